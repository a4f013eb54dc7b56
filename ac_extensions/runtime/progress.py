"""Progress metrics: episode returns, frames, throughput, policy versions."""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any

from tensordict import TensorDictBase


def finished_returns(batch: TensorDictBase) -> list[float]:
    """Returns of the episodes that ended in ``batch`` ``[B, T]``, in time order.

    Read from ``("next", "episode_reward")`` (TorchRL's ``RewardSum``) at the steps where
    ``("next", "done")`` is set.
    """
    done = batch["next", "done"].squeeze(-1)
    times = done.nonzero()
    order = times[:, 1].argsort(stable=True)
    values = batch["next", "episode_reward"].squeeze(-1)[done]
    return values[order].tolist()


def collector_metrics(batch: TensorDictBase) -> dict[str, float]:
    """``collector/policy_version``: the newest policy version the batch was collected with.

    Present when the collector tracks versions (the Ray backend's actors do, see
    :mod:`ac_extensions.runtime.ray_backend`); it grows by one per weight update the actors receive.
    """
    version = batch.get("policy_version", None)
    return {} if version is None else {"collector/policy_version": float(version.max())}


class Progress:
    """Episode returns and throughput, as ``train/*`` and ``time/*`` metrics."""

    def __init__(self, window: int) -> None:
        self.window: deque[float] = deque(maxlen=window)
        self.frames = 0
        self.start = time.perf_counter()

    def state_dict(self) -> dict[str, Any]:
        """Frames, the return window and the seconds elapsed: what a resumed run continues."""
        return {
            "frames": self.frames,
            "window": list(self.window),
            "seconds": time.perf_counter() - self.start,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` (time keeps counting from the saved seconds)."""
        self.frames = int(state["frames"])
        self.window.clear()
        self.window.extend(state["window"])
        self.start = time.perf_counter() - float(state["seconds"])

    def update(self, frames: int, returns: list[float]) -> dict[str, float]:
        """Account for a batch of ``frames`` in which episodes with ``returns`` finished.

        Non-finite returns (an episode that saw a NaN reward) are left out of the metrics.
        """
        self.frames += frames
        returns = [r for r in returns if math.isfinite(r)]
        self.window.extend(returns)
        elapsed = time.perf_counter() - self.start
        return {
            "train/episodes": float(len(returns)),
            "train/episode_return": sum(returns) / len(returns) if returns else math.nan,
            "train/return_window": sum(self.window) / len(self.window) if self.window else math.nan,
            "train/return_window_size": float(len(self.window)),
            "time/frames": float(self.frames),
            "time/seconds": elapsed,
            "time/fps": self.frames / elapsed,
        }
