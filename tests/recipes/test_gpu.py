"""CUDA runs of every recipe (marked ``gpu``: skipped without a CUDA device, see conftest).

Each recipe trains for a few batches with ``device="cuda"`` (the learner and its networks on
the GPU, the workers stepping the environments on CPU) and must yield finite losses; the
Atari branch of ACER (Nature-CNN policy-plus-Q network on stacked frames) takes its updates
on the GPU too.
"""

from __future__ import annotations

import math
from itertools import islice

import pytest

from ac_extensions.recipes import a2c, acer, ppo, reactor

pytestmark = pytest.mark.gpu

SMALL = {"workers": 1, "envs_per_worker": 2, "rollout_length": 16, "device": "cuda"}
CASES = {
    "a2c": (a2c.A2CConfig, a2c.train, {}),
    "ppo": (ppo.PPOConfig, ppo.train, {"minibatch_size": 16, "epochs": 2}),
    "acer": (acer.ACERConfig, acer.train, {"replay_start": 32}),
    "acer-pendulum": (acer.ACERConfig, acer.train, {"env_id": "Pendulum-v1", "replay_start": 32}),
    "acer-atari": (
        acer.ACERConfig,
        acer.train,
        {"env_id": "ALE/Pong-v5", "replay_start": 32, "batch_size": 4, "envs_per_worker": 1},
    ),
    "reactor": (reactor.ReactorConfig, reactor.train, {"replay_start": 32, "sequence_length": 8}),
    "reactor-lstm": (
        reactor.ReactorConfig,
        reactor.train,
        {"replay_start": 32, "sequence_length": 8, "recurrent": True},
    ),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(CASES))
def test_recipe_trains_on_cuda(name):
    config_class, train, extra = CASES[name]
    config = config_class(seed=0, frames=10_000, **(SMALL | extra))
    runs = train(config)
    try:
        metrics = list(islice(runs, 4))
    finally:
        runs.close()
    assert len(metrics) == 4
    losses = {k: v for k, v in metrics[-1].items() if "loss" in k}
    assert losses, f"{name}: no loss metric in {sorted(metrics[-1])}"
    assert all(math.isfinite(v) for v in losses.values()), losses
