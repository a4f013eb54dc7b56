"""Training throughput with the Ray backend against the number of collector actors, in one run.

A recipe (PPO by default, or ACER) trains on CartPole-v1 with ``backend="ray"`` and W = 1, 2
collector actors (each stepping E environments for T steps per batch, so a batch is W·E·T
frames: more actors, bigger batches, same work per actor), and with the local backend
(``MultiSyncCollector``, W worker processes) as the baseline, measured in the same process on
one local Ray instance started once (``ray.init(num_cpus=max(cores, W))``). Per run: the
start-up (seconds until the first batch: actors or worker processes, weight sync) and the
steady training frames per second after the first batch (learning included); the median over
repeats, the configurations interleaved so that a change of machine load hits them alike.
Ratios are against the local backend with the same W. Writes
``benchmarks/results/ray_scaling.{md,json}``.

    python benchmarks/ray_scaling.py                      # PPO, W = 1, 2, 3 repeats
    python benchmarks/ray_scaling.py --recipe acer --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write_markdown

RESULTS = Path(__file__).resolve().parent / "results"


def make_config(recipe: str, backend: str, workers: int, frames: int):
    """The recipe's default config with the backend, W and the frame budget set."""
    if recipe == "ppo":
        from ac_extensions.recipes.ppo import PPOConfig

        return PPOConfig(backend=backend, workers=workers, frames=frames)
    from ac_extensions.recipes.acer import ACERConfig

    return ACERConfig(backend=backend, workers=workers, frames=frames)


def train(recipe: str, config):
    """The recipe's training generator."""
    if recipe == "ppo":
        from ac_extensions.recipes.ppo import train as run
    else:
        from ac_extensions.recipes.acer import train as run
    return run(config)


def measure(recipe: str, config) -> dict[str, float]:
    """Start-up seconds and steady frames per second (after the first batch) of one run."""
    start = time.perf_counter()
    stamps = []
    for _ in train(recipe, config):
        stamps.append(time.perf_counter())
    frames = config.frames_per_batch * (len(stamps) - 1)
    return {
        "startup_s": stamps[0] - start,
        "fps": frames / (stamps[-1] - stamps[0]),
        "batches": len(stamps),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", choices=["ppo", "acer"], default="ppo")
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--frames", type=int, default=None, help="per run (default: 16 batches)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import ray
    import torchrl

    cores = os.cpu_count() or 1
    load = os.getloadavg()[0]
    ray.init(num_cpus=max(cores, *args.actors), include_dashboard=False, log_to_driver=False)
    setups = [(backend, w) for w in args.actors for backend in ("local", "ray")]
    runs: dict[tuple[str, int], list[dict[str, float]]] = {setup: [] for setup in setups}
    try:
        for repeat in range(args.repeats):
            for backend, workers in setups:
                probe = make_config(args.recipe, backend, workers, 1)
                frames = args.frames or 16 * probe.frames_per_batch
                result = measure(args.recipe, make_config(args.recipe, backend, workers, frames))
                runs[backend, workers].append(result)
                print(json.dumps({"repeat": repeat, "backend": backend, "W": workers} | result))
    finally:
        ray.shutdown()

    rows = []
    for backend, workers in setups:
        results = runs[backend, workers]
        rows.append(
            {
                "backend": backend,
                "workers": workers,
                "fps_median": statistics.median(r["fps"] for r in results),
                "startup_s_median": statistics.median(r["startup_s"] for r in results),
                "fps_runs": [round(r["fps"], 1) for r in results],
                "startup_s_runs": [round(r["startup_s"], 2) for r in results],
            }
        )
    fps = {(r["backend"], r["workers"]): r["fps_median"] for r in rows}
    base = fps["ray", min(args.actors)]
    config = make_config(args.recipe, "local", 1, 1)
    lines = [
        f"# Ray backend: {args.recipe.upper()} training throughput vs collector actors "
        "(CartPole-v1, one machine)",
        "",
        f"Command: `python benchmarks/ray_scaling.py --recipe {args.recipe} --repeats "
        f"{args.repeats}` ({cores} cores shared with other jobs, load average {load:.1f} at "
        f"the start; torch {torch.__version__}, torchrl {torchrl.__version__}, ray "
        f"{ray.__version__}, {platform.machine()}). The recipe's default config (E = "
        f"{config.envs_per_worker} envs per actor or worker, T = {config.rollout_length}) "
        f"with W actors (Ray) or W worker processes (local `MultiSyncCollector`): a batch is "
        "W·E·T frames, 16 batches a run. fps: frames per second of training (collection and "
        "learning) after the first batch; start-up: seconds until the first batch (workers or "
        "actors started, weights synced; the Ray instance itself was started once before). "
        f"Medians over {args.repeats} runs, the configurations interleaved.",
        "",
        "| backend | W | training fps | fps / Ray W=1 | Ray / local (same W) | start-up s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        w = r["workers"]
        lines.append(
            f"| {r['backend']} | {w} | {r['fps_median']:,.0f} | {r['fps_median'] / base:.2f} | "
            f"{fps['ray', w] / fps['local', w] if r['backend'] == 'ray' else 1.0:.2f} | "
            f"{r['startup_s_median']:.1f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(exist_ok=True)
    write_markdown((RESULTS / "ray_scaling.md"), text)
    meta = {"recipe": args.recipe, "repeats": args.repeats, "cores": cores, "load": load}
    (RESULTS / "ray_scaling.json").write_text(json.dumps(meta | {"rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
