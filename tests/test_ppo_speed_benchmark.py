"""benchmarks/ppo_speed.py: alternating runs, medians and the ratio, the table it writes."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def load():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("ppo_speed", BENCH / "ppo_speed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_runs_alternate_and_the_table_gives_median_fps_and_ratio(tmp_path, monkeypatch):
    bench = load()
    calls = []
    seconds = {
        "ours": iter([1.0, 4.0, 2.0]),
        "overlap": iter([1.0, 1.0, 4.0]),
        "sb3": iter([2.0, 2.0, 8.0]),
        "zoo": iter([10.0, 20.0, 40.0]),
    }

    def fake(which, env_id, frames):
        calls.append(which)
        return {"frames": frames, "seconds": next(seconds[which])}

    monkeypatch.setattr(bench, "run_child", fake)
    assert (
        bench.main(
            ["--envs", "E-v0", "--frames", "1000", "--repeats", "3", "--results", str(tmp_path)]
        )
        == 0
    )
    assert calls == ["ours", "overlap", "sb3", "zoo"] * 3
    rows = json.loads((tmp_path / "ppo_speed.json").read_text())
    assert rows[0]["ratio"] == 500.0 / 500.0  # medians: ours 500 fps, SB3 500 fps
    assert rows[0]["ratio_zoo"] == 500.0 / 50.0  # zoo: 100, 50, 25 fps
    assert rows[0]["ratio_overlap"] == 1000.0 / 500.0  # overlapped: 1000, 1000, 250 fps
    assert rows[0]["ratio_overlap_zoo"] == 1000.0 / 50.0
    table = (tmp_path / "ppo_speed.md").read_text()
    assert "| E-v0 | 500 | 1,000 | 500 | 1.00× | 2.00× | 50 | 10.00× | 20.00× |" in table
