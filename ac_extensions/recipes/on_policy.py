"""On-policy actor-critic training (A2C and PPO) on TorchRL's multi-process collector.

Reads top to bottom: :class:`OnPolicyConfig` → :func:`train`, a generator yielding one dict of
scalar metrics per collected batch. :mod:`ac_extensions.recipes.ppo` and
:mod:`ac_extensions.recipes.a2c` give the algorithm-specific defaults.

One iteration:

1. ``MultiSyncCollector``: W worker processes, each stepping E environments at once for T
   steps → a batch ``[W·E, T]`` (each row one contiguous stream of one environment).
2. Optional reward shaping (torch-ac's ``reshape_reward(obs, action, reward, done)``).
3. Advantages once per batch with the pre-update critic: TorchRL's
   ``generalized_advantage_estimate`` (GAE, Schulman et al., 2016, arXiv:1506.02438) over the
   time dim, V(x_{t+1}) read from ``("next", ...)`` so truncations bootstrap correctly.
4. ``epochs`` passes over minibatches (of steps for feed-forward policies, of whole sequences
   for recurrent ones, which the loss replays from their stored hidden state; feed-forward PPO
   computes the same losses on plain tensors, and their gradients by hand, :class:`TensorPath`),
   gradient clipping, linear
   learning-rate (and PPO clip) annealing, optional early stop of an epoch on a KL target.
5. Metrics: ``train/*`` (returns, losses averaged over the steps, diagnostics of the last
   minibatch of the last epoch, or averaged over each epoch's last minibatch with a
   ``target_kl``), ``eval/*`` (greedy evaluation
   episodes, when enabled), ``time/*`` (frames, frames per second, seconds per phase).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch
from tensordict import TensorDictBase
from torch import Tensor
from torchrl.envs import ExplorationType, set_exploration_type
from torchrl.objectives.value.functional import generalized_advantage_estimate

from ac_extensions.functional import categorical_ppo_backward, categorical_ppo_losses
from ac_extensions.modules import (
    FlatAdam,
    FlatParameters,
    MLPBackprop,
    collection_policy,
    make_actor_critic,
    recurrent_env_transforms,
)
from ac_extensions.objectives import SequenceA2CLoss, SequencePPOLoss
from ac_extensions.recipes._common import (
    Checkpointer,
    NonFiniteGuard,
    Progress,
    RunConfig,
    collector_metrics,
    resume,
    start_collector,
    stop_collector,
    training_state,
)
from ac_extensions.recipes.envs import make_batched_env, observation_size


@dataclass(frozen=True)
class OnPolicyConfig(RunConfig):
    """Hyper-parameters of the on-policy recipe; defaults: PPO on CartPole-v1.

    Defaults follow rl-baselines3-zoo's tuned CartPole-v1 PPO (γ 0.98, λ 0.8, lr 1e-3 linear,
    clip 0.2 linear, 2×64 tanh MLPs, Adam eps 1e-5, grad-norm 0.5; DLR-RM/rl-baselines3-zoo
    ``hyperparams/ppo.yml``) except where a comment gives another source.
    """

    algorithm: Literal["ppo", "a2c"] = "ppo"
    """Which loss: clipped PPO (``SequencePPOLoss``) or A2C (``SequenceA2CLoss``)."""
    lmbda: float = 0.8
    """GAE λ."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to 0 over ``frames`` (SB3's ``lin_`` schedules)."""
    epochs: int = 20
    """Passes over each batch (PPO); A2C uses 1."""
    minibatch_size: int = 256
    """Frames per gradient step (rounded to whole sequences for recurrent policies)."""
    clip_epsilon: float = 0.2
    """PPO clip ε (Schulman et al., 2017, arXiv:1707.06347, Eq. 7)."""
    anneal_clip: bool = True
    """Decay ε linearly to 0 with the learning rate (zoo ``clip_range: lin_0.2``)."""
    clip_value: float | None = None
    """PPO value clipping radius (None: no value clipping)."""
    normalize_advantage: bool = True
    """Standardise advantages per minibatch (PPO)."""
    target_kl: float | None = None
    """Stop the epochs of a batch early once ``kl_approx`` exceeds 1.5 × this (SB3's rule)."""
    recurrent: Literal["lstm", "gru"] | None = None
    """Shared recurrent memory for actor and critic (``None``: feed-forward)."""
    recurrent_size: int = 64
    """Hidden size of the recurrent memory."""
    sequence_length: int | None = None
    """Training sequence length L for recurrent policies (None: the whole rollout, T); T must
    be a multiple of L."""
    burn_in: int = 0
    """Steps replayed before each training sequence only to warm up the hidden state (masked
    out of the loss; Kapturowski et al., 2019, R2D2, §3). 0: start from the stored state."""
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
    async_collection: bool = False
    """Collect while the learner trains (TorchRL's ``MultiAsyncCollector``): each batch is
    then one worker's E·T frames, in the order the workers finish, and the workers start their
    next rollout at once, with weights that the learner's updates replace mid-rollout (each
    step's behaviour log-prob is stored with it, so PPO's ratio stays exact). Faster when the
    learner would otherwise leave cores idle; the batch order depends on timing, so runs are
    not bit-reproducible. Local backend only."""
    tensor_update: bool = True
    """Feed-forward PPO computes its losses on plain tensors (:class:`TensorPath`,
    :func:`~ac_extensions.functional.categorical_ppo_losses`) instead of through the loss
    module: the same losses, gradients and minibatches at about half the cost per gradient step
    (``benchmarks/results/ppo_update.md``). Recurrent policies and A2C always use the module."""
    hand_gradients: bool = True
    """With ``tensor_update``, also compute the gradients by hand instead of with autograd
    (:func:`~ac_extensions.functional.categorical_ppo_backward` through
    :class:`~ac_extensions.modules.MLPBackprop`; the same gradients up to float rounding,
    ``tests/recipes/test_on_policy.py``) when both networks are MLPs it supports, as the
    default ones are; otherwise autograd."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("epochs", "minibatch_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not 0 <= self.lmbda <= 1:
            raise ValueError(f"lmbda must lie in [0, 1], got {self.lmbda}")
        length = self.sequence_length or self.rollout_length
        if self.rollout_length % length or not 0 <= self.burn_in <= self.rollout_length - length:
            raise ValueError(
                f"sequence_length {length} must divide rollout_length {self.rollout_length}, and "
                f"burn_in {self.burn_in} must lie in [0, rollout_length - sequence_length]"
            )
        if self.algorithm not in ("ppo", "a2c"):
            raise ValueError(f"algorithm must be 'ppo' or 'a2c', got {self.algorithm!r}")
        if self.async_collection and self.backend != "local":
            raise ValueError(f"async_collection needs backend 'local', got {self.backend!r}")

    @property
    def batch_frames(self) -> int:
        """Frames per learner batch: W·E·T, or one worker's E·T with ``async_collection``."""
        return (
            self.frames_per_batch // self.workers
            if self.async_collection
            else self.frames_per_batch
        )


def make_env(config: OnPolicyConfig):
    """The env one worker steps: E copies, plus the recurrent policy's primers if any."""
    extra = ()
    if config.recurrent is not None:
        probe = make_actor_critic(
            1,
            2,
            hidden_sizes=config.hidden_sizes,
            recurrent=config.recurrent,
            recurrent_size=config.recurrent_size,
        )
        extra = (recurrent_env_transforms(collection_policy(*probe)),)
    return make_batched_env(
        config.env_id,
        config.envs_per_worker,
        observation_keys=config.observation_keys,
        transform_factory=config.transform_factory,
        extra_transforms=extra,
    )


def build(config: OnPolicyConfig):
    """Networks, loss and optimiser for ``config`` (env specs from a probe env).

    Returns:
        ``(actor, critic, loss_module, optimizer, flat)``: the optimiser steps ``flat``
        (:class:`~ac_extensions.modules.FlatParameters` over the loss module's parameters), so
        the gradient reset, clipping and update are one op each.
    """
    probe = make_env(config)
    obs_dim = observation_size(probe)
    num_actions = int(probe.full_action_spec["action"].space.n)
    probe.close()
    actor, critic = make_actor_critic(
        obs_dim,
        num_actions,
        hidden_sizes=config.hidden_sizes,
        recurrent=config.recurrent,
        recurrent_size=config.recurrent_size,
    )
    actor, critic = actor.to(config.device), critic.to(config.device)
    # functional=False: the loss calls the networks directly instead of swapping functional
    # parameters in on every call (same math, ~0.2 ms less per step on this machine).
    common = dict(
        entropy_coeff=config.entropy_coeff,
        critic_coeff=config.critic_coeff,
        loss_critic_type="l2",
        functional=False,
    )
    if config.algorithm == "ppo":
        loss = SequencePPOLoss(
            actor,
            critic,
            clip_epsilon=config.clip_epsilon,
            clip_value=config.clip_value,
            normalize_advantage=config.normalize_advantage,
            **common,
        )
    else:
        loss = SequenceA2CLoss(actor, critic, **common)
    # One [P] buffer for parameters and one for gradients: zeroing, clipping and the update
    # are one op each instead of a few per tensor (~0.7 ms less per step for the 2×64 MLPs).
    flat = FlatParameters(loss.parameters())
    if config.algorithm == "ppo":
        optimizer = FlatAdam(flat, lr=config.lr, eps=1e-5, fused=True)
    else:
        # A2C's RMSprop settings (Mnih et al., 2016; SB3's A2C defaults).
        optimizer = torch.optim.RMSprop([flat.parameter], lr=config.lr, alpha=0.99, eps=1e-5)
    return actor, critic, loss, optimizer, flat


@torch.no_grad()
def compute_advantages(batch: TensorDictBase, critic, config: OnPolicyConfig) -> None:
    """GAE once per batch with the pre-update critic; writes ``advantage``/``value_target``.

    V(x_t) and V(x_{t+1}) are evaluated step by step from the stored hidden state (exactly the
    collection-time computation for a recurrent critic), V(x_{t+1}) on ``("next", ...)``.
    """
    flat = batch.reshape(-1)
    value = critic(flat.select(*critic.in_keys, strict=False).clone())["state_value"]
    next_value = critic(flat["next"].select(*critic.in_keys, strict=False).clone())["state_value"]
    advantage, value_target = generalized_advantage_estimate(
        config.gamma,
        config.lmbda,
        value.reshape(*batch.shape, 1),
        next_value.reshape(*batch.shape, 1),
        batch["next", "reward"],
        batch["next", "done"],
        batch["next", "terminated"],
    )
    batch.set("advantage", advantage)
    batch.set("value_target", value_target)
    batch.set("state_value", value.reshape(*batch.shape, 1))


def training_sequences(batch: TensorDictBase, length: int, burn_in: int) -> TensorDictBase:
    """Cut ``[B, T]`` rows into windows of ``burn_in + length`` steps for recurrent training.

    Window i trains on steps [i·L, (i+1)·L) of its row; the ``burn_in`` steps before them
    (after them for the first window) are replayed but masked out of the loss through
    ``("collector", "mask")``, so every step is trained exactly once and each window starts
    ``burn_in`` steps earlier than its trained part, from the state stored there.

    Returns:
        ``[B · T/L, burn_in + L]`` windows.
    """
    rows, time = batch.shape
    width = burn_in + length
    starts = [max(0, i * length - burn_in) for i in range(time // length)]
    index = torch.tensor(starts).unsqueeze(-1) + torch.arange(width)  # [n, width]
    windows = batch[:, index].reshape(rows * len(starts), width)
    trained = torch.zeros(len(starts), width, dtype=torch.bool)
    for i, start in enumerate(starts):
        offset = i * length - start
        trained[i, offset : offset + length] = True
    windows.set(("collector", "mask"), trained.repeat(rows, 1))
    return windows


def minibatches(batch: TensorDictBase, config: OnPolicyConfig, generator) -> Iterator:
    """Shuffled minibatches: of single steps (feed-forward) or of whole sequences (recurrent)."""
    if config.recurrent is None:
        flat = batch.reshape(-1)
        order = torch.randperm(flat.shape[0], generator=generator)
        for start in range(0, flat.shape[0], config.minibatch_size):
            yield flat[order[start : start + config.minibatch_size]]
    else:
        length = config.sequence_length or batch.shape[1]
        if length != batch.shape[1] or config.burn_in:
            batch = training_sequences(batch, length, config.burn_in)
        rows = max(1, config.minibatch_size // length)
        order = torch.randperm(batch.shape[0], generator=generator)
        for start in range(0, batch.shape[0], rows):
            yield batch[order[start : start + rows]]


class TensorPath:
    """PPO's gradient steps on plain tensors, for feed-forward categorical actor-critics.

    Per gradient step the loss module spends most of its time on TensorDict bookkeeping
    (indexing, keys, distribution objects) rather than on the 2×64 MLPs. Here the tensors the
    loss needs are gathered once per batch, minibatches are index gathers, and the losses come
    from :func:`~ac_extensions.functional.categorical_ppo_losses`, which equals
    ``loss_module``'s output (``tests/functional/test_ppo.py``). The minibatch order uses the
    same generator draws as :func:`minibatches`, so a run takes the same steps either way (up
    to float rounding: ``tests/recipes/test_on_policy.py``).

    With ``config.hand_gradients`` and MLP networks (:class:`~ac_extensions.modules.MLPBackprop`)
    the path also writes the gradients itself (:attr:`writes_gradients`): the networks run
    forward without autograd, :func:`~ac_extensions.functional.categorical_ppo_backward` gives
    ∂L/∂logits and ∂L/∂V, and :class:`~ac_extensions.modules.MLPBackprop` propagates them into
    every parameter's ``.grad`` (overwriting it), so the caller takes no ``backward()``.

    Args:
        actor: the feed-forward actor of :func:`~ac_extensions.modules.make_actor_critic`.
        critic: its critic.
        loss_module: the :class:`~ac_extensions.objectives.SequencePPOLoss` whose settings
            (clip ε as annealed, coefficients, value clipping) the losses use.
        config: the run's config (``minibatch_size``).
    """

    def __init__(self, actor, critic, loss_module: SequencePPOLoss, config: OnPolicyConfig):
        body = actor.module[0]
        self.observation_key = body.in_keys[0]
        self.actor_net, self.critic_net = body.module, critic.module
        self.loss_module, self.config = loss_module, config
        self.backprop: tuple[MLPBackprop, MLPBackprop] | None = None
        if config.hand_gradients and all(
            MLPBackprop.supports(net) for net in (self.actor_net, self.critic_net)
        ):
            backprop = (MLPBackprop(self.actor_net), MLPBackprop(self.critic_net))
            actor_params = {id(p) for p in backprop[0].parameters()}
            critic_params = {id(p) for p in backprop[1].parameters()}
            # Every trained parameter gets its gradient written, and none twice (overwrite).
            if not actor_params & critic_params and actor_params | critic_params == {
                id(p) for p in loss_module.parameters()
            }:
                self.backprop = backprop

    @property
    def writes_gradients(self) -> bool:
        """Whether a call also writes the parameters' ``.grad`` (no ``backward()`` needed)."""
        return self.backprop is not None

    @staticmethod
    def applies(config: OnPolicyConfig) -> bool:
        """Whether ``config`` trains a feed-forward PPO with ``tensor_update`` on."""
        return config.tensor_update and config.algorithm == "ppo" and config.recurrent is None

    def gather(self, batch: TensorDictBase) -> tuple[Tensor, ...]:
        """The tensors the loss reads, flattened to ``[N, ...]`` steps: once per batch.

        Returns:
            ``(observation [N, obs], action [N], log µ [N], advantage [N], value_target [N],
            state_value [N])``.
        """
        flat = batch.reshape(-1)
        keys = self.loss_module.tensor_keys
        return (
            flat[self.observation_key],
            flat[keys.action],
            flat[keys.sample_log_prob],
            flat[keys.advantage].squeeze(-1),
            flat[keys.value_target].squeeze(-1),
            flat["state_value"].squeeze(-1),
        )

    def minibatches(self, steps: tuple[Tensor, ...], generator) -> Iterator[tuple]:
        """Shuffled minibatches of the :meth:`gather` ed steps, as tuples of ``[M, ...]``.

        A minibatch that holds every step is the batch itself, unshuffled: its losses are
        means over the steps, which the order does not change (the permutation is drawn all
        the same, so the generator's stream matches :func:`minibatches`').
        """
        n = steps[0].shape[0]
        order = torch.randperm(n, generator=generator)
        if self.config.minibatch_size >= n:
            yield steps
            return
        for start in range(0, n, self.config.minibatch_size):
            index = order[start : start + self.config.minibatch_size]
            yield tuple(t[index] for t in steps)

    def __call__(self, minibatch: tuple, diagnostics: bool) -> dict:
        """The loss terms (and, with ``diagnostics``, the scalar diagnostics) of a minibatch.

        With :attr:`writes_gradients` they come detached, and the gradient of their sum is
        already in the parameters' ``.grad``.
        """
        observation, action, log_prob, advantage, value_target, old_value = minibatch
        loss = self.loss_module
        clip_value = loss.clip_value
        settings = dict(
            clip_epsilon=float(loss.clip_epsilon),
            entropy_coeff=float(loss.entropy_coeff),
            critic_coeff=float(loss.critic_coeff),
            normalize_advantage=loss.normalize_advantage,
            clip_value=None if clip_value is None else float(clip_value),
            old_value=old_value,
            diagnostics=diagnostics,
        )
        if self.backprop is None:
            logits = self.actor_net(observation)
            value = self.critic_net(observation).squeeze(-1)
            return categorical_ppo_losses(
                logits, value, action, log_prob, advantage, value_target, **settings
            )
        actor, critic = self.backprop
        logits, actor_saved = actor.forward(observation)
        value, critic_saved = critic.forward(observation)
        out, grad_logits, grad_value = categorical_ppo_backward(
            logits, value.squeeze(-1), action, log_prob, advantage, value_target, **settings
        )
        actor.backward(actor_saved, grad_logits)
        critic.backward(critic_saved, grad_value.unsqueeze(-1))
        return out


def epoch_losses(
    batch: TensorDictBase | tuple[Tensor, ...],
    config: OnPolicyConfig,
    generator,
    loss_module,
    tensor_path: TensorPath | None = None,
    diagnostics: bool = True,
) -> Iterator:
    """The loss outputs of one epoch's minibatches, in order, computed one at a time.

    Each output is computed when the next one is asked for, so a caller that takes an optimiser
    step in between trains every minibatch on the updated networks. Minibatches come from
    :func:`minibatches` of the TensorDict ``batch`` through ``loss_module``, or, with a
    ``tensor_path``, from ``batch`` = ``tensor_path.gather(...)``'s tensors. With
    ``diagnostics``, the last minibatch also computes the diagnostics (entropy, clip
    fraction, KL, ...; ~0.3 ms per step): the KL early stop and the logs read them.
    """
    if tensor_path is None:
        cuts = list(minibatches(batch, config, generator))
    else:
        cuts = list(tensor_path.minibatches(batch, generator))
    last = len(cuts) - 1 if diagnostics else -1
    for index, minibatch in enumerate(cuts):
        diagnostics = index == last
        if tensor_path is None:
            loss_module.diagnostics = diagnostics
            yield loss_module(minibatch)
        else:
            yield tensor_path(minibatch, diagnostics)


def finished_returns(batch: TensorDictBase) -> list[float]:
    """Returns of the episodes that ended in ``batch``, in time order."""
    done = batch["next", "done"].squeeze(-1)
    times = done.nonzero()
    order = times[:, 1].argsort(stable=True)
    values = batch["next", "episode_reward"].squeeze(-1)[done]
    return values[order].tolist()


def evaluate(actor, config: OnPolicyConfig, episodes: int) -> list[float]:
    """Greedy-policy returns of ``episodes`` episodes on a fresh env."""
    env = make_batched_env(
        config.env_id,
        1,
        observation_keys=config.observation_keys,
        transform_factory=config.transform_factory,
        extra_transforms=(recurrent_env_transforms(actor),) if config.recurrent else (),
    )
    env.set_seed(config.seed + 10_000)
    returns: list[float] = []
    with set_exploration_type(ExplorationType.DETERMINISTIC), torch.no_grad():
        while len(returns) < episodes:
            rollout = env.rollout(10_000, actor, break_when_any_done=True)
            returns.extend(finished_returns(rollout))
    env.close()
    return returns[:episodes]


def train(  # noqa: C901 (one loop, read top to bottom; see the module docstring)
    config: OnPolicyConfig, *, checkpoint: Checkpointer | None = None
) -> Iterator[dict[str, float]]:
    """Run the recipe; yield one dict of scalar metrics per collected batch.

    With a ``checkpoint``, a run resumes from its newest checkpoint (networks, optimiser,
    counters, random streams; only the frames still missing from ``config.frames`` are
    collected) and saves one every ``checkpoint.every`` batches and after the last.

    Faults (see :class:`~ac_extensions.recipes._common.NonFiniteGuard`): an update with a
    NaN/inf loss or gradient norm is skipped, a batch with a NaN/inf observation or reward is
    dropped; both warn and count (``train/skipped_updates``, ``train/skipped_batches``), and
    ``max_nonfinite_updates`` in a row raise ``NonFiniteError``. A collector worker that dies
    raises ``WorkerError``. Either stops the run before the batch in progress is checkpointed.
    """
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    actor, critic, loss_module, optimizer, flat = build(config)
    tensor_path = None  # feed-forward PPO: the same losses on plain tensors (TensorPath)
    if TensorPath.applies(config):
        tensor_path = TensorPath(actor, critic, loss_module, config)
    num_batches = math.ceil(config.frames / config.batch_frames)
    progress = Progress(config.return_window)
    # A resumed run continues from its checkpoint: batches already trained on.
    counters = resume(checkpoint, loss_module, optimizer, progress, generator)
    done = counters.get("batches", 0)
    guard = NonFiniteGuard(config.max_nonfinite_updates)  # skips non-finite batches and steps
    guard.load_state_dict(counters)
    if done >= num_batches:
        return
    collector = start_collector(
        config,
        partial(make_env, config),
        collection_policy(actor, critic),
        frames=config.frames - progress.frames,
        seed=config.seed + done,
        asynchronous=config.async_collection,
    )
    try:
        collect_start = time.perf_counter()
        for iteration, batch in enumerate(collector, start=done):
            collect_time = time.perf_counter() - collect_start
            batch = batch.reshape(-1, batch.shape[-1])  # [W·E, T]
            returns = finished_returns(batch)
            # A batch with a NaN/inf observation or reward is dropped (warned, counted).
            learn = guard.batch_ok(batch)

            # Reward shaping (logged returns above are the environment's).
            if learn and config.reshape_reward is not None:
                batch["next", "reward"] = config.reshape_reward(
                    batch["observation"],
                    batch["action"],
                    batch["next", "reward"],
                    batch["next", "done"],
                )

            update_start = time.perf_counter()
            if learn:
                compute_advantages(batch, critic, config)
                # Validate the whole batch once; its minibatches skip the per-call checks.
                loss_module.validate(batch)
                loss_module.check_inputs = False

            # Schedules: linear decay over the run (progress measured before this update).
            remaining = 1.0 - iteration / num_batches
            lr = config.lr * (remaining if config.anneal_lr else 1.0)
            for group in optimizer.param_groups:
                group["lr"] = lr
            if config.algorithm == "ppo" and config.anneal_clip:
                loss_module.clip_epsilon.fill_(config.clip_epsilon * remaining)

            epochs = (config.epochs if config.algorithm == "ppo" else 1) if learn else 0
            flat.check()  # every parameter and gradient still lives in the flat buffers
            logs: dict[str, list[float]] = {}
            stopped_early = 0.0
            hand = tensor_path is not None and tensor_path.writes_gradients
            source = tensor_path.gather(batch) if tensor_path is not None and learn else batch
            for epoch in range(epochs):
                # Diagnostics on the last minibatch of the last epoch (of every epoch when the
                # KL early stop needs them).
                diagnose = config.target_kl is not None or epoch == epochs - 1
                for out in epoch_losses(
                    source, config, generator, loss_module, tensor_path, diagnose
                ):
                    if not hand:  # (the hand path has written the gradients already)
                        total = sum(v for k, v in out.items() if k.startswith("loss_"))
                        flat.zero_grad()
                        total.backward()
                    grad_norm = float(flat.clip_grad_norm_(config.max_grad_norm))
                    values = {key: float(value.detach()) for key, value in out.items()}
                    total_value = sum(v for k, v in values.items() if k.startswith("loss_"))
                    if not guard.update_ok(total_value, grad_norm):
                        continue  # NaN/inf loss or gradient: no step (warned, counted)
                    optimizer.step()
                    for key, value in values.items():
                        logs.setdefault(key, []).append(value)
                    logs.setdefault("grad_norm", []).append(grad_norm)
                kl = logs.get("kl_approx", [0.0])[-1]
                if config.target_kl is not None and kl > 1.5 * config.target_kl:
                    stopped_early = 1.0
                    break
            loss_module.diagnostics = True
            collector.update_policy_weights_()
            update_time = time.perf_counter() - update_start

            metrics = {f"train/{k}": sum(v) / len(v) for k, v in logs.items()}
            metrics.update(progress.update(batch.numel(), returns))
            metrics.update(guard.metrics())
            metrics.update(collector_metrics(batch))
            metrics.update(
                {
                    "train/lr": lr,
                    "train/stopped_early": stopped_early,
                    "time/collect": collect_time,
                    "time/update": update_time,
                }
            )
            if config.eval_every and (iteration + 1) % config.eval_every == 0:
                evaluation = evaluate(actor, config, config.eval_episodes)
                metrics["eval/episode_return"] = sum(evaluation) / len(evaluation)
            yield metrics
            if checkpoint is not None:
                checkpoint.maybe_save(
                    iteration + 1,
                    partial(
                        training_state,
                        loss_module,
                        optimizer,
                        progress,
                        generator,
                        batches=iteration + 1,
                        **guard.state_dict(),
                    ),
                    final=iteration + 1 == num_batches,
                )
            collect_start = time.perf_counter()
    finally:
        stop_collector(collector)
