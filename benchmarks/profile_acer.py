"""Where ACER's training time goes on CartPole-v1: cProfile of one short run of the recipe.

Runs ``ac_extensions.recipes.acer.train`` (default ``ACERConfig`` on CartPole-v1, one learner
thread) for ``--frames`` frames under ``cProfile`` and writes the top functions by own time
and by cumulative time, with the per-update split (loss forward, backward, replay sampling,
waiting for the collector), to ``benchmarks/results/acer_profile.md``.

    python benchmarks/profile_acer.py --frames 8000
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write_markdown

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


def main() -> None:
    """Profile one run and write the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=8_000)
    parser.add_argument("--out", type=Path, default=RESULTS / "acer_profile.md")
    args = parser.parse_args()
    config = ACERConfig(frames=args.frames, seed=1, torch_threads=1)
    profile = cProfile.Profile()
    profile.enable()
    updates = 0
    for metrics in train(config):
        updates += 1 + int(metrics["train/replay_updates"])
    profile.disable()
    stats = pstats.Stats(profile)
    total = stats.total_tt
    rows = ["| phase | calls | seconds | ms per update |", "|---|---|---|---|"]
    for label, needle in PHASES.items():
        calls, seconds = cumulative(stats, needle)
        rows.append(f"| {label} | {calls:,} | {seconds:.2f} | {1e3 * seconds / updates:.1f} |")
    tops = []
    for key in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats(key).print_stats(20)
        text = out.getvalue()
        tops.append(f"Top 20 by {key}:\n\n```\n{text[text.index('ncalls') :].rstrip()}\n```")
    text = (
        "# Where ACER's training time goes (CartPole-v1)\n\n"
        f"Command: `python benchmarks/profile_acer.py --frames {args.frames}` (default "
        f"`ACERConfig`, one learner thread, seed 1): {total:.1f} s profiled, {updates:,} "
        "updates (on-policy + replayed).\n\n" + "\n".join(rows) + "\n\n" + "\n\n".join(tops) + "\n"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_markdown(args.out, text)
    print(text[:3000])


if __name__ == "__main__":
    main()
