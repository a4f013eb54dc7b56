"""Continuous ACER on MuJoCo: the env family, clipped actions, observation normalisation, the
paper's settings, and a short HalfCheetah-v5 run with a checkpoint and a resume."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from ac_extensions.modules import NORMALIZED_OBSERVATION, FixedNormalScale, ObservationNormalizer
from ac_extensions.recipes import acer as acer_recipe
from ac_extensions.recipes.acer import ACERConfig, build, train
from ac_extensions.runtime import Checkpointer
from ac_extensions.runtime.config import RunConfig
from ac_extensions.runtime.envs import env_family, make_gym_env

pytest.importorskip("mujoco")

ENV = "HalfCheetah-v5"


def test_mujoco_tasks_are_a_family_with_their_own_defaults():
    assert [env_family(e) for e in (ENV, "Hopper-v5", "Walker2d-v5")] == ["mujoco"] * 3
    assert env_family("Pendulum-v1") == "classic"
    assert RunConfig.for_env(ENV).frames == 1_000_000
    config = ACERConfig.for_env(ENV)
    assert config.normalize_observations and config.hidden_sizes == (256, 256)
    assert ACERConfig.for_env("Pendulum-v1") == ACERConfig(env_id="Pendulum-v1")


def test_actions_are_clipped_to_the_bounds_inside_the_env_and_observations_are_float32():
    # An action far outside [−1, 1] acts and is charged (control cost) exactly as the bound.
    wide, bound = make_gym_env(ENV), make_gym_env(ENV)
    obs_wide, _ = wide.reset(seed=3)
    obs_bound, _ = bound.reset(seed=3)
    assert obs_wide.dtype == np.float32 and np.array_equal(obs_wide, obs_bound)
    action = np.array([4.0, -7.0, 0.5, 1.5, -0.2, -1.0], dtype=np.float32)
    for _ in range(5):
        step_wide = wide.step(action)
        step_bound = bound.step(np.clip(action, -1.0, 1.0))
        assert np.array_equal(step_wide[0], step_bound[0])
        assert step_wide[1] == step_bound[1]
    # HalfCheetah's control cost is 0.1 Σ a²: the clipped action's, not the raw one's.
    assert step_wide[4]["reward_ctrl"] == pytest.approx(-0.1 * np.sum(np.clip(action, -1, 1) ** 2))


def test_the_papers_continuous_settings_build_a_fixed_sigma_policy():
    config = ACERConfig.for_env(ENV, workers=1, envs_per_worker=1, **ACERConfig.PAPER_CONTINUOUS)
    assert (config.rollout_length, config.truncation_threshold, config.fixed_scale) == (
        50,
        5.0,
        0.3,
    )
    policy, loss, *_ = build(config)
    assert any(isinstance(m, FixedNormalScale) for m in policy.modules())
    assert not any("scale" in name for name, _ in loss.named_parameters())
    obs = torch.randn(4, 17)
    td = policy(_td(obs))
    assert torch.equal(td["scale"], torch.full((4, 6), 0.3))
    assert torch.equal(td["behavior", "scale"], td["scale"])


def _td(observation):
    from tensordict import TensorDict

    return TensorDict({"observation": observation}, observation.shape[:1])


def test_normalize_observations_needs_vector_observations():
    pytest.importorskip("minatar")
    with pytest.raises(ValueError, match=r"normalize_observations.*\[4, 10, 10\]"):
        build(ACERConfig.for_env("MinAtar/Breakout-v1", normalize_observations=True))


@pytest.mark.timeout(300)
def test_halfcheetah_trains_on_normalised_inputs_and_resumes_its_statistics(tmp_path, monkeypatch):
    # Every batch the loss sees (fresh or replayed) carries observations normalised with the
    # statistics of that moment; the statistics count every collected frame, are saved with the
    # checkpoint and continue after a resume.
    seen = []
    original = acer_recipe.build

    def recording_build(config):
        policy, loss, optimizer, average, normalizer = original(config)

        def check(module, args):
            batch = args[0]
            expected = normalizer.normalize(batch["observation"])
            seen.append(torch.equal(batch[NORMALIZED_OBSERVATION], expected))
            nxt = normalizer.normalize(batch["next", "observation"])
            seen.append(torch.equal(batch["next", NORMALIZED_OBSERVATION], nxt))

        loss.register_forward_pre_hook(check)
        recording_build.normalizer = normalizer
        return policy, loss, optimizer, average, normalizer

    monkeypatch.setattr(acer_recipe, "build", recording_build)
    config = ACERConfig.for_env(
        ENV, frames=1_600, replay_start=800, batch_size=8, hidden_sizes=(64, 64), seed=0
    )
    checkpoint = Checkpointer(tmp_path / "ckpt", every=10)
    metrics = list(train(config, checkpoint=checkpoint))
    assert len(metrics) == 1_600 // config.frames_per_batch
    assert sum(m["train/replay_updates"] for m in metrics) > 0
    finals = [m[k] for m in metrics for k in m if k.startswith("train/replay/loss")]
    assert finals and all(math.isfinite(v) for v in finals)
    assert seen and all(seen)
    first = recording_build.normalizer
    assert first.count.item() == pytest.approx(1_600 + 1e-4)
    assert float(first.var.min()) > 0 and not torch.equal(first.loc, torch.zeros(17))
    saved = checkpoint.load()["counters"]["observation_norm"]
    assert torch.equal(saved["loc"], first.loc)

    list(train(replace(config, frames=2_400), checkpoint=checkpoint))
    second = recording_build.normalizer
    assert second is not first
    assert second.count.item() == pytest.approx(2_400 + 1e-4)


def test_normalizer_is_the_collection_policys_first_module():
    config = ACERConfig.for_env(ENV, workers=1, envs_per_worker=1)
    policy, _, _, _, normalizer = build(config)
    assert isinstance(normalizer, ObservationNormalizer) and policy.module[0] is normalizer
    assert build(replace(config, normalize_observations=False))[-1] is None


def test_activation_reaches_the_continuous_networks_and_is_validated():
    config = ACERConfig.for_env(ENV, workers=1, envs_per_worker=1, activation="relu")

    def kinds(loss):
        return {type(m) for net in (loss.actor_network, loss.critic_network) for m in net.modules()}

    _, loss, *_ = build(config)
    assert torch.nn.ReLU in kinds(loss) and torch.nn.Tanh not in kinds(loss)
    _, loss, *_ = build(replace(config, activation="tanh"))
    assert torch.nn.ReLU not in kinds(loss) and torch.nn.Tanh in kinds(loss)
    with pytest.raises(ValueError, match="activation must be 'tanh' or 'relu', got 'elu'"):
        ACERConfig(env_id=ENV, activation="elu")
