"""PPO with Random Network Distillation on a hard-exploration task: TorchRL's parts, our losses.

``DeepSea-v0`` (20 × 20): only moving right at every step, each move costing a little,
reaches the reward of 1, so PPO alone learns to stop moving right and never finds it.
``RandomNetworkDistillation`` turns each step's ``("next", "observation")`` into an intrinsic
reward; TorchRL's ``GAE`` computes two advantages from a two-headed critic: the extrinsic one cut at
episode ends (γ 0.98), the intrinsic one not (γ 0.99, its done keys pointed at an entry that is
never set, so at an episode end it bootstraps from the terminal observation, where the recipe takes
the next episode's first; λ 0.8 for both); ``RNDPPOLoss`` follows 2·A^E + A^I and adds the
predictor's ``loss_rnd``. One ``MultiSyncCollector`` worker steps 8 envs (``SerialEnv``); 20 epochs
of 2 minibatches (advantages standardised in each) per batch of 8 × 64 steps, Adam 1e-3.
``--no-rnd``: the intrinsic advantage's weight is 0.

    python examples/compose_rnd_ppo.py --frames 20480 --seed 1
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

from ac_extensions.modules import RandomNetworkDistillation, make_actor_critic, rnd_networks
from ac_extensions.objectives import RNDPPOLoss
from ac_extensions.runtime import check_action_encoding, shutdown_collector  # registers DeepSea-v0

ENVS, T = 8, 64
HEADS = ("state_value", "state_value_intrinsic")


def make_env():
    """8 deep seas (one-hot positions ``[400]``), returns summed per episode."""
    envs = SerialEnv(ENVS, partial(GymEnv, "DeepSea-v0", categorical_action_encoding=True))
    return TransformedEnv(envs, RewardSum())


if __name__ == "__main__":  # the collector starts its worker with spawn
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=20_480)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-rnd", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # small networks: one learner thread beside the worker
    actor, critic = make_actor_critic(400, 2, value_keys=HEADS)
    rnd = RandomNetworkDistillation(*rnd_networks(400), observation_shape=(400,))
    check_action_encoding(make_env(), actor)  # index actions, as the categorical actor writes
    rnd.initialize(make_env().rollout(128, break_when_any_done=False)["next", "observation"])
    ppo = dict(normalize_advantage=True, entropy_coeff=0.0, critic_coeff=0.5, loss_critic_type="l2")
    loss = RNDPPOLoss(actor, critic, rnd, intrinsic_coeff=0.0 if args.no_rnd else 1.0, **ppo)
    extrinsic = GAE(gamma=0.98, lmbda=0.8, value_network=critic)
    intrinsic = GAE(gamma=0.99, lmbda=0.8, value_network=critic)
    intrinsic.set_keys(
        value="state_value_intrinsic",
        reward="reward_intrinsic",
        done="never",
        terminated="never",
        advantage="advantage_intrinsic",
        value_target="value_target_intrinsic",
    )
    trained = [p for p in loss.parameters() if p.requires_grad]  # not RND's fixed target
    optimizer = torch.optim.Adam(trained, lr=1e-3)
    collector = MultiSyncCollector(
        [make_env], actor, frames_per_batch=ENVS * T, total_frames=args.frames
    )
    collector.set_seed(args.seed)

    returns, frames, start = [], 0, time.perf_counter()
    for i, batch in enumerate(collector):
        batch = batch.reshape(-1, T)  # [8 rows, T]: one env's contiguous steps per row
        returns += batch["next", "episode_reward"][batch["next", "done"]].tolist()
        frames += batch.numel()
        rnd(batch)  # ("next", "reward_intrinsic"), normalised; RND's statistics updated
        batch["next", "never"] = torch.zeros_like(batch["next", "done"])
        with torch.no_grad():
            extrinsic(batch)  # "advantage", "value_target"
            intrinsic(batch)  # "advantage_intrinsic", "value_target_intrinsic"
        flat = batch.reshape(-1)
        for _ in range(20):
            for steps in torch.randperm(flat.shape[0]).chunk(2):
                out = loss(flat[steps])
                optimizer.zero_grad()
                sum(v for k, v in out.items() if k.startswith("loss_")).backward()
                torch.nn.utils.clip_grad_norm_(trained, 0.5)
                optimizer.step()
        collector.update_policy_weights_()
        window = sum(returns[-20:]) / len(returns[-20:]) if returns else float("nan")
        if i % 10 == 0:
            print(f"{frames:6d} frames: mean of the last 20 returns {window:5.2f}", flush=True)
    shutdown_collector(collector)  # collector.shutdown() alone can hang at exit (TorchRL 0.14)
    seconds = round(time.perf_counter() - start, 1)
    print(json.dumps({"frames": frames, "return_window": window, "seconds": seconds}))
