"""The off-policy recipes' replay buffer: in this process, or in a Ray actor (``backend="ray"``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ac_extensions.runtime.config import RunConfig


def make_replay_buffer(
    config: RunConfig, replay_cls: type, *, storage: Callable, sampler: Callable, **kwargs
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
        **kwargs: the rest of ``replay_cls``'s arguments (``batch_size``, ...).
    """
    if config.backend == "ray":
        from ac_extensions.runtime.ray_backend import make_ray_replay

        return make_ray_replay(config, replay_cls, storage=storage, sampler=sampler, **kwargs)
    return replay_cls(storage=storage(), sampler=sampler(), **kwargs)


def close_replay(replay) -> None:
    """Close a Ray-hosted replay (and its lease on Ray); a local replay is left alone."""
    if hasattr(replay, "ray_runtime"):
        from ac_extensions.runtime.ray_backend import close

        close(replay)
