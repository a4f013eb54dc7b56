"""``OverlappedCollector``: batch k+1 is collected during the update on batch k, with fixed weights.

A fake collector stands in for TorchRL's: each ``next`` records the weight its policy copy
(``mirror``) holds at that moment, so the tests can check which learner weights every batch
was collected with, and that the collection of the next batch runs while the learner updates.
The recipes' runs with ``overlap_collection`` are in ``tests/recipes``.
"""

from __future__ import annotations

import copy
import threading

import pytest
import torch
from torch import nn

from ac_extensions.recipes import A2CConfig, ACERConfig, PPOConfig, ReactorConfig
from ac_extensions.runtime import OverlappedCollector

WAIT = 10.0
"""Seconds a test waits for the other thread before calling the overlap missing."""


class FakeCollector:
    """Yields ``batches`` batches; each is the mirror's weight when its collection started."""

    def __init__(self, mirror: nn.Module, batches: int, fail_at: int | None = None) -> None:
        self.mirror, self.batches, self.fail_at = mirror, batches, fail_at
        self.started = [threading.Event() for _ in range(batches)]
        self.weight_updates = 0
        self.stopped = False

    def __iter__(self):
        for index in range(self.batches):
            self.started[index].set()
            if index == self.fail_at:
                raise RuntimeError(f"worker died during batch {index}")
            yield float(self.mirror.weight.detach())

    def update_policy_weights_(self) -> None:
        self.weight_updates += 1

    def shutdown(self) -> None:
        self.stopped = True


def make(batches: int, fail_at: int | None = None):
    source = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        source.weight.fill_(0.0)
    mirror = copy.deepcopy(source)
    fake = FakeCollector(mirror, batches, fail_at)
    return source, mirror, fake, OverlappedCollector(fake, source, mirror)


def test_each_batch_is_collected_with_the_weights_of_one_update_before():
    # The learner adds 1 to its weight per batch: after update k it holds k + 1. Batch 0 is
    # collected with the initial weight 0, batch 1 during the update on batch 0 (still 0),
    # batch k + 1 with the weight after update k - 1, i.e. k.
    source, mirror, fake, collector = make(batches=5)
    seen = []
    for index, batch in enumerate(collector):
        seen.append(batch)
        if index + 1 < fake.batches:  # the next batch is collected beside this update
            assert fake.started[index + 1].wait(WAIT), f"batch {index + 1} did not start"
        with torch.no_grad():
            source.weight.add_(1.0)  # the update, in place, as the optimiser does it
        assert float(mirror.weight) == index  # the workers' copy is untouched by it
        collector.update_policy_weights_()
        assert float(mirror.weight) == index + 1
    assert seen == [0.0, 0.0, 1.0, 2.0, 3.0]
    assert fake.weight_updates == 5


def test_the_mirror_keeps_its_own_storage():
    source, mirror, _, _ = make(batches=1)
    assert source.weight.data_ptr() != mirror.weight.data_ptr()


def test_a_collection_error_reaches_the_learner():
    *_, collector = make(batches=4, fail_at=2)
    batches = iter(collector)
    next(batches)
    collector.update_policy_weights_()
    next(batches)
    collector.update_policy_weights_()  # batch 2 fails while this update runs
    with pytest.raises(RuntimeError, match="worker died during batch 2"):
        next(batches)


def test_shutdown_stops_the_wrapped_collector_and_other_attributes_pass_through():
    _, _, fake, collector = make(batches=3)
    next(iter(collector))
    assert collector.batches == 3  # the fake's own attribute
    collector.shutdown()
    assert fake.stopped


@pytest.mark.parametrize("config_class", [A2CConfig, PPOConfig, ACERConfig, ReactorConfig])
@pytest.mark.parametrize(
    "options",
    [{"backend": "ray"}, {"async_collection": True}],
    ids=["ray", "async"],
)
def test_overlap_collection_needs_local_synchronous_collection(config_class, options):
    assert config_class(overlap_collection=True).overlap_collection  # every recipe takes it
    with pytest.raises(ValueError, match="overlap_collection needs backend 'local'"):
        config_class(overlap_collection=True, **options)
