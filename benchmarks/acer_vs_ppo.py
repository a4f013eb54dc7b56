"""ACER's sample efficiency on CartPole-v1, side by side with our PPO, in one run.

For each seed, runs the ACER recipe (default ``ACERConfig``: 60,000 frames) and the PPO recipe
(default ``PPOConfig``, rl-baselines3-zoo settings: 100,352 frames), each in a fresh
subprocess, one after the other. Reports frames and wall seconds until the mean of the last 20
finished episode returns first reaches 475, and frames per second; medians over seeds and
ratios against PPO. Published ACER ports need 375k (Kaixhin/ACER) to 500k (Stable Baselines 2)
frames here; the target is a median of at most 30k frames.

    python benchmarks/acer_vs_ppo.py --seeds 1 2 3

Writes ``benchmarks/results/acer_cartpole.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _threshold import run_recipe, run_seeds, write_table

RESULTS = Path(__file__).resolve().parent / "results"
BUDGET = {"acer": 60_000, "ppo": 100_352}


def child(argv: list[str]) -> None:
    which, seed = argv[0], int(argv[1])
    if which == "acer":
        from ac_extensions.recipes.acer import ACERConfig
        from ac_extensions.recipes.acer import train as train_acer

        result = run_recipe(lambda: train_acer(ACERConfig(frames=BUDGET["acer"], seed=seed)))
    else:
        from ac_extensions.recipes.ppo import PPOConfig
        from ac_extensions.recipes.ppo import train as train_ppo

        result = run_recipe(lambda: train_ppo(PPOConfig(frames=BUDGET["ppo"], seed=seed)))
    print("RESULT " + json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--out", type=Path, default=RESULTS / "acer_cartpole.md")
    args = parser.parse_args()
    runs = run_seeds(__file__, ["ppo", "acer"], args.seeds, BUDGET)
    header = (
        "# ACER vs PPO on CartPole-v1: frames to a mean return of 475\n\n"
        f"Command: `python benchmarks/acer_vs_ppo.py --seeds {' '.join(map(str, args.seeds))}` "
        f"(default configs; budgets {BUDGET['acer']:,} frames for ACER, {BUDGET['ppo']:,} for "
        "PPO; each run a fresh process, one after the other on the same 2-core machine; wall "
        "time includes model/collector construction).\n\n"
    )
    write_table(runs, "ppo", args.out, header)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
    else:
        main()
