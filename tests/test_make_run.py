"""``make run`` then ``make test``: the main job changes no tracked file and leaves no new file
outside the ignored ``runs/``."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def make_run_command() -> list[str]:
    """The command of the Makefile's ``run`` target, with this interpreter."""
    text = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^run:.*\n\t(.+)$", text, re.MULTILINE).group(1)
    words = shlex.split(recipe.replace("$(BIN)/python", "python"))
    assert words[0] == "python", recipe
    return [sys.executable, *words[1:]]


def tracked_changes() -> str:
    """Modified tracked files and untracked files git does not ignore, one line each."""
    out = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout


@pytest.fixture
def keep_users_runs(tmp_path):
    """Set a user's own ``make run`` output aside while the test writes its short one."""
    names = ("learning_quick", "learning_quick.md", "learning_quick.png")
    saved = [(ROOT / "runs" / n, tmp_path / n) for n in names if (ROOT / "runs" / n).exists()]
    for path, aside in saved:
        shutil.move(path, aside)
    yield
    for name in names:
        path = ROOT / "runs" / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    for path, aside in saved:
        shutil.move(aside, path)


@pytest.mark.timeout(600)
def test_make_run_writes_no_tracked_file(keep_users_runs):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    before = tracked_changes()
    command = [*make_run_command(), "--frames-scale", "0.05"]  # the same job, a short budget
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=550)
    assert result.returncode == 0, result.stderr[-3000:]
    assert tracked_changes() == before
    table = (ROOT / "runs" / "learning_quick.md").read_text()
    for algorithm in ("a2c", "ppo", "acer", "reactor"):
        assert f"| {algorithm} |" in table
    assert (ROOT / "runs" / "learning_quick.png").stat().st_size > 0
    assert "runs/learning_quick.md" in result.stdout
