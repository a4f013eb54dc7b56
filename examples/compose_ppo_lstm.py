"""Recurrent PPO (LSTM) on CartPole-v1 composed from TorchRL's parts: only the loss is ours.

Actor and critic each have a TorchRL ``LSTMModule``; the env's ``InitTracker`` and primer
(``recurrent_env_transforms``) make the collector store both hidden states at every step. One
``MultiSyncCollector`` worker steps 8 CartPoles (``SerialEnv``) for 64 steps; GAE reads V from
the stored states, and ``SequencePPOLoss`` replays whole ``[B, 64]`` rows in recurrent mode
(every TorchRL loss runs its networks under ``set_recurrent_mode(True)``), each row from the
hidden state stored at its first step; the learning rate decays linearly to 0.

    python examples/compose_ppo_lstm.py --frames 20480 --seed 1
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial

import torch
from torchrl.collectors import MultiSyncCollector
from torchrl.envs import GymEnv, RewardSum, SerialEnv, TransformedEnv
from torchrl.objectives.value import GAE

from ac_extensions.modules import collection_policy, make_actor_critic, recurrent_env_transforms
from ac_extensions.objectives import SequencePPOLoss
from ac_extensions.runtime import check_action_encoding, shutdown_collector

ENVS, T = 8, 64


def make_env():
    """8 CartPoles with index actions (GymEnv's default is one-hot); RewardSum: returns."""
    cartpole = partial(GymEnv, "CartPole-v1", categorical_action_encoding=True)
    env = TransformedEnv(SerialEnv(ENVS, cartpole), RewardSum())
    policy = collection_policy(*make_actor_critic(4, 2, recurrent="lstm"))  # (for its specs)
    return env.append_transform(recurrent_env_transforms(policy))  # is_init + hidden states


if __name__ == "__main__":  # the collector starts its worker with spawn
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=20_480)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # small networks: one learner thread beside the worker
    actor, critic = make_actor_critic(4, 2, recurrent="lstm")  # separate LSTMs (64 units)
    loss = SequencePPOLoss(actor, critic, normalize_advantage=True)
    gae = GAE(gamma=0.98, lmbda=0.95, value_network=None)  # on values computed below
    optimizer = torch.optim.Adam(loss.parameters(), lr=2e-3, eps=1e-5)
    policy = collection_policy(actor, critic)  # actor, then critic: both states get stored
    check_action_encoding(make_env(), policy)  # fails on one-hot actions (see README)
    collector = MultiSyncCollector(
        [make_env], policy, frames_per_batch=ENVS * T, total_frames=args.frames
    )
    collector.set_seed(args.seed)

    returns, frames, start = [], 0, time.perf_counter()
    for i, batch in enumerate(collector):
        batch = batch.reshape(-1, T)  # [8 rows, T]: one env's contiguous steps per row
        returns += batch["next", "episode_reward"][batch["next", "done"]].tolist()
        frames += batch.numel()
        with torch.no_grad():  # V(x_t), V(x_t+1) step by step from the stored hidden states
            critic(batch)
            critic(batch["next"])
            gae(batch)  # writes "advantage" and "value_target"
        for group in optimizer.param_groups:  # learning rate: linear decay to 0
            group["lr"] = 2e-3 * (1 - i * ENVS * T / args.frames)
        for _ in range(10):  # 10 epochs of 4 minibatches of 2 whole rows [2, T]
            for rows in torch.randperm(batch.shape[0]).split(2):
                out = loss(batch[rows])  # recurrent mode: each row from its stored state
                optimizer.zero_grad()
                (out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]).backward()
                torch.nn.utils.clip_grad_norm_(loss.parameters(), 0.5)
                optimizer.step()
        collector.update_policy_weights_()
        window = sum(returns[-20:]) / len(returns[-20:]) if returns else float("nan")
        if i % 4 == 0:
            print(f"{frames:6d} frames: mean of the last 20 returns {window:6.1f}", flush=True)
    shutdown_collector(collector)  # collector.shutdown() alone can hang at exit (TorchRL 0.14)
    seconds = round(time.perf_counter() - start, 1)
    print(json.dumps({"frames": frames, "return_window": window, "seconds": seconds}))
