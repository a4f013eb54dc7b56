"""ACER on TorchRL's multi-process collector with a replay of sequences.

Reads top to bottom: :class:`ACERConfig` → :func:`train`, a generator yielding one dict of
scalar metrics per collected batch. Wang et al., 2017, arXiv:1611.01224v2, Algorithm 1:

1. ``MultiSyncCollector`` workers step batches of environments for T steps; the policy stores
   the behavior distribution µ: its logits (``("behavior", "logits")``) for a discrete action
   space, its Gaussian statistics (``("behavior", "loc")``, ``("behavior", "scale")``) for a
   continuous one (§5; the action space is read from the env's action spec).
2. The fresh batch ``[W·E, T]`` gives one on-policy update and goes into a TorchRL replay
   buffer of steps (``LazyTensorStorage``, or ``LazyMemmapStorage`` on request); a
   ``SliceSampler`` draws whole T-step sequences back from it (each row carries its own
   sequence id, so a slice never straddles two rows: Retrace handles the episode ends inside).
3. Once the replay holds ``replay_start`` frames, n ~ Poisson(``replay_ratio``) off-policy
   updates on sampled sequences follow.
4. After every optimiser step the average policy moves: θ_avg ← α θ_avg + (1 − α) θ
   (``SoftUpdate``).

With ``recurrent`` (an LSTM or GRU after the torso), each step also stores the memory's state
and ``is_init``; the updates replay whole sequences in recurrent mode from the state stored at
their first step, the first ``burn_in`` steps only warming it up (R2D2's burn-in, Kapturowski
et al., 2019, §3), and the outputs at x_{t+1} come from that pass (never from stale states).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar, Literal

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer, SliceSampler
from torchrl.modules import set_recurrent_mode
from torchrl.objectives import SoftUpdate

from ac_extensions.modules import (
    NORMALIZED_OBSERVATION,
    ObservationNormalizer,
    make_acer_actor,
    make_actor_critic,
    make_continuous_actor_critic,
    make_qvalue,
    recurrent_env_transforms,
    recurrent_in_keys,
)
from ac_extensions.objectives import ACERLoss, ContinuousACERLoss
from ac_extensions.runtime import (
    SEQUENCE_KEY,
    Checkpointer,
    ReplayFeed,
    close_replay,
    collector_metrics,
    finished_returns,
    make_replay_buffer,
    replay_uint8_keys,
    store_sequences,
)
from ac_extensions.runtime.config import RunConfig
from ac_extensions.runtime.envs import (
    action_size,
    action_space_kind,
    has_continuous_actions,
    make_batched_env,
    observation_shape,
    observation_size,
    require_action_space,
    torso_for,
)
from ac_extensions.runtime.loop import Run, seed_run

ACTION_SPACES = ("discrete", "box")
"""Discrete actions, and 1-D Box actions (Gaussian policy, stochastic dueling network)."""


@dataclass(frozen=True)
class ACERConfig(RunConfig):
    """Hyper-parameters of the ACER recipe (defaults: CartPole-v1).

    The paper's and openai/baselines' values where they apply (c = 10, δ = 1, α = 0.99, Poisson
    replay draws, k = 20 steps per sequence, Q coefficient 0.5); learning rate, replay ratio,
    batch, network size, replay sizes, reward scale and γ tuned on CartPole-v1 (how:
    ``benchmarks/results/defaults.md``). Other env families: ``ACERConfig.for_env(env_id, ...)``
    (``FAMILY_DEFAULTS``; what ``ac-train`` uses).
    """

    FAMILY_DEFAULTS: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "minatar": {
            "lr": 1e-3,
            "reward_scale": 1.0,
            "entropy_coeff": 0.01,
            "entropy_coeff_final": 0.001,
            "replay_ratio": 4.0,
            "replay_capacity": 100_000,
            "replay_start": 5_000,
            "batch_size": 16,
        },
        "atari": {
            "lr": 1e-4,
            "reward_scale": 1.0,
            "entropy_coeff": 0.01,
            "replay_ratio": 4.0,
            "replay_capacity": 50_000,
            "replay_start": 10_000,
            "batch_size": 16,
            "memmap": True,
        },
        "mujoco": {
            "lr": 3e-4,
            "hidden_sizes": (256, 256),
            "normalize_observations": True,
            "init_scale": 0.5,
            "workers": 2,
            "envs_per_worker": 2,
            "replay_ratio": 4.0,
            "replay_capacity": 200_000,
            "replay_start": 10_000,
            "batch_size": 32,
            "reward_scale": 0.1,
            "gamma": 0.99,
        },
    }
    """Per env family, on top of :class:`RunConfig`'s γ 0.99 and frames (see
    :meth:`~ac_extensions.runtime.config.RunConfig.for_env`). Every family: the paper's replay
    ratio 4 (Wang et al., 2017, arXiv:1611.01224v2, §6). MinAtar: the MinAtar DQN's replay
    (100k frames, learning after 5k; Young & Tian, 2019, arXiv:1903.03176), Adam 1e-3 (four
    times that DQN's 2.5e-4: measured higher over the five games), reward scale 1 (MinAtar's
    rewards are small integers), 16 sequences per update (openai/baselines), and the entropy
    weight annealed from openai/baselines' 0.01 at the first frame to the paper's 0.001 at the
    last (higher on Freeway, level on the other four games). Atari: a 50k-frame
    replay in memory-mapped files and Adam 1e-4, a starting point not measured here. MuJoCo:
    two 256-unit layers (SB3 zoo), normalised observations (the zoo's ``normalize: true``), σ
    from 0.5, Adam 3e-4, a 200k-frame replay filled to 10k first, reward scale 0.1. How each
    was chosen and what else was tried: ``benchmarks/results/defaults.md``."""

    PAPER_CONTINUOUS: ClassVar[Mapping[str, Any]] = {
        "fixed_scale": 0.3,
        "truncation_threshold": 5.0,
        "average_policy_decay": 0.995,
        "rollout_length": 50,
        "num_samples": 5,
    }
    """The ACER paper's continuous-control settings (Wang et al., 2017, arXiv:1611.01224v2, §6 and
    appendix): fixed σ = 0.3, truncation c = 5, average-policy decay α = 0.995, k = 50 steps,
    n = 5 samples in the stochastic dueling network; its learning rate and δ were drawn per
    run, so they stay ours. ``ACERConfig.for_env("HalfCheetah-v5",
    **ACERConfig.PAPER_CONTINUOUS)``, or ``ac-train acer --env HalfCheetah-v5 --fixed-scale 0.3
    --truncation-threshold 5 --average-policy-decay 0.995 --rollout-length 50 --num-samples
    5``; measured against the defaults in ``benchmarks/results/defaults.md``."""

    frames: int = 60_000
    """Total environment frames to collect."""
    lr: float = 3e-3
    """Adam learning rate (openai/baselines: RMSprop 7e-4 on Atari)."""
    envs_per_worker: int = 4
    """Environments each worker steps at once (E)."""
    rollout_length: int = 20
    """Steps per sequence (k = 20 in the paper)."""
    gamma: float = 0.995
    """Discount γ."""
    max_grad_norm: float = 10.0
    """Global gradient-norm clip (openai/baselines: 10)."""
    truncation_threshold: float = 10.0
    """c, the importance-weight truncation of the policy term."""
    trust_region_delta: float = 1.0
    """δ of the efficient trust region (``inf`` disables it)."""
    average_policy_decay: float = 0.99
    """α of the Polyak-averaged policy."""
    entropy_coeff_final: float | None = None
    """The entropy weight at the last frame, reached linearly from ``entropy_coeff``
    (:func:`entropy_coeff_at`); ``None`` keeps it constant, as the paper does. A departure
    for runs that need exploration early and a decisive policy late: the MinAtar default,
    0.01 → 0.001 (study ``acer_entropy_anneal`` of ``benchmarks/results/minatar_variants.md``)."""
    replay_ratio: float = 16.0
    """Mean number of off-policy updates per on-policy update (Poisson; paper: 4)."""
    replay_capacity: int = 50_000
    """Frames kept in the replay."""
    replay_start: int = 1_000
    """Frames in the replay before off-policy updates start."""
    batch_size: int = 32
    """Sequences per off-policy update (openai/baselines: 16 per environment)."""
    memmap: bool = False
    """Keep the replay in memory-mapped files (``LazyMemmapStorage``) instead of RAM."""
    torch_threads: int | None = None
    """Threads of the learner process (``None``: torch's default, one per core). The collector
    workers run beside it: with small networks one thread avoids oversubscribing the cores
    (see :attr:`ReactorConfig.torch_threads <ac_extensions.recipes.reactor.ReactorConfig>`)."""
    reward_scale: float = 0.1
    """Factor on the rewards the learner sees, after ``reward_clip``. It applies to the fresh
    batch and the replay; the logged returns stay the environment's. 0.1 keeps Q^ret's squared
    error in a range the gradient-norm clip does not swallow (not in the paper, whose Atari
    rewards are clipped)."""
    num_samples: int = 5
    """Continuous actions only: n, the stochastic dueling network's samples u_i ∼ π(·|x). They
    enter Q̃(x, a) = V(x) + A(x, a) − (1/n) Σ_i A(x, u_i) (Wang et al., 2017,
    arXiv:1611.01224v2, §5.1; n = 5 in pfrl and dchetelat/acer)."""
    init_scale: float = 1.0
    """Continuous actions only: the initial σ of the learned state-independent scale."""
    fixed_scale: float | None = None
    """Continuous actions only: a fixed σ instead of a learned one (the paper's 0.3, §6).
    :class:`~ac_extensions.modules.FixedNormalScale`; None learns one log σ per dimension."""
    activation: Literal["tanh", "relu"] = "tanh"
    """Continuous actions only: the hidden layers' activation.
    :func:`~ac_extensions.modules.make_continuous_actor_critic`'s, ``"tanh"`` or ``"relu"``."""
    share_torso: bool = False
    """Discrete actions, vector observations: one tanh MLP torso for the policy and Q heads.
    :func:`~ac_extensions.modules.make_acer_actor` with ``torso="mlp"``, the layout of the
    paper's Atari network (Wang et al., 2017, arXiv:1611.01224v2, §6), instead of separate
    policy and Q networks of ``hidden_sizes`` each. One torso pass instead of two per
    update; image observations always share theirs."""
    normalize_observations: bool = False
    """Normalise vector observations by running mean and variance.
    :class:`~ac_extensions.modules.ObservationNormalizer`: (x − mean)/sqrt(var + 1e-8),
    clipped to ±10. The statistics are updated by the learner from every fresh batch before
    its update, reach the workers with the weights, and are checkpointed with the run; the
    replay keeps raw observations and every replayed sample is normalised with the current
    statistics (never with those of its collection time)."""
    recurrent: Literal["lstm", "gru"] | None = None
    """A recurrent memory after the torso (``None``: feed-forward). One network with policy and
    Q heads on the memory (:func:`~ac_extensions.modules.make_acer_actor`). Discrete actions
    only; for partially observed tasks (the paper's networks are feed-forward)."""
    recurrent_size: int = 128
    """Hidden size of the recurrent memory."""
    burn_in: int = 0
    """Recurrent networks: first steps of each replayed sequence that only rebuild the memory.
    The first ``burn_in`` steps of every replayed sequence rebuild the memory from its stored
    state (no loss on them); must be < ``rollout_length``."""

    def _check_memory(self) -> None:
        """Check the recurrent fields (``recurrent``, ``recurrent_size``, ``burn_in``)."""
        if self.recurrent not in (None, "lstm", "gru"):
            raise ValueError(f"recurrent must be 'lstm', 'gru' or None, got {self.recurrent!r}")
        if self.recurrent_size <= 0:
            raise ValueError(f"recurrent_size must be > 0, got {self.recurrent_size}")
        if self.burn_in and self.recurrent is None:
            raise ValueError(f"burn_in ({self.burn_in}) needs a recurrent network (--recurrent)")
        if not 0 <= self.burn_in < self.rollout_length:
            raise ValueError(
                f"burn_in must lie in [0, rollout_length) = [0, {self.rollout_length}), got "
                f"{self.burn_in}"
            )
        if self.recurrent is not None and self.share_torso:
            raise ValueError(
                "share_torso=True is for feed-forward networks; a recurrent discrete network "
                "always shares its torso and memory between the policy and Q heads"
            )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ValueError(f"torch_threads must be >= 1 or None, got {self.torch_threads}")
        for name in ("batch_size", "replay_capacity", "num_samples", "init_scale"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.activation not in ("tanh", "relu"):
            raise ValueError(f"activation must be 'tanh' or 'relu', got {self.activation!r}")
        if self.fixed_scale is not None and not (
            self.fixed_scale > 0 and math.isfinite(self.fixed_scale)
        ):
            raise ValueError(f"fixed_scale must be finite and > 0 or None, got {self.fixed_scale}")
        final = self.entropy_coeff_final
        if final is not None and not (final >= 0 and math.isfinite(final)):
            raise ValueError(f"entropy_coeff_final must be finite and >= 0 or None, got {final}")
        if not (self.reward_scale > 0 and math.isfinite(self.reward_scale)):
            raise ValueError(f"reward_scale must be finite and > 0, got {self.reward_scale}")
        self._check_memory()
        if self.replay_ratio < 0 or not 0 <= self.average_policy_decay < 1:
            raise ValueError(
                f"replay_ratio must be >= 0 and average_policy_decay in [0, 1), got "
                f"{self.replay_ratio}, {self.average_policy_decay}"
            )


def entropy_coeff_at(config: ACERConfig, frames: int) -> float:
    """The entropy weight for the batch collected after ``frames`` frames.

    ``entropy_coeff`` when ``entropy_coeff_final`` is ``None``; otherwise
    c₀ + (c₁ − c₀) · min(frames / ``config.frames``, 1), with c₀ = ``entropy_coeff`` and
    c₁ = ``entropy_coeff_final``. A function of the frames alone, so a resumed run continues the
    schedule where it stopped.
    """
    if config.entropy_coeff_final is None:
        return config.entropy_coeff
    done = min(frames / config.frames, 1.0)
    return config.entropy_coeff + (config.entropy_coeff_final - config.entropy_coeff) * done


def check_action_space(config: ACERConfig) -> None:
    """Refuse settings the env's action space rules out: ``recurrent`` needs discrete actions.

    (The stochastic dueling network of continuous ACER would need its memory run at collection
    too.) Raises ``ValueError`` with one line; the command line calls it before anything starts.
    """
    if config.recurrent is not None and action_space_kind(config.env_id)[0] != "discrete":
        raise ValueError(
            f"recurrent={config.recurrent!r} is for discrete actions; {config.env_id} has "
            f"continuous actions (the stochastic dueling network's memory would need running "
            f"at collection too)"
        )


def make_env(config: ACERConfig, policy: nn.Module | None = None):
    """The env one worker steps: E copies of ``config.env_id``.

    With ``config.recurrent``, ``policy`` (the collection policy) gives the transforms its
    memory needs (:func:`~ac_extensions.modules.recurrent_env_transforms`: ``is_init`` and
    the stored states).
    """
    if config.recurrent is None:
        return make_batched_env(config.env_id, config.envs_per_worker)
    if policy is None:
        raise ValueError("a recurrent ACER env needs the policy (make_env(config, policy))")
    return make_batched_env(
        config.env_id, config.envs_per_worker, extra_transforms=[recurrent_env_transforms(policy)]
    )


def build(config: ACERConfig):
    """Networks, the collection policy (storing µ), loss, optimiser, average update.

    The env's specs pick the branch. Discrete (``Categorical``): a softmax actor and a Q
    network, :class:`~ac_extensions.objectives.ACERLoss`, µ stored as its logits; with image
    observations one network instead, a convolutional torso with policy and Q heads
    (:func:`~ac_extensions.modules.make_acer_actor`, as in the paper's §6): the Nature CNN for
    Atari frames ``[4, 84, 84]``, the MinAtar network for MinAtar's ``[C, 10, 10]``
    (:func:`~ac_extensions.runtime.envs.torso_for`). Continuous
    (a 1-D ``Box``): a diagonal Gaussian actor and a stochastic dueling network
    (:func:`~ac_extensions.modules.make_continuous_actor_critic`),
    :class:`~ac_extensions.objectives.ContinuousACERLoss`, µ stored as its ``loc`` / ``scale``
    (Wang et al., 2017, arXiv:1611.01224v2, §5). The continuous actor's actions are unbounded
    and stored as sampled; the env clips what it applies (see
    :func:`~ac_extensions.runtime.envs.make_batched_env`), so µ's density is evaluated at the
    action that was actually drawn from µ.

    With ``config.recurrent`` (discrete actions only), one network with a memory after the torso
    and policy and Q heads on it.

    With ``config.normalize_observations`` the networks read ``"observation_normalized"``,
    written by an :class:`~ac_extensions.modules.ObservationNormalizer` that leads the
    collection policy (and that :func:`train` applies to every batch before the loss).

    Returns:
        ``(policy, loss, optimizer, average, normalizer)``; ``normalizer`` is None unless
        ``config.normalize_observations``.
    """
    require_action_space(config.env_id, ACTION_SPACES, "ACER")
    probe = make_batched_env(config.env_id, config.envs_per_worker)  # the specs only
    shape, size = observation_shape(probe), action_size(probe)
    obs_dim = observation_size(probe)
    continuous = has_continuous_actions(probe)
    probe.close()
    normalizer, observation_key = None, "observation"
    if config.normalize_observations:
        if torso_for(shape) != "mlp":
            raise ValueError(
                f"normalize_observations needs vector observations; {config.env_id} gives "
                f"'observation' of per-env shape {list(shape)}"
            )
        normalizer = ObservationNormalizer(shape).to(config.device)
        observation_key = NORMALIZED_OBSERVATION
    coefficients = {
        "gamma": config.gamma,
        "truncation_threshold": config.truncation_threshold,
        "trust_region_delta": config.trust_region_delta,
        "entropy_coeff": config.entropy_coeff,
        "critic_coeff": config.critic_coeff,
    }
    # µ's full distribution is needed at replay time: copy its statistics under their own keys
    # (re-running the actor overwrites "logits" / "loc" / "scale").
    if config.share_torso and continuous:
        raise ValueError(
            f"share_torso=True is for discrete actions; {config.env_id} has continuous actions "
            f"(its actor and stochastic dueling network keep their own torsos)"
        )
    if continuous:
        check_action_space(config)
    memory = {"recurrent": config.recurrent, "recurrent_size": config.recurrent_size}
    if config.recurrent is not None:
        coefficients["burn_in"] = config.burn_in
    if continuous:
        actor, critic = make_continuous_actor_critic(
            obs_dim,
            size,
            hidden_sizes=config.hidden_sizes,
            num_samples=config.num_samples,
            init_scale=config.init_scale,
            fixed_scale=config.fixed_scale,
            observation_key=observation_key,
            activation=config.activation,
        )
        actor, critic = actor.to(config.device), critic.to(config.device)
        statistics = ("loc", "scale")
        loss = ContinuousACERLoss(actor, critic, **coefficients)
    elif torso_for(shape) != "mlp":  # images: one conv torso, policy and Q heads (§6)
        actor = make_acer_actor(shape, size, torso=torso_for(shape), **memory)
        actor = actor.to(config.device)
        statistics = ("logits",)
        loss = ACERLoss(actor, None, **coefficients)
    elif config.share_torso or config.recurrent is not None:  # one torso, policy and Q heads
        actor = make_acer_actor(
            obs_dim,
            size,
            torso="mlp",
            hidden_sizes=config.hidden_sizes,
            observation_key=observation_key,
            **memory,
        ).to(config.device)
        statistics = ("logits",)
        loss = ACERLoss(actor, None, **coefficients)
    else:
        actor, _ = make_actor_critic(
            obs_dim, size, hidden_sizes=config.hidden_sizes, observation_key=observation_key
        )
        qvalue = make_qvalue(
            obs_dim, size, hidden_sizes=config.hidden_sizes, observation_key=observation_key
        )
        actor, qvalue = actor.to(config.device), qvalue.to(config.device)
        statistics = ("logits",)
        loss = ACERLoss(actor, qvalue, **coefficients)
    policy = TensorDictSequential(
        *([normalizer] if normalizer is not None else []),
        actor,
        *(TensorDictModule(nn.Identity(), [key], [("behavior", key)]) for key in statistics),
    )
    # fused: torch's one-kernel Adam (the same update, less CPU per step than the per-tensor
    # loop; benchmarks/results/optimizer_step.md).
    loss = loss.to(config.device)  # its own buffers (coefficients) beside the networks
    optimizer = torch.optim.Adam(loss.parameters(), lr=config.lr, fused=True)
    average = SoftUpdate(loss, eps=config.average_policy_decay)
    return policy, loss, optimizer, average, normalizer


REPLAY_KEYS = (
    "observation",
    "action",
    ("behavior", "logits"),
    ("next", "observation"),
    ("next", "reward"),
    ("next", "done"),
    ("next", "terminated"),
)
"""What a discrete-action step keeps in the replay: µ is the full softmax (its logits)."""
CONTINUOUS_REPLAY_KEYS = (
    "observation",
    "action",
    ("behavior", "loc"),
    ("behavior", "scale"),
    ("next", "observation"),
    ("next", "reward"),
    ("next", "done"),
    ("next", "terminated"),
)
"""What a continuous-action step keeps: µ's Gaussian statistics, since the bias correction
evaluates µ at fresh actions a' ∼ π (Wang et al., 2017, arXiv:1611.01224v2, §5); ``action``
is the unclipped sample (shape [..., d])."""


def make_replay(config: ACERConfig) -> ReplayBuffer:
    """Replay of steps sampled as ``batch_size`` whole sequences of ``rollout_length`` steps.

    The capacity is ``replay_capacity`` rounded down to whole sequences, so overwriting (FIFO)
    always replaces whole rows. A sample is flat ``[batch_size · T]``; reshape to ``[-1, T]``.
    With ``config.backend == "ray"`` the same buffer lives in a Ray actor, which the
    collector actors extend (:func:`~ac_extensions.runtime.make_replay_buffer`). MinAtar's
    0/1 observations are stored as ``uint8`` and sampled as float32
    (:func:`~ac_extensions.runtime.replay_uint8_keys`).
    """
    length = config.rollout_length
    capacity = max(1, config.replay_capacity // length) * length
    storage = partial(LazyMemmapStorage if config.memmap else LazyTensorStorage, capacity)
    sampler = partial(
        SliceSampler, slice_len=length, traj_key=SEQUENCE_KEY, strict_length=True, cache_values=True
    )
    batch_size = config.batch_size * length
    return make_replay_buffer(
        config,
        ReplayBuffer,
        storage=storage,
        sampler=sampler,
        uint8_keys=replay_uint8_keys(config.env_id),
        batch_size=batch_size,
    )


def statistics(normalizer: ObservationNormalizer | None) -> dict[str, Any]:
    """What a checkpoint keeps of the observation statistics (``{}`` without a normalizer)."""
    return {} if normalizer is None else {"observation_norm": normalizer.state_dict()}


def load_statistics(normalizer: ObservationNormalizer | None, counters: Mapping) -> None:
    """Restore the observation statistics a checkpoint's counters hold (if both exist)."""
    if normalizer is not None and "observation_norm" in counters:
        normalizer.load_state_dict(counters["observation_norm"])


def train(
    config: ACERConfig | None = None, *, checkpoint: Checkpointer | None = None
) -> Iterator[dict[str, float]]:
    """Run ACER; yield one dict of scalar metrics per collected batch.

    With a ``checkpoint``, a run resumes from its newest checkpoint (networks, average policy,
    optimiser, replay, counters, random streams; only the frames still missing from
    ``config.frames`` are collected) and saves one every ``checkpoint.every`` batches and after
    the last.

    Faults (see :class:`~ac_extensions.runtime.NonFiniteGuard`): an update with a
    NaN/inf loss or gradient norm is skipped (no average-policy update either), a batch with a
    NaN/inf observation or reward is dropped (not stored in the replay); both warn and count
    (``train/skipped_updates``, ``train/skipped_batches``), and ``max_nonfinite_updates`` in a
    row raise ``NonFiniteError``. A collector worker that dies raises ``WorkerError``. Either
    stops the run before the batch in progress is checkpointed.
    """
    config = config or ACERConfig()
    generator = seed_run(config)
    policy, loss_module, optimizer, average, normalizer = build(config)
    keys = CONTINUOUS_REPLAY_KEYS if isinstance(loss_module, ContinuousACERLoss) else REPLAY_KEYS
    networks = (loss_module.actor_network, getattr(loss_module, "critic_network", None))
    keys = (*keys, *recurrent_in_keys(*networks))  # a memory's stored state and is_init
    replay = make_replay(config)
    # A resumed run continues from its checkpoint (the average policy is in the loss's state).
    run = Run(config, loss_module, optimizer, checkpoint, generator=generator, replay=replay)
    sequences, guard = run.counters.get("sequences", 0), run.guard
    load_statistics(normalizer, run.counters)
    if run.finished:
        close_replay(replay)
        return
    # With the Ray backend the collector actors label and store each batch themselves.
    feed = ReplayFeed(
        replay, keys, SEQUENCE_KEY, config.reward_scale, sequences, True, config.reward_clip
    )

    def update(batch) -> dict[str, float]:
        batch = batch.to(config.device)  # collected and replayed on the CPU
        if normalizer is not None:  # the current statistics, for fresh and replayed steps
            batch = normalizer(batch)
        with set_recurrent_mode(config.recurrent is not None):  # whole sequences at once
            out = loss_module(batch)
        total = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(
            loss_module.parameters(), config.max_grad_norm, foreach=True
        )
        if not guard.update_ok(total, grad_norm):
            return {}  # NaN/inf loss or gradient: no step, no average update (warned, counted)
        optimizer.step()
        average.step()  # θ_avg ← α θ_avg + (1 − α) θ
        return {k: float(v.detach()) for k, v in out.items()} | {"grad_norm": float(grad_norm)}

    with run.collector(partial(make_env, config, policy), policy, feed=feed) as collector:
        for iteration, batch in run.batches(collector):  # [W·E, T]
            returns = finished_returns(batch)  # from ("next", "episode_reward"): unscaled
            versions = collector_metrics(batch)
            rows, length = batch.shape
            # A batch with a NaN/inf observation or reward is dropped (warned, counted): not
            # stored, no updates this iteration.
            learn = guard.batch_ok(batch)
            if learn:  # the replay keeps raw observations; the statistics then merge them
                batch = store_sequences(
                    replay,
                    batch,
                    keys,
                    sequences,
                    config.reward_scale,
                    config.backend,
                    reward_clip=config.reward_clip,
                )
                if normalizer is not None:
                    normalizer.update(batch["observation"])
            sequences += rows

            coeff = entropy_coeff_at(config, run.progress.frames)  # before this batch's frames
            loss_module.entropy_coeff.fill_(coeff)
            logs = {f"train/on_policy/{k}": v for k, v in update(batch).items()} if learn else {}
            replayed: dict[str, list[float]] = {}
            n_replay = 0
            if learn and len(replay) >= config.replay_start:
                rate = torch.tensor(float(config.replay_ratio))
                n_replay = int(torch.poisson(rate, generator=generator))
                for _ in range(n_replay):
                    sample = replay.sample().reshape(-1, length)
                    for key, value in update(sample).items():
                        replayed.setdefault(key, []).append(value)
            logs |= {f"train/replay/{k}": sum(v) / len(v) for k, v in replayed.items()}
            collector.update_policy_weights_()

            yield (
                logs
                | run.progress.update(batch.numel(), returns)
                | {
                    "train/replay_updates": float(n_replay),
                    "train/replay_frames": float(len(replay)),
                    "train/entropy_coeff": coeff,
                }
                | guard.metrics()
                | versions
            )
            run.save(iteration, sequences=sequences, **statistics(normalizer))
