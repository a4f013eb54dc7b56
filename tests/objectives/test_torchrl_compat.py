"""SequencePPOLoss / SequenceA2CLoss as drop-ins for TorchRL's ClipPPOLoss / A2CLoss.

Each case TorchRL's own losses accept is fed to both classes on the same batch and the same
networks (deep copies), and the losses and gradients must agree: multi-head actions with
list-valued keys, keyword calls through ``@dispatch``, per-agent log-probs and advantages,
actor inputs the actor writes itself, a continuous ``TanhNormal`` actor, and TorchRL's
defaults. The deliberate difference (no silent default GAE) is a one-line error.
"""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import (
    CompositeDistribution,
    NormalParamExtractor,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
    set_composite_lp_aggregate,
)
from torchrl.modules import MLP, ProbabilisticActor, TanhNormal, ValueOperator
from torchrl.objectives import A2CLoss, ClipPPOLoss

from ac_extensions.objectives import SequenceA2CLoss, SequencePPOLoss

PAIRS = [(SequencePPOLoss, ClipPPOLoss), (SequenceA2CLoss, A2CLoss)]
OBS = 4


def both(pair, actor, critic, **kwargs):
    ours, theirs = pair
    return ours(actor, critic, **kwargs), theirs(
        copy.deepcopy(actor), copy.deepcopy(critic), **kwargs
    )


def loss_terms_and_grads(loss, td):
    out = loss(td)
    terms = {k: v.detach() for k, v in out.items() if k.startswith("loss_")}
    total = sum(v for k, v in out.items() if k.startswith("loss_"))
    params = [p for p in loss.parameters() if p.requires_grad]
    return terms, torch.autograd.grad(total, params, allow_unused=True)


def assert_same(ours, theirs, td):
    terms_a, grads_a = loss_terms_and_grads(ours, td.clone())
    terms_b, grads_b = loss_terms_and_grads(theirs, td.clone())
    assert terms_a.keys() == terms_b.keys()
    for key in terms_a:
        torch.testing.assert_close(terms_a[key], terms_b[key], msg=key)
    for a, b in zip(grads_a, grads_b, strict=True):
        if a is not None or b is not None:
            torch.testing.assert_close(a, b)


def critic_net():
    return ValueOperator(MLP(OBS, 1, num_cells=[8]), in_keys=["observation"])


def tanh_actor():
    net = torch.nn.Sequential(MLP(OBS, 4, num_cells=[8]), NormalParamExtractor())
    return ProbabilisticActor(
        TensorDictModule(net, ["observation"], ["loc", "scale"]),
        in_keys=["loc", "scale"],
        distribution_class=TanhNormal,
        distribution_kwargs={"low": -2.0, "high": 2.0},
        return_log_prob=True,
    )


def rollout(actor, shape, extra=()):
    torch.manual_seed(1)
    td = TensorDict({"observation": torch.randn(*shape, *extra, OBS)}, list(shape))
    with torch.no_grad():
        td = actor(td)
    values = (*shape, *extra, 1)
    td["advantage"], td["value_target"] = torch.randn(values), torch.randn(values)
    td["next", "observation"] = torch.randn(*shape, *extra, OBS)
    td["next", "reward"] = torch.randn(values)
    td["next", "done"] = torch.zeros(values, dtype=torch.bool)
    td["next", "terminated"] = torch.zeros(values, dtype=torch.bool)
    return td.detach()


@pytest.mark.parametrize("pair", PAIRS, ids=["ppo", "a2c"])
@pytest.mark.parametrize("shape", [(12,), (3, 5)])
def test_tanh_normal_actor_same_losses_and_gradients(pair, shape):
    torch.manual_seed(0)
    # MC entropy: seed each call the same way by leaving the entropy term out
    ours, theirs = both(pair, tanh_actor(), critic_net(), entropy_bonus=False)
    assert_same(ours, theirs, rollout(ours.actor_network, shape))


def composite_actor():
    """Two action heads (a Normal and a Categorical) with list-valued action / log-prob keys."""
    heads = TensorDictModule(
        torch.nn.Linear(OBS, 5),
        ["observation"],
        ["raw"],
    )

    def split(raw):
        return raw[..., :1], raw[..., 1:2].exp(), raw[..., 2:]

    params = TensorDictModule(
        split,
        ["raw"],
        [("params", "a1", "loc"), ("params", "a1", "scale"), ("params", "a2", "logits")],
    )
    prob = ProbabilisticTensorDictModule(
        in_keys=["params"],
        out_keys=[("action", "a1"), ("action", "a2")],
        distribution_class=CompositeDistribution,
        distribution_kwargs={
            "distribution_map": {
                "a1": torch.distributions.Normal,
                "a2": torch.distributions.Categorical,
            },
            "name_map": {"a1": ("action", "a1"), "a2": ("action", "a2")},
        },
        return_log_prob=True,
    )
    return ProbabilisticTensorDictSequential(heads, params, prob)


@pytest.mark.parametrize("pair", PAIRS[:1], ids=["ppo"])  # TorchRL's A2CLoss: no list keys
def test_multi_head_actions_with_list_valued_keys(pair):
    with set_composite_lp_aggregate(False):
        torch.manual_seed(0)
        actor = composite_actor()
        # the actor's own input check: "params" is written by the actor itself
        assert "params" in actor.in_keys
        ours, theirs = both(pair, actor, critic_net(), entropy_bonus=False)
        keys = {
            "action": [("action", "a1"), ("action", "a2")],
            "sample_log_prob": [("action", "a1_log_prob"), ("action", "a2_log_prob")],
        }
        if pair[0] is SequenceA2CLoss:
            keys.pop("sample_log_prob")
        ours.set_keys(**keys)
        theirs.set_keys(**keys)
        td = rollout(actor, (6,))
        assert_same(ours, theirs, td)


@pytest.mark.parametrize("pair", PAIRS, ids=["ppo", "a2c"])
def test_keyword_calls_through_dispatch(pair):
    # TorchRL's keyword form: one tensor per input key ("next_reward" for ("next", "reward")),
    # the out_keys' values back as a tuple. Ours also takes the advantage and value target
    # this way; TorchRL's would build them itself, so it gets the same batch as a TensorDict.
    torch.manual_seed(0)
    ours, theirs = both(pair, tanh_actor(), critic_net(), entropy_bonus=False)
    td = rollout(ours.actor_network, (7,))
    assert {"advantage", "value_target"} <= set(ours.in_keys)
    kwargs = {"_".join(key) if isinstance(key, tuple) else key: td[key] for key in ours.in_keys}
    out_ours = ours(**kwargs)
    out_theirs = theirs(td.clone())
    assert isinstance(out_ours, tuple) and len(out_ours) == len(ours.out_keys)
    for key, value in zip(ours.out_keys, out_ours, strict=True):
        if key.startswith("loss_"):
            torch.testing.assert_close(value, out_theirs[key], msg=key)


@pytest.mark.parametrize("pair", PAIRS, ids=["ppo", "a2c"])
def test_per_agent_log_probs_and_advantages(pair):
    # [B, agents] log-probs against [B, agents, 1] advantages (TorchRL's multi-agent layout)
    torch.manual_seed(0)
    ours, theirs = both(pair, tanh_actor(), critic_net(), entropy_bonus=False)
    td = rollout(ours.actor_network, (6,), extra=(3,))
    assert td["action_log_prob"].shape == (6, 3)
    assert_same(ours, theirs, td)
    out = ours(td.clone())
    assert out["explained_variance"].shape == ()


def test_per_agent_advantages_are_standardised_over_the_valid_steps_only():
    # A padded [B, T] batch with per-agent values: the padding changes nothing.
    torch.manual_seed(0)
    loss = SequencePPOLoss(tanh_actor(), critic_net(), normalize_advantage=True)
    td = rollout(loss.actor_network, (2, 4), extra=(3,))
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    td["collector", "mask"] = mask
    padded = loss(td.clone())["loss_objective"]
    valid = td[mask]  # the valid steps alone, flat [5]
    valid = valid.exclude(("collector", "mask"))
    torch.testing.assert_close(loss(valid)["loss_objective"], padded)


def test_torchrl_defaults_and_explained_variance_flag():
    actor, critic = tanh_actor(), critic_net()
    ours, theirs = both(PAIRS[0], actor, critic)
    assert ours.log_explained_variance == theirs.log_explained_variance is True
    assert float(ours.entropy_coeff) == float(theirs.entropy_coeff)
    assert ours.loss_critic_type == theirs.loss_critic_type
    quiet = SequencePPOLoss(actor, critic, log_explained_variance=False, entropy_bonus=False)
    assert "explained_variance" not in quiet(rollout(actor, (5,))).keys()


@pytest.mark.parametrize("cls", [SequencePPOLoss, SequenceA2CLoss])
def test_no_default_advantage_is_a_one_line_error(cls):
    actor = tanh_actor()
    td = rollout(actor, (5,)).exclude("advantage")
    with pytest.raises(KeyError, match="no 'advantage' in the input") as error:
        cls(actor, critic_net())(td)
    assert "\n" not in str(error.value)
    loss = cls(actor, critic_net(), entropy_bonus=False)
    loss.make_value_estimator()  # TorchRL's default GAE, asked for explicitly
    assert torch.isfinite(loss(td)["loss_objective"])


def test_flat_advantage_is_refused_as_an_outer_product():
    actor = tanh_actor()
    td = rollout(actor, (5,))
    td["advantage"] = td["advantage"].squeeze(-1)
    with pytest.raises(ValueError, match="outer product"):
        SequencePPOLoss(actor, critic_net())(td)
