"""Off-policy returns with per-step traces: Retrace, ACER's Q^ret, tree-backup, Q^opc.

One primitive, :func:`retrace_targets`, computes the trace-corrected action-value target for
any trace coefficient ``c``; the algorithms differ only in how ``c`` is built, which the small
``*_trace`` functions below do (the trace table of Munos et al., 2016, arXiv:1606.02647v1,
Table 1):

    importance sampling   c_t = ρ_t
    Retrace(λ)            c_t = λ · min(1, ρ_t)          :func:`retrace_trace`
    ACER's Q^ret          c_t = min(1, ρ_t)              :func:`acer_trace`
    continuous ACER       c_t = min(1, ρ_t^{1/d})        :func:`continuous_acer_trace`
    tree-backup TB(λ)     c_t = λ · π(a_t|x_t)           :func:`tree_backup_trace`
    Q^opc                 c_t = 1                        :func:`opc_trace`

with ρ_t = π(a_t|x_t) / µ(a_t|x_t), π the target (current) policy and µ the behavior policy
that acted.

Layout (README § Conventions): batch-first ``[*B, T, 1]``, time at dim -2; index t holds the
transition (x_t, a_t, r_t, x_{t+1}); ``done[t]`` says the trajectory ends after step t (terminal,
truncated, or a segment boundary inside a batch) and ``terminated[t]`` that x_{t+1} is terminal.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ac_extensions.functional._checks import (
    check_bool,
    check_floating,
    check_gamma,
    check_nonnegative,
    check_tensor,
    check_time_layout,
)

__all__ = [
    "acer_trace",
    "continuous_acer_trace",
    "importance_ratio",
    "opc_trace",
    "retrace_targets",
    "retrace_trace",
    "sequence_priority",
    "tree_backup_trace",
]


def _shift_back(x: Tensor, fill: float = 0.0) -> Tensor:
    """Return y with y[..., t, :] = x[..., t + 1, :] and y[..., T - 1, :] = fill.  # [*B, T, F]."""
    tail = torch.full_like(x[..., -1:, :], fill)
    return torch.cat([x[..., 1:, :], tail], dim=-2)


def _backward_linear_recursion(offset: Tensor, coefficient: Tensor) -> Tensor:
    """Solve G_t = offset_t + coefficient_t · G_{t+1} backwards from G_T = 0.

    Args:
        offset: Shape [*B, T, F].
        coefficient: Shape [*B, T, F] (``coefficient[..., T-1, :]`` multiplies G_T = 0).

    Returns:
        G, shape [*B, T, F].
    """
    out = torch.empty_like(offset)
    carry = torch.zeros_like(offset[..., 0, :])
    for t in range(offset.shape[-2] - 1, -1, -1):
        carry = offset[..., t, :] + coefficient[..., t, :] * carry
        out[..., t, :] = carry
    return out


def retrace_targets(
    reward: Tensor,
    chosen_action_value: Tensor,
    state_value: Tensor,
    next_state_value: Tensor,
    trace: Tensor,
    done: Tensor,
    terminated: Tensor,
    gamma: float | Tensor,
) -> Tensor:
    """Trace-corrected off-policy action-value targets (Retrace, ACER's Q^ret).

    Computed backwards in time over a window of T transitions:

        G_t = r_t + γ (1 − term_t) · [ V(x_{t+1})
                                       + (1 − done_t) · c_{t+1} · (G_{t+1} − Q(x_{t+1}, a_{t+1})) ]

    and at the window end (c_T := 0) G_{T−1} = r_{T−1} + γ (1 − term_{T−1}) V(x_T).
    A trajectory that ends after step t (``done``) keeps its bootstrap γ V(x_{t+1}) unless it
    terminated, but its trace is cut: row t + 1 belongs to another trajectory.

    This is the Retrace operator of Munos et al., 2016, arXiv:1606.02647v1, Eq. 4, written as the
    backward recursion of Wang et al., 2017, arXiv:1611.01224v2, Eq. 5 (ACER's Q^ret, where the
    trace is ρ̄_{t+1} = min(1, ρ_{t+1})). The trace argument picks the algorithm; see the module
    docstring.

    Args:
        reward: r_t, the reward for transition t (TorchRL ``("next", "reward")``).
            Shape [*B, T, 1].
        chosen_action_value: Q(x_t, a_t). Row t enters the target of row t − 1 through the
            correction term. Shape [*B, T, 1].
        state_value: V(x_t) = Σ_a π(a|x_t) Q(x_t, a). It does not enter the recursion (V(x_{t+1})
            is always read from ``next_state_value``, which is what keeps truncations and window
            ends right); it is accepted for parity with TorchRL's value functionals and checked
            for shape. Shape [*B, T, 1].
        next_state_value: V(x_{t+1}) = Σ_a π(a|x_{t+1}) Q(x_{t+1}, a). At a truncated step this
            is V of the truncated next observation (``("next", "observation")``), never of the
            next row's reset observation. Shape [*B, T, 1].
        trace: c_t, the trace coefficient of the action taken at step t, already truncated and
            scaled (e.g. :func:`retrace_trace`). Must be >= 0. Shape [*B, T, 1].
        done: the trajectory ends after step t (terminated, truncated or segment end).
            Shape [*B, T, 1], bool.
        terminated: x_{t+1} is terminal: nothing is bootstrapped. Shape [*B, T, 1], bool.
        gamma: discount γ ∈ [0, 1], a float or a tensor broadcastable to [*B, T, 1]
            (a per-step discount).

    Returns:
        G_t, shape [*B, T, 1], detached (a regression target: no gradient flows into any input).

    Raises:
        ValueError: on mismatched shapes, T = 0, non-bool ``done``/``terminated``, negative
            traces or γ outside [0, 1].

    Example:
        >>> import torch
        >>> col = lambda *xs: torch.tensor(xs).unsqueeze(-1)
        >>> no = col(False, False, False)
        >>> retrace_targets(col(1., 0., 2.), col(2., 2., 1.), col(1.5, 1.5, 1.5),
        ...                 col(1.5, 1.5, 1.5), col(1., 1., 1.), no, no, gamma=0.9).squeeze(-1)
        tensor([3.6685, 3.4650, 3.3500])
    """
    batch_shape, time = check_time_layout(
        feature=1,
        reward=reward,
        chosen_action_value=chosen_action_value,
        state_value=state_value,
        next_state_value=next_state_value,
        trace=trace,
        done=done,
        terminated=terminated,
    )
    check_bool(done=done, terminated=terminated)
    check_floating(
        reward=reward,
        chosen_action_value=chosen_action_value,
        state_value=state_value,
        next_state_value=next_state_value,
        trace=trace,
    )
    check_nonnegative(trace=trace)
    gamma = check_gamma(gamma, batch_shape, time)
    with torch.no_grad():
        discount = gamma * (~terminated).to(reward.dtype)  # γ (1 − term_t)      [*B, T, 1]
        # (1 − done_t) c_{t+1}, zero at the window end (c_T := 0)                 [*B, T, 1]
        next_trace = _shift_back(trace) * (~done).to(reward.dtype)
        next_chosen = _shift_back(chosen_action_value)  # Q(x_{t+1}, a_{t+1})  [*B, T, 1]
        # G_t = [r_t + γ'(V_{t+1} − c'_{t+1} Q_{t+1})] + [γ' c'_{t+1}] · G_{t+1}
        offset = reward + discount * (next_state_value - next_trace * next_chosen)
        return _backward_linear_recursion(offset, discount * next_trace)


def importance_ratio(log_prob: Tensor, behavior_log_prob: Tensor) -> Tensor:
    """Importance ratio ρ = π(a|x) / µ(a|x), computed in log space.

        ρ = exp(log π(a|x) − log µ(a|x))

    Munos et al., 2016, arXiv:1606.02647v1, §2 (ρ_t = π(a_t|x_t)/µ(a_t|x_t)).

    Args:
        log_prob: log π(a|x) under the current (target) policy. Shape [*B, T, F].
        behavior_log_prob: log µ(a|x) under the behavior policy that acted (stored at
            collection). Shape [*B, T, F], the same as ``log_prob``.

    Returns:
        ρ, shape [*B, T, F]. Differentiable in ``log_prob`` (detach it where it is a weight).
        A behavior probability of 0 gives ρ = inf, which every trace below truncates.

    Example:
        >>> import torch
        >>> importance_ratio(torch.tensor([[0.5]]).log(), torch.tensor([[0.25]]).log())
        tensor([[2.]])
    """
    check_tensor("log_prob", log_prob)
    check_tensor("behavior_log_prob", behavior_log_prob)
    if log_prob.shape != behavior_log_prob.shape:
        raise ValueError(
            f"log_prob {tuple(log_prob.shape)} and behavior_log_prob "
            f"{tuple(behavior_log_prob.shape)} must have the same shape [*B, T, F]"
        )
    return (log_prob - behavior_log_prob).exp()


def _check_ratio(ratio: Tensor) -> None:
    check_tensor("ratio", ratio)
    check_floating(ratio=ratio)
    check_nonnegative(ratio=ratio)


def _check_lmbda(lmbda: float) -> float:
    if isinstance(lmbda, bool) or not isinstance(lmbda, (int, float)) or not 0.0 <= lmbda <= 1.0:
        raise ValueError(f"lmbda must be a float in [0, 1], got {lmbda!r}")
    return float(lmbda)


def retrace_trace(ratio: Tensor, lmbda: float = 1.0) -> Tensor:
    """Retrace(λ) trace coefficient c_t = λ · min(1, ρ_t).

    Munos et al., 2016, arXiv:1606.02647v1, Eq. 4 (c_s = λ min(1, π(a_s|x_s)/µ(a_s|x_s))).

    Args:
        ratio: ρ_t = π(a_t|x_t)/µ(a_t|x_t) of the action taken at step t, >= 0 (inf allowed).
            Shape [*B, T, 1].
        lmbda: λ ∈ [0, 1].

    Returns:
        c_t, shape [*B, T, 1], detached.

    Example:
        >>> import torch
        >>> retrace_trace(torch.tensor([[0.5], [2.0]]), lmbda=0.9)
        tensor([[0.4500],
                [0.9000]])
    """
    _check_ratio(ratio)
    lmbda = _check_lmbda(lmbda)
    return lmbda * ratio.detach().clamp(max=1.0)


def acer_trace(ratio: Tensor) -> Tensor:
    """ACER's Q^ret trace c_t = min(1, ρ_t) (Retrace with λ = 1).

    Wang et al., 2017, arXiv:1611.01224v2, Eq. 5 (ρ̄_t = min(1, ρ_t)). Note that the policy
    term truncates at c = 10 (:func:`truncated_is_policy_loss`); the critic's trace at 1.

    Args:
        ratio: ρ_t of the action taken at step t, >= 0. Shape [*B, T, 1].

    Returns:
        c_t, shape [*B, T, 1], detached.

    Example:
        >>> import torch
        >>> acer_trace(torch.tensor([[0.5], [2.0]]))
        tensor([[0.5000],
                [1.0000]])
    """
    return retrace_trace(ratio, 1.0)


def continuous_acer_trace(ratio: Tensor, action_dim: int) -> Tensor:
    """Continuous-action ACER trace c_t = min(1, ρ_t^{1/d}).

    Wang et al., 2017, arXiv:1611.01224v2, §5 (the d-th root keeps the product of per-dimension
    densities from collapsing the trace in high dimensions). ρ_t is the ratio of the full joint
    densities (a product over the d action dimensions).

    Args:
        ratio: ρ_t = π(a_t|x_t)/µ(a_t|x_t) of the joint action density, >= 0. Shape [*B, T, 1].
        action_dim: d, the number of action dimensions (>= 1).

    Returns:
        c_t, shape [*B, T, 1], detached.

    Example:
        >>> import torch
        >>> continuous_acer_trace(torch.tensor([[0.25], [4.0]]), action_dim=2)
        tensor([[0.5000],
                [1.0000]])
    """
    _check_ratio(ratio)
    if isinstance(action_dim, bool) or not isinstance(action_dim, int) or action_dim < 1:
        raise ValueError(f"action_dim must be an int >= 1, got {action_dim!r}")
    return ratio.detach().pow(1.0 / action_dim).clamp(max=1.0)


def tree_backup_trace(action_prob: Tensor, lmbda: float = 1.0) -> Tensor:
    """Tree-backup TB(λ) trace c_t = λ · π(a_t|x_t).

    Precup et al., 2000 (tree backup), as tabulated in Munos et al., 2016, arXiv:1606.02647v1,
    §3 ("TB(λ)"). Safe for any behavior policy but not efficient near on-policy.

    Args:
        action_prob: π(a_t|x_t), the current policy's probability of the action taken at step t,
            in [0, 1]. Shape [*B, T, 1].
        lmbda: λ ∈ [0, 1].

    Returns:
        c_t, shape [*B, T, 1], detached.

    Example:
        >>> import torch
        >>> tree_backup_trace(torch.tensor([[0.5]]), lmbda=0.5)
        tensor([[0.2500]])
    """
    check_tensor("action_prob", action_prob)
    check_floating(action_prob=action_prob)
    check_nonnegative(action_prob=action_prob)
    lmbda = _check_lmbda(lmbda)
    return lmbda * action_prob.detach()


def opc_trace(reference: Tensor) -> Tensor:
    """Q^opc trace c_t ≡ 1 (no importance correction).

    Wang et al., 2017, arXiv:1611.01224v2, §5: Q^opc is the Q^ret recursion with the truncated
    ratio replaced by 1; continuous ACER uses it in the policy gradient. With Q constant over
    actions it gives the discounted return.

    Args:
        reference: any tensor of the trace's shape. Shape [*B, T, 1].

    Returns:
        ones, shape [*B, T, 1], dtype of ``reference``.

    Example:
        >>> import torch
        >>> opc_trace(torch.zeros(2, 1))
        tensor([[1.],
                [1.]])
    """
    check_tensor("reference", reference)
    dtype = reference.dtype if reference.is_floating_point() else torch.get_default_dtype()
    return torch.ones_like(reference, dtype=dtype)


def sequence_priority(error: Tensor, mask: Tensor | None = None, eta: float = 0.0) -> Tensor:
    """One replay priority per sequence from per-step errors: η max_t δ_t + (1 − η) mean_t δ_t.

    η = 0 is Reactor's mean of the per-step errors along the sequence (Gruslys et al., 2018,
    arXiv:1704.04651v2, §3.3: mean |TD| for a scalar critic, mean total variation for the
    distributional one); η = 0.9 is R2D2's mixture (Kapturowski et al., 2019, §2.3).

    Args:
        error: δ_t >= 0, shape [*B, T, 1] (or [*B, T]).
        mask: valid steps, bool [*B, T]; None: every step. A row without a valid step gets 0.
        eta: η in [0, 1].

    Returns:
        p, shape [*B].

    Example:
        >>> sequence_priority(torch.tensor([[1.0, 2.0, 0.5]]), eta=0.9)  # 0.9·2 + 0.1·3.5/3
        tensor([1.9167])
    """
    check_tensor("error", error)
    if not 0.0 <= eta <= 1.0:
        raise ValueError(f"eta must lie in [0, 1], got {eta}")
    delta = error.squeeze(-1) if error.dim() >= 2 and error.shape[-1] == 1 else error
    if delta.dim() < 1:
        raise ValueError(f"error must have shape [*B, T, 1] or [*B, T], got {list(error.shape)}")
    if mask is not None:
        if mask.shape != delta.shape or mask.dtype != torch.bool:
            raise ValueError(
                f"mask must be bool of shape {list(delta.shape)}, got {mask.dtype} of shape "
                f"{list(mask.shape)}"
            )
        delta = torch.where(mask, delta, torch.zeros_like(delta))
        count = mask.sum(-1).clamp_min(1).to(delta.dtype)
    else:
        count = torch.full_like(delta[..., 0], delta.shape[-1])
    mean = delta.sum(-1) / count
    if eta == 0.0:
        return mean
    return eta * delta.amax(-1) + (1.0 - eta) * mean
