"""One-line errors for the command-line tools: never a traceback for bad input."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from collections.abc import Callable

from ac_extensions.cli._config import UsageError

DEBUG_VARIABLE = "AC_DEBUG"
"""Set to 1 to get tracebacks instead of one-line errors."""


class ArgumentParser(argparse.ArgumentParser):
    """``argparse`` whose errors raise :class:`UsageError` (one line) instead of printing usage."""

    def error(self, message: str):
        raise UsageError(message)


def quiet_libraries() -> None:
    """Keep TorchRL's info logs and library warnings off the terminal (workers inherit it).

    Also a collector worker whose env raised prints no traceback (the one-line ``WorkerError``
    names the exception and where); ``AC_DEBUG=1`` shows it.
    """
    from ac_extensions.runtime import WORKER_TRACEBACKS_VARIABLE

    os.environ.setdefault("RL_LOGGING_LEVEL", "WARNING")
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    if not os.environ.get(DEBUG_VARIABLE):
        warnings.filterwarnings("ignore")
        os.environ.setdefault("PYTHONWARNINGS", "ignore")
        os.environ.setdefault(WORKER_TRACEBACKS_VARIABLE, "0")


def show_training_warnings(prog: str) -> None:
    """Print every :class:`~ac_extensions.runtime.TrainingWarning` as one line.

    ``PROG: warning: MESSAGE`` on stderr, each occurrence (a skipped update, a dropped batch, a
    checkpoint not written), even though :func:`quiet_libraries` hides other warnings.
    """
    from ac_extensions.runtime import TrainingWarning

    warnings.filterwarnings("always", category=TrainingWarning)
    original = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, TrainingWarning):
            print(f"{prog}: warning: {_one_line(message)}", file=sys.stderr)
        else:
            original(message, category, filename, lineno, file, line)

    warnings.showwarning = show


def run_main(prog: str, command: Callable[[list[str]], int], argv: list[str]) -> int:
    """Run ``command(argv)``; report bad input and failures as one line on stderr.

    Exit status: 0 success, 2 bad input (usage, unknown names, unreadable checkpoint), 1 a
    failure while running (e.g. ``WorkerError``: a collector worker died;
    ``NonFiniteError``: too many non-finite updates; ``OSError``: the final checkpoint could
    not be written), 130 interrupted (``ac-train``: 143 when SIGTERM stopped it after a
    checkpoint, see :func:`ac_extensions.cli.train.stop_on_sigterm`).
    """
    from ac_extensions.runtime import CheckpointError

    quiet_libraries()
    show_training_warnings(prog)
    debug = bool(os.environ.get(DEBUG_VARIABLE))
    try:
        return command(argv)
    except (UsageError, CheckpointError) as error:
        if debug:
            raise
        print(f"{prog}: error: {_one_line(error)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        if debug:
            raise
        print(
            f"{prog}: error: {type(error).__name__}: {_one_line(error)} "
            f"(set {DEBUG_VARIABLE}=1 for the traceback)",
            file=sys.stderr,
        )
        return 1


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__
