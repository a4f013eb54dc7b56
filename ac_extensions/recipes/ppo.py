"""PPO recipe: :class:`PPOConfig` (zoo-tuned CartPole defaults) and :func:`train`.

The loop is :func:`ac_extensions.recipes.on_policy.train`; this module only fixes the algorithm.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from ac_extensions.recipes import on_policy
from ac_extensions.recipes._common import Checkpointer


@dataclass(frozen=True)
class PPOConfig(on_policy.OnPolicyConfig):
    """:class:`~ac_extensions.recipes.on_policy.OnPolicyConfig` with ``algorithm="ppo"``."""

    algorithm: Literal["ppo"] = "ppo"
    """Clipped PPO (Schulman et al., 2017, arXiv:1707.06347)."""


def train(
    config: PPOConfig | None = None, *, checkpoint: Checkpointer | None = None
) -> Iterator[dict[str, float]]:
    """Train PPO; yield one dict of scalar metrics per batch (see ``on_policy.train``)."""
    return on_policy.train(config or PPOConfig(), checkpoint=checkpoint)


__all__ = ["PPOConfig", "train"]
