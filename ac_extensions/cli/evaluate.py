"""``ac-eval``: run a checkpointed policy for K episodes; optionally record one as a video.

    ac-eval runs/ppo-1 --episodes 10
    ac-eval runs/ppo-1 --episodes 1 --video ppo.gif     # GIF via Pillow; .mp4 needs ffmpeg

Prints ``mean ± std`` of the episode returns (greedy actions unless ``--sample``). The video
is taken from the first episode, from an environment that renders RGB arrays (CartPole needs
``pygame``: ``pip install 'ac-extensions[video]'``).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import inspect
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from ac_extensions.cli._config import UsageError, load_recipe, read_run
from ac_extensions.cli._errors import ArgumentParser, run_main

VIDEO_SUFFIXES = (".gif", ".mp4")


def build_parser() -> ArgumentParser:
    """The parser of ``ac-eval``."""
    parser = ArgumentParser(
        prog="ac-eval",
        description="Evaluate the newest checkpoint of an ac-train run directory.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("run", type=Path, help="the --out directory of an ac-train run")
    parser.add_argument("--episodes", type=int, default=10, help="episodes to run (K)")
    parser.add_argument("--seed", type=int, default=12345, help="environment seed")
    parser.add_argument("--sample", action="store_true", help="sample actions (default: greedy)")
    parser.add_argument("--max-steps", type=int, default=100_000, help="step cap per episode")
    parser.add_argument(
        "--video",
        type=Path,
        default=None,
        help="record the first episode to this .gif or .mp4 file",
    )
    parser.add_argument("--fps", type=int, default=30, help="video frames per second")
    return parser


def load_policy(directory: Path):
    """(algorithm, config, recipe module, policy) from the newest checkpoint in ``directory``."""
    from torchrl.objectives import LossModule

    from ac_extensions.modules import ObservationNormalizer
    from ac_extensions.runtime import Checkpointer, load_loss_state_dict
    from ac_extensions.runtime.on_policy import BatchNormalizers

    name, config = read_run(directory)
    module, _ = load_recipe(name)
    checkpointer = Checkpointer(directory / "checkpoints")
    if checkpointer.latest() is None:
        raise UsageError(f"{directory} has no checkpoint")
    state = checkpointer.load()
    config = dataclasses.replace(config, device="cpu")
    built = module.build(config)
    loss = next(part for part in built if isinstance(part, LossModule))
    load_loss_state_dict(loss, state["loss"])
    policy = built[0]
    counters = state.get("counters", {})
    normalizers = next((p for p in built if isinstance(p, BatchNormalizers)), None)
    if normalizers is not None:  # A2C / PPO: the normaliser goes in front of the actor
        normalizers.load_state_dict(counters)
        return name, config, module, normalizers.policy(policy)
    # Observation statistics (ACER's normalize_observations) are kept beside the counters.
    statistics = counters.get("observation_norm")
    if statistics is not None:
        normalizer = next(m for m in policy.modules() if isinstance(m, ObservationNormalizer))
        normalizer.load_state_dict(statistics)
    return name, config, module, policy


def make_eval_env(module, config, policy):
    """One environment built like the recipe's workers build theirs (same transforms)."""
    config = dataclasses.replace(config, envs_per_worker=1)
    if len(inspect.signature(module.make_env).parameters) > 1:
        return module.make_env(config, policy)
    return module.make_env(config)


def enable_rendering(env):
    """Switch the single gymnasium env inside ``env`` to ``rgb_array`` rendering."""
    # VectorGymEnv or GymWrapper (bare or under a TransformedEnv) around a SyncVectorEnv.
    vector = getattr(env, "base_env", env)._env
    inner = vector.envs[0]
    inner.unwrapped.render_mode = "rgb_array"
    return inner


def render(inner):
    """One RGB frame, or a :class:`UsageError` saying why the env cannot give one."""
    try:
        frame = inner.render()
    except Exception as error:  # e.g. gymnasium's DependencyNotInstalled (pygame)
        raise UsageError(f"the environment cannot render RGB arrays: {error}") from error
    if frame is None:
        raise UsageError("the environment does not render RGB arrays")
    return frame


def check_video_path(path: Path) -> None:
    """Fail before running anything when the video cannot be written."""
    if path.suffix.lower() not in VIDEO_SUFFIXES:
        raise UsageError(f"--video must end in {' or '.join(VIDEO_SUFFIXES)}, got {path.name}")
    if path.suffix.lower() == ".gif" and importlib.util.find_spec("PIL") is None:
        raise UsageError("writing a GIF needs Pillow (pip install 'ac-extensions[video]')")
    if path.suffix.lower() == ".mp4" and shutil.which("ffmpeg") is None:
        raise UsageError("writing .mp4 needs the ffmpeg program on PATH (not found); use .gif")


def write_video(frames, path: Path, fps: int) -> None:
    """Frames ``[H, W, 3]`` uint8 → GIF (Pillow) or MP4 (ffmpeg), written atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{path.suffix}")
    try:
        if path.suffix.lower() == ".gif":
            from PIL import Image

            images = [Image.fromarray(frame) for frame in frames]
            images[0].save(
                tmp, save_all=True, append_images=images[1:], duration=1000 / fps, loop=0
            )
        else:
            height, width = frames[0].shape[:2]
            command = [
                "ffmpeg", "-loglevel", "error", "-y", "-f", "rawvideo", "-pix_fmt", "rgb24",
                "-s", f"{width}x{height}", "-r", str(fps), "-i", "-",
                "-pix_fmt", "yuv420p", "-vf", "pad=ceil(iw/2)*2:ceil(ih/2)*2", str(tmp),
            ]  # fmt: skip
            data = b"".join(frame.tobytes() for frame in frames)
            subprocess.run(command, input=data, check=True)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def result_line(name: str, env_id: str, returns: list[float], *, sample: bool = False) -> str:
    """The line ``ac-eval`` prints: mean and population std of ``returns``, for people.

    Example:
        >>> result_line("ppo", "Pendulum-v1", [-1234.5, -1000.0])
        'ppo on Pendulum-v1: mean return -1,117.25 ± 117.25 (std) over 2 episodes, greedy actions'
        >>> result_line("ppo", "CartPole-v1", [500.0], sample=True).split(" over ")[1]
        '1 episode, actions sampled from the policy'
    """
    std = statistics.pstdev(returns) if len(returns) > 1 else 0.0
    episodes = f"{len(returns):,} episode" + ("" if len(returns) == 1 else "s")
    actions = "actions sampled from the policy" if sample else "greedy actions"
    return (
        f"{name} on {env_id}: mean return {statistics.fmean(returns):,.2f} ± {std:,.2f} (std) "
        f"over {episodes}, {actions}"
    )


def evaluate_command(argv: list[str]) -> int:
    """Parse, run the episodes, print mean and std; return the exit status."""
    args = build_parser().parse_args(argv)
    if args.episodes <= 0:
        raise UsageError(f"--episodes must be > 0, got {args.episodes}")
    if args.video is not None:
        check_video_path(args.video)
    import torch
    from torchrl.envs import ExplorationType, set_exploration_type

    from ac_extensions.runtime import finished_returns

    name, config, module, policy = load_policy(args.run)
    env = make_eval_env(module, config, policy)
    env.set_seed(args.seed)
    inner = enable_rendering(env) if args.video is not None else None
    frames: list = []

    def record(_env, _td) -> None:
        if inner is not None and len(returns) == 0:
            frames.append(render(inner))

    mode = ExplorationType.RANDOM if args.sample else ExplorationType.DETERMINISTIC
    returns: list[float] = []
    with set_exploration_type(mode), torch.no_grad():
        while len(returns) < args.episodes:
            rollout = env.rollout(args.max_steps, policy, break_when_any_done=True, callback=record)
            finished = finished_returns(rollout)
            returns.extend(finished or [float(rollout["next", "episode_reward"][..., -1, :].sum())])
    env.close()
    print(result_line(name, config.env_id, returns[: args.episodes], sample=args.sample))
    if args.video is not None:
        write_video(frames, args.video, args.fps)
        print(f"wrote {args.video} ({len(frames):,} frames)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``ac-eval``."""
    return run_main("ac-eval", evaluate_command, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
