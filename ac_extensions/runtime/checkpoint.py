"""Checkpoints: atomic writes of a run's state (networks, optimiser, replay, RNG, counters)."""

from __future__ import annotations

import os
import pickle
import random
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ac_extensions.runtime.guards import TrainingWarning
from ac_extensions.runtime.progress import Progress


def rng_state(generator: torch.Generator | None = None) -> dict[str, Any]:
    """Every random stream a recipe draws from: torch (CPU, CUDA), numpy, ``random``, its own.

    Tensors and plain Python values only (a checkpoint is read with ``weights_only=True``).
    """
    name, keys, pos, has_gauss, cached = np.random.get_state()  # noqa: NPY002 (global stream)
    return {
        "torch": torch.get_rng_state(),
        "numpy": {
            "name": str(name),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": random.getstate(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "generator": None if generator is None else generator.get_state(),
    }


def set_rng_state(state: dict[str, Any], generator: torch.Generator | None = None) -> None:
    """Restore what :func:`rng_state` saved (also the numpy tuple older checkpoints hold)."""
    torch.set_rng_state(state["torch"])
    saved = state["numpy"]
    if isinstance(saved, dict):
        keys = saved["keys"].numpy().astype(np.uint32)
        saved = (saved["name"], keys, saved["pos"], saved["has_gauss"], saved["cached_gaussian"])
    np.random.set_state(saved)  # noqa: NPY002
    random.setstate(state["python"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if generator is not None and state["generator"] is not None:
        generator.set_state(state["generator"])


def safe_load(path: Path) -> Any:
    """``torch.load(path)`` with ``weights_only=True``: tensors and plain Python values only.

    Unpickling can run code; a restricted unpickler reads nothing else. The numpy arrays and
    dtypes this library's older checkpoints hold (a saved numpy random state) are allowed too.

    Raises:
        CheckpointError: one line naming the file, for anything else it holds, or when it
            cannot be read at all.
    """
    allowed = [np.ndarray, np.dtype, np.dtypes.UInt32DType, np.dtypes.Int64DType]
    allowed.append(np._core.multiarray._reconstruct)
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        found = re.search(r"GLOBAL (\S+)", str(error))
        if found is None:  # a damaged file, not a forbidden object
            raise CheckpointError(f"cannot read {path}: {_detail(error)}") from error
        raise CheckpointError(
            f"refusing to read {path}: it holds {found.group(1)}, not only tensors and plain "
            f"values (unpickling it could run code)"
        ) from error
    except Exception as error:  # truncated, not a torch file
        raise CheckpointError(f"cannot read {path}: {_detail(error)}") from error


def _detail(error: BaseException) -> str:
    """The informative line of a loading error (torch's start with a long preamble)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    specific = [line for line in lines if line.startswith("Unsupported")]
    return (specific or lines or [type(error).__name__])[0]


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


class RunStopped(Exception):
    """Training stopped on request (:meth:`Checkpointer.request_stop`) after a checkpoint.

    Raised by :meth:`Checkpointer.maybe_save` once the checkpoint of the batch just trained on
    is written; ``path`` is that checkpoint, from which ``--resume`` continues.
    """

    def __init__(self, path: Path, updates: int) -> None:
        super().__init__(f"stopped after {updates} updates; checkpoint {path}")
        self.path, self.updates = path, updates


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


def _fsync_tree(root: Path) -> None:
    """``fsync`` every file below ``root`` and every directory from ``root`` down.

    So that a checkpoint named by ``latest`` is on disk whole after a power loss or kernel
    crash too, not only after a killed process (the replay's and SB3's writers do not sync).
    """
    for folder, _, names in os.walk(root):
        for name in names:
            _fsync(Path(folder, name))
        _fsync(Path(folder))


def _fsync(path: Path) -> None:
    """``fsync`` a file, or a directory (making the renames and creations inside it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Checkpointer:
    """Atomic checkpoints of one run in ``directory``, every ``every`` updates and at the end.

    Layout: ``directory/latest`` names the newest complete checkpoint, ``directory/ckpt-<N>/``
    (N: updates done) holds ``state.pt`` (``torch.save`` of the recipe's state dict) and, for
    off-policy recipes, ``replay/`` (``ReplayBuffer.dumps``; a memmap storage is copied as its
    memmap files). A checkpoint is written into a temporary directory that is then renamed, and
    ``latest`` is replaced atomically after it, so a run killed at any moment (SIGKILL
    included) leaves the previous complete checkpoint readable; older ones are then deleted.
    A write that fails (a full disk) leaves it too, and no partial files; a periodic save that
    fails only warns, the final one raises (:meth:`maybe_save`).

    Args:
        directory: where the checkpoints go.
        every: save after every this many updates (collected batches); 0: only at the end.
        extra: optional callable whose dict is saved along (the caller's own counters, e.g.
            the CLI's threshold tracker); :meth:`load` returns it under ``"extra"``.
        min_seconds: skip a periodic save while fewer than this many seconds have passed
            since the last save (or since this object was made): for long runs whose updates
            come every few seconds and whose checkpoints hold a replay (tens to hundreds of
            MB). 0 (the default): every ``every`` updates, however soon.
    """

    POINTER = "latest"
    STATE = "state.pt"
    REPLAY = "replay"

    def __init__(
        self,
        directory: str | os.PathLike,
        every: int = 10,
        extra: Callable[[], dict] | None = None,
        min_seconds: float = 0.0,
    ) -> None:
        if every < 0:
            raise ValueError(f"every must be >= 0, got {every}")
        if not min_seconds >= 0:
            raise ValueError(f"min_seconds must be >= 0, got {min_seconds}")
        self.directory = Path(directory)
        self.every = every
        self.extra = extra
        self.min_seconds = float(min_seconds)
        self._saved_at = time.monotonic()
        self.failed_saves = 0
        """Periodic saves that failed (and were skipped with a warning) so far."""
        self.stop_requested = False
        """Set by :meth:`request_stop`: the next :meth:`maybe_save` saves and stops the run."""

    def request_stop(self) -> None:
        """Ask the run to stop at its next :meth:`maybe_save`, with a checkpoint.

        Safe to call from a signal handler (it only sets a flag). The recipe's next call of
        :meth:`maybe_save` (after the batch in progress, once it is trained on) then saves
        whatever ``every`` and ``min_seconds`` say and raises :class:`RunStopped`; ``ac-train``
        calls it on SIGTERM, so a run stopped that way loses nothing.
        """
        self.stop_requested = True

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
        state = safe_load(path / self.STATE)
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
        self,
        updates: int,
        state: Callable[[], dict[str, Any]],
        *,
        replay=None,
        files: Callable[[Path], None] | None = None,
        final=False,
    ) -> Path | None:
        """Save ``state()`` (and ``replay``, ``files``) every ``every`` updates and when ``final``.

        A periodic save also waits for ``min_seconds`` since the last one (the next multiple
        of ``every`` after that saves).

        A periodic save that fails with an ``OSError`` (a full disk, a lost mount) warns
        (:class:`TrainingWarning`) and the run goes on: the previous checkpoint stays the newest,
        intact, and the next periodic save tries again. The final save raises instead, so that
        a run never ends as complete without its last checkpoint.

        After :meth:`request_stop`, it saves now, raising on failure as a final save does,
        and then raises :class:`RunStopped` (unless ``final``: the run ends anyway).

        Returns:
            The checkpoint's path, or None when nothing was saved.
        """
        if self.stop_requested and not final:
            path = self.save(updates, state(), replay=replay, files=files)
            raise RunStopped(path, updates)
        if not final and (self.every == 0 or updates % self.every):
            return None
        if not final and time.monotonic() - self._saved_at < self.min_seconds:
            return None
        if final:
            return self.save(updates, state(), replay=replay, files=files)
        try:
            return self.save(updates, state(), replay=replay, files=files)
        except OSError as error:
            self.failed_saves += 1
            warnings.warn(
                f"{error}; training goes on and the next checkpoint tries again",
                TrainingWarning,
                stacklevel=2,
            )
            return None

    def _undo(self, name: str, tmp: Path | None, aside: Path | None) -> None:
        """After a failed :meth:`save` of ``name``: leave the checkpoints as they were.

        Removes the temporary write ``tmp``; puts back the checkpoint of the same name moved
        to ``aside``, or removes a renamed ``name`` that ``latest`` does not name.
        """
        final = self.directory / name
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if aside is not None and (aside / name).exists():
            if final.exists():
                shutil.rmtree(final, ignore_errors=True)
            os.replace(aside / name, final)
        elif final.exists() and self._pointed() != name:  # renamed, but the pointer failed
            shutil.rmtree(final, ignore_errors=True)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)

    def _pointed(self) -> str | None:
        try:
            return (self.directory / self.POINTER).read_text().strip() or None
        except OSError:
            return None

    def save(
        self,
        updates: int,
        state: dict[str, Any],
        *,
        replay=None,
        files: Callable[[Path], None] | None = None,
    ) -> Path:
        """Write a checkpoint atomically (temporary directory, rename, pointer, clean-up).

        ``files``, when given, is called with the temporary directory before the rename, to
        write files of the caller's own format beside ``state.pt`` (the benchmark's
        Stable-Baselines3 runs write their ``model.zip`` and replay there); what it writes is
        part of the same atomic checkpoint. A write that fails half-way (``ENOSPC``: the disk
        is full) removes what it wrote and leaves the previous checkpoint and the ``latest``
        pointer as they were, also when it was a checkpoint of the same count (kept aside
        until the new one is in place). Every file is ``fsync``-ed before ``latest`` names it.

        Raises:
            OSError: the write failed; the message names the checkpoint and the one kept.
        """
        if self.extra is not None:
            state = state | {"extra": self.extra()}
        name = f"ckpt-{updates:09d}"
        final = self.directory / name
        tmp = aside = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=self.directory, prefix=f".{name}."))
            with open(tmp / self.STATE, "wb") as f:
                torch.save(state, f)
            if replay is not None:
                replay.dumps(tmp / self.REPLAY)
            if files is not None:
                files(tmp)
            _fsync_tree(tmp)  # every file on disk before ``latest`` can name them
            if final.exists():  # the same count again (e.g. a final save after a resume):
                # moved aside, not deleted, until the new one is in place (``latest`` may
                # name it); :meth:`_undo` puts it back if anything below fails.
                aside = Path(tempfile.mkdtemp(dir=self.directory, prefix=f".{name}.old."))
                os.replace(final, aside / name)
            os.replace(tmp, final)
            tmp = None
            atomic_write_text(self.directory / self.POINTER, name + "\n")
            _fsync(self.directory)
        except BaseException as error:
            self._undo(name, tmp, aside)
            if not isinstance(error, OSError):
                raise
            kept = self._pointed()
            message = (
                f"checkpoint {name} not written in {self.directory} "
                f"({error.strerror or error}); "
                + (f"{kept} is still the newest, intact" if kept else "there is no earlier one")
            )
            if error.errno is None:
                raise OSError(message) from error
            raise OSError(error.errno, message) from error
        for old in self.directory.iterdir():  # older checkpoints and interrupted writes
            if old.is_dir() and old.name != name and old.name.lstrip(".").startswith("ckpt-"):
                shutil.rmtree(old, ignore_errors=True)
        self._saved_at = time.monotonic()
        return final
