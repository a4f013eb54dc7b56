"""RNDPPOLoss: PPO on c_E·A^E + c_I·A^I, both value heads trained, the predictor's loss added;
the intrinsic GAE ignores episode ends and the extrinsic one does not."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from ac_extensions.modules import RandomNetworkDistillation, make_actor_critic, rnd_networks
from ac_extensions.objectives import RNDPPOLoss, SequencePPOLoss
from ac_extensions.runtime.on_policy import compute_advantages

HEADS = ("state_value", "state_value_intrinsic")


def _networks():
    torch.manual_seed(0)
    return make_actor_critic(4, 3, value_keys=HEADS)


def _batch(rows=3, steps=5) -> TensorDict:
    g = torch.Generator().manual_seed(1)
    return TensorDict(
        {
            "observation": torch.randn(rows, steps, 4, generator=g),
            ("next", "observation"): torch.randn(rows, steps, 4, generator=g),
            "action": torch.randint(3, (rows, steps), generator=g),
            "action_log_prob": -1.0 - torch.rand(rows, steps, generator=g),
            "advantage": torch.randn(rows, steps, 1, generator=g),
            "value_target": torch.randn(rows, steps, 1, generator=g),
            "advantage_intrinsic": torch.randn(rows, steps, 1, generator=g),
            "value_target_intrinsic": torch.randn(rows, steps, 1, generator=g),
        },
        [rows, steps],
    )


def test_the_policy_follows_the_weighted_sum_of_the_advantages():
    actor, critic = _networks()
    td = _batch()
    ours = RNDPPOLoss(actor, critic, extrinsic_coeff=2.0, intrinsic_coeff=0.5, functional=False)
    plain = SequencePPOLoss(actor, critic, functional=False)
    combined = td.clone()
    combined["advantage"] = 2.0 * td["advantage"] + 0.5 * td["advantage_intrinsic"]
    out, reference = ours(td), plain(combined)
    for key in ("loss_objective", "loss_entropy", "clip_fraction", "kl_approx"):
        torch.testing.assert_close(out[key], reference[key])


def test_the_critic_loss_sums_both_heads():
    actor, critic = _networks()
    td = _batch()
    loss = RNDPPOLoss(actor, critic, critic_coeff=0.5, loss_critic_type="l2", functional=False)
    out = loss(td)
    values = critic(td.select("observation").clone())
    expected = 0.5 * (
        (values["state_value"] - td["value_target"]).square().mean()
        + (values["state_value_intrinsic"] - td["value_target_intrinsic"]).square().mean()
    )
    torch.testing.assert_close(out["loss_critic"], expected)


def test_loss_rnd_trains_the_predictor_and_never_the_target():
    actor, critic = _networks()
    rnd = RandomNetworkDistillation(*rnd_networks(4), observation_shape=(4,))
    loss = RNDPPOLoss(actor, critic, rnd, functional=False)
    td = _batch()
    out = loss(td)
    with torch.no_grad():
        expected = rnd.prediction_error(td["next", "observation"]).mean()
    torch.testing.assert_close(out["loss_rnd"].detach(), expected)
    sum(v for k, v in out.items() if k.startswith("loss_")).backward()
    assert all(p.grad is None for p in rnd.target.parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in rnd.predictor.parameters())
    assert all(not p.requires_grad for p in rnd.target.parameters())
    assert {n.split(".")[0] for n, _ in loss.named_parameters()} >= {"rnd"}


def test_bad_input_names_the_key():
    actor, critic = _networks()
    loss = RNDPPOLoss(actor, critic, functional=False)
    td = _batch()
    del td["advantage_intrinsic"]
    with pytest.raises(KeyError, match="advantage_intrinsic"):
        loss(td)
    td = _batch()
    td["value_target_intrinsic"] = torch.randn(3, 5)
    with pytest.raises(ValueError, match=r"'value_target_intrinsic' must have shape \[3, 5, 1\]"):
        loss(td)
    one_head, _ = make_actor_critic(4, 3)
    with pytest.raises(ValueError, match="state_value_intrinsic"):
        RNDPPOLoss(one_head, make_actor_critic(4, 3)[1])
    with pytest.raises(ValueError, match="clip_value"):
        RNDPPOLoss(actor, critic, clip_value=0.2)


def _gae(reward, value, next_value, gamma, lmbda, cut):
    """Schulman et al., 2016, Eq. 16 as a loop, the trace cut where `cut` is set."""
    advantage = torch.zeros_like(reward)
    running = torch.zeros(reward.shape[0])
    for t in reversed(range(reward.shape[1])):
        keep = 1.0 - cut[:, t].float()
        delta = reward[:, t] + gamma * next_value[:, t] * keep - value[:, t]
        running = delta + gamma * lmbda * keep * running
        advantage[:, t] = running
    return advantage


def test_the_intrinsic_advantage_ignores_episode_ends_and_the_extrinsic_one_does_not():
    _, critic = _networks()
    td = _batch(rows=2, steps=6)
    done = torch.zeros(2, 6, 1, dtype=torch.bool)
    done[0, 2] = done[1, 4] = done[0, 5] = True  # the last one: bootstrap from ("next", ...)
    g = torch.Generator().manual_seed(3)
    td.set(("next", "reward"), torch.randn(2, 6, 1, generator=g))
    td.set(("next", "reward_intrinsic"), torch.rand(2, 6, 1, generator=g))
    td.set(("next", "done"), done)
    td.set(("next", "terminated"), done.clone())
    compute_advantages(td, critic, 0.9, 0.8, intrinsic_gamma=0.7)
    with torch.no_grad():
        values = critic(td.select("observation").clone())
        next_values = critic(td["next"].select("observation").clone())
    for suffix, gamma, cut in (("", 0.9, done), ("_intrinsic", 0.7, torch.zeros_like(done))):
        value = values[f"state_value{suffix}"].squeeze(-1)
        next_value = next_values[f"state_value{suffix}"].squeeze(-1).clone()
        if suffix:  # the stream goes on into the next episode: its first step's value
            next_value[0, 2], next_value[1, 4] = value[0, 3], value[1, 5]
        expected = _gae(
            td["next", f"reward{suffix}"].squeeze(-1),
            value,
            next_value,
            gamma,
            0.8,
            cut.squeeze(-1),
        )
        torch.testing.assert_close(td[f"advantage{suffix}"].squeeze(-1), expected)
        torch.testing.assert_close(td[f"value_target{suffix}"].squeeze(-1), expected + value)
    # The intrinsic trace crosses the episode end: step 2 of row 0 sees step 3's error.
    crossing = td.clone()
    crossing["next", "reward_intrinsic"][0, 3] += 1.0
    crossing["next", "reward"][0, 3] += 1.0
    compute_advantages(crossing, critic, 0.9, 0.8, intrinsic_gamma=0.7)
    assert crossing["advantage_intrinsic"][0, 2] > td["advantage_intrinsic"][0, 2]
    torch.testing.assert_close(crossing["advantage"][0, 2], td["advantage"][0, 2])


def test_keyword_calls_return_loss_rnd_and_read_the_next_observation():
    actor, critic = _networks()
    rnd = RandomNetworkDistillation(*rnd_networks(4), observation_shape=(4,))
    loss = RNDPPOLoss(actor, critic, rnd, functional=False)
    assert ("next", "observation") in loss.in_keys and loss.out_keys[-1] == "loss_rnd"
    td = _batch()
    kwargs = {
        "_".join(k) if isinstance(k, tuple) else k: td.get(k)
        for k in loss.in_keys
        if td.get(k, None) is not None
    }
    values = dict(zip(loss.out_keys, loss(**kwargs), strict=True))
    torch.testing.assert_close(values["loss_rnd"], loss(td)["loss_rnd"])


@pytest.mark.parametrize("functional", [False, True])
def test_a_stale_intrinsic_value_in_the_input_is_not_read(functional):
    actor, critic = _networks()
    td = _batch()
    loss = RNDPPOLoss(actor, critic, loss_critic_type="l2", functional=functional)
    fresh = loss(td)["loss_critic"]
    stale = td.clone()
    stale["state_value_intrinsic"] = torch.full((3, 5, 1), 100.0)  # GAE leaves one there
    out = loss(stale)
    torch.testing.assert_close(out["loss_critic"], fresh)
    out["loss_critic"].backward()
    head = [p for n, p in critic.named_parameters() if n.endswith("weight")][-1]
    assert head.grad is not None and bool(head.grad[1].abs().sum() > 0)  # the intrinsic row


def test_a_critic_that_does_not_write_in_place_is_refused():
    from tensordict.nn import TensorDictModule

    actor, critic = _networks()
    copy = TensorDictModule(critic.module, critic.in_keys, critic.out_keys, inplace=False)
    loss = RNDPPOLoss(actor, copy, functional=False)
    with pytest.raises(ValueError, match="must write 'state_value_intrinsic'"):
        loss(_batch())


def test_advantage_norm_is_refused():
    from torchrl.modules.value_norm import RunningValueNorm

    actor, critic = _networks()
    with pytest.raises(ValueError, match="advantage_norm"):
        RNDPPOLoss(actor, critic, advantage_norm=RunningValueNorm())
