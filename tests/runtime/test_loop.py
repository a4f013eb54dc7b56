"""runtime.loop.Run: resume, the run's end, checkpoints and the collector's shutdown."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from ac_extensions.runtime import Checkpointer, RunConfig, loop
from ac_extensions.runtime.loop import Run, seed_run

CONFIG = RunConfig(frames=40, workers=1, envs_per_worker=2, rollout_length=5, seed=3)


def parts():
    torch.manual_seed(0)
    loss = torch.nn.Linear(2, 1)
    return loss, torch.optim.Adam(loss.parameters(), lr=0.1)


def test_seed_run_seeds_torch_and_the_generator():
    generator = seed_run(CONFIG)
    first = torch.rand(1)
    torch.manual_seed(CONFIG.seed)
    assert torch.equal(first, torch.rand(1))
    assert torch.equal(
        torch.rand(2, generator=generator),
        torch.rand(2, generator=torch.Generator().manual_seed(3)),
    )


def test_a_fresh_run_counts_from_zero_and_saves_on_schedule(tmp_path):
    loss, optimizer = parts()
    checkpoint = Checkpointer(tmp_path, every=2)
    run = Run(CONFIG, loss, optimizer, checkpoint, generator=torch.Generator())
    assert (run.done, run.num_batches, run.counters, run.finished) == (0, 4, {}, False)
    run.save(0, sequences=2)  # batch 1 of 4: not on the schedule
    assert checkpoint.latest() is None
    run.save(1, sequences=4)  # batch 2
    assert checkpoint.latest() is not None

    with torch.no_grad():
        loss.weight.add_(1.0)  # a later state, not saved
    resumed_loss, resumed_optimizer = parts()
    resumed = Run(CONFIG, resumed_loss, resumed_optimizer, checkpoint, generator=torch.Generator())
    assert resumed.done == 2 and resumed.counters["sequences"] == 4 and not resumed.finished
    assert not torch.equal(resumed_loss.weight, loss.weight)  # the saved weights, not the later

    resumed.save(3)  # the last batch is always saved: the run is complete
    assert Run(CONFIG, *parts(), checkpoint).finished


def test_batches_are_rows_counted_on_from_the_resumed_batch(tmp_path):
    run = Run(CONFIG, *parts())
    run.done = 2
    collected = [TensorDict({"x": torch.zeros(1, 2, 5)}, [1, 2, 5]) for _ in range(2)]
    out = list(run.batches(collected))
    assert [i for i, _ in out] == [2, 3] and out[0][1].shape == (2, 5)


def test_the_collector_stops_however_the_block_ends(monkeypatch):
    started, stopped = [], []
    monkeypatch.setattr(loop, "start_collector", lambda *a, **k: started.append(k) or "c")
    monkeypatch.setattr(loop, "stop_collector", lambda c, replay=None: stopped.append(c))
    run = Run(CONFIG, *parts())
    with pytest.raises(RuntimeError, match="boom"):
        with run.collector(lambda: None, torch.nn.Identity()):
            raise RuntimeError("boom")
    assert stopped == ["c"]
    assert started[0]["frames"] == 40 and started[0]["seed"] == 3
