from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ac_extensions.functional import (
    categorical_projection,
    distributional_retrace_targets,
    retrace_targets,
)
from ac_extensions.functional import distributional as distributional_module
from tests import _reference as reference
from tests._helpers import col, flags

SUPPORT3 = torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64)


def one_hot(index: int, n: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(index), n).double()


class TestCategoricalProjectionHandComputed:
    @pytest.mark.parametrize(
        ("position", "expected"),
        [
            (0.3, [0.7, 0.3, 0.0]),  # 0.3 of the way from z_0 to z_1
            (1.0, [0.0, 1.0, 0.0]),  # exactly on z_1: no mass lost (the floor == ceil bug)
            (-5.0, [1.0, 0.0, 0.0]),  # clipped to v_min
            (2.5, [0.0, 0.0, 1.0]),  # clipped to v_max
            (2.0, [0.0, 0.0, 1.0]),  # exactly on the last atom
        ],
    )
    def test_point_mass(self, position, expected):
        out = categorical_projection(
            torch.tensor([position], dtype=torch.float64),
            torch.tensor([1.0], dtype=torch.float64),
            SUPPORT3,
        )
        torch.testing.assert_close(out, torch.tensor(expected, dtype=torch.float64))

    def test_non_uniform_support(self):
        # support [0, 1, 3]: y = 2 sits halfway between 1 and 3 → [0, .5, .5]
        support = torch.tensor([0.0, 1.0, 3.0], dtype=torch.float64)
        out = categorical_projection(
            torch.tensor([2.0], dtype=torch.float64),
            torch.tensor([2.0], dtype=torch.float64),
            support,
        )
        torch.testing.assert_close(out, torch.tensor([0.0, 1.0, 1.0], dtype=torch.float64))

    def test_rlax_l2_project_golden(self):
        # rlax value_learning_test.py::L2ProjectTest: signed, unnormalised weights; the
        # support differs per row in rlax, so project row by row.
        old = torch.arange(-1.0, 1.0, 0.25, dtype=torch.float64)
        old = torch.stack([old, old + 1.0])
        weights = old.clone()
        weights[0, ::2] = 0.0
        weights[1, 1::2] = 0.0
        new = torch.arange(-1.0, 1.0, 0.5, dtype=torch.float64)
        new = torch.stack([new, new + 1.0])
        expected = torch.tensor(
            [[-0.375, -0.5, 0.0, 0.875], [0.0, 0.5, 1.0, 1.5]], dtype=torch.float64
        )
        out = torch.stack([categorical_projection(old[i], weights[i], new[i]) for i in range(2)])
        torch.testing.assert_close(out, expected)


class TestCategoricalProjectionProperties:
    def test_identity_on_its_own_support(self):
        # float32 linspace has inexact Δz: atoms must still land on their own bin.
        support = torch.linspace(-10.0, 10.0, 51)
        weights = torch.rand(4, 51)
        out = categorical_projection(support.expand(4, 51), weights, support)
        assert torch.equal(out, weights)

    def test_uniform_fast_path_matches_the_search_path(self):
        # A uniform support takes the arithmetic path; the same points with a tiny bump in the
        # last gap take the searchsorted path. Away from that gap they must agree.
        uniform = torch.linspace(-3.0, 3.0, 13, dtype=torch.float64)
        bumped = uniform.clone()
        bumped[-1] += 1e-3
        atoms = torch.rand(50, 40, dtype=torch.float64) * 5.0 - 3.5  # some clipped at −3
        weights = torch.randn(50, 40, dtype=torch.float64)
        fast = categorical_projection(atoms, weights, uniform)
        slow = categorical_projection(atoms, weights, bumped)
        torch.testing.assert_close(fast, slow)
        on_grid = categorical_projection(uniform.expand(3, 13), torch.ones(3, 13), uniform.float())
        assert torch.equal(on_grid, torch.ones(3, 13))

    def test_conserves_signed_mass(self):
        atoms = torch.randn(5, 30, dtype=torch.float64) * 3
        weights = torch.randn(5, 30, dtype=torch.float64)
        out = categorical_projection(atoms, weights, torch.linspace(-2, 2, 9, dtype=torch.float64))
        torch.testing.assert_close(out.sum(-1), weights.sum(-1))

    def test_preserves_mean_inside_the_support(self):
        support = torch.linspace(-5, 5, 11, dtype=torch.float64)
        atoms = torch.rand(6, 20, dtype=torch.float64) * 10 - 5
        weights = torch.randn(6, 20, dtype=torch.float64)
        out = categorical_projection(atoms, weights, support)
        torch.testing.assert_close((out * support).sum(-1), (weights * atoms).sum(-1))

    def test_linear_in_the_weights(self):
        support = torch.linspace(-1, 1, 5, dtype=torch.float64)
        atoms = torch.randn(3, 8, dtype=torch.float64)
        w1, w2 = torch.randn(2, 3, 8, dtype=torch.float64)
        lhs = categorical_projection(atoms, 2.0 * w1 - 3.0 * w2, support)
        rhs = 2.0 * categorical_projection(atoms, w1, support) - 3.0 * categorical_projection(
            atoms, w2, support
        )
        torch.testing.assert_close(lhs, rhs)

    @pytest.mark.parametrize("batch_shape", [(), (3,), (2, 3)])
    def test_matches_dense_kernel_reference(self, batch_shape):
        gen = torch.Generator().manual_seed(0)
        support = torch.sort(torch.randn(7, generator=gen, dtype=torch.float64)).values
        atoms = torch.randn(*batch_shape, 12, generator=gen, dtype=torch.float64) * 2
        weights = torch.randn(*batch_shape, 12, generator=gen, dtype=torch.float64)
        out = categorical_projection(atoms, weights, support)
        torch.testing.assert_close(out, reference.categorical_projection(atoms, weights, support))

    def test_gradient_with_respect_to_weights_is_the_kernel(self):
        atoms = torch.tensor([0.3, 1.0, 1.75], dtype=torch.float64)
        weights = torch.ones(3, dtype=torch.float64, requires_grad=True)
        jac = torch.autograd.functional.jacobian(
            lambda w: categorical_projection(atoms, w, SUPPORT3), weights
        )
        expected = torch.tensor(
            [[0.7, 0.0, 0.0], [0.3, 1.0, 0.25], [0.0, 0.0, 0.75]], dtype=torch.float64
        )
        torch.testing.assert_close(jac, expected)


class TestCategoricalProjectionBadInput:
    @pytest.mark.parametrize(
        "support",
        [
            torch.tensor([0.0, 0.0, 1.0]),
            torch.tensor([1.0, 0.0]),
            torch.tensor([1.0]),
            torch.zeros(2, 3),
        ],
    )
    def test_bad_support(self, support):
        with pytest.raises(ValueError, match="support"):
            categorical_projection(torch.zeros(2), torch.zeros(2), support)

    def test_shape_mismatch(self):
        with pytest.raises(ValueError, match=r"atoms.*\(3,\).*weights.*\(2,\)"):
            categorical_projection(torch.zeros(3), torch.zeros(2), SUPPORT3.float())


def collapsed(w: dict) -> dict:
    return dict(
        reward=w["reward"],
        chosen_atom_probs=w["chosen_atom_probs"],
        next_expected_atom_probs=w["next_expected_atom_probs"],
        trace=w["trace"],
        done=w["done"],
        terminated=w["terminated"],
    )


class TestDistributionalRetraceHandComputed:
    def test_point_mass_critic_gives_a_signed_histogram(self):
        # support z = [0, 1, 2, 3], γ = 1, r = [1, 0], c_1 = 0.5.
        # x_1: q̄_0 = δ_1 (expected next distribution), q(x_1, a_1) = δ_0; x_2: q̄_1 = δ_1.
        # t = 0:  u = 0: P = 1, shift G = 1, Γ = 1: (δ_1 − 0.5 δ_0) moved by +1 → +1 at 2, −.5 at 1
        #         u = 1: P = c_1 = .5, G = 1 + 0, Γ = 1: .5 δ_1 moved by +1 → +.5 at 2
        #         q*_0 = [0, −0.5, 1.5, 0]   (mean 2.5 = scalar Retrace: 1 + [1 + .5(1 − 0)])
        # t = 1:  u = 1: δ_1 moved by 0 → q*_1 = [0, 1, 0, 0]
        support = torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=torch.float64)
        out = distributional_retrace_targets(
            reward=col(1.0, 0.0),
            chosen_atom_probs=torch.stack([one_hot(2, 4), one_hot(0, 4)]),
            next_expected_atom_probs=torch.stack([one_hot(1, 4), one_hot(1, 4)]),
            trace=col(1.0, 0.5),
            done=flags(0, 0),
            terminated=flags(0, 0),
            gamma=1.0,
            support=support,
        )
        expected = torch.tensor([[0.0, -0.5, 1.5, 0.0], [0.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
        torch.testing.assert_close(out, expected)

    def test_single_step_is_expected_sarsa_c51(self):
        # T = 1: α_{1,a} = π(a|x_1), target = Φ[Σ_a π(a|x_1) (r_0 + γ Z(x_1, a))].
        # r = 0.5, γ = 0.5, q̄ = [.2, .3, .5] on [0, 1, 2] → atoms at .5, 1, 1.5.
        # .2 at .5 → .1/.1; .3 at 1 → .3 on z_1; .5 at 1.5 → .25/.25 → [.1, .65, .25]
        out = distributional_retrace_targets(
            col(0.5),
            torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64),
            torch.tensor([[0.2, 0.3, 0.5]], dtype=torch.float64),
            col(1.0),
            flags(0),
            flags(0),
            0.5,
            SUPPORT3,
        )
        torch.testing.assert_close(out, torch.tensor([[0.1, 0.65, 0.25]], dtype=torch.float64))

    def test_terminal_first_step_is_a_point_mass_at_the_reward(self):
        # term_0: the target of row 0 is δ_{r_0} projected; r_0 = 1.25 → [0, .75, .25]
        out = distributional_retrace_targets(
            col(1.25, 0.0),
            torch.full((2, 3), 1 / 3, dtype=torch.float64),
            torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64),
            col(1.0, 1.0),
            flags(1, 0),
            flags(1, 0),
            0.9,
            SUPPORT3,
        )
        torch.testing.assert_close(out[0], torch.tensor([0.0, 0.75, 0.25], dtype=torch.float64))


class TestDistributionalRetraceDifferential:
    @pytest.mark.parametrize("batch_shape", [(), (3,), (2, 3)])
    @pytest.mark.parametrize("done_pattern", ["none", "mid", "last"])
    def test_matches_naive_per_action_mixture(self, batch_shape, done_pattern):
        w = reference.random_window(
            batch_shape, time=5, num_actions=3, num_atoms=7, done_pattern=done_pattern, seed=11
        )
        support = torch.linspace(-1.5, 1.5, 7, dtype=torch.float64)  # some atoms get clipped
        out = distributional_retrace_targets(**collapsed(w), gamma=0.9, support=support)
        expected = reference.distributional_retrace_targets(
            w["reward"],
            w["next_probs"],
            w["next_atom_probs"],
            w["next_action"],
            w["trace"],
            w["done"],
            w["terminated"],
            0.9,
            support,
        )
        torch.testing.assert_close(out, expected)

    def test_chunking_does_not_change_the_result(self, monkeypatch):
        w = reference.random_window((4,), time=9, num_atoms=11, seed=12)
        whole = distributional_retrace_targets(**collapsed(w), gamma=0.95, support=w["support"])
        monkeypatch.setattr(distributional_module, "_MAX_ATOMS_PER_CHUNK", 1)
        chunked = distributional_retrace_targets(**collapsed(w), gamma=0.95, support=w["support"])
        torch.testing.assert_close(chunked, whole)


class TestDistributionalRetraceIdentities:
    @pytest.mark.parametrize("batch_shape", [(), (3,), (2, 3)])
    @pytest.mark.parametrize("done_pattern", ["none", "mid", "last"])
    def test_mean_equals_scalar_retrace_when_nothing_is_clipped(self, batch_shape, done_pattern):
        w = reference.random_window(
            batch_shape, time=8, num_atoms=11, done_pattern=done_pattern, seed=13
        )
        narrow = torch.linspace(-1.0, 1.0, 11, dtype=torch.float64)  # critic's support
        wide = torch.linspace(-20.0, 20.0, 401, dtype=torch.float64)  # target support, no clip
        # Embed the critic's distributions on the wide support (narrow ⊂ wide, on grid points).
        embed = categorical_projection(
            narrow[:, None], torch.ones(11, 1, dtype=torch.float64), wide
        )
        chosen = w["chosen_atom_probs"] @ embed
        next_expected = w["next_expected_atom_probs"] @ embed
        out = distributional_retrace_targets(
            w["reward"], chosen, next_expected, w["trace"], w["done"], w["terminated"], 0.9, wide
        )
        scalar = retrace_targets(
            w["reward"],
            (chosen * wide).sum(-1, keepdim=True),
            w["state_value"],
            (next_expected * wide).sum(-1, keepdim=True),
            w["trace"],
            w["done"],
            w["terminated"],
            0.9,
        )
        torch.testing.assert_close((out * wide).sum(-1, keepdim=True), scalar)
        torch.testing.assert_close(out.sum(-1), torch.ones_like(out.sum(-1)))

    def test_zero_trace_is_one_step_distributional_target(self):
        w = reference.random_window((3,), time=6, num_atoms=9, done_pattern="mid", seed=14)
        w["trace"] = torch.zeros_like(w["trace"])
        out = distributional_retrace_targets(**collapsed(w), gamma=0.8, support=w["support"])
        # One-step expected-SARSA C51: Φ[q̄_t at r_t + γ(1 − term_t) z]
        positions = w["reward"] + 0.8 * (~w["terminated"]) * w["support"]
        expected = categorical_projection(positions, w["next_expected_atom_probs"], w["support"])
        torch.testing.assert_close(out, expected)

    def test_mass_is_one_even_with_negative_entries(self):
        w = reference.random_window((4,), time=10, num_atoms=21, seed=15)
        w["trace"] = torch.ones_like(w["trace"])  # c = 1 > π(a): negative α's appear
        out = distributional_retrace_targets(**collapsed(w), gamma=0.99, support=w["support"])
        torch.testing.assert_close(out.sum(-1), torch.ones(4, 10, dtype=torch.float64))
        assert bool((out < 0).any()), "expected a signed mixture (no silent renormalisation)"

    def test_target_carries_no_gradient(self):
        w = reference.random_window((2,), time=4, seed=16)
        inputs = collapsed(w)
        for key in ("reward", "chosen_atom_probs", "next_expected_atom_probs", "trace"):
            inputs[key] = inputs[key].clone().requires_grad_()
        out = distributional_retrace_targets(**inputs, gamma=0.9, support=w["support"])
        assert not out.requires_grad


class TestDistributionalRetraceBadInput:
    def test_atom_count_must_match_support(self):
        w = reference.random_window((2,), time=4, num_atoms=11, seed=17)
        with pytest.raises(ValueError, match=r"chosen_atom_probs.*11.*|.*\[\*B, T, 9\]"):
            distributional_retrace_targets(
                **collapsed(w), gamma=0.9, support=torch.linspace(-1, 1, 9, dtype=torch.float64)
            )

    def test_batch_dims_must_match(self):
        w = reference.random_window((2,), time=4, seed=18)
        inputs = collapsed(w)
        inputs["chosen_atom_probs"] = inputs["chosen_atom_probs"][:1]
        with pytest.raises(ValueError, match="chosen_atom_probs"):
            distributional_retrace_targets(**inputs, gamma=0.9, support=w["support"])

    def test_decreasing_support(self):
        w = reference.random_window((), time=3, num_atoms=11, seed=19)
        with pytest.raises(ValueError, match="strictly increasing"):
            distributional_retrace_targets(**collapsed(w), gamma=0.9, support=w["support"].flip(0))

    def test_float_terminated(self):
        w = reference.random_window((), time=3, seed=20)
        inputs = collapsed(w)
        inputs["terminated"] = inputs["terminated"].double()
        with pytest.raises(ValueError, match="terminated must be a bool tensor"):
            distributional_retrace_targets(**inputs, gamma=0.9, support=w["support"])

    def test_negative_trace_and_gamma(self):
        w = reference.random_window((), time=3, seed=21)
        inputs = collapsed(w)
        with pytest.raises(ValueError, match="gamma"):
            distributional_retrace_targets(**inputs, gamma=1.01, support=w["support"])
        inputs["trace"] = -inputs["trace"]
        with pytest.raises(ValueError, match="trace"):
            distributional_retrace_targets(**inputs, gamma=0.9, support=w["support"])


class TestCategoricalProjectionProperty:
    @settings(max_examples=60, deadline=None)
    @given(
        gaps=st.lists(st.floats(0.05, 3.0), min_size=1, max_size=8),
        start=st.floats(-5.0, 5.0),
        atoms=st.lists(st.floats(-20.0, 20.0), min_size=1, max_size=12),
        seed=st.integers(0, 2**16),
    )
    def test_mass_and_in_range_mean_are_preserved(self, gaps, start, atoms, seed):
        support = start + torch.tensor([0.0, *gaps], dtype=torch.float64).cumsum(0)
        positions = torch.tensor(atoms, dtype=torch.float64)
        gen = torch.Generator().manual_seed(seed)
        weights = torch.randn(len(atoms), generator=gen, dtype=torch.float64)
        out = categorical_projection(positions, weights, support)
        torch.testing.assert_close(out.sum(), weights.sum())
        clipped = positions.clamp(support[0], support[-1])
        torch.testing.assert_close((out * support).sum(), (weights * clipped).sum())
        torch.testing.assert_close(
            out, reference.categorical_projection(positions, weights, support)
        )
