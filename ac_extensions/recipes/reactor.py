"""Reactor on TorchRL's multi-process collector with a prioritized sequence replay.

Reads top to bottom: :class:`ReactorConfig` → :func:`train`, a generator yielding one dict of
scalar metrics per collected batch. Gruslys et al., 2018, "The Reactor", arXiv:1704.04651v2:

1. ``MultiSyncCollector`` workers step batches of environments for T steps with the current
   policy, storing log µ(a_t|x_t) (``action_log_prob``) and, for the recurrent network, the
   LSTM states (R2D2's stored state, Kapturowski et al., 2019).
2. The fresh batch ``[W·E, T]`` goes into a replay of flat steps; each row carries its own
   sequence id (``("replay", "sequence")``), and the
   :class:`~ac_extensions.data.PrioritizedSequenceSampler` draws windows of L steps inside a
   row (every start is a candidate), with Reactor's lazily initialised priorities (§3.3).
3. Acting and learning run at a fixed ratio: once the replay holds ``replay_start`` frames,
   every collected frame owes ``1 / acting_steps_per_learning_step`` learner steps. One learner
   step samples ``batch_size`` sequences ``[B, L]`` with their importance weights, computes
   :class:`~ac_extensions.objectives.ReactorLoss` (distributional Retrace critic against the
   target network, β-LOO policy gradient), takes a clipped Adam step, writes the sequences'
   new priorities back into the sampler and steps the target network's ``HardUpdate``.
4. The workers receive the new weights (``collector.update_policy_weights_()``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar, Literal

import torch
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.modules import set_recurrent_mode
from torchrl.objectives import HardUpdate

from ac_extensions.data import PrioritizedSequenceSampler
from ac_extensions.modules import make_reactor_actor, reactor_env_transforms
from ac_extensions.objectives import ReactorLoss
from ac_extensions.runtime import (
    SEQUENCE_KEY,
    Checkpointer,
    NonFiniteGuard,
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
    make_batched_env,
    require_action_space,
    torso_for,
)
from ac_extensions.runtime.loop import Run, seed_run

LOSS_KEYS = ("loss_objective", "loss_critic", "loss_entropy")
"""The loss terms summed for backward."""


ACTION_SPACES = ("discrete",)
"""Discrete actions only (the β-LOO policy gradient sums over the actions)."""


@dataclass(frozen=True)
class ReactorConfig(RunConfig):
    """Hyper-parameters of the Reactor recipe (defaults: CartPole-v1).

    Where a default is marked "tuned" it was chosen on CartPole-v1 (seeds 1–3, see
    ``benchmarks/reactor_cartpole.py``). MinAtar and Atari: ``ReactorConfig.for_env(env_id,
    ...)`` (``FAMILY_DEFAULTS``; what ``ac-train`` uses).
    """

    FAMILY_DEFAULTS: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "minatar": {
            "lr": 2.5e-4,
            "reward_scale": 1.0,
            "replay_start": 5_000,
            "acting_steps_per_learning_step": 16.0,
            "target_update_period": 250,
            "policy_torso_gradient": True,
            "recurrent_size": 128,
        },
        "atari": {
            "envs_per_worker": 8,
            "rollout_length": 33,
            "sequence_length": 33,
            "recurrent": True,
            "recurrent_size": 256,
            "lr": 1e-4,
            "max_grad_norm": 40.0,
            "reward_scale": 1.0,
            "batch_size": 32,
            "target_update_period": 1_000,
            "replay_start": 20_000,
            "torch_threads": None,
        },
    }
    """Per env family, on top of :class:`RunConfig`'s γ 0.99 and frames (see
    :meth:`~ac_extensions.runtime.config.RunConfig.for_env`). MinAtar: the MinAtar DQN's replay
    start (5k frames) and step size 2.5e-4 (Young & Tian, 2019, arXiv:1903.03176), reward scale 1
    (small integer rewards, so C51's ±10 support fits), feed-forward branches 128 wide, as wide as
    the torso's features (MinAtar's frames are close to Markov; 128 learned more than 64 on Asterix
    and no less on the other four games), and two measured departures from the paper: one learner
    step per 16 frames instead of 4–6, with the target copied every 250 steps (4,000 frames, as
    1,000 steps at 4 frames), which replays a quarter as much per frame, runs 2–4× the fps and
    learned more on four of the five games at 1M frames; and the policy's gradient into the shared
    torso (§3.4.1), which ``ReactorConfig.for_env(env_id, **ReactorConfig.PAPER)`` undoes. Atari:
    the paper's sequence length 33, one learner step per 4 frames and target period 1,000 (Gruslys
    et al., 2018, arXiv:1704.04651v2), the rest from DQN/R2D2 practice, not measured here. How each
    was chosen: ``benchmarks/results/defaults.md``."""

    frames: int = 60_000
    """Total environment frames to collect."""
    envs_per_worker: int = 4
    """Environments each worker steps at once (E)."""
    rollout_length: int = 32
    """Steps per environment per collected batch (T), at least ``sequence_length``. Replayed
    windows stay inside one collector row."""
    gamma: float = 0.99
    """Discount γ (Reactor/ACER/DQN's 0.99)."""
    lr: float = 3e-3
    """Adam learning rate (tuned on CartPole-v1). How: ``benchmarks/results/defaults.md``."""
    max_grad_norm: float = 10.0
    """Global gradient-norm clip (openai/baselines ACER's 10)."""
    entropy_coeff: float = 0.01
    """Entropy bonus coefficient (A3C's and ACER's 0.01)."""
    critic_coeff: float = 1.0
    """Critic loss coefficient (:class:`ReactorLoss`'s default)."""
    hidden_sizes: tuple[int, ...] = (64,)
    """Widths of the shared MLP torso (ignored by the CNN torso of image observations)."""
    recurrent: bool = False
    """LSTM branches, Reactor's network (off: feed-forward branches). The LSTM branches keep a
    stored state and read the previous action and reward; feed-forward branches are enough for
    Markov CartPole-v1, and much cheaper to replay. See
    :func:`~ac_extensions.modules.make_reactor_actor`."""
    recurrent_size: int = 64
    """Width of each branch (the LSTM hidden size, or the feed-forward layer's width). 64 suits
    CartPole-v1; MinAtar's 128 learned more there (``benchmarks/results/defaults.md``)."""
    distributional: bool = True
    """Categorical critic with distributional Retrace (off: scalar, "Reactor ND"). Reactor's
    critic, or a scalar critic with scalar Retrace ("Reactor ND", the paper's ablation)."""
    v_min: float = -10.0
    """Lowest atom z_0 of the categorical support (C51's −10). C51's support is ±10 (Bellemare
    et al., 2017, arXiv:1707.06887); with ``reward_scale`` 0.1 CartPole's discounted returns
    lie in [0, 10]."""
    v_max: float = 10.0
    """Highest atom z_{N−1} of the support (C51's 10). Raise it where Q nears it (dense-reward
    games such as MinAtar SpaceInvaders; ``benchmarks/results/defaults.md``)."""
    num_atoms: int = 51
    """N, atoms of the support (C51's and Reactor's 51)."""
    lmbda: float = 1.0
    """Retrace λ of the trace c_s = λ min(1, ρ_s) (Retrace's and Reactor's 1). Munos et al.,
    2016; Gruslys et al., 2018, arXiv:1704.04651v2, appendix."""
    loo_threshold: float = 1.0
    """c of β-LOO's β = min(c, 1/µ(â)) (1: plain leave-one-out, the paper's). §3.1; the
    paper's β = 1 (Gruslys et al., 2018, arXiv:1704.04651v2, appendix)."""
    priority_eta: float = 0.0
    """η of the sequence priority η max_t δ_t + (1 − η) mean_t δ_t (0: the paper's mean). The
    paper's priority is the mean along the sequence (§3.3); R2D2's 0.9 is an alternative
    setting (in ``PREVIOUS``; ``benchmarks/results/reactor_paper.md``)."""
    priority_metric: Literal["auto", "tv", "td"] = "auto"
    """δ_t of the priority: total variation (tv), |TD| (td), or the paper's choice (auto).
    ``"auto"`` is the total variation between q*_t and q(x_t, a_t) for the distributional
    critic and |TD| for ND; ``"td"`` is |G_t − Q|, the difference of the means (R2D2's, in
    ``PREVIOUS``). See :class:`ReactorLoss`."""
    bootstrap_states: Literal["unroll", "stored"] = "unroll"
    """Recurrent network only: the state at x_{t+1} from the window's pass, or as collected.
    ``"unroll"`` takes it from the pass over the window, ``"stored"`` (in ``PREVIOUS``) from
    collection. See :class:`ReactorLoss`."""
    policy_epsilon: float = 0.01
    """ε of the policy (1 − ε) softmax + ε/A (0: plain softmax). The paper mixes in a uniform
    distribution (§3.4.1); 0.01 is this recipe's choice of ε (0 in ``PREVIOUS``)."""
    dueling: bool = True
    """Dueling distributional Q head, the paper's (off: one linear layer). §3.4.1; False
    (in ``PREVIOUS``): a single-stream head of one linear layer."""
    policy_torso_gradient: bool = False
    """Let the policy's gradient reach the shared torso (the paper blocks it, §3.4.1).
    MinAtar's default lets it: see ``FAMILY_DEFAULTS``."""
    target_update_period: int = 100
    """Learner steps between two copies of the online parameters into the target network.
    ``HardUpdate``; tuned on CartPole-v1, the paper's is 1,000 (Gruslys et al., 2018,
    appendix)."""
    sequence_length: int = 16
    """L, steps per replayed sequence (tuned; the paper's is 33). Gruslys et al., 2018,
    appendix."""
    batch_size: int = 16
    """Sequences per learner step (B; the paper's is 4). Gruslys et al., 2018, appendix."""
    acting_steps_per_learning_step: float = 4.0
    """Environment frames collected per learner step (the paper's ratio is 4–6). The fixed
    acting/learning ratio; the paper reports 4–6 acting steps per learning step (Gruslys et
    al., 2018)."""
    replay_capacity: int = 100_000
    """Frames kept in the replay (rounded down to whole collector rows)."""
    replay_start: int = 1_000
    """Frames in the replay before learning starts."""
    priority_exponent: float = 1.0
    """α of P(t) ∝ p̃_t^α (the sampler's default; 0: uniform)."""
    uniform_probability: float = 0.1
    """ε, the probability that a sequence is drawn uniformly (the sampler's default)."""
    importance_exponent: float = 1.0
    """β of the importance weights w = (P(t)/P_min)^−β (1: the paper's, full correction). The
    paper's fixed β = 1 (§3.3) corrects the prioritised sampling fully. 0.4, PER's starting
    value, learns faster at short budgets and is a named option (in ``PREVIOUS``;
    ``benchmarks/results/defaults.md``)."""
    torch_threads: int | None = 1
    """Threads of the learner process (``None``: torch's default). One by default: the
    networks are tiny, and a learner that shares the CPU cores with the collector workers slows
    down when its threads outnumber the free cores (oversubscription;
    ``benchmarks/results/defaults.md``)."""
    reward_scale: float = 0.1
    """Factor on the rewards the learner sees, so the discounted returns fit the support. It
    applies after ``reward_clip``; the logged returns stay the environment's. Not in
    the paper, whose Atari rewards are clipped to [−1, 1] instead (Atari's ``reward_clip``)."""

    PAPER: ClassVar[Mapping[str, Any]] = {
        "priority_eta": 0.0,
        "priority_metric": "auto",
        "bootstrap_states": "unroll",
        "importance_exponent": 1.0,
        "policy_epsilon": 0.01,
        "dueling": True,
        "policy_torso_gradient": False,
    }
    """The paper's values of the settings ``PREVIOUS`` departs from: the class defaults, and
    what ``ReactorConfig.for_env(env_id, **ReactorConfig.PAPER)`` restores where a family's
    defaults depart from the paper (MinAtar's policy gradient into the torso)."""

    PREVIOUS: ClassVar[Mapping[str, Any]] = {
        "priority_eta": 0.9,
        "priority_metric": "td",
        "bootstrap_states": "stored",
        "importance_exponent": 0.4,
        "policy_epsilon": 0.0,
        "dueling": False,
        "policy_torso_gradient": True,
    }
    """An alternative setting of the options ``PAPER`` lists: R2D2's priority of the mean
    difference (η 0.9, |G_t − Q|), PER's β 0.4, a plain softmax policy, a single-stream Q head,
    the policy gradient into the torso and stored bootstrap states;
    ``ReactorConfig(**ReactorConfig.PREVIOUS)``. Faster than the paper's settings at 50k
    MinAtar frames, slightly slower on CartPole-v1 (``benchmarks/results/defaults.md``); the
    paper's are the defaults."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in (
            "batch_size",
            "sequence_length",
            "replay_capacity",
            "target_update_period",
            "recurrent_size",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.sequence_length > self.rollout_length:
            raise ValueError(
                f"sequence_length ({self.sequence_length}) must be <= rollout_length "
                f"({self.rollout_length}): a replayed sequence stays inside one collector row"
            )
        if self.replay_capacity < self.frames_per_batch:
            raise ValueError(
                f"replay_capacity ({self.replay_capacity}) must hold one collected batch "
                f"({self.frames_per_batch} frames)"
            )
        if not (self.acting_steps_per_learning_step > 0):
            raise ValueError(
                "acting_steps_per_learning_step must be > 0, got "
                f"{self.acting_steps_per_learning_step}"
            )
        if not (self.reward_scale > 0 and math.isfinite(self.reward_scale)):
            raise ValueError(f"reward_scale must be finite and > 0, got {self.reward_scale}")
        if not (self.v_min < self.v_max and self.num_atoms >= 2):
            raise ValueError(
                f"need v_min < v_max and num_atoms >= 2, got {self.v_min}, {self.v_max}, "
                f"{self.num_atoms}"
            )
        self._check_paper_options()
        if not 0 <= self.uniform_probability <= 1:
            raise ValueError(
                f"uniform_probability must lie in [0, 1], got {self.uniform_probability}"
            )
        if self.priority_exponent < 0 or self.importance_exponent < 0:
            raise ValueError(
                f"priority_exponent and importance_exponent must be >= 0, got "
                f"{self.priority_exponent}, {self.importance_exponent}"
            )

    def _check_paper_options(self) -> None:
        """Validate the options that choose between ``PAPER`` and ``PREVIOUS``."""
        if self.priority_metric not in ("auto", "tv", "td"):
            raise ValueError(
                f"priority_metric must be 'auto', 'tv' or 'td', got {self.priority_metric!r}"
            )
        if self.priority_metric == "tv" and not self.distributional:
            raise ValueError("priority_metric='tv' needs distributional=True")
        if self.bootstrap_states not in ("unroll", "stored"):
            raise ValueError(
                f"bootstrap_states must be 'unroll' or 'stored', got {self.bootstrap_states!r}"
            )
        if not 0 <= self.policy_epsilon < 1:
            raise ValueError(f"policy_epsilon must lie in [0, 1), got {self.policy_epsilon}")
        if not 0 <= self.priority_eta <= 1:
            raise ValueError(f"priority_eta must lie in [0, 1], got {self.priority_eta}")

    @property
    def replay_slots(self) -> int:
        """The storage capacity: ``replay_capacity`` rounded down to whole rows of T steps."""
        return self.replay_capacity // self.rollout_length * self.rollout_length


def _probe(config: ReactorConfig) -> tuple[tuple[int, ...], int]:
    """Per-env observation shape and the number of actions of ``config.env_id``.

    TorchRL's env stack (``lean=False``), as when Reactor's results were measured: building it
    draws from torch's random stream, so the seeded runs (and benchmarks/results) repeat.
    """
    env = make_batched_env(config.env_id, 1, lean=False)
    shape = tuple(env.observation_spec["observation"].shape[len(env.batch_size) :])
    num_actions = action_size(env)
    env.close()
    return shape, num_actions


def make_actor(config: ReactorConfig):
    """The Reactor actor for ``config.env_id``; the observation shape picks the torso.

    :func:`~ac_extensions.runtime.envs.torso_for`: an MLP for vectors, the MinAtar network for
    ``[C, 10, 10]``, the Nature CNN for ``[C, 84, 84]`` frames.

    Returns a TorchRL ``ProbabilisticActor`` (see
    :func:`~ac_extensions.modules.make_reactor_actor`) writing ``logits``, the critic's
    ``action_value_logits`` [*B, A, N] (``action_value`` [*B, A] for Reactor ND), ``action``
    and ``action_log_prob``.
    """
    shape, num_actions = _probe(config)
    torso = torso_for(shape)
    return make_reactor_actor(
        shape if torso != "mlp" else int(math.prod(shape)),
        num_actions,
        torso=torso,
        hidden_sizes=config.hidden_sizes,
        recurrent_size=config.recurrent_size,
        num_atoms=config.num_atoms,
        distributional=config.distributional,
        previous_action_reward=config.recurrent,
        recurrent=config.recurrent,
        policy_epsilon=config.policy_epsilon,
        dueling=config.dueling,
        policy_torso_gradient=config.policy_torso_gradient,
    )


def make_env(config: ReactorConfig, actor):
    """The env one worker steps: E copies of ``config.env_id`` plus the actor's transforms.

    The transforms come from :func:`~ac_extensions.modules.reactor_env_transforms`:
    ``InitTracker``, the stored-state primer and the previous action/reward for the recurrent
    network; nothing for the feed-forward one.
    """
    return make_batched_env(
        config.env_id, config.envs_per_worker, extra_transforms=[reactor_env_transforms(actor)]
    )


def build(config: ReactorConfig):
    """Actor, loss (online and target network), optimiser and target-network updater.

    The loss shares the actor's network (``critic_network=None``: one torso, the critic's
    output written in the same pass). TorchRL's ``HardUpdate`` with interval K copies on its
    (K + 1)-th step, so it is built with ``target_update_period − 1``: a copy every
    ``target_update_period`` learner steps.

    Returns:
        ``(actor, loss, optimizer, target_updater)``.
    """
    require_action_space(config.env_id, ACTION_SPACES, "Reactor")
    actor = make_actor(config).to(config.device)
    loss = ReactorLoss(
        actor,
        None,
        distributional=config.distributional,
        v_min=config.v_min,
        v_max=config.v_max,
        num_atoms=config.num_atoms,
        gamma=config.gamma,
        lmbda=config.lmbda,
        loo_threshold=config.loo_threshold,
        entropy_coeff=config.entropy_coeff,
        critic_coeff=config.critic_coeff,
        priority_eta=config.priority_eta,
        priority_metric=config.priority_metric,
        bootstrap_states=config.bootstrap_states,
    ).to(config.device)  # its buffers (the support) beside the networks
    # fused: torch's one-kernel Adam (the same update; ~half the CPU of the per-tensor loop
    # for these ~15 small tensors, benchmarks/results/optimizer_step.md).
    optimizer = torch.optim.Adam(
        loss.actor_network_params.values(True, True), lr=config.lr, fused=True
    )
    target = HardUpdate(loss, value_network_update_interval=config.target_update_period - 1)
    return actor, loss, optimizer, target


def make_replay(config: ReactorConfig) -> TensorDictReplayBuffer:
    """Flat step storage sampled as ``batch_size`` windows of ``sequence_length`` steps.

    The sample is flat ``[B·L]`` with ``"index"`` and ``"priority_weight"`` (one weight per
    step, constant along a sequence); reshape it to ``[-1, L]``. Priorities are read from
    ``"td_error"`` by ``update_tensordict_priority`` (a max over each sequence's steps, which
    all hold the loss's per-sequence priority).

    With ``config.backend == "ray"`` the same buffer lives in a Ray actor
    (:func:`~ac_extensions.runtime.make_replay_buffer`): the collector actors extend it, the
    sampler and its priorities stay inside the actor, and :func:`learner_step` samples and
    updates priorities through it. MinAtar's 0/1 observations are stored as ``uint8`` and
    sampled as float32 (:func:`~ac_extensions.runtime.replay_uint8_keys`).
    """
    slots = config.replay_slots
    sampler = partial(
        PrioritizedSequenceSampler,
        slots,
        config.sequence_length,
        alpha=config.priority_exponent,
        beta=config.importance_exponent,
        uniform_probability=config.uniform_probability,
        traj_key=SEQUENCE_KEY,
    )
    storage = partial(LazyTensorStorage, slots)
    return make_replay_buffer(
        config,
        TensorDictReplayBuffer,
        storage=storage,
        sampler=sampler,
        uint8_keys=replay_uint8_keys(config.env_id),
        batch_size=config.batch_size * config.sequence_length,
        priority_key="td_error",
    )


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def learner_step(
    loss_module: ReactorLoss,
    optimizer: torch.optim.Optimizer,
    target: HardUpdate,
    replay: TensorDictReplayBuffer,
    config: ReactorConfig,
    guard: NonFiniteGuard | None = None,
) -> dict[str, float] | None:
    """One learning step on ``batch_size`` prioritized sequences ``[B, L]``.

    Samples the sequences with their importance weights (``"priority_weight"``, used by the
    loss), computes the Reactor loss, takes a clipped optimiser step, writes each sequence's
    new priority (the loss's ``"td_error"``) back into the sampler and steps the target
    network's updater (Gruslys et al., 2018, arXiv:1704.04651v2, §3). With a ``guard``, a
    NaN/inf loss or gradient norm skips all three (:meth:`NonFiniteGuard.update_ok`).

    Returns:
        The loss outputs as floats, plus ``grad_norm``, ``priority_mean`` and
        ``priority_max`` (of the B priorities written) and ``weight_min`` (the smallest
        importance weight in the sample); None when the guard skipped the step.
    """
    sample = replay.sample().reshape(-1, config.sequence_length).to(config.device)
    with set_recurrent_mode(config.recurrent):
        out = loss_module(sample)
    total = sum(out[k] for k in LOSS_KEYS)
    optimizer.zero_grad(set_to_none=True)
    total.backward()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm, foreach=True)
    if guard is not None and not guard.update_ok(total, grad_norm):
        return None  # no step, no priorities (NaN td_error would poison the sampler), no target
    optimizer.step()
    # Only what the priority update reads (a Ray-hosted replay gets it over the wire).
    replay.update_tensordict_priority(sample.select("index", "td_error"))
    target.step()
    priority = sample["td_error"][:, 0]  # one priority per sequence               [B]
    return {k: float(v.detach()) for k, v in out.items()} | {
        "grad_norm": float(grad_norm),
        "priority_mean": float(priority.mean()),
        "priority_max": float(priority.max()),
        "weight_min": float(sample["priority_weight"].min()),
    }


def train(
    config: ReactorConfig | None = None, *, checkpoint: Checkpointer | None = None
) -> Iterator[dict[str, float]]:
    """Run Reactor; yield one dict of scalar metrics per collected batch.

    Metrics: ``train/<loss output>`` (means over the batch's learner steps; absent before
    learning starts), ``train/priority_mean`` / ``train/priority_max`` (the priorities just
    written), ``train/weight_min`` (smallest importance weight sampled), ``train/grad_norm``,
    ``train/learner_steps`` / ``train/target_updates`` (cumulative),
    ``train/replay_frames``, plus the returns and throughput of
    :class:`~ac_extensions.runtime.Progress`.

    Faults (see :class:`~ac_extensions.runtime.NonFiniteGuard`): an update with a
    NaN/inf loss or gradient norm is skipped (no priorities, no target-network step), a batch
    with a NaN/inf observation or reward is dropped (not stored, owes no learner steps); both
    warn and count (``train/skipped_updates``, ``train/skipped_batches``), and
    ``max_nonfinite_updates`` in a row raise ``NonFiniteError``. A collector worker that dies
    raises ``WorkerError``. Either stops the run before the batch in progress is checkpointed.
    """
    config = config or ReactorConfig()
    seed_run(config)  # Reactor draws from torch's global stream only
    actor, loss_module, optimizer, target = build(config)
    keys = list(dict.fromkeys(loss_module.in_keys))
    replay = make_replay(config)
    # A resumed run continues from its checkpoint (the target network is in the loss's state).
    run = Run(config, loss_module, optimizer, checkpoint, replay=replay)
    counters, guard = run.counters, run.guard
    if counters:
        target.load_state_dict(counters["target"])
    sequences = counters.get("sequences", 0)
    learner_steps = counters.get("learner_steps", 0)
    target_updates = counters.get("target_updates", 0)
    owed = counters.get("owed", 0.0)  # learner steps due at the fixed acting/learning ratio
    if run.finished:
        close_replay(replay)
        return
    # With the Ray backend the collector actors label and store each batch themselves.
    feed = ReplayFeed(
        replay,
        tuple(keys),
        SEQUENCE_KEY,
        config.reward_scale,
        sequences,
        reward_clip=config.reward_clip,
    )
    reduce = {"priority_max": max, "weight_min": min}
    with run.collector(partial(make_env, config, actor), actor, feed=feed) as collector:
        for iteration, batch in run.batches(collector):  # [W·E, T]
            returns = finished_returns(batch)  # from ("next", "episode_reward"): unscaled
            # A batch with a NaN/inf observation or reward is dropped (warned, counted): not
            # stored, and its frames owe no learner steps.
            learn = guard.batch_ok(batch)
            if learn and config.backend == "local":  # Ray: the collector actors stored it
                store_sequences(
                    replay,
                    batch,
                    keys,
                    sequences,
                    config.reward_scale,
                    reward_clip=config.reward_clip,
                )
            sequences += batch.shape[0]  # a dropped batch's rows use their ids too
            logs: dict[str, list[float]] = {}
            if learn and len(replay) >= config.replay_start:
                owed += batch.numel() / config.acting_steps_per_learning_step
                for _ in range(int(owed)):
                    out = learner_step(loss_module, optimizer, target, replay, config, guard)
                    if out is None:
                        continue  # NaN/inf loss or gradient: skipped (warned, counted)
                    for key, value in out.items():
                        logs.setdefault(key, []).append(value)
                    learner_steps += 1
                    target_updates += learner_steps % config.target_update_period == 0
                owed -= int(owed)
            collector.update_policy_weights_()
            means = {f"train/{k}": reduce.get(k, _mean)(v) for k, v in logs.items()}
            yield (
                means
                | run.progress.update(batch.numel(), returns)
                | {
                    "train/learner_steps": float(learner_steps),
                    "train/target_updates": float(target_updates),
                    "train/replay_frames": float(len(replay)),
                }
                | guard.metrics()
                | collector_metrics(batch)
            )
            run.save(
                iteration,
                sequences=sequences,
                learner_steps=learner_steps,
                target_updates=target_updates,
                owed=owed,
                target=target.state_dict(),
            )
