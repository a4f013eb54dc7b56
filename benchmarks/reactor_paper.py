"""Reactor as the paper wrote it against this library's departures from it, same seeds.

Variants of the Reactor recipe (``ac_extensions.recipes.reactor``), each a fresh process:

- ``paper``: the defaults, which follow Gruslys et al., 2018 (arXiv:1704.04651v2): priority
  = mean total variation along the sequence, importance exponent β = 1, policy gradient
  blocked from the shared torso, uniform-mixed softmax (ε = 0.01), dueling distributional
  head (and, for recurrent networks, bootstrap states unrolled over the window).
- ``previous``: ``ReactorConfig.PREVIOUS``, every departure at once (R2D2's priority, β 0.4,
  plain softmax, one-stream Q head, policy gradient into the torso, stored bootstrap states).
- one variant per departure, on top of ``paper``: ``r2d2_priority`` (η 0.9 of the
  difference of the means), ``beta_0.4``, ``no_epsilon``, ``single_stream``,
  ``torso_gradient``.

Per environment: CartPole-v1 (frames and seconds until the mean of the last 20 returns
reaches 475; a run stops there or at ``--frames``) and MinAtar games (the mean return of the
last 100 episodes at ``--frames``; MinAtar defaults of ``ReactorConfig.for_env``). Resumable:
every finished run writes ``benchmarks/results/reactor_paper/<env>/<variant>/seed<N>.json`` and
is skipped on the next call; ``--jobs 2`` runs two at once. The table is rebuilt from the
files present:

    python benchmarks/reactor_paper.py --env CartPole-v1 --seeds 1 2 3 --frames 60000
    python benchmarks/reactor_paper.py --env MinAtar/Breakout-v1 --frames 50000

Writes ``benchmarks/results/reactor_paper.{md,json}`` (every environment found on disk).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write_markdown
from _threshold import run_until_threshold

RESULTS = Path(__file__).resolve().parent / "results"
RUNS = RESULTS / "reactor_paper"
VARIANTS = {
    "paper": {},  # ReactorConfig.PAPER (also under every variant but previous)
    "previous": None,  # ReactorConfig.PREVIOUS
    "r2d2_priority": {"priority_eta": 0.9, "priority_metric": "td"},
    "beta_0.4": {"importance_exponent": 0.4},
    "no_epsilon": {"policy_epsilon": 0.0},
    "single_stream": {"dueling": False},
    "torso_gradient": {"policy_torso_gradient": True},
}


def overrides(variant: str) -> dict:
    """The ``ReactorConfig`` fields a variant sets on top of the family's defaults.

    The paper's settings (``ReactorConfig.PAPER``, which MinAtar's defaults depart from) and
    the variant's one departure, or ``ReactorConfig.PREVIOUS``.
    """
    from ac_extensions.recipes.reactor import ReactorConfig

    extra = VARIANTS[variant]
    return dict(ReactorConfig.PREVIOUS) if extra is None else {**ReactorConfig.PAPER, **extra}


def run_minatar(train) -> dict:
    """Run to the budget; the mean return of the last 100 finished episodes at the end."""
    start, returns, last = time.perf_counter(), [], {}
    for metrics in train():
        last = metrics
        count = int(metrics.get("train/episodes", 0))
        if count:
            returns += [metrics["train/episode_return"]] * count  # the batch's mean, per episode
    wall = time.perf_counter() - start
    tail = returns[-100:]
    return {
        "final_return": sum(tail) / len(tail) if tail else None,
        "episodes": len(returns),
        "frames": last["time/frames"],
        "seconds": wall,
        "fps": last["time/frames"] / wall,
    }


def child(env_id: str, variant: str, seed: int, frames: int) -> None:
    from ac_extensions.recipes.reactor import ReactorConfig, train

    config = ReactorConfig.for_env(env_id, frames=frames, seed=seed, **overrides(variant))
    if env_id == "CartPole-v1":
        result = run_until_threshold(lambda: train(config))
    else:
        result = run_minatar(lambda: train(config))
    print("RESULT " + json.dumps(result), flush=True)


def result_path(env_id: str, variant: str, seed: int) -> Path:
    return RUNS / env_id.replace("/", "_") / variant / f"seed{seed}.json"


def run_one(env_id: str, variant: str, seed: int, frames: int, timeout: int) -> None:
    """One run in a fresh process; its result file is written only when it finished."""
    path = result_path(env_id, variant, seed)
    if path.is_file():
        return
    out = subprocess.run(
        [sys.executable, __file__, "--child", env_id, variant, str(seed), str(frames)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    if not line:
        print(f"{env_id} {variant} seed {seed} FAILED:\n{out.stderr[-2000:]}", flush=True)
        return
    result = json.loads(line[-1][7:]) | {"seed": seed, "budget": frames}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(path)
    print(f"{env_id} {variant} seed {seed}: {result}", flush=True)


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _fmt(x, spec):
    return "—" if x is None else format(x, spec)


def summarize() -> dict:
    """Rebuild ``reactor_paper.{md,json}`` from every result file on disk."""
    summary, sections = {}, []
    for env_dir in sorted(p for p in RUNS.glob("*") if p.is_dir()):
        env_id = (
            env_dir.name.replace("_", "/", 1)
            if env_dir.name.startswith("MinAtar")
            else (env_dir.name)
        )
        cartpole = env_id == "CartPole-v1"
        rows, env_summary = [], {}
        for variant in VARIANTS:
            files = sorted((env_dir / variant).glob("seed*.json"))
            if not files:
                continue
            runs = [json.loads(f.read_text()) for f in files]
            seeds = [r["seed"] for r in runs]
            if cartpole:
                reached = [r["frames_to_475"] for r in runs]
                med = {
                    "frames_to_475": _median(reached),
                    "seconds_to_475": _median(r["seconds_to_475"] for r in runs),
                    "reached": sum(x is not None for x in reached),
                }
                per_seed = ", ".join(_fmt(x, ",.0f") for x in reached)
                rows.append(
                    f"| {variant} | {med['reached']}/{len(runs)} | "
                    f"{_fmt(med['frames_to_475'], ',.0f')} | {per_seed} | "
                    f"{_fmt(med['seconds_to_475'], '.0f')} | "
                    f"{_fmt(_median(r['fps'] for r in runs), ',.0f')} |"
                )
            else:
                finals = [r["final_return"] for r in runs]
                med = {"final_return": _median(finals), "budget": runs[0]["budget"]}
                rows.append(
                    f"| {variant} | {len(runs)} | {_fmt(med['final_return'], '.2f')} | "
                    f"{_fmt(min(finals), '.2f')} – {_fmt(max(finals), '.2f')} | "
                    f"{', '.join(_fmt(x, '.2f') for x in finals)} | "
                    f"{_fmt(_median(r['fps'] for r in runs), ',.0f')} |"
                )
            env_summary[variant] = med | {"seeds": seeds, "runs": runs}
        if cartpole:
            head = (
                "| variant | seeds reaching 475 | frames to 475 (median) | per seed | "
                "s to 475 (median) | fps (median) |\n|---|---|---|---|---|---|"
            )
        else:
            budget = next(iter(env_summary.values()))["budget"] if env_summary else 0
            head = (
                f"| variant | seeds | mean return, last 100 episodes at {budget:,} frames "
                "(median) | range | per seed | fps (median) |\n|---|---|---|---|---|---|"
            )
        sections.append(f"## {env_id}\n\n{head}\n" + "\n".join(rows))
        summary[env_id] = env_summary
    text = (
        "# Reactor: the paper's settings against this library's departures from them\n\n"
        "Command: `python benchmarks/reactor_paper.py --env <id> --seeds 1 2 3 --frames <N> "
        "--jobs 2` (one result file per run under `benchmarks/results/reactor_paper/`; "
        "2 runs at a time on the shared 2-core machine, so seconds and fps compare only "
        "roughly). `paper` = `ReactorConfig.PAPER` on every environment (the recipe's "
        "defaults, except that MinAtar's default lets the policy gradient into the torso); "
        "`previous` = `ReactorConfig.PREVIOUS` (every departure at once); the others change "
        "one setting of `paper`.\n\n" + "\n\n".join(sections) + "\n"
    )
    out = RESULTS / "reactor_paper.md"
    write_markdown(out, text)
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--frames", type=int, default=60_000, help="budget of every run")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--jobs", type=int, default=2, help="runs at once")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per run")
    parser.add_argument("--summary-only", action="store_true", help="only rebuild the table")
    args = parser.parse_args()
    if not args.summary_only:
        todo = [(v, s) for v in args.variants for s in args.seeds]
        left = [job for job in todo if not result_path(args.env, *job).is_file()]
        print(f"{len(todo) - len(left)} of {len(todo)} runs already done", flush=True)
        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(lambda job: run_one(args.env, *job, args.frames, args.timeout), left))
    summarize()
    print(f"wrote {RESULTS / 'reactor_paper.md'}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        env, variant, seed, frames = sys.argv[2:6]
        child(env, variant, int(seed), int(frames))
    else:
        main()
