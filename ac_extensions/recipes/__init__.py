"""Whole training loops, one file per algorithm, each read top to bottom.

:mod:`~ac_extensions.recipes.a2c`, :mod:`~ac_extensions.recipes.ppo`,
:mod:`~ac_extensions.recipes.acer`, :mod:`~ac_extensions.recipes.reactor`: a config dataclass,
``build(config)``, ``make_env(config)`` and ``train(config)``, a generator yielding one dict of
metrics per collected batch. They train through the exported loss modules
(:mod:`ac_extensions.objectives`); the plumbing is :mod:`ac_extensions.runtime`'s. No recipe
imports another.
"""

from __future__ import annotations

from ac_extensions.recipes.a2c import A2CConfig
from ac_extensions.recipes.acer import ACERConfig
from ac_extensions.recipes.ppo import PPOConfig
from ac_extensions.recipes.reactor import ReactorConfig
from ac_extensions.runtime.config import OnPolicyConfig

__all__ = ["A2CConfig", "ACERConfig", "OnPolicyConfig", "PPOConfig", "ReactorConfig"]
