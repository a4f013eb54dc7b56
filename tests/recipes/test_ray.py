"""The Ray collection backend: ACER and Reactor on a local Ray cluster of 2 collector actors.

The tests marked ``ray`` share one local cluster (``num_cpus=2``: the two collector actors
reserve one CPU each, the replay actor none) and skip without the ``ray`` extra; the others
check the configuration, the CLI and the error without ray, and need no cluster.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time

import pytest
import torch
from tensordict import TensorDict

from ac_extensions.cli._config import UsageError
from ac_extensions.cli.train import parse
from ac_extensions.recipes import a2c, acer, ppo, reactor
from ac_extensions.runtime import Checkpointer, RunConfig, close_replay
from tests._helpers import check_stored_normalisation

WORKERS = 2

pytestmark = pytest.mark.xdist_group("ray")  # one worker runs them all: one cluster, not two


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=WORKERS, include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()


def _cpus_released(ray, timeout: float = 20.0) -> bool:
    """All CPUs free again, i.e. the run's collector actors are gone (ray.kill is async)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ray.available_resources().get("CPU", 0.0) >= WORKERS:
            return True
        time.sleep(0.2)
    return False


def _check_run(metrics: list[dict[str, float]], config) -> None:
    """Frames, returns and weight delivery common to both recipes."""
    batches = math.ceil(config.frames / config.frames_per_batch)
    assert len(metrics) == batches
    assert [m["time/frames"] for m in metrics] == [
        float(config.frames_per_batch * (i + 1)) for i in range(batches)
    ]
    assert sum(m["train/episodes"] for m in metrics) > 0
    assert math.isfinite(metrics[-1]["train/return_window"])
    # Weights reach the actors: the version they act with grows by one per update pushed.
    versions = [m["collector/policy_version"] for m in metrics]
    assert versions == [versions[0] + i for i in range(batches)], versions


@pytest.mark.ray
@pytest.mark.timeout(180)
def test_acer_trains_on_ray_actors_and_checkpoints_their_replay(ray_cluster, tmp_path, monkeypatch):
    from tests.recipes.test_acer import _record_worker_normalisation

    # With observation normalisation: the actors act with the learner's latest weights and
    # statistics (µ's logits they stored = the learner's policy on the raw observations).
    agree = _record_worker_normalisation(monkeypatch)
    config = acer.ACERConfig(
        backend="ray",
        workers=WORKERS,
        envs_per_worker=2,
        rollout_length=16,
        frames=448,
        replay_start=128,
        replay_ratio=2.0,
        batch_size=4,
        normalize_observations=True,
    )
    metrics = list(acer.train(config, checkpoint=Checkpointer(tmp_path, every=0)))
    _check_run(metrics, config)
    assert len(agree) == len(metrics) and all(agree), agree
    assert sum(m["train/replay_updates"] for m in metrics) > 0
    assert math.isfinite(metrics[-1]["train/on_policy/loss_objective"])
    assert metrics[-1]["train/replay_frames"] == config.frames
    # The recipe left the user's cluster running and its own actors stopped.
    assert ray_cluster.is_initialized() and _cpus_released(ray_cluster)

    # The replay actor wrote the checkpoint's replay: a local buffer reads it back, with the
    # actors' sequence ids (2 actors x 2 rows per batch, each id on exactly one row of T).
    local = acer.make_replay(dataclasses.replace(config, backend="local"))
    Checkpointer(tmp_path).load_replay(local)
    assert len(local) == config.frames
    ids = local[:].get(acer.SEQUENCE_KEY).reshape(-1, config.rollout_length)
    assert (ids == ids[:, :1]).all()
    assert sorted(ids[:, 0].tolist()) == list(range(config.frames // config.rollout_length))


@pytest.mark.ray
@pytest.mark.timeout(180)
def test_on_policy_recipe_trains_on_ray_actors(ray_cluster):
    # A2C and PPO share the on-policy recipe; A2C (one epoch) keeps this short.
    config = a2c.A2CConfig(
        backend="ray", workers=WORKERS, envs_per_worker=2, rollout_length=16, frames=320
    )
    metrics = list(a2c.train(config))
    _check_run(metrics, config)
    assert all(math.isfinite(m["train/loss_objective"]) for m in metrics)
    assert ray_cluster.is_initialized() and _cpus_released(ray_cluster)


@pytest.mark.ray
@pytest.mark.timeout(180)
def test_continuous_ppo_on_ray_actors_normalises_with_the_learners_statistics(
    ray_cluster, monkeypatch
):
    config = ppo.PPOConfig(
        env_id="Pendulum-v1",
        backend="ray",
        workers=WORKERS,
        envs_per_worker=2,
        rollout_length=64,
        frames=1024,  # each env 256 steps: its first 200-step episode ends
        epochs=2,
        normalize_observations=True,
        normalize_rewards=True,
    )
    metrics = check_stored_normalisation(monkeypatch, config, ppo.train)
    _check_run(metrics, config)
    assert all(math.isfinite(m["train/loss_objective"]) for m in metrics)


@pytest.mark.ray
@pytest.mark.timeout(180)
def test_reactor_trains_on_ray_actors_with_priorities_in_the_replay_actor(ray_cluster):
    config = reactor.ReactorConfig(
        backend="ray",
        workers=WORKERS,
        envs_per_worker=2,
        rollout_length=16,
        sequence_length=8,
        frames=448,
        replay_start=128,
        replay_capacity=1024,
        batch_size=4,
        acting_steps_per_learning_step=16.0,
    )
    metrics = list(reactor.train(config))
    _check_run(metrics, config)
    assert metrics[-1]["train/learner_steps"] > 0
    assert math.isfinite(metrics[-1]["train/priority_max"])
    assert metrics[-1]["train/replay_frames"] == config.frames
    assert ray_cluster.is_initialized() and _cpus_released(ray_cluster)


@pytest.mark.ray
@pytest.mark.timeout(120)
def test_reactor_priorities_are_written_into_the_ray_hosted_sampler(ray_cluster):
    config = reactor.ReactorConfig(
        backend="ray", rollout_length=8, sequence_length=4, replay_capacity=64, batch_size=2
    )
    replay = reactor.make_replay(config)
    try:
        steps = 4 * config.rollout_length
        data = TensorDict(
            {
                "observation": torch.randn(steps, 4),
                ("next", "reward"): torch.ones(steps, 1),
                reactor.SEQUENCE_KEY: torch.arange(4).repeat_interleave(config.rollout_length),
            },
            batch_size=[steps],
        )
        replay.extend(data)
        sample = replay.sample().reshape(-1, config.sequence_length)
        sample.set("td_error", torch.full(sample.shape, 7.0))
        replay.update_tensordict_priority(sample.select("index", "td_error"))
        actor = replay._rb  # the sampler lives in the replay actor: read its state back
        sampler = ray_cluster.get(actor._getattr.remote("_sampler"))
        table = sampler.priorities(ray_cluster.get(actor._getattr.remote("_storage")))
        starts = sample["index"][:, 0]
        assert table.assigned[starts].all() and (table.priority[starts] == 7.0).all()
        assert table.assigned.sum() == starts.unique().numel()
    finally:
        close_replay(replay)


@pytest.mark.ray
@pytest.mark.timeout(120)
def test_minatar_maps_are_stored_as_uint8_in_the_ray_hosted_replay(ray_cluster):
    # What a collector actor's ReplayFeeder sends (float32 0/1 maps) is stored as uint8 by the
    # replay actor's transform and sampled back as the same float32 values.
    config = reactor.ReactorConfig(
        env_id="MinAtar/Breakout-v1",
        backend="ray",
        rollout_length=8,
        sequence_length=4,
        replay_capacity=64,
        batch_size=2,
    )
    replay = reactor.make_replay(config)
    try:
        steps = 4 * config.rollout_length
        maps = (torch.rand(steps, 4, 10, 10) < 0.3).float()
        data = TensorDict(
            {
                "observation": maps,
                ("next", "observation"): maps.roll(1, 0),
                ("next", "reward"): torch.ones(steps, 1),
                reactor.SEQUENCE_KEY: torch.arange(4).repeat_interleave(config.rollout_length),
            },
            batch_size=[steps],
        )
        (client,) = replay.clients(1)  # as the collector actors write
        client.extend(data)
        storage = ray_cluster.get(replay._rb._getattr.remote("_storage"))._storage
        assert storage["observation"].dtype == storage["next", "observation"].dtype == torch.uint8
        sample = replay.sample()
        assert sample["observation"].dtype == torch.float32
        assert torch.equal(sample["observation"], maps[sample["index"]])
        data["observation"][0, 0, 0, 0] = 0.5
        with pytest.raises(ValueError, match="'observation'"):  # raised in the replay actor
            client.extend(data)
    finally:
        close_replay(replay)


def test_backend_is_validated():
    with pytest.raises(ValueError, match="backend must be 'local' or 'ray', got 'dask'"):
        RunConfig(backend="dask")
    with pytest.raises(ValueError, match=r"ray_address .* needs backend 'ray'"):
        RunConfig(ray_address="auto")
    with pytest.raises(ValueError, match="device 'cuda'"):
        RunConfig(backend="ray", device="cuda")
    assert RunConfig(backend="ray", ray_address="auto").ray_address == "auto"


def test_cli_exposes_the_backend():
    pytest.importorskip("ray")
    _, config, _ = parse(["acer", "--backend", "ray", "--ray-address", "10.0.0.1:6379"])
    assert (config.backend, config.ray_address) == ("ray", "10.0.0.1:6379")
    _, config, _ = parse(["reactor", "--backend", "ray"])
    assert (config.backend, config.ray_address) == ("ray", None)  # a local Ray instance
    _, config, _ = parse(["ppo"])
    assert config.backend == "local"


def test_missing_ray_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'ac-extensions\[ray\]'"):
        next(acer.train(acer.ACERConfig(backend="ray", frames=64)))
    with pytest.raises(UsageError, match=r"ac-extensions\[ray\]"):
        parse(["ppo", "--backend", "ray"])
