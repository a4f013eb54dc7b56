"""ACER (discrete) on CartPole-v1: Retrace critic, truncated IS + bias correction, trust region.

Wang et al., 2017 (arXiv:1611.01224). Two worker processes each step 4 CartPoles for 20-step
sequences; every fresh batch gives one on-policy update and enters a replay of sequences, then
Poisson(16) off-policy updates follow; the average policy is a Polyak average (α = 0.99). The
learner sees rewards × 0.1 (logged returns are the environment's). Measured on a 2-core CPU:
the mean return of the last 20 episodes reaches 475 at 21,440 frames (seed 2) and 25,600
(seed 3), in about 2 minutes.

    python examples/acer_cartpole.py --frames 60000
"""

from __future__ import annotations

from _cli import parse_config, report

from ac_extensions.recipes.acer import ACERConfig, train

if __name__ == "__main__":
    config = parse_config(ACERConfig, __doc__.splitlines()[0])
    for i, metrics in enumerate(train(config)):
        report(metrics, every=20, index=i)
