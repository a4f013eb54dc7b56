"""Small constructors shared by the tests."""

from __future__ import annotations

import torch
from torch import Tensor


def col(*xs: float, dtype: torch.dtype = torch.float64) -> Tensor:
    """A [T, 1] column: one trajectory, no batch dims."""
    return torch.tensor(xs, dtype=dtype).unsqueeze(-1)


def flags(*xs: int) -> Tensor:
    """A [T, 1] bool column."""
    return torch.tensor(xs, dtype=torch.bool).unsqueeze(-1)
