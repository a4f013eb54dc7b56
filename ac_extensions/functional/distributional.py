"""Categorical (C51-style) projection and Reactor's distributional Retrace target.

Support z = (z_0 < z_1 < … < z_{N−1}); a return distribution is a weight vector over it.
Projection uses the triangular (Cramér / L2) kernel: a mass at position y (clipped to
[z_0, z_{N−1}]) is split between the two neighbouring atoms in proportion to proximity, which is
the same as h_{z_i}(y) = max(0, 1 − |y − z_i|/Δz) on a uniform support (Rowland et al., 2018,
arXiv:1802.08163, Eq. 5; Bellemare et al., 2017, arXiv:1707.06887v1, Algorithm 1). The projection
is linear in the weights, so it applies unchanged to signed mixtures.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ac_extensions.functional._checks import (
    check_bool,
    check_floating,
    check_gamma,
    check_nonnegative,
    check_support,
    check_tensor,
    check_time_layout,
)

__all__ = ["categorical_projection", "distributional_retrace_targets"]

# Upper bound on the number of (t, u, j) atoms materialised at once by the distributional
# Retrace target; larger inputs are processed in chunks of start times t (same result).
_MAX_ATOMS_PER_CHUNK = 1 << 23


def _project(atoms: Tensor, weights: Tensor, support: Tensor) -> Tensor:
    """Unchecked projection; atoms/weights [*, K], support [N] → [*, N]."""
    num_atoms = support.shape[0]
    position = atoms.clamp(min=support[0], max=support[-1])  # [*, K]
    # Index of the support interval [z_l, z_{l+1}] holding each position, l ∈ [0, N − 2].
    lower = torch.searchsorted(support, position.contiguous(), right=True) - 1
    lower = lower.clamp(min=0, max=num_atoms - 2)  # [*, K]
    z_lower, z_upper = support[lower], support[lower + 1]
    upper_share = ((position - z_lower) / (z_upper - z_lower)).clamp(0.0, 1.0)  # [*, K]
    out = weights.new_zeros((*weights.shape[:-1], num_atoms))
    out.scatter_add_(-1, lower, weights * (1.0 - upper_share))
    out.scatter_add_(-1, lower + 1, weights * upper_share)
    return out


def categorical_projection(atoms: Tensor, weights: Tensor, support: Tensor) -> Tensor:
    """Project weights at arbitrary positions onto a fixed categorical support (Cramér / L2).

        (Φ p)_i = Σ_k p_k · h_i(clip(y_k, z_0, z_{N−1})),
        h_i(y) = (y − z_{i−1})/(z_i − z_{i−1})  for y ∈ [z_{i−1}, z_i],
                 (z_{i+1} − y)/(z_{i+1} − z_i)  for y ∈ [z_i, z_{i+1}],   0 elsewhere

    (the triangular kernel; on a uniform support h_i(y) = max(0, 1 − |y − z_i|/Δz)). Rowland et
    al., 2018, arXiv:1802.08163, Eq. 5 (Cramér projection Π_C); Bellemare et al., 2017,
    arXiv:1707.06887v1, Algorithm 1. An atom landing exactly on a support point keeps all its
    mass there. Linear in ``weights`` (signed weights allowed); conserves Σ_k p_k; preserves the
    mean when no atom is clipped; the identity on the support itself. Cost O(K log N) per row:
    each atom touches two support points, no dense [K, N] kernel is built.

    Args:
        atoms: y_k, positions of the masses. Shape [*, K].
        weights: p_k, the masses (any sign). Shape [*, K].
        support: z, strictly increasing, N >= 2 atoms. Shape [N].

    Returns:
        The projected weights, shape [*, N]. Differentiable in ``weights`` (and in ``atoms``
        between support points).

    Example:
        >>> import torch
        >>> support = torch.tensor([0.0, 1.0, 2.0])
        >>> categorical_projection(torch.tensor([0.3, 1.0]), torch.tensor([1.0, 1.0]), support)
        tensor([0.7000, 1.3000, 0.0000])
    """
    check_tensor("atoms", atoms)
    check_tensor("weights", weights)
    check_support(support)
    if atoms.dim() < 1 or atoms.shape != weights.shape:
        raise ValueError(
            f"atoms and weights must have the same shape [*, K], got atoms "
            f"{tuple(atoms.shape)} and weights {tuple(weights.shape)}"
        )
    check_floating(atoms=atoms, weights=weights)
    support = support.to(device=atoms.device, dtype=atoms.dtype)
    return _project(atoms, weights.to(atoms.dtype), support)


def _exclusive_window_cumprod(x: Tensor) -> Tensor:
    """E[..., t, u] = Π_{s=t}^{u−1} x[..., s] for u >= t (1 on the diagonal), 0 for u < t.

    Args:
        x: Shape [*B, T].

    Returns:
        Shape [*B, T, T], indexed [start t, end u].
    """
    time = x.shape[-1]
    on_or_above = torch.ones(time, time, dtype=torch.bool, device=x.device).triu()  # u >= t
    # grid[t, s] = x_s for s >= t, 1 before: its cumulative product is Π_{s=t}^{u} x_s.
    grid = torch.where(on_or_above, x.unsqueeze(-2), torch.ones((), dtype=x.dtype))
    inclusive = grid.cumprod(dim=-1)
    exclusive = torch.cat([torch.ones_like(inclusive[..., :1]), inclusive[..., :-1]], dim=-1)
    return torch.where(on_or_above, exclusive, torch.zeros((), dtype=x.dtype))


def distributional_retrace_targets(
    reward: Tensor,
    chosen_atom_probs: Tensor,
    next_expected_atom_probs: Tensor,
    trace: Tensor,
    done: Tensor,
    terminated: Tensor,
    gamma: float | Tensor,
    support: Tensor,
) -> Tensor:
    """Reactor's distributional Retrace target, as one projected mixture of n-step returns.

    The scalar Retrace target (:func:`~ac_extensions.functional.retrace_targets`, same alignment)
    is an affine combination of n-step bootstrapped returns. With u = t + n − 1 the last
    transition of the n-step return,

        Q^ret_t = Σ_{u=t}^{T−1} P_{t,u} · [ G_{t,u} (1 − c'_{u+1})
                                             + Γ_{t,u} (V(x_{u+1}) − c'_{u+1} Q(x_{u+1}, a_{u+1})) ]

        G_{t,u} = Σ_{s=t}^{u} (Π_{v=t}^{s−1} γ'_v) r_s          n-step return
        Γ_{t,u} = Π_{v=t}^{u} γ'_v,     γ'_v = γ (1 − term_v)   bootstrap discount
        P_{t,u} = Π_{s=t+1}^{u} c'_s,   c'_s = (1 − done_{s−1}) c_s,  c'_T = 0

    Replacing each bootstrapped value by its categorical distribution, shifted and scaled to
    G_{t,u} + Γ_{t,u} z_j, gives the target distribution (Gruslys et al., 2018,
    arXiv:1704.04651v2, §3.2, distributional Retrace):

        q*_t = Φ[ Σ_u Σ_j P_{t,u} (q̄_{u}(j) − c'_{u+1} q_{u+1}(j)) · δ(G_{t,u} + Γ_{t,u} z_j) ]

    with q̄_u = Σ_a π(a|x_{u+1}) q(x_{u+1}, a, ·) (``next_expected_atom_probs[u]``),
    q_{u+1} = q(x_{u+1}, a_{u+1}, ·) (``chosen_atom_probs[u+1]``) and Φ
    :func:`categorical_projection`. The mixture is built explicitly, collapsed over actions, and
    projected once (projecting at every step of a backward recursion is not the same, because
    projection does not commute with r + γ·). Its weights sum to 1 but can be negative where
    c_{u+1} > π(a_{u+1}|x_{u+1}): the target is a signed measure, returned as is (no clipping,
    no renormalisation), and cross-entropy against it is still well defined. A terminal
    transition u contributes a point mass at G_{t,u} (Γ = 0) and cuts the trace; a truncation
    bootstraps from the truncated next state and cuts the trace. When no atom is clipped, the
    mean Σ_i z_i q*_t(i) equals the scalar Retrace target with V = E[q̄], Q = E[q].

    Cost O(B·T²·N) time and memory (atoms are materialised per (t, u, j), in chunks over t for
    large inputs), never a dense [N, N] kernel.

    Args:
        reward: r_t. Shape [*B, T, 1].
        chosen_atom_probs: q(x_t, a_t, ·), the distribution of the taken action (row t enters
            the targets of earlier rows). Shape [*B, T, N].
        next_expected_atom_probs: Σ_a π(a|x_{t+1}) q(x_{t+1}, a, ·); at a truncated step, of the
            truncated next observation. Shape [*B, T, N].
        trace: c_t >= 0 of the action taken at step t (Reactor: λ·min(1, ρ_t)). Shape [*B, T, 1].
        done: the trajectory ends after step t. Shape [*B, T, 1], bool.
        terminated: x_{t+1} is terminal. Shape [*B, T, 1], bool.
        gamma: γ ∈ [0, 1], a float or a tensor broadcastable to [*B, T, 1].
        support: z, strictly increasing. Shape [N].

    Returns:
        q*_t, shape [*B, T, N], detached; each row sums to the mass of its inputs (1 for
        normalised distributions).

    Example:
        >>> import torch
        >>> support = torch.tensor([0.0, 1.0, 2.0])
        >>> no = torch.tensor([[False]])
        >>> distributional_retrace_targets(torch.tensor([[1.0]]), torch.tensor([[0., 1., 0.]]),
        ...     torch.tensor([[1., 0., 0.]]), torch.tensor([[1.0]]), no, no, 0.5, support)
        tensor([[0., 1., 0.]])
    """
    batch_shape, time = check_time_layout(
        feature=1, reward=reward, trace=trace, done=done, terminated=terminated
    )
    check_support(support)
    num_atoms = support.shape[0]
    check_time_layout(
        feature=num_atoms,
        chosen_atom_probs=chosen_atom_probs,
        next_expected_atom_probs=next_expected_atom_probs,
    )
    check_time_layout(reward=reward, chosen_atom_probs=chosen_atom_probs)  # same [*B, T]
    check_bool(done=done, terminated=terminated)
    check_floating(
        reward=reward,
        chosen_atom_probs=chosen_atom_probs,
        next_expected_atom_probs=next_expected_atom_probs,
        trace=trace,
    )
    check_nonnegative(trace=trace)
    gamma = check_gamma(gamma, batch_shape, time)
    dtype = reward.dtype
    with torch.no_grad():
        support = support.to(device=reward.device, dtype=dtype)
        discount = (gamma * (~terminated).to(dtype)).squeeze(-1)  # γ'_v = γ(1 − term_v)  [*B, T]
        if discount.shape != reward.shape[:-1]:
            discount = discount.expand(reward.shape[:-1])
        # c'_{s} for s = 1..T (c'_T = 0), stored at index s − 1:  (1 − done_{s−1}) c_s   [*B, T]
        cut = (~(done | terminated)).to(dtype).squeeze(-1)
        next_trace = torch.cat([trace[..., 1:, 0], torch.zeros_like(trace[..., :1, 0])], -1) * cut

        # Window products indexed [start t, end u]                                   [*B, T, T]
        reward_discount = _exclusive_window_cumprod(discount)  # Π_{v=t}^{u−1} γ'_v
        bootstrap_discount = reward_discount * discount.unsqueeze(-2)  # Γ_{t,u}
        n_step_return = (reward_discount * reward.squeeze(-1).unsqueeze(-2)).cumsum(-1)  # G_{t,u}
        trace_product = _exclusive_window_cumprod(next_trace)  # P_{t,u} = Π_{s=t+1}^{u} c'_s

        # Bootstrap distribution after transition u: q̄_u − c'_{u+1} q_{u+1}            [*B, T, N]
        next_chosen = torch.cat(
            [chosen_atom_probs[..., 1:, :], torch.zeros_like(chosen_atom_probs[..., :1, :])], -2
        )
        bootstrap = next_expected_atom_probs.to(dtype) - next_trace.unsqueeze(-1) * next_chosen
        # The n-step return's own mass (1 − c'_{u+1}) sits on top of that distribution: both
        # are shifted by G_{t,u}, so it is enough to shift/scale the bootstrap distribution,
        # whose total mass is Σ_j q̄_u(j) − c'_{u+1} = 1 − c'_{u+1} for normalised inputs.

        atoms_per_row = time * num_atoms * max(1, batch_shape.numel())
        chunk = max(1, _MAX_ATOMS_PER_CHUNK // atoms_per_row)
        out = []
        for start in range(0, time, chunk):
            rows = slice(start, min(time, start + chunk))
            # Atoms y_{t,u,j} = G_{t,u} + Γ_{t,u} z_j, weights P_{t,u} · bootstrap_u(j)
            positions = (
                n_step_return[..., rows, :, None] + bootstrap_discount[..., rows, :, None] * support
            )  # [*B, t, T, N]
            weights = trace_product[..., rows, :, None] * bootstrap.unsqueeze(-3)
            flat = (*positions.shape[:-2], time * num_atoms)
            out.append(_project(positions.reshape(flat), weights.reshape(flat), support))
        return torch.cat(out, dim=-2)
