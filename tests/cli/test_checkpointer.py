"""The checkpoint files: atomic, newest wins, corrupt ones rejected (no collector needed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from ac_extensions.runtime import (
    Checkpointer,
    CheckpointError,
    Progress,
    RunStopped,
    TrainingWarning,
    atomic_write_text,
    resume,
    training_state,
)
from ac_extensions.runtime import checkpoint as checkpoint_module


def _state(step: int) -> dict:
    return {"counters": {"batches": step}, "value": torch.tensor([float(step)])}


def test_every_k_updates_and_at_the_end(tmp_path):
    checkpointer = Checkpointer(tmp_path, every=3)
    saved = [
        u for u in range(1, 8) if checkpointer.maybe_save(u, lambda u=u: _state(u), final=u == 7)
    ]
    assert saved == [3, 6, 7]
    assert checkpointer.load()["counters"] == {"batches": 7}
    # Only the newest checkpoint is kept; the pointer names it.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-000000007", "latest"]


def test_interrupted_write_leaves_the_previous_checkpoint(tmp_path):
    checkpointer = Checkpointer(tmp_path, every=1)
    checkpointer.save(1, _state(1))
    # A write killed half-way: a temporary directory with a truncated file, pointer untouched.
    partial = tmp_path / ".ckpt-000000002.abc"
    partial.mkdir()
    (partial / "state.pt").write_bytes(b"\x80\x02garbage")
    assert checkpointer.load()["counters"] == {"batches": 1}
    checkpointer.save(2, _state(2))
    assert not partial.exists()  # cleaned up by the next save
    assert checkpointer.load()["counters"] == {"batches": 2}


def test_files_are_written_into_the_same_atomic_checkpoint(tmp_path):
    """``files`` writes the caller's own files beside state.pt; if it fails, nothing is kept."""
    checkpointer = Checkpointer(tmp_path, every=1)

    def files(folder):
        assert folder.name.startswith(".ckpt-")  # the temporary folder, before the rename
        (folder / "model.zip").write_bytes(b"weights")

    path = checkpointer.maybe_save(1, lambda: _state(1), files=files)
    assert sorted(p.name for p in path.iterdir()) == ["model.zip", "state.pt"]
    assert (path / "model.zip").read_bytes() == b"weights"

    def full_disk(folder):
        (folder / "model.zip").write_bytes(b"half")
        raise OSError(28, "No space left on device")

    with pytest.warns(TrainingWarning, match="ckpt-000000001 is still the newest"):
        assert checkpointer.maybe_save(2, lambda: _state(2), files=full_disk) is None
    assert checkpointer.latest() == path and (path / "model.zip").read_bytes() == b"weights"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-000000001", "latest"]


def test_a_failed_save_of_the_same_count_keeps_the_checkpoint_latest_names(tmp_path, monkeypatch):
    """Saving count N again (a final save right after a resume) and failing at any step keeps
    the old ckpt-N readable and named by ``latest``; a save that succeeds replaces it."""
    checkpointer = Checkpointer(tmp_path, every=1)
    checkpointer.save(5, _state(5))

    def full_disk(folder):
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="ckpt-000000005 is still the newest, intact"):
        checkpointer.save(5, _state(50), files=full_disk)
    assert checkpointer.load()["value"].item() == 5.0
    # The failure after the old one was moved aside: the rename of the new one into place.
    real_replace = os.replace

    def replace(src, dst):
        if Path(src).name.startswith(".ckpt-000000005.") and ".old." not in Path(src).name:
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError, match="still the newest, intact"):
        checkpointer.save(5, _state(51))
    monkeypatch.setattr(os, "replace", real_replace)
    assert checkpointer.load()["value"].item() == 5.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-000000005", "latest"]
    checkpointer.save(5, _state(52))
    assert checkpointer.load()["value"].item() == 52.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-000000005", "latest"]


def test_every_file_of_a_checkpoint_is_synced_before_latest_names_it(tmp_path, monkeypatch):
    checkpointer = Checkpointer(tmp_path, every=1)
    synced, pointer_written = [], []
    real_fsync, real_write = os.fsync, checkpoint_module.atomic_write_text

    def fsync(fd):
        synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")).name)
        return real_fsync(fd)

    def write(path, text):
        pointer_written.append(set(synced))
        return real_write(path, text)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(checkpoint_module, "atomic_write_text", write)

    def files(folder):
        (folder / "sub").mkdir()
        (folder / "sub" / "replay.pkl").write_bytes(b"replay")
        (folder / "model.zip").write_bytes(b"weights")

    checkpointer.save(1, _state(1), files=files)
    assert {"state.pt", "model.zip", "replay.pkl", "sub"} <= pointer_written[0]


def test_a_requested_stop_saves_at_the_next_update_and_raises_run_stopped(tmp_path):
    """request_stop: the next maybe_save saves, whatever every/min_seconds say, then stops."""
    checkpointer = Checkpointer(tmp_path, every=10, min_seconds=3600)
    assert checkpointer.maybe_save(10, lambda: _state(10)) is None  # too soon after start
    checkpointer.request_stop()  # e.g. from ac-train's SIGTERM handler
    with pytest.raises(RunStopped) as stopped:
        checkpointer.maybe_save(11, lambda: _state(11))
    assert stopped.value.updates == 11 and stopped.value.path == checkpointer.latest()
    assert checkpointer.load()["counters"] == {"batches": 11}
    # Requested during the last update: the run ends complete, without RunStopped.
    last = Checkpointer(tmp_path / "last", every=0)
    last.request_stop()
    assert last.maybe_save(5, lambda: _state(5), final=True).name == "ckpt-000000005"


def test_corrupt_or_missing_checkpoint_raises_checkpoint_error(tmp_path):
    checkpointer = Checkpointer(tmp_path)
    assert checkpointer.load() is None
    path = checkpointer.save(4, _state(4))
    (path / "state.pt").write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match="cannot read"):
        checkpointer.load()
    atomic_write_text(tmp_path / "latest", "ckpt-000000099\n")
    with pytest.raises(CheckpointError, match=r"no state\.pt"):
        checkpointer.load()


def test_training_state_round_trip_restores_weights_optimizer_counters_and_rng(tmp_path):
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
    net(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    progress = Progress(20)
    progress.update(64, [10.0, 12.0])
    generator = torch.Generator().manual_seed(5)
    checkpointer = Checkpointer(tmp_path)
    checkpointer.save(7, training_state(net, optimizer, progress, generator, batches=7))
    expected = (torch.rand(3), torch.rand(3, generator=generator))

    other = torch.nn.Linear(3, 2)
    other_optimizer = torch.optim.Adam(other.parameters(), lr=1e-2)
    other_progress, other_generator = Progress(20), torch.Generator()
    counters = resume(checkpointer, other, other_optimizer, other_progress, other_generator)
    assert counters == {"batches": 7}
    assert all(
        torch.equal(a, b)
        for a, b in zip(net.state_dict().values(), other.state_dict().values(), strict=True)
    )
    assert other_optimizer.state_dict()["state"][0]["step"] == 1
    assert other_progress.frames == 64 and list(other_progress.window) == [10.0, 12.0]
    assert torch.equal(torch.rand(3), expected[0])
    assert torch.equal(torch.rand(3, generator=other_generator), expected[1])
    assert resume(None, other, other_optimizer, other_progress) == {}


class _WritesAFile:
    """Unpickling this runs ``Path.touch`` on the marker: what a crafted checkpoint could do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_checkpoint_holding_code_is_refused_and_nothing_runs(tmp_path):
    checkpointer = Checkpointer(tmp_path / "ckpt")
    marker = tmp_path / "written-by-unpickling"
    path = checkpointer.save(3, _state(3) | {"payload": _WritesAFile(marker)})
    with pytest.raises(CheckpointError) as error:
        checkpointer.load()
    message = str(error.value)
    assert message.startswith(f"refusing to read {path / 'state.pt'}: it holds ")
    assert "\n" not in message and not marker.exists()


def test_a_checkpoint_with_the_older_numpy_random_state_still_loads(tmp_path):
    # Checkpoints written before the numpy stream was saved as a tensor hold numpy's own tuple.
    np = pytest.importorskip("numpy")
    np.random.seed(11)
    old = checkpoint_module.rng_state() | {"numpy": np.random.get_state()}
    expected = np.random.rand(3)
    checkpointer = Checkpointer(tmp_path)
    checkpointer.save(1, {"counters": {}, "rng": old})
    np.random.seed(0)
    checkpoint_module.set_rng_state(checkpointer.load()["rng"])
    assert np.array_equal(np.random.rand(3), expected)


def test_min_seconds_spaces_the_periodic_saves_but_never_the_final_one(tmp_path, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("ac_extensions.runtime.checkpoint.time.monotonic", lambda: clock[0])
    checkpointer = Checkpointer(tmp_path, every=2, min_seconds=60)
    saved = []
    for update, now in enumerate([110, 130, 165, 170, 171, 200, 240, 250], 1):
        clock[0] = now
        if checkpointer.maybe_save(update, lambda u=update: _state(u), final=update == 8):
            saved.append(update)
    # Multiples of 2 at 130 s (30 s after start: too soon), 170 s (70 s: saved), 200 s (30 s
    # after that save: too soon); update 8 is the final one.
    assert saved == [4, 8]
    assert Checkpointer(tmp_path).load()["counters"] == {"batches": 8}
    with pytest.raises(ValueError, match="min_seconds"):
        Checkpointer(tmp_path, min_seconds=-1)
