"""ACER's discrete network: one torso, a policy head and a Q head (Wang et al., 2017, §3, §5).

::

    observation ──► torso ──► features ──► [LSTM / GRU] ──► memory ──┬─► linear ──► logits
        (MLP, Nature CNN or MinAtar CNN)          ▲  │                └─► linear ──► action_value
               ("recurrent_state_*") stored ─────┘  └──► ("next", "recurrent_state_*")

The two heads share the torso (and the memory), as in the paper's Atari network and
openai/baselines' ``acer`` policies, so one forward pass gives π(·|x) and Q(x, ·). The module
is a TorchRL ``ProbabilisticActor`` (categorical on ``logits``) that also writes
``action_value``: pass it to :class:`~ac_extensions.objectives.ACERLoss` as the actor with
``qvalue_network=None`` and the loss reads Q from the same pass.

Recurrent torsos read their hidden state from the TensorDict; build the env with
:func:`~ac_extensions.modules.recurrent_env_transforms` so it is stored at collection, and the
loss (recurrent mode) replays whole ``[B, T]`` sequences from the state stored at their first
step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import Tensor, nn
from torchrl.modules import GRUModule, LSTMModule, ProbabilisticActor

from ac_extensions.modules.layers import mlp_torso
from ac_extensions.modules.minatar import MinAtarCNN


class NatureCNN(nn.Module):
    """The DQN Atari torso (Mnih et al., 2015, Nature 518, Methods "Model architecture").

    Conv 32×8×8 stride 4 → conv 64×4×4 stride 2 → conv 64×3×3 stride 1 → linear 512, ReLU
    after each. Input ``[*B, C, 84, 84]`` (``uint8`` frames are scaled to [0, 1]); output
    ``[*B, 512]``. Leading batch dims are flattened for the convolutions and restored.

    Args:
        in_channels: stacked frames C (4 for the usual frame stack).
        features: output width.

    Example:
        >>> net = NatureCNN(4)
        >>> net(torch.zeros(2, 3, 4, 84, 84, dtype=torch.uint8)).shape
        torch.Size([2, 3, 512])
    """

    def __init__(self, in_channels: int = 4, features: int = 512) -> None:
        super().__init__()
        self.convs = nn.Sequential(
            nn.Conv2d(in_channels, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
        )
        self.linear = nn.Sequential(nn.Linear(64 * 7 * 7, features), nn.ReLU())
        self.features = features

    def forward(self, observation: Tensor) -> Tensor:
        """``[*B, C, 84, 84]`` → ``[*B, features]``."""
        if observation.dim() < 3 or observation.shape[-2:] != (84, 84):
            raise ValueError(
                f"NatureCNN: observation must have shape [*B, C, 84, 84], got "
                f"{list(observation.shape)}"
            )
        batch = observation.shape[:-3]
        x = observation.reshape(-1, *observation.shape[-3:])
        x = x.float() / 255.0 if not x.is_floating_point() else x
        return self.linear(self.convs(x)).reshape(*batch, self.features)


class _Heads(nn.Module):
    """Two linear heads on shared features: (logits [*B, A], action values [*B, A])."""

    def __init__(self, in_features: int, num_actions: int) -> None:
        super().__init__()
        self.policy = nn.Linear(in_features, num_actions)
        self.qvalue = nn.Linear(in_features, num_actions)
        # Small policy head (near-uniform initial π; Andrychowicz et al., 2021, §3.2).
        nn.init.orthogonal_(self.policy.weight, 0.01)
        nn.init.zeros_(self.policy.bias)

    def forward(self, features: Tensor) -> tuple[Tensor, Tensor]:
        return self.policy(features), self.qvalue(features)


def make_acer_actor(
    observation_shape: int | Sequence[int],
    num_actions: int,
    *,
    torso: Literal["mlp", "cnn", "minatar"] = "mlp",
    hidden_sizes: Sequence[int] = (64, 64),
    recurrent: Literal["lstm", "gru"] | None = None,
    recurrent_size: int = 128,
    observation_key: str = "observation",
) -> ProbabilisticActor:
    """ACER's policy-plus-Q network for A discrete actions, as one TorchRL actor.

    Args:
        observation_shape: observation size (MLP torso), ``(C, 84, 84)`` (CNN torso) or
            ``(C, 10, 10)`` (MinAtar torso).
        num_actions: number of discrete actions A.
        torso: ``"mlp"`` (tanh MLP of ``hidden_sizes``), ``"cnn"`` (:class:`NatureCNN`, the
            paper's Atari torso) or ``"minatar"`` (:class:`~ac_extensions.modules.MinAtarCNN`,
            one 3×3 conv with 16 channels and 128 units; Young & Tian, 2019,
            arXiv:1903.03176). The policy and Q heads share it, as they share the Nature CNN.
        hidden_sizes: MLP widths (ignored by the convolutional torsos).
        recurrent: ``"lstm"`` or ``"gru"`` to put a memory after the torso; ``None``: none.
        recurrent_size: hidden size of the memory.
        observation_key: the observation entry to read.

    Returns:
        A ``ProbabilisticActor`` writing ``logits`` and ``action_value`` (both ``[*B, A]``),
        ``action`` (an index, ``[*B]``) and ``action_log_prob``; recurrent variants read and
        write ``recurrent_state_*`` (and need ``is_init``).

    Example:
        >>> from tensordict import TensorDict
        >>> actor = make_acer_actor(4, 2)
        >>> out = actor(TensorDict({"observation": torch.randn(3, 4)}, [3]))
        >>> out["logits"].shape, out["action_value"].shape, out["action"].shape
        (torch.Size([3, 2]), torch.Size([3, 2]), torch.Size([3]))
        >>> actor = make_acer_actor((4, 10, 10), 3, torso="minatar")
        >>> out = actor(TensorDict({"observation": torch.zeros(2, 5, 4, 10, 10)}, [2, 5]))
        >>> out["logits"].shape, out["action_value"].shape
        (torch.Size([2, 5, 3]), torch.Size([2, 5, 3]))
    """
    if torso == "mlp":
        dim = observation_shape if isinstance(observation_shape, int) else observation_shape[-1]
        body: nn.Module = mlp_torso(int(dim), hidden_sizes)
        width = hidden_sizes[-1] if hidden_sizes else int(dim)
    elif torso in ("cnn", "minatar"):
        if isinstance(observation_shape, int) or len(observation_shape) != 3:
            raise ValueError(f"torso={torso!r} needs observation_shape = (C, H, W)")
        cls = NatureCNN if torso == "cnn" else MinAtarCNN
        body = cls(int(observation_shape[0]))
        width = body.features
    else:
        raise ValueError(f"torso must be 'mlp', 'cnn' or 'minatar', got {torso!r}")
    modules = [TensorDictModule(body, [observation_key], ["features"])]
    head_key = "features"
    if recurrent is not None:
        if recurrent not in ("lstm", "gru"):
            raise ValueError(f"recurrent must be 'lstm', 'gru' or None, got {recurrent!r}")
        hidden = (
            ["recurrent_state_h", "recurrent_state_c"]
            if recurrent == "lstm"
            else ["recurrent_state"]
        )
        memory_cls = LSTMModule if recurrent == "lstm" else GRUModule
        modules.append(
            memory_cls(
                input_size=width,
                hidden_size=recurrent_size,
                in_keys=["features", *hidden],
                out_keys=["memory", *(("next", k) for k in hidden)],
            )
        )
        head_key, width = "memory", recurrent_size
    modules.append(
        TensorDictModule(_Heads(width, num_actions), [head_key], ["logits", "action_value"])
    )
    return ProbabilisticActor(
        TensorDictSequential(*modules),
        in_keys=["logits"],
        out_keys=["action"],
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
    )


__all__ = ["NatureCNN", "make_acer_actor"]
