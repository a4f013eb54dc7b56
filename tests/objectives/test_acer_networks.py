"""ACER with its policy-plus-Q network: shared head, CNN torso, recurrent replay."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torchrl.collectors import Collector
from torchrl.envs import GymEnv, TransformedEnv
from torchrl.modules import set_recurrent_mode

import ac_extensions.objectives.acer as acer_module
from ac_extensions.modules import make_acer_actor, recurrent_env_transforms
from ac_extensions.modules.acer import NatureCNN, _Heads
from ac_extensions.objectives import ACERLoss
from tests.objectives.test_acer import sequences

OBS, ACT = 4, 3


def split_networks(actor):
    """The same function as ``actor`` as two modules (policy and Q) sharing the torso."""
    body = actor.module[0]
    torso = body[0].module
    heads: _Heads = body[-1].module
    policy = TensorDictModule(torch.nn.Sequential(torso, heads.policy), ["observation"], ["logits"])
    qvalue = TensorDictModule(
        torch.nn.Sequential(torso, heads.qvalue), ["observation"], ["action_value"]
    )
    return policy, qvalue


def test_shared_head_equals_separate_networks_with_the_same_weights():
    torch.manual_seed(0)
    actor = make_acer_actor(OBS, ACT, hidden_sizes=(16,))
    td = sequences(seed=1)
    shared = ACERLoss(actor, None, gamma=0.9)
    separate = ACERLoss(*split_networks(actor), gamma=0.9)
    out_a = shared(td.clone())
    out_b = separate(td.clone())
    for key in out_a.keys():
        torch.testing.assert_close(out_a[key], out_b[key], msg=key)
    # Gradients reach the shared torso from both the critic and the policy terms.
    total = out_a["loss_objective"] + out_a["loss_critic"]
    params = dict(shared.actor_network_params.items(True, True))
    names = list(params)
    grads = torch.autograd.grad(total, list(params.values()), allow_unused=True)
    prefix = ("module", "0", "module", "0")  # the torso, first module of the sequence
    torso = [g for n, g in zip(names, grads, strict=True) if n[:4] == prefix]
    assert len(torso) == 2 and all(g is not None and g.abs().sum() > 0 for g in torso)


def test_shared_head_without_action_value_is_an_error():
    actor = TensorDictModule(torch.nn.Linear(OBS, ACT), ["observation"], ["logits"])
    with pytest.raises(KeyError, match="action_value"):
        ACERLoss(actor, None)(sequences())


def test_nature_cnn_shapes_and_bad_input():
    net = NatureCNN(4)
    assert net(torch.zeros(5, 4, 84, 84, dtype=torch.uint8)).shape == (5, 512)
    with pytest.raises(ValueError, match=r"\[\*B, C, 84, 84\]"):
        net(torch.zeros(5, 4, 64, 64))


def test_cnn_actor_runs_the_loss_on_frames():
    torch.manual_seed(0)
    actor = make_acer_actor((4, 84, 84), 6, torso="cnn")
    gen = torch.Generator().manual_seed(0)
    shape = (2, 3)
    frames = torch.randint(0, 256, (*shape, 4, 84, 84), dtype=torch.uint8, generator=gen)
    td = TensorDict(
        {
            "observation": frames,
            "action": torch.randint(6, shape, generator=gen),
            ("behavior", "logits"): torch.randn(*shape, 6, generator=gen),
            ("next", "observation"): frames.roll(1, 1),
            ("next", "reward"): torch.ones(*shape, 1),
            ("next", "done"): torch.zeros(*shape, 1, dtype=torch.bool),
            ("next", "terminated"): torch.zeros(*shape, 1, dtype=torch.bool),
        },
        shape,
    )
    out = ACERLoss(actor, None)(td)
    (out["loss_objective"] + out["loss_critic"]).backward()
    assert all(torch.isfinite(v) for v in out.values())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_recurrent_replay_matches_collection_and_step_by_step_values(cell):
    # Collect with a recurrent policy-plus-Q actor (hidden state stored by the primer), then
    # check: (1) replaying the [B, T] sequence in recurrent mode reproduces the collection-time
    # logits (so the loss trains the policy that acted); (2) the loss's next-state values are
    # the step-by-step ones from the stored next hidden states, even across an episode end.
    torch.manual_seed(0)
    actor = make_acer_actor(4, 2, hidden_sizes=(16,), recurrent=cell, recurrent_size=8)
    env = TransformedEnv(GymEnv("CartPole-v1"), recurrent_env_transforms(actor))
    env.set_seed(0)
    collector = Collector(env, actor, frames_per_batch=60, total_frames=60)
    batch = next(iter(collector)).unsqueeze(0)  # [1, 60], episodes end inside
    collector.shutdown()
    assert batch["next", "done"].any()
    batch["behavior", "logits"] = batch["logits"].clone()

    loss = ACERLoss(actor, None, gamma=0.9)
    with set_recurrent_mode(True), torch.no_grad():
        replay_logits, _ = loss._actor_outputs(batch, loss.actor_network_params)
    torch.testing.assert_close(replay_logits, batch["logits"])

    nxt = batch["next"]
    with torch.no_grad():
        _, next_q = loss._policy_and_q(nxt)  # sequential (the loss's own mode for next)
        expected = torch.stack(
            [actor(nxt[:, t].clone())["action_value"] for t in range(nxt.shape[1])], 1
        )
    torch.testing.assert_close(next_q, expected)
    out = loss(batch)
    assert all(torch.isfinite(v) for v in out.values())


@pytest.mark.parametrize("shared", [True, False])
def test_next_values_reuse_the_current_pass_exactly(shared, monkeypatch):
    # A consistent stream (x_{t+1} = next row's observation except after an episode end): the
    # loss shifts its current-pass outputs instead of running the networks on ("next", ...).
    # Same outputs and gradients as the full next pass, and fewer network inputs.
    torch.manual_seed(0)
    actor = make_acer_actor(OBS, ACT, hidden_sizes=(16,))
    networks = (actor, None) if shared else split_networks(actor)
    loss = ACERLoss(*networks)
    gen = torch.Generator().manual_seed(2)
    stream = torch.randn(3, 8, OBS, generator=gen)
    td = sequences((3, 7), seed=4)
    td["observation"], td["next", "observation"] = stream[:, :-1], stream[:, 1:].clone()
    done = td["next", "done"].squeeze(-1)
    td["next", "observation"][done] = torch.randn(int(done.sum()), OBS, generator=gen)

    seen = []
    original = ACERLoss._policy_and_q
    monkeypatch.setattr(
        ACERLoss,
        "_policy_and_q",
        lambda self, x, *args: seen.append(x.numel()) or original(self, x, *args),
    )
    fast = loss(td.clone())
    fast_grads = torch.autograd.grad(
        fast["loss_objective"] + fast["loss_critic"], list(loss.parameters()), allow_unused=True
    )
    # one pass over the current steps and the fresh next observations together
    assert seen == [3 * 7 + int(done[:, :-1].sum()) + 3]
    monkeypatch.setattr(  # the plain full pass on ("next", ...): every next step is fresh
        acer_module, "next_step_plan", lambda td, *_: torch.ones(td.batch_size, dtype=torch.bool)
    )
    full = loss(td.clone())
    full_grads = torch.autograd.grad(
        full["loss_objective"] + full["loss_critic"], list(loss.parameters()), allow_unused=True
    )
    for key in fast.keys():
        torch.testing.assert_close(fast[key], full[key], msg=key)
    for a, b in zip(fast_grads, full_grads, strict=True):
        torch.testing.assert_close(a, b)


def collect_recurrent(cell: str, frames: int = 60):
    """A recurrent policy-plus-Q actor and one CartPole sequence [1, frames] it collected."""
    torch.manual_seed(0)
    actor = make_acer_actor(4, 2, hidden_sizes=(16,), recurrent=cell, recurrent_size=8)
    env = TransformedEnv(GymEnv("CartPole-v1"), recurrent_env_transforms(actor))
    env.set_seed(0)
    collector = Collector(env, actor, frames_per_batch=frames, total_frames=frames)
    batch = next(iter(collector)).unsqueeze(0)
    collector.shutdown()
    batch["behavior", "logits"] = batch["logits"].clone()
    return actor, batch


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_burn_in_rebuilds_a_stale_stored_state(cell):
    # The stored state at step k is replaced by garbage (as if an old network had stored it).
    # With burn_in = k the loss rebuilds it from steps 0..k−1 with the current network, which
    # is the one that collected, so it equals the loss on steps k.. with the true stored state:
    # same values and gradients (no gradient through the prefix). Without burn-in the garbage
    # changes the loss.
    actor, batch = collect_recurrent(cell)
    is_init = batch["is_init"].squeeze(-1)[0]
    k = next(t for t in range(10, 40) if not is_init[t])
    hidden = [key for key in batch.keys() if isinstance(key, str) and "recurrent_state" in key]
    stale = batch.clone()
    for key in hidden:
        stale[key][:, k] = torch.randn_like(stale[key][:, k])

    exact = ACERLoss(actor, None, gamma=0.9)
    burned = ACERLoss(actor, None, gamma=0.9, burn_in=k)
    burned.load_state_dict(exact.state_dict())
    expected = exact(batch[:, k:].clone())
    got = burned(stale.clone())
    for key in expected.keys():
        torch.testing.assert_close(got[key], expected[key], msg=key)
    grads = [
        torch.autograd.grad(out["loss_objective"] + out["loss_critic"], list(m.parameters()))
        for out, m in ((expected, exact), (got, burned))
    ]
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)
    corrupted = exact(stale[:, k:].clone())
    assert not torch.allclose(corrupted["loss_critic"], expected["loss_critic"])


def test_burn_in_bad_input():
    actor = make_acer_actor(OBS, ACT, hidden_sizes=(8,))
    with pytest.raises(ValueError, match="recurrent"):
        ACERLoss(actor, None, burn_in=3)
    recurrent = make_acer_actor(OBS, ACT, hidden_sizes=(8,), recurrent="gru", recurrent_size=4)
    loss = ACERLoss(recurrent, None, burn_in=7)
    td = sequences((2, 7))
    with pytest.raises(ValueError, match="T = 7"):
        loss(td)
    loss.burn_in = 3  # no stored recurrent state in the input
    with pytest.raises(KeyError, match="has no key 'recurrent_state'"):
        loss(td)
