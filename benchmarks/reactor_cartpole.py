"""Reactor's sample efficiency on CartPole-v1, beside Reactor ND, ACER and our PPO, in one run.

For each seed, runs the Reactor recipe (default ``ReactorConfig``), its non-distributional
ablation "Reactor ND" (``distributional=False``, scalar Retrace; Gruslys et al., 2018,
arXiv:1704.04651v2), the ACER recipe (default ``ACERConfig``) and the PPO recipe (default
``PPOConfig``), each in a fresh subprocess, one after the other, each capped at ``--frames``.
Reports frames and wall seconds until the mean of the last 20 finished episode returns first
reaches 475 (a run stops there), and frames per second; medians over seeds and ratios
against PPO. The target is a Reactor median of at most 30k frames.

    python benchmarks/reactor_cartpole.py --seeds 1 2 3 --frames 60000

Writes ``benchmarks/results/reactor_cartpole.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _threshold import describe_run, run_child, run_until_threshold, write_table

RESULTS = Path(__file__).resolve().parent / "results"
RUNS = ("reactor", "reactor_nd", "acer", "ppo")


def child(argv: list[str]) -> None:
    which, seed, frames = argv[0], int(argv[1]), int(argv[2])
    if which.startswith("reactor"):
        from ac_extensions.recipes.reactor import ReactorConfig
        from ac_extensions.recipes.reactor import train as train_reactor

        config = ReactorConfig(frames=frames, seed=seed, distributional=which == "reactor")
        result = run_until_threshold(lambda: train_reactor(config))
    elif which == "acer":
        from ac_extensions.recipes.acer import ACERConfig
        from ac_extensions.recipes.acer import train as train_acer

        result = run_until_threshold(lambda: train_acer(ACERConfig(frames=frames, seed=seed)))
    else:
        from ac_extensions.recipes.ppo import PPOConfig
        from ac_extensions.recipes.ppo import train as train_ppo

        result = run_until_threshold(lambda: train_ppo(PPOConfig(frames=frames, seed=seed)))
    print("RESULT " + json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--frames", type=int, default=60_000, help="budget of every run")
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=RUNS)
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per run")
    parser.add_argument(
        "--jobs", type=int, default=1, help="runs at once (wall seconds comparable only at 1)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "reactor_cartpole.md")
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {name: [] for name in args.runs}
    todo = [(name, seed) for seed in args.seeds for name in runs]

    def one(job: tuple[str, int]) -> dict:
        name, seed = job
        result = run_child(__file__, name, seed, args.frames, timeout=args.timeout)
        print(f"{name:10s} seed {seed}: {describe_run(result)}", flush=True)
        return result

    with ThreadPoolExecutor(args.jobs) as pool:
        for (name, _), result in zip(todo, pool.map(one, todo), strict=True):
            runs[name].append(result)
    baseline = "ppo" if "ppo" in runs else args.runs[0]
    header = (
        "# Reactor, Reactor ND, ACER and PPO on CartPole-v1: frames to a mean return of 475\n\n"
        f"Command: `python benchmarks/reactor_cartpole.py --seeds "
        f"{' '.join(map(str, args.seeds))} --frames {args.frames} --runs {' '.join(args.runs)} "
        f"--jobs {args.jobs}` (default configs, every run capped at {args.frames:,} frames and "
        f"stopped once it reaches 475; each run a fresh process, {args.jobs} at a time on the "
        "same shared 2-core machine, so wall seconds compare only within one table and only "
        "at --jobs 1; wall time includes model/collector construction).\n\n"
    )
    write_table(runs, baseline, args.out, header)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
    else:
        main()
