"""What every recipe shares: the run configuration, the collector's life cycle, progress metrics."""

from __future__ import annotations

import gc
import math
import os
import random
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torchrl.collectors import MultiSyncCollector
from torchrl.weight_update import SharedMemWeightSyncScheme


@dataclass(frozen=True)
class RunConfig:
    """Fields common to every recipe (defaults: CartPole-v1 on this 2-core machine)."""

    env_id: str = "CartPole-v1"
    """Gymnasium id (a discrete action space; the ACER recipe also takes a 1-D Box)."""
    frames: int = 100_000
    """Total environment frames to collect."""
    workers: int = 2
    """Collector worker processes (W); this machine has 2 cores."""
    envs_per_worker: int = 8
    """Environments each worker steps at once (E): amortises TorchRL's per-step overhead."""
    rollout_length: int = 32
    """Steps per environment per batch (T); a batch is W·E·T frames."""
    gamma: float = 0.98
    """Discount γ."""
    lr: float = 1e-3
    """Learning rate."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    entropy_coeff: float = 0.0
    """Entropy bonus coefficient."""
    critic_coeff: float = 0.5
    """Critic loss coefficient."""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """MLP widths."""
    return_window: int = 20
    """Finished episodes averaged in ``train/return_window``."""
    seed: int = 0
    """Seed for torch and the environments."""
    device: str = "cpu"
    """Learner device (``cpu`` or ``cuda``); workers step the environments on CPU."""

    def __post_init__(self) -> None:
        for name in ("frames", "workers", "envs_per_worker", "rollout_length", "return_window"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not 0 <= self.gamma <= 1:
            raise ValueError(f"gamma must lie in [0, 1], got {self.gamma}")

    @property
    def frames_per_batch(self) -> int:
        """W · E · T."""
        return self.workers * self.envs_per_worker * self.rollout_length


class SharedWeights(SharedMemWeightSyncScheme):
    """TorchRL's shared-memory weight sync, minus its finaliser.

    ``WeightSyncScheme.__del__`` calls ``shutdown()``, which puts a message on a
    ``multiprocessing.Queue`` and so starts the queue's feeder thread. Run from the garbage
    collector, that can deadlock: if the collection happens while the thread machinery's lock
    is held (inside another ``Thread.start``), the new thread never starts and the process
    waits forever. Seen with torchrl 0.14.1 in a worker at start-up (py-spy: ``__del__`` →
    ``_shared.py:1117 shutdown`` → ``Queue.put`` → ``Thread.start``) and in the main process
    at interpreter exit (research/anchors.md §1b). Every copy of this class (the workers
    unpickle their own) is shut down explicitly instead: the workers' copies by TorchRL's
    worker loop, the trainer's by :func:`stop_collector`.
    """

    def __del__(self) -> None:
        pass


def start_collector(
    config: RunConfig,
    env_factory: Callable,
    policy: nn.Module,
    *,
    frames: int | None = None,
    seed: int | None = None,
):
    """``MultiSyncCollector`` with ``config.workers`` processes, seeded; yields ``[W, E, T]``.

    Weights reach the workers through shared memory (:class:`SharedWeights`). ``frames`` and
    ``seed`` default to the config's; a resumed run passes the frames still to collect and a
    seed offset by the batches done (so its environments do not replay the first episodes).
    """
    collector = MultiSyncCollector(
        [env_factory] * config.workers,
        policy,
        frames_per_batch=config.frames_per_batch,
        total_frames=config.frames if frames is None else frames,
        env_device="cpu",
        policy_device=config.device,
        storing_device=config.device,
        weight_sync_schemes={"policy": SharedWeights()},
    )
    collector.set_seed(config.seed if seed is None else seed)
    return collector


def stop_collector(collector) -> None:
    """Shut the workers down and drop the collector while the interpreter is fully alive.

    TorchRL leaves the weight-sync scheme's clean-up to its finaliser, which can hang
    (:class:`SharedWeights`); it is shut down here, explicitly.
    """
    collector.shutdown()
    for scheme in (getattr(collector, "_weight_sync_schemes", None) or {}).values():
        scheme.shutdown()
    del collector
    gc.collect()


class Progress:
    """Episode returns and throughput, as ``train/*`` and ``time/*`` metrics."""

    def __init__(self, window: int) -> None:
        self.window: deque[float] = deque(maxlen=window)
        self.frames = 0
        self.start = time.perf_counter()

    def state_dict(self) -> dict[str, Any]:
        """Frames, the return window and the seconds elapsed: what a resumed run continues."""
        return {
            "frames": self.frames,
            "window": list(self.window),
            "seconds": time.perf_counter() - self.start,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` (time keeps counting from the saved seconds)."""
        self.frames = int(state["frames"])
        self.window.clear()
        self.window.extend(state["window"])
        self.start = time.perf_counter() - float(state["seconds"])

    def update(self, frames: int, returns: list[float]) -> dict[str, float]:
        """Account for a batch of ``frames`` in which episodes with ``returns`` finished."""
        self.frames += frames
        self.window.extend(returns)
        elapsed = time.perf_counter() - self.start
        return {
            "train/episodes": float(len(returns)),
            "train/episode_return": sum(returns) / len(returns) if returns else math.nan,
            "train/return_window": sum(self.window) / len(self.window) if self.window else math.nan,
            "train/return_window_size": float(len(self.window)),
            "time/frames": float(self.frames),
            "time/seconds": elapsed,
            "time/fps": self.frames / elapsed,
        }


# --- Checkpoints -------------------------------------------------------------------------------


def rng_state(generator: torch.Generator | None = None) -> dict[str, Any]:
    """Every random stream a recipe draws from: torch (CPU, CUDA), numpy, ``random``, its own."""
    state = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),  # noqa: NPY002 (global stream)
        "python": random.getstate(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "generator": None if generator is None else generator.get_state(),
    }
    return state


def set_rng_state(state: dict[str, Any], generator: torch.Generator | None = None) -> None:
    """Restore what :func:`rng_state` saved."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])  # noqa: NPY002
    random.setstate(state["python"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if generator is not None and state["generator"] is not None:
        generator.set_state(state["generator"])


LAZY_PREFIX = "_value_estimator."
"""Buffers of the value estimator a TorchRL loss builds on its first call (γ, λ copied from the
config): left out of checkpoints, since a loss just built does not have them yet."""


def loss_state_dict(loss: nn.Module) -> dict[str, Any]:
    """The loss's state dict (networks, average/target parameters) without lazy buffers."""
    return {k: v for k, v in loss.state_dict().items() if not k.startswith(LAZY_PREFIX)}


def load_loss_state_dict(loss: nn.Module, state: dict[str, Any]) -> None:
    """Load :func:`loss_state_dict` into a loss (strictly, lazy buffers aside)."""
    state = {k: v for k, v in state.items() if not k.startswith(LAZY_PREFIX)}
    missing, unexpected = loss.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith(LAZY_PREFIX)]
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint does not match the loss: missing {missing}, unexpected {unexpected}"
        )


def training_state(
    loss: nn.Module, optimizer, progress: Progress, generator=None, **counters
) -> dict[str, Any]:
    """One checkpoint's content.

    The loss's state (networks, average/target parameters), the optimiser's, the progress, the
    random streams and the recipe's counters (``batches``, ...).
    """
    return {
        "loss": loss_state_dict(loss),
        "optimizer": optimizer.state_dict(),
        "progress": progress.state_dict(),
        "rng": rng_state(generator),
        "counters": counters,
    }


def restore_training_state(
    state: dict[str, Any], loss: nn.Module, optimizer, progress: Progress, generator=None
) -> dict[str, Any]:
    """Load :func:`training_state` back into the objects; return the counters."""
    load_loss_state_dict(loss, state["loss"])
    optimizer.load_state_dict(state["optimizer"])
    progress.load_state_dict(state["progress"])
    set_rng_state(state["rng"], generator)
    return dict(state["counters"])


def resume(checkpoint, loss: nn.Module, optimizer, progress: Progress, generator=None) -> dict:
    """Restore the newest checkpoint of ``checkpoint`` (a :class:`Checkpointer` or None).

    Returns:
        The saved counters (``{}`` for a fresh run).
    """
    state = None if checkpoint is None else checkpoint.load()
    if state is None:
        return {}
    return restore_training_state(state, loss, optimizer, progress, generator)


class CheckpointError(RuntimeError):
    """A checkpoint that is missing or cannot be read."""


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and ``os.replace``.

    Readers see the old content or the new one, never half of it (also after a SIGKILL).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class Checkpointer:
    """Atomic checkpoints of one run in ``directory``, every ``every`` updates and at the end.

    Layout: ``directory/latest`` names the newest complete checkpoint, ``directory/ckpt-<N>/``
    (N: updates done) holds ``state.pt`` (``torch.save`` of the recipe's state dict) and, for
    off-policy recipes, ``replay/`` (``ReplayBuffer.dumps``; a memmap storage is copied as its
    memmap files). A checkpoint is written into a temporary directory that is then renamed, and
    ``latest`` is replaced atomically after it, so a run killed at any moment (SIGKILL
    included) leaves the previous complete checkpoint readable; older ones are then deleted.

    Args:
        directory: where the checkpoints go.
        every: save after every this many updates (collected batches); 0: only at the end.
        extra: optional callable whose dict is saved along (the caller's own counters, e.g.
            the CLI's threshold tracker); :meth:`load` returns it under ``"extra"``.
    """

    POINTER = "latest"
    STATE = "state.pt"
    REPLAY = "replay"

    def __init__(
        self,
        directory: str | os.PathLike,
        every: int = 10,
        extra: Callable[[], dict] | None = None,
    ) -> None:
        if every < 0:
            raise ValueError(f"every must be >= 0, got {every}")
        self.directory = Path(directory)
        self.every = every
        self.extra = extra

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None if there is none."""
        pointer = self.directory / self.POINTER
        if not pointer.is_file():
            return None
        path = self.directory / pointer.read_text().strip()
        if not (path / self.STATE).is_file():
            raise CheckpointError(f"{pointer} names {path.name}, which has no {self.STATE}")
        return path

    def load(self) -> dict[str, Any] | None:
        """The newest checkpoint's state dict (None if there is none).

        Raises:
            CheckpointError: when the checkpoint cannot be read.
        """
        path = self.latest()
        if path is None:
            return None
        try:
            state = torch.load(path / self.STATE, map_location="cpu", weights_only=False)
        except Exception as error:  # truncated, not a torch file, unpickling failure
            raise CheckpointError(f"cannot read {path / self.STATE}: {error}") from error
        if not isinstance(state, dict) or "counters" not in state:
            raise CheckpointError(f"{path / self.STATE} is not a training checkpoint")
        return state

    def load_replay(self, replay) -> None:
        """Fill ``replay`` (built empty by the recipe) from the newest checkpoint."""
        path = self.latest()
        if path is None or not (path / self.REPLAY).is_dir():
            raise CheckpointError(f"no replay saved in {self.directory}")
        replay.loads(path / self.REPLAY)

    def maybe_save(
        self, updates: int, state: Callable[[], dict[str, Any]], *, replay=None, final=False
    ) -> Path | None:
        """Save ``state()`` (and ``replay``) every ``every`` updates and when ``final``.

        Returns:
            The checkpoint's path, or None when nothing was saved.
        """
        if not final and (self.every == 0 or updates % self.every):
            return None
        return self.save(updates, state(), replay=replay)

    def save(self, updates: int, state: dict[str, Any], *, replay=None) -> Path:
        """Write a checkpoint atomically (temporary directory, rename, pointer, clean-up)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.extra is not None:
            state = state | {"extra": self.extra()}
        name = f"ckpt-{updates:09d}"
        tmp = Path(tempfile.mkdtemp(dir=self.directory, prefix=f".{name}."))
        try:
            with open(tmp / self.STATE, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            if replay is not None:
                replay.dumps(tmp / self.REPLAY)
            final = self.directory / name
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        atomic_write_text(self.directory / self.POINTER, name + "\n")
        for old in self.directory.iterdir():  # older checkpoints and interrupted writes
            if old.is_dir() and old.name != name and old.name.lstrip(".").startswith("ckpt-"):
                shutil.rmtree(old, ignore_errors=True)
        return final
