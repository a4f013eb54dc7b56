"""benchmarks/ppo_speed.py: alternating runs, medians and the ratios, the table it writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._helpers import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "ppo_speed.py"


@pytest.fixture
def bench():
    yield from load_script(SCRIPT, "_ppo_speed_under_test")


def fake_runs(bench, monkeypatch, seconds):
    calls = []

    def fake(which, env_id, frames):
        calls.append(which)
        return {"frames": frames, "seconds": next(seconds[which])}

    monkeypatch.setattr(bench, "run_child", fake)
    return calls


def test_runs_alternate_and_the_table_gives_median_fps_and_ratios(bench, tmp_path, monkeypatch):
    seconds = {
        "ours": iter([1.0, 4.0, 2.0]),
        "overlap": iter([1.0, 1.0, 4.0]),
        "compiled": iter([4.0, 4.0, 4.0]),
        "compiled_overlap": iter([0.5, 1.0, 0.5]),
        "sb3": iter([2.0, 2.0, 8.0]),
        "zoo": iter([10.0, 20.0, 40.0]),
    }
    calls = fake_runs(bench, monkeypatch, seconds)
    argv = ["--envs", "E-v0", "--frames", "1000", "--repeats", "3", "--results", str(tmp_path)]
    assert bench.main(argv) == 0
    assert calls == ["ours", "overlap", "compiled", "compiled_overlap", "sb3", "zoo"] * 3
    (row,) = json.loads((tmp_path / "ppo_speed.json").read_text())
    # medians: ours 500, overlapped 1,000, compiled 250, compiled + overlapped 2,000,
    # SB3 same 500, SB3 zoo 50 fps
    assert row["ratios"]["ours"] == {"sb3": 1.0, "zoo": 10.0}
    assert row["ratios"]["overlap"] == {"sb3": 2.0, "zoo": 20.0}
    assert row["ratios"]["compiled"] == {"sb3": 0.5, "zoo": 5.0}
    assert row["ratios"]["compiled_overlap"] == {"sb3": 4.0, "zoo": 40.0}
    assert set(row["ratios"]) == set(bench.OURS)
    table = (tmp_path / "ppo_speed.md").read_text()
    assert "| env | run | fps | / SB3 same | / SB3 zoo |" in table
    assert "| E-v0 | ours | 500 | 1.00× | 10.00× |" in table
    assert "| E-v0 | compiled + overlapped | 2,000 | 4.00× | 40.00× |" in table
    assert "| E-v0 | SB3 zoo | 50 |  |  |" in table
    assert "--sides" not in table  # all sides: the default command


def test_a_subset_of_sides_runs_alone_and_the_command_names_it(bench, tmp_path, monkeypatch):
    seconds = {"compiled": iter([2.0]), "ours": iter([4.0]), "sb3": iter([1.0])}
    calls = fake_runs(bench, monkeypatch, seconds)
    argv = ["--envs", "E-v0", "--frames", "1000", "--repeats", "1", "--results", str(tmp_path)]
    assert bench.main([*argv, "--sides", "sb3", "compiled", "ours"]) == 0
    assert calls == ["ours", "compiled", "sb3"]  # the order of SIDES, whatever the order given
    (row,) = json.loads((tmp_path / "ppo_speed.json").read_text())
    assert row["ratios"] == {"ours": {"sb3": 0.25}, "compiled": {"sb3": 0.5}}
    table = (tmp_path / "ppo_speed.md").read_text()
    assert "--sides ours compiled sb3`" in table
    assert "| env | run | fps | / SB3 same |" in table
    assert "| E-v0 | compiled | 500 | 0.50× |" in table
