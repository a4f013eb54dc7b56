"""functional.reactor: Reactor's critic target and loss against the naive references."""

from __future__ import annotations

import math

import pytest
import torch

from ac_extensions.functional import reactor_critic_loss, reactor_critic_targets
from tests import _reference as ref

GAMMA, LMBDA = 0.9, 0.9  # random_window's trace is 0.9 · min(1, ρ)


def inputs(window, support=None):
    """reactor_critic_targets' arguments from a reference window (critic: log-probabilities)."""
    action = window["action"].unsqueeze(-1)
    distributional = support is not None
    q_values = (window["atom_probs"] * window["support"]).sum(-1) * 3.0 - 1.0
    next_q = (window["next_atom_probs"] * window["support"]).sum(-1) * 3.0 - 1.0
    return dict(
        log_probs=window["probs"].log(),
        target_critic=window["atom_probs"].log() if distributional else q_values,
        next_probs=window["next_probs"],
        next_target_critic=window["next_atom_probs"].log() if distributional else next_q,
        action=action,
        behavior_log_prob=window["behavior_probs"].gather(-1, action).log(),
        reward=window["reward"],
        done=window["done"],
        terminated=window["terminated"],
        gamma=GAMMA,
        lmbda=LMBDA,
        support=support,
    )


@pytest.mark.parametrize("pattern", ["none", "mid", "last"])
def test_distributional_target_equals_the_explicit_mixture(pattern):
    window = ref.random_window((2,), time=6, done_pattern=pattern, seed=1)
    target, corrected, ratio = reactor_critic_targets(**inputs(window, window["support"]))
    expected = ref.distributional_retrace_targets(
        window["reward"],
        window["next_probs"],
        window["next_atom_probs"],
        window["next_action"],
        window["trace"],
        window["done"],
        window["terminated"],
        GAMMA,
        window["support"],
    )
    torch.testing.assert_close(target, expected)
    torch.testing.assert_close(corrected, (expected * window["support"]).sum(-1, keepdim=True))
    torch.testing.assert_close(ratio, window["ratio"])
    torch.testing.assert_close(target.sum(-1), torch.ones(2, 6, dtype=torch.float64))


@pytest.mark.parametrize("pattern", ["none", "mid", "last"])
def test_scalar_target_equals_the_naive_recursion(pattern):
    window = ref.random_window((3,), time=7, done_pattern=pattern, seed=2)
    target, corrected, _ = reactor_critic_targets(**inputs(window))
    expected = ref.retrace_targets(
        window["reward"],
        window["chosen_action_value"],
        window["next_state_value"],
        window["trace"],
        window["done"],
        window["terminated"],
        GAMMA,
    )
    torch.testing.assert_close(target, expected)
    assert corrected is target


def test_distributional_mean_is_the_scalar_target_when_no_atom_is_clipped():
    # Q = E[q] on a support wide enough that no return G + Γz leaves it (|r| ≤ 1, γ = 0.9).
    window = ref.random_window((2,), time=6, done_pattern="mid", seed=3)
    support = torch.linspace(-40.0, 40.0, window["support"].numel(), dtype=torch.float64)
    args = inputs(window, support)
    _, corrected, _ = reactor_critic_targets(**args)
    scalar = dict(args, support=None)
    scalar["target_critic"] = (window["atom_probs"] * support).sum(-1)
    scalar["next_target_critic"] = (window["next_atom_probs"] * support).sum(-1)
    expected, _, _ = reactor_critic_targets(**scalar)
    torch.testing.assert_close(corrected, expected)


def test_distributional_loss_is_the_cross_entropy_at_the_taken_action():
    torch.manual_seed(0)
    support = torch.linspace(-1.0, 1.0, 5, dtype=torch.float64)
    critic = torch.randn(2, 3, 4, 5, dtype=torch.float64, requires_grad=True)  # [B, T, A, N]
    action = torch.randint(4, (2, 3, 1))
    target = torch.zeros(2, 3, 5, dtype=torch.float64)
    target[..., 1] = 1.0  # a point mass on atom 1
    loss, q, chosen = reactor_critic_loss(critic, target, action, support)
    for b in range(2):
        for t in range(3):
            a = int(action[b, t, 0])
            probs = critic[b, t, a].softmax(-1)
            assert loss[b, t, 0].item() == pytest.approx(-math.log(probs[1].item()))
            torch.testing.assert_close(chosen[b, t], probs.detach())
            for other in range(4):
                mean = (critic[b, t, other].softmax(-1) * support).sum()
                assert q[b, t, other].item() == pytest.approx(mean.item())
    assert torch.autograd.gradcheck(
        lambda c: reactor_critic_loss(c, target, action, support)[0], (critic,)
    )


def test_scalar_loss_is_half_the_squared_error():
    critic = torch.tensor([[[1.0, 4.0], [0.5, -1.0]]], requires_grad=True)
    target = torch.tensor([[[2.0], [1.0]]])
    loss, q, chosen = reactor_critic_loss(critic, target, torch.tensor([[[1], [0]]]))
    torch.testing.assert_close(loss, torch.tensor([[[2.0], [0.125]]]))
    assert q is critic and chosen is None
    loss.sum().backward()
    torch.testing.assert_close(critic.grad, torch.tensor([[[0.0, 2.0], [-0.5, 0.0]]]))
