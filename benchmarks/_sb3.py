"""The Stable-Baselines3 runs as the grids run them: logs and checkpoints in ``ac-train``'s layout.

An SB3 run runs in a child process of its grid. :class:`SB3Log` writes what ``ac-train`` writes
(``summary.json`` and the ``train/return_window`` / ``time/seconds`` CSVs), so one reader
handles both; :class:`SB3Checkpoint` saves SB3's model, its replay buffer and the counters
every few minutes and when the run is stopped, and :func:`learn_sb3` runs ``model.learn``
with both, stopping cleanly on SIGTERM.
"""

from __future__ import annotations

import json
import math
import signal
import time
from collections import deque
from pathlib import Path
from typing import Any

WINDOW = 100
"""Finished episodes in the moving mean (the MinAtar paper's metric)."""


CHECKPOINT_MINUTES = 5.0
"""Every run saves a checkpoint about this often (ours: ``ac-train --checkpoint-minutes``; a
replaying run otherwise writes its replay every 10 updates, every few seconds on MuJoCo), and
an SB3 run also when it is stopped."""


LOG_EVERY = 1000
"""An SB3 run writes a CSV row at most every this many frames (and at the end)."""


CURVE = "train/return_window"


CURVE_SIZE = "train/return_window_size"


SECONDS = "time/seconds"


def jsonable(settings: dict[str, Any]) -> dict[str, Any]:
    def value(v):
        if callable(v) and not isinstance(v, type):
            return f"linear from {v(1.0)} to 0"
        if isinstance(v, type):
            return v.__name__
        if isinstance(v, dict):
            return {k: value(x) for k, x in v.items()}
        if isinstance(v, float) and not math.isfinite(v):
            return str(v)
        return v

    return {k: value(v) for k, v in settings.items()}


class SB3Log:
    """``ac-train``'s layout for an SB3 run: ``logs/<algo>/scalars/*.csv`` and ``summary.json``."""

    def __init__(self, out: Path, algo: str, env_id: str, seed: int, frames: int, config) -> None:
        self.out, self.algo, self.env_id, self.seed = out, algo, env_id, seed
        self.frames_target, self.config = frames, config
        self.scalars = out / "logs" / algo / "scalars"
        self.start = time.perf_counter()
        self.window: deque[float] = deque(maxlen=WINDOW)
        self.episodes = 0
        self.frames = 0
        self.logged = -math.inf
        self.resumed_at: list[int] = []
        self.saved_seconds: float | None = None
        self.code = self._code_record(out)

    @staticmethod
    def _code_record(out: Path) -> list[dict]:
        """The earlier starts' provenance (from ``summary.json``) and this one's."""
        from ac_extensions.runtime.provenance import provenance

        starts = []
        try:
            starts = list(json.loads((out / "summary.json").read_text()).get("code", []))
        except (OSError, ValueError, TypeError):
            pass
        return [*starts, provenance(("stable-baselines3", "sb3-contrib"))]

    def episode(self, episode_return: float) -> None:
        """Account for one finished episode."""
        self.window.append(float(episode_return))
        self.episodes += 1

    def step(self, frames: int, force: bool = False) -> None:
        """Write a CSV row (every :data:`LOG_EVERY` frames, or now with ``force``)."""
        self.frames = frames
        if not self.window or (not force and frames - self.logged < LOG_EVERY):
            return
        self.logged = frames
        seconds = time.perf_counter() - self.start
        for name, value in (
            (CURVE, sum(self.window) / len(self.window)),
            (CURVE_SIZE, len(self.window)),
            (SECONDS, seconds),
            ("time/frames", frames),
            ("train/episodes", self.episodes),
        ):
            path = self.scalars / f"{name}.csv"
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as f:
                f.write(f"{frames},{value}\n")
        self.write_summary(complete=False)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the log (see :meth:`restore`).

        Its clock is remembered as ``saved_seconds``, the seconds a stopped run's summary
        reports.
        """
        self.saved_seconds = time.perf_counter() - self.start
        return {
            "window": list(self.window),
            "episodes": self.episodes,
            "frames": self.frames,
            "seconds": self.saved_seconds,
            "logged": None if self.logged == -math.inf else self.logged,
            "resumed_at": list(self.resumed_at),
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state`: the episode window, the counters and the clock.

        CSV rows past the checkpoint's frames (written before the run was stopped, by steps
        the resumed run makes again) are dropped, so every curve stays one increasing line.
        """
        self.window = deque(state["window"], maxlen=WINDOW)
        self.episodes, self.frames = state["episodes"], state["frames"]
        self.start = time.perf_counter() - state["seconds"]
        self.logged = -math.inf if state["logged"] is None else state["logged"]
        self.resumed_at = [*state["resumed_at"], state["frames"]]
        from ac_extensions.cli.train import truncate_logs  # what ac-train --resume does

        truncate_logs(self.scalars, self.frames)

    def write_summary(self, complete: bool, seconds: float | None = None) -> None:
        """Rewrite ``summary.json`` (atomically), with the clock now or at ``seconds``."""
        from ac_extensions.runtime import atomic_write_text

        if seconds is None:
            seconds = time.perf_counter() - self.start
        summary = {
            "algorithm": self.algo,
            "env": self.env_id,
            "seed": self.seed,
            "frames": int(self.frames),
            "frames_target": self.frames_target,
            "complete": complete,
            "wall_seconds": round(seconds, 3),
            "fps": round(self.frames / seconds, 1) if seconds and self.frames else None,
            "final_mean_return": sum(self.window) / len(self.window) if self.window else None,
            "final_return_episodes": len(self.window),
            "resumed_at_frames": self.resumed_at,
            "config": self.config,
            "code": self.code,
        }
        atomic_write_text(self.out / "summary.json", json.dumps(summary, indent=1) + "\n")


class SB3Stopped(Exception):
    """Ends SB3's ``learn`` once a stopped SB3 run has saved its checkpoint."""


class SB3Checkpoint:
    """Checkpoints of one SB3 run, so that a stopped run goes on where it was.

    The SB3 runs that matter here take hours (``sb3_dqn`` ≈1–4 h per MinAtar run, with the
    load): longer than a job can run undisturbed on a shared machine. They are written by
    ``ac-train``'s :class:`~ac_extensions.runtime.Checkpointer` (same layout, same atomic
    write, same full-disk handling; :func:`has_checkpoint` and :func:`action` treat both
    alike): ``checkpoints/latest`` names ``ckpt-<frames>/``, which holds ``state.pt`` (the
    counters SB3 does not load with the parameters, and the episode window and clock of the
    :class:`SB3Log`), ``model.zip`` (SB3's file: the policy, its target network where it has
    one, and the optimiser state), ``replay.pkl`` (off-policy algorithms: SB3's replay buffer) and
    what ``extra_save`` writes (the MuJoCo grid's SB3 runs: their ``VecNormalize`` statistics).

    It is saved at the start of a rollout, when everything collected so far has been trained
    on (nothing is half done): at least every ``every`` seconds (a periodic save that fails,
    a full disk, warns and the run goes on), and after the process got SIGTERM or SIGINT (the
    grid stops runs with SIGTERM), which then ends training with :class:`SB3Stopped`. Not
    kept: the episodes in progress (a resumed run's envs start new ones, their frames stay
    counted) and the random streams (reseeded with ``seed + frames``), so a resumed run is
    not, draw for draw, the run that was never stopped.
    """

    def __init__(self, out: Path, every: float = 60 * CHECKPOINT_MINUTES, extra_save=None) -> None:
        from ac_extensions.runtime import Checkpointer

        self.checkpointer = Checkpointer(Path(out) / "checkpoints", every=1, min_seconds=every)
        self.extra_save = extra_save
        self.stop_requested = False

    def latest(self) -> Path | None:
        """The newest complete checkpoint folder, or None."""
        return self.checkpointer.latest()

    def saved_frames(self) -> int:
        """Frames of the newest checkpoint (0 without one)."""
        state = self.checkpointer.load()
        return 0 if state is None else state["frames"]

    def save(self, model, log: SB3Log, *, final: bool = True) -> Path | None:
        """Write a checkpoint of ``model`` and ``log``; return its folder.

        ``final=False``: only if ``every`` seconds have passed since the last one (None
        otherwise, or when the write failed and was warned about).
        """
        frames = int(model.num_timesteps)
        counters = {  # DQN's _n_calls paces its target copies; the others count
            k: getattr(model, k)
            for k in ("_n_calls", "_n_updates", "_episode_num")
            if hasattr(model, k)
        }

        def state() -> dict:
            log.frames = frames
            return {"frames": frames, "counters": counters, "log": log.state()}

        def files(folder: Path) -> None:
            model.save(folder / "model.zip")
            if getattr(model, "replay_buffer", None) is not None:
                model.save_replay_buffer(folder / "replay.pkl")
            if self.extra_save is not None:
                self.extra_save(folder)

        return self.checkpointer.maybe_save(frames, state, files=files, final=final)

    def restore(self, model, log: SB3Log) -> int:
        """Load the newest checkpoint into a freshly built ``model`` and ``log``.

        Returns its frames (``model.num_timesteps``), 0 when there is none.
        """
        path, state = self.checkpointer.latest(), self.checkpointer.load()
        if state is None:
            return 0
        model.set_parameters(str(path / "model.zip"), exact_match=True, device=model.device)
        model.num_timesteps = state["frames"]
        for name, value in state["counters"].items():
            setattr(model, name, value)
        if (path / "replay.pkl").is_file():
            model.load_replay_buffer(path / "replay.pkl")
        log.restore(state["log"])
        return state["frames"]

    def callback(self, log: SB3Log):
        """The SB3 callback that saves (and stops) at rollout starts."""
        from stable_baselines3.common.callbacks import BaseCallback

        checkpoint = self

        class Checkpointing(BaseCallback):
            def _on_rollout_start(self) -> None:
                if checkpoint.stop_requested:
                    checkpoint.save(self.model, log)
                    raise SB3Stopped(f"stopped at {self.model.num_timesteps:,} frames")
                checkpoint.save(self.model, log, final=False)

            def _on_step(self) -> bool:
                return True

        return Checkpointing()


def learn_sb3(model, log: SB3Log, checkpoint: SB3Checkpoint, frames: int, seed: int) -> bool:
    """Train ``model`` to ``frames``, logging episodes and saving checkpoints; write the summary.

    ``model`` is freshly built; if ``checkpoint`` holds one it is restored first (and the
    random streams reseeded with ``seed + frames``; build the envs with that seed too). Returns
    whether the run is complete: False when SIGTERM/SIGINT stopped it (its checkpoint saved).
    """
    from stable_baselines3.common.callbacks import BaseCallback

    done = checkpoint.restore(model, log)
    if done:
        model.set_random_seed(seed + done)
        print(f"resumed from the checkpoint at {done:,} frames", flush=True)
    log.write_summary(complete=False)

    class Logger(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    log.episode(info["episode"]["r"])
            log.step(self.num_timesteps)
            return True

    def request_stop(signum, frame) -> None:
        checkpoint.stop_requested = True

    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        if model.num_timesteps < frames:
            model.learn(
                total_timesteps=frames - model.num_timesteps,
                callback=[Logger(), checkpoint.callback(log)],
                reset_num_timesteps=not done,
            )
    except SB3Stopped as stop:
        print(f"{stop}; the same command resumes it", flush=True)
        # The summary of a stopped run is its checkpoint's: frames and clock as saved (the
        # seconds spent writing the checkpoint are not counted, as the resumed run's clock
        # goes on from the saved one), so a resumed run's seconds never fall below it.
        log.frames = model.num_timesteps
        log.write_summary(complete=False, seconds=log.saved_seconds)
        return False
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    log.step(model.num_timesteps, force=True)
    log.write_summary(complete=True)
    return True
