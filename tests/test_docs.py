"""The API reference builds with every warning an error (what ``make docs`` runs)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(300)
def test_api_reference_builds_without_warnings(tmp_path):
    if (
        importlib.util.find_spec("sphinx") is None
        or importlib.util.find_spec("myst_parser") is None
    ):
        pytest.skip("needs the docs extra (sphinx, myst-parser)")
    command = re.search(
        r"^docs:.*\n\t\$\(BIN\)/python (.+)$", (ROOT / "Makefile").read_text(), re.M
    )
    args = command.group(1).split()
    args[args.index("docs/_build/html")] = str(tmp_path / "html")
    result = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    index = (tmp_path / "html" / "index.html").read_text(encoding="utf-8")
    assert "Compose it yourself" in index  # the README is the front page
    api = (tmp_path / "html" / "api.html").read_text(encoding="utf-8")
    for name in ("SequencePPOLoss", "ACERLoss", "ReactorLoss", "retrace_targets", "Run"):
        assert name in api, name
