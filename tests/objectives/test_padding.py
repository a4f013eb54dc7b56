"""Padded steps never reach a valid step's loss, target, priority or gradient.

The batches are real ``split_trajectories`` output of a TorchRL ``Collector``
(``split_trajs=True``): every trajectory is padded to the longest, and the last one of the
batch is cut by the batch end after a step that is *not* done, so its padding follows a step
whose trace would otherwise continue into it.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictSequential
from torchrl.collectors import Collector
from torchrl.envs import GymEnv
from torchrl.objectives import HardUpdate

from ac_extensions.modules import make_actor_critic, make_continuous_actor_critic, make_qvalue
from ac_extensions.objectives import ACERLoss, ContinuousACERLoss, ReactorLoss

MASK = ("collector", "mask")
LOSS_KEYS = ("loss_objective", "loss_critic", "loss_entropy")


def collect(env: GymEnv, actor, statistics: tuple[str, ...], frames: int) -> TensorDictBase:
    """One ``split_trajs`` batch ``[n, L]`` collected by ``actor`` (µ stored under behavior)."""
    torch.manual_seed(0)
    env.set_seed(0)
    policy = TensorDictSequential(
        actor, *(TensorDictModule(torch.nn.Identity(), [k], [("behavior", k)]) for k in statistics)
    )
    collector = Collector(
        env, policy, frames_per_batch=frames, total_frames=frames, split_trajs=True
    )
    batch = next(iter(collector))
    collector.shutdown()
    mask = batch.get(MASK)
    assert not bool(mask.all()), "the batch has no padding"
    # The last trajectory is cut by the batch end: its last valid step is not done.
    last = batch[-1]
    assert not bool(last["next", "done"][last.get(MASK)][-1]), "the cut trajectory ended"
    return batch


def scramble_padding(batch: TensorDictBase, num_actions: int | None, seed: int = 1):
    """A copy whose padded entries (every leaf, every step where the mask is False) are random."""
    gen = torch.Generator().manual_seed(seed)
    out = batch.clone()
    padded = ~batch.get(MASK)  # [n, L]
    for key in out.keys(True, True):
        if key == MASK or (isinstance(key, tuple) and key[0] == "collector"):
            continue
        value = out.get(key)
        if value.shape[:2] != padded.shape:
            continue
        if value.dtype == torch.bool:
            noise = torch.rand(value.shape, generator=gen) < 0.5
        elif value.is_floating_point():
            noise = 3 * torch.randn(value.shape, generator=gen, dtype=value.dtype)
        elif key == "action" and num_actions is not None:
            noise = torch.randint(num_actions, value.shape, generator=gen, dtype=value.dtype)
        else:
            continue
        where = padded.reshape(*padded.shape, *([1] * (value.dim() - 2)))
        out.set(key, torch.where(where, noise, value))
    return out


def outputs_and_grads(loss, batch):
    out = loss(batch)
    params = [p for p in loss.parameters() if p.requires_grad]
    total = sum(out[k] for k in LOSS_KEYS)
    grads = torch.autograd.grad(total, params, allow_unused=True)
    return out.detach(), grads


def assert_same(first, second):
    (out_a, grads_a), (out_b, grads_b) = first, second
    for key in out_a.keys():
        torch.testing.assert_close(out_a[key], out_b[key], msg=lambda m, k=key: f"{k}: {m}")
    for a, b in zip(grads_a, grads_b, strict=True):
        if a is None or b is None:
            assert a is None and b is None
        else:
            torch.testing.assert_close(a, b)


def by_trajectory(loss, batch, key):
    """The length-weighted mean of ``key`` over each trajectory alone (no padding, no mask)."""
    total, steps = 0.0, 0
    for row in batch:
        valid = row[row.get(MASK)].exclude("collector").unsqueeze(0)  # [1, len]
        total += float(loss(valid)[key].detach()) * valid.numel()
        steps += valid.numel()
    return total / steps


@pytest.fixture(scope="module")
def cartpole_batch():
    actor, _ = make_actor_critic(4, 2, hidden_sizes=(16,))
    env = GymEnv("CartPole-v1", categorical_action_encoding=True)
    return collect(env, actor, ("logits",), frames=120)


@pytest.fixture(scope="module")
def pendulum_batch():
    actor, _ = make_continuous_actor_critic(3, 1, hidden_sizes=(16,))
    return collect(GymEnv("Pendulum-v1"), actor, ("loc", "scale"), frames=260)


def acer_loss():
    torch.manual_seed(3)
    actor, _ = make_actor_critic(4, 2, hidden_sizes=(16,))
    return ACERLoss(actor, make_qvalue(4, 2, hidden_sizes=(16,)), gamma=0.9)


def reactor_loss(distributional: bool):
    torch.manual_seed(4)
    actor, _ = make_actor_critic(4, 2, hidden_sizes=(16,))
    out = ["action_value_logits"] if distributional else ["action_value"]
    width = 2 * 11 if distributional else 2
    net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, width))
    if distributional:
        net.append(torch.nn.Unflatten(-1, (2, 11)))
    critic = TensorDictModule(net, ["observation"], out)
    loss = ReactorLoss(
        actor, critic, distributional=distributional, num_atoms=11, v_min=-5, v_max=5, gamma=0.9
    )
    HardUpdate(loss, value_network_update_interval=1000)
    return loss


def continuous_loss():
    torch.manual_seed(5)
    actor, critic = make_continuous_actor_critic(3, 1, hidden_sizes=(16,))
    return ContinuousACERLoss(actor, critic, gamma=0.9)


class TestDiscreteACER:
    def test_padding_changes_nothing(self, cartpole_batch):
        loss = acer_loss()
        torch.manual_seed(0)
        clean = outputs_and_grads(loss, cartpole_batch)
        torch.manual_seed(0)
        assert_same(clean, outputs_and_grads(loss, scramble_padding(cartpole_batch, 2)))

    def test_equals_each_trajectory_alone(self, cartpole_batch):
        loss = acer_loss()
        for key in ("loss_critic", "loss_objective"):
            expected = by_trajectory(loss, cartpole_batch, key)
            assert float(loss(cartpole_batch)[key]) == pytest.approx(expected, rel=1e-5)

    def test_a_cut_trajectory_still_bootstraps_from_its_next_observation(self, cartpole_batch):
        # Control: the test above can fail. The cut trajectory's last valid step reads its own
        # ("next", "observation"): changing it changes the critic's loss.
        loss = acer_loss()
        edited = cartpole_batch.clone()
        last = int(edited[-1].get(MASK).sum()) - 1
        edited["next", "observation"][-1, last] += 1.0
        assert float(loss(edited)["loss_critic"]) != float(loss(cartpole_batch)["loss_critic"])


@pytest.mark.parametrize("distributional", [True, False], ids=["distributional", "scalar"])
class TestReactor:
    def test_padding_changes_nothing(self, cartpole_batch, distributional):
        loss = reactor_loss(distributional)
        first, second = cartpole_batch.clone(), scramble_padding(cartpole_batch, 2)
        assert_same(outputs_and_grads(loss, first), outputs_and_grads(loss, second))
        valid = cartpole_batch.get(MASK)
        torch.testing.assert_close(first["td_error"][valid], second["td_error"][valid])
        with torch.no_grad():
            targets = loss.targets(first)[valid], loss.targets(second)[valid]
        torch.testing.assert_close(*targets)

    def test_equals_each_trajectory_alone(self, cartpole_batch, distributional):
        loss = reactor_loss(distributional)
        for key in ("loss_critic", "loss_objective"):
            expected = by_trajectory(loss, cartpole_batch, key)
            got = float(loss(cartpole_batch.clone())[key])
            assert got == pytest.approx(expected, rel=1e-5)


class TestContinuousACER:
    def test_padding_changes_nothing(self, pendulum_batch):
        loss = continuous_loss()
        torch.manual_seed(0)  # the bias correction samples a'_t ∼ π: same draws both times
        clean = outputs_and_grads(loss, pendulum_batch)
        torch.manual_seed(0)
        assert_same(clean, outputs_and_grads(loss, scramble_padding(pendulum_batch, None)))
        valid = pendulum_batch.get(MASK)
        with torch.no_grad():
            torch.manual_seed(0)
            a = loss.targets(pendulum_batch)
            torch.manual_seed(0)
            b = loss.targets(scramble_padding(pendulum_batch, None))
        for key in ("q_ret", "q_opc", "value_target"):
            torch.testing.assert_close(a[key][valid], b[key][valid])


def test_cut_traces_at_padding_marks_the_last_valid_step_and_the_padding():
    from ac_extensions.objectives._replay import cut_traces_at_padding

    done = torch.tensor([[0, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool).unsqueeze(-1)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    td = TensorDict({("next", "done"): done}, [2, 4])
    out = cut_traces_at_padding(td, mask, "done")
    expected = torch.tensor([[0, 1, 1, 1], [0, 0, 0, 1]], dtype=torch.bool).unsqueeze(-1)
    assert torch.equal(out["next", "done"], expected)
    assert torch.equal(td["next", "done"], done)  # the input is untouched
    assert cut_traces_at_padding(td, None, "done") is td
