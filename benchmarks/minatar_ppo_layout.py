"""PPO on MinAtar: how the collection is laid out, measured in frames per second.

The same batch (8 environments × 128 steps = 1,024 frames, the PPO paper's Atari batch and
SB3's MinAtar setting) collected by 2 worker processes of 4 environments each (the previous
``PPOConfig`` MinAtar default) or by 1 worker of 8; the learner with torch's default threads or
one. Each layout trains ``--frames`` frames of MinAtar Breakout with ``PPOConfig.for_env``'s
settings otherwise; fps counts the frames after the first two batches (start-up excluded).
Layouts alternate run by run, ``--repeats`` times, so load changes hit them alike. Writes
``benchmarks/results/minatar_ppo_layout.{md,json}``.

    python benchmarks/minatar_ppo_layout.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write_markdown

RESULTS = Path(__file__).resolve().parent / "results"
LAYOUTS: dict[str, dict] = {
    "2 workers × 4 envs": {"workers": 2, "envs_per_worker": 4},
    "2 workers × 4 envs, 1 thread": {"workers": 2, "envs_per_worker": 4, "torch_threads": 1},
    "1 worker × 8 envs, 1 thread": {"workers": 1, "envs_per_worker": 8, "torch_threads": 1},
}
"""Name → ``PPOConfig`` overrides (every layout collects 8 × 128 frames per batch)."""


def child(overrides: dict, frames: int) -> None:
    """Train one layout and print its fps after the first two batches."""
    from ac_extensions.recipes.ppo import PPOConfig, train

    config = PPOConfig.for_env("MinAtar/Breakout-v1", frames=frames, seed=1, **overrides)
    start, first = None, 0.0
    for batches, metrics in enumerate(train(config), 1):
        if batches == 2:
            start, first = time.perf_counter(), metrics["time/frames"]
    print("FPS", (frames - first) / (time.perf_counter() - start), flush=True)


def main() -> None:
    """Alternate the layouts, then write the table of median fps."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=61_440)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    fps: dict[str, list[float]] = {name: [] for name in LAYOUTS}
    for _ in range(args.repeats):
        for name, overrides in LAYOUTS.items():
            out = subprocess.run(
                [sys.executable, __file__, "--child", json.dumps(overrides), str(args.frames)],
                capture_output=True,
                text=True,
                timeout=900,
                check=True,
            ).stdout
            fps[name].append(float(out.split("FPS")[-1]))
            print(f"{name}: {fps[name][-1]:,.0f} fps", flush=True)
    base = statistics.median(fps[next(iter(LAYOUTS))])
    rows = ["| layout | fps (median) | runs | vs 2 workers × 4 envs |", "|---|---|---|---|"]
    for name, values in fps.items():
        rows.append(
            f"| {name} | {statistics.median(values):,.0f} | "
            f"{', '.join(f'{v:,.0f}' for v in values)} | {statistics.median(values) / base:.2f}× |"
        )
    text = (
        "# PPO on MinAtar Breakout: collection layout and fps\n\n"
        f"Command: `python benchmarks/minatar_ppo_layout.py --repeats {args.repeats}` "
        f"({args.frames:,} frames per run, fps after the first two batches, layouts "
        "alternating run by run; every layout collects 8 envs × 128 steps per batch).\n\n"
        + "\n".join(rows)
        + "\n"
    )
    RESULTS.mkdir(exist_ok=True)
    write_markdown(RESULTS / "minatar_ppo_layout.md", text)
    (RESULTS / "minatar_ppo_layout.json").write_text(json.dumps(fps, indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(json.loads(sys.argv[2]), int(sys.argv[3]))
    else:
        main()
