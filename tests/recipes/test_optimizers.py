"""ACER's and Reactor's recipes step a fused Adam: the same update as torch's per-tensor loop."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from tests._helpers import load_script


def recipe_optimizer(recipe: str):
    if recipe == "acer":
        from ac_extensions.recipes.acer import ACERConfig, build

        _, _, optimizer, _, _ = build(ACERConfig(seed=1))
    else:
        from ac_extensions.recipes.reactor import ReactorConfig, build

        _, _, optimizer, _ = build(ReactorConfig(seed=1))
    return optimizer


@pytest.mark.parametrize("recipe", ["acer", "reactor"])
def test_the_recipe_steps_a_fused_adam_with_the_per_tensor_update(recipe):
    optimizer = recipe_optimizer(recipe)
    assert optimizer.param_groups[0]["fused"] is True
    params = [p for group in optimizer.param_groups for p in group["params"]]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    reference = torch.optim.Adam(twins, lr=optimizer.defaults["lr"], foreach=False)
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):  # the bias corrections of the first steps included
        for p, twin in zip(params, twins, strict=True):
            p.grad = torch.randn(p.shape, generator=generator)
            twin.grad = p.grad.clone()
        optimizer.step()
        reference.step()
    for p, twin in zip(params, twins, strict=True):
        torch.testing.assert_close(p.detach(), twin.detach(), rtol=1e-6, atol=1e-7)


def test_a_checkpoint_of_the_per_tensor_optimiser_keeps_it_on_resume():
    # Runs started before the recipes used fused Adam resume with the optimiser they had:
    # load_state_dict takes the saved param groups, flags included.
    optimizer = recipe_optimizer("reactor")
    params = [p for group in optimizer.param_groups for p in group["params"]]
    before = torch.optim.Adam(params, lr=1e-3)  # torch's default for CPU tensors
    for p in params:
        p.grad = torch.ones_like(p)
    before.step()
    optimizer.load_state_dict(copy.deepcopy(before.state_dict()))
    assert not optimizer.param_groups[0]["fused"]
    optimizer.step()  # and it steps


def test_optimizer_step_benchmark_writes_its_table(tmp_path):
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "optimizer_step.py"
    for bench in load_script(script, "optimizer_step_benchmark"):
        out = tmp_path / "optimizer_step.md"
        bench.main(["--envs", "CartPole-v1", "--steps", "2", "--repeats", "1", "--out", str(out)])
        text = out.read_text()
        assert "| acer | CartPole-v1 | 12 |" in text and "| reactor | CartPole-v1 | 12 |" in text
        assert out.with_suffix(".json").is_file()
