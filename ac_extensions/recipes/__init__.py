"""Whole training loops, readable top to bottom (see :mod:`ac_extensions.recipes.on_policy`)."""

from __future__ import annotations

from ac_extensions.recipes.a2c import A2CConfig
from ac_extensions.recipes.on_policy import OnPolicyConfig
from ac_extensions.recipes.ppo import PPOConfig

__all__ = ["A2CConfig", "OnPolicyConfig", "PPOConfig"]
