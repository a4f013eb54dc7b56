"""PPO or A2C on Pendulum-v1 with your own TorchRL actor: only the loss is ours.

The actor is TorchRL's usual continuous one: an MLP whose 2 outputs ``NormalParamExtractor``
splits into loc and a state-dependent scale, feeding a ``TanhNormal`` on Pendulum's torque
bounds [−2, 2] (``ProbabilisticActor`` stores log µ(a|x) as ``action_log_prob``). One
``MultiSyncCollector`` worker steps 8 Pendulums (``SerialEnv``); rewards ×0.1 for the learner
(``RewardScaling``, after ``RewardSum`` has summed the env's); GAE (γ 0.9, λ 0.95) with the
pre-update critic. ``--loss ppo``: ``SequencePPOLoss``, 10 epochs of 4 minibatches per batch
of 8 × 128 steps, Adam 1e-3. ``--loss a2c``: ``SequenceA2CLoss``, one step per batch of 8 × 8
steps, Adam 3e-3 (1e-3 had barely moved from random play after 61k frames).

    python examples/compose_continuous_ppo.py --loss ppo --frames 61440 --seed 1
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial

import torch
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torchrl.collectors import MultiSyncCollector
from torchrl.envs import Compose, GymEnv, RewardScaling, RewardSum, SerialEnv, TransformedEnv
from torchrl.modules import MLP, ProbabilisticActor, TanhNormal, ValueOperator
from torchrl.objectives.value import GAE

from ac_extensions.objectives import SequenceA2CLoss, SequencePPOLoss
from ac_extensions.runtime import check_action_encoding, shutdown_collector

ENVS = 8


def make_env():
    """8 Pendulums; returns summed from the env's rewards, the learner's scaled by 0.1."""
    envs = SerialEnv(ENVS, partial(GymEnv, "Pendulum-v1"))
    return TransformedEnv(envs, Compose(RewardSum(), RewardScaling(loc=0.0, scale=0.1)))


if __name__ == "__main__":  # the collector starts its worker with spawn
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loss", choices=["ppo", "a2c"], default="ppo")
    parser.add_argument("--frames", type=int, default=61_440)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # small networks: one learner thread beside the worker
    net = torch.nn.Sequential(MLP(3, 2, num_cells=[64, 64]), NormalParamExtractor())
    actor = ProbabilisticActor(
        TensorDictModule(net, ["observation"], ["loc", "scale"]),
        in_keys=["loc", "scale"],
        distribution_class=TanhNormal,
        distribution_kwargs={"low": -2.0, "high": 2.0},
        return_log_prob=True,
    )
    critic = ValueOperator(MLP(3, 1, num_cells=[64, 64]), in_keys=["observation"])
    if args.loss == "ppo":
        loss, T, epochs, minibatches, lr = SequencePPOLoss(actor, critic), 128, 10, 4, 1e-3
    else:
        loss, T, epochs, minibatches, lr = SequenceA2CLoss(actor, critic), 8, 1, 1, 3e-3
    gae = GAE(gamma=0.9, lmbda=0.95, value_network=critic)
    optimizer = torch.optim.Adam(loss.parameters(), lr=lr)
    check_action_encoding(make_env(), actor)  # the action's shape fits the env's spec
    collector = MultiSyncCollector(
        [make_env], actor, frames_per_batch=ENVS * T, total_frames=args.frames
    )
    collector.set_seed(args.seed)

    returns, frames, start = [], 0, time.perf_counter()
    for i, batch in enumerate(collector):
        batch = batch.reshape(-1, T)  # [8 rows, T]: one env's contiguous steps per row
        returns += batch["next", "episode_reward"][batch["next", "done"]].tolist()
        frames += batch.numel()
        with torch.no_grad():
            gae(batch)  # writes "advantage" and "value_target"
        flat = batch.reshape(-1)
        for _ in range(epochs):
            for steps in torch.randperm(flat.shape[0]).chunk(minibatches):
                out = loss(flat[steps])
                optimizer.zero_grad()
                (out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]).backward()
                torch.nn.utils.clip_grad_norm_(loss.parameters(), 0.5)
                optimizer.step()
        collector.update_policy_weights_()
        window = sum(returns[-20:]) / len(returns[-20:]) if returns else float("nan")
        if i % (40 if args.loss == "a2c" else 5) == 0:
            print(f"{frames:6d} frames: mean of the last 20 returns {window:7.1f}", flush=True)
    shutdown_collector(collector)  # collector.shutdown() alone can hang at exit (TorchRL 0.14)
    seconds = round(time.perf_counter() - start, 1)
    print(json.dumps({"frames": frames, "return_window": window, "seconds": seconds}))
