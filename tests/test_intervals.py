"""The interval estimates and verdicts of the benchmark pages (``benchmarks/_intervals.py``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests._helpers import load_script

pytest.importorskip("rliable")
SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "_intervals.py"


@pytest.fixture(scope="module")
def intervals():
    yield from load_script(SCRIPT, "_intervals_under_test")


@pytest.fixture(autouse=True)
def few_resamples(intervals, monkeypatch):
    monkeypatch.setattr(intervals, "REPS", 300)


@pytest.mark.parametrize(
    ("low", "high", "word"),
    [(0.51, 0.9, "above"), (0.1, 0.49, "below"), (0.3, 0.7, "level"), (0.5, 0.8, "level")],
)
def test_verdict(intervals, low, high, word):
    assert intervals.verdict(low, high) == word


def test_probability_of_improvement_of_separated_scores(intervals):
    better, worse = np.full((3, 2), 5.0) + np.arange(3)[:, None], np.zeros((3, 2))
    assert intervals.probability_of_improvement(better, worse) == (1.0, 1.0, 1.0)
    assert intervals.probability_of_improvement(worse, better) == (0.0, 0.0, 0.0)
    # identical scores: every pair a tie, P = 0.5 exactly
    assert intervals.probability_of_improvement(worse, worse)[0] == 0.5


def test_iqm_interval_and_determinism(intervals):
    scores = np.array([[1.0], [2.0], [3.0], [10.0]])
    state = np.random.get_state()[1].copy()  # noqa: NPY002
    first = intervals.interval(scores, "iqm")
    assert intervals.interval(scores, "iqm") == first  # the same page twice
    assert np.array_equal(np.random.get_state()[1], state)  # noqa: NPY002 (stream restored)
    point, low, high = first
    assert point == pytest.approx(2.5)  # IQM of 1, 2, 3, 10: the mean of the middle two
    assert 1.0 <= low <= point <= high <= 10.0
    assert intervals.interval(scores, "mean")[0] == pytest.approx(4.0)
    assert intervals.interval(scores[:1], "mean") == (1.0, 1.0, 1.0)  # one run: no interval


def run(seed, score, complete=True):
    return {"seed": seed, "complete": complete, "final_mean_return": score}


def test_estimates_normalise_by_the_best_other_library_and_judge(intervals):
    summary = {
        "games": {
            "A": {
                "algorithms": {
                    "ours": {"runs": [run(1, 20.0), run(2, 22.0), run(3, 24.0)]},
                    "theirs1": {"runs": [run(1, 10.0), run(2, 10.0), run(3, 10.0)]},
                    "theirs2": {"runs": [run(1, 4.0), run(2, 6.0), run(3, 99.0, complete=False)]},
                }
            },
            "B": {
                "algorithms": {
                    "ours": {"runs": [run(1, 1.0), run(2, 1.5), run(3, 2.0)]},
                    "theirs1": {"runs": [run(1, 2.0), run(2, 2.0), run(3, 2.0)]},
                    "theirs2": {"runs": [run(1, 4.0), run(2, 4.0)]},
                }
            },
        }
    }
    data = intervals.estimates(summary, ["ours"], ["theirs1", "theirs2"])
    # best other library's mean per game; the unfinished run is left out
    assert data["reference"] == {"A": 10.0, "B": 4.0}
    assert data["per_game"]["A"]["theirs2"]["runs"] == 2
    assert data["per_game"]["A"]["ours"]["mean"][0] == pytest.approx(22.0)
    # ours normalised: A 2.0-2.4, B 0.25-0.5; mean of all six = (2+2.2+2.4+.25+.375+.5)/6
    assert data["aggregate"]["ours"]["mean"][0] == pytest.approx(7.725 / 6)
    assert data["aggregate"]["theirs2"]["runs"] == 2  # seeds complete on both games
    # P(ours > theirs1), per game over all run pairs (a tie counts half), then averaged: on A
    # every pair is won (1); on B ours 0.25, 0.375, 0.5 against 0.5 three times: 0.5/3
    versus = data["improvement"]["ours > theirs1"]
    assert versus["probability"][0] == pytest.approx((1 + 0.5 / 3) / 2)
    assert versus["verdict"] == "level"
    lines = intervals.markdown(data)
    assert any(line.startswith("| ours > theirs1 | 2 | 0.58 [") for line in lines)
    assert "| A | ours | 3 | 22.00 [" in "\n".join(lines)


def test_intervals_agree_with_rliables_own_bootstrap(intervals, monkeypatch):
    from rliable import library, metrics

    monkeypatch.setattr(intervals, "REPS", 20_000)
    gen = np.random.default_rng(3)
    x, y = gen.normal(1.0, 0.5, (5, 4)), gen.normal(0.8, 0.5, (5, 4))
    with intervals._seeded(1):
        _, theirs = library.get_interval_estimates({"x": x}, metrics.aggregate_iqm, reps=2_000)
        _, theirs_poi = library.get_interval_estimates(
            {"x,y": (x, y)}, metrics.probability_of_improvement, reps=2_000
        )
    _, low, high = intervals.interval(x, "iqm")
    np.testing.assert_allclose([low, high], np.ravel(theirs["x"]), atol=0.05)
    _, low, high = intervals.probability_of_improvement(x, y)
    np.testing.assert_allclose([low, high], np.ravel(theirs_poi["x,y"]), atol=0.05)


def test_a_game_with_a_reference_of_zero_or_below_is_left_out_of_the_aggregate(intervals):
    summary = {
        "games": {
            "A": {
                "algorithms": {
                    "ours": {"runs": [run(1, 2.0), run(2, 3.0)]},
                    "theirs": {"runs": [run(1, 1.0), run(2, 1.0)]},
                }
            },
            "B": {
                "algorithms": {
                    "ours": {"runs": [run(1, -2.0), run(2, -1.0)]},
                    "theirs": {"runs": [run(1, -5.0), run(2, -3.0)]},
                }
            },
        }
    }
    data = intervals.estimates(summary, ["ours"], ["theirs"])
    assert data["normalised_games"] == ["A"] and data["left_out"] == ["B"]
    assert data["aggregate"]["ours"]["mean"][0] == pytest.approx(2.5)
    assert "(B left out: its reference score is not positive)" in "\n".join(
        intervals.markdown(data)
    )


def test_one_run_a_side_gives_no_verdict(intervals):
    point, low, high = intervals.probability_of_improvement(
        np.array([[1.0, 2.0]]), np.array([[0.5, 1.5]])
    )
    assert point == 1.0 and (low, high) == (0.0, 1.0)
    assert intervals.verdict(low, high) == "level"


def test_comparisons_use_every_shared_game_on_raw_scores(intervals):
    # Each comparison uses the games both sides have ("late" has no run on B, so it is compared
    # on A alone and left out of the aggregate); ours wins every pair on both games.
    summary = {
        "games": {
            "A": {
                "algorithms": {
                    "ours": {"runs": [run(1, 5.0), run(2, 6.0)]},
                    "theirs": {"runs": [run(1, 1.0), run(2, 2.0)]},
                    "late": {"runs": [run(1, 1.0), run(2, 1.5)]},
                }
            },
            "B": {
                "algorithms": {
                    "ours": {"runs": [run(1, 5.0), run(2, 7.0)]},
                    "theirs": {"runs": [run(1, 3.0), run(2, 4.0)]},
                }
            },
        }
    }
    data = intervals.estimates(summary, ["ours"], ["theirs", "late"])
    assert data["improvement"]["ours > theirs"]["games"] == 2
    assert data["improvement"]["ours > theirs"]["probability"][0] == 1.0
    assert data["improvement"]["ours > late"]["games"] == 1
    assert data["aggregate_left_out"] == ["late"]
    assert "Not in the aggregate (no complete run on one of them): late." in "\n".join(
        intervals.markdown(data)
    )


def test_per_game_verdicts_judge_each_game_on_its_own_runs(intervals):
    summary = {
        "games": {
            "A": {  # ours above every run of theirs: P 1, above
                "algorithms": {
                    "ours": {"runs": [run(1, 20.0), run(2, 22.0), run(3, 24.0)]},
                    "theirs": {"runs": [run(1, 10.0), run(2, 11.0), run(5, 12.0)]},
                }
            },
            "B": {  # ours below: P 0, below
                "algorithms": {
                    "ours": {"runs": [run(1, 1.0), run(2, 1.5), run(3, 2.0)]},
                    "theirs": {"runs": [run(1, 3.0), run(2, 4.0)]},
                }
            },
            "C": {  # interleaved runs: level
                "algorithms": {
                    "ours": {"runs": [run(1, 1.0), run(2, 3.0)]},
                    "theirs": {"runs": [run(1, 2.0), run(2, 4.0)]},
                }
            },
            "D": {"algorithms": {"ours": {"runs": [run(1, 1.0)]}}},  # no runs of theirs
        }
    }
    data = intervals.estimates(summary, ["ours"], ["theirs"])
    games = data["per_game_improvement"]["ours > theirs"]
    assert list(games) == ["A", "B", "C"]  # D has nothing to compare with
    assert games["A"]["probability"] == (1.0, 1.0, 1.0) and games["A"]["verdict"] == "above"
    assert games["B"]["probability"] == (0.0, 0.0, 0.0) and games["B"]["verdict"] == "below"
    # C: pairs (1,2) lost, (1,4) lost, (3,2) won, (3,4) lost: P = 1/4, interval holds 0.5
    point, low, high = games["C"]["probability"]
    assert point == pytest.approx(0.25) and low <= 0.5 <= high
    assert games["C"]["verdict"] == "level"
    table = "\n".join(intervals.markdown(data))
    assert "| comparison | A | B | C |" in table
    assert "| ours > theirs | above (1.00) | below (0.00) | level (0.25) |" in table
