"""Tiny gymnasium envs for the recipes' edge cases, registered on import.

The action spaces no recipe takes, and rewards beyond [−1, 1]. Used as
``tests._spaces:MultiDiscreteToy-v0`` (gymnasium imports the module first).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class _Toy(gym.Env):
    """One-step episodes with a 2-vector observation and the action space given."""

    def __init__(self, action_space: gym.Space) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = action_space

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, True, False, {}


gym.register("MultiDiscreteToy-v0", entry_point=lambda: _Toy(gym.spaces.MultiDiscrete([3, 3])))
gym.register(
    "MatrixBoxToy-v0", entry_point=lambda: _Toy(gym.spaces.Box(-1.0, 1.0, (2, 3), np.float32))
)


class BigRewardToy(gym.Env):
    """Four-step episodes paying 5 per step (a return of 20), two actions, a 2-vector."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.steps += 1
        return np.full(2, self.steps / 4, np.float32), 5.0, self.steps == 4, False, {}


gym.register("BigRewardToy-v0", entry_point=BigRewardToy)
