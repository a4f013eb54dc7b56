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
