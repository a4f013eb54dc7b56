"""PPO on CartPole-v1 with TorchRL's multi-process collector.

Schulman et al., 2017 (arXiv:1707.06347). Two worker processes each step 8 CartPoles; GAE once
per batch; 20 epochs of 256-frame minibatches (rl-baselines3-zoo's tuned CartPole settings).
Expected: the mean of the last 20 episode returns reaches 475 after about 30k frames, in about
8 s on a 2-core CPU (median of 10 seeds, benchmarks/results/ppo_cartpole.md). Faster in
seconds (median 32.5k frames, 6.6 s, 2.28x Stable-Baselines3's frames per second): one worker
collecting the next batch while the learner trains (second command).

    python examples/ppo_cartpole.py --frames 100000 --seed 1
    python examples/ppo_cartpole.py --frames 100000 --async-collection true --workers 1
"""

from __future__ import annotations

from _cli import parse_config, report

from ac_extensions.recipes import PPOConfig
from ac_extensions.recipes.ppo import train

if __name__ == "__main__":
    config = parse_config(PPOConfig, __doc__.splitlines()[0])
    for i, metrics in enumerate(train(config)):
        report(metrics, every=10, index=i)
