"""Off-policy policy-gradient losses: ACER's truncated IS with bias correction, Reactor's β-LOO.

Every function returns an *unreduced* per-step loss to **minimise** (the negative of the paper's
ascent objective), shape ``[*B, T, 1]``; the caller masks and averages. Every weight (ratios,
advantages, returns, the π factor of the bias correction, β) is detached inside the function:
only the log-probabilities (ACER) or the probabilities (β-LOO) carry gradient. Not detaching the
π factor of the bias correction is a known bug of public ACER ports (Kaixhin/ACER#22,
seungeunrho/minimalRL#15): ∇(π log π) ≠ π ∇log π.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ac_extensions.functional._checks import (
    check_floating,
    check_nonnegative,
    check_positive_scalar,
    check_same_shape,
    check_tensor,
    check_time_layout,
)

__all__ = [
    "beta_loo_policy_loss",
    "bias_correction_loss",
    "sampled_bias_correction_loss",
    "truncated_is_policy_loss",
]


def _correction_weight(ratio: Tensor, truncation_threshold: float) -> Tensor:
    """[1 − c/ρ]_+ computed without dividing by zero (ρ = 0 gives 0, ρ = inf gives 1)."""
    ratio = ratio.detach()
    if math.isinf(truncation_threshold):
        return torch.zeros_like(ratio)
    # 1 − c/ρ > 0  ⇔  ρ > c; evaluating c/ρ only there keeps ρ = 0 from producing inf − inf.
    safe = torch.where(ratio > truncation_threshold, ratio, torch.ones_like(ratio))
    return torch.where(ratio > truncation_threshold, 1.0 - truncation_threshold / safe, 0.0)


def truncated_is_policy_loss(
    log_prob: Tensor,
    ratio: Tensor,
    advantage: Tensor,
    truncation_threshold: float = 10.0,
) -> Tensor:
    """ACER's truncated importance-sampled policy term (to minimise).

        L_t = − min(c, ρ_t) · (Q^ret_t − V(x_t)) · log π(a_t|x_t)

    with min(c, ρ_t) and the advantage Q^ret_t − V(x_t) treated as constants. This is the first
    term of the ACER gradient, Wang et al., 2017, arXiv:1611.01224v2, Eq. 9 (truncation with
    bias correction, Eq. 7); the default c = 10 is the paper's.

    Args:
        log_prob: log π(a_t|x_t) of the stored action under the current policy; the only input
            that carries gradient. Shape [*B, T, 1].
        ratio: ρ_t = π(a_t|x_t)/µ(a_t|x_t), >= 0 (detached here). Shape [*B, T, 1].
        advantage: Q^ret_t − V(x_t) (detached here). Shape [*B, T, 1].
        truncation_threshold: c > 0 (``inf`` disables truncation: plain importance sampling).

    Returns:
        Per-step loss, shape [*B, T, 1].

    Example:
        >>> import torch
        >>> logp = torch.tensor([[0.5]]).log().requires_grad_()
        >>> truncated_is_policy_loss(logp, torch.tensor([[20.0]]), torch.tensor([[1.0]]))
        tensor([[6.9315]], grad_fn=<MulBackward0>)
    """
    check_time_layout(feature=1, log_prob=log_prob, ratio=ratio, advantage=advantage)
    check_floating(log_prob=log_prob, ratio=ratio, advantage=advantage)
    check_nonnegative(ratio=ratio)
    c = check_positive_scalar("truncation_threshold", truncation_threshold)
    weight = ratio.detach().clamp(max=c) * advantage.detach()  # min(c, ρ_t)(Q^ret − V)
    return -weight * log_prob


def bias_correction_loss(
    log_probs: Tensor,
    ratios: Tensor,
    advantages: Tensor,
    truncation_threshold: float = 10.0,
) -> Tensor:
    """ACER's bias-correction term over all actions (to minimise).

        L_t = − Σ_a [1 − c/ρ_t(a)]_+ · π(a|x_t) · (Q(x_t, a) − V(x_t)) · log π(a|x_t)

    with the weight [1 − c/ρ_t(a)]_+ · π(a|x_t) · (Q − V) detached (π(a|x_t) = exp(log_probs) is
    read without gradient). Second term of Wang et al., 2017, arXiv:1611.01224v2, Eq. 9. Together
    with :func:`truncated_is_policy_loss` it is unbiased: for every action,
    µ(a)·min(c, ρ(a)) + π(a)·[1 − c/ρ(a)]_+ = π(a) (Eq. 7).

    Args:
        log_probs: log π(·|x_t) for every action under the current policy; the only input that
            carries gradient. Shape [*B, T, A].
        ratios: ρ_t(a) = π(a|x_t)/µ(a|x_t) for every action, >= 0 (inf allowed). Shape [*B, T, A].
        advantages: Q(x_t, a) − V(x_t) for every action (detached here). Shape [*B, T, A].
        truncation_threshold: c > 0 (``inf`` makes the correction vanish).

    Returns:
        Per-step loss, shape [*B, T, 1]. Zero on on-policy data when c >= 1 (every ρ = 1).

    Example:
        >>> import torch
        >>> logp = torch.tensor([[0.5, 0.5]]).log().requires_grad_()
        >>> bias_correction_loss(logp, torch.tensor([[4.0, 0.5]]), torch.tensor([[1.0, -1.0]]),
        ...                      truncation_threshold=2.0)
        tensor([[0.1733]], grad_fn=<NegBackward0>)
    """
    check_time_layout(log_probs=log_probs, ratios=ratios, advantages=advantages)
    check_same_shape(log_probs=log_probs, ratios=ratios, advantages=advantages)
    check_floating(log_probs=log_probs, ratios=ratios, advantages=advantages)
    check_nonnegative(ratios=ratios)
    c = check_positive_scalar("truncation_threshold", truncation_threshold)
    probs = log_probs.detach().exp()  # π(a|x_t), a constant weight         [*B, T, A]
    weight = _correction_weight(ratios, c) * probs * advantages.detach()  # [*B, T, A]
    # An action with π(a) = 0 has weight 0 and log π(a) = −inf: it contributes nothing.
    terms = torch.where(weight != 0, weight * log_probs, torch.zeros_like(log_probs))
    return -terms.sum(dim=-1, keepdim=True)


def sampled_bias_correction_loss(
    log_prob: Tensor,
    ratio: Tensor,
    advantage: Tensor,
    truncation_threshold: float = 10.0,
) -> Tensor:
    """ACER's bias-correction term estimated with K actions sampled from π (continuous ACER).

        L_t = − (1/K) Σ_k [1 − c/ρ_t(a'_k)]_+ · (Q̃(x_t, a'_k) − V(x_t)) · log π(a'_k|x_t),
        a'_k ∼ π(·|x_t)

    The π(a) factor of the discrete sum becomes the sampling distribution, so it does not appear.
    Wang et al., 2017, arXiv:1611.01224v2, §5, continuous-action ACER gradient (one fresh sample,
    K = 1, in the paper). Weights are detached.

    Args:
        log_prob: log π(a'_k|x_t) of the fresh samples (these must be detached samples; gradient
            flows through the density only). Shape [*B, T, K].
        ratio: ρ_t(a'_k) = π(a'_k|x_t)/µ(a'_k|x_t), >= 0. Shape [*B, T, K].
        advantage: Q̃(x_t, a'_k) − V(x_t) (detached here). Shape [*B, T, K].
        truncation_threshold: c > 0.

    Returns:
        Per-step loss averaged over the K samples, shape [*B, T, 1].

    Example:
        >>> import torch
        >>> logp = torch.tensor([[0.5]]).log().requires_grad_()
        >>> sampled_bias_correction_loss(logp, torch.tensor([[4.0]]), torch.tensor([[1.0]]), 2.0)
        tensor([[0.3466]], grad_fn=<NegBackward0>)
    """
    check_time_layout(log_prob=log_prob, ratio=ratio, advantage=advantage)
    check_same_shape(log_prob=log_prob, ratio=ratio, advantage=advantage)
    check_floating(log_prob=log_prob, ratio=ratio, advantage=advantage)
    check_nonnegative(ratio=ratio)
    c = check_positive_scalar("truncation_threshold", truncation_threshold)
    weight = _correction_weight(ratio, c) * advantage.detach()  # [*B, T, K]
    return -(weight * log_prob).mean(dim=-1, keepdim=True)


def beta_loo_policy_loss(
    probs: Tensor,
    action: Tensor,
    behavior_prob: Tensor,
    action_value: Tensor,
    corrected_return: Tensor,
    truncation_threshold: float = 1.0,
) -> Tensor:
    """Reactor's β-leave-one-out policy gradient (to minimise).

        L_t = − [ β · (R(â) − Q(x_t, â)) · π(â|x_t) + Σ_a Q(x_t, a) · π(a|x_t) ],
        β = min(c, 1/µ(â|x_t))

    where â = a_t is the action the behavior policy µ took and R(â) its off-policy corrected
    (Retrace) return. Gruslys et al., 2018, arXiv:1704.04651v2, §3.1 (the β-LOO estimator and
    Proposition 1: the bias is |Σ_a (1 − µ(a)β(a)) ∇π(a) (Q(a) − Q^π(a))|). c = 1 gives plain
    leave-one-out (β = 1), c = inf the unbiased β = 1/µ. Note the loss holds the probability
    π(â), not its log. β, R, Q are detached; only ``probs`` carries gradient.

    Args:
        probs: π(·|x_t) for every action under the current policy. Shape [*B, T, A].
        action: â = a_t, the index of the action taken. Shape [*B, T, 1], integer dtype.
        behavior_prob: µ(â|x_t) stored at collection, in (0, 1]. Shape [*B, T, 1].
        action_value: Q(x_t, ·) from the critic (for a distributional critic, E[Z]).
            Shape [*B, T, A].
        corrected_return: R(â), the Retrace target of the taken action. Shape [*B, T, 1].
        truncation_threshold: c >= 0 (``inf`` allowed; c = 0 gives β ≡ 0, the all-action
            critic gradient Σ_a Q(a) ∇π(a)).

    Returns:
        Per-step loss, shape [*B, T, 1].

    Example:
        >>> import torch
        >>> probs = torch.tensor([[0.5, 0.5]], requires_grad=True)
        >>> beta_loo_policy_loss(probs, torch.tensor([[0]]), torch.tensor([[0.25]]),
        ...                      torch.tensor([[0.0, 0.0]]), torch.tensor([[1.0]]))
        tensor([[-0.5000]], grad_fn=<NegBackward0>)
    """
    check_time_layout(probs=probs, action_value=action_value)
    check_same_shape(probs=probs, action_value=action_value)
    check_time_layout(
        feature=1, action=action, behavior_prob=behavior_prob, corrected_return=corrected_return
    )
    check_time_layout(probs=probs, behavior_prob=behavior_prob)  # same [*B, T]
    check_floating(
        probs=probs,
        behavior_prob=behavior_prob,
        action_value=action_value,
        corrected_return=corrected_return,
    )
    check_tensor("action", action)
    if action.is_floating_point() or action.dtype == torch.bool:
        raise ValueError(f"action must hold integer action indices, got dtype {action.dtype}")
    num_actions = probs.shape[-1]
    if bool(((action < 0) | (action >= num_actions)).any()):
        raise ValueError(f"action indices must lie in [0, {num_actions}), got {action.tolist()}")
    if bool(~(behavior_prob > 0).all()):
        raise ValueError(
            "behavior_prob must be > 0 for every taken action (the behavior policy chose it), "
            f"found min {behavior_prob.min().item():.4g} in shape {tuple(behavior_prob.shape)}"
        )
    c = check_positive_scalar("truncation_threshold", truncation_threshold, allow_zero=True)
    action_value = action_value.detach()
    beta = (1.0 / behavior_prob.detach()).clamp(max=c)  # β = min(c, 1/µ(â))      [*B, T, 1]
    chosen_prob = probs.gather(-1, action)  # π(â|x_t)                                [*B, T, 1]
    chosen_value = action_value.gather(-1, action)  # Q(x_t, â)                         [*B, T, 1]
    loo = beta * (corrected_return.detach() - chosen_value) * chosen_prob
    all_action = (action_value * probs).sum(dim=-1, keepdim=True)  # Σ_a Q(a) π(a)
    return -(loo + all_action)
