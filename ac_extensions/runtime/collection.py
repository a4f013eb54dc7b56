"""Collection: start, supervise and stop TorchRL's multi-process collectors.

:func:`start_collector` starts TorchRL's ``MultiSyncCollector`` (or ``MultiAsyncCollector``)
with supervised workers (:class:`SupervisedCollector`): a worker that dies raises
:class:`WorkerError` naming it and the cause, and every worker exits within about a second
when the learner process dies, by any signal, SIGKILL included (:func:`watch_parent`).
:class:`OverlappedCollector` collects each batch while the learner trains on the one before,
with weights fixed by the batch count (``overlap_collection``).
:func:`shutdown_collector` stops any TorchRL collector without TorchRL's interpreter-exit
hang; :func:`stop_collector` also closes what the Ray backend
(:mod:`ac_extensions.runtime.ray_backend`, the same interface) acquired.
"""

from __future__ import annotations

import functools
import gc
import multiprocessing as mp
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from queue import Empty

from torch import nn
from torchrl.collectors import MultiAsyncCollector, MultiSyncCollector
from torchrl.weight_update import SharedMemWeightSyncScheme

from ac_extensions.runtime.checkpoint import atomic_write_text
from ac_extensions.runtime.config import RunConfig
from ac_extensions.runtime.sequences import ReplayFeed


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
    at interpreter exit. Every copy of this class (the workers
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


PARENT_POLL = 0.25
"""Seconds between two looks of :func:`watch_parent` at the learner process."""

_watching: set[int] = set()


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped, counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (macOS): signal 0 tells whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def watch_parent(learner_pid: int, interval: float = PARENT_POLL) -> None:
    """Exit this process (``os._exit(1)``) within ``interval`` seconds of ``learner_pid``'s death.

    Called in a collector worker, with the pid of the learner that started it. A daemon thread
    looks every ``interval`` seconds: when the worker's parent is no longer the learner (a
    forked or spawned worker is re-parented when the learner dies, whatever killed it: a
    signal it could not handle, SIGKILL included, skips every clean-up of the learner's), or,
    for a worker whose parent is a fork server, when the learner process is gone or a zombie.
    Without it, TorchRL's workers outlive a SIGKILLed learner: they block on their pipes
    forever (two were still alive 78 minutes after such a kill). The thread calls
    ``os._exit`` since the worker's main thread may be blocked in a queue or pipe read.

    A worker that exits normally once the learner is dead or dying ends with ``os._exit(1)``
    too, from an ``atexit`` hook: a spawned TorchRL worker does exit when the learner dies (its
    pipe to the learner closes and its loop returns), but through the interpreter's
    finalisation, which takes seconds after ``import torch``, could hang in a finaliser, and
    stops the watch thread (daemon threads cannot run then). The hook also counts a learner
    the kernel is still tearing down (Linux: ``PF_EXITING``) as dead: the worker reads the
    end of its pipe before it is re-parented, and a plain parent check would miss it.

    No-op when called again in the same process for the same learner, or in the learner.
    """
    if learner_pid == os.getpid() or learner_pid in _watching:
        return
    _watching.add(learner_pid)
    parent = os.getppid()
    direct = parent == learner_pid

    def gone() -> bool:
        return (os.getppid() != parent) if direct else not _alive(learner_pid)

    def watch() -> None:
        while True:
            if gone():
                os._exit(1)
            time.sleep(interval)

    def dying() -> bool:
        try:
            with open(f"/proc/{learner_pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return False  # gone (gone() says so) or no /proc
        return fields[0] in "ZXx" or bool(int(fields[6]) & 0x4)  # 0x4: PF_EXITING

    def at_exit() -> None:
        if gone() or dying():
            os._exit(1)

    if not direct and not _alive(learner_pid):
        os._exit(1)  # the learner died before the watch began (or we were re-parented)
    import atexit  # (here: this function is the module's only user)

    atexit.register(at_exit)
    threading.Thread(target=watch, name="ac-watch-parent", daemon=True).start()


class ReportingEnvFactory:
    """A picklable env factory whose envs write what they raise where the learner can read it.

    A worker process that dies of an exception prints its traceback on its own stderr and
    exits with code 1; TorchRL's main process only sees the exit code. The env built here has
    its ``_step``, ``_reset`` and ``step_and_maybe_reset`` (those of the returned TorchRL env,
    transforms included) wrapped: the first exception is written, as
    ``"Type: message (file:line in function)"``, to ``<directory>/<pid>.txt`` before it
    propagates, and :func:`worker_failure` reads it back.
    With :data:`WORKER_TRACEBACKS_VARIABLE` set to ``0`` the dying worker prints no traceback.

    It also ties the worker's life to the learner's: built in a process other than the one
    that made the factory (the learner), it starts :func:`watch_parent` there, so the worker
    exits when the learner dies, SIGKILL included.

    Args:
        factory: the env factory (picklable: it runs in the worker process).
        directory: where the reports go (created by the first report, removed by
            :class:`SupervisedCollector`).
    """

    def __init__(self, factory: Callable, directory: str | os.PathLike) -> None:
        self.factory = factory
        self.directory = str(directory)
        self.learner_pid = os.getpid()

    def __call__(self, *args, **kwargs):
        """Build the env and wrap its ``_step`` / ``_reset`` / ``step_and_maybe_reset``.

        The last is the collector's entry point, which a bare ``VectorGymEnv`` implements
        without ``_step``; wrapped as instance attributes.
        """
        if os.getpid() != self.learner_pid:  # in a worker: exit when the learner dies
            watch_parent(self.learner_pid)
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


class OverlappedCollector:
    """Collects the next batch while the learner trains on this one, bit-reproducibly.

    Wraps a synchronous collector whose workers read their policy's weights from shared
    memory. The workers get their own copy of the policy (``mirror``), so the learner's
    in-place updates of ``source`` do not reach them mid-rollout. Batch k+1 is collected while
    the learner updates on batch k, with the weights from before that update (one batch
    behind); :meth:`update_policy_weights_` waits for that collection to end, then copies
    ``source`` into ``mirror``, which batch k+2 is collected with. The weights every batch
    sees are fixed by the batch count, not by timing, so the same seed gives the same run.
    Each step's behaviour log-probability is stored with it, so PPO's ratio stays exact for
    the batch that is one update old (the first epoch's ratio is then not 1).

    Args:
        collector: a synchronous collector (``MultiSyncCollector``) built on ``mirror``.
        source: the learner's policy.
        mirror: the collector's copy of it (same modules, its own storage).
    """

    def __init__(self, collector, source: nn.Module, mirror: nn.Module) -> None:
        self.collector, self.source, self.mirror = collector, source, mirror
        self._pending: _Prefetch | None = None

    def __iter__(self):
        batches = iter(self.collector)
        batch = next(batches, None)
        while batch is not None:
            self._pending = _Prefetch(batches)  # batch k+1, with the mirror's weights
            yield batch
            batch = self._take()

    def _take(self):
        pending, self._pending = self._pending, None
        return None if pending is None else pending.result()

    def update_policy_weights_(self) -> None:
        """Wait for the batch in collection, then give the workers the learner's weights."""
        if self._pending is not None:
            self._pending.wait()
        self.mirror.load_state_dict(self.source.state_dict())
        self.collector.update_policy_weights_()

    def shutdown(self) -> None:
        """Let a batch in collection finish (up to a minute), then stop the collector."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.wait(timeout=60)
        self.collector.shutdown()

    def __getattr__(self, name: str):
        return getattr(self.collector, name)


class _Prefetch:
    """``next(iterator, None)`` on a daemon thread; :meth:`result` returns it or raises."""

    def __init__(self, iterator) -> None:
        self._value = self._error = None
        self._thread = threading.Thread(target=self._run, args=(iterator,), daemon=True)
        self._thread.start()

    def _run(self, iterator) -> None:
        try:
            self._value = next(iterator, None)
        except BaseException as error:  # re-raised in the learner's thread by result()
            self._error = error

    def wait(self, timeout: float | None = None) -> None:
        """Block until the batch is collected (or collection failed), or ``timeout`` seconds."""
        self._thread.join(timeout)

    def result(self):
        """The batch (``None`` when the collector has finished); a collection error raises."""
        self.wait()
        if self._error is not None:
            raise self._error
        return self._value


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
    (:func:`ac_extensions.runtime.ray_backend.start_ray_collector`).
    """
    if config.backend == "ray":
        from ac_extensions.runtime.ray_backend import start_ray_collector

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


def shutdown_collector(collector) -> None:
    """Stop a TorchRL collector so that the interpreter can exit afterwards.

    For users of their own collectors too: call it where you would call
    ``collector.shutdown()``. TorchRL 0.14's ``collector.shutdown()`` stops the workers but
    leaves its weight-sync schemes to their finalisers; ``WeightSyncScheme.__del__`` then
    calls ``shutdown()`` during interpreter finalisation, which puts a message on a
    ``multiprocessing.Queue`` and starts the queue's feeder thread, and a thread cannot start
    at that point: the process hangs at exit (seen with ``MultiSyncCollector`` and a policy,
    ``faulthandler``: ``weight_sync_schemes.py __del__`` →
    ``_shared.py shutdown`` → ``Queue.put`` → ``Thread.start``). Here each scheme is shut down
    explicitly while the interpreter is fully alive (their ``shutdown`` is idempotent, so the
    finaliser's later call returns at once) and the collector's garbage is collected now.

    Safe to call twice, and on any collector (single, multi-process, Ray).

    Example:
        >>> from torchrl.collectors import Collector
        >>> from torchrl.envs import GymEnv
        >>> collector = Collector(GymEnv("CartPole-v1"), None, frames_per_batch=8, total_frames=8)
        >>> [batch.numel() for batch in collector]
        [8]
        >>> shutdown_collector(collector)
    """
    try:
        collector.shutdown()
    finally:
        for scheme in list((getattr(collector, "_weight_sync_schemes", None) or {}).values()):
            try:
                scheme.shutdown()
            except Exception:  # a scheme whose queues the collector already closed
                pass
        gc.collect()


def stop_collector(collector, replay=None) -> None:
    """Shut a recipe's collector down (:func:`shutdown_collector`) and release its backend.

    With the Ray backend this also closes a Ray-hosted ``replay`` and stops a Ray instance
    the run started (never a cluster it joined); a local ``replay`` is left alone.
    """
    try:
        shutdown_collector(collector)
    finally:
        if hasattr(collector, "ray_runtime") or hasattr(replay, "ray_runtime"):
            from ac_extensions.runtime.ray_backend import close

            close(replay)
            close(collector)
