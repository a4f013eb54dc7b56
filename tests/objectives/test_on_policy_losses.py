from __future__ import annotations

import copy
import math

import pytest
import torch
from tensordict import TensorDict
from torchrl.collectors import Collector
from torchrl.envs import GymEnv, TransformedEnv
from torchrl.modules import set_recurrent_mode
from torchrl.objectives import A2CLoss, ClipPPOLoss

from ac_extensions.modules import make_actor_critic, recurrent_env_transforms
from ac_extensions.objectives import KLPenalty, SequenceA2CLoss, SequencePPOLoss
from tests._helpers import on_policy_batch as batch

OBS, ACT = 4, 3


@pytest.fixture
def networks():
    torch.manual_seed(0)
    return make_actor_critic(OBS, ACT, hidden_sizes=(16,))


PPO_KW = dict(clip_epsilon=0.2, entropy_coeff=0.01, critic_coeff=0.5, loss_critic_type="l2")


def grads(loss_module, td):
    out = loss_module(td)
    total = sum(v for k, v in out.items() if k.startswith("loss_"))
    params = [p for p in loss_module.parameters() if p.requires_grad]
    return out, torch.autograd.grad(total, params, allow_unused=True)


class TestAgainstTorchRL:
    @pytest.mark.parametrize("normalize", [False, True])
    def test_ppo_equals_clip_ppo_on_a_flat_batch(self, networks, normalize):
        actor, critic = networks
        td = batch((64,), networks=networks)
        ours = SequencePPOLoss(actor, critic, normalize_advantage=normalize, **PPO_KW)
        theirs = ClipPPOLoss(
            copy.deepcopy(actor), copy.deepcopy(critic), normalize_advantage=normalize, **PPO_KW
        )
        out_a, g_a = grads(ours, td.clone())
        out_b, g_b = grads(theirs, td.clone())
        for key in (
            "loss_objective",
            "loss_critic",
            "loss_entropy",
            "entropy",
            "kl_approx",
            "clip_fraction",
        ):
            torch.testing.assert_close(out_a[key], out_b[key], msg=key)
        torch.testing.assert_close(
            out_a["explained_variance"], out_b["explained_variance"].reshape(())
        )
        torch.testing.assert_close(out_a["ESS"], out_b["ESS"].reshape(()))
        assert len(g_a) == len(g_b)
        for a, b in zip(g_a, g_b, strict=True):
            torch.testing.assert_close(a, b)

    def test_a2c_equals_a2c_loss_on_a_flat_batch(self, networks):
        actor, critic = networks
        td = batch((64,), networks=networks)
        kw = dict(entropy_coeff=0.01, critic_coeff=0.5, loss_critic_type="l2")
        out_a, g_a = grads(SequenceA2CLoss(actor, critic, **kw), td.clone())
        out_b, g_b = grads(A2CLoss(copy.deepcopy(actor), copy.deepcopy(critic), **kw), td.clone())
        for key in ("loss_objective", "loss_critic", "loss_entropy", "entropy"):
            torch.testing.assert_close(out_a[key], out_b[key], msg=key)
        for a, b in zip(g_a, g_b, strict=True):
            torch.testing.assert_close(a, b)

    @pytest.mark.parametrize("cls", [SequencePPOLoss, SequenceA2CLoss])
    def test_non_functional_and_diagnostics_off_keep_the_losses(self, networks, cls):
        # The recipe's fast settings: networks called directly (functional=False) and no
        # diagnostics. Same loss_* values and gradients, and only loss_* entries come out.
        td = batch((4, 10), networks=networks, seed=3)
        td["action_log_prob"] = td["action_log_prob"] + 0.3  # ratios away from 1: clipping on
        addon = KLPenalty(copy.deepcopy(networks[0]), coeff=0.5)
        reference = cls(*networks, functional=True, addons=[addon])
        fast = cls(*networks, functional=False, addons=[addon])
        fast.diagnostics = False
        out_a, g_a = grads(reference, td.clone())
        out_b, g_b = grads(fast, td.clone())
        assert sorted(out_b.keys()) == sorted(k for k in out_a.keys() if k.startswith("loss_"))
        assert "loss_kl_reference" in out_b.keys()
        for key in out_b.keys():
            torch.testing.assert_close(out_a[key], out_b[key], msg=key)
        for a, b in zip(g_a, g_b, strict=True):
            torch.testing.assert_close(a, b)


class TestSequenceBatches:
    @pytest.mark.parametrize("cls", [SequencePPOLoss, SequenceA2CLoss])
    def test_every_output_is_a_scalar_on_b_t(self, networks, cls):
        out = cls(*networks)(batch((4, 10), networks=networks))
        for key, value in out.items():
            assert value.shape == torch.Size([]), (key, value.shape)
            if not key.startswith("loss_"):
                assert not value.requires_grad, key

    @pytest.mark.parametrize("cls", [SequencePPOLoss, SequenceA2CLoss])
    def test_padding_mask_excludes_padded_steps(self, networks, cls):
        # A padded [4, 10] batch must give exactly the losses and diagnostics of its valid
        # steps alone; padded steps hold garbage (huge advantages, other actions).
        td = batch((4, 10), networks=networks, seed=1)
        mask = torch.ones(4, 10, dtype=torch.bool)
        mask[0, 6:] = False
        mask[2, 3:] = False
        valid = td[mask].clone()
        td["advantage"][~mask] = 1e6
        td["value_target"][~mask] = -1e6
        td[("collector", "mask")] = mask
        kw = dict(normalize_advantage=True) if cls is SequencePPOLoss else {}
        loss = cls(*networks, **kw)
        padded, flat = loss(td), loss(valid)
        for key in flat.keys():
            torch.testing.assert_close(padded[key], flat[key], msg=key)

    def test_kl_penalty_addon(self, networks):
        actor, critic = networks
        td = batch((4, 6), networks=networks)
        same = SequencePPOLoss(actor, critic, addons=[KLPenalty(actor, coeff=2.0)])(td)
        assert same["kl_reference"].abs().item() < 1e-6
        other, _ = make_actor_critic(OBS, ACT, hidden_sizes=(16,))
        loss = SequencePPOLoss(actor, critic, addons=[KLPenalty(other, coeff=2.0)])
        out = loss(td)
        with torch.no_grad():
            expected = torch.distributions.kl_divergence(
                actor.get_dist(td.clone()), other.get_dist(td.clone())
            ).mean()
        torch.testing.assert_close(out["kl_reference"], expected)
        torch.testing.assert_close(out["loss_kl_reference"], 2.0 * expected)
        out["loss_kl_reference"].backward()
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in actor.parameters())
        assert all(p.grad is None for p in loss.addons[0].parameters())

    def test_callable_addon(self, networks):
        def entropy_floor(td, dist):
            return {"loss_entropy_floor": (0.5 - dist.entropy()).clamp(min=0)}

        out = SequenceA2CLoss(*networks, addons=[entropy_floor])(batch((3, 5), networks=networks))
        assert out["loss_entropy_floor"].shape == torch.Size([])


class TestBadInput:
    def test_missing_behavior_log_prob(self, networks):
        td = batch((4, 5), networks=networks).exclude("action_log_prob")
        with pytest.raises(KeyError, match=r"action_log_prob.*return_log_prob=True"):
            SequencePPOLoss(*networks)(td)

    def test_missing_observation(self, networks):
        td = batch((4, 5), networks=networks).exclude("observation")
        with pytest.raises(KeyError, match=r"batch_size \[4, 5\]\) has no key .*observation"):
            SequencePPOLoss(*networks)(td)

    def test_log_prob_with_trailing_dim(self, networks):
        td = batch((4, 5), networks=networks)
        td["action_log_prob"] = td["action_log_prob"].unsqueeze(-1)
        with pytest.raises(ValueError, match=r"action_log_prob.*\[4, 5\].*\[4, 5, 1\]"):
            SequencePPOLoss(*networks)(td)

    def test_non_finite_reward(self, networks):
        td = batch((4, 5), networks=networks)
        td["next", "reward"][1, 2] = float("nan")
        with pytest.raises(ValueError, match=r"reward.*\[4, 5, 1\].*1 non-finite"):
            SequenceA2CLoss(*networks)(td)

    def test_missing_advantage_is_not_silently_estimated(self, networks):
        td = batch((4, 5), networks=networks).exclude("advantage")
        with pytest.raises(KeyError, match=r"advantage.*make_value_estimator"):
            SequencePPOLoss(*networks)(td)

    def test_recurrent_policy_without_primer(self):
        actor, critic = make_actor_critic(OBS, ACT, recurrent="lstm", recurrent_size=8)
        td = TensorDict(
            {
                "observation": torch.randn(2, 5, OBS),
                "action": torch.zeros(2, 5).long(),
                "action_log_prob": torch.zeros(2, 5),
                "advantage": torch.zeros(2, 5, 1),
                "value_target": torch.zeros(2, 5, 1),
            },
            [2, 5],
        )
        with pytest.raises(KeyError, match=r"recurrent.*primer"):
            SequencePPOLoss(actor, critic)(td)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_recurrent_replay_reproduces_collection_log_probs(cell):
    # Collect 60 steps (several CartPole episodes, so is_init is set inside the sequence) with
    # a recurrent policy, then replay the whole sequence through the loss's actor in recurrent
    # mode: the log-probabilities must be those computed step by step at collection.
    torch.manual_seed(0)
    actor, critic = make_actor_critic(4, 2, recurrent=cell, recurrent_size=16)
    env = TransformedEnv(GymEnv("CartPole-v1"))
    env.append_transform(recurrent_env_transforms(actor))
    env.set_seed(0)
    collector = Collector(env, actor, frames_per_batch=60, total_frames=60)
    try:
        data = next(iter(collector))
    finally:
        collector.shutdown()
    assert bool(data["is_init"][1:].any()), "want an episode start inside the sequence"
    sequence = data.unsqueeze(0)  # [1, T]
    loss = SequencePPOLoss(actor, critic)
    with set_recurrent_mode(True), torch.no_grad():
        dist = loss.actor_network.get_dist(sequence.select(*actor.in_keys).clone())
        replayed = dist.log_prob(sequence["action"])
    torch.testing.assert_close(replayed, sequence["action_log_prob"], rtol=0, atol=1e-6)


def test_ppo_hand_case_clipped_and_unclipped_steps():
    # Uniform π over 2 actions (π(a) = 0.5), V = (0, 2, 1) from one-hot observations.
    # Step 0: µ = 0.25 → r = 2, A = +1: the clip binds, gain 1.2. Step 1: µ = 0.25 → r = 2,
    # A = −1: min(−2, −1.2) = −2, unclipped. Step 2: µ = 0.5 → r = 1, A = 3: gain 3.
    from tensordict.nn import TensorDictModule
    from torch.distributions import Categorical
    from torchrl.modules import ProbabilisticActor, ValueOperator

    logits_net, value_net = torch.nn.Linear(3, 2), torch.nn.Linear(3, 1, bias=False)
    with torch.no_grad():
        logits_net.weight.zero_(), logits_net.bias.zero_()
        value_net.weight.copy_(torch.tensor([[0.0, 2.0, 1.0]]))
    actor = ProbabilisticActor(
        TensorDictModule(logits_net, ["observation"], ["logits"]),
        in_keys=["logits"],
        distribution_class=Categorical,
        return_log_prob=True,
    )
    critic = ValueOperator(value_net, in_keys=["observation"])
    loss = SequencePPOLoss(
        actor,
        critic,
        clip_epsilon=0.2,
        entropy_coeff=0.5,
        critic_coeff=2.0,
        loss_critic_type="l2",
        normalize_advantage=False,
    )
    td = TensorDict(
        {
            "observation": torch.eye(3),
            "action": torch.tensor([0, 1, 0]),
            "action_log_prob": torch.log(torch.tensor([0.25, 0.25, 0.5])),
            "advantage": torch.tensor([[1.0], [-1.0], [3.0]]),
            "value_target": torch.tensor([[1.0], [0.0], [1.0]]),
        },
        [3],
    )
    out = loss(td)
    assert out["loss_objective"].item() == pytest.approx(-(1.2 - 2 + 3) / 3)
    assert out["loss_critic"].item() == pytest.approx(2.0 * (1 + 4 + 0) / 3)
    assert out["loss_entropy"].item() == pytest.approx(-0.5 * math.log(2))
    assert out["clip_fraction"].item() == pytest.approx(2 / 3)
    assert out["kl_approx"].item() == pytest.approx(-2 * math.log(2) / 3)
    # Only the unclipped steps carry gradient: none reaches the logits of step 0's input.
    out["loss_objective"].backward()
    assert logits_net.weight.grad[:, 0].abs().sum() == 0
    assert logits_net.weight.grad[:, 1].abs().sum() > 0


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "options",
    [
        dict(distribution="normal"),
        dict(share_torso=True, head_sizes=(8,)),
    ],
    ids=["gaussian", "shared_torso"],
)
def test_ppo_under_torch_compile_equals_eager(options):
    # What the recipe's compile_loss runs: the same losses and gradients as the eager loss,
    # including a shared torso (its feature cache stands aside under compile).
    torch.manual_seed(0)
    networks = make_actor_critic(OBS, ACT, hidden_sizes=(16,), **options)
    td = batch((64,), networks=networks)
    loss = SequencePPOLoss(*networks, normalize_advantage=True, functional=False, **PPO_KW)
    eager_out, eager_grads = grads(loss, td.clone())
    torch._dynamo.reset()
    compiled_out, compiled_grads = grads(torch.compile(loss), td.clone())
    for key in ("loss_objective", "loss_critic", "loss_entropy", "kl_approx", "clip_fraction"):
        torch.testing.assert_close(compiled_out[key], eager_out[key], msg=key)
    for a, b in zip(compiled_grads, eager_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
