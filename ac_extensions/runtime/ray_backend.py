"""The Ray collection backend (``RunConfig.backend = "ray"``), imported only when it is chosen.

What runs where (one Ray cluster, local or joined through ``RunConfig.ray_address``):

* **The learner** (the process that calls a recipe's ``train``) owns the networks and the
  optimiser, iterates TorchRL's ``RayCollector`` (``torchrl.collectors.distributed``,
  ``sync=True``) and pushes weights after every update with ``update_policy_weights_()``
  (TorchRL's default ``RayWeightSyncScheme``).
* **W collector actors** (``RunConfig.workers``), each a TorchRL ``Collector`` stepping E
  environments for T steps on CPU (:data:`ACTOR_CPUS` each). Each tags its frames with the
  version of the policy it acted with (``track_policy_version=True``: a ``PolicyVersion``
  transform, bumped by every weight update it receives). ``RayCollector`` stacks their
  ``[E, T]`` rollouts into ``[W, E, T]``: the layout ``MultiSyncCollector`` yields.
* **One replay actor** (ACER and Reactor only): TorchRL's ``RayReplayBuffer`` holding the
  recipe's own storage and sampler (``SliceSampler``, or our ``PrioritizedSequenceSampler``
  whose priorities then live in that actor), pinned to the learner's node so that checkpoints
  (``dumps``/``loads`` run inside the actor) land on the learner's disk. The learner samples
  from it and, for Reactor, writes priorities back into it (one Ray call each).

The collector actors write into the replay themselves, through a :class:`ReplayFeeder`: a
picklable ``postproc`` of their ``Collector`` that labels each row with a sequence id unique
across actors (actor i, its b-th batch, row r: ``first + (b·W + i)·E + r``), scales the
rewards, keeps the replay's keys, extends the replay through a restricted
``RayReplayBuffer.client()`` and returns to the learner only what it still needs: the
episode returns, ``done`` flags and policy versions (Reactor), plus the stored rows (ACER,
whose on-policy update trains on the fresh batch).

Why the feeder rather than ``RayCollector(replay_buffer=...)``: with TorchRL 0.14.1, a
collector given a replay buffer writes into it and yields ``None``, so the learner would get
no episode returns to log (``train/return_window``) nor policy versions, and ACER no fresh
batch; reading them back would cost one more round trip per actor per batch (or a second
transfer of the whole batch out of the replay). The feeder writes from the same actor at the
same point of TorchRL's collection loop (``Collector._postproc``, right where TorchRL itself
would call ``replay_buffer.extend``) and keeps the metadata on the normal return path.
"""

from __future__ import annotations

import math
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
from tensordict import NestedKey, TensorDictBase
from torch import nn

from ac_extensions.runtime.config import RunConfig
from ac_extensions.runtime.guards import CHECKED_KEYS
from ac_extensions.runtime.sequences import ReplayFeed, label_sequences

EXTRA_HINT = "pip install 'ac-extensions[ray]'"
"""How to get the optional dependency."""
ACTOR_CPUS = 1.0
"""CPUs each collector actor reserves (it steps its E environments in one process)."""
REPLAY_ACTOR_CPUS = 0.0
"""CPUs the replay actor reserves: it only stores and samples (its work is small next to a
collector's), and reserving none keeps it schedulable next to W collectors on a W-core node."""
META_KEYS: tuple[NestedKey, ...] = (
    ("next", "episode_reward"),
    ("next", "done"),
    ("next", "reward"),
    "policy_version",
)
"""What a :class:`ReplayFeeder` returns to the learner besides the stored rows: the episode
returns (``finished_returns``), the acting policy's version, and the unscaled reward (all NaN
when the batch held a NaN/inf observation or reward and was not stored, so that the learner's
``NonFiniteGuard`` drops and counts it)."""


def import_ray():
    """``import ray``, or an ``ImportError`` that names the extra to install."""
    try:
        import ray
    except ImportError as error:
        raise ImportError(
            f"backend 'ray' needs the ray package, which is not installed: {EXTRA_HINT}"
        ) from error
    return ray


class RayRuntime:
    """A lease on this process's Ray connection; Ray is shut down only if a lease started it.

    The first :meth:`acquire` joins the cluster at ``config.ray_address`` or, without one,
    starts a local Ray instance sized for the run (``num_cpus`` = max(cores, W ·
    :data:`ACTOR_CPUS`), no dashboard, actor logs left in Ray's session directory). A process
    already connected to Ray (``ray.init`` called by the user) is used as it is and never shut
    down here. The last :meth:`release` shuts down only a runtime that :meth:`acquire` started.
    """

    _lock = threading.Lock()
    _leases = 0
    _started = False

    def __init__(self) -> None:
        self._released = False

    @classmethod
    def acquire(cls, config: RunConfig) -> RayRuntime:
        """Connect (or start Ray) and check the cluster can host ``config.workers`` actors.

        Raises:
            ImportError: without the ``ray`` package.
            ValueError: when the cluster has fewer CPUs than W collector actors reserve
                (their creation would otherwise wait forever).
        """
        ray = import_ray()
        with cls._lock:
            if not ray.is_initialized():
                if config.ray_address is not None:
                    ray.init(address=config.ray_address)
                else:
                    cores = os.cpu_count() or 1
                    ray.init(
                        num_cpus=max(cores, math.ceil(config.workers * ACTOR_CPUS)),
                        include_dashboard=False,
                        log_to_driver=False,
                    )
                cls._started = True
            cls._leases += 1
        lease = cls()
        needed = config.workers * ACTOR_CPUS
        available = ray.cluster_resources().get("CPU", 0.0)
        if available < needed:
            lease.release()
            raise ValueError(
                f"workers={config.workers} Ray collector actors reserve {needed:g} CPUs, but the "
                f"Ray cluster ({config.ray_address or 'local'}) has {available:g}"
            )
        return lease

    def release(self) -> None:
        """Give the lease back (once); the last one shuts down a Ray this class started."""
        if self._released:
            return
        self._released = True
        ray = import_ray()
        cls = type(self)
        with cls._lock:
            cls._leases -= 1
            if cls._leases == 0 and cls._started:
                cls._started = False
                if ray.is_initialized():
                    ray.shutdown()


class ReplayFeeder:
    """``postproc`` of one collector actor: writes its batch into the Ray-hosted replay.

    Runs inside the actor on each rollout ``[E, T]`` (after TorchRL's ``Collector`` has
    counted its frames): :func:`~ac_extensions.runtime.sequences.label_sequences` keeps
    ``feed.keys``, clips and scales the rewards and gives row r of this actor's b-th batch the
    sequence id ``feed.first_sequence + (b · num_collectors + index) · E + r`` (unique across
    actors, so a replayed sequence never spans two rows); the flat steps ``[E · T]`` go to the
    replay in one ``extend``. Returns :data:`META_KEYS` (and, with ``feed.return_stored``, the
    stored rows too), shape ``[E, T]``.

    Args:
        client: a ``RayReplayBuffer.client()`` (picklable, no shutdown rights).
        feed: what to store (:class:`~ac_extensions.runtime.sequences.ReplayFeed`).
        index: this actor's index i in ``[0, num_collectors)``.
        num_collectors: W.
    """

    def __init__(self, client: Any, feed: ReplayFeed, index: int, num_collectors: int) -> None:
        self.client = client
        self.keys = tuple(feed.keys)
        self.sequence_key = feed.sequence_key
        self.reward_scale = feed.reward_scale
        self.reward_clip = feed.reward_clip
        self.first_sequence = feed.first_sequence
        self.return_stored = feed.return_stored
        self.index = index
        self.num_collectors = num_collectors
        self.batches = 0

    def __call__(self, batch: TensorDictBase) -> TensorDictBase:
        """Store ``batch`` ``[E, T]``; return what the learner reads from it."""
        rows = batch.shape[0]
        first = self.first_sequence + (self.batches * self.num_collectors + self.index) * rows
        self.batches += 1
        stored = label_sequences(
            batch,
            self.keys,
            first,
            self.reward_scale,
            self.sequence_key,
            reward_clip=self.reward_clip,
        )
        finite = all_finite(batch)
        if finite:  # else the learner's NonFiniteGuard drops it (warned, counted)
            self.client.extend(stored.reshape(-1).cpu())
        meta = batch.select(*META_KEYS, strict=False)
        if self.return_stored:  # the stored (scaled) reward, not the environment's
            meta = stored.update(meta.exclude(("next", "reward")))
        if not finite:
            # the learner checks what comes back: mark the whole batch as one to drop
            meta.set(("next", "reward"), torch.full_like(meta.get(("next", "reward")), math.nan))
        return meta


def all_finite(batch: TensorDictBase) -> bool:
    """Whether the floating entries of ``batch`` under ``CHECKED_KEYS`` hold no NaN or inf.

    The same test as ``NonFiniteGuard.batch_ok``, which the learner applies to what the actor
    returns; a batch that fails it is not written into the replay, so no replayed sample ever
    contains it.
    """
    for key in CHECKED_KEYS:
        value = batch.get(key, None)
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            if not bool(torch.isfinite(value).all()):
                return False
    return True


def make_ray_replay(config: RunConfig, replay_cls: type, **kwargs) -> Any:
    """TorchRL's ``RayReplayBuffer`` wrapping ``replay_cls(**kwargs)`` in an actor.

    ``storage`` and ``sampler`` in ``kwargs`` must be constructors (e.g. ``functools.partial``)
    that the actor calls. The actor reserves :data:`REPLAY_ACTOR_CPUS` and is pinned to this
    (the learner's) node. Holds a :class:`RayRuntime` lease until :func:`close`; a finaliser
    closes it if the buffer is dropped first (a run that failed before its collector started).
    """
    runtime = RayRuntime.acquire(config)  # first: a missing ray names the extra
    ray = import_ray()
    try:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        from torchrl.data.replay_buffers.ray_buffer import RayReplayBuffer

        node = ray.get_runtime_context().get_node_id()
        replay = RayReplayBuffer(
            replay_buffer_cls=replay_cls,
            remote_config={
                "num_cpus": REPLAY_ACTOR_CPUS,
                "scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False),
            },
            **kwargs,
        )
    except BaseException:
        runtime.release()
        raise
    replay.ray_runtime = runtime
    replay.ray_finalizer = weakref.finalize(replay, _close_actor, replay._rb, runtime)
    replay.ray_finalizer.atexit = False  # at exit Ray's own hook stops everything
    return replay


def _close_actor(actor, runtime: RayRuntime) -> None:
    try:
        import_ray().kill(actor, no_restart=True)
    except Exception:  # already gone with the cluster
        pass
    runtime.release()


def start_ray_collector(
    config: RunConfig,
    env_factory: Callable,
    policy: nn.Module,
    *,
    frames: int,
    seed: int,
    feed: ReplayFeed | None = None,
):
    """TorchRL's ``RayCollector``: W actors, ``sync=True``, yielding ``[W, E, T]``.

    Each actor runs a ``torchrl.collectors.Collector`` on CPU with ``track_policy_version``;
    with a ``feed`` each also gets its own :class:`ReplayFeeder` (a per-actor
    ``collector_kwargs`` list) and the collector yields what the feeders return. The actors
    are seeded like ``MultiSyncCollector``'s workers (``set_seed``: consecutive seeds) and
    receive the learner's weights once before the first batch. The collector holds a
    :class:`RayRuntime` lease (attribute ``ray_runtime``), released by
    :func:`~ac_extensions.runtime.collection.stop_collector`.

    On a one-node cluster (the actors share the learner's cores) the learner leaves them their
    cores as ``MultiSyncCollector`` does for its workers: torch threads max(1, threads − W)
    until the collector is closed. Without it the learner's two threads on a 2-core machine
    made a PPO update 3.5–5 s instead of 0.2 s (oversubscription).
    """
    from torchrl.collectors import Collector
    from torchrl.collectors.distributed import RayCollector

    runtime = RayRuntime.acquire(config)
    try:
        kwargs = [{"track_policy_version": True} for _ in range(config.workers)]
        if feed is not None:
            clients = feed.replay.clients(config.workers)
            for index, (extra, client) in enumerate(zip(kwargs, clients, strict=True)):
                extra["postproc"] = ReplayFeeder(client, feed, index, config.workers)
        collector = RayCollector(
            env_factory,
            policy,
            frames_per_batch=config.frames_per_batch,
            total_frames=frames,
            collector_class=Collector,
            collector_kwargs=kwargs,
            num_collectors=config.workers,
            sync=True,
            remote_configs={"num_cpus": ACTOR_CPUS},
            env_device="cpu",
            policy_device="cpu",
            storing_device="cpu",
        )
        try:
            collector.set_seed(seed)
            collector.update_policy_weights_()  # connects the weight sync; version 1
        except BaseException:
            collector.shutdown()
            raise
    except BaseException:
        runtime.release()
        raise
    collector.ray_runtime = runtime
    ray = import_ray()
    if sum(1 for node in ray.nodes() if node.get("Alive")) == 1:
        collector.ray_learner_threads = torch.get_num_threads()
        torch.set_num_threads(max(1, collector.ray_learner_threads - config.workers))
    return collector


def close(resource: Any) -> None:
    """Release what :func:`make_ray_replay` / :func:`start_ray_collector` acquired, once.

    A replay's actor is killed (``RayReplayBuffer.close``); a collector's lease is given back
    (its actors were stopped by its ``shutdown``). Other objects are left alone.
    """
    finalizer = getattr(resource, "ray_finalizer", None)
    if finalizer is not None:
        finalizer.detach()
        try:
            resource.close()
        finally:
            resource.ray_runtime.release()
        return
    runtime = getattr(resource, "ray_runtime", None)
    if isinstance(runtime, RayRuntime):
        threads = getattr(resource, "ray_learner_threads", None)
        if threads is not None:
            torch.set_num_threads(threads)
        runtime.release()
