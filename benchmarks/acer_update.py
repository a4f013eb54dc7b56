"""ACER update throughput: ``ACERLoss`` against a naive per-time-step loop, in one run.

One update = loss (Retrace Q^ret, truncated IS + bias correction, per-sample trust region
against the average network) + backward, on a batch of B = 32 sequences of k = 20 steps, for
two networks: the CartPole policy-plus-Q MLP (2×64) and the Atari Nature CNN (4×84×84 frames,
6 actions). The baseline is :func:`benchmarks._acer_naive.naive_acer_loss`, written from the
paper's Algorithm 2 one time step at a time (vectorised over the batch only). Before timing,
the script checks that both give the same gradients. Reports the median sequences per second
over repeats and the ratio; writes ``benchmarks/results/acer_update.{md,json}``.

    python benchmarks/acer_update.py              # both networks
    python benchmarks/acer_update.py --only mlp   # CartPole MLP only (fast)
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from tensordict import TensorDict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _acer_naive import naive_acer_loss
from _results import write_markdown

from ac_extensions.modules import make_acer_actor
from ac_extensions.objectives import ACERLoss

RESULTS = Path(__file__).resolve().parent / "results"
GAMMA, ENTROPY = 0.99, 0.01


def make_batch(
    batch: int, steps: int, obs_shape: tuple, actions: int, seed: int, binary: bool = False
) -> TensorDict:
    """A replay-like batch [batch, steps]; ``binary``: MinAtar's 0/1 float channels."""
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, steps)

    def draw(*size):
        if binary:  # MinAtar: 0/1 channels, sampled from the replay as float32
            return (torch.rand(*size, *obs_shape, generator=gen) < 0.1).float()
        if len(obs_shape) == 3:  # frames
            return torch.randint(0, 256, (*size, *obs_shape), dtype=torch.uint8, generator=gen)
        return torch.randn(*size, *obs_shape, generator=gen)

    # A consistent stream: x_{t+1} is the next row's observation, except after an episode end,
    # where ("next", "observation") is the final observation and the next row a reset one.
    stream = draw(batch, steps + 1)
    obs, nxt = stream[:, :-1], stream[:, 1:].clone()
    done = torch.rand(*shape, 1, generator=gen) < 0.05
    nxt[done.squeeze(-1)] = draw(int(done.sum()))
    return TensorDict(
        {
            "observation": obs,
            "action": torch.randint(actions, shape, generator=gen),
            ("behavior", "logits"): torch.randn(*shape, actions, generator=gen),
            ("next", "observation"): nxt,
            ("next", "reward"): torch.randn(*shape, 1, generator=gen),
            ("next", "done"): done,
            ("next", "terminated"): done & (torch.rand(*shape, 1, generator=gen) < 0.5),
        },
        shape,
    )


class PlainNetwork(torch.nn.Module):
    """The actor's torch modules as ``x → (logits, Q)`` for the naive loop."""

    def __init__(self, actor) -> None:
        super().__init__()
        body = actor.module[0]
        self.torso, self.heads = body[0].module, body[-1].module

    def forward(self, x):
        """``x → (logits, Q)``."""
        return self.heads(self.torso(x))


def naive_inputs(td: TensorDict) -> dict:
    return {
        "observation": td["observation"],
        "action": td["action"],
        "behavior_logits": td["behavior", "logits"],
        "next_observation": td["next", "observation"],
        "reward": td["next", "reward"].squeeze(-1),
        "done": td["next", "done"].squeeze(-1),
        "terminated": td["next", "terminated"].squeeze(-1),
    }


def setup(kind: str):
    torch.manual_seed(0)
    if kind == "mlp":
        obs_shape, actions = (4,), 2
        actor = make_acer_actor(4, actions, hidden_sizes=(64, 64))
    else:
        obs_shape, actions = (4, 84, 84), 6
        actor = make_acer_actor(obs_shape, actions, torso="cnn")
    loss = ACERLoss(actor, None, gamma=GAMMA, entropy_coeff=ENTROPY)
    # Move the average policy away from the current one, so that the trust region binds.
    with torch.no_grad():
        for p in loss.target_actor_network_params.values(True, True):
            p.add_(0.05 * torch.randn_like(p))
    network = PlainNetwork(actor)
    average_actor = copy.deepcopy(actor)  # the naive loop's average network: θ_avg copied in
    loss.target_actor_network_params.to_module(average_actor)
    average = PlainNetwork(average_actor)
    return loss, network, average, obs_shape, actions


def ours_step(loss, td) -> None:
    out = loss(td)
    (out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]).backward()


def naive_step(network, average, data) -> None:
    naive_acer_loss(network, average, data, gamma=GAMMA, entropy_coeff=ENTROPY).backward()


def check_same_gradients(loss, network, average, td) -> float:
    params = list(network.parameters())
    for p in params:
        p.grad = None
    ours_step(loss, td.clone())
    ours = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    naive_step(network, average, naive_inputs(td))
    worst = 0.0
    for a, b in zip(ours, (p.grad for p in params), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)
        worst = max(worst, float((a - b).abs().max()))
    return worst


def time_it(fn, repeats: int, inner: int) -> list[float]:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - start) / inner)
    return times


def run(kind: str, repeats: int, batch: int, steps: int) -> dict:
    loss, network, average, obs_shape, actions = setup(kind)
    td = make_batch(batch, steps, obs_shape, actions, seed=1)
    worst = check_same_gradients(loss, network, average, td)
    data = naive_inputs(td)
    inner = 10 if kind == "mlp" else 1
    ours = time_it(lambda: ours_step(loss, td), repeats, inner)
    naive = time_it(lambda: naive_step(network, average, data), repeats, inner)
    ours_sps, naive_sps = batch / statistics.median(ours), batch / statistics.median(naive)
    return {
        "network": kind,
        "batch": [batch, steps],
        "max_abs_grad_difference": worst,
        "ours_ms": 1e3 * statistics.median(ours),
        "naive_ms": 1e3 * statistics.median(naive),
        "ours_sequences_per_s": ours_sps,
        "naive_sequences_per_s": naive_sps,
        "speedup": ours_sps / naive_sps,
        "repeats": repeats,
        "inner": inner,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["mlp", "cnn"], default=None)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    kinds = [args.only] if args.only else ["mlp", "cnn"]
    rows = []
    for kind in kinds:
        row = run(kind, args.repeats, 32, 20)
        rows.append(row)
        print(json.dumps(row), flush=True)
    threads = f" --threads {args.threads}" if args.threads else ""
    lines = [
        "# ACER update throughput: ACERLoss vs a naive per-time-step loop (Algorithm 2)",
        "",
        f"Command: `python benchmarks/acer_update.py{threads}` (torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, {platform.processor() or platform.machine()}). "
        "One update = loss + backward incl. the per-sample trust region, batch [32, 20]; "
        "median over repeats. Gradients of the two agree (max |Δ| in the table).",
        "",
        "| network | ours ms | naive ms | ours seq/s | naive seq/s | speed-up | max abs Δgrad |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['network']} | {r['ours_ms']:.2f} | {r['naive_ms']:.2f} | "
            f"{r['ours_sequences_per_s']:,.0f} | {r['naive_sequences_per_s']:,.0f} | "
            f"{r['speedup']:.2f}× | {r['max_abs_grad_difference']:.1e} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.only:
        RESULTS.mkdir(exist_ok=True)
        write_markdown((RESULTS / "acer_update.md"), text)
        payload = {"networks": rows}
        (RESULTS / "acer_update.json").write_text(json.dumps(payload, indent=1) + "\n")


if __name__ == "__main__":
    main()
