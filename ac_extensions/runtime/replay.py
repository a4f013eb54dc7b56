"""The off-policy recipes' replay buffer: in this process, or in a Ray actor (``backend="ray"``).

MinAtar's observations are 0/1 maps: the replay keeps them as ``torch.uint8`` (a quarter of
float32's bytes) and hands them back as float32 when sampled (:class:`BinaryAsUint8`,
:func:`replay_uint8_keys`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from tensordict import NestedKey, TensorDictBase
from torchrl.envs import Transform

from ac_extensions.runtime.config import RunConfig
from ac_extensions.runtime.envs import env_family

BINARY_OBSERVATION_KEYS: tuple[NestedKey, ...] = ("observation", ("next", "observation"))
"""The entries a replay of MinAtar steps stores as ``uint8``: the observation and the next one
(both float32 ``[C, 10, 10]`` 0/1 maps from
:class:`~ac_extensions.runtime.envs.MinAtarObservation`)."""


def replay_uint8_keys(env_id: str) -> tuple[NestedKey, ...]:
    """The replay entries stored as ``uint8`` for ``env_id``: MinAtar's observations, else none.

    Only MinAtar (``MinAtar/…``) observations are exact 0/1 maps stored as float32 (Atari's are
    already ``uint8``; classic-control observations are real-valued and stay float32).

    Args:
        env_id: a gymnasium id.

    Returns:
        :data:`BINARY_OBSERVATION_KEYS` for the MinAtar family, ``()`` otherwise.

    Example:
        >>> replay_uint8_keys("MinAtar/Breakout-v1"), replay_uint8_keys("CartPole-v1")
        (('observation', ('next', 'observation')), ())
    """
    return BINARY_OBSERVATION_KEYS if env_family(env_id) == "minatar" else ()


class BinaryAsUint8(Transform):
    """A replay-buffer transform: 0/1 float entries stored as ``uint8``, sampled as float.

    ``ReplayBuffer.extend`` applies the inverse (:meth:`inv`): each of ``keys`` is checked to
    hold only 0 and 1 (else ``ValueError`` naming the key: a cast would silently change the
    values) and cast to ``torch.uint8`` on a shallow copy (the caller's data is untouched).
    ``ReplayBuffer.sample`` applies the forward: the entries come back as ``dtype`` (float32),
    the exact values that were extended, so the losses read the same inputs as from a float
    storage. Entries that a storage already holds as float (a replay saved before this
    transform) are cast to ``dtype`` too (a no-op for float32).

    With a Ray-hosted replay the buffer in the actor holds the transform (built there from
    ``transform_factory``): the collector actors send float32 rows, the replay actor stores
    ``uint8`` and samples float32.

    Args:
        keys: the entries to store as ``uint8`` (each must be present in every extend and
            sample).
        dtype: what a sample holds them as.

    Example:
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(8), transform=BinaryAsUint8(["obs"]))
        >>> _ = rb.extend(TensorDict({"obs": torch.ones(4, 2)}, [4]))
        >>> rb.storage._storage["obs"].dtype, rb.sample(2)["obs"].dtype
        (torch.uint8, torch.float32)
    """

    def __init__(self, keys: Sequence[NestedKey], dtype: torch.dtype = torch.float32) -> None:
        keys = list(keys)
        super().__init__(in_keys=keys, out_keys=keys, in_keys_inv=keys, out_keys_inv=keys)
        self.dtype = dtype

    def _apply_transform(self, value: torch.Tensor) -> torch.Tensor:
        return value.to(self.dtype)

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        for key in self.in_keys_inv:
            value = tensordict.get(key)
            if value.dtype != torch.bool:
                binary = (value == 0) | (value == 1)
                if not bool(binary.all()):
                    bad = value[~binary]
                    raise ValueError(
                        f"replay entry {key!r} is stored as uint8 and must hold only 0 and 1, "
                        f"but {bad.numel()} of its values are not (e.g. {bad[0].item()!r}); "
                        "store it as float (no BinaryAsUint8 for this key; see "
                        "replay_uint8_keys)"
                    )
            tensordict.set(key, value.to(torch.uint8))
        return tensordict


def make_replay_buffer(
    config: RunConfig,
    replay_cls: type,
    *,
    storage: Callable,
    sampler: Callable,
    uint8_keys: Sequence[NestedKey] = (),
    **kwargs,
) -> Any:
    """``replay_cls(storage=storage(), sampler=sampler(), **kwargs)`` where the backend wants it.

    Local backend: built here. Ray backend: TorchRL's ``RayReplayBuffer`` hosting the same
    buffer in an actor pinned to this node, which the collector actors extend
    (:func:`~ac_extensions.runtime.ray_backend.make_ray_replay`); close it with
    :func:`close_replay` (or :func:`~ac_extensions.runtime.collection.stop_collector`).

    Args:
        config: the run's config (``backend``).
        replay_cls: a TorchRL replay buffer class (``ReplayBuffer``,
            ``TensorDictReplayBuffer``).
        storage: builds the storage (e.g. ``functools.partial(LazyTensorStorage, n)``).
        sampler: builds the sampler.
        uint8_keys: entries stored as ``uint8`` and sampled as float32 (0/1 values only:
            :class:`BinaryAsUint8`, the buffer's ``transform``; in the Ray actor its
            ``transform_factory``); the recipes pass :func:`replay_uint8_keys` of the env.
        **kwargs: the rest of ``replay_cls``'s arguments (``batch_size``, ...).
    """
    transform = partial(BinaryAsUint8, tuple(uint8_keys)) if uint8_keys else None
    if config.backend == "ray":
        from ac_extensions.runtime.ray_backend import make_ray_replay

        if transform is not None:  # built in the actor (TorchRL: transforms as factories)
            kwargs["transform_factory"] = transform
        return make_ray_replay(config, replay_cls, storage=storage, sampler=sampler, **kwargs)
    if transform is not None:  # an instance: a factory would delay the buffer's construction
        kwargs["transform"] = transform()
    return replay_cls(storage=storage(), sampler=sampler(), **kwargs)


def close_replay(replay) -> None:
    """Close a Ray-hosted replay (and its lease on Ray); a local replay is left alone."""
    if hasattr(replay, "ray_runtime"):
        from ac_extensions.runtime.ray_backend import close

        close(replay)
