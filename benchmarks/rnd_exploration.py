"""PPO with and without Random Network Distillation, same settings, on sparse rewards (resumable).

Burda et al., 2018, "Exploration by Random Network Distillation", arXiv:1810.12894. Each run is
``ac-train ppo`` as a user runs it, with the env's settings below; the ``rnd`` variant adds
``--rnd`` (an intrinsic reward from a fixed random network's prediction error, its own value
head and advantage: :class:`~ac_extensions.objectives.RNDPPOLoss`), nothing else.

    python benchmarks/rnd_exploration.py --env DeepSea-v0 --seeds 1 2 3 --jobs 2
    python benchmarks/rnd_exploration.py --env SparseMountainCar-v0 --seeds 1 2 3
    python benchmarks/rnd_exploration.py --env MinAtar/Seaquest-v1 --seeds 1 --frames 1000000
    python benchmarks/rnd_exploration.py --env DeepSea-v0 --summary-only

* ``DeepSea-v0`` (registered by ``ac_extensions.runtime.envs``; Osband et al., 2019, bsuite):
  a 20 × 20 grid where only moving right at every step (each move right costing 0.01/20)
  reaches the reward of 1 (a random policy: about 2 episodes in 1,000,000). The recipe's
  defaults for small vector tasks (rl-baselines3-zoo's tuned CartPole PPO).
* ``SparseMountainCar-v0`` (registered by ``ac_extensions.runtime.envs``): MountainCar-v0
  paying 1 at the flag and 0 otherwise, so an episode's return is whether it reached the flag
  within 200 steps. The recipe's defaults for small vector tasks (rl-baselines3-zoo's tuned
  CartPole PPO) plus observation normalisation (MountainCar's velocity is ~100× smaller than
  its position) and a 20-episode return window.
* ``MinAtar/Seaquest-v1``: the recipe's MinAtar defaults, 100-episode window (the MinAtar
  grid's command).

A run lives in ``benchmarks/results/rnd/runs/<env>/<variant>/seed<N>/`` (``summary.json``,
the logged curves); a complete run is skipped, an unfinished one resumes from its checkpoint.
Output: ``benchmarks/results/rnd_<env>.{md,json,png}``: per variant the final return window
(median and min–max over seeds), the fraction of seeds whose window ever reached the env's
threshold, fps, and the curves.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _scheduler as scheduler  # noqa: E402
from _results import write_markdown  # noqa: E402
from _summary import fmt, median, plot_curves, read_run, strip_curves  # noqa: E402

RESULTS = HERE / "results"
VARIANTS = {"ppo": [], "rnd": ["--rnd"]}
"""Each variant's flags on top of the env's."""
ENVS = {
    "DeepSea-v0": {"flags": [], "frames": 61_440, "threshold": 0.9},
    "SparseMountainCar-v0": {
        "flags": ["--normalize-observations", "--return-window", "20"],
        "frames": 100_000,
        "threshold": 0.5,
    },
    "MinAtar/Seaquest-v1": {"flags": ["--return-window", "100"], "frames": 1_000_000},
}
"""Per env: its flags, default frames and (optionally) the window that counts as solved."""


def slug(env: str) -> str:
    """A file-name form of an env id."""
    return env.replace("/", "_").replace("-", "_").lower()


def window(env: str) -> int:
    """The return window of ``env``'s runs (its ``--return-window``, else the recipe's 20)."""
    flags = ENVS[env]["flags"]
    return int(flags[flags.index("--return-window") + 1]) if "--return-window" in flags else 20


def run_dir(results: Path, env: str, variant: str, seed: int) -> Path:
    """Where one run lives."""
    return results / "rnd" / "runs" / slug(env) / variant / f"seed{seed}"


def train(results: Path, env: str, variant: str, seed: int, frames: int) -> str:
    """Run (or resume, or skip) one run; a one-line outcome."""
    directory = run_dir(results, env, variant, seed)
    if scheduler.complete_at(scheduler.read_summary(directory), frames):
        return f"{variant} seed {seed}: complete, skipped"
    directory.mkdir(parents=True, exist_ok=True)
    command = [*scheduler.ac_train(), "ppo", "--env", env, "--frames", str(frames)]
    command += ["--seed", str(seed), "--out", str(directory), *ENVS[env]["flags"]]
    command += [*VARIANTS[variant], "--quiet"]
    if scheduler.has_checkpoint(directory):
        command.append("--resume")
    result = scheduler.run_process(command, directory, timeout=frames / 10 + 600)
    if result["status"] == "ok":
        scheduler.prune_checkpoints(directory)
    summary = result["summary"] or {}
    return (
        f"{variant} seed {seed}: {result['status']} in {result['seconds']:.0f} s "
        f"(return window {fmt(summary.get('final_mean_return'), '.2f')})"
    )


def reached(run: dict, threshold: float) -> bool:
    """Whether the run's return window ever reached ``threshold``."""
    return any(v >= threshold for v in run["curve"]["values"])


def summarise(results: Path, env: str, seeds: list[int], frames: int) -> dict:
    """The table's numbers and the curves of every complete run of ``env``."""
    threshold = ENVS[env].get("threshold")
    algorithms = {}
    for variant in VARIANTS:
        runs = [read_run(run_dir(results, env, variant, s)) for s in seeds]
        runs = [r for r in runs if r and r["complete"] and (r["frames_target"] or 0) >= frames]
        finals = [r["final_mean_return"] for r in runs]
        stats = {
            "seeds": len(runs),
            "final_median": median(finals),
            "final_min": min(finals, default=None),
            "final_max": max(finals, default=None),
            "per_seed": {r["seed"]: r["final_mean_return"] for r in runs},
            "fps": median([r["fps"] for r in runs]),
            "runs": runs,
        }
        if threshold is not None:
            stats["reached"] = sum(reached(r, threshold) for r in runs)
        algorithms[variant] = stats
    return {
        "env": env,
        "frames": frames,
        "threshold": threshold,
        "games": {env: {"algorithms": algorithms}},
    }


def write(results: Path, summary: dict) -> Path:
    """``rnd_<env>.{md,json,png}``; the markdown's path."""
    env, frames, threshold = summary["env"], summary["frames"], summary["threshold"]
    base = results / f"rnd_{slug(env)}"
    base.with_suffix(".json").write_text(json.dumps(strip_curves(summary), indent=1) + "\n")
    png = plot_curves(
        summary,
        base.with_suffix(".png"),
        title=lambda e: e,
        xlabel="frames",
        algos=list(VARIANTS),
        sb3_algos=(),
        caption="PPO with and without RND (median of seeds, band: min–max)",
        ylabel=f"mean return, last {window(env)} episodes",
    )
    flags = "".join(f" {flag}" for flag in ENVS[env]["flags"])
    stats = summary["games"][env]["algorithms"].values()
    seeds = " ".join(str(s) for s in sorted({s for a in stats for s in a["per_seed"]}))
    lines = [
        f"# PPO with and without Random Network Distillation: {env}",
        "",
        f"Command: `python benchmarks/rnd_exploration.py --env {env} --seeds {seeds} "
        f"--frames {frames}`; each run is `ac-train ppo --env {env} --frames {frames} "
        f"--seed S{flags}`, the `rnd` variant with `--rnd` added; the return window is the "
        f"mean of the last {window(env)} episodes at the end of the run.",
        "",
        "| variant | seeds | final return window, median (min–max) | per seed |"
        + (f" seeds reaching {threshold} |" if threshold is not None else "")
        + " fps |",
        "|---|---|---|---|" + ("---|" if threshold is not None else "") + "---|",
    ]
    for variant, stats in summary["games"][env]["algorithms"].items():
        if not stats["seeds"]:
            continue  # not run for this env (see the page's notes)
        per_seed = ", ".join(f"{s}: {v:.2f}" for s, v in sorted(stats["per_seed"].items()))
        row = (
            f"| {variant} | {stats['seeds']} | {fmt(stats['final_median'], '.2f')} "
            f"({fmt(stats['final_min'], '.2f')}–{fmt(stats['final_max'], '.2f')}) | {per_seed} |"
        )
        if threshold is not None:
            row += f" {stats['reached']} of {stats['seeds']} |"
        lines.append(row + f" {fmt(stats['fps'], ',.0f')} |")
    if png:
        lines += ["", f"![curves]({png.name})"]
    md = base.with_suffix(".md")
    write_markdown(md, "\n".join(lines) + "\n")
    return md


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", choices=list(ENVS), default="DeepSea-v0")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--frames", type=int, default=None, help="default: the env's")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--summary-only", action="store_true")
    args = parser.parse_args(argv)
    frames = args.frames or ENVS[args.env]["frames"]
    if not args.summary_only:
        jobs = [(v, s) for s in args.seeds for v in args.variants]
        with scheduler.stop_on_interrupt(), ThreadPoolExecutor(args.jobs) as pool:
            futures = [pool.submit(train, args.results, args.env, v, s, frames) for v, s in jobs]
            for future in futures:
                print(future.result(), flush=True)
    md = write(args.results, summarise(args.results, args.env, args.seeds, frames))
    print(f"wrote {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
