"""Collector processes die with the learner, and :func:`shutdown_collector` lets Python exit.

Everything here runs in subprocesses: the learner (``ac-train``, or a small script) is killed
with SIGKILL, which no clean-up of its own survives, and its collector workers are watched
through ``/proc`` (Linux only). Each process is identified by its pid *and* its start time, so
a recycled pid is never mistaken for (or killed as) a worker; whatever outlives a test is
killed in its ``finally``.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ac_extensions.runtime import watch_parent

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="reads processes from /proc (Linux)"
)

EXIT_DEADLINE = 10.0
"""Seconds within which every collector process must be gone after the learner's SIGKILL."""

Process = tuple[int, int]
"""A process: its pid and its start time (clock ticks since boot), which tell pid reuse apart."""


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first); None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def _process(pid: int) -> Process | None:
    fields = _stat(pid)
    return None if fields is None else (pid, int(fields[19]))


def _alive(process: Process) -> bool:
    """Whether ``process`` still runs: a zombie (dead, not yet reaped) counts as dead."""
    pid, start = process
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z" and int(fields[19]) == start


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return "?"


def _descendants(root: int) -> dict[Process, str]:
    """Every live descendant of ``root`` (children, grandchildren, …), with its command line."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None and fields[0] != "Z":
                parents[int(entry)] = int(fields[1])
    found, frontier = {}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and (process := _process(pid)) is not None:
                found[process] = _cmdline(pid)
                frontier.append(pid)
    return found


def _kill(processes) -> None:
    for process in processes:
        if _alive(process):
            try:
                os.kill(process[0], signal.SIGKILL)
            except ProcessLookupError:
                pass


def _wait_until(condition: Callable[[], object], timeout: float, interval: float = 0.05):
    """``condition()``'s first truthy value within ``timeout`` seconds; None if none came."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            return value or None
        time.sleep(interval)


def _survivors_after(processes, timeout: float) -> list[Process]:
    """The ``processes`` still alive after ``timeout`` seconds (returns as soon as none is)."""
    _wait_until(lambda: not any(_alive(p) for p in processes), timeout)
    return [p for p in processes if _alive(p)]


def _start(args: list[str], log: Path) -> subprocess.Popen:
    """Start ``python <args>`` with its stdout and stderr in ``log`` (never a pipe it can fill)."""
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


def _reap(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)


def _lines(log: Path) -> list[str]:
    return log.read_text(errors="replace").splitlines() if log.exists() else []


def _progress_rows(out: Path) -> int:
    """Rows in the fullest CSV log of a run: one per batch for the per-batch scalars."""
    rows = 0
    for path in out.rglob("*.csv"):
        try:
            rows = max(rows, len(path.read_text().splitlines()))
        except OSError:
            pass
    return rows


def _workers(processes: dict[Process, str], learner: str) -> dict[Process, str]:
    """The collector workers among a learner's descendants.

    Named by what they run: forked workers keep the learner's command line ``learner``,
    spawned ones run ``multiprocessing.spawn``'s entry point. Anything else is not a worker:
    multiprocessing's resource tracker, the short-lived ``python -c`` probes that importing
    ``glfw`` (through ``mujoco``, which ``torchrl.envs`` imports when it is installed) starts to
    read a library's version, and a process caught while exiting, whose command line is empty.
    """
    return {
        p: line
        for p, line in processes.items()
        if "resource_tracker" not in line
        and ("spawn_main" in line or (line == learner and line != ""))
    }


def _describe(processes, names: dict[Process, str]) -> str:
    return "; ".join(f"pid {p[0]} ({names.get(p, '?')[:100]})" for p in processes)


# --- 1. the learner's SIGKILL takes its collector workers along ----------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "method, algorithm, flags",
    [
        ("fork", "acer", "--replay-start 10"),
        ("spawn", "acer", "--replay-start 10"),
        ("fork", "a2c", "--async-collection true"),  # TorchRL's MultiAsyncCollector
    ],
    ids=["acer-fork", "acer-spawn", "a2c-async-fork"],
)
def test_collector_workers_exit_when_the_learner_is_killed(method, algorithm, flags, tmp_path):
    # When the learner is SIGKILLed (no chance to clean up), every collector worker it started,
    # forked or spawned, must exit on its own within EXIT_DEADLINE seconds.
    workers = 2
    out, log = tmp_path / "run", tmp_path / "learner.log"
    flags += (
        f" --env CartPole-v1 --frames 10000000 --workers {workers} --start-method {method}"
        " --envs-per-worker 1 --rollout-length 5 --hidden-sizes 8 --checkpoint-every 0 --quiet"
    )
    args = ["-m", "ac_extensions.cli.train", algorithm, "--out", str(out), *flags.split()]
    learner = _start(args, log)
    command = " ".join([sys.executable, *args])
    processes: dict[Process, str] = {}
    try:

        def running() -> bool:
            assert learner.poll() is None, "the learner exited:\n" + log.read_text()[-3000:]
            processes.update(_descendants(learner.pid))
            return len(_workers(processes, command)) >= workers and _progress_rows(out) >= 3

        assert _wait_until(running, timeout=90, interval=0.2), (
            f"no {workers} workers and 3 batches within 90 s; learner's descendants: "
            f"{_describe(processes, processes)}; log:\n{log.read_text()[-3000:]}"
        )
        # Count the workers alive now, not every descendant seen so far: a child forked for a
        # moment (a probe caught before its exec) carries the learner's command line too.
        alive: dict[Process, str] = {}

        def exactly_the_workers() -> bool:
            alive.clear()
            alive.update(_descendants(learner.pid))
            return len(_workers(alive, command)) == workers

        assert _wait_until(exactly_the_workers, timeout=10), _describe(alive, alive)
        processes.update(alive)  # all of them, just before the kill

        os.kill(learner.pid, signal.SIGKILL)
        killed = time.monotonic()
        learner.wait(timeout=30)
        survivors = _survivors_after(processes, EXIT_DEADLINE)
        took = time.monotonic() - killed
        assert not survivors, (
            f"alive {EXIT_DEADLINE:.0f} s after the learner's SIGKILL: "
            f"{_describe(survivors, processes)}"
        )
        assert took < EXIT_DEADLINE
        print(f"{len(processes)} processes gone {took:.2f} s after the kill: {processes}")
    finally:
        _reap(learner)
        _kill(processes)


# A user's own pipeline: TorchRL's MultiSyncCollector (its workers not wrapped in our env
# factory) with a ProbabilisticActor over two GymEnv("CartPole-v1") factories.
PLAIN_PIPELINE = """
import multiprocessing as mp
import os
import sys
import time

from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.collectors import MultiSyncCollector
from torchrl.envs import GymEnv
from torchrl.modules import MLP, ProbabilisticActor
from torchrl.modules.distributions import OneHotCategorical


def make_env():
    return GymEnv("CartPole-v1")


if __name__ == "__main__":
    mode, method = sys.argv[1], sys.argv[2]  # mode: hang, update or no-update
    mp.set_start_method(method, force=True)
    net = MLP(in_features=4, out_features=2, num_cells=[16, 16], activation_class=nn.Tanh)
    policy = ProbabilisticActor(
        TensorDictModule(net, in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"],
        out_keys=["action"],
        distribution_class=OneHotCategorical,
        return_log_prob=True,
        spec=make_env().action_spec,
    )
    collector = MultiSyncCollector(
        [make_env, make_env], policy, frames_per_batch=64, total_frames=-1
    )
    print("workers", *(proc.pid for proc in collector.procs), flush=True)
    for index, batch in enumerate(collector):
        if mode != "no-update":
            collector.update_policy_weights_()
        print("batch", index, batch.numel(), flush=True)
        if index == 2:
            break
    if mode == "hang":
        time.sleep(600)  # until the test kills it
    from ac_extensions.runtime import shutdown_collector

    shutdown_collector(collector)
    print("alive", sum(proc.is_alive() for proc in collector.procs), flush=True)
    shutdown_collector(collector)  # a second call is harmless
    print("shut down", flush=True)
"""


@pytest.mark.timeout(90)
def test_plain_torchrl_fork_workers_outlive_a_killed_learner(tmp_path):
    # The control: without our env-factory wrapper (watch_parent), TorchRL's forked workers
    # block on their pipes forever once the learner is SIGKILLed, so the test above can fail.
    # (Spawned ones, whose pipes do report the learner's end, exit after a few seconds.)
    script, log = tmp_path / "pipeline.py", tmp_path / "pipeline.log"
    script.write_text(PLAIN_PIPELINE)
    learner = _start([str(script), "hang", "fork"], log)
    workers: list[Process] = []
    try:
        assert _wait_until(
            lambda: "batch 2 64" in _lines(log) or learner.poll() is not None, timeout=60
        ), log.read_text()[-3000:]
        assert learner.poll() is None, log.read_text()[-3000:]
        pids = next(line for line in _lines(log) if line.startswith("workers")).split()[1:]
        workers = [p for p in map(_process, map(int, pids)) if p is not None]
        assert len(workers) == 2 and all(map(_alive, workers))
        os.kill(learner.pid, signal.SIGKILL)
        learner.wait(timeout=30)
        time.sleep(3.0)  # more than ten of watch_parent's looks
        assert all(map(_alive, workers)), "TorchRL's own workers now exit with the learner"
    finally:
        _reap(learner)
        _kill(workers)
    assert not _survivors_after(workers, EXIT_DEADLINE)


# --- 2. watch_parent itself --------------------------------------------------------------------

# The learner starts two children with `method`: one calls watch_parent(learner, 0.05) (twice:
# the second call must not add a second thread), the other does not; both then sleep.
WATCH_TREE = """
import multiprocessing as mp
import sys
import threading
import time

from ac_extensions.runtime import watch_parent


def child(learner, watch, ready):
    if watch:
        watch_parent(learner, interval=0.05)
        watch_parent(learner, interval=0.05)
    watchers = [t for t in threading.enumerate() if t.name == "ac-watch-parent"]
    ready.put(len(watchers))
    time.sleep(600)


if __name__ == "__main__":
    context = mp.get_context(sys.argv[1])
    ready = context.Queue()
    learner = mp.current_process().pid
    children = [context.Process(target=child, args=(learner, w, ready)) for w in (True, False)]
    for process in children:
        process.start()
    threads = sorted(ready.get(timeout=120) for _ in children)
    print("children", *(process.pid for process in children), *threads, flush=True)
    time.sleep(600)  # until the test kills it
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_watch_parent_exits_the_child_promptly_when_the_learner_is_killed(method, tmp_path):
    # fork and spawn: the child's parent is the learner, and it is re-parented at the kill;
    # forkserver: its parent is the fork server, and the watch looks at the learner's pid.
    script, log = tmp_path / "tree.py", tmp_path / "tree.log"
    script.write_text(WATCH_TREE)
    learner = _start([str(script), method], log)
    children: list[Process] = []
    helpers: list[Process] = []
    try:
        line = _wait_until(
            lambda: (
                next((x for x in _lines(log) if x.startswith("children")), None)
                or learner.poll() is not None
            ),
            timeout=90,
        )
        assert isinstance(line, str), log.read_text()[-3000:]
        watching, plain, *threads = map(int, line.split()[1:])
        assert threads == [0, 1]  # one watch thread in the watching child, none in the other
        children = [_process(watching), _process(plain)]
        assert all(children) and all(map(_alive, children)), line
        helpers = list(_descendants(learner.pid))  # the fork server and resource tracker too

        os.kill(learner.pid, signal.SIGKILL)
        killed = time.monotonic()
        learner.wait(timeout=30)
        assert not _survivors_after(children[:1], EXIT_DEADLINE), "the watching child lives on"
        took = time.monotonic() - killed
        assert took < 3.0, f"the watching child took {took:.2f} s to exit"
        assert _alive(children[1]), "the child without the watch died too: the test proves nothing"
        print(f"the watching child exited {took:.2f} s after the kill")
    finally:
        _reap(learner)
        _kill(children + helpers)


# Spawned children that wait on a pipe from the learner, as TorchRL's workers do, and return
# when it closes; their interpreter's exit then hangs (as TorchRL's weight-sync finaliser can):
# here an atexit handler registered before watch_parent. One of them calls watch_parent, with a
# watch thread too slow to matter.
WATCH_EXIT = """
import atexit
import multiprocessing as mp
import os
import time

from ac_extensions.runtime import watch_parent


def child(learner, watch, connection, ready):
    atexit.register(time.sleep, 600)
    if watch:
        watch_parent(learner, interval=600)
    ready.put(os.getpid())
    try:
        connection.recv()
    except EOFError:
        pass


if __name__ == "__main__":
    context = mp.get_context("spawn")
    ready = context.Queue()
    learner = mp.current_process().pid
    children, ends = [], []
    for watch in (True, False):
        mine, theirs = context.Pipe()
        children.append(context.Process(target=child, args=(learner, watch, theirs, ready)))
        children[-1].start()
        theirs.close()
        ends.append(mine)
    for _ in children:
        ready.get(timeout=120)
    print("children", *(process.pid for process in children), flush=True)
    time.sleep(600)  # until the test kills it
"""


@pytest.mark.timeout(120)
def test_watch_parent_ends_a_child_that_exits_after_the_learner_died(tmp_path):
    # Python's own exit would hang; watch_parent's exit hook (registered last, run first)
    # skips it.
    script, log = tmp_path / "exit.py", tmp_path / "exit.log"
    script.write_text(WATCH_EXIT)
    learner = _start([str(script)], log)
    children: list[Process] = []
    helpers: list[Process] = []
    try:
        line = _wait_until(
            lambda: (
                next((x for x in _lines(log) if x.startswith("children")), None)
                or learner.poll() is not None
            ),
            timeout=90,
        )
        assert isinstance(line, str), log.read_text()[-3000:]
        children = [_process(int(pid)) for pid in line.split()[1:]]
        assert len(children) == 2 and all(children) and all(map(_alive, children)), line
        helpers = list(_descendants(learner.pid))

        os.kill(learner.pid, signal.SIGKILL)
        killed = time.monotonic()
        learner.wait(timeout=30)
        assert not _survivors_after(children[:1], EXIT_DEADLINE), "the watching child lives on"
        took = time.monotonic() - killed
        assert took < 3.0, f"the watching child took {took:.2f} s to exit"
        time.sleep(1.0)
        assert _alive(children[1]), "the child without the watch exited: the test proves nothing"
        print(f"the watching child exited {took:.2f} s after the kill")
    finally:
        _reap(learner)
        _kill(children + helpers)


def test_watch_parent_is_a_no_op_in_the_learner():
    before, hooks = set(threading.enumerate()), atexit._ncallbacks()
    assert watch_parent(os.getpid(), interval=0.05) is None
    assert watch_parent(os.getpid()) is None
    time.sleep(0.2)  # a watch would have exited this process by now
    assert set(threading.enumerate()) <= before  # and no thread was started,
    assert atexit._ncallbacks() == hooks  # nor an exit hook registered


# --- 3. shutdown_collector lets the interpreter exit --------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["update", "no-update"])
def test_shutdown_collector_lets_a_plain_torchrl_pipeline_exit(mode, tmp_path):
    # TorchRL 0.14: a weight-sync scheme left to its finaliser can hang the interpreter at exit.
    # `no-update`: the weight queues were never used, so their feeder threads would first start
    # inside that finaliser.
    script, log = tmp_path / "pipeline.py", tmp_path / "pipeline.log"
    script.write_text(PLAIN_PIPELINE)
    start = time.monotonic()
    proc = _start([str(script), mode, "fork"], log)
    workers: list[Process] = []
    try:
        assert _wait_until(
            lambda: "shut down" in _lines(log) or proc.poll() is not None, timeout=90
        ), f"no 'shut down' within 90 s:\n{log.read_text()[-3000:]}"
        marker = time.monotonic()
        pids = next((x for x in _lines(log) if x.startswith("workers")), "workers").split()[1:]
        workers = [p for p in map(_process, map(int, pids)) if p is not None]
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the process still runs 15 s after shutdown_collector:\n{_lines(log)}")
        exited = time.monotonic()
        lines = _lines(log)
        assert proc.returncode == 0, "\n".join(lines[-40:])
        assert [x for x in lines if x.startswith("batch")] == [f"batch {i} 64" for i in range(3)]
        assert lines.index("alive 0") < lines.index("shut down"), lines
        assert not any("Traceback" in x for x in lines), "\n".join(lines)
        assert not [p for p in workers if _alive(p)]
        print(f"exit {exited - marker:.2f} s after the marker, {exited - start:.1f} s in all")
    finally:
        _reap(proc)
        _kill(workers)
