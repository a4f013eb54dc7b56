"""``ac-train`` frames per second of this tree against another commit's, in one invocation.

For every algorithm and env, ``ac-train`` runs with the code of ``--baseline`` (a git ref,
checked out into a temporary worktree) and with this working tree, alternating, ``--repeats``
times each, one run at a time. A run's speed is its steady-state fps: frames over seconds
between the middle and the end of the run, read from its ``time/seconds`` log, so start-up and
the replay's fill-up before learning starts (``--replay-start``, lowered here so that the
learner runs for most of the run) are left out. The ratio is the median of this tree's fps
over the median of the baseline's.

    python benchmarks/train_fps.py --baseline 72ae20e

Writes ``benchmarks/results/train_fps.{md,json}``; finished runs are kept under
``benchmarks/results/train_fps/`` (not committed) and skipped when the script runs again with
the same baseline.

``--flags`` adds ``ac-train`` arguments to this tree's runs only, so that one setting can be
measured against the baseline's defaults (its runs are kept apart from the plain ones):

    python benchmarks/train_fps.py --baseline f6938a9 --algorithms reactor \
        --envs MinAtar/Breakout-v1 --flags=--overlap-collection

Each case also says whether the two codes learned the same curve (the ``train/return_window``
log of the first repeat, value for value), and ``--threshold-seeds`` adds frames to CartPole's
475 with each algorithm's default budget, per seed, for both codes:

    python benchmarks/train_fps.py --baseline 72ae20e --threshold-seeds 1 2 3 \
        --threshold-algorithms ppo a2c
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write_markdown

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
RUNS = RESULTS / "train_fps"
CASES = {
    # (algorithm, env): frames, extra ac-train arguments
    ("ppo", "CartPole-v1"): (61_440, []),
    ("a2c", "CartPole-v1"): (61_440, []),
    ("acer", "CartPole-v1"): (20_000, ["--replay-start", "2000"]),
    ("reactor", "CartPole-v1"): (10_000, ["--replay-start", "2000"]),
    ("ppo", "MinAtar/Breakout-v1"): (40_960, []),
    ("a2c", "MinAtar/Breakout-v1"): (40_960, []),
    ("acer", "MinAtar/Breakout-v1"): (16_000, ["--replay-start", "2000"]),
    ("reactor", "MinAtar/Breakout-v1"): (8_000, ["--replay-start", "2000"]),
}
"""Each case's frames: enough for tens of seconds of steady learning on 2 CPU cores."""


def steady_fps(run: Path, algorithm: str) -> float:
    """Frames per second between the middle and the end of ``run`` (from its seconds log)."""
    path = run / "logs" / algorithm / "scalars" / "time" / "seconds.csv"
    with path.open() as f:
        rows = [(float(frames), float(seconds)) for frames, seconds in csv.reader(f)]
    start = rows[len(rows) // 2]
    end = rows[-1]
    return (end[0] - start[0]) / (end[1] - start[1])


def curve(run: Path, algorithm: str) -> list[tuple[float, float]]:
    """The run's ``train/return_window`` log as (frames, value) pairs."""
    path = run / "logs" / algorithm / "scalars" / "train" / "return_window.csv"
    with path.open() as f:
        return [(float(frames), float(value)) for frames, value in csv.reader(f)]


def same_curve(a: list, b: list) -> str:
    """Say "yes" when two curves are equal value for value, else where they part."""
    for (frames, x), (_, y) in zip(a, b, strict=False):
        if x != y:
            return f"no (from frame {frames:,.0f})"
    return "yes" if len(a) == len(b) else "no (lengths differ)"


def train(code: Path, algorithm: str, env: str, out: Path, args: list[str]) -> None:
    """One ``ac-train`` run with the package found under ``code``."""
    command = [sys.executable, "-m", "ac_extensions.cli.train", algorithm, "--env", env]
    command += ["--out", str(out), *args]
    environ = dict(os.environ, PYTHONPATH=str(code))
    subprocess.run(command, check=True, env=environ, stdout=subprocess.DEVNULL, cwd=code)


def run_once(code: Path, algorithm: str, env: str, out: Path, flags: tuple[str, ...] = ()) -> float:
    """One fps case run with the package found under ``code``; its steady-state fps."""
    frames, extra = CASES[(algorithm, env)]
    train(code, algorithm, env, out, ["--frames", str(frames), "--seed", "1", *extra, *flags])
    return steady_fps(out, algorithm)


def frames_to_threshold(code: Path, algorithm: str, seed: int, out: Path) -> float | None:
    """Frames to CartPole's 475 in a default ``ac-train`` run (None: not reached)."""
    summary = out / "summary.json"
    if not summary.is_file() or not json.loads(summary.read_text())["complete"]:
        train(code, algorithm, "CartPole-v1", out, ["--seed", str(seed)])
    return json.loads(summary.read_text())["frames_to_threshold"]


def measure(
    baseline: str,
    cases: list[tuple[str, str]],
    repeats: int,
    threshold: tuple[list[str], list[int]] = ((), ()),
    flags: tuple[str, ...] = (),
) -> dict:
    """Measure every case with the baseline's code and this tree's (with ``flags``), alternating."""
    sha = subprocess.run(
        ["git", "rev-parse", "--short", baseline],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    results: dict = {"baseline": sha, "flags": list(flags), "cases": {}, "threshold": {}}
    # this tree's runs with flags are kept apart from its plain ones
    current = "current" + "".join(f"_{f.strip('-').replace('=', '_')}" for f in flags)
    with tempfile.TemporaryDirectory() as tmp:
        worktree = Path(tmp) / "baseline"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(worktree), sha],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        try:
            for algorithm, env in cases:
                name = f"{algorithm}-{env.replace('/', '_')}"
                row: dict = {"baseline": [], "current": []}
                for repeat in range(repeats):
                    for label, code in (("baseline", worktree), ("current", ROOT)):
                        folder = current if label == "current" else label
                        out = RUNS / sha / folder / f"{name}-{repeat}"
                        done = out / "fps.json"
                        if done.is_file():
                            fps = json.loads(done.read_text())["fps"]
                        else:
                            extra = flags if label == "current" else ()
                            fps = run_once(code, algorithm, env, out, extra)
                            done.write_text(json.dumps({"fps": fps}) + "\n")
                        row[label].append(fps)
                        print(f"{name} {label} #{repeat}: {fps:,.0f} fps", flush=True)
                runs = [RUNS / sha / folder / f"{name}-0" for folder in ("baseline", current)]
                row["same_curve"] = same_curve(*(curve(run, algorithm) for run in runs))
                results["cases"][f"{algorithm} {env}"] = row
            for algorithm in threshold[0]:
                row = {"baseline": [], "current": []}
                for seed in threshold[1]:
                    for label, code in (("baseline", worktree), ("current", ROOT)):
                        out = RUNS / sha / label / f"{algorithm}-475-seed{seed}"
                        row[label].append(frames_to_threshold(code, algorithm, seed, out))
                        print(f"{algorithm} seed {seed} {label}: {row[label][-1]}", flush=True)
                results["threshold"][algorithm] = row
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT)
    return results


def table(results: dict) -> str:
    """The markdown page of ``results``."""
    lines = [
        "# `ac-train` frames per second: this code against the baseline",
        "",
        f"Baseline: commit `{results['baseline']}`; produced by `benchmarks/train_fps.py`. "
        "Steady-state fps (middle to end of each run), median of the repeats, one run at a "
        "time on this machine; ratio = this code / baseline."
        + (f" This code ran with `{' '.join(results['flags'])}`." if results.get("flags") else ""),
        "",
        "| algorithm | env | baseline fps | this code fps | ratio | same curve |",
        "|---|---|---|---|---|---|",
    ]
    for case, row in results["cases"].items():
        algorithm, env = case.split(" ", 1)
        before, after = statistics.median(row["baseline"]), statistics.median(row["current"])
        lines.append(
            f"| {algorithm} | {env} | {before:,.0f} | {after:,.0f} | {after / before:.2f}x "
            f"| {row['same_curve']} |"
        )
    if results["threshold"]:
        lines += [
            "",
            "Frames to CartPole-v1's 475 (mean of the last 20 returns) with each algorithm's "
            "default budget, per seed (— : not reached):",
            "",
            "| algorithm | seeds | baseline | this code | median baseline | median this code |",
            "|---|---|---|---|---|---|",
        ]
        for algorithm, row in results["threshold"].items():
            cells = [", ".join(_frames(v) for v in row[k]) for k in ("baseline", "current")]
            medians = [_frames(_median(row[k])) for k in ("baseline", "current")]
            lines.append(
                f"| {algorithm} | {len(row['current'])} | {cells[0]} | {cells[1]} | "
                f"{medians[0]} | {medians[1]} |"
            )
    return "\n".join(lines) + "\n"


def _median(values: list) -> float | None:
    """The median, counting a run that never reached the threshold as infinitely long."""
    value = statistics.median(math.inf if v is None else v for v in values)
    return None if math.isinf(value) else value


def _frames(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="git ref of the code to compare with")
    parser.add_argument("--repeats", type=int, default=2, help="runs per case and code")
    parser.add_argument("--algorithms", nargs="+", default=["ppo", "a2c", "acer", "reactor"])
    parser.add_argument("--envs", nargs="+", default=["CartPole-v1", "MinAtar/Breakout-v1"])
    parser.add_argument("--name", default="train_fps", help="result files' name")
    parser.add_argument("--threshold-seeds", type=int, nargs="*", default=[])
    parser.add_argument("--threshold-algorithms", nargs="*", default=["ppo", "a2c"])
    parser.add_argument(
        "--flags",
        nargs="*",
        default=[],
        help="ac-train arguments for this tree's fps runs only (write --flags=--opt for one)",
    )
    args = parser.parse_args()
    cases = [(a, e) for e in args.envs for a in args.algorithms if (a, e) in CASES]
    threshold = (args.threshold_algorithms if args.threshold_seeds else [], args.threshold_seeds)
    results = measure(args.baseline, cases, args.repeats, threshold, tuple(args.flags))
    (RESULTS / f"{args.name}.json").write_text(json.dumps(results, indent=1) + "\n")
    write_markdown(RESULTS / f"{args.name}.md", table(results))
    print(table(results))


if __name__ == "__main__":
    main()
