"""Micro-benchmark of ``PrioritizedSequenceSampler`` against a dense full-recompute baseline.

For C ∈ {10^4, 10^5, 10^6} stored steps (collector rows of 200 steps, one trajectory id per
row), B = 32 sequences of L = 20 steps, α = 1, ε = 0.1, β = 0.4 (CPU, float64 tables): after
``--warmup`` sample/update cycles (so that priorities are assigned and the neighbour estimate
matters), each timed cycle draws one batch and writes back 32 sequence priorities. The
baseline keeps a dense priority vector, recomputes every neighbour estimate p̂ from scratch
(vectorised) and calls ``torch.multinomial`` over all C starts. Both see the same assignments;
the script first checks that the baseline's p̃ equals the sampler's. Reported: the median
time of ``sample`` (which applies the pending updates), ``update_priority``, the whole cycle,
and a cycle that first writes one new row of 200 steps (timed together), over repeats; also
the one-off costs of validating all C windows after the first fill and of the first
refresh after the first update (every slot's estimate changes). Runs on 1 torch thread by
default (the machine is shared).

    python benchmarks/sequence_sampler.py           # writes benchmarks/results/
    python benchmarks/sequence_sampler.py --quick   # C = 10^4 and 10^5 only
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer

from ac_extensions.data import PrioritizedSequenceSampler

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write_markdown

RESULTS = Path(__file__).resolve().parent / "results"
B, L, ROW = 32, 20, 200
ALPHA, EPS, BETA = 1.0, 0.1, 0.4


def naive_cycle(valid: torch.Tensor, assigned: torch.Tensor, priority: torch.Tensor) -> tuple:
    """Full recompute of p̃ (module docstring rule) + multinomial over all C starts."""
    capacity = valid.numel()
    a = assigned.nonzero().flatten()  # [m] sorted assigned starts
    pos = torch.arange(capacity)
    k = torch.searchsorted(a, pos, right=True) - 1  # index of a_k ≤ t, −1 if none
    has_a, has_b = k >= 0, k + 1 < a.numel()
    ak = a[k.clamp(0, a.numel() - 1)]
    bk = a[(k + 1).clamp(0, a.numel() - 1)]
    after = torch.cat([a[1:], torch.tensor([capacity])])  # a_{k+1} for each assigned a_k
    left = torch.where(torch.arange(a.numel()) > 0, a, 0)  # cell start: a_k, or 0 for a_1
    w = (after - left).double()  # cell sizes |I_k|
    w_a, w_b = w[k.clamp(0, a.numel() - 1)], w[(k + 1).clamp(0, a.numel() - 1)]
    p_a, p_b = priority[ak], priority[bk]
    est = torch.where(has_a & has_b, (w_a * p_a + w_b * p_b) / (w_a + w_b), 0.0)
    est = torch.where(has_a & ~has_b, p_a, est)
    est = torch.where(~has_a & has_b, p_b, est)
    est = torch.where(assigned, priority, est)
    mass = torch.where(valid, est.pow(ALPHA), 0.0)
    prob = EPS * valid.double() / valid.sum() + (1 - EPS) * mass / mass.sum()
    starts = torch.multinomial(prob, B, replacement=True)
    p_min = prob[valid].min()
    weight = (prob[starts] / p_min).pow(-BETA)
    return starts, weight, est


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def bench(capacity: int, warmup: int, repeats: int, naive_repeats: int) -> dict:
    torch.manual_seed(0)
    sampler = PrioritizedSequenceSampler(
        capacity, L, alpha=ALPHA, beta=BETA, uniform_probability=EPS, traj_key="traj"
    )
    rb = ReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler)
    rb.extend(TensorDict({"traj": torch.arange(capacity) // ROW}, [capacity]))
    storage = rb.storage
    fill_ms = timed(lambda: sampler.priorities(storage))  # validates all C windows once
    rows_written = [capacity // ROW]

    def write_row():  # one new collector row of ROW steps (replay ratio ~ B·L / ROW)
        ids = torch.full((ROW,), rows_written[0])
        rows_written[0] += 1
        rb.extend(TensorDict({"traj": ids}, [ROW]))

    def cycle(extend: bool) -> tuple[float, float]:
        if extend:
            write_row()
        t0 = time.perf_counter()
        index, _ = sampler.sample(storage, B * L)
        t1 = time.perf_counter()
        sampler.update_priority(index, torch.rand(B).repeat_interleave(L))
        t2 = time.perf_counter()
        return (t1 - t0) * 1e3, (t2 - t1) * 1e3

    first = None
    for i in range(warmup):
        cycle(extend=i % 2 == 1)
        if i == 0:  # the refresh after the very first update re-estimates every slot
            first = timed(lambda: sampler.priorities(storage))
    samples, updates, with_extend = [], [], []
    for _ in range(repeats):
        t_sample, t_update = cycle(extend=False)
        samples.append(t_sample)
        updates.append(t_update)
        t0 = time.perf_counter()
        cycle(extend=True)
        with_extend.append((time.perf_counter() - t0) * 1e3)
    table = sampler.priorities(storage)
    valid, assigned = table.valid.clone(), table.assigned.clone()
    priority = torch.where(assigned, table.priority, 0.0)
    _, _, est = naive_cycle(valid, assigned, priority)
    torch.testing.assert_close(est, table.priority)  # same p̃ as the sampler
    naive = [timed(lambda: naive_cycle(valid, assigned, priority)) for _ in range(naive_repeats)]
    cycles = [s + u for s, u in zip(samples, updates, strict=True)]
    return {
        "capacity": capacity,
        "block_size": sampler.block_size,
        "assigned": int(assigned.sum()),
        "valid": int(valid.sum()),
        "sample_ms": statistics.median(samples),
        "update_ms": statistics.median(updates),
        "cycle_ms": statistics.median(cycles),
        "cycle_p90_ms": sorted(cycles)[int(0.9 * len(cycles))],
        "cycle_with_extend_ms": statistics.median(with_extend),
        "initial_validation_ms": fill_ms,
        "first_refresh_ms": first,
        "naive_cycle_ms": statistics.median(naive),
        "repeats": repeats,
        "naive_repeats": naive_repeats,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sizes = [10**4, 10**5] if args.quick else [10**4, 10**5, 10**6]
    rows = [bench(c, args.warmup, 100, 20 if c < 10**6 else 7) for c in sizes]
    header = (
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.machine()}; "
        f"B = {B} sequences × L = {L} steps, α = {ALPHA}, ε = {EPS}, β = {BETA}; "
        f"{args.warmup} warm-up cycles before timing; medians over repeats; shared machine, "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the end of the run"
    )
    lines = [
        "# PrioritizedSequenceSampler micro-benchmark",
        "",
        header,
        "",
        "Command: `python benchmarks/sequence_sampler.py`",
        "",
        "| C (steps) | assigned | sample (ms) | update (ms) | cycle (ms) | cycle p90 (ms) "
        f"| cycle + extend {ROW} (ms) | naive cycle (ms) | naive/ours | first refresh (ms) "
        "| validate C windows (ms) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['capacity']:,} | {r['assigned']:,} | {r['sample_ms']:.2f} | "
            f"{r['update_ms']:.2f} | {r['cycle_ms']:.2f} | {r['cycle_p90_ms']:.2f} | "
            f"{r['cycle_with_extend_ms']:.2f} | {r['naive_cycle_ms']:.2f} | "
            f"{r['naive_cycle_ms'] / r['cycle_ms']:.1f}x | {r['first_refresh_ms']:.0f} | "
            f"{r['initial_validation_ms']:.0f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        write_markdown((RESULTS / "sequence_sampler.md"), text)
        (RESULTS / "sequence_sampler.json").write_text(
            json.dumps({"header": header, "rows": rows}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
