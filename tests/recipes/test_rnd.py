"""PPO with Random Network Distillation in the recipe: trains, logs both streams, resumes.

Each test that trains spawns a collector worker and carries a timeout.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from ac_extensions.objectives import RNDPPOLoss
from ac_extensions.recipes import PPOConfig
from ac_extensions.recipes import ppo as ppo_recipe
from ac_extensions.runtime import Checkpointer


def test_build_gives_two_value_heads_and_a_frozen_target():
    config = PPOConfig(env_id="MountainCar-v0", rnd=True, workers=1, envs_per_worker=2)
    _, critic, loss, _, _, _ = ppo_recipe.build(config)
    assert isinstance(loss, RNDPPOLoss)
    assert critic.out_keys == ["state_value", "state_value_intrinsic"]
    trained = {id(p) for p in loss.parameters() if p.requires_grad}
    assert not any(id(p) in trained for p in loss.rnd.target.parameters())
    assert all(id(p) in trained for p in loss.rnd.predictor.parameters())


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(intrinsic_gamma=1.5), "intrinsic_gamma"),
        (dict(rnd_proportion=0.0), "rnd_proportion"),
        (dict(clip_value=0.2), "clip_value"),
        (dict(async_collection=True, workers=2), "needs workers=1"),
    ],
)
def test_bad_rnd_settings_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        PPOConfig(env_id="MountainCar-v0", rnd=True, **bad)


@pytest.mark.timeout(300)
def test_rnd_run_logs_both_streams_and_resumes_its_statistics(tmp_path, monkeypatch):
    built = []
    original = ppo_recipe.build

    def recording_build(config):
        parts = original(config)
        built.append(parts[2])
        return parts

    monkeypatch.setattr(ppo_recipe, "build", recording_build)
    config = PPOConfig(
        env_id="MountainCar-v0",
        rnd=True,
        frames=1024,
        workers=1,
        envs_per_worker=4,
        rollout_length=64,
        epochs=2,
        rnd_init_steps=16,
        seed=2,
    )
    checkpoint = Checkpointer(tmp_path / "ckpt", every=1)
    first = list(ppo_recipe.train(config, checkpoint=checkpoint))
    assert len(first) == 4
    for metrics in first:
        for key in ("train/intrinsic_reward", "train/intrinsic_return", "train/loss_rnd"):
            assert np.isfinite(metrics[key]), key
    rnd = built[-1].rnd
    # 4 envs × 16 random steps, then 4 batches of 256 frames.
    assert rnd.observations.count.item() == pytest.approx(64 + 1024 + 1e-4)
    assert rnd.rewards.count.item() == pytest.approx(1024 + 1e-4)
    saved = checkpoint.load()["loss"]
    assert torch.equal(saved["rnd.observations.loc"], rnd.observations.loc)
    assert torch.equal(saved["rnd.target.0.weight"], rnd.target[0].weight)
    resumed = list(ppo_recipe.train(replace(config, frames=1536), checkpoint=checkpoint))
    assert len(resumed) == 2 and resumed[-1]["time/frames"] == 1536
    again = built[-1].rnd  # restored, not started again from random steps
    assert again.observations.count.item() == pytest.approx(64 + 1536 + 1e-4)
    torch.testing.assert_close(again.target[0].weight, rnd.target[0].weight)
    assert again.rewards.returns.shape == (4,)  # one running intrinsic return per env row
    assert not torch.equal(again.predictor[0].weight, saved["rnd.predictor.0.weight"])  # trained on


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "env_id, extra",
    [
        ("MaskedCartPole-v1", dict(recurrent="lstm")),
        ("MinAtar/Breakout-v1", dict(share_torso=True)),
    ],
)
def test_rnd_trains_recurrent_and_image_policies(env_id, extra):
    if env_id.startswith("MinAtar"):
        pytest.importorskip("minatar")
    config = PPOConfig(
        env_id=env_id,
        rnd=True,
        frames=512,
        workers=1,
        envs_per_worker=2,
        rollout_length=64,
        epochs=1,
        rnd_init_steps=8,
        **extra,
    )
    metrics = list(ppo_recipe.train(config))
    assert len(metrics) == 4
    assert all(np.isfinite(m["train/loss_rnd"]) and m["train/loss_rnd"] > 0 for m in metrics)
    assert all(np.isfinite(m["train/intrinsic_return"]) for m in metrics)


FRAMES, THRESHOLD = 61_440, 0.5


def frames_to_window(config, threshold):
    """Frames at which the 20-episode mean return first reaches ``threshold`` (or None).

    The run stops there (closing the generator shuts its collector down).
    """
    run = ppo_recipe.train(config)
    try:
        for m in run:
            if m["train/return_window"] >= threshold:
                return m["time/frames"]
    finally:
        run.close()
    return None


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_rnd_finds_the_deep_sea_treasure_that_plain_ppo_never_does():
    # DeepSea-v0 (20 × 20), the recipe's defaults, seed 3. With RND the 20-episode window
    # passes 0.5 at 7,680 frames on an AMD EPYC (seeds 1 / 2: 37,376 / 17,920) and reaches
    # 0.99, every episode finding the treasure. PPO alone learns to stop paying for moves
    # right: its window never leaves 0 (seeds 1–3, 61,440 frames).
    found = frames_to_window(
        PPOConfig.for_env("DeepSea-v0", rnd=True, frames=FRAMES, seed=3), THRESHOLD
    )
    assert found is not None, f"with RND the window never reached {THRESHOLD} in {FRAMES:,} frames"
    plain = list(ppo_recipe.train(PPOConfig.for_env("DeepSea-v0", frames=20_480, seed=3)))
    best = max(m["train/return_window"] for m in plain)
    assert best < 0.1, f"PPO alone reached a window of {best:.2f} (RND: {THRESHOLD} at {found:,})"
