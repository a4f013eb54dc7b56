"""Clipped PPO on plain tensors: the losses of ``SequencePPOLoss`` without TensorDicts.

For feed-forward categorical policies a training loop can gather the minibatch tensors itself
and call :func:`categorical_ppo_losses`; it returns the same numbers (and gradients) as
:class:`~ac_extensions.objectives.SequencePPOLoss` / TorchRL's ``ClipPPOLoss`` with
``loss_critic_type="l2"`` on an unpadded flat batch (``tests/functional/test_ppo.py``) at about
half the cost per gradient step for small MLPs (``benchmarks/results/ppo_update.md``). That
loss module computes its outputs with these functions itself wherever it can (its fast path).

Shapes: ``[N]`` steps (any flat batch), ``[N, A]`` for per-action tensors.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
from torch import Tensor

from ac_extensions.functional._checks import check_positive_scalar

_RESOLUTION = torch.finfo(torch.float).resolution  # TorchRL's advantage-std floor


def _check_steps(logits: Tensor, **named: Tensor) -> int:
    if logits.dim() != 2:
        raise ValueError(f"logits must have shape [N, A], got {list(logits.shape)}")
    n = logits.shape[0]
    for name, value in named.items():
        if value is not None and tuple(value.shape) != (n,):
            raise ValueError(
                f"{name} must have shape [N] = [{n}] (one entry per step, no trailing dim), "
                f"got {list(value.shape)}"
            )
    return n


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
    ``mean_ratio`` and ``max_ratio``. Shared by :func:`categorical_ppo_losses` and the
    ``SequencePPOLoss`` / ``SequenceA2CLoss`` diagnostics.
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


def categorical_ppo_losses(
    logits: Tensor,
    value: Tensor,
    action: Tensor,
    behavior_log_prob: Tensor,
    advantage: Tensor,
    value_target: Tensor,
    *,
    clip_epsilon: float,
    entropy_coeff: float = 0.0,
    critic_coeff: float = 1.0,
    normalize_advantage: bool = True,
    clip_value: float | None = None,
    old_value: Tensor | None = None,
    diagnostics: bool = False,
) -> dict[str, Tensor]:
    """Clipped PPO losses of a categorical policy and a state-value critic, means over N steps.

    With r_t = π_θ(a_t|x_t) / µ(a_t|x_t) and Â_t the (optionally standardised) advantage
    (Schulman et al., 2017, arXiv:1707.06347):

        loss_objective = −mean_t min(r_t Â_t, clip(r_t, 1 − ε, 1 + ε) Â_t)        (Eq. 7)
        loss_critic    = critic_coeff · mean_t (V_θ(x_t) − G_t)²                   (Eq. 9, L^VF)
        loss_entropy   = −entropy_coeff · mean_t H(π_θ(·|x_t))                     (Eq. 9, S)

    The clip acts on log r_t in [log(1 − ε), log(1 + ε)] as TorchRL's does (the same set).
    With ``clip_value`` c the critic term is the larger of the plain and the clipped error,
    V_clip = V_old + clip(V_θ − V_old, −c, c) (the PPO2 baselines' value clipping).

    Args:
        logits: shape [N, A], unnormalised log-probabilities of π_θ.
        value: shape [N], V_θ(x_t).
        action: shape [N], integer actions taken.
        behavior_log_prob: shape [N], log µ(a_t|x_t) stored at collection.
        advantage: shape [N], advantage estimates (e.g. GAE with the pre-update critic).
        value_target: shape [N], G_t, the critic's regression target.
        clip_epsilon: ε ≥ 0.
        entropy_coeff: weight of the entropy bonus.
        critic_coeff: weight of the critic loss.
        normalize_advantage: standardise ``advantage`` over the N steps first
            (:func:`standardize_advantage`; skipped for N = 1).
        clip_value: value-clipping radius c, or ``None``.
        old_value: shape [N], V_old(x_t) at collection; required with ``clip_value``.
        diagnostics: also return detached scalars ``entropy``, ``kl_approx``
            (mean log µ − log π_θ), ``clip_fraction``, ``ESS``, ``mean_ratio``, ``max_ratio``,
            ``explained_variance`` (and ``value_clip_fraction`` with ``clip_value``), defined as
            :class:`~ac_extensions.objectives.SequencePPOLoss` defines them.

    Returns:
        ``{"loss_objective", "loss_critic", "loss_entropy"}`` scalars (plus the diagnostics).

    Example:
        >>> import torch
        >>> out = categorical_ppo_losses(
        ...     torch.zeros(2, 2), torch.tensor([0.0, 1.0]), torch.tensor([0, 1]),
        ...     torch.log(torch.tensor([0.5, 0.5])), torch.tensor([2.0, -1.0]),
        ...     torch.tensor([1.0, 1.0]), clip_epsilon=0.2, entropy_coeff=0.1,
        ...     normalize_advantage=False)
        >>> {k: round(v.item(), 4) for k, v in out.items()}
        {'loss_objective': -0.5, 'loss_critic': 0.5, 'loss_entropy': -0.0693}
    """
    return _forward(
        logits,
        value,
        action,
        behavior_log_prob,
        advantage,
        value_target,
        clip_epsilon,
        entropy_coeff,
        critic_coeff,
        normalize_advantage,
        clip_value,
        old_value,
        diagnostics,
    ).out


def _forward(
    logits,
    value,
    action,
    behavior_log_prob,
    advantage,
    value_target,
    clip_epsilon,
    entropy_coeff,
    critic_coeff,
    normalize_advantage,
    clip_value,
    old_value,
    diagnostics,
) -> SimpleNamespace:
    """The forward pass both PPO functions share (arguments as :func:`categorical_ppo_losses`).

    Returns a namespace with ``out`` (the loss dict, plus the detached diagnostics) and the
    intermediates :func:`categorical_ppo_backward` differentiates by hand: ``log_probs``
    [N, A], ``probs`` [N, A] (None when the entropy was not needed), ``index`` [N, 1],
    ``log_weight``, ``surrogate``, ``clipped_surrogate``, ``entropy`` (or None), ``error``,
    ``squared`` (the plain squared error), ``clipped_error``, ``clipped_squared``, ``step``
    (the last three None without value clipping), and the clip range ``low``, ``high``.
    """
    low, high = _check_arguments(
        logits,
        value,
        action,
        behavior_log_prob,
        advantage,
        value_target,
        clip_epsilon,
        clip_value,
        old_value,
    )
    log_probs = logits.log_softmax(-1)  # [N, A]
    index = action.long().unsqueeze(-1)  # [N, 1]
    log_weight = log_probs.gather(-1, index).squeeze(-1) - behavior_log_prob  # [N]
    if normalize_advantage and advantage.numel() > 1:
        advantage = standardize_advantage(advantage)
    surrogate = log_weight.exp() * advantage
    clipped_surrogate = log_weight.clamp(low, high).exp() * advantage
    gain = torch.minimum(surrogate, clipped_surrogate)
    probs = entropy = None
    if entropy_coeff or diagnostics:
        probs = log_probs.exp()
        entropy = -(probs * log_probs).sum(-1)  # [N]
        loss_entropy = -entropy_coeff * entropy.mean()
    else:  # a zero coefficient: the term and its gradient are 0, H need not be computed
        loss_entropy = logits.new_zeros(())
    error = value - value_target  # [N]
    squared = error.pow(2)
    step = clipped_step = clipped_error = clipped_squared = None
    critic = squared
    if clip_value is not None:
        step = value - old_value
        clipped_step = step.clamp(-clip_value, clip_value)
        clipped_error = old_value + clipped_step - value_target
        clipped_squared = clipped_error.pow(2)
        critic = torch.maximum(squared, clipped_squared)
    out = {
        "loss_objective": -gain.mean(),
        "loss_critic": critic_coeff * critic.mean(),
        "loss_entropy": loss_entropy,
    }
    if diagnostics:
        with torch.no_grad():
            out.update(
                _diagnostics(
                    log_weight.detach(),
                    low,
                    high,
                    entropy.detach(),
                    value.detach(),
                    value_target.detach(),
                    step,
                    clipped_step,
                )
            )
    return SimpleNamespace(
        out=out,
        log_probs=log_probs,
        probs=probs,
        index=index,
        log_weight=log_weight,
        surrogate=surrogate,
        clipped_surrogate=clipped_surrogate,
        entropy=entropy,
        error=error,
        squared=squared,
        clipped_error=clipped_error,
        clipped_squared=clipped_squared,
        step=step,
        low=low,
        high=high,
    )


def _check_arguments(
    logits,
    value,
    action,
    behavior_log_prob,
    advantage,
    value_target,
    clip_epsilon,
    clip_value,
    old_value,
) -> tuple[float, float]:
    """Shape and value checks shared by both PPO functions; returns the log-ratio clip range."""
    _check_steps(
        logits,
        value=value,
        action=action,
        behavior_log_prob=behavior_log_prob,
        advantage=advantage,
        value_target=value_target,
        old_value=old_value,
    )
    clip_epsilon = check_positive_scalar("clip_epsilon", clip_epsilon, allow_zero=True)
    if clip_value is not None and old_value is None:
        raise ValueError("clip_value needs old_value: V_old(x_t) of shape [N]")
    low = math.log1p(-clip_epsilon) if clip_epsilon < 1 else -math.inf
    return low, math.log1p(clip_epsilon)


def _diagnostics(
    log_weight, low, high, entropy, value, value_target, step, clipped_step
) -> dict[str, Tensor]:
    """The detached scalar diagnostics of :func:`categorical_ppo_losses` (shapes [N])."""
    out = {
        "entropy": entropy.mean(),
        "kl_approx": (-log_weight).mean(),
        "clip_fraction": ((log_weight < low) | (log_weight > high)).to(log_weight.dtype).mean(),
        **ratio_diagnostics(log_weight),
        "explained_variance": explained_variance(value_target, value),
    }
    if step is not None:
        out["value_clip_fraction"] = (step != clipped_step).to(step.dtype).mean()
    return out


def _tie_weights(first: Tensor, second: Tensor, first_wins: Tensor) -> tuple[Tensor, Tensor]:
    """Gradient shares of ``first`` and ``second`` in an elementwise min/max (shape [N]).

    ``first_wins``: where ``first`` is the one selected. As torch's ``minimum`` / ``maximum``
    backward: the selected input gets the whole gradient, and a tie gives each half.
    """
    tie = first == second
    share = torch.where(tie, 0.5, first_wins.to(first.dtype))
    return share, torch.where(tie, 0.5, 1.0 - share)


@torch.no_grad()
def categorical_ppo_backward(
    logits: Tensor,
    value: Tensor,
    action: Tensor,
    behavior_log_prob: Tensor,
    advantage: Tensor,
    value_target: Tensor,
    *,
    clip_epsilon: float,
    entropy_coeff: float = 0.0,
    critic_coeff: float = 1.0,
    normalize_advantage: bool = True,
    clip_value: float | None = None,
    old_value: Tensor | None = None,
    diagnostics: bool = False,
) -> tuple[dict[str, Tensor], Tensor, Tensor]:
    """:func:`categorical_ppo_losses`, and the gradient of their sum, derived by hand.

    Takes the same arguments and returns the same (detached) dict, together with
    ∂L/∂logits (shape [N, A]) and ∂L/∂value (shape [N]) for L = loss_objective +
    loss_critic + loss_entropy; no autograd graph is built. With a network's hand-written
    backward (:class:`~ac_extensions.modules.MLPBackprop`) this replaces ``L.backward()``.
    Derivation, with g_t = ∂L/∂log r_t and π = softmax(logits):

    * objective, L_clip = −(1/N) Σ_t min(r_t Â_t, r̄_t Â_t), r̄_t = exp(clip(log r_t)):
      g_t = −(1/N) r_t Â_t (w_t + w̄_t 1[log r_t ∈ [log(1−ε), log(1+ε)]]) with w_t, w̄_t
      the min's gradient shares (1/0, or ½ each on a tie, as torch's ``minimum`` splits it;
      ``clamp`` passes the gradient on the closed range, as torch's does);
    * log r_t = log π(a_t|x_t) − log µ(a_t|x_t): ∂/∂logits = g_t (e_{a_t} − π_t);
    * entropy, −β (1/N) Σ_t H_t with H = −Σ_a π_a log π_a:
      ∂/∂logits = (β/N) π_t ⊙ (log π_t + H_t);
    * critic, c (1/N) Σ_t (V_t − G_t)²: ∂/∂V_t = (2c/N)(V_t − G_t); with value clipping,
      c (1/N) Σ_t max((V_t − G_t)², (V̄_t − G_t)²), V̄_t = V_old + clip(V_t − V_old, −c_v, c_v):
      ∂/∂V_t = (2c/N)(u_t (V_t − G_t) + ū_t (V̄_t − G_t) 1[|V_t − V_old| ≤ c_v]), with u, ū
      the max's gradient shares.

    ``tests/functional/test_ppo.py`` checks the result against autograd through
    :func:`categorical_ppo_losses` (ties and boundaries included). Clipped objective:
    Schulman et al., 2017, arXiv:1707.06347, Eq. 7 and 9.

    Args:
        logits: shape [N, A], unnormalised log-probabilities of π_θ (no graph needed).
        value: shape [N], V_θ(x_t).
        action: shape [N], integer actions taken.
        behavior_log_prob: shape [N], log µ(a_t|x_t) stored at collection.
        advantage: shape [N], advantage estimates.
        value_target: shape [N], G_t.
        clip_epsilon: ε ≥ 0.
        entropy_coeff: weight β of the entropy bonus.
        critic_coeff: weight c of the critic loss.
        normalize_advantage: standardise ``advantage`` over the N steps first.
        clip_value: value-clipping radius c_v, or ``None``.
        old_value: shape [N], V_old(x_t); required with ``clip_value``.
        diagnostics: also return the detached diagnostics of :func:`categorical_ppo_losses`.

    Returns:
        ``(out, grad_logits, grad_value)``: the loss dict of :func:`categorical_ppo_losses`
        (detached), ∂L/∂logits of shape [N, A] and ∂L/∂value of shape [N].

    Example:
        >>> import torch
        >>> out, grad_logits, grad_value = categorical_ppo_backward(
        ...     torch.zeros(2, 2), torch.tensor([0.0, 1.0]), torch.tensor([0, 1]),
        ...     torch.log(torch.tensor([0.5, 0.5])), torch.tensor([2.0, -1.0]),
        ...     torch.tensor([1.0, 1.0]), clip_epsilon=0.2, normalize_advantage=False)
        >>> round(out["loss_objective"].item(), 4), grad_logits.tolist(), grad_value.tolist()
        (-0.5, [[-0.5, 0.5], [-0.25, 0.25]], [-1.0, 0.0])
    """
    f = _forward(
        logits.detach(),
        value.detach(),
        action,
        behavior_log_prob,
        advantage,
        value_target,
        clip_epsilon,
        entropy_coeff,
        critic_coeff,
        normalize_advantage,
        clip_value,
        old_value,
        diagnostics,
    )
    n = logits.shape[0]
    # Objective. Inside the clip range r̄ = r exactly, so both of min's terms carry r Â there.
    share, clipped_share = _tie_weights(
        f.surrogate, f.clipped_surrogate, f.surrogate < f.clipped_surrogate
    )
    in_range = (f.log_weight >= f.low) & (f.log_weight <= f.high)
    grad_log_weight = f.surrogate * (share + clipped_share * in_range) * (-1.0 / n)  # [N]
    probs = f.log_probs.exp() if f.probs is None else f.probs  # [N, A]
    grad_logits = probs * grad_log_weight.neg().unsqueeze(-1)
    grad_logits.scatter_add_(-1, f.index, grad_log_weight.unsqueeze(-1))
    if entropy_coeff:
        grad_logits.addcmul_(probs, f.log_probs + f.entropy.unsqueeze(-1), value=entropy_coeff / n)
    # Critic.
    scale = 2.0 * critic_coeff / n
    if clip_value is None:
        grad_value = f.error * scale
    else:
        weight, clipped_weight = _tie_weights(
            f.squared, f.clipped_squared, f.squared > f.clipped_squared
        )
        passes = (f.step >= -clip_value) & (f.step <= clip_value)
        grad_value = (f.error * weight + f.clipped_error * clipped_weight * passes) * scale
    return f.out, grad_logits, grad_value


__all__ = ["categorical_ppo_backward", "categorical_ppo_losses", "standardize_advantage"]
