"""A naive ACER update written from the paper's Algorithm 2, one time step at a time.

Wang et al., 2017, arXiv:1611.01224v2, Algorithm 2 ("ACER for discrete actions"), for a batch
of B sequences at once (vectorised over B only): walk i = k−1 … 0 backwards, run the networks
on step i, update Q^ret, form g (truncated IS + bias correction + entropy, in the statistics
φ = f = π(·|x_i)), project it with the trust region against the average network's f_avg, and
accumulate the surrogate losses; one backward at the end. This is the baseline of
``benchmarks/acer_update.py`` (what a straightforward port does), and the benchmark checks
that it gives the same gradients as :class:`~ac_extensions.objectives.ACERLoss`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def naive_acer_loss(
    network: nn.Module,
    average: nn.Module,
    data: dict[str, Tensor],
    *,
    gamma: float,
    c: float = 10.0,
    delta: float = 1.0,
    entropy_coeff: float = 0.0,
    critic_coeff: float = 0.5,
) -> Tensor:
    """Total ACER loss for ``[B, k]`` sequences, step by step (Algorithm 2).

    Args:
        network: ``x [B, ...] → (logits [B, A], Q [B, A])`` (policy-plus-Q network).
        average: the Polyak-averaged copy of ``network``.
        data: ``observation [B, k, ...]``, ``action [B, k]``, ``behavior_logits [B, k, A]``,
            ``next_observation [B, k, ...]``, ``reward / done / terminated [B, k]``.
        gamma: discount γ.
        c: truncation threshold of the importance weight.
        delta: trust-region δ.
        entropy_coeff: entropy bonus coefficient β.
        critic_coeff: weight of the critic loss.

    Returns:
        The scalar loss whose gradient is the ACER update (mean over B and k).
    """
    obs, action = data["observation"], data["action"]
    mu = data["behavior_logits"].softmax(-1)
    reward, done, terminated = data["reward"], data["done"], data["terminated"]
    steps = action.shape[1]

    def value_of(x: Tensor) -> Tensor:
        logits, q = network(x)
        return (logits.softmax(-1) * q).sum(-1)

    policy_terms, critic_terms = [], []
    q_ret = None
    for i in reversed(range(steps)):
        # Q^ret ← r_i + γ Q^ret, restarting at episode ends and at the window end.
        if i == steps - 1 or bool(done[:, i].any()):
            with torch.no_grad():
                bootstrap = value_of(data["next_observation"][:, i])
            bootstrap = torch.where(terminated[:, i], torch.zeros_like(bootstrap), bootstrap)
            q_ret = bootstrap if q_ret is None else torch.where(done[:, i], bootstrap, q_ret)
        q_ret = reward[:, i] + gamma * q_ret

        logits, q = network(obs[:, i])
        f = logits.softmax(-1)  # φ = f(·|φ_θ(x_i))                                   [B, A]
        with torch.no_grad():
            f_avg = average(obs[:, i])[0].softmax(-1)
        a = action[:, i].unsqueeze(-1)
        fd = f.detach()
        value = (fd * q.detach()).sum(-1)  # V_i = Σ_a f(a) Q(x_i, a)
        rho = fd / mu[:, i]  # ρ_i(a) = f(a)/µ(a)                                 [B, A]
        rho_a = rho.gather(-1, a).squeeze(-1)
        # g = ∂/∂φ [min(c, ρ_i) (Q^ret − V) log f(a_i)
        #          + Σ_a [1 − c/ρ_i(a)]_+ f(a) (Q(a) − V) log f(a) + β H(f)]
        g = torch.zeros_like(fd)
        g.scatter_(-1, a, (rho_a.clamp(max=c) * (q_ret - value)).unsqueeze(-1) / fd.gather(-1, a))
        g = g + (1 - c / rho).clamp(min=0) * (q.detach() - value.unsqueeze(-1))
        g = g - entropy_coeff * (fd.clamp_min(1e-30).log() + 1)
        # Trust region: k = ∂ KL(f_avg ‖ f)/∂φ, z* = g − max(0, (kᵀg − δ)/‖k‖²) k  (Eq. 12).
        k = -f_avg / fd
        scale = ((k * g).sum(-1, keepdim=True) - delta).clamp(min=0) / (k * k).sum(-1, keepdim=True)
        z = g - scale * k
        policy_terms.append(-(z * f).sum(-1))  # ∂/∂φ = −z*, then backprop into θ
        q_a = q.gather(-1, a).squeeze(-1)
        critic_terms.append(0.5 * (q_ret - q_a).pow(2))
        # Q^ret ← ρ̄_i (Q^ret − Q(x_i, a_i)) + V_i, ρ̄ = min(1, ρ).
        q_ret = rho_a.clamp(max=1.0) * (q_ret - q_a.detach()) + value

    policy = torch.stack(policy_terms).mean()
    critic = torch.stack(critic_terms).mean()
    return policy + critic_coeff * critic
