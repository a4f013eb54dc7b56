"""Frames to 475 on CartPole-v1 over many seeds: which PPO settings learn in fewer frames.

Sample efficiency only (no timing): each (variant, seed) runs in a fresh subprocess and stops
as soon as the mean of the last 20 finished episode returns reaches 475 (or at ``--frames``).
Our variants collect synchronously with one worker (8 envs × 32 steps = SB3's zoo batch), so a
seed's frames do not depend on timing and runs can share the machine (``--jobs``); the
learning rate and clip range still anneal over the full ``--frames`` as in
``benchmarks/ppo_vs_sb3.py``. Stable-Baselines3 runs with the zoo settings and with the
learning rate changed, so the effect of a setting can be told apart from the library.

    python benchmarks/ppo_frames_sweep.py --seeds $(seq 1 20) --jobs 2

Writes ``benchmarks/results/ppo_frames_sweep.{md,json}``: per variant the median, quartiles
and every seed's frames (a run that never reaches 475 counts as ``--frames``, shown as "—").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write_markdown
from _threshold import run_child, run_sb3_ppo, run_until_threshold

RESULTS = Path(__file__).resolve().parent / "results"

# PPOConfig overrides (all with workers=1, synchronous: 8 envs × 32 steps per batch).
OURS = {
    "ours (zoo settings, lr 1e-3)": {},
    "ours (lr 1.5e-3)": dict(lr=1.5e-3),
    "ours (lr 2e-3)": dict(lr=2e-3),
    "ours (lr 2.5e-3)": dict(lr=2.5e-3),
    "ours (8 envs × 16 steps, minibatch 128)": dict(rollout_length=16, minibatch_size=128),
}
# Stable-Baselines3 PPO: the zoo's CartPole settings with this learning rate.
SB3 = {"sb3 (zoo settings, lr 1e-3)": 1e-3, "sb3 (lr 2e-3)": 2e-3}


def child(argv: list[str]) -> None:
    which, seed, frames = argv[0], int(argv[1]), int(argv[2])
    if which in SB3:
        result = run_sb3_ppo(seed, frames, lr=SB3[which], threads=1, stop_at_threshold=True)
    else:
        from ac_extensions.recipes import PPOConfig
        from ac_extensions.recipes.ppo import train

        config = PPOConfig(frames=frames, seed=seed, workers=1, **OURS[which])
        result = run_until_threshold(lambda: train(config))
    print("RESULT " + json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(1, 11)))
    parser.add_argument("--frames", type=int, default=100_096)
    parser.add_argument("--jobs", type=int, default=2, help="runs at the same time")
    parser.add_argument("--out", type=Path, default=RESULTS / "ppo_frames_sweep.md")
    parser.add_argument("--variants", nargs="+", default=[*SB3, *OURS], choices=[*SB3, *OURS])
    args = parser.parse_args()
    jobs = [(name, seed) for name in args.variants for seed in args.seeds]
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda job: run_child(__file__, *job, args.frames), jobs))
    runs: dict[str, dict[int, int | None]] = {name: {} for name in args.variants}
    for (name, seed), result in zip(jobs, results, strict=True):
        hit = result["frames_to_475"]
        runs[name][seed] = hit = None if hit is None else int(hit)
        print(f"{name:42s} seed {seed:3d}: {hit}", flush=True)

    def quartiles(values: list[int]) -> list[float]:
        return statistics.quantiles(values, n=4, method="inclusive")

    rows = [
        "| variant | reached 475 | frames to 475: median | 25th pct | 75th pct | max |",
        "|---|---|---|---|---|---|",
    ]
    summary = {}
    for name, per_seed in runs.items():
        # A run that never reaches the threshold counts as the whole budget.
        values = [args.frames if hit is None else hit for hit in per_seed.values()]
        q1, med, q3 = quartiles(values) if len(values) > 1 else values * 3
        reached = sum(hit is not None for hit in per_seed.values())
        summary[name] = dict(median=med, q1=q1, q3=q3, reached=reached, runs=len(values))
        rows.append(
            f"| {name} | {reached}/{len(values)} | {med:,.0f} | {q1:,.0f} | {q3:,.0f} "
            f"| {max(values):,.0f} |"
        )
    table = "\n".join(rows)
    print("\n" + table)
    per_seed_lines = "\n".join(
        f"- {name}: " + ", ".join("—" if h is None else f"{h:,}" for h in per_seed.values())
        for name, per_seed in runs.items()
    )
    header = (
        "# PPO on CartPole-v1: frames to 475 over seeds\n\nCommand: `python benchmarks/"
        f"ppo_frames_sweep.py --seeds {' '.join(map(str, args.seeds))} --jobs {args.jobs}` "
        f"(budget {args.frames:,} frames, schedules annealed over it; each run stops when the "
        "mean of the last 20 returns reaches 475; a run that never does counts as the budget)."
        "\n\n"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_markdown(
        args.out,
        header
        + table
        + f"\n\nPer seed ({', '.join(map(str, args.seeds))}):\n\n"
        + per_seed_lines
        + "\n",
    )
    args.out.with_suffix(".json").write_text(
        json.dumps({"seeds": args.seeds, "runs": runs, "summary": summary}, indent=1)
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
    else:
        main()
