"""The examples run as users run them (tiny budgets), so they cannot rot silently."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("script", "frames"),
    [
        ("ppo_cartpole.py", 1024),
        ("a2c_cartpole.py", 256),
        ("recurrent_ppo_masked_cartpole.py", 1024),
        ("acer_cartpole.py", 320),
        ("acer_pendulum.py", 320),
        ("acer_atari.py", 320),
        ("reactor_cartpole.py", 1280),
    ],
)
def test_example_runs(script, frames):
    # one collector worker: the same code path, half the processes to start (CI time)
    extra = ["--workers", "1"]
    extra += ["--epochs", "1"] if script.startswith(("ppo", "recurrent_ppo")) else []
    result = subprocess.run(
        [sys.executable, script, "--frames", str(frames), *extra],
        cwd=EXAMPLES,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [json.loads(x) for x in result.stdout.splitlines() if x.startswith("{")]
    assert lines and lines[0]["time/frames"] > 0
