"""PPO on MinAtar: collection layout and network layout, in frames per second, beside SB3 PPO.

The same batch (8 environments × 128 steps = 1,024 frames, the PPO paper's Atari batch and
SB3's MinAtar setting) collected by 2 worker processes of 4 environments each or by 1 worker
of 8 (``PPOConfig``'s MinAtar default); the learner with torch's default threads or
one; actor and critic with separate MinAtar torsos or one shared torso (``share_torso``). Each
variant trains ``--frames`` frames of MinAtar Breakout with ``PPOConfig.for_env``'s settings
otherwise; fps counts the frames after the first two batches (start-up excluded). The baseline,
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
import os
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
    "1 worker × 8 envs, 1 thread, shared torso, async": {
        "workers": 1,
        "envs_per_worker": 8,
        "torch_threads": 1,
        "share_torso": True,
        "async_collection": True,
    },
    "1 worker × 16 envs × 64 steps, 1 thread, shared torso": {
        "workers": 1,
        "envs_per_worker": 16,
        "rollout_length": 64,
        "torch_threads": 1,
        "share_torso": True,
    },
    "1 worker × 32 envs × 32 steps, 1 thread, shared torso": {
        "workers": 1,
        "envs_per_worker": 32,
        "rollout_length": 32,
        "torch_threads": 1,
        "share_torso": True,
    },
    "1 worker × 32 envs × 32 steps, 1 thread, shared torso, async": {
        "workers": 1,
        "envs_per_worker": 32,
        "rollout_length": 32,
        "torch_threads": 1,
        "share_torso": True,
        "async_collection": True,
    },
}
"""Name → ``PPOConfig`` overrides. Every layout collects 1,024 frames per batch: 8 envs × 128
steps unless named otherwise (16 × 64 or 32 × 32: the same batch in fewer, wider steps, so
TorchRL's per-step collection cost is paid for more frames at once; the GAE horizon within a
batch shortens to 64 or 32 steps). ``async``:
the worker collects the next batch while the learner trains on this one (TorchRL's
``MultiAsyncCollector``), so on 2 cores collection and update overlap instead of alternating;
the batch was collected by the policy of one update earlier."""
SB3_PPO = "sb3_ppo"
"""The Stable-Baselines3 PPO variant (``minatar_grid.py``'s SB3 PPO baseline)."""
WARMUP = 2 * 1024
"""Frames left out of every fps: the first two batches."""


def tree_cpu_seconds() -> float:
    """User + system CPU seconds of this process tree, reaped children included (``/proc``).

    Wall-clock fps on a shared machine moves with whatever else runs; the CPU time a run's
    processes (the learner and, for ours, its collector worker) spend per frame moves much
    less, so both are reported.
    """
    tick = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [os.getpid()]
    while todo:
        pid = todo.pop()
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            # utime, stime, and cutime, cstime: the children it has reaped (a collector
            # worker stopped before the end mark is counted there)
            total += sum(int(f) for f in fields[11:15]) / tick
            for task in Path(f"/proc/{pid}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue  # a process that ended meanwhile
    return total


def report(frames: float, start: tuple[float, float], end: tuple[float, float]) -> None:
    """Print the fps between two ``(perf_counter, tree_cpu_seconds)`` marks ``frames`` apart."""
    wall, cpu = end[0] - start[0], end[1] - start[1]
    print("RESULT", json.dumps({"fps": frames / wall, "cpu_fps": frames / cpu}), flush=True)


def child(overrides: dict, frames: int) -> None:
    """Train one layout and report its fps after the first two batches."""
    from ac_extensions.recipes.ppo import PPOConfig, train

    config = PPOConfig.for_env("MinAtar/Breakout-v1", frames=frames, seed=1, **overrides)
    start, first, last = None, 0.0, 0.0
    for batches, metrics in enumerate(train(config), 1):
        last = metrics["time/frames"]
        if batches == 2:
            start, first = (time.perf_counter(), tree_cpu_seconds()), last
    report(last - first, start, (time.perf_counter(), tree_cpu_seconds()))


def sb3_child(frames: int) -> None:
    """Train SB3 PPO (``minatar_grid.train_sb3``) and report its fps after :data:`WARMUP`."""
    import tempfile

    import minatar_grid

    marks: dict[str, tuple] = {}
    step = minatar_grid.SB3Log.step

    def marked_step(self, now: int, force: bool = False) -> None:
        if "start" not in marks and now >= WARMUP:
            marks["start"] = (now, time.perf_counter(), tree_cpu_seconds())
        step(self, now, force)

    minatar_grid.SB3Log.step = marked_step
    with tempfile.TemporaryDirectory() as out:
        summary = minatar_grid.train_sb3(SB3_PPO, "Breakout", 1, frames, Path(out))
    end = (time.perf_counter(), tree_cpu_seconds())
    first, *start = marks["start"]
    report(summary["frames"] - first, tuple(start), end)


def run_variant(name: str, frames: int) -> dict[str, float]:
    """One run of variant ``name`` in a fresh process: ``{"fps", "cpu_fps"}``."""
    what = ["--sb3"] if name == SB3_PPO else ["--child", json.dumps(LAYOUTS[name])]
    out = subprocess.run(
        [sys.executable, __file__, *what, str(frames)],
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    ).stdout
    return json.loads(out.split("RESULT")[-1])


def main() -> None:
    """Alternate the layouts, then write the table of median fps."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=61_440)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--variants", nargs="+", default=[*LAYOUTS, SB3_PPO], choices=[*LAYOUTS, SB3_PPO]
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "minatar_ppo_layout.md")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in args.variants}
    for _ in range(args.repeats):
        for name in args.variants:
            runs[name].append(run_variant(name, args.frames))
            got = runs[name][-1]
            print(f"{name}: {got['fps']:,.0f} fps, {got['cpu_fps']:,.0f} per CPU-s", flush=True)
    medians = {
        name: {k: statistics.median(r[k] for r in values) for k in ("fps", "cpu_fps")}
        for name, values in runs.items()
    }
    base = next(iter(medians.values()))
    sb3 = medians.get(SB3_PPO)

    def ratio(name: str, key: str, to: dict | None) -> str:
        return "—" if to is None else f"{medians[name][key] / to[key]:.2f}×"

    rows = [
        f"| variant | fps (median) | runs | vs {args.variants[0]} | vs SB3 PPO "
        "| frames per CPU-second (median) | runs | vs SB3 PPO |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def listed(values: list[dict[str, float]], key: str) -> str:
        return ", ".join(format(r[key], ",.0f") for r in values)

    for name, values in runs.items():
        rows.append(
            f"| {name} | {medians[name]['fps']:,.0f} | "
            f"{listed(values, 'fps')} | {ratio(name, 'fps', base)} | "
            f"{ratio(name, 'fps', sb3)} | {medians[name]['cpu_fps']:,.0f} | "
            f"{listed(values, 'cpu_fps')} | "
            f"{ratio(name, 'cpu_fps', sb3)} |"
        )
    text = (
        "# PPO on MinAtar Breakout: collection and network layout, fps beside SB3 PPO\n\n"
        f"Command: `python benchmarks/minatar_ppo_layout.py --repeats {args.repeats}"
        + (
            ""
            if args.variants == [*LAYOUTS, SB3_PPO]
            else " --variants " + " ".join(f'"{name}"' for name in args.variants)
        )
        + ("" if args.out == RESULTS / "minatar_ppo_layout.md" else f" --out {args.out}")
        + "` "
        f"({args.frames:,} frames per run, fps and frames per CPU-second of the run's processes "
        "after the first two batches, variants "
        "alternating run by run; every variant collects 1,024 frames per batch, 8 envs × 128 "
        "steps unless named otherwise; "
        f"{SB3_PPO}: `minatar_grid.py`'s SB3 PPO baseline).\n\n" + "\n".join(rows) + "\n"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_markdown(args.out, text)
    args.out.with_suffix(".json").write_text(json.dumps(runs, indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(json.loads(sys.argv[2]), int(sys.argv[3]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--sb3":
        sb3_child(int(sys.argv[2]))
    else:
        main()
