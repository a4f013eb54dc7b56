"""Micro-benchmark of ``ac_extensions.functional`` against naive per-time-step loops.

For B ∈ {32, 256}, T ∈ {20, 80}, A = 18 actions and N = 51 atoms (float32, CPU), each op and
its naive baseline (``benchmarks/_baselines.py``) run in the same process on the same inputs;
the script first checks that both give the same numbers, then reports the median time per
call over repeats, the ratio naive/ours, and the peak memory of live tensors allocated during
one call (tracked with a TorchDispatchMode, so it counts tensor storage only).

    python benchmarks/functional_ops.py            # full table, writes benchmarks/results/
    python benchmarks/functional_ops.py --quick    # B = 32, T = 20 only, fewer repeats
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import weakref
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _baselines as naive
from _results import write_markdown

from ac_extensions import functional as F

RESULTS = Path(__file__).resolve().parent / "results"


class PeakTensorMemory(TorchDispatchMode):
    """Track the peak bytes of live tensor storages created while the mode is active."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, list[int]] = {}
        self.current = 0
        self.peak = 0

    def _release(self, ptr: int) -> None:
        entry = self.live.get(ptr)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            del self.live[ptr]
            self.current -= entry[1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            ptr = storage.data_ptr()
            if ptr in self.live:
                self.live[ptr][0] += 1
            else:
                self.live[ptr] = [1, storage.nbytes()]
                self.current += storage.nbytes()
                self.peak = max(self.peak, self.current)
            weakref.finalize(tensor, self._release, ptr)
        return out


def peak_memory(fn: Callable[[], object]) -> int:
    mode = PeakTensorMemory()
    with mode:
        result = fn()
        del result
    return mode.peak


def median_time(fn: Callable[[], object], min_repeats: int, budget_s: float) -> float:
    fn()  # warm-up
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_repeats or (time.perf_counter() - start < budget_s and len(times) < 200):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def make_inputs(batch: int, time_steps: int, actions: int, atoms: int, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.rand(*shape, generator=gen)

    done = rand(batch, time_steps, 1) < 0.05
    terminated = done & (rand(batch, time_steps, 1) < 0.5)
    logits = torch.randn(batch, time_steps, actions, generator=gen)
    behavior = torch.randn(batch, time_steps, actions, generator=gen).softmax(-1)
    q = torch.randn(batch, time_steps, actions, generator=gen)
    action = torch.randint(actions, (batch, time_steps, 1), generator=gen)
    probs = logits.softmax(-1)
    ratio = probs.gather(-1, action) / behavior.gather(-1, action)
    atom_probs = torch.randn(batch, time_steps, atoms, generator=gen).softmax(-1)
    next_expected = torch.randn(batch, time_steps, atoms, generator=gen).softmax(-1)
    return dict(
        reward=torch.randn(batch, time_steps, 1, generator=gen),
        done=done,
        terminated=terminated,
        logits=logits,
        behavior_probs=behavior,
        action_values=q,
        action=action,
        ratio=ratio,
        trace=F.acer_trace(ratio),
        chosen_action_value=q.gather(-1, action),
        state_value=(probs * q).sum(-1, keepdim=True),
        next_state_value=torch.randn(batch, time_steps, 1, generator=gen),
        chosen_atom_probs=atom_probs,
        next_expected_atom_probs=next_expected,
        support=torch.linspace(-10.0, 10.0, atoms),
        q_ret=torch.randn(batch, time_steps, 1, generator=gen),
        g=torch.randn(batch * time_steps, actions, generator=gen) * 3,
        k=-behavior.reshape(-1, actions) / probs.reshape(-1, actions),
    )


def ops(x: dict, gamma: float = 0.99, c: float = 10.0) -> dict[str, tuple[Callable, Callable]]:
    """Name → (ours, naive); each returns a tensor to compare."""

    def acer_ours():
        logits = x["logits"].clone().requires_grad_()
        log_probs = logits.log_softmax(-1)
        pi = log_probs.detach().exp()
        v = (pi * x["action_values"]).sum(-1, keepdim=True)
        ratios = pi / x["behavior_probs"]
        loss = F.truncated_is_policy_loss(
            log_probs.gather(-1, x["action"]), ratios.gather(-1, x["action"]), x["q_ret"] - v, c
        ) + F.bias_correction_loss(log_probs, ratios, x["action_values"] - v, c)
        loss.sum().backward()
        return logits.grad

    def acer_naive():
        logits = x["logits"].clone().requires_grad_()
        loss = naive.acer_policy_losses(
            logits.log_softmax(-1),
            x["behavior_probs"],
            x["action"],
            x["q_ret"],
            x["action_values"],
            c,
        )
        loss.sum().backward()
        return logits.grad

    def loo(fn):
        def run():
            logits = x["logits"].clone().requires_grad_()
            loss = fn(
                logits.softmax(-1),
                x["action"],
                x["behavior_probs"].gather(-1, x["action"]),
                x["action_values"],
                x["q_ret"],
                1.0,
            )
            loss.sum().backward()
            return logits.grad

        return run

    shifted = x["reward"] + gamma * x["support"]  # [B, T, N] atoms of a one-step target
    dist_args = (
        x["reward"],
        x["chosen_atom_probs"],
        x["next_expected_atom_probs"],
        x["trace"],
        x["done"],
        x["terminated"],
        gamma,
        x["support"],
    )
    return {
        "retrace_targets": (
            lambda: F.retrace_targets(
                x["reward"],
                x["chosen_action_value"],
                x["state_value"],
                x["next_state_value"],
                x["trace"],
                x["done"],
                x["terminated"],
                gamma,
            ),
            lambda: naive.retrace_targets(
                x["reward"],
                x["chosen_action_value"],
                x["next_state_value"],
                x["trace"],
                x["done"],
                x["terminated"],
                gamma,
            ),
        ),
        "acer_policy_terms (fwd+bwd)": (acer_ours, acer_naive),
        "trust_region_step": (
            lambda: F.trust_region_step(x["g"], x["k"], 1.0),
            lambda: naive.trust_region_step(x["g"], x["k"], 1.0),
        ),
        "categorical_projection": (
            lambda: F.categorical_projection(shifted, x["next_expected_atom_probs"], x["support"]),
            lambda: naive.categorical_projection(
                shifted, x["next_expected_atom_probs"], x["support"]
            ),
        ),
        "distributional_retrace_targets": (
            lambda: F.distributional_retrace_targets(*dist_args),
            lambda: naive.distributional_retrace_targets(*dist_args),
        ),
        "beta_loo_policy_loss (fwd+bwd)": (
            loo(F.beta_loo_policy_loss),
            loo(naive.beta_loo_policy_loss),
        ),
    }


def format_row(r: dict) -> str:
    return (
        f"| {r['op']} | {r['B']} | {r['T']} | {r['ours_ms']:.3f} | {r['naive_ms']:.1f} | "
        f"{r['ratio']:.1f}x | {r['peak_mib_ours']:.1f} | {r['peak_mib_naive']:.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="B = 32, T = 20 only")
    parser.add_argument("--budget", type=float, default=1.0, help="seconds per measurement")
    parser.add_argument("--out", type=Path, default=RESULTS / "functional_ops.md")
    args = parser.parse_args()
    sizes = [(32, 20)] if args.quick else [(32, 20), (32, 80), (256, 20), (256, 80)]
    actions, atoms = 18, 51
    rows = []
    header = (
        "| op | B | T | ours (ms) | naive (ms) | naive/ours | peak MiB ours | "
        "peak MiB naive |\n|---|---|---|---|---|---|---|---|"
    )
    print(header, flush=True)
    for batch, steps in sizes:
        x = make_inputs(batch, steps, actions, atoms)
        for name, (ours, base) in ops(x).items():
            torch.testing.assert_close(ours(), base(), rtol=1e-4, atol=1e-4)
            t_ours = median_time(ours, 5, args.budget)
            t_base = median_time(base, 1 if steps * batch > 2000 else 3, args.budget)
            row = dict(
                op=name,
                B=batch,
                T=steps,
                ours_ms=t_ours * 1e3,
                naive_ms=t_base * 1e3,
                ratio=t_base / t_ours,
                peak_mib_ours=peak_memory(ours) / 2**20,
                peak_mib_naive=peak_memory(base) / 2**20,
            )
            rows.append(row)
            print(format_row(row), flush=True)
    meta = (
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}, A = {actions}, N = {atoms}, float32; "
        f"median of repeats within {args.budget:.1f} s per measurement (naive at the larger "
        f"sizes: a single timed call)"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        f"# Functional micro-benchmark\n\n{meta}\n\nCommand: `python benchmarks/"
        f"functional_ops.py{' --quick' if args.quick else ''}`\n\n{header}"
    ]
    lines += [format_row(r) for r in rows]
    write_markdown(args.out, "\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"\n{meta}\nwrote {args.out}")


if __name__ == "__main__":
    main()
