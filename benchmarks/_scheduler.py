"""A resumable grid of runs, each a subprocess: the benchmark grids' scheduler.

A grid is a list of cells (any object with a ``directory(results)`` method and a ``str``), an
``action_of(cell, results, frames)`` that says ``"done"``, ``"resume"`` or ``"fresh"`` from
what the cell's directory holds, and a ``command_of(cell, results, frames, how)`` that gives
its command line. :func:`run_grid` runs every cell that is not done, ``--jobs`` at a time,
each under a lock on its directory (two invocations never run one cell twice), with a time
limit, progress lines, an optional deadline, and Ctrl-C / SIGTERM stopping every run so that
it saves its checkpoint. A run counts as complete when it leaves a ``summary.json`` saying
``complete: true`` (what ``ac-train`` and the Stable-Baselines3 runs' child processes write).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path


def read_summary(directory: Path) -> dict | None:
    """The run's ``summary.json`` (None if absent or unreadable)."""
    try:
        return json.loads((directory / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def complete_at(summary: dict | None, frames: int) -> bool:
    """Whether ``summary`` is of a run complete at a budget of at least ``frames``."""
    return bool(
        summary and summary.get("complete") and (summary.get("frames_target") or 0) >= frames
    )


def has_checkpoint(directory: Path) -> bool:
    """Whether ``ac-train --resume`` has a checkpoint to continue from."""
    return (directory / "checkpoints" / "latest").is_file()


def ac_train() -> list[str]:
    """The ``ac-train`` console script of this interpreter's environment."""
    script = Path(sys.executable).with_name("ac-train")
    if script.exists():
        return [str(script)]
    found = shutil.which("ac-train")
    return [found] if found else [sys.executable, "-m", "ac_extensions"]


_LIVE: set[subprocess.Popen] = set()


_LIVE_LOCK = threading.Lock()


_STOPPING = threading.Event()  # set under _LIVE_LOCK on Ctrl-C: no run starts after it


@contextlib.contextmanager
def stop_on_interrupt():
    """While the body runs, Ctrl-C (SIGINT) or SIGTERM stops the grid and exits with 130.

    The handler stops every live run with its children (runs live in their own sessions, so
    the signal does not reach them) and flags the grid as stopping, so that every queued run
    returns :data:`STOPPED` without starting; the body then ends on its own. Raising
    ``KeyboardInterrupt`` in the main thread instead would land in the middle of
    ``as_completed``'s lock wait, which it can leave broken: the grid then hung with a run still
    going. A stopped run resumes from its checkpoint on the next invocation.
    """

    def stop(signum, frame):
        with _LIVE_LOCK:  # the main thread never holds it: only the runners' threads do
            _STOPPING.set()
            live = list(_LIVE)
        _stop_runs(live)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if _STOPPING.is_set():
        print("interrupted: the same command resumes the grid", file=sys.stderr, flush=True)
        raise SystemExit(130)


STOP_GRACE_SECONDS = 90
"""How long a stopped run may take to save its checkpoint and exit before it is killed."""


def _stop_runs(processes: list[subprocess.Popen]) -> None:
    """Stop every run: SIGTERM to each run's own process, then SIGKILL to what is left.

    The signal goes to the run's process alone, not its group: ``ac-train`` then trains the
    batch in progress to its end, checkpoints it and exits (its collector workers with it),
    and an SB3 run saves at its next rollout start, so the resumed run loses nothing. Whatever of
    a run's process group is still alive after :data:`STOP_GRACE_SECONDS` (a run that did not
    stop, or orphaned workers) is killed.
    """
    if processes:
        print(
            f"stopping {len(processes)} run(s): each saves its checkpoint "
            f"(up to {STOP_GRACE_SECONDS} s)",
            file=sys.stderr,
            flush=True,
        )
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)  # a no-op once the runner thread reaped it
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(max(0.0, deadline - time.monotonic()))
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10)


STOPPED = "stopped: the grid was interrupted"


SKIPPED = "skipped: another invocation is running it"
"""The status of a run whose directory another grid invocation holds (not a failure)."""


FINISHED_ELSEWHERE = "skipped: another invocation finished it since this one started"
"""The status of a run found complete once its lock was taken (not a failure)."""


DEADLINE_SKIPPED = "not started: it would not finish before the deadline"
"""The status (its beginning) of a run ``--deadline-minutes`` leaves for later (not a failure)."""


DEADLINE_STOPPED = "stopped at the deadline, with its checkpoint"
"""The status of a run stopped when ``--deadline-minutes`` ran out (not a failure)."""


def failed(status: str) -> bool:
    """Whether a run's status counts as a failure (the grid's exit status)."""
    fine = ("ok", SKIPPED, STOPPED, FINISHED_ELSEWHERE, DEADLINE_STOPPED)
    return status not in fine and not status.startswith(DEADLINE_SKIPPED)


@contextlib.contextmanager
def claimed(directory: Path):
    """Hold the run lock of ``directory`` (``.<name>.lock`` beside it) while the body runs.

    Yields whether this process got it. Two invocations whose plans overlap would otherwise
    start the same run twice, the second deleting the directory the first is writing. The lock
    is ``flock``'s, so a killed invocation never leaves it held.
    """
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / f".{directory.name}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


def execute(
    run,
    results: Path,
    frames: int,
    how: str,
    timeout: float,
    action_of: Callable[..., str],
    command_of: Callable[..., list[str]],
) -> dict:
    """Run one cell in a subprocess; return ``{"status", "seconds", "summary"}``.

    A fresh run starts from an empty directory; stdout and stderr go to ``output.log``.
    ``action_of(run, results, frames)`` and ``command_of(run, results, frames, how)`` are the
    grid's (see the module doc).
    """

    def replan() -> tuple[str, list[str]]:  # decided again once the run's lock is taken
        now = action_of(run, results, frames)
        return now, [] if now == "done" else command_of(run, results, frames, now)

    cmd = command_of(run, results, frames, how)
    return run_claimed(run.directory(results), cmd, timeout, fresh=how == "fresh", replan=replan)


def _not_run(status: str, directory: Path) -> dict:
    return {"status": status, "seconds": 0.0, "summary": read_summary(directory), "started": False}


def run_claimed(
    directory: Path,
    cmd: list[str],
    timeout: float,
    fresh: bool,
    replan: Callable[[], tuple[str, list[str]]] | None = None,
) -> dict:
    """:func:`run_process` under ``directory``'s run lock (:func:`claimed`), every grid's runner.

    ``fresh``: empty the directory first. A run another invocation holds is left alone (status
    :data:`SKIPPED`); after an interrupt nothing starts (:data:`STOPPED`). ``replan`` (the
    grids' :func:`execute`) decides again under the lock, since another invocation may have
    run the cell between planning and now: it returns ``(how, command)`` as :func:`action` and
    :func:`command` see the directory now; ``"done"`` skips the run
    (:data:`FINISHED_ELSEWHERE`), and a run planned as fresh that now has a checkpoint resumes
    it instead of emptying the directory.
    """
    if _STOPPING.is_set():
        return _not_run(STOPPED, directory)
    with claimed(directory) as mine:
        if not mine:
            return _not_run(SKIPPED, directory)
        if replan is not None:
            how, cmd = replan()
            if how == "done":
                return _not_run(FINISHED_ELSEWHERE, directory)
            fresh = how == "fresh"
        if fresh and directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True, exist_ok=True)
        return run_process(cmd, directory, timeout)


def run_process(cmd: list[str], directory: Path, timeout: float) -> dict:
    """Run ``cmd`` (its own process group, output appended to ``directory/output.log``).

    Returns ``{"status", "seconds", "summary"}``: ``"ok"`` only when it exited with 0 and left
    a complete ``summary.json`` in ``directory``; a process past ``timeout`` seconds is stopped
    with its children.
    """
    if _STOPPING.is_set():
        return _not_run(STOPPED, directory)
    start = time.perf_counter()
    with open(directory / "output.log", "a") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        with _LIVE_LOCK:
            if _STOPPING.is_set():
                return _not_run(STOPPED, directory)
            process = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            _LIVE.add(process)
        try:
            process.wait(timeout)
            status = "ok" if process.returncode == 0 else f"failed (exit {process.returncode})"
            if process.returncode != 0 and _STOPPING.is_set():
                status = STOPPED
        except subprocess.TimeoutExpired:
            _stop_runs([process])
            status = f"timeout after {timeout:.0f} s"
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(process)
    summary = read_summary(directory)
    if status == "ok" and not (summary and summary.get("complete")):
        status = "failed (no complete summary.json)"
    return {"status": status, "seconds": time.perf_counter() - start, "summary": summary}


def prune_checkpoints(directory: Path) -> None:
    """Delete a finished run's checkpoints (replays are large)."""
    if (directory / "checkpoints").is_dir():
        shutil.rmtree(directory / "checkpoints")


def describe(run, result: dict) -> str:
    """One progress line: the status, and the run's frames, fps and return.

    A run this invocation did not start (``result["started"]`` false: another invocation holds
    or finished it, or the deadline left it for later) has no seconds of its own; its line
    gives the status and, where the run has a ``summary.json``, what that says.
    """
    s = result.get("summary") or {}
    ret = s.get("final_mean_return")
    details = (
        f"{s.get('frames', 0):,} frames, {s.get('fps') or 0:,.0f} fps, "
        f"return {'—' if ret is None else format(ret, '.2f')}"
    )
    if not result.get("started", True):
        return f"{run}: {result['status']}" + (f" (its summary: {details})" if s else "")
    return f"{run}: {result['status']} in {result['seconds']:.0f} s ({details})"


def _duration(seconds: float) -> str:
    """``seconds`` as "1 h 05 min", "12 min" or "40 s"."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min"


def progress_line(run, summary: dict | None, target: int, unit: str = "frames") -> str:
    """One line on a run in flight, from the ``summary.json`` it rewrites as it goes.

    Args:
        run: the cell (printed as its ``str``).
        summary: its current summary (None before it wrote one).
        target: the frames it runs to.
        unit: what the frames are called ("environment steps" on MuJoCo).

    Returns:
        e.g. ``"  … Breakout acer seed 1: 41% 412,000/1,000,000 frames, 190 fps, 52 min left,
        return 8.12"``: the fields and order of ``ac-train``'s own progress lines (time left at
        the run's average fps so far).
    """
    frames = int((summary or {}).get("frames") or 0)
    if not frames:
        return f"  … {run}: starting"
    fps, ret = summary.get("fps"), summary.get("final_mean_return")
    parts = [f"{min(100, round(100 * frames / target))}% {frames:,}/{target:,} {unit}"]
    if fps:
        parts.append(f"{fps:,.0f} fps")
        parts.append(f"{_duration(max(0, target - frames) / fps)} left")
    parts.append(f"return {'—' if ret is None else format(ret, '.2f')}")
    return f"  … {run}: " + ", ".join(parts)


def _report_progress(futures: dict, args: argparse.Namespace, finished: threading.Event) -> None:
    """Every ``args.progress_minutes``, one :func:`progress_line` per run in flight."""
    while not finished.wait(60 * args.progress_minutes) and not _STOPPING.is_set():
        for future, run in list(futures.items()):
            if future.running() and not finished.is_set():
                summary = read_summary(run.directory(args.results))
                line = progress_line(run, summary, args.frames, getattr(args, "unit", "frames"))
                print(line, flush=True)


def estimate_seconds(directory: Path, frames: int, fresh: bool) -> float | None:
    """Wall seconds the run in ``directory`` still needs, from the complete runs beside it.

    The median ``wall_seconds`` per frame of the complete runs of the same algorithm and game
    (``<root>/<game>/<algo>/seed*``, the MinAtar and the MuJoCo layout), else of the same
    algorithm on any game, counting only runs complete at ``frames`` or more (a short run's
    rate is mostly start-up), times the frames the run has left: all of them when ``fresh``,
    else ``frames`` minus what its ``summary.json`` reports (a resumed run also repeats the
    frames since its last checkpoint, a few minutes' worth). ``None`` when no such run is
    complete: nothing to estimate from.
    """
    algo_dir = directory.parent  # <root>/<game>/<algo>
    same_game = algo_dir.glob("seed*/summary.json")
    any_game = algo_dir.parent.parent.glob(f"*/{algo_dir.name}/seed*/summary.json")
    rates = []
    for paths in (same_game, any_game):
        for path in sorted(paths):
            s = read_summary(path.parent) or {}
            seconds, done = s.get("wall_seconds"), s.get("frames")
            if not complete_at(s, frames):
                continue
            if isinstance(seconds, int | float) and seconds > 0 and done:
                rates.append(seconds / done)
        if rates:
            break
    if not rates:
        return None
    done = 0 if fresh else int((read_summary(directory) or {}).get("frames") or 0)
    return statistics.median(rates) * max(0, frames - done)


def _within_deadline(execute_run, deadline: float, clock: Callable[[], float] = time.monotonic):
    """``execute_run`` that starts only what fits before ``deadline`` (a ``clock()`` time).

    A run is started only while more than :data:`STOP_GRACE_SECONDS` + 30 s are left and its
    :func:`estimate_seconds` (when there is one) fits in what is left minus that, with its
    timeout cut to it, so that a run stopped then saves its checkpoint before the deadline;
    others report :data:`DEADLINE_SKIPPED`, a run stopped by the cut timeout
    :data:`DEADLINE_STOPPED`.
    """
    reserve = STOP_GRACE_SECONDS + 30

    def start(run, results: Path, frames: int, how: str, timeout: float) -> dict:
        directory = run.directory(results)
        usable = deadline - clock() - reserve
        needed = estimate_seconds(directory, frames, fresh=how == "fresh")
        if usable <= 0 or (needed is not None and needed > usable):
            needs = "" if needed is None else f"needs about {_duration(needed)}, "
            left = f"{needs}{_duration(max(0.0, usable))} left before stopping"
            return _not_run(f"{DEADLINE_SKIPPED} ({left})", directory)
        cut = usable < timeout
        result = execute_run(run, results, frames, how, min(timeout, usable))
        if cut and result["status"].startswith("timeout"):
            result["status"] = DEADLINE_STOPPED
        return result

    return start


def run_grid(
    runs: list, args: argparse.Namespace, action_of: Callable[..., str], execute_run: Callable
) -> int:
    """Run every cell that is not done, ``args.jobs`` at a time; return the number of failures.

    One line is printed per finished run, and every ``args.progress_minutes`` (when > 0) one
    per run in flight (:func:`progress_line`).

    ``action_of(run, results, frames)`` says what a cell needs; ``execute_run(run, results,
    frames, how, timeout)`` runs it (the grid's :func:`execute`).
    """
    if getattr(args, "deadline", None) is not None:
        execute_run = _within_deadline(execute_run, args.deadline)
    todo = []
    for run in runs:
        how = action_of(run, args.results, args.frames)
        if how == "done":
            if not args.keep_checkpoints:
                prune_checkpoints(run.directory(args.results))
        else:
            todo.append((run, how))
    resumed = sum(how == "resume" for _, how in todo)
    print(
        f"{len(runs) - len(todo)} of {len(runs)} runs complete, {len(todo)} to run "
        f"({resumed} resumed from a checkpoint), {args.jobs} at a time",
        flush=True,
    )
    failures = 0
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {
            pool.submit(execute_run, run, args.results, args.frames, how, args.timeout): run
            for run, how in todo
        }
        finished, reporter = threading.Event(), None
        if getattr(args, "progress_minutes", 0) > 0:
            reporter = threading.Thread(
                target=_report_progress, args=(futures, args, finished), daemon=True
            )
            reporter.start()
        try:
            with stop_on_interrupt():
                for done, future in enumerate(as_completed(futures), 1):
                    run = futures[future]
                    try:
                        result = future.result()
                    except Exception as error:  # the runner itself failed: report, go on
                        result = {"status": f"error: {error!r}", "seconds": 0.0, "summary": None}
                    failures += failed(result["status"])
                    if result["status"] == "ok" and not args.keep_checkpoints:
                        prune_checkpoints(run.directory(args.results))
                    print(f"[{done}/{len(todo)}] {describe(run, result)}", flush=True)
        finally:
            finished.set()  # the progress reporter's last wait
            if reporter is not None:
                reporter.join()  # no progress line after the last result
    return failures
