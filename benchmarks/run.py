"""The benchmarks' one entry point: learning, throughput and the micro-benchmarks.

* **Learning**: every algorithm on CartPole-v1 through ``ac-train`` (``python -m ac_extensions``,
  each run a fresh process, one after the other), default configs except the frames budget.
  Writes each run's directory (``summary.json``, CSV logs) under ``<out>/learning[_quick]/``,
  a markdown table ``<out>/learning[_quick].md`` (medians over seeds) and the curves
  ``<out>/learning[_quick].png`` (``ac-plot``). ``<out>`` (``--out``) is ``runs/`` for
  ``--quick`` (ignored by git: ``make run`` never rewrites a committed file) and
  ``benchmarks/results/`` otherwise; ``--quick --out benchmarks/results`` refreshes the
  committed quick table.
* **Throughput**: frames per second of PPO training (default ``PPOConfig``) against the same
  collector with the same policy and no learning, and against raw gymnasium vector-env
  stepping (``SyncVectorEnv`` of the same W·E CartPoles, random actions, one process), as
  ratios measured in one run. Writes ``throughput.md``.
* **Micro**: ``functional_ops.py``, ``acer_update.py``, ``sequence_sampler.py`` (their own
  result files).

    python benchmarks/run.py --quick          # learning only, 1 seed, small budgets (make run)
    python benchmarks/run.py --quick --frames-scale 0.1   # the same job on a tenth of the frames
    python benchmarks/run.py                  # learning (3 seeds) + throughput + micro
    python benchmarks/run.py --only throughput
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write_markdown

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
ALGORITHMS = ("a2c", "ppo", "acer", "reactor")
FULL_FRAMES = {"a2c": 200_000, "ppo": 100_352, "acer": 60_000, "reactor": 60_000}
"""The recipes' default budgets."""
QUICK_FRAMES = {"a2c": 60_000, "ppo": 40_960, "acer": 30_000, "reactor": 30_000}
"""A few minutes in all on 2 cores."""
MICRO = (
    ["functional_ops.py"],
    ["acer_update.py"],
    ["collection.py"],
    ["sequence_sampler.py"],
)


def available(name: str) -> bool:
    """Whether the recipe imports and has a ``train``."""
    import importlib

    module = {"a2c": "a2c", "ppo": "ppo", "acer": "acer", "reactor": "reactor"}[name]
    try:
        return hasattr(importlib.import_module(f"ac_extensions.recipes.{module}"), "train")
    except ImportError:
        return False


def run_training(name: str, seed: int, frames: int, out: Path) -> dict:
    """One ``ac-train`` run in a fresh process; its ``summary.json``.

    The run's progress lines (one every 10 s off a terminal, a bar on one) and its final line
    go to this process's output as they come.
    """
    if out.exists():
        shutil.rmtree(out)
    command = [sys.executable, "-m", "ac_extensions", name, "--frames", str(frames)]
    command += ["--seed", str(seed), "--out", str(out), "--checkpoint-every", "0"]
    command += ["--progress-seconds", "10"]
    print(f"{name}, seed {seed}, {frames:,} frames:", flush=True)
    result = subprocess.run(command, cwd=ROOT, stderr=subprocess.PIPE, text=True, timeout=3600)
    if result.returncode != 0:
        raise RuntimeError(f"{name} seed {seed} failed: {result.stderr.strip()[-2000:]}")
    return json.loads((out / "summary.json").read_text())


def median(values) -> float | None:
    """Median of the values that are not None (None if there are none)."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def learning(
    seeds: list[int], frames: dict[str, int], tag: str, out: Path = RESULTS, command: str = ""
) -> tuple[Path, Path]:
    """Run every algorithm for every seed; write the table and the plot under ``out``."""
    from ac_extensions.cli.plot import plot

    folder = out / f"learning{tag}"
    summaries: dict[str, list[dict]] = {}
    runs: list[Path] = []
    for name in ALGORITHMS:
        if not available(name):
            print(f"skipping {name}: its recipe does not import", flush=True)
            continue
        for seed in seeds:
            run_dir = folder / f"{name}-seed{seed}"
            summary = run_training(name, seed, frames[name], run_dir)
            summaries.setdefault(name, []).append(summary)
            runs.append(run_dir)

    def fmt(value, spec: str) -> str:
        return "—" if value is None else format(value, spec)

    rows = [
        "| algorithm | frames | seeds reaching 475 | frames to 475 (median) | final mean return "
        "(median) | fps (median) | wall s (median) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, results in summaries.items():
        reached = sum(r["frames_to_threshold"] is not None for r in results)
        rows.append(
            f"| {name} | {frames[name]:,} | {reached}/{len(results)} "
            f"| {fmt(median(r['frames_to_threshold'] for r in results), ',.0f')} "
            f"| {fmt(median(r['final_mean_return'] for r in results), '.1f')} "
            f"| {fmt(median(r['fps'] for r in results), ',.0f')} "
            f"| {fmt(median(r['wall_seconds'] for r in results), '.1f')} |"
        )
    table = "\n".join(rows)
    png = plot(runs, out / f"learning{tag}.png", f"CartPole-v1, seeds {seeds}")
    markdown = out / f"learning{tag}.md"
    write_markdown(
        markdown,
        "# Learning benchmark: every algorithm on CartPole-v1\n\n"
        f"Command: `python benchmarks/run.py{command}` (default configs, "
        f"seeds {seeds}, each run a fresh `ac-train` process one after the other; frames to "
        "475: first frame at which the mean of the last 20 finished episode returns reached "
        "475; final mean return: mean of the last 20 training episodes; wall seconds include "
        "model and collector start-up).\n\n" + table + f"\n\nCurves: `{png.name}`; runs: "
        f"`{folder.name}/` beside this page (written by the command, not committed).\n",
    )
    print("\n" + table + f"\n\nwrote {markdown}\nplot: {png}", flush=True)
    return markdown, png


def throughput(frames: int, repeats: int = 3) -> Path:
    """Training fps vs collection-only fps vs raw gymnasium fps, measured in one run.

    The three measurements are interleaved ``repeats`` times; the table gives their medians
    (the machine is shared and noisy) and the ratios of the medians.
    """
    from functools import partial

    import gymnasium as gym

    from ac_extensions.modules import collection_policy
    from ac_extensions.recipes import ppo as on_policy
    from ac_extensions.recipes.ppo import PPOConfig
    from ac_extensions.runtime import start_collector, stop_collector

    config = PPOConfig(frames=frames)
    per_batch = config.frames_per_batch

    def steady_fps(batches) -> float:
        """Frames per second after the first batch (start-up excluded)."""
        start = count = None
        for _ in batches:
            if start is None:
                start, count = time.perf_counter(), 0
            else:
                count += per_batch
        return count / (time.perf_counter() - start)

    def collection_only() -> float:
        actor, critic, *_ = on_policy.build(config)
        collector = start_collector(
            config, partial(on_policy.make_env, config), collection_policy(actor, critic)
        )
        try:
            return steady_fps(iter(collector))
        finally:
            stop_collector(collector)

    envs = config.workers * config.envs_per_worker

    def raw_gymnasium() -> float:
        vector = gym.make_vec(config.env_id, num_envs=envs, vectorization_mode="sync")
        vector.reset(seed=0)
        steps = frames // envs
        start = time.perf_counter()
        for _ in range(steps):
            vector.step(vector.action_space.sample())
        vector.close()
        return steps * envs / (time.perf_counter() - start)

    samples: dict[str, list[float]] = {"training": [], "collecting": [], "raw": []}
    for repeat in range(repeats):
        samples["training"].append(steady_fps(on_policy.train(config)))
        samples["collecting"].append(collection_only())
        samples["raw"].append(raw_gymnasium())
        print(f"repeat {repeat + 1}/{repeats}: " + ", ".join(
            f"{k} {v[-1]:,.0f} fps" for k, v in samples.items()), flush=True)  # fmt: skip
    training, collecting, raw = (statistics.median(samples[k]) for k in samples)
    table = (
        "| measure | frames per second | training / this |\n|---|---|---|\n"
        f"| PPO training (W={config.workers}, E={config.envs_per_worker}, "
        f"T={config.rollout_length}) | {training:,.0f} | 1.00 |\n"
        f"| same collector and policy, no learning | {collecting:,.0f} | "
        f"{training / collecting:.2f} |\n"
        f"| raw gymnasium SyncVectorEnv ({envs} envs, random actions, 1 process) | {raw:,.0f} | "
        f"{training / raw:.2f} |"
    )
    out = RESULTS / "throughput.md"
    write_markdown(
        out,
        "# Throughput on CartPole-v1, measured in one run\n\n"
        f"Command: `python benchmarks/run.py --only throughput` ({frames:,} frames each, "
        f"the first batch excluded as start-up; medians of {repeats} interleaved repeats; "
        f"load average {os.getloadavg()[0]:.1f} at the end).\n\n" + table + "\n\nPer repeat "
        "(fps): "
        + "; ".join(f"{k} {', '.join(f'{v:,.0f}' for v in vs)}" for k, vs in samples.items())
        + "\n",
    )
    print("\n" + table + f"\n\nwrote {out}", flush=True)
    return out


def micro() -> None:
    """Run each micro-benchmark of :data:`MICRO` (ops, updates, collection) in its own process."""
    for script in MICRO:
        print(f"\n$ python benchmarks/{' '.join(script)}", flush=True)
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / script[0]), *script[1:]],
                       cwd=ROOT, check=True)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="learning only: 1 seed, small "
                        "budgets (a few minutes on 2 cores)")  # fmt: skip
    parser.add_argument("--only", choices=["learning", "throughput", "micro"], default=None)
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--throughput-frames", type=int, default=50_176)
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where the learning table, plot and runs go (default: runs/ with --quick, "
        "else benchmarks/results/)",
    )
    parser.add_argument(
        "--frames-scale",
        type=float,
        default=1.0,
        help="multiply every learning budget (a shorter run of the same job, e.g. in CI)",
    )
    args = parser.parse_args(argv)
    sections = [args.only] if args.only else (["learning"] if args.quick else
                                              ["learning", "throughput", "micro"])  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    if "learning" in sections:
        out = args.out or (ROOT / "runs" if args.quick else RESULTS)
        out.mkdir(parents=True, exist_ok=True)
        seeds = args.seeds or ([1] if args.quick else [1, 2, 3])
        budgets = QUICK_FRAMES if args.quick else FULL_FRAMES
        budgets = {name: max(1, round(args.frames_scale * n)) for name, n in budgets.items()}
        command = " ".join(argv if argv is not None else sys.argv[1:])
        learning(seeds, budgets, "_quick" * args.quick, out, f" {command}" if command else "")
    if "throughput" in sections:
        throughput(args.throughput_frames)
    if "micro" in sections:
        micro()


if __name__ == "__main__":
    main()
