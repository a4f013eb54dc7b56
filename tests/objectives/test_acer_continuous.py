from __future__ import annotations

import functools
import math

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictModuleBase
from tensordict.nn.distributions import AddStateIndependentNormalScale, NormalParamExtractor
from torchrl.modules import ProbabilisticActor, TanhNormal
from torchrl.objectives import SoftUpdate

from ac_extensions.modules import make_continuous_actor_critic
from ac_extensions.objectives import ContinuousACERLoss
from tests import _reference as ref

OBS, ACT = 4, 2
INF = float("inf")


def networks(d=ACT, seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    actor, critic = make_continuous_actor_critic(OBS, d, hidden_sizes=(16,), init_scale=0.8)
    return actor.to(dtype), critic.to(dtype)


class LinearCritic(TensorDictModuleBase):
    """A deterministic stand-in for the SDN: V(x) = w_vᵀx, Q̃(x, a) = V(x) + w_aᵀ tanh(a) x_0."""

    def __init__(self, d, dtype=torch.float64, obs_dim=OBS):
        super().__init__()
        self.in_keys = ["observation", "action", "loc", "scale"]
        self.out_keys = ["state_value", "action_value"]
        gen = torch.Generator().manual_seed(11)
        self.w_v = torch.nn.Parameter(torch.randn(obs_dim, 1, generator=gen, dtype=dtype))
        self.w_a = torch.nn.Parameter(torch.randn(d, 1, generator=gen, dtype=dtype))

    def value(self, obs):
        return obs @ self.w_v

    def q(self, obs, action):
        return self.value(obs) + (action.tanh() @ self.w_a) * obs[..., :1]

    def forward(self, td):
        td.set("state_value", self.value(td["observation"]))
        if "action" in td.keys():
            td.set("action_value", self.q(td["observation"], td["action"]))
        return td


def sequences(shape=(4, 6), d=ACT, seed=0, dtype=torch.float32, consistent=False):
    """Random [B, T] windows; a terminal at t=2 in every row but row 0 (a truncation there).

    With ``consistent``, ("next", "observation")[t] is observation[t + 1] unless done[t].
    """
    gen = torch.Generator().manual_seed(seed)
    done = torch.zeros(*shape, 1, dtype=torch.bool)
    done[..., 2, :] = True
    terminated = done.clone()
    terminated[0] = False  # row 0: a truncation
    obs = torch.randn(*shape, OBS, generator=gen, dtype=dtype)
    next_obs = torch.randn(*shape, OBS, generator=gen, dtype=dtype)
    if consistent:
        cont = ~done[..., :-1, :]
        next_obs[..., :-1, :] = torch.where(cont, obs[..., 1:, :], next_obs[..., :-1, :])
    behavior_loc = 0.5 * torch.randn(*shape, d, generator=gen, dtype=dtype)
    behavior_scale = 0.4 + torch.rand(*shape, d, generator=gen, dtype=dtype)
    action = behavior_loc + behavior_scale * torch.randn(*shape, d, generator=gen, dtype=dtype)
    return TensorDict(
        {
            "observation": obs,
            "action": action,
            ("behavior", "loc"): behavior_loc,
            ("behavior", "scale"): behavior_scale,
            ("next", "observation"): next_obs,
            ("next", "reward"): torch.randn(*shape, 1, generator=gen, dtype=dtype),
            ("next", "done"): done,
            ("next", "terminated"): terminated,
        },
        batch_size=shape,
    )


def seeded(loss, td, seed=0):
    torch.manual_seed(seed)
    return loss(td)


def grads(loss, td, keys=("loss_objective", "loss_critic", "loss_entropy"), seed=0):
    out = seeded(loss, td, seed)
    total = sum(out[k] for k in keys)
    params = [p for p in loss.actor_network_params.values(True, True) if p.requires_grad]
    return out, torch.autograd.grad(total, params, allow_unused=True)


def perturb_average(loss, scale=0.3):
    with torch.no_grad():
        for p in loss.target_actor_network_params.values(True, True):
            p.add_(torch.randn_like(p) * scale)


def gaussian_pdf(x, m, s):
    return math.exp(-0.5 * ((x - m) / s) ** 2) / (s * math.sqrt(2 * math.pi))


def naive_ratio(action, loc, scale, behavior_loc, behavior_scale):
    """ρ = Π_i N(a_i; m_i, σ_i) / Π_i N(a_i; m_b,i, σ_b,i), one float at a time. [*B, T, 1]."""
    flat = [x.detach().double().reshape(-1, x.shape[-1]) for x in (action, loc, scale)]
    flat += [x.double().reshape(-1, x.shape[-1]) for x in (behavior_loc, behavior_scale)]
    a, m, s, mb, sb = flat
    out = torch.zeros(a.shape[0], dtype=torch.float64)
    for n in range(a.shape[0]):
        pi = mu = 1.0
        for i in range(a.shape[1]):
            pi *= gaussian_pdf(float(a[n, i]), float(m[n, i]), float(s[n, i]))
            mu *= gaussian_pdf(float(a[n, i]), float(mb[n, i]), float(sb[n, i]))
        out[n] = pi / mu
    return out.reshape(*action.shape[:-1], 1)


def current_statistics(loss, td):
    with loss.actor_network_params.to_module(loss.actor_network):
        out = loss.actor_network.get_dist_params(td.select("observation").copy())
    return out["loc"], out["scale"]


class TestContract:
    def test_scalar_finite_losses_and_detached_diagnostics(self):
        out = seeded(ContinuousACERLoss(*networks()), sequences())
        assert set(out.keys()) == set(ContinuousACERLoss(*networks()).out_keys)
        for key, value in out.items():
            assert value.shape == torch.Size([]) and torch.isfinite(value), key
            assert value.requires_grad == key.startswith("loss_"), key

    def test_single_sequence_equals_batch_of_one(self):
        loss = ContinuousACERLoss(*networks())
        td = sequences((1, 6))
        a, b = seeded(loss, td), seeded(loss, td[0])
        for key in a.keys():
            torch.testing.assert_close(a[key], b[key])
        assert loss.targets(td[0])["q_ret"].shape == (6, 1)

    def test_set_keys_round_trip(self):
        loss = ContinuousACERLoss(*networks())
        td = sequences()
        expected = seeded(loss, td)
        loss.set_keys(behavior_loc=("collector", "mu_loc"), behavior_scale="mu_scale")
        moved = td.clone()
        moved["collector", "mu_loc"] = moved.pop(("behavior", "loc"))
        moved["mu_scale"] = moved.pop(("behavior", "scale"))
        for key in ("loss_objective", "loss_critic", "ratio_mean"):
            torch.testing.assert_close(seeded(loss, moved)[key], expected[key])
        # The actor's own loc/scale entries written at collection can serve as µ in place.
        loss.set_keys(behavior_loc="loc", behavior_scale="scale")
        in_place = td.clone()
        in_place["loc"], in_place["scale"] = td["behavior", "loc"], td["behavior", "scale"]
        torch.testing.assert_close(seeded(loss, in_place)["loss_critic"], expected["loss_critic"])
        loss.set_keys(behavior_loc=None, behavior_scale=None)
        assert loss.tensor_keys.behavior_loc == ("behavior", "loc")
        assert loss.tensor_keys.behavior_scale == ("behavior", "scale")

    def test_state_dict_round_trip(self):
        loss = ContinuousACERLoss(*networks(seed=0))
        other = ContinuousACERLoss(*networks(seed=1))
        td = sequences()
        assert not torch.allclose(seeded(loss, td)["loss_critic"], seeded(other, td)["loss_critic"])
        other.load_state_dict(loss.state_dict())
        a, b = seeded(loss, td), seeded(other, td)
        for key in a.keys():
            torch.testing.assert_close(a[key], b[key])

    def test_deterministic_under_a_seed_and_random_otherwise(self):
        loss = ContinuousACERLoss(*networks())
        td = sequences()
        a, b, c = seeded(loss, td, 0), seeded(loss, td, 0), seeded(loss, td, 1)
        for key in a.keys():
            assert torch.equal(a[key], b[key]), key
        assert not torch.equal(a["loss_critic"], c["loss_critic"])  # Q̃ draws fresh u_i

    def test_padding_mask_is_honoured(self):
        loss = ContinuousACERLoss(*networks())
        td = sequences()
        td["collector", "mask"] = torch.ones(4, 6, dtype=torch.bool)
        td["collector", "mask"][1, 3:] = False  # row 1 ends at t = 2 (done there)
        garbage = td.clone()
        garbage["next", "reward"][1, 3:] = 100.0
        garbage["action"][1, 3:] += 5.0
        a, b = seeded(loss, td), seeded(loss, garbage)
        for key in a.keys():
            torch.testing.assert_close(a[key], b[key])
        unmasked = garbage.exclude(("collector", "mask"))
        assert not torch.allclose(seeded(loss, unmasked)["loss_critic"], a["loss_critic"])


class TestTargets:
    @pytest.mark.parametrize("d", [1, 3])
    def test_ratio_is_joint_density_ratio_and_trace_is_its_d_th_root(self, d):
        loss = ContinuousACERLoss(*networks(d=d))
        td = sequences(d=d)
        step = loss.targets(td)
        loc, scale = current_statistics(loss, td)
        rho = naive_ratio(td["action"], loc, scale, td["behavior", "loc"], td["behavior", "scale"])
        torch.testing.assert_close(step["ratio"].double(), rho, rtol=1e-4, atol=1e-6)
        naive_trace = rho.pow(1.0 / d).clamp(max=1.0)  # min(1, ρ^{1/d})
        torch.testing.assert_close(step["trace"].double(), naive_trace, rtol=1e-4, atol=1e-6)
        if d > 1:  # the d-th root matters: min(1, ρ) would differ
            assert ((rho < 0.9) & ((naive_trace - rho.clamp(max=1.0)).abs() > 0.05)).any()

    def test_q_ret_q_opc_and_v_target_match_the_papers_loop(self):
        # Algorithm (continuous ACER, appendix), one row at a time, in float64:
        #   Q^ret ← 0 at a terminal, V(x_{t+1}) at a window end or truncation;
        #   Q^ret ← r_t + γ Q^ret;  then Q^ret ← c_t (Q^ret − Q̃(x_t, a_t)) + V(x_t).
        d, gamma = 2, 0.9
        actor, _ = networks(d=d, dtype=torch.float64)
        critic = LinearCritic(d)
        loss = ContinuousACERLoss(actor, critic, gamma=gamma, critic_coeff=0.5)
        td = sequences((2, 5), d=d, dtype=torch.float64, consistent=True)
        td["next", "done"][1, 2] = td["next", "terminated"][1, 2] = True  # terminal inside
        step = loss.targets(td)
        loc, scale = current_statistics(loss, td)
        rho = naive_ratio(td["action"], loc, scale, td["behavior", "loc"], td["behavior", "scale"])
        with torch.no_grad():
            v = critic.value(td["observation"])
            v_next = critic.value(td["next", "observation"])
            q = critic.q(td["observation"], td["action"])
        q_ret, q_opc = torch.zeros_like(v), torch.zeros_like(v)
        for b in range(2):
            ret = opc = 0.0
            for t in reversed(range(5)):
                done, term = bool(td["next", "done"][b, t]), bool(td["next", "terminated"][b, t])
                if t == 4 or done:
                    ret = opc = 0.0 if term else float(v_next[b, t])
                ret = float(td["next", "reward"][b, t]) + gamma * ret
                opc = float(td["next", "reward"][b, t]) + gamma * opc
                q_ret[b, t], q_opc[b, t] = ret, opc
                c = min(1.0, float(rho[b, t]) ** (1.0 / d))
                ret = c * (ret - float(q[b, t])) + float(v[b, t])
                opc = 1.0 * (opc - float(q[b, t])) + float(v[b, t])
        v_target = rho.clamp(max=1.0) * (q_ret - q) + v
        torch.testing.assert_close(step["q_ret"], q_ret)
        torch.testing.assert_close(step["q_opc"], q_opc)
        torch.testing.assert_close(step["value_target"], v_target)
        # ...and forward uses them: loss_critic = ½ · mean[½(Q^ret − Q̃)² + ½(V^tgt − V)²].
        out = seeded(loss, td)
        critic_ref = 0.5 * (0.5 * (q_ret - q) ** 2 + 0.5 * (v_target - v) ** 2).mean()
        torch.testing.assert_close(out["loss_critic"], critic_ref)
        torch.testing.assert_close(out["q_ret_mean"], q_ret.mean())
        torch.testing.assert_close(out["q_opc_mean"], q_opc.mean())

    def test_targets_carry_no_gradient_and_match_forward_under_the_same_seed(self):
        loss = ContinuousACERLoss(*networks())
        td = sequences()
        torch.manual_seed(5)
        step = loss.targets(td)
        assert not any(v.requires_grad for v in step.values())
        out = seeded(loss, td, 5)
        torch.testing.assert_close(out["q_ret_mean"], step["q_ret"].mean())
        torch.testing.assert_close(out["q_opc_mean"], step["q_opc"].mean())


class TestPolicyObjective:
    def test_objective_is_truncated_is_on_q_opc_plus_the_sampled_correction(self):
        # Trust region off, deterministic critic: the only draw is a'_t ∼ π, reproduced here.
        # ∇ loss_objective = ∇ mean[−min(c, ρ_t)(Q^opc_t − V_t) log π(a_t)
        #                           − [1 − c/ρ_t(a'_t)]_+ (Q̃(x_t, a'_t) − V_t) log π(a'_t)].
        d, c = 2, 1.2
        actor, _ = networks(d=d, dtype=torch.float64)
        critic = LinearCritic(d)
        loss = ContinuousACERLoss(
            actor, critic, truncation_threshold=c, trust_region_delta=INF, gamma=0.9
        )
        td = sequences((2, 5), d=d, dtype=torch.float64, consistent=True)
        step = loss.targets(td)
        q_opc, v = step["q_opc"], step["state_value"]
        assert not torch.allclose(q_opc, step["q_ret"])  # the test tells Q^opc from Q^ret
        out, g_loss = grads(loss, td, keys=("loss_objective",), seed=3)

        params = [p for p in loss.actor_network_params.values(True, True) if p.requires_grad]
        with loss.actor_network_params.to_module(loss.actor_network):
            stats = loss.actor_network.get_dist_params(td.select("observation").copy())
        loc, scale = stats["loc"], stats["scale"]
        policy = torch.distributions.Independent(torch.distributions.Normal(loc, scale), 1)
        torch.manual_seed(3)
        fresh = policy.sample()
        rho = naive_ratio(td["action"], loc, scale, td["behavior", "loc"], td["behavior", "scale"])
        rho_fresh = naive_ratio(fresh, loc, scale, td["behavior", "loc"], td["behavior", "scale"])
        with torch.no_grad():
            q_fresh = critic.q(td["observation"], fresh)
        correction = (1.0 - c / rho_fresh).clamp(min=0.0)  # [1 − c/ρ(a')]_+
        assert (correction > 0).any() and (rho > c).any()  # both branches are exercised
        reference = -(
            rho.clamp(max=c) * (q_opc - v) * policy.log_prob(td["action"]).unsqueeze(-1)
            + correction * (q_fresh - v) * policy.log_prob(fresh).unsqueeze(-1)
        ).mean()
        expected = torch.autograd.grad(reference, params)
        torch.testing.assert_close(out["loss_objective"], reference)
        for a, b in zip(g_loss, expected, strict=True):
            torch.testing.assert_close(a, b)


class TestTrustRegion:
    def test_infinite_delta_is_a_no_op(self):
        loss = ContinuousACERLoss(*networks())
        perturb_average(loss)
        td = sequences()
        loss.trust_region_delta = INF
        out_inf, g_inf = grads(loss, td)
        loss.trust_region_delta = 1e12  # never binds: kᵀg < δ
        out_big, g_big = grads(loss, td)
        assert out_inf["trust_region_active"] == 0 and out_big["trust_region_active"] == 0
        for a, b in zip(g_inf, g_big, strict=True):
            torch.testing.assert_close(a, b)

    def test_trust_region_binds_and_changes_the_gradient(self):
        loss = ContinuousACERLoss(*networks(), trust_region_delta=0.0)
        perturb_average(loss)
        td = sequences()
        out, g_tr = grads(loss, td)
        assert out["trust_region_active"] > 0 and out["kl_average"] > 0
        loss.trust_region_delta = INF
        _, g_free = grads(loss, td)
        assert any(not torch.allclose(a, b) for a, b in zip(g_tr, g_free, strict=True))

    def test_average_equal_to_policy_leaves_the_gradient_unchanged(self):
        # At construction π_avg = π: KL is at its minimum, k = ∂KL/∂(m, σ) = 0, λ = 0.
        loss = ContinuousACERLoss(*networks(), trust_region_delta=1e-3)
        td = sequences()
        out, g_tr = grads(loss, td)
        assert out["kl_average"] == 0 and out["trust_region_active"] == 0
        loss.trust_region_delta = INF
        _, g_free = grads(loss, td)
        for a, b in zip(g_tr, g_free, strict=True):
            torch.testing.assert_close(a, b)

    def test_duplicating_the_batch_keeps_the_per_sample_trust_region(self):
        # Deterministic critic and c = inf (no sampled correction): the gradient is then a
        # function of the data alone, and a per-sample trust region is batch-size invariant.
        actor, _ = networks(dtype=torch.float64)
        loss = ContinuousACERLoss(
            actor, LinearCritic(ACT), trust_region_delta=0.05, truncation_threshold=INF
        )
        perturb_average(loss)
        td = sequences(dtype=torch.float64)
        out1, g1 = grads(loss, td)
        out2, g2 = grads(loss, torch.cat([td, td]))
        assert 0 < out1["trust_region_active"] < 1
        torch.testing.assert_close(out1["trust_region_active"], out2["trust_region_active"])
        for a, b in zip(g1, g2, strict=True):
            torch.testing.assert_close(a, b)

    def test_gradient_on_the_statistics_is_minus_z_star(self):
        # One-hot observations and a bias-free linear actor make W[:, n] the statistics of
        # sample n: W.grad[:, n] = ∂L/∂(loc_n, log σ_n). With g_n from the δ = inf loss and
        # k_n = ∂KL(π_avg ‖ π)/∂(loc_n, σ_n) from torch's KL, the δ-loss gradient must be
        # −z*_n / N, z* = g − max(0, (kᵀg − δ)/‖k‖²) k (Eq. 12), sample by sample.
        shape, d, delta = (2, 3), 2, 0.05
        n = shape[0] * shape[1]
        torch.manual_seed(0)
        linear = torch.nn.Linear(n, 2 * d, bias=False).double()
        actor = ProbabilisticActor(
            TensorDictModule(
                torch.nn.Sequential(linear, NormalParamExtractor(scale_mapping="exp")),
                ["observation"],
                ["loc", "scale"],
            ),
            in_keys=["loc", "scale"],
            distribution_class=torch.distributions.Normal,
        )
        loss = ContinuousACERLoss(
            actor, LinearCritic(d, obs_dim=n), trust_region_delta=delta, truncation_threshold=1.0
        )
        perturb_average(loss, scale=0.4)
        td = sequences(shape, d=d, dtype=torch.float64)
        td["observation"] = torch.eye(n, dtype=torch.float64).reshape(*shape, n)
        td["next", "observation"] = torch.randn(*shape, n, dtype=torch.float64)
        weight = loss.actor_network_params.get(("module", "0", "module", "0", "weight"))

        def statistics_grad(out):
            total = out["loss_objective"] + out["loss_entropy"]
            (w_grad,) = torch.autograd.grad(total, weight)  #                    [2d, N]
            with torch.no_grad():
                scale = (weight[d:].T).exp()  # σ_n = exp(raw)                      [N, d]
            return torch.cat([w_grad[:d].T, w_grad[d:].T / scale], -1)  # ∂L/∂(loc, σ) [N, 2d]

        out = seeded(loss, td)
        with_tr = statistics_grad(out)
        loss.trust_region_delta = INF
        g = -n * statistics_grad(seeded(loss, td))  # g_n = ∂J_n/∂φ_n
        loc = weight[:d].T.detach().clone().requires_grad_(True)  # [N, d]
        scale = weight[d:].T.detach().exp().requires_grad_(True)
        avg = loss.target_actor_network_params.get(("module", "0", "module", "0", "weight"))
        average = torch.distributions.Normal(avg[:d].T, avg[d:].T.exp())
        kl = torch.distributions.kl_divergence(average, torch.distributions.Normal(loc, scale))
        k = torch.cat(torch.autograd.grad(kl.sum(), (loc, scale)), -1)  #         [N, 2d]
        z_star = ref.trust_region_step(g, k, delta)
        assert 0 < out["trust_region_active"] < 1  # some samples bind, some do not
        torch.testing.assert_close(with_tr, -z_star / n)

    def test_fixed_scale_constrains_the_mean_only(self):
        # The paper's fixed covariance: σ carries no gradient, φ = loc.
        torch.manual_seed(0)
        body = torch.nn.Sequential(
            torch.nn.Linear(OBS, ACT), AddStateIndependentNormalScale(ACT, make_param=False)
        )
        actor = ProbabilisticActor(
            TensorDictModule(body, ["observation"], ["loc", "scale"]),
            in_keys=["loc", "scale"],
            distribution_class=torch.distributions.Normal,
        )
        _, critic = networks()
        loss = ContinuousACERLoss(actor, critic, trust_region_delta=0.0)
        perturb_average(loss)
        out, g_tr = grads(loss, sequences())
        assert out["trust_region_active"] > 0
        loss.trust_region_delta = INF
        _, g_free = grads(loss, sequences())
        assert any(not torch.allclose(a, b) for a, b in zip(g_tr, g_free, strict=True))

    def test_soft_update_moves_the_average_policy(self):
        loss = ContinuousACERLoss(*networks())
        updater = SoftUpdate(loss, eps=0.99)
        before = {k: v.clone() for k, v in loss.target_actor_network_params.items(True, True)}
        optimizer = torch.optim.SGD(loss.parameters(), lr=0.1)
        out = seeded(loss, sequences())
        (out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]).backward()
        optimizer.step()
        updater.step()
        moved = False
        for key, old in before.items():
            new = loss.target_actor_network_params.get(key)
            live = loss.actor_network_params.get(key)
            torch.testing.assert_close(new, 0.99 * old + 0.01 * live.detach())
            moved |= not torch.equal(new, old)
        assert moved


class TestGradientFlow:
    def test_critic_loss_reaches_both_heads_and_objective_only_the_actor(self):
        loss = ContinuousACERLoss(*networks(), trust_region_delta=0.0)
        perturb_average(loss)
        td = sequences()
        critic_params = dict(loss.critic_network_params.items(True, True))
        actor_params = dict(loss.actor_network_params.items(True, True))
        both = list(critic_params.values()) + list(actor_params.values())

        out = seeded(loss, td)
        g_critic = dict(
            zip([*critic_params, *actor_params], torch.autograd.grad(
                out["loss_critic"], both, allow_unused=True, retain_graph=True
            ), strict=True)
        )  # fmt: skip
        for name in critic_params:
            if name == ("advantage_network", "net", "2", "bias"):
                continue  # A's output bias cancels in Q̃ (see the module tests)
            assert g_critic[name] is not None and g_critic[name].abs().sum() > 0, name
        heads = {name[0] for name in critic_params}
        assert heads == {"value_network", "advantage_network"}
        assert all(g_critic[name] is None for name in actor_params)

        for key in ("loss_objective", "loss_entropy"):
            g = torch.autograd.grad(out[key], both, allow_unused=True, retain_graph=True)
            g = dict(zip([*critic_params, *actor_params], g, strict=True))
            assert all(g[name] is None for name in critic_params), key
            assert any(g[name] is not None and g[name].abs().sum() > 0 for name in actor_params)


class TestBadInput:
    def test_missing_behavior_statistics(self):
        td = sequences().exclude(("behavior", "loc"))
        with pytest.raises(KeyError, match=r"'behavior', 'loc'.*stored at collection"):
            ContinuousACERLoss(*networks())(td)

    def test_non_positive_behavior_scale(self):
        td = sequences()
        td["behavior", "scale"][1, 2, 0] = 0.0
        with pytest.raises(ValueError, match=r"'scale'.*must be > 0.*1 entries <= 0.*\[4, 6, 2\]"):
            ContinuousACERLoss(*networks())(td)

    def test_mismatched_behavior_shape(self):
        td = sequences()
        td["behavior", "loc"] = torch.zeros(4, 6, 3)
        with pytest.raises(ValueError, match=r"'loc'.*action's shape \[4, 6, 2\].*\[4, 6, 3\]"):
            ContinuousACERLoss(*networks())(td)

    def test_action_dim_differs_from_the_policy(self):
        td = sequences(d=3)  # consistent data, but the actor has d = 2
        with pytest.raises(ValueError, match=r"actor's 'loc' has shape \[4, 6, 2\].*\[4, 6, 3\]"):
            ContinuousACERLoss(*networks(d=2))(td)

    def test_reward_without_trailing_dim(self):
        td = sequences()
        td["next", "reward"] = td["next", "reward"].squeeze(-1)
        with pytest.raises(ValueError, match=r"'reward'.*shape \[4, 6, 1\], got \[4, 6\]"):
            ContinuousACERLoss(*networks())(td)

    def test_nan_reward(self):
        td = sequences()
        td["next", "reward"][2, 3] = float("nan")
        with pytest.raises(ValueError, match=r"reward.*\[4, 6, 1\].*1 non-finite"):
            ContinuousACERLoss(*networks())(td)

    def test_squashed_actor_is_refused(self):
        actor = ProbabilisticActor(
            TensorDictModule(
                torch.nn.Sequential(torch.nn.Linear(OBS, ACT), AddStateIndependentNormalScale(ACT)),
                ["observation"],
                ["loc", "scale"],
            ),
            in_keys=["loc", "scale"],
            distribution_class=TanhNormal,
        )
        with pytest.raises(ValueError, match=r"TanhNormal.*diagonal Gaussian"):
            ContinuousACERLoss(actor, networks()[1])

    def test_no_value_estimator(self):
        with pytest.raises(NotImplementedError, match="retrace_targets"):
            ContinuousACERLoss(*networks()).make_value_estimator("retrace")


# Loss values of the feed-forward networks, recorded with the code before the recurrent
# option was added (torch 2.13 CPU): the feed-forward path must not move.
FEED_FORWARD_GOLDEN = {
    False: {
        "loss_objective": 1.9415959119796753,
        "loss_critic": 1.0011171102523804,
        "loss_entropy": -0.02391589805483818,
        "ratio_mean": 0.6045281291007996,
        "q_ret_mean": 0.9731683731079102,
        "q_opc_mean": 1.209624171257019,
        "critic_v_term": 0.6853880286216736,
    },
    True: {
        "loss_objective": 1.5752373933792114,
        "loss_critic": 1.1758099794387817,
        "loss_entropy": -0.028371168300509453,
        "ratio_mean": 0.5752673745155334,
        "q_ret_mean": 0.8239659667015076,
        "q_opc_mean": 0.8788759112358093,
        "critic_v_term": 0.8641257286071777,
    },
}


@functools.cache
def _collect(cell, frames=60, max_steps=20):
    """A recurrent actor/critic pair and one Pendulum-v1 sequence [1, frames] it collected.

    Episodes are cut at ``max_steps`` (StepCounter), so resets happen inside the sequence.
    The behavior statistics are the collection-time loc/scale.
    """
    from torchrl.collectors import Collector
    from torchrl.envs import Compose, GymEnv, StepCounter, TransformedEnv

    from ac_extensions.modules import collection_policy, recurrent_env_transforms

    torch.manual_seed(0)
    actor, critic = make_continuous_actor_critic(
        3, 1, hidden_sizes=(16,), recurrent=cell, recurrent_size=8
    )
    policy = collection_policy(actor, critic)  # both memories run: both states are stored
    env = TransformedEnv(
        GymEnv("Pendulum-v1"),
        Compose(StepCounter(max_steps=max_steps), recurrent_env_transforms(policy)),
    )
    env.set_seed(0)
    collector = Collector(env, policy, frames_per_batch=frames, total_frames=frames)
    batch = next(iter(collector)).unsqueeze(0)
    collector.shutdown()
    env.close()
    batch["behavior", "loc"] = batch["loc"].clone()
    batch["behavior", "scale"] = batch["scale"].clone()
    return actor, critic, batch


def collected(cell):
    actor, critic, batch = _collect(cell)
    return actor, critic, batch.clone()


def recurrent_keys(batch):
    return [k for k in batch.keys() if isinstance(k, str) and "recurrent_state" in k]


class TestRecurrent:
    @pytest.mark.parametrize("state_dependent_scale", [False, True])
    def test_feed_forward_loss_is_unchanged(self, state_dependent_scale):
        torch.manual_seed(0)
        actor, critic = make_continuous_actor_critic(
            OBS,
            ACT,
            hidden_sizes=(16,),
            init_scale=0.8,
            state_dependent_scale=state_dependent_scale,
        )
        loss = ContinuousACERLoss(actor, critic, gamma=0.9)
        assert not loss._recurrent and loss.burn_in == 0
        out = seeded(loss, sequences())
        for key, value in FEED_FORWARD_GOLDEN[state_dependent_scale].items():
            torch.testing.assert_close(out[key].item(), value, rtol=1e-5, atol=1e-7, msg=key)

    @pytest.mark.timeout(120)
    @pytest.mark.parametrize("cell", ["lstm", "gru"])
    def test_recurrent_replay_matches_collection_and_step_by_step_values(self, cell):
        # (1) Replaying the collected [1, T] sequence in recurrent mode from the stored state
        # reproduces the collection-time loc/scale and V (the loss trains the policy that
        # acted, so ρ = 1); (2) the loss's V(x_{t+1}) are the critic's step-by-step values from
        # the stored next hidden states, which are also the collection-time V(x_{t+1}) where
        # the episode goes on, across the resets inside the sequence.
        from torchrl.modules import set_recurrent_mode

        actor, critic, batch = collected(cell)
        done = batch["next", "done"].squeeze(-1)[0]
        assert done.sum() >= 2 and batch["is_init"][0, 1:].any()
        loss = ContinuousACERLoss(actor, critic, gamma=0.9)
        with set_recurrent_mode(True), torch.no_grad():
            loc, scale = loss._policy_statistics(batch, loss.actor_network_params)
        assert (loc - batch["loc"]).abs().max() < 1e-5
        assert (scale - batch["scale"]).abs().max() < 1e-5
        targets = loss.targets(batch)
        assert (targets["state_value"] - batch["state_value"]).abs().max() < 1e-5
        torch.testing.assert_close(targets["ratio"], torch.ones_like(targets["ratio"]))

        nxt = batch["next"]
        inputs = [k for k in critic.in_keys if k not in ("action", "loc", "scale")]
        with torch.no_grad():  # sequential mode, one step at a time
            expected = torch.stack(
                [critic(nxt[:, t].select(*inputs).clone())["state_value"] for t in range(60)], 1
            )
        torch.testing.assert_close(targets["next_state_value"], expected, atol=1e-6, rtol=0)
        goes_on = ~done[:-1]
        torch.testing.assert_close(
            targets["next_state_value"][0, :-1][goes_on],
            batch["state_value"][0, 1:][goes_on],
            atol=1e-5,
            rtol=0,
        )
        out = seeded(loss, batch)
        assert all(torch.isfinite(v) for v in out.values())
        (out["loss_objective"] + out["loss_critic"]).backward()
        grads = [p.grad for p in critic.torso.parameters()]
        assert all(g is not None and g.abs().sum() > 0 for g in grads)  # the critic memory learns
        actor.zero_grad(), critic.zero_grad()

    @pytest.mark.timeout(120)
    @pytest.mark.parametrize("cell", ["lstm", "gru"])
    def test_burn_in_rebuilds_a_stale_stored_state(self, cell):
        # The stored actor and critic states at step k are replaced by garbage. With
        # burn_in = k the loss rebuilds them from steps 0..k−1 with the current networks
        # (those that collected), so it equals the loss on steps k.. with the true stored
        # states: same values and gradients. Without burn-in the garbage changes the loss.
        actor, critic, batch = collected(cell)
        is_init = batch["is_init"].squeeze(-1)[0]
        k = next(t for t in range(7, 40) if not is_init[t])
        hidden = recurrent_keys(batch)
        assert len(hidden) == (4 if cell == "lstm" else 2)
        stale = batch.clone()
        for key in hidden:
            stale[key][:, k] = torch.randn_like(stale[key][:, k])

        exact = ContinuousACERLoss(actor, critic, gamma=0.9)
        burned = ContinuousACERLoss(actor, critic, gamma=0.9, burn_in=k)
        burned.load_state_dict(exact.state_dict())
        expected = seeded(exact, batch[:, k:].clone())
        got = seeded(burned, stale.clone())
        for key in expected.keys():
            torch.testing.assert_close(got[key], expected[key], msg=key)
        grads = [
            torch.autograd.grad(
                out["loss_objective"] + out["loss_critic"] + out["loss_entropy"],
                list(m.parameters()),
                allow_unused=True,
            )
            for out, m in ((expected, exact), (got, burned))
        ]
        assert sum(g is not None for g in grads[0]) > 10
        for a, b in zip(*grads, strict=True):
            if a is None:
                assert b is None
            else:
                torch.testing.assert_close(a, b)
        # targets() burns in too; a single sequence [T] is a batch of one.
        torch.manual_seed(0)
        targets = burned.targets(stale[0].clone())
        torch.manual_seed(0)
        torch.testing.assert_close(targets, exact.targets(batch[0, k:].clone()))
        assert targets.batch_size == (60 - k,)
        corrupted = seeded(exact, stale[:, k:].clone())
        assert not torch.allclose(corrupted["loss_critic"], expected["loss_critic"])

    def test_recurrent_bad_input(self):
        with pytest.raises(ValueError, match=r"burn_in .*recurrent network.*recurrent: False"):
            ContinuousACERLoss(*networks(), burn_in=3)
        actor, critic = make_continuous_actor_critic(
            OBS, ACT, hidden_sizes=(8,), recurrent="gru", recurrent_size=4
        )
        with pytest.raises(ValueError, match="burn_in must be an int >= 0"):
            ContinuousACERLoss(actor, critic, burn_in=-1)
        loss = ContinuousACERLoss(actor, critic, burn_in=6)
        td = sequences((2, 6))
        td["is_init"] = torch.zeros(2, 6, 1, dtype=torch.bool)
        td["is_init"][:, 0] = True
        td["next", "is_init"] = torch.zeros(2, 6, 1, dtype=torch.bool)
        for key in ("actor_recurrent_state", "critic_recurrent_state"):
            td[key] = torch.zeros(2, 6, 1, 4)
            td["next", key] = torch.zeros(2, 6, 1, 4)
        with pytest.raises(ValueError, match=r"T = 6"):
            loss(td)
        loss.burn_in = 2
        assert loss(td)["loss_critic"].isfinite()
        with pytest.raises(KeyError, match=r"'critic_recurrent_state'.*recurrent_env_transforms"):
            loss(td.exclude("critic_recurrent_state"))
        # The next hidden states are not read: the pass over the window gives them.
        stored_next = [("next", "actor_recurrent_state"), ("next", "critic_recurrent_state")]
        torch.manual_seed(0)
        reference = loss(td)["loss_critic"]
        torch.manual_seed(0)
        torch.testing.assert_close(loss(td.exclude(*stored_next))["loss_critic"], reference)
        with pytest.raises(KeyError, match=r"'is_init'"):
            loss(td.exclude("is_init"))


def test_setting_gamma_after_a_call_takes_effect():
    actor, critic = networks()
    loss = ContinuousACERLoss(actor, critic, gamma=0.99)
    td = sequences(consistent=True)
    loss(td.clone())
    loss.gamma = 0.5
    fresh = ContinuousACERLoss(actor, critic, gamma=0.5)
    fresh.load_state_dict(loss.state_dict())
    torch.manual_seed(3)
    got = loss(td.clone())
    torch.manual_seed(3)
    expected = fresh(td.clone())
    for key in expected.keys():
        torch.testing.assert_close(got[key], expected[key], msg=key)
