"""What every recipe shares: the run configuration, the collector's life cycle, progress metrics."""

from __future__ import annotations

import functools
import gc
import math
import multiprocessing as mp
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import traceback
import uuid
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from queue import Empty
from typing import Any, Literal

import numpy as np
import torch
from tensordict import NestedKey, TensorDictBase
from torch import Tensor, nn
from torchrl.collectors import MultiAsyncCollector, MultiSyncCollector
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
    backend: Literal["local", "ray"] = "local"
    """Collection backend: ``local`` (TorchRL's ``MultiSyncCollector``, W worker processes on
    this machine) or ``ray`` (TorchRL's ``RayCollector``, W collector actors on a Ray cluster;
    ACER and Reactor then keep their replay in a Ray actor the collectors write into; needs
    the ``ray`` extra, see :mod:`ac_extensions.recipes._ray`)."""
    start_method: Literal["fork", "spawn", "forkserver"] | None = None
    """How the local backend starts its worker processes (``multiprocessing`` start methods).
    ``spawn`` (TorchRL's default) starts a fresh interpreter that imports torch, TorchRL and
    the env again: ~4–5 s per run on this machine before the first frame. ``fork`` copies the
    learner process instead (~0.1 s); Linux/macOS only, and not with a CUDA learner (CUDA does
    not survive a fork). None: ``fork`` where that is possible (a CPU learner on Linux),
    otherwise ``spawn``."""
    ray_address: str | None = None
    """Ray cluster to join with backend ``ray`` (``auto``, ``HOST:6379``, ``ray://HOST:10001``);
    None starts a local Ray instance for the run and stops it afterwards."""
    max_nonfinite_updates: int = 10
    """Fault tolerance: an update whose loss or gradient norm is NaN/inf is skipped (no
    optimiser step), a batch with a NaN/inf observation or reward is dropped (no learning, not
    stored); each warns and counts in ``train/skipped_updates`` / ``train/skipped_batches``.
    This many in a row stop the run (``NonFiniteError``, no checkpoint written for it)."""

    def __post_init__(self) -> None:
        for name in (
            "frames",
            "workers",
            "envs_per_worker",
            "rollout_length",
            "return_window",
            "max_nonfinite_updates",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not 0 <= self.gamma <= 1:
            raise ValueError(f"gamma must lie in [0, 1], got {self.gamma}")
        if self.backend not in ("local", "ray"):
            raise ValueError(f"backend must be 'local' or 'ray', got {self.backend!r}")
        if self.ray_address is not None and self.backend != "ray":
            raise ValueError(
                f"ray_address ({self.ray_address!r}) needs backend 'ray', got {self.backend!r}"
            )
        if self.start_method not in (None, "fork", "spawn", "forkserver"):
            raise ValueError(
                f"start_method must be 'fork', 'spawn', 'forkserver' or None, got "
                f"{self.start_method!r}"
            )
        if self.start_method == "fork" and torch.device(self.device).type == "cuda":
            raise ValueError(
                "start_method 'fork' cannot be used with a CUDA learner (CUDA does not survive "
                "a fork): use 'spawn'"
            )
        if self.backend == "ray" and torch.device(self.device).type != "cpu":
            raise ValueError(
                f"backend 'ray' runs the learner on CPU (its actors act on CPU and receive "
                f"CPU weights), got device {self.device!r}"
            )

    @property
    def frames_per_batch(self) -> int:
        """W · E · T."""
        return self.workers * self.envs_per_worker * self.rollout_length

    @property
    def worker_start_method(self) -> str:
        """The start method the local collector's workers use (``start_method`` resolved)."""
        if self.start_method is not None:
            return self.start_method
        if sys.platform == "linux" and torch.device(self.device).type == "cpu":
            return "fork"
        return "spawn"


class SharedWeights(SharedMemWeightSyncScheme):
    """TorchRL's shared-memory weight sync, minus its finaliser, watching its workers.

    (The second part: :meth:`_wait_for_ack` raises :class:`WorkerError` for a dead worker
    instead of waiting for it forever.)

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

    ACK_POLL = 0.5
    """Seconds between two looks at the workers while waiting for their weight acknowledgments."""

    def _wait_for_ack(self, worker_ids=None, timeout=None) -> None:
        """Wait for the workers' acknowledgments of new weights, watching that they live.

        TorchRL's version waits on each worker's ack queue without a timeout, so a worker that
        died (SIGKILL, a crash) between two batches hangs ``update_policy_weights_()`` forever.
        Here the wait looks at the workers every :attr:`ACK_POLL` seconds and raises
        :class:`WorkerError` for a dead one. ``timeout`` is ignored: a live worker always
        answers.
        """
        if worker_ids is None:
            targets = list(self._ack_queues)
        elif isinstance(worker_ids, int):
            targets = [worker_ids]
        else:
            targets = list(worker_ids)
        for worker in targets:
            while True:
                try:
                    self._ack_queues[worker].get(timeout=self.ACK_POLL)
                    break
                except Empty:
                    failure = worker_failure(self.context)
                    if failure is not None:
                        raise failure from None


class WorkerError(RuntimeError):
    """A collector worker process died: killed, crashed, or its environment raised.

    The message names each dead worker (index and pid) and the cause: the signal or exit code,
    or the exception its environment raised (with where). It is raised within about a second
    of the death, the collector is shut down, and the run stops before the batch in progress
    is checkpointed, so the newest checkpoint stays the last complete one.

    Attributes:
        worker: index of the (first) dead worker, or None when unknown.
        pid: its process id, or None when unknown.
        cause: what happened to it, e.g. ``"was killed by signal SIGKILL"``.
    """

    def __init__(
        self,
        message: str,
        *,
        worker: int | None = None,
        pid: int | None = None,
        cause: str | None = None,
    ) -> None:
        super().__init__(message)
        self.worker, self.pid, self.cause = worker, pid, cause


WORKER_TRACEBACKS_VARIABLE = "AC_WORKER_TRACEBACKS"
"""Set to ``0`` to keep a worker whose env raised from printing its traceback (``ac-train`` does,
unless ``AC_DEBUG`` is set): the :class:`WorkerError` already names the exception and where."""


def _worker_tracebacks() -> bool:
    return os.environ.get(WORKER_TRACEBACKS_VARIABLE, "1") != "0"


def _exit_cause(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return f"was killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode} (its stderr has the details)"


def _read_report(directory: str | os.PathLike | None, pid: int | None) -> str | None:
    if directory is None or pid is None:
        return None
    try:
        return (Path(directory) / f"{pid}.txt").read_text().strip() or None
    except OSError:
        return None


def worker_failure(collector) -> WorkerError | None:
    """A :class:`WorkerError` describing the dead workers of ``collector``; None if none died.

    Reads the collector's ``procs`` (TorchRL's worker processes) and, for a
    :class:`SupervisedCollector`, the pids recorded at start and the workers' error reports.
    Workers TorchRL itself stopped after another one died are not reported.
    """
    procs = list(getattr(collector, "procs", None) or ())
    pids = list(getattr(collector, "worker_pids", None) or [None] * len(procs))
    reports = getattr(collector, "worker_reports", None)
    failures = []
    for index, (proc, pid) in enumerate(zip(procs, pids, strict=False)):
        raised = _read_report(reports, pid)
        if raised is not None:
            cause = f"died: its environment raised {raised}"
            if _worker_tracebacks():
                cause += "; traceback on its stderr"
        elif getattr(proc, "_closed", False) or proc.exitcode is None:
            continue  # alive, or terminated (and closed) by TorchRL after another one died
        else:
            cause = _exit_cause(proc.exitcode)
        failures.append((index, pid, cause))
    if not failures:
        return None
    message = "; ".join(
        f"collector worker {index} (pid {pid if pid is not None else '?'}) {cause}"
        for index, pid, cause in failures
    )
    index, pid, cause = failures[0]
    return WorkerError(
        f"{message}; training stopped",
        worker=index,
        pid=pid,
        cause=cause,
    )


def _report_errors(method: Callable, directory: str) -> Callable:
    @functools.wraps(method)
    def call(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except Exception as error:
            path = Path(directory) / f"{os.getpid()}.txt"
            try:
                if not path.exists():  # the first error is the cause
                    frame = traceback.extract_tb(error.__traceback__)[-1]
                    where = f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}"
                    message = " ".join(str(error).split())
                    atomic_write_text(path, f"{type(error).__name__}: {message} ({where})\n")
                if not _worker_tracebacks():  # the process is dying: silence its traceback
                    sys.stderr = open(os.devnull, "w")
            except Exception:  # reporting must never hide the original error
                pass
            raise

    return call


class ReportingEnvFactory:
    """A picklable env factory whose envs write what they raise where the learner can read it.

    A worker process that dies of an exception prints its traceback on its own stderr and
    exits with code 1; TorchRL's main process only sees the exit code. The env built here has
    its ``_step``, ``_reset`` and ``step_and_maybe_reset`` (those of the returned TorchRL env,
    transforms included) wrapped: the first exception is written, as
    ``"Type: message (file:line in function)"``, to ``<directory>/<pid>.txt`` before it
    propagates, and :func:`worker_failure` reads it back.
    With :data:`WORKER_TRACEBACKS_VARIABLE` set to ``0`` the dying worker prints no traceback.

    Args:
        factory: the env factory (picklable: it runs in the worker process).
        directory: where the reports go (created by the first report, removed by
            :class:`SupervisedCollector`).
    """

    def __init__(self, factory: Callable, directory: str | os.PathLike) -> None:
        self.factory = factory
        self.directory = str(directory)

    def __call__(self, *args, **kwargs):
        """Build the env and wrap its ``_step`` / ``_reset`` / ``step_and_maybe_reset``.

        The last is the collector's entry point, which a bare ``VectorGymEnv`` implements
        without ``_step``; wrapped as instance attributes.
        """
        env = self.factory(*args, **kwargs)
        for name in ("_step", "_reset", "step_and_maybe_reset"):
            setattr(env, name, _report_errors(getattr(env, name), self.directory))
        return env


class _Supervised:
    """Mixin for TorchRL's multi-process collectors: a dead worker becomes a :class:`WorkerError`.

    With TorchRL alone, a worker that dies while the main process waits for a batch is noticed
    within a second but reported as a bare ``RuntimeError`` naming only its index and exit
    code, and one that dies while the main process waits for weight acknowledgments hangs it
    forever. Here the envs report their exceptions (:class:`ReportingEnvFactory`), the weight
    sync watches the workers (:class:`SharedWeights`), and both cases raise
    :class:`WorkerError` with the worker's index, pid and cause. Failed workers are not
    restarted: the run stops (resume it from its newest checkpoint).

    Args:
        create_env_fn: one env factory per worker (wrapped in :class:`ReportingEnvFactory`).
        *args: the rest of the collector's arguments.
        **kwargs: the rest of the collector's arguments.
    """

    def __init__(self, create_env_fn: list[Callable], *args, **kwargs) -> None:
        # Created by the first worker that reports (so a killed learner rarely leaves one).
        self.worker_reports = os.path.join(
            tempfile.gettempdir(), f"ac-worker-errors-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        )
        self.worker_pids: list[int | None] = []
        factories = [ReportingEnvFactory(f, self.worker_reports) for f in create_env_fn]
        try:
            super().__init__(factories, *args, **kwargs)
        except BaseException:
            shutil.rmtree(self.worker_reports, ignore_errors=True)
            raise
        self.worker_pids = [proc.pid for proc in self.procs]

    def iterator(self):
        """TorchRL's batches; a dead worker raises :class:`WorkerError` instead."""
        try:
            yield from super().iterator()
        except WorkerError:
            raise
        except Exception as error:
            failure = worker_failure(self)
            if failure is None:
                raise
            raise failure from error

    def shutdown(self, *args, **kwargs) -> None:
        """Stop the workers (TorchRL's shutdown) and remove the error reports."""
        try:
            super().shutdown(*args, **kwargs)
        finally:
            shutil.rmtree(self.worker_reports, ignore_errors=True)


class SupervisedCollector(_Supervised, MultiSyncCollector):
    """TorchRL's ``MultiSyncCollector`` that turns a dead worker into a :class:`WorkerError`.

    Every worker collects its E·T frames, the batch ``[W, E, T]`` comes out, and the workers
    wait until the next batch is asked for (see :class:`_Supervised` for the supervision).
    """


class SupervisedAsyncCollector(_Supervised, MultiAsyncCollector):
    """TorchRL's ``MultiAsyncCollector`` that turns a dead worker into a :class:`WorkerError`.

    Each batch is one worker's ``[E, T]``, in the order they finish; a worker starts its next
    rollout as soon as its batch is handed over, so collection overlaps the learner's update
    (see :class:`_Supervised` for the supervision).
    """


@dataclass(frozen=True)
class ReplayFeed:
    """What collectors need to write their batches into a replay themselves (Ray backend).

    With ``backend="ray"``, :func:`start_collector` gives every collector actor a writer that
    stores each batch as :func:`label_sequences` would on the learner, so ``replay`` must be
    the recipe's Ray-hosted replay; the local backend ignores the feed (the learner stores).
    """

    replay: Any
    """The replay the collectors extend (a TorchRL ``RayReplayBuffer``)."""
    keys: tuple[NestedKey, ...]
    """Entries kept in the replay."""
    sequence_key: NestedKey
    """Where each row's sequence id goes (the sampler's trajectory key)."""
    reward_scale: float = 1.0
    """Factor on ``("next", "reward")`` before storage."""
    first_sequence: int = 0
    """Sequence ids start here (a resumed run continues after the restored replay's)."""
    return_stored: bool = False
    """Collectors return the stored rows too (ACER's on-policy update trains on them), not only
    the episode returns and policy versions."""


def label_sequences(
    batch: TensorDictBase,
    keys,
    first_sequence: int,
    reward_scale: float = 1.0,
    sequence_key: NestedKey = ("replay", "sequence"),
) -> TensorDictBase:
    """Rows ``[R, T]`` as a replay stores them: ``keys`` only, scaled rewards, sequence ids.

    Multiplies ``("next", "reward")`` by ``reward_scale`` (on a copy of the selection; the
    caller's batch is untouched) and writes ``first_sequence + r`` for row r, constant along
    the row, under ``sequence_key``.
    """
    batch = batch.select(*keys)
    batch.set(("next", "reward"), batch.get(("next", "reward")) * reward_scale)
    rows, steps = batch.shape
    ids = torch.arange(first_sequence, first_sequence + rows).unsqueeze(-1).expand(rows, steps)
    return batch.set(sequence_key, ids)


def collector_metrics(batch: TensorDictBase) -> dict[str, float]:
    """``collector/policy_version``: the newest policy version the batch was collected with.

    Present when the collector tracks versions (the Ray backend's actors do, see
    :mod:`ac_extensions.recipes._ray`); it grows by one per weight update the actors receive.
    """
    version = batch.get("policy_version", None)
    return {} if version is None else {"collector/policy_version": float(version.max())}


def start_collector(
    config: RunConfig,
    env_factory: Callable,
    policy: nn.Module,
    *,
    frames: int | None = None,
    seed: int | None = None,
    feed: ReplayFeed | None = None,
    asynchronous: bool = False,
):
    """``MultiSyncCollector`` with ``config.workers`` processes, seeded; yields ``[W, E, T]``.

    A :class:`SupervisedCollector`: a worker that dies raises :class:`WorkerError` (promptly,
    naming it and the cause) instead of a bare error or a hang. With ``asynchronous``, a
    :class:`SupervisedAsyncCollector` (TorchRL's ``MultiAsyncCollector``) instead: it yields
    each worker's ``[E, T]`` as it finishes, and the workers go on collecting while the
    learner trains (local backend only).
    Weights reach the workers through shared memory (:class:`SharedWeights`). ``frames`` and
    ``seed`` default to the config's; a resumed run passes the frames still to collect and a
    seed offset by the batches done (so its environments do not replay the first episodes).

    With ``config.backend == "ray"``: TorchRL's ``RayCollector`` with W actors instead, same
    layout, the actors writing into ``feed.replay`` when a ``feed`` is given
    (:func:`ac_extensions.recipes._ray.start_ray_collector`).
    """
    if config.backend == "ray":
        from ac_extensions.recipes._ray import start_ray_collector

        return start_ray_collector(
            config,
            env_factory,
            policy,
            frames=config.frames if frames is None else frames,
            seed=config.seed if seed is None else seed,
            feed=feed,
        )
    if asynchronous:  # (the Ray backend returned above)
        kind, frames_per_batch = SupervisedAsyncCollector, config.frames_per_batch // config.workers
    else:
        kind, frames_per_batch = SupervisedCollector, config.frames_per_batch
    with start_method(config.worker_start_method):  # the workers start in the constructor
        collector = kind(
            [env_factory] * config.workers,
            policy,
            frames_per_batch=frames_per_batch,
            total_frames=config.frames if frames is None else frames,
            env_device="cpu",
            policy_device=config.device,
            storing_device=config.device,
            weight_sync_schemes={"policy": SharedWeights()},
        )
    collector.set_seed(config.seed if seed is None else seed)
    return collector


@contextmanager
def start_method(method: str) -> Iterator[None]:
    """Make ``method`` the global ``multiprocessing`` start method inside the block.

    TorchRL's collectors take their start method from the global setting (``spawn`` when
    unset) when they start their workers; the setting the caller had before is restored after
    the block, so nothing outside the recipe changes.
    """
    previous = mp.get_start_method(allow_none=True)
    mp.set_start_method(method, force=True)
    try:
        yield
    finally:
        mp.set_start_method(previous, force=True)


def stop_collector(collector, replay=None) -> None:
    """Shut the workers down and drop the collector while the interpreter is fully alive.

    TorchRL leaves the weight-sync scheme's clean-up to its finaliser, which can hang
    (:class:`SharedWeights`); it is shut down here, explicitly. With the Ray backend this also
    closes a Ray-hosted ``replay`` and stops a Ray instance the run started (never a cluster
    it joined); a local ``replay`` is left alone.
    """
    try:
        collector.shutdown()
        for scheme in (getattr(collector, "_weight_sync_schemes", None) or {}).values():
            scheme.shutdown()
    finally:
        if hasattr(collector, "ray_runtime") or hasattr(replay, "ray_runtime"):
            from ac_extensions.recipes._ray import close

            close(replay)
            close(collector)
        del collector
        gc.collect()


def close_replay(replay) -> None:
    """Close a Ray-hosted replay (and its lease on Ray); a local replay is left alone."""
    if hasattr(replay, "ray_runtime"):
        from ac_extensions.recipes._ray import close

        close(replay)


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
        """Account for a batch of ``frames`` in which episodes with ``returns`` finished.

        Non-finite returns (an episode that saw a NaN reward) are left out of the metrics.
        """
        self.frames += frames
        returns = [r for r in returns if math.isfinite(r)]
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


# --- Non-finite values -------------------------------------------------------------------------


class TrainingWarning(UserWarning):
    """A fault the run survives: a skipped update, a dropped batch, a checkpoint not written.

    ``ac-train`` shows these as one ``warning:`` line each (it hides other libraries' warnings).
    """


class NonFiniteError(RuntimeError):
    """Too many non-finite updates or batches in a row: the run stops.

    Raised before the batch in progress is checkpointed; since no optimiser step ever used a
    non-finite loss or gradient, the newest checkpoint holds the last (finite) parameters.
    """


CHECKED_KEYS: tuple[NestedKey, ...] = ("observation", ("next", "observation"), ("next", "reward"))
"""The batch entries :meth:`NonFiniteGuard.batch_ok` checks (floating-point ones only)."""


class NonFiniteGuard:
    """Skip non-finite updates and batches, warn, count; stop after too many in a row.

    Every recipe's update asks :meth:`update_ok` after ``backward()`` and the gradient clip: a
    NaN or infinite total loss or gradient norm skips ``optimizer.step()`` and what follows it
    (the average / target network update, the replay priorities), so the parameters never take
    a non-finite step. Every collected batch is first checked by :meth:`batch_ok`: one with a
    NaN or infinite observation or reward (:data:`CHECKED_KEYS`) is dropped, so nothing learns
    from it and it never enters a replay (the losses would refuse it: they raise on non-finite
    rewards); its frames still count. Each skip warns (:class:`TrainingWarning`) and is
    counted in :meth:`metrics` (cumulative, also over a resumed run: :meth:`state_dict`).
    ``max_consecutive`` skipped updates in a row, or as many dropped batches in a row, raise
    :class:`NonFiniteError`.

    Args:
        max_consecutive: the streak that stops the run (``RunConfig.max_nonfinite_updates``).
    """

    def __init__(self, max_consecutive: int = 10) -> None:
        if max_consecutive <= 0:
            raise ValueError(f"max_consecutive must be > 0, got {max_consecutive}")
        self.max_consecutive = max_consecutive
        self.skipped_updates = 0
        self.skipped_batches = 0
        self.updates_in_a_row = 0
        self.batches_in_a_row = 0

    def update_ok(self, loss: Tensor | float, grad_norm: Tensor | float) -> bool:
        """Whether the optimiser step may go ahead: ``loss`` and ``grad_norm`` are finite.

        Otherwise the skip is counted and warned about, and returns False.

        Raises:
            NonFiniteError: at ``max_consecutive`` skipped updates in a row.
        """
        if isinstance(loss, float) and isinstance(grad_norm, float):  # no tensor ops needed
            finite = math.isfinite(loss) and math.isfinite(grad_norm)
        else:
            loss = torch.as_tensor(loss).detach()
            grad_norm = torch.as_tensor(grad_norm).detach()
            finite = bool(torch.isfinite(loss).all() & torch.isfinite(grad_norm).all())
        if finite:
            self.updates_in_a_row = 0
            return True
        self.skipped_updates += 1
        self.updates_in_a_row += 1
        self._skipped(
            f"non-finite update skipped (loss {float(torch.as_tensor(loss).sum()):.4g}, "
            f"gradient norm {float(torch.as_tensor(grad_norm).sum()):.4g})",
            self.updates_in_a_row,
            self.skipped_updates,
            "updates",
        )
        return False

    def batch_ok(self, batch: TensorDictBase, keys: tuple[NestedKey, ...] = CHECKED_KEYS) -> bool:
        """Whether ``batch`` may be learnt from: its ``keys`` hold no NaN or infinity.

        Missing and non-floating entries are not checked. Otherwise the drop is counted and
        warned about (naming the entries), and returns False.

        Raises:
            NonFiniteError: at ``max_consecutive`` dropped batches in a row.
        """
        bad = []
        for key in keys:
            value = batch.get(key, None)
            if isinstance(value, Tensor) and value.is_floating_point():
                count = int((~torch.isfinite(value)).sum())
                if count:
                    bad.append(f"{key!r} ({count} of {value.numel()})")
        if not bad:
            self.batches_in_a_row = 0
            return True
        self.skipped_batches += 1
        self.batches_in_a_row += 1
        self._skipped(
            f"batch of {batch.numel()} frames dropped: non-finite {', '.join(bad)}",
            self.batches_in_a_row,
            self.skipped_batches,
            "batches",
        )
        return False

    def _skipped(self, what: str, in_a_row: int, total: int, kind: str) -> None:
        if in_a_row >= self.max_consecutive:
            raise NonFiniteError(
                f"{what}: {in_a_row} non-finite {kind} in a row (max_nonfinite_updates "
                f"{self.max_consecutive}); training stopped, no checkpoint written for this batch"
            )
        warnings.warn(
            f"{what} ({in_a_row} in a row, {total} in total)", TrainingWarning, stacklevel=3
        )

    def metrics(self) -> dict[str, float]:
        """``train/skipped_updates`` and ``train/skipped_batches`` (cumulative counts)."""
        return {
            "train/skipped_updates": float(self.skipped_updates),
            "train/skipped_batches": float(self.skipped_batches),
        }

    def state_dict(self) -> dict[str, int]:
        """The cumulative counts, as checkpoint counters."""
        return {"skipped_updates": self.skipped_updates, "skipped_batches": self.skipped_batches}

    def load_state_dict(self, counters: dict[str, Any]) -> None:
        """Continue the counts from a checkpoint's counters (absent: 0)."""
        self.skipped_updates = int(counters.get("skipped_updates", 0))
        self.skipped_batches = int(counters.get("skipped_batches", 0))


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
    A write that fails (a full disk) leaves it too, and no partial files; a periodic save that
    fails only warns, the final one raises (:meth:`maybe_save`).

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
        self.failed_saves = 0
        """Periodic saves that failed (and were skipped with a warning) so far."""

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

        A periodic save that fails with an ``OSError`` (a full disk, a lost mount) warns
        (:class:`TrainingWarning`) and the run goes on: the previous checkpoint stays the newest,
        intact, and the next periodic save tries again. The final save raises instead, so that
        a run never ends as complete without its last checkpoint.

        Returns:
            The checkpoint's path, or None when nothing was saved.
        """
        if not final and (self.every == 0 or updates % self.every):
            return None
        if final:
            return self.save(updates, state(), replay=replay)
        try:
            return self.save(updates, state(), replay=replay)
        except OSError as error:
            self.failed_saves += 1
            warnings.warn(
                f"{error}; training goes on and the next checkpoint tries again",
                TrainingWarning,
                stacklevel=2,
            )
            return None

    def _pointed(self) -> str | None:
        try:
            return (self.directory / self.POINTER).read_text().strip() or None
        except OSError:
            return None

    def save(self, updates: int, state: dict[str, Any], *, replay=None) -> Path:
        """Write a checkpoint atomically (temporary directory, rename, pointer, clean-up).

        A write that fails half-way (``ENOSPC``: the disk is full) removes what it wrote and
        leaves the previous checkpoint and the ``latest`` pointer as they were.

        Raises:
            OSError: the write failed; the message names the checkpoint and the one kept.
        """
        if self.extra is not None:
            state = state | {"extra": self.extra()}
        name = f"ckpt-{updates:09d}"
        final = self.directory / name
        tmp = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=self.directory, prefix=f".{name}."))
            with open(tmp / self.STATE, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            if replay is not None:
                replay.dumps(tmp / self.REPLAY)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            atomic_write_text(self.directory / self.POINTER, name + "\n")
        except BaseException as error:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            if final.exists() and self._pointed() != name:  # renamed, but the pointer failed
                shutil.rmtree(final, ignore_errors=True)
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
        return final
