"""``ac-train`` / ``ac-eval`` / ``ac-plot`` end to end on tiny budgets.

Runs spawn collector worker processes; every test carries a timeout so a hang fails fast.
Budgets: 1 worker × 2 envs × 16 steps = 32 frames per batch.
"""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ac_extensions.cli import evaluate, plot, train
from ac_extensions.runtime import Checkpointer

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--workers", "1", "--envs-per-worker", "2", "--rollout-length", "16", "--quiet"]
BATCH = 32
EXTRA = {
    "a2c": [],
    "ppo": ["--epochs", "2"],
    "acer": ["--replay-start", "64", "--replay-ratio", "1", "--batch-size", "2"],
    "reactor": ["--replay-start", "64", "--batch-size", "2", "--sequence-length", "8"],
}


@pytest.fixture(autouse=True)
def _quiet_env(monkeypatch):
    # main() sets these with setdefault; pre-set them so monkeypatch restores them afterwards.
    monkeypatch.setenv("RL_LOGGING_LEVEL", "WARNING")
    monkeypatch.setenv("PYTHONWARNINGS", "ignore")
    monkeypatch.setenv("AC_WORKER_TRACEBACKS", "0")


def cli(*args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    """``python -m ac_extensions ...`` in a fresh process (the console script's code path)."""
    return subprocess.run(
        [sys.executable, "-m", "ac_extensions", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def csv_steps(run: Path, name: str, metric: str = "time/frames") -> list[int]:
    lines = (run / "logs" / name / "scalars" / f"{metric}.csv").read_text().split()
    return [int(line.split(",")[0]) for line in lines]


def check_run(run: Path, name: str, frames: int) -> dict:
    summary = json.loads((run / "summary.json").read_text())
    assert summary["algorithm"] == name and summary["env"] == "CartPole-v1"
    assert summary["frames"] == frames and summary["complete"] is True
    assert summary["threshold"] == 475.0
    assert summary["frames_to_threshold"] is None  # far too few frames
    assert summary["final_mean_return"] > 0 and summary["final_return_episodes"] > 0
    assert summary["wall_seconds"] > 0 and summary["fps"] > 0
    assert summary["config"]["frames"] == frames
    assert csv_steps(run, name) == list(range(BATCH, frames + 1, BATCH))
    assert (run / "logs" / name / "scalars" / "train" / "return_window.csv").stat().st_size
    latest = Checkpointer(run / "checkpoints").latest()
    assert latest.name == f"ckpt-{frames // BATCH:09d}" and (latest / "state.pt").stat().st_size
    state = Checkpointer(run / "checkpoints").load()
    assert state["counters"]["batches"] == frames // BATCH
    assert state["progress"]["frames"] == frames
    assert {"loss", "optimizer", "rng", "extra"} <= state.keys()
    return state


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory) -> Path:
    """One PPO run through the console entry point, shared by the eval/plot tests."""
    out = tmp_path_factory.mktemp("cli") / "ppo"
    result = cli("ppo", "--frames", "128", "--checkpoint-every", "3", "--out", str(out), *TINY)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == ""  # --quiet
    assert "Traceback" not in result.stderr
    return out


@pytest.mark.timeout(300)
def test_train_ppo_via_python_dash_m(ppo_run):
    check_run(ppo_run, "ppo", 128)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["a2c", "acer", "reactor"])
def test_train_end_to_end(name, tmp_path):
    if name == "reactor":
        if importlib.util.find_spec("ac_extensions.recipes.reactor") is None:
            pytest.skip("ac_extensions.recipes.reactor is not there yet")
        from ac_extensions.recipes import reactor

        if "checkpoint" not in inspect.signature(reactor.train).parameters:
            pytest.skip("reactor.train has no checkpoint hook")
    out = tmp_path / name
    argv = [name, "--frames", "128", "--checkpoint-every", "2", "--out", str(out), *TINY]
    assert train.main(argv + EXTRA[name]) == 0
    state = check_run(out, name, 128)
    if name in ("acer", "reactor"):  # off-policy: the replay is in the checkpoint
        assert any((Checkpointer(out / "checkpoints").latest() / "replay").iterdir())
    if name == "acer":
        assert state["counters"]["sequences"] == 128 // 16
        assert any(k.startswith("target_") for k in state["loss"])  # the average policy


@pytest.mark.timeout(300)
def test_resumed_run_continues_from_the_saved_counters(ppo_run, tmp_path):
    run = tmp_path / "ppo"
    shutil.copytree(ppo_run, run)
    assert train.main(["--resume", str(run), "--frames", "192", "--quiet"]) == 0
    state = check_run(run, "ppo", 192)
    # Two more batches after the four saved ones, not six from zero: the frame log continues.
    assert state["counters"]["batches"] == 6
    assert csv_steps(run, "ppo", "train/lr") == list(range(BATCH, 193, BATCH))
    # The learning rate keeps annealing from where it was (progress 4/6, then 5/6).
    lr = [
        float(x.split(",")[1]) for x in (run / "logs/ppo/scalars/train/lr.csv").read_text().split()
    ]
    assert lr[4] == pytest.approx(1e-3 * (1 - 4 / 6)) and lr[5] == pytest.approx(1e-3 / 6)


def start_ppo(out: Path, frames: int, checkpoint_every: int, stderr=None) -> subprocess.Popen:
    """A tiny ``ac-train ppo`` run in its own session, to be signalled (``stderr``: a pipe to
    read with ``communicate``, else discarded)."""
    args = ["--frames", str(frames), "--checkpoint-every", str(checkpoint_every), "--out", str(out)]
    return subprocess.Popen(
        [sys.executable, "-m", "ac_extensions", "ppo", *args, *TINY],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL if stderr is None else stderr,
        text=True,
        start_new_session=True,
    )


@pytest.mark.timeout(400)
def test_run_killed_with_sigkill_resumes_to_the_frames_asked(tmp_path):
    out = tmp_path / "killed"
    frames = 40 * BATCH
    process = start_ppo(out, frames, checkpoint_every=1)
    try:
        deadline = time.monotonic() + 200
        checkpointer = Checkpointer(out / "checkpoints")
        while time.monotonic() < deadline and process.poll() is None:
            latest = checkpointer.latest() if (out / "checkpoints" / "latest").exists() else None
            if latest is not None and int(latest.name.split("-")[1]) >= 3:
                break
            time.sleep(0.2)
        assert process.poll() is None, "the run ended before it could be killed"
        os.kill(process.pid, signal.SIGKILL)  # the trainer only; its workers are orphaned
        process.wait()
    finally:
        time.sleep(1)
        try:
            os.killpg(process.pid, signal.SIGKILL)  # reap the orphaned collector workers
        except ProcessLookupError:
            pass
    saved = Checkpointer(out / "checkpoints").load()["counters"]["batches"]
    assert 3 <= saved < 40
    assert json.loads((out / "summary.json").read_text())["complete"] is False

    result = cli("ppo", "--resume", str(out), "--quiet")
    assert result.returncode == 0, result.stderr[-3000:]
    state = check_run(out, "ppo", frames)
    assert state["counters"]["batches"] == 40
    assert csv_steps(out, "ppo") == list(range(BATCH, frames + 1, BATCH))  # no gap, no repeat


@pytest.mark.timeout(400)
def test_sigterm_stops_after_a_checkpoint_of_the_batch_in_progress(tmp_path):
    """SIGTERM: exit 143 with a checkpoint of the last batch trained on; resuming loses nothing.

    Periodic checkpoints are off (``--checkpoint-every 0``), so the only checkpoint before the
    end is the one the stop writes.
    """
    out = tmp_path / "stopped"
    frames = 40 * BATCH
    process = start_ppo(out, frames, checkpoint_every=0, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 200
        summary = out / "summary.json"
        while time.monotonic() < deadline and process.poll() is None:
            if summary.exists() and json.loads(summary.read_text())["frames"] >= 3 * BATCH:
                break
            time.sleep(0.2)
        assert process.poll() is None, "the run ended before it could be stopped"
        os.kill(process.pid, signal.SIGTERM)  # the trainer only, as the benchmark grids do
        _, stderr = process.communicate(timeout=120)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # anything left (nothing, normally)
        except ProcessLookupError:
            pass
    assert process.returncode == 143, stderr[-3000:]
    assert "checkpoint saved" in stderr and f"--resume {out}" in stderr
    saved = Checkpointer(out / "checkpoints").load()["counters"]["batches"]
    stopped = json.loads((out / "summary.json").read_text())
    assert stopped["complete"] is False
    assert 3 <= saved < 40 and stopped["frames"] == saved * BATCH  # the last batch logged

    result = cli("ppo", "--resume", str(out), "--quiet")
    assert result.returncode == 0, result.stderr[-3000:]
    state = check_run(out, "ppo", frames)
    assert state["counters"]["batches"] == 40
    assert csv_steps(out, "ppo") == list(range(BATCH, frames + 1, BATCH))  # no gap, no repeat


SECOND_SIGTERM = """
import os, signal, sys, time
from ac_extensions.cli.train import stop_on_sigterm
from ac_extensions.runtime import Checkpointer

checkpointer = Checkpointer(sys.argv[1])
with stop_on_sigterm(checkpointer):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.5)
    print("first: stop requested" if checkpointer.stop_requested else "first: ignored", flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10)
    print("still running after the second", flush=True)
"""


@pytest.mark.timeout(120)
def test_a_second_sigterm_ends_a_stopping_run_at_once(tmp_path):
    """The first SIGTERM asks for a stop after the batch; a second one (a run stuck in its
    batch) takes SIGTERM's default action instead of being ignored."""
    result = subprocess.run(
        [sys.executable, "-c", SECOND_SIGTERM, str(tmp_path / "checkpoints")],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert result.returncode == -signal.SIGTERM, (result.stdout, result.stderr[-2000:])
    assert result.stdout.splitlines() == ["first: stop requested"]


@pytest.mark.timeout(300)
def test_eval_prints_mean_and_std_and_records_a_gif(ppo_run, tmp_path, capsys):
    if importlib.util.find_spec("pygame") is None:
        pytest.skip("CartPole renders RGB arrays through pygame (extra 'video')")
    video = tmp_path / "episode.gif"
    assert evaluate.main([str(ppo_run), "--episodes", "3", "--video", str(video)]) == 0
    out = capsys.readouterr().out
    assert "mean return" in out and "± " in out and "over 3 episodes" in out
    assert video.read_bytes()[:6] in (b"GIF87a", b"GIF89a")


@pytest.mark.timeout(300)
def test_plot_draws_a_png(ppo_run, tmp_path, capsys):
    png = tmp_path / "curves.png"
    assert plot.main([str(ppo_run), str(ppo_run.parent), "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000


def _unfinished_copy(ppo_run: Path, run: Path) -> Path:
    """A copy of the run that says it is unfinished (a resume then needs its checkpoint)."""
    shutil.copytree(ppo_run, run)
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps(summary | {"complete": False}))
    return run


def _corrupt(ppo_run: Path, tmp_path: Path) -> Path:
    run = _unfinished_copy(ppo_run, tmp_path / "corrupt")
    (Checkpointer(run / "checkpoints").latest() / "state.pt").write_bytes(b"\x00" * 100)
    return run


def _empty(ppo_run: Path, tmp_path: Path) -> Path:
    run = _unfinished_copy(ppo_run, tmp_path / "empty")
    shutil.rmtree(run / "checkpoints")
    return run


BAD = {
    "unknown algorithm": (lambda r, t: ["dqn", "--frames", "64"], "unknown algorithm"),
    "unknown env": (lambda r, t: ["ppo", "--env", "NoSuchEnv-v0"], "unknown environment"),
    "unknown field": (lambda r, t: ["ppo", "--no-such-field", "3"], "unrecognized arguments"),
    "bad value": (lambda r, t: ["ppo", "--gamma", "high"], "invalid float value"),
    "negative frames": (lambda r, t: ["ppo", "--frames", "-5"], "frames must be > 0"),
    "no checkpoint": (lambda r, t: ["--resume", str(_empty(r, t))], "no checkpoint"),
    "corrupt checkpoint": (lambda r, t: ["--resume", str(_corrupt(r, t))], "cannot read"),
    "not a run": (lambda r, t: ["ppo", "--resume", str(t)], "holds no ac-train run"),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_gives_one_line_and_writes_nothing(case, ppo_run, tmp_path, capsys):
    make_argv, message = BAD[case]
    argv = make_argv(ppo_run, tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    code = train.main([*argv, "--out", str(tmp_path / "new")] if "--resume" not in argv else argv)
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("ac-train: error: ") and message in err, err
    assert "Traceback" not in err
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before  # nothing written, nothing half-written
    assert not (tmp_path / "new").exists()


HELP_LINES = {"a2c": 95, "ppo": 128, "acer": 100, "reactor": 120}
"""Most lines of ``ac-train ALGORITHM --help`` at 100 columns (measured: 88, 119, 92, 112)."""


def help_entries(raw: str) -> dict[str, list[str]]:
    """The config fields' flags of a help text → their help lines (at most one per line)."""
    section = raw.split(" fields:\n", 1)[1]
    entries: dict[str, list[str]] = {}
    for line in section.splitlines():
        if line.startswith("  -"):
            flag, _, beside = line.strip().partition("  ")
            entries[flag] = [beside.strip()] if beside.strip() else []
        elif line.strip():
            entries[flag].append(line.strip())
    return entries


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(EXTRA))
def test_help_lists_every_field_with_its_documentation(name, capsys, monkeypatch):
    import dataclasses
    import re

    from ac_extensions.cli._config import load_recipe

    monkeypatch.setenv("COLUMNS", "100")  # argparse wraps to the terminal's width
    _, config_cls = load_recipe(name)
    with pytest.raises(SystemExit) as exit_:
        train.main([name, "--help"])
    assert exit_.value.code == 0
    raw = capsys.readouterr().out
    text = " ".join(raw.split())
    for field in dataclasses.fields(config_cls):
        if field.name not in ("env_id", "algorithm", "transform_factory", "reshape_reward"):
            assert f"--{field.name.replace('_', '-')}" in text, field.name
    if name == "acer":
        assert "Steps per sequence (k = 20 in the paper)" in text  # the field's docstring
    assert "--env ENV_ID" in text and "--resume DIR" in text and "--logger" in text
    # Readable: one spelling, defaults once, no markup, booleans as --flag/--no-flag.
    assert "--env-id" not in text and "--async_collection" not in text and "--env_id" not in text
    assert "--async-collection/--no-async-collection" in text
    assert text.count("(default:") == text.count("(default: ")
    for markup in (":class:", ":func:", ":mod:", ":attr:", ":meth:", "``"):
        assert markup not in text, markup
    assert "None" not in raw  # a None default reads "none", and so do the choices
    assert max(map(len, raw.splitlines())) <= 100
    # No word split by the wrapping (argparse's textwrap breaks "feed-" / "forward").
    lines = raw.splitlines()
    for line, after in itertools.pairwise(lines):
        assert not (re.search(r"\w-$", line) and after.startswith(" " * 30)), (line, after)
    entries = help_entries(raw)
    assert len(entries) >= len(dataclasses.fields(config_cls)) - 3
    for flag, help_lines in entries.items():
        assert 1 <= len(help_lines) <= 3, (flag, help_lines)  # the first sentence only
        defaults = re.findall(r"\(default: ([^;()]*)((?:; [^;()]*)*)\)$", " ".join(help_lines))
        assert len(defaults) == 1, (flag, help_lines)  # the default, once, at the end
        default, families = defaults[0]
        labels = [part.partition(": ")[0] for part in families.split("; ")[1:]]
        values = [part.partition(": ")[2] for part in families.split("; ")[1:]]
        assert default not in values, (flag, help_lines)  # a family's value only if it differs
        assert len(set(labels)) == len(labels), (flag, help_lines)
    assert len(lines) <= HELP_LINES[name], len(lines)


def test_none_is_typed_and_shown_as_none(tmp_path, capsys, monkeypatch):
    out = ["--out", str(tmp_path / "run")]
    _, config, _ = train.parse(["ppo", "--start-method", "spawn", "--recurrent", "none", *out])
    assert (config.start_method, config.recurrent) == ("spawn", None)
    _, config, _ = train.parse(["acer", "--recurrent", "gru", "--torch-threads", "none", *out])
    assert (config.recurrent, config.torch_threads) == ("gru", None)
    _, config, _ = train.parse(
        ["ppo", "--env", "MinAtar/Breakout-v1", "--head-sizes", "none", *out]
    )
    assert config.head_sizes == ()  # MinAtar's default is (64, 64)
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit):
        train.main(["ppo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--start-method {fork,spawn,forkserver,none}" in text
    assert "--recurrent {lstm,gru,none}" in text
    assert "(default: 0.98; MinAtar, Atari, MuJoCo: 0.99)" in text  # --gamma
    assert "(default: 1.0; MuJoCo: 0.5)" in text  # --init-scale
    assert "(default: off; MuJoCo: on)" in text  # --normalize-observations
    assert train.main(["ppo", "--start-method", "thread", *out]) == 2
    assert "(choose from 'fork', 'spawn', 'forkserver', 'none')" in capsys.readouterr().err


def test_every_spelling_of_a_flag_still_parses(tmp_path):
    out = ["--out", str(tmp_path / "run")]
    for argv, expected in (
        (["--share-torso"], True),
        (["--no-share-torso"], False),
        (["--share-torso", "false"], False),
        (["--share_torso", "true"], True),
    ):
        _, config, _ = train.parse(["acer", *argv, *out])
        assert config.share_torso is expected, argv
    for spelling in ("--env", "--env-id", "--env_id"):
        _, config, _ = train.parse(["acer", spelling, "Acrobot-v1", *out])
        assert config.env_id == "Acrobot-v1"


def test_progress_is_a_bar_on_a_terminal_lines_elsewhere_and_nothing_when_quiet():
    import io

    metrics = {"time/frames": 512.0, "time/fps": 256.0, "train/return_window": 20.5}
    later = metrics | {"time/frames": 768.0}
    out = {}
    for mode in ("bar", "lines", "off"):
        buffer = io.StringIO()
        report = train.ProgressReport(1024, mode, every=3600.0, stream=buffer)
        report.update(metrics, force=True)
        report.update(later)  # within `every`: no second line
        report.close()
        out[mode] = buffer.getvalue()
    assert "768/1.02k" in out["bar"] and "return 20.5" in out["bar"] and "75%" in out["bar"]
    assert out["lines"] == "ac-train: 50% 512/1,024 frames, 256 fps, 2 s left, return 20.5\n"
    assert out["off"] == ""


def test_progress_past_the_frames_asked_says_100_percent_and_both_numbers():
    import io

    last = {"time/frames": 20480.0, "time/fps": 2048.0, "train/return_window": 500.0}
    line = train.progress_text(20480, 20000, last)
    assert line.startswith("ac-train: 100% 20,480 frames (20,000 asked)"), line
    buffer = io.StringIO()
    report = train.ProgressReport(20000, "bar", stream=buffer)
    report.update(last)
    report.close()
    assert "100%" in buffer.getvalue() and "20.0k/20.0k" in buffer.getvalue(), buffer.getvalue()


@pytest.mark.timeout(300)
def test_a_run_off_a_terminal_prints_progress_lines(tmp_path):
    out = tmp_path / "lines"
    argv = ["ppo", "--frames", "128", "--out", str(out), "--progress-seconds", "0"]
    result = cli(*argv, *[a for a in TINY if a != "--quiet"])
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("ac-train: ")]
    assert len(lines) >= 2 and "% " in lines[0] and "/128 frames" in lines[0], result.stdout
    assert lines[-1].startswith("ac-train: 100% 128/128 frames")
    assert "\r" not in result.stdout


def test_checkpoint_minutes_is_a_run_option_not_a_config_field(tmp_path):
    from ac_extensions.cli._config import UsageError

    argv = ["acer", "--checkpoint-minutes", "5", "--out", str(tmp_path / "run"), *TINY]
    name, config, args = train.parse(argv)
    assert (name, args.checkpoint_minutes) == ("acer", 5.0)
    assert not hasattr(config, "checkpoint_minutes")  # not saved with the run's config
    with pytest.raises(UsageError, match="--checkpoint-minutes must be >= 0"):
        train.parse(["acer", "--checkpoint-minutes", "-1", *TINY])


@pytest.mark.timeout(300)
def test_resuming_a_complete_run_says_so_and_trains_nothing(ppo_run, capsys):
    before = (ppo_run / "summary.json").read_bytes()
    assert train.main(["--resume", str(ppo_run)]) == 0
    out = capsys.readouterr().out
    assert f"{ppo_run} is already complete (ppo on CartPole-v1: 128 frames in " in out
    assert "nothing to train (a larger --frames continues it)" in out
    assert (ppo_run / "summary.json").read_bytes() == before


def test_the_result_line_formats_numbers_for_people():
    run = {"algorithm": "acer", "env": "Pendulum-v1", "frames": 23552, "wall_seconds": 61.04}
    line = train.result_line(run | {"final_mean_return": -1227.7279434204102})
    assert line == "acer on Pendulum-v1: 23,552 frames in 61.0 s, mean of the last returns -1,227.7"
    assert train.result_line(run | {"final_mean_return": None}).endswith("no episode finished")
    missed = run | {"final_mean_return": 20.0, "threshold": 475.0, "frames_to_threshold": None}
    assert train.result_line(missed).endswith("; did not reach 475")
    assert "None" not in train.result_line(missed)


def test_the_eval_line_formats_numbers_for_people():
    line = evaluate.result_line("acer", "Pendulum-v1", [-1227.7279, -1327.7279, -1127.7279])
    assert line == (
        "acer on Pendulum-v1: mean return -1,227.73 ± 81.65 (std) over 3 episodes, greedy actions"
    )
    line = evaluate.result_line("ppo", "CartPole-v1", [500.0], sample=True)
    assert line.endswith("500.00 ± 0.00 (std) over 1 episode, actions sampled from the policy")
    assert "over 1,200 episodes" in evaluate.result_line("ppo", "CartPole-v1", [1.0] * 1200)


@pytest.mark.timeout(300)
def test_eval_says_whether_actions_are_greedy_or_sampled(ppo_run, capsys):
    assert evaluate.main([str(ppo_run), "--episodes", "1"]) == 0
    assert capsys.readouterr().out.rstrip().endswith(" over 1 episode, greedy actions")
    assert evaluate.main([str(ppo_run), "--episodes", "1", "--sample"]) == 0
    assert "actions sampled from the policy" in capsys.readouterr().out


@pytest.mark.timeout(300)
def test_plot_puts_each_env_in_its_own_panel(ppo_run, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(ppo_run, other)
    summary = json.loads((other / "summary.json").read_text())
    (other / "summary.json").write_text(json.dumps(summary | {"env": "Acrobot-v1"}))
    groups, _ = plot.group_runs([ppo_run, other, ppo_run])
    assert sorted(groups) == ["Acrobot-v1", "CartPole-v1"]
    assert [len(v) for v in groups["CartPole-v1"].values()] == [2]
    png = tmp_path / "two.png"
    assert plot.main([str(ppo_run), str(other), "--out", str(png)]) == 0
    assert png.stat().st_size > 1000


@pytest.mark.timeout(300)
def test_eval_of_a_continuous_run_uses_its_observation_statistics(tmp_path, capsys):
    # PPO on Pendulum with normalised observations: ac-eval puts the checkpoint's statistics
    # in front of the Gaussian actor (without them the actor would read raw observations).
    from ac_extensions.cli.train import main as train_main

    out = tmp_path / "pendulum"
    flags = ["--env", "Pendulum-v1", "--frames", "2048", "--normalize-observations"]
    assert train_main(["ppo", *flags, "--out", str(out), "--quiet"]) == 0
    name, _, _, policy = evaluate.load_policy(out)
    normalizer = policy[0]
    assert name == "ppo" and float(normalizer.count) == pytest.approx(2048 + 1e-4)
    assert evaluate.main([str(out), "--episodes", "1"]) == 0
    assert "ppo on Pendulum-v1: mean return" in capsys.readouterr().out
