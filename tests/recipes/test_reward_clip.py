"""The reward clip: the learner sees rewards in [−c, c], the logged returns stay the env's."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from ac_extensions.objectives import ACERLoss, ReactorLoss
from ac_extensions.recipes import a2c, acer, ppo, reactor
from ac_extensions.runtime import label_sequences
from ac_extensions.runtime.on_policy import clip_rewards

ENV = "tests._spaces:BigRewardToy-v0"  # 5 per step, episodes of 4 steps: returns of 20
SMALL = {"env_id": ENV, "workers": 1, "envs_per_worker": 2, "rollout_length": 8}


def test_label_sequences_clips_before_scaling_and_leaves_the_batch_alone():
    reward = torch.tensor([[-3.0, -0.5, 0.0, 0.4, 7.0]]).unsqueeze(-1)
    batch = TensorDict({("next", "reward"): reward.clone()}, [1, 5])
    rows = label_sequences(batch, None, 0, reward_scale=0.1, reward_clip=1.0)
    expected = torch.tensor([[-1.0, -0.5, 0.0, 0.4, 1.0]]).unsqueeze(-1) * 0.1
    torch.testing.assert_close(rows["next", "reward"], expected)
    assert torch.equal(batch["next", "reward"], reward)
    unclipped = label_sequences(batch, None, 0, reward_scale=0.1)
    torch.testing.assert_close(unclipped["next", "reward"], reward * 0.1)


def test_on_policy_clip_rewards():
    reward = torch.tensor([[-3.0, 0.25, 2.0]]).unsqueeze(-1)
    batch = TensorDict({("next", "reward"): reward.clone()}, [1, 3])
    clip_rewards(batch, ppo.PPOConfig(reward_clip=0.5))
    torch.testing.assert_close(batch["next", "reward"], torch.tensor([[[-0.5], [0.25], [0.5]]]))
    clip_rewards(batch, ppo.PPOConfig())  # None: untouched
    torch.testing.assert_close(batch["next", "reward"], torch.tensor([[[-0.5], [0.25], [0.5]]]))


@pytest.mark.parametrize(
    "config_class",
    [ppo.PPOConfig, a2c.A2CConfig, acer.ACERConfig, reactor.ReactorConfig],
)
def test_atari_defaults_clip_rewards_to_one(config_class):
    assert config_class.for_env("ALE/Pong-v5").reward_clip == 1.0
    assert config_class.for_env("MinAtar/Breakout-v1").reward_clip is None
    assert config_class.for_env("CartPole-v1").reward_clip is None


@pytest.mark.parametrize("value", [0.0, -1.0, float("inf")])
def test_reward_clip_is_validated(value):
    with pytest.raises(ValueError, match="reward_clip"):
        ppo.PPOConfig(reward_clip=value)


def _returns(metrics):
    return [m["train/episode_return"] for m in metrics if m["train/episodes"] > 0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("recipe", [ppo, a2c])
def test_on_policy_learner_sees_clipped_rewards(recipe, monkeypatch):
    seen = []
    compute = recipe.compute_advantages

    def recording(batch, *args, **kwargs):
        seen.append(batch["next", "reward"].clone())
        return compute(batch, *args, **kwargs)

    monkeypatch.setattr(recipe, "compute_advantages", recording)
    config_class = recipe.PPOConfig if recipe is ppo else recipe.A2CConfig
    metrics = list(recipe.train(config_class(frames=64, reward_clip=1.0, **SMALL)))
    assert seen and all(bool((r == 1.0).all()) for r in seen)
    assert _returns(metrics) and set(_returns(metrics)) == {20.0}


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("recipe", "loss_class", "extra"),
    [
        (acer, ACERLoss, {"replay_start": 16, "replay_ratio": 1.0}),
        (reactor, ReactorLoss, {"replay_start": 16, "sequence_length": 4, "batch_size": 2}),
    ],
)
def test_off_policy_losses_see_clipped_rewards(recipe, loss_class, extra, monkeypatch):
    seen = []
    forward = loss_class.forward

    def recording(self, tensordict, *args, **kwargs):
        seen.append(tensordict["next", "reward"].clone())
        return forward(self, tensordict, *args, **kwargs)

    monkeypatch.setattr(loss_class, "forward", recording)
    config_class = recipe.ACERConfig if recipe is acer else recipe.ReactorConfig
    config = config_class(frames=64, reward_clip=1.0, reward_scale=0.5, **SMALL, **extra)
    metrics = list(recipe.train(config))
    assert seen and all(bool((r == 0.5).all()) for r in seen)  # clip to 1, then scale
    assert _returns(metrics) and set(_returns(metrics)) == {20.0}
