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

    ``ESS``: the normalised effective sample size (Σr)² / (N Σr²) (Kong, 1992; Owen, 2013,
    "Monte Carlo theory, methods and examples", Eq. 9.13), computed in log space so that large
    ratios do not overflow; ``mean_ratio`` and ``max_ratio``. The diagnostics of
    ``SequencePPOLoss`` and ``SequenceA2CLoss``.

    Args:
        log_ratio: log π_θ(a_t|x_t) − log µ(a_t|x_t), shape [N].

    Returns:
        ``{"ESS", "mean_ratio", "max_ratio"}``, scalars.

    Example:
        >>> import torch
        >>> out = ratio_diagnostics(torch.log(torch.tensor([1.0, 2.0, 4.0])))
        >>> round(out["ESS"].item(), 4), round(out["max_ratio"].item(), 4)
        (0.7778, 4.0)
    """
    ess = (2 * log_ratio.logsumexp(0) - (2 * log_ratio).logsumexp(0)).exp()
    ratio = log_ratio.exp()
    return {"ESS": ess / log_ratio.numel(), "mean_ratio": ratio.mean(), "max_ratio": ratio.max()}


def explained_variance(target: Tensor, prediction: Tensor) -> Tensor:
    """1 − Var[target − prediction] / Var[target] over ``[N]`` steps, as SB3 and TorchRL log it.

    The fraction of the return's variance the critic explains (1: perfect, 0: no better than
    a constant, negative: worse). Biased variances; the dtype's ε is added to the denominator.

    Args:
        target: value targets G_t, shape [N].
        prediction: the critic's V(x_t), shape [N].

    Returns:
        A scalar.

    Example:
        >>> import torch
        >>> target = torch.tensor([1.0, 2.0, 3.0, 4.0])
        >>> round(explained_variance(target, target / 2).item(), 4)
        0.75
    """
    eps = torch.finfo(target.dtype).eps
    return 1.0 - (target - prediction).var(correction=0) / (target.var(correction=0) + eps)


__all__ = ["standardize_advantage"]
