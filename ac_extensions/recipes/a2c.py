"""A2C recipe: :class:`A2CConfig` (zoo CartPole defaults) and :func:`train`.

The loop is :func:`ac_extensions.recipes.on_policy.train`; this module only fixes the algorithm
and its defaults (rl-baselines3-zoo ``hyperparams/a2c.yml`` CartPole-v1 with SB3's A2C
defaults: RMSprop lr 7e-4, γ 0.99, GAE λ 1.0, no entropy bonus, critic coefficient 0.5,
gradient-norm clip 0.5, constant learning rate).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from ac_extensions.recipes import on_policy
from ac_extensions.recipes._common import Checkpointer


@dataclass(frozen=True)
class A2CConfig(on_policy.OnPolicyConfig):
    """:class:`~ac_extensions.recipes.on_policy.OnPolicyConfig` with A2C's defaults."""

    algorithm: Literal["a2c"] = "a2c"
    """Advantage actor-critic (Mnih et al., 2016, arXiv:1602.01783)."""
    frames: int = 200_000
    """SB3's A2C needs ~100k CartPole frames; leave room."""
    envs_per_worker: int = 8
    """E."""
    rollout_length: int = 8
    """T (SB3 uses n_steps 5 with 8 envs; 2 workers × 8 envs × 8 steps here)."""
    gamma: float = 0.99
    """Discount γ."""
    lmbda: float = 1.0
    """GAE λ = 1: the n-step return advantage of A2C."""
    lr: float = 7e-4
    """RMSprop learning rate."""
    anneal_lr: bool = False
    """Constant learning rate."""
    epochs: int = 1
    """One pass: A2C is on-policy without reuse."""
    minibatch_size: int = 1 << 30
    """The whole batch in one gradient step."""
    normalize_advantage: bool = False
    """Raw advantages."""


def train(
    config: A2CConfig | None = None, *, checkpoint: Checkpointer | None = None
) -> Iterator[dict[str, float]]:
    """Train A2C; yield one dict of scalar metrics per batch (see ``on_policy.train``)."""
    return on_policy.train(config or A2CConfig(), checkpoint=checkpoint)


__all__ = ["A2CConfig", "train"]
