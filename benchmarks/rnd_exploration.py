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
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _scheduler as scheduler  # noqa: E402
from _results import write_markdown  # noqa: E402
from _sb3 import CHECKPOINT_MINUTES  # noqa: E402
from _summary import algo_stats, fmt, plot_curves, read_run, strip_curves  # noqa: E402

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
    return Path(results) / "rnd" / "runs" / slug(env) / variant / f"seed{seed}"


@dataclass(frozen=True)
class Run:
    """One (env, variant, seed) cell, as :func:`_scheduler.run_grid` runs it."""

    env: str
    variant: str
    seed: int

    def directory(self, results: Path) -> Path:
        """Where the run lives."""
        return run_dir(results, self.env, self.variant, self.seed)

    def __str__(self) -> str:
        return f"{self.env} {self.variant} seed {self.seed}"


def action(run: Run, results: Path, frames: int) -> str:
    """``"done"``, ``"resume"`` (with a checkpoint) or ``"fresh"``."""
    directory = run.directory(results)
    if scheduler.complete_at(scheduler.read_summary(directory), frames):
        return "done"
    return "resume" if scheduler.has_checkpoint(directory) else "fresh"


def command(run: Run, results: Path, frames: int, how: str) -> list[str]:
    """``ac-train ppo`` for one run (``how``: ``"fresh"`` or ``"resume"``)."""
    directory = run.directory(results)
    every = ["--checkpoint-minutes", f"{CHECKPOINT_MINUTES:g}", "--quiet"]
    if how == "resume":
        return [*scheduler.ac_train(), "ppo", "--resume", str(directory), "--frames", str(frames)]
    return [
        *scheduler.ac_train(),
        *("ppo", "--env", run.env, "--frames", str(frames), "--seed", str(run.seed)),
        *("--out", str(directory), *ENVS[run.env]["flags"], *VARIANTS[run.variant], *every),
    ]


def execute(run: Run, results: Path, frames: int, how: str, timeout: float) -> dict:
    """Run one cell in a subprocess (:func:`_scheduler.execute` with these commands)."""
    return scheduler.execute(run, results, frames, how, timeout, action, command)


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
        stats = algo_stats(runs, None)  # final median, min, max, fps
        stats |= {"per_seed": {r["seed"]: r["final_mean_return"] for r in runs}, "runs": runs}
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
        lines.append(row + f" {fmt(stats['fps_median'], ',.0f')} |")
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
    args.frames = args.frames or ENVS[args.env]["frames"]
    failures = 0
    if not args.summary_only:  # the grids' runner: locks, resume, pruned checkpoints
        args.timeout, args.keep_checkpoints = args.frames / 10 + 600, False
        runs = [Run(args.env, v, s) for s in args.seeds for v in args.variants]
        failures = scheduler.run_grid(runs, args, action, execute)
    md = write(args.results, summarise(args.results, args.env, args.seeds, args.frames))
    print(f"wrote {md}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
