"""ACER's efficient trust region, per sample.

The policy update is constrained to stay close to a Polyak-averaged policy π_avg: for each
state x_t, with φ_t the statistics of π(·|x_t) (the action probabilities for discrete actions,
(mean, scale) for a Gaussian), g_t = ∂J_t/∂φ_t the gradient of the step-t objective and
k_t = ∂/∂φ_t KL(π_avg(·|x_t) ‖ π(·|x_t)), solve

    minimise_z  ½ ‖g_t − z‖²   subject to   k_tᵀ z ≤ δ

whose closed form is z*_t = g_t − max(0, (k_tᵀg_t − δ) / ‖k_t‖²) · k_t
(Wang et al., 2017, arXiv:1611.01224v2, §3.3, Eq. 11–12).

The constraint is **per sample**: g_t must be the gradient of the step-t objective alone, not of
a batch mean (which shrinks g by the batch size and loosens the constraint by as much; a bug of
several public ACER ports).

The ACER loss does not need a custom backward: minimising −J_t + sg(λ_t) · KL_t with
λ_t = max(0, (k_tᵀg_t − δ)/‖k_t‖²) has gradient −g_t + λ_t k_t = −z*_t with respect to φ_t
(:func:`trust_region_loss`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ac_extensions.functional._checks import check_floating, check_same_shape, check_tensor

__all__ = [
    "categorical_kl_gradient",
    "normal_kl_gradient",
    "scaled_categorical_kl_gradient",
    "trust_region_loss",
    "trust_region_multiplier",
    "trust_region_step",
]


def _check_delta(delta: float) -> float:
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not delta >= 0:
        raise ValueError(f"delta must be a number >= 0 (inf allowed), got {delta!r}")
    return float(delta)


def _check_gk(g: Tensor, k: Tensor) -> None:
    check_same_shape(g=g, k=k)
    check_floating(g=g, k=k)
    if g.dim() < 1:
        raise ValueError(f"g and k must have a trailing statistics dim [*, D], got shape {()}")


def trust_region_multiplier(
    g: Tensor, k: Tensor, delta: float = 1.0, log_scale: Tensor | None = None
) -> Tensor:
    """The per-sample multiplier λ = max(0, (kᵀg − δ) / ‖k‖²) of ACER's trust region.

    Wang et al., 2017, arXiv:1611.01224v2, Eq. 12. Where ‖k‖ = 0 the constraint kᵀz ≤ δ cannot
    bind (δ >= 0), so λ = 0 there (no division by zero).

    With ``log_scale`` = s, ``k`` holds k·e^(−s) (:func:`scaled_categorical_kl_gradient`), and λ
    is computed for the unscaled k as e^(−s) · max(0, (k̃ᵀg − δe^(−s)) / ‖k̃‖²), which stays finite
    where k itself would overflow (a probability below float's smallest normal number).

    Args:
        g: g_t = ∂J_t/∂φ_t, the per-sample gradient of the objective w.r.t. the policy
            statistics. Shape [*, D].
        k: k_t = ∂KL(π_avg ‖ π)/∂φ_t, or k_t·e^(−s_t) when ``log_scale`` is given. Shape [*, D].
        delta: δ >= 0, the trust-region radius (``inf`` disables the constraint).
        log_scale: s_t, or ``None`` for an unscaled k. Shape [*, 1].

    Returns:
        λ_t, shape [*, 1], detached, >= 0.

    Example:
        >>> import torch
        >>> trust_region_multiplier(torch.tensor([2.0, 0.0]), torch.tensor([1.0, 0.0]), 1.0)
        tensor([1.])
    """
    _check_gk(g, k)
    delta = _check_delta(delta)
    g, k = g.detach(), k.detach()
    if math.isinf(delta):
        return torch.zeros_like(g[..., :1])
    if log_scale is None:
        inverse_scale = torch.ones_like(g[..., :1])
    else:
        check_floating(log_scale=log_scale)
        if log_scale.shape != g[..., :1].shape:
            raise ValueError(
                f"log_scale must have shape [*, 1] = {tuple(g[..., :1].shape)}, "
                f"got {tuple(log_scale.shape)}"
            )
        inverse_scale = (-log_scale.detach()).exp()  # e^(−s)                            [*, 1]
    k_dot_g = (k * g).sum(dim=-1, keepdim=True)  # kᵀg    [*, 1]
    k_norm2 = (k * k).sum(dim=-1, keepdim=True)  # ‖k‖²   [*, 1]
    safe_norm2 = torch.where(k_norm2 > 0, k_norm2, torch.ones_like(k_norm2))
    lam = ((k_dot_g - delta * inverse_scale) / safe_norm2).clamp(min=0.0) * inverse_scale
    return torch.where(k_norm2 > 0, lam, torch.zeros_like(lam))


def trust_region_step(g: Tensor, k: Tensor, delta: float = 1.0) -> Tensor:
    """ACER's trust-region-adjusted gradient z* = g − max(0, (kᵀg − δ)/‖k‖²) · k, per sample.

    The solution of min_z ½‖g − z‖² s.t. kᵀz ≤ δ (Wang et al., 2017, arXiv:1611.01224v2,
    Eq. 11–12). If kᵀg ≤ δ the constraint is inactive and z* = g exactly; otherwise
    kᵀz* = δ. Safe when ‖k‖ = 0 (then z* = g).

    Args:
        g: per-sample objective gradient w.r.t. the policy statistics φ. Shape [*, D].
        k: per-sample gradient of KL(π_avg ‖ π) w.r.t. φ. Shape [*, D].
        delta: δ >= 0 (``inf``: no constraint).

    Returns:
        z*, shape [*, D], detached.

    Example:
        >>> import torch
        >>> trust_region_step(torch.tensor([2.0, 0.0, 0.0]), torch.tensor([1.0, 0.0, 0.0]), 1.0)
        tensor([1., 0., 0.])
    """
    lam = trust_region_multiplier(g, k, delta)
    return g.detach() - lam * k.detach()


def trust_region_loss(
    kl: Tensor, g: Tensor, k: Tensor, delta: float = 1.0, log_scale: Tensor | None = None
) -> Tensor:
    """Surrogate penalty sg(λ_t) · KL_t whose gradient applies ACER's trust region.

    Adding this to the per-sample policy loss −J_t gives the gradient −g_t + λ_t k_t = −z*_t
    with respect to the statistics φ_t, i.e. back-propagating z*_t through the network
    (Wang et al., 2017, arXiv:1611.01224v2, Eq. 12; the surrogate form is an identity, see the
    module docstring). λ is detached; only ``kl`` carries gradient.

    Args:
        kl: KL(π_avg(·|x_t) ‖ π(·|x_t)) per sample, differentiable in φ_t. Shape [*, 1].
        g: per-sample objective gradient w.r.t. φ. Shape [*, D].
        k: per-sample gradient of ``kl`` w.r.t. φ (scaled by e^(−s) when ``log_scale`` is
            given). Shape [*, D].
        delta: δ >= 0.
        log_scale: s_t (see :func:`trust_region_multiplier`), or ``None``. Shape [*, 1].

    Returns:
        λ_t · KL_t, shape [*, 1] (sum or average it with the same weights as the policy loss).

    Example:
        >>> import torch
        >>> trust_region_loss(torch.tensor([0.3]), torch.tensor([2.0, 0.0]),
        ...                   torch.tensor([1.0, 0.0]), 1.0)
        tensor([0.3000])
    """
    check_tensor("kl", kl)
    lam = trust_region_multiplier(g, k, delta, log_scale)
    if kl.shape != lam.shape:
        raise ValueError(
            f"kl must have shape [*, 1] = {tuple(lam.shape)} (one KL per sample of g), "
            f"got {tuple(kl.shape)}"
        )
    return lam * kl


def categorical_kl_gradient(average_probs: Tensor, probs: Tensor) -> Tensor:
    """Trust-region direction k = ∂/∂π KL(π_avg ‖ π) = −π_avg / π for φ = probabilities.

    KL(π_avg ‖ π) = Σ_a π_avg(a) (log π_avg(a) − log π(a)), so ∂KL/∂π(a) = −π_avg(a)/π(a).
    φ = the probability vector is the paper's choice ("f categorical with probability vector
    φ_θ(x)", Wang et al., 2017, arXiv:1611.01224v2, §3.3) and openai/baselines'. With
    π_avg = π, k = −𝟙, which back-propagation through a softmax annihilates: the trust region
    then leaves the parameter gradient unchanged.

    Where π(a) underflows to 0 (a probability below float's smallest normal number), k is
    infinite or NaN: use :func:`scaled_categorical_kl_gradient` there.

    Args:
        average_probs: π_avg(·|x) from the average policy network. Shape [*, A].
        probs: π(·|x) from the current policy, > 0. Shape [*, A].

    Returns:
        k, shape [*, A], detached.

    Example:
        >>> import torch
        >>> categorical_kl_gradient(torch.tensor([0.5, 0.5]), torch.tensor([0.25, 0.75]))
        tensor([-2.0000, -0.6667])
    """
    check_same_shape(average_probs=average_probs, probs=probs)
    check_floating(average_probs=average_probs, probs=probs)
    return -average_probs.detach() / probs.detach()


def scaled_categorical_kl_gradient(
    average_log_probs: Tensor, log_probs: Tensor
) -> tuple[Tensor, Tensor]:
    """The direction k = −π_avg/π from log-probabilities, as (k·e^(−s), s), finite on underflow.

    With r(a) = log π_avg(a) − log π(a) and s = max_a r(a), returns k̃ = −e^(r − s) (entries in
    [−1, 0), the largest exactly −1) and s. Since both distributions sum to 1, s ≥ 0 (up to
    rounding), so e^(−s) ≤ 1 never overflows; pass s as ``log_scale`` to
    :func:`trust_region_multiplier` / :func:`trust_region_loss`. Same k as
    :func:`categorical_kl_gradient` (Wang et al., 2017, arXiv:1611.01224v2, §3.3), but from
    ``log_softmax`` outputs, which stay finite when a softmax entry is 0 in float32.

    Args:
        average_log_probs: log π_avg(·|x). Shape [*, A].
        log_probs: log π(·|x), finite. Shape [*, A].

    Returns:
        (k̃, s): k̃ shape [*, A], s shape [*, 1], both detached.

    Example:
        >>> import torch
        >>> k, s = scaled_categorical_kl_gradient(torch.tensor([0.5, 0.5]).log(),
        ...                                       torch.tensor([0.25, 0.75]).log())
        >>> k * s.exp()
        tensor([-2.0000, -0.6667])
    """
    check_same_shape(average_log_probs=average_log_probs, log_probs=log_probs)
    check_floating(average_log_probs=average_log_probs, log_probs=log_probs)
    log_ratio = average_log_probs.detach() - log_probs.detach()  # log |k(a)|             [*, A]
    log_scale = log_ratio.amax(dim=-1, keepdim=True)  # s                                 [*, 1]
    return -(log_ratio - log_scale).exp(), log_scale


def normal_kl_gradient(
    average_loc: Tensor, average_scale: Tensor, loc: Tensor, scale: Tensor
) -> tuple[Tensor, Tensor]:
    """Trust-region direction for a diagonal Gaussian φ = (m, σ): ∂/∂(m, σ) KL(N_avg ‖ N).

        KL = Σ_i [ log σ_i/σ_avg,i + (σ_avg,i² + (m_avg,i − m_i)²) / (2σ_i²) − ½ ]
        k_m = (m − m_avg) / σ²,   k_σ = 1/σ − (σ_avg² + (m_avg − m)²) / σ³
                                      = (σ² − σ_avg² − (m_avg − m)²) / σ³

    (the last form is computed: it is exactly 0 in floating point when N_avg = N, where the
    first rounds to up to ~2e-6 in float32 and would make a δ = 0 trust region act on noise.)

    The continuous-action trust region of Wang et al., 2017, arXiv:1611.01224v2, §5 (applied to
    the Gaussian's statistics).

    Args:
        average_loc: m_avg. Shape [*, d].
        average_scale: σ_avg > 0. Shape [*, d].
        loc: m. Shape [*, d].
        scale: σ > 0. Shape [*, d].

    Returns:
        (k_m, k_σ), each shape [*, d], detached. Concatenate them as the D = 2d statistics.

    Example:
        >>> import torch
        >>> one, zero = torch.ones(1), torch.zeros(1)
        >>> normal_kl_gradient(zero, one, one, one)
        (tensor([1.]), tensor([-1.]))
    """
    check_same_shape(average_loc=average_loc, average_scale=average_scale, loc=loc, scale=scale)
    check_floating(average_loc=average_loc, average_scale=average_scale, loc=loc, scale=scale)
    m_a, s_a, m, s = (x.detach() for x in (average_loc, average_scale, loc, scale))
    k_loc = (m - m_a) / s.pow(2)
    k_scale = (s.pow(2) - s_a.pow(2) - (m_a - m).pow(2)) / s.pow(3)
    return k_loc, k_scale
