"""benchmarks/minatar_variants.py: commands, resumability and the summary (fabricated runs)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tests._helpers import few_resamples, load_script
from tests.test_minatar_benchmark import fake_run

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "minatar_variants.py"


@pytest.fixture(scope="module")
def bench():
    for module in load_script(SCRIPT, "minatar_variants"):
        with few_resamples():
            yield module


@pytest.mark.timeout(60)
def test_commands_skip_and_resume(bench, tmp_path, monkeypatch):
    def d(variant, seed):
        return bench.run_dir(tmp_path, "ppo_torso", variant, "Breakout", seed)

    # Complete at 3000 frames: skipped; unfinished with a checkpoint: resumed; absent: fresh.
    fake_run(d("shared torso", 1), "ppo", 1, final=7.0, curve=[(3000, 7.0, 100, 3.0)])
    fake_run(d("shared torso", 2), "ppo", 2, final=1.0, complete=False, curve=[(1000, 1, 100, 1.0)])
    (d("shared torso", 2) / "checkpoints").mkdir()
    (d("shared torso", 2) / "checkpoints" / "latest").write_text("ckpt-1\n")
    calls = []

    def run_process(cmd, directory, timeout):
        calls.append(cmd[1:])
        return {"status": "ok", "seconds": 0.0, "summary": {"final_mean_return": 1.0}}

    # The runs start through the scheduler's run_claimed, which calls its own run_process.
    monkeypatch.setattr(sys.modules["_scheduler"], "run_process", run_process)
    argv = ["--study", "ppo_torso", "--games", "Breakout", "--seeds", "1", "2", "--jobs", "1"]
    assert bench.main([*argv, "--frames", "3000", "--results", str(tmp_path)]) == 0

    def fresh(seed):
        out = str(d("separate torsos", seed))
        head = ("--env", "MinAtar/Breakout-v1", "--frames", "3000", "--seed", str(seed))
        return ["ppo", *head, "--return-window", "100", "--out", out, "--share-torso", "false"]

    expected = [
        fresh(1),
        fresh(2),
        ["ppo", "--resume", str(d("shared torso", 2)), "--frames", "3000"],
    ]
    assert sorted(calls) == sorted(expected)
    assert d("shared torso", 1).parent.parent.name == "shared_torso"  # the folder is a slug


@pytest.mark.timeout(60)
def test_variants_limits_the_runs_to_the_named_variants(bench, tmp_path, monkeypatch):
    calls = []
    ok = {"status": "ok", "seconds": 0.0, "summary": {"final_mean_return": 1.0}}
    monkeypatch.setattr(
        sys.modules["_scheduler"], "run_process", lambda c, d, t: calls.append(d) or ok
    )
    argv = ["--study", "acer_lr", "--variants", "lr 2.5e-4", "--games", "Asterix"]
    argv += ["--seeds", "2", "3", "--jobs", "1", "--frames", "3000", "--results", str(tmp_path)]
    assert bench.main(argv) == 0
    expected = [bench.run_dir(tmp_path, "acer_lr", "lr 2.5e-4", "Asterix", s) for s in (2, 3)]
    assert sorted(calls) == expected


@pytest.mark.timeout(60)
@pytest.mark.parametrize("keep", [False, True])
def test_a_finished_runs_checkpoints_are_deleted_unless_kept(bench, tmp_path, monkeypatch, keep):
    def run_process(cmd, directory, timeout):
        made = tmp_path / "made"  # the runner has made the run's folder already
        fake_run(made, "acer", 1, final=2.0, curve=[(3000, 2.0, 100, 3.0)])
        shutil.copytree(made, directory, dirs_exist_ok=True)
        (directory / "checkpoints" / "ckpt-000000007").mkdir(parents=True)
        (directory / "checkpoints" / "latest").write_text("ckpt-000000007\n")
        return {"status": "ok", "seconds": 0.0, "summary": {"final_mean_return": 2.0}}

    monkeypatch.setattr(sys.modules["_scheduler"], "run_process", run_process)
    argv = ["--study", "acer_replay", "--games", "Seaquest", "--seeds", "1", "--jobs", "1"]
    argv += ["--frames", "3000", "--results", str(tmp_path)]
    assert bench.main(argv + (["--keep-checkpoints"] if keep else [])) == 0
    out = bench.run_dir(tmp_path, "acer_replay", "replay ratio 8", "Seaquest", 1)
    assert (out / "summary.json").exists()
    assert (out / "checkpoints" / "ckpt-000000007").is_dir() is keep


def test_an_unknown_variant_is_refused_naming_the_known_ones(bench, tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--study", "acer_lr", "--variants", "lr 3e-4", "--results", str(tmp_path)])
    err = capsys.readouterr().err
    assert "'lr 3e-4'" in err and "'lr 1e-4', 'lr 2.5e-4'" in err


@pytest.mark.timeout(60)
def test_a_run_finished_elsewhere_after_planning_is_not_run_again(bench, tmp_path, monkeypatch):
    grid = sys.modules["_scheduler"]  # the lock and the runner of every grid
    out = bench.run_dir(tmp_path, "ppo_torso", "shared torso", "Breakout", 1)
    calls, lock = [], grid.claimed.__wrapped__  # the generator under @contextmanager

    def claimed_after_another_invocation_finished(directory):  # the lock, taken late
        if directory == out:
            fake_run(out, "ppo", 1, final=7.0, curve=[(3000, 7.0, 100, 3.0)])
        return lock(directory)

    late = grid.contextlib.contextmanager(claimed_after_another_invocation_finished)
    monkeypatch.setattr(grid, "claimed", late)
    ok = {"status": "ok", "seconds": 0.0, "summary": {"final_mean_return": 1.0}}
    monkeypatch.setattr(grid, "run_process", lambda cmd, d, t: calls.append(d) or ok)
    argv = ["--study", "ppo_torso", "--games", "Breakout", "--seeds", "1", "--jobs", "1"]
    argv += ["--frames", "3000", "--results", str(tmp_path)]
    assert bench.main(argv) == 0
    separate = bench.run_dir(tmp_path, "ppo_torso", "separate torsos", "Breakout", 1)
    assert calls == [separate] and (out / "summary.json").is_file()  # finished, not redone


@pytest.mark.timeout(60)
def test_summary_reads_each_run_at_its_fractions(bench, tmp_path):
    def d(variant, seed):
        return bench.run_dir(tmp_path, "reactor_acting", variant, "Breakout", seed)

    name = "16 frames per learner step"
    rows = [(1000, 1.0, 100, 1.0), (2000, 2.0, 100, 2.0), (3000, 3.0, 100, 3.0)]
    fake_run(d(name, 1), "reactor", 1, final=3.0, curve=rows, fps=50.0)
    fake_run(d(name, 2), "reactor", 2, final=5.0, curve=[(r[0], 2 * r[1], *r[2:]) for r in rows])
    fake_run(d(name, 3), "reactor", 3, final=9.0, complete=False, curve=rows)  # left out
    found = bench.summarize(tmp_path)
    runs = found["reactor_acting"][name]["Breakout"]
    assert [r["seed"] for r in runs] == [1, 2]
    # At 25% of 3000 frames no point is logged yet; at 50% (1500) the 1000-frame point.
    assert runs[0]["at"] == {"0.25": None, "0.5": 1.0, "1.0": 3.0}
    assert runs[1]["at"] == {"0.25": None, "0.5": 2.0, "1.0": 6.0}
    md = bench.markdown(found)
    assert (
        "| 16 frames per learner step | `--acting-steps-per-learning-step 16 "
        "--target-update-period 1000 --recurrent-size 64` | Breakout | 1, 2 | 3,000 | — | 1.50 "
        "| 4.50 | 75 |" in md
    )
    assert "ppo_torso" not in md  # no runs, no table


@pytest.mark.timeout(60)
def test_a_study_with_a_baseline_shows_the_grid_runs_of_its_games_and_seeds(bench, tmp_path):
    variant = "2 learner threads"
    rows = [(1000, 1.0, 100, 1.0), (2000, 2.0, 100, 2.0), (4000, 4.0, 100, 3.0)]
    fake_run(
        bench.run_dir(tmp_path, "ppo_rounding", variant, "Breakout", 1),
        "ppo",
        1,
        final=4.0,
        curve=rows,
        fps=300.0,
    )
    grid_run = sys.modules["minatar_grid"].Run
    fake_run(
        grid_run("Breakout", "ppo", 1).directory(tmp_path),
        "ppo",
        1,
        final=2.0,
        curve=[(r[0], r[1] / 2, *r[2:]) for r in rows],
        fps=100.0,
    )
    # Another seed and another game of the grid: not run by the study, so not shown.
    fake_run(grid_run("Breakout", "ppo", 2).directory(tmp_path), "ppo", 2, final=9.0, curve=rows)
    fake_run(grid_run("Asterix", "ppo", 1).directory(tmp_path), "ppo", 1, final=9.0, curve=rows)
    found = bench.summarize(tmp_path)
    baseline = "1 learner thread (default)"
    assert list(found["ppo_rounding"]) == [baseline, variant]  # the baseline first
    assert list(found["ppo_rounding"][baseline]) == ["Breakout"]
    assert [r["seed"] for r in found["ppo_rounding"][baseline]["Breakout"]] == [1]
    md = bench.markdown(found)
    assert (
        f"| {baseline} | (`minatar_grid.py`'s ppo) | Breakout | 1 | 4,000 | 0.50 | 1.00 | 2.00 "
        "| 100 |" in md
    )
    assert f"| {variant} | `--torch-threads 2` | Breakout | 1 " in md
    assert "ppo_epochs" not in md  # a baseline alone makes no table


@pytest.mark.timeout(60)
def test_a_baseline_from_another_study_reads_that_studys_variant(bench, tmp_path):
    rows = [(1000, 1.0, 100, 1.0), (2000, 2.0, 100, 2.0), (4000, 4.0, 100, 3.0)]
    fake_run(
        bench.run_dir(tmp_path, "reactor_entropy", "entropy 0.001", "Freeway", 1),
        "reactor",
        1,
        final=4.0,
        curve=rows,
    )
    stopped = "policy gradient stopped at the torso"
    fake_run(
        bench.run_dir(tmp_path, "reactor_torso", stopped, "Freeway", 1),
        "reactor",
        1,
        final=8.0,
        curve=[(r[0], 2 * r[1], *r[2:]) for r in rows],
        fps=50.0,
    )
    # The grid's run of the same game and seed (today's default) is the baseline of none of
    # these studies: the torso study's is the ratio study's variant, the default when the
    # torso study ran, and the ratio study's is the width study's 64-wide variant.
    grid_run = sys.modules["minatar_grid"].Run
    fake_run(
        grid_run("Freeway", "reactor", 1).directory(tmp_path),
        "reactor",
        1,
        final=99.0,
        curve=[(r[0], 20 * r[1], *r[2:]) for r in rows],
    )
    fake_run(
        bench.run_dir(tmp_path, "reactor_width", "branches 64 wide", "Freeway", 1),
        "reactor",
        1,
        final=77.0,
        curve=[(r[0], 15 * r[1], *r[2:]) for r in rows],
    )
    then = "4 frames per learner step, target every 1,000 steps"
    fake_run(
        bench.run_dir(tmp_path, "reactor_ratio", then, "Freeway", 1),
        "reactor",
        1,
        final=40.0,
        curve=[(r[0], 10 * r[1], *r[2:]) for r in rows],
    )
    found = bench.summarize(tmp_path)
    baseline = bench.STUDIES["reactor_entropy"]["baseline"]
    assert list(found["reactor_entropy"]) == [baseline, "entropy 0.001"]
    assert found["reactor_entropy"][baseline]["Freeway"][0]["final_mean_return"] == 8.0
    torso_baseline = bench.STUDIES["reactor_torso"]["baseline"]
    assert found["reactor_torso"][torso_baseline]["Freeway"][0]["final_mean_return"] == 40.0
    ratio_baseline = bench.STUDIES["reactor_ratio"]["baseline"]
    assert found["reactor_ratio"][ratio_baseline]["Freeway"][0]["final_mean_return"] == 77.0
    md = bench.markdown(found)
    old_ratio = "--acting-steps-per-learning-step 4 --target-update-period 1000 --recurrent-size 64"
    assert (
        f"| {baseline} | `--policy-torso-gradient false {old_ratio}` | Freeway | 1 | 4,000 "
        "| 2.00 | 4.00 | 8.00 | 50 |" in md
    )


@pytest.mark.timeout(60)
def test_a_recorded_baseline_keeps_the_rows_of_the_previous_summary(bench, tmp_path):
    # ppo_envs ran when the grid's ppo runs had older defaults; those runs were replaced, so
    # its baseline rows are the recorded ones, whatever the grid holds today.
    variant = "32 envs × 32 steps"
    rows = [(1000, 1.0, 100, 1.0), (2000, 2.0, 100, 2.0), (4000, 4.0, 100, 3.0)]
    fake_run(
        bench.run_dir(tmp_path, "ppo_envs", variant, "Breakout", 1), "ppo", 1, final=4.0, curve=rows
    )
    grid_run = sys.modules["minatar_grid"].Run
    fake_run(grid_run("Breakout", "ppo", 1).directory(tmp_path), "ppo", 1, final=9.0, curve=rows)
    baseline = "8 envs × 128 steps (default)"
    recorded = {
        "Breakout": [
            {
                "seed": 1,
                "frames": 4000,
                "fps": 10.0,
                "final_mean_return": 0.7,
                "at": {"0.25": 0.1, "0.5": 0.3, "1.0": 0.7},
            }
        ]
    }
    previous = {"ppo_envs": {baseline: recorded, variant: {}}}
    (tmp_path / "minatar_variants.json").write_text(json.dumps(previous))
    found = bench.summarize(tmp_path)
    assert list(found["ppo_envs"]) == [baseline, variant]
    assert found["ppo_envs"][baseline] == recorded  # not the grid's run (9.0)
    # Without a previous summary there is nothing to show for it: the grid's run is not used.
    (tmp_path / "minatar_variants.json").unlink()
    assert list(bench.summarize(tmp_path)["ppo_envs"]) == [variant]


@pytest.mark.timeout(120)
def test_a_study_with_a_baseline_judges_each_variant_by_its_probability_of_improvement(
    bench, tmp_path
):
    fast, wide = "overlapped collection", "32 envs × 32 steps, overlapped"
    rows = [(1000, 1.0, 100, 1.0), (2000, 2.0, 100, 2.0)]
    grid_run = sys.modules["minatar_grid"].Run
    finals = {  # game -> seed -> (variant's, grid baseline's)
        "Asterix": {1: (5.0, 1.0), 2: (6.0, 2.0)},  # the variant beats every baseline run
        "Breakout": {1: (1.0, 3.0), 2: (4.0, 2.0)},  # 2 of 4 pairs go each way
    }
    for game, seeds in finals.items():
        for seed, (mine, theirs) in seeds.items():
            directory = bench.run_dir(tmp_path, "ppo_overlap", fast, game, seed)
            fake_run(directory, "ppo", seed, final=mine, curve=rows)
            fake_run(
                grid_run(game, "ppo", seed).directory(tmp_path),
                "ppo",
                seed,
                final=theirs,
                curve=rows,
            )
    # one seed of the other variant, on one game
    directory = bench.run_dir(tmp_path, "ppo_overlap", wide, "Asterix", 1)
    fake_run(directory, "ppo", 1, final=0.5, curve=rows)
    found = bench.summarize(tmp_path)
    comparisons = {
        r["variant"]: r for r in bench.against_baseline("ppo_overlap", found["ppo_overlap"])
    }
    asterix = comparisons[fast]["per_game"]["Asterix"]
    assert asterix[:4] == (1.0, 1.0, 1.0, "above") and asterix[4] == 2
    breakout = comparisons[fast]["per_game"]["Breakout"]
    assert breakout[0] == pytest.approx(0.5) and breakout[3] == "level"  # resamples span 0..1
    overall = comparisons[fast]["overall"]
    assert overall[0] == pytest.approx((1.0 + 0.5) / 2)  # the mean over the two games
    assert overall[1] <= overall[0] <= overall[2]
    assert comparisons[wide]["overall"] is None  # one game: nothing to aggregate
    md = bench.markdown(found)
    assert f"| {fast} | " in md
    assert "| above, 1.00 [1.00, 1.00] | level, 0.50 [0.00, 1.00] |" in md
    assert f"| {wide} | — | one seed, 0.00 | — |" in md
