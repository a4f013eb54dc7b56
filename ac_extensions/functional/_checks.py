"""Input validation shared by the functional ops.

Every check raises :class:`ValueError` with the names of the offending arguments and their
shapes, so that a layout mistake fails loudly instead of broadcasting silently.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _shape(x: Tensor) -> str:
    return str(tuple(x.shape))


def check_tensor(name: str, x: object) -> None:
    """Raise unless ``x`` is a tensor."""
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")


def check_time_layout(feature: int | None = None, **named: Tensor) -> tuple[torch.Size, int]:
    """Check that every tensor is ``[*B, T, F]`` with the same ``*B`` and ``T``.

    Args:
        feature: the required trailing size ``F`` (``None`` accepts any, but all must agree).
        **named: the tensors, by argument name.

    Returns:
        ``(batch_shape, T)``.
    """
    for name, x in named.items():
        check_tensor(name, x)
        if x.dim() < 2:
            raise ValueError(
                f"{name} must have shape [*B, T, F] (at least 2 dims), got shape {_shape(x)}"
            )
    first_name, first = next(iter(named.items()))
    lead = first.shape[:-1]
    for name, x in named.items():
        if x.shape[:-1] != lead:
            listing = ", ".join(f"{n}={_shape(v)}" for n, v in named.items())
            raise ValueError(
                f"{name} has leading shape [*B, T] = {tuple(x.shape[:-1])} but {first_name} has "
                f"{tuple(lead)}; all of these must share [*B, T]: {listing}"
            )
        if feature is not None and x.shape[-1] != feature:
            raise ValueError(
                f"{name} must have a trailing feature dim of size {feature} ([*B, T, {feature}]), "
                f"got shape {_shape(x)}"
            )
    if lead[-1] == 0:
        raise ValueError(f"{first_name} has T = 0 time steps (shape {_shape(first)}); need T >= 1")
    return lead[:-1], lead[-1]


def check_same_shape(**named: Tensor) -> torch.Size:
    """Check that all tensors have exactly the same shape and return it."""
    for name, x in named.items():
        check_tensor(name, x)
    first_name, first = next(iter(named.items()))
    for name, x in named.items():
        if x.shape != first.shape:
            listing = ", ".join(f"{n}={_shape(v)}" for n, v in named.items())
            raise ValueError(f"{name} and {first_name} must have the same shape; got {listing}")
    return first.shape


def check_bool(**named: Tensor) -> None:
    """Check that the flags are boolean tensors (a float ``done`` is a common silent bug)."""
    for name, x in named.items():
        if x.dtype != torch.bool:
            raise ValueError(
                f"{name} must be a bool tensor, got dtype {x.dtype} with shape {_shape(x)}; "
                f"convert with `{name}.bool()` if it holds 0/1 flags"
            )


def check_floating(**named: Tensor) -> None:
    """Check that the tensors are floating point."""
    for name, x in named.items():
        if not x.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")


def check_nonnegative(**named: Tensor) -> None:
    """Check that no entry is negative (NaN entries are reported too)."""
    for name, x in named.items():
        bad = ~(x >= 0)
        if bool(bad.any()):
            raise ValueError(
                f"{name} must be >= 0 everywhere; found {int(bad.sum())} negative or NaN "
                f"entries (min {x.min().item():.4g}) in shape {_shape(x)}"
            )


def check_gamma(gamma: float | Tensor, batch_shape: torch.Size, time: int) -> Tensor | float:
    """Check γ ∈ [0, 1]; a tensor γ must broadcast to ``[*B, T, 1]`` without growing it."""
    if isinstance(gamma, Tensor):
        target = (*batch_shape, time, 1)
        try:
            grown = torch.broadcast_shapes(gamma.shape, target)
        except RuntimeError:
            grown = None
        if grown != torch.Size(target):
            raise ValueError(
                f"gamma of shape {_shape(gamma)} does not broadcast to [*B, T, 1] = {target}"
            )
        if bool(((gamma < 0) | (gamma > 1) | gamma.isnan()).any()):
            raise ValueError(
                f"gamma must lie in [0, 1], got values in "
                f"[{gamma.min().item():.4g}, {gamma.max().item():.4g}]"
            )
        return gamma
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)):
        raise ValueError(f"gamma must be a float or a tensor, got {type(gamma).__name__}")
    if not (0.0 <= gamma <= 1.0) or math.isnan(gamma):
        raise ValueError(f"gamma must lie in [0, 1], got {gamma}")
    return float(gamma)


def check_positive_scalar(name: str, value: float, allow_zero: bool = False) -> float:
    """Check a scalar hyperparameter is > 0 (or >= 0 with ``allow_zero``); ``inf`` is allowed."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {type(value).__name__}")
    if math.isnan(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>=' if allow_zero else '>'} 0, got {value}")
    return float(value)


def check_support(support: Tensor) -> None:
    """Check a categorical support: 1-D, at least 2 atoms, strictly increasing, finite."""
    check_tensor("support", support)
    if support.dim() != 1 or support.numel() < 2:
        raise ValueError(f"support must be 1-D with N >= 2 atoms, got shape {_shape(support)}")
    if not support.is_floating_point() or not bool(torch.isfinite(support).all()):
        raise ValueError(f"support must hold finite floats, got {support.tolist()}")
    if not bool((support[1:] > support[:-1]).all()):
        raise ValueError(f"support must be strictly increasing, got {support.tolist()}")
