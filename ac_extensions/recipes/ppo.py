"""PPO on TorchRL's multi-process collector, read top to bottom: config, build, the loop.

Schulman et al., 2017, "Proximal Policy Optimization Algorithms", arXiv:1707.06347. One
iteration of :func:`train`:

1. **Collect**: ``MultiSyncCollector`` workers each step E environments for T steps → a batch
   ``[W·E, T]``, every row one contiguous stream of one environment, with log µ(a_t|x_t)
   stored at collection (``async_collection``: one worker's ``[E, T]`` while the others go on;
   ``overlap_collection``: the next batch collected beside this update, one update behind).
2. **Targets**: GAE once per batch with the pre-update critic (Schulman et al., 2016,
   arXiv:1506.02438), V(x_{t+1}) read from ``("next", ...)`` so truncations bootstrap.
3. **Losses and steps**: ``epochs`` passes over shuffled minibatches (of steps, or of whole
   sequences for recurrent policies), each one call of the exported
   :class:`~ac_extensions.objectives.SequencePPOLoss` (clipped surrogate, value loss, entropy),
   a clipped Adam step; linear learning-rate and clip annealing, optional KL early stop.
4. **Weights** go to the workers; metrics are yielded (``train/*``, ``eval/*``, ``time/*``).

The plumbing (collector supervision, checkpoints, non-finite guards, progress) lives in
:mod:`ac_extensions.runtime`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

import torch

from ac_extensions.modules import RandomNetworkDistillation, collection_policy, rnd_networks
from ac_extensions.objectives import RNDPPOLoss, SequencePPOLoss
from ac_extensions.runtime import (
    Checkpointer,
    FlatAdam,
    FlatParameters,
    collector_metrics,
    finished_returns,
)
from ac_extensions.runtime.config import OnPolicyConfig
from ac_extensions.runtime.envs import require_action_space
from ac_extensions.runtime.loop import Run, seed_run
from ac_extensions.runtime.on_policy import (
    clip_rewards,
    compute_advantages,
    evaluate,
    make_env,
    make_networks,
    minibatches,
    random_observations,
    reshape_rewards,
)

_PAPER_ATARI: dict[str, Any] = {
    "lr": 2.5e-4,
    "rollout_length": 128,
    "epochs": 3,
    "minibatch_size": 256,
    "clip_epsilon": 0.1,
    "lmbda": 0.95,
    "entropy_coeff": 0.01,
}
"""The PPO paper's Atari settings both pixel families share (see ``PPOConfig.FAMILY_DEFAULTS``)."""


ACTION_SPACES = ("discrete", "box")
"""Discrete actions (categorical policy) and 1-D Box actions (diagonal Gaussian)."""


@dataclass(frozen=True)
class PPOConfig(OnPolicyConfig):
    """Hyper-parameters of PPO; defaults: rl-baselines3-zoo's tuned CartPole-v1 PPO.

    γ 0.98, λ 0.8, lr 1e-3 linear, clip 0.2 linear, 20 epochs, minibatch 256, 2×64 tanh MLPs,
    Adam eps 1e-5, grad-norm 0.5 (DLR-RM/rl-baselines3-zoo ``hyperparams/ppo.yml``). Other env
    families: ``PPOConfig.for_env(env_id, ...)`` (``FAMILY_DEFAULTS``; what ``ac-train``
    uses). Measured against Stable-Baselines3: ``benchmarks/RESULTS.md``.
    """

    FAMILY_DEFAULTS: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "minatar": _PAPER_ATARI
        | {
            "workers": 1,
            "envs_per_worker": 8,
            "torch_threads": 1,
            "share_torso": True,
            "head_sizes": (64, 64),
            "epochs": 4,
            "anneal_lr": False,
            "anneal_clip": False,
        },
        "atari": _PAPER_ATARI | {"envs_per_worker": 4},
        "mujoco": {
            "rollout_length": 256,
            "workers": 1,
            "envs_per_worker": 8,
            "torch_threads": 1,
            "lr": 3e-4,
            "anneal_lr": False,
            "epochs": 10,
            "minibatch_size": 64,
            "clip_epsilon": 0.2,
            "anneal_clip": False,
            "lmbda": 0.95,
            "entropy_coeff": 0.0,
            "normalize_observations": True,
            "normalize_rewards": True,
            "init_scale": 0.5,
        },
    }
    """Per family, on top of :class:`RunConfig`'s γ 0.99 and frames (see
    :meth:`~ac_extensions.runtime.config.RunConfig.for_env`).

    Atari: the PPO paper's Atari settings (Schulman et al., 2017, arXiv:1707.06347, Table 5:
    Adam 2.5e-4 and clip 0.1, both annealed linearly; 8 actors × 128 steps; 3 epochs of
    minibatches of 256; λ 0.95; entropy 0.01), value coefficient and gradient clip 0.5 (SB3's),
    2 workers × 4 envs, separate torsos (not measured here).

    MinAtar, for a 1M-frame budget: the same batch (one worker of 8 envs × 128 steps, a
    one-thread learner: 1.42× the fps of 2 workers × 4 envs here,
    ``benchmarks/results/minatar_ppo_layout.md``), with the network and schedule of SB3's
    PPO as rl-baselines3-zoo runs it on Atari but constant: one MinAtar torso shared by both
    heads, each head a 2×64 tanh MLP (SB3's default ``net_arch`` after a shared features
    extractor), 4 epochs, lr 2.5e-4 and clip 0.1 not annealed (the zoo's linear decay is tuned
    for 10M frames): above linear heads and the annealed schedule at 1M frames
    (``benchmarks/results/minatar.md``, notes).

    MuJoCo: the PPO paper's settings (Schulman et al., 2017, arXiv:1707.06347, Table 3: 2048
    steps per batch, Adam 3e-4, 10 epochs of minibatches of 64, γ 0.99, λ 0.95, clip 0.2, a
    diagonal Gaussian with a state-independent log σ on separate 2×64 tanh MLPs), which are
    also SB3's PPO defaults, with rl-baselines3-zoo's ``normalize: true`` for these tasks
    (observations and rewards, as ``VecNormalize``). The 2048 steps are 8 envs × 256 steps in
    one worker process (the paper's one env × 2048 costs TorchRL's per-step overhead 8 times
    as often). One departure: the Gaussian starts at σ = 0.5, not the paper's 1 (a smaller
    initial σ is what Andrychowicz et al., 2021, arXiv:2006.05990, §3.2, recommend tuning
    down); it learned more than σ = 1 at 1M steps, above it on HalfCheetah and Walker2d and
    level on Hopper (``benchmarks/results/mujoco.md``, the ``ppo_sigma1`` rows), and
    ``init_scale=1.0`` restores the paper's."""

    epochs: int = 20
    """Passes over each batch."""
    minibatch_size: int = 256
    """Frames per gradient step (rounded to whole sequences for recurrent policies)."""
    clip_epsilon: float = 0.2
    """Clip ε (Schulman et al., 2017, arXiv:1707.06347, Eq. 7)."""
    anneal_clip: bool = True
    """Decay ε linearly to 0 with the learning rate (zoo ``clip_range: lin_0.2``)."""
    clip_value: float | None = None
    """Value clipping radius (None: no value clipping)."""
    normalize_advantage: bool = True
    """Standardise advantages per minibatch."""
    target_kl: float | None = None
    """Stop the epochs of a batch early once ``kl_approx`` exceeds 1.5 × this (SB3's rule)."""
    compile_loss: bool = False
    """Compile the loss with ``torch.compile``. Forward and backward compile once, in tens of
    seconds at the start. It pays where the loss's per-minibatch overhead outweighs
    its arithmetic: small MLPs (MuJoCo's, CartPole's); MinAtar's conv torso ran slower with
    it (``benchmarks/results/ppo_speed.md``). Off by default: compiled kernels round
    differently from eager ones, so a seed's run differs from the eager one's."""
    rnd: bool = False
    """Add Random Network Distillation's exploration bonus (Burda et al., 2018,
    arXiv:1810.12894): a second, intrinsic value head and advantage (``RNDPPOLoss``)."""
    intrinsic_gamma: float = 0.99
    """With ``rnd``: the intrinsic return's discount (the paper's γ_I; ``gamma`` is γ_E)."""
    extrinsic_coeff: float = 2.0
    """With ``rnd``: the extrinsic advantage's weight (the paper's)."""
    intrinsic_coeff: float = 1.0
    """With ``rnd``: the intrinsic advantage's weight (the paper's)."""
    rnd_proportion: float = 1.0
    """With ``rnd``: the fraction of each minibatch the predictor trains on."""
    rnd_init_steps: int = 128
    """With ``rnd``: random-policy steps of one worker's envs that start the observation
    statistics on a fresh run (0: start from mean 0, variance 1)."""
    rnd_reward_forget: float = 0.0
    """With ``rnd``: the fraction of the intrinsic-return statistics forgotten per batch
    (0: the paper's whole-run estimate)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("epochs", "minibatch_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.rnd:
            if not 0 <= self.intrinsic_gamma <= 1:
                raise ValueError(f"intrinsic_gamma must lie in [0, 1], got {self.intrinsic_gamma}")
            if not 0 < self.rnd_proportion <= 1:
                raise ValueError(f"rnd_proportion must lie in (0, 1], got {self.rnd_proportion}")
            if not 0 <= self.rnd_reward_forget < 1:
                raise ValueError(
                    f"rnd_reward_forget must lie in [0, 1), got {self.rnd_reward_forget}"
                )
            if self.rnd_init_steps < 0:
                raise ValueError(f"rnd_init_steps must be >= 0, got {self.rnd_init_steps}")
            if self.async_collection and self.workers > 1:
                raise ValueError(
                    "rnd with async_collection needs workers=1: the intrinsic return runs on "
                    "along each env's rows, which asynchronous batches from different workers "
                    f"interleave (got workers={self.workers})"
                )
            if self.clip_value is not None:
                raise ValueError(
                    "rnd does not support clip_value (the intrinsic head has no clipped loss)"
                )


def build(config: PPOConfig):
    """Networks, loss, optimiser for ``config``.

    Returns:
        ``(actor, critic, loss_module, optimizer, flat, normalizers)``: the optimiser steps ``flat``
        (:class:`~ac_extensions.runtime.FlatParameters`: the loss's parameters and gradients in
        one buffer each, so zeroing, clipping and the Adam update are one op each);
        ``normalizers`` the run's :class:`~ac_extensions.runtime.on_policy.BatchNormalizers`.
    """
    require_action_space(config.env_id, ACTION_SPACES, "PPO")
    value_keys = ("state_value", "state_value_intrinsic") if config.rnd else ("state_value",)
    actor, critic, normalizers = make_networks(config, value_keys=value_keys)
    options = dict(
        clip_epsilon=config.clip_epsilon,
        clip_value=config.clip_value,
        normalize_advantage=config.normalize_advantage,
        entropy_coeff=config.entropy_coeff,
        critic_coeff=config.critic_coeff,
        loss_critic_type="l2",
        # The loss calls the networks directly instead of swapping functional parameters in.
        functional=False,
    )
    if config.rnd:
        shape = normalizers.shape
        rnd = RandomNetworkDistillation(
            *rnd_networks(shape),
            observation_shape=shape,
            gamma=config.intrinsic_gamma,
            proportion=config.rnd_proportion,
            reward_forget=config.rnd_reward_forget,
        ).to(config.device)
        loss = RNDPPOLoss(
            actor,
            critic,
            rnd,
            extrinsic_coeff=config.extrinsic_coeff,
            intrinsic_coeff=config.intrinsic_coeff,
            **options,
        )
    else:
        loss = SequencePPOLoss(actor, critic, **options)
    flat = FlatParameters(p for p in loss.parameters() if p.requires_grad)
    optimizer = FlatAdam(flat, lr=config.lr, eps=1e-5, fused=True)
    return actor, critic, loss, optimizer, flat, normalizers


def train(  # noqa: C901 (one loop, read top to bottom)
    config: PPOConfig | None = None, *, checkpoint: Checkpointer | None = None
) -> Iterator[dict[str, float]]:
    """Run PPO; yield one dict of scalar metrics per collected batch.

    With a ``checkpoint``, a run resumes from its newest checkpoint (networks, optimiser,
    counters, random streams; only the frames still missing from ``config.frames`` are
    collected) and saves one every ``checkpoint.every`` batches and after the last.

    Faults (:class:`~ac_extensions.runtime.NonFiniteGuard`): an update with a NaN/inf loss or
    gradient norm is skipped, a batch with a NaN/inf observation or reward is dropped; both
    warn and count (``train/skipped_updates``, ``train/skipped_batches``), and
    ``max_nonfinite_updates`` in a row raise ``NonFiniteError``. A collector worker that dies
    raises ``WorkerError``. Either stops the run before the batch in progress is checkpointed.
    """
    config = config or PPOConfig()
    generator = seed_run(config)
    actor, critic, loss_module, optimizer, flat, normalizers = build(config)
    run = Run(config, loss_module, optimizer, checkpoint, generator=generator)
    normalizers.load_state_dict(run.counters)
    if run.finished:
        return
    rnd = getattr(loss_module, "rnd", None)
    if rnd is not None and not run.counters and config.rnd_init_steps:
        rnd.initialize(random_observations(config, config.rnd_init_steps))  # a fresh run
    guard, num_batches = run.guard, run.num_batches
    keys = loss_module.tensor_keys  # what a minibatch keeps: the loss's inputs, and the mask
    inputs = {*actor.in_keys, *critic.in_keys, keys.action, keys.sample_log_prob, keys.advantage}
    inputs |= {keys.value_target, keys.value, ("collector", "mask")}
    if rnd is not None:
        inputs |= {*rnd.in_keys, loss_module.intrinsic_advantage_key}
        inputs |= {loss_module.intrinsic_value_target_key}
    policy = normalizers.policy(collection_policy(actor, critic))
    # The loss as the minibatches call it (its state and settings stay on loss_module).
    compute = torch.compile(loss_module) if config.compile_loss else loss_module
    with run.collector(partial(make_env, config), policy) as collector:
        collect_start = time.perf_counter()
        for iteration, batch in run.batches(collector):
            # 1. Collect: [W·E, T] (async: one worker's [E, T]).
            collect_time = time.perf_counter() - collect_start
            returns, versions = finished_returns(batch), collector_metrics(batch)
            learn = guard.batch_ok(batch)  # NaN/inf observation or reward: dropped (warned)
            update_start = time.perf_counter()
            if learn:  # reward clip, normalisation, reward shaping (logged returns: the env's)
                clip_rewards(batch, config)
                normalizers(batch)
                reshape_rewards(batch, config)

            # 2. Targets: GAE with the pre-update critic (and the intrinsic stream's, with RND).
            intrinsic = {}
            if learn and rnd is not None:
                rnd(batch)  # ("next", "reward_intrinsic"), normalised; statistics updated
                reward = batch["next", "reward_intrinsic"]
                intrinsic["train/intrinsic_reward"] = float(reward.mean())
            if learn:
                compute_advantages(
                    batch,
                    critic,
                    config.gamma,
                    config.lmbda,
                    intrinsic_gamma=config.intrinsic_gamma if rnd is not None else None,
                )
                if rnd is not None:
                    target = batch[loss_module.intrinsic_value_target_key]
                    intrinsic["train/intrinsic_return"] = float(target.mean())
                loss_module.validate(batch)  # once per batch; the minibatches skip the checks
                loss_module.check_inputs = False
                batch = batch.select(*inputs, strict=False)

            # Schedules: linear decay over the run (progress measured before this update).
            remaining = 1.0 - iteration / num_batches
            lr = config.lr * (remaining if config.anneal_lr else 1.0)
            for group in optimizer.param_groups:
                group["lr"] = lr
            if config.anneal_clip:
                loss_module.clip_epsilon.fill_(config.clip_epsilon * remaining)

            # 3. Losses and steps: epochs × shuffled minibatches.
            epochs = config.epochs if learn else 0
            logs: dict[str, list[float]] = {}
            stopped_early = 0.0
            for epoch in range(epochs):
                cuts = list(minibatches(batch, config.minibatch_size, generator, config))
                # Diagnostics (entropy, clip fraction, KL, ...) on the last minibatch of the
                # last epoch, or of every epoch when the KL early stop needs them.
                diagnose = config.target_kl is not None or epoch == epochs - 1
                for index, minibatch in enumerate(cuts):
                    loss_module.diagnostics = diagnose and index == len(cuts) - 1
                    out = compute(minibatch)
                    flat.zero_grad()
                    sum(v for k, v in out.items() if k.startswith("loss_")).backward()
                    grad_norm = float(flat.clip_grad_norm_(config.max_grad_norm))
                    values = {key: float(value.detach()) for key, value in out.items()}
                    total = sum(v for k, v in values.items() if k.startswith("loss_"))
                    if not guard.update_ok(total, grad_norm):
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

            # 4. New weights to the workers; metrics.
            collector.update_policy_weights_()
            update_time = time.perf_counter() - update_start
            metrics = {f"train/{k}": sum(v) / len(v) for k, v in logs.items()}
            metrics |= run.progress.update(batch.numel(), returns) | guard.metrics()
            metrics |= (
                intrinsic
                | versions
                | {
                    "train/lr": lr,
                    "train/stopped_early": stopped_early,
                    "time/collect": collect_time,
                    "time/update": update_time,
                }
            )
            if config.eval_every and (iteration + 1) % config.eval_every == 0:
                evaluation = evaluate(normalizers.policy(actor), config, config.eval_episodes)
                metrics["eval/episode_return"] = sum(evaluation) / len(evaluation)
            yield metrics
            run.save(iteration, **normalizers.state_dict())
            collect_start = time.perf_counter()


__all__ = ["PPOConfig", "build", "make_env", "train"]
