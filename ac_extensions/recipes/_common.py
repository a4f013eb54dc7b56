"""What every recipe shares: the run configuration, the collector's life cycle, progress metrics."""

from __future__ import annotations

import gc
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn
from torchrl.collectors import MultiSyncCollector
from torchrl.weight_update import SharedMemWeightSyncScheme


@dataclass(frozen=True)
class RunConfig:
    """Fields common to every recipe (defaults: CartPole-v1 on this 2-core machine)."""

    env_id: str = "CartPole-v1"
    """Gymnasium id (a discrete action space; the ACER recipe also takes a 1-D Box)."""
    frames: int = 100_000
    """Total environment frames to collect."""
    workers: int = 2
    """Collector worker processes (W); this machine has 2 cores."""
    envs_per_worker: int = 8
    """Environments each worker steps at once (E): amortises TorchRL's per-step overhead."""
    rollout_length: int = 32
    """Steps per environment per batch (T); a batch is W·E·T frames."""
    gamma: float = 0.98
    """Discount γ."""
    lr: float = 1e-3
    """Learning rate."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    entropy_coeff: float = 0.0
    """Entropy bonus coefficient."""
    critic_coeff: float = 0.5
    """Critic loss coefficient."""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """MLP widths."""
    return_window: int = 20
    """Finished episodes averaged in ``train/return_window``."""
    seed: int = 0
    """Seed for torch and the environments."""
    device: str = "cpu"
    """Learner device (``cpu`` or ``cuda``); workers step the environments on CPU."""

    def __post_init__(self) -> None:
        for name in ("frames", "workers", "envs_per_worker", "rollout_length", "return_window"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not 0 <= self.gamma <= 1:
            raise ValueError(f"gamma must lie in [0, 1], got {self.gamma}")

    @property
    def frames_per_batch(self) -> int:
        """W · E · T."""
        return self.workers * self.envs_per_worker * self.rollout_length


class SharedWeights(SharedMemWeightSyncScheme):
    """TorchRL's shared-memory weight sync, minus its finaliser.

    ``WeightSyncScheme.__del__`` calls ``shutdown()``, which puts a message on a
    ``multiprocessing.Queue`` and so starts the queue's feeder thread. Run from the garbage
    collector, that can deadlock: if the collection happens while the thread machinery's lock
    is held (inside another ``Thread.start``), the new thread never starts and the process
    waits forever. Seen with torchrl 0.14.1 in a worker at start-up (py-spy: ``__del__`` →
    ``_shared.py:1117 shutdown`` → ``Queue.put`` → ``Thread.start``) and in the main process
    at interpreter exit (research/anchors.md §1b). Every copy of this class (the workers
    unpickle their own) is shut down explicitly instead: the workers' copies by TorchRL's
    worker loop, the trainer's by :func:`stop_collector`.
    """

    def __del__(self) -> None:
        pass


def start_collector(config: RunConfig, env_factory: Callable, policy: nn.Module):
    """``MultiSyncCollector`` with ``config.workers`` processes, seeded; yields ``[W, E, T]``.

    Weights reach the workers through shared memory (:class:`SharedWeights`).
    """
    collector = MultiSyncCollector(
        [env_factory] * config.workers,
        policy,
        frames_per_batch=config.frames_per_batch,
        total_frames=config.frames,
        env_device="cpu",
        policy_device=config.device,
        storing_device=config.device,
        weight_sync_schemes={"policy": SharedWeights()},
    )
    collector.set_seed(config.seed)
    return collector


def stop_collector(collector) -> None:
    """Shut the workers down and drop the collector while the interpreter is fully alive.

    TorchRL leaves the weight-sync scheme's clean-up to its finaliser, which can hang
    (:class:`SharedWeights`); it is shut down here, explicitly.
    """
    collector.shutdown()
    for scheme in (getattr(collector, "_weight_sync_schemes", None) or {}).values():
        scheme.shutdown()
    del collector
    gc.collect()


class Progress:
    """Episode returns and throughput, as ``train/*`` and ``time/*`` metrics."""

    def __init__(self, window: int) -> None:
        self.window: deque[float] = deque(maxlen=window)
        self.frames = 0
        self.start = time.perf_counter()

    def update(self, frames: int, returns: list[float]) -> dict[str, float]:
        """Account for a batch of ``frames`` in which episodes with ``returns`` finished."""
        self.frames += frames
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
