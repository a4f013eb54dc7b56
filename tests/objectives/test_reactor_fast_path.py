"""ReactorLoss's fast path (plain tensors) against its general path (TensorDict wrappers)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential
from torchrl.modules import ProbabilisticActor
from torchrl.objectives import HardUpdate

from ac_extensions.modules import make_reactor_actor
from ac_extensions.objectives import ReactorLoss
from ac_extensions.objectives._plain import PlainActorCritic, plain_graph
from tests.objectives.test_reactor import ACT, OBS, N, SharedNet, networks, sequences

LOSS_KEYS = ("loss_objective", "loss_critic", "loss_entropy")


@pytest.fixture
def calls(monkeypatch):
    """Counts the fast path's online passes."""
    count = {"fast": 0}
    original = PlainActorCritic.online

    def counted(self, joint):
        count["fast"] += 1
        return original(self, joint)

    monkeypatch.setattr(PlainActorCritic, "online", counted)
    return count


def with_previous_action_reward(td, seed=7):
    """Add ``prev_action`` [*B, T, A] / ``prev_reward`` [*B, T, 1] streams consistent like the
    observation's (row t + 1's value is ("next", ...) at t except after an episode end)."""
    gen = torch.Generator().manual_seed(seed)
    batch, steps = td.batch_size[:-1], td.batch_size[-1]
    done = td["next", "done"]
    for key, size in (("prev_action", ACT), ("prev_reward", 1)):
        stream = torch.randn(*batch, steps + 1, size, generator=gen)
        now, later = stream[..., :-1, :].clone(), stream[..., 1:, :].clone()
        reset = torch.randn(*batch, steps, size, generator=gen)
        now[..., 1:, :] = torch.where(done[..., :-1, :], reset[..., :-1, :], now[..., 1:, :])
        td[key], td["next", key] = now, later
    return td


def reactor_network(previous_action_reward=False, distributional=True):
    torch.manual_seed(2)
    return make_reactor_actor(
        OBS,
        ACT,
        hidden_sizes=(16,),
        recurrent_size=8,
        num_atoms=N,
        recurrent=False,
        previous_action_reward=previous_action_reward,
        distributional=distributional,
    )


def layouts(name):
    """(actor, critic or None) of each network layout the fast path takes."""
    if name == "separate":
        return networks(0)
    if name == "separate, probabilistic actor":
        actor, critic = networks(0)
        return (
            ProbabilisticActor(
                actor, in_keys=["logits"], distribution_class=torch.distributions.Categorical
            ),
            critic,
        )
    if name == "separate ND":
        return networks(0, distributional=False)
    if name == "shared module":
        torch.manual_seed(0)
        return TensorDictModule(
            SharedNet(), ["observation"], ["logits", "action_value_logits"]
        ), None
    if name == "make_reactor_actor":
        return reactor_network(), None
    if name == "make_reactor_actor, previous action and reward":
        return reactor_network(previous_action_reward=True), None
    if name == "make_reactor_actor ND":
        return reactor_network(distributional=False), None
    raise ValueError(name)


LAYOUTS = [
    "separate",
    "separate, probabilistic actor",
    "separate ND",
    "shared module",
    "make_reactor_actor",
    "make_reactor_actor, previous action and reward",
    "make_reactor_actor ND",
]


def pair(actor, critic, **kwargs):
    """The same networks (same weights) under a fast-path and a general-path loss, their
    target parameters moved away from the online ones identically."""
    kwargs.setdefault("distributional", "ND" not in str(kwargs.pop("layout", "")))
    losses = []
    for fast_path in (True, False):
        loss = ReactorLoss(
            actor, critic, num_atoms=N, v_min=-5.0, v_max=5.0, fast_path=fast_path, **kwargs
        )
        HardUpdate(loss, value_network_update_interval=1000)
        losses.append(loss)
    fast, slow = losses
    target = fast._target_params()
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for value in target.values(include_nested=True, leaves_only=True):
            if value.is_floating_point():
                value.add_(0.3 * torch.randn(value.shape, generator=gen))
    slow._target_params().update(target.clone())
    return fast, slow


def outputs_and_grads(loss, td):
    td = td.clone()
    out = loss(td)
    total = sum(out[k] for k in LOSS_KEYS)
    grads = torch.autograd.grad(total, list(loss.parameters()), allow_unused=True)
    return out, grads, td["td_error"]


def assert_same(fast, slow, td, calls):
    out_fast, grads_fast, priority_fast = outputs_and_grads(fast, td)
    assert calls["fast"] == 1
    out_slow, grads_slow, priority_slow = outputs_and_grads(slow, td)
    assert calls["fast"] == 1  # the general path did not take it
    assert set(out_fast.keys()) == set(out_slow.keys())
    for key in out_slow.keys():
        torch.testing.assert_close(out_fast[key], out_slow[key], msg=key)
    torch.testing.assert_close(priority_fast, priority_slow)
    assert any(g is not None and bool(g.abs().sum() > 0) for g in grads_fast)
    for a, b in zip(grads_fast, grads_slow, strict=True):
        if a is None or b is None:
            assert a is None and b is None
        else:
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("data", ["stream", "independent", "single"])
def test_fast_path_equals_the_general_path(layout, data, calls):
    fast, slow = pair(*layouts(layout), layout=layout, gamma=0.9, lmbda=0.8)
    td = {
        "stream": sequences((3, 7), seed=4),
        "independent": sequences((4, 6), seed=3),
        "single": sequences((1, 9), seed=5)[0],
    }[data]
    if data == "independent":  # no x_{t+1} is row t + 1's: every next step is evaluated
        td["next", "observation"] = torch.randn_like(td["next", "observation"])
    if "previous" in layout:
        td = with_previous_action_reward(td)
    assert fast.fast_path_blocker(td) is None
    assert slow.fast_path_blocker(td) == "fast_path is off"
    assert_same(fast, slow, td, calls)


def test_fast_path_with_padding_and_importance_weights(calls):
    fast, slow = pair(*layouts("make_reactor_actor"), priority_eta=0.5)
    td = sequences((3, 7), seed=6)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, 5:] = False
    mask[2, 3:] = False
    td["mask"] = mask
    td["priority_weight"] = torch.rand(3, 1).expand(3, 7).clone()
    assert_same(fast, slow, td, calls)


def test_fast_path_follows_the_target_updates(calls):
    # Train a few steps with hard target updates every 2 steps; then both paths agree.
    # (The fast path reads the target parameters afresh at every call.)
    actor, _ = layouts("make_reactor_actor")
    fast = ReactorLoss(actor, None, num_atoms=N, v_min=-5.0, v_max=5.0)
    slow = ReactorLoss(actor, None, num_atoms=N, v_min=-5.0, v_max=5.0, fast_path=False)
    updater = HardUpdate(fast, value_network_update_interval=2)
    HardUpdate(slow, value_network_update_interval=1000)
    optimizer = torch.optim.SGD(fast.parameters(), lr=0.5)
    td = sequences((3, 7), seed=4)
    for step in range(4):  # the target is copied at least once, then the online net moves on
        out = fast(td.clone())
        optimizer.zero_grad()
        sum(out[k] for k in LOSS_KEYS).backward()
        optimizer.step()
        if step < 3:
            updater.step()
    calls["fast"] = 0
    slow._target_params().update(fast._target_params().clone())
    assert not torch.equal(  # the target lags the online network
        fast._target_params().flatten_keys(".")["module.0.module.4.module.policy.weight"],
        fast.actor_network_params.flatten_keys(".")["module.0.module.4.module.policy.weight"],
    )
    assert_same(fast, slow, td, calls)


def test_blockers():
    td = sequences()
    assert ReactorLoss(*networks()).fast_path_blocker(td) is None
    recurrent = make_reactor_actor(OBS, ACT, hidden_sizes=(8,), recurrent_size=4, num_atoms=N)
    assert ReactorLoss(recurrent, None).fast_path_blocker(td) == "the networks are recurrent"
    hooked = ReactorLoss(*networks())
    hooked.critic_network.register_forward_hook(lambda *args: None)
    assert "hooks" in hooked.fast_path_blocker(td)
    hooked_part = reactor_network()
    hooked_part.module[0].module[2].register_forward_pre_hook(lambda *args: None)
    assert "hooks" in ReactorLoss(hooked_part, None).fast_path_blocker(td)
    keyword = TensorDictModule(lambda x: x, ["observation"], ["logits"], method="forward")
    blocker = ReactorLoss(keyword, networks()[1]).fast_path_blocker(td)
    assert blocker.startswith("actor: part 0 of the network")
    no_critic = TensorDictModule(torch.nn.Linear(OBS, ACT), ["observation"], ["logits"])
    assert "writes no ['action_value_logits']" in ReactorLoss(no_critic, None).fast_path_blocker(td)

    class Sub(ReactorLoss):
        def _online(self, tensordict):
            return super()._online(tensordict)

    assert Sub(*networks()).fast_path_blocker(td) == "a subclass overrides _online"
    nested = sequences()
    nested["observation"] = nested["observation"].unsqueeze(-1)  # still a tensor: fine
    nested["next", "observation"] = nested["next", "observation"].unsqueeze(-1)
    assert ReactorLoss(*networks()).fast_path_blocker(nested) is None


def test_plain_graph_runs_only_what_an_output_needs():
    calls = []

    class Recorder(torch.nn.Linear):
        def forward(self, x):
            calls.append(self.out_features)
            return super().forward(x)

    torch.manual_seed(0)
    sequence = TensorDictSequential(
        TensorDictModule(Recorder(4, 5), ["x"], ["h"]),
        TensorDictModule(Recorder(5, 6), ["h"], ["a"]),
        TensorDictModule(Recorder(5, 7), ["h"], ["b"]),
    )
    graph = plain_graph(sequence, ["a", "b"])
    assert graph.inputs == ("x",) and graph.needed(["b"]) == (0, 2)
    x = torch.randn(3, 4)
    (b,) = graph.run({"x": x}, ["b"])
    assert calls == [5, 7]
    calls.clear()
    torch.testing.assert_close(b, sequence(TensorDict({"x": x}, [3]))["b"])
    # Under other parameters (functional_call per step) = the sequence under them.
    params = TensorDict.from_module(sequence).clone()
    params.apply_(lambda p: p.add_(1.0))
    (a,) = graph.run({"x": x}, ["a"], graph.parameters_by_step(params))
    with params.to_module(sequence):
        expected = sequence(TensorDict({"x": x}, [3]))["a"]
    torch.testing.assert_close(a, expected)
    again = TensorDictSequential(
        TensorDictModule(torch.nn.Linear(4, 4), ["x"], ["h"]),
        TensorDictModule(torch.nn.Linear(4, 4), ["h"], ["h"]),
    )
    assert "writes 'h' again" in plain_graph(again, ["h"])
