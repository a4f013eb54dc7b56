"""A2C on TorchRL's multi-process collector, read top to bottom: config, build, the loop.

Advantage actor-critic, synchronous (Mnih et al., 2016, arXiv:1602.01783, Algorithm S3 with
W·E parallel actors). One iteration of :func:`train`:

1. **Collect**: ``MultiSyncCollector`` workers each step E environments for T steps → a batch
   ``[W·E, T]`` (``async_collection``: one worker's ``[E, T]`` while the others go on;
   ``overlap_collection``: the next batch collected beside this update, one update behind).
2. **Targets**: n-step returns as GAE with λ = 1 (configurable) from the pre-update critic,
   V(x_{t+1}) read from ``("next", ...)`` so truncations bootstrap.
3. **Loss and step**: one call of the exported :class:`~ac_extensions.objectives.SequenceA2CLoss`
   on the whole batch (of whole sequences, from their stored state, for recurrent policies),
   one clipped RMSprop step.
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

from ac_extensions.modules import collection_policy
from ac_extensions.objectives import SequenceA2CLoss
from ac_extensions.runtime import (
    Checkpointer,
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
    reshape_rewards,
    training_sequences,
)

ACTION_SPACES = ("discrete", "box")
"""Discrete actions (categorical policy) and 1-D Box actions (diagonal Gaussian)."""


_A3C_ATARI: dict[str, Any] = {"workers": 2, "rollout_length": 5, "entropy_coeff": 0.01}
"""A3C's Atari settings both pixel families share (see ``A2CConfig.FAMILY_DEFAULTS``)."""


@dataclass(frozen=True)
class A2CConfig(OnPolicyConfig):
    """Hyper-parameters of A2C; defaults: rl-baselines3-zoo's CartPole-v1 A2C.

    DLR-RM/rl-baselines3-zoo ``hyperparams/a2c.yml`` with SB3's A2C defaults: RMSprop lr 7e-4
    (α 0.99, eps 1e-5), γ 0.99, GAE λ 1.0, no entropy bonus, critic coefficient 0.5,
    gradient-norm clip 0.5, constant learning rate. MinAtar and Atari:
    ``A2CConfig.for_env(env_id, ...)`` (``FAMILY_DEFAULTS``; what ``ac-train`` uses).
    """

    FAMILY_DEFAULTS: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "minatar": _A3C_ATARI | {"share_torso": True, "head_sizes": (64, 64)},
        "atari": _A3C_ATARI,
        "mujoco": {
            "workers": 1,
            "envs_per_worker": 8,
            "torch_threads": 1,
            "normalize_observations": True,
            "normalize_rewards": True,
        },
    }
    """MinAtar and Atari (on top of :class:`RunConfig`'s γ 0.99 and frames; see
    :meth:`~ac_extensions.runtime.config.RunConfig.for_env`): A3C/A2C's Atari settings, t_max
    = 5 steps per update and entropy β = 0.01 (Mnih et al., 2016, arXiv:1602.01783,
    experimental setup; also SB3's and rl-baselines3-zoo's Atari A2C), RMSprop 7e-4 as the class
    default, two workers (CartPole's default is one); Atari: separate torsos, not measured.

    MinAtar: the same, with one MinAtar torso shared by the policy and value heads (the A3C
    paper's network shares all non-output layers) and a 2×64 tanh MLP per head (PPO's MinAtar
    heads): above separate torsos at 1M frames (``benchmarks/results/defaults.md``).

    MuJoCo: SB3's A2C defaults (the class defaults: 5 steps per env, RMSprop 7e-4, γ 0.99, no
    entropy bonus, separate 2×64 tanh MLPs, a diagonal Gaussian with a state-independent
    log σ) with rl-baselines3-zoo's ``normalize: true`` for these tasks (observations and
    rewards, as ``VecNormalize``), 8 envs in one worker (A3C's parallel actors, Mnih et al.,
    2016, arXiv:1602.01783, §4)."""

    frames: int = 200_000
    """Total environment frames to collect (SB3's A2C needs ~100k on CartPole-v1)."""
    workers: int = 1
    """Collector worker processes (W). One worker × 8 envs × 5 steps is SB3's A2C batch
    exactly: 40 frames per update. On CartPole-v1 it needs a median 84,780 frames until the
    20-episode mean reaches 475, against SB3's zoo A2C's 93,704 (seeds 1–10,
    ``benchmarks/results/a2c_cartpole.md``); larger batches run at more frames per second but
    need more frames (``benchmarks/results/defaults.md``)."""
    envs_per_worker: int = 8
    """Environments each worker steps at once (E)."""
    rollout_length: int = 5
    """Steps per environment per batch (T; SB3's A2C ``n_steps`` 5)."""
    gamma: float = 0.99
    """Discount γ."""
    lmbda: float = 1.0
    """GAE λ = 1: the n-step return advantage of A2C."""
    lr: float = 7e-4
    """RMSprop learning rate."""
    anneal_lr: bool = False
    """Decay the learning rate linearly to 0 over ``frames`` (off: constant, as SB3's A2C)."""


def build(config: A2CConfig):
    """Networks, loss, optimiser for ``config``.

    Returns:
        ``(actor, critic, loss_module, optimizer, flat, normalizers)``: the optimiser steps ``flat``
        (:class:`~ac_extensions.runtime.FlatParameters`, the loss's parameters and gradients
        in one buffer each); ``normalizers`` the run's
        :class:`~ac_extensions.runtime.on_policy.BatchNormalizers`.
    """
    require_action_space(config.env_id, ACTION_SPACES, "A2C")
    actor, critic, normalizers = make_networks(config)
    loss = SequenceA2CLoss(
        actor,
        critic,
        entropy_coeff=config.entropy_coeff,
        critic_coeff=config.critic_coeff,
        loss_critic_type="l2",
        functional=False,
    )
    flat = FlatParameters(loss.parameters())
    # A2C's RMSprop settings (Mnih et al., 2016; SB3's A2C defaults).
    optimizer = torch.optim.RMSprop([flat.parameter], lr=config.lr, alpha=0.99, eps=1e-5)
    return actor, critic, loss, optimizer, flat, normalizers


def train(
    config: A2CConfig | None = None, *, checkpoint: Checkpointer | None = None
) -> Iterator[dict[str, float]]:
    """Run A2C; yield one dict of scalar metrics per collected batch.

    Checkpoints and faults as in :func:`ac_extensions.recipes.ppo.train`.
    """
    config = config or A2CConfig()
    generator = seed_run(config)
    actor, critic, loss_module, optimizer, flat, normalizers = build(config)
    run = Run(config, loss_module, optimizer, checkpoint, generator=generator)
    normalizers.load_state_dict(run.counters)
    if run.finished:
        return
    guard, num_batches = run.guard, run.num_batches
    policy = normalizers.policy(collection_policy(actor, critic))
    with run.collector(partial(make_env, config), policy) as collector:
        collect_start = time.perf_counter()
        for iteration, batch in run.batches(collector):
            # 1. Collect: [W·E, T] (async: one worker's [E, T]).
            collect_time = time.perf_counter() - collect_start
            frames = batch.numel()
            returns, versions = finished_returns(batch), collector_metrics(batch)
            learn = guard.batch_ok(batch)  # NaN/inf observation or reward: dropped (warned)
            update_start = time.perf_counter()
            if learn:  # reward clip, normalisation, reward shaping (logged returns: the env's)
                clip_rewards(batch, config)
                normalizers(batch)
                reshape_rewards(batch, config)
            lr = config.lr * ((1.0 - iteration / num_batches) if config.anneal_lr else 1.0)
            for group in optimizer.param_groups:
                group["lr"] = lr

            logs: dict[str, float] = {}
            if learn:
                # 2. Targets: n-step (GAE λ) advantages with the pre-update critic.
                compute_advantages(batch, critic, config.gamma, config.lmbda)
                if config.recurrent is not None and (config.sequence_length or config.burn_in):
                    length = config.sequence_length or batch.shape[1]
                    batch = training_sequences(batch, length, config.burn_in)
                # 3. Loss and one step on the whole batch.
                out = loss_module(batch)
                total = sum(v for k, v in out.items() if k.startswith("loss_"))
                flat.zero_grad()
                total.backward()
                grad_norm = float(flat.clip_grad_norm_(config.max_grad_norm))
                # A NaN/inf loss or gradient skips the step (warned, counted).
                if guard.update_ok(float(total.detach()), grad_norm):
                    optimizer.step()
                    logs = {k: float(v.detach()) for k, v in out.items()}
                    logs["grad_norm"] = grad_norm

            # 4. New weights to the workers; metrics.
            collector.update_policy_weights_()
            update_time = time.perf_counter() - update_start
            metrics = {f"train/{k}": v for k, v in logs.items()}
            metrics |= run.progress.update(frames, returns) | guard.metrics()
            metrics |= versions | {
                "train/lr": lr,
                "time/collect": collect_time,
                "time/update": update_time,
            }
            if config.eval_every and (iteration + 1) % config.eval_every == 0:
                evaluation = evaluate(normalizers.policy(actor), config, config.eval_episodes)
                metrics["eval/episode_return"] = sum(evaluation) / len(evaluation)
            yield metrics
            run.save(iteration, **normalizers.state_dict())
            collect_start = time.perf_counter()


__all__ = ["A2CConfig", "build", "make_env", "train"]
