"""VectorGymEnv, the lean env of make_batched_env, against TorchRL's GymWrapper stack."""

from __future__ import annotations

from functools import partial

import gymnasium as gym
import pytest
import torch
from torchrl.envs import EnvBase, GymWrapper, InitTracker, RewardSum, TransformedEnv

from ac_extensions.runtime.envs import make_batched_env, make_gym_env
from ac_extensions.runtime.vector_env import VectorGymEnv


def _vector(env_id: str, n: int) -> gym.vector.SyncVectorEnv:
    return gym.vector.SyncVectorEnv(
        [partial(make_gym_env, env_id)] * n, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )


def _torchrl_stack(env_id: str, n: int) -> EnvBase:
    """What make_batched_env built before VectorGymEnv: GymWrapper + RewardSum."""
    env = TransformedEnv(GymWrapper(_vector(env_id, n), categorical_action_encoding=True))
    env.append_transform(RewardSum())
    return env


def _run(env: EnvBase, steps: int, step_fn) -> list:
    """``steps`` steps with random actions from a fixed generator; returns the step data."""
    env.set_seed(3)
    root = env.reset()
    generator = torch.Generator().manual_seed(0)
    spec = env.full_action_spec["action"]
    out = []
    for _ in range(steps):
        if spec.domain == "discrete":
            action = torch.randint(int(spec.space.n), spec.shape, generator=generator)
        else:
            action = torch.rand(spec.shape, generator=generator) * 4 - 2
        root.set("action", action)
        data, root = step_fn(env, root)
        out.append(data.clone())
    return out


KEYS = [
    "observation",
    "action",
    "episode_reward",
    ("next", "observation"),
    ("next", "reward"),
    ("next", "done"),
    ("next", "terminated"),
    ("next", "truncated"),
    ("next", "episode_reward"),
]


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
@pytest.mark.parametrize("path", ["fast", "generic"])
def test_same_data_as_the_torchrl_stack(env_id, path):
    # "fast": VectorGymEnv.step_and_maybe_reset (collectors on a bare env); "generic": EnvBase's
    # step → step_mdp → partial reset through VectorGymEnv._step / _reset (TransformedEnv).
    steps = 300 if env_id == "CartPole-v1" else 230  # Pendulum truncates at 200
    expected = _run(_torchrl_stack(env_id, 4), steps, lambda e, td: e.step_and_maybe_reset(td))
    if path == "fast":
        got = _run(
            VectorGymEnv(_vector(env_id, 4)), steps, lambda e, td: e.step_and_maybe_reset(td)
        )
    else:
        env = TransformedEnv(VectorGymEnv(_vector(env_id, 4)), InitTracker())
        got = _run(env, steps, lambda e, td: EnvBase.step_and_maybe_reset(e, td))
    dones = 0
    for t, (a, b) in enumerate(zip(expected, got, strict=True)):
        for key in KEYS:
            x, y = a[key], b[key]
            assert x.dtype == y.dtype and x.shape == y.shape, (t, key, x.shape, y.shape)
            assert torch.equal(x, y), (t, key)
        dones += int(a["next", "done"].sum())
    assert dones >= 4  # episodes ended (and restarted) along the way


def test_episode_reward_is_the_running_return():
    env = VectorGymEnv(_vector("CartPole-v1", 2))
    env.set_seed(0)
    root = env.reset()
    running = torch.zeros(2, 1)
    finished = 0
    for _ in range(200):
        root.set("action", torch.ones(2, dtype=torch.int64))  # always push right: short episodes
        data, root = env.step_and_maybe_reset(root)
        running += data["next", "reward"]
        torch.testing.assert_close(data["next", "episode_reward"], running)
        done = data["next", "done"]
        finished += int(done.sum())
        running[done] = 0.0
        torch.testing.assert_close(root["episode_reward"], running)
        assert not root["done"].any()
    assert finished > 4


def test_make_batched_env_picks_the_lean_env_when_it_applies():
    assert isinstance(make_batched_env("CartPole-v1", 2), VectorGymEnv)
    # Transforms keep TorchRL's stack (their order relative to RewardSum is unchanged).
    with_transform = make_batched_env("CartPole-v1", 2, extra_transforms=(InitTracker(),))
    assert isinstance(with_transform.base_env, GymWrapper)
    # Dict observations keep TorchRL's stack (CatTensors + RewardSum).
    dict_env = make_batched_env("DictCartPole-v1", 2, observation_keys=("position", "velocity"))
    assert isinstance(dict_env.base_env, GymWrapper)
    assert dict_env.reset()["observation"].shape == (2, 4)


def test_unsupported_spaces_are_named():
    vector = gym.vector.SyncVectorEnv(
        [partial(gym.make, "DictCartPole-v1")], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    assert not VectorGymEnv.supports(vector)
    with pytest.raises(TypeError, match="needs a Box observation space"):
        VectorGymEnv(vector)


def test_sparse_mountain_car_pays_only_at_the_flag():
    env = gym.make("SparseMountainCar-v0")
    rewards, terminated, truncated = [], False, False
    observation, _ = env.reset(seed=0)
    while not (terminated or truncated):  # push along the velocity: reaches the flag
        observation, reward, terminated, truncated, _ = env.step(2 if observation[1] >= 0 else 0)
        rewards.append(reward)
    assert terminated and rewards[-1] == 1.0 and set(rewards[:-1]) == {0.0}
    env.reset(seed=0)
    steps, truncated = 0, False
    while not truncated:  # doing nothing never gets there: 200 steps, no reward
        _, reward, terminated, truncated, _ = env.step(1)
        steps += 1
        assert reward == 0.0 and not terminated
    assert steps == 200
