"""The MinAtar network's torso (Young & Tian, 2019, arXiv:1903.03176, §4).

MinAtar observations are ``C`` binary 10×10 feature maps (one channel per object kind; C is 4
for Breakout, 7 for Freeway, 10 for Seaquest). The paper's agents use "a single convolutional
layer with 16 3×3 filters (stride 1), followed by a fully connected hidden layer with 128
units": a quarter of the DQN network's widths (kenjyoung/MinAtar ``examples/dqn.py``,
``QNetwork``: ReLU after both layers, no padding, so the conv output is 16×8×8).
:class:`MinAtarCNN` is that torso; the recipes' builders (``torso="minatar"`` in
:func:`~ac_extensions.modules.make_actor_critic`,
:func:`~ac_extensions.modules.make_acer_actor` and
:func:`~ac_extensions.modules.make_reactor_actor`) put their heads on it.

Activation: ReLU, as the paper's DQN network. The repository's AC(λ) example
(``examples/AC_lambda.py``) uses the same layers with SiLU after the convolution and dSiLU
after the linear layer; ReLU is used here for every algorithm.
"""

from __future__ import annotations

from torch import Tensor, nn

MINATAR_SIZE = 10
"""Height and width of a MinAtar observation."""


class MinAtarCNN(nn.Module):
    """Conv 16×3×3 stride 1 → ReLU → flatten → linear 128 → ReLU (Young & Tian, 2019).

    Input ``[*B, C, 10, 10]`` channels-first (what
    :func:`~ac_extensions.runtime.envs.make_gym_env` returns for ``MinAtar/…`` ids; ``bool`` or
    integer maps are cast to float, values stay 0/1); output ``[*B, features]``. Leading batch
    dims (e.g. ``[B, T]``) are flattened for the convolution and restored. Weights are
    orthogonal with gain √2 and biases zero (the init of the package's MLPs; Andrychowicz et
    al., 2021, arXiv:2006.05990, §3.2).

    Args:
        in_channels: C, the game's number of channels.
        features: output width (128 in the paper).
        channels: convolution filters (16 in the paper).

    Example:
        >>> import torch
        >>> net = MinAtarCNN(4)
        >>> net(torch.zeros(2, 3, 4, 10, 10)).shape
        torch.Size([2, 3, 128])
        >>> sum(p.numel() for p in net.parameters())  # 4·16·9 + 16 + 16·8·8·128 + 128
        131792
    """

    def __init__(self, in_channels: int, features: int = 128, channels: int = 16) -> None:
        super().__init__()
        inner = MINATAR_SIZE - 2  # 3×3 kernel, no padding, stride 1: 10 → 8
        self.conv = nn.Conv2d(in_channels, channels, kernel_size=3, stride=1)
        self.linear = nn.Linear(channels * inner * inner, features)
        for layer in (self.conv, self.linear):
            nn.init.orthogonal_(layer.weight, 2**0.5)
            nn.init.zeros_(layer.bias)
        self.in_channels, self.features = in_channels, features

    def forward(self, observation: Tensor) -> Tensor:
        """``[*B, C, 10, 10]`` → ``[*B, features]``."""
        if observation.dim() < 3 or tuple(observation.shape[-3:]) != (
            self.in_channels,
            MINATAR_SIZE,
            MINATAR_SIZE,
        ):
            raise ValueError(
                f"MinAtarCNN: observation must have shape [*B, {self.in_channels}, 10, 10] "
                f"(channels first), got {list(observation.shape)}"
            )
        batch = observation.shape[:-3]
        x = observation.reshape(-1, *observation.shape[-3:])
        x = x if x.is_floating_point() else x.float()
        x = self.conv(x).relu().flatten(1)
        return self.linear(x).relu().reshape(*batch, self.features)


__all__ = ["MINATAR_SIZE", "MinAtarCNN"]
