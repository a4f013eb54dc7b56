"""``ac-train``: train a recipe from the command line, with logs, a summary and checkpoints.

    ac-train ppo --env CartPole-v1 --frames 60000 --seed 1 --out runs/ppo-1
    ac-train ppo --resume runs/ppo-1          # continue a stopped (even SIGKILLed) run
    ac-train acer --help                      # every ACERConfig field, with its documentation
    ac-train ppo --env MinAtar/Breakout-v1    # MinAtar's defaults (PPOConfig.for_env)

Writes into ``--out DIR``: ``run.json`` (algorithm, config, and per start the commit, package
versions and machine: :func:`~ac_extensions.runtime.provenance.provenance`), ``logs/``
(TorchRL logger; CSV: ``logs/<algorithm>/scalars/<metric>.csv`` as ``frames,value`` lines),
``summary.json`` (rewritten atomically after every batch) and ``checkpoints/`` (see
:class:`~ac_extensions.runtime.Checkpointer`). SIGTERM to the ``ac-train`` process
(``kill PID``) stops a run after the batch in progress, with a checkpoint of it (exit status
143; ``--resume`` loses nothing); a second SIGTERM ends it at once. SIGKILL, a crash, or a
SIGTERM to the whole process group (``timeout``, Slurm's and systemd's default), which also
stops the collector workers at once, loses what was trained since the last periodic
checkpoint.

Fields not given on the command line take the recipe's defaults for the env's family
(classic control, MinAtar, Atari: ``Config.for_env``, see :mod:`ac_extensions.runtime.config`);
a resumed run keeps its saved config.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import inspect
import json
import math
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ac_extensions.cli._config import (
    RECIPES,
    RUN_FILE,
    HelpFormatter,
    UsageError,
    add_config_flags,
    check_env_id,
    config_to_json,
    load_recipe,
    make_config,
    read_run,
)
from ac_extensions.cli._errors import ArgumentParser, run_main

LOGGERS = {"csv": None, "tensorboard": "tensorboard", "wandb": "wandb"}
"""Logger backend → the package it needs (CSV needs none)."""
WINDOW = 20
"""``frames_to_threshold`` needs this many finished episodes in the return window."""


def build_parser(name: str | None = None, config_cls: type | None = None) -> ArgumentParser:
    """The parser of ``ac-train`` (with ``name``'s config fields when given)."""
    prog = "ac-train" if name is None else f"ac-train {name}"
    parser = ArgumentParser(
        prog=prog,
        usage=f"{prog} [options]" if name is not None else None,
        description="Train an actor-critic recipe. `ac-train ALGORITHM --help` lists the "
        "algorithm's config fields; every field is a --flag.",
        formatter_class=HelpFormatter,
    )
    if name is None:
        parser.add_argument("algorithm", choices=list(RECIPES), help="which recipe")
    run = parser.add_argument_group("run options")
    run.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="output directory (default: runs/<algorithm>-<env>-seed<seed>)",
    )
    run.add_argument(
        "--logger", choices=list(LOGGERS), default="csv", help="TorchRL logger (default: csv)"
    )
    run.add_argument(
        "--threshold",
        type=float,
        default=None,
        metavar="RETURN",
        help="return for frames_to_threshold (default: the env's reward threshold)",
    )
    run.add_argument(
        "--checkpoint-every",
        type=int,
        default=10,
        metavar="K",
        help="save a checkpoint every K updates (0: only at the end; default: 10)",
    )
    run.add_argument(
        "--checkpoint-minutes",
        type=float,
        default=0.0,
        metavar="M",
        help="and at most once every M minutes, the final one always (0: no limit; default: 0)",
    )
    run.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="DIR",
        help="continue the run in DIR from its newest checkpoint (its saved config; "
        "flags given here override it, e.g. --frames to extend it)",
    )
    run.add_argument("--quiet", action="store_true", help="no progress, no final line")
    run.add_argument(
        "--progress-seconds",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds between two progress lines off a terminal (default: 30)",
    )
    if config_cls is not None:
        add_config_flags(parser, config_cls)
    return parser


def parse(argv: list[str]) -> tuple[str, Any, argparse.Namespace]:
    """(algorithm, config, run options) from the command line."""
    if not argv or argv[0].startswith("-"):
        # No algorithm: `--help`, or `--resume DIR` (the algorithm is in DIR/run.json).
        resume = _find_resume(argv)
        if resume is None:
            build_parser().parse_args(argv)  # prints the help, or the missing-algorithm error
            raise UsageError("an algorithm is required")
        name, _ = read_run(resume)
        argv = [name, *argv]
    name = argv[0]
    if name not in RECIPES:
        raise UsageError(f"unknown algorithm {name!r} (choose from {', '.join(RECIPES)})")
    _, config_cls = load_recipe(name)
    args = build_parser(name, config_cls).parse_args(argv[1:])
    run_options = {
        "out",
        "logger",
        "threshold",
        "checkpoint_every",
        "checkpoint_minutes",
        "resume",
        "quiet",
        "progress_seconds",
    }
    given = {k: v for k, v in vars(args).items() if k not in run_options}
    if args.checkpoint_every < 0:
        raise UsageError(f"--checkpoint-every must be >= 0, got {args.checkpoint_every}")
    if not args.checkpoint_minutes >= 0:
        raise UsageError(f"--checkpoint-minutes must be >= 0, got {args.checkpoint_minutes}")
    if args.resume is not None:
        saved_name, saved = read_run(args.resume)
        if saved_name != name:
            raise UsageError(f"{args.resume} holds a {saved_name} run, not {name}")
        config = make_config(config_cls, config_to_values(saved) | given)
        if args.out is not None and args.out.resolve() != args.resume.resolve():
            raise UsageError("--out and --resume name different directories")
        args.out = args.resume
    else:
        # Defaults per env family (MinAtar, Atari) under the flags given: Config.for_env.
        env_id = given.get("env_id", config_cls.env_id)
        config = make_config(config_cls, config_cls.family_defaults(env_id) | given)
    args.threshold = _threshold(args.threshold, config.env_id)
    check_action_space(name, config.env_id, config)
    if args.out is None:
        env = config.env_id.replace("/", "_")
        args.out = Path("runs") / f"{name}-{env}-seed{config.seed}"
    if getattr(config, "backend", "local") == "ray" and importlib.util.find_spec("ray") is None:
        raise UsageError("--backend ray needs the ray package (pip install 'ac-extensions[ray]')")
    if LOGGERS[args.logger] and importlib.util.find_spec(LOGGERS[args.logger]) is None:
        raise UsageError(
            f"--logger {args.logger} needs the {LOGGERS[args.logger]} package "
            "(pip install 'ac-extensions[loggers]')"
        )
    return name, config, args


def run_record(out: Path, name: str, config) -> dict[str, Any]:
    """``run.json``: the algorithm, its config, and one :func:`provenance` entry per start.

    A resumed run keeps the entries of its earlier starts (``"code"`` lists every segment's
    commit, versions and machine, oldest first).
    """
    from ac_extensions.runtime.provenance import provenance

    starts = []
    with contextlib.suppress(OSError, ValueError, TypeError):
        starts = list(json.loads((out / RUN_FILE).read_text()).get("code", []))
    return {"algorithm": name, "config": config_to_json(config), "code": [*starts, provenance()]}


def check_action_space(name: str, env_id: str, config=None) -> None:
    """Refuse (:class:`UsageError`) an env whose action space recipe ``name`` cannot handle.

    With ``config``, also the recipe's own ``check_action_space(config)`` when it has one (a
    setting that needs a kind of action space), so nothing starts and no run directory is made.
    """
    from ac_extensions.runtime.envs import require_action_space

    module, _ = load_recipe(name)
    try:
        require_action_space(env_id, module.ACTION_SPACES, name)
        if config is not None and hasattr(module, "check_action_space"):
            module.check_action_space(config)
    except ValueError as error:
        raise UsageError(str(error)) from error


def _find_resume(argv: list[str]) -> Path | None:
    for i, arg in enumerate(argv):
        if arg == "--resume" and i + 1 < len(argv):
            return Path(argv[i + 1])
        if arg.startswith("--resume="):
            return Path(arg.split("=", 1)[1])
    return None


def config_to_values(config) -> dict[str, Any]:
    """The config's fields as keyword arguments (tuples kept)."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


def _threshold(given: float | None, env_id: str) -> float | None:
    env_threshold = check_env_id(env_id)
    return given if given is not None else env_threshold


class Tracker:
    """``frames_to_threshold`` and the last metrics, for ``summary.json``."""

    def __init__(self, threshold: float | None) -> None:
        self.threshold = threshold
        self.frames_to_threshold: float | None = None
        self.last: dict[str, float] = {}

    def update(self, metrics: dict[str, float]) -> None:
        """Account for one batch's metrics."""
        self.last = metrics
        if (
            self.frames_to_threshold is None
            and self.threshold is not None
            and metrics.get("train/return_window_size", 0) >= WINDOW
            and metrics["train/return_window"] >= self.threshold
        ):
            self.frames_to_threshold = metrics["time/frames"]

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps."""
        return {"frames_to_threshold": self.frames_to_threshold, "last": self.last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`."""
        self.frames_to_threshold = state.get("frames_to_threshold")
        self.last = dict(state.get("last", {}))


def _number(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else value


def summary(name: str, config, tracker: Tracker, *, complete: bool) -> dict[str, Any]:
    """The content of ``summary.json``."""
    last = tracker.last
    frames = last.get("time/frames", 0.0)
    seconds = last.get("time/seconds", 0.0)
    return {
        "algorithm": name,
        "env": config.env_id,
        "seed": config.seed,
        "frames": int(frames),
        "frames_target": config.frames,
        "complete": complete,
        "wall_seconds": round(seconds, 3),
        "fps": round(frames / seconds, 1) if seconds else None,
        "threshold": tracker.threshold,
        "frames_to_threshold": _number(tracker.frames_to_threshold),
        "final_mean_return": _number(last.get("train/return_window")),
        "final_return_episodes": int(last.get("train/return_window_size", 0)),
        "config": config_to_json(config),
    }


class ProgressReport:
    """A run's progress: a ``tqdm`` bar on a terminal, else one plain line every ``every`` s.

    Both give the percentage, frames, frames per second, the time left at that rate and the
    latest return window; the plain lines are for logs (``nohup``, a redirect, CI, a cluster
    job), where a bar would be one endless line.

    Args:
        total: the run's frames.
        mode: ``"bar"``, ``"lines"`` or ``"off"``.
        every: seconds between two plain lines.
        stream: where to write (standard output).
    """

    def __init__(self, total: int, mode: str, every: float = 30.0, stream=None) -> None:
        self.total, self.mode, self.every = total, mode, every
        self.stream = stream or sys.stdout
        self.bar = None
        self.shown = time.monotonic()

    def update(self, metrics: dict[str, float], force: bool = False) -> None:
        """Account for one batch's metrics (a plain line when ``every`` s passed or ``force``)."""
        frames = int(metrics.get("time/frames", 0))
        window = metrics.get("train/return_window", math.nan)
        if self.mode == "bar":
            if self.bar is None:
                from tqdm import tqdm

                self.bar = tqdm(
                    total=self.total,
                    initial=0,
                    unit="frame",
                    unit_scale=True,
                    dynamic_ncols=True,
                    file=self.stream,
                )
            self.bar.update(max(0, min(frames, self.total) - self.bar.n))  # ends at 100%
            if math.isfinite(window):
                self.bar.set_postfix_str(f"return {window:,.1f}", refresh=False)
        elif self.mode == "lines":
            now = time.monotonic()
            if force or now - self.shown >= self.every:
                self.shown = now
                print(progress_text(frames, self.total, metrics), file=self.stream, flush=True)

    def close(self) -> None:
        """End the bar (once)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def progress_text(frames: int, total: int, metrics: dict[str, float]) -> str:
    """One plain progress line.

    The last batch can take a run past the frames asked (runs collect whole batches): the line
    then says 100% and both numbers.

    Example:
        >>> progress_text(5120, 20480, {"time/fps": 2560.0, "train/return_window": 41.25})
        'ac-train: 25% 5,120/20,480 frames, 2,560 fps, 6 s left, return 41.2'
        >>> progress_text(20480, 20000, {"time/fps": 2560.0})
        'ac-train: 100% 20,480 frames (20,000 asked), 2,560 fps, 0 s left, no episode finished yet'
    """
    fps = metrics.get("time/fps", 0.0)
    if frames > total:
        parts = [f"ac-train: 100% {frames:,} frames ({total:,} asked)"]
    else:
        parts = [f"ac-train: {100 * frames / max(total, 1):.0f}% {frames:,}/{total:,} frames"]
    if fps > 0:
        parts.append(f"{fps:,.0f} fps")
        parts.append(f"{_duration(max(0.0, total - frames) / fps)} left")
    window = metrics.get("train/return_window", math.nan)
    parts.append(
        "no episode finished yet" if not math.isfinite(window) else f"return {window:,.1f}"
    )
    return ", ".join(parts)


def _duration(seconds: float) -> str:
    """``seconds`` as "1 h 05 min", "12 min" or "40 s"."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min"


def truncate_logs(directory: Path, frames: float) -> None:
    """Drop CSV rows logged after the checkpoint a resumed run starts from."""
    from ac_extensions.runtime import atomic_write_text

    for path in directory.rglob("*.csv"):
        lines = path.read_text().splitlines()
        kept = [line for line in lines if line and float(line.split(",", 1)[0]) <= frames]
        if len(kept) != len(lines):
            atomic_write_text(path, "".join(line + "\n" for line in kept))


def make_logger(backend: str, out: Path, name: str, config, state: dict | None):
    """The TorchRL logger (``logs/<name>/...`` under ``out`` for CSV)."""
    from torchrl.record.loggers import get_logger

    kwargs: dict[str, Any] = {}
    if backend == "wandb":
        kwargs["wandb_kwargs"] = {"config": config_to_json(config), "project": "ac_extensions"}
    logger = get_logger(backend, str(out / "logs"), name, state_dict=state, **kwargs)
    if state is None:
        try:
            logger.log_hparams(config_to_json(config))
        except Exception:  # hyper-parameters are a convenience
            pass
    return logger


def prepare_output(args: argparse.Namespace, checkpointer, tracker: Tracker) -> dict | None:
    """Check ``--out`` / ``--resume`` before anything is written; return a W&B logger state.

    A resumed run gets the tracker's state back and its CSV logs cut at the checkpoint.
    """
    out: Path = args.out
    if args.resume is None:
        if (out / "checkpoints" / checkpointer.POINTER).exists():
            raise UsageError(f"{out} already holds a run: pass --resume {out} or another --out")
        if (out / RUN_FILE).exists() and (out / "logs").is_dir():
            shutil.rmtree(out / "logs")  # a run of ours stopped before its first checkpoint
        return None
    if checkpointer.latest() is None:
        raise UsageError(f"{out} has no checkpoint to resume from")
    state = checkpointer.load()  # CheckpointError for a corrupt one
    extra = state.get("extra", {})
    tracker.load_state_dict(extra.get("tracker", {}))
    truncate_logs(out / "logs", state["progress"]["frames"])
    if args.logger == "wandb" == extra.get("logger_backend"):
        return extra.get("logger")  # the W&B run id; CSV and TensorBoard just append
    return None


STOPPED_STATUS = 128 + signal.SIGTERM
"""``ac-train``'s exit status when SIGTERM stopped it after a checkpoint (143, the shells'
code for a process ended by SIGTERM)."""


@contextlib.contextmanager
def stop_on_sigterm(checkpointer):
    """While the body trains, SIGTERM asks ``checkpointer`` to save and stop the run.

    The batch in progress is finished and checkpointed, then the recipe raises
    :class:`~ac_extensions.runtime.RunStopped` (``ac-train`` exits with
    :data:`STOPPED_STATUS`): a run stopped that way (the benchmark grids stop theirs so)
    resumes with nothing lost. A second SIGTERM takes the default action (the process ends at
    once; the last checkpoint written stays), so a run stuck in a batch can still be ended
    without SIGKILL. Without a checkpointer (a recipe with no checkpoint support) SIGTERM
    keeps its default action. Only in the main thread (signal handlers live there).
    """
    if checkpointer is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame) -> None:
        if checkpointer.stop_requested:  # the second one: end now
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        checkpointer.request_stop()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def train_command(argv: list[str]) -> int:
    """Parse, check, train; return the exit status."""
    name, config, args = parse(argv)
    from ac_extensions.runtime import Checkpointer, RunStopped, atomic_write_text

    module, _ = load_recipe(name)
    out: Path = args.out
    resumable = "checkpoint" in inspect.signature(module.train).parameters
    if not resumable and args.resume is not None:
        raise UsageError(f"the {name} recipe has no checkpoint support yet: cannot resume")
    done = None if args.resume is None else complete_summary(out, config.frames)
    if done is not None:  # nothing to train: the run and its files stay as they are
        if not args.quiet:
            print(
                f"ac-train: {out} is already complete ({result_line(done)}); nothing to train "
                f"(a larger --frames continues it)"
            )
        return 0
    tracker = Tracker(args.threshold)
    checkpointer = Checkpointer(
        out / "checkpoints",
        every=args.checkpoint_every,
        min_seconds=60 * args.checkpoint_minutes,
    )
    logger_state = prepare_output(args, checkpointer, tracker)

    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / RUN_FILE, json.dumps(run_record(out, name, config), indent=1) + "\n")
    logger = make_logger(args.logger, out, name, config, logger_state)

    def extra() -> dict[str, Any]:
        state = {"tracker": tracker.state_dict(), "logger_backend": args.logger}
        try:
            state["logger"] = logger.state_dict()
        except Exception:  # a backend without resumable state
            pass
        return state

    checkpointer.extra = extra
    mode = "off" if args.quiet else "bar" if sys.stdout.isatty() else "lines"
    line = ProgressReport(config.frames, mode, args.progress_seconds)

    def write_summary(complete: bool) -> None:
        text = json.dumps(summary(name, config, tracker, complete=complete), indent=1)
        atomic_write_text(out / "summary.json", text + "\n")

    write_summary(complete=False)
    try:
        if not resumable and not args.quiet:
            print(f"ac-train: warning: the {name} recipe saves no checkpoints", file=sys.stderr)
        hook = {"checkpoint": checkpointer} if resumable else {}
        with stop_on_sigterm(checkpointer if resumable else None):
            for metrics in module.train(config, **hook):
                tracker.update(metrics)
                step = int(metrics["time/frames"])
                finite = {k: v for k, v in metrics.items() if math.isfinite(v)}
                logger.log_metrics(finite, step=step)
                write_summary(complete=False)
                line.update(metrics)
        line.update(tracker.last, force=True)
    except RunStopped:
        line.close()
        frames = int(tracker.last.get("time/frames", 0))
        print(
            f"ac-train: stopped by SIGTERM at {frames:,} frames, checkpoint saved; "
            f"continue with: ac-train {name} --resume {out}",
            file=sys.stderr,
        )
        return STOPPED_STATUS
    finally:
        line.close()
    write_summary(complete=True)
    if not args.quiet:
        result = summary(name, config, tracker, complete=True)
        print(f"{result_line(result)}; wrote {out / 'summary.json'}")
    return 0


def complete_summary(out: Path, frames: int) -> dict[str, Any] | None:
    """The ``summary.json`` of a run in ``out`` complete at ``frames`` or more, else None."""
    try:
        result = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    complete = result.get("complete") and int(result.get("frames") or 0) >= frames
    return result if complete else None


def result_line(result: dict[str, Any]) -> str:
    """A run's outcome for people: frames, seconds, the return window, the threshold.

    Example:
        >>> run = {"algorithm": "ppo", "env": "CartPole-v1", "frames": 20480,
        ...     "wall_seconds": 12.34, "final_mean_return": 480.25}
        >>> result_line(run)
        'ppo on CartPole-v1: 20,480 frames in 12.3 s, mean of the last returns 480.2'
        >>> result_line(run | {"threshold": 475.0, "frames_to_threshold": 18432.0})[75:]
        '; reached 475 at 18,432 frames'
    """
    final = result.get("final_mean_return")
    text = (
        f"{result['algorithm']} on {result['env']}: {result['frames']:,} frames in "
        f"{result['wall_seconds']:.1f} s, "
        + ("no episode finished" if final is None else f"mean of the last returns {final:,.1f}")
    )
    threshold, reached = result.get("threshold"), result.get("frames_to_threshold")
    if threshold is not None:
        target = f"{threshold:,g}"
        text += (
            f"; did not reach {target}"
            if reached is None
            else f"; reached {target} at {int(reached):,} frames"
        )
    return text


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``ac-train`` (and ``python -m ac_extensions``)."""
    return run_main("ac-train", train_command, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
