"""Wall-clock to 475 on CartPole-v1: ACER and Reactor against PPO, in one run.

The question: do ACER and Reactor reach a 20-episode mean of 475 in no more wall-clock than our
PPO (median of 3 seeds, measured side by side)? For each seed, every variant of
:data:`VARIANTS` runs in a fresh subprocess, one after the other (so machine load hits them
alike), and stops when the mean of its last 20 finished returns first reaches 475 or at its
budget. Reported per variant: seeds reaching 475, median frames and wall seconds to 475
(model and collector construction included), fps up to then, and the ratios to PPO.

Variants change only how the off-policy learners spend their time, not their losses:
learner threads (one thread avoids oversubscribing 2 cores shared with the collector
workers) and the replay schedule (fewer, larger replay updates for ACER; fewer learner steps
per frame for Reactor).

    python benchmarks/offpolicy_wallclock.py --seeds 1 2 3
    python benchmarks/offpolicy_wallclock.py --seeds 1 --variants ppo "acer (1 thread)"
    python benchmarks/offpolicy_wallclock.py --jobs 5 --out /tmp/screen.md \
        --variants ppo "acer:torch_threads=1,share_torso=True,replay_ratio=1.0,batch_size=128"

An ad-hoc ``"<recipe>:key=value,..."`` variant screens a setting without naming it here;
``--jobs`` runs several at once (for frames to 475; their seconds then share the cores).

Writes ``benchmarks/results/offpolicy_wallclock.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _grid_cli import parse_settings
from _threshold import run_seeds, run_until_threshold, write_table

RESULTS = Path(__file__).resolve().parent / "results"

VARIANTS: dict[str, tuple[str, dict]] = {
    "ppo": ("ppo", {"frames": 100_352}),
    "ppo (1 thread)": ("ppo", {"frames": 100_352, "torch_threads": 1}),
    "acer": ("acer", {"frames": 60_000}),
    "acer (1 thread)": ("acer", {"frames": 60_000, "torch_threads": 1}),
    "acer (1 thread, replay 4 × 128)": (
        "acer",
        {"frames": 60_000, "torch_threads": 1, "replay_ratio": 4.0, "batch_size": 128},
    ),
    "acer (1 thread, replay 8 × 64)": (
        "acer",
        {"frames": 60_000, "torch_threads": 1, "replay_ratio": 8.0, "batch_size": 64},
    ),
    "acer (1 thread, replay 2 × 128)": (
        "acer",
        {"frames": 60_000, "torch_threads": 1, "replay_ratio": 2.0, "batch_size": 128},
    ),
    "acer (1 thread, 8 envs, replay 2 × 128)": (
        "acer",
        {
            "frames": 60_000,
            "torch_threads": 1,
            "envs_per_worker": 8,
            "replay_ratio": 2.0,
            "batch_size": 128,
        },
    ),
    "acer (1 thread, 8 envs, replay 4 × 128)": (
        "acer",
        {
            "frames": 60_000,
            "torch_threads": 1,
            "envs_per_worker": 8,
            "replay_ratio": 4.0,
            "batch_size": 128,
        },
    ),
    "acer (1 thread, 8 envs, replay 2 × 256)": (
        "acer",
        {
            "frames": 60_000,
            "torch_threads": 1,
            "envs_per_worker": 8,
            "replay_ratio": 2.0,
            "batch_size": 256,
        },
    ),
    "acer (1 thread, shared torso)": (
        "acer",
        {"frames": 60_000, "torch_threads": 1, "share_torso": True},
    ),
    "acer (1 thread, shared torso, 8 envs, replay 2 × 128)": (
        "acer",
        {
            "frames": 60_000,
            "torch_threads": 1,
            "share_torso": True,
            "envs_per_worker": 8,
            "replay_ratio": 2.0,
            "batch_size": 128,
        },
    ),
    "acer (1 thread, shared torso, 8 envs, replay 4 × 64)": (
        "acer",
        {
            "frames": 60_000,
            "torch_threads": 1,
            "share_torso": True,
            "envs_per_worker": 8,
            "replay_ratio": 4.0,
            "batch_size": 64,
        },
    ),
    "acer (async, 1 worker × 8 envs, 1 thread)": (
        "acer",
        {
            "frames": 60_000,
            "torch_threads": 1,
            "async_collection": True,
            "workers": 1,
            "envs_per_worker": 8,
        },
    ),
    "reactor": ("reactor", {"frames": 60_000}),
    "reactor (8 frames per step, B 32)": (
        "reactor",
        {"frames": 60_000, "acting_steps_per_learning_step": 8.0, "batch_size": 32},
    ),
    "reactor (16 frames per step, B 64)": (
        "reactor",
        {"frames": 60_000, "acting_steps_per_learning_step": 16.0, "batch_size": 64},
    ),
    "reactor (32 frames per step, B 64)": (
        "reactor",
        {"frames": 60_000, "acting_steps_per_learning_step": 32.0, "batch_size": 64},
    ),
    # The same 64 replayed transitions per frame as the default, in 8 times fewer steps, with
    # the target copied every 384 frames as the default's 100 steps of 4 frames do.
    "reactor (32 frames per step, B 128, target every 12 steps)": (
        "reactor",
        {
            "frames": 60_000,
            "acting_steps_per_learning_step": 32.0,
            "batch_size": 128,
            "target_update_period": 12,
        },
    ),
}
"""Name → (recipe, config overrides). Defaults otherwise (``PPOConfig``, ``ACERConfig``,
``ReactorConfig``: their CartPole-v1 settings)."""


def parse_variant(name: str) -> tuple[str, dict]:
    """``(recipe, config overrides)`` of a :data:`VARIANTS` name or of an ad-hoc spec.

    A spec is ``"<recipe>:key=value,key=value"`` with values as Python literals, on top of a
    60,000-frame budget, e.g. ``"acer:torch_threads=1,share_torso=True,replay_ratio=2.0"``.
    """
    if name in VARIANTS:
        return VARIANTS[name]
    recipe, _, spec = name.partition(":")
    if recipe not in ("ppo", "acer", "reactor") or not spec:
        raise ValueError(
            f"unknown variant {name!r}: expected one of {sorted(VARIANTS)} or "
            "'<ppo|acer|reactor>:key=value,...'"
        )
    return recipe, {"frames": 60_000} | parse_settings(spec.split(","), f"variant {name!r}")


def run_variant(name: str, seed: int) -> dict:
    """One run of ``name`` with ``seed``, stopped at 475."""
    recipe, overrides = parse_variant(name)
    if recipe == "ppo":
        from ac_extensions.recipes.ppo import PPOConfig as Config
        from ac_extensions.recipes.ppo import train
    elif recipe == "acer":
        from ac_extensions.recipes.acer import ACERConfig as Config
        from ac_extensions.recipes.acer import train
    else:
        from ac_extensions.recipes.reactor import ReactorConfig as Config
        from ac_extensions.recipes.reactor import train
    return run_until_threshold(lambda: train(Config(seed=seed, **overrides)))


def child(argv: list[str]) -> None:
    """Run one (variant, seed) and print its ``RESULT`` line."""
    print("RESULT " + json.dumps(run_variant(argv[0], int(argv[1]))), flush=True)


def main() -> None:
    """Every seed of every chosen variant, then the median table against PPO."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument(
        "--variants",
        nargs="+",
        default=list(VARIANTS),
        help=f"names of {sorted(VARIANTS)} or '<recipe>:key=value,...' specs (parse_variant)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "offpolicy_wallclock.md")
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs at once: > 1 screens frames to 475 faster, but seconds then share the cores",
    )
    args = parser.parse_args()
    for name in args.variants:
        try:
            parse_variant(name)
        except ValueError as error:
            parser.error(str(error))
    names = ["ppo", *(v for v in args.variants if v != "ppo")]
    runs = run_seeds(__file__, names, args.seeds, 0, jobs=args.jobs)  # budgets: parse_variant
    chosen = ""
    if args.variants != list(VARIANTS):
        chosen = " --variants " + " ".join(f'"{v}"' if " " in v else v for v in args.variants)
    header = (
        "# Wall-clock to 475 on CartPole-v1: ACER and Reactor against PPO\n\n"
        f"Command: `python benchmarks/offpolicy_wallclock.py --seeds "
        f"{' '.join(map(str, args.seeds))}{chosen}"
        + (f" --jobs {args.jobs}" if args.jobs > 1 else "")
        + (f" --out {args.out}" if args.out != parser.get_default("out") else "")
        + "` (each run a fresh process, stopped "
        "when the mean of the last 20 returns first reaches 475 or at its budget: PPO "
        "100,352 frames, ACER and Reactor 60,000; "
        + (
            f"runs one after the other, seed by seed, on the same {os.cpu_count()}-core machine; "
            if args.jobs == 1
            else f"{args.jobs} runs at a time, seed by seed, on a {os.cpu_count()}-core machine "
            "(seconds and fps share its cores); "
        )
        + "wall time includes model/collector construction; fps up to "
        "475).\n\n"
    )
    write_table(runs, "ppo", args.out, header, seconds_ratio=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
    else:
        main()
