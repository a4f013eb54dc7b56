"""Reading the grids' runs back: curves, per-algorithm statistics over seeds, table helpers.

Every run directory holds ``summary.json`` and the ``train/return_window``,
``train/return_window_size`` and ``time/seconds`` CSV logs (``ac-train``'s layout, which the
Stable-Baselines3 runs' :class:`~_sb3.SB3Log` writes too), so one reader serves ours and theirs.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import _intervals as intervals
from _results import write_markdown
from _sb3 import CURVE, CURVE_SIZE, SECONDS, WINDOW
from _scheduler import read_summary


def read_scalar(directory: Path, name: str) -> dict[float, float]:
    """``frames → value`` of one logged scalar (the last value kept for a repeated frame)."""
    files = sorted((directory / "logs").glob(f"*/scalars/{name}.csv"))
    points: dict[float, float] = {}
    if files:
        for line in files[0].read_text().splitlines():
            if line.strip():
                step, value = line.split(",")[:2]
                points[float(step)] = float(value)
    return points


def read_run(directory: Path) -> dict | None:
    """One run's summary and curve (None if it has no ``summary.json``)."""
    summary = read_summary(directory)
    if summary is None:
        return None
    curve = read_scalar(directory, CURVE)
    sizes = read_scalar(directory, CURVE_SIZE)
    seconds = read_scalar(directory, SECONDS)
    frames = sorted(curve)
    return {
        "seed": summary.get("seed"),
        "complete": bool(summary.get("complete")),
        "frames": summary.get("frames", 0),
        "frames_target": summary.get("frames_target"),
        "wall_seconds": summary.get("wall_seconds"),
        "fps": summary.get("fps"),
        "final_mean_return": summary.get("final_mean_return"),
        "curve": {
            "frames": frames,
            "values": [curve[f] for f in frames],
            "sizes": [sizes.get(f, WINDOW) for f in frames],
            "seconds": [seconds.get(f) for f in frames],
        },
    }


def time_to(run: dict, target: float) -> tuple[float, float | None] | None:
    """(frames, seconds) of the first point where the full 100-episode mean reaches ``target``."""
    c = run["curve"]
    for frames, value, size, seconds in zip(
        c["frames"], c["values"], c["sizes"], c["seconds"], strict=True
    ):
        if size >= WINDOW and value >= target:
            return frames, seconds
    return None


def median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def algo_stats(runs: list[dict], target: float | None) -> dict[str, Any]:
    """Medians over one algorithm's seeds on one game."""
    finals = [r["final_mean_return"] for r in runs if r["final_mean_return"] is not None]
    stats: dict[str, Any] = {
        "seeds": len(runs),
        "unfinished": sum(not r["complete"] for r in runs),
        "final_median": median(finals),
        "final_min": min(finals) if finals else None,
        "final_max": max(finals) if finals else None,
        "frames_median": median(r["frames"] for r in runs),
        "fps_median": median(r["fps"] for r in runs),
        "target_reached": None,
        "frames_to_target": None,
        "seconds_to_target": None,
    }
    if target is not None and runs:
        hits = [time_to(r, target) for r in runs]
        stats["target_reached"] = sum(h is not None for h in hits)
        frames = statistics.median(math.inf if h is None else h[0] for h in hits)
        seconds = statistics.median(math.inf if h is None or h[1] is None else h[1] for h in hits)
        stats["frames_to_target"] = frames if math.isfinite(frames) else None
        stats["seconds_to_target"] = seconds if math.isfinite(seconds) else None
    return stats


def fmt(value, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def band(runs: list[dict]):
    """Median, min and max over runs on a common frame grid (to the shortest run's end)."""
    import numpy as np

    curves = [
        (np.asarray(r["curve"]["frames"]), np.asarray(r["curve"]["values"]))
        for r in runs
        if r["curve"]["frames"]
    ]
    if not curves:
        return None
    end = min(x[-1] for x, _ in curves)
    grid = np.unique(np.concatenate([x[x <= end] for x, _ in curves]))
    values = np.stack([np.interp(grid, x, y) for x, y in curves])
    return grid, np.median(values, 0), values.min(0), values.max(0)


def strip_curves(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary for the JSON file: per-run values without the curves."""
    games = {}
    for game, data in summary["games"].items():
        algos = {}
        for algo, stats in data["algorithms"].items():
            runs = [{k: v for k, v in r.items() if k != "curve"} for r in stats["runs"]]
            algos[algo] = stats | {"runs": runs}
        games[game] = data | {"algorithms": algos}
    return summary | {"games": games}


def plot_curves(
    summary: dict[str, Any],
    out: Path,
    *,
    title: Callable[[str], str],
    xlabel: str,
    algos: Sequence[str],
    sb3_algos: Sequence[str],
    caption: str,
    ylabel: str = f"mean return, last {WINDOW} episodes",
) -> Path | None:
    """One panel per environment: each algorithm's median curve, its seeds' range as a band.

    Args:
        summary: a grid's summary (``summary["games"][env]["algorithms"][algo]["runs"]``).
        out: the PNG to write.
        title: an environment's panel title, from its name.
        xlabel: what the x axis counts.
        algos: every algorithm of the grid, in order (their colours).
        sb3_algos: the Stable-Baselines3 / sb3-contrib ones among them (dashed).
        caption: the figure's title.
        ylabel: the y axis's label.

    Returns:
        ``out``, or None when the summary has no environment.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(summary["games"])
    if not envs:
        return None
    columns = min(3, len(envs))
    rows = math.ceil(len(envs) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.6 * rows), squeeze=False)
    colors = {a: f"C{i}" for i, a in enumerate(algos)}
    for ax, env in zip(axes.flat, envs, strict=False):
        for algo, stats in summary["games"][env]["algorithms"].items():
            curves = band(stats["runs"])
            if curves is None:
                continue
            x, middle, low, high = curves
            style = "--" if algo in sb3_algos else "-"
            ax.plot(x, middle, style, color=colors.get(algo), label=f"{algo} ({stats['seeds']})")
            if stats["seeds"] > 1:
                ax.fill_between(x, low, high, color=colors.get(algo), alpha=0.15, linewidth=0)
        ax.set_title(title(env))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize="x-small")
            ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 0))
        else:
            ax.text(0.5, 0.5, "no runs yet", transform=ax.transAxes, ha="center", va="center")
    for ax in list(axes.flat)[len(envs) :]:
        ax.set_visible(False)
    figure.suptitle(caption, fontsize=10)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100)
    plt.close(figure)
    return out


def write_grid_results(
    summary: dict[str, Any],
    args,
    *,
    name: str,
    envs: str,
    ours: Sequence[str],
    peers: Sequence[str],
    markdown: Callable[[dict[str, Any], Any, dict[str, Any]], str],
    plot: Callable[[dict[str, Any], Path], Path | None],
    extra: dict[str, Any],
    title: str,
) -> Path:
    """A grid's ``<name>.md``, ``.json``, ``.png`` and ``_intervals.png`` under ``args.results``.

    Args:
        summary: the grid's summary.
        args: its parsed options (``results``, ``algos``, ``seeds``, ``frames`` and ``envs``).
        name: the files' stem (``minatar``, ``mujoco``).
        envs: the option naming the environments (``games``, ``tasks``).
        ours: our algorithms (the first side of the interval comparisons).
        peers: the other libraries' algorithms (the second side).
        markdown: the page, from the summary, the options and the interval estimates.
        plot: writes the learning curves' PNG.
        extra: more top-level JSON fields (the published sources).
        title: the interval figure's title.

    Returns:
        The markdown page's path.
    """
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    md = results / f"{name}.md"
    estimates = intervals.estimates(
        summary, [a for a in ours if a in args.algos], [a for a in peers if a in args.algos]
    )
    write_markdown(md, markdown(summary, args, estimates))
    grid = {k: getattr(args, k) for k in (envs, "algos", "seeds", "frames")}
    data = {"grid": grid} | extra | strip_curves(summary)
    data["intervals"] = {k: v for k, v in estimates.items() if k != "profiles"}  # plotted
    md.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    plot(summary, results / f"{name}.png")
    intervals.plot(estimates, results / f"{name}_intervals.png", title)
    return md
