"""ACERLoss's fast path (plain tensors) against its general path (TensorDict wrappers)."""

from __future__ import annotations

import pytest
import torch
from tensordict.nn import TensorDictModule
from torchrl.modules import ProbabilisticActor
from torchrl.objectives import SoftUpdate

import ac_extensions.objectives.acer as acer_module
from ac_extensions.modules import make_acer_actor
from ac_extensions.objectives import ACERLoss
from tests.objectives.test_acer import ACT, OBS, networks, perturb_average, sequences


def consistent_stream(shape=(3, 7), seed=4):
    """x_{t+1} is the next row's observation except after an episode end (the collector's)."""
    td = sequences(shape, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    stream = torch.randn(shape[0], shape[1] + 1, OBS, generator=gen)
    td["observation"], td["next", "observation"] = stream[:, :-1], stream[:, 1:].clone()
    done = td["next", "done"].squeeze(-1)
    td["next", "observation"][done] = torch.randn(int(done.sum()), OBS, generator=gen)
    return td


def probabilistic_actor(seed=0):
    """The recipe's layout: a ProbabilisticActor around a plain logits network."""
    actor, _ = networks(seed)
    return ProbabilisticActor(
        actor, in_keys=["logits"], distribution_class=torch.distributions.Categorical
    )


@pytest.fixture
def calls(monkeypatch):
    """Counts the fast path's network evaluations."""
    count = {"fast": 0}
    original = acer_module._fast_outputs

    def counted(*args):
        count["fast"] += 1
        return original(*args)

    monkeypatch.setattr(acer_module, "_fast_outputs", counted)
    return count


def outputs_and_grads(loss, td):
    out = loss(td.clone())
    total = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
    return out, torch.autograd.grad(total, list(loss.parameters()), allow_unused=True)


def assert_same(fast, slow, td, calls):
    out_fast, grads_fast = outputs_and_grads(fast, td)
    assert calls["fast"] == 1
    out_slow, grads_slow = outputs_and_grads(slow, td)
    assert calls["fast"] == 1  # the general path did not take it
    assert set(out_fast.keys()) == set(out_slow.keys())
    for key in out_slow.keys():
        torch.testing.assert_close(out_fast[key], out_slow[key], msg=key)
    for a, b in zip(grads_fast, grads_slow, strict=True):
        torch.testing.assert_close(a, b)


def pair(actor_factory=lambda: networks(0), **kwargs):
    """The same networks (same weights) under a fast-path loss and a general-path loss."""
    actor, qvalue = actor_factory()
    fast = ACERLoss(actor, qvalue, **kwargs)
    slow = ACERLoss(actor, qvalue, fast_path=False, **kwargs)
    return fast, slow


@pytest.mark.parametrize("actor_kind", ["plain", "probabilistic"])
@pytest.mark.parametrize("data", ["stream", "independent", "single"])
def test_fast_path_equals_the_general_path(actor_kind, data, calls):
    def factory():
        _, qvalue = networks(1)
        actor = probabilistic_actor(0) if actor_kind == "probabilistic" else networks(0)[0]
        return actor, qvalue

    fast, slow = pair(factory, gamma=0.9, trust_region_delta=0.05)
    # The average policy away from the current one, identically in both losses.
    perturb_average(fast)
    slow.target_actor_network_params.update(fast.target_actor_network_params.clone())
    td = {
        "stream": consistent_stream(),
        "independent": sequences((4, 6), seed=3),
        "single": consistent_stream((1, 9))[0],
    }[data]
    assert fast.fast_path_blocker(td) is None
    assert slow.fast_path_blocker(td) == "fast_path is off"
    assert_same(fast, slow, td, calls)
    out = fast(td.clone())
    assert 0 < float(out["trust_region_active"]) <= 1  # the trust region binds somewhere


def image_stream(shape=(3, 7), channels=4, seed=5):
    """``consistent_stream`` with MinAtar-like [C, 10, 10] binary observations."""
    td = sequences(shape, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    stream = (torch.rand(shape[0], shape[1] + 1, channels, 10, 10, generator=gen) < 0.2).float()
    td["observation"], td["next", "observation"] = stream[:, :-1], stream[:, 1:].clone()
    done = td["next", "done"].squeeze(-1)
    td["next", "observation"][done] = torch.rand(int(done.sum()), channels, 10, 10, generator=gen)
    return td


@pytest.mark.parametrize("torso", ["mlp", "minatar"])
@pytest.mark.parametrize("data", ["stream", "independent"])
def test_fast_path_of_the_policy_plus_q_network_equals_the_general_path(torso, data, calls):
    # One network writes logits and Q (make_acer_actor): the fast path calls its torso and
    # heads in turn on tensors, the average policy part by part.
    torch.manual_seed(0)
    if torso == "mlp":
        actor = make_acer_actor(OBS, ACT, hidden_sizes=(16, 16))
        td = consistent_stream() if data == "stream" else sequences((4, 6), seed=3)
    else:
        actor = make_acer_actor((4, 10, 10), ACT, torso="minatar")
        td = image_stream() if data == "stream" else image_stream((4, 6), seed=3)
        if data == "independent":
            td["next", "observation"] = (torch.rand_like(td["next", "observation"]) < 0.2).float()
    fast, slow = pair(lambda: (actor, None), gamma=0.9, trust_region_delta=0.05)
    perturb_average(fast)
    slow.target_actor_network_params.update(fast.target_actor_network_params.clone())
    assert fast.fast_path_blocker(td) is None
    assert_same(fast, slow, td, calls)
    if torso == "mlp":  # the perturbed average policy binds the trust region somewhere
        assert 0 < float(fast(td.clone())["trust_region_active"]) <= 1


def test_fast_path_with_padding_and_another_lambda(calls):
    fast, slow = pair()
    for loss in (fast, slow):
        loss.make_value_estimator("retrace", gamma=0.95, lmbda=0.8)
    td = consistent_stream((3, 7))
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, 5:] = False
    mask[2, 3:] = False
    td["mask"] = mask
    assert_same(fast, slow, td, calls)


def _shared_head():
    torch.manual_seed(1)
    return make_acer_actor(OBS, ACT, hidden_sizes=(16,)), None


@pytest.mark.parametrize("layout", ["separate", "policy-plus-Q"])
def test_fast_path_follows_the_average_policy_updates(layout, calls):
    fast, slow = pair() if layout == "separate" else pair(_shared_head)
    td = consistent_stream()
    optimizer = torch.optim.SGD(fast.parameters(), lr=0.5)
    average = SoftUpdate(fast, eps=0.5)
    for _ in range(3):  # the online and the average parameters drift apart
        out = fast(td.clone())
        optimizer.zero_grad()
        (out["loss_objective"] + out["loss_critic"]).backward()
        optimizer.step()
        average.step()
    calls["fast"] = 0
    # The general path on the same parameters (the networks are shared; copy the average).
    slow.target_actor_network_params.update(fast.target_actor_network_params.clone())
    assert_same(fast, slow, td, calls)


def test_blockers():
    td = sequences()
    actor, qvalue = networks()
    assert ACERLoss(actor, qvalue).fast_path_blocker(td) is None
    assert ACERLoss(make_acer_actor(OBS, ACT), None).fast_path_blocker(td) is None
    recurrent = ACERLoss(make_acer_actor(OBS, ACT, recurrent="gru"), None)
    assert recurrent.fast_path_blocker(td) == "the networks are recurrent"
    # A policy-plus-Q network whose head reads an entry the batch does not hold.
    rewired = make_acer_actor(OBS, ACT)
    rewired.module[0].module[1].in_keys = ["other"]
    assert ACERLoss(rewired, None).fast_path_blocker(td) == (
        f"the network input 'other' is not a tensor of batch shape {td.batch_size}"
    )
    hooked_part = make_acer_actor(OBS, ACT)
    hooked_part.module[0].module[0].register_forward_hook(lambda *args: None)
    assert "hooks" in ACERLoss(hooked_part, None).fast_path_blocker(td)
    hooked = ACERLoss(*networks())
    hooked.actor_network.register_forward_hook(lambda *args: None)
    assert "hooks" in hooked.fast_path_blocker(td)
    not_a_module = TensorDictModule(lambda x: x, ["observation"], ["logits"])
    blocker = ACERLoss(not_a_module, networks()[1]).fast_path_blocker(td)
    assert blocker == (
        "actor: part 0 of the network: TensorDictModule does not wrap a plain nn.Module"
    )
    no_q = TensorDictModule(torch.nn.Linear(OBS, ACT), ["observation"], ["logits"])
    assert ACERLoss(no_q, None).fast_path_blocker(td) == (
        "actor (writing the Q network's output): the network writes no ['action_value']"
    )
    renamed = ACERLoss(*networks())
    renamed.set_keys(logits="policy_logits")
    assert "'policy_logits'" in renamed.fast_path_blocker(td)

    class Sub(ACERLoss):
        def _q_ret(self, *args):
            return super()._q_ret(*args)

    assert Sub(*networks()).fast_path_blocker(td) == "a subclass overrides _q_ret"
    frames = sequences()
    frames["observation"] = frames["observation"][..., None]  # [B, T, O, 1]: still a tensor
    assert ACERLoss(*networks()).fast_path_blocker(frames) is None


def test_fast_path_names_mismatched_action_counts():
    actor = TensorDictModule(torch.nn.Linear(OBS, 2), ["observation"], ["logits"])
    qvalue = TensorDictModule(torch.nn.Linear(OBS, 3), ["observation"], ["action_value"])
    loss = ACERLoss(actor, qvalue)
    td = sequences((3, 5), behavior=torch.zeros(3, 5, 2))
    td["action"] = td["action"].clamp_max(1)
    assert loss.fast_path_blocker(td) is None
    with pytest.raises(ValueError, match=r"'action_value' \(shape \[3, 5, 3\]\)"):
        loss(td)


class _TwoInputs(torch.nn.Module):
    """Logits (or Q) from the observation and a second entry, e.g. the previous action."""

    def __init__(self, width: int, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.obs, self.extra = torch.nn.Linear(OBS, width), torch.nn.Linear(2, width)

    def forward(self, observation, extra):
        return self.obs(observation) + self.extra(extra)


@pytest.mark.parametrize("data", ["stream", "independent"])
def test_fast_path_of_networks_reading_several_entries_equals_the_general_path(data, calls):
    # Each network reads the observation and a second entry ("extra"), the Q network through
    # a two-step TensorDictSequential (a torso writing "features", then the head): the fast
    # path runs them as plain graphs, with x_{t+1}'s entries from ("next", ...).
    from tensordict.nn import TensorDictSequential

    def factory():
        actor = TensorDictModule(_TwoInputs(ACT, 0), ["observation", "extra"], ["logits"])
        qvalue = TensorDictSequential(
            TensorDictModule(_TwoInputs(8, 1), ["observation", "extra"], ["features"]),
            TensorDictModule(torch.nn.Linear(8, ACT), ["features"], ["action_value"]),
        )
        return actor, qvalue

    fast, slow = pair(factory, gamma=0.9, trust_region_delta=0.05)
    perturb_average(fast)
    slow.target_actor_network_params.update(fast.target_actor_network_params.clone())
    td = consistent_stream() if data == "stream" else sequences((4, 6), seed=3)
    gen = torch.Generator().manual_seed(9)
    stream = torch.randn(*td.batch_size[:-1], td.batch_size[-1] + 1, 2, generator=gen)
    td["extra"], td["next", "extra"] = stream[..., :-1, :], stream[..., 1:, :].clone()
    if data == "independent":
        td["next", "extra"] = torch.randn(td["next", "extra"].shape, generator=gen)
    assert fast.fast_path_blocker(td) is None
    assert_same(fast, slow, td, calls)
    del td["next", "extra"]
    assert "'extra'" in fast.fast_path_blocker(td)
