"""PPO on CartPole-v1: ac_extensions vs Stable-Baselines3, side by side in one run.

For each seed, runs Stable-Baselines3 PPO with its rl-baselines3-zoo tuned CartPole settings
(8 envs, n_steps 32, batch 256, 20 epochs, γ 0.98, λ 0.8, lr 1e-3 linear, clip 0.2 linear,
100,096 frames), SB3 again with the learning rate doubled (2e-3: shows what the setting
alone does), and our PPO recipe (default ``PPOConfig``; the zoo batch with
``async_collection`` and one worker; the same with lr 2e-3),
each in a fresh subprocess, one after the other. Reports, per run: frames until the
mean of the last 20 finished episode returns first reaches 475, wall seconds until then
(counted from before the model / collector is built, so start-up is included on both sides),
and frames per second over the whole run; then medians and ratios against SB3.

    # needs `pip install stable-baselines3`
    python benchmarks/ppo_vs_sb3.py --seeds 1 2 3 4 5 6 7 8 9 10

Writes ``benchmarks/results/ppo_cartpole.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _threshold import run_recipe, run_sb3_ppo, run_seeds, write_table

RESULTS = Path(__file__).resolve().parent / "results"

# Variants of our recipe (PPOConfig overrides) benchmarked against SB3.
OURS = {
    # The default config: 2 workers × 8 envs × 32 steps = 512 frames per batch, 2 minibatches.
    "ours (zoo settings)": {},
    # One worker collects the next batch while the learner trains on this one (the 2 cores:
    # one each); each update sees 8 × 32 = 256 frames, 20 epochs of one 256-minibatch: SB3's
    # zoo batch exactly.
    "ours (zoo settings, async, 1 worker)": dict(async_collection=True, workers=1),
    # The same with twice the learning rate: fewer frames to 475 over 20 seeds in
    # benchmarks/ppo_frames_sweep.py (the "sb3 (lr 2e-3)" row shows the setting's effect on SB3).
    "ours (lr 2e-3, async, 1 worker)": dict(async_collection=True, workers=1, lr=2e-3),
}
# SB3 PPO settings: the zoo's, and the zoo's with the learning rate doubled.
SB3 = {
    "sb3 (zoo)": dict(n_envs=8, n_steps=32, lr=1e-3),
    "sb3 (lr 2e-3)": dict(n_envs=8, n_steps=32, lr=2e-3),
}


def run_ours(seed: int, frames: int, overrides: dict) -> dict:
    from ac_extensions.recipes import PPOConfig
    from ac_extensions.recipes.ppo import train

    return run_recipe(lambda: train(PPOConfig(frames=frames, seed=seed, **overrides)))


def child(argv: list[str]) -> None:
    which, seed, frames = argv[0], int(argv[1]), int(argv[2])
    if which in SB3:
        result = run_sb3_ppo(seed, frames, **SB3[which])
    else:
        result = run_ours(seed, frames, OURS[which])
    print("RESULT " + json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--frames", type=int, default=100_096)
    parser.add_argument("--out", type=Path, default=RESULTS / "ppo_cartpole.md")
    parser.add_argument(
        "--ours", nargs="+", default=list(OURS), choices=list(OURS), help="our variants to run"
    )
    args = parser.parse_args()
    runs = run_seeds(__file__, [*SB3, *args.ours], args.seeds, args.frames)
    header = (
        f"# PPO on CartPole-v1 vs Stable-Baselines3\n\nCommand: `python benchmarks/"
        f"ppo_vs_sb3.py --seeds {' '.join(map(str, args.seeds))}` ({args.frames:,} frames "
        f"per run, each run a fresh process, run one after the other on the same machine; "
        f"wall time includes model/collector construction).\n\n"
    )
    write_table(runs, "sb3 (zoo)", args.out, header)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
    else:
        main()
