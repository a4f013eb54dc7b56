"""FlatParameters: one buffer for parameters and gradients, the same training steps."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ac_extensions.runtime import FlatAdam, FlatParameters


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


def test_parameters_and_gradients_are_views_into_the_buffers():
    torch.manual_seed(0)
    net = _net()
    before = [p.detach().clone() for p in net.parameters()]
    flat = FlatParameters(net.parameters())
    assert flat.parameter.shape == (sum(p.numel() for p in before),)
    # Values kept, in parameter order.
    torch.testing.assert_close(flat.parameter.detach(), torch.cat([p.reshape(-1) for p in before]))
    # Writing the buffer writes the module's parameters (and the other way round).
    with torch.no_grad():
        flat.parameter.fill_(2.0)
    assert all((p == 2.0).all() for p in net.parameters())
    # Backward accumulates into the flat gradient buffer.
    flat.zero_grad()
    net(torch.ones(5, 4)).sum().backward()
    torch.testing.assert_close(flat.grad, torch.cat([p.grad.reshape(-1) for p in net.parameters()]))
    assert flat.grad.abs().sum() > 0
    flat.check()


def test_training_steps_equal_the_per_parameter_ones():
    # Differential: Adam + clipping on the flat buffer vs. torch's per-tensor versions.
    torch.manual_seed(0)
    a = _net()
    b = copy.deepcopy(a)
    flat = FlatParameters(b.parameters())
    opt_a = torch.optim.Adam(a.parameters(), lr=1e-2, eps=1e-5)
    opt_b = torch.optim.Adam([flat.parameter], lr=1e-2, eps=1e-5, fused=True)
    for step in range(25):
        x = torch.randn(16, 4) * (10 if step % 5 == 0 else 1)  # some steps clip, some do not
        opt_a.zero_grad()
        a(x).pow(2).mean().backward()
        norm_a = torch.nn.utils.clip_grad_norm_(a.parameters(), 0.5)
        opt_a.step()
        flat.zero_grad()
        b(x).pow(2).mean().backward()
        norm_b = flat.clip_grad_norm_(0.5)
        opt_b.step()
        torch.testing.assert_close(norm_a, norm_b)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(fused=True),
        dict(fused=True, weight_decay=0.1, betas=(0.8, 0.9)),
        dict(weight_decay=0.1, betas=(0.8, 0.9)),
    ],
)
def test_flat_adam_equals_torch_adam(kwargs):
    # Differential: FlatAdam's lean step against torch.optim.Adam on the same flat parameter,
    # over 20 steps with a changing learning rate; state_dicts load into each other.
    torch.manual_seed(3)
    a, b = _net(), _net()
    b.load_state_dict(a.state_dict())
    flat_a, flat_b = FlatParameters(a.parameters()), FlatParameters(b.parameters())
    opt_a = torch.optim.Adam([flat_a.parameter], lr=1e-2, eps=1e-5, **kwargs)
    opt_b = FlatAdam(flat_b, lr=1e-2, eps=1e-5, **kwargs)
    for step in range(20):
        x = torch.randn(16, 4)
        for net, flat, opt in ((a, flat_a, opt_a), (b, flat_b, opt_b)):
            for group in opt.param_groups:
                group["lr"] = 1e-2 * (1 - step / 20)
            flat.zero_grad()
            net(x).pow(2).mean().backward()
            opt.step()
        torch.testing.assert_close(flat_a.parameter, flat_b.parameter, rtol=0, atol=0)
    state = opt_b.state_dict()
    assert float(state["state"][0]["step"]) == 20
    fresh = torch.optim.Adam([flat_a.parameter], lr=1e-2, eps=1e-5, **kwargs)
    fresh.load_state_dict(state)
    torch.testing.assert_close(fresh.state_dict()["state"][0], opt_a.state_dict()["state"][0])


def test_clip_matches_torch_and_scales_to_max_norm():
    net = _net()
    flat = FlatParameters(net.parameters())
    flat.zero_grad()
    flat.grad.copy_(torch.arange(flat.grad.numel(), dtype=torch.float))
    norm = flat.clip_grad_norm_(1.0)
    torch.testing.assert_close(norm, torch.arange(flat.grad.numel(), dtype=torch.float).norm())
    torch.testing.assert_close(flat.grad.norm(), torch.tensor(1.0), atol=1e-5, rtol=0)
    # Below the limit nothing changes.
    flat.grad.fill_(1e-3)
    flat.clip_grad_norm_(1.0)
    assert (flat.grad == 1e-3).all()
    # Bit for bit torch's rule (the coefficient is computed in Python, rounded as float32).
    generator = torch.Generator().manual_seed(0)
    for max_norm in (0.5, 0.3, 1.7):
        for scale in (1e-3, 0.1, 1.0, 30.0):
            grad = torch.randn(flat.grad.shape, generator=generator) * scale
            reference = grad.clone().requires_grad_()
            reference.grad = grad.clone()
            expected = torch.nn.utils.clip_grad_norm_([reference], max_norm)
            flat.grad.copy_(grad)
            assert flat.clip_grad_norm_(max_norm) == expected
            assert torch.equal(flat.grad, reference.grad), (max_norm, scale)


def test_a_loss_module_state_dict_round_trips():
    torch.manual_seed(0)
    net = _net()
    flat = FlatParameters(net.parameters())
    state = copy.deepcopy(net.state_dict())
    with torch.no_grad():
        flat.parameter.zero_()
    net.load_state_dict(state)  # copies into the views
    torch.testing.assert_close(
        flat.parameter.detach(), torch.cat([v.reshape(-1) for v in state.values()])
    )
    flat.check()


def test_check_raises_when_gradients_were_detached():
    net = _net()
    flat = FlatParameters(net.parameters())
    net.zero_grad(set_to_none=True)
    with pytest.raises(RuntimeError, match=r"gradient of parameter 0 .*zero_grad"):
        flat.check()
    flat.attach_grads()
    flat.check()


def test_check_raises_when_a_parameter_was_replaced():
    net = _net()
    flat = FlatParameters(net.parameters())
    net[0].weight.data = net[0].weight.data.clone()
    with pytest.raises(RuntimeError, match=r"parameter 0 \(shape \[8, 4\]\) no longer lives"):
        flat.check()


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="at least one parameter"):
        FlatParameters([])
    frozen = nn.Linear(2, 2)
    frozen.bias.requires_grad_(False)
    with pytest.raises(ValueError, match=r"parameter 1 \(shape \[2\]\) does not require grad"):
        FlatParameters(frozen.parameters())
    mixed = [nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(2, dtype=torch.float64))]
    with pytest.raises(ValueError, match=r"parameter 1 is torch\.float64"):
        FlatParameters(mixed)


def test_shared_parameters_are_taken_once():
    layer = nn.Linear(3, 3)
    flat = FlatParameters([*layer.parameters(), layer.weight])
    assert flat.parameter.numel() == 12
