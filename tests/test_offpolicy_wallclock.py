"""benchmarks/offpolicy_wallclock.py: ad-hoc variants and parallel screening (fake children)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests._helpers import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "offpolicy_wallclock.py"


@pytest.fixture(scope="module")
def bench():
    yield from load_script(SCRIPT, "offpolicy_wallclock")


def test_named_and_ad_hoc_variants(bench):
    assert bench.parse_variant("acer (1 thread)") == bench.VARIANTS["acer (1 thread)"]
    recipe, overrides = bench.parse_variant(
        "acer:torch_threads=1, share_torso=True,replay_ratio=2.0,lr=5e-3"
    )
    assert recipe == "acer"
    assert overrides == {
        "frames": 60_000,
        "torch_threads": 1,
        "share_torso": True,
        "replay_ratio": 2.0,
        "lr": 5e-3,
    }
    assert bench.parse_variant("ppo:frames=1000") == ("ppo", {"frames": 1000})


@pytest.mark.parametrize(
    "name, match",
    [
        ("acer (42 threads)", "unknown variant"),
        ("dqn:lr=1", "unknown variant"),
        ("acer:", "unknown variant"),
        ("acer:lr", "is not key=value"),
    ],
)
def test_bad_variants_are_named(bench, name, match):
    with pytest.raises(ValueError, match=match):
        bench.parse_variant(name)


@pytest.mark.parametrize("jobs", [1, 3])
def test_run_seeds_keeps_seed_order_per_name(bench, monkeypatch, jobs):
    threshold = sys.modules["_threshold"]
    calls = []

    def run_child(script, name, seed, frames, timeout=900):
        calls.append((name, seed, frames))
        return {"frames_to_475": 1000.0 * seed + len(name), "seed": seed}

    monkeypatch.setattr(threshold, "run_child", run_child)
    runs = threshold.run_seeds("x.py", ["a", "bb"], [3, 1, 2], {"a": 5, "bb": 7}, jobs=jobs)
    assert [r["seed"] for r in runs["a"]] == [3, 1, 2]
    assert [r["frames_to_475"] for r in runs["bb"]] == [3002.0, 1002.0, 2002.0]
    assert sorted(calls) == sorted((n, s, f) for n, f in (("a", 5), ("bb", 7)) for s in (3, 1, 2))


def test_per_run_lines_are_written_for_people(bench):
    describe = sys.modules["_threshold"].describe_run
    run = {"frames_to_475": 34304.0, "seconds_to_475": 9.22, "frames": 100352.0}
    run |= {"seconds": 30.68, "fps": 3270.9}
    assert describe(run) == "475 at 34,304 frames (9.2 s); 100,352 frames in 30.7 s, 3,271 fps"
    missed = run | {"frames_to_475": None, "seconds_to_475": None, "best_window": 473.84}
    assert describe(missed).startswith("475 not reached (best window 473.8); 100,352 frames")
