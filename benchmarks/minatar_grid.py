"""MinAtar: our four recipes beside Stable-Baselines3 PPO / DQN and sb3-contrib QR-DQN (resumable).

Grid: games Asterix, Breakout, Freeway, Seaquest, SpaceInvaders (``MinAtar/<Game>-v1``: minimal
action set, sticky actions 0.1, difficulty ramping; Young & Tian, 2019, arXiv:1903.03176) ×
algorithms × seeds, every run to the same frame budget (default 1,000,000; a frame is one env
step, MinAtar has no frame skip).

    make bench-minatar                                  # the full grid: 5 × 9 × 3 = 135 runs
    python benchmarks/minatar_grid.py --games Breakout --algos ppo sb3_dqn --seeds 1 --frames 50000
    python benchmarks/minatar_grid.py --summary-only         # rewrite the tables/plot from the runs

Ours (``a2c``, ``ppo``, ``acer``, ``reactor``) run through the CLI exactly as users run it,
each in its own process: ``ac-train <algo> --env MinAtar/<Game>-v1 --frames N --seed S
--return-window 100 --out <rundir>`` (every other field: the recipe's MinAtar defaults,
``Config.for_env``; the network is :class:`~ac_extensions.modules.MinAtarCNN`).

The Stable-Baselines3 and sb3-contrib baselines (``sb3_ppo``, ``sb3_ppo_const``, ``sb3_a2c``,
``sb3_dqn``, ``sb3_qrdqn``, ``sb3_dqn_paper``) run in a child
process of this script (``--child``) with the MinAtar torso and the settings (and their
sources) that ``_minatar_sb3.py`` describes.

Layout: each run lives in ``<results>/minatar/runs/<Game>/<algo>/seed<N>/`` with a
``summary.json`` (``frames``, ``wall_seconds``, ``fps``, ``final_mean_return`` = mean of the
last 100 finished episodes, ``complete``) and ``logs/<algo>/scalars/train/return_window.csv``
(``frames,value`` of the 100-episode moving mean; also ``train/return_window_size.csv`` and
``time/seconds.csv``): what ``ac-train`` writes, and what the SB3 runs' child writes, so one
reader handles both. ``output.log`` keeps the run's stdout/stderr.

Resumable: a run whose ``summary.json`` says ``complete: true`` (at a budget of at least
``--frames``) is skipped; an unfinished run of ours continues with ``ac-train --resume`` from
its newest checkpoint, an unfinished SB3 run from its own (:class:`SB3Checkpoint`: SB3's model
file, replay buffer and counters, saved every 5 minutes and when the run is stopped); a run
with no checkpoint starts again. A resumed run starts new episodes where the stopped one had
episodes in progress. Finished runs' ``checkpoints/`` are deleted (ACER's, Reactor's and the
SB3 DQNs' hold the replay, hundreds of MB each) unless ``--keep-checkpoints``. ``--jobs``
runs (default 2) go at once, started seed by seed (every game's seed 1 before any seed 2:
:func:`run_order`), each a subprocess with a time limit (``--timeout``; a run that
hits it resumes on the next invocation); one line is printed per finished run, one per run in
flight every 10 minutes (``--progress-minutes``: frames, fps, return and the time left at its
fps so far), and a failure does not stop the rest. On a machine lent for a fixed time,
``--deadline-minutes M`` starts a run only when the complete runs of its algorithm say it
will finish in time (or when there is nothing to estimate from), and stops what still runs in
time to save its checkpoint before M (:func:`_within_deadline`).

Cost: under an hour per run at 1M frames (Reactor, ACER and QR-DQN the slowest, about half an
hour), as one of two jobs on this 2-core machine (measured speeds: the notes of
``results/minatar.md``), ≈33 job-hours for seeds 1–3 of the grid, so it is meant to be resumed
across invocations. A checkpoint holds
the replay and is not committed: a run stopped on one machine starts again on another.

Summary (also ``--summary-only``), read from each run's own ``summary.json`` and CSVs, of the
whole default grid plus the runs selected (a run of part of the grid keeps every other run's
rows; ``--summary-only`` alone tabulates just the selection given):
``<results>/minatar.md`` and ``.json``: per game and algorithm the final mean return (median and
min–max over seeds), frames and wall seconds until the 100-episode mean first reaches the best
SB3 baseline's final score (the highest median final return among them; median over seeds, a
seed that never gets there counting as never, "—" when the median never does), fps (median);
the MinAtar paper's DQN and AC(λ) values beside them (5M frames, full action set: see
``PUBLISHED``), and how many of the command's runs are present. ``<results>/minatar.png``: one panel
per game, the median curve of every algorithm with the seed range as a band.
"""

from __future__ import annotations

import argparse
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the harness beside this script
import _intervals as intervals
import _scheduler as scheduler
from _grid_cli import (  # noqa: F401 (re-exported: the grid scripts read them here)
    DEFAULT_SEEDS,
    add_grid_arguments,
    prepare,
    report,
    require,
    runs_present_line,
    widen_to_grid,
)
from _minatar_sb3 import sb3_settings, train_sb3  # noqa: F401 (re-exported)
from _sb3 import (  # noqa: F401 (re-exported: the grid scripts read them here)
    CHECKPOINT_MINUTES,
    CURVE,
    CURVE_SIZE,
    LOG_EVERY,
    SECONDS,
    WINDOW,
    SB3Checkpoint,
    SB3Log,
    SB3Stopped,
    jsonable,
    learn_sb3,
)
from _scheduler import (  # noqa: F401 (re-exported: the grid scripts read them here)
    DEADLINE_SKIPPED,
    DEADLINE_STOPPED,
    FINISHED_ELSEWHERE,
    SKIPPED,
    STOPPED,
    ac_train,
    claimed,
    complete_at,
    describe,
    estimate_seconds,
    failed,
    has_checkpoint,
    progress_line,
    prune_checkpoints,
    read_summary,
    run_claimed,
    run_process,
)
from _summary import (  # noqa: F401 (re-exported: the grid scripts read them here)
    algo_stats,
    band,
    fmt,
    median,
    plot_curves,
    read_run,
    read_scalar,
    strip_curves,
    time_to,
    write_grid_results,
)

# Not named minatar.py: a file of that name in this folder (sys.path[0] of every script here)
# would shadow the minatar package for all of them.
HERE = Path(__file__).resolve().parent

RESULTS = HERE / "results"
GAMES = ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders")
OURS = ("a2c", "ppo", "acer", "reactor")
GRID_SB3_ALGOS = ("sb3_ppo", "sb3_ppo_const", "sb3_a2c", "sb3_dqn", "sb3_qrdqn")
"""The Stable-Baselines3 / sb3-contrib algorithms of the default grid (``make bench-minatar``)."""
SB3_ALGOS = (*GRID_SB3_ALGOS, "sb3_dqn_paper")
"""Every SB3 algorithm ``--algos`` accepts (``sb3_dqn_paper``: run by name only)."""
GRID = OURS + GRID_SB3_ALGOS
ALGOS = OURS + SB3_ALGOS

PUBLISHED_SOURCE = (
    "Young & Tian 2019 (arXiv:1903.03176; figure `img/learning_curves.gif` of kenjyoung/MinAtar, "
    "30 seeds per curve, online training return over 100 episodes): ≈, read from the plot in "
    "the MinAtar repository, 5M frames, full action set"
)
PUBLISHED_FRAMES = 5_000_000
PUBLISHED_SEEDS = 30
PUBLISHED: dict[str, dict[str, str]] = {
    # game: {curve: value read by eye (±10%) from the MinAtar paper's learning curves}
    "Asterix": {"DQN": "≈17", "AC(λ=0.8)": "≈19", "AC(λ=0)": "≈20"},
    "Breakout": {"DQN": "≈10", "AC(λ=0.8)": "≈17.5", "AC(λ=0)": "≈15"},
    "Freeway": {"DQN": "≈50", "AC(λ=0.8)": "≈47", "AC(λ=0)": "≈47"},
    "Seaquest": {"DQN": "≈20", "AC(λ=0.8)": "≈15–16", "AC(λ=0)": "≈7"},
    "SpaceInvaders": {"DQN": "≈43", "AC(λ=0.8)": "≈185", "AC(λ=0)": "≈145"},
}
PUBLISHED_NOTES = {
    "Seaquest": "the paper's Seaquest ran before the v1.0.11 oxygen fix: its values do not "
    "transfer to MinAtar 1.0.11 and later",
}


# ---------------------------------------------------------------------------------------------
# The grid and its runs


@dataclass(frozen=True)
class Run:
    """One (game, algorithm, seed) cell of the grid."""

    game: str
    algo: str
    seed: int

    @property
    def env_id(self) -> str:
        """The gymnasium id."""
        return f"MinAtar/{self.game}-v1"

    def directory(self, results: Path) -> Path:
        """Where the run lives."""
        return runs_root(results) / self.game / self.algo / f"seed{self.seed}"

    def __str__(self) -> str:
        return f"{self.game} {self.algo} seed {self.seed}"


def runs_root(results: Path) -> Path:
    """The folder of every run."""
    return Path(results) / "minatar" / "runs"


def plan(games, algos, seeds) -> list[Run]:
    """The runs of the grid, game by game (the summary's order)."""
    return [Run(g, a, s) for g in games for a in algos for s in seeds]


def run_order(games, algos, seeds) -> list[Run]:
    """The runs of the grid in the order they start: seed by seed, then game by game.

    A grid stopped part-way (runs of hours, sessions of a few) then holds the lower seeds of
    every game and algorithm rather than every seed of the first games.
    """
    return [Run(g, a, s) for s in seeds for g in games for a in algos]


def action(run: Run, results: Path, frames: int) -> str:
    """``"done"`` (complete at this budget), ``"resume"`` (a checkpoint) or ``"fresh"``.

    Ours resume with ``ac-train --resume``, the SB3 runs from their :class:`SB3Checkpoint`.
    """
    directory = run.directory(results)
    if complete_at(read_summary(directory), frames):
        return "done"
    if has_checkpoint(directory):
        return "resume"
    return "fresh"


def command(run: Run, results: Path, frames: int, how: str) -> list[str]:
    """The command line of one run (``how``: ``"fresh"`` or ``"resume"``)."""
    directory = run.directory(results)
    if run.algo in SB3_ALGOS:  # the child continues from a checkpoint of its own when there is one
        script = str(Path(__file__).resolve())
        child = ["--child", run.algo, run.game, str(run.seed), str(frames), str(directory)]
        return [sys.executable, script, *child]
    every = ["--checkpoint-minutes", f"{CHECKPOINT_MINUTES:g}"]
    if how == "resume":
        return [*ac_train(), run.algo, "--resume", str(directory), "--frames", str(frames), *every]
    return [
        *ac_train(),
        run.algo,
        "--env",
        run.env_id,
        "--frames",
        str(frames),
        "--seed",
        str(run.seed),
        "--return-window",
        str(WINDOW),
        "--out",
        str(directory),
        *every,
    ]


def execute(
    run: Run, results: Path, frames: int, how: str, timeout: float, action_of=None, command_of=None
) -> dict:
    """Run one cell (:func:`_scheduler.execute`).

    ``action_of`` and ``command_of`` default to this grid's :func:`action` and :func:`command`;
    another grid (``mujoco_grid.py``) passes its own.
    """
    return scheduler.execute(
        run, results, frames, how, timeout, action_of or action, command_of or command
    )


def run_grid(runs: list, args: argparse.Namespace, action_of=None, execute_run=None) -> int:
    """Run the cells not done (:func:`_scheduler.run_grid`); the number of failures."""
    return scheduler.run_grid(runs, args, action_of or action, execute_run or execute)


# ---------------------------------------------------------------------------------------------
# Stable-Baselines3 runs (the --child process)


# ---------------------------------------------------------------------------------------------
# Summary


OFF_POLICY = ("acer", "reactor")
"""Ours that replay: the algorithms timed to our PPO's final score."""


def against_ppo(runs: dict[str, list[dict]]) -> dict[str, Any] | None:
    """Our off-policy learners against our PPO's final score and wall clock, on one game.

    The target is the median final return of our complete PPO runs; each off-policy run's
    seconds to reach it (:func:`time_to`, its own clock) against the median wall seconds of
    those PPO runs. ``None`` without a complete PPO run.
    """
    finished = [r for r in runs.get("ppo", []) if r["complete"]]
    target = median(r["final_mean_return"] for r in finished)
    seconds = median(r["wall_seconds"] for r in finished)
    if target is None or seconds is None:
        return None
    out: dict[str, Any] = {"return": target, "seconds": seconds, "algorithms": {}}
    for algo in OFF_POLICY:
        if runs.get(algo):
            stats = algo_stats(runs[algo], target)
            keep = ("seeds", "unfinished", "target_reached", "frames_to_target")
            out["algorithms"][algo] = {k: stats[k] for k in keep} | {
                "seconds_to_target": stats["seconds_to_target"],
                "vs_ppo": None
                if stats["seconds_to_target"] is None
                else stats["seconds_to_target"] / seconds,
            }
    return out


def summarize(results: Path, games, algos, seeds, complete_only: bool = False) -> dict[str, Any]:
    """Everything the tables and the plot show, from the run directories of the grid.

    ``complete_only``: leave out the runs still under way (``--complete-only``), so that the
    tables are those of the finished runs alone: what a commit of the finished runs reproduces.
    """
    planned = plan(games, algos, seeds)
    per_game: dict[str, Any] = {}
    present = complete = 0
    for game in games:
        runs: dict[str, list[dict]] = {}
        for algo in algos:
            found = [read_run(Run(game, algo, s).directory(results)) for s in seeds]
            runs[algo] = [
                r for r in found if r is not None and (r["complete"] or not complete_only)
            ]
            present += len(runs[algo])
            complete += sum(r["complete"] for r in runs[algo])
        sb3_medians = {
            a: median(r["final_mean_return"] for r in runs[a]) for a in SB3_ALGOS if a in runs
        }
        sb3_medians = {a: m for a, m in sb3_medians.items() if m is not None}
        best = max(sb3_medians, key=sb3_medians.get) if sb3_medians else None
        target = sb3_medians[best] if best else None
        per_game[game] = {
            "target": {"algorithm": best, "return": target},
            "algorithms": {
                a: algo_stats(runs[a], target) | {"runs": runs[a]} for a in algos if runs[a]
            },
            "published": PUBLISHED.get(game, {}),
            "against_ppo": against_ppo(runs),
        }
    return {
        "planned": len(planned),
        "present": present,
        "complete": complete,
        "games": per_game,
    }


def game_table(game: str, data: dict[str, Any], planned_seeds: int) -> list[str]:
    """The markdown lines of one game."""
    target = data["target"]
    if target["return"] is None:
        head = "to the best Stable-Baselines3 score"
        lines = [f"## {game}", "", "No Stable-Baselines3 run yet: no target score.", ""]
    else:
        head = f"to {target['return']:.2f}"
        lines = [
            f"## {game}",
            "",
            f"Target: {target['return']:.2f}, the final score of the best Stable-Baselines3 run "
            f"({target['algorithm']}, median over its seeds).",
            "",
        ]
    lines += [
        f"| algorithm | seeds | return, last {WINDOW} episodes (median) | min–max | frames "
        f"(median) | frames {head} (median) | s {head} (median) | fps (median) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for algo, s in data["algorithms"].items():
        seeds = f"{s['seeds']}/{planned_seeds}"
        if s["unfinished"]:
            seeds += f" (partial: {s['unfinished']} unfinished)"
        reached = "" if s["target_reached"] is None else f" ({s['target_reached']} reached)"
        lines.append(
            f"| {algo} | {seeds} | {fmt(s['final_median'], '.2f')} | "
            f"{fmt(s['final_min'], '.2f')}–{fmt(s['final_max'], '.2f')} | "
            f"{fmt(s['frames_median'], ',.0f')} | "
            f"{fmt(s['frames_to_target'], ',.0f')}{reached} | "
            f"{fmt(s['seconds_to_target'], ',.0f')} | {fmt(s['fps_median'], ',.0f')} |"
        )
    for curve, value in data["published"].items():
        lines.append(
            f"| {curve}, MinAtar paper¹ | {PUBLISHED_SEEDS} | {value} | — | "
            f"{PUBLISHED_FRAMES:,} | — | — | — |"
        )
    lines.append("")
    if game in PUBLISHED_NOTES:
        lines += [f"Published {game}: {PUBLISHED_NOTES[game]}.", ""]
    return lines


def against_ppo_table(summary: dict[str, Any]) -> list[str]:
    """The markdown lines of :func:`against_ppo` over the games (none without PPO runs)."""
    rows = []
    for game, data in summary["games"].items():
        versus = data.get("against_ppo")
        if not versus:
            continue
        for algo, s in versus["algorithms"].items():
            reached = f" ({s['target_reached']} of {s['seeds']} reached)"
            if s["unfinished"]:
                reached += f", {s['unfinished']} unfinished"
            ratio = "—" if s["vs_ppo"] is None else f"{s['vs_ppo']:.2f}×"
            rows.append(
                f"| {game} | {versus['return']:.2f} | {versus['seconds']:,.0f} | {algo} | "
                f"{fmt(s['frames_to_target'], ',.0f')}{reached} | "
                f"{fmt(s['seconds_to_target'], ',.0f')} | {ratio} |"
            )
    if not rows:
        return []
    return [
        "## Off-policy learners against our PPO's wall clock",
        "",
        "How long ACER and Reactor take to reach our PPO's final score, against the time PPO "
        "takes for its run. Target: the median final return of our complete "
        "PPO runs; PPO s: the median wall seconds of those runs; s to the target: each run's "
        "own clock at the first logged point where the full "
        f"{WINDOW}-episode mean reaches it (median over seeds, a seed that never does counting "
        "as never); vs PPO: that over PPO s. The runs were not made side by side (see the "
        "notes for their loads), so these ratios are rough.",
        "",
        "| game | PPO final (median) | PPO s (median) | algorithm | frames to PPO's final "
        "(median) | s to PPO's final (median) | vs PPO |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def markdown(
    summary: dict[str, Any], args: argparse.Namespace, estimates: dict[str, Any] | None = None
) -> str:
    """The whole ``minatar.md`` (``estimates``: :func:`_intervals.estimates`, or none)."""
    seeds = " ".join(map(str, args.seeds))
    only = " --complete-only" if args.complete_only else ""
    sb3 = ", ".join(a for a in args.algos if a in SB3_ALGOS)
    lines = [
        "# MinAtar: ac_extensions recipes vs Stable-Baselines3 and sb3-contrib",
        "",
        f"Command: `python benchmarks/minatar_grid.py --games {' '.join(args.games)} --algos "
        f"{' '.join(args.algos)} --seeds {seeds} --frames {args.frames}{only}` "
        "(`make bench-minatar` runs its seeds 1–3; "
        f"settings and their sources: the docstring of `benchmarks/minatar_grid.py`). Envs "
        f"`MinAtar/<Game>-v1` (minimal action set, sticky actions 0.1); every run "
        f"{args.frames:,} frames, ours through `ac-train`, Stable-Baselines3 and sb3-contrib "
        f"({sb3}) with the same MinAtar CNN torso; {args.jobs} runs at a time on this machine.",
        "",
        "Their settings: sb3_dqn with the MinAtar paper's DQN settings (its `examples/dqn.py`, "
        "centred RMSProp lr 2.5e-4 included) but one update per 4 frames (Nature DQN's rate; "
        "sb3_dqn_paper keeps the paper's one per frame); sb3_qrdqn with the same settings, "
        "51 quantiles and Adam (lr 2.5e-4, ε 0.01/32); "
        "sb3_ppo and sb3_a2c with rl-baselines3-zoo's Atari PPO and A2C settings; sb3_ppo_const "
        "with sb3_ppo's settings at a constant lr and clip and SB3's default 2×64 MLP heads.",
        "",
        runs_present_line(summary),
        "",
        f"Return: the online training return, mean of the last {WINDOW} finished episodes at "
        "the end of each run (the MinAtar paper's metric); median and min–max over seeds. "
        "Frames / s to the target: first logged point at which the full "
        f"{WINDOW}-episode mean reaches the best Stable-Baselines3 final score; median over "
        "seeds, a seed that never reaches it counting as never (— when the median never does). "
        "s and fps are wall time of the whole run, start-up included.",
        "",
        f"¹ {PUBLISHED_SOURCE}. Not comparable with the rows above: 5× the frames here, the "
        "full action set of 6 (here the minimal one).",
        "",
    ]
    for game, data in summary["games"].items():
        lines += game_table(game, data, len(args.seeds))
    if estimates is not None:
        lines += intervals.markdown(estimates)
        if estimates["aggregate"]:
            lines += ["![MinAtar interval estimates](minatar_intervals.png)", ""]
    lines += against_ppo_table(summary)
    lines.append("![MinAtar learning curves](minatar.png)")
    return "\n".join(lines) + "\n"


def plot(summary: dict[str, Any], out: Path) -> Path | None:
    """One panel per game: median curve per algorithm, seed range as a band."""
    return plot_curves(
        summary,
        out,
        title=lambda game: f"MinAtar/{game}-v1",
        xlabel="frames",
        algos=ALGOS,
        sb3_algos=SB3_ALGOS,
        caption="median over seeds; band: min–max; dashed: Stable-Baselines3, sb3-contrib",
    )


def write_results(summary: dict[str, Any], args: argparse.Namespace) -> Path:
    """``minatar.md``, ``minatar.json``, ``minatar.png`` and ``minatar_intervals.png``."""
    return write_grid_results(
        summary,
        args,
        name="minatar",
        envs="games",
        ours=OURS,
        peers=SB3_ALGOS,
        markdown=markdown,
        plot=plot,
        extra={"published_source": PUBLISHED_SOURCE},
        title="MinAtar, 1M frames",
    )


# ---------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    """The options of the benchmark."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--games", nargs="+", default=list(GAMES), choices=GAMES)
    parser.add_argument("--algos", nargs="+", default=list(GRID), choices=ALGOS)
    parser.add_argument(
        "--complete-only",
        action="store_true",
        help="summarise the complete runs only (leave out runs under way or stopped)",
    )
    add_grid_arguments(parser, unit="frames", frames_per_timeout_second=10, results=RESULTS)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the grid (unless ``--summary-only``) and write the summary; return the exit status."""
    args = prepare(build_parser().parse_args(argv))
    failures = 0
    if not args.summary_only:
        needed = {"minatar"}
        if set(args.algos) & set(SB3_ALGOS):
            needed.add("stable_baselines3")
        if "sb3_qrdqn" in args.algos:
            needed.add("sb3_contrib")
        require(needed, "bench,minatar")
        failures = run_grid(run_order(args.games, args.algos, args.seeds), args)
        widen_to_grid(args, "games", GAMES, GRID, ALGOS)
    summary = summarize(args.results, args.games, args.algos, args.seeds, args.complete_only)
    return report(summary, write_results(summary, args), failures)


def child(argv: list[str]) -> int:
    """``--child ALGO GAME SEED FRAMES OUT``: train one SB3 baseline."""
    algo, game, seed, frames, out = argv
    summary = train_sb3(algo, game, int(seed), int(frames), Path(out))
    if summary is None:
        return 128 + signal.SIGTERM  # stopped, its checkpoint saved
    print(
        f"{algo} on MinAtar/{game}-v1: {summary['frames']:,} frames in "
        f"{summary['wall_seconds']:.1f} s, final mean return {summary['final_mean_return']}"
    )
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.exit(child(sys.argv[2:]))
    sys.exit(main())
