"""Collected rows as a replay stores them: the keys kept, rewards clipped and scaled, row ids."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from tensordict import NestedKey, TensorDictBase

SEQUENCE_KEY: NestedKey = ("replay", "sequence")
"""Per-row sequence id written before storage, the recipes' sampler trajectory key: a replayed
window never spans two collector rows (episode ends inside a row are the losses' business)."""


@dataclass(frozen=True)
class ReplayFeed:
    """What collectors need to write their batches into a replay themselves (Ray backend).

    With ``backend="ray"``, :func:`start_collector` gives every collector actor a writer that
    stores each batch as :func:`label_sequences` would on the learner, so ``replay`` must be
    the recipe's Ray-hosted replay; the local backend ignores the feed (the learner stores).
    """

    replay: Any
    """The replay the collectors extend (a TorchRL ``RayReplayBuffer``)."""
    keys: tuple[NestedKey, ...]
    """Entries kept in the replay."""
    sequence_key: NestedKey
    """Where each row's sequence id goes (the sampler's trajectory key)."""
    reward_scale: float = 1.0
    """Factor on ``("next", "reward")`` before storage."""
    first_sequence: int = 0
    """Sequence ids start here (a resumed run continues after the restored replay's)."""
    return_stored: bool = False
    """Collectors return the stored rows too (ACER's on-policy update trains on them), not only
    the episode returns and policy versions."""
    reward_clip: float | None = None
    """Bound c of the clip of ``("next", "reward")`` to [−c, c] before scaling (``None``: none)."""


def label_sequences(
    batch: TensorDictBase,
    keys,
    first_sequence: int,
    reward_scale: float = 1.0,
    sequence_key: NestedKey = ("replay", "sequence"),
    *,
    reward_clip: float | None = None,
) -> TensorDictBase:
    """Rows ``[*R, T]`` as a replay stores them: ``keys`` only, scaled rewards, sequence ids.

    A collector's batch holds one contiguous stream of one env per row (``[W, E, T]`` from a
    ``MultiSyncCollector`` over envs of batch [E]; the leading dims are flattened to R rows).
    Each row gets its own id, ``first_sequence + r`` for row r, constant along the row, under
    ``sequence_key``: give the same key to the sampler (``SliceSampler(traj_key=...)`` or
    :class:`~ac_extensions.data.PrioritizedSequenceSampler`'s ``traj_key``) so that a replayed
    window never spans two rows (episode ends inside a row are the loss's business: ``done``
    cuts the traces). ``("next", "reward")`` is clipped to [−``reward_clip``, ``reward_clip``]
    and then multiplied by ``reward_scale`` (on a copy of the selection; the caller's batch,
    and its ``episode_reward``, are untouched).

    Args:
        batch: collected rows, shape [*R, T] (time last).
        keys: the entries to keep (e.g. the loss's ``in_keys``); ``None`` keeps everything.
        first_sequence: the first row's id; the next batch starts at ``first_sequence + R``.
        reward_scale: factor on ``("next", "reward")``.
        sequence_key: where each row's id goes.
        reward_clip: the bound of the reward clip, or ``None`` (no clip).

    Returns:
        A new TensorDict ``[R, T]``; flatten it with ``.reshape(-1)`` for ``rb.extend``.

    Example:
        >>> from tensordict import TensorDict
        >>> batch = TensorDict({"observation": torch.zeros(2, 3, 5, 4),
        ...                     ("next", "reward"): torch.ones(2, 3, 5, 1)}, [2, 3, 5])
        >>> rows = label_sequences(batch, None, first_sequence=10, reward_scale=0.1)
        >>> rows.shape, rows["replay", "sequence"][:, 0].tolist(), rows["next", "reward"][0, 0]
        (torch.Size([6, 5]), [10, 11, 12, 13, 14, 15], tensor([0.1000]))
    """
    if batch.batch_dims != 2:  # [W, E, T] → [W·E, T]
        batch = batch.reshape(-1, batch.shape[-1])
    batch = batch.select(*keys) if keys is not None else batch.clone(recurse=False)
    reward = batch.get(("next", "reward"))
    if reward_clip is not None:
        reward = reward.clamp(-reward_clip, reward_clip)
    batch.set(("next", "reward"), reward * reward_scale)
    rows, steps = batch.shape
    ids = torch.arange(first_sequence, first_sequence + rows).unsqueeze(-1).expand(rows, steps)
    return batch.set(sequence_key, ids)


def store_sequences(
    replay,
    batch: TensorDictBase,
    keys,
    first_sequence: int,
    reward_scale: float = 1.0,
    backend: str = "local",
    *,
    reward_clip: float | None = None,
) -> TensorDictBase:
    """Store a fresh batch ``[R, T]`` as ACER's and Reactor's recipes do; the rows stored.

    The local backend labels the rows (:func:`label_sequences`: ``keys``, rewards times
    ``reward_scale`` after the clip, ids from ``first_sequence`` under :data:`SEQUENCE_KEY`)
    and extends ``replay`` with them. With another backend the collector actors did that already
    (:class:`ReplayFeed`), and only ``keys`` and the ids are selected from ``batch``.

    Args:
        replay: the recipe's replay buffer.
        batch: collected rows, shape [R, T].
        keys: the entries the replay keeps.
        first_sequence: the first row's sequence id.
        reward_scale: factor on ``("next", "reward")``.
        backend: the run's backend (``"local"`` or ``"ray"``).
        reward_clip: the bound of the reward clip before scaling, or ``None``.

    Returns:
        The rows as stored, ``[R, T]`` (R is how many sequence ids they used).
    """
    if backend != "local":  # labelled, scaled and stored by the collector actors
        return batch.select(*keys, SEQUENCE_KEY)
    rows = label_sequences(
        batch, keys, first_sequence, reward_scale, SEQUENCE_KEY, reward_clip=reward_clip
    )
    replay.extend(rows.reshape(-1).cpu())
    return rows
