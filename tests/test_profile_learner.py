"""benchmarks/profile_learner.py: the summary names each label's own command (fabricated)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._helpers import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "profile_learner.py"


@pytest.fixture(scope="module")
def bench():
    yield from load_script(SCRIPT, "profile_learner")


def record(bench, label, env, ms, **extra):
    phases = dict.fromkeys(bench.PHASES, ms) | {"total": ms * len(bench.PHASES)}
    return {
        "label": label,
        "env": env,
        "source": "/src",
        "steps": 20,
        "repeats": 3,
        "cpu_ms_per_step": phases,
        "torch_ops": f"ops of {label}",
        "python_functions": f"functions of {label}",
        **extra,
    }


def test_each_label_keeps_its_own_command(bench):
    stored = "python benchmarks/profile_learner.py --label b --env MinAtar/Breakout-v1"
    records = [
        record(bench, "b", "MinAtar/Breakout-v1", 2.0, command=stored),
        record(bench, "a", "CartPole-v1", 1.0),  # written before commands were stored
    ]
    text = bench.summary(records)
    rebuilt = "python benchmarks/profile_learner.py --label a --env CartPole-v1 --steps 20"
    assert f"- `a`: `{rebuilt} --repeats 3`" in text
    assert f"- `b`: `{stored}`" in text
    lines = text.splitlines()
    assert "| phase | a | b |" in lines  # columns sorted by label
    assert "| total | 5.00 | 10.00 |" in lines
    assert text.index("ops of a") < text.index("ops of b")


def test_cuda_labels_name_their_clock(bench):
    cuda = record(bench, "g", "MinAtar/Breakout-v1", 1.0, device="cuda", clock="wall, synchronised")
    text = bench.summary([cuda, record(bench, "c", "CartPole-v1", 1.0)])
    assert (
        "### g (MinAtar/Breakout-v1, code from `/src`; device cuda, wall, synchronised ms)" in text
    )
    assert "### c (CartPole-v1, code from `/src`)" in text  # older records: no device field


def test_set_reads_config_settings_as_python_literals(bench):
    assert bench.parse_settings(["batch_size=8", "lr=1e-3", "recurrent=True"]) == {
        "batch_size": 8,
        "lr": 1e-3,
        "recurrent": True,
    }
    with pytest.raises(ValueError, match="--set: 'batch_size' is not key=value"):
        bench.parse_settings(["batch_size"])
