from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict
from torchrl.envs.utils import ExplorationType, set_exploration_type

from ac_extensions.modules import StochasticDuelingNetwork, make_continuous_actor_critic

OBS, ACT = 4, 3


def critic(num_samples=5, seed=0, advantage_offset=0.0):
    torch.manual_seed(seed)
    _, sdn = make_continuous_actor_critic(OBS, ACT, hidden_sizes=(16,), num_samples=num_samples)
    sdn = sdn.double()
    with torch.no_grad():  # shift A so that E_π[A(x, ·)] is far from 0
        sdn.advantage_network.net[-1].bias.add_(advantage_offset)
    return sdn


def inputs(batch=(5,), seed=1):
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(*batch, OBS, generator=gen, dtype=torch.float64),  # observation
        torch.randn(*batch, ACT, generator=gen, dtype=torch.float64),  # action
        torch.randn(*batch, ACT, generator=gen, dtype=torch.float64),  # loc
        torch.rand(*batch, ACT, generator=gen, dtype=torch.float64) + 0.5,  # scale
    )


class TestStochasticDuelingNetwork:
    def test_q_minus_v_minus_advantage_is_minus_the_sample_mean(self):
        # Q̃(x, a) − V(x) − A(x, a) = −(1/n) Σ_i A(x, u_i), with the u_i the network drew.
        sdn = critic(num_samples=4)
        obs, action, loc, scale = inputs()
        torch.manual_seed(7)
        q = sdn.action_value(obs, action, loc, scale)
        torch.manual_seed(7)
        samples = sdn.sample_actions(loc, scale)  # the same draws            [n, B, d]
        assert samples.shape == (4, 5, ACT)
        with torch.no_grad():
            mean = sum(sdn.advantage(obs, samples[i]) for i in range(4)) / 4
            lhs = q - sdn.state_value(obs) - sdn.advantage(obs, action)
        torch.testing.assert_close(lhs, -mean)
        assert mean.abs().min() > 1e-6  # the correction is not trivially zero

    def test_expected_action_value_over_pi_is_the_state_value(self):
        # E_{a, u ∼ π}[Q̃(x, a)] = V(x), whatever E_π[A]: check by Monte Carlo.
        sdn = critic(num_samples=5, advantage_offset=3.0)
        obs, _, loc, scale = inputs(batch=(3,))
        n = 20000
        torch.manual_seed(0)
        actions = torch.distributions.Normal(loc, scale).sample((n,))  # a ∼ π   [N, 3, d]
        with torch.no_grad():
            q = sdn.action_value(obs.expand(n, 3, OBS), actions, loc.expand(n, 3, ACT),
                                 scale.expand(n, 3, ACT))  # fmt: skip
            value = sdn.state_value(obs)
            plain = value + sdn.advantage(obs.expand(n, 3, OBS), actions).mean(0)
        torch.testing.assert_close(q.mean(0), value, atol=0.02, rtol=0)
        assert ((plain - value).abs() > 1.0).all()  # without the correction: far from V

    def test_gradient_reaches_both_heads_and_not_the_policy_statistics(self):
        sdn = critic()
        obs, action, loc, scale = inputs()
        loc.requires_grad_(True)
        scale.requires_grad_(True)
        sdn.action_value(obs, action, loc, scale).sum().backward()
        for head in (sdn.value_network, sdn.advantage_network):
            weights = [p for p in head.parameters() if p.dim() == 2]
            assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in weights)
        # A's output bias cancels in A(x, a) − (1/n) Σ_i A(x, u_i): its gradient is zero.
        assert sdn.advantage_network.net[-1].bias.grad.abs().item() < 1e-12
        assert sdn.value_network[-1].bias.grad.abs().item() > 0
        assert loc.grad is None and scale.grad is None

    def test_tensordict_api(self):
        sdn = critic()
        obs, action, loc, scale = inputs(batch=(2, 5))
        td = TensorDict({"observation": obs, "action": action, "loc": loc, "scale": scale}, [2, 5])
        torch.manual_seed(3)
        out = sdn(td.clone())
        torch.manual_seed(3)
        expected = sdn.action_value(obs, action, loc, scale)
        torch.testing.assert_close(out["action_value"], expected)
        assert out["state_value"].shape == (2, 5, 1)
        only_value = sdn(TensorDict({"observation": obs}, [2, 5]))
        assert "action_value" not in only_value.keys()
        torch.testing.assert_close(only_value["state_value"], out["state_value"])
        with pytest.raises(KeyError, match=r"lacks \['scale'\]"):
            sdn(td.exclude("scale"))

    def test_seeded_and_fresh_samples(self):
        sdn = critic()
        obs, action, loc, scale = inputs()
        torch.manual_seed(0)
        a = sdn.action_value(obs, action, loc, scale)
        torch.manual_seed(0)
        b = sdn.action_value(obs, action, loc, scale)
        c = sdn.action_value(obs, action, loc, scale)
        torch.testing.assert_close(a, b)
        assert not torch.allclose(a, c)

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="num_samples must be an int >= 1"):
            StochasticDuelingNetwork(torch.nn.Identity(), torch.nn.Identity(), num_samples=0)
        sdn = critic()
        obs, action, loc, scale = inputs()
        with pytest.raises(ValueError, match=r"'action' \[5, 2\] and 'loc' \[5, 3\]"):
            sdn.action_value(obs, action[:, :2], loc, scale)


class TestContinuousActor:
    def test_log_prob_is_the_sum_of_per_dimension_log_densities(self):
        torch.manual_seed(0)
        actor, _ = make_continuous_actor_critic(OBS, ACT, hidden_sizes=(8,), init_scale=0.7)
        td = TensorDict({"observation": torch.randn(6, OBS)}, [6])
        with set_exploration_type(ExplorationType.RANDOM):
            td = actor(td).detach()
        expected = torch.zeros(6)
        for b in range(6):
            for i in range(ACT):
                a, m, s = (float(td[key][b, i]) for key in ("action", "loc", "scale"))
                expected[b] += -0.5 * ((a - m) / s) ** 2 - math.log(s) - 0.5 * math.log(2 * math.pi)
        torch.testing.assert_close(td["action_log_prob"].detach(), expected)
        torch.testing.assert_close(td["scale"].detach(), torch.full((6, ACT), 0.7))

    def test_state_independent_vs_state_dependent_scale(self):
        obs = TensorDict({"observation": torch.randn(6, OBS)}, [6])
        actor, _ = make_continuous_actor_critic(OBS, ACT, hidden_sizes=(8,))
        scale = actor(obs.clone())["scale"]
        assert torch.equal(scale, scale[:1].expand_as(scale))  # one σ per dim, all states
        actor, _ = make_continuous_actor_critic(
            OBS, ACT, hidden_sizes=(8,), state_dependent_scale=True
        )
        with torch.no_grad():
            actor.module[0].module[0][-1].weight.normal_()
        scale = actor(obs.clone())["scale"]
        assert not torch.allclose(scale, scale[:1].expand_as(scale))
        assert (scale > 0).all()

    def test_relu_activation_changes_only_the_nonlinearity(self):
        """activation="relu": the same layers and initial weights, ReLU between them."""
        obs = TensorDict({"observation": torch.randn(6, OBS)}, [6])
        torch.manual_seed(3)
        tanh_actor, tanh_critic = make_continuous_actor_critic(OBS, ACT, hidden_sizes=(8, 8))
        torch.manual_seed(3)
        relu_actor, relu_critic = make_continuous_actor_critic(
            OBS, ACT, hidden_sizes=(8, 8), activation="relu"
        )
        for tanh_net, relu_net in ((tanh_actor, relu_actor), (tanh_critic, relu_critic)):
            kinds = {type(m) for m in relu_net.modules()}
            assert torch.nn.ReLU in kinds and torch.nn.Tanh not in kinds
            for a, b in zip(tanh_net.parameters(), relu_net.parameters(), strict=True):
                torch.testing.assert_close(a, b)
        # loc by hand: W3 relu(W2 relu(W1 x + b1) + b2) + b3
        linears = [m for m in relu_actor.modules() if isinstance(m, torch.nn.Linear)]
        x = obs["observation"]
        for layer in linears[:-1]:
            x = torch.relu(layer(x))
        expected = linears[-1](x)
        torch.testing.assert_close(relu_actor(obs.clone())["loc"], expected)
        assert not torch.allclose(tanh_actor(obs.clone())["loc"], expected)

    def test_bad_activation(self):
        with pytest.raises(ValueError, match=r"activation must be one of .*'gelu'"):
            make_continuous_actor_critic(OBS, ACT, activation="gelu")
        with pytest.raises(ValueError, match="recurrent torsos use tanh; got activation='relu'"):
            make_continuous_actor_critic(OBS, ACT, recurrent="lstm", activation="relu")


def feed_forward_reference(state_dependent_scale):
    """The feed-forward networks built by hand as before the recurrent option existed."""
    from tensordict.nn import TensorDictModule
    from tensordict.nn.distributions import AddStateIndependentNormalScale, NormalParamExtractor
    from torchrl.modules import IndependentNormal, ProbabilisticActor

    from ac_extensions.modules.dueling import _ObservationActionMLP
    from ac_extensions.modules.layers import mlp

    hidden = (16,)
    if state_dependent_scale:
        body = torch.nn.Sequential(
            mlp(OBS, 2 * ACT, hidden, head_gain=0.01),
            NormalParamExtractor(scale_mapping="biased_softplus_1.0"),
        )
    else:
        body = torch.nn.Sequential(
            mlp(OBS, ACT, hidden, head_gain=0.01),
            AddStateIndependentNormalScale(ACT, scale_mapping="exp", init_value=math.log(0.8)),
        )
    actor = ProbabilisticActor(
        TensorDictModule(body, ["observation"], ["loc", "scale"]),
        in_keys=["loc", "scale"],
        out_keys=["action"],
        distribution_class=IndependentNormal,
        return_log_prob=True,
    )
    sdn = StochasticDuelingNetwork(
        mlp(OBS, 1, hidden, head_gain=1.0),
        _ObservationActionMLP(mlp(OBS + ACT, 1, hidden, head_gain=1.0)),
    )
    return actor, sdn


def recurrent_pair(cell, state_dependent_scale=False, seed=0):
    torch.manual_seed(seed)
    return make_continuous_actor_critic(
        OBS,
        ACT,
        hidden_sizes=(16,),
        recurrent=cell,
        recurrent_size=8,
        state_dependent_scale=state_dependent_scale,
        init_scale=0.8,
    )


def hidden_keys(cell, name):
    if cell == "lstm":
        return [f"{name}_recurrent_state_h", f"{name}_recurrent_state_c"]
    return [f"{name}_recurrent_state"]


def run_step_by_step(actor, sdn, observation, is_init, cell):
    """Sequential mode (as at collection) over [B, T], carrying both hidden states by hand."""
    batch, steps = observation.shape[:2]
    keys = hidden_keys(cell, "actor") + hidden_keys(cell, "critic")
    state = {k: torch.zeros(batch, 1, 8) for k in keys}
    rows, starts = [], {k: [] for k in keys}
    for t in range(steps):
        td = TensorDict({"observation": observation[:, t], "is_init": is_init[:, t]}, [batch])
        reset = is_init[:, t].reshape(batch, 1, 1)
        state = {k: torch.where(reset, 0.0, v) for k, v in state.items()}  # the primer's reset
        td.update(state)
        for k in keys:
            starts[k].append(state[k])
        with torch.no_grad():
            stats, values = actor.get_dist_params(td.clone()), sdn(td.clone())
        rows.append(stats.select("loc", "scale").update(values.select("state_value")))
        state = {k: (stats if k.startswith("actor") else values)["next", k] for k in keys}
    out = torch.stack(rows, 1)
    stored = {k: torch.stack(v, 1) for k, v in starts.items()}
    return out, stored


class TestRecurrent:
    @pytest.mark.parametrize("state_dependent_scale", [False, True])
    def test_feed_forward_networks_are_unchanged(self, state_dependent_scale):
        # Same parameter names, values (same RNG draws) and outputs as the hand-built networks.
        torch.manual_seed(0)
        actor, sdn = make_continuous_actor_critic(
            OBS,
            ACT,
            hidden_sizes=(16,),
            init_scale=0.8,
            state_dependent_scale=state_dependent_scale,
        )
        torch.manual_seed(0)
        ref_actor, ref_sdn = feed_forward_reference(state_dependent_scale)
        for new, old in ((actor, ref_actor), (sdn, ref_sdn)):
            new_params, old_params = dict(new.named_parameters()), dict(old.named_parameters())
            assert list(new_params) == list(old_params)
            assert all(torch.equal(new_params[k], old_params[k]) for k in old_params)
        assert sdn.torso is None
        assert sdn.in_keys == ["observation", "action", "loc", "scale"]
        assert sdn.out_keys == ["state_value", "action_value"]
        td = TensorDict({"observation": torch.randn(6, OBS)}, [6])
        torch.manual_seed(1)
        out = sdn(actor(td.clone()))
        torch.manual_seed(1)
        expected = ref_sdn(ref_actor(td.clone()))
        for key in ("loc", "scale", "action", "state_value", "action_value"):
            assert torch.equal(out[key], expected[key]), key

    @pytest.mark.parametrize("cell", ["lstm", "gru"])
    def test_separate_memories_and_distinct_hidden_keys(self, cell):
        actor, sdn = recurrent_pair(cell)
        actor_keys, critic_keys = hidden_keys(cell, "actor"), hidden_keys(cell, "critic")
        assert set(actor.in_keys) == {"observation", "is_init", *actor_keys}
        assert set(sdn.in_keys) == {
            "observation", "is_init", *critic_keys, "action", "loc", "scale"
        }  # fmt: skip
        assert {("next", k) for k in critic_keys} <= set(sdn.out_keys)
        actor_params = {p.data_ptr() for p in actor.parameters()}
        assert not actor_params & {p.data_ptr() for p in sdn.parameters()}
        # A(x, a) reads [critic features, action]: recurrent_size + d inputs.
        assert sdn.advantage_network.net[0].in_features == 8 + ACT
        assert sdn.observation_key == "critic_memory"

    @pytest.mark.parametrize("state_dependent_scale", [False, True])
    @pytest.mark.parametrize("cell", ["lstm", "gru"])
    def test_recurrent_mode_replays_the_step_by_step_outputs(self, cell, state_dependent_scale):
        # Run step by step (sequential, hidden carried, a reset at t = 4 in row 1), store the
        # incoming states; a recurrent-mode pass over [B, T] from the stored states gives the
        # same loc, scale and V at every step.
        from torchrl.modules import set_recurrent_mode

        actor, sdn = recurrent_pair(cell, state_dependent_scale)
        gen = torch.Generator().manual_seed(3)
        observation = torch.randn(2, 7, OBS, generator=gen)
        is_init = torch.zeros(2, 7, 1, dtype=torch.bool)
        is_init[:, 0] = True
        is_init[1, 4] = True
        expected, stored = run_step_by_step(actor, sdn, observation, is_init, cell)
        td = TensorDict({"observation": observation, "is_init": is_init, **stored}, [2, 7])
        with set_recurrent_mode(True), torch.no_grad():
            out = sdn(td.clone()).update(actor.get_dist_params(td.clone()).select("loc", "scale"))
        for key in ("loc", "scale", "state_value"):
            torch.testing.assert_close(out[key], expected[key], atol=1e-6, rtol=0)
        assert (expected["loc"][:, 1] != expected["loc"][:, 0]).all()  # the memory matters

    @pytest.mark.parametrize("cell", ["lstm", "gru"])
    def test_dueling_heads_read_the_critic_features(self, cell):
        # Q̃(x, a) = V(h) + A(h, a) − (1/n) Σ_i A(h, u_i), h the critic memory's output.
        _, sdn = recurrent_pair(cell)
        state = {k: torch.randn(5, 1, 8) for k in hidden_keys(cell, "critic")}
        _, action, loc, scale = (x.float() for x in inputs())
        td = TensorDict(
            {"observation": torch.randn(5, OBS), "is_init": torch.zeros(5, 1, dtype=torch.bool),
             "action": action, "loc": loc, "scale": scale, **state}, [5]
        )  # fmt: skip
        torch.manual_seed(4)
        out = sdn(td.clone())
        features = out["critic_memory"]
        assert features.shape == (5, 8)
        torch.manual_seed(4)
        expected = sdn.action_value(features, action, loc, scale)
        torch.testing.assert_close(out["action_value"], expected)
        torch.testing.assert_close(out["state_value"], sdn.state_value(features))
        assert out["next", hidden_keys(cell, "critic")[0]].shape == (5, 1, 8)
        # The stored hidden state changes V: the critic is recurrent.
        other = td.clone()
        for key in state:
            other[key] = torch.zeros_like(other[key])
        assert not torch.allclose(sdn(other)["state_value"], out["state_value"])

    def test_recurrent_bad_arguments(self):
        with pytest.raises(ValueError, match="recurrent must be 'lstm', 'gru' or None"):
            make_continuous_actor_critic(OBS, ACT, recurrent="rnn")
        with pytest.raises(ValueError, match="recurrent_size must be an int >= 1"):
            make_continuous_actor_critic(OBS, ACT, recurrent="gru", recurrent_size=0)
        _, sdn = recurrent_pair("gru")
        with pytest.raises(TypeError, match="torso must be a TensorDict module"):
            StochasticDuelingNetwork(
                sdn.value_network, sdn.advantage_network, torso=torch.nn.Identity()
            )
        with pytest.raises(ValueError, match=r"observation_key \('observation'\) must be one"):
            StochasticDuelingNetwork(sdn.value_network, sdn.advantage_network, torso=sdn.torso)
        with pytest.raises(KeyError):  # no stored hidden state
            sdn(TensorDict({"observation": torch.randn(5, OBS)}, [5]))
