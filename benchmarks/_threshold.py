"""Shared pieces of the "frames until the mean of the last 20 returns reaches 475" benchmarks.

Each run happens in a fresh subprocess (``python <script> --child NAME SEED FRAMES``) so runs
do not share torch threads, caches or collector processes; the parent collects one
``RESULT {json}`` line per run and writes a median table.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

THRESHOLD = 475.0
"""CartPole-v1's "solved" return (the mean over the last 20 finished episodes)."""


def run_recipe(train: Callable[[], Iterator[dict]]) -> dict:
    """Run one of our recipes (``train()`` yields metrics) and time it to the threshold.

    Wall time counts from before ``train()`` builds the model and collector.
    """
    start = time.perf_counter()
    hit, last = None, {}
    for metrics in train():
        last = metrics
        if (
            hit is None
            and metrics["train/return_window_size"] >= 20
            and metrics["train/return_window"] >= THRESHOLD
        ):
            hit = (metrics["time/frames"], time.perf_counter() - start)
    wall = time.perf_counter() - start
    return {
        "frames_to_475": hit[0] if hit else None,
        "seconds_to_475": hit[1] if hit else None,
        "frames": last["time/frames"],
        "seconds": wall,
        "fps": last["time/frames"] / wall,
    }


def median(values) -> float | None:
    """Median of the values that are not None (None if there are none)."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def run_child(script: str, name: str, seed: int, frames: int, timeout: int = 900) -> dict:
    """Run ``script --child name seed frames`` and return its ``RESULT`` dict (plus seed)."""
    out = subprocess.run(
        [sys.executable, script, "--child", name, str(seed), str(frames)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    if not line:
        raise RuntimeError(f"{name} seed {seed} failed:\n{out.stderr[-3000:]}")
    return json.loads(line[-1][7:]) | {"seed": seed}


def write_table(
    runs: dict[str, list[dict]], baseline: str, out: Path, header: str
) -> dict[str, dict]:
    """Median table with ratios against ``baseline``; writes ``out`` (.md) and ``.json``."""
    keys = ("frames_to_475", "seconds_to_475", "fps")
    base = {k: median(r[k] for r in runs[baseline]) for k in keys}
    rows = [
        "| run | seeds reaching 475 | frames to 475 (median) | s to 475 (median) | fps "
        f"(median) | frames ratio vs {baseline} | fps ratio vs {baseline} |",
        "|---|---|---|---|---|---|---|",
    ]

    def fmt(x, spec):
        return "—" if x is None else format(x, spec)

    summary = {}
    for name, results in runs.items():
        med = {k: median(r[k] for r in results) for k in keys}
        reached = sum(r["frames_to_475"] is not None for r in results)
        frames_ratio = (
            med["frames_to_475"] / base["frames_to_475"]
            if med["frames_to_475"] and base["frames_to_475"]
            else None
        )
        fps_ratio = med["fps"] / base["fps"]
        summary[name] = med | {"reached": reached, "frames_ratio": frames_ratio}
        summary[name]["fps_ratio"] = fps_ratio
        rows.append(
            f"| {name} | {reached}/{len(results)} | {fmt(med['frames_to_475'], ',.0f')} "
            f"| {fmt(med['seconds_to_475'], '.1f')} | {med['fps']:,.0f} | "
            f"{fmt(frames_ratio, '.2f')} | {fps_ratio:.2f} |"
        )
    table = "\n".join(rows)
    print("\n" + table)
    per_run = "\n".join(
        f"- {name}, seed {r['seed']}: "
        + json.dumps(
            {k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items() if k != "seed"}
        )
        for name, results in runs.items()
        for r in results
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(header + table + "\n\nPer run:\n\n" + per_run + "\n")
    out.with_suffix(".json").write_text(json.dumps({"runs": runs, "summary": summary}, indent=1))
    print(f"wrote {out}")
    return summary
