"""Reactor on CartPole-v1 composed from TorchRL's parts: only the loss and the sampler are ours.

One ``MultiSyncCollector`` worker steps 8 CartPoles (``SerialEnv``) for 32 steps with a
feed-forward Reactor network, which stores log µ(a_t|x_t) (``action_log_prob``). Rows go into
a ``TensorDictReplayBuffer`` whose ``PrioritizedSequenceSampler`` draws 16-step windows inside
a row; once it holds 1,000 frames, every 4 collected frames owe one learner step: sample 16
windows with their importance weights, ``ReactorLoss``, a clipped Adam step, the windows'
priorities back into the sampler (``rb.update_tensordict_priority``), ``HardUpdate``.

    python examples/compose_reactor.py --frames 12800 --seed 1
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial

import torch
from torchrl.collectors import MultiSyncCollector
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.envs import GymEnv, RewardSum, SerialEnv, TransformedEnv
from torchrl.objectives import HardUpdate

from ac_extensions.data import PrioritizedSequenceSampler
from ac_extensions.modules import make_reactor_actor
from ac_extensions.objectives import ReactorLoss
from ac_extensions.runtime import check_action_encoding, label_sequences, shutdown_collector

ENVS, T, L = 8, 32, 16  # envs, steps per collected row, steps per replayed window
CAPACITY = 2_048 * T  # whole rows: overwriting (FIFO) never splits a row


def make_env():
    """8 CartPoles with index actions (GymEnv's default is one-hot); RewardSum: returns."""
    cartpole = partial(GymEnv, "CartPole-v1", categorical_action_encoding=True)
    return TransformedEnv(SerialEnv(ENVS, cartpole), RewardSum())


if __name__ == "__main__":  # the collector starts its worker with spawn
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=12_800)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # small networks: one learner thread beside the worker
    actor = make_reactor_actor(
        4, 2, recurrent=False, previous_action_reward=False, recurrent_size=64
    )  # logits, action_value_logits, action, log µ
    loss = ReactorLoss(actor)  # one network: policy and distributional Q heads
    optimizer = torch.optim.Adam(loss.parameters(), lr=3e-3)
    target = HardUpdate(loss, value_network_update_interval=99)  # a copy every 100 steps
    check_action_encoding(make_env(), actor)  # fails on one-hot actions (see README)
    collector = MultiSyncCollector(
        [make_env], actor, frames_per_batch=ENVS * T, total_frames=args.frames
    )
    collector.set_seed(args.seed)
    sampler = PrioritizedSequenceSampler(CAPACITY, L, traj_key=("replay", "sequence"))
    replay = TensorDictReplayBuffer(
        storage=LazyTensorStorage(CAPACITY),
        sampler=sampler,
        batch_size=16 * L,
        priority_key="td_error",
    )
    keys = list(dict.fromkeys(loss.in_keys))  # what the replay keeps: the loss's inputs

    returns, rows, frames, owed, start = [], 0, 0, 0.0, time.perf_counter()
    for i, batch in enumerate(collector):  # [1 worker, 8 envs, T]
        done = batch["next", "done"]
        returns += batch["next", "episode_reward"][done].tolist()
        batch = label_sequences(batch, keys, rows, reward_scale=0.1)  # [8, T], one id per row
        rows, frames = rows + batch.shape[0], frames + batch.numel()
        replay.extend(batch.reshape(-1))
        owed += batch.numel() / 4 if len(replay) >= 1_000 else 0.0  # 4 frames per step
        while owed >= 1:
            sample = replay.sample().reshape(-1, L)  # [16, L], with "priority_weight"
            out = loss(sample)  # also writes each window's priority to sample["td_error"]
            optimizer.zero_grad()
            (out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]).backward()
            torch.nn.utils.clip_grad_norm_(loss.parameters(), 10.0)
            optimizer.step()
            replay.update_tensordict_priority(sample)  # one priority per window (a max)
            target.step()
            owed -= 1
        collector.update_policy_weights_()
        window = sum(returns[-20:]) / len(returns[-20:]) if returns else float("nan")
        if i % 8 == 0:
            print(f"{frames:6d} frames: mean of the last 20 returns {window:6.1f}", flush=True)
    shutdown_collector(collector)  # collector.shutdown() alone can hang at exit (TorchRL 0.14)
    seconds = round(time.perf_counter() - start, 1)
    print(json.dumps({"frames": frames, "return_window": window, "seconds": seconds}))
