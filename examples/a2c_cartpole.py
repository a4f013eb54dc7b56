"""A2C on CartPole-v1 with TorchRL's multi-process collector.

Mnih et al., 2016 (arXiv:1602.01783), synchronous version: two worker processes each step 8
CartPoles for 8 steps; one RMSprop step per batch on n-step (GAE λ = 1) advantages.
Expected: around 100k frames to a mean return of 475 (Stable-Baselines3's A2C needs ~103k).

    python examples/a2c_cartpole.py --frames 200000
"""

from __future__ import annotations

from _cli import parse_config, report

from ac_extensions.recipes import A2CConfig
from ac_extensions.recipes.a2c import train

if __name__ == "__main__":
    config = parse_config(A2CConfig, __doc__.splitlines()[0])
    for i, metrics in enumerate(train(config)):
        report(metrics, every=50, index=i)
