"""The replay's uint8 storage of 0/1 observations (:class:`BinaryAsUint8`), and who gets it."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, RandomSampler, ReplayBuffer

from ac_extensions.recipes import acer, reactor
from ac_extensions.runtime import BinaryAsUint8, RunConfig, make_replay_buffer, replay_uint8_keys

KEYS = ("observation", ("next", "observation"))


def steps(n: int = 12, seed: int = 0) -> TensorDict:
    """n flat steps with 0/1 float maps [4, 10, 10], a float reward and a sequence id."""
    generator = torch.Generator().manual_seed(seed)
    maps = torch.rand(n + 1, 4, 10, 10, generator=generator).lt(0.3).float()
    return TensorDict(
        {
            "observation": maps[:-1].clone(),
            ("next", "observation"): maps[1:].clone(),
            ("next", "reward"): torch.rand(n, 1, generator=generator),
            ("replay", "sequence"): torch.arange(n) // 4,
        },
        [n],
    )


def storage_bytes(replay) -> int:
    return sum(v.numel() * v.element_size() for v in replay.storage._storage.values(True, True))


@pytest.mark.parametrize("storage", [LazyTensorStorage, LazyMemmapStorage])
def test_stored_as_uint8_sampled_as_the_same_float32(storage):
    replay = ReplayBuffer(storage=storage(24), transform=BinaryAsUint8(KEYS), batch_size=6)
    data = steps()
    replay.extend(data)
    stored = replay.storage._storage
    assert stored["observation"].dtype == stored["next", "observation"].dtype == torch.uint8
    assert stored["next", "reward"].dtype == torch.float32  # other entries as they came
    assert data["observation"].dtype == torch.float32  # the caller's batch is untouched
    everything = replay[:]  # the forward transform, as a sample gets it
    for key in KEYS:
        assert everything[key].dtype == torch.float32
        assert torch.equal(everything[key], data[key])
    assert torch.equal(everything["next", "reward"], data["next", "reward"])
    sample = replay.sample()
    assert sample["observation"].dtype == torch.float32 and sample.shape == (6,)


def test_non_binary_values_are_refused_with_the_key_named():
    replay = ReplayBuffer(storage=LazyTensorStorage(24), transform=BinaryAsUint8(KEYS))
    data = steps()
    data["next", "observation"][3, 0, 0, 0] = 0.5
    with pytest.raises(ValueError, match=r"\('next', 'observation'\).*0\.5"):
        replay.extend(data)
    data = steps()
    data["observation"][0, 1, 2, 3] = 2.0  # an integer but not a bit: uint8 would keep it,
    with pytest.raises(ValueError, match="'observation'"):  # but it is not a 0/1 map
        replay.extend(data)
    assert len(replay) == 0


def test_storage_shrinks_about_four_times():
    floats = ReplayBuffer(storage=LazyTensorStorage(1_000))
    uint8 = ReplayBuffer(storage=LazyTensorStorage(1_000), transform=BinaryAsUint8(KEYS))
    for replay in (floats, uint8):
        replay.extend(steps(8))  # a lazy storage allocates its whole capacity here
    ratio = storage_bytes(floats) / storage_bytes(uint8)
    # 2 × 400 map entries per step from 4 bytes to 1; the reward and sequence id stay
    assert 3.8 < ratio < 4.0, ratio


def test_only_minatar_ids_get_uint8_keys():
    assert replay_uint8_keys("MinAtar/Breakout-v1") == KEYS
    assert replay_uint8_keys("MinAtar/Freeway-v0") == KEYS
    for env_id in ("CartPole-v1", "MaskedCartPole-v1", "ALE/Pong-v5", "Pendulum-v1"):
        assert replay_uint8_keys(env_id) == ()


def test_make_replay_buffer_adds_the_transform_only_when_asked():
    sampler = RandomSampler
    plain = make_replay_buffer(
        RunConfig(), ReplayBuffer, storage=lambda: LazyTensorStorage(16), sampler=sampler
    )
    assert len(plain._transform) == 0
    packed = make_replay_buffer(
        RunConfig(),
        ReplayBuffer,
        storage=lambda: LazyTensorStorage(16),
        sampler=sampler,
        uint8_keys=KEYS,
    )
    assert [type(t) for t in packed._transform] == [BinaryAsUint8]


def test_cartpole_replays_stay_float():
    # The recipes' own replays for CartPole-v1 (classic family): no transform, float storage.
    data = TensorDict(
        {
            "observation": torch.randn(20, 4),
            ("next", "observation"): torch.randn(20, 4),
            ("replay", "sequence"): torch.arange(20) // 5,
        },
        [20],
    )
    for replay in (
        acer.make_replay(acer.ACERConfig(rollout_length=5, replay_capacity=40)),
        reactor.make_replay(reactor.ReactorConfig(replay_capacity=512)),
    ):
        assert len(replay._transform) == 0
        replay.extend(data)
        stored = replay.storage._storage
        assert stored["observation"].dtype == stored["next", "observation"].dtype == torch.float32
        assert torch.equal(replay[:]["observation"], data["observation"])


def test_a_saved_uint8_replay_loads_back_as_uint8(tmp_path):
    # What a checkpoint does with the replay (ReplayBuffer.dumps / loads).
    data = steps()
    saved = ReplayBuffer(storage=LazyTensorStorage(24), transform=BinaryAsUint8(KEYS))
    saved.extend(data)
    saved.dumps(tmp_path / "replay")
    loaded = ReplayBuffer(storage=LazyTensorStorage(24), transform=BinaryAsUint8(KEYS))
    loaded.loads(tmp_path / "replay")
    assert loaded.storage._storage["observation"].dtype == torch.uint8
    assert torch.equal(loaded[:]["next", "observation"], data["next", "observation"])
