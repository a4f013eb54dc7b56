"""Layers the network builders share: orthogonally initialised linear layers and MLPs.

Orthogonal weights and zero biases, gain √2 on hidden layers and a per-head gain on the output
(Andrychowicz et al., 2021, arXiv:2006.05990, §3.2; Stable-Baselines3's default for its MLP
policies): a small policy-head gain (0.01) starts π near uniform.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn
from torchrl.modules import MLP

ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}
"""The hidden activations the MLP builders accept, by name."""


def orthogonal_init(module: nn.Module, gain: float) -> nn.Module:
    """Orthogonal weights (``gain``) and zero biases for every ``nn.Linear`` in ``module``."""
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            nn.init.orthogonal_(layer.weight, gain)
            nn.init.zeros_(layer.bias)
    return module


def linear(in_features: int, out_features: int, gain: float) -> nn.Linear:
    """A linear layer with orthogonal weights (``gain``) and zero bias."""
    return orthogonal_init(nn.Linear(in_features, out_features), gain)


def mlp(
    in_features: int,
    out_features: int,
    hidden: Sequence[int],
    head_gain: float,
    activation: str = "tanh",
) -> MLP:
    """An MLP ``in → hidden… → out`` with ``activation`` between layers (output not activated).

    Gains: √2 on the hidden layers, ``head_gain`` on the output layer.
    """
    net = MLP(
        in_features=in_features,
        out_features=out_features,
        num_cells=list(hidden),
        activation_class=ACTIVATIONS[activation],
    )
    orthogonal_init(net, 2**0.5)
    last = [m for m in net.modules() if isinstance(m, nn.Linear)][-1]
    nn.init.orthogonal_(last.weight, head_gain)
    return net


def mlp_torso(observation_dim: int, hidden_sizes: Sequence[int]) -> nn.Sequential:
    """``Linear → Tanh`` per hidden size, every layer activated (a torso for several heads)."""
    layers: list[nn.Module] = []
    width = observation_dim
    for size in hidden_sizes:
        layers += [linear(width, size, 2**0.5), nn.Tanh()]
        width = size
    return nn.Sequential(*layers)
