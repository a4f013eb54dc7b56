"""Fault injection: dead workers, raising envs, NaN rewards and losses, failing checkpoint writes.

Each fault must end in one of two ways: the run stops promptly with an error naming the cause, or
goes on after a warning and a counted skip; the newest checkpoint stays intact either way. The
tests that spawn collector workers carry a timeout, so a hang fails fast. Budgets: 1 worker ×
2 envs × 16 steps.

The faulty environments below are registered on import; the collector workers import this
module through gymnasium's ``"module:Id"`` form of the env id, so they register them too.
"""

from __future__ import annotations

import errno
import json
import math
import os
import signal
import time
import warnings
from dataclasses import replace
from functools import partial

import gymnasium as gym
import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer

from ac_extensions.cli import train as train_cli
from ac_extensions.modules import collection_policy
from ac_extensions.recipes import PPOConfig
from ac_extensions.recipes import ppo as ppo_recipe
from ac_extensions.runtime import (
    Checkpointer,
    NonFiniteError,
    NonFiniteGuard,
    TrainingWarning,
    WorkerError,
    sequences,
    start_collector,
    stop_collector,
    store_sequences,
)
from ac_extensions.runtime import checkpoint as checkpoint_module
from ac_extensions.runtime import collection as common
from ac_extensions.runtime import loop as loop_module

RAISE_AT = 40
"""``RaisingCartPole-v0`` raises in its 40th step: in the third batch of 16 steps. (An env takes
a few steps before the first batch, for TorchRL's spec checks: positions are kept away from
batch edges.)"""
NAN_AT, NAN_FROM = 24, 72
"""``NaNRewardCartPole-v0``'s reward is NaN at step 24 (batch 1) and from step 72 on (batches 4,
5, ...)."""


class FaultyCartPole(gym.Wrapper):
    """CartPole-v1 counting its own steps: it raises at ``raise_at``, its reward is NaN at the
    steps in ``nan_at`` and from ``nan_from`` on."""

    def __init__(self, raise_at=None, nan_at=(), nan_from=None):
        super().__init__(gym.make("CartPole-v1"))
        self.raise_at, self.nan_at, self.nan_from = raise_at, set(nan_at), nan_from
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.raise_at is not None and self.steps >= self.raise_at:
            raise ValueError(f"injected failure at step {self.steps}")
        observation, reward, terminated, truncated, info = self.env.step(action)
        if self.steps in self.nan_at or (self.nan_from is not None and self.steps >= self.nan_from):
            reward = math.nan
        return observation, reward, terminated, truncated, info


for _id, _kwargs in (
    ("RaisingCartPole-v0", {"raise_at": RAISE_AT}),
    ("NaNRewardCartPole-v0", {"nan_at": (NAN_AT,), "nan_from": NAN_FROM}),
):
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=FaultyCartPole, kwargs=_kwargs, disable_env_checker=True)


def env_id(name: str) -> str:
    return f"{__name__}:{name}"


TINY = PPOConfig(workers=1, envs_per_worker=2, rollout_length=16, epochs=2, minibatch_size=32)


@pytest.fixture
def collectors(monkeypatch) -> list:
    """The collectors the on-policy recipe starts (the test hook for killing a worker)."""
    started: list = []

    def recording(*args, **kwargs):
        started.append(start_collector(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(loop_module, "start_collector", recording)
    return started


def latest_counters(directory) -> dict:
    state = Checkpointer(directory).load()
    assert all(torch.isfinite(v).all() for v in state["loss"].values() if v.is_floating_point())
    return state["counters"]


# --- Non-finite updates and batches (no workers) -----------------------------------------------


def test_guard_skips_non_finite_updates_and_stops_after_a_streak():
    net = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    guard = NonFiniteGuard(max_consecutive=3)

    def update(scale: float) -> bool:
        loss = net(torch.ones(1, 2)).sum() * scale
        optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        ok = guard.update_ok(loss, grad_norm)
        if ok:
            optimizer.step()
        return ok

    before = [p.detach().clone() for p in net.parameters()]
    with pytest.warns(TrainingWarning, match=r"non-finite update skipped \(loss nan.*1 in a row"):
        assert not update(math.nan)
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
    with pytest.warns(TrainingWarning, match="2 in a row, 2 in total"):
        assert not update(math.inf)
    assert update(1.0)  # a finite update goes ahead and ends the streak
    assert guard.metrics() == {"train/skipped_updates": 2.0, "train/skipped_batches": 0.0}
    with pytest.warns(TrainingWarning, match="1 in a row, 3 in total"):
        assert not update(math.nan)
    with pytest.warns(TrainingWarning):
        assert not update(math.nan)
    with pytest.raises(NonFiniteError, match="3 non-finite updates in a row"):
        update(math.nan)
    # The counts survive a checkpoint (cumulative over a resumed run).
    resumed = NonFiniteGuard()
    resumed.load_state_dict(dict(guard.state_dict(), batches=7))
    assert resumed.metrics() == {"train/skipped_updates": 5.0, "train/skipped_batches": 0.0}


def test_guard_drops_batches_with_non_finite_observations_or_rewards():
    guard = NonFiniteGuard(max_consecutive=2)
    batch = TensorDict(
        {
            "observation": torch.zeros(4, 3, 2),
            "action": torch.zeros(4, 3, dtype=torch.long),
            "next": {"observation": torch.zeros(4, 3, 2), "reward": torch.ones(4, 3, 1)},
        },
        batch_size=[4, 3],
    )
    assert guard.batch_ok(batch)
    batch["next", "reward"][1, 2] = math.nan
    with pytest.warns(TrainingWarning, match=r"batch of 12 frames dropped.*'reward'\) \(1 of 12"):
        assert not guard.batch_ok(batch)
    batch["next", "reward"][1, 2] = 1.0
    assert guard.batch_ok(batch)  # ends the streak
    batch["observation"][0, 0, 1] = -math.inf
    with pytest.warns(TrainingWarning, match="'observation' \\(1 of 24\\)"):
        assert not guard.batch_ok(batch)
    with pytest.raises(NonFiniteError, match="2 non-finite batches in a row"):
        guard.batch_ok(batch)
    assert guard.skipped_batches == 3 and guard.skipped_updates == 0


@pytest.mark.timeout(120)
def test_reactor_learner_step_skips_a_nan_loss_entirely():
    # No optimiser step, no priorities written, no target-network step; then learning resumes.
    from ac_extensions.recipes import reactor

    torch.manual_seed(0)
    config = reactor.ReactorConfig(
        workers=1,
        envs_per_worker=2,
        rollout_length=8,
        sequence_length=4,
        batch_size=2,
        replay_capacity=16,
        hidden_sizes=(8,),
        recurrent_size=8,
        num_atoms=11,
    )
    actor, loss, optimizer, target = reactor.build(config)
    env = reactor.make_env(config, actor)
    env.set_seed(0)
    with torch.no_grad():
        batch = env.rollout(config.rollout_length, actor, break_when_any_done=False)
    env.close()
    replay = reactor.make_replay(config)
    store_sequences(replay, batch, list(dict.fromkeys(loss.in_keys)), 0, 0.1)
    guard = NonFiniteGuard(max_consecutive=2)
    # A finite loss whose gradient is NaN (the losses themselves reject NaN inputs and NaN
    # intermediate values with a ValueError).
    weight = next(p for p in loss.actor_network_params.values(True, True) if p.dim() == 2)
    hook = weight.register_hook(lambda grad: torch.full_like(grad, math.nan))
    with pytest.warns(TrainingWarning, match=r"non-finite update skipped \(loss [-\d.]+, gradi"):
        assert reactor.learner_step(loss, optimizer, target, replay, config, guard) is None
    hook.remove()
    assert not optimizer.state  # Adam never stepped
    assert not replay.sampler.priorities(replay.storage).assigned.any()
    assert target.counter == 0
    metrics = reactor.learner_step(loss, optimizer, target, replay, config, guard)
    assert metrics is not None and all(math.isfinite(v) for v in metrics.values())
    assert guard.metrics()["train/skipped_updates"] == 1.0 and guard.updates_in_a_row == 0


# --- Checkpoint writes failing half-way (no workers) -------------------------------------------


def _state(step: int) -> dict:
    return {"counters": {"batches": step}, "value": torch.arange(1000.0) + step}


def _full_disk(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _fail_half_way(stage: str, monkeypatch, replay) -> None:
    """Make the next checkpoint write fail with ENOSPC at ``stage``, after writing some bytes."""
    if stage == "state":
        real_save = torch.save

        def save(obj, f, *args, **kwargs):
            real_save(obj, f, *args, **kwargs)
            f.truncate(100)  # the first 100 bytes reached the disk, then it was full
            _full_disk()

        monkeypatch.setattr(torch, "save", save)
    elif stage == "replay":
        real_dumps = replay.dumps

        def dumps(path):
            real_dumps(path)
            with open(os.path.join(path, "storage", "partial.bin"), "wb") as f:
                f.write(b"\x00" * 100)
            _full_disk()

        monkeypatch.setattr(replay, "dumps", dumps)
    else:  # the checkpoint is complete and renamed; writing the pointer fails
        monkeypatch.setattr(checkpoint_module, "atomic_write_text", _full_disk)


@pytest.mark.parametrize("stage", ["state", "replay", "pointer"])
def test_checkpoint_write_failing_half_way_keeps_the_previous_checkpoint(stage, tmp_path):
    replay = ReplayBuffer(storage=LazyTensorStorage(64), batch_size=4)
    replay.extend(TensorDict({"x": torch.arange(10.0)}, batch_size=[10]))
    checkpointer = Checkpointer(tmp_path, every=1)
    checkpointer.save(1, _state(1), replay=replay)
    expected = sorted(p.name for p in tmp_path.iterdir())
    assert expected == ["ckpt-000000001", "latest"]

    with pytest.MonkeyPatch.context() as patch:
        _fail_half_way(stage, patch, replay)
        # A periodic save: a warning, and the run goes on.
        with pytest.warns(TrainingWarning, match="checkpoint ckpt-000000002 not written") as got:
            assert checkpointer.maybe_save(2, lambda: _state(2), replay=replay) is None
        assert "No space left on device" in str(got[0].message)
        assert "ckpt-000000001 is still the newest, intact" in str(got[0].message)
        assert checkpointer.failed_saves == 1
        # The final save raises (a run must not end without its last checkpoint).
        with pytest.raises(OSError, match="ckpt-000000003 not written") as raised:
            checkpointer.maybe_save(3, lambda: _state(3), replay=replay, final=True)
        assert raised.value.errno == errno.ENOSPC
    # Nothing half-written is left, and the previous checkpoint loads, replay included.
    assert sorted(p.name for p in tmp_path.iterdir()) == expected
    assert checkpointer.load()["counters"] == {"batches": 1}
    assert torch.equal(checkpointer.load()["value"], _state(1)["value"])
    restored = ReplayBuffer(storage=LazyTensorStorage(64), batch_size=4)
    checkpointer.load_replay(restored)
    assert torch.equal(restored[:]["x"], torch.arange(10.0))
    # The next save, with room again, succeeds.
    checkpointer.maybe_save(4, lambda: _state(4), replay=replay)
    assert checkpointer.load()["counters"] == {"batches": 4}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-000000004", "latest"]


# --- Dead workers ------------------------------------------------------------------------------


class FakeProcess:
    def __init__(self, pid, exitcode=None, closed=False):
        self.pid, self.exitcode, self._closed = pid, exitcode, closed


class FakeCollector:
    def __init__(self, procs, reports):
        self.procs, self.worker_pids, self.worker_reports = procs, [p.pid for p in procs], reports


def test_worker_failure_names_each_dead_worker_and_its_cause(monkeypatch, tmp_path):
    monkeypatch.setenv(common.WORKER_TRACEBACKS_VARIABLE, "1")  # the default: workers print them
    alive = FakeProcess(101)
    assert common.worker_failure(FakeCollector([alive, FakeProcess(102)], tmp_path)) is None
    # Killed, exited, stopped by TorchRL after another died (closed: not reported), raised.
    procs = [
        alive,
        FakeProcess(102, exitcode=-signal.SIGKILL),
        FakeProcess(103, exitcode=3),
        FakeProcess(104, exitcode=-signal.SIGTERM, closed=True),
        FakeProcess(105, exitcode=1),
    ]
    (tmp_path / "105.txt").write_text("KeyError: 'x' (env.py:7 in step)\n")
    failure = common.worker_failure(FakeCollector(procs, tmp_path))
    assert str(failure) == (
        "collector worker 1 (pid 102) was killed by signal SIGKILL; "
        "collector worker 2 (pid 103) exited with code 3 (its stderr has the details); "
        "collector worker 4 (pid 105) died: its environment raised KeyError: 'x' "
        "(env.py:7 in step); traceback on its stderr; training stopped"
    )
    assert (failure.worker, failure.pid, failure.cause) == (1, 102, "was killed by signal SIGKILL")
    assert isinstance(failure, RuntimeError)


def _wait_dead(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[-1].startswith("Z"):
                    return  # a zombie: dead, waiting for its parent
        except FileNotFoundError:
            return
        time.sleep(0.02)


@pytest.mark.timeout(120)
def test_worker_killed_while_weights_sync_raises_worker_error_instead_of_hanging():
    # TorchRL waits for the weight acknowledgment of a dead worker forever.
    config = replace(TINY, frames=10_000)
    actor, critic, *_ = ppo_recipe.build(config)
    policy = collection_policy(actor, critic)
    collector = start_collector(config, partial(ppo_recipe.make_env, config), policy)
    try:
        next(iter(collector))
        pid = collector.procs[0].pid
        os.kill(pid, signal.SIGKILL)
        _wait_dead(pid)
        start = time.monotonic()
        with pytest.raises(WorkerError) as raised:
            collector.update_policy_weights_()
        assert time.monotonic() - start < 5
        assert str(raised.value).startswith(
            f"collector worker 0 (pid {pid}) was killed by signal SIGKILL; training stopped"
        )
        assert (raised.value.worker, raised.value.pid) == (0, pid)
    finally:
        start = time.monotonic()
        stop_collector(collector)
        assert time.monotonic() - start < 20
    assert not any(proc.is_alive() for proc in collector.procs if not proc._closed)
    assert not os.path.exists(collector.worker_reports)


@pytest.mark.timeout(150)
def test_worker_killed_mid_run_stops_the_run_and_keeps_the_checkpoint(collectors, tmp_path):
    run = ppo_recipe.train(replace(TINY, frames=10_000), checkpoint=Checkpointer(tmp_path, every=1))
    next(run)
    next(run)  # checkpoint 1 written on the way
    pid = collectors[0].procs[0].pid
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerError, match=rf"worker 0 \(pid {pid}\) was killed by signal SIGKILL"):
        next(run)  # checkpoint 2, then the next collection notices
    assert time.monotonic() - start < 10
    assert not any(p.is_alive() for p in collectors[0].procs if not p._closed)  # shut down
    assert latest_counters(tmp_path)["batches"] == 2


@pytest.mark.timeout(150)
def test_env_raising_inside_step_ends_the_cli_run_with_one_line(monkeypatch, tmp_path, capfd):
    # main() sets these with setdefault; pre-set them so monkeypatch restores them afterwards.
    monkeypatch.setenv("RL_LOGGING_LEVEL", "WARNING")
    monkeypatch.setenv("PYTHONWARNINGS", "ignore")
    monkeypatch.setenv(common.WORKER_TRACEBACKS_VARIABLE, "0")
    monkeypatch.delenv("AC_DEBUG", raising=False)
    out = tmp_path / "run"
    code = train_cli.main(
        [
            "ppo",
            "--env",
            env_id("RaisingCartPole-v0"),
            "--frames",
            "320",
            "--workers",
            "1",
            "--envs-per-worker",
            "2",
            "--rollout-length",
            "16",
            "--epochs",
            "2",
            "--checkpoint-every",
            "1",
            "--quiet",
            "--out",
            str(out),
        ]
    )
    err = capfd.readouterr().err  # the worker's stderr too: it printed no traceback
    assert code == 1
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("ac-train: error: WorkerError: collector worker 0 (pid "), err
    assert (
        f"died: its environment raised ValueError: injected failure at step {RAISE_AT} "
        "(test_faults.py:" in err
    ), err
    assert err.endswith("in step); training stopped (set AC_DEBUG=1 for the traceback)\n"), err
    # Two batches were trained and checkpointed before the third failed.
    assert latest_counters(out / "checkpoints")["batches"] == 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is False and summary["frames"] == 64


# --- NaN rewards in a run ----------------------------------------------------------------------


@pytest.mark.timeout(150)
def test_nan_rewards_drop_their_batches_and_a_streak_stops_the_run(tmp_path):
    config = replace(
        TINY, env_id=env_id("NaNRewardCartPole-v0"), frames=10_000, max_nonfinite_updates=2
    )
    metrics = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(NonFiniteError, match="2 non-finite batches in a row") as raised:
            for m in ppo_recipe.train(config, checkpoint=Checkpointer(tmp_path, every=1)):
                metrics.append(m)
    assert "batch of 32 frames dropped: non-finite ('next', 'reward') (32 of 32)" in str(
        raised.value
    )
    dropped = [str(w.message) for w in caught if issubclass(w.category, TrainingWarning)]
    assert len(dropped) == 2, dropped
    assert "('next', 'reward') (2 of 32) (1 in a row, 1 in total)" in dropped[0]
    assert "('next', 'reward') (" in dropped[1] and "(1 in a row, 2 in total)" in dropped[1]
    # Batches 1 and 4 were dropped (no loss metrics), 0, 2, 3 trained; 5 stopped the run.
    assert [m["train/skipped_batches"] for m in metrics] == [0, 1, 1, 1, 2]
    assert ["train/loss_objective" in m for m in metrics] == [True, False, True, True, False]
    assert all(m["train/skipped_updates"] == 0 for m in metrics)
    # Episodes that saw the NaN reward are left out of the returns (no NaN window).
    assert all(
        math.isnan(m["train/return_window"]) == (m["train/return_window_size"] == 0)
        for m in metrics
    )
    assert metrics[-1]["time/frames"] == 5 * 32
    # The newest checkpoint is the one after batch 4 (finite parameters, counts kept).
    counters = latest_counters(tmp_path)
    assert counters["batches"] == 5 and counters["skipped_batches"] == 2


class _Client:
    """Stands in for a ``RayReplayBuffer.client()``: records what is extended."""

    def __init__(self) -> None:
        self.extended: list = []

    def extend(self, data) -> None:
        self.extended.append(data)


@pytest.mark.parametrize("return_stored", [False, True])
def test_ray_feeder_never_stores_a_non_finite_batch(return_stored):
    from ac_extensions.runtime.ray_backend import ReplayFeeder

    keys = ("observation", ("next", "observation"), ("next", "reward"), ("next", "done"))
    feed = sequences.ReplayFeed(None, keys, ("replay", "sequence"), 0.5, 0, return_stored)
    client = _Client()
    feeder = ReplayFeeder(client, feed, index=0, num_collectors=1)

    def rollout(reward: float) -> TensorDict:
        return TensorDict(
            {
                "observation": torch.zeros(2, 3, 4),
                "policy_version": torch.ones(2, 3),
                "next": {
                    "observation": torch.zeros(2, 3, 4),
                    "reward": torch.full((2, 3, 1), reward),
                    "done": torch.zeros(2, 3, 1, dtype=torch.bool),
                    "episode_reward": torch.zeros(2, 3, 1),
                },
            },
            [2, 3],
        )

    out = feeder(rollout(2.0))
    assert len(client.extended) == 1 and client.extended[0].shape == (6,)
    assert torch.equal(client.extended[0]["next", "reward"], torch.full((6, 1), 1.0))  # scaled
    # what the learner gets back: the stored (scaled) reward with the rows, else the env's
    assert torch.equal(out["next", "reward"], torch.full((2, 3, 1), 1.0 if return_stored else 2.0))

    bad = rollout(2.0)
    bad["next", "observation"][1, 2, 0] = math.inf
    out = feeder(bad)
    assert len(client.extended) == 1  # not stored
    assert torch.isnan(out["next", "reward"]).all()  # so the learner's guard drops it
    guard = NonFiniteGuard(max_consecutive=3)
    with pytest.warns(TrainingWarning, match="dropped"):
        assert not guard.batch_ok(out)
    assert guard.metrics()["train/skipped_batches"] == 1.0
