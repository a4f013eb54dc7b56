"""Where one Reactor learner step spends its time: milliseconds per phase, and the top ops.

Fills a replay with CartPole-v1 (or MinAtar) data collected by the recipe's own actor, then
times ``--steps`` learner steps of ``ac_extensions.recipes.reactor.learner_step``'s phases one
by one (process CPU time, so other jobs on the shared machine distort it less than wall time):
sampling the prioritized sequences, the loss forward, backward, the clipped Adam step, and
writing priorities back plus the target-network step. Then ``torch.profiler`` over the same
steps for the heaviest ops and cProfile for the heaviest Python functions.

    python benchmarks/profile_learner.py --label after
    PYTHONPATH=/path/to/older/checkout python benchmarks/profile_learner.py --label before
    python benchmarks/profile_learner.py --label compile --compile static  # torch.compile
    python benchmarks/profile_learner.py --label compile_loss --compile loss  # the whole loss
    python benchmarks/profile_learner.py --label cuda --env MinAtar/Breakout-v1 --device cuda
    python benchmarks/profile_learner.py --label graphs --device cuda --compile reduce-overhead
    python benchmarks/profile_learner.py --label b8 --env MinAtar/Breakout-v1 --set batch_size=8
    python benchmarks/profile_learner.py --label bf16 --env MinAtar/Breakout-v1 --autocast bfloat16

On CUDA the phases are wall milliseconds with the device synchronised at each phase's end (a
kernel's time is not on the process's CPU clock); ``reduce-overhead`` is ``torch.compile``'s
CUDA-graph mode. The replay stays on the CPU, as in the recipe, and each sample is moved to
the device inside "sample".

Each label writes ``benchmarks/results/reactor_learner_profile/<label>.json``; the markdown
``benchmarks/results/reactor_learner_profile.md`` shows every label found, side by side.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import dataclasses
import io
import json
import pstats
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _grid_cli import parse_settings
from _results import write_markdown

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
OUT = RESULTS / "reactor_learner_profile"
PHASES = ("sample", "loss forward", "backward", "optimizer step", "priorities + target")


def fill(config, loss, replay, frames: int) -> None:
    from torchrl.collectors import Collector

    from ac_extensions.recipes.reactor import make_env
    from ac_extensions.runtime import store_sequences

    keys = list(dict.fromkeys(loss.in_keys))
    actor = loss.actor_network
    collector = Collector(
        make_env(config, actor), actor, frames_per_batch=config.frames_per_batch, total_frames=-1
    )
    sequences = 0
    for batch in collector:
        batch = batch.reshape(-1, batch.shape[-1])
        sequences += len(store_sequences(replay, batch, keys, sequences, config.reward_scale))
        if len(replay) >= frames:
            break
    collector.shutdown()


def compile_networks(loss, mode: str) -> int:
    """``torch.compile`` every plain network module inside the loss's TensorDict wrappers.

    Compiles in place (``nn.Module.compile``), so the wrappers run the compiled module.
    Returns how many modules were compiled.
    """
    from tensordict.nn import TensorDictModule, TensorDictModuleBase

    networks = [loss.actor_network, getattr(loss, "critic_network", None)]
    seen, count = set(), 0
    for network in filter(None, networks):  # TorchRL keeps them outside loss.modules()
        for wrapper in network.modules():
            if (
                type(wrapper) is TensorDictModule
                and not isinstance(wrapper.module, TensorDictModuleBase)
                and id(wrapper.module) not in seen
            ):
                seen.add(id(wrapper.module))
                if mode == "reduce-overhead":
                    wrapper.module.compile(mode=mode)
                else:
                    wrapper.module.compile(dynamic=mode == "dynamic")
                count += 1
    return count


def graph_breaks() -> int:
    """Graph breaks torch.compile has met in this process so far."""
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values())


def timed_step(loss, optimizer, target, replay, config, autocast=None) -> dict[str, float]:
    """One learner step (as ``learner_step``), seconds per phase.

    Process CPU seconds on the CPU; on CUDA wall seconds, the device synchronised before each
    reading. ``autocast`` (a dtype) runs the loss forward under ``torch.autocast``.
    """
    from torchrl.modules import set_recurrent_mode

    if config.device.startswith("cuda"):

        def clock() -> float:
            torch.cuda.synchronize()
            return time.perf_counter()

    else:
        clock = time.process_time
    t0 = clock()
    sample = replay.sample().reshape(-1, config.sequence_length).to(config.device)
    t1 = clock()
    mixed = (
        torch.autocast(config.device.split(":")[0], dtype=autocast)
        if autocast is not None
        else contextlib.nullcontext()
    )
    with set_recurrent_mode(config.recurrent), mixed:
        out = loss(sample)
    total = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
    t2 = clock()
    optimizer.zero_grad(set_to_none=True)
    total.backward()
    t3 = clock()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
    optimizer.step()
    t4 = clock()
    replay.update_tensordict_priority(sample.select("index", "td_error"))
    target.step()
    t5 = clock()
    return dict(zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4), strict=True))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", help="name of this measurement (required unless --summary-only)")
    parser.add_argument(
        "--summary-only",
        action="store_true",
        help="only rebuild the markdown from the stored labels (e.g. ones measured elsewhere)",
    )
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--fill",
        type=int,
        default=3_000,
        help="frames in the replay before timing (a long run's is full: replay_capacity)",
    )
    parser.add_argument(
        "--compile",
        choices=("off", "static", "dynamic", "reduce-overhead", "loss"),
        default="off",
        help="torch.compile the network modules (static or dynamic shapes, or CUDA graphs), "
        "or the whole loss (loss), before timing",
    )
    parser.add_argument("--device", default="cpu", help="the learner's device, e.g. cuda")
    parser.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="ReactorConfig settings on top of the env's defaults, e.g. batch_size=8",
    )
    parser.add_argument(
        "--autocast",
        choices=("off", "bfloat16"),
        default="off",
        help="run the loss forward under torch.autocast with this dtype (mixed precision)",
    )
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.summary_only:
        write_summary()
        return
    if not args.label:
        parser.error("--label is required")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    import ac_extensions
    from ac_extensions.recipes.reactor import ReactorConfig, build, make_replay

    settings = parse_settings(args.set)
    config = ReactorConfig.for_env(args.env, seed=1, device=args.device, **settings)
    autocast = None if args.autocast == "off" else getattr(torch, args.autocast)
    _, loss, optimizer, target = build(config)
    replay = make_replay(config)
    # The workers' actor lives on the CPU (as in the recipe's collectors): a CUDA learner
    # fills the replay through a CPU copy of its loss.
    if config.device == "cpu":
        fill(config, loss, replay, args.fill)
    else:
        cpu_config = dataclasses.replace(config, device="cpu")
        fill(cpu_config, build(cpu_config)[1], replay, args.fill)
    compiled, compute = 0, loss
    if args.compile == "loss":  # the whole loss, as PPOConfig.compile_loss compiles PPO's
        compiled, compute = 1, torch.compile(loss)
    elif args.compile != "off":
        compiled = compile_networks(loss, args.compile)
    warm_up = time.process_time()
    for _ in range(20 if compiled else 5):  # compiling (and recompiling) happens here
        timed_step(compute, optimizer, target, replay, config, autocast)
    warm_up = time.process_time() - warm_up
    repeats = []
    for _ in range(args.repeats):
        steps = [
            timed_step(compute, optimizer, target, replay, config, autocast)
            for _ in range(args.steps)
        ]
        repeats.append({p: 1e3 * sum(s[p] for s in steps) / len(steps) for p in PHASES})
    phases = {p: statistics.median(r[p] for r in repeats) for p in PHASES}
    phases["total"] = statistics.median(sum(r.values()) for r in repeats)

    from torch.profiler import profile

    with profile() as prof:
        for _ in range(10):
            timed_step(compute, optimizer, target, replay, config, autocast)
    ops = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(20):
        timed_step(compute, optimizer, target, replay, config, autocast)
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(25)
    functions = "\n".join(
        line for line in text.getvalue().splitlines() if "/" in line or "ncalls" in line
    )
    source = Path(ac_extensions.__file__).resolve().parents[1]  # the checkout whose code ran
    named = "" if source == ROOT else "<another checkout>/"
    functions = functions.replace(sys.prefix, "<venv>")  # before the checkout that may hold it
    functions = functions.replace(f"{source}/", named).replace(f"{ROOT}/", "")
    OUT.mkdir(parents=True, exist_ok=True)
    record = {
        "label": args.label,
        "command": " ".join(["python benchmarks/profile_learner.py", *map(shlex.quote, argv)]),
        "env": args.env,
        "source": f"{named}ac_extensions",
        "device": config.device,
        "clock": "wall, synchronised" if config.device.startswith("cuda") else "process CPU",
        "compile": f"{args.compile} ({compiled} modules, warm-up {warm_up:.1f} CPU s"
        + (f", {graph_breaks()} graph breaks)" if compiled else ")"),
        "settings": settings,
        "autocast": args.autocast,
        "transitions_per_step": config.batch_size * config.sequence_length,
        "steps": args.steps,
        "repeats": args.repeats,
        "cpu_ms_per_step": phases,
        "torch_ops": ops,
        "python_functions": functions,
    }
    (OUT / f"{args.label}.json").write_text(json.dumps(record, indent=1))
    write_summary()


def write_summary() -> None:
    """Rebuild ``reactor_learner_profile.md`` from every stored label; print the table."""
    records = [json.loads(path.read_text()) for path in OUT.glob("*.json")]
    write_markdown(RESULTS / "reactor_learner_profile.md", summary(records))
    print(table(records))


def command(record: dict) -> str:
    """The command line that measured ``record`` (rebuilt from its settings when not stored)."""
    if "command" in record:
        return record["command"]
    return (
        f"python benchmarks/profile_learner.py --label {record['label']} --env {record['env']} "
        f"--steps {record['steps']} --repeats {record['repeats']}"
    )


def table(records: list[dict]) -> str:
    """Milliseconds per phase, one column per label (sorted by label)."""
    records = sorted(records, key=lambda r: r["label"])
    rows = [
        "| phase | " + " | ".join(r["label"] for r in records) + " |",
        "|---" * (len(records) + 1) + "|",
    ]
    for phase in (*PHASES, "total"):
        cells = " | ".join(f"{r['cpu_ms_per_step'][phase]:.2f}" for r in records)
        rows.append(f"| {phase} | {cells} |")
    sizes = [r.get("transitions_per_step") for r in records]
    rows.append("| transitions per step | " + " | ".join(f"{n or '—'}" for n in sizes) + " |")
    per = (
        f"{1e3 * r['cpu_ms_per_step']['total'] / n:.1f}" if n else "—"
        for r, n in zip(records, sizes, strict=True)
    )
    rows.append("| µs per transition | " + " | ".join(per) + " |")
    return "\n".join(rows)


def summary(records: list[dict]) -> str:
    """``reactor_learner_profile.md``: each label's own command, the table, the profiles."""
    records = sorted(records, key=lambda r: r["label"])
    commands = "\n".join(f"- `{r['label']}`: `{command(r)}`" for r in records)
    details = "\n\n".join(
        f"### {r['label']} ({r['env']}, code from `{r['source']}`"
        + (f"; fast path: {r['fast_path']}" if "fast_path" in r else "")
        + (f"; torch.compile: {r['compile']}" if "compile" in r else "")
        + (f"; settings: {r['settings']}" if r.get("settings") else "")
        + (f"; autocast: {r['autocast']}" if r.get("autocast", "off") != "off" else "")
        + (f"; device {r['device']}, {r['clock']} ms" if "device" in r else "")
        + ")\n\n"
        f"torch ops (10 steps):\n\n```\n{r['torch_ops']}\n```\n\n"
        f"Python functions (20 steps, cumulative):\n\n```\n{r['python_functions']}\n```"
        for r in records
    )
    return (
        "# Reactor learner step: milliseconds per phase\n\n"
        "Each label's `ReactorConfig.for_env(env)` (the MinAtar network on MinAtar) with the "
        "settings its command gives (`--set`), "
        "one torch thread; process CPU time per learner step (on CUDA: wall time, the device "
        "synchronised at each phase's end), median over the repeats. "
        "Commands:\n\n"
        f"{commands}\n\n{table(records)}\n\n{details}\n"
    )


if __name__ == "__main__":
    main()
