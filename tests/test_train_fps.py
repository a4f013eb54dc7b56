"""benchmarks/train_fps.py: alternating runs, the flags only this tree's runs get, the table."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests._helpers import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "train_fps.py"


@pytest.fixture
def bench():
    yield from load_script(SCRIPT, "_train_fps_under_test")


def test_flags_reach_this_trees_runs_only_and_the_page_says_so(bench, tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "RUNS", tmp_path)
    git = []
    monkeypatch.setattr(
        bench.subprocess,
        "run",
        lambda command, **kw: git.append(command) or SimpleNamespace(stdout="abc1234\n"),
    )
    calls = []
    fps = {"baseline": iter([100.0, 300.0, 200.0]), "current": iter([500.0, 400.0, 600.0])}

    def fake_run_once(code, algorithm, env, out, flags=()):
        label = "baseline" if code != bench.ROOT else "current"
        calls.append((label, flags, out.relative_to(tmp_path).as_posix()))
        out.mkdir(parents=True)
        return next(fps[label])

    monkeypatch.setattr(bench, "run_once", fake_run_once)
    monkeypatch.setattr(bench, "curve", lambda run, algorithm: [(1.0, 2.0)])
    case = [("reactor", "MinAtar/Breakout-v1")]
    results = bench.measure("HEAD", case, 3, flags=("--overlap-collection",))
    assert [c[:2] for c in calls] == [
        ("baseline", ()),
        ("current", ("--overlap-collection",)),
    ] * 3
    # the flagged runs live apart from the plain ones
    assert calls[1][2] == "abc1234/current_overlap-collection/reactor-MinAtar_Breakout-v1-0"
    assert calls[0][2] == "abc1234/baseline/reactor-MinAtar_Breakout-v1-0"
    assert any(c[:3] == ["git", "worktree", "add"] for c in git)
    page = bench.table(results)
    assert "This code ran with `--overlap-collection`." in page
    assert "| reactor | MinAtar/Breakout-v1 | 200 | 500 | 2.50x | yes |" in page
    # a rerun skips the finished runs
    calls.clear()
    bench.measure("HEAD", case, 3, flags=("--overlap-collection",))
    assert calls == []


def test_without_flags_the_page_has_no_flag_sentence(bench):
    results = {"baseline": "abc1234", "cases": {}, "threshold": {}}
    assert "This code ran with" not in bench.table(results)
