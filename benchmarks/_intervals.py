"""Interval estimates over seeds and the verdicts they give, with ``rliable``.

Agarwal et al., 2021, "Deep Reinforcement Learning at the Edge of the Statistical Precipice"
(NeurIPS; the ``rliable`` library): with few runs per task, report the interquartile mean (IQM)
and the mean with 95% stratified bootstrap confidence intervals (runs resampled within each
task), the IQM of normalised scores across tasks, performance profiles, and the probability of
improvement P(X > Y) of one algorithm over another with its interval.

A benchmark grid's summary (``summary["games"][game]["algorithms"][algo]["runs"]``, each run
with ``seed``, ``complete`` and ``final_mean_return``) goes in; markdown lines, a JSON-ready
dict and a figure come out. Only complete runs count. Scores are normalised per game by a
stated reference: the mean final score of the best other library's algorithm on that game
(:func:`reference_scores`), so 1.0 is "as good as the best of them".

The statistics are rliable's (``metrics.aggregate_iqm``, ``aggregate_mean``,
``probability_of_improvement``, ``create_performance_profile``); the percentile intervals come
from the same stratified bootstrap, vectorised here (rliable's runs one Python step per
resample, about a millisecond on this machine: minutes per page at its default 50,000);
``tests/test_intervals.py`` checks them against rliable's ``get_interval_estimates``.

Verdicts (:func:`verdict`): "above" where the 95% interval of P(ours > theirs) lies above 0.5,
"below" where it lies below, "level" where it contains 0.5.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPS = 50_000
"""Bootstrap resamples per interval (rliable's default)."""
SEED = 0
"""The bootstrap's random stream, fixed so that a summary regenerates the same page."""
TAUS = np.linspace(0.0, 2.0, 81)
"""Normalised-score thresholds τ of the performance profiles."""


@contextlib.contextmanager
def _seeded(seed: int = SEED) -> Iterator[None]:
    """Rliable's bootstrap draws from NumPy's global stream: seed it, then restore it."""
    state = np.random.get_state()  # noqa: NPY002 (the stream rliable draws from)
    np.random.seed(seed)  # noqa: NPY002
    try:
        yield
    finally:
        np.random.set_state(state)  # noqa: NPY002


def stratified_resamples(scores: np.ndarray, reps: int, rng: np.random.Generator) -> np.ndarray:
    """``reps`` stratified resamples of ``scores`` ``[runs, tasks]``: ``[reps, runs, tasks]``.

    Runs are drawn with replacement within each task (rliable's ``StratifiedBootstrap``).
    """
    runs, tasks = scores.shape
    index = rng.integers(0, runs, size=(reps, runs, tasks))
    return np.take_along_axis(np.broadcast_to(scores, (reps, runs, tasks)), index, axis=1)


def _iqm(samples: np.ndarray) -> np.ndarray:
    """IQM of each resample ``[reps, runs, tasks]`` over all its scores: ``[reps]``.

    As ``scipy.stats.trim_mean(x, 0.25)``, rliable's ``aggregate_iqm``.
    """
    flat = np.sort(samples.reshape(samples.shape[0], -1), axis=1)
    cut = int(0.25 * flat.shape[1])
    return flat[:, cut : flat.shape[1] - cut].mean(axis=1)


def _improvement(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y) of each pair of resamples x ``[reps, n, G]``, y ``[reps, m, G]``: ``[reps]``.

    Per task the fraction of run pairs won (ties half: the Mann-Whitney U over n·m), averaged
    over tasks (rliable's ``probability_of_improvement``).
    """
    diff = x[:, :, None, :] - y[:, None, :, :]  # [reps, n, m, G]
    wins = (diff > 0).mean(axis=(1, 2)) + 0.5 * (diff == 0).mean(axis=(1, 2))  # [reps, G]
    return wins.mean(axis=1)


def _percentiles(values: np.ndarray) -> tuple[float, float]:
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)


def _rliable():
    try:
        from rliable import library, metrics
    except ImportError as error:  # the bench extra
        raise ImportError("interval estimates need rliable: pip install -e '.[bench]'") from error
    return library, metrics


def final_scores(summary: dict[str, Any], algo: str, game: str) -> dict[int, float]:
    """``seed → final score`` of one algorithm's complete runs on one game."""
    data = summary["games"].get(game, {}).get("algorithms", {}).get(algo)
    if not data:
        return {}
    return {
        r["seed"]: float(r["final_mean_return"])
        for r in data["runs"]
        if r["complete"] and r["final_mean_return"] is not None
    }


def reference_scores(summary: dict[str, Any], others: Sequence[str]) -> dict[str, float]:
    """Per game, the best mean final score among ``others`` (the normalisation's 1.0)."""
    out = {}
    for game in summary["games"]:
        means = [np.mean(list(s.values())) for p in others if (s := final_scores(summary, p, game))]
        if means:
            out[game] = float(max(means))
    return out


def score_matrix(summary: dict[str, Any], algo: str, games: Sequence[str]) -> np.ndarray | None:
    """Final scores ``[runs, games]`` over the seeds complete on every one of ``games``."""
    per_game = [final_scores(summary, algo, g) for g in games]
    seeds = sorted(set.intersection(*(set(s) for s in per_game))) if per_game else []
    if not seeds:
        return None
    return np.array([[scores[s] for scores in per_game] for s in seeds])


def interval(scores: np.ndarray, statistic: str) -> tuple[float, float, float]:
    """(point, low, high): ``"iqm"`` or ``"mean"`` of ``scores`` ``[runs, tasks]``, 95% CI."""
    _, metrics = _rliable()
    func = {"iqm": metrics.aggregate_iqm, "mean": metrics.aggregate_mean}[statistic]
    point = float(func(scores))
    if scores.shape[0] < 2:
        return point, point, point
    samples = stratified_resamples(scores, REPS, np.random.default_rng(SEED))
    values = _iqm(samples) if statistic == "iqm" else samples.mean(axis=(1, 2))
    return (point, *_percentiles(values))


def probability_of_improvement(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """(point, low, high) of P(X > Y) over tasks (ties count half), x ``[n, G]``, y ``[m, G]``.

    X's and Y's runs are resampled independently, each within its tasks (rliable's
    ``StratifiedIndependentBootstrap``).
    """
    _, metrics = _rliable()
    point = float(metrics.probability_of_improvement(x, y))
    if x.shape[0] < 2 or y.shape[0] < 2:  # one run a side: no spread to resample, no verdict
        return point, 0.0, 1.0
    rng = np.random.default_rng(SEED)
    chunks = []
    for size in np.diff(np.r_[0:REPS:5_000, REPS]):  # bounded memory: [5000, n, m, G] at most
        chunks.append(
            _improvement(stratified_resamples(x, size, rng), stratified_resamples(y, size, rng))
        )
    return (point, *_percentiles(np.concatenate(chunks)))


def verdict(low: float, high: float) -> str:
    """The word for an interval of P(ours > theirs): "above", "below" or "level" (contains 0.5)."""
    if low > 0.5:
        return "above"
    if high < 0.5:
        return "below"
    return "level"


def estimates(
    summary: dict[str, Any], ours: Sequence[str], others: Sequence[str]
) -> dict[str, Any]:
    """Every number of the interval section, JSON-ready (see the module docstring)."""
    games = list(summary["games"])
    algos = [a for a in (*ours, *others) if any(final_scores(summary, a, g) for g in games)]
    reference = reference_scores(summary, others)
    per_game: dict[str, Any] = {}
    for game in games:
        rows = {}
        for algo in algos:
            scores = final_scores(summary, algo, game)
            if scores:
                column = np.array(list(scores.values()))[:, None]
                rows[algo] = {
                    "runs": len(scores),
                    "mean": interval(column, "mean"),
                    "iqm": interval(column, "iqm"),
                }
        per_game[game] = rows
    # a ratio to a reference of 0 or below is no normalisation: such a game is left out
    normalised = [g for g in games if reference.get(g, 0.0) > 0]
    aggregate, matrices, incomplete = {}, {}, []
    for algo in algos:
        matrix = score_matrix(summary, algo, normalised)
        if matrix is None:
            incomplete.append(algo)
            continue
        matrices[algo] = matrix / np.array([reference[g] for g in normalised])
        aggregate[algo] = {
            "runs": matrix.shape[0],
            "iqm": interval(matrices[algo], "iqm"),
            "mean": interval(matrices[algo], "mean"),
        }
    # P(X > Y) per game does not depend on a positive per-game scale: raw scores, over every
    # game where both have complete runs (the seeds complete on all of those).
    improvement = {}
    for mine in (a for a in ours if a in algos):
        for theirs in (p for p in others if p in algos):
            shared = [
                g
                for g in games
                if final_scores(summary, mine, g) and final_scores(summary, theirs, g)
            ]
            x, y = score_matrix(summary, mine, shared), score_matrix(summary, theirs, shared)
            if x is None or y is None:
                continue
            point, low, high = probability_of_improvement(x, y)
            improvement[f"{mine} > {theirs}"] = {
                "probability": (point, low, high),
                "verdict": verdict(low, high),
                "games": len(shared),
            }
    return {
        "reps": REPS,
        "reference": reference,
        "per_game_improvement": per_game_improvement(summary, ours, others),
        "normalised_games": normalised,
        "left_out": [g for g in games if g in reference and g not in normalised],
        "per_game": per_game,
        "aggregate": aggregate,
        "aggregate_left_out": incomplete,
        "improvement": improvement,
        "profiles": _profiles(matrices),
    }


def per_game_improvement(
    summary: dict[str, Any], ours: Sequence[str], others: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """``"ours > theirs" → game →`` P(ours > theirs) on that game's complete runs and its verdict.

    One game at a time, so the seeds need not match (the two sides are resampled
    independently); a pair appears where both have complete runs on at least one game.
    """
    out: dict[str, dict[str, Any]] = {}
    for mine in ours:
        for theirs in others:
            games = {}
            for game in summary["games"]:
                x, y = final_scores(summary, mine, game), final_scores(summary, theirs, game)
                if not x or not y:
                    continue
                column = (np.array(list(x.values()))[:, None], np.array(list(y.values()))[:, None])
                point, low, high = probability_of_improvement(*column)
                games[game] = {"probability": (point, low, high), "verdict": verdict(low, high)}
            if games:
                out[f"{mine} > {theirs}"] = games
    return out


def _profiles(matrices: dict[str, np.ndarray]) -> dict[str, Any]:
    """Run-score performance profiles: the fraction of (run, game) scores above each τ."""
    if not matrices:
        return {}
    library, _ = _rliable()
    with _seeded():
        profiles, intervals = library.create_performance_profile(matrices, TAUS, reps=REPS // 5)
    return {
        "taus": TAUS.tolist(),
        "algorithms": {
            a: {
                "fraction": profiles[a].tolist(),
                "low": intervals[a][0].tolist(),
                "high": intervals[a][1].tolist(),
            }
            for a in matrices
        },
    }


def _ci(triple: Sequence[float], spec: str) -> str:
    point, low, high = triple
    return f"{point:{spec}} [{low:{spec}}, {high:{spec}}]"


def markdown(data: dict[str, Any], *, label: str = "game", spec: str = ".2f") -> list[str]:
    """The interval section of a results page (empty when no complete run is there)."""
    if not data["per_game"] or not any(data["per_game"].values()):
        return []
    lines = [
        "## Interval estimates and verdicts",
        "",
        'Over the complete runs above, with `rliable` (Agarwal et al., 2021, "Deep RL at the '
        'Edge of the Statistical Precipice"): 95% stratified bootstrap confidence intervals '
        f"({data['reps']:,} resamples of the seeds within each {label}), the interquartile mean "
        "(IQM) and the mean. Normalised score: a run's final score over the best other "
        f"library's mean final score on that {label} (so 1.00 = as good as the best of them). "
        "Verdicts compare our algorithms with each other library's by the probability of "
        "improvement P(ours > theirs): **above** where its "
        "interval lies above 0.5, **below** where it lies below, **level** where it contains "
        "0.5. With three runs a bootstrap can only recombine those three scores, so it "
        "understates the uncertainty: a verdict on three seeds is weaker than its interval.",
        "",
        f"| {label} | algorithm | runs | mean [95% CI] | IQM [95% CI] |",
        "|---|---|---|---|---|",
    ]
    for game, rows in data["per_game"].items():
        for algo, row in rows.items():
            lines.append(
                f"| {game} | {algo} | {row['runs']} | {_ci(row['mean'], spec)} | "
                f"{_ci(row['iqm'], spec)} |"
            )
    lines.append("")
    if data["aggregate"]:
        games = ", ".join(data["normalised_games"])
        left_out = data.get("left_out") or []
        skipped = (
            f" ({', '.join(left_out)} left out: its reference score is not positive)"
            if left_out
            else ""
        )
        lines += [
            f"Across {label}s ({games}){skipped}, normalised scores over the seeds complete on "
            f"every one of them:",
            "",
            "| algorithm | runs per " + label + " | IQM [95% CI] | mean [95% CI] |",
            "|---|---|---|---|",
        ]
        for algo, row in data["aggregate"].items():
            lines.append(
                f"| {algo} | {row['runs']} | {_ci(row['iqm'], '.2f')} | {_ci(row['mean'], '.2f')} |"
            )
        lines.append("")
        if data.get("aggregate_left_out"):
            missing = ", ".join(data["aggregate_left_out"])
            lines += [f"Not in the aggregate (no complete run on one of them): {missing}.", ""]
    if data["improvement"]:
        lines += [
            f"P(ours > theirs) on the raw scores of every {label} both have complete runs on "
            f"(a positive per-{label} scale does not change it):",
            "",
            f"| comparison | {label}s | P(ours > theirs) [95% CI] | verdict |",
            "|---|---|---|---|",
        ]
        for pair, row in data["improvement"].items():
            lines.append(
                f"| {pair} | {row['games']} | {_ci(row['probability'], '.2f')} | {row['verdict']} |"
            )
        lines.append("")
    per_game = data.get("per_game_improvement") or {}
    if per_game:
        names = list(dict.fromkeys(g for games in per_game.values() for g in games))
        lines += [
            f"Per {label}, the same verdict from that {label}'s runs alone (P(ours > theirs) in "
            f"brackets; with a few runs a side only a clean separation of the runs gives "
            f"**above** or **below**):",
            "",
            "| comparison | " + " | ".join(names) + " |",
            "|---" * (len(names) + 1) + "|",
        ]
        for pair, games in per_game.items():
            cells = (
                f"{games[g]['verdict']} ({games[g]['probability'][0]:.2f})" if g in games else "—"
                for g in names
            )
            lines.append(f"| {pair} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def plot(data: dict[str, Any], out: Path, title: str) -> Path | None:
    """IQM of normalised scores with intervals, beside the performance profiles."""
    if not data["aggregate"]:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    algos = list(data["aggregate"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 0.45 * len(algos) + 2.5))
    for i, algo in enumerate(algos):
        point, low, high = data["aggregate"][algo]["iqm"]
        left.errorbar(point, i, xerr=[[point - low], [high - point]], fmt="o", capsize=4)
    left.set_yticks(range(len(algos)), algos)
    left.axvline(1.0, color="grey", lw=0.8, ls="--")
    left.set_xlabel("IQM of normalised final score (95% CI)")
    left.invert_yaxis()
    profiles = data["profiles"]
    for algo, p in profiles.get("algorithms", {}).items():
        (line,) = right.plot(profiles["taus"], p["fraction"], label=algo)
        right.fill_between(
            profiles["taus"], p["low"], p["high"], alpha=0.15, color=line.get_color()
        )
    right.set_xlabel("normalised score τ")
    right.set_ylabel("fraction of runs with score > τ")
    right.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
