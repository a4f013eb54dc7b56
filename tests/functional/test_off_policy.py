from __future__ import annotations

import math

import pytest
import torch

from ac_extensions.functional import (
    acer_trace,
    continuous_acer_trace,
    importance_ratio,
    opc_trace,
    retrace_targets,
    retrace_trace,
    tree_backup_trace,
)
from tests import _reference as reference
from tests._helpers import col, flags

RETRACE_KEYS = (
    "reward",
    "chosen_action_value",
    "state_value",
    "next_state_value",
    "trace",
    "done",
    "terminated",
)


def retrace_inputs(window: dict) -> dict:
    return {k: window[k] for k in RETRACE_KEYS}


def scalar_reference(fn, window: dict, gamma):
    """Call a reference Retrace loop on a random window's scalar inputs."""
    keys = ("reward", "chosen_action_value", "next_state_value", "trace", "done", "terminated")
    return fn(*(window[k] for k in keys), gamma)


def paper_case(**overrides):
    """A Retrace case small enough to check by hand (B = 1, T = 3, A = 2, γ = 0.9).

    Q(x_s, ·) = [1, 2] for every s, π = [.5, .5] so V = 1.5; actions a = [0, 1, 0, (1)] so
    Q(x_t, a_t) = [1, 2, 1]; µ(a_s|x_s) = 0.25 so ρ = 2 and c = min(1, ρ) = 1; r = [1, 0, 2].
    """
    inputs = dict(
        reward=col(1.0, 0.0, 2.0),
        chosen_action_value=col(1.0, 2.0, 1.0),
        state_value=col(1.5, 1.5, 1.5),
        next_state_value=col(1.5, 1.5, 1.5),
        trace=acer_trace(col(2.0, 2.0, 2.0)),
        done=flags(0, 0, 0),
        terminated=flags(0, 0, 0),
    )
    return inputs | overrides


class TestRetraceTargetsHandComputed:
    def test_paper_case(self):
        # G_2 = 2 + .9·1.5 = 3.35
        # G_1 = 0 + .9·(1.5 + 1·(3.35 − Q(x_2, a_2) = 1)) = 3.465
        # G_0 = 1 + .9·(1.5 + 1·(3.465 − Q(x_1, a_1) = 2)) = 3.6685
        out = retrace_targets(**paper_case(), gamma=0.9)
        torch.testing.assert_close(out, col(3.6685, 3.465, 3.35))

    def test_zero_trace_is_one_step_expected_sarsa(self):
        # c ≡ 0: G_t = r_t + γ V(x_{t+1}) = [1 + 1.35, 0 + 1.35, 2 + 1.35]
        out = retrace_targets(**paper_case(trace=col(0.0, 0.0, 0.0)), gamma=0.9)
        torch.testing.assert_close(out, col(2.35, 1.35, 3.35))

    def test_terminal_in_the_middle(self):
        # done_1 = term_1: G_1 = r_1 = 0; G_0 = 1 + .9·(1.5 + (0 − 2)) = 0.55; G_2 unchanged.
        end = flags(0, 1, 0)
        out = retrace_targets(**paper_case(done=end, terminated=end), gamma=0.9)
        torch.testing.assert_close(out, col(0.55, 0.0, 3.35))

    def test_truncation_bootstraps_from_the_truncated_next_observation(self):
        # done_1 = 1, term_1 = 0. Row 2 is a new episode: its reset observation has V = 100 and
        # its Q(x_2, a_2) = 50; neither may leak into row 1. V of row 1's truncated next
        # observation is 1.5 (next_state_value[1]).
        # G_1 = 0 + .9·1.5 = 1.35; G_0 = 1 + .9·(1.5 + (1.35 − 2)) = 1.765; G_2 = 2 + .9·1.5.
        out = retrace_targets(
            **paper_case(
                done=flags(0, 1, 0),
                chosen_action_value=col(1.0, 2.0, 50.0),
                state_value=col(1.5, 1.5, 100.0),
            ),
            gamma=0.9,
        )
        torch.testing.assert_close(out, col(1.765, 1.35, 3.35))

    def test_unit_trace_with_q_constant_over_actions_is_discounted_return(self):
        # Q ≡ V ≡ 1.5, c ≡ 1: G_2 = 3.35; G_1 = .9·(1.5 + 3.35 − 1.5) = 3.015;
        # G_0 = 1 + .9·(1.5 + 3.015 − 1.5) = 3.7135 = 1 + .9·0 + .81·2 + .729·1.5.
        out = retrace_targets(
            **paper_case(chosen_action_value=col(1.5, 1.5, 1.5), trace=col(1.0, 1.0, 1.0)),
            gamma=0.9,
        )
        torch.testing.assert_close(out, col(3.7135, 3.015, 3.35))

    def test_terminal_last_step_does_not_bootstrap(self):
        # By hand: r = (1, 0, 2), Q = V = 0, V(x_3) = 4, γ = 0.5, terminal at t = 2:
        # G_2 = 2; G_1 = .5·(0 + 1·(2 − 0)) = 1; G_0 = 1 + .5·(0 + 1·(1 − 0)) = 1.5
        end = flags(0, 0, 1)
        zeros = col(0.0, 0.0, 0.0)
        out = retrace_targets(
            col(1.0, 0.0, 2.0),
            zeros,
            zeros,
            col(0.0, 0.0, 4.0),
            col(1.0, 1.0, 1.0),
            end,
            end,
            gamma=0.5,
        )
        torch.testing.assert_close(out, col(1.5, 1.0, 2.0))

    def test_window_end_reads_next_state_value_at_t_minus_1(self):
        # Only next_state_value[T − 1] can bootstrap the last row: G_2 = 2 + .9·10 = 11.
        out = retrace_targets(**paper_case(next_state_value=col(1.5, 1.5, 10.0)), gamma=0.9)
        assert out[-1, 0].item() == pytest.approx(11.0)


class TestRetraceTargetsGolden:
    def test_rlax_retrace_golden_values(self):
        # rlax value_learning_test.py::RetraceTest (same data as trfl retrace_ops_test.py).
        # rlax is per-sequence "tm1/t": it passes q_tm1 = qs[:, :-1], q_t = targnet_qs[:, 1:],
        # r_t = rewards[:, :-1], discount_t = pcontinues[:, :-1], pi_t / mu_t at [:, 1:].
        # In our alignment, row t is transition t (t = 0..2): the bootstrap V(x_{t+1}) and the
        # correction's Q(x_{t+1}, a_{t+1}) both come from the target network; pcontinue (γ
        # with terminations folded in) is a per-step γ tensor; expected is ½ (G − Q_online)².
        qs = torch.tensor(
            [
                [[1.1, 2.1], [-1.1, 1.1], [3.1, -3.1], [-1.2, 0.0]],
                [[2.1, 3.1], [9.5, 0.1], [-2.1, -1.1], [0.1, 7.4]],
            ]
        )
        targnet_qs = torch.tensor(
            [
                [[1.2, 2.2], [-1.2, 0.2], [2.2, -1.2], [-2.25, -6.0]],
                [[4.2, 2.2], [1.2, 1.2], [-1.2, -2.2], [1.5, 1.0]],
            ]
        )
        actions = torch.tensor([[0, 1, 0, 0], [1, 0, 0, 1]])
        rewards = torch.tensor([[-1.3, -1.3, 2.3, 42.0], [1.3, 5.3, -3.3, -5.0]])
        pcontinues = torch.tensor([[0.0, 0.89, 0.85, 0.99], [0.88, 1.0, 0.83, 0.95]])
        pi = torch.tensor(
            [
                [[0.5, 0.5], [0.2, 0.8], [0.6, 0.4], [0.9, 0.1]],
                [[0.1, 0.9], [1.0, 0.0], [0.3, 0.7], [0.7, 0.3]],
            ]
        )
        mu_taken = torch.tensor([[0.5, 0.1, 0.9, 0.3], [0.4, 0.6, 1.0, 0.9]])
        expected = torch.tensor(
            [[2.8800001, 3.8934109, 4.5942383], [3.1121615e-1, 2.0253206e1, 3.1601219e-3]]
        )

        a = actions.unsqueeze(-1)
        target_values = (pi * targnet_qs).sum(-1, keepdim=True)  # V_targ(x_s)  [B, 4, 1]
        target_chosen = targnet_qs.gather(-1, a)  # Q_targ(x_s, a_s)         [B, 4, 1]
        ratio = pi.gather(-1, a) / mu_taken.unsqueeze(-1)
        trace = retrace_trace(ratio, lmbda=0.9)
        no = torch.zeros(2, 3, 1, dtype=torch.bool)
        g = retrace_targets(
            reward=rewards[:, :-1, None],
            chosen_action_value=target_chosen[:, :-1],
            state_value=target_values[:, :-1],
            next_state_value=target_values[:, 1:],
            trace=trace[:, :-1],
            done=no,
            terminated=no,
            gamma=pcontinues[:, :-1, None],
        )
        td = g - qs.gather(-1, a)[:, :-1]
        torch.testing.assert_close(0.5 * td.squeeze(-1).square(), expected, rtol=1e-5, atol=1e-6)


class TestRetraceTargetsDifferential:
    @pytest.mark.parametrize("batch_shape", [(), (3,), (2, 3)])
    @pytest.mark.parametrize("done_pattern", ["none", "mid", "last"])
    def test_matches_naive_loop(self, batch_shape, done_pattern):
        w = reference.random_window(batch_shape, time=7, done_pattern=done_pattern, seed=1)
        out = retrace_targets(**retrace_inputs(w), gamma=0.97)
        expected = scalar_reference(reference.retrace_targets, w, 0.97)
        torch.testing.assert_close(out, expected)

    @pytest.mark.parametrize("batch_shape", [(), (3,), (2, 3)])
    def test_matches_td_error_form(self, batch_shape):
        # Recursion == Σ_s (Π γ'c') δ_s, the TD-error form of Retrace (Munos et al., 2016,
        # arXiv:1606.02647), including done masks.
        w = reference.random_window(batch_shape, time=9, done_pattern="mid", seed=2)
        out = retrace_targets(**retrace_inputs(w), gamma=0.9)
        expected = scalar_reference(reference.retrace_targets_td_form, w, 0.9)
        torch.testing.assert_close(out, expected)

    def test_per_step_gamma_tensor(self):
        w = reference.random_window((4,), time=6, seed=3)
        gamma = torch.rand(4, 6, 1, dtype=torch.float64)
        out = retrace_targets(**retrace_inputs(w), gamma=gamma)
        expected = scalar_reference(reference.retrace_targets, w, gamma)
        torch.testing.assert_close(out, expected)

    def test_float32_matches_float64(self):
        w = reference.random_window((5,), time=20, seed=4)
        w32 = {k: (v.float() if v.is_floating_point() else v) for k, v in w.items()}
        out32 = retrace_targets(**retrace_inputs(w32), gamma=0.99)
        out64 = retrace_targets(**retrace_inputs(w), gamma=0.99)
        torch.testing.assert_close(out32, out64.float(), rtol=1e-5, atol=1e-5)

    def test_single_step_window(self):
        w = reference.random_window((3,), time=1, done_pattern="none", seed=5)
        out = retrace_targets(**retrace_inputs(w), gamma=0.5)
        torch.testing.assert_close(out, w["reward"] + 0.5 * w["next_state_value"])


class TestRetraceTargetsIdentities:
    @pytest.mark.parametrize("done_pattern", ["none", "mid"])
    def test_zero_trace_is_one_step_target(self, done_pattern):
        w = reference.random_window((2, 3), time=8, done_pattern=done_pattern, seed=6)
        w["trace"] = torch.zeros_like(w["trace"])
        out = retrace_targets(**retrace_inputs(w), gamma=0.9)
        expected = w["reward"] + 0.9 * (~w["terminated"]) * w["next_state_value"]
        torch.testing.assert_close(out, expected)

    def test_unit_trace_and_constant_q_give_discounted_return(self):
        # c ≡ 1 and Q(x, ·) = V(x): the corrections cancel, leaving Σ γ^k r_{t+k} plus
        # γ^n V(x_{t+n}) at the first episode end or window end (0 if terminal).
        w = reference.random_window((3,), time=9, done_pattern="mid", seed=7)
        gamma = 0.8
        w["trace"] = opc_trace(w["trace"])
        # Q(x_{t+1}, a_{t+1}) = V(x_{t+1}) inside a trajectory.
        w["chosen_action_value"] = w["state_value"]
        cont = ~w["done"][:, :-1]
        w["next_state_value"][:, :-1] = torch.where(
            cont, w["state_value"][:, 1:], w["next_state_value"][:, :-1]
        )
        out = retrace_targets(**retrace_inputs(w), gamma=gamma)
        expected = torch.zeros_like(out)
        for b in range(3):
            for t in range(9):
                total, disc = 0.0, 1.0
                for s in range(t, 9):
                    total += disc * float(w["reward"][b, s])
                    disc *= gamma
                    if bool(w["done"][b, s]) or s == 8:
                        if not bool(w["terminated"][b, s]):
                            total += disc * float(w["next_state_value"][b, s])
                        break
                expected[b, t] = total
        torch.testing.assert_close(out, expected)

    def test_on_policy_control_variate_identity(self):
        # With c ≡ 1 (on-policy, ρ = 1) and no episode end,
        # Q^ret_t − [n-step return to the window end]
        #     = Σ_{k≥1} γ^k (V(x_{t+k}) − Q(x_{t+k}, a_{t+k}))
        # where the n-step return bootstraps with γ^{T−t} V(x_T). Exact for any Q.
        w = reference.random_window((2,), time=6, done_pattern="none", seed=8)
        gamma, T = 0.9, 6
        w["trace"] = torch.ones_like(w["trace"])
        out = retrace_targets(**retrace_inputs(w), gamma=gamma)
        v = w["state_value"][..., 0]
        q = w["chosen_action_value"][..., 0]
        for t in range(T):
            n_step = sum(gamma ** (s - t) * w["reward"][:, s, 0] for s in range(t, T))
            n_step = n_step + gamma ** (T - t) * w["next_state_value"][:, T - 1, 0]
            correction = torch.zeros(2, dtype=torch.float64)
            for s in range(t + 1, T):
                correction += gamma ** (s - t) * (v[:, s] - q[:, s])
            torch.testing.assert_close(out[:, t, 0] - n_step, correction)


class TestRetraceTargetsGradient:
    def test_targets_carry_no_gradient(self):
        inputs = paper_case()
        for key in ("reward", "chosen_action_value", "state_value", "next_state_value", "trace"):
            inputs[key] = inputs[key].clone().requires_grad_()
        out = retrace_targets(**inputs, gamma=0.9)
        assert not out.requires_grad
        assert out.grad_fn is None


class TestRetraceTargetsBadInput:
    def test_mismatched_time(self):
        with pytest.raises(ValueError, match=r"reward.*\(3,\).*|.*trace.*\(2,\)"):
            retrace_targets(**paper_case(trace=col(1.0, 1.0)), gamma=0.9)

    def test_mismatched_batch_dims_name_shapes(self):
        inputs = {k: v.expand(2, 3, 1) for k, v in paper_case().items()}
        inputs["reward"] = torch.zeros(3, 3, 1, dtype=torch.float64)
        with pytest.raises(ValueError) as err:
            retrace_targets(**inputs, gamma=0.9)
        assert "chosen_action_value" in str(err.value)
        assert "(2, 3)" in str(err.value) and "(3, 3)" in str(err.value)

    def test_missing_feature_dim(self):
        inputs = paper_case(reward=torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64))
        with pytest.raises(ValueError, match="reward"):
            retrace_targets(**inputs, gamma=0.9)

    def test_wrong_feature_dim(self):
        inputs = paper_case(chosen_action_value=torch.zeros(3, 2, dtype=torch.float64))
        with pytest.raises(ValueError, match=r"chosen_action_value.*\(3, 2\)"):
            retrace_targets(**inputs, gamma=0.9)

    def test_float_done(self):
        with pytest.raises(ValueError, match="done must be a bool tensor"):
            retrace_targets(**paper_case(done=col(0.0, 0.0, 0.0)), gamma=0.9)

    def test_zero_length_window(self):
        empty = {k: v[:0] for k, v in paper_case().items()}
        with pytest.raises(ValueError, match="T = 0"):
            retrace_targets(**empty, gamma=0.9)

    @pytest.mark.parametrize("gamma", [-0.1, 1.5, math.nan])
    def test_gamma_out_of_range(self, gamma):
        with pytest.raises(ValueError, match="gamma"):
            retrace_targets(**paper_case(), gamma=gamma)

    def test_gamma_tensor_that_would_broadcast_up(self):
        with pytest.raises(ValueError, match="gamma"):
            retrace_targets(**paper_case(), gamma=torch.full((2, 3, 1), 0.9))

    def test_negative_trace(self):
        with pytest.raises(ValueError, match="trace must be >= 0"):
            retrace_targets(**paper_case(trace=col(1.0, -0.5, 1.0)), gamma=0.9)


class TestTraces:
    def test_retrace_trace(self):
        ratio = col(0.0, 0.5, 2.0, math.inf)
        torch.testing.assert_close(retrace_trace(ratio, lmbda=0.5), col(0.0, 0.25, 0.5, 0.5))

    def test_acer_trace_is_lambda_one(self):
        ratio = col(0.2, 1.0, 7.0)
        torch.testing.assert_close(acer_trace(ratio), col(0.2, 1.0, 1.0))

    def test_continuous_acer_trace_takes_the_dth_root(self):
        # d = 3: ρ = 0.125 → 0.5; ρ = 8 → min(1, 2) = 1; ρ = 0.001 → 0.1
        out = continuous_acer_trace(col(0.125, 8.0, 0.001), action_dim=3)
        torch.testing.assert_close(out, col(0.5, 1.0, 0.1))

    def test_tree_backup_trace(self):
        torch.testing.assert_close(tree_backup_trace(col(0.2, 1.0), lmbda=0.5), col(0.1, 0.5))

    def test_opc_trace(self):
        torch.testing.assert_close(opc_trace(col(3.0, -1.0)), col(1.0, 1.0))

    def test_traces_are_detached(self):
        ratio = col(0.5, 2.0).requires_grad_()
        assert not retrace_trace(ratio).requires_grad
        assert not continuous_acer_trace(ratio, 2).requires_grad

    def test_importance_ratio(self):
        out = importance_ratio(col(0.5, 0.1).log(), col(0.25, 0.4).log())
        torch.testing.assert_close(out, col(2.0, 0.25))

    def test_zero_behavior_probability_gives_unit_trace(self):
        ratio = importance_ratio(col(0.5).log(), col(0.0).log())
        assert math.isinf(ratio.item())
        assert acer_trace(ratio).item() == 1.0

    @pytest.mark.parametrize("bad", [-0.1, 1.1])
    def test_lambda_out_of_range(self, bad):
        with pytest.raises(ValueError, match="lmbda"):
            retrace_trace(col(1.0), lmbda=bad)

    def test_negative_ratio(self):
        with pytest.raises(ValueError, match="ratio"):
            acer_trace(col(-1.0))

    def test_bad_action_dim(self):
        with pytest.raises(ValueError, match="action_dim"):
            continuous_acer_trace(col(1.0), action_dim=0)

    def test_importance_ratio_shape_mismatch(self):
        with pytest.raises(ValueError, match="behavior_log_prob"):
            importance_ratio(col(0.0, 0.0), col(0.0))
