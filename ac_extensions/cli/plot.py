"""``ac-plot``: learning curves of ``ac-train`` runs to a PNG.

    ac-plot runs/ppo-1 runs/ppo-2 runs/acer-1 --out curves.png
    ac-plot runs/                                  # every run below a folder

One line per algorithm and environment: the mean over its runs (seeds) of
``train/return_window`` (mean of the last 20 finished episode returns) against frames, with a
shaded band from the lowest to the highest run, and the threshold dashed when the runs share
one. Reads each run's ``summary.json`` and CSV logs (``logs/*/scalars/train/return_window.csv``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections import defaultdict
from pathlib import Path

from ac_extensions.cli._config import UsageError
from ac_extensions.cli._errors import ArgumentParser, run_main

CURVE = Path("scalars") / "train" / "return_window.csv"


def build_parser() -> ArgumentParser:
    """The parser of ``ac-plot``."""
    parser = ArgumentParser(
        prog="ac-plot",
        description="Plot return vs frames of ac-train runs (seeds aggregated with a band).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("runs", nargs="+", type=Path, help="run directories, or folders of them")
    parser.add_argument("--out", type=Path, default=Path("curves.png"), help="PNG to write")
    parser.add_argument("--title", default=None, help="figure title")
    return parser


def find_runs(paths: list[Path]) -> list[Path]:
    """Run directories (holding ``summary.json``) given or found below ``paths``."""
    runs: list[Path] = []
    for path in paths:
        if not path.exists():
            raise UsageError(f"{path} does not exist")
        if (path / "summary.json").is_file():
            runs.append(path)
        else:
            runs.extend(sorted(p.parent for p in path.rglob("summary.json")))
    if not runs:
        raise UsageError("no ac-train runs (directories with summary.json) found")
    return list(dict.fromkeys(runs))


def read_curve(run: Path) -> tuple[list[float], list[float]]:
    """(frames, return_window) of one run, the last value kept for a repeated frame count."""
    files = sorted((run / "logs").glob(f"*/{CURVE}"))
    if not files:
        return [], []
    points: dict[float, float] = {}
    for line in files[0].read_text().splitlines():
        if line.strip():
            step, value = line.split(",")[:2]
            points[float(step)] = float(value)
    frames = sorted(points)
    return frames, [points[f] for f in frames]


def aggregate(curves: list[tuple[list[float], list[float]]]):
    """Mean, min and max over runs on a common frame grid (up to the shortest run's end)."""
    import numpy as np

    curves = [(np.asarray(x), np.asarray(y)) for x, y in curves if len(x)]
    end = min(x[-1] for x, _ in curves)
    grid = np.unique(np.concatenate([x[x <= end] for x, _ in curves]))
    values = np.stack([np.interp(grid, x, y) for x, y in curves])
    return grid, values.mean(0), values.min(0), values.max(0)


def group_runs(runs: list[Path]) -> tuple[dict[str, dict[str, list]], dict[str, set]]:
    """The runs' curves by env, then by algorithm; and the thresholds found per env."""
    groups: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    thresholds: dict[str, set] = defaultdict(set)
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        curve = read_curve(run)
        if curve[0]:
            groups[summary["env"]][summary["algorithm"]].append(curve)
            thresholds[summary["env"]].add(summary.get("threshold"))
    return groups, thresholds


def plot(runs: list[Path], out: Path, title: str | None = None) -> Path:
    """Draw the curves of ``runs`` into ``out`` (written atomically); return ``out``.

    One panel per env (returns of different envs do not share a scale), one curve per
    algorithm in it, the mean over its runs with their min–max as a band.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups, thresholds = group_runs(runs)
    if not groups:
        raise UsageError("the runs have no train/return_window logs (CSV logger) to plot")
    envs = sorted(groups)
    figure, panels = plt.subplots(1, len(envs), figsize=(7 * len(envs), 4.5), squeeze=False)
    for axes, env in zip(panels.flat, envs, strict=True):
        for label, curves in sorted(groups[env].items()):
            grid, mean, low, high = aggregate(curves)
            n = len(curves)
            (line,) = axes.plot(grid, mean, label=f"{label}, {n} run{'s' * (n > 1)}")
            if n > 1:
                axes.fill_between(grid, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
        if len(thresholds[env]) == 1 and None not in thresholds[env]:
            level = thresholds[env].pop()
            axes.axhline(level, color="grey", linestyle="--", linewidth=1, label="threshold")
        _finish_panel(axes, env)
    figure.suptitle(title or "learning curves (mean over seeds, band: min–max)")
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp.png")
    try:
        figure.savefig(tmp, dpi=120)
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
        plt.close(figure)
    return out


def _finish_panel(axes, env: str) -> None:
    """Labels, grid and legend of one panel, titled with its env."""
    axes.set_xlabel("frames")
    axes.set_ylabel("mean return of the last 20 episodes")
    axes.set_title(env)
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")


def plot_command(argv: list[str]) -> int:
    """Parse, plot; return the exit status."""
    args = build_parser().parse_args(argv)
    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError("ac-plot needs matplotlib (pip install 'ac-extensions[plot]')")
    if args.out.suffix.lower() != ".png":
        raise UsageError(f"--out must be a .png file, got {args.out.name}")
    out = plot(find_runs(args.runs), args.out, args.title)
    print(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``ac-plot``."""
    return run_main("ac-plot", plot_command, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
