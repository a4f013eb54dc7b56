"""Naive reference implementations, written straight from the papers' equations.

Plain Python loops over every batch element, time step, action and atom, in float64, with no
vectorisation tricks: slow and obviously correct, so the vectorised ops in
``ac_extensions.functional`` can be checked against them. Also imported by
``benchmarks/functional_ops.py`` as the baseline of the micro-benchmark (there, the inner loops
over actions/atoms run as small tensor ops so that the baseline finishes in seconds; the loop
structure over batch and time is the same).

Inputs use the library's layout ``[*B, T, F]``; every function flattens ``*B`` and loops.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _flat(x: Tensor, trailing: int) -> Tensor:
    """Flatten the leading batch dims: [*B, *rest] → [prod(B), *rest] with ``trailing`` kept."""
    return x.reshape(-1, *x.shape[x.dim() - trailing :])


def _gamma_table(gamma: float | Tensor, shape: torch.Size) -> Tensor:
    g = torch.as_tensor(gamma, dtype=torch.float64)
    return torch.broadcast_to(g, shape).reshape(-1, shape[-2])


def _scalar_window(reward, chosen_action_value, next_state_value, trace, done, terminated, gamma):
    """[*B, T, 1] inputs → float64 / bool [prod(B), T] tables, plus the per-step γ table."""
    r, q, v_next, c = (
        _flat(x.double(), 2)[..., 0] for x in (reward, chosen_action_value, next_state_value, trace)
    )
    d, term = _flat(done, 2)[..., 0], _flat(terminated, 2)[..., 0]
    return r, q, v_next, c, d, term, _gamma_table(gamma, reward.shape)


def retrace_targets(reward, chosen_action_value, next_state_value, trace, done, terminated, gamma):
    """The Retrace recursion, one batch element and one step at a time.

    G_t = r_t + γ(1 − term_t)·[V(x_{t+1}) + (1 − done_t)·c_{t+1}·(G_{t+1} − Q(x_{t+1}, a_{t+1}))],
    the bracket's second term absent at t = T − 1.
    """
    shape = reward.shape
    r, q, v_next, c, d, term, gam = _scalar_window(
        reward, chosen_action_value, next_state_value, trace, done, terminated, gamma
    )
    out = torch.zeros_like(r)
    for b in range(r.shape[0]):
        g_next = 0.0
        for t in reversed(range(r.shape[1])):
            bracket = float(v_next[b, t])
            if t < r.shape[1] - 1 and not bool(d[b, t]):
                bracket += float(c[b, t + 1]) * (g_next - float(q[b, t + 1]))
            g = float(r[b, t]) + float(gam[b, t]) * (0.0 if bool(term[b, t]) else 1.0) * bracket
            out[b, t] = g
            g_next = g
    return out.reshape(shape[:-1]).unsqueeze(-1)


def retrace_targets_td_form(
    reward, chosen_action_value, next_state_value, trace, done, terminated, gamma
):
    """The TD-error form (Munos et al., 2016, Eq. 4; rlax/trfl): a sum, not a recursion.

    G_t = Q(x_t, a_t) + Σ_{s≥t} (Π_{v=t}^{s−1} γ'_v c'_{v+1}) δ_s,
    δ_s = r_s + γ'_s V(x_{s+1}) − Q(x_s, a_s),  γ'_v = γ(1 − term_v),
    c'_{v+1} = (1 − done_v) c_{v+1}.
    """
    shape = reward.shape
    r, q, v_next, c, d, term, gam = _scalar_window(
        reward, chosen_action_value, next_state_value, trace, done, terminated, gamma
    )
    out = torch.zeros_like(r)
    n_b, n_t = r.shape
    for b in range(n_b):
        for t in range(n_t):
            total, weight = float(q[b, t]), 1.0
            for s in range(t, n_t):
                disc = float(gam[b, s]) * (0.0 if bool(term[b, s]) else 1.0)
                delta = float(r[b, s]) + disc * float(v_next[b, s]) - float(q[b, s])
                total += weight * delta
                if s + 1 >= n_t or bool(d[b, s]):
                    break
                weight *= disc * float(c[b, s + 1])
            out[b, t] = total
    return out.reshape(shape[:-1]).unsqueeze(-1)


def triangular_kernel(y: float, support: list[float], i: int) -> float:
    """h_{z_i}(y): the hat function of atom i on a (possibly non-uniform) support, y clipped."""
    y = min(max(y, support[0]), support[-1])
    z = support[i]
    if i > 0 and support[i - 1] <= y <= z:
        return (y - support[i - 1]) / (z - support[i - 1])
    if i < len(support) - 1 and z <= y <= support[i + 1]:
        return (support[i + 1] - y) / (support[i + 1] - z)
    return 1.0 if y == z else 0.0


def categorical_projection(atoms, weights, support):
    """(Φp)_i = Σ_k p_k h_{z_i}(y_k), one atom and one support point at a time."""
    zs = [float(z) for z in support.double()]
    a, w = _flat(atoms.double(), 1), _flat(weights.double(), 1)
    out = torch.zeros(a.shape[0], len(zs), dtype=torch.float64)
    for b in range(a.shape[0]):
        for k in range(a.shape[1]):
            for i in range(len(zs)):
                out[b, i] += float(w[b, k]) * triangular_kernel(float(a[b, k]), zs, i)
    return out.reshape(*atoms.shape[:-1], len(zs))


def distributional_retrace_targets(
    reward, next_action_probs, next_atom_probs, next_action, trace, done, terminated, gamma, support
):
    """Reactor's distributional Retrace with the explicit α_{n,a} of Gruslys et al. (§3.2).

    q*_i(x_t, a_t) = Σ_{n≥1} Σ_a α_{n,a} Σ_j q_j(x_{t+n}, a) h_{z_i}(G_{t,n} + Γ_{t,n} z_j),
    α_{n,a} = (Π_{s=t+1}^{t+n−1} c'_s) (π(a|x_{t+n}) − 𝟙{a = a_{t+n}} c'_{t+n}),

    with c'_s = (1 − done_{s−1}) c_s, c'_T = 0, and per-step discounts γ'_v = γ(1 − term_v).
    Per action and per atom: no collapsing over actions.

    Args:
        next_action_probs: π(·|x_{t+1}) at row t. [*B, T, A].
        next_atom_probs: q(x_{t+1}, a, ·) at row t. [*B, T, A, N].
        next_action: a_{t+1} at row t (ignored where done_t or t = T − 1). [*B, T], long.
    """
    zs = [float(z) for z in support.double()]
    n_atoms = len(zs)
    shape = reward.shape
    r, c = _flat(reward.double(), 2)[..., 0], _flat(trace.double(), 2)[..., 0]
    d, term = _flat(done, 2)[..., 0], _flat(terminated, 2)[..., 0]
    pi = _flat(next_action_probs.double(), 2)
    q = _flat(next_atom_probs.double(), 3)
    a_next = _flat(next_action, 1)
    gam = _gamma_table(gamma, shape)
    n_b, n_t = r.shape
    n_act = pi.shape[-1]
    out = torch.zeros(n_b, n_t, n_atoms, dtype=torch.float64)

    def c_prime(b, s):  # c'_s for s in 1..T
        if s >= n_t or bool(d[b, s - 1]) or bool(term[b, s - 1]):
            return 0.0
        return float(c[b, s])

    for b in range(n_b):
        for t in range(n_t):
            n_step_return, discount, trace_prod = 0.0, 1.0, 1.0
            for n in range(1, n_t - t + 1):
                u = t + n - 1  # last transition of the n-step return
                n_step_return += discount * float(r[b, u])
                discount *= float(gam[b, u]) * (0.0 if bool(term[b, u]) else 1.0)
                c_next = c_prime(b, u + 1)
                for a in range(n_act):
                    indicator = 1.0 if (c_next > 0 and int(a_next[b, u]) == a) else 0.0
                    alpha = trace_prod * (float(pi[b, u, a]) - indicator * c_next)
                    for j in range(n_atoms):
                        y = n_step_return + discount * zs[j]
                        for i in range(n_atoms):
                            out[b, t, i] += (
                                alpha * float(q[b, u, a, j]) * triangular_kernel(y, zs, i)
                            )
                trace_prod *= c_next
                if trace_prod == 0.0:
                    break
    return out.reshape(*shape[:-1], n_atoms)


def truncated_is_policy_loss(log_prob, ratio, advantage, c):
    """−min(c, ρ)·A·log π, element by element."""
    out = torch.zeros_like(log_prob, dtype=torch.float64)
    flat_out = out.view(-1)
    for i, (lp, rho, adv) in enumerate(
        zip(log_prob.reshape(-1), ratio.reshape(-1), advantage.reshape(-1), strict=True)
    ):
        flat_out[i] = -min(c, float(rho)) * float(adv) * float(lp)
    return out


def bias_correction_loss(log_probs, ratios, advantages, c):
    """−Σ_a [1 − c/ρ(a)]_+ π(a) A(a) log π(a), element by element."""
    lp, rho, adv = (_flat(x.double(), 1) for x in (log_probs, ratios, advantages))
    out = torch.zeros(lp.shape[0], 1, dtype=torch.float64)
    for b in range(lp.shape[0]):
        for a in range(lp.shape[1]):
            weight = max(0.0, 1.0 - c / float(rho[b, a])) if float(rho[b, a]) > 0 else 0.0
            out[b, 0] -= weight * float(lp[b, a].exp()) * float(adv[b, a]) * float(lp[b, a])
    return out.reshape(*log_probs.shape[:-1], 1)


def beta_loo_policy_loss(probs, action, behavior_prob, action_value, corrected_return, c):
    """−[β (R − Q(â)) π(â) + Σ_a Q(a) π(a)], β = min(c, 1/µ(â)), element by element."""
    p, q = _flat(probs.double(), 1), _flat(action_value.double(), 1)
    act, mu, ret = (
        _flat(x, 1)[:, 0] for x in (action, behavior_prob.double(), corrected_return.double())
    )
    out = torch.zeros(p.shape[0], 1, dtype=torch.float64)
    for b in range(p.shape[0]):
        a_hat = int(act[b])
        beta = min(c, 1.0 / float(mu[b]))
        value = beta * (float(ret[b]) - float(q[b, a_hat])) * float(p[b, a_hat])
        value += sum(float(q[b, a]) * float(p[b, a]) for a in range(p.shape[1]))
        out[b, 0] = -value
    return out.reshape(*probs.shape[:-1], 1)


def trust_region_step(g, k, delta):
    """z* = g − max(0, (kᵀg − δ)/‖k‖²) k, one sample at a time (0 multiplier when k = 0)."""
    gf, kf = _flat(g.double(), 1), _flat(k.double(), 1)
    out = gf.clone()
    for b in range(gf.shape[0]):
        kg = sum(float(x) * float(y) for x, y in zip(kf[b], gf[b], strict=True))
        kk = sum(float(x) ** 2 for x in kf[b])
        lam = max(0.0, (kg - delta) / kk) if kk > 0 else 0.0
        out[b] = gf[b] - lam * kf[b]
    return out.reshape(g.shape)


def random_window(
    batch_shape=(),
    time=7,
    num_actions=3,
    num_atoms=11,
    done_pattern="mid",
    seed=0,
    dtype=torch.float64,
):
    """A consistent random window with per-action detail for the references.

    Rows follow the TorchRL alignment. Where ``done[t]`` is False and t < T − 1, the next state
    of row t is the state of row t + 1, so ``next_*[t]`` equals the current-state quantities of
    row t + 1; where ``done[t]`` is True (terminal or truncated), the next state is fresh.

    ``done_pattern``: "none", "mid" (a termination and a truncation inside the window) or
    "last" (the last step terminates). Returns a dict of tensors.
    """
    gen = torch.Generator().manual_seed(seed)
    bs = tuple(batch_shape)

    def rand(*shape):
        return torch.rand(*bs, *shape, generator=gen, dtype=torch.float64)

    def simplex(*shape):
        x = rand(*shape) + 0.05
        return x / x.sum(-1, keepdim=True)

    done = torch.zeros(*bs, time, 1, dtype=torch.bool)
    terminated = torch.zeros_like(done)
    if done_pattern == "mid" and time >= 3:
        terminated[..., 1, :] = True
        done[..., 1, :] = True
        done[..., time - 2, :] = True  # a truncation (done, not terminated)
    elif done_pattern == "last":
        terminated[..., -1, :] = True
        done[..., -1, :] = True
    elif done_pattern != "none" and time >= 3:
        raise ValueError(done_pattern)

    probs = simplex(time, num_actions)  # π(·|x_t)
    atom_probs = simplex(time, num_actions, num_atoms)  # q(x_t, a, ·)
    action = torch.randint(num_actions, (*bs, time), generator=gen)
    next_probs = simplex(time, num_actions)  # fresh π(·|x_{t+1}) where done
    next_atom_probs = simplex(time, num_actions, num_atoms)
    next_action = torch.randint(num_actions, (*bs, time), generator=gen)
    # Continue the trajectory where not done: next quantities are row t + 1's.
    cont = ~done[..., :-1, 0]  # [*B, T − 1]
    next_probs[..., :-1, :] = torch.where(
        cont[..., None], probs[..., 1:, :], next_probs[..., :-1, :]
    )
    next_atom_probs[..., :-1, :, :] = torch.where(
        cont[..., None, None], atom_probs[..., 1:, :, :], next_atom_probs[..., :-1, :, :]
    )
    next_action[..., :-1] = torch.where(cont, action[..., 1:], next_action[..., :-1])

    behavior = simplex(time, num_actions)
    taken_prob = probs.gather(-1, action.unsqueeze(-1))
    ratio = taken_prob / behavior.gather(-1, action.unsqueeze(-1))
    support = torch.linspace(-4.0, 4.0, num_atoms, dtype=torch.float64)
    q_values = (atom_probs * support).sum(-1) * 3.0 - 1.0  # arbitrary scalar critic [*B, T, A]
    next_q_values = (next_atom_probs * support).sum(-1) * 3.0 - 1.0
    out = dict(
        reward=rand(time, 1) * 2.0 - 1.0,
        done=done,
        terminated=terminated,
        probs=probs,
        behavior_probs=behavior,
        action=action,
        ratio=ratio,
        trace=ratio.clamp(max=1.0) * 0.9,
        atom_probs=atom_probs,
        next_probs=next_probs,
        next_atom_probs=next_atom_probs,
        next_action=next_action,
        support=support,
        chosen_action_value=q_values.gather(-1, action.unsqueeze(-1)),
        state_value=(probs * q_values).sum(-1, keepdim=True),
        next_state_value=(next_probs * next_q_values).sum(-1, keepdim=True),
        chosen_atom_probs=atom_probs.gather(
            -2, action[..., None, None].expand(*bs, time, 1, num_atoms)
        ).squeeze(-2),
        next_expected_atom_probs=(next_probs.unsqueeze(-1) * next_atom_probs).sum(-2),
    )
    return {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in out.items()}
