"""benchmarks/reactor_probe.py: per-state statistics by hand, and a probe of a saved run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tests._helpers import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "reactor_probe.py"


@pytest.fixture(scope="module")
def bench():
    yield from load_script(SCRIPT, "reactor_probe")


def test_state_stats_by_hand(bench):
    probs = torch.tensor([[0.5, 0.5], [1.0, 0.0], [0.2, 0.8]])
    q = torch.tensor([[0.0, 1.0], [2.0, 1.0], [0.3, 0.1]])
    stats = bench.state_stats(probs, q)
    torch.testing.assert_close(stats["entropy"][:2], torch.tensor([math.log(2.0), 0.0]))
    expected = -(0.2 * math.log(0.2) + 0.8 * math.log(0.8))
    assert stats["entropy"][2].item() == pytest.approx(expected)
    # argmax π: 0 (first of a tie), 0, 1; argmax Q: 1, 0, 0.
    torch.testing.assert_close(stats["agree"], torch.tensor([0.0, 1.0, 0.0]))
    torch.testing.assert_close(stats["gap"], torch.tensor([1.0, 1.0, 0.2]))


def test_state_stats_names_the_shapes(bench):
    with pytest.raises(ValueError, match=r"\[S, A\], got \[2, 3\] and \[2, 2\]"):
        bench.state_stats(torch.ones(2, 3) / 3, torch.zeros(2, 2))


@pytest.mark.timeout(120)
def test_probe_of_a_saved_run(bench, tmp_path):
    from ac_extensions.cli._config import RUN_FILE, config_to_json
    from ac_extensions.recipes.reactor import ReactorConfig, build
    from ac_extensions.runtime.checkpoint import loss_state_dict

    config = ReactorConfig(seed=0, frames=1_000)
    _, loss, _, _ = build(config)
    checkpoint = tmp_path / "checkpoints" / "ckpt-000000001"
    checkpoint.mkdir(parents=True)
    state = {"loss": loss_state_dict(loss), "counters": {"learner_steps": 7}}
    torch.save(state, checkpoint / "state.pt")
    (tmp_path / "checkpoints" / "latest").write_text("ckpt-000000001\n")
    run = {"algorithm": "reactor", "config": config_to_json(config)}
    (tmp_path / RUN_FILE).write_text(json.dumps(run))

    record = bench.main([str(tmp_path), "--episodes", "2", "--json", str(tmp_path / "p.json")])
    assert record["learner_steps"] == 7 and record["num_actions"] == 2
    assert json.loads((tmp_path / "p.json").read_text()) == record
    for rule in bench.RULES:
        r = record["results"][rule]
        assert len(r["returns"]) == 2 and all(ret >= 1.0 for ret in r["returns"])  # CartPole
        assert 0.0 <= r["entropy"] <= math.log(2.0) + 1e-6
        assert 0.0 <= r["agree"] <= 1.0 and r["gap"] >= 0.0
    # The greedy rules are deterministic: the same episodes twice give the same returns.
    again = bench.main([str(tmp_path), "--episodes", "2"])["results"]
    assert again["greedy_q"]["returns"] == record["results"]["greedy_q"]["returns"]


def test_probe_refuses_other_runs(bench, tmp_path):
    from ac_extensions.cli._config import RUN_FILE, config_to_json
    from ac_extensions.recipes.acer import ACERConfig

    run = {"algorithm": "acer", "config": config_to_json(ACERConfig())}
    (tmp_path / RUN_FILE).write_text(json.dumps(run))
    with pytest.raises(SystemExit, match="is an acer run"):
        bench.main([str(tmp_path)])
