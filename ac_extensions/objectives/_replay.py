"""Helpers shared by the losses that train on replayed sequences ``[*B, T]`` (ACER, Reactor)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import Tensor
from torchrl.modules import GRUModule, LSTMModule, set_recurrent_mode


def is_recurrent(*networks: torch.nn.Module | None) -> bool:
    """Whether any of ``networks`` holds a TorchRL ``LSTMModule`` or ``GRUModule``."""
    return any(
        isinstance(m, (LSTMModule, GRUModule))
        for net in networks
        if net is not None
        for m in net.modules()
    )


def next_step_outputs(
    tensordict: TensorDictBase,
    nxt: TensorDictBase,
    current: Sequence[Tensor],
    evaluate: Callable[[TensorDictBase], Sequence[Tensor]],
    in_keys: Iterable[NestedKey],
    done_key: NestedKey,
    recurrent: bool,
) -> tuple[Tensor, ...]:
    """Network outputs at x_{t+1}, shape [*B, T, ...] each, detached.

    ``evaluate(td)`` runs the networks on a TensorDict and returns their outputs; ``current``
    holds what it returned on ``tensordict`` itself (the outputs at x_t, same parameters).

    Recurrent networks: ``evaluate`` runs step by step (recurrent mode off) on ``nxt``, from the
    hidden states stored under ``("next", ...)`` at collection. Feed-forward networks: where the
    next row continues the stream (x_{t+1} is row t+1's observation: not done, not the last
    step, and the stored inputs agree) the outputs at x_t are shifted by one step; only the
    remaining next observations (episode ends, the window end) go through ``evaluate``. Any
    disagreement between row t+1's inputs and ``("next", ...)`` falls back to a full pass on
    ``nxt``.

    Args:
        tensordict: the input sequences, batch [*B, T] (time last).
        nxt: ``tensordict.get("next")``, batch [*B, T].
        current: outputs of ``evaluate(tensordict)``, each of shape [*B, T, ...].
        evaluate: the networks, TensorDict → outputs (same order as ``current``).
        in_keys: every input key of the networks.
        done_key: the done flag inside ``nxt``, shape [*B, T, 1].
        recurrent: whether the networks are recurrent.

    Returns:
        The outputs at x_{t+1}, same shapes as ``current``, detached.
    """
    if recurrent:
        with set_recurrent_mode(False):
            return tuple(out.detach() for out in evaluate(nxt))
    fresh = nxt.get(done_key).reshape(tensordict.batch_size).clone()  # [*B, T]
    fresh[..., -1] = True  # x_T must be computed here
    continues = ~fresh[..., :-1]  # [*B, T − 1]
    time_dim, steps = tensordict.batch_dims - 1, tensordict.batch_size[-1]
    for key in dict.fromkeys(in_keys):
        now, later = tensordict.get(key, None), nxt.get(key, None)
        if now is None or later is None or now.shape != later.shape:
            return tuple(out.detach() for out in evaluate(nxt))
        now, later = now.narrow(time_dim, 1, steps - 1), later.narrow(time_dim, 0, steps - 1)
        if not torch.equal(now[continues], later[continues]):
            return tuple(out.detach() for out in evaluate(nxt))
    computed = evaluate(nxt[fresh])  # [n, ...] each
    out = []
    for value_now, value_fresh in zip(current, computed, strict=True):
        tail = value_now.narrow(time_dim, steps - 1, 1)
        shifted = torch.cat([value_now.narrow(time_dim, 1, steps - 1), tail], time_dim).detach()
        shifted[fresh] = value_fresh.detach().to(shifted.dtype)
        out.append(shifted)
    return tuple(out)
