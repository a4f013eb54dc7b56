"""Continuous ACER on HalfCheetah-v5: training fps against its collector alone, and a profile.

The collector with ACER's MuJoCo defaults and the same policy runs ``--frames`` frames with no
learning, then the recipe runs as many with it; both fps count from the first batch on (worker
start-up excluded), and ``cProfile`` records the learner's main thread.

    python benchmarks/mujoco_speed.py --frames 20000

Writes ``benchmarks/results/mujoco_speed.md`` (the notes under its table are kept).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from functools import partial
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _results import write_markdown  # noqa: E402


def measure_speed(frames: int, results: Path) -> Path:
    """Collector alone, then the recipe, over ``frames`` each; profile the learner."""
    import torch

    from ac_extensions.recipes import acer
    from ac_extensions.runtime import start_collector, stop_collector

    config = acer.ACERConfig.for_env("HalfCheetah-v5", frames=frames, seed=1)
    config = acer.ACERConfig.for_env(
        "HalfCheetah-v5", frames=frames, seed=1, replay_start=config.frames_per_batch
    )
    torch.manual_seed(config.seed)
    policy = acer.build(config)[0]
    start = time.perf_counter()
    collector = start_collector(config, partial(acer.make_env, config), policy)
    collected, first = 0, None
    try:
        for batch in collector:
            collected += batch.numel()
            if first is None:  # start-up (worker processes, envs) is not collection
                first, first_frames = time.perf_counter(), collected
    finally:
        stop_collector(collector)
    collect_fps = (collected - first_frames) / (time.perf_counter() - first)
    startup = first - start

    profiler = cProfile.Profile()
    run = acer.train(config)
    seen, first = 0, None
    profiler.enable()
    try:
        for metrics in run:
            if first is None:
                first, first_frames = time.perf_counter(), metrics["time/frames"]
            seen = metrics["time/frames"]
    finally:
        profiler.disable()
        run.close()
    train_fps = (seen - first_frames) / (time.perf_counter() - first)
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(15)
    top = "\n".join(line for line in stream.getvalue().splitlines() if line.strip())
    lines = [
        "# Continuous ACER on HalfCheetah-v5: training fps against collection alone",
        "",
        f"Command: `python benchmarks/mujoco_speed.py --frames {frames}`. One "
        f"process, ACER's MuJoCo defaults ({config.workers} workers × "
        f"{config.envs_per_worker} envs, "
        f"T = {config.rollout_length}, replay ratio {config.replay_ratio}, batch "
        f"{config.batch_size} sequences, replay from the second batch), fps after the first batch "
        "(worker start-up excluded).",
        "",
        "| | frames | fps |",
        "|---|---|---|",
        f"| collector alone (same policy, no learning) | {collected:,} | {collect_fps:,.0f} |",
        f"| recipe (collection + on-policy + replay updates) | {int(seen):,} | {train_fps:,.0f} |",
        "",
        f"Training runs at {train_fps / collect_fps:.2f}× the collector's fps (worker start-up "
        f"{startup:.1f} s).",
        "",
        "Learner main thread, `cProfile`, top 15 by own time:",
        "",
        "```",
        top,
        "```",
    ]
    out = Path(results) / "mujoco_speed.md"
    write_markdown(out, "\n".join(lines) + "\n")
    print("\n".join(lines[:12]))
    return out


def main(argv: list[str] | None = None) -> int:
    """Measure and write the page."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=20_000, help="frames of each phase")
    parser.add_argument("--results", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    measure_speed(args.frames, args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
