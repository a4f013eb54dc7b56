"""Non-finite guards: skip NaN/inf updates and batches, warn, count, stop after a streak."""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from tensordict import NestedKey, TensorDictBase
from torch import Tensor


class TrainingWarning(UserWarning):
    """A fault the run survives: a skipped update, a dropped batch, a checkpoint not written.

    ``ac-train`` shows these as one ``warning:`` line each (it hides other libraries' warnings).
    """


class NonFiniteError(RuntimeError):
    """Too many non-finite updates or batches in a row: the run stops.

    Raised before the batch in progress is checkpointed; since no optimiser step ever used a
    non-finite loss or gradient, the newest checkpoint holds the last (finite) parameters.
    """


CHECKED_KEYS: tuple[NestedKey, ...] = ("observation", ("next", "observation"), ("next", "reward"))
"""The batch entries :meth:`NonFiniteGuard.batch_ok` checks (floating-point ones only)."""


class NonFiniteGuard:
    """Skip non-finite updates and batches, warn, count; stop after too many in a row.

    Every recipe's update asks :meth:`update_ok` after ``backward()`` and the gradient clip: a
    NaN or infinite total loss or gradient norm skips ``optimizer.step()`` and what follows it
    (the average / target network update, the replay priorities), so the parameters never take
    a non-finite step. Every collected batch is first checked by :meth:`batch_ok`: one with a
    NaN or infinite observation or reward (:data:`CHECKED_KEYS`) is dropped, so nothing learns
    from it and it never enters a replay (the losses would refuse it: they raise on non-finite
    rewards); its frames still count. Each skip warns (:class:`TrainingWarning`) and is
    counted in :meth:`metrics` (cumulative, also over a resumed run: :meth:`state_dict`).
    ``max_consecutive`` skipped updates in a row, or as many dropped batches in a row, raise
    :class:`NonFiniteError`.

    Args:
        max_consecutive: the streak that stops the run (``RunConfig.max_nonfinite_updates``).
    """

    def __init__(self, max_consecutive: int = 10) -> None:
        if max_consecutive <= 0:
            raise ValueError(f"max_consecutive must be > 0, got {max_consecutive}")
        self.max_consecutive = max_consecutive
        self.skipped_updates = 0
        self.skipped_batches = 0
        self.updates_in_a_row = 0
        self.batches_in_a_row = 0

    def update_ok(self, loss: Tensor | float, grad_norm: Tensor | float) -> bool:
        """Whether the optimiser step may go ahead: ``loss`` and ``grad_norm`` are finite.

        Otherwise the skip is counted and warned about, and returns False.

        Raises:
            NonFiniteError: at ``max_consecutive`` skipped updates in a row.
        """
        if isinstance(loss, float) and isinstance(grad_norm, float):  # no tensor ops needed
            finite = math.isfinite(loss) and math.isfinite(grad_norm)
        else:
            loss = torch.as_tensor(loss).detach()
            grad_norm = torch.as_tensor(grad_norm).detach()
            finite = bool(torch.isfinite(loss).all() & torch.isfinite(grad_norm).all())
        if finite:
            self.updates_in_a_row = 0
            return True
        self.skipped_updates += 1
        self.updates_in_a_row += 1
        self._skipped(
            f"non-finite update skipped (loss {float(torch.as_tensor(loss).sum()):.4g}, "
            f"gradient norm {float(torch.as_tensor(grad_norm).sum()):.4g})",
            self.updates_in_a_row,
            self.skipped_updates,
            "updates",
        )
        return False

    def batch_ok(self, batch: TensorDictBase, keys: tuple[NestedKey, ...] = CHECKED_KEYS) -> bool:
        """Whether ``batch`` may be learnt from: its ``keys`` hold no NaN or infinity.

        Missing and non-floating entries are not checked. Otherwise the drop is counted and
        warned about (naming the entries), and returns False.

        Raises:
            NonFiniteError: at ``max_consecutive`` dropped batches in a row.
        """
        bad = []
        for key in keys:
            value = batch.get(key, None)
            if isinstance(value, Tensor) and value.is_floating_point():
                count = int((~torch.isfinite(value)).sum())
                if count:
                    bad.append(f"{key!r} ({count} of {value.numel()})")
        if not bad:
            self.batches_in_a_row = 0
            return True
        self.skipped_batches += 1
        self.batches_in_a_row += 1
        self._skipped(
            f"batch of {batch.numel()} frames dropped: non-finite {', '.join(bad)}",
            self.batches_in_a_row,
            self.skipped_batches,
            "batches",
        )
        return False

    def _skipped(self, what: str, in_a_row: int, total: int, kind: str) -> None:
        if in_a_row >= self.max_consecutive:
            raise NonFiniteError(
                f"{what}: {in_a_row} non-finite {kind} in a row (max_nonfinite_updates "
                f"{self.max_consecutive}); training stopped, no checkpoint written for this batch"
            )
        warnings.warn(
            f"{what} ({in_a_row} in a row, {total} in total)", TrainingWarning, stacklevel=3
        )

    def metrics(self) -> dict[str, float]:
        """``train/skipped_updates`` and ``train/skipped_batches`` (cumulative counts)."""
        return {
            "train/skipped_updates": float(self.skipped_updates),
            "train/skipped_batches": float(self.skipped_batches),
        }

    def state_dict(self) -> dict[str, int]:
        """The cumulative counts, as checkpoint counters."""
        return {"skipped_updates": self.skipped_updates, "skipped_batches": self.skipped_batches}

    def load_state_dict(self, counters: dict[str, Any]) -> None:
        """Continue the counts from a checkpoint's counters (absent: 0)."""
        self.skipped_updates = int(counters.get("skipped_updates", 0))
        self.skipped_batches = int(counters.get("skipped_batches", 0))
