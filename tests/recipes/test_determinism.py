"""Determinism: a fixed seed and one worker give the same metrics, update for update.

Two CPU runs of each recipe with the same config must yield identical metrics (every
``train/*``, ``eval/*`` and ``collector/*`` value, bit for bit) for their first updates; only the
``time/*`` metrics (wall clock) may differ. The losses must change from update to update, so
the comparison is not vacuous. The runs go one after the other in this process, each with its own
collector worker (forked, the default on Linux: it starts with the learner's seeded torch RNG
state), so the seeding of torch, the workers' environments and the recipe's own generator is all
that makes them agree.
"""

from __future__ import annotations

import math
from itertools import islice

import pytest

from ac_extensions.recipes import a2c, acer, ppo, reactor

SMALL = {"workers": 1, "envs_per_worker": 2, "rollout_length": 16, "hidden_sizes": (16,)}
RECIPES = {
    "a2c": (a2c.A2CConfig, a2c.train, {}),
    "ppo": (ppo.PPOConfig, ppo.train, {"minibatch_size": 16, "epochs": 2}),
    # the next batch collected beside each update, with the weights of the update before
    "a2c_overlap": (a2c.A2CConfig, a2c.train, {"overlap_collection": True}),
    "ppo_overlap": (
        ppo.PPOConfig,
        ppo.train,
        {"minibatch_size": 16, "epochs": 2, "overlap_collection": True},
    ),
    # replay from the second batch on, so the off-policy updates are covered too
    "acer": (acer.ACERConfig, acer.train, {"replay_start": 32, "replay_ratio": 2.0}),
    "reactor": (
        reactor.ReactorConfig,
        reactor.train,
        {"replay_start": 32, "sequence_length": 8, "batch_size": 4},
    ),
    # acting beside learning, one batch behind, for the off-policy learners too
    "acer_overlap": (
        acer.ACERConfig,
        acer.train,
        {"replay_start": 32, "replay_ratio": 2.0, "overlap_collection": True},
    ),
    "reactor_overlap": (
        reactor.ReactorConfig,
        reactor.train,
        {"replay_start": 32, "sequence_length": 8, "batch_size": 4, "overlap_collection": True},
    ),
}
UPDATES = 4
"""Batches (each with its updates) compared per run."""


def first_metrics(name: str, seed: int) -> list[dict[str, float]]:
    config_class, train, extra = RECIPES[name]
    config = config_class(seed=seed, frames=10_000, **SMALL, **extra)
    runs = train(config)
    try:
        metrics = list(islice(runs, UPDATES))
    finally:
        runs.close()  # stops the collector
    return [{k: v for k, v in m.items() if not k.startswith("time/")} for m in metrics]


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", sorted(RECIPES))
def test_same_seed_same_metrics(name):
    first, second = first_metrics(name, seed=5), first_metrics(name, seed=5)
    assert len(first) == len(second) == UPDATES
    for step, (a, b) in enumerate(zip(first, second, strict=True)):
        assert a.keys() == b.keys()
        differing = {k: (a[k], b[k]) for k in a if not same(a[k], b[k])}
        assert not differing, f"{name}, batch {step}: metrics differ between runs: {differing}"
    losses = [k for k in first[-1] if "loss" in k]
    assert losses, f"{name}: no loss metric to compare"
    # not vacuous: the compared losses move from update to update
    assert any(len({m[k] for m in first if k in m}) > 1 for k in losses), (
        f"{name}: the losses {losses} did not change over {UPDATES} batches"
    )


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", ["acer", "reactor"])
def test_overlapped_collection_lags_the_learner_by_one_batch(name):
    # The first batch is collected with the initial weights either way, so the first learning
    # agrees; the second is collected with the initial weights again when overlapped (beside
    # the learning on the first), with the learned ones otherwise, so the runs part there.
    plain, overlapped = first_metrics(name, seed=5), first_metrics(f"{name}_overlap", seed=5)
    assert plain[0] == overlapped[0]
    later = [k for k in plain[-1] if "loss" in k]
    assert any(plain[-1][k] != overlapped[-1][k] for k in later), later
