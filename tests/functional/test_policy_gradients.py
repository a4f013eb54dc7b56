from __future__ import annotations

import math

import pytest
import torch

from ac_extensions.functional import (
    beta_loo_policy_loss,
    bias_correction_loss,
    sampled_bias_correction_loss,
    truncated_is_policy_loss,
)
from tests import _reference as reference
from tests._helpers import col


def vec(*xs: float) -> torch.Tensor:
    """A [1, A] row: one step, A actions (T = 1, no batch dims)."""
    return torch.tensor([xs], dtype=torch.float64)


def random_policies(batch_shape, num_actions=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(*batch_shape, num_actions, generator=gen, dtype=torch.float64)
    behavior = torch.randn(*batch_shape, num_actions, generator=gen, dtype=torch.float64)
    q = torch.randn(*batch_shape, num_actions, generator=gen, dtype=torch.float64)
    return logits, behavior.softmax(-1), q


class TestTruncatedISPolicyLoss:
    def test_hand_computed(self):
        # −min(10, 20)·1·log 0.5 = 10 log 2;  −min(10, 0.5)·(−2)·log 0.25 = −2 log 2
        out = truncated_is_policy_loss(col(0.5, 0.25).log(), col(20.0, 0.5), col(1.0, -2.0))
        torch.testing.assert_close(out, col(10 * math.log(2), -2 * math.log(2)))

    @pytest.mark.parametrize("batch_shape", [(), (3,), (2, 3)])
    def test_matches_reference(self, batch_shape):
        gen = torch.Generator().manual_seed(1)
        shape = (*batch_shape, 5, 1)
        log_prob = -torch.rand(shape, generator=gen, dtype=torch.float64) * 3
        ratio = torch.rand(shape, generator=gen, dtype=torch.float64) * 4
        adv = torch.randn(shape, generator=gen, dtype=torch.float64)
        out = truncated_is_policy_loss(log_prob, ratio, adv, truncation_threshold=2.0)
        torch.testing.assert_close(
            out, reference.truncated_is_policy_loss(log_prob, ratio, adv, 2.0)
        )

    def test_only_log_prob_carries_gradient(self):
        log_prob = col(0.5, 0.2).log().requires_grad_()
        ratio = col(3.0, 0.5).requires_grad_()
        adv = col(1.0, 2.0).requires_grad_()
        truncated_is_policy_loss(log_prob, ratio, adv, truncation_threshold=2.0).sum().backward()
        torch.testing.assert_close(log_prob.grad, col(-2.0 * 1.0, -0.5 * 2.0))
        assert ratio.grad is None and adv.grad is None

    def test_on_policy_is_the_a2c_loss(self):
        log_prob, adv = col(0.3, 0.6).log(), col(1.5, -0.5)
        out = truncated_is_policy_loss(log_prob, torch.ones_like(log_prob), adv)
        torch.testing.assert_close(out, -adv * log_prob)

    def test_bad_input(self):
        with pytest.raises(ValueError, match="ratio"):
            truncated_is_policy_loss(col(0.0), col(-1.0), col(1.0))
        with pytest.raises(ValueError, match="truncation_threshold"):
            truncated_is_policy_loss(col(0.0), col(1.0), col(1.0), truncation_threshold=0.0)
        with pytest.raises(ValueError, match=r"advantage.*\(2,\)|log_prob.*\(1,\)"):
            truncated_is_policy_loss(col(0.0), col(1.0), col(1.0, 2.0))


class TestBiasCorrectionLoss:
    def test_per_action_weights_sum_to_pi(self):
        # ACER's truncation with bias correction (Wang et al., 2017, arXiv:1611.01224v2, Eq. 7):
        # π = [.5, .3, .2], µ = [.1, .6, .3], c = 2 → ρ = [5, .5, .667].
        # sampled part µ·min(c, ρ) = [.2, .3, .2]; correction part π·[1 − c/ρ]_+ = [.3, 0, 0].
        # With A ≡ 1, ∂L/∂log π(a) of (E_{a_t∼µ} truncated IS) + (bias correction) is −π(a).
        pi, mu, c = vec(0.5, 0.3, 0.2), vec(0.1, 0.6, 0.3), 2.0
        log_probs = pi.log().requires_grad_()
        rho = pi / mu
        bias_correction_loss(log_probs, rho, torch.ones_like(pi), c).sum().backward()
        torch.testing.assert_close(log_probs.grad, -vec(0.3, 0.0, 0.0))
        sampled = -mu * rho.clamp(max=c)
        torch.testing.assert_close(sampled, -vec(0.2, 0.3, 0.2))
        torch.testing.assert_close(sampled + log_probs.grad, -pi)

    @pytest.mark.parametrize("c", [0.5, 1.0, 2.0, math.inf])
    def test_expected_gradient_is_the_all_action_gradient(self, c):
        # E_{a_t∼µ}[∇_ℓ L_is(a_t)] + ∇_ℓ L_bc = −∇_ℓ Σ_a π(a) (Q(a) − V), with Q^ret := Q(a_t)
        # and V held constant (Wang et al. 2017, Eq. 7: the estimator is unbiased for any c).
        logits, mu, q = random_policies((), num_actions=5, seed=2)
        logits = logits.unsqueeze(0).requires_grad_()  # [T = 1, A]
        mu, q = mu.unsqueeze(0), q.unsqueeze(0)
        log_probs = logits.log_softmax(-1)
        pi = log_probs.exp()
        v = (pi * q).sum(-1, keepdim=True).detach()
        rho = (pi / mu).detach()
        total = bias_correction_loss(log_probs, rho, q - v, c).sum()
        for a in range(5):
            is_term = truncated_is_policy_loss(
                log_probs[:, a : a + 1], rho[:, a : a + 1], q[:, a : a + 1] - v, c
            )
            total = total + mu[0, a] * is_term.sum()
        (grad,) = torch.autograd.grad(total, logits)
        target = -(logits.softmax(-1) * (q - v)).sum()
        (expected,) = torch.autograd.grad(target, logits)
        torch.testing.assert_close(grad, expected)

    def test_on_policy_correction_is_zero(self):
        logits, _, q = random_policies((3, 4), seed=3)
        log_probs = logits.log_softmax(-1)
        out = bias_correction_loss(log_probs, torch.ones_like(log_probs), q, 1.0)
        assert torch.equal(out, torch.zeros_like(out))

    def test_gradient_treats_pi_weight_as_constant(self):
        # ∇_ℓ L_bc = −Σ_a w_a A_a (e_a − π), w_a = [1 − c/ρ(a)]_+ π(a) constant. A non-detached
        # π weight (Kaixhin/ACER, CampusAI) would add Σ_a w_a A_a log π(a)·(e_a − π) terms.
        logits, mu, q = random_policies((), num_actions=4, seed=4)
        logits = logits.unsqueeze(0).requires_grad_()
        mu, adv = mu.unsqueeze(0), q.unsqueeze(0)
        log_probs = logits.log_softmax(-1)
        pi = log_probs.exp().detach()
        rho = pi / mu
        c = 0.8
        bias_correction_loss(log_probs, rho, adv, c).sum().backward()
        w = (1 - c / rho).clamp(min=0) * pi
        eye = torch.eye(4, dtype=torch.float64)
        expected = -((w * adv).unsqueeze(-1) * (eye - pi)).sum(-2)
        torch.testing.assert_close(logits.grad, expected)

    @pytest.mark.parametrize("batch_shape", [(), (3,), (2, 3)])
    def test_matches_reference(self, batch_shape):
        logits, mu, q = random_policies((*batch_shape, 6), seed=5)
        log_probs = logits.log_softmax(-1)
        rho = log_probs.exp() / mu
        out = bias_correction_loss(log_probs, rho, q, 1.5)
        torch.testing.assert_close(out, reference.bias_correction_loss(log_probs, rho, q, 1.5))

    def test_zero_probability_action_is_finite(self):
        log_probs = vec(0.5, 0.5, 0.0).log().requires_grad_()
        rho = vec(5.0, 0.5, 0.0)
        out = bias_correction_loss(log_probs, rho, vec(1.0, 1.0, 1.0), 2.0)
        out.sum().backward()
        assert torch.isfinite(out).all() and torch.isfinite(log_probs.grad).all()

    def test_bad_input(self):
        with pytest.raises(ValueError, match=r"ratios.*\(1, 2\)|log_probs.*\(1, 3\)"):
            bias_correction_loss(vec(0.0, 0.0, 0.0), vec(1.0, 1.0), vec(1.0, 1.0, 1.0))
        with pytest.raises(ValueError, match="ratios"):
            bias_correction_loss(vec(0.0, 0.0), vec(1.0, -1.0), vec(1.0, 1.0))


class TestSampledBiasCorrectionLoss:
    def test_expectation_over_pi_equals_the_discrete_sum(self):
        # Σ_{a'} π(a') · L_sampled(a') == L_bc (the π factor is the sampling distribution).
        logits, mu, q = random_policies((), num_actions=4, seed=6)
        log_probs = logits.log_softmax(-1).unsqueeze(0)
        pi, mu, adv = log_probs.exp(), mu.unsqueeze(0), q.unsqueeze(0)
        rho = pi / mu
        expected = bias_correction_loss(log_probs, rho, adv, 1.2)
        total = sum(
            pi[0, a]
            * sampled_bias_correction_loss(
                log_probs[:, a : a + 1], rho[:, a : a + 1], adv[:, a : a + 1], 1.2
            )
            for a in range(4)
        )
        torch.testing.assert_close(total, expected)

    def test_averages_over_samples(self):
        # K = 2 samples: ρ = [4, 1], c = 2 → weights [.5, 0]; −.5·3·log .5 / 2
        out = sampled_bias_correction_loss(vec(0.5, 0.1).log(), vec(4.0, 1.0), vec(3.0, 9.0), 2.0)
        torch.testing.assert_close(out, col(0.75 * math.log(2)).reshape(1, 1))


class TestBetaLOOPolicyLoss:
    def test_paper_hand_case(self):
        # β-LOO (Gruslys et al., 2018, arXiv:1704.04651v2, §3.1), by hand: π = [.5, .5],
        # µ = [.25, .75], Q^π = [1, 0] = R, critic Q = [0, 0].
        # E_{â∼µ}[∇_π(−L)] = Σ_â µ(â) β(â) (R(â) − Q(â)) e_â = µ(0) β(0) e_0.
        # β = 1 (c = 1): 0.25 e_0 (biased by −0.75 e_0); β = 1/µ (c = inf): e_0 = ∇Σ_a Q^π π.
        probs = torch.tensor([[0.5, 0.5]], dtype=torch.float64, requires_grad=True)
        mu, r = [0.25, 0.75], [1.0, 0.0]
        for c, expected in ((1.0, [0.25, 0.0]), (math.inf, [1.0, 0.0])):
            total = 0.0
            for a in range(2):
                total = (
                    total
                    + mu[a]
                    * beta_loo_policy_loss(
                        probs,
                        torch.tensor([[a]]),
                        torch.tensor([[mu[a]]], dtype=torch.float64),
                        torch.zeros(1, 2, dtype=torch.float64),
                        torch.tensor([[r[a]]], dtype=torch.float64),
                        c,
                    ).sum()
                )
            (grad,) = torch.autograd.grad(-total, probs)
            torch.testing.assert_close(grad, torch.tensor([expected], dtype=torch.float64))

    @pytest.mark.parametrize("c", [0.0, 1.0, 2.0, math.inf])
    def test_bias_matches_proposition_1(self, c):
        # E_{â∼µ}[∇_π(−L)] − ∇_π Σ_a Q^π(a)π(a) = (1 − µ(a)β(a)) (Q(a) − Q^π(a)) per action,
        # with β(a) = min(c, 1/µ(a)) and R(â) = Q^π(â) (Gruslys et al. 2018, Proposition 1).
        gen = torch.Generator().manual_seed(7)
        n = 5
        probs = torch.rand(1, n, generator=gen, dtype=torch.float64).softmax(-1).requires_grad_()
        mu = torch.rand(n, generator=gen, dtype=torch.float64).softmax(-1)
        q = torch.randn(1, n, generator=gen, dtype=torch.float64)
        q_pi = torch.randn(n, generator=gen, dtype=torch.float64)
        expected_loss = 0.0
        for a in range(n):
            expected_loss = (
                expected_loss
                + mu[a]
                * beta_loo_policy_loss(
                    probs, torch.tensor([[a]]), mu[a].reshape(1, 1), q, q_pi[a].reshape(1, 1), c
                ).sum()
            )
        (grad,) = torch.autograd.grad(-expected_loss, probs)
        beta = (1.0 / mu).clamp(max=c)
        bias = (1 - mu * beta) * (q[0] - q_pi)
        torch.testing.assert_close(grad[0] - q_pi, bias)
        if c == math.inf:
            torch.testing.assert_close(grad[0], q_pi)  # unbiased

    def test_gradient_closed_form_wrt_logits(self):
        # Critic Q ≡ 0 leaves −β(R − 0)π(â); ∇_ℓ = −β R π(â) (e_â − π).
        logits = torch.tensor([[0.2, -0.4, 1.0]], dtype=torch.float64, requires_grad=True)
        probs = logits.softmax(-1)
        mu, ret = 0.4, 1.7
        loss = beta_loo_policy_loss(
            probs,
            torch.tensor([[1]]),
            torch.tensor([[mu]], dtype=torch.float64),
            torch.zeros(1, 3, dtype=torch.float64),
            torch.tensor([[ret]], dtype=torch.float64),
            2.0,
        )
        loss.sum().backward()
        pi = probs.detach()[0]
        beta = min(2.0, 1 / mu)
        expected = -beta * ret * pi[1] * (torch.eye(3, dtype=torch.float64)[1] - pi)
        torch.testing.assert_close(logits.grad[0], expected)

    def test_critic_return_and_behavior_are_detached(self):
        probs = torch.tensor([[0.3, 0.7]], dtype=torch.float64, requires_grad=True)
        q = torch.tensor([[1.0, 2.0]], dtype=torch.float64, requires_grad=True)
        ret = torch.tensor([[3.0]], dtype=torch.float64, requires_grad=True)
        mu = torch.tensor([[0.5]], dtype=torch.float64, requires_grad=True)
        beta_loo_policy_loss(probs, torch.tensor([[0]]), mu, q, ret).sum().backward()
        assert q.grad is None and ret.grad is None and mu.grad is None
        assert probs.grad is not None

    @pytest.mark.parametrize("batch_shape", [(), (3,), (2, 3)])
    def test_matches_reference(self, batch_shape):
        gen = torch.Generator().manual_seed(8)
        shape = (*batch_shape, 4)
        probs = torch.rand(*shape, 3, generator=gen, dtype=torch.float64).softmax(-1)
        action = torch.randint(3, (*shape, 1), generator=gen)
        mu = torch.rand(*shape, 1, generator=gen, dtype=torch.float64) * 0.9 + 0.05
        q = torch.randn(*shape, 3, generator=gen, dtype=torch.float64)
        ret = torch.randn(*shape, 1, generator=gen, dtype=torch.float64)
        out = beta_loo_policy_loss(probs, action, mu, q, ret, 1.5)
        torch.testing.assert_close(
            out, reference.beta_loo_policy_loss(probs, action, mu, q, ret, 1.5)
        )

    def test_bad_input(self):
        probs = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
        q = torch.zeros(1, 2, dtype=torch.float64)
        one = torch.ones(1, 1, dtype=torch.float64)
        with pytest.raises(ValueError, match="integer action"):
            beta_loo_policy_loss(probs, one, one, q, one)
        with pytest.raises(ValueError, match=r"action indices must lie in \[0, 2\)"):
            beta_loo_policy_loss(probs, torch.tensor([[2]]), one, q, one)
        with pytest.raises(ValueError, match="behavior_prob must be > 0"):
            beta_loo_policy_loss(probs, torch.tensor([[0]]), 0 * one, q, one)
        with pytest.raises(ValueError, match="action_value"):
            beta_loo_policy_loss(probs, torch.tensor([[0]]), one, torch.zeros(1, 3), one)
        with pytest.raises(ValueError, match="truncation_threshold"):
            beta_loo_policy_loss(probs, torch.tensor([[0]]), one, q, one, -1.0)
