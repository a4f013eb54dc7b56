"""The run scaffold every recipe's ``train()`` shares, so that each holds only its algorithm.

A recipe builds its networks, loss and optimiser, then::

    run = Run(config, loss_module, optimizer, checkpoint, generator=generator, replay=replay)
    if run.finished:          # a resumed run that already collected every batch
        return
    with run.collector(make_env, policy, feed=feed) as collector:
        for iteration, batch in run.batches(collector):   # batch: [W·E, T]
            ...                                            # the algorithm
            yield metrics
            run.save(iteration, sequences=...)              # the recipe's own counters

:class:`Run` resumes from the newest checkpoint (networks, optimiser, progress, random streams,
the replay, the non-finite guard's counters), starts the collector for the frames still
missing, checkpoints after each batch as the :class:`~ac_extensions.runtime.Checkpointer`
schedules it, and stops the collector (and a Ray backend) however the loop ends.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from tensordict import TensorDictBase

from ac_extensions.runtime.checkpoint import Checkpointer, resume, training_state
from ac_extensions.runtime.collection import OverlappedCollector, start_collector, stop_collector
from ac_extensions.runtime.guards import NonFiniteGuard
from ac_extensions.runtime.progress import Progress


def seed_run(config) -> torch.Generator:
    """Apply ``config.torch_threads`` (if set) and ``config.seed``; a generator seeded with it.

    The recipes draw their own random numbers (minibatch order, replay counts) from the
    generator, so that a checkpoint can restore them apart from torch's global stream.
    """
    threads = getattr(config, "torch_threads", None)  # a recipe's field, not every config's
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(config.seed)
    return torch.Generator().manual_seed(config.seed)


class Run:
    """One training run's bookkeeping: resume, collection, checkpoints.

    Args:
        config: the recipe's config (a :class:`~ac_extensions.runtime.RunConfig`).
        loss_module: the loss whose state (networks, target parameters) a checkpoint keeps.
        optimizer: its optimiser.
        checkpoint: where checkpoints go, or None (no resume, no saving).
        generator: the recipe's random generator, kept by checkpoints (None: none).
        replay: the recipe's replay buffer, kept by checkpoints and released at the end
            (None: an on-policy recipe).

    Attributes:
        counters: what the newest checkpoint held beyond the standard state (``{}`` on a fresh
            run): the recipe reads its own counters from it.
        progress: returns, frames and fps (:class:`~ac_extensions.runtime.Progress`).
        guard: the :class:`~ac_extensions.runtime.NonFiniteGuard` of the run.
        done: batches collected before this call (0 on a fresh run).
        num_batches: batches in the whole run.
    """

    def __init__(
        self,
        config,
        loss_module: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        checkpoint: Checkpointer | None = None,
        *,
        generator: torch.Generator | None = None,
        replay=None,
    ) -> None:
        self.config, self.checkpoint, self.replay = config, checkpoint, replay
        self._state = (loss_module, optimizer)
        self.generator = generator
        self.progress = Progress(config.return_window)
        self.counters: dict[str, Any] = resume(
            checkpoint, loss_module, optimizer, self.progress, generator
        )
        self.done = self.counters.get("batches", 0)
        self.guard = NonFiniteGuard(config.max_nonfinite_updates)
        self.guard.load_state_dict(self.counters)
        if self.counters and replay is not None:
            checkpoint.load_replay(replay)
        self.num_batches = math.ceil(config.frames / config.batch_frames)

    @property
    def finished(self) -> bool:
        """Whether every batch was already collected (a resumed, complete run)."""
        return self.done >= self.num_batches

    @contextmanager
    def collector(self, make_env: Callable, policy: torch.nn.Module, *, feed=None) -> Iterator[Any]:
        """The run's collector for the frames still missing, stopped on leaving the block.

        Args:
            make_env: builds one worker's env (no argument).
            policy: the collection policy.
            feed: a :class:`~ac_extensions.runtime.ReplayFeed` for the Ray backend's replay.
        """
        config = self.config
        overlap = getattr(config, "overlap_collection", False)
        mirror = copy.deepcopy(policy) if overlap else policy
        collector = start_collector(
            config,
            make_env,
            mirror,
            frames=config.frames - self.progress.frames,
            seed=config.seed + self.done,
            feed=feed,
            asynchronous=config.async_collection,
        )
        if overlap:
            collector = OverlappedCollector(collector, policy, mirror)
        try:
            yield collector
        finally:
            stop_collector(collector, self.replay)

    def batches(self, collector) -> Iterator[tuple[int, TensorDictBase]]:
        """``(iteration, batch)`` per collected batch, counted on from a resumed run.

        ``batch`` is ``[W·E, T]``: one row per env (an asynchronous collector's batch is one
        worker's ``[E, T]``).
        """
        for iteration, batch in enumerate(collector, start=self.done):
            yield iteration, batch.reshape(-1, batch.shape[-1])

    def save(self, iteration: int, **counters) -> None:
        """Checkpoint after batch ``iteration`` when the checkpointer's schedule says so.

        Args:
            iteration: the batch just finished (0-based, as :meth:`batches` counts).
            **counters: the recipe's own counters, returned in :attr:`counters` on resume.
        """
        if self.checkpoint is None:
            return
        loss_module, optimizer = self._state
        state = partial(
            training_state,
            loss_module,
            optimizer,
            self.progress,
            self.generator,
            batches=iteration + 1,
            **self.guard.state_dict(),
            **counters,
        )
        final = iteration + 1 == self.num_batches
        self.checkpoint.maybe_save(iteration + 1, state, replay=self.replay, final=final)


__all__ = ["Run", "seed_run"]
