"""PPO on MinAtar: collection layout and network layout, in frames per second, beside SB3 PPO.

The same batch (8 environments × 128 steps = 1,024 frames, the PPO paper's Atari batch and
SB3's MinAtar setting) collected by 2 worker processes of 4 environments each (the previous
``PPOConfig`` MinAtar default) or by 1 worker of 8; the learner with torch's default threads or
one; actor and critic with separate MinAtar torsos or one shared torso (``share_torso``). Each
variant trains ``--frames`` frames of MinAtar Breakout with ``PPOConfig.for_env``'s settings
otherwise; fps counts the frames after the first two batches (start-up excluded). The peer,
Stable-Baselines3 PPO with rl-baselines3-zoo's Atari settings on the same torso (the
``sb3_ppo`` of ``minatar_grid.py``, one torch thread), is timed the same way from its own log
(the frames after its first 2,048). Variants alternate run by run, ``--repeats`` times, so
load changes hit them alike. Writes ``benchmarks/results/minatar_ppo_layout.{md,json}``.

    python benchmarks/minatar_ppo_layout.py --repeats 3
    python benchmarks/minatar_ppo_layout.py --variants "1 worker × 8 envs, 1 thread" sb3_ppo
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
    "1 worker × 8 envs, 1 thread, shared torso": {
        "workers": 1,
        "envs_per_worker": 8,
        "torch_threads": 1,
        "share_torso": True,
    },
}
"""Name → ``PPOConfig`` overrides (every layout collects 8 × 128 frames per batch)."""
PEER = "sb3_ppo"
"""The Stable-Baselines3 PPO variant (``minatar_grid.py``'s peer)."""
WARMUP = 2 * 1024
"""Frames left out of every fps: the first two batches."""


def child(overrides: dict, frames: int) -> None:
    """Train one layout and print its fps after the first two batches."""
    from ac_extensions.recipes.ppo import PPOConfig, train

    config = PPOConfig.for_env("MinAtar/Breakout-v1", frames=frames, seed=1, **overrides)
    start, first = None, 0.0
    for batches, metrics in enumerate(train(config), 1):
        if batches == 2:
            start, first = time.perf_counter(), metrics["time/frames"]
    print("FPS", (frames - first) / (time.perf_counter() - start), flush=True)


def peer_child(frames: int) -> None:
    """Train SB3 PPO (``minatar_grid.train_peer``) and print its fps after :data:`WARMUP`."""
    import tempfile

    from minatar_grid import SECONDS, read_scalar, train_peer

    with tempfile.TemporaryDirectory() as out:
        train_peer(PEER, "Breakout", 1, frames, Path(out))
        seconds = read_scalar(Path(out), SECONDS)  # frames → seconds since the start
    start = min(f for f in seconds if f >= WARMUP)
    end = max(seconds)
    print("FPS", (end - start) / (seconds[end] - seconds[start]), flush=True)


def run_variant(name: str, frames: int) -> float:
    """One run of variant ``name`` in a fresh process; its fps."""
    what = ["--peer"] if name == PEER else ["--child", json.dumps(LAYOUTS[name])]
    out = subprocess.run(
        [sys.executable, __file__, *what, str(frames)],
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    ).stdout
    return float(out.split("FPS")[-1])


def main() -> None:
    """Alternate the layouts, then write the table of median fps."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=61_440)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", nargs="+", default=[*LAYOUTS, PEER], choices=[*LAYOUTS, PEER])
    args = parser.parse_args()
    fps: dict[str, list[float]] = {name: [] for name in args.variants}
    for _ in range(args.repeats):
        for name in args.variants:
            fps[name].append(run_variant(name, args.frames))
            print(f"{name}: {fps[name][-1]:,.0f} fps", flush=True)
    medians = {name: statistics.median(values) for name, values in fps.items()}
    base = next(iter(medians.values()))
    peer = medians.get(PEER)
    rows = [
        f"| variant | fps (median) | runs | vs {args.variants[0]} | vs SB3 PPO |",
        "|---|---|---|---|---|",
    ]
    for name, values in fps.items():
        rows.append(
            f"| {name} | {medians[name]:,.0f} | {', '.join(f'{v:,.0f}' for v in values)} | "
            f"{medians[name] / base:.2f}× | "
            f"{'—' if peer is None else format(medians[name] / peer, '.2f') + '×'} |"
        )
    text = (
        "# PPO on MinAtar Breakout: collection and network layout, fps beside SB3 PPO\n\n"
        f"Command: `python benchmarks/minatar_ppo_layout.py --repeats {args.repeats}"
        + (
            ""
            if args.variants == [*LAYOUTS, PEER]
            else " --variants " + " ".join(f'"{name}"' for name in args.variants)
        )
        + "` "
        f"({args.frames:,} frames per run, fps after the first two batches, variants "
        "alternating run by run; every variant collects 8 envs × 128 steps per batch; "
        f"{PEER}: `minatar_grid.py`'s SB3 PPO peer).\n\n" + "\n".join(rows) + "\n"
    )
    RESULTS.mkdir(exist_ok=True)
    write_markdown(RESULTS / "minatar_ppo_layout.md", text)
    (RESULTS / "minatar_ppo_layout.json").write_text(json.dumps(fps, indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(json.loads(sys.argv[2]), int(sys.argv[3]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--peer":
        peer_child(int(sys.argv[2]))
    else:
        main()
