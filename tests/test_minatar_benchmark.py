"""benchmarks/minatar_grid.py: the summary, resumability and one tiny real run."""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ac_extensions.runtime import TrainingWarning
from tests._helpers import few_resamples, load_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "minatar_grid.py"


@pytest.fixture(scope="module")
def bench():
    for module in load_script(SCRIPT, "minatar_benchmark"):
        with few_resamples():
            yield module


def fake_run(directory: Path, algo: str, seed: int, *, final, curve, complete=True, fps=100.0):
    """A run directory as ac-train writes it: summary.json and frames,value CSVs.

    ``curve``: (frames, return_window, return_window_size, seconds) rows.
    """
    directory.mkdir(parents=True)
    summary = {
        "algorithm": algo,
        "env": "MinAtar/Breakout-v1",
        "seed": seed,
        "frames": curve[-1][0] if curve else 0,
        "frames_target": 3000,
        "complete": complete,
        "wall_seconds": curve[-1][3] if curve else 0.0,
        "fps": fps,
        "final_mean_return": final,
    }
    (directory / "summary.json").write_text(json.dumps(summary))
    scalars = directory / "logs" / algo / "scalars"
    for index, name in (
        (1, "train/return_window"),
        (2, "train/return_window_size"),
        (3, "time/seconds"),
    ):
        path = scalars / f"{name}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{row[0]},{row[index]}\n" for row in curve))


def make_grid(bench, root: Path) -> None:
    def d(algo, seed):
        return bench.Run("Breakout", algo, seed).directory(root)

    # SB3 baselines: sb3_dqn finals 4, 6, 5 (median 5: the target); sb3_ppo 2, 3 (seed 3 missing).
    for seed, final in ((1, 4.0), (2, 6.0), (3, 5.0)):
        fake_run(d("sb3_dqn", seed), "sb3_dqn", seed, final=final, curve=[(3000, final, 100, 10.0)])
    for seed, final in ((1, 2.0), (2, 3.0)):
        fake_run(d("sb3_ppo", seed), "sb3_ppo", seed, final=final, curve=[(3000, final, 100, 9.0)])
    # Ours: seed 1 reaches 5 at 2000 frames (2 s); seed 2 at 3000 (6 s: its 5.0 at 1000
    # frames has only 50 episodes in the window); seed 3 never, and is unfinished.
    fake_run(
        d("ppo", 1),
        "ppo",
        1,
        final=7.0,
        fps=100.0,
        curve=[(1000, 3.0, 100, 1.0), (2000, 5.5, 100, 2.0), (3000, 7.0, 100, 3.0)],
    )
    fake_run(
        d("ppo", 2),
        "ppo",
        2,
        final=6.0,
        fps=200.0,
        curve=[(1000, 5.0, 50, 2.0), (2000, 4.0, 100, 4.0), (3000, 6.0, 100, 6.0)],
    )
    fake_run(
        d("ppo", 3),
        "ppo",
        3,
        final=3.0,
        fps=300.0,
        complete=False,
        curve=[(1000, 1.0, 100, 1.0), (2000, 2.0, 100, 2.0), (2500, 3.0, 100, 2.5)],
    )


@pytest.mark.timeout(60)
def test_summary_of_fabricated_runs(bench, tmp_path):
    make_grid(bench, tmp_path)
    algos, seeds = ["ppo", "sb3_ppo", "sb3_dqn"], [1, 2, 3]
    summary = bench.summarize(tmp_path, ["Breakout"], algos, seeds)
    assert (summary["planned"], summary["present"], summary["complete"]) == (9, 8, 7)
    game = summary["games"]["Breakout"]
    assert game["target"] == {"algorithm": "sb3_dqn", "return": 5.0}
    ppo = game["algorithms"]["ppo"]
    assert (ppo["seeds"], ppo["unfinished"]) == (3, 1)
    assert (ppo["final_median"], ppo["final_min"], ppo["final_max"]) == (6.0, 3.0, 7.0)
    assert ppo["frames_median"] == 3000  # frames reached: 3000, 3000, 2500
    # frames to 5: 2000, 3000, never → median 3000; seconds 2, 6, never → 6.
    assert (ppo["target_reached"], ppo["frames_to_target"], ppo["seconds_to_target"]) == (
        2,
        3000,
        6.0,
    )
    assert ppo["fps_median"] == 200.0
    dqn = game["algorithms"]["sb3_dqn"]
    assert (dqn["final_median"], dqn["final_min"], dqn["final_max"]) == (5.0, 4.0, 6.0)
    assert (dqn["target_reached"], dqn["frames_to_target"]) == (2, 3000)  # never, 3000, 3000
    sb3 = game["algorithms"]["sb3_ppo"]
    assert (sb3["seeds"], sb3["final_median"]) == (2, 2.5)
    assert (sb3["target_reached"], sb3["frames_to_target"], sb3["seconds_to_target"]) == (
        0,
        None,
        None,
    )

    results = tmp_path / "out"
    results.mkdir()
    (results / "minatar.md").write_text("old table\n\n## Notes\n\nhand-written\n")
    args = bench.build_parser().parse_args(
        ["--games", "Breakout", "--algos", *algos, "--seeds", "1", "2", "3", "--frames", "3000"]
    )
    args.results = results
    md = bench.write_results(summary, args).read_text()
    assert "Runs present: 8 of the command's 9 (7 complete): partial results." in md
    assert (
        "| ppo | 3/3 (partial: 1 unfinished) | 6.00 | 3.00–7.00 | 3,000 | 3,000 (2 reached) " in md
    )
    assert "| sb3_ppo | 2/3 | 2.50 | 2.00–3.00 | 3,000 | — (0 reached) | — |" in md
    assert "| DQN, MinAtar paper¹ | 30 | ≈10 | — | 5,000,000 |" in md
    assert "| AC(λ=0.8), MinAtar paper¹ | 30 | ≈17.5 |" in md
    assert "≈, read from the plot in the MinAtar repository, 5M frames, full action set" in md
    assert md.endswith("## Notes\n\nhand-written\n") and "old table" not in md
    assert "Goal" not in md  # the page reports; verdicts are not tied to planning
    saved = json.loads((results / "minatar.json").read_text())
    assert saved["games"]["Breakout"]["algorithms"]["ppo"]["frames_to_target"] == 3000
    assert (results / "minatar.png").stat().st_size > 0


@pytest.mark.timeout(60)
def test_complete_only_leaves_out_the_runs_under_way(bench, tmp_path):
    make_grid(bench, tmp_path)  # ppo seed 3 is unfinished (final 3.0)
    algos, seeds = ["ppo", "sb3_ppo", "sb3_dqn"], [1, 2, 3]
    summary = bench.summarize(tmp_path, ["Breakout"], algos, seeds, complete_only=True)
    assert (summary["planned"], summary["present"], summary["complete"]) == (9, 7, 7)
    ppo = summary["games"]["Breakout"]["algorithms"]["ppo"]
    assert (ppo["seeds"], ppo["unfinished"], ppo["final_median"]) == (2, 0, 6.5)
    args = bench.build_parser().parse_args(
        ["--algos", *algos, "--seeds", "1", "2", "3", "--frames", "3000", "--complete-only"]
    )
    assert args.complete_only
    md = bench.markdown(summary, args)
    # the command, as run
    assert "--frames 3000 --complete-only` (`make bench-minatar` runs its seeds 1–3" in md
    assert "sb3-contrib (sb3_ppo, sb3_dqn) with" in md  # the command's, not all known


@pytest.mark.timeout(60)
def test_a_run_of_part_of_the_grid_keeps_the_other_runs_in_the_summary(
    bench, tmp_path, monkeypatch
):
    make_grid(bench, tmp_path)  # Breakout: ppo, sb3_ppo, sb3_dqn
    started = []
    monkeypatch.setattr(bench, "require", lambda modules, extra: None)
    monkeypatch.setattr(bench, "run_grid", lambda runs, args: started.extend(runs) or 0)
    part = ["--results", str(tmp_path), "--frames", "3000", "--complete-only"]
    part += ["--games", "Freeway", "--algos", "sb3_dqn_paper", "ppo", "--seeds", "4"]
    assert bench.main(part) == 0
    assert started == [bench.Run("Freeway", "sb3_dqn_paper", 4), bench.Run("Freeway", "ppo", 4)]
    md = (tmp_path / "minatar.md").read_text()
    grid = " ".join(bench.GRID)  # the whole grid, in its order, and the selection's extra one
    games = " ".join(bench.GAMES)
    assert f"--games {games} --algos {grid} sb3_dqn_paper --seeds 1 2 3 4 --frames 3000" in md
    assert "Runs present: 7 of the command's 200 (7 complete)" in md  # 5 games x 10 algos x 4 seeds
    assert "| sb3_dqn | 3/4 | 5.00 | 4.00–6.00 |" in md
    assert "| ppo | 2/4 | 6.50 |" in md

    # --summary-only tabulates the selection it is given, literally
    assert bench.main([*part, "--summary-only"]) == 0
    md = (tmp_path / "minatar.md").read_text()
    assert "--games Freeway --algos sb3_dqn_paper ppo --seeds 4 --frames 3000" in md
    assert "Runs present: 0 of the command's 2" in md and "sb3_dqn |" not in md


@pytest.mark.timeout(60)
def test_off_policy_learners_against_our_ppo(bench, tmp_path):
    make_grid(bench, tmp_path)

    def d(algo, seed):
        return bench.Run("Breakout", algo, seed).directory(tmp_path)

    # Complete PPO runs: finals 7 and 6 (target 6.5; seed 3 is unfinished and left out),
    # wall seconds 3 and 6 (median 4.5). ACER seed 1 reaches 6.5 at 1000 frames (1.5 s),
    # seed 2 at 2000 frames (3 s; its 6.6 at 1000 frames has only 99 episodes).
    fake_run(d("acer", 1), "acer", 1, final=8.0, curve=[(1000, 6.6, 100, 1.5), (2000, 8.0, 100, 4)])
    fake_run(d("acer", 2), "acer", 2, final=7.0, curve=[(1000, 6.6, 99, 2.0), (2000, 7, 100, 3.0)])
    summary = bench.summarize(tmp_path, ["Breakout"], ["ppo", "acer", "sb3_dqn"], [1, 2, 3])
    versus = summary["games"]["Breakout"]["against_ppo"]
    assert (versus["return"], versus["seconds"]) == (6.5, 4.5)
    acer = versus["algorithms"]["acer"]
    assert (acer["target_reached"], acer["frames_to_target"], acer["seconds_to_target"]) == (
        2,
        1500,
        2.25,
    )
    assert acer["vs_ppo"] == 0.5
    assert "reactor" not in versus["algorithms"]  # no run of it
    lines = "\n".join(bench.against_ppo_table(summary))
    assert "| Breakout | 6.50 | 4 | acer | 1,500 (2 of 2 reached) | 2 | 0.50× |" in lines
    # Without a complete PPO run there is no target, and no table.
    alone = bench.summarize(tmp_path, ["Breakout"], ["acer", "sb3_dqn"], [1, 2])
    assert alone["games"]["Breakout"]["against_ppo"] is None
    assert bench.against_ppo_table(alone) == []


@pytest.mark.timeout(60)
def test_complete_runs_are_skipped_and_unfinished_resumed(bench, tmp_path, monkeypatch):
    def d(seed):
        return bench.Run("Breakout", "ppo", seed).directory(tmp_path)

    fake_run(d(1), "ppo", 1, final=7.0, curve=[(3000, 7.0, 100, 3.0)])
    (d(1) / "checkpoints").mkdir()
    (d(1) / "checkpoints" / "latest").write_text("ckpt-3\n")
    fake_run(d(2), "ppo", 2, final=1.0, complete=False, curve=[(1000, 1.0, 100, 1.0)])
    (d(2) / "checkpoints").mkdir()
    (d(2) / "checkpoints" / "latest").write_text("ckpt-1\n")
    calls = []

    def execute(run, results, frames, how, timeout):
        calls.append((run.seed, how, frames))
        summary = {"complete": True, "frames": frames, "fps": 1.0, "final_mean_return": 2.0}
        return {"status": "ok", "seconds": 0.0, "summary": summary}

    monkeypatch.setattr(bench, "execute", execute)
    argv = ["--games", "Breakout", "--algos", "ppo", "--seeds", "1", "2", "3"]
    status = bench.main([*argv, "--frames", "3000", "--jobs", "1", "--results", str(tmp_path)])
    assert status == 0
    assert sorted(calls) == [(2, "resume", 3000), (3, "fresh", 3000)]
    assert not (d(1) / "checkpoints").exists()  # a finished run's checkpoints are pruned
    # A larger budget makes a complete run due again (extended with --resume when it can).
    assert bench.action(bench.Run("Breakout", "ppo", 1), tmp_path, 3000) == "done"
    assert bench.action(bench.Run("Breakout", "ppo", 1), tmp_path, 6000) == "fresh"
    assert bench.action(bench.Run("Breakout", "sb3_dqn", 2), tmp_path, 3000) == "fresh"

    ours = bench.command(bench.Run("Breakout", "ppo", 3), tmp_path, 3000, "fresh")
    assert Path(ours[0]).name == "ac-train"
    assert ours[1:] == [
        "ppo",
        *("--env", "MinAtar/Breakout-v1", "--frames", "3000", "--seed", "3"),
        *("--return-window", "100", "--out", str(d(3))),
        *("--checkpoint-minutes", "5"),
    ]
    resumed = bench.command(bench.Run("Breakout", "ppo", 2), tmp_path, 3000, "resume")
    assert resumed[1:] == [
        *("ppo", "--resume", str(d(2)), "--frames", "3000"),
        *("--checkpoint-minutes", "5"),
    ]


@pytest.mark.timeout(60)
def test_runs_start_seed_by_seed_so_a_stopped_grid_covers_every_game(bench, tmp_path, monkeypatch):
    started = []

    def execute(run, results, frames, how, timeout):
        started.append(str(run))
        summary = {"complete": True, "frames": frames, "fps": 1.0, "final_mean_return": 2.0}
        return {"status": "ok", "seconds": 0.0, "summary": summary}

    monkeypatch.setattr(bench, "execute", execute)
    argv = ["--games", "Breakout", "Asterix", "--algos", "ppo", "acer", "--seeds", "1", "2"]
    status = bench.main([*argv, "--frames", "3000", "--jobs", "1", "--results", str(tmp_path)])
    assert status == 0
    assert started == [
        "Breakout ppo seed 1",
        "Breakout acer seed 1",
        "Asterix ppo seed 1",
        "Asterix acer seed 1",
        "Breakout ppo seed 2",
        "Breakout acer seed 2",
        "Asterix ppo seed 2",
        "Asterix acer seed 2",
    ]
    # The tables keep the games' order, whatever order the runs ran in.
    assert [str(r) for r in bench.plan(["Breakout"], ["ppo"], [2, 1])] == [
        "Breakout ppo seed 2",
        "Breakout ppo seed 1",
    ]


def test_a_run_another_invocation_holds_is_left_alone(bench, tmp_path, monkeypatch):
    # Another grid invocation (here: another process holding the flock) is writing seed 1.
    d1 = bench.Run("Breakout", "ppo", 1).directory(tmp_path)
    fake_run(d1, "ppo", 1, final=1.0, complete=False, curve=[(1000, 1.0, 100, 1.0)])
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(d1.parent / f".{d1.name}.lock")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        started = []
        monkeypatch.setattr(
            bench.scheduler, "run_process", lambda cmd, d, t: started.append(d) or OK
        )
        argv = ["--games", "Breakout", "--algos", "ppo", "--seeds", "1", "2", "--jobs", "2"]
        status = bench.main([*argv, "--frames", "3000", "--results", str(tmp_path)])
        assert status == 0  # skipped, not failed
        assert started == [bench.Run("Breakout", "ppo", 2).directory(tmp_path)]
        assert (d1 / "summary.json").is_file()  # a "fresh" start would have deleted it
    finally:
        holder.kill()
        holder.wait()
    # Once the holder is gone (killed: flock releases with the process), the run is ours.
    with bench.claimed(d1) as mine:
        assert mine
        with bench.claimed(d1) as again:  # a second open file description is refused
            assert not again


def test_a_run_another_invocation_ran_since_planning_is_not_emptied(bench, tmp_path, monkeypatch):
    """Planned as fresh, then finished (or checkpointed) by a second grid before the lock."""
    started = []
    monkeypatch.setattr(bench.scheduler, "run_process", lambda cmd, d, t: started.append(cmd) or OK)
    finished, stopped = bench.Run("Breakout", "ppo", 1), bench.Run("Breakout", "ppo", 2)
    assert bench.action(finished, tmp_path, 3_000) == "fresh"  # what run_grid planned
    assert bench.action(stopped, tmp_path, 3_000) == "fresh"
    # ... and meanwhile another invocation finished one and left a checkpoint in the other:
    summary = {"complete": True, "frames": 3_000, "frames_target": 3_000}
    finished.directory(tmp_path).mkdir(parents=True)
    (finished.directory(tmp_path) / "summary.json").write_text(json.dumps(summary))
    checkpoints = stopped.directory(tmp_path) / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "latest").write_text("ckpt-1000\n")
    result = bench.execute(finished, tmp_path, 3_000, "fresh", 60)
    assert result["status"] == bench.FINISHED_ELSEWHERE and not bench.failed(result["status"])
    assert started == [] and (finished.directory(tmp_path) / "summary.json").is_file()
    assert bench.execute(stopped, tmp_path, 3_000, "fresh", 60)["status"] == "ok"
    assert "--resume" in started[0] and (checkpoints / "latest").is_file()  # resumed, kept
    # Planned as a resume, but the checkpoint is gone: it starts again from an empty directory.
    (checkpoints / "latest").unlink()
    assert bench.execute(stopped, tmp_path, 3_000, "resume", 60)["status"] == "ok"
    assert "--resume" not in started[1] and not checkpoints.exists()


def _complete(directory: Path, frames: int, seconds, complete=True, target=1_000_000) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    summary = {"complete": complete, "frames": frames, "frames_target": target}
    (directory / "summary.json").write_text(json.dumps(summary | {"wall_seconds": seconds}))


def test_the_time_a_run_needs_is_estimated_from_the_complete_runs_beside_it(bench, tmp_path):
    root = tmp_path / "minatar" / "runs"
    _complete(root / "Breakout" / "acer" / "seed1", 1_000_000, 1_000.0)  # 1 ms a frame
    _complete(root / "Breakout" / "acer" / "seed2", 1_000_000, 3_000.0)  # 3 ms a frame
    _complete(root / "Breakout" / "acer" / "seed4", 500_000, 99_999.0, complete=False)
    _complete(root / "Breakout" / "acer" / "seed5", 20_000, 9_999.0, target=20_000)  # smoke
    _complete(root / "Breakout" / "acer" / "seed6", 1_000_000, None)  # no clock: skipped
    _complete(root / "Asterix" / "acer" / "seed1", 1_000_000, 8_000.0)
    _complete(root / "Breakout" / "acer" / "seed3", 250_000, 600.0, complete=False)
    seed3 = root / "Breakout" / "acer" / "seed3"
    # Same game first: median 2 ms a frame × the 750,000 frames seed 3 has left ...
    assert bench.estimate_seconds(seed3, 1_000_000, fresh=False) == 1_500.0
    # ... or × all 1M when it starts again (no checkpoint: its summary's frames do not count).
    assert bench.estimate_seconds(seed3, 1_000_000, fresh=True) == 2_000.0
    # No complete run on Freeway: every game's (1, 3, 8 ms a frame: median 3) × 1M frames.
    assert bench.estimate_seconds(root / "Freeway" / "acer" / "seed1", 1_000_000, True) == 3_000
    assert bench.estimate_seconds(root / "Breakout" / "ppo" / "seed1", 1_000_000, True) is None
    # At 2M frames no run is complete at that budget: nothing to estimate from.
    assert bench.estimate_seconds(seed3, 2_000_000, fresh=True) is None
    # The MuJoCo grid's layout is the same depth: <results>/mujoco/runs/<Task>/<algo>/seed<N>.
    task = tmp_path / "mujoco" / "runs" / "Hopper" / "acer"
    _complete(task / "seed1", 1_000_000, 7_000.0)
    assert bench.estimate_seconds(task / "seed2", 1_000_000, fresh=True) == 7_000.0


def test_a_deadline_starts_only_what_fits_and_stops_in_time_to_save(bench, tmp_path):
    root = tmp_path / "minatar" / "runs"
    _complete(root / "Breakout" / "acer" / "seed1", 1_000_000, 2_000_000.0)  # 2 s a frame
    now, timeouts = [0.0], {}

    def execute_run(run, results, frames, how, timeout):  # runs until its timeout stops it
        timeouts[run.algo], now[0] = timeout, now[0] + timeout
        return {"status": f"timeout after {timeout:.0f} s", "seconds": timeout, "summary": None}

    start = bench.scheduler._within_deadline(execute_run, deadline=1_000.0, clock=lambda: now[0])
    reserve = bench.scheduler.STOP_GRACE_SECONDS + 30  # 120 s kept to stop and save
    # 3,000 frames × 2 s = 6,000 s > the 880 s usable: not started.
    status = start(bench.Run("Breakout", "acer", 2), tmp_path, 3_000, "fresh", 3_600)["status"]
    assert (
        status == bench.DEADLINE_SKIPPED + " (needs about 1 h 40 min, 15 min left before stopping)"
    )
    assert "acer" not in timeouts
    # Nothing to estimate ppo from: it starts, its timeout cut to 880 s, and is stopped there.
    status = start(bench.Run("Breakout", "ppo", 2), tmp_path, 3_000, "fresh", 3_600)["status"]
    assert timeouts["ppo"] == 1_000.0 - reserve and status == bench.DEADLINE_STOPPED
    # 120 s before the deadline nothing starts any more.
    status = start(bench.Run("Breakout", "a2c", 2), tmp_path, 3_000, "fresh", 3_600)["status"]
    assert status == bench.DEADLINE_SKIPPED + " (0 s left before stopping)"
    # A run's own shorter timeout is still a failure, however close the deadline.
    now[0] = 800.0
    status = start(bench.Run("Breakout", "a2c", 3), tmp_path, 3_000, "fresh", 60)["status"]
    assert status == "timeout after 60 s" and bench.failed(status)
    assert not any(map(bench.failed, (bench.DEADLINE_STOPPED, bench.DEADLINE_SKIPPED + " (x)")))
    assert bench.failed("failed (exit 1)") and not bench.failed("ok")
    options = dict(jobs=1, timeout=None, frames=3_000, frames_per_timeout_second=10)
    with pytest.raises(SystemExit, match="--deadline-minutes must be > 0, got 0"):
        bench.prepare(argparse.Namespace(**options, results=tmp_path, deadline_minutes=0))
    before = time.monotonic()
    args = bench.prepare(argparse.Namespace(**options, results=tmp_path, deadline_minutes=2))
    assert before + 120 <= args.deadline <= time.monotonic() + 120


def test_a_progress_line_reads_frames_fps_return_and_time_left(bench):
    run = bench.Run("Breakout", "acer", 1)
    summary = {"frames": 412_000, "fps": 196.0, "final_mean_return": 8.123}
    # (1,000,000 − 412,000) / 196 = 3,000 s left: 50 min.
    assert bench.progress_line(run, summary, 1_000_000) == (
        "  … Breakout acer seed 1: 41% 412,000/1,000,000 frames, 196 fps, 50 min left, return 8.12"
    )
    summary |= {"frames": 100_000, "fps": 20.0, "final_mean_return": None}  # 45,000 s left
    assert bench.progress_line(run, summary, 1_000_000).endswith(
        ": 10% 100,000/1,000,000 frames, 20 fps, 12 h 30 min left, return —"
    )
    assert bench.progress_line(run, None, 1_000_000) == "  … Breakout acer seed 1: starting"
    assert bench.scheduler._duration(40.4) == "40 s" and bench.scheduler._duration(59.6) == "1 min"


def test_a_result_line_gives_seconds_only_for_runs_this_invocation_started(bench, tmp_path):
    run = bench.Run("Breakout", "acer", 1)
    summary = {"frames": 1_000_000, "fps": 1231.4, "final_mean_return": 9.6512}
    ran = {"status": "ok", "seconds": 812.2, "summary": summary}
    assert bench.describe(run, ran) == (
        "Breakout acer seed 1: ok in 812 s (1,000,000 frames, 1,231 fps, return 9.65)"
    )
    # Left for later: no summary yet, so no "in 0 s (0 frames, ...)".
    skipped = bench.scheduler._not_run(bench.DEADLINE_SKIPPED + " (5 min left)", tmp_path / "none")
    assert bench.describe(run, skipped) == (
        f"Breakout acer seed 1: {bench.DEADLINE_SKIPPED} (5 min left)"
    )
    # Finished by another invocation: what its summary says, without seconds of ours.
    d = run.directory(tmp_path)
    fake_run(d, "acer", 1, final=9.6512, complete=True, curve=[(1000, 9.6512, 100, 1.0)])
    elsewhere = bench.scheduler._not_run(bench.FINISHED_ELSEWHERE, d)
    line = bench.describe(run, elsewhere)
    assert line.startswith(f"Breakout acer seed 1: {bench.FINISHED_ELSEWHERE} (its summary: ")
    assert "return 9.65)" in line and " in 0 s" not in line


@pytest.mark.timeout(60)
def test_the_grid_reports_each_run_in_flight_while_it_runs(bench, tmp_path, monkeypatch):
    release, reports = threading.Event(), []

    def progress_line(run, summary, target, unit="frames"):
        reports.append((str(run), summary["frames"], target, unit))
        if len(reports) >= 2:
            release.set()
        return "  … (progress)"

    monkeypatch.setattr(bench.scheduler, "progress_line", progress_line)

    def execute_run(run, results, frames, how, timeout):
        directory = run.directory(results)
        directory.mkdir(parents=True)
        summary = {"frames": 1_500, "fps": 100.0, "final_mean_return": 2.5, "complete": False}
        (directory / "summary.json").write_text(json.dumps(summary))
        assert release.wait(30)  # released by two reports
        return {"status": "ok", "seconds": 1.0, "summary": summary | {"complete": True}}

    args = argparse.Namespace(results=tmp_path, frames=3_000, timeout=60, jobs=1)
    args.keep_checkpoints, args.progress_minutes = False, 0.002  # every 0.12 s
    run = bench.Run("Breakout", "ppo", 1)
    assert bench.run_grid([run], args, execute_run=execute_run) == 0
    assert reports[:2] == [("Breakout ppo seed 1", 1_500, 3_000, "frames")] * 2
    count = len(reports)
    time.sleep(0.4)  # three report periods
    assert len(reports) == count  # the reporter ended with the grid


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_stops_the_live_run_and_starts_no_other(bench, tmp_path, monkeypatch, sig):
    monkeypatch.setattr(bench.scheduler, "_STOPPING", threading.Event())
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    monkeypatch.setattr(bench, "command", lambda run, results, frames, how: sleeper)
    live: list[subprocess.Popen] = []

    def signal_once_a_run_is_live():
        deadline = time.monotonic() + 30
        while not bench.scheduler._LIVE and time.monotonic() < deadline:
            time.sleep(0.05)
        live.extend(bench.scheduler._LIVE)
        os.kill(os.getpid(), sig)

    threading.Thread(target=signal_once_a_run_is_live, daemon=True).start()
    runs = [bench.Run("Breakout", "ppo", seed) for seed in (1, 2, 3)]
    args = argparse.Namespace(results=tmp_path, frames=3000, timeout=120, jobs=1)
    args.keep_checkpoints = False
    with pytest.raises(SystemExit) as stopped:
        bench.run_grid(runs, args)
    assert stopped.value.code == 130
    assert len(live) == 1 and live[0].poll() is not None  # stopped with the grid
    started = [r.seed for r in runs if (r.directory(tmp_path) / "output.log").exists()]
    assert started == [1]
    assert signal.getsignal(sig) is not None and not bench.scheduler._LIVE
    # A thread that reaches run_process after the signal starts nothing.
    assert bench.run_process(sleeper, tmp_path, 5)["status"] == bench.STOPPED


SAVES_ON_SIGTERM = """
import pathlib, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # a worker
pathlib.Path(sys.argv[1]).write_text(str(child.pid))
def stop(signum, frame):
    time.sleep(0.5)  # the batch in progress and its checkpoint
    pathlib.Path(sys.argv[2]).write_text("saved")
    sys.exit(143)  # its worker left behind, as a hung collector shutdown would
signal.signal(signal.SIGTERM, stop)
time.sleep(60)
"""


@pytest.mark.timeout(60)
def test_stopping_runs_lets_each_save_then_kills_what_is_left(bench, tmp_path, monkeypatch):
    """SIGTERM to each run's own process, time to save, then SIGKILL to the rest of its group."""
    monkeypatch.setattr(bench.scheduler, "STOP_GRACE_SECONDS", 3)
    saver = subprocess.Popen(
        [sys.executable, "-c", SAVES_ON_SIGTERM, str(tmp_path / "pid"), str(tmp_path / "saved")],
        start_new_session=True,
    )
    deaf = subprocess.Popen(  # ignores SIGTERM: killed after the grace
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, "
            "signal.SIG_IGN); print('ready', flush=True); time.sleep(60)",
        ],
        start_new_session=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert deaf.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 30
    while not (tmp_path / "pid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    worker = int((tmp_path / "pid").read_text())
    start = time.monotonic()
    bench.scheduler._stop_runs([saver, deaf])
    assert saver.returncode == 143 and (tmp_path / "saved").read_text() == "saved"
    assert deaf.returncode == -signal.SIGKILL and time.monotonic() - start >= 2.5
    deadline = time.monotonic() + 10
    while Path(f"/proc/{worker}").exists() and time.monotonic() < deadline:
        status = Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if status == "Z":  # killed, waiting for its (gone) parent's reaper
            break
        time.sleep(0.05)
    stat = Path(f"/proc/{worker}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"


HOLD_LOCK = """
import fcntl, sys, time
f = open(sys.argv[1], "w")
fcntl.flock(f, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(60)
"""
OK = {"status": "ok", "seconds": 0.0, "summary": {"complete": True, "frames": 3000}}


@pytest.mark.timeout(120)
def test_tiny_real_grid(bench, tmp_path):
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("minatar")
    argv = ["--games", "Breakout", "--algos", "ppo", "sb3_dqn", "--seeds", "1"]
    assert bench.main([*argv, "--frames", "3000", "--results", str(tmp_path)]) == 0
    for algo in ("ppo", "sb3_dqn"):
        run = bench.Run("Breakout", algo, 1).directory(tmp_path)
        summary = json.loads((run / "summary.json").read_text())
        assert summary["complete"] and summary["frames"] >= 3000, algo
        assert summary["final_mean_return"] is not None
        assert (run / "logs" / algo / "scalars" / "train" / "return_window.csv").is_file()
    data = json.loads((tmp_path / "minatar.json").read_text())
    # the summary of the whole grid, the two runs of this one present in it
    assert (data["planned"], data["present"], data["complete"]) == (135, 2, 2)
    assert data["grid"]["games"] == list(bench.GAMES) and data["grid"]["seeds"] == [1, 2, 3]


def test_sb3_a2c_has_the_zoo_settings_and_runs(bench, tmp_path):
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("minatar")
    settings = bench.sb3_settings("sb3_a2c", 1_600)
    assert (settings["n_steps"], settings["vf_coef"], settings["ent_coef"]) == (5, 0.25, 0.01)
    assert settings["learning_rate"] == 7e-4 and settings["gae_lambda"] == 1.0
    assert settings["policy_kwargs"]["optimizer_kwargs"] == {"eps": 1e-5}
    assert "sb3_a2c" in bench.SB3_ALGOS
    out = bench.Run("Breakout", "sb3_a2c", 1).directory(tmp_path)
    summary = bench.train_sb3("sb3_a2c", "Breakout", 1, 1_600, out)
    assert summary["complete"] and summary["frames"] >= 1_600  # 16 envs × 5 steps per update
    assert (out / "logs" / "sb3_a2c" / "scalars" / "train" / "return_window.csv").is_file()


def test_sb3_dqns_update_every_four_frames_but_the_paper_rate_one_every_frame(bench):
    pytest.importorskip("stable_baselines3")
    dqn, paper, qrdqn = (
        bench.sb3_settings(algo, 1_000_000) for algo in ("sb3_dqn", "sb3_dqn_paper", "sb3_qrdqn")
    )
    assert (dqn["train_freq"], paper["train_freq"], qrdqn["train_freq"]) == (4, 1, 4)
    # sb3_dqn and sb3_dqn_paper differ in the update rate only (as the runs record them).
    dqn_recorded, paper_recorded = bench.jsonable(dqn), bench.jsonable(paper)
    assert dqn_recorded.pop("train_freq") == 4 and paper_recorded.pop("train_freq") == 1
    assert dqn_recorded == paper_recorded
    shared = ("buffer_size", "batch_size", "learning_rate", "learning_starts", "gamma")
    assert all(dqn[k] == qrdqn[k] for k in (*shared, "target_update_interval"))
    assert qrdqn["policy_kwargs"]["n_quantiles"] == 51  # Reactor's atom count
    assert qrdqn["policy_kwargs"]["optimizer_kwargs"] == {"eps": 0.01 / 32}


def test_the_paper_rate_sb3_dqn_runs_by_name_only(bench):
    """``sb3_dqn_paper`` is an SB3 baseline --algos takes, outside the default grid and its gaps."""
    assert "sb3_dqn_paper" in bench.SB3_ALGOS and "sb3_dqn_paper" not in bench.GRID
    assert bench.build_parser().parse_args([]).algos == list(bench.GRID)
    assert bench.build_parser().parse_args(["--algos", "sb3_dqn_paper"]).algos == ["sb3_dqn_paper"]
    command = bench.command(bench.Run("Breakout", "sb3_dqn_paper", 1), Path("r"), 100, "fresh")
    assert command[-6:-1] == ["--child", "sb3_dqn_paper", "Breakout", "1", "100"]


def sigterm_once(summary: Path, frames: int, deadline: float = 60.0) -> threading.Thread:
    """A thread that sends this process SIGTERM once ``summary`` reports ``frames`` or more.

    What the grid does to an SB3 run it stops (``_stop_runs``), without a second process. It only
    signals while a handler other than the default one is installed (the SB3 run's), so a run that
    ends first fails its test instead of killing pytest.
    """

    def watch():
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            try:
                reached = json.loads(summary.read_text())["frames"] >= frames
            except (OSError, ValueError, KeyError):
                reached = False
            if reached:
                if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
                    os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def csv_rows(run: Path, algo: str, name: str) -> list[tuple[float, float]]:
    text = (run / "logs" / algo / "scalars" / f"{name}.csv").read_text()
    return [tuple(map(float, line.split(","))) for line in text.splitlines() if line.strip()]


def test_sb3_checkpoint_restores_parameters_optimizer_counters_replay_and_log(bench, tmp_path):
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("minatar")
    import torch

    settings = bench.sb3_settings("sb3_dqn", 3_000) | {"buffer_size": 1_000}
    settings["learning_starts"] = 500
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the SB3 baselines run (much faster beside other jobs)
    try:
        check_roundtrip(bench, tmp_path, settings)
    finally:
        torch.set_num_threads(threads)


def check_roundtrip(bench, tmp_path, settings):
    """Save a trained DQN and its log, restore both into fresh ones, compare everything."""
    import numpy as np
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_vec_env

    from ac_extensions.runtime.envs import make_gym_env

    def build(out):
        env = make_vec_env(lambda: make_gym_env("MinAtar/Breakout-v1"), n_envs=1, seed=1)
        model = DQN("MlpPolicy", env, seed=1, device="cpu", **settings)
        return model, bench.SB3Log(out, "sb3_dqn", "MinAtar/Breakout-v1", 1, 3_000, {})

    model, log = build(tmp_path)
    model.learn(600)  # 100 updates after learning starts: optimiser state to restore
    for r in (1.0, 2.0, 4.0):
        log.episode(r)
    log.step(model.num_timesteps, force=True)
    log.step(model.num_timesteps + 500, force=True)  # a row the stopped run wrote after saving
    log.frames = model.num_timesteps
    checkpoint = bench.SB3Checkpoint(tmp_path)
    assert checkpoint.latest() is None and checkpoint.saved_frames() == 0
    assert checkpoint.save(model, log, final=False) is None  # not `every` seconds yet
    path = checkpoint.save(model, log)
    assert checkpoint.latest() == path and checkpoint.saved_frames() == 600
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "ckpt-000000600"
    assert sorted(p.name for p in path.iterdir()) == ["model.zip", "replay.pkl", "state.pt"]

    other, other_log = build(tmp_path)
    assert bench.SB3Checkpoint(tmp_path / "nothing").restore(other, other_log) == 0
    assert checkpoint.restore(other, other_log) == 600
    loaded = other.policy.state_dict()
    for name, value in model.policy.state_dict().items():  # q_net and q_net_target
        assert torch.equal(value, loaded[name]), name
    saved_opt, loaded_opt = model.policy.optimizer.state_dict(), other.policy.optimizer.state_dict()
    assert saved_opt["state"].keys() == loaded_opt["state"].keys() and saved_opt["state"]
    for key, state in saved_opt["state"].items():
        for name, value in state.items():
            assert torch.equal(
                torch.as_tensor(value), torch.as_tensor(loaded_opt["state"][key][name])
            )
    assert other.num_timesteps == 600
    assert (other._n_calls, other._episode_num) == (model._n_calls, model._episode_num)
    assert other._n_calls == 600 and other._n_updates == model._n_updates > 0
    assert (other.replay_buffer.pos, other.replay_buffer.full) == (600, False)
    assert np.array_equal(other.replay_buffer.observations, model.replay_buffer.observations)
    assert np.array_equal(other.replay_buffer.actions, model.replay_buffer.actions)
    assert list(other_log.window) == [1.0, 2.0, 4.0] and other_log.episodes == 3
    assert other_log.resumed_at == [600]
    # The CSV row past the checkpoint is dropped: the resumed run writes those frames again.
    assert [f for f, _ in csv_rows(tmp_path, "sb3_dqn", bench.CURVE)] == [600.0]
    # A newer checkpoint replaces the older one.
    other.learn(100, reset_num_timesteps=False)
    assert checkpoint.save(other, other_log).name == "ckpt-000000700"
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["ckpt-000000700", "latest"]


def test_an_sb3_checkpoint_that_cannot_be_written_keeps_the_previous_one(bench, tmp_path):
    """A periodic SB3 checkpoint save that fails (a full disk) warns and keeps the older checkpoint.

    A stand-in for the SB3 model (SB3Checkpoint only calls its ``save``), so this runs where
    stable-baselines3 is not installed (CI).
    """

    class Model:  # what SB3Checkpoint.save reads of an SB3 model
        replay_buffer = None

        def __init__(self, frames, fail=False):
            self.num_timesteps, self.fail = frames, fail

        def save(self, path):
            if self.fail:
                raise OSError(errno.ENOSPC, "No space left on device")
            Path(path).write_bytes(b"model")

    log = bench.SB3Log(tmp_path, "sb3_ppo", "MinAtar/Breakout-v1", 1, 1_000, {})
    checkpoint = bench.SB3Checkpoint(tmp_path, every=0)
    kept = checkpoint.save(Model(100), log, final=False)
    with pytest.warns(TrainingWarning, match="ckpt-000000200 not written"):
        assert checkpoint.save(Model(200, fail=True), log, final=False) is None
    assert checkpoint.latest() == kept and checkpoint.saved_frames() == 100
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [kept.name, "latest"]
    with pytest.raises(OSError, match="ckpt-000000100 is still the newest"):
        checkpoint.save(Model(300, fail=True), log)  # the save on a stop raises


@pytest.mark.timeout(180)
def test_a_stopped_sb3_run_resumes_where_it_was(bench, tmp_path):
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("minatar")
    out = bench.Run("Breakout", "sb3_dqn", 1).directory(tmp_path)
    budget = 5_500  # learning starts after 5,000 frames
    # What this worker had before (not SIG_DFL where an earlier test, e.g. ray.init, set one).
    before = signal.getsignal(signal.SIGTERM)
    watcher = sigterm_once(out / "summary.json", 5_000)
    assert bench.train_sb3("sb3_dqn", "Breakout", 1, budget, out) is None  # stopped
    watcher.join()
    stopped = json.loads((out / "summary.json").read_text())
    assert not stopped["complete"]
    at = bench.SB3Checkpoint(out).saved_frames()
    assert 5_000 <= at < budget  # (restoring updates, optimiser state: the test above)
    assert stopped["frames"] == at
    saved = bench.SB3Checkpoint(out).checkpointer.load()["log"]["seconds"]
    assert stopped["wall_seconds"] == round(saved, 3)  # the checkpoint's clock, not the stop's
    assert bench.action(bench.Run("Breakout", "sb3_dqn", 1), tmp_path, budget) == "resume"
    assert signal.getsignal(signal.SIGTERM) == before  # its handler is gone again

    summary = bench.train_sb3("sb3_dqn", "Breakout", 1, budget, out)
    assert summary["complete"] and summary["frames"] == budget
    assert summary["resumed_at_frames"] == [at]
    assert summary["wall_seconds"] >= stopped["wall_seconds"]  # one clock across the stop
    # each start records its code and versions (the stopped one's entry is kept)
    assert len(summary["code"]) == 2 and summary["code"][0] == stopped["code"][0]
    assert summary["code"][1]["versions"]["stable-baselines3"]
    for name in (bench.CURVE, bench.SECONDS, "train/episodes"):
        rows = csv_rows(out, "sb3_dqn", name)
        frames = [f for f, _ in rows]
        assert frames == sorted(set(frames)), name  # one increasing line across the stop
        if name != bench.CURVE:  # the clock and the episode count go on from the checkpoint
            assert [v for _, v in rows] == sorted(v for _, v in rows), name
