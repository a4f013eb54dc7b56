from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torchrl.modules import set_recurrent_mode
from torchrl.objectives import HardUpdate

import ac_extensions.functional as F
from ac_extensions.objectives import ReactorLoss
from tests import _reference as ref

OBS, ACT, N = 4, 3, 11
LOSS_KEYS = ("loss_objective", "loss_critic", "loss_entropy")


class AtomHead(torch.nn.Module):
    """Observation → action-value logits [*, A, N] (atoms last)."""

    def __init__(self, num_atoms=N, extra_logits=False):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(OBS, 16), torch.nn.Tanh(), torch.nn.Linear(16, ACT * num_atoms)
        )
        self.num_atoms = num_atoms

    def forward(self, obs):
        return self.body(obs).unflatten(-1, (ACT, self.num_atoms))


class SharedNet(torch.nn.Module):
    """One torso, a policy head and a distributional Q head in the same pass."""

    def __init__(self, num_atoms=N):
        super().__init__()
        self.torso = torch.nn.Sequential(torch.nn.Linear(OBS, 16), torch.nn.Tanh())
        self.policy = torch.nn.Linear(16, ACT)
        self.q = torch.nn.Linear(16, ACT * num_atoms)
        self.num_atoms = num_atoms

    def forward(self, obs):
        h = self.torso(obs)
        return self.policy(h), self.q(h).unflatten(-1, (ACT, self.num_atoms))


class _Bimodal(torch.nn.Module):
    """Action-value logits [*, A, 5] putting half the mass on the first and the last atom."""

    def __init__(self):
        super().__init__()
        self.height = torch.nn.Parameter(torch.tensor(50.0))

    def forward(self, obs):
        logits = torch.zeros(*obs.shape[:-1], ACT, 5)
        logits[..., 0] = logits[..., -1] = 1.0
        return logits * self.height


def networks(seed=0, distributional=True, num_atoms=N, dtype=torch.float32):
    torch.manual_seed(seed)
    actor = TensorDictModule(
        torch.nn.Sequential(torch.nn.Linear(OBS, 16), torch.nn.Tanh(), torch.nn.Linear(16, ACT)),
        ["observation"],
        ["logits"],
    )
    if distributional:
        critic = TensorDictModule(AtomHead(num_atoms), ["observation"], ["action_value_logits"])
    else:
        critic = TensorDictModule(
            torch.nn.Sequential(
                torch.nn.Linear(OBS, 16), torch.nn.Tanh(), torch.nn.Linear(16, ACT)
            ),
            ["observation"],
            ["action_value"],
        )
    return actor.to(dtype), critic.to(dtype)


def make_loss(*nets, interval=1000, **kwargs):
    kwargs.setdefault("num_atoms", N)
    kwargs.setdefault("v_min", -5.0)
    kwargs.setdefault("v_max", 5.0)
    loss = ReactorLoss(*nets, **kwargs)
    HardUpdate(loss, value_network_update_interval=interval)  # associates the updater
    return loss


def sequences(shape=(3, 6), seed=0, dtype=torch.float32):
    """Consistent streams: next observation = next row's observation unless done.

    Row 0 truncates after step 2, rows ≥ 1 terminate after step 2; row 1 also terminates at
    step 4 (so rows hold terminations and truncations inside the window).
    """
    gen = torch.Generator().manual_seed(seed)
    *batch, time = shape
    done = torch.zeros(*shape, 1, dtype=torch.bool)
    done[..., 2, :] = True
    terminated = done.clone()
    if batch:
        terminated[0] = False  # row 0: a truncation
        if batch[0] > 1:
            done[1, 4] = terminated[1, 4] = True
    stream = torch.randn(*batch, time + 1, OBS, generator=gen, dtype=dtype)
    observation = stream[..., :-1, :].clone()
    next_observation = stream[..., 1:, :].clone()
    fresh = torch.randn(*shape, OBS, generator=gen, dtype=dtype)
    # After an episode end, row t + 1 starts from a reset observation.
    observation[..., 1:, :] = torch.where(
        done[..., :-1, :], fresh[..., :-1, :], observation[..., 1:, :]
    )
    return TensorDict(
        {
            "observation": observation,
            "action": torch.randint(ACT, shape, generator=gen),
            "action_log_prob": -torch.rand(*shape, generator=gen, dtype=dtype) * 2.0 - 0.1,
            ("next", "observation"): next_observation,
            ("next", "reward"): torch.randn(*shape, 1, generator=gen, dtype=dtype),
            ("next", "done"): done,
            ("next", "terminated"): terminated,
        },
        batch_size=shape,
    )


def network_outputs(loss, td, params=None):
    """(π, target atom probabilities or Q) at the given inputs, computed directly."""
    with torch.no_grad():
        probs = loss.actor_network(td.clone())["logits"].softmax(-1)
        with (params or loss.target_critic_network_params).to_module(loss.critic_network):
            out = loss.critic_network(td.clone())
    if "action_value_logits" in out.keys():
        return probs, out["action_value_logits"].softmax(-1)
    return probs, out["action_value"]


def trace_of(td, probs, lmbda):
    a = td["action"].unsqueeze(-1)
    ratio = probs.gather(-1, a) / td["action_log_prob"].exp().unsqueeze(-1)
    return F.retrace_trace(ratio, lmbda)


class TestContract:
    def test_scalar_finite_losses_and_detached_diagnostics(self):
        loss = make_loss(*networks())
        out = loss(sequences())
        assert sorted(out.keys()) == sorted(loss.out_keys)
        for key, value in out.items():
            assert value.shape == torch.Size([]) and torch.isfinite(value), key
            assert value.requires_grad == key.startswith("loss_"), key
        total = sum(out[k] for k in LOSS_KEYS)
        params = list(loss.parameters())
        grads = torch.autograd.grad(total, params)
        assert all(g is not None and torch.isfinite(g).all() for g in grads)

    def test_in_keys(self):
        loss = make_loss(*networks())
        assert set(loss.in_keys) == {
            "observation",
            "action",
            "action_log_prob",
            ("next", "observation"),
            ("next", "reward"),
            ("next", "done"),
            ("next", "terminated"),
        }

    def test_single_sequence_equals_batch_of_one(self):
        loss = make_loss(*networks())
        td = sequences((1, 6))
        single = td[0].clone()
        a, b = loss(td), loss(single)
        for key in a.keys():
            torch.testing.assert_close(a[key], b[key])
        assert single["td_error"].shape == (6,)
        torch.testing.assert_close(single["td_error"], td["td_error"][0])

    def test_behavior_log_prob_with_trailing_dim(self):
        loss = make_loss(*networks())
        td = sequences()
        other = td.clone()
        other["action_log_prob"] = other["action_log_prob"].unsqueeze(-1)
        a, b = loss(td), loss(other)
        for key in a.keys():
            torch.testing.assert_close(a[key], b[key])

    def test_set_keys_round_trip_with_nested_keys(self):
        loss = make_loss(*networks())
        td = sequences()
        expected = loss(td.clone())
        loss.set_keys(sample_log_prob=("collector", "mu_log_prob"), priority=("replay", "priority"))
        moved = td.clone()
        moved["collector", "mu_log_prob"] = moved.pop("action_log_prob")
        out = loss(moved)
        for key in expected.keys():
            torch.testing.assert_close(out[key], expected[key])
        assert ("replay", "priority") in moved.keys(True) and "td_error" not in moved.keys()
        assert ("collector", "mu_log_prob") in loss.in_keys
        loss.set_keys(sample_log_prob=None, priority=None)
        assert loss.tensor_keys.sample_log_prob == "action_log_prob"
        assert loss.tensor_keys.priority == "td_error"

    def test_state_dict_round_trip_and_determinism(self):
        loss = make_loss(*networks(0))
        other = make_loss(*networks(1))
        with torch.no_grad():  # make the target differ from the online critic
            for p in loss.target_critic_network_params.values(True, True):
                p.add_(0.3)
        other.load_state_dict(loss.state_dict())
        td = sequences()
        a, b = loss(td.clone()), other(td.clone())
        for key in a.keys():
            torch.testing.assert_close(a[key], b[key])
        torch.manual_seed(3)
        first = loss(td.clone())
        torch.manual_seed(3)
        second = loss(td.clone())
        for key in first.keys():
            assert torch.equal(first[key], second[key]), key

    def test_shared_network(self):
        net = TensorDictModule(SharedNet(), ["observation"], ["logits", "action_value_logits"])
        loss = make_loss(net)
        out = loss(sequences())
        assert all(torch.isfinite(out[k]) for k in LOSS_KEYS)
        # The bootstrap uses the shared net's target parameters.
        td = sequences()
        before = loss.targets(td)
        with torch.no_grad():
            for p in loss.target_actor_network_params.values(True, True):
                p.add_(0.5)
        assert not torch.allclose(before, loss.targets(td))
        after = loss(td)  # the online policy and critic are unchanged
        for key in ("entropy", "q_mean", "ratio_mean"):
            torch.testing.assert_close(after[key], out[key])

    def test_recurrent_networks_run_over_the_sequence(self):
        from torchrl.modules import LSTMModule

        torch.manual_seed(0)
        lstm = LSTMModule(OBS, 8, in_key="observation", out_key="h")
        head = TensorDictModule(torch.nn.Linear(8, ACT), ["h"], ["logits"])
        from tensordict.nn import TensorDictSequential

        actor = TensorDictSequential(lstm, head)
        critic = TensorDictModule(AtomHead(), ["observation"], ["action_value_logits"])
        loss = make_loss(actor, critic)
        td = sequences((2, 5))
        zeros = torch.zeros(2, 5, 1, 8)
        td["recurrent_state_h"] = zeros
        td["recurrent_state_c"] = zeros
        td["is_init"] = torch.zeros(2, 5, 1, dtype=torch.bool)
        td["is_init"][:, 0] = True
        td["next", "recurrent_state_h"] = torch.randn(2, 5, 1, 8)
        td["next", "recurrent_state_c"] = torch.randn(2, 5, 1, 8)
        td["next", "is_init"] = torch.zeros(2, 5, 1, dtype=torch.bool)
        out = loss(td)
        assert all(torch.isfinite(out[k]) for k in LOSS_KEYS)


class TestCriticTarget:
    def test_mean_equals_scalar_retrace_when_no_atom_is_clipped(self):
        loss = make_loss(*networks(), v_min=-60.0, v_max=60.0, lmbda=0.8, gamma=0.9)
        td = sequences()
        target = loss.targets(td)  # [B, T, N]
        torch.testing.assert_close(target.sum(-1), torch.ones(target.shape[:-1]))
        probs, atoms = network_outputs(loss, td)
        next_probs, next_atoms = network_outputs(loss, td["next"])
        q, next_q = (atoms * loss.support).sum(-1), (next_atoms * loss.support).sum(-1)
        a = td["action"].unsqueeze(-1)
        expected = F.retrace_targets(
            td["next", "reward"],
            q.gather(-1, a),
            (probs * q).sum(-1, keepdim=True),
            (next_probs * next_q).sum(-1, keepdim=True),
            trace_of(td, probs, 0.8),
            td["next", "done"],
            td["next", "terminated"],
            0.9,
        )
        torch.testing.assert_close((target * loss.support).sum(-1, keepdim=True), expected)

    def test_zero_trace_gives_one_step_expected_sarsa(self):
        loss = make_loss(*networks(), lmbda=0.0, gamma=0.9)
        td = sequences()
        next_probs, next_atoms = network_outputs(loss, td["next"])
        # q*_t = Φ[Σ_a π(a|x_{t+1}) q̄(x_{t+1}, a, ·) at r_t + γ(1 − term_t) z]
        discount = 0.9 * (~td["next", "terminated"]).float()  # [B, T, 1]
        positions = td["next", "reward"] + discount * loss.support  # [B, T, N]
        weights = (next_probs.unsqueeze(-1) * next_atoms).sum(-2)
        expected = F.categorical_projection(positions, weights, loss.support)
        torch.testing.assert_close(loss.targets(td), expected)

    @pytest.mark.parametrize("shape", [(6,), (2, 7)])
    def test_matches_the_naive_reference_loop(self, shape):
        # float64 networks; narrow support so that some atoms are clipped too.
        nets = networks(num_atoms=7, dtype=torch.float64)
        loss = make_loss(*nets, num_atoms=7, v_min=-3.0, v_max=3.0, lmbda=0.9, gamma=0.95)
        loss.double()
        td = sequences(shape, seed=1, dtype=torch.float64)
        batched = td if td.batch_dims == 2 else td.unsqueeze(0)
        probs, _ = network_outputs(loss, batched)
        next_probs, next_atoms = network_outputs(loss, batched["next"])
        next_action = torch.cat([batched["action"][..., 1:], batched["action"][..., -1:]], -1)
        expected = ref.distributional_retrace_targets(
            batched["next", "reward"],
            next_probs,
            next_atoms,
            next_action,
            trace_of(batched, probs, 0.9),
            batched["next", "done"],
            batched["next", "terminated"],
            0.95,
            loss.support,
        )
        got = loss.targets(td)
        if td.batch_dims == 1:
            expected = expected.squeeze(0)
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-10)

    def test_non_distributional_target_is_retrace(self):
        loss = make_loss(*networks(distributional=False), distributional=False, lmbda=0.7)
        td = sequences()
        probs, q = network_outputs(loss, td)
        next_probs, next_q = network_outputs(loss, td["next"])
        a = td["action"].unsqueeze(-1)
        expected = F.retrace_targets(
            td["next", "reward"],
            q.gather(-1, a),
            (probs * q).sum(-1, keepdim=True),
            (next_probs * next_q).sum(-1, keepdim=True),
            trace_of(td, probs, 0.7),
            td["next", "done"],
            td["next", "terminated"],
            0.99,
        )
        torch.testing.assert_close(loss.targets(td), expected)
        # loss_critic = ½ mean (G − Q(x_t, a_t))² with the online critic (= target here).
        out = loss(td)
        torch.testing.assert_close(
            out["loss_critic"], 0.5 * (expected - q.gather(-1, a)).pow(2).mean()
        )
        assert out["target_negative_mass"] == 0

    def test_critic_loss_is_cross_entropy_against_the_signed_target(self):
        loss = make_loss(*networks(), critic_coeff=1.0)
        td = sequences()
        td["action_log_prob"] = torch.full_like(td["action_log_prob"], -6.0)  # ρ ≫ 1, c = 1
        target = loss.targets(td)
        assert (target < 0).any()  # c_{t+1} = 1 > π(a_{t+1}): a signed mixture
        with torch.no_grad():
            logits = loss.critic_network(td.clone())["action_value_logits"]
        idx = td["action"][..., None, None].expand(3, 6, 1, N)
        log_q = logits.log_softmax(-1).gather(-2, idx).squeeze(-2)
        out = loss(td)
        torch.testing.assert_close(out["loss_critic"], -(target * log_q).sum(-1).mean())
        negative = (-target).clamp_min(0).sum(-1).mean()
        torch.testing.assert_close(out["target_negative_mass"], negative)
        assert out["target_negative_mass"] > 0


class TestTargetNetwork:
    def test_bootstrap_comes_from_the_target_parameters(self):
        loss = make_loss(*networks())
        td = sequences()
        before, out_before = loss.targets(td), loss(td.clone())
        # Online critic changed: same target, different online logits (critic loss).
        with torch.no_grad():
            for p in loss.critic_network_params.values(True, True):
                p.add_(0.2 * torch.randn_like(p))
        torch.testing.assert_close(loss.targets(td), before)
        assert not torch.allclose(loss(td.clone())["loss_critic"], out_before["loss_critic"])
        # Target parameters changed: the target changes.
        with torch.no_grad():
            for p in loss.target_critic_network_params.values(True, True):
                p.add_(0.2 * torch.randn_like(p))
        assert not torch.allclose(loss.targets(td), before)

    def test_hard_update_copies_after_k_steps(self):
        loss = ReactorLoss(*networks(), num_atoms=N)
        updater = HardUpdate(loss, value_network_update_interval=3)
        optimizer = torch.optim.SGD(loss.parameters(), lr=0.1)
        out = loss(sequences())
        sum(out[k] for k in LOSS_KEYS).backward()
        optimizer.step()
        initial = loss.target_critic_network_params.clone()
        online = loss.critic_network_params.detach().clone()
        assert not torch.allclose(
            initial["module", "body", "2", "bias"], online["module", "body", "2", "bias"]
        )
        for _ in range(3):  # TorchRL's HardUpdate copies on the (K + 1)-th step
            updater.step()
            assert (loss.target_critic_network_params == initial).all()
        updater.step()
        assert (loss.target_critic_network_params == online).all()


class TestPolicyGradient:
    def test_beta_loo_gradient_matches_the_closed_form(self):
        torch.manual_seed(0)
        actor = TensorDictModule(torch.nn.Linear(OBS, ACT), ["observation"], ["logits"])
        _, critic = networks()
        loss = make_loss(actor, critic, loo_threshold=2.0)
        td = sequences()
        mask = torch.ones(3, 6, dtype=torch.bool)
        mask[1, 4:] = False
        td["collector", "mask"] = mask
        out = loss(td)
        params = loss.actor_network_params
        g_bias, g_weight = torch.autograd.grad(
            out["loss_objective"], [params["module", "bias"], params["module", "weight"]]
        )
        with torch.no_grad():
            pi = actor(td.clone())["logits"].softmax(-1)  # [B, T, A]
            atoms = loss.critic_network(td.clone())["action_value_logits"].softmax(-1)
            q = (atoms * loss.support).sum(-1)  # E[Z]
            ret = (loss.targets(td) * loss.support).sum(-1)  # R(â) = mean of q*
            a = td["action"]
            mu = td["action_log_prob"].exp()
            beta = (1 / mu).clamp(max=2.0)
            eye = torch.eye(ACT)
            onehot = eye[a]
            pi_a = pi.gather(-1, a.unsqueeze(-1)).squeeze(-1)
            q_a = q.gather(-1, a.unsqueeze(-1)).squeeze(-1)
            # ∂/∂logits of [β(R − Q(â))π(â) + Σ_a Q(a)π(a)]
            closed = (beta * (ret - q_a) * pi_a)[..., None] * (onehot - pi)
            closed = closed + (q * pi)[..., :, None].mul(eye - pi[..., None, :]).sum(-2)
            d_logits = -closed * mask[..., None] / mask.sum()  # the loss averages valid steps
        torch.testing.assert_close(g_bias, d_logits.sum((0, 1)))
        torch.testing.assert_close(
            g_weight, torch.einsum("bta,bto->ao", d_logits, td["observation"])
        )

    def test_loo_threshold_sets_beta(self):
        td = sequences()
        mu = td["action_log_prob"].exp()
        loss = make_loss(*networks(), loo_threshold=math.inf)
        torch.testing.assert_close(loss(td.clone())["beta_mean"], (1 / mu).mean())
        loss = make_loss(*networks(), loo_threshold=1.0)
        assert loss(td.clone())["beta_mean"] == 1.0


class TestPriorities:
    @staticmethod
    def zero_critic_loss(**kwargs):
        actor, critic = networks(distributional=False)
        with torch.no_grad():
            for p in critic.parameters():
                p.zero_()
        return make_loss(actor, critic, distributional=False, **kwargs)

    @staticmethod
    def terminal_steps(rewards):
        td = sequences((1, len(rewards)))
        td["next", "reward"] = torch.tensor(rewards).reshape(1, -1, 1)
        td["next", "done"][:] = True
        td["next", "terminated"][:] = True
        return td

    def test_eta_formula_by_hand(self):
        # Every step terminal ⇒ G_t = r_t; Q ≡ 0 ⇒ δ = |r| = [1, 2, 0.5].
        loss = self.zero_critic_loss(priority_eta=0.9)
        td = self.terminal_steps([1.0, -2.0, 0.5])
        out = loss(td)
        # p = 0.9 · 2 + 0.1 · (3.5 / 3)
        expected = 0.9 * 2.0 + 0.1 * 3.5 / 3
        torch.testing.assert_close(td["td_error"], torch.full((1, 3), expected))
        torch.testing.assert_close(out["td_error_mean"], torch.tensor(3.5 / 3))

    def test_padded_steps_are_left_out(self):
        loss = self.zero_critic_loss(priority_eta=0.9)
        td = self.terminal_steps([1.0, -2.0, 0.5])
        td["collector", "mask"] = torch.tensor([[True, False, True]])
        loss(td)
        # valid δ = [1, 0.5]: p = 0.9 · 1 + 0.1 · 0.75
        torch.testing.assert_close(td["td_error"], torch.full((1, 3), 0.975))

    def test_overwrites_existing_priority_in_place(self):
        loss = self.zero_critic_loss(priority_eta=0.0)
        td = self.terminal_steps([1.0, -2.0, 0.5])
        existing = torch.zeros(1, 3)
        td["td_error"] = existing
        loss(td)
        torch.testing.assert_close(existing, torch.full((1, 3), 3.5 / 3))

    def test_distributional_td_priority_compares_means(self):
        loss = make_loss(*networks(), priority_eta=0.5, priority_metric="td")
        td = sequences()
        out = loss(td)
        with torch.no_grad():
            atoms = loss.critic_network(td.clone())["action_value_logits"].softmax(-1)
            q_a = (atoms * loss.support).sum(-1).gather(-1, td["action"].unsqueeze(-1))
            ret = (loss.targets(td) * loss.support).sum(-1, keepdim=True)
            delta = (ret - q_a).abs().squeeze(-1)  # [B, T]
        expected = 0.5 * delta.amax(-1) + 0.5 * delta.mean(-1)
        torch.testing.assert_close(td["td_error"], expected[:, None].expand(3, 6))
        torch.testing.assert_close(out["td_error_mean"], delta.mean())

    def test_distributional_priority_is_mean_total_variation(self):
        # The paper's default (§3.3): mean_t ½ Σ_i |q*_t(i) − q_i(x_t, a_t)|, online critic.
        loss = make_loss(*networks())
        assert (loss.priority_metric, loss.priority_eta) == ("tv", 0.0)
        td = sequences()
        loss(td)
        with torch.no_grad():
            atoms = loss.critic_network(td.clone())["action_value_logits"].softmax(-1)
            index = td["action"][..., None, None].expand(3, 6, 1, atoms.shape[-1])
            chosen = atoms.gather(-2, index).squeeze(-2)  # [B, T, N]
            target = loss.targets(td)
            tv = [
                [
                    0.5
                    * sum(
                        abs(float(target[b, t, i]) - float(chosen[b, t, i]))
                        for i in range(atoms.shape[-1])
                    )
                    for t in range(6)
                ]
                for b in range(3)
            ]  # a naive loop
        expected = torch.tensor(tv).mean(-1)
        torch.testing.assert_close(td["td_error"], expected[:, None].expand(3, 6))

    def test_total_variation_sees_disagreeing_distributions_with_equal_means(self):
        # Prediction: half the mass at −5, half at +5 (mean 0); target: every step terminal
        # with reward 0, a point mass at 0 (mean 0). The means agree, the distributions do not.
        actor = TensorDictModule(torch.nn.Linear(OBS, ACT), ["observation"], ["logits"])
        critic = TensorDictModule(_Bimodal(), ["observation"], ["action_value_logits"])
        td = sequences((2, 6))
        td["next", "reward"] = torch.zeros(2, 6, 1)
        td["next", "done"][:] = True
        td["next", "terminated"][:] = True
        make_loss(actor, critic, num_atoms=5)(td)  # support [−5, −2.5, 0, 2.5, 5]
        torch.testing.assert_close(td["td_error"], torch.ones(2, 6))  # TV = ½(½ + ½ + 1)
        make_loss(actor, critic, num_atoms=5, priority_metric="td")(td)
        torch.testing.assert_close(td["td_error"], torch.zeros(2, 6), atol=1e-5, rtol=0)

    def test_tv_needs_the_distributional_critic(self):
        with pytest.raises(ValueError, match="priority_metric='tv' needs"):
            make_loss(*networks(distributional=False), distributional=False, priority_metric="tv")
        with pytest.raises(ValueError, match="priority_metric must be"):
            make_loss(*networks(), priority_metric="max")

    def test_repeated_calls_write_in_place(self):
        loss = make_loss(*networks())
        td = sequences()
        loss(td)
        first, old = td["td_error"], td["td_error"].clone()
        td["next", "reward"] += 1.0
        loss(td)  # the stored entry is overwritten in place (TorchRL's DQN/SAC convention)
        assert first.shape == (3, 6) and not torch.equal(first, old)
        assert torch.equal(first, td["td_error"])


class TestImportanceWeights:
    def test_weights_scale_the_losses_not_the_diagnostics(self):
        loss = make_loss(*networks())
        td = sequences()
        base = loss(td.clone())
        weighted = td.clone()
        weighted["priority_weight"] = torch.full((3, 6), 2.0)
        out = loss(weighted)
        for key in base.keys():
            factor = 2.0 if key.startswith("loss_") else 1.0
            torch.testing.assert_close(out[key], factor * base[key])
        loss.use_prioritized_weights = False
        torch.testing.assert_close(loss(weighted)["loss_critic"], base["loss_critic"])

    def test_weights_multiply_each_step(self):
        loss = make_loss(*networks(), critic_coeff=1.0)
        td = sequences()
        w = torch.rand(3, 6, generator=torch.Generator().manual_seed(1))
        weighted = td.clone()
        weighted["priority_weight"] = w.unsqueeze(-1)  # [B, T, 1] accepted too
        target = loss.targets(td)
        with torch.no_grad():
            logits = loss.critic_network(td.clone())["action_value_logits"]
        idx = td["action"][..., None, None].expand(3, 6, 1, N)
        log_q = logits.log_softmax(-1).gather(-2, idx).squeeze(-2)
        expected = (w * -(target * log_q).sum(-1)).mean()  # mean_t w_t · CE_t (not Σwl/Σw)
        torch.testing.assert_close(loss(weighted)["loss_critic"], expected)

    def test_bad_weight_shape(self):
        td = sequences()
        td["priority_weight"] = torch.ones(3, 6, 2)
        with pytest.raises(ValueError, match=r"priority_weight.*\[3, 6\].*\[3, 6, 2\]"):
            make_loss(*networks())(td)


class TestBadInput:
    def test_missing_behavior_log_prob(self):
        td = sequences().exclude("action_log_prob")
        with pytest.raises(KeyError, match=r"action_log_prob.*stored at collection"):
            make_loss(*networks())(td)

    def test_missing_next_observation(self):
        td = sequences().exclude(("next", "observation"))
        with pytest.raises(KeyError, match=r"\[3, 6\].*'next', 'observation'"):
            make_loss(*networks())(td)

    def test_mismatched_action_shape(self):
        td = sequences()
        td["action"] = td["action"].unsqueeze(-1)
        with pytest.raises(ValueError, match=r"action.*\[3, 6\].*\[3, 6, 1\]"):
            make_loss(*networks())(td)

    def test_bad_log_prob_shape(self):
        td = sequences()
        td["action_log_prob"] = td["action_log_prob"].unsqueeze(-1).expand(3, 6, 2)
        with pytest.raises(ValueError, match=r"action_log_prob.*\[3, 6\].*\[3, 6, 2\]"):
            make_loss(*networks())(td)

    def test_nan_reward(self):
        td = sequences()
        td["next", "reward"][1, 3] = float("nan")
        with pytest.raises(ValueError, match=r"reward.*\[3, 6, 1\].*1 non-finite"):
            make_loss(*networks())(td)

    def test_zero_behavior_probability(self):
        td = sequences()
        td["action_log_prob"][0, 2] = -math.inf
        with pytest.raises(ValueError, match=r"behavior probability.*is 0.*\[3, 6, 1\]"):
            make_loss(*networks())(td)

    def test_wrong_number_of_atoms(self):
        with pytest.raises(
            ValueError, match=r"action_value_logits.*\[3, 6, 3, 11\].*\[3, 6, 3, 5\]"
        ):
            make_loss(*networks(num_atoms=5))(sequences())

    def test_shared_actor_without_critic_output(self):
        actor, _ = networks()
        with pytest.raises(KeyError, match="action_value_logits"):
            make_loss(actor)(sequences())

    def test_bad_constructor_arguments(self):
        with pytest.raises(ValueError, match="v_min < v_max"):
            ReactorLoss(*networks(), v_min=1.0, v_max=-1.0)
        with pytest.raises(ValueError, match="priority_eta"):
            ReactorLoss(*networks(), priority_eta=1.5)
        with pytest.raises(ValueError, match="loo_threshold"):
            ReactorLoss(*networks(), loo_threshold=-1.0)

    def test_no_value_estimator(self):
        with pytest.raises(NotImplementedError, match="target network"):
            make_loss(*networks()).make_value_estimator("retrace")


class TestBootstrapStates:
    """``bootstrap_states``: the recurrent state at x_{t+1} from the pass or from storage."""

    @staticmethod
    def collected(seed=0):
        from torchrl.collectors import Collector

        from ac_extensions.modules import make_reactor_actor, reactor_env_transforms
        from ac_extensions.runtime.envs import make_batched_env

        torch.manual_seed(seed)
        actor = make_reactor_actor(4, 2, hidden_sizes=(16,), recurrent_size=8, num_atoms=N)
        env = make_batched_env("CartPole-v1", 2, extra_transforms=[reactor_env_transforms(actor)])
        env.set_seed(seed)
        collector = Collector(env, actor, frames_per_batch=80, total_frames=80)
        batch = next(iter(collector))  # [2, 40]
        collector.shutdown()
        return actor, batch

    @staticmethod
    def loss_of(actor, mode):
        return make_loss(actor, None, bootstrap_states=mode, v_min=-10.0, v_max=10.0)

    @staticmethod
    def drift(actor, seed=1):
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in actor.parameters():
                p.add_(0.3 * torch.randn(p.shape, generator=gen))

    @staticmethod
    def recomputed_states(actor, batch):
        """Naive loop: carry each LSTM's state step by step with the current weights."""
        from ac_extensions.modules import reactor_hidden_state_keys

        keys = reactor_hidden_state_keys("policy") + reactor_hidden_state_keys("critic")
        net = actor.module[0]  # the network without the sampling step
        out = batch.clone()
        carried = {k: batch[k][:, 0] for k in keys}
        with torch.no_grad(), set_recurrent_mode(False):
            for t in range(batch.shape[1]):
                step = batch[:, t].select("observation", "prev_action", "prev_reward", "is_init")
                init = step["is_init"].unsqueeze(-1)  # [E, 1, 1]: a reset starts from zeros
                for k in keys:
                    carried[k] = torch.where(init, torch.zeros_like(carried[k]), carried[k])
                    step[k] = carried[k]
                    out[k][:, t] = carried[k]
                step = net(step)
                for k in keys:
                    carried[k] = step["next", k]
                    out["next", k][:, t] = carried[k]
        return out

    @pytest.mark.timeout(120)
    def test_unroll_equals_stored_states_when_the_weights_have_not_moved(self):
        actor, batch = self.collected()
        with torch.no_grad(), set_recurrent_mode(True):
            unroll = self.loss_of(actor, "unroll").targets(batch.clone())
            stored = self.loss_of(actor, "stored").targets(batch.clone())
        torch.testing.assert_close(unroll, stored, atol=1e-5, rtol=1e-5)

    @pytest.mark.timeout(120)
    def test_unroll_refreshes_the_bootstrap_states_after_a_weight_change(self):
        actor, batch = self.collected()
        assert batch["next", "done"].any()  # episode ends inside the window
        self.drift(actor)
        with torch.no_grad(), set_recurrent_mode(True):
            unroll = self.loss_of(actor, "unroll").targets(batch.clone())
            stale = self.loss_of(actor, "stored").targets(batch.clone())
            # the stored-state path on states recomputed with the current weights, step by step
            fresh = self.loss_of(actor, "stored").targets(self.recomputed_states(actor, batch))
        assert (unroll - stale).abs().max() > 1e-3  # the stored states are stale
        torch.testing.assert_close(unroll, fresh, atol=1e-5, rtol=1e-4)

    @pytest.mark.timeout(120)
    def test_unroll_refreshes_the_state_at_a_truncation_inside_the_window(self):
        # Every episode end made a truncation: x_{t+1} is the episode's final observation, to
        # be evaluated from the state the pass reached after step t, not the stored one.
        actor, batch = self.collected()
        assert bool(batch["next", "done"][:, :-1].any())
        batch["next", "terminated"] = torch.zeros_like(batch["next", "terminated"])
        self.drift(actor)
        with torch.no_grad(), set_recurrent_mode(True):
            unroll = self.loss_of(actor, "unroll").targets(batch.clone())
            stale = self.loss_of(actor, "stored").targets(batch.clone())
            fresh = self.loss_of(actor, "stored").targets(self.recomputed_states(actor, batch))
        assert (unroll - stale).abs().max() > 1e-3
        torch.testing.assert_close(unroll, fresh, atol=1e-5, rtol=1e-4)

    def test_bootstrap_states_is_checked(self):
        with pytest.raises(ValueError, match="bootstrap_states must be"):
            make_loss(*networks(), bootstrap_states="burn")


def test_setting_gamma_after_a_call_takes_effect():
    nets = networks()
    loss = make_loss(*nets, gamma=0.99)
    td = sequences()
    loss(td.clone())
    loss.gamma = 0.5
    expected = make_loss(*nets, gamma=0.5).targets(td.clone())
    torch.testing.assert_close(loss.targets(td.clone()), expected)
