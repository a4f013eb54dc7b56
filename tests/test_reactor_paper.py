"""benchmarks/reactor_paper.py: each variant is the paper's settings plus one departure."""

from __future__ import annotations

from pathlib import Path

import pytest

from ac_extensions.recipes.reactor import ReactorConfig
from tests._helpers import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "reactor_paper.py"


@pytest.fixture(scope="module")
def bench():
    yield from load_script(SCRIPT, "reactor_paper")


def test_variants_pin_the_papers_settings_whatever_the_family_defaults(bench):
    paper = ReactorConfig.for_env("MinAtar/Breakout-v1", **bench.overrides("paper"))
    assert paper.policy_torso_gradient is False  # MinAtar's default is True
    assert all(getattr(paper, k) == v for k, v in ReactorConfig.PAPER.items())
    beta = ReactorConfig.for_env("MinAtar/Freeway-v1", **bench.overrides("beta_0.4"))
    assert (beta.importance_exponent, beta.policy_torso_gradient) == (0.4, False)
    torso = ReactorConfig.for_env("MinAtar/Freeway-v1", **bench.overrides("torso_gradient"))
    assert torso.policy_torso_gradient is True
    previous = bench.overrides("previous")
    assert previous == dict(ReactorConfig.PREVIOUS)
