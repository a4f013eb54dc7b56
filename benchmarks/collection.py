"""Collection cost per frame: TorchRL's GymWrapper stack against ac_extensions' lean path.

One in-process TorchRL ``Collector`` (what each recipe worker runs) on 8 CartPole-v1 copies,
256 frames per batch, the recipe's 2×64 actor, three variants measured interleaved:

* ``torchrl``: ``GymWrapper`` (+ ``VecGymEnvTransform``) + ``RewardSum``, ``ProbabilisticActor``
  (what ``make_batched_env`` / ``collection_policy`` built before);
* ``lean env``: :class:`~ac_extensions.runtime.vector_env.VectorGymEnv`, ``ProbabilisticActor``;
* ``lean env + sampler``: the same with :class:`~ac_extensions.modules.CategoricalSampler`
  (the recipes' default now);

plus gymnasium's ``SyncVectorEnv`` alone (random actions) as the floor. Reports milliseconds
per 256-frame batch (median over repeats) and ratios; writes
``benchmarks/results/collection.{md,json}``.

    python benchmarks/collection.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import gymnasium as gym
import torch
from torchrl.collectors import Collector
from torchrl.envs import GymWrapper, RewardSum, TransformedEnv

from ac_extensions.modules import collection_policy, make_actor_critic
from ac_extensions.runtime.envs import make_gym_env
from ac_extensions.runtime.vector_env import VectorGymEnv

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write_markdown

RESULTS = Path(__file__).resolve().parent / "results"
ENVS, FRAMES = 8, 256


def _vector() -> gym.vector.SyncVectorEnv:
    return gym.vector.SyncVectorEnv(
        [partial(make_gym_env, "CartPole-v1")] * ENVS,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )


def _torchrl_env():
    env = TransformedEnv(GymWrapper(_vector(), categorical_action_encoding=True))
    env.append_transform(RewardSum())
    return env


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batches", type=int, default=10, help="batches per timed repeat")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    actor, critic = make_actor_critic(4, 2)
    sampler = collection_policy(actor, critic)
    variants = {
        "torchrl": (_torchrl_env(), actor),
        "lean env": (VectorGymEnv(_vector()), actor),
        "lean env + sampler": (VectorGymEnv(_vector()), sampler),
    }
    iterators = {}
    for name, (env, policy) in variants.items():
        collector = Collector(env, policy, frames_per_batch=FRAMES, total_frames=-1)
        collector.set_seed(0)
        iterators[name] = (collector, iter(collector))
    raw = _vector()
    raw.reset(seed=0)

    def raw_batch():
        for _ in range(FRAMES // ENVS):
            raw.step(raw.action_space.sample())

    samples: dict[str, list[float]] = {name: [] for name in [*variants, "gymnasium alone"]}
    for repeat in range(args.repeats + 1):  # the first round warms up, untimed
        for name in samples:
            start = time.perf_counter()
            for _ in range(args.batches):
                if name == "gymnasium alone":
                    raw_batch()
                else:
                    next(iterators[name][1])
            elapsed = (time.perf_counter() - start) / args.batches * 1e3
            if repeat:
                samples[name].append(elapsed)
    for collector, _ in iterators.values():
        collector.shutdown()
    median = {name: statistics.median(v) for name, v in samples.items()}
    base = median["torchrl"]
    rows = [
        "| variant | ms per 256 frames (median) | frames/s | vs torchrl | all repeats |",
        "|---|---|---|---|---|",
    ] + [
        f"| {name} | {median[name]:.1f} | {FRAMES / median[name] * 1e3:,.0f} | "
        f"{base / median[name]:.2f}x | {', '.join(f'{v:.1f}' for v in samples[name])} |"
        for name in samples
    ]
    table = "\n".join(rows)
    header = (
        "# Collection cost: TorchRL's GymWrapper stack vs the lean path\n\n"
        f"Command: `python benchmarks/collection.py --repeats {args.repeats}` (one in-process "
        f"Collector, {ENVS} CartPole-v1 copies, {FRAMES} frames per batch, 2×64 actor, 1 torch "
        f"thread, {args.batches} batches per repeat, variants interleaved; torch "
        f"{torch.__version__}).\n\n"
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_markdown((RESULTS / "collection.md"), header + table + "\n")
    (RESULTS / "collection.json").write_text(
        json.dumps({"ms_per_batch": samples, "median": median}, indent=2)
    )
    print(table)


if __name__ == "__main__":
    main()
