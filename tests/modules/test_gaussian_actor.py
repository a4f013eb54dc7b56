"""Gaussian actors of ``make_actor_critic``: log-densities against torch, σ, bounds, recurrence."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict
from torchrl.envs.utils import ExplorationType, set_exploration_type

from ac_extensions.modules import make_actor_critic


def sample(actor, td):
    with set_exploration_type(ExplorationType.RANDOM):
        return actor(td)


def test_normal_actor_log_prob_is_the_sum_over_dimensions_with_a_state_independent_scale():
    torch.manual_seed(0)
    actor, critic = make_actor_critic(3, 2, distribution="normal", init_scale=0.5)
    td = sample(actor, TensorDict({"observation": torch.randn(6, 3)}, [6]))
    assert td["action"].shape == (6, 2) and td["action_log_prob"].shape == (6,)
    assert torch.allclose(td["scale"], torch.full((6, 2), 0.5))
    expected = torch.distributions.Normal(td["loc"], td["scale"]).log_prob(td["action"]).sum(-1)
    assert torch.allclose(td["action_log_prob"], expected, atol=1e-6)
    # σ is one parameter per dimension, shared by every state (it gets a gradient).
    scale_params = [p for n, p in actor.named_parameters() if "log_scale" in n or "scale" in n]
    assert [tuple(p.shape) for p in scale_params] == [(2,)]
    assert critic(td)["state_value"].shape == (6, 1)


def test_tanh_normal_actions_stay_inside_the_bounds():
    torch.manual_seed(0)
    low, high = torch.tensor([-2.0, 0.0]), torch.tensor([2.0, 1.0])
    actor, _ = make_actor_critic(
        3, 2, distribution="tanh_normal", init_scale=3.0, action_bounds=(low, high)
    )
    td = sample(actor, TensorDict({"observation": 5 * torch.randn(500, 3)}, [500]))
    action = td["action"].detach()
    assert bool(((action >= low) & (action <= high)).all())
    assert float(action[:, 0].std()) > 0.5  # the wide σ reaches most of [−2, 2]
    assert bool(td["action_log_prob"].isfinite().all())


@pytest.mark.parametrize("recurrent", ["lstm", "gru"])
def test_recurrent_gaussian_actor_stores_its_state(recurrent):
    actor, _ = make_actor_critic(3, 2, distribution="normal", recurrent=recurrent)
    hidden = {
        "lstm": ["actor_recurrent_state_h", "actor_recurrent_state_c"],
        "gru": ["actor_recurrent_state"],
    }[recurrent]
    td = TensorDict(
        {"observation": torch.randn(4, 3), "is_init": torch.ones(4, 1, dtype=torch.bool)}
        | {key: torch.zeros(4, 1, 64) for key in hidden},
        [4],
    )
    td = sample(actor, td)
    assert td["action"].shape == (4, 2) and td["scale"].shape == (4, 2)
    assert td["next", hidden[0]].shape == (4, 1, 64)


def test_shared_torso_gaussian_actor():
    actor, critic = make_actor_critic(3, 2, distribution="normal", share_torso=True)
    body = actor.module[0].module[0][0][0]
    assert body is critic.module[0][0]
    td = sample(actor, TensorDict({"observation": torch.randn(4, 3)}, [4]))
    assert td["action"].shape == (4, 2)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"distribution": "beta"}, "distribution must be one of"),
        ({"distribution": "normal", "init_scale": 0.0}, "init_scale"),
        ({"distribution": "normal", "init_scale": math.inf}, "init_scale"),
    ],
)
def test_bad_distribution_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_actor_critic(3, 2, **kwargs)
