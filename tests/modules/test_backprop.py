"""modules.MLPBackprop: hand-written MLP gradients against autograd and finite differences."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from ac_extensions.modules import FlatParameters, MLPBackprop, make_actor_critic


def _net(activation, bias=True, sizes=(3, 7, 5, 2), dtype=torch.float32):
    layers = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(a, b, bias=bias, dtype=dtype))
        if i < len(sizes) - 2:
            layers.append(activation())
    return nn.Sequential(*layers)


@pytest.mark.parametrize("activation", [nn.Tanh, nn.ReLU, nn.Identity])
@pytest.mark.parametrize("bias", [True, False])
def test_gradients_equal_autograd(activation, bias):
    torch.manual_seed(0)
    net = _net(activation, bias)
    x, weight = torch.randn(11, 3), torch.randn(11, 2)
    expected_out = net(x)
    expected = torch.autograd.grad((expected_out * weight).sum(), list(net.parameters()))
    backprop = MLPBackprop(net)
    out, saved = backprop.forward(x)
    torch.testing.assert_close(out, expected_out.detach())
    assert not out.requires_grad
    backprop.backward(saved, weight)
    assert backprop.parameters() == list(net.parameters())
    for p, g in zip(net.parameters(), expected, strict=True):
        torch.testing.assert_close(p.grad, g)


def test_gradients_match_finite_differences_in_float64():
    # Independent of autograd: central differences of L = Σ out ⊙ W on every parameter entry.
    torch.manual_seed(1)
    net = _net(nn.Tanh, sizes=(2, 4, 3, 2), dtype=torch.float64)
    x, weight = torch.randn(5, 2, dtype=torch.float64), torch.randn(5, 2, dtype=torch.float64)
    backprop = MLPBackprop(net)
    backprop.backward(backprop.forward(x)[1], weight)
    h = 1e-6
    with torch.no_grad():
        for p in net.parameters():
            numeric = torch.zeros_like(p)
            for i in range(p.numel()):
                flat = p.view(-1)
                flat[i] += h
                up = (net(x) * weight).sum()
                flat[i] -= 2 * h
                down = (net(x) * weight).sum()
                flat[i] += h
                numeric.view(-1)[i] = (up - down) / (2 * h)
            torch.testing.assert_close(p.grad, numeric, rtol=1e-6, atol=1e-8)


def test_writes_into_flat_buffers_and_overwrites():
    # The recipe's networks: gradients land in FlatParameters' buffer in place (no new
    # tensors), and a second backward replaces the first instead of adding to it.
    torch.manual_seed(2)
    actor, critic = make_actor_critic(4, 3)
    nets = [actor.module[0].module, critic.module]
    flat = FlatParameters([p for net in nets for p in net.parameters()])
    buffer = flat.grad.data_ptr()
    x = torch.randn(9, 4)
    for _ in range(2):
        for backprop in map(MLPBackprop, nets):
            out, saved = backprop.forward(x)
            backprop.backward(saved, torch.ones_like(out))
    flat.check()  # still views into the buffers
    assert flat.grad.data_ptr() == buffer
    expected = torch.autograd.grad(
        nets[0](x).sum() + nets[1](x).sum(), [p for net in nets for p in net.parameters()]
    )
    torch.testing.assert_close(flat.grad, torch.cat([g.reshape(-1) for g in expected]))


def test_unsupported_layers_and_shapes_raise():
    with pytest.raises(TypeError, match=r"layer 1 is Dropout"):
        MLPBackprop(nn.Sequential(nn.Linear(2, 2), nn.Dropout(), nn.Linear(2, 1)))
    with pytest.raises(TypeError, match=r"layer 2 is ReLU"):
        MLPBackprop(nn.Sequential(nn.Linear(2, 2), nn.Tanh(), nn.ReLU()))
    with pytest.raises(TypeError, match=r"nn\.Sequential"):
        MLPBackprop(nn.Linear(2, 2))
    assert not MLPBackprop.supports(nn.Sequential(nn.Tanh()))
    assert MLPBackprop.supports(nn.Sequential(nn.Linear(2, 2)))
    backprop = MLPBackprop(nn.Sequential(nn.Linear(2, 3)))
    with pytest.raises(ValueError, match=r"\[N, in\], got \[2\]"):
        backprop.forward(torch.zeros(2))
    _, saved = backprop.forward(torch.zeros(4, 2))
    with pytest.raises(ValueError, match=r"output's shape \[4, 3\], got \[4, 1\]"):
        backprop.backward(saved, torch.zeros(4, 1))
