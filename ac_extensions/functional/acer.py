"""Discrete ACER on plain tensors: Q^ret from network outputs, and the whole loss.

:class:`~ac_extensions.objectives.ACERLoss` evaluates its networks (through their TensorDict
modules) and hands the outputs to these two functions, so the math lives here once, free of
keys and modules:

- :func:`categorical_q_retrace`: Q^ret (Wang et al., 2017, arXiv:1611.01224v2, Eq. 5; Retrace(λ)
  of Munos et al., 2016, arXiv:1606.02647v1, Eq. 4) from π and Q at x_t and x_{t+1};
- :func:`categorical_acer_losses`: the critic loss (§3.1), the truncated importance-sampling
  policy gradient with bias correction (Eq. 9), the entropy bonus and the efficient trust
  region against the average policy (§3.3, Eq. 11–12), reduced over the valid steps.

Layout as the rest of :mod:`ac_extensions.functional`: ``[*B, T, A]`` per-action tensors,
``[*B, T, 1]`` per-step scalars, time at dim -2.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ac_extensions.functional._checks import check_same_shape, check_time_layout
from ac_extensions.functional.masks import masked_mean
from ac_extensions.functional.off_policy import retrace_targets, retrace_trace
from ac_extensions.functional.policy_gradients import (
    bias_correction_loss,
    truncated_is_policy_loss,
)
from ac_extensions.functional.trust_region import (
    scaled_categorical_kl_gradient,
    trust_region_loss,
    trust_region_multiplier,
)

__all__ = ["categorical_acer_losses", "categorical_q_retrace"]


@torch.no_grad()
def categorical_q_retrace(
    logits: Tensor,
    action_value: Tensor,
    next_logits: Tensor,
    next_action_value: Tensor,
    action: Tensor,
    behavior_log_probs: Tensor,
    reward: Tensor,
    done: Tensor,
    terminated: Tensor,
    gamma: float | Tensor,
    lmbda: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Retrace(λ) targets for a softmax policy and a Q head; λ = 1 is ACER's Q^ret.

        G_t = r_t + γ(1 − term_t)[V(x_{t+1}) + (1 − done_t) c_{t+1}(G_{t+1} − Q(x_{t+1}, a_{t+1}))]

    with c_t = λ min(1, π(a_t|x_t)/µ(a_t|x_t)) and V(x) = Σ_a π(a|x) Q(x, a) (Munos et al., 2016,
    arXiv:1606.02647v1, Eq. 4; Wang et al., 2017, arXiv:1611.01224v2, Eq. 5), computed by
    :func:`~ac_extensions.functional.retrace_targets`.

    Args:
        logits: the current policy's logits at x_t. Shape [*B, T, A].
        action_value: Q(x_t, ·). Shape [*B, T, A].
        next_logits: the policy's logits at x_{t+1} (``("next", ...)``). Shape [*B, T, A].
        next_action_value: Q(x_{t+1}, ·). Shape [*B, T, A].
        action: the actions taken, indices. Shape [*B, T, 1], integer.
        behavior_log_probs: log µ(·|x_t) of the policy that acted. Shape [*B, T, A].
        reward: r_t. Shape [*B, T, 1].
        done: the trajectory ends after step t. Shape [*B, T, 1], bool.
        terminated: x_{t+1} is terminal. Shape [*B, T, 1], bool.
        gamma: discount γ ∈ [0, 1].
        lmbda: trace decay λ ∈ [0, 1].

    Returns:
        ``(q_ret, value)``: G_t and V(x_t), each [*B, T, 1], detached.

    Example:
        >>> import torch
        >>> zeros = torch.zeros(1, 2, 2)
        >>> no = torch.zeros(1, 2, 1, dtype=torch.bool)
        >>> q_ret, value = categorical_q_retrace(zeros, torch.ones(1, 2, 2), zeros,
        ...     torch.ones(1, 2, 2), torch.zeros(1, 2, 1, dtype=torch.long),
        ...     zeros.log_softmax(-1), torch.ones(1, 2, 1), no, no, gamma=0.5)
        >>> q_ret.squeeze(-1)  # G_1 = 1 + ½·1 = 1.5; G_0 = 1 + ½(1 + 1·(1.5 − 1)) = 1.75
        tensor([[1.7500, 1.5000]])
    """
    check_same_shape(
        logits=logits,
        action_value=action_value,
        next_logits=next_logits,
        next_action_value=next_action_value,
        behavior_log_probs=behavior_log_probs,
    )
    probs = logits.softmax(-1)  # π(·|x_t)                                          [*B, T, A]
    value = (probs * action_value).sum(-1, keepdim=True)  # V(x_t)                 [*B, T, 1]
    next_value = (next_logits.softmax(-1) * next_action_value).sum(-1, keepdim=True)
    ratio = (probs.gather(-1, action).log() - behavior_log_probs.gather(-1, action)).exp()
    q_ret = retrace_targets(
        reward,
        action_value.gather(-1, action),
        value,
        next_value,
        retrace_trace(ratio, lmbda),
        done,
        terminated,
        gamma,
    )
    return q_ret, value


def categorical_acer_losses(
    logits: Tensor,
    action_value: Tensor,
    average_logits: Tensor,
    q_ret: Tensor,
    action: Tensor,
    behavior_log_probs: Tensor,
    *,
    truncation_threshold: float = 10.0,
    trust_region_delta: float = 1.0,
    entropy_coeff: float | Tensor = 0.01,
    critic_coeff: float | Tensor = 0.5,
    mask: Tensor | None = None,
) -> dict[str, Tensor]:
    """ACER's losses for a softmax policy and a Q head, averaged over the valid steps.

    Wang et al., 2017, "Sample Efficient Actor-Critic with Experience Replay",
    arXiv:1611.01224v2 (section and equation numbers below refer to it).

    Per step t, with π = softmax(``logits``), ρ_t(a) = π(a|x_t)/µ(a|x_t), V_t = Σ_a π(a) Q(x_t, a)
    (π detached) and c the truncation threshold:

    - critic (§3.1): ½ (Q^ret_t − Q(x_t, a_t))², times ``critic_coeff``;
    - policy (Eq. 9): −min(c, ρ_t)(Q^ret_t − V_t) log π(a_t|x_t)
      − Σ_a [1 − c/ρ_t(a)]_+ π(a)(Q(x_t, a) − V_t) log π(a|x_t);
    - entropy: −``entropy_coeff`` · H(π(·|x_t));
    - trust region (§3.3, Eq. 11–12) on the statistics φ_t = π(·|x_t): with g_t = ∂J_t/∂φ_t,
      J_t the step's policy objective with the entropy bonus, and k_t = −π_avg/π, the policy
      loss adds sg(λ_t) KL(π_avg ‖ π) with λ_t = max(0, (k_tᵀg_t − δ)/‖k_t‖²), so that the
      gradient reaching φ_t is −z*_t. ``trust_region_delta = inf`` leaves it out.

    Args:
        logits: the current policy's logits at x_t, differentiable (the trust region takes
            the gradient g_t through them: call it with gradients enabled). Shape [*B, T, A].
        action_value: Q(x_t, ·), differentiable. Shape [*B, T, A].
        average_logits: the average policy's logits at x_t (no gradient is taken). Shape
            [*B, T, A].
        q_ret: the critic's target Q^ret_t (e.g. :func:`categorical_q_retrace`), a constant.
            Shape [*B, T, 1].
        action: the actions taken, indices. Shape [*B, T, 1], integer.
        behavior_log_probs: log µ(·|x_t). Shape [*B, T, A].
        truncation_threshold: c > 0.
        trust_region_delta: δ ≥ 0 (``inf``: no trust region).
        entropy_coeff: entropy bonus coefficient.
        critic_coeff: critic loss coefficient.
        mask: the valid steps, bool [*B, T]; ``None``: all.

    Returns:
        Scalars ``loss_objective`` (policy + trust region), ``loss_critic``, ``loss_entropy``
        and the detached diagnostics ``entropy``, ``ratio_mean``, ``truncation_fraction``
        (ρ_t > c), ``trust_region_active`` (fraction with λ_t > 0), ``kl_average``
        (KL(π_avg ‖ π)), ``q_ret_mean``.

    Example:
        >>> import torch
        >>> logits = torch.zeros(1, 3, 2, requires_grad=True)
        >>> out = categorical_acer_losses(logits, torch.zeros(1, 3, 2), torch.zeros(1, 3, 2),
        ...     torch.ones(1, 3, 1), torch.zeros(1, 3, 1, dtype=torch.long),
        ...     torch.zeros(1, 3, 2).log_softmax(-1))
        >>> round(float(out["loss_critic"]), 4), round(float(out["ratio_mean"]), 4)
        (0.25, 1.0)
    """
    check_time_layout(q_ret=q_ret, feature=1)
    check_same_shape(
        logits=logits,
        action_value=action_value,
        average_logits=average_logits,
        behavior_log_probs=behavior_log_probs,
    )
    q = action_value
    probs = logits.softmax(-1)  # φ_t = π(·|x_t)                                    [*B, T, A]
    pi_detached = probs.detach()
    with torch.no_grad():
        exact_log_probs = logits.log_softmax(-1)
    # log φ as a function of φ (g = ∂J/∂φ needs it): log_softmax's value, derivative 1/φ floored
    # at float's smallest normal number, so both stay finite where a softmax entry underflows.
    tiny = torch.finfo(probs.dtype).tiny
    log_probs = exact_log_probs + (probs - pi_detached) / pi_detached.clamp_min(tiny)
    value = (pi_detached * q).sum(-1, keepdim=True)  # V_t = Σ_a π(a) Q(a)          [*B, T, 1]
    chosen_q = q.gather(-1, action)  # Q(x_t, a_t)                                 [*B, T, 1]
    ratios = (exact_log_probs - behavior_log_probs).exp()  # ρ_t(a)                [*B, T, A]
    ratio = ratios.gather(-1, action)  # ρ_t                                       [*B, T, 1]
    critic = 0.5 * (q_ret - chosen_q).pow(2)  # ½ (Q^ret − Q(x_t, a_t))²             [*B, T, 1]

    # Policy objective J_t (to maximise), per sample: Eq. 9 plus the entropy bonus.
    c = truncation_threshold
    advantage = (q - value).detach()  # Q(x_t, ·) − V_t                              [*B, T, A]
    policy_loss = truncated_is_policy_loss(
        log_probs.gather(-1, action), ratio, q_ret - value.detach(), c
    ) + bias_correction_loss(log_probs, ratios, advantage, c)
    entropy = -(probs * log_probs).sum(-1, keepdim=True)  # H(π(·|x_t))              [*B, T, 1]
    objective = -policy_loss + entropy_coeff * entropy  # J_t                      [*B, T, 1]

    # Efficient trust region, per sample (Eq. 11–12) on φ = probs. k = −π_avg/π is taken
    # from log-probabilities, scaled by e^(−s), so that a probability that underflows to 0 in
    # float32 leaves it finite (an entry of π at 0 gets no gradient through the softmax).
    with torch.no_grad():
        average_log_probs = average_logits.log_softmax(-1)
        average_probs = average_log_probs.exp()
    kl = (average_probs * (average_log_probs - log_probs)).sum(-1, keepdim=True)  # [*B, T, 1]
    if math.isinf(trust_region_delta):
        penalty = torch.zeros_like(kl)
        active = torch.zeros_like(kl)
    else:
        (g,) = torch.autograd.grad(objective.sum(), probs, retain_graph=True)  # ∂J_t/∂φ_t
        k, log_scale = scaled_categorical_kl_gradient(average_log_probs, exact_log_probs)
        penalty = trust_region_loss(kl, g, k, trust_region_delta, log_scale)
        lam = trust_region_multiplier(g, k, trust_region_delta, log_scale)
        active = (lam > 0).to(kl.dtype)

    return {
        "loss_objective": masked_mean(policy_loss + penalty, mask),
        "loss_critic": critic_coeff * masked_mean(critic, mask),
        "loss_entropy": -entropy_coeff * masked_mean(entropy, mask),
        "entropy": masked_mean(entropy.detach(), mask),
        "ratio_mean": masked_mean(ratio, mask),
        "truncation_fraction": masked_mean((ratio > c).to(ratio.dtype), mask),
        "trust_region_active": masked_mean(active, mask),
        "kl_average": masked_mean(kl.detach(), mask),
        "q_ret_mean": masked_mean(q_ret, mask),
    }
