"""Run configurations: the fields every recipe shares, and those the on-policy recipes share.

Defaults per environment family. A config class's field defaults are its **classic-control**
settings (tuned on CartPole-v1, see each recipe). For the other families (MinAtar, Atari; see
:func:`~ac_extensions.runtime.envs.env_family`) each class lists the fields that change in
``FAMILY_DEFAULTS``, merged along the class hierarchy (a subclass's entries win), and
``Config.for_env(env_id, **overrides)`` builds a config from them: the family's values
replace the class defaults, and ``overrides`` (the fields a user set) replace both.
``ac-train`` builds its configs this way. Each table says where its values come from and
what measured them: every recipe's MinAtar values ran the MinAtar grid
(``benchmarks/minatar_grid.py``, ``benchmarks/results/minatar.md``: five games, 3–10 seeds
each, 1M frames) and some were chosen against alternatives there (PPO's layout, shared torso
and epochs; Reactor's torso gradient and support; ACER's step size, entropy weight, discount
and replay ratio; ``benchmarks/results/minatar_variants.md``); the Atari values have not been
measured with these recipes.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch

from ac_extensions.runtime.envs import env_family


@dataclass(frozen=True)
class RunConfig:
    """Fields common to every recipe (defaults: CartPole-v1 on a machine with a few CPU cores)."""

    env_id: str = "CartPole-v1"
    """Gymnasium id (discrete actions; A2C, PPO and ACER also take 1-D Box actions)."""
    frames: int = 100_000
    """Total environment frames to collect."""
    workers: int = 2
    """Collector worker processes (W). Each is a process of its own, beside the learner's: more
    workers than free CPU cores slow the run down."""
    envs_per_worker: int = 8
    """Environments each worker steps at once (E). More amortise TorchRL's per-step overhead."""
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
    backend: Literal["local", "ray"] = "local"
    """Collection backend: local worker processes or actors on a Ray cluster. ``local``
    (TorchRL's ``MultiSyncCollector``, W worker processes on the learner's machine) or ``ray``
    (TorchRL's ``RayCollector``, W collector actors on a Ray cluster; ACER and Reactor then
    keep their replay in a Ray actor the collectors write into; needs the ``ray`` extra, see
    :mod:`ac_extensions.runtime.ray_backend`). Ray runs are not bit-reproducible: batches
    arrive in the order the actors finish."""
    start_method: Literal["fork", "spawn", "forkserver"] | None = None
    """How the local backend starts its workers (``None``: fork where possible, else spawn).
    These are ``multiprocessing`` start methods. ``spawn`` (TorchRL's default) starts a fresh
    interpreter that imports torch, TorchRL and the env again, which takes seconds before the
    first frame; ``fork`` copies the learner process instead, in a fraction of a second
    (``benchmarks/results/defaults.md``); Linux/macOS only, and not with a CUDA learner (CUDA
    does not survive a fork). None: ``fork`` where that is possible (a CPU learner on Linux),
    otherwise ``spawn``."""
    ray_address: str | None = None
    """Ray cluster to join with backend ``ray`` (``auto``, ``HOST:6379``, ``ray://HOST:10001``;
    ``None``: a local one). None starts a local Ray instance for the run and stops it
    afterwards."""
    max_nonfinite_updates: int = 10
    """Non-finite (NaN/inf) updates or batches in a row that stop the run. Fault tolerance: an
    update whose loss or gradient norm is NaN/inf is skipped (no optimiser step), a batch with a
    NaN/inf observation or reward is dropped (no learning, not stored); each warns and counts in
    ``train/skipped_updates`` / ``train/skipped_batches``. This many in a row stop the run
    (``NonFiniteError``, no checkpoint written for it)."""
    reward_clip: float | None = None
    """Clip the rewards the learner sees to [−reward_clip, reward_clip] (``None``: no clipping).
    The clip comes before any scaling or normalisation; the logged episode returns stay the
    game's. Atari defaults to 1, DQN's preprocessing that the PPO, ACER and Reactor papers
    share (Mnih et al., 2015, Nature 518, "Methods")."""
    async_collection: bool = False
    """Collect while the learner trains (TorchRL's ``MultiAsyncCollector``). Each batch is
    then one worker's E·T frames, in the order the workers finish, and the workers start their
    next rollout at once, with weights that the learner's updates replace mid-rollout (each
    step's behaviour statistics are stored with it, so PPO's ratio and the off-policy
    corrections of ACER and Reactor stay exact). Faster when the
    learner would otherwise leave cores idle; the batch order depends on timing, so runs are
    not bit-reproducible. Local backend only."""

    overlap_collection: bool = False
    """Collect the next batch while the learner trains on this one, and stay bit-reproducible.
    Each batch is collected with the weights from before the learning that runs beside it (one
    batch behind; each step's behaviour statistics are stored with it, so PPO's ratio and the
    off-policy corrections of ACER and Reactor stay exact), at points fixed by the batch count,
    so the same seed gives the same run (:class:`~ac_extensions.runtime.OverlappedCollector`).
    Faster where collection and learning each fill a core; the Reactor paper acts beside
    learning too (Gruslys et al., 2018, arXiv:1704.04651v2), here with the lag fixed. Off by
    default: the one-batch lag changes the numerics. Local, synchronous collection only."""

    FAMILY_DEFAULTS: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "minatar": {"frames": 5_000_000, "gamma": 0.99},
        "atari": {"frames": 10_000_000, "gamma": 0.99, "reward_clip": 1.0},
        "mujoco": {"frames": 1_000_000, "gamma": 0.99},
    }
    """Field values per env family that replace the class defaults (see :meth:`for_env`).

    Shared by every recipe: MinAtar, the paper's 5M frames per run and γ = 0.99 (Young & Tian,
    2019, arXiv:1903.03176, §4; kenjyoung/MinAtar ``examples/dqn.py`` and ``AC_lambda.py``:
    ``NUM_FRAMES``, ``GAMMA``); Atari, γ = 0.99 and rewards clipped to [−1, 1] (Mnih et al.,
    2015) and 10M agent steps (40M emulator frames at frame skip 4, the PPO paper's budget,
    Schulman et al., 2017, arXiv:1707.06347, §6.2); MuJoCo, 1M steps and γ 0.99 (the budget
    of SB3's zoo and CleanRL benchmarks on these tasks). Not measured here."""

    @classmethod
    def family_defaults(cls, env_id: str) -> dict[str, Any]:
        """The field values that replace the class defaults for ``env_id``'s family.

        ``FAMILY_DEFAULTS`` of every class in the hierarchy, base first (a subclass's entries
        win); empty for classic control (the class defaults are its settings).

        Args:
            env_id: a gymnasium id (its family: :func:`~ac_extensions.runtime.envs.env_family`).

        Returns:
            ``{field: value}``.
        """
        return cls.defaults_for_family(env_family(env_id))

    @classmethod
    def defaults_for_family(cls, family: str) -> dict[str, Any]:
        """:meth:`family_defaults` by family name (classic, minatar, atari, mujoco)."""
        values: dict[str, Any] = {}
        for klass in reversed(cls.__mro__):
            table = vars(klass).get("FAMILY_DEFAULTS")
            if table:
                values.update(table.get(family, {}))
        return values

    @classmethod
    def for_env(cls, env_id: str, **overrides: Any):
        """A config for ``env_id``: its family's defaults, then ``overrides``.

        Args:
            env_id: a gymnasium id, e.g. ``"MinAtar/Breakout-v1"``.
            **overrides: fields set explicitly; they win over the family's defaults.

        Returns:
            ``cls(**(family_defaults(env_id) | {"env_id": env_id} | overrides))``.

        Example:
            >>> config = RunConfig.for_env("MinAtar/Breakout-v1", frames=1_000)
            >>> config.gamma, config.frames, RunConfig.for_env("CartPole-v1") == RunConfig()
            (0.99, 1000, True)
        """
        return cls(**(cls.family_defaults(env_id) | {"env_id": env_id} | overrides))

    def __post_init__(self) -> None:
        for name in (
            "frames",
            "workers",
            "envs_per_worker",
            "rollout_length",
            "return_window",
            "max_nonfinite_updates",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not 0 <= self.gamma <= 1:
            raise ValueError(f"gamma must lie in [0, 1], got {self.gamma}")
        if self.backend not in ("local", "ray"):
            raise ValueError(f"backend must be 'local' or 'ray', got {self.backend!r}")
        if self.ray_address is not None and self.backend != "ray":
            raise ValueError(
                f"ray_address ({self.ray_address!r}) needs backend 'ray', got {self.backend!r}"
            )
        if self.start_method not in (None, "fork", "spawn", "forkserver"):
            raise ValueError(
                f"start_method must be 'fork', 'spawn', 'forkserver' or None, got "
                f"{self.start_method!r}"
            )
        if self.start_method == "fork" and torch.device(self.device).type == "cuda":
            raise ValueError(
                "start_method 'fork' cannot be used with a CUDA learner (CUDA does not survive "
                "a fork): use 'spawn'"
            )
        if self.backend == "ray" and torch.device(self.device).type != "cpu":
            raise ValueError(
                f"backend 'ray' runs the learner on CPU (its actors act on CPU and receive "
                f"CPU weights), got device {self.device!r}"
            )
        if self.reward_clip is not None and not (
            self.reward_clip > 0 and math.isfinite(self.reward_clip)
        ):
            raise ValueError(f"reward_clip must be None or finite and > 0, got {self.reward_clip}")
        if self.async_collection and self.backend != "local":
            raise ValueError(f"async_collection needs backend 'local', got {self.backend!r}")
        if self.overlap_collection and (self.backend != "local" or self.async_collection):
            raise ValueError(
                "overlap_collection needs backend 'local' and async_collection=False, got "
                f"backend={self.backend!r}, async_collection={self.async_collection}"
            )

    @property
    def frames_per_batch(self) -> int:
        """W · E · T."""
        return self.workers * self.envs_per_worker * self.rollout_length

    @property
    def batch_frames(self) -> int:
        """Frames per learner batch: W·E·T, or one worker's E·T with ``async_collection``."""
        return (
            self.frames_per_batch // self.workers
            if self.async_collection
            else self.frames_per_batch
        )

    @property
    def worker_start_method(self) -> str:
        """The start method the local collector's workers use (``start_method`` resolved)."""
        if self.start_method is not None:
            return self.start_method
        if sys.platform == "linux" and torch.device(self.device).type == "cpu":
            return "fork"
        return "spawn"


@dataclass(frozen=True)
class OnPolicyConfig(RunConfig):
    """Fields the on-policy recipes (A2C, PPO) share on top of :class:`RunConfig`.

    Defaults: rl-baselines3-zoo's tuned CartPole-v1 PPO (γ 0.98, λ 0.8, lr 1e-3 linear, 2×64
    tanh MLPs; DLR-RM/rl-baselines3-zoo ``hyperparams/ppo.yml``); A2C's recipe overrides them.
    """

    lmbda: float = 0.8
    """GAE λ (Schulman et al., 2016, arXiv:1506.02438, Eq. 16)."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to 0 over ``frames`` (SB3's ``lin_`` schedules)."""
    recurrent: Literal["lstm", "gru"] | None = None
    """Shared recurrent memory for actor and critic (``None``: feed-forward)."""
    recurrent_size: int = 64
    """Hidden size of the recurrent memory."""
    share_torso: bool = False
    """One torso for actor and critic (feed-forward networks only). Both heads read its
    features and the sum of the losses trains it (``make_actor_critic``'s ``share_torso``)."""
    head_sizes: tuple[int, ...] = ()
    """With ``share_torso``: hidden widths of the policy and value heads (none: linear heads).
    One tanh MLP each on the shared features; ``()`` (``none`` on the command line): one
    linear layer each."""
    sequence_length: int | None = None
    """Training sequence length L for recurrent policies (None: the whole rollout, T); T must
    be a multiple of L."""
    burn_in: int = 0
    """Steps replayed before each training sequence only to warm up the hidden state. They are
    masked out of the loss (Kapturowski et al., 2019, R2D2, §3). 0: start from the stored
    state."""
    observation_keys: tuple[str, ...] = ("observation",)
    """Observation entries; several (Dict observations) are concatenated."""
    transform_factory: Callable | None = None
    """Picklable callable returning a TorchRL transform (observation preprocessing)."""
    reshape_reward: Callable | None = None
    """torch-ac's hook ``reshape_reward(obs, action, reward, done) -> reward`` (tensors of the
    batch); logged returns stay the environment's."""
    eval_every: int = 0
    """Evaluate the greedy policy every this many batches (0: never)."""
    eval_episodes: int = 5
    """Episodes per evaluation."""
    torch_threads: int | None = None
    """Threads for the learner (None: torch's default)."""
    tanh_squash: bool = False
    """Continuous actions only: squash the Gaussian onto the action bounds with tanh. Without
    it the env clips the Gaussian's samples (``make_actor_critic``'s ``"tanh_normal"``)."""
    init_scale: float = 1.0
    """Continuous actions only: the Gaussian's initial σ (SB3's ``log_std_init`` 0)."""
    normalize_observations: bool = False
    """Normalise vector observations by their running mean and variance (SB3's rule).
    :class:`~ac_extensions.modules.ObservationNormalizer`, SB3's ``VecNormalize`` rule: the
    collection policy stores the normalised observation, which the losses read."""
    normalize_rewards: bool = False
    """Divide rewards by the running standard deviation of the discounted return (SB3's rule).
    :class:`~ac_extensions.modules.RewardNormalizer`, SB3's ``VecNormalize`` rule."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (self.init_scale > 0 and math.isfinite(self.init_scale)):
            raise ValueError(f"init_scale must be finite and > 0, got {self.init_scale}")
        if not 0 <= self.lmbda <= 1:
            raise ValueError(f"lmbda must lie in [0, 1], got {self.lmbda}")
        if self.normalize_rewards and self.async_collection and self.workers > 1:
            raise ValueError(
                "normalize_rewards with async_collection needs workers=1: the running returns "
                "follow each env's rows, which asynchronous batches from different workers "
                f"interleave (got workers={self.workers})"
            )
        if self.share_torso and self.recurrent is not None:
            raise ValueError(
                f"share_torso=True needs feed-forward networks, got recurrent={self.recurrent!r}"
            )
        length = self.sequence_length or self.rollout_length
        if self.rollout_length % length or not 0 <= self.burn_in <= self.rollout_length - length:
            raise ValueError(
                f"sequence_length {length} must divide rollout_length {self.rollout_length}, and "
                f"burn_in {self.burn_in} must lie in [0, rollout_length - sequence_length]"
            )
