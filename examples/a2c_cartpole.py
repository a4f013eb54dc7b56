"""A2C on CartPole-v1 with TorchRL's multi-process collector.

Mnih et al., 2016 (arXiv:1602.01783), synchronous version: one worker process steps 8
CartPoles for 5 steps (Stable-Baselines3's A2C batch); one RMSprop step per batch on n-step
(GAE λ = 1) advantages. Expected: around 85k frames to a mean return of 475 (median of 10
seeds; SB3's zoo A2C 94k in the same run: benchmarks/results/a2c_cartpole.md).

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
