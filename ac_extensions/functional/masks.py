"""Reductions over the valid (unpadded) steps of ``[*B, T, 1]`` per-step tensors."""

from __future__ import annotations

from torch import Tensor


def masked_mean(x: Tensor, mask: Tensor | None, weight: Tensor | None = None) -> Tensor:
    """Mean of w · x over the steps where ``mask`` holds (every step if ``mask`` is None).

    The losses on replayed sequences (ACER, continuous ACER, Reactor) reduce every term with it,
    so padded steps of a window never count.

    Args:
        x: per-step values, shape [*B, T, 1].
        mask: valid steps, bool of shape [*B, T], or None.
        weight: per-step importance weights w, shape [*B, T, 1], or None (w = 1).

    Returns:
        A scalar.

    Example:
        >>> import torch
        >>> masked_mean(torch.tensor([[[1.0], [3.0], [8.0]]]), torch.tensor([[True, True, False]]))
        tensor(2.)
    """
    if weight is not None:
        x = x * weight
    return x.mean() if mask is None else x.squeeze(-1)[mask].mean()


__all__ = ["masked_mean"]
