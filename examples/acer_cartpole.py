"""ACER (discrete) on CartPole-v1: Retrace critic, truncated IS + bias correction, trust region.

Wang et al., 2017 (arXiv:1611.01224). Two worker processes each step 4 CartPoles for 20-step
sequences; every fresh batch gives one on-policy update and enters a replay of sequences, then
Poisson(4) off-policy updates follow; the average policy is a Polyak average (α = 0.99).
Measured (tests/recipes/test_acer.py): a mean return of ~270-295 over the last 20 episodes
after 35-40k frames (seed 0), in ~20 s on a 2-core CPU; tuning towards 475 is ongoing.

    python examples/acer_cartpole.py --frames 60000
"""

from __future__ import annotations

from _cli import parse_config, report

from ac_extensions.recipes.acer import ACERConfig, train

if __name__ == "__main__":
    config = parse_config(ACERConfig, __doc__.splitlines()[0])
    for i, metrics in enumerate(train(config)):
        report(metrics, every=20, index=i)
