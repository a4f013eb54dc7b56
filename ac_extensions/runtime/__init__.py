"""The plumbing under the recipes: collection, checkpoints, guards, progress, run config.

One file per job; runtime imports only :mod:`ac_extensions.modules` of the package
(``tests/test_layering.py`` checks it):

* :mod:`~ac_extensions.runtime.loop`: :class:`Run`, the scaffold of every recipe's
  ``train()`` (resume, collection, checkpoints, shutdown), and :func:`seed_run`.
* :mod:`~ac_extensions.runtime.config`: :class:`RunConfig`, the fields every recipe shares,
  and the defaults per env family (``Config.for_env``).
* :mod:`~ac_extensions.runtime.envs`: batched TorchRL envs over gymnasium (classic control,
  Atari, MinAtar, the test envs), the lean
  :class:`~ac_extensions.runtime.vector_env.VectorGymEnv`.
* :mod:`~ac_extensions.runtime.collection`: start, supervise and stop TorchRL's collectors
  (:func:`start_collector`, :class:`WorkerError`, :func:`shutdown_collector`); workers exit
  when the learner dies. :class:`OverlappedCollector` collects beside the learner's update,
  reproducibly.
* :mod:`~ac_extensions.runtime.ray_backend`: the same collection on Ray (``backend="ray"``).
* :mod:`~ac_extensions.runtime.replay`: the recipe's replay buffer, local or in a Ray actor
  (:func:`make_replay_buffer`); MinAtar's 0/1 observations stored as ``uint8``
  (:class:`BinaryAsUint8`, :func:`replay_uint8_keys`).
* :mod:`~ac_extensions.runtime.on_policy`: what A2C and PPO share (env, networks, GAE,
  minibatches, evaluation).
* :mod:`~ac_extensions.runtime.sequences`: collected rows as replayable sequences
  (:func:`label_sequences`, :class:`ReplayFeed`).
* :mod:`~ac_extensions.runtime.guards`: :class:`NonFiniteGuard` (skip NaN/inf updates and
  batches).
* :mod:`~ac_extensions.runtime.progress`: :class:`Progress` (returns, frames, fps),
  :func:`finished_returns`.
* :mod:`~ac_extensions.runtime.provenance`: :func:`provenance`, the commit, package versions
  and machine a run records.
* :mod:`~ac_extensions.runtime.checkpoint`: :class:`Checkpointer` (atomic, resumable;
  :class:`RunStopped` ends a run stopped on request, after its checkpoint).
* :mod:`~ac_extensions.runtime.flat`: :class:`FlatParameters` and :class:`FlatAdam`, the
  on-policy recipes' optimiser state in one buffer.
* :mod:`~ac_extensions.runtime.compose`: for pipelines composed from TorchRL's parts around
  one of the losses: :class:`BehaviorPolicy` (µ stored at collection),
  :func:`check_action_encoding` (the one-hot action trap).
"""

from __future__ import annotations

from ac_extensions.runtime.checkpoint import (
    Checkpointer,
    CheckpointError,
    RunStopped,
    atomic_write_text,
    load_loss_state_dict,
    loss_state_dict,
    resume,
    training_state,
)
from ac_extensions.runtime.collection import (
    WORKER_TRACEBACKS_VARIABLE,
    OverlappedCollector,
    SupervisedAsyncCollector,
    SupervisedCollector,
    WorkerError,
    shutdown_collector,
    start_collector,
    stop_collector,
    watch_parent,
)
from ac_extensions.runtime.compose import (
    BehaviorPolicy,
    action_encoding_error,
    check_action_encoding,
)
from ac_extensions.runtime.config import RunConfig
from ac_extensions.runtime.flat import FlatAdam, FlatParameters
from ac_extensions.runtime.guards import NonFiniteError, NonFiniteGuard, TrainingWarning
from ac_extensions.runtime.loop import Run, seed_run
from ac_extensions.runtime.progress import Progress, collector_metrics, finished_returns
from ac_extensions.runtime.provenance import provenance
from ac_extensions.runtime.replay import (
    BinaryAsUint8,
    close_replay,
    make_replay_buffer,
    replay_uint8_keys,
)
from ac_extensions.runtime.sequences import (
    SEQUENCE_KEY,
    ReplayFeed,
    label_sequences,
    store_sequences,
)

__all__ = [
    "SEQUENCE_KEY",
    "WORKER_TRACEBACKS_VARIABLE",
    "BehaviorPolicy",
    "BinaryAsUint8",
    "CheckpointError",
    "Checkpointer",
    "FlatAdam",
    "FlatParameters",
    "NonFiniteError",
    "NonFiniteGuard",
    "OverlappedCollector",
    "Progress",
    "ReplayFeed",
    "Run",
    "RunConfig",
    "RunStopped",
    "SupervisedAsyncCollector",
    "SupervisedCollector",
    "TrainingWarning",
    "WorkerError",
    "action_encoding_error",
    "atomic_write_text",
    "check_action_encoding",
    "close_replay",
    "collector_metrics",
    "finished_returns",
    "label_sequences",
    "load_loss_state_dict",
    "loss_state_dict",
    "make_replay_buffer",
    "provenance",
    "replay_uint8_keys",
    "resume",
    "seed_run",
    "shutdown_collector",
    "start_collector",
    "stop_collector",
    "store_sequences",
    "training_state",
    "watch_parent",
]
