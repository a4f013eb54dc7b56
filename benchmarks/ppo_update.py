"""PPO gradient-step cost: the loss module's three paths against a bare plain-tensor loop.

One PPO batch as the default recipe trains it: 512 steps (16 rows × 32 steps, synthetic
CartPole-sized observations, log-probs from the actor that "collected" them), 20 epochs of 2
minibatches of 256, 2×64 tanh MLPs (:func:`~ac_extensions.modules.make_actor_critic`),
:class:`~ac_extensions.modules.FlatParameters` with
:class:`~ac_extensions.modules.FlatAdam` (fused), gradient clipping at 0.5, the loss and
gradient norm read back every step (the recipe logs both); the last minibatch of the last
epoch also computes the diagnostics. Four paths, same batch, same minibatch draws,
interleaved repeats:

* (a) ``module, TorchRL path``: :class:`~ac_extensions.objectives.SequencePPOLoss` with
  ``fast_path=False`` on TensorDict minibatches (TorchRL's ``ClipPPOLoss.forward``), autograd;
* (b) ``module, fast forward + autograd``: the same module on its fast path
  (:func:`~ac_extensions.functional.categorical_ppo_losses` on the minibatch's tensors),
  autograd backward;
* (c) ``module, forward_backward``: :meth:`SequencePPOLoss.forward_backward`, gradients by
  hand (:func:`~ac_extensions.functional.categorical_ppo_backward` through
  :class:`~ac_extensions.modules.MLPBackprop`);
* (d) ``bare tensors, hand gradients``: no loss module and no TensorDict: the tensors are
  gathered once per batch, minibatches are index gathers, and the step calls
  ``categorical_ppo_backward`` and ``MLPBackprop`` directly (what the recipe's former
  ``TensorPath`` did).

Minibatches of (a)–(c) are TensorDicts cut from the flat batch (the loss's keys selected once
per batch, then indexed), as a training loop composing with the module would cut them. Before
timing, the script checks that one step of each path gives the same losses and gradients.
Reports milliseconds per gradient step (median over repeats) and the ratios to (a) and (d);
writes ``benchmarks/results/ppo_update.{md,json}`` (the ``## Notes`` written under the table,
what was tried to close the gap between (c) and (d), are kept).

    python benchmarks/ppo_update.py [--repeats 9] [--threads 1]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from tensordict import TensorDict, TensorDictBase

from ac_extensions.functional import categorical_ppo_backward
from ac_extensions.modules import FlatAdam, FlatParameters, MLPBackprop, make_actor_critic
from ac_extensions.objectives import SequencePPOLoss

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write_markdown

RESULTS = Path(__file__).resolve().parent / "results"
ROWS, STEPS, OBS, ACTIONS = 16, 32, 4, 2  # 2 workers × 8 envs × 32 steps of CartPole
EPOCHS, MINIBATCH = 20, 256
LR, MAX_GRAD_NORM = 1e-3, 0.5
PATHS = {
    "a": "module, TorchRL path",
    "b": "module, fast forward + autograd",
    "c": "module, forward_backward",
    "d": "bare tensors, hand gradients",
}


def build(seed: int = 0):
    """The default recipe's networks, loss and optimiser (``recipes.ppo.build``'s settings)."""
    torch.manual_seed(seed)
    actor, critic = make_actor_critic(OBS, ACTIONS, hidden_sizes=(64, 64))
    loss = SequencePPOLoss(
        actor,
        critic,
        clip_epsilon=0.2,
        clip_value=None,
        normalize_advantage=True,
        entropy_coeff=0.0,
        critic_coeff=0.5,
        loss_critic_type="l2",
        functional=False,
    )
    flat = FlatParameters(loss.parameters())
    optimizer = FlatAdam(flat, lr=LR, eps=1e-5, fused=True)
    return actor, critic, loss, flat, optimizer


def make_batch(actor, seed: int = 0) -> TensorDict:
    """A ``[16, 32]`` batch with what a collector and GAE would have written."""
    gen = torch.Generator().manual_seed(seed)
    td = TensorDict({"observation": torch.randn(ROWS, STEPS, OBS, generator=gen)}, [ROWS, STEPS])
    with torch.no_grad():
        td = actor(td)
    td["action_log_prob"] = td["action_log_prob"] + 0.1 * torch.randn(ROWS, STEPS, generator=gen)
    td.update(
        {
            "advantage": torch.randn(ROWS, STEPS, 1, generator=gen),
            "value_target": torch.randn(ROWS, STEPS, 1, generator=gen),
            "state_value": torch.randn(ROWS, STEPS, 1, generator=gen),
            ("next", "reward"): torch.randn(ROWS, STEPS, 1, generator=gen),
        }
    )
    return td


LOSS_KEYS = ("observation", "action", "action_log_prob", "advantage", "value_target")


def module_minibatches(batch: TensorDictBase, generator) -> Iterator[list[TensorDictBase]]:
    """Per epoch, the shuffled TensorDict minibatches of the flat batch (keys selected once)."""
    flat = batch.reshape(-1).select(*LOSS_KEYS, "state_value")
    for _ in range(EPOCHS):
        order = torch.randperm(flat.shape[0], generator=generator)
        yield [flat[order[s : s + MINIBATCH]] for s in range(0, flat.shape[0], MINIBATCH)]


class Bare:
    """Path (d): the former recipe's plain-tensor step, without the loss module."""

    def __init__(self, actor, critic, loss: SequencePPOLoss) -> None:
        self.loss = loss
        self.actor = MLPBackprop(actor.module[0].module)
        self.critic = MLPBackprop(critic.module)

    @staticmethod
    def gather(batch: TensorDictBase) -> tuple[torch.Tensor, ...]:
        """Observation [N, O], action, log µ, advantage, value target, V_old (each [N])."""
        flat = batch.reshape(-1)
        return (
            flat["observation"],
            flat["action"],
            flat["action_log_prob"],
            flat["advantage"].squeeze(-1),
            flat["value_target"].squeeze(-1),
            flat["state_value"].squeeze(-1),
        )

    def minibatches(self, batch: TensorDictBase, generator) -> Iterator[list[tuple]]:
        """Per epoch, the shuffled minibatches of the gathered tensors (the same draws)."""
        steps = self.gather(batch)
        n = steps[0].shape[0]
        for _ in range(EPOCHS):
            order = torch.randperm(n, generator=generator)
            yield [
                tuple(t[order[s : s + MINIBATCH]] for t in steps) for s in range(0, n, MINIBATCH)
            ]

    def __call__(self, minibatch: tuple, diagnostics: bool) -> dict[str, torch.Tensor]:
        """The losses of one minibatch; their gradient is written into every ``.grad``."""
        observation, action, log_prob, advantage, value_target, old_value = minibatch
        loss, clip_value = self.loss, self.loss.clip_value
        logits, actor_saved = self.actor.forward(observation)
        value, critic_saved = self.critic.forward(observation)
        out, grad_logits, grad_value = categorical_ppo_backward(
            logits,
            value.squeeze(-1),
            action,
            log_prob,
            advantage,
            value_target,
            clip_epsilon=float(loss.clip_epsilon),
            entropy_coeff=float(loss.entropy_coeff),
            critic_coeff=float(loss.critic_coeff),
            normalize_advantage=loss.normalize_advantage,
            clip_value=None if clip_value is None else float(clip_value),
            old_value=old_value,
            diagnostics=diagnostics,
        )
        self.actor.backward(actor_saved, grad_logits)
        self.critic.backward(critic_saved, grad_value.unsqueeze(-1))
        return out


def step_functions(loss: SequencePPOLoss, flat: FlatParameters, bare: Bare) -> dict:
    """Per path: ``(minibatches(batch, generator), step(minibatch, diagnostics) -> out)``."""

    def autograd_step(fast: bool) -> Callable:
        def step(minibatch, diagnostics):
            loss.fast_path, loss.diagnostics = fast, diagnostics
            out = loss(minibatch)
            total = sum(v for k, v in out.items() if k.startswith("loss_"))
            flat.zero_grad()
            total.backward()
            return out

        return step

    def hand_step(minibatch, diagnostics):
        loss.fast_path, loss.diagnostics = True, diagnostics
        return loss.forward_backward(minibatch)

    return {
        "a": (module_minibatches, autograd_step(False)),
        "b": (module_minibatches, autograd_step(True)),
        "c": (module_minibatches, hand_step),
        "d": (bare.minibatches, bare),
    }


def one_batch(batch, flat, optimizer, minibatches, step, generator) -> int:
    """Every gradient step of one batch (epochs × minibatches); returns the step count."""
    steps = 0
    epochs = list(minibatches(batch, generator))
    for epoch, cuts in enumerate(epochs):
        for index, minibatch in enumerate(cuts):
            # The recipe's diagnostics: on the last minibatch of the last epoch.
            diagnostics = epoch == len(epochs) - 1 and index == len(cuts) - 1
            out = step(minibatch, diagnostics)
            grad_norm = flat.clip_grad_norm_(MAX_GRAD_NORM)
            optimizer.step()
            total = sum(v for k, v in out.items() if k.startswith("loss_"))
            float(total.detach()), float(grad_norm)  # logged: a sync point each
            steps += 1
    return steps


def check_same_steps(batch: TensorDictBase) -> None:
    """One minibatch through each path: the same losses, diagnostics and gradients."""
    actor, critic, loss, flat, _ = build()
    bare = Bare(actor, critic, loss)
    functions = step_functions(loss, flat, bare)
    results = {}
    for name, (minibatches, step) in functions.items():
        generator = torch.Generator().manual_seed(1)
        minibatch = next(iter(minibatches(batch, generator)))[0]
        out = step(minibatch, True)
        results[name] = ({k: float(v.detach()) for k, v in out.items()}, flat.grad.clone())
    keys, grad = results["a"]
    for name, (values, other) in results.items():
        assert values.keys() == keys.keys(), (name, sorted(values), sorted(keys))
        for key in keys:
            assert abs(values[key] - keys[key]) <= 1e-5 * (1 + abs(keys[key])), (name, key)
        torch.testing.assert_close(other, grad, msg=f"gradients of path {name}")
    assert loss.hand_gradients and loss.fast_path_blocker(batch) is None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    actor, critic, loss, flat, optimizer = build()
    batch = make_batch(actor)
    check_same_steps(batch)
    loss.validate(batch)  # once per batch, as the recipe does; the minibatches skip it
    loss.check_inputs = False
    functions = step_functions(loss, flat, Bare(actor, critic, loss))
    state = copy.deepcopy(loss.state_dict())
    samples: dict[str, list[float]] = {name: [] for name in PATHS}
    load_before = os.getloadavg()[0]
    for repeat in range(args.repeats + 1):  # the first round warms up, untimed
        for name, (minibatches, step) in functions.items():
            loss.load_state_dict(state)
            optimizer.state.clear()  # fresh Adam moments for every batch
            generator = torch.Generator().manual_seed(repeat)
            start = time.perf_counter()
            steps = one_batch(batch, flat, optimizer, minibatches, step, generator)
            elapsed = time.perf_counter() - start
            if repeat:
                samples[name].append(elapsed / steps * 1e3)
    load = (load_before, os.getloadavg()[0])  # the machine may be shared: say how busy it was
    median = {name: statistics.median(v) for name, v in samples.items()}
    rows = [
        "| path | ms per gradient step (median) | all repeats | speed-up vs (a) | time vs (d) |",
        "|---|---|---|---|---|",
    ] + [
        f"| ({name}) {label} | {median[name]:.3f} | "
        f"{', '.join(f'{v:.2f}' for v in samples[name])} | "
        f"{median['a'] / median[name]:.2f}x | {median[name] / median['d']:.2f}x |"
        for name, label in PATHS.items()
    ]
    table = "\n".join(rows)
    header = (
        "# PPO gradient-step cost: SequencePPOLoss's paths vs a bare plain-tensor loop\n\n"
        f"Command: `python benchmarks/ppo_update.py --repeats {args.repeats}` "
        f"({args.threads} torch thread(s), {os.cpu_count()} cores "
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}, 1-minute "
        f"load average {load[0]:.1f} before and {load[1]:.1f} after). One default PPO batch "
        f"(512 steps, {EPOCHS} epochs × 2 minibatches of {MINIBATCH}, 2×64 MLPs, fused FlatAdam, "
        "gradient clipping, "
        "diagnostics on the last minibatch of the last epoch); all paths checked to give the same "
        "losses and gradients first; repeats interleaved. (a)–(c): TensorDict minibatches; "
        "(d): index-gathered plain tensors.\n\n"
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_markdown(RESULTS / "ppo_update.md", header + table + "\n")
    (RESULTS / "ppo_update.json").write_text(
        json.dumps(
            {
                "paths": PATHS,
                "load_average": load,
                "ms_per_step": samples,
                "median": median,
                "speedup_vs_torchrl_path": {n: median["a"] / median[n] for n in PATHS},
                "time_vs_bare": {n: median[n] / median["d"] for n in PATHS},
            },
            indent=2,
        )
    )
    print(table)
    print(
        f"\nforward_backward: {median['a'] / median['c']:.2f}x faster per gradient step than the "
        f"TorchRL path, {median['c'] / median['d']:.2f}x the bare loop's time; "
        f"wrote {RESULTS}/ppo_update.md"
    )


if __name__ == "__main__":
    main()
