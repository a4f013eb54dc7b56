"""PPO's training speed against Stable-Baselines3 PPO, side by side in one invocation.

For each env, runs of ``--frames`` frames, each in a fresh subprocess, one after the other
and alternating (ours, overlap, compiled, compiled_overlap, SB3, zoo, ours, ...) ``--repeats``
times, so a change of machine load hits all alike (``--sides``: a subset):

- ``ours``: our PPO with its defaults (``PPOConfig.for_env``: the recipe's defaults for the
  env's family);
- ``overlap``: the same with ``overlap_collection`` (the next batch collected beside each
  update, one update behind);
- ``compiled``, ``compiled_overlap``: the same two with ``compile_loss`` (each minibatch's
  loss through ``torch.compile``; the compiling counts in the run's seconds);
- ``sb3``: SB3 PPO at the same settings (batch, epochs, minibatch, network, normalisation;
  MinAtar: the ``sb3_ppo_const`` baseline of the MinAtar grid; MuJoCo: SB3's PPO defaults,
  which are the PPO paper's, with ``VecNormalize``), the question "which implementation is
  faster at the same work";
- ``zoo``: SB3 PPO with rl-baselines3-zoo's tuned settings for the env, the grids' ``sb3_ppo``
  rows (MinAtar: the zoo's Atari settings, the same work as ``sb3`` with annealed schedules;
  MuJoCo: the zoo's per-task settings, ``mujoco_grid.ZOO_PPO``), the question "how fast does
  each library train with its own settings for the task".

fps counts the whole run from before the model is built; the table gives the median of the
repeats and ours over each SB3 side.

    python benchmarks/ppo_speed.py --envs MinAtar/Breakout-v1 HalfCheetah-v5 --frames 100000

Writes ``benchmarks/results/ppo_speed.{md,json}`` (the notes under the table are kept).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _results import write_markdown  # noqa: E402

RESULTS = HERE / "results"
DEFAULT_ENVS = ("MinAtar/Breakout-v1", "HalfCheetah-v5")


def ours(env_id: str, frames: int, **options) -> dict:
    """Our PPO with its defaults for ``env_id``'s family (and ``options``); frames, seconds."""
    from ac_extensions.recipes.ppo import PPOConfig, train

    start = time.perf_counter()
    config = PPOConfig.for_env(env_id, frames=frames, seed=1, **options)
    metrics = list(train(config))
    return {"frames": metrics[-1]["time/frames"], "seconds": time.perf_counter() - start}


def sb3(env_id: str, frames: int) -> dict:
    """SB3 PPO at our defaults' settings for ``env_id``; frames and seconds."""
    import torch
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    from ac_extensions.recipes.ppo import PPOConfig
    from ac_extensions.runtime.envs import env_family, make_gym_env

    torch.set_num_threads(1)
    start = time.perf_counter()
    config = PPOConfig.for_env(env_id, seed=1)
    n_envs = config.workers * config.envs_per_worker
    env = make_vec_env(lambda: make_gym_env(env_id), n_envs=n_envs, seed=1)
    if env_family(env_id) == "minatar":
        from _minatar_sb3 import sb3_settings

        settings = sb3_settings("sb3_ppo_const", frames)
    else:
        env = VecNormalize(env, gamma=config.gamma)
        settings = dict(
            n_steps=config.rollout_length,
            batch_size=config.minibatch_size,
            n_epochs=config.epochs,
            learning_rate=config.lr,
            clip_range=config.clip_epsilon,
            ent_coef=config.entropy_coeff,
            gamma=config.gamma,
            gae_lambda=config.lmbda,
        )
    return _learn(env, settings, frames, start)


def zoo(env_id: str, frames: int) -> dict:
    """SB3 PPO with rl-baselines3-zoo's tuned settings for ``env_id``; frames and seconds."""
    import gymnasium as gym
    import torch
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    from ac_extensions.runtime.envs import env_family, make_gym_env

    torch.set_num_threads(1)
    start = time.perf_counter()
    if env_family(env_id) == "minatar":
        from _minatar_sb3 import N_ENVS, sb3_settings

        env = make_vec_env(lambda: make_gym_env(env_id), n_envs=N_ENVS["sb3_ppo"], seed=1)
        settings = sb3_settings("sb3_ppo", frames)
    else:
        from mujoco_grid import sb3_settings

        settings = sb3_settings(env_id.split("-")[0])
        env = make_vec_env(lambda: gym.make(env_id), n_envs=1, seed=1)
        env = VecNormalize(env, gamma=settings.get("gamma", 0.99))
    return _learn(env, settings, frames, start)


def _learn(env, settings: dict, frames: int, start: float) -> dict:
    """SB3 PPO with ``settings`` trained ``frames`` on ``env``; frames, seconds since ``start``."""
    from stable_baselines3 import PPO

    model = PPO("MlpPolicy", env, seed=1, device="cpu", verbose=0, **settings)
    model.learn(frames)
    return {"frames": model.num_timesteps, "seconds": time.perf_counter() - start}


SIDES = {
    "ours": ours,
    "overlap": partial(ours, overlap_collection=True),
    "compiled": partial(ours, compile_loss=True),
    "compiled_overlap": partial(ours, compile_loss=True, overlap_collection=True),
    "sb3": sb3,
    "zoo": zoo,
}
"""Every run per env and repeat, in the order they alternate (``--sides``: a subset)."""

OURS = ("ours", "overlap", "compiled", "compiled_overlap")
LABELS = {
    "ours": "ours",
    "overlap": "overlapped",
    "compiled": "compiled",
    "compiled_overlap": "compiled + overlapped",
    "sb3": "SB3 same",
    "zoo": "SB3 zoo",
}


def run_child(which: str, env_id: str, frames: int) -> dict:
    """One run in a fresh interpreter; its result dict."""
    command = [sys.executable, __file__, "--child", which, env_id, str(frames)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"{which} on {env_id} failed:\n{done.stderr[-2000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def median(values: list[float]) -> float:
    """The median."""
    values = sorted(values)
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def main(argv: list[str] | None = None) -> int:
    """Parse, run the pairs, write the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=list(DEFAULT_ENVS))
    parser.add_argument("--frames", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument(
        "--sides",
        nargs="+",
        choices=list(SIDES),
        default=list(SIDES),
        help="the runs to alternate (default: all)",
    )
    args = parser.parse_args(argv)
    sides = [which for which in SIDES if which in args.sides]
    peers = [which for which in ("sb3", "zoo") if which in sides]
    rows = []
    for env_id in args.envs:
        fps: dict[str, list[float]] = {which: [] for which in sides}
        for repeat in range(args.repeats):
            for which in sides:
                result = run_child(which, env_id, args.frames)
                fps[which].append(result["frames"] / result["seconds"])
                print(f"{env_id} {which} #{repeat + 1}: {fps[which][-1]:,.0f} fps", flush=True)
        ratios = {
            which: {peer: median(fps[which]) / median(fps[peer]) for peer in peers}
            for which in sides
            if which in OURS
        }
        rows.append({"env": env_id, "fps": fps, "ratios": ratios})
    command = (
        f"python benchmarks/ppo_speed.py --envs {' '.join(args.envs)} --frames {args.frames} "
        f"--repeats {args.repeats}"
    )
    if sides != list(SIDES):
        command += f" --sides {' '.join(sides)}"
    lines = [
        "# PPO: training fps against Stable-Baselines3 PPO, at the same and at its own settings",
        "",
        f"Command: `{command}`; {platform.processor() or platform.machine()}, runs one at a "
        "time, alternating. fps: the whole run, start-up (and compiling) included, median of "
        "the repeats. Ours: our PPO's defaults; overlapped: the same with "
        "`--overlap-collection`; compiled: with `--compile-loss`; SB3 same: SB3 PPO at our "
        "defaults' settings; SB3 zoo: SB3 PPO with rl-baselines3-zoo's tuned settings for the "
        "env (the grids' `sb3_ppo`). Ratios: each of ours over SB3's.",
        "",
        "| env | run | fps | " + " | ".join(f"/ {LABELS[peer]}" for peer in peers) + " |",
        "|---|---|---|" + "---|" * len(peers),
    ]
    for row in rows:
        for which in sides:
            cells = [
                f"{row['ratios'][which][peer]:.2f}×" if which in OURS else "" for peer in peers
            ]
            lines.append(
                f"| {row['env']} | {LABELS[which]} | {median(row['fps'][which]):,.0f} | "
                + " | ".join(cells)
                + " |"
            )
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "ppo_speed.json").write_text(json.dumps(rows, indent=1) + "\n")
    write_markdown(args.results / "ppo_speed.md", "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, which, env_id, frames = sys.argv
        result = SIDES[which](env_id, int(frames))
        print("RESULT " + json.dumps(result), flush=True)
        sys.exit(0)
    sys.exit(main())
