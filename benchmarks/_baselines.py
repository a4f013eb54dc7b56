"""Naive per-time-step baselines for the functional micro-benchmark.

Each is written straight from the paper's equation as a Python loop over time steps (and, where
the equation is a double sum, over the horizon n), vectorised only over the batch, as a
first implementation would be: the TD-error sum of Retrace (Munos et al. 2016, Eq. 4), the
per-step loop of ACER's Algorithm 2, C51's Algorithm 1 projection loop over atoms, and the
explicit Σ_n α_n mixture of Reactor's distributional Retrace. The benchmark checks that every
baseline agrees with the library op before timing them.

(The fully element-wise float64 references used by the tests live in ``tests/_reference.py``;
they are too slow for the benchmark's sizes.)
"""

from __future__ import annotations

import torch
from torch import Tensor


def retrace_targets(reward, chosen_action_value, next_state_value, trace, done, terminated, gamma):
    """G_t = Q_t + Σ_{s≥t} (Π_{v=t}^{s−1} γ'_v c'_{v+1}) δ_s, a double loop over (t, s)."""
    time = reward.shape[-2]
    disc = gamma * (~terminated).to(reward.dtype)
    delta = reward + disc * next_state_value - chosen_action_value
    out = []
    for t in range(time):
        total = chosen_action_value[..., t, :].clone()
        weight = torch.ones_like(total)
        for s in range(t, time):
            total = total + weight * delta[..., s, :]
            if s + 1 < time:
                weight = weight * disc[..., s, :] * (~done[..., s, :]) * trace[..., s + 1, :]
        out.append(total)
    return torch.stack(out, dim=-2)


def acer_policy_losses(log_probs, behavior_probs, action, q_ret, action_values, c):
    """ACER's truncated IS term + bias correction, one time step at a time (Algorithm 2)."""
    time = log_probs.shape[-2]
    out = []
    for t in range(time):
        lp = log_probs[..., t, :]
        pi = lp.detach().exp()
        rho_all = pi / behavior_probs[..., t, :]
        a = action[..., t, :]
        v = (pi * action_values[..., t, :]).sum(-1, keepdim=True)
        rho = rho_all.gather(-1, a)
        term = -(rho.clamp(max=c) * (q_ret[..., t, :] - v)).detach() * lp.gather(-1, a)
        weight = ((1 - c / rho_all).clamp(min=0) * pi * (action_values[..., t, :] - v)).detach()
        out.append(term - (weight * lp).sum(-1, keepdim=True))
    return torch.stack(out, dim=-2)


def trust_region_step(g, k, delta):
    """z* = g − max(0, (kᵀg − δ)/‖k‖²) k, one sample at a time."""
    gf, kf = g.reshape(-1, g.shape[-1]), k.reshape(-1, k.shape[-1])
    out = torch.empty_like(gf)
    for i in range(gf.shape[0]):
        kk = torch.dot(kf[i], kf[i])
        lam = (torch.dot(kf[i], gf[i]) - delta).clamp(min=0) / kk if kk > 0 else 0.0
        out[i] = gf[i] - lam * kf[i]
    return out.reshape(g.shape)


def categorical_projection(atoms, weights, support):
    """C51 Algorithm 1 (Bellemare et al. 2017): a loop over atoms j with floor/ceil indices."""
    v_min, v_max, n = support[0], support[-1], support.shape[0]
    delta_z = (v_max - v_min) / (n - 1)
    out = torch.zeros(*weights.shape[:-1], n, dtype=weights.dtype)
    for j in range(atoms.shape[-1]):
        b = (atoms[..., j].clamp(v_min, v_max) - v_min) / delta_z
        lower, upper = b.floor().long(), b.ceil().long()
        same = lower == upper  # the atom sits on a support point: all its mass goes there
        p = weights[..., j]
        out.scatter_add_(-1, lower.unsqueeze(-1), (p * (upper - b + same)).unsqueeze(-1))
        out.scatter_add_(-1, upper.unsqueeze(-1), (p * (b - lower)).unsqueeze(-1))
    return out


def _dense_projection(positions: Tensor, weights: Tensor, support: Tensor) -> Tensor:
    """Triangular kernel h_{z_i}(y) evaluated densely: [*, K] → [*, N] via a [*, K, N] kernel."""
    delta_z = support[1] - support[0]
    y = positions.clamp(support[0], support[-1]).unsqueeze(-1)
    kernel = (1 - (y - support).abs() / delta_z).clamp(min=0)
    return (weights.unsqueeze(-1) * kernel).sum(-2)


def distributional_retrace_targets(
    reward, chosen_atom_probs, next_expected_atom_probs, trace, done, terminated, gamma, support
):
    """q*_t = Σ_n Φ[w_{t,n} at G_{t,n} + Γ_{t,n} z], a loop over (t, n) with a dense kernel."""
    time = reward.shape[-2]
    disc = (gamma * (~terminated).to(reward.dtype))[..., 0]
    cut = (~(done | terminated))[..., 0].to(reward.dtype)
    out = []
    for t in range(time):
        acc = torch.zeros_like(chosen_atom_probs[..., t, :])
        n_step = torch.zeros_like(reward[..., t, 0])
        discount = torch.ones_like(n_step)
        trace_prod = torch.ones_like(n_step)
        for u in range(t, time):
            n_step = n_step + discount * reward[..., u, 0]
            discount = discount * disc[..., u]
            c_next = (
                trace[..., u + 1, 0] * cut[..., u] if u + 1 < time else torch.zeros_like(n_step)
            )
            bootstrap = next_expected_atom_probs[..., u, :]
            if u + 1 < time:
                bootstrap = bootstrap - c_next.unsqueeze(-1) * chosen_atom_probs[..., u + 1, :]
            positions = n_step.unsqueeze(-1) + discount.unsqueeze(-1) * support
            acc = acc + _dense_projection(positions, trace_prod.unsqueeze(-1) * bootstrap, support)
            trace_prod = trace_prod * c_next
        out.append(acc)
    return torch.stack(out, dim=-2)


def beta_loo_policy_loss(probs, action, behavior_prob, action_value, corrected_return, c):
    """−[β (R − Q(â)) π(â) + Σ_a Q(a) π(a)], one time step at a time."""
    out = []
    for t in range(probs.shape[-2]):
        a = action[..., t, :]
        beta = (1 / behavior_prob[..., t, :]).clamp(max=c)
        q = action_value[..., t, :]
        p = probs[..., t, :]
        loo = beta * (corrected_return[..., t, :] - q.gather(-1, a)) * p.gather(-1, a)
        out.append(-(loo + (q * p).sum(-1, keepdim=True)))
    return torch.stack(out, dim=-2)
