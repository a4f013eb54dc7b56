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
"""

from __future__ import annotations

import argparse
import csv
import json
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


def run_once(code: Path, algorithm: str, env: str, out: Path) -> float:
    """One ``ac-train`` run with the package found under ``code``; its steady-state fps."""
    frames, extra = CASES[(algorithm, env)]
    command = [sys.executable, "-m", "ac_extensions.cli.train", algorithm, "--env", env]
    command += ["--frames", str(frames), "--seed", "1", "--out", str(out), *extra]
    environ = dict(os.environ, PYTHONPATH=str(code))
    subprocess.run(command, check=True, env=environ, stdout=subprocess.DEVNULL, cwd=code)
    return steady_fps(out, algorithm)


def measure(baseline: str, cases: list[tuple[str, str]], repeats: int) -> dict:
    """Measure every case with the baseline's code and this tree's, alternating."""
    sha = subprocess.run(
        ["git", "rev-parse", "--short", baseline],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    results: dict = {"baseline": sha, "cases": {}}
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
                        out = RUNS / sha / label / f"{name}-{repeat}"
                        done = out / "fps.json"
                        if done.is_file():
                            fps = json.loads(done.read_text())["fps"]
                        else:
                            fps = run_once(code, algorithm, env, out)
                            done.write_text(json.dumps({"fps": fps}) + "\n")
                        row[label].append(fps)
                        print(f"{name} {label} #{repeat}: {fps:,.0f} fps", flush=True)
                results["cases"][f"{algorithm} {env}"] = row
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
        "time on this machine; ratio = this code / baseline.",
        "",
        "| algorithm | env | baseline fps | this code fps | ratio |",
        "|---|---|---|---|---|",
    ]
    for case, row in results["cases"].items():
        algorithm, env = case.split(" ", 1)
        before, after = statistics.median(row["baseline"]), statistics.median(row["current"])
        lines.append(
            f"| {algorithm} | {env} | {before:,.0f} | {after:,.0f} | {after / before:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="git ref of the code to compare with")
    parser.add_argument("--repeats", type=int, default=2, help="runs per case and code")
    parser.add_argument("--algorithms", nargs="+", default=["ppo", "a2c", "acer", "reactor"])
    parser.add_argument("--envs", nargs="+", default=["CartPole-v1", "MinAtar/Breakout-v1"])
    parser.add_argument("--name", default="train_fps", help="result files' name")
    args = parser.parse_args()
    cases = [(a, e) for e in args.envs for a in args.algorithms if (a, e) in CASES]
    results = measure(args.baseline, cases, args.repeats)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(results, indent=1) + "\n")
    write_markdown(RESULTS / f"{args.name}.md", table(results))
    print(table(results))


if __name__ == "__main__":
    main()
