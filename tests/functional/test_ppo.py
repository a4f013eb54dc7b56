"""functional.ppo: the on-policy losses' statistics against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from ac_extensions.functional import standardize_advantage
from ac_extensions.functional.ppo import explained_variance, ratio_diagnostics


def test_standardize_advantage_matches_mean_and_unbiased_std():
    x = torch.tensor([1.0, 2.0, 4.0, 9.0])
    torch.testing.assert_close(standardize_advantage(x), (x - 4.0) / x.std())
    assert torch.all(standardize_advantage(torch.ones(5)) == 0)


def test_ratio_diagnostics_by_hand():
    # r = (1, 2, 4): ESS = (Σr)² / (N Σr²) = 49 / (3 · 21).
    out = ratio_diagnostics(torch.log(torch.tensor([1.0, 2.0, 4.0])))
    assert out["ESS"].item() == pytest.approx(49 / 63)
    assert out["mean_ratio"].item() == pytest.approx(7 / 3)
    assert out["max_ratio"].item() == pytest.approx(4.0)
    # Equal ratios: every sample counts fully, even when the ratios overflow float32.
    assert ratio_diagnostics(torch.full((5,), 200.0))["ESS"].item() == pytest.approx(1.0, rel=1e-5)


def test_explained_variance_by_hand():
    target = torch.tensor([1.0, 2.0, 3.0, 4.0])  # biased variance 1.25
    assert explained_variance(target, target).item() == pytest.approx(1.0)
    # Residual target / 2: variance 1.25 / 4, a quarter left unexplained.
    assert explained_variance(target, target / 2).item() == pytest.approx(0.75)
    # A constant offset is fully explained (the residual has no variance).
    assert explained_variance(target, target + 1).item() == pytest.approx(1.0)
    assert math.isfinite(explained_variance(torch.ones(3), torch.zeros(3)).item())
