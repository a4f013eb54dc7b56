"""CategoricalSampler: the feed-forward collection policy equals the ProbabilisticActor."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.envs import ExplorationType, set_exploration_type

from ac_extensions.modules import CategoricalSampler, collection_policy, make_actor_critic


def _outputs(policy, observation, exploration):
    torch.manual_seed(7)
    td = TensorDict(observation=observation, batch_size=observation.shape[:-1])
    if exploration is None:
        return policy(td)
    with set_exploration_type(exploration):
        return policy(td)


@pytest.mark.parametrize(
    "exploration", [ExplorationType.RANDOM, ExplorationType.DETERMINISTIC, None]
)
def test_same_draws_and_log_probs_as_the_actor(exploration):
    torch.manual_seed(0)
    actor, critic = make_actor_critic(4, 3)
    with torch.no_grad():  # spread the logits so that sampling and argmax differ
        actor.module[0].module[-1].weight.mul_(300)
    policy = collection_policy(actor, critic)
    assert isinstance(policy.module, CategoricalSampler)
    observation = torch.randn(16, 8, 4)  # [B, T, O]
    expected = _outputs(actor, observation, exploration)
    got = _outputs(policy, observation, exploration)
    assert got["action"].shape == (16, 8) and got["action"].dtype == torch.int64
    assert torch.equal(got["action"], expected["action"])
    torch.testing.assert_close(got["logits"], expected["logits"])
    torch.testing.assert_close(got["action_log_prob"], expected["action_log_prob"])
    # log π(a) by hand.
    log_probs = got["logits"].log_softmax(-1)
    hand = log_probs.gather(-1, got["action"].unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(got["action_log_prob"], hand)
    if exploration != ExplorationType.RANDOM:
        assert torch.equal(got["action"], got["logits"].argmax(-1))


def test_random_actions_follow_the_policy():
    net = torch.nn.Linear(1, 3, bias=False)
    with torch.no_grad():
        net.weight.copy_(torch.log(torch.tensor([[0.2], [0.3], [0.5]])))
    sampler = CategoricalSampler(net)
    torch.manual_seed(0)
    with set_exploration_type(ExplorationType.RANDOM):
        _, action, _ = sampler(torch.ones(20_000, 1))
    frequency = torch.bincount(action, minlength=3).float() / action.numel()
    torch.testing.assert_close(frequency, torch.tensor([0.2, 0.3, 0.5]), atol=0.015, rtol=0)


def test_recurrent_actors_keep_the_actor():
    actor, critic = make_actor_critic(4, 2, recurrent="gru", recurrent_size=8)
    assert not isinstance(
        getattr(collection_policy(actor, critic), "module", None), CategoricalSampler
    )
