"""Bad input to the sequence losses: one clear error each, naming the key and the shapes."""

from __future__ import annotations

import re

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torchrl.objectives import HardUpdate

from ac_extensions.modules import make_actor_critic, make_continuous_actor_critic, make_qvalue
from ac_extensions.objectives import ACERLoss, ContinuousACERLoss, ReactorLoss

B, T, A, D, OBS = 3, 5, 2, 1, 4


def batch(continuous: bool = False) -> TensorDict:
    gen = torch.Generator().manual_seed(0)
    td = TensorDict(
        {
            "observation": torch.randn(B, T, OBS, generator=gen),
            ("next", "observation"): torch.randn(B, T, OBS, generator=gen),
            ("next", "reward"): torch.randn(B, T, 1, generator=gen),
            ("next", "done"): torch.zeros(B, T, 1, dtype=torch.bool),
            ("next", "terminated"): torch.zeros(B, T, 1, dtype=torch.bool),
            ("replay", "sequence"): torch.arange(B).unsqueeze(-1).expand(B, T),
        },
        [B, T],
    )
    if continuous:
        td["action"] = torch.randn(B, T, D, generator=gen)
        td["behavior", "loc"] = torch.zeros(B, T, D)
        td["behavior", "scale"] = torch.ones(B, T, D)
    else:
        td["action"] = torch.randint(A, (B, T), generator=gen)
        td["behavior", "logits"] = torch.randn(B, T, A, generator=gen)
        td["action_log_prob"] = torch.full((B, T), -0.7)
    return td


def acer(num_q_actions: int = A) -> ACERLoss:
    torch.manual_seed(0)
    actor, _ = make_actor_critic(OBS, A, hidden_sizes=(8,))
    return ACERLoss(actor, make_qvalue(OBS, num_q_actions, hidden_sizes=(8,)))


def reactor(num_q_actions: int = A) -> ReactorLoss:
    torch.manual_seed(0)
    actor, _ = make_actor_critic(OBS, A, hidden_sizes=(8,))
    net = torch.nn.Linear(OBS, num_q_actions)
    critic = TensorDictModule(net, ["observation"], ["action_value"])
    loss = ReactorLoss(actor, critic, distributional=False)
    HardUpdate(loss, value_network_update_interval=10)
    return loss


def continuous() -> ContinuousACERLoss:
    torch.manual_seed(0)
    return ContinuousACERLoss(*make_continuous_actor_critic(OBS, D, hidden_sizes=(8,)))


LOSSES = {"acer": (acer, False), "reactor": (reactor, False), "continuous": (continuous, True)}
BEHAVIOR = {"acer": ("behavior", "logits"), "reactor": "action_log_prob"}
BEHAVIOR["continuous"] = ("behavior", "scale")


def raises(loss, td, error, *fragments):
    with pytest.raises(error) as info:
        loss(td)
    message = str(info.value)
    assert type(loss).__name__ in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert "\n" not in message.strip("'\"")  # one line


@pytest.mark.parametrize("name", LOSSES)
def test_valid_batch_passes(name):
    make, is_continuous = LOSSES[name]
    out = make()(batch(is_continuous))
    assert torch.isfinite(out["loss_critic"])


@pytest.mark.parametrize("name", LOSSES)
def test_missing_behavior_key(name):
    make, is_continuous = LOSSES[name]
    key = BEHAVIOR[name]
    raises(make(), batch(is_continuous).exclude(key), KeyError, repr(key))


@pytest.mark.parametrize("name", LOSSES)
def test_missing_next_observation(name):
    # The networks run on ("next", ...) for the bootstrap: a missing next input is named.
    make, is_continuous = LOSSES[name]
    td = batch(is_continuous).exclude(("next", "observation"))
    raises(make(), td, KeyError, "('next', 'observation')", "[3, 5]")


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("flag", ["done", "terminated"])
def test_float_done_or_terminated(name, flag):
    make, is_continuous = LOSSES[name]
    td = batch(is_continuous)
    td["next", flag] = td["next", flag].float()
    raises(make(), td, ValueError, f"('next', '{flag}')", "bool", "[3, 5, 1]", "float32")


@pytest.mark.parametrize("name", LOSSES)
def test_flat_sample_of_several_sequences(name):
    make, is_continuous = LOSSES[name]
    flat = batch(is_continuous).reshape(-1)  # [B·T]: a replay sample not reshaped to [B, T]
    raises(make(), flat, ValueError, "[15]", "('replay', 'sequence')", "3 different sequences")
    make()(batch(is_continuous)[0])  # one sequence [T] is fine


@pytest.mark.parametrize("name", LOSSES)
def test_nan_rewards(name):
    make, is_continuous = LOSSES[name]
    td = batch(is_continuous)
    td["next", "reward"][1, 2] = float("nan")
    raises(make(), td, ValueError, "('next', 'reward')", "[3, 5, 1]", "1 non-finite")


@pytest.mark.parametrize("name", ["acer", "reactor"])
def test_float_action_for_a_discrete_loss(name):
    make, _ = LOSSES[name]
    td = batch()
    td["action"] = td["action"].float()
    raises(make(), td, ValueError, "'action'", "integer", "[3, 5]", "float32")


@pytest.mark.parametrize("make", [acer, reactor], ids=["acer", "reactor"])
def test_actor_and_critic_with_different_action_counts(make):
    loss = make(num_q_actions=3)
    with pytest.raises(ValueError) as info:
        loss(batch())
    message = str(info.value)
    assert "'action_value'" in message and "[3, 5, 3]" in message
    assert re.search(r"\[3, 5, 2\]", message)
