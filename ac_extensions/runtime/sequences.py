"""Collected rows as a replay stores them: the keys kept, scaled rewards, sequence ids."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from tensordict import NestedKey, TensorDictBase


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


def label_sequences(
    batch: TensorDictBase,
    keys,
    first_sequence: int,
    reward_scale: float = 1.0,
    sequence_key: NestedKey = ("replay", "sequence"),
) -> TensorDictBase:
    """Rows ``[R, T]`` as a replay stores them: ``keys`` only, scaled rewards, sequence ids.

    Multiplies ``("next", "reward")`` by ``reward_scale`` (on a copy of the selection; the
    caller's batch is untouched) and writes ``first_sequence + r`` for row r, constant along
    the row, under ``sequence_key``.
    """
    batch = batch.select(*keys)
    batch.set(("next", "reward"), batch.get(("next", "reward")) * reward_scale)
    rows, steps = batch.shape
    ids = torch.arange(first_sequence, first_sequence + rows).unsqueeze(-1).expand(rows, steps)
    return batch.set(sequence_key, ids)
