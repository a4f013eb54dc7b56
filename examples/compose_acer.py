"""ACER on CartPole-v1 composed from TorchRL's parts: only the loss is ours.

One ``MultiSyncCollector`` worker steps 8 CartPoles (``SerialEnv``) for 20 steps; the policy
stores µ's logits under ``("behavior", "logits")`` (``BehaviorPolicy``). Each batch gives one
on-policy update and goes into a ``TensorDictReplayBuffer`` whose ``SliceSampler`` draws whole
20-step rows back (``label_sequences`` gives every row its id); Poisson(4) replayed updates
follow, and ``SoftUpdate`` moves the averaged policy of the trust region after every step.

    python examples/compose_acer.py --frames 16000 --seed 1
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial

import torch
from torchrl.collectors import MultiSyncCollector
from torchrl.data import LazyTensorStorage, SliceSampler, TensorDictReplayBuffer
from torchrl.envs import GymEnv, RewardSum, SerialEnv, TransformedEnv
from torchrl.objectives import SoftUpdate

from ac_extensions.modules import make_actor_critic, make_qvalue
from ac_extensions.objectives import ACERLoss
from ac_extensions.runtime import (
    BehaviorPolicy,
    check_action_encoding,
    label_sequences,
    shutdown_collector,
)

ENVS, T = 8, 20
KEYS = ["observation", "action", ("behavior", "logits"), ("next", "observation")]
KEYS += [("next", "reward"), ("next", "done"), ("next", "terminated")]  # what the replay keeps


def make_env():
    """8 CartPoles with index actions (GymEnv's default is one-hot); RewardSum: returns."""
    cartpole = partial(GymEnv, "CartPole-v1", categorical_action_encoding=True)
    return TransformedEnv(SerialEnv(ENVS, cartpole), RewardSum())


if __name__ == "__main__":  # the collector starts its worker with spawn
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=16_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replay-ratio", type=float, default=4.0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # small networks: one learner thread beside the worker
    actor, _ = make_actor_critic(4, 2)  # writes logits, action (an index), action_log_prob
    loss = ACERLoss(actor, make_qvalue(4, 2), gamma=0.995, entropy_coeff=0.0)
    optimizer = torch.optim.Adam(loss.parameters(), lr=3e-3)
    average = SoftUpdate(loss, eps=0.99)  # θ_avg ← 0.99 θ_avg + 0.01 θ, the trust region's π_avg
    policy = BehaviorPolicy(actor)  # + ("behavior", "logits"): µ, which the replay keeps
    check_action_encoding(make_env(), policy)  # fails on one-hot actions (see README)
    collector = MultiSyncCollector(
        [make_env], policy, frames_per_batch=ENVS * T, total_frames=args.frames
    )
    collector.set_seed(args.seed)
    sampler = SliceSampler(slice_len=T, traj_key=("replay", "sequence"), strict_length=True)
    replay = TensorDictReplayBuffer(
        storage=LazyTensorStorage(50_000), sampler=sampler, batch_size=32 * T
    )  # 32 sequences of T steps

    def update(sequences):
        """One clipped Adam step on sequences [B, T], then the averaged policy's."""
        out = loss(sequences)
        optimizer.zero_grad()
        (out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]).backward()
        torch.nn.utils.clip_grad_norm_(loss.parameters(), 10.0)
        optimizer.step()
        average.step()  # after every optimiser step

    returns, rows, frames, start = [], 0, 0, time.perf_counter()
    for i, batch in enumerate(collector):  # [1 worker, 8 envs, T]
        done = batch["next", "done"]
        returns += batch["next", "episode_reward"][done].tolist()
        batch = label_sequences(batch, KEYS, rows, reward_scale=0.1)  # [8, T], one id per row
        rows, frames = rows + batch.shape[0], frames + batch.numel()
        replay.extend(batch.reshape(-1))
        update(batch)  # on-policy
        if len(replay) >= 1_000:  # then n ~ Poisson(replay ratio) replayed updates
            for _ in range(int(torch.poisson(torch.tensor(args.replay_ratio)))):
                update(replay.sample().reshape(-1, T))
        collector.update_policy_weights_()
        window = sum(returns[-20:]) / len(returns[-20:]) if returns else float("nan")
        if i % 10 == 0:
            print(f"{frames:6d} frames: mean of the last 20 returns {window:6.1f}", flush=True)
    shutdown_collector(collector)  # collector.shutdown() alone can hang at exit (TorchRL 0.14)
    seconds = round(time.perf_counter() - start, 1)
    print(json.dumps({"frames": frames, "return_window": window, "seconds": seconds}))
