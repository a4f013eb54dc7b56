"""What produced a run: the code's commit, the package versions, the machine.

``ac-train`` writes :func:`provenance` into every run's ``run.json`` (one entry per start, so a
resumed run lists each segment's code), and the benchmark grids' Stable-Baselines3 runs do the
same, so a results table can say which code made each row.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

PACKAGES = ("ac-extensions", "torch", "torchrl", "tensordict", "gymnasium", "numpy")
"""The distributions whose versions a run records (others can be added by the caller)."""


RESULTS_PATH = "benchmarks/results"
"""Where the benchmarks write their tables and runs: data, not code, so edits there leave a
checkout clean for :func:`code_version`."""


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def code_version(root: Path | None = None) -> dict[str, Any]:
    """``{"commit": sha or None, "dirty": bool or None}`` of the checkout holding the package.

    ``dirty``: uncommitted changes to tracked files outside :data:`RESULTS_PATH` (untracked files
    do not count, nor the committed results pages a benchmark rewrites as its runs finish). Both
    are None when the package is not inside a git checkout (an installed wheel).
    """
    root = Path(root) if root is not None else Path(__file__).resolve().parents[2]
    commit = _git(root, "rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = _git(
        root, "status", "--porcelain", "--untracked-files=no", "--", ".", f":!{RESULTS_PATH}"
    )
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def package_versions(extra: tuple[str, ...] = ()) -> dict[str, str | None]:
    """Installed version of each of :data:`PACKAGES` and ``extra`` (None if missing)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in (*PACKAGES, *extra):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _torch_cpu_capability() -> str | None:
    """The vector instruction set torch dispatches its CPU kernels to (``"AVX2"``, ...)."""
    try:
        import torch

        return torch.backends.cpu.get_cpu_capability()
    except (ImportError, AttributeError, RuntimeError):
        return None


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else :func:`platform.processor`).

    Recorded because torch and MKL choose their float kernels by CPU vendor and instruction
    set, so the same code and seed can round differently, and drift apart, on another CPU.
    """
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance(extra_packages: tuple[str, ...] = ()) -> dict[str, Any]:
    """The code, versions and machine of this process, and when it started (UTC).

    Example:
        >>> record = provenance()
        >>> sorted(record)
        ['code', 'machine', 'started', 'versions']
    """
    return {
        "code": code_version(),
        "versions": package_versions(extra_packages),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu": cpu_model(),
            "cpu_capability": _torch_cpu_capability(),
            "cpus": os.cpu_count(),
            "executable": sys.executable,
        },
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


__all__ = ["code_version", "cpu_model", "package_versions", "provenance"]
