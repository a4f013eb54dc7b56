from __future__ import annotations

import math

import pytest
import torch

from ac_extensions.functional import (
    categorical_kl_gradient,
    normal_kl_gradient,
    scaled_categorical_kl_gradient,
    trust_region_loss,
    trust_region_multiplier,
    trust_region_step,
)
from tests import _reference as reference


def t(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float64)


class TestTrustRegionStep:
    def test_active_constraint_hand_case(self):
        # g = [2, 0, 0], k = [1, 0, 0], δ = 1: kᵀg = 2 > δ, λ = (2 − 1)/1 = 1, z* = [1, 0, 0],
        # and kᵀz* = δ exactly.
        g, k = t(2.0, 0.0, 0.0), t(1.0, 0.0, 0.0)
        z = trust_region_step(g, k, 1.0)
        torch.testing.assert_close(z, t(1.0, 0.0, 0.0))
        assert float(k @ z) == 1.0

    def test_inactive_constraint_is_bit_exact(self):
        g, k = t(0.3, -1.2, 0.7), t(0.5, 0.5, 0.1)  # kᵀg = −0.38 ≤ δ
        z = trust_region_step(g, k, 1.0)
        assert torch.equal(z, g)

    def test_zero_k_is_safe(self):
        g = t(1.0, 2.0)
        for delta in (0.0, 1.0):
            z = trust_region_step(g, torch.zeros(2, dtype=torch.float64), delta)
            assert torch.equal(z, g)

    def test_infinite_delta_is_a_no_op(self):
        g, k = torch.randn(5, 4, dtype=torch.float64), torch.randn(5, 4, dtype=torch.float64) * 9
        assert torch.equal(trust_region_step(g, k, math.inf), g)

    @pytest.mark.parametrize("batch_shape", [(), (3,), (2, 3)])
    def test_matches_reference(self, batch_shape):
        gen = torch.Generator().manual_seed(0)
        g = torch.randn(*batch_shape, 6, generator=gen, dtype=torch.float64) * 3
        k = torch.randn(*batch_shape, 6, generator=gen, dtype=torch.float64)
        torch.testing.assert_close(
            trust_region_step(g, k, 0.5), reference.trust_region_step(g, k, 0.5)
        )

    def test_kkt_conditions(self):
        # For random g, k, δ: z* is feasible, λ >= 0, stationarity g − z* = λk, and
        # complementary slackness λ (kᵀz* − δ) = 0; and no feasible point is closer to g.
        gen = torch.Generator().manual_seed(1)
        g = torch.randn(200, 5, generator=gen, dtype=torch.float64) * 2
        k = torch.randn(200, 5, generator=gen, dtype=torch.float64)
        delta = 0.7
        z = trust_region_step(g, k, delta)
        lam = trust_region_multiplier(g, k, delta)
        kz = (k * z).sum(-1, keepdim=True)
        assert bool((kz <= delta + 1e-9).all())
        assert bool((lam >= 0).all())
        torch.testing.assert_close(g - z, lam * k)
        torch.testing.assert_close(lam * (kz - delta), torch.zeros_like(lam), atol=1e-9, rtol=0)
        assert bool((lam > 0).any()) and bool((lam == 0).any())  # both regimes exercised
        # Optimality against random feasible points.
        other = torch.randn(200, 50, 5, generator=gen, dtype=torch.float64) * 3 + g.unsqueeze(1)
        k_o = (other * k.unsqueeze(1)).sum(-1)
        feasible = k_o <= delta
        dist_other = (other - g.unsqueeze(1)).pow(2).sum(-1)
        dist_z = (z - g).pow(2).sum(-1, keepdim=True).expand_as(dist_other)
        assert bool((dist_z[feasible] <= dist_other[feasible] + 1e-9).all())

    def test_duplicating_the_batch_does_not_change_per_sample_directions(self):
        # The constraint is per sample: the adjusted direction of a sample does not depend on
        # how many other samples share the batch (catches batch-mean scaling of g).
        gen = torch.Generator().manual_seed(2)
        g = torch.randn(4, 3, generator=gen, dtype=torch.float64) * 3
        k = torch.randn(4, 3, generator=gen, dtype=torch.float64)
        single = trust_region_step(g, k, 1.0)
        doubled = trust_region_step(torch.cat([g, g]), torch.cat([k, k]), 1.0)
        torch.testing.assert_close(doubled, torch.cat([single, single]))

    def test_bad_input(self):
        with pytest.raises(ValueError, match=r"k.*\(3,\)|g.*\(2,\)"):
            trust_region_step(t(1.0, 2.0), t(1.0, 2.0, 3.0))
        with pytest.raises(ValueError, match="delta"):
            trust_region_step(t(1.0), t(1.0), -1.0)


class TestTrustRegionLoss:
    def test_surrogate_gradient_is_minus_z_star(self):
        # ∂/∂φ [−J(φ) + sg(λ)·KL(π_avg ‖ π_φ)] = −g + λk = −z*, per sample, with φ = probs.
        gen = torch.Generator().manual_seed(3)
        probs = torch.rand(6, 4, generator=gen, dtype=torch.float64).softmax(-1)
        probs.requires_grad_()
        avg = torch.rand(6, 4, generator=gen, dtype=torch.float64).softmax(-1)
        weights = torch.randn(6, 4, generator=gen, dtype=torch.float64) * 5
        objective = (weights * probs.log()).sum(-1, keepdim=True)  # J_t, per sample
        (g,) = torch.autograd.grad(objective.sum(), probs, retain_graph=True)
        kl = (avg * (avg.log() - probs.log())).sum(-1, keepdim=True)
        (k_autograd,) = torch.autograd.grad(kl.sum(), probs, retain_graph=True)
        k = categorical_kl_gradient(avg, probs)
        torch.testing.assert_close(k, k_autograd)
        surrogate = -objective + trust_region_loss(kl, g, k, delta=0.1)
        (grad,) = torch.autograd.grad(surrogate.sum(), probs)
        torch.testing.assert_close(grad, -trust_region_step(g, k, 0.1))
        assert bool((trust_region_multiplier(g, k, 0.1) > 0).any())

    def test_average_equal_to_current_policy_leaves_parameter_gradient_unchanged(self):
        # φ = probs, π_avg = π: k = −𝟙, annihilated by the softmax Jacobian (Jᵀ𝟙 = 0).
        gen = torch.Generator().manual_seed(4)
        logits = torch.randn(5, 3, generator=gen, dtype=torch.float64, requires_grad=True)
        weights = torch.randn(5, 3, generator=gen, dtype=torch.float64) * 4

        def grad_wrt_logits(with_trust_region: bool) -> torch.Tensor:
            probs = logits.softmax(-1)
            objective = (weights * probs.log()).sum(-1, keepdim=True)
            loss = -objective
            if with_trust_region:
                (g,) = torch.autograd.grad(objective.sum(), probs, retain_graph=True)
                avg = probs.detach()
                k = categorical_kl_gradient(avg, probs)
                torch.testing.assert_close(k, -torch.ones_like(k))
                kl = (avg * (avg.log() - probs.log())).sum(-1, keepdim=True)
                loss = loss + trust_region_loss(kl, g, k, delta=0.0)
            (grad,) = torch.autograd.grad(loss.sum(), logits)
            return grad

        torch.testing.assert_close(grad_wrt_logits(True), grad_wrt_logits(False))

    def test_kl_shape_must_match(self):
        with pytest.raises(ValueError, match=r"kl must have shape"):
            trust_region_loss(torch.zeros(3), torch.zeros(3, 2), torch.zeros(3, 2))


class TestKLGradients:
    def test_normal_kl_gradient_matches_autograd(self):
        gen = torch.Generator().manual_seed(5)
        m_a, m = torch.randn(2, 4, 3, generator=gen, dtype=torch.float64)
        s_a, s = torch.rand(2, 4, 3, generator=gen, dtype=torch.float64) + 0.3
        m.requires_grad_()
        s.requires_grad_()
        kl = torch.distributions.kl_divergence(
            torch.distributions.Normal(m_a, s_a), torch.distributions.Normal(m, s)
        ).sum()
        gm, gs = torch.autograd.grad(kl, (m, s))
        k_loc, k_scale = normal_kl_gradient(m_a, s_a, m, s)
        torch.testing.assert_close(k_loc, gm)
        torch.testing.assert_close(k_scale, gs)

    def test_normal_kl_gradient_is_exactly_zero_at_the_average(self):
        # At N_avg = N the direction must vanish in float32 too (1/σ − σ²/σ³ rounds to ~1e-6,
        # which a δ = 0 trust region would act on).
        gen = torch.Generator().manual_seed(6)
        m = torch.randn(10_000, generator=gen)
        s = torch.rand(10_000, generator=gen) * 2 + 0.05
        k_loc, k_scale = normal_kl_gradient(m, s, m.clone(), s.clone())
        assert (k_loc == 0).all() and (k_scale == 0).all()

    def test_categorical_kl_gradient_shape_mismatch(self):
        with pytest.raises(ValueError, match="probs"):
            categorical_kl_gradient(torch.ones(2, 3), torch.ones(2, 4))


class TestScaledKLGradient:
    def test_equals_the_unscaled_direction_and_multiplier(self):
        gen = torch.Generator().manual_seed(3)
        avg = torch.randn(50, 5, generator=gen, dtype=torch.float64).log_softmax(-1)
        cur = (torch.randn(50, 5, generator=gen, dtype=torch.float64) * 2).log_softmax(-1)
        g = torch.randn(50, 5, generator=gen, dtype=torch.float64)
        k_scaled, log_scale = scaled_categorical_kl_gradient(avg, cur)
        k = categorical_kl_gradient(avg.exp(), cur.exp())
        torch.testing.assert_close(k_scaled * log_scale.exp(), k)
        assert bool((log_scale >= -1e-12).all())  # s ≥ 0: e^(−s) cannot overflow
        for delta in (0.0, 0.1, 1.0):
            torch.testing.assert_close(
                trust_region_multiplier(g, k_scaled, delta, log_scale),
                trust_region_multiplier(g, k, delta),
            )

    def test_log_scale_shape_is_checked(self):
        with pytest.raises(ValueError, match=r"log_scale must have shape \[\*, 1\]"):
            trust_region_multiplier(torch.ones(3, 2), torch.ones(3, 2), 1.0, torch.zeros(3))


def _acer_logit_gradient(logits, average_logits, dtype, delta):
    # One step, three actions, action 0 taken under a uniform behaviour policy.
    from ac_extensions.functional import categorical_acer_losses

    logits = logits.to(dtype).clone().requires_grad_(True)
    out = categorical_acer_losses(
        logits,
        torch.tensor([[[1.0, 3.0, -2.0]]], dtype=dtype),
        average_logits.to(dtype),
        torch.full((1, 1, 1), 2.0, dtype=dtype),
        torch.zeros(1, 1, 1, dtype=torch.long),
        torch.full((1, 1, 3), 1 / 3, dtype=dtype).log(),
        trust_region_delta=delta,
    )
    (out["loss_objective"] + out["loss_entropy"]).backward()
    return logits.grad, float(out["trust_region_active"])


class TestUnderflowingProbabilities:
    """A softmax entry below float32's smallest normal number (e^-200 ≈ 1e-87 is 0 in float32,
    not in float64): the float32 loss must follow the float64 one."""

    logits = torch.tensor([[[0.0, 0.5, -200.0]]])

    def test_only_the_current_policy_underflows(self):
        average = torch.zeros(1, 1, 3)
        grad32, active32 = _acer_logit_gradient(self.logits, average, torch.float32, 0.01)
        grad64, active64 = _acer_logit_gradient(self.logits, average, torch.float64, 0.01)
        assert bool(torch.isfinite(grad32).all())  # was NaN: k = −π_avg/0
        assert active32 == active64
        torch.testing.assert_close(grad32.double(), grad64, rtol=1e-5, atol=1e-7)

    @pytest.mark.parametrize("delta", [0.01, 0.1])
    def test_both_policies_underflow(self, delta):
        # The trust region binds in float64; in float32 k(a) = −0/0 switched it off silently
        # (a gradient ~7× too large here).
        average = torch.tensor([[[4.0, 0.0, -199.0]]])
        grad32, active32 = _acer_logit_gradient(self.logits, average, torch.float32, delta)
        grad64, active64 = _acer_logit_gradient(self.logits, average, torch.float64, delta)
        free64, _ = _acer_logit_gradient(self.logits, average, torch.float64, math.inf)
        assert active64 == 1.0 and active32 == 1.0
        assert float((free64 - grad64).abs().max()) > 0.1  # the constraint matters here
        torch.testing.assert_close(grad32.double(), grad64, rtol=0.01, atol=1e-6)
