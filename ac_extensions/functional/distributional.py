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

__all__ = ["categorical_projection", "distributional_retrace_targets", "total_variation"]

# Upper bound on the number of (t, u, j) atoms materialised at once by the distributional
# Retrace target; larger inputs are processed in chunks of (t, u) pairs (same result).
_MAX_ATOMS_PER_CHUNK = 1 << 22


def _is_uniform(support: Tensor) -> bool:
    gaps = support[1:] - support[:-1]
    return bool(torch.allclose(gaps, gaps.mean().expand_as(gaps), rtol=1e-4, atol=0.0))


def _split_uniform(scaled: Tensor, num_atoms: int) -> tuple[Tensor, Tensor]:
    """Split fractional atom indices (position − z_0)/Δz into (lower index, upper share).

    Indices are clipped to [0, N − 1] (clipping the position to [z_0, z_{N−1}]). An index
    within float rounding of an integer is snapped to it, so that a position on a support
    point gives all of its weight to that point instead of splitting it as (1 − ε, ε).
    """
    scaled = scaled.clamp(0.0, num_atoms - 1.0)
    nearest = scaled.round()
    snap = 16.0 * torch.finfo(scaled.dtype).eps * num_atoms
    on_atom = (scaled - nearest).abs_().le_(snap).bool()
    scaled = torch.where(on_atom, nearest, scaled)
    lower = scaled.floor().clamp_(max=num_atoms - 2.0)
    return lower.to(torch.int32), scaled.sub_(lower)


def _split_sorted(position: Tensor, support: Tensor) -> tuple[Tensor, Tensor]:
    """(lower index, upper share) of positions on an arbitrary increasing support."""
    position = torch.minimum(torch.maximum(position, support[0]), support[-1])
    lower = torch.searchsorted(support, position.contiguous(), right=True, out_int32=True) - 1
    lower = lower.clamp(0, support.shape[0] - 2)
    z_lower, z_upper = support[lower], support[lower + 1]
    return lower, ((position - z_lower) / (z_upper - z_lower)).clamp(0.0, 1.0)


def _accumulate(
    out: Tensor, row_start: Tensor, lower: Tensor, upper_share: Tensor, weights: Tensor
) -> None:
    """out.view(-1)[row_start + l] += w (1 − s); out.view(-1)[row_start + l + 1] += w s.

    Args:
        out: accumulator [R, N], contiguous.
        row_start: int32 offset R_i · N of the output row of each atom, broadcastable.
        lower: int32 lower atom index l, shape [*, K].
        upper_share: s ∈ [0, 1], shape [*, K].
        weights: w, shape [*, K].
    """
    index = (row_start + lower).reshape(-1)
    upper_weight = weights * upper_share
    flat = out.view(-1)
    flat.index_add_(0, index, (weights - upper_weight).reshape(-1))
    flat.index_add_(0, index + 1, upper_weight.reshape(-1))


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
    weights = weights.to(atoms.dtype)
    batch_shape, num_atoms = atoms.shape[:-1], support.shape[0]
    rows = batch_shape.numel()
    atoms, weights = atoms.reshape(rows, -1), weights.reshape(rows, -1)
    if _is_uniform(support):
        spacing = (support[-1] - support[0]) / (num_atoms - 1)
        lower, upper_share = _split_uniform((atoms - support[0]) / spacing, num_atoms)
    else:
        lower, upper_share = _split_sorted(atoms, support)
    out = atoms.new_zeros(rows, num_atoms)
    row_start = torch.arange(rows, dtype=torch.int32, device=atoms.device) * num_atoms
    _accumulate(out, row_start.unsqueeze(-1), lower, upper_share, weights)
    return out.reshape(*batch_shape, num_atoms)


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

    Cost O(B·T²·N) time (each of the T(T+1)/2 pairs (t, u) contributes N atoms, each touching
    two support points; pairs whose trace product is exactly zero, e.g. past an episode end,
    are skipped) and memory bounded by a chunk of pairs; never a dense [N, N] kernel.

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

        # Only pairs u >= t contribute, and of those only the ones whose trace product is not
        # exactly zero (a pair reaching past an episode end or a zero trace adds nothing).
        # Gather the contributing (row r, pair) items once, flattening the batch dims.   [M]
        rows = batch_shape.numel()
        start, end = torch.triu_indices(time, time, device=reward.device)
        trace_product = trace_product.reshape(rows, time, time)[:, start, end]  # [R, P]
        item_row, item_pair = (trace_product != 0).nonzero(as_tuple=True)
        item_start, item_end = start[item_pair], end[item_pair]
        trace_product = trace_product[item_row, item_pair]
        n_step_return = n_step_return.reshape(rows, time, time)[item_row, item_start, item_end]
        bootstrap_discount = bootstrap_discount.reshape(rows, time, time)[
            item_row, item_start, item_end
        ]
        bootstrap = bootstrap.reshape(rows, time, num_atoms)
        # Offset of the [R·T, N] output row (r, t) that each item feeds.                [M]
        row_start = ((item_row * time + item_start) * num_atoms).to(torch.int32)
        out = reward.new_zeros(rows * time, num_atoms)
        uniform = _is_uniform(support)
        if uniform:
            # Work in fractional atom indices: (G + Γ z_j − z_0)/Δz = (G − z_0)/Δz + Γ z_j/Δz.
            spacing = (support[-1] - support[0]) / (num_atoms - 1)
            offset = (n_step_return - support[0]) / spacing
            scaled_support = support / spacing
        items = item_row.shape[0]
        chunk = max(1, _MAX_ATOMS_PER_CHUNK // num_atoms)
        for lo in range(0, items, chunk):
            sl = slice(lo, min(items, lo + chunk))
            # Atoms y_{t,u,j} = G_{t,u} + Γ_{t,u} z_j, weights P_{t,u} · bootstrap_u(j)    [m, N]
            if uniform:
                scaled = torch.addcmul(
                    offset[sl, None], bootstrap_discount[sl, None], scaled_support
                )
                lower, upper_share = _split_uniform(scaled, num_atoms)
            else:
                positions = n_step_return[sl, None] + bootstrap_discount[sl, None] * support
                lower, upper_share = _split_sorted(positions, support)
            weights = trace_product[sl, None] * bootstrap[item_row[sl], item_end[sl]]
            _accumulate(out, row_start[sl, None], lower, upper_share, weights)
        return out.reshape(*batch_shape, time, num_atoms)


def total_variation(target: Tensor, prediction: Tensor) -> Tensor:
    """Total variation distance ½ Σ_i |p_i − q_i| between two categorical weight vectors.

    Reactor's per-step priority for the distributional critic: the distance between the
    (projected, possibly signed) target q*_t and the predicted distribution q(x_t, a_t)
    (Gruslys et al., 2018, arXiv:1704.04651v2, §3.3). Unlike the difference of the means it
    is 1 for two distributions with disjoint supports whatever their means. With a signed
    target (mass below 0 at some atoms) it is half the L1 norm of the difference, which can
    exceed 1.

    Args:
        target: q*, shape [*B, T, N] (atoms last).
        prediction: q, same shape.

    Returns:
        [*B, T, 1], >= 0.

    Example:
        >>> total_variation(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]]))
        tensor([[1.]])
    """
    check_tensor("target", target)
    check_tensor("prediction", prediction)
    if target.shape != prediction.shape or target.dim() < 1:
        raise ValueError(
            f"target and prediction must have the same shape [*B, T, N], got "
            f"{list(target.shape)} and {list(prediction.shape)}"
        )
    return 0.5 * (target - prediction).abs().sum(-1, keepdim=True)
