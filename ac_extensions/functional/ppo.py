"""Clipped PPO on plain tensors: the losses of ``SequencePPOLoss`` without TensorDicts.

For feed-forward categorical policies a training loop can gather the minibatch tensors itself
and call :func:`categorical_ppo_losses`; it returns the same numbers (and gradients) as
:class:`~ac_extensions.objectives.SequencePPOLoss` / TorchRL's ``ClipPPOLoss`` with
``loss_critic_type="l2"`` on an unpadded flat batch (``tests/functional/test_ppo.py``) at about
half the cost per gradient step for small MLPs (``benchmarks/results/ppo_update.md``).

Shapes: ``[N]`` steps (any flat batch), ``[N, A]`` for per-action tensors.
"""

from __future__ import annotations

import math

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
    log_probs = logits.log_softmax(-1)  # [N, A]
    log_prob = log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
    log_weight = log_prob - behavior_log_prob
    if normalize_advantage and advantage.numel() > 1:
        advantage = standardize_advantage(advantage)
    low = math.log1p(-clip_epsilon) if clip_epsilon < 1 else -math.inf
    high = math.log1p(clip_epsilon)
    clipped = log_weight.clamp(low, high)
    gain = torch.minimum(log_weight.exp() * advantage, clipped.exp() * advantage)
    if entropy_coeff or diagnostics:
        entropy = -(log_probs.exp() * log_probs).sum(-1)  # [N]
        loss_entropy = -entropy_coeff * entropy.mean()
    else:  # a zero coefficient: the term and its gradient are 0, H need not be computed
        loss_entropy = logits.new_zeros(())
    error = (value - value_target).pow(2)
    step = None
    if clip_value is not None:
        step = value - old_value
        clipped_step = step.clamp(-clip_value, clip_value)
        error = torch.maximum(error, (old_value + clipped_step - value_target).pow(2))
    out = {
        "loss_objective": -gain.mean(),
        "loss_critic": critic_coeff * error.mean(),
        "loss_entropy": loss_entropy,
    }
    if diagnostics:
        with torch.no_grad():
            log_weight = log_weight.detach()
            out.update(
                entropy=entropy.detach().mean(),
                kl_approx=(-log_weight).mean(),
                clip_fraction=((log_weight < low) | (log_weight > high)).float().mean(),
                **ratio_diagnostics(log_weight),
                explained_variance=explained_variance(value_target.detach(), value.detach()),
            )
            if step is not None:
                out["value_clip_fraction"] = (step != clipped_step).float().mean()
    return out


__all__ = ["categorical_ppo_losses", "standardize_advantage"]
