"""PPO gradient-step cost: the loss module against the plain-tensor path, in one run.

One PPO batch as the default recipe trains it: 512 steps of CartPole (2 workers × 8 envs × 32
steps), 20 epochs of 2 minibatches of 256, 2×64 tanh MLPs, fused Adam, gradient clipping; the
last minibatch of the last epoch also computes the diagnostics (as the recipe does). Four
variants, same batch, same minibatch draws, interleaved repeats:

* ``module``: ``SequencePPOLoss`` on TensorDict minibatches (``tensor_update=False``);
* ``tensor, per-tensor step``: :class:`ac_extensions.recipes.on_policy.TensorPath` on plain
  tensors with autograd, the optimiser, clipping and gradient reset walking the 12 parameter
  tensors (torch's ``Adam`` and ``clip_grad_norm_``);
* ``tensor, autograd``: the same on :class:`~ac_extensions.modules.FlatParameters`' single
  buffers, stepped by :class:`~ac_extensions.modules.FlatAdam` (``hand_gradients=False``);
* ``tensor, hand gradients``: the same without autograd: the gradients come from
  :func:`~ac_extensions.functional.categorical_ppo_backward` and
  :class:`~ac_extensions.modules.MLPBackprop` (the recipe's default).

Before timing, the script checks that one step of each gives the same losses and gradients.
Reports milliseconds per gradient step (median over repeats) and the speed-ups; writes
``benchmarks/results/ppo_update.{md,json}``.

    python benchmarks/ppo_update.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch
from tensordict import TensorDict

from ac_extensions.recipes.on_policy import TensorPath, build, epoch_losses, minibatches
from ac_extensions.recipes.ppo import PPOConfig

RESULTS = Path(__file__).resolve().parent / "results"


def make_batch(config: PPOConfig, actor, seed: int = 0) -> TensorDict:
    rows, steps = config.workers * config.envs_per_worker, config.rollout_length
    gen = torch.Generator().manual_seed(seed)
    td = TensorDict({"observation": torch.randn(rows, steps, 4, generator=gen)}, [rows, steps])
    with torch.no_grad():
        td = actor(td)
    td.update(
        {
            "advantage": torch.randn(rows, steps, 1, generator=gen),
            "value_target": torch.randn(rows, steps, 1, generator=gen),
            "state_value": torch.randn(rows, steps, 1, generator=gen),
            ("next", "reward"): torch.randn(rows, steps, 1, generator=gen),
        }
    )
    return td


def one_batch(config, batch, loss_module, optimizer, flat, tensor_path, generator) -> int:
    """Every gradient step of one batch (``epochs`` × minibatches); returns the step count.

    ``flat``: the recipe's :class:`~ac_extensions.modules.FlatParameters` step (``optimizer``
    steps the flat parameter); ``None``: the per-tensor step (``optimizer`` over the module's
    parameters, ``torch.nn.utils.clip_grad_norm_``), the recipe's step before the flat buffers.
    """
    steps = 0
    params = list(loss_module.parameters())
    hand = tensor_path is not None and tensor_path.writes_gradients
    source = tensor_path.gather(batch) if tensor_path is not None else batch
    for epoch in range(config.epochs):
        last = epoch == config.epochs - 1  # the recipe's diagnostics: last epoch's last step
        for out in epoch_losses(source, config, generator, loss_module, tensor_path, last):
            total = sum(v for k, v in out.items() if k.startswith("loss_"))
            if hand:  # the gradients are written already
                grad_norm = flat.clip_grad_norm_(config.max_grad_norm)
            elif flat is not None:
                flat.zero_grad()
                total.backward()
                grad_norm = flat.clip_grad_norm_(config.max_grad_norm)
            else:
                optimizer.zero_grad(set_to_none=True)
                total.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
            optimizer.step()
            float(total.detach()), float(grad_norm)  # the recipe logs both: a sync point each
            steps += 1
    return steps


def check_same_gradients(config, batch) -> None:
    torch.manual_seed(0)
    actor, critic, loss_module, *_ = build(config)  # (FlatParameters: .grad buffers exist)
    path = TensorPath(actor, critic, loss_module, replace(config, hand_gradients=False))
    hand = TensorPath(actor, critic, loss_module, config)
    assert hand.writes_gradients
    order_a, order_b = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    module_mb = next(iter(minibatches(batch, config, order_a)))
    tensor_mb = next(iter(path.minibatches(path.gather(batch), order_b)))
    params = list(loss_module.parameters())
    grads = []
    for out in (loss_module(module_mb), path(tensor_mb, diagnostics=False)):
        total = sum(v for k, v in out.items() if k.startswith("loss_"))
        grads.append(torch.autograd.grad(total, params))
    hand(tensor_mb, diagnostics=False)
    grads.append([p.grad.clone() for p in params])
    for a, b, c in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(a, c)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = PPOConfig()
    torch.manual_seed(0)
    actor, critic, loss_module, optimizer, flat = build(config)
    batch = make_batch(config, actor)
    check_same_gradients(config, batch)
    loss_module.validate(batch)
    loss_module.check_inputs = False
    tensor_path = TensorPath(actor, critic, loss_module, replace(config, hand_gradients=False))
    hand_path = TensorPath(actor, critic, loss_module, config)
    # The per-tensor variant steps the same parameters (views into the flat buffer) with its
    # own Adam, as the recipe did before FlatParameters; attach_grads() restores the gradient
    # views that its zero_grad(set_to_none=True) replaced.
    per_tensor = torch.optim.Adam(loss_module.parameters(), lr=config.lr, eps=1e-5, fused=True)
    paths = {
        "module": (None, optimizer, flat),
        "tensor, per-tensor step": (tensor_path, per_tensor, None),
        "tensor, autograd": (tensor_path, optimizer, flat),
        "tensor, hand gradients": (hand_path, optimizer, flat),
    }
    state = copy.deepcopy(loss_module.state_dict())
    samples: dict[str, list[float]] = {name: [] for name in paths}
    for repeat in range(args.repeats + 1):  # the first round warms up, untimed
        for name, (path, opt, flat_or_none) in paths.items():
            loss_module.load_state_dict(state)
            opt.state.clear()  # fresh Adam moments for every batch
            flat.attach_grads()
            generator = torch.Generator().manual_seed(repeat)
            start = time.perf_counter()
            steps = one_batch(config, batch, loss_module, opt, flat_or_none, path, generator)
            elapsed = time.perf_counter() - start
            if repeat:
                samples[name].append(elapsed / steps * 1e3)
    median = {name: statistics.median(v) for name, v in samples.items()}
    speedup = median["module"] / median["tensor, hand gradients"]
    flat_gain = median["tensor, per-tensor step"] / median["tensor, autograd"]
    hand_gain = median["tensor, autograd"] / median["tensor, hand gradients"]
    rows = [
        "| path | ms per gradient step (median) | all repeats | speed-up |",
        "|---|---|---|---|",
    ] + [
        f"| {name} | {median[name]:.3f} | {', '.join(f'{v:.2f}' for v in samples[name])} | "
        f"{median['module'] / median[name]:.2f}x |"
        for name in paths
    ]
    table = "\n".join(rows)
    header = (
        "# PPO gradient-step cost: loss module vs plain-tensor path\n\n"
        f"Command: `python benchmarks/ppo_update.py --repeats {args.repeats}` "
        f"({args.threads} torch thread(s), {platform.processor() or platform.machine()}, "
        f"torch {torch.__version__}). One default PPO batch (512 steps, {config.epochs} epochs × "
        f"2 minibatches of {config.minibatch_size}, 2×64 MLPs, fused Adam, gradient clipping, "
        "diagnostics on the last minibatch of the last epoch); all paths checked to give the same "
        "gradients first; repeats interleaved.\n\n"
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "ppo_update.md").write_text(header + table + "\n")
    (RESULTS / "ppo_update.json").write_text(
        json.dumps(
            {
                "ms_per_step": samples,
                "median": median,
                "speedup": speedup,
                "flat": flat_gain,
                "hand_gradients": hand_gain,
            },
            indent=2,
        )
    )
    print(table)
    print(
        f"\nhand-gradient tensor path: {speedup:.2f}x faster per gradient step than the module; "
        f"flat buffers: {flat_gain:.2f}x; hand gradients over autograd: {hand_gain:.2f}x; "
        f"wrote {RESULTS}/ppo_update.md"
    )


if __name__ == "__main__":
    main()
