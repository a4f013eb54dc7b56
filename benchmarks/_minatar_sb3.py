"""The MinAtar grid's Stable-Baselines3 baselines: their network, settings and sources.

The SB3 baselines (``sb3_ppo``, ``sb3_ppo_const``, ``sb3_a2c``, ``sb3_dqn``, ``sb3_qrdqn``,
``sb3_dqn_paper``) run in a child process of ``minatar_grid.py`` (``--child``) and use the same
torso: a SB3 ``BaseFeaturesExtractor``
holding a :class:`~ac_extensions.modules.MinAtarCNN` (one 3×3 conv with 16 channels, ReLU, a
128-unit layer, ReLU; kenjyoung/MinAtar ``examples/dqn.py``, ``QNetwork``), with ``net_arch=[]``
so the heads are single linear layers on its 128 features, as in the paper's network (except
``sb3_ppo_const``, below). Observations
come from the same wrapper as ours (:func:`ac_extensions.runtime.envs.make_gym_env`: float32
channels-first ``[C, 10, 10]``, values 0/1). SB3 only transposes observation spaces it takes
for images (``uint8`` in [0, 255], ``is_image_space``), so a float32 [0, 1] space stays
channels-first as it is, and ``normalize_images=False`` keeps it from being divided by 255.
No Atari wrappers (no frame stack, no reward clipping: MinAtar rewards are already 0/1 and its
maps carry the motion trails). Each SB3 run uses one torch thread (two runs share 2 cores).

- ``sb3_dqn``: DQN with the MinAtar paper's settings (constants of kenjyoung/MinAtar
  ``examples/dqn.py``) except one update per 4 frames (``train_freq=4``: Nature DQN's update
  period, rl-baselines3-zoo's Atari default, and the rate of ``sb3_qrdqn`` below, so that the
  two SB3 DQNs differ in their head, loss and optimiser only): replay 100,000, batch 32,
  target network copied every 1,000 frames, learning starts after 5,000 frames (uniform
  random actions before, as there), ε from 1 to 0.1 linearly over the first 100,000 frames
  then 0.1 (SB3 anneals from frame 0; dqn.py from frame 5,000 on: a 5% shift of the
  schedule), γ 0.99, Huber loss (SB3's DQN loss, as dqn.py), and dqn.py's optimiser: centred
  RMSProp, lr 2.5e-4, α (squared-gradient momentum) 0.95, momentum 0.95, ε 0.01. No gradient
  clipping (dqn.py has none; SB3's default of 10 is switched off).
- ``sb3_dqn_paper``: the same with the MinAtar paper's one update per frame (``train_freq=1``).
  Not in the default grid: it cost 12,749 s for one run here (Breakout seed 1, 65–115 fps
  beside one other job), so its 15 runs would have been ≈50 job-hours, the grid's largest
  share. Run it by name (``--algos sb3_dqn_paper``); its Breakout seed 1 is committed.
- ``sb3_qrdqn``: QR-DQN (Dabney et al., 2018, arXiv:1710.10044) with ``sb3_dqn``'s settings,
  one update per 4 frames included (the QR-DQN paper's rate, which keeps Nature DQN's update
  period of 4, and rl-baselines3-zoo's default for QR-DQN; the MinAtar paper's one per frame
  made a run ≈15 h here), 51 quantiles (the resolution of Reactor's 51
  atoms; the paper's Atari N and sb3-contrib's default of 200 cost 5.1× more per frame here:
  Breakout, 12k frames after the replay start, one thread beside two other jobs, 119 fps at
  200 quantiles against 613 at 51, its quantile Huber loss over N × N pairs dominating the
  update), quantile Huber loss κ = 1, and Adam (the QR-DQN paper's optimiser,
  with its ε = 0.01/32) at the MinAtar lr 2.5e-4 (the paper's Atari lr 5e-5 is tuned to
  50M-frame runs). The target network is still copied every 1,000 frames (250 updates).
- ``sb3_ppo``: rl-baselines3-zoo's Atari PPO (``hyperparams/ppo.yml``, ``atari``): 8 envs,
  n_steps 128, 4 epochs, minibatch 256, lr 2.5e-4 and clip 0.1 both decayed linearly to 0,
  entropy 0.01, value coefficient 0.5, γ 0.99, GAE λ 0.95 (SB3 defaults, as the zoo), grad
  norm 0.5, one torso shared by policy and value (as the zoo's ``CnnPolicy``); the zoo's Nature
  CNN is replaced by the MinAtar torso above.
- ``sb3_ppo_const``: ``sb3_ppo`` with a constant lr 2.5e-4 and clip 0.1 (the zoo's decay to 0
  is tuned for 10M frames and halves the score at 1M) and SB3's default ``MlpPolicy`` heads,
  one 2×64 tanh MLP each for policy and value on the shared torso (``net_arch`` left at its
  default): the strongest SB3 PPO setting found for 1M MinAtar frames, and the settings of
  our ``ppo``'s MinAtar defaults.
- ``sb3_a2c``: rl-baselines3-zoo's Atari A2C (``hyperparams/a2c.yml``, ``atari``): 16 envs,
  n_steps 5 (SB3's default), entropy 0.01, value coefficient 0.25, RMSprop in TensorFlow's
  form (``RMSpropTFLike``, ε 1e-5) at SB3's lr 7e-4, γ 0.99, no GAE (λ 1), grad norm 0.5, one
  shared torso (the MinAtar one above): the SB3 counterpart of our ``a2c``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from _sb3 import SB3Checkpoint, SB3Log, jsonable, learn_sb3
from _scheduler import read_summary


def _extractor_class():
    """A SB3 features extractor holding our MinAtar torso (built lazily: SB3 is optional)."""
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor

    from ac_extensions.modules import MinAtarCNN

    class MinAtarExtractor(BaseFeaturesExtractor):
        """:class:`~ac_extensions.modules.MinAtarCNN` as a SB3 features extractor."""

        def __init__(self, observation_space, features_dim: int = 128) -> None:
            super().__init__(observation_space, features_dim)
            self.cnn = MinAtarCNN(observation_space.shape[0], features=features_dim)

        def forward(self, observations):
            return self.cnn(observations)

    return MinAtarExtractor


N_ENVS = {"sb3_ppo": 8, "sb3_ppo_const": 8, "sb3_a2c": 16}
"""Parallel envs of the on-policy baselines (the zoo's Atari ``n_envs``); the DQNs step one."""


def sb3_settings(algo: str, frames: int) -> dict[str, Any]:
    """The constructor keywords of an SB3 baseline (see the module docstring for their sources)."""
    import torch

    policy = {
        "features_extractor_class": _extractor_class(),
        "net_arch": [],
        "normalize_images": False,
    }
    if algo in ("sb3_ppo", "sb3_ppo_const"):
        ppo = dict(
            n_steps=128,
            batch_size=256,
            n_epochs=4,
            ent_coef=0.01,
            vf_coef=0.5,
            gamma=0.99,
            gae_lambda=0.95,
            max_grad_norm=0.5,
        )
        if algo == "sb3_ppo_const":
            # Constant lr and clip, and SB3's default MlpPolicy heads (a 2x64 tanh MLP each for
            # policy and value: net_arch left unset) on the shared torso.
            heads = {k: v for k, v in policy.items() if k != "net_arch"}
            return ppo | dict(
                learning_rate=2.5e-4,
                clip_range=0.1,
                policy_kwargs=heads | {"share_features_extractor": True},
            )

        def linear(value: float):
            return lambda remaining: remaining * value

        return ppo | dict(
            learning_rate=linear(2.5e-4),
            clip_range=linear(0.1),
            policy_kwargs=policy | {"share_features_extractor": True},
        )
    if algo == "sb3_a2c":
        from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike

        return dict(
            n_steps=5,
            learning_rate=7e-4,
            ent_coef=0.01,
            vf_coef=0.25,
            gamma=0.99,
            gae_lambda=1.0,
            max_grad_norm=0.5,
            policy_kwargs=policy
            | {"optimizer_class": RMSpropTFLike, "optimizer_kwargs": {"eps": 1e-5}},
        )
    dqn = dict(
        buffer_size=100_000,
        batch_size=32,
        learning_rate=2.5e-4,
        learning_starts=5_000,
        # One update per 4 frames: Nature DQN's and the QR-DQN paper's rate (dqn.py: one per
        # frame, which sb3_dqn_paper keeps).
        train_freq=4,
        gradient_steps=1,
        target_update_interval=1_000,
        tau=1.0,
        gamma=0.99,
        exploration_initial_eps=1.0,
        exploration_final_eps=0.1,
        exploration_fraction=min(1.0, 100_000 / frames),
    )
    if algo in ("sb3_dqn", "sb3_dqn_paper"):
        rmsprop = dict(alpha=0.95, momentum=0.95, eps=0.01, centered=True)
        policy |= {"optimizer_class": torch.optim.RMSprop, "optimizer_kwargs": rmsprop}
        if algo == "sb3_dqn_paper":
            dqn["train_freq"] = 1
        return dqn | dict(max_grad_norm=math.inf, policy_kwargs=policy)
    if algo == "sb3_qrdqn":
        # 51 quantiles, Reactor's atom count (the paper's 200 cost 5.1x more per frame here).
        policy |= {"n_quantiles": 51, "optimizer_kwargs": {"eps": 0.01 / 32}}
        return dqn | dict(max_grad_norm=None, policy_kwargs=policy)
    raise ValueError(f"unknown SB3 algorithm {algo!r}")


def train_sb3(algo: str, game: str, seed: int, frames: int, out: Path) -> dict | None:
    """Train one SB3 baseline to ``frames`` in ``out`` (resuming its checkpoint if there is one).

    Returns its summary, or None when it was stopped before the end (checkpoint saved).
    """
    import torch
    from stable_baselines3 import A2C, DQN, PPO
    from stable_baselines3.common.env_util import make_vec_env

    from ac_extensions.runtime.envs import make_gym_env

    torch.set_num_threads(1)
    env_id = f"MinAtar/{game}-v1"
    settings = sb3_settings(algo, frames)
    n_envs = N_ENVS.get(algo, 1)
    config = {"env_id": env_id, "frames": frames, "seed": seed, "n_envs": n_envs}
    log = SB3Log(out, algo, env_id, seed, frames, config | jsonable(settings))
    checkpoint = SB3Checkpoint(out)
    env_seed = seed + checkpoint.saved_frames()
    env = make_vec_env(lambda: make_gym_env(env_id), n_envs=n_envs, seed=env_seed)
    if algo == "sb3_qrdqn":
        from sb3_contrib import QRDQN as cls
    else:
        cls = {"sb3_ppo": PPO, "sb3_ppo_const": PPO, "sb3_a2c": A2C}.get(algo, DQN)
    model = cls("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **settings)
    complete = learn_sb3(model, log, checkpoint, frames, seed)
    env.close()
    return read_summary(out) if complete else None
