"""benchmarks/mujoco_grid.py: command lines, resumability and the summary."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tests._helpers import few_resamples, load_script
from tests.test_minatar_benchmark import fake_run, sigterm_once

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "mujoco_grid.py"


@pytest.fixture(scope="module")
def bench():
    for module in load_script(SCRIPT, "mujoco_benchmark"):
        with few_resamples():
            yield module


def test_the_papers_flags_parse_back_into_the_papers_settings(bench, tmp_path):
    from ac_extensions.cli._config import add_config_flags, make_config
    from ac_extensions.recipes.acer import ACERConfig

    cmd = bench.command(bench.Run("Hopper", "acer_paper", 2), tmp_path, 5000, "fresh")
    assert cmd[cmd.index("--env") + 1] == "Hopper-v5" and cmd[cmd.index("--seed") + 1] == "2"
    flags = cmd[cmd.index("--out") + 2 :]
    parser = argparse.ArgumentParser()
    add_config_flags(parser, ACERConfig)
    values = {k: v for k, v in vars(parser.parse_args(flags)).items() if v is not None}
    config = make_config(ACERConfig, values)
    for name, value in ACERConfig.PAPER_CONTINUOUS.items():
        assert getattr(config, name) == value, name
    plain = bench.command(bench.Run("Hopper", "acer", 2), tmp_path, 5000, "fresh")
    assert plain[-2:] == ["--out", str(bench.Run("Hopper", "acer", 2).directory(tmp_path))]
    sb3 = bench.command(bench.Run("Walker2d", "sb3_ppo", 1), tmp_path, 5000, "fresh")
    assert sb3[2:7] == ["--child", "sb3_ppo", "Walker2d", "1", "5000"]


def test_the_sigma_variants_change_only_the_initial_sigma(bench, tmp_path):
    from ac_extensions.cli import train

    def config(algo):
        cmd = bench.command(bench.Run("Walker2d", algo, 3), tmp_path, 5000, "fresh")
        recipe = bench.VARIANTS.get(algo, (algo,))[0]
        return train.parse(cmd[cmd.index(recipe) :])[1]

    for default, variant, sigmas in (
        ("ppo", "ppo_sigma1", (0.5, 1.0)),
        ("a2c", "a2c_sigma05", (1.0, 0.5)),
    ):
        base, other = config(default), config(variant)
        assert (base.init_scale, other.init_scale) == sigmas
        assert (other.env_id, other.seed, other.frames) == ("Walker2d-v5", 3, 5000)
        same = {f: getattr(base, f) for f in vars(base) if f not in ("init_scale", "out")}
        assert same == {f: getattr(other, f) for f in same}  # only σ's start differs


def test_complete_runs_are_skipped_and_unfinished_ones_of_ours_resume(bench, tmp_path):
    run = bench.Run("HalfCheetah", "acer", 1)
    assert bench.action(run, tmp_path, 1000) == "fresh"
    fake_run(run.directory(tmp_path), "acer", 1, final=5.0, curve=[(1000, 5.0, 100, 1.0)])
    # fake_run's frames_target is 3000: complete at 1000 and 3000 frames, not at 5000.
    assert bench.action(run, tmp_path, 3000) == "done"
    assert bench.action(run, tmp_path, 5000) == "fresh"
    (run.directory(tmp_path) / "checkpoints").mkdir()
    (run.directory(tmp_path) / "checkpoints" / "latest").write_text("ckpt-1")
    assert bench.action(run, tmp_path, 5000) == "resume"
    assert bench.command(run, tmp_path, 5000, "resume")[-6:] == [
        *("--resume", str(run.directory(tmp_path)), "--frames", "5000"),
        *("--checkpoint-minutes", "5"),  # not a replay write every few seconds
    ]


def test_summary_and_files(bench, tmp_path):
    def d(task, algo, seed):
        return bench.Run(task, algo, seed).directory(tmp_path)

    for seed, final in ((1, 8000.0), (2, 7000.0), (3, 9000.0)):
        fake_run(
            d("HalfCheetah", "acer", seed),
            "acer",
            seed,
            final=final,
            curve=[(3000, final, 100, 5.0)],
        )
    for seed, final in ((1, 3000.0), (2, 4000.0)):
        fake_run(
            d("HalfCheetah", "sb3_ppo", seed),
            "sb3_ppo",
            seed,
            final=final,
            curve=[(3000, final, 100, 5.0)],
        )
    fake_run(d("Hopper", "acer", 1), "acer", 1, final=900.0, curve=[(3000, 900.0, 100, 5.0)])
    fake_run(
        d("Hopper", "sb3_ppo", 1), "sb3_ppo", 1, final=1500.0, curve=[(3000, 1500.0, 100, 5.0)]
    )
    summary = bench.summarize(tmp_path, bench.TASKS, ["acer", "sb3_ppo"], [1, 2, 3])
    assert (summary["planned"], summary["present"], summary["complete"]) == (18, 7, 7)
    cheetah = summary["games"]["HalfCheetah"]["algorithms"]
    assert (cheetah["acer"]["final_median"], cheetah["sb3_ppo"]["final_median"]) == (8000.0, 3500.0)

    args = bench.build_parser().parse_args(["--results", str(tmp_path), "--summary-only"])
    md = bench.write_results(summary, args)
    text = md.read_text()
    assert "**Runs present: 7 of the command's 18 (7 complete): partial results.**" in text
    assert "| acer | 3/3 | 8,000 | 7,000–9,000 |" in text
    assert "| SB3 zoo SAC (published¹) | — | 9535 ± 100 |" in text
    data = json.loads(md.with_suffix(".json").read_text())
    assert "curve" not in data["games"]["HalfCheetah"]["algorithms"]["acer"]["runs"][0]
    assert md.with_suffix(".png").stat().st_size > 0


def test_unfinished_runs_are_marked_partial(bench, tmp_path):
    def d(task, algo, seed):
        return bench.Run(task, algo, seed).directory(tmp_path)

    curve = [(1500, 5000.0, 100, 5.0)]
    fake_run(d("HalfCheetah", "acer", 1), "acer", 1, final=5000.0, curve=curve, complete=False)
    fake_run(
        d("HalfCheetah", "sb3_ppo", 1), "sb3_ppo", 1, final=4000.0, curve=[(3000, 4000.0, 100, 5)]
    )
    summary = bench.summarize(tmp_path, ["HalfCheetah"], ["acer", "sb3_ppo"], [1])
    table = "\n".join(bench.task_table("HalfCheetah", summary["games"]["HalfCheetah"], 1))
    assert "| acer | 1/1 (partial: 1 unfinished) | 5,000 |" in table
    assert "| sb3_ppo | 1/1 | 4,000 |" in table


def test_zoo_settings_become_sb3_keywords(bench):
    settings = bench.sb3_settings("HalfCheetah")
    assert settings["n_steps"] == 512 and settings["learning_rate"] == pytest.approx(2.0633e-05)
    assert settings["policy_kwargs"]["net_arch"] == {"pi": [256, 256], "vf": [256, 256]}
    assert settings["policy_kwargs"]["activation_fn"].__name__ == "ReLU"
    assert "policy_kwargs" not in bench.sb3_settings("Walker2d")


@pytest.mark.timeout(60)
def test_the_grid_runs_its_own_cells_through_the_shared_runner(bench, tmp_path, monkeypatch):
    done = bench.Run("Hopper", "acer", 1)
    fake_run(done.directory(tmp_path), "acer", 1, final=5.0, curve=[(3000, 5.0, 100, 1.0)])
    started = []

    def run_process(cmd, directory, timeout):
        started.append(cmd[cmd.index("--env") + 1] if "--env" in cmd else cmd[3:5])
        return {"status": "ok", "seconds": 0.0, "summary": {"complete": True, "frames": 3000}}

    monkeypatch.setattr(bench.scheduler, "run_process", run_process)
    runs = [done, bench.Run("Hopper", "acer", 2), bench.Run("Hopper", "sb3_ppo", 1)]
    args = argparse.Namespace(results=tmp_path, frames=3000, timeout=60, jobs=1)
    args.keep_checkpoints = False
    assert bench.run_grid(runs, args) == 0
    assert sorted(map(str, started)) == sorted(["Hopper-v5", str(["sb3_ppo", "Hopper"])])


def test_a_run_of_part_of_the_grid_keeps_the_other_runs_in_the_summary(
    bench, tmp_path, monkeypatch
):
    cheetah = bench.Run("HalfCheetah", "sb3_ppo", 2)
    fake_run(cheetah.directory(tmp_path), "sb3_ppo", 2, final=4.0, curve=[(3000, 4.0, 100, 1.0)])
    started = []
    monkeypatch.setattr(bench, "require", lambda modules, extra: None)
    monkeypatch.setattr(bench, "run_grid", lambda runs, args: started.extend(runs) or 0)
    part = ["--results", str(tmp_path), "--frames", "3000"]
    assert bench.main([*part, "--tasks", "Hopper", "--algos", "acer_paper", "--seeds", "1"]) == 0
    assert started == [bench.Run("Hopper", "acer_paper", 1)]
    text = (tmp_path / "mujoco.md").read_text()
    # 3 tasks x 7 algos x 3 seeds
    assert "**Runs present: 1 of the command's 63 (1 complete)" in text
    assert "| sb3_ppo | 1/3 | 4 |" in text  # HalfCheetah's run, outside the selection


@pytest.mark.timeout(180)
def test_a_stopped_sb3_run_resumes_with_its_normalisation_statistics(bench, tmp_path):
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("mujoco")
    import pickle

    out = bench.Run("Hopper", "sb3_ppo", 1).directory(tmp_path)
    budget = 2_048  # four rollouts of 512 steps
    watcher = sigterm_once(out / "summary.json", 600)
    assert bench.train_sb3("sb3_ppo", "Hopper", 1, budget, out) is None  # stopped
    watcher.join()
    saved = bench.SB3Checkpoint(out).latest()
    at = bench.SB3Checkpoint(out).saved_frames()
    assert at % 512 == 0 and 512 <= at < budget  # at a rollout start: all of it trained on
    assert sorted(p.name for p in saved.iterdir()) == sorted(
        ["model.zip", "state.pt", bench.NORMALIZE]
    )
    with open(saved / bench.NORMALIZE, "rb") as f:
        statistics = pickle.load(f)
    # Every step's observation and the first reset's (plus VecNormalize's ε count of 1e-4).
    assert statistics.obs_rms.count == pytest.approx(at + 1, abs=1e-3)
    assert bench.action(bench.Run("Hopper", "sb3_ppo", 1), tmp_path, budget) == "resume"

    summary = bench.train_sb3("sb3_ppo", "Hopper", 1, budget, out)
    assert summary["complete"] and summary["frames"] == budget
    assert summary["resumed_at_frames"] == [at]
