"""Hand-written backward passes for small MLPs: gradients without building an autograd graph.

A PPO gradient step on CartPole's 2×64 MLPs costs little arithmetic; much of it is autograd's
per-op bookkeeping (recording the graph, then walking it). :class:`MLPBackprop` runs an
``nn.Sequential`` of ``Linear`` and ``Tanh`` / ``ReLU`` layers forward while keeping the
activations, and back-propagates an output gradient through it with one matrix product per
weight gradient, written straight into each parameter's ``.grad`` (so into
:class:`~ac_extensions.modules.FlatParameters`' buffer when there is one). With a loss whose
gradient is also written by hand (:func:`~ac_extensions.functional.categorical_ppo_backward`)
the whole step runs without autograd: ``benchmarks/results/ppo_update.md`` measures it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

_ACTIVATIONS = (nn.Tanh, nn.ReLU, nn.Identity)


class MLPBackprop:
    """Forward and backward of an MLP, by hand.

    Per layer l with input h_{l−1} ([N, in]), z_l = h_{l−1} W_lᵀ + b_l and h_l = σ(z_l), the
    backward pass of an output gradient G = ∂L/∂h_L is the chain rule written out:

        ∂L/∂W_l = δ_lᵀ h_{l−1},   ∂L/∂b_l = Σ_n δ_l,   δ_{l−1} = (δ_l W_l) ⊙ σ'(z_{l−1})

    with δ_L = G ⊙ σ'(z_L), σ' taken from the saved outputs (tanh: 1 − h², ReLU: 1[h > 0]),
    the same kernels autograd uses, so the gradients equal ``loss.backward()``'s up to float
    rounding (``tests/modules/test_backprop.py``).

    :meth:`backward` **overwrites** each parameter's ``.grad`` (``backward()`` would add to
    it): no gradient reset is needed first, and parameters shared with another network would
    lose that network's gradient, so do not share them.

    Args:
        net: an ``nn.Sequential`` (e.g. TorchRL's ``MLP``) of ``nn.Linear`` layers, each
            optionally followed by one ``nn.Tanh``, ``nn.ReLU`` or ``nn.Identity``.

    Raises:
        TypeError: for any other layer, naming it and its index.

    Example:
        >>> import torch
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
        >>> backprop = MLPBackprop(net)
        >>> x = torch.randn(5, 3)
        >>> out, saved = backprop.forward(x)
        >>> backprop.backward(saved, torch.ones(5, 1))
        >>> expected = torch.autograd.grad(net(x).sum(), net[0].weight)[0]
        >>> torch.allclose(net[0].weight.grad, expected, atol=1e-6)
        True
    """

    def __init__(self, net: nn.Sequential) -> None:
        if not isinstance(net, nn.Sequential):
            raise TypeError(f"MLPBackprop needs an nn.Sequential, got {type(net).__name__}")
        self.layers: list[tuple[nn.Linear, type | None]] = []
        for index, layer in enumerate(net):
            if isinstance(layer, nn.Linear):
                self.layers.append((layer, None))
            elif isinstance(layer, _ACTIVATIONS) and self.layers and self.layers[-1][1] is None:
                self.layers[-1] = (self.layers[-1][0], type(layer))
            else:
                raise TypeError(
                    f"MLPBackprop supports Linear layers, each followed by at most one Tanh, "
                    f"ReLU or Identity; layer {index} is {layer!r}"
                )
        if not self.layers:
            raise TypeError("MLPBackprop needs at least one Linear layer")

    @staticmethod
    def supports(net: nn.Module) -> bool:
        """Whether ``net`` has a structure :class:`MLPBackprop` handles."""
        try:
            MLPBackprop(net)  # type: ignore[arg-type]
        except TypeError:
            return False
        return True

    def parameters(self) -> list[nn.Parameter]:
        """The parameters whose gradients :meth:`backward` writes."""
        params = []
        for linear, _ in self.layers:
            params.append(linear.weight)
            if linear.bias is not None:
                params.append(linear.bias)
        return params

    @torch.no_grad()
    def forward(self, x: Tensor) -> tuple[Tensor, list[Tensor]]:
        """The network's output for ``x`` ([N, in] → [N, out]) and what :meth:`backward` needs.

        Returns:
            ``(output, saved)``: the output (no graph) and the layer inputs and outputs.
        """
        if x.dim() != 2:
            raise ValueError(f"MLPBackprop takes inputs of shape [N, in], got {list(x.shape)}")
        saved = [x]
        h = x
        for linear, activation in self.layers:
            if linear.bias is None:
                h = h.mm(linear.weight.t())
            else:
                h = torch.addmm(linear.bias, h, linear.weight.t())
            if activation is nn.Tanh:
                h = h.tanh()
            elif activation is nn.ReLU:
                h = h.relu()
            saved.append(h)
        return h, saved

    @torch.no_grad()
    def backward(self, saved: list[Tensor], grad_output: Tensor) -> None:
        """Write ∂L/∂θ into every parameter's ``.grad``, given ∂L/∂output ([N, out]).

        Args:
            saved: the second value :meth:`forward` returned for this input.
            grad_output: shape [N, out], the loss's gradient with respect to the output.
        """
        output = saved[-1]
        if grad_output.shape != output.shape:
            raise ValueError(
                f"grad_output must have the output's shape {list(output.shape)}, "
                f"got {list(grad_output.shape)}"
            )
        grad = grad_output
        for index in range(len(self.layers) - 1, -1, -1):
            linear, activation = self.layers[index]
            h_out, h_in = saved[index + 1], saved[index]
            if activation is nn.Tanh:
                grad = torch.ops.aten.tanh_backward(grad, h_out)
            elif activation is nn.ReLU:
                grad = torch.ops.aten.threshold_backward(grad, h_out, 0)
            weight, bias = linear.weight, linear.bias
            if _writable(weight):
                torch.mm(grad.t(), h_in, out=weight.grad)
            else:
                weight.grad = grad.t().mm(h_in)
            if bias is not None:
                if _writable(bias):
                    torch.sum(grad, 0, out=bias.grad)
                else:
                    bias.grad = grad.sum(0)
            if index:
                grad = grad.mm(linear.weight)


def _writable(param: nn.Parameter) -> bool:
    """Whether ``param.grad`` exists and can be computed into in place (``out=``)."""
    grad = param.grad
    return grad is not None and grad.is_contiguous() and grad.shape == param.shape


__all__ = ["MLPBackprop"]
