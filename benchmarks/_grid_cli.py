"""The command line every benchmark grid shares: its options, their checks, the final report.

A grid script adds its own environment and algorithm options, then
:func:`add_grid_arguments`; :func:`prepare` checks the parsed options, :func:`require` stops
early with the install line when an optional package is missing, :func:`widen_to_grid` makes a
run of part of the grid summarise the whole default grid, and :func:`report` prints what was
written. :func:`parse_settings` reads ``KEY=VALUE`` config overrides (also used by the
single-run benchmarks).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import time
from pathlib import Path
from typing import Any

DEFAULT_SEEDS = (1, 2, 3)


def parse_settings(items, what: str = "--set") -> dict:
    """``["batch_size=8", "lr=1e-3"]`` → ``{"batch_size": 8, "lr": 0.001}`` (Python literals).

    ``what`` names the option or spec in the error for an item without ``=``.
    """
    settings = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"{what}: {item!r} is not key=value")
        settings[key.strip()] = ast.literal_eval(value.strip())
    return settings


def widen_to_grid(args: argparse.Namespace, field: str, names, default_algos, algos) -> None:
    """Widen the selection of ``args`` to the whole default grid plus the selection.

    A run of part of a grid (``--games Breakout --seeds 2``) still writes the summary of the
    whole grid, so the committed table keeps the rows of every other run (``--summary-only``
    alone takes its selection literally, to tabulate a part).

    Args:
        args: the parsed options; ``args.<field>``, ``args.algos`` and ``args.seeds`` change.
        field: the option naming the environments (``"games"``, ``"tasks"``).
        names: every environment of the grid, in the summary's order.
        default_algos: the algorithms of the default grid.
        algos: every algorithm the grid knows, in the summary's order.
    """
    setattr(args, field, list(names))
    args.algos = [a for a in algos if a in args.algos or a in default_algos]
    args.seeds = sorted({*args.seeds, *DEFAULT_SEEDS})


def add_grid_arguments(
    parser: argparse.ArgumentParser, *, unit: str, frames_per_timeout_second: int, results: Path
) -> None:
    """The options every grid has (this one's and ``mujoco_grid.py``'s), after its own.

    Args:
        parser: the grid's parser, its game/task and algorithm options already added.
        unit: what ``--frames`` counts ("frames", "environment steps").
        frames_per_timeout_second: the default ``--timeout`` allows one second per this many
            frames, plus 10 minutes (:func:`prepare`).
        results: the default output root.
    """
    parser.add_argument("--seeds", nargs="+", type=int, default=list(DEFAULT_SEEDS))
    parser.add_argument("--frames", type=int, default=1_000_000, help=f"{unit} per run")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"seconds per run before it is stopped (default: 1 s per "
        f"{frames_per_timeout_second} {unit} + 10 min); a stopped run resumes from its "
        "checkpoint on the next invocation",
    )
    parser.set_defaults(frames_per_timeout_second=frames_per_timeout_second, unit=unit)
    parser.add_argument(
        "--results", type=Path, default=results, help="output root (tables, plot, runs)"
    )
    parser.add_argument(
        "--summary-only",
        action="store_true",
        help="only rewrite the summary from the runs, of the selection given (a run of "
        "part of the grid summarises the whole default grid plus its selection)",
    )
    parser.add_argument(
        "--deadline-minutes",
        type=float,
        default=None,
        help="finish within this many minutes: a run whose estimated time (from the complete "
        "runs of its algorithm) does not fit is not started, and a run still going then is "
        "stopped with its checkpoint (for machines lent for a fixed time)",
    )
    parser.add_argument(
        "--progress-minutes",
        type=float,
        default=10.0,
        help="print each running run's frames, fps, return and time left this often (0: never)",
    )
    parser.add_argument(
        "--keep-checkpoints",
        action="store_true",
        help="keep finished runs' checkpoints (default: deleted; they can hold replays)",
    )


def prepare(args: argparse.Namespace) -> argparse.Namespace:
    """Check ``args`` of :func:`add_grid_arguments` and fill in the default timeout."""
    if args.jobs < 1:
        raise SystemExit("--jobs must be >= 1")
    if args.timeout is None:
        args.timeout = args.frames / args.frames_per_timeout_second + 600
    deadline_minutes = getattr(args, "deadline_minutes", None)
    if deadline_minutes is not None and deadline_minutes <= 0:
        raise SystemExit(f"--deadline-minutes must be > 0, got {deadline_minutes}")
    args.deadline = None if deadline_minutes is None else time.monotonic() + 60 * deadline_minutes
    args.results = Path(args.results).resolve()
    return args


def require(modules: set[str], extra: str) -> None:
    """Stop with the install line when one of ``modules`` cannot be imported."""
    missing = sorted(m for m in modules if importlib.util.find_spec(m) is None)
    if missing:
        raise SystemExit(f"missing packages: {', '.join(missing)} (pip install -e '.[{extra}]')")


def runs_present_line(summary: dict[str, Any]) -> str:
    """The bold line a grid page opens its results with: runs present, complete, partial or not."""
    partial = summary["present"] < summary["planned"] or summary["complete"] < summary["present"]
    return (
        f"**Runs present: {summary['present']} of the command's {summary['planned']} "
        f"({summary['complete']} complete)" + (": partial results.**" if partial else ".**")
    )


def report(summary: dict[str, Any], md: Path, failures: int) -> int:
    """Print what a grid wrote (``md`` and its ``.json`` and ``.png``); the exit status."""
    print(
        f"{summary['present']} of the command's {summary['planned']} runs present "
        f"({summary['complete']} complete); wrote {md}, {md.with_suffix('.json').name}, "
        f"{md.with_suffix('.png').name}"
        + (f"; {failures} run(s) failed (see their output.log)" if failures else "")
    )
    return 1 if failures else 0
