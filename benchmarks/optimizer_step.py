"""The optimiser step of ACER's and Reactor's recipes: per-tensor, foreach and fused Adam.

Each recipe's parameters (its default network for ``--env``) get random gradients; one step
is ``clip_grad_norm_`` followed by ``Adam.step``, as in the recipes' learner steps. The three
variants run interleaved (``--repeats`` rounds of ``--steps`` steps each, one torch thread),
timed in process CPU time, so other jobs on the machine distort them less than wall time:

- ``per-tensor``: ``torch.optim.Adam(..., foreach=False)`` and ``clip_grad_norm_(...,
  foreach=False)``: what torch picks by default for CPU tensors, and the recipes' optimiser
  before.
- ``foreach``: both with ``foreach=True`` (multi-tensor kernels).
- ``fused``: ``Adam(fused=True)`` (one kernel for the update) and a foreach clip: the recipes'
  optimiser now.

    python benchmarks/optimizer_step.py

Writes ``benchmarks/results/optimizer_step.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write_markdown

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS = {
    "per-tensor": (dict(foreach=False), False),
    "foreach": (dict(foreach=True), True),
    "fused": (dict(fused=True), True),
}
"""name → (Adam keywords, clip_grad_norm_'s foreach)."""


def parameters(recipe: str, env: str) -> list[torch.nn.Parameter]:
    """The parameters the recipe's optimiser steps, for its default config on ``env``."""
    if recipe == "reactor":
        from ac_extensions.recipes.reactor import ReactorConfig, build

        _, _, optimizer, _ = build(ReactorConfig.for_env(env, seed=1))
    else:
        from ac_extensions.recipes.acer import ACERConfig, build

        _, _, optimizer, _, _ = build(ACERConfig.for_env(env, seed=1))
    return [p for group in optimizer.param_groups for p in group["params"]]


def time_steps(params, variant: str, steps: int) -> float:
    """CPU milliseconds per clip-and-step of ``variant`` (a fresh optimiser, warmed up)."""
    adam, foreach_clip = VARIANTS[variant]
    optimizer = torch.optim.Adam(params, lr=1e-4, **adam)
    optimizer.step()
    start = time.process_time()
    for _ in range(steps):
        torch.nn.utils.clip_grad_norm_(params, 10.0, foreach=foreach_clip)
        optimizer.step()
    return 1e3 * (time.process_time() - start) / steps


def measure(recipe: str, env: str, steps: int, repeats: int) -> dict:
    """Median ms per step of each variant over interleaved repeats."""
    params = parameters(recipe, env)
    generator = torch.Generator().manual_seed(0)
    for p in params:
        p.grad = torch.randn(p.shape, generator=generator)
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(repeats):
        for variant in VARIANTS:
            times[variant].append(time_steps(params, variant, steps))
    return {
        "recipe": recipe,
        "env": env,
        "tensors": len(params),
        "numel": sum(p.numel() for p in params),
        "ms": {v: statistics.median(t) for v, t in times.items()},
        "repeats": times,
    }


def markdown(rows: list[dict], command: str) -> str:
    lines = [
        "# Optimiser step: per-tensor, foreach and fused Adam",
        "",
        f"Command: `{command}` (one torch thread; process CPU ms per `clip_grad_norm_` + "
        "`Adam.step` on the recipe's own parameters with random gradients; variants "
        "interleaved, median over repeats; ratio: per-tensor over the variant).",
        "",
        "| recipe | env | tensors | parameters | per-tensor ms | foreach ms | fused ms | "
        "fused speed-up |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ms = r["ms"]
        lines.append(
            f"| {r['recipe']} | {r['env']} | {r['tensors']} | {r['numel']:,} | "
            f"{ms['per-tensor']:.3f} | {ms['foreach']:.3f} | {ms['fused']:.3f} | "
            f"{ms['per-tensor'] / ms['fused']:.2f}× |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=["CartPole-v1", "MinAtar/Breakout-v1"])
    parser.add_argument("--recipes", nargs="+", default=["acer", "reactor"])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=RESULTS / "optimizer_step.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = [
        measure(recipe, env, args.steps, args.repeats)
        for recipe in args.recipes
        for env in args.envs
    ]
    command = "python benchmarks/optimizer_step.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    write_markdown(args.out, markdown(rows, command.strip()))
    args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    print(markdown(rows, command.strip()))


if __name__ == "__main__":
    main()
