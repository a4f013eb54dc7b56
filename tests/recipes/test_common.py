"""The collector life cycle shared by the recipes."""

from __future__ import annotations

import gc
import math
import multiprocessing as mp
import sys

import pytest
from torchrl.weight_update import SharedMemWeightSyncScheme

from ac_extensions.recipes import PPOConfig, ppo
from ac_extensions.runtime.collection import SharedWeights, start_method


def test_weight_sync_scheme_does_no_work_in_its_finaliser(monkeypatch):
    # TorchRL's finaliser calls shutdown(), which starts a queue feeder thread and can deadlock
    # when the garbage collector runs it; ours must leave that to stop_collector.
    calls = []
    monkeypatch.setattr(SharedMemWeightSyncScheme, "shutdown", lambda self: calls.append(self))
    scheme = SharedWeights()
    del scheme
    gc.collect()
    assert calls == []
    # ...while TorchRL's own class would have called it (the test can fail).
    scheme = SharedMemWeightSyncScheme()
    del scheme
    gc.collect()
    assert len(calls) == 1


def test_start_method_resolution_and_validation():
    assert PPOConfig().worker_start_method == ("fork" if sys.platform == "linux" else "spawn")
    assert PPOConfig(start_method="spawn").worker_start_method == "spawn"
    assert PPOConfig(device="cuda").worker_start_method == "spawn"
    with pytest.raises(ValueError, match="CUDA learner"):
        PPOConfig(device="cuda", start_method="fork")
    with pytest.raises(ValueError, match="start_method must be"):
        PPOConfig(start_method="thread")


@pytest.mark.parametrize("before", [None, "spawn"])
def test_start_method_block_restores_the_callers_setting(before):
    previous = mp.get_start_method(allow_none=True)
    try:
        mp.set_start_method(before, force=True)
        with start_method("fork"):
            assert mp.get_start_method(allow_none=True) == "fork"
        assert mp.get_start_method(allow_none=True) == before
        with pytest.raises(RuntimeError, match="inside"), start_method("forkserver"):
            raise RuntimeError("inside")
        assert mp.get_start_method(allow_none=True) == before
    finally:
        mp.set_start_method(previous, force=True)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_both_start_methods_train(method):
    # The same seeded run with spawned and with forked workers: both train, and the caller's
    # start method is untouched afterwards.
    before = mp.get_start_method(allow_none=True)
    config = PPOConfig(
        frames=512, workers=1, envs_per_worker=4, rollout_length=64, epochs=2, start_method=method
    )
    metrics = list(ppo.train(config))
    assert len(metrics) == 2 and metrics[-1]["time/frames"] == 512
    assert all(math.isfinite(m["train/loss_objective"]) for m in metrics)
    assert mp.get_start_method(allow_none=True) == before
