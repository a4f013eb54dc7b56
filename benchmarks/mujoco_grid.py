"""MuJoCo: continuous ACER, PPO and A2C beside Stable-Baselines3 PPO and A2C (zoo), resumable.

Grid: tasks HalfCheetah-v5, Hopper-v5, Walker2d-v5 (gymnasium's MuJoCo tasks, the ``mujoco``
extra) × algorithms × seeds, every run to the same number of environment steps (default
1,000,000).

    make bench-mujoco                                   # the grid: 3 tasks × 6 algos × 3 seeds
    python benchmarks/mujoco_grid.py --tasks HalfCheetah --algos acer --seeds 1 --frames 100000
    python benchmarks/mujoco_grid.py --algos acer acer_paper sb3_ppo   # + the paper's settings
    python benchmarks/mujoco_grid.py --summary-only     # rewrite the table and plot from the runs

A run of part of the grid writes the summary of the whole default grid plus its selection (the
other runs' rows stay); ``--summary-only`` tabulates just the selection it is given.

(Not named ``mujoco.py``: a file of that name in this folder, ``sys.path[0]`` of every script
here, would shadow the ``mujoco`` package that gymnasium imports to build these tasks.)

Ours run through the CLI exactly as users run it, each in its own process:

- ``acer``: ``ac-train acer --env <Task>-v5 --frames N --seed S --return-window 100 --out
  <rundir>``, i.e. ``ACERConfig.for_env``'s MuJoCo defaults (observation normalisation, learned
  state-independent σ from 0.5, two 256-unit layers, replay ratio 4; see
  :class:`~ac_extensions.recipes.acer.ACERConfig`). Actions are clipped to the bounds inside the
  env (:func:`~ac_extensions.runtime.envs.prepare_mujoco`).
- ``acer_paper``: the same with ``ACERConfig.PAPER_CONTINUOUS`` on top (fixed σ = 0.3, c = 5,
  α = 0.995, k = 50, n = 5; Wang et al., 2017, arXiv:1611.01224v2, §6).
- ``ppo``, ``a2c``: ``ac-train ppo|a2c`` with the recipes' MuJoCo defaults (a Gaussian policy
  with a state-independent σ, observation and reward normalisation; PPO the PPO paper's
  settings with σ starting at 0.5, A2C SB3's defaults:
  :class:`~ac_extensions.recipes.ppo.PPOConfig`, :class:`~ac_extensions.recipes.a2c.A2CConfig`).
- ``ppo_sigma1``: ``ac-train ppo`` with the PPO paper's initial σ = 1 (``--init-scale 1``)
  instead of the MuJoCo default's 0.5; the grid's PPO rows before that default.
- ``a2c_sigma05``: ``ac-train a2c`` with the Gaussian started at σ = 0.5 (``--init-scale 0.5``)
  instead of SB3's 1, the setting that PPO's MuJoCo default took; screened (no gain), outside
  the default grid.

The Stable-Baselines3 baseline ``sb3_a2c`` is SB3 A2C with its defaults, as rl-baselines3-zoo's
``hyperparams/a2c.yml`` runs it on the MuJoCo ``-v4`` tasks (``normalize: true``, one env). The
baseline ``sb3_ppo`` runs in a child process of this script (``--child``), as ``sb3_a2c``
does: SB3 PPO with rl-baselines3-zoo's tuned settings for these tasks (``hyperparams/ppo.yml``,
the ``-v3`` entries, commit 00128b5d; :data:`ZOO_PPO`), including the zoo's ``normalize: true``
(``VecNormalize`` of observations and rewards, its γ the agent's γ, as the zoo sets it), one
env, gymnasium's task as it is (SB3 clips actions to the bounds itself), one torch thread. Its
logged return is the raw episode return (the ``Monitor`` under ``VecNormalize``).

Layout, resumability and the summary are the MinAtar grid's (the harness modules
``_scheduler``, ``_sb3``, ``_summary``): each run lives in
``<results>/mujoco/runs/<Task>/<algo>/seed<N>/`` with ``summary.json`` and
``logs/<algo>/scalars/train/return_window.csv`` (the 100-episode training mean); a complete run
is skipped, an unfinished one resumes from its checkpoint (ours with ``ac-train --resume``,
the SB3 runs from their ``_sb3.SB3Checkpoint``, ``VecNormalize`` statistics included);
``--jobs`` (default 2) runs at once. Output
``<results>/mujoco.{md,json,png}``: per task and algorithm the final mean return (mean of the
last 100 training episodes at the end of the run; median and min–max over seeds), fps, the
curves with seed bands, and the published 1M-step numbers of SB3's zoo (SAC, TD3, PPO; one run
each, deterministic evaluation) and CleanRL (3 seeds, training return) beside them with their
source (:data:`PUBLISHED`).

Training fps against collection alone: ``benchmarks/mujoco_speed.py``.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _intervals as intervals  # noqa: E402
import _scheduler as scheduler  # noqa: E402
from _grid_cli import (  # noqa: E402
    add_grid_arguments,
    prepare,
    report,
    require,
    runs_present_line,
    widen_to_grid,
)
from _sb3 import CHECKPOINT_MINUTES, WINDOW, SB3Checkpoint, SB3Log, jsonable, learn_sb3  # noqa: E402
from _scheduler import ac_train, complete_at, has_checkpoint, read_summary  # noqa: E402
from _summary import (  # noqa: E402
    algo_stats,
    fmt,
    median,
    plot_curves,
    read_run,
    write_grid_results,
)

RESULTS = HERE / "results"
TASKS = ("HalfCheetah", "Hopper", "Walker2d")
OURS = ("acer", "acer_paper", "ppo", "ppo_sigma1", "a2c", "a2c_sigma05")
SB3_ALGOS = ("sb3_ppo", "sb3_a2c")
ALGOS = OURS + SB3_ALGOS
DEFAULT_ALGOS = ("acer", "ppo", "ppo_sigma1", "a2c", "sb3_ppo", "sb3_a2c")

_POLICY_256 = {"log_std_init": -2, "ortho_init": False, "activation_fn": "ReLU", "net_arch": 256}
ZOO_PPO: dict[str, dict[str, Any]] = {
    # rl-baselines3-zoo hyperparams/ppo.yml (commit 00128b5d), the tuned "-v3" entries; all with
    # normalize: true, n_envs: 1, n_timesteps: 1e6, policy: MlpPolicy. "policy" here stands for
    # policy_kwargs=dict(log_std_init=-2, ortho_init=False, activation_fn=nn.ReLU,
    # net_arch=dict(pi=[256, 256], vf=[256, 256])); Walker2d-v3 has none (SB3's defaults).
    "HalfCheetah": dict(
        batch_size=64,
        n_steps=512,
        gamma=0.98,
        learning_rate=2.0633e-05,
        ent_coef=0.000401762,
        clip_range=0.1,
        n_epochs=20,
        gae_lambda=0.92,
        max_grad_norm=0.8,
        vf_coef=0.58096,
        policy=_POLICY_256,
    ),
    "Hopper": dict(
        batch_size=32,
        n_steps=512,
        gamma=0.999,
        learning_rate=9.80828e-05,
        ent_coef=0.00229519,
        clip_range=0.2,
        n_epochs=5,
        gae_lambda=0.99,
        max_grad_norm=0.7,
        vf_coef=0.835671,
        policy=_POLICY_256,
    ),
    "Walker2d": dict(
        batch_size=32,
        n_steps=512,
        gamma=0.99,
        learning_rate=5.05041e-05,
        ent_coef=0.000585045,
        clip_range=0.1,
        n_epochs=20,
        gae_lambda=0.95,
        max_grad_norm=1,
        vf_coef=0.871923,
        policy=None,
    ),
}

PUBLISHED_SOURCES = {
    "zoo": "rl-baselines3-zoo `benchmark.md` (gym v3, 1M steps, one run, deterministic "
    "evaluation, ± across evaluation episodes)",
    "cleanrl": "CleanRL benchmark (gymnasium v4, 1M steps, 3 seeds, training return over the "
    "last 100 episodes, ± across seeds)",
}
PUBLISHED: dict[str, dict[str, str]] = {
    # task: {row: value as published (PUBLISHED_SOURCES)}
    "HalfCheetah": {
        "SB3 zoo SAC": "9535 ± 100",
        "SB3 zoo TD3": "9656 ± 970",
        "SB3 zoo PPO": "5819 ± 664",
        "CleanRL SAC": "9635 ± 1424",
        "CleanRL PPO": "1443 ± 46",
    },
    "Hopper": {
        "SB3 zoo SAC": "2326 ± 1130",
        "SB3 zoo TD3": "3606 ± 4",
        "SB3 zoo PPO": "2410 ± 10",
        "CleanRL SAC": "2310 ± 343",
        "CleanRL PPO": "2383 ± 272",
    },
    "Walker2d": {
        "SB3 zoo SAC": "3863 ± 254",
        "SB3 zoo TD3": "4718 ± 46",
        "SB3 zoo PPO": "3479 ± 822",
        "CleanRL SAC": "3591 ± 911",
        "CleanRL PPO": "2288 ± 572",
    },
}


@dataclass(frozen=True)
class Run:
    """One (task, algorithm, seed) cell of the grid."""

    task: str
    algo: str
    seed: int

    @property
    def env_id(self) -> str:
        """The gymnasium id."""
        return f"{self.task}-v5"

    def directory(self, results: Path) -> Path:
        """Where the run lives."""
        return Path(results) / "mujoco" / "runs" / self.task / self.algo / f"seed{self.seed}"

    def __str__(self) -> str:
        return f"{self.task} {self.algo} seed {self.seed}"


def plan(tasks, algos, seeds) -> list[Run]:
    """The runs of the grid, task by task."""
    return [Run(t, a, s) for t in tasks for a in algos for s in seeds]


def paper_flags() -> list[str]:
    """``ac-train`` flags for ``ACERConfig.PAPER_CONTINUOUS``."""
    from ac_extensions.recipes.acer import ACERConfig

    flags = []
    for name, value in ACERConfig.PAPER_CONTINUOUS.items():
        flags += [f"--{name.replace('_', '-')}", str(value)]
    return flags


VARIANTS: dict[str, tuple[str, Callable[[], list[str]]]] = {
    "acer_paper": ("acer", paper_flags),
    "ppo_sigma1": ("ppo", lambda: ["--init-scale", "1"]),
    "a2c_sigma05": ("a2c", lambda: ["--init-scale", "0.5"]),
}
"""Our named variants: ``algo → (recipe, its extra ac-train flags)``, on top of the defaults."""


def action(run: Run, results: Path, frames: int) -> str:
    """``"done"``, ``"resume"`` (ours, with a checkpoint) or ``"fresh"``."""
    directory = run.directory(results)
    if complete_at(read_summary(directory), frames):
        return "done"
    if has_checkpoint(directory):
        return "resume"
    return "fresh"


def command(run: Run, results: Path, frames: int, how: str) -> list[str]:
    """The command line of one run (``how``: ``"fresh"`` or ``"resume"``)."""
    directory = run.directory(results)
    if run.algo in SB3_ALGOS:
        child = ["--child", run.algo, run.task, str(run.seed), str(frames), str(directory)]
        return [sys.executable, str(Path(__file__).resolve()), *child]
    every = ["--checkpoint-minutes", f"{CHECKPOINT_MINUTES:g}"]
    recipe, flags = VARIANTS.get(run.algo, (run.algo, list))
    if how == "resume":
        return [
            *ac_train(),
            recipe,
            *("--resume", str(directory), "--frames", str(frames)),
            *every,
        ]
    extra = flags()
    return [
        *ac_train(),
        recipe,
        "--env",
        run.env_id,
        "--frames",
        str(frames),
        "--seed",
        str(run.seed),
        "--return-window",
        str(WINDOW),
        *every,
        "--out",
        str(directory),
        *extra,
    ]


def execute(run: Run, results: Path, frames: int, how: str, timeout: float) -> dict:
    """Run one cell in a subprocess (:func:`_scheduler.execute` with this grid's commands)."""
    return scheduler.execute(run, results, frames, how, timeout, action, command)


def run_grid(runs: list[Run], args: argparse.Namespace) -> int:
    """Run every cell that is not done, ``args.jobs`` at a time (:func:`_scheduler.run_grid`)."""
    return scheduler.run_grid(runs, args, action, execute)


# ---------------------------------------------------------------------------------------------
# The Stable-Baselines3 runs (the --child process)


def sb3_settings(task: str) -> dict[str, Any]:
    """SB3 ``PPO`` keywords for ``task`` (:data:`ZOO_PPO`, policy keywords made real)."""
    from torch import nn

    settings = dict(ZOO_PPO[task])
    policy = settings.pop("policy")
    if policy is not None:
        width = policy["net_arch"]
        settings["policy_kwargs"] = {
            "log_std_init": policy["log_std_init"],
            "ortho_init": policy["ortho_init"],
            "activation_fn": getattr(nn, policy["activation_fn"]),
            "net_arch": {"pi": [width, width], "vf": [width, width]},
        }
    return settings


def train_sb3(algo: str, task: str, seed: int, frames: int, out: Path) -> dict | None:
    """Train a SB3 baseline to ``frames`` on ``task`` in ``out`` (resuming its checkpoint if any).

    ``sb3_ppo``: PPO with :data:`ZOO_PPO`; ``sb3_a2c``: A2C with SB3's defaults, which the
    zoo's ``hyperparams/a2c.yml`` uses for the MuJoCo ``-v4`` tasks (``normalize: true``, one
    env, 1M steps). Returns the summary, or None when the run was stopped before the end
    (checkpoint saved, the ``VecNormalize`` statistics with it).
    """
    import gymnasium as gym
    import torch
    from stable_baselines3 import A2C, PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    torch.set_num_threads(1)
    env_id = f"{task}-v5"
    settings = sb3_settings(task) if algo == "sb3_ppo" else {}
    gamma = settings.get("gamma", 0.99)
    config = {"env_id": env_id, "frames": frames, "seed": seed, "n_envs": 1, "normalize": True}
    log = SB3Log(out, algo, env_id, seed, frames, config | jsonable(settings))
    checkpoint = SB3Checkpoint(out, extra_save=lambda d: env.save(str(d / NORMALIZE)))
    saved = checkpoint.latest()
    venv = make_vec_env(lambda: gym.make(env_id), n_envs=1, seed=seed + checkpoint.saved_frames())
    if saved is None:
        env = VecNormalize(venv, gamma=gamma)
    else:  # the running statistics the policy was trained with
        env = VecNormalize.load(str(saved / NORMALIZE), venv)
    cls = PPO if algo == "sb3_ppo" else A2C
    model = cls("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **settings)
    complete = learn_sb3(model, log, checkpoint, frames, seed)
    env.close()
    return read_summary(out) if complete else None


NORMALIZE = "vecnormalize.pkl"
"""The SB3 checkpoint's file of ``VecNormalize`` statistics."""


# ---------------------------------------------------------------------------------------------
# Summary


def summarize(results: Path, tasks, algos, seeds) -> dict[str, Any]:
    """Everything the table and the plot show, from the run directories."""
    per_task: dict[str, Any] = {}
    present = complete = 0
    for task in tasks:
        runs: dict[str, list[dict]] = {}
        for algo in algos:
            found = [read_run(Run(task, algo, s).directory(results)) for s in seeds]
            runs[algo] = [r for r in found if r is not None]
            present += len(runs[algo])
            complete += sum(r["complete"] for r in runs[algo])
        per_task[task] = {
            "algorithms": {
                a: algo_stats(runs[a], None) | {"runs": runs[a]} for a in algos if runs[a]
            },
            "published": PUBLISHED.get(task, {}),
        }
    return {
        "planned": len(plan(tasks, algos, seeds)),
        "present": present,
        "complete": complete,
        "games": per_task,
    }


def task_table(task: str, data: dict[str, Any], planned_seeds: int) -> list[str]:
    """The markdown lines of one task."""
    lines = [
        f"## {task}-v5",
        "",
        f"| algorithm | seeds | return, last {WINDOW} episodes (median) | min–max | "
        "steps (median) | wall s (median) | fps (median) |",
        "|---|---|---|---|---|---|---|",
    ]
    for algo, s in data["algorithms"].items():
        seeds = f"{s['seeds']}/{planned_seeds}"
        if s["unfinished"]:
            seeds += f" (partial: {s['unfinished']} unfinished)"
        walls = [r["wall_seconds"] for r in s["runs"]]
        lines.append(
            f"| {algo} | {seeds} | {fmt(s['final_median'], ',.0f')} | "
            f"{fmt(s['final_min'], ',.0f')}–{fmt(s['final_max'], ',.0f')} | "
            f"{fmt(s['frames_median'], ',.0f')} | "
            f"{fmt(median(walls), ',.0f')} | {fmt(s['fps_median'], ',.0f')} |"
        )
    for row, value in data["published"].items():
        source = "¹" if row.startswith("SB3") else "²"
        lines.append(f"| {row} (published{source}) | — | {value} | — | 1,000,000 | — | — |")
    lines.append("")
    return lines


def markdown(
    summary: dict[str, Any], args: argparse.Namespace, estimates: dict[str, Any] | None = None
) -> str:
    """The whole ``mujoco.md`` (``estimates``: :func:`_intervals.estimates`, or none)."""
    lines = [
        "# MuJoCo: continuous ACER, PPO and A2C vs Stable-Baselines3 PPO and A2C",
        "",
        f"Command: `python benchmarks/mujoco_grid.py --tasks {' '.join(args.tasks)} --algos "
        f"{' '.join(args.algos)} --seeds {' '.join(map(str, args.seeds))} --frames "
        f"{args.frames}` (`make bench-mujoco` runs its seeds 1–3; settings and sources: the "
        "script's docstring). "
        f"Every run {args.frames:,} environment steps, {args.jobs} runs at a time on this "
        "machine (2 cores); ours through `ac-train`, SB3 PPO with the zoo's tuned settings, SB3 "
        "A2C with its defaults (the zoo's for these tasks).",
        "",
        runs_present_line(summary),
        "",
        f"Return: the training return, mean of the last {WINDOW} finished episodes at the end of "
        "each run; median and min–max over seeds. Wall seconds and fps: the whole run, start-up "
        "included.",
        "",
        f"¹ {PUBLISHED_SOURCES['zoo']}. ² {PUBLISHED_SOURCES['cleanrl']}. Published rows are "
        "other measurements (versions, metrics, seeds differ); the rows above them were run "
        "here, side by side.",
        "",
    ]
    for task, data in summary["games"].items():
        lines += task_table(task, data, len(args.seeds))
    if estimates is not None:
        lines += intervals.markdown(estimates, label="task", spec=",.0f")
        if estimates["aggregate"]:
            lines += ["![MuJoCo interval estimates](mujoco_intervals.png)", ""]
    lines.append("![MuJoCo learning curves](mujoco.png)")
    return "\n".join(lines) + "\n"


def plot(summary: dict[str, Any], out: Path) -> Path | None:
    """One panel per task: median curve per algorithm, seed range as a band."""
    return plot_curves(
        summary,
        out,
        title=lambda task: f"{task}-v5",
        xlabel="environment steps",
        algos=ALGOS,
        sb3_algos=SB3_ALGOS,
        caption="median over seeds; band: min–max; dashed: SB3 PPO",
    )


def write_results(summary: dict[str, Any], args: argparse.Namespace) -> Path:
    """``mujoco.md``, ``mujoco.json``, ``mujoco.png`` and ``mujoco_intervals.png``."""
    return write_grid_results(
        summary,
        args,
        name="mujoco",
        envs="tasks",
        ours=OURS,
        peers=SB3_ALGOS,
        markdown=markdown,
        plot=plot,
        extra={"published_sources": PUBLISHED_SOURCES},
        title="MuJoCo, 1M steps",
    )


# ---------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    """The options of the benchmark."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--algos", nargs="+", default=list(DEFAULT_ALGOS), choices=ALGOS)
    add_grid_arguments(
        parser, unit="environment steps", frames_per_timeout_second=50, results=RESULTS
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the grid (unless ``--summary-only``) and write the summary; return the exit status."""
    args = prepare(build_parser().parse_args(argv))
    failures = 0
    if not args.summary_only:
        sb3 = {"stable_baselines3"} if set(args.algos) & set(SB3_ALGOS) else set()
        require({"mujoco"} | sb3, "bench,mujoco")
        failures = run_grid(plan(args.tasks, args.algos, args.seeds), args)
        widen_to_grid(args, "tasks", TASKS, DEFAULT_ALGOS, ALGOS)
    summary = summarize(args.results, args.tasks, args.algos, args.seeds)
    return report(summary, write_results(summary, args), failures)


def child(argv: list[str]) -> int:
    """``--child ALGO TASK SEED FRAMES OUT``: train one SB3 baseline."""
    algo, task, seed, frames, out = argv
    summary = train_sb3(algo, task, int(seed), int(frames), Path(out))
    if summary is None:
        return 128 + signal.SIGTERM  # stopped, its checkpoint saved
    print(
        f"{algo} on {task}-v5: {summary['frames']:,} steps in {summary['wall_seconds']:.1f} s, "
        f"final mean return {summary['final_mean_return']}"
    )
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.exit(child(sys.argv[2:]))
    sys.exit(main())
