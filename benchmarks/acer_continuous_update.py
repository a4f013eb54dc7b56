"""Continuous ACER update cost on HalfCheetah-shaped batches: what the learner's time buys.

One update = :class:`~ac_extensions.objectives.ContinuousACERLoss` (Retrace with the SDN's
Q̃, Q^opc policy term with bias correction, trust region against the average policy) +
backward + Adam step, on random [B, T] batches shaped like HalfCheetah-v5 (O = 17, d = 6,
T = 20), with the networks of :func:`~ac_extensions.modules.make_continuous_actor_critic`.
Variants change one thing at a time against the recipe's MuJoCo defaults (two 256-unit tanh
layers, B = 32 sequences, n = 5 SDN samples, torch's default threads); every variant is
timed in the same process, interleaved round by round so that load on the shared machine hits
all of them alike. Reports the median milliseconds per update over rounds and the ratio to the
defaults, and the frames per second that cost allows at replay ratio 4 with 4 sequences of 20
steps collected per on-policy update (the recipe's 2 workers × 2 envs). Writes
``benchmarks/results/acer_continuous_update.{md,json}``.

    python benchmarks/acer_continuous_update.py
    python benchmarks/acer_continuous_update.py --rounds 3 --updates 5   # quick
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from tensordict import TensorDict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write_markdown

from ac_extensions.modules import make_continuous_actor_critic
from ac_extensions.objectives import ContinuousACERLoss

RESULTS = Path(__file__).resolve().parent / "results"
OBS, ACT, STEPS = 17, 6, 20
DEFAULTS = {"hidden": (256, 256), "activation": "tanh", "batch": 32, "samples": 5, "threads": 0}
VARIANTS = {
    "defaults (2×256 tanh, B 32, n 5)": {},
    "relu": {"activation": "relu"},
    "B 16": {"batch": 16},
    "n 1": {"samples": 1},
    "2×64 tanh": {"hidden": (64, 64)},
    "1 thread": {"threads": 1},
    "relu, B 16": {"activation": "relu", "batch": 16},
}
"""Name → the settings that differ from :data:`DEFAULTS` (threads 0: torch's default)."""
COLLECTED_PER_UPDATE = 4 * STEPS
"""Frames one on-policy update brings (the recipe's MuJoCo defaults: 2 workers × 2 envs × T)."""
REPLAY_RATIO = 4.0


def make_batch(batch: int, gen: torch.Generator) -> TensorDict:
    """A random [batch, T] window with the keys ContinuousACERLoss reads; a done every 7 steps."""
    shape = (batch, STEPS)
    done = torch.zeros(*shape, 1, dtype=torch.bool)
    done[:, 6::7] = True
    loc = 0.3 * torch.randn(*shape, ACT, generator=gen)
    scale = 0.5 + 0.1 * torch.rand(*shape, ACT, generator=gen)
    return TensorDict(
        {
            "observation": torch.randn(*shape, OBS, generator=gen),
            "action": loc + scale * torch.randn(*shape, ACT, generator=gen),
            ("behavior", "loc"): loc,
            ("behavior", "scale"): scale,
            ("next", "observation"): torch.randn(*shape, OBS, generator=gen),
            ("next", "reward"): torch.randn(*shape, 1, generator=gen),
            ("next", "done"): done,
            ("next", "terminated"): done.clone(),
        },
        batch_size=shape,
    )


class Variant:
    """One configuration: its networks, loss, optimiser and batch."""

    def __init__(self, settings: dict, seed: int = 0) -> None:
        self.settings = {**DEFAULTS, **settings}
        torch.manual_seed(seed)
        actor, critic = make_continuous_actor_critic(
            OBS,
            ACT,
            hidden_sizes=self.settings["hidden"],
            num_samples=self.settings["samples"],
            init_scale=0.5,
            activation=self.settings["activation"],
        )
        self.loss = ContinuousACERLoss(actor, critic, gamma=0.99)
        self.optimizer = torch.optim.Adam(self.loss.parameters(), lr=3e-4)
        self.batch = make_batch(self.settings["batch"], torch.Generator().manual_seed(seed))

    def update(self) -> None:
        """One loss + backward + clipped Adam step on this variant's batch."""
        out = self.loss(self.batch)
        total = sum(v for k, v in out.items() if k.startswith("loss_"))
        self.optimizer.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(self.loss.parameters(), 10.0)
        self.optimizer.step()

    def time(self, updates: int) -> float:
        """Milliseconds per update over ``updates`` updates."""
        default_threads = torch.get_num_threads()
        if self.settings["threads"]:
            torch.set_num_threads(self.settings["threads"])
        try:
            start = time.perf_counter()
            for _ in range(updates):
                self.update()
            return 1e3 * (time.perf_counter() - start) / updates
        finally:
            torch.set_num_threads(default_threads)


def measure(rounds: int, updates: int) -> dict:
    variants = {name: Variant(settings) for name, settings in VARIANTS.items()}
    for v in variants.values():  # warm-up
        v.time(2)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(rounds):
        for name, v in variants.items():
            times[name].append(v.time(updates))
        print(f"round {r + 1}/{rounds}: " + ", ".join(f"{n} {t[-1]:.1f}" for n, t in times.items()))
    base = statistics.median(times[next(iter(VARIANTS))])
    rows = {}
    for name, ts in times.items():
        ms = statistics.median(ts)
        settings = variants[name].settings
        # per on-policy update: 1 update of the fresh 4 sequences + replay_ratio replay updates
        # of `batch` sequences; cost ~ proportional to the sequences pushed through.
        fresh_ms = ms * 4 / settings["batch"]
        fps = COLLECTED_PER_UPDATE / ((fresh_ms + REPLAY_RATIO * ms) / 1e3)
        rows[name] = {
            "settings": {**settings, "hidden": list(settings["hidden"])},
            "ms_per_update": ms,
            "all_ms": ts,
            "ratio_to_defaults": ms / base,
            "learner_bound_fps": fps,
        }
    return rows


def render(rows: dict, rounds: int, updates: int) -> str:
    lines = [
        "# Continuous ACER update cost (HalfCheetah-shaped batches)",
        "",
        f"Command: `python benchmarks/acer_continuous_update.py --rounds {rounds} --updates "
        f"{updates}`. One update = ContinuousACERLoss + backward + Adam on a random [B, 20] "
        f"batch (O = 17, d = 6); median over {rounds} interleaved rounds of {updates} updates; "
        f"torch {torch.__version__}, {platform.machine()}, default threads "
        f"{torch.get_num_threads()}. Learner-bound fps: the frames per second the learner alone "
        f"allows at replay ratio 4 with 80 frames (4 sequences) per on-policy update, "
        f"collection excluded.",
        "",
        "| variant | ms per update | ratio to defaults | learner-bound fps |",
        "|---|---|---|---|",
    ]
    for name, row in rows.items():
        lines.append(
            f"| {name} | {row['ms_per_update']:.1f} | {row['ratio_to_defaults']:.2f} | "
            f"{row['learner_bound_fps']:,.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--updates", type=int, default=10)
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    rows = measure(args.rounds, args.updates)
    text = render(rows, args.rounds, args.updates)
    print(text)
    args.results.mkdir(parents=True, exist_ok=True)
    write_markdown(args.results / "acer_continuous_update.md", text)
    (args.results / "acer_continuous_update.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
