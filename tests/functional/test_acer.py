"""Discrete ACER on plain tensors: Q^ret and the losses against loops written from the paper."""

from __future__ import annotations

import math

import pytest
import torch

from ac_extensions.functional import categorical_acer_losses, categorical_q_retrace

B, T, A = 3, 6, 4


def inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    done = torch.zeros(B, T, 1, dtype=torch.bool)
    done[0, 2] = done[1, 4] = True
    terminated = done.clone()
    terminated[1, 4] = False  # a truncation: bootstraps from its own next state
    return {
        "logits": torch.randn(B, T, A, generator=gen),
        "action_value": torch.randn(B, T, A, generator=gen),
        "next_logits": torch.randn(B, T, A, generator=gen),
        "next_action_value": torch.randn(B, T, A, generator=gen),
        "action": torch.randint(A, (B, T, 1), generator=gen),
        "behavior_log_probs": torch.randn(B, T, A, generator=gen).log_softmax(-1),
        "reward": torch.randn(B, T, 1, generator=gen),
        "done": done,
        "terminated": terminated,
    }


def naive_q_retrace(x, gamma, lmbda):
    """Algorithm 2 of Wang et al. (2017), one sequence and one step at a time."""
    probs, next_probs = x["logits"].softmax(-1), x["next_logits"].softmax(-1)
    out = torch.zeros(B, T)
    for b in range(B):
        following = None  # G_{t+1}
        for t in reversed(range(T)):
            v_next = float((next_probs[b, t] * x["next_action_value"][b, t]).sum())
            keep = 0.0 if x["terminated"][b, t] else gamma
            target = v_next
            if t < T - 1 and not x["done"][b, t]:
                a1 = int(x["action"][b, t + 1])
                rho = float(probs[b, t + 1, a1] / x["behavior_log_probs"][b, t + 1, a1].exp())
                c = lmbda * min(1.0, rho)
                target += c * (following - float(x["action_value"][b, t + 1, a1]))
            following = float(x["reward"][b, t]) + keep * target
            out[b, t] = following

    return out


@pytest.mark.parametrize("lmbda", [1.0, 0.7])
def test_q_retrace_equals_the_papers_loop(lmbda):
    x = inputs()
    q_ret, value = categorical_q_retrace(**x, gamma=0.9, lmbda=lmbda)
    torch.testing.assert_close(q_ret.squeeze(-1), naive_q_retrace(x, 0.9, lmbda))
    expected_value = (x["logits"].softmax(-1) * x["action_value"]).sum(-1, keepdim=True)
    torch.testing.assert_close(value, expected_value)


def test_q_retrace_without_traces_is_one_step_td():
    x = inputs(1)
    q_ret, _ = categorical_q_retrace(**x, gamma=0.8, lmbda=0.0)
    next_value = (x["next_logits"].softmax(-1) * x["next_action_value"]).sum(-1, keepdim=True)
    expected = x["reward"] + 0.8 * (~x["terminated"]) * next_value
    torch.testing.assert_close(q_ret, expected)


def test_q_retrace_names_mismatched_shapes():
    x = inputs()
    x["next_action_value"] = x["next_action_value"][..., :2]
    with pytest.raises(ValueError, match="next_action_value"):
        categorical_q_retrace(**x, gamma=0.9)


def naive_losses(logits, q, q_ret, action, behavior_log_probs, c, entropy_coeff, critic_coeff):
    """Eq. 9, the critic of §3.1 and the entropy bonus, step by step (no trust region)."""
    policy, critic, entropy = [], [], []
    for b in range(logits.shape[0]):
        for t in range(logits.shape[1]):
            pi = logits[b, t].softmax(-1)
            log_pi = pi.log()
            mu = behavior_log_probs[b, t].exp()
            a = int(action[b, t])
            v = float((pi.detach() * q[b, t]).sum())
            rho = (pi.detach() / mu).tolist()
            term = -min(c, rho[a]) * (float(q_ret[b, t]) - v) * log_pi[a]
            for u in range(len(rho)):
                weight = max(0.0, 1 - c / rho[u]) * float(pi[u])
                term = term - weight * (float(q[b, t, u]) - v) * log_pi[u]
            policy.append(term)
            critic.append(0.5 * (float(q_ret[b, t]) - q[b, t, a]) ** 2)
            entropy.append(-(pi * log_pi).sum())
    return {
        "loss_objective": torch.stack(policy).mean(),
        "loss_critic": critic_coeff * torch.stack(critic).mean(),
        "loss_entropy": -entropy_coeff * torch.stack(entropy).mean(),
    }


def test_losses_equal_the_papers_terms_step_by_step():
    x = inputs(2)
    logits = (3 * x["logits"]).requires_grad_(True)  # peaked: ratios above c occur
    q = x["action_value"].clone().requires_grad_(True)
    q_ret = torch.randn(B, T, 1, generator=torch.Generator().manual_seed(5))
    c = 1.5
    out = categorical_acer_losses(
        logits,
        q,
        logits.detach(),
        q_ret,
        x["action"],
        x["behavior_log_probs"],
        truncation_threshold=c,
        trust_region_delta=math.inf,
        entropy_coeff=0.01,
        critic_coeff=0.5,
    )
    expected = naive_losses(logits, q, q_ret, x["action"], x["behavior_log_probs"], c, 0.01, 0.5)
    for key, value in expected.items():
        torch.testing.assert_close(out[key], value, msg=key)
        got = torch.autograd.grad(out[key], (logits, q), allow_unused=True, retain_graph=True)
        want = torch.autograd.grad(value, (logits, q), allow_unused=True, retain_graph=True)
        for g, w in zip(got, want, strict=True):
            if w is None:
                assert g is None or not g.abs().any()
            else:
                torch.testing.assert_close(g, w, msg=key)
    assert 0 < float(out["truncation_fraction"]) < 1
    assert float(out["trust_region_active"]) == 0 and float(out["kl_average"]) == pytest.approx(0)


def test_mask_leaves_the_padded_steps_out():
    x = inputs(3)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[2, 3:] = False
    q_ret = torch.randn(B, T, 1)

    def run(logits, q):
        logits = logits.clone().requires_grad_(True)
        return categorical_acer_losses(
            logits,
            q,
            logits.detach() + 0.3,
            q_ret,
            x["action"],
            x["behavior_log_probs"],
            trust_region_delta=0.01,
            mask=mask,
        )

    base = run(x["logits"], x["action_value"])
    garbage_logits, garbage_q = x["logits"].clone(), x["action_value"].clone()
    garbage_logits[2, 3:] = 50.0
    garbage_q[2, 3:] = -1e3
    changed = run(garbage_logits, garbage_q)
    for key in base.keys():
        torch.testing.assert_close(base[key], changed[key], msg=key)
    assert float(base["trust_region_active"]) > 0
