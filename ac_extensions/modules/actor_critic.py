"""Actor-critic networks as TorchRL modules, feed-forward or recurrent (LSTM / GRU).

Feed-forward::

    observation ──► MLP ──► logits ──► Categorical ──► action, action_log_prob     (actor)
    observation ──► MLP ──► state_value                                              (critic)

Recurrent (one shared memory, as torch-ac's recurrent models)::

    observation ──► MLP ──► embed ──► LSTM/GRU ──► memory ──► linear ──► logits ──► action
                                         ▲  │                └──► linear ──► state_value
                 stored hidden state ────┘  └──► ("next", hidden state)

The recurrent module reads its hidden state from the TensorDict (written at collection by the
module itself and fed back through a ``TensorDictPrimer``) and resets it where ``is_init`` is
set (``InitTracker``): :func:`recurrent_env_transforms` builds both for an environment. In a
loss (recurrent mode) it runs over whole ``[B, T]`` sequences, starting from the stored hidden
state of each sequence's first step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.envs import Compose, InitTracker
from torchrl.modules import MLP, GRUModule, LSTMModule, ProbabilisticActor, ValueOperator
from torchrl.modules.utils import get_primers_from_module


def _orthogonal_init(module: nn.Module, gain: float) -> nn.Module:
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            nn.init.orthogonal_(layer.weight, gain)
            nn.init.zeros_(layer.bias)
    return module


def _mlp(in_features: int, out_features: int, hidden: Sequence[int], head_gain: float) -> nn.Module:
    net = MLP(
        in_features=in_features,
        out_features=out_features,
        num_cells=list(hidden),
        activation_class=nn.Tanh,
    )
    # Orthogonal init, √2 for hidden layers and a small gain on the policy head (Andrychowicz
    # et al., 2021, arXiv:2006.05990, §3.2; SB3's default for its MLP policies).
    _orthogonal_init(net, 2**0.5)
    last = [m for m in net.modules() if isinstance(m, nn.Linear)][-1]
    nn.init.orthogonal_(last.weight, head_gain)
    return net


def make_actor_critic(
    observation_dim: int,
    num_actions: int,
    *,
    hidden_sizes: Sequence[int] = (64, 64),
    recurrent: Literal["lstm", "gru"] | None = None,
    recurrent_size: int = 64,
    observation_key: str = "observation",
) -> tuple[ProbabilisticActor, TensorDictModule]:
    """Build a categorical actor and a state-value critic.

    Args:
        observation_dim: size of the (flat) observation.
        num_actions: number of discrete actions A.
        hidden_sizes: MLP widths (separate MLPs for actor and critic when feed-forward; one
            shared encoder before the memory when recurrent).
        recurrent: ``"lstm"`` or ``"gru"`` for a shared recurrent memory, ``None`` for an MLP.
        recurrent_size: hidden size of the memory.
        observation_key: the observation entry to read.

    Returns:
        ``(actor, critic)``: the actor writes ``logits``, ``action`` (an index, shape ``[*B]``)
        and ``action_log_prob``; the critic writes ``state_value`` (``[*B, 1]``).
    """
    if recurrent is None:
        actor_net = _mlp(observation_dim, num_actions, hidden_sizes, head_gain=0.01)
        critic_net = _mlp(observation_dim, 1, hidden_sizes, head_gain=1.0)
        actor_body = TensorDictModule(actor_net, [observation_key], ["logits"])
        critic = ValueOperator(critic_net, in_keys=[observation_key])
    else:
        encoder = TensorDictModule(
            _orthogonal_init(
                MLP(
                    in_features=observation_dim,
                    out_features=hidden_sizes[-1],
                    num_cells=list(hidden_sizes[:-1]),
                    activation_class=nn.Tanh,
                    activate_last_layer=True,
                ),
                2**0.5,
            ),
            [observation_key],
            ["embed"],
        )
        memory_cls = {"lstm": LSTMModule, "gru": GRUModule}[recurrent]
        memory = memory_cls(
            input_size=hidden_sizes[-1],
            hidden_size=recurrent_size,
            in_key="embed",
            out_key="memory",
        )
        policy_head = TensorDictModule(
            _orthogonal_init(nn.Linear(recurrent_size, num_actions), 0.01), ["memory"], ["logits"]
        )
        value_head = TensorDictModule(
            _orthogonal_init(nn.Linear(recurrent_size, 1), 1.0), ["memory"], ["state_value"]
        )
        actor_body = TensorDictSequential(encoder, memory, policy_head)
        critic = TensorDictSequential(encoder, memory, value_head)
    actor = ProbabilisticActor(
        actor_body,
        in_keys=["logits"],
        out_keys=["action"],
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
    )
    return actor, critic


def recurrent_env_transforms(policy: nn.Module) -> Compose:
    """The transforms a recurrent policy needs on its environment: ``InitTracker`` + primers.

    ``InitTracker`` writes ``is_init`` (where the hidden state is reset); the primers, collected
    from every ``LSTMModule`` / ``GRUModule`` inside ``policy``, make the environment carry the
    hidden state from one step to the next, so that the collector stores it (without them
    recurrence is silently lost: pytorch/rl#2327). Append the result to the env with
    ``env.append_transform(...)``.

    Args:
        policy: the actor (or any module containing the recurrent modules).

    Returns:
        A ``Compose`` of ``InitTracker`` and the primers.
    """
    primers = get_primers_from_module(policy)
    if primers is None:
        raise ValueError("the policy has no LSTMModule / GRUModule: it needs no primer")
    transforms = [InitTracker()]
    transforms.extend(primers.transforms if isinstance(primers, Compose) else [primers])
    return Compose(*transforms)
