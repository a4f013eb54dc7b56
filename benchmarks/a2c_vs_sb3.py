"""A2C on CartPole-v1: ac_extensions vs Stable-Baselines3's zoo A2C, seed by seed in one run.

For each seed, runs Stable-Baselines3 A2C with rl-baselines3-zoo's CartPole-v1 settings
(8 envs, SB3's A2C defaults: n_steps 5, RMSprop 7e-4, γ 0.99, λ 1, no entropy bonus; see
:func:`_threshold.run_sb3_a2c`) and our A2C recipe in the variants of :data:`OURS`, each in a
fresh subprocess, one after the other. Every run stops when the mean of its last 20 finished
episode returns first reaches 475 (or at ``--frames``, the zoo's 500k budget). Reports, per
run: frames until 475, wall seconds until then (model and collector construction included on
both sides) and frames per second; then medians and ratios against SB3.

    # needs `pip install stable-baselines3` (the `bench` extra)
    python benchmarks/a2c_vs_sb3.py --seeds 1 2 3 4 5 6 7 8 9 10

Writes ``benchmarks/results/a2c_cartpole.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _threshold import run_sb3_a2c, run_seeds, run_until_threshold, write_table

RESULTS = Path(__file__).resolve().parent / "results"

OURS = {
    # The default config: SB3's batch exactly, 1 worker × 8 envs × 5 steps = 40 frames per update.
    "ours (defaults: SB3's batch, 1 worker, 8 envs, 5 steps)": {},
    # 2 workers × 8 envs × 8 steps = 128 frames per update.
    "ours (2 workers, 8 envs, 8 steps)": dict(workers=2, rollout_length=8),
}
"""Our variants: ``A2CConfig`` overrides."""
SB3_NAME = "sb3 (zoo)"


def run_ours(seed: int, frames: int, overrides: dict) -> dict:
    """Our A2C recipe with ``overrides``, stopped at 475."""
    from ac_extensions.recipes import A2CConfig
    from ac_extensions.recipes.a2c import train

    return run_until_threshold(lambda: train(A2CConfig(frames=frames, seed=seed, **overrides)))


def child(argv: list[str]) -> None:
    """Run one (variant, seed) and print its ``RESULT`` line."""
    which, seed, frames = argv[0], int(argv[1]), int(argv[2])
    if which == SB3_NAME:
        result = run_sb3_a2c(seed, frames)
    else:
        result = run_ours(seed, frames, OURS[which])
    print("RESULT " + json.dumps(result), flush=True)


def main() -> None:
    """Every seed of every variant, then the median table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--frames", type=int, default=500_000)
    parser.add_argument("--out", type=Path, default=RESULTS / "a2c_cartpole.md")
    args = parser.parse_args()
    runs = run_seeds(__file__, [SB3_NAME, *OURS], args.seeds, args.frames, timeout=1800)
    header = (
        f"# A2C on CartPole-v1 vs Stable-Baselines3's zoo A2C\n\nCommand: `python benchmarks/"
        f"a2c_vs_sb3.py --seeds {' '.join(map(str, args.seeds))}` (each run a fresh process, "
        f"stopped when the mean of the last 20 returns first reaches 475 or at "
        f"{args.frames:,} frames; runs one after the other on the same machine; wall time "
        f"includes model/collector construction).\n\n"
    )
    write_table(runs, SB3_NAME, args.out, header)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
    else:
        main()
