"""Scalar statistics of the on-policy losses: advantage standardisation and diagnostics.

Shapes: ``[N]`` steps (any flat batch of valid steps).
"""

from __future__ import annotations

import torch
from torch import Tensor

_RESOLUTION = torch.finfo(torch.float).resolution  # TorchRL's advantage-std floor


def standardize_advantage(advantage: Tensor) -> Tensor:
    """(A − mean A) / max(std A, ε): the minibatch standardisation of SB3 and TorchRL.

    ``std`` is the unbiased standard deviation and ε the float32 resolution (1e-6), as in
    TorchRL's ``_standardize`` (PPO's advantage normalisation, arXiv:1707.06347 as implemented
    by the OpenAI baselines).

    Args:
        advantage: shape [N], advantage estimates of one minibatch.

    Returns:
        Shape [N]: the standardised advantages.

    Example:
        >>> import torch
        >>> standardize_advantage(torch.tensor([1.0, 3.0]))
        tensor([-0.7071,  0.7071])
    """
    return (advantage - advantage.mean()) / advantage.std().clamp_min(_RESOLUTION)


def ratio_diagnostics(log_ratio: Tensor) -> dict[str, Tensor]:
    """Spread of the importance ratios r = exp(log_ratio) over ``[N]`` steps.

    ``ESS``: the normalised effective sample size (Σr)² / (N Σr²), computed in log space;
    ``mean_ratio`` and ``max_ratio``: the ``SequencePPOLoss`` / ``SequenceA2CLoss`` diagnostics.
    """
    ess = (2 * log_ratio.logsumexp(0) - (2 * log_ratio).logsumexp(0)).exp()
    ratio = log_ratio.exp()
    return {"ESS": ess / log_ratio.numel(), "mean_ratio": ratio.mean(), "max_ratio": ratio.max()}


def explained_variance(target: Tensor, prediction: Tensor) -> Tensor:
    """1 − Var[target − prediction] / Var[target] over ``[N]`` steps, as SB3 and TorchRL log it.

    Biased variances; the dtype's ε is added to the denominator.
    """
    eps = torch.finfo(target.dtype).eps
    return 1.0 - (target - prediction).var(correction=0) / (target.var(correction=0) + eps)


__all__ = ["explained_variance", "ratio_diagnostics", "standardize_advantage"]
