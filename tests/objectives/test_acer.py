from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torchrl.modules import set_recurrent_mode
from torchrl.objectives import SoftUpdate

from ac_extensions.objectives import ACERLoss

OBS, ACT = 4, 3


def networks(seed=0):
    torch.manual_seed(seed)
    actor = TensorDictModule(
        torch.nn.Sequential(torch.nn.Linear(OBS, 16), torch.nn.Tanh(), torch.nn.Linear(16, ACT)),
        ["observation"],
        ["logits"],
    )
    qvalue = TensorDictModule(
        torch.nn.Sequential(torch.nn.Linear(OBS, 16), torch.nn.Tanh(), torch.nn.Linear(16, ACT)),
        ["observation"],
        ["action_value"],
    )
    return actor, qvalue


def sequences(shape=(4, 6), seed=0, behavior=None):
    gen = torch.Generator().manual_seed(seed)
    done = torch.zeros(*shape, 1, dtype=torch.bool)
    done[..., 2, :] = True
    terminated = done.clone()
    terminated[0] = False  # row 0: a truncation
    logits = behavior if behavior is not None else torch.randn(*shape, ACT, generator=gen)
    return TensorDict(
        {
            "observation": torch.randn(*shape, OBS, generator=gen),
            "action": torch.randint(ACT, shape, generator=gen),
            ("behavior", "logits"): logits,
            ("next", "observation"): torch.randn(*shape, OBS, generator=gen),
            ("next", "reward"): torch.randn(*shape, 1, generator=gen),
            ("next", "done"): done,
            ("next", "terminated"): terminated,
        },
        batch_size=shape,
    )


def grads(loss, td, keys=("loss_objective", "loss_critic", "loss_entropy")):
    out = loss(td)
    total = sum(out[k] for k in keys)
    params = list(loss.actor_network_params.values(True, True))
    return out, torch.autograd.grad(total, params, allow_unused=True)


def perturb_average(loss, scale=0.5):
    with torch.no_grad():
        for p in loss.target_actor_network_params.values(True, True):
            p.add_(torch.randn_like(p) * scale)


class TestContract:
    def test_scalar_finite_losses_and_detached_diagnostics(self):
        out = ACERLoss(*networks())(sequences())
        for key, value in out.items():
            assert value.shape == torch.Size([]) and torch.isfinite(value), key
            assert value.requires_grad == key.startswith("loss_"), key

    def test_single_sequence_equals_batch_of_one(self):
        loss = ACERLoss(*networks())
        td = sequences((1, 6))
        a, b = loss(td), loss(td[0])
        for key in a.keys():
            torch.testing.assert_close(a[key], b[key])

    def test_set_keys_round_trip(self):
        loss = ACERLoss(*networks())
        td = sequences()
        expected = loss(td)
        loss.set_keys(behavior_logits=("collector", "mu_logits"))
        moved = td.clone()
        moved[("collector", "mu_logits")] = moved.pop(("behavior", "logits"))
        torch.testing.assert_close(loss(moved)["loss_objective"], expected["loss_objective"])
        loss.set_keys(behavior_logits=None)
        assert loss.tensor_keys.behavior_logits == ("behavior", "logits")

    def test_state_dict_round_trip_and_determinism(self):
        loss = ACERLoss(*networks(0))
        other = ACERLoss(*networks(1))
        other.load_state_dict(loss.state_dict())
        td = sequences()
        torch.testing.assert_close(loss(td)["loss_objective"], other(td)["loss_objective"])
        torch.testing.assert_close(loss(td)["loss_critic"], loss(td)["loss_critic"])


class TestIdentities:
    def test_on_policy_gradient_is_actor_critic_with_q_ret_target(self):
        # ρ ≡ 1 (behavior = current policy) and c ≥ 1: no truncation, no bias correction, so
        # ∇ loss_objective = ∇ mean(−(Q^ret − V) log π(a_t|x_t)), trust region off.
        actor, qvalue = networks()
        loss = ACERLoss(actor, qvalue, trust_region_delta=float("inf"), entropy_coeff=0.0)
        td = sequences()
        with torch.no_grad():
            td["behavior", "logits"] = actor(td.clone())["logits"]
        out, (g_w, g_b, *rest) = grads(loss, td, keys=("loss_objective",))
        assert out["ratio_mean"].item() == pytest.approx(1.0, abs=1e-6)
        # Reference: same Q^ret (from the same critic), plain advantage actor-critic loss.
        with torch.no_grad():
            logits = actor(td.clone())["logits"]
            q = qvalue(td.clone())["action_value"]
            pi = logits.softmax(-1)
            v = (pi * q).sum(-1, keepdim=True)
            nxt = td["next"].clone()
            v_next = (actor(nxt)["logits"].softmax(-1) * qvalue(nxt.clone())["action_value"]).sum(
                -1, keepdim=True
            )
        from ac_extensions.functional import retrace_targets

        q_ret = retrace_targets(
            td["next", "reward"],
            q.gather(-1, td["action"].unsqueeze(-1)),
            v,
            v_next,
            torch.ones_like(v),
            td["next", "done"],
            td["next", "terminated"],
            0.99,
        )
        params = list(loss.actor_network_params.values(True, True))
        with loss.actor_network_params.to_module(loss.actor_network):
            logp = loss.actor_network(td.clone())["logits"].log_softmax(-1)
        reference = -((q_ret - v) * logp.gather(-1, td["action"].unsqueeze(-1))).mean()
        expected = torch.autograd.grad(reference, params)
        for a, b in zip((g_w, g_b, *rest), expected, strict=True):
            torch.testing.assert_close(a, b)

    def test_infinite_delta_is_a_no_op(self):
        loss = ACERLoss(*networks())
        perturb_average(loss)
        td = sequences()
        loss.trust_region_delta = float("inf")
        _, g_inf = grads(loss, td)
        loss.trust_region_delta = 1e12  # never binds: kᵀg < δ
        _, g_big = grads(loss, td)
        for a, b in zip(g_inf, g_big, strict=True):
            torch.testing.assert_close(a, b)

    def test_trust_region_binds_and_changes_the_gradient(self):
        loss = ACERLoss(*networks(), trust_region_delta=0.0)
        perturb_average(loss)
        td = sequences()
        out, g_tr = grads(loss, td)
        assert out["trust_region_active"] > 0
        loss.trust_region_delta = float("inf")
        _, g_free = grads(loss, td)
        assert any(not torch.allclose(a, b) for a, b in zip(g_tr, g_free, strict=True))

    def test_average_equal_to_policy_leaves_the_gradient_unchanged(self):
        # At construction π_avg = π: k = −𝟙 is annihilated by the softmax Jacobian.
        loss = ACERLoss(*networks(), trust_region_delta=0.0)
        td = sequences()
        out, g_tr = grads(loss, td)
        assert out["trust_region_active"] > 0  # the constraint is active...
        loss.trust_region_delta = float("inf")
        _, g_free = grads(loss, td)
        for a, b in zip(g_tr, g_free, strict=True):  # ...and changes nothing
            torch.testing.assert_close(a, b)

    def test_duplicating_the_batch_keeps_the_per_sample_trust_region(self):
        loss = ACERLoss(*networks(), trust_region_delta=0.05)
        perturb_average(loss)
        td = sequences()
        out1, g1 = grads(loss, td)
        out2, g2 = grads(loss, torch.cat([td, td]))
        torch.testing.assert_close(out1["trust_region_active"], out2["trust_region_active"])
        for a, b in zip(g1, g2, strict=True):
            torch.testing.assert_close(a, b)

    def test_soft_update_moves_the_average_policy(self):
        loss = ACERLoss(*networks())
        updater = SoftUpdate(loss, eps=0.99)
        before = {k: v.clone() for k, v in loss.target_actor_network_params.items(True, True)}
        optimizer = torch.optim.SGD(loss.parameters(), lr=0.1)
        out = loss(sequences())
        (out["loss_objective"] + out["loss_critic"]).backward()
        optimizer.step()
        updater.step()
        moved = False
        for key, old in before.items():
            new = loss.target_actor_network_params.get(key)
            live = loss.actor_network_params.get(key)
            torch.testing.assert_close(new, 0.99 * old + 0.01 * live.detach())
            moved |= not torch.equal(new, old)
        assert moved


class TestBadInput:
    def test_missing_behavior_logits(self):
        td = sequences().exclude(("behavior", "logits"))
        with pytest.raises(KeyError, match=r"behavior.*logits.*stored at collection"):
            ACERLoss(*networks())(td)

    def test_zero_behavior_probability_for_the_taken_action(self):
        td = sequences()
        td["behavior", "logits"][0, 1, td["action"][0, 1]] = -float("inf")
        with pytest.raises(ValueError, match="behavior probability of the taken action is 0"):
            ACERLoss(*networks())(td)

    def test_mismatched_shapes(self):
        bad = sequences()
        bad["action"] = bad["action"].unsqueeze(-1)
        with pytest.raises(ValueError, match=r"action.*\[4, 6\].*\[4, 6, 1\]"):
            ACERLoss(*networks())(bad)

    def test_nan_reward(self):
        td = sequences()
        td["next", "reward"][2, 3] = float("nan")
        with pytest.raises(ValueError, match=r"reward.*\[4, 6, 1\].*1 non-finite"):
            ACERLoss(*networks())(td)

    def test_q_network_writing_another_key_is_named(self):
        actor, qvalue = networks()
        elsewhere = TensorDictModule(qvalue.module, ["observation"], ["q"])
        with pytest.raises(KeyError, match="the qvalue_network wrote no 'action_value'"):
            ACERLoss(actor, elsewhere)(sequences())


def test_copy_of_actor_is_not_needed():
    # The average policy lives in the loss (target params), not in a separate module.
    actor, qvalue = networks()
    loss = ACERLoss(copy.deepcopy(actor), qvalue)
    assert set(loss.target_actor_network_params.keys(True, True)) == set(
        loss.actor_network_params.keys(True, True)
    )


class TestRetraceEstimator:
    def test_default_is_retrace_with_lambda_one_and_the_loss_gamma(self):
        from ac_extensions.objectives import RetraceEstimator

        loss = ACERLoss(*networks(), gamma=0.95)
        loss(sequences())
        assert isinstance(loss.value_estimator, RetraceEstimator)
        assert float(loss.value_estimator.gamma) == pytest.approx(0.95)
        assert float(loss.value_estimator.lmbda) == 1.0

    def test_string_alias_and_hyperparameters(self):
        from ac_extensions.functional import retrace_targets, retrace_trace

        actor, qvalue = networks()
        loss = ACERLoss(actor, qvalue)
        loss.make_value_estimator("retrace", gamma=0.9, lmbda=0.5)
        td = sequences()
        out = loss(td)
        with torch.no_grad():
            probs = actor(td.clone())["logits"].softmax(-1)
            q = qvalue(td.clone())["action_value"]
            nxt = td["next"].clone()
            v_next = (actor(nxt)["logits"].softmax(-1) * qvalue(nxt.clone())["action_value"]).sum(
                -1, keepdim=True
            )
            a = td["action"].unsqueeze(-1)
            ratio = probs.gather(-1, a) / td["behavior", "logits"].softmax(-1).gather(-1, a)
            expected = retrace_targets(
                td["next", "reward"],
                q.gather(-1, a),
                (probs * q).sum(-1, keepdim=True),
                v_next,
                retrace_trace(ratio, 0.5),
                td["next", "done"],
                td["next", "terminated"],
                0.9,
            )
        torch.testing.assert_close(out["q_ret_mean"], expected.mean())

    def test_setting_gamma_after_a_call_takes_effect(self):
        actor, qvalue = networks()
        loss = ACERLoss(actor, qvalue, gamma=0.99)
        td = sequences()
        before = loss(td.clone())["q_ret_mean"]
        loss.gamma = 0.5  # after the estimator was built by the first call
        assert float(loss.value_estimator.gamma) == 0.5 and loss.gamma == 0.5
        fresh = ACERLoss(actor, qvalue, gamma=0.5)
        torch.testing.assert_close(loss(td.clone())["q_ret_mean"], fresh(td.clone())["q_ret_mean"])
        assert not torch.allclose(before, fresh(td.clone())["q_ret_mean"])
        loss.make_value_estimator("retrace", gamma=0.8)  # and the estimator's γ is the loss's
        assert loss.gamma == pytest.approx(0.8)
        with pytest.raises(ValueError, match="gamma must lie in"):
            loss.gamma = 1.5

    def test_unsupported_estimator(self):
        from torchrl.objectives.utils import ValueEstimators

        with pytest.raises(NotImplementedError, match="ACERLoss"):
            ACERLoss(*networks()).make_value_estimator(ValueEstimators.GAE)


class TestRecurrentBootstrap:
    """Recurrent networks: π and Q at x_{t+1} come from the current weights' own states."""

    @staticmethod
    def collected(seed=0):
        from torchrl.collectors import Collector

        from ac_extensions.modules import make_acer_actor, recurrent_env_transforms
        from ac_extensions.runtime.envs import make_batched_env

        torch.manual_seed(seed)
        actor = make_acer_actor(
            4, 2, torso="mlp", hidden_sizes=(16,), recurrent="lstm", recurrent_size=8
        )
        env = make_batched_env("CartPole-v1", 2, extra_transforms=[recurrent_env_transforms(actor)])
        env.set_seed(seed)
        collector = Collector(env, actor, frames_per_batch=80, total_frames=80)
        batch = next(iter(collector))  # [2, 40]
        collector.shutdown()
        batch["behavior", "logits"] = batch["logits"]
        return actor, batch

    @staticmethod
    def reference(actor, batch):
        """Naive loop with the current weights: π and Q at x_{t+1} from the state after step t."""
        keys = ("recurrent_state_h", "recurrent_state_c")
        carried = {k: batch[k][:, 0] for k in keys}
        logits, q = [], []
        with torch.no_grad(), set_recurrent_mode(False):
            for t in range(batch.shape[1]):
                step = batch[:, t].select("observation", "is_init", *keys)
                init = step["is_init"].unsqueeze(-1)  # a reset starts from the stored zeros
                for k in keys:
                    step[k] = torch.where(init, batch[k][:, t], carried[k])
                out = actor.get_dist_params(step)
                carried = {k: out["next", k] for k in keys}
                later = batch["next"][:, t].select("observation").clone()
                later["is_init"] = torch.zeros_like(step["is_init"])
                for k in keys:
                    later[k] = carried[k]
                later = actor.get_dist_params(later)
                logits.append(later["logits"])
                q.append(later["action_value"])
        return torch.stack(logits, 1), torch.stack(q, 1)

    @pytest.mark.timeout(120)
    @pytest.mark.parametrize("truncate", [False, True])
    def test_next_outputs_follow_the_current_weights(self, truncate):
        actor, batch = self.collected()
        assert bool(batch["next", "done"][:, :-1].any())  # episode ends inside the window
        if truncate:  # x_{t+1} at each end is then bootstrapped from
            batch["next", "terminated"] = torch.zeros_like(batch["next", "terminated"])
        with torch.no_grad():  # weights moved since collection: the stored states are stale
            gen = torch.Generator().manual_seed(1)
            for p in actor.parameters():
                p.add_(0.3 * torch.randn(p.shape, generator=gen))
        loss = ACERLoss(actor, None)
        # stored next states may be anything: they are not read
        stale = batch.clone()
        for k in ("recurrent_state_h", "recurrent_state_c"):
            stale["next", k] = torch.randn_like(stale["next", k])
        with set_recurrent_mode(True):
            *_, next_logits, next_q = loss._outputs(stale)
        expected_logits, expected_q = self.reference(actor, batch)
        torch.testing.assert_close(next_logits, expected_logits, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(next_q, expected_q, atol=1e-5, rtol=1e-4)

    @pytest.mark.timeout(120)
    def test_a_padded_window_bootstraps_its_last_valid_step_from_the_pass(self):
        # Row 0 padded from step 30 (("collector", "mask") False, garbage after it): the
        # outputs at x_30 (the next observation of its last valid step) still come from the
        # state the pass reached after step 29.
        actor, batch = self.collected()
        loss = ACERLoss(actor, None)
        padded = batch.clone()
        mask = torch.ones(batch.shape, dtype=torch.bool)
        mask[0, 30:] = False
        padded["collector", "mask"] = mask
        padded["observation"][0, 30:] = 9.0
        padded["next", "observation"][0, 30:] = 9.0
        with set_recurrent_mode(True):
            prepared = loss._prepare(padded)
            *_, next_logits, next_q = loss._outputs(prepared.td)
        expected_logits, expected_q = self.reference(actor, batch)
        torch.testing.assert_close(next_logits[0, 29], expected_logits[0, 29], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(next_q[0, 29], expected_q[0, 29], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(next_q[1], expected_q[1], atol=1e-5, rtol=1e-4)
