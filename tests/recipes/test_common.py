"""The collector life cycle shared by the recipes."""

from __future__ import annotations

import gc

from torchrl.weight_update import SharedMemWeightSyncScheme

from ac_extensions.recipes._common import SharedWeights


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
