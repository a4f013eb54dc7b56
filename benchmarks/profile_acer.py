"""Where ACER's training time goes on CartPole-v1: cProfile of short runs of the recipe.

Runs ``ac_extensions.recipes.acer.train`` (default ``ACERConfig`` on CartPole-v1, one learner
thread) for ``--frames`` frames, twice per path of :class:`~ac_extensions.objectives.ACERLoss`
(its fast path on plain tensors, the default, and the general path through the TensorDict
wrappers, ``fast_path=False``, i.e. before the fast path existed): once unprofiled for the
wall time per update, once under ``cProfile`` for the per-update split (loss forward, backward,
replay sampling, waiting for the collector; cProfile's own overhead inflates Python-heavy code,
so compare the phases, not their sum with the unprofiled time). Writes both tables and the
fast path's top functions to ``benchmarks/results/acer_profile.md``.

    python benchmarks/profile_acer.py --frames 8000
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write_markdown

import ac_extensions.recipes.acer as recipe
from ac_extensions.objectives import ACERLoss
from ac_extensions.recipes.acer import ACERConfig, train

RESULTS = Path(__file__).resolve().parent / "results"
PHASES = {
    "update (loss forward + backward + step)": ("recipes/acer.py", "update"),
    "loss forward": ("objectives/acer.py", "forward"),
    "backward": ("~", "run_backward"),
    "replay sample": ("replay_buffers/base.py", "sample"),
    "waiting for the collector (poll)": ("~", "'poll'"),
}
"""Phase → (file suffix, or ``~`` for built-ins; function name, or a part of a built-in's)."""


def cumulative(stats: pstats.Stats, where: tuple[str, str]) -> tuple[int, float]:
    """(calls, cumulative seconds) of the profiled function ``where`` names (0, 0.0 if none)."""
    suffix, name = where
    for (file, _, func), (_, calls, _, cum, _) in stats.stats.items():
        builtin = suffix == "~" and file == "~" and name in func
        if builtin or (suffix != "~" and file.endswith(suffix) and func == name):
            return calls, cum
    return 0, 0.0


class GeneralPathACERLoss(ACERLoss):
    """``ACERLoss`` with the fast path off: the recipe as it ran before the fast path."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, fast_path=False, **kwargs)


def run(frames: int, fast: bool, profile: cProfile.Profile | None) -> tuple[int, float]:
    """One recipe run; returns (updates, seconds)."""
    recipe.ACERLoss = ACERLoss if fast else GeneralPathACERLoss
    try:
        config = ACERConfig(frames=frames, seed=1, torch_threads=1)
        updates, start = 0, time.perf_counter()
        if profile is not None:
            profile.enable()
        for metrics in train(config):
            updates += 1 + int(metrics["train/replay_updates"])
        if profile is not None:
            profile.disable()
        return updates, time.perf_counter() - start
    finally:
        recipe.ACERLoss = ACERLoss


def main() -> None:
    """Profile both paths and write the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=8_000)
    parser.add_argument("--out", type=Path, default=RESULTS / "acer_profile.md")
    args = parser.parse_args()
    wall = ["| path | updates | seconds | ms per update | fps |", "|---|---|---|---|---|"]
    phases = {}
    profiles = {}
    for name, fast in (("general (before)", False), ("fast (after)", True)):
        updates, seconds = run(args.frames, fast, None)
        wall.append(
            f"| {name} | {updates:,} | {seconds:.1f} | {1e3 * seconds / updates:.1f} | "
            f"{args.frames / seconds:,.0f} |"
        )
        profile = cProfile.Profile()
        updates, _ = run(args.frames, fast, profile)
        stats = pstats.Stats(profile)
        phases[name] = {
            label: (*cumulative(stats, needle), updates) for label, needle in PHASES.items()
        }
        profiles[name] = profile
    names = list(phases)
    rows = [
        "| phase | " + " | ".join(f"{n}: ms per update" for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for label in PHASES:
        cells = [f"{1e3 * phases[n][label][1] / phases[n][label][2]:.1f}" for n in names]
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    tops = []
    for key in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(profiles["fast (after)"], stream=out).sort_stats(key).print_stats(20)
        text = out.getvalue()
        tops.append(
            f"Fast path, top 20 by {key}:\n\n```\n{text[text.index('ncalls') :].rstrip()}\n```"
        )
    text = (
        "# Where ACER's training time goes (CartPole-v1)\n\n"
        f"Command: `python benchmarks/profile_acer.py --frames {args.frames}` (default "
        "`ACERConfig`, one learner thread, seed 1; each path run unprofiled, then under "
        "cProfile).\n\nWall time, unprofiled:\n\n" + "\n".join(wall) + "\n\n"
        "Per-update split under cProfile:\n\n" + "\n".join(rows) + "\n\n" + "\n\n".join(tops) + "\n"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_markdown(args.out, text)
    print(text[:3000])


if __name__ == "__main__":
    main()
