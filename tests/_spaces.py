"""Tiny gymnasium envs with the action spaces no recipe takes, registered on import.

Used as ``tests._spaces:MultiDiscreteToy-v0`` (gymnasium imports the module first).
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
