"""Reactor's critic on plain tensors: the (distributional) Retrace target and the critic loss.

Reactor (Gruslys et al., 2018, arXiv:1704.04651v2) trains its critic towards a Retrace target
built from a target network, with traces c_t = λ min(1, ρ_t) of the current policy π over the
behaviour policy µ. Distributional (§3.2): the critic outputs, per action, logits over N
atoms z of a fixed support; the target is the projected mixture of n-step return
distributions of :func:`~ac_extensions.functional.distributional_retrace_targets`, and the loss
its cross-entropy with q(x_t, a_t, ·). Non-distributional: the scalar Retrace target of
:func:`~ac_extensions.functional.retrace_targets` (Munos et al., 2016, arXiv:1606.02647v1,
Eq. 4) and ½(G_t − Q(x_t, a_t))².

Shapes: ``[*B, T, 1]`` per step, ``[*B, T, A]`` per action, ``[*B, T, A, N]`` per action and
atom (time at dim -2 of the per-step tensors).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ac_extensions.functional.distributional import distributional_retrace_targets
from ac_extensions.functional.off_policy import retrace_targets, retrace_trace


def _chosen(per_action: Tensor, action: Tensor, atoms: bool) -> Tensor:
    """``per_action`` at the taken action: [*B, T, A(, N)] → [*B, T, 1] or [*B, T, N]."""
    if not atoms:
        return per_action.gather(-1, action)
    index = action.unsqueeze(-1).expand(*action.shape[:-1], 1, per_action.shape[-1])
    return per_action.gather(-2, index).squeeze(-2)


@torch.no_grad()
def reactor_critic_targets(
    log_probs: Tensor,
    target_critic: Tensor,
    next_probs: Tensor,
    next_target_critic: Tensor,
    action: Tensor,
    behavior_log_prob: Tensor,
    reward: Tensor,
    done: Tensor,
    terminated: Tensor,
    gamma: float | Tensor,
    lmbda: float = 1.0,
    support: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The critic's Retrace target from the target network; detached.

    With ρ_t = π(a_t|x_t)/µ(a_t|x_t) and c_t = λ min(1, ρ_t) (Munos et al., 2016,
    arXiv:1606.02647v1, Eq. 4):

    * distributional (``support`` given; Gruslys et al., 2018, arXiv:1704.04651v2, §3.2): the
      target network's atom probabilities q̄ = softmax(``target_critic``); the target is
      q*_t = :func:`~ac_extensions.functional.distributional_retrace_targets` of
      q̄(x_t, a_t, ·) and Σ_a π(a|x_{t+1}) q̄(x_{t+1}, a, ·), and the corrected return its mean
      Σ_i z_i q*_t(i);
    * otherwise the scalar G_t = :func:`~ac_extensions.functional.retrace_targets` of
      Q̄(x_t, a_t), V̄(x_t) = Σ_a π(a|x_t) Q̄(x_t, a) and V̄(x_{t+1}), the corrected return
      itself.

    Args:
        log_probs: log π(·|x_t), shape [*B, T, A].
        target_critic: the target network at x_t: Q̄ [*B, T, A], or atom logits
            [*B, T, A, N] with ``support``.
        next_probs: π(·|x_{t+1}), shape [*B, T, A].
        next_target_critic: the target network at x_{t+1}, shaped as ``target_critic``.
        action: a_t, int64 of shape [*B, T, 1].
        behavior_log_prob: log µ(a_t|x_t), shape [*B, T, 1].
        reward: r_t, shape [*B, T, 1].
        done: bool [*B, T, 1], the episode ended after step t (cuts the trace).
        terminated: bool [*B, T, 1], the end was terminal (no bootstrap).
        gamma: discount γ.
        lmbda: trace decay λ ∈ [0, 1] (the paper's 1).
        support: the atoms z, shape [N] increasing; None for the scalar critic.

    Returns:
        ``(target, corrected_return, ratio)``: q*_t [*B, T, N] (a signed mixture summing to 1)
        or G_t [*B, T, 1]; the corrected return [*B, T, 1]; ρ_t [*B, T, 1].

    Example:
        >>> import torch
        >>> log_probs = torch.log(torch.full((1, 2, 2), 0.5))
        >>> q = torch.tensor([[[1.0, 3.0], [2.0, 2.0]]])
        >>> flags = torch.tensor([[[False], [True]]])
        >>> target, ret, ratio = reactor_critic_targets(
        ...     log_probs, q, log_probs.exp(), q, torch.zeros(1, 2, 1, dtype=torch.long),
        ...     torch.log(torch.full((1, 2, 1), 0.5)), torch.ones(1, 2, 1), flags, flags, 0.5)
        >>> target.squeeze(-1)  # G_1 = r_1 (terminal); G_0 = r_0 + γ(V_1 + c_1(G_1 − Q_1))
        tensor([[1.5000, 1.0000]])
    """
    dtype = log_probs.dtype
    ratio = (log_probs.gather(-1, action) - behavior_log_prob.to(dtype)).exp()  # ρ_t
    trace = retrace_trace(ratio, lmbda)  # c_t = λ min(1, ρ_t)                      [*B, T, 1]
    if support is not None:
        atoms_now, atoms_next = target_critic.softmax(-1), next_target_critic.softmax(-1)
        chosen = _chosen(atoms_now, action, atoms=True)  # q̄(x_t, a_t, ·)          [*B, T, N]
        expected = (next_probs.unsqueeze(-1) * atoms_next).sum(-2)  # Σ_a π q̄     [*B, T, N]
        target = distributional_retrace_targets(
            reward, chosen, expected, trace, done, terminated, gamma, support.to(dtype)
        )  # q*_t                                                                [*B, T, N]
        return target, (target * support.to(dtype)).sum(-1, keepdim=True), ratio
    probs = log_probs.exp()
    target = retrace_targets(
        reward,
        _chosen(target_critic, action, atoms=False),  # Q̄(x_t, a_t)
        (probs * target_critic).sum(-1, keepdim=True),  # V̄(x_t)
        (next_probs * next_target_critic).sum(-1, keepdim=True),  # V̄(x_{t+1})
        trace,
        done,
        terminated,
        gamma,
    )  # G_t                                                                     [*B, T, 1]
    return target, target, ratio


def reactor_critic_loss(
    critic: Tensor,
    target: Tensor,
    action: Tensor,
    support: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Per-step critic loss, the critic's Q(x_t, ·) and its distribution at the taken action.

    Distributional (``support`` given; Gruslys et al., 2018, arXiv:1704.04651v2, §3.2): the
    cross-entropy −Σ_i q*_t(i) log q_i(x_t, a_t) against the target mixture, with
    q = softmax(``critic``) over the atoms and Q(x_t, a) = Σ_i z_i q_i(x_t, a). Scalar:
    ½(G_t − Q(x_t, a_t))² (Munos et al., 2016, arXiv:1606.02647v1).

    Args:
        critic: the online critic at x_t: Q [*B, T, A], or atom logits [*B, T, A, N] with
            ``support``.
        target: q*_t [*B, T, N] or G_t [*B, T, 1] (:func:`reactor_critic_targets`), detached.
        action: a_t, int64 of shape [*B, T, 1].
        support: the atoms z, shape [N]; None for the scalar critic.

    Returns:
        ``(loss, q, chosen)``: the loss per step [*B, T, 1] (differentiable in ``critic``),
        Q(x_t, ·) [*B, T, A], and q(x_t, a_t, ·) [*B, T, N] detached (None for the scalar
        critic).

    Example:
        >>> import torch
        >>> loss, q, _ = reactor_critic_loss(
        ...     torch.tensor([[[1.0, 4.0]]]), torch.tensor([[[2.0]]]),
        ...     torch.ones(1, 1, 1, dtype=torch.long))
        >>> loss  # ½ (2 − 4)²
        tensor([[[2.]]])
    """
    if support is None:
        return 0.5 * (target - _chosen(critic, action, atoms=False)).pow(2), critic, None
    chosen_log = _chosen(critic.log_softmax(-1), action, atoms=True)  # log q(x_t, a_t, ·)
    loss = -(target * chosen_log).sum(-1, keepdim=True)  # −Σ_i q*_i log q_i      [*B, T, 1]
    q = (critic.softmax(-1) * support.to(critic.dtype)).sum(-1)  # E[Z(x_t, a)]      [*B, T, A]
    return loss, q, chosen_log.detach().exp()


__all__ = ["reactor_critic_loss", "reactor_critic_targets"]
