"""Recognising TensorDict modules that are plain networks, for the losses' fast paths.

A loss's fast path calls the ``nn.Module`` inside a TensorDict wrapper directly on tensors,
skipping the wrapper's key plumbing (which costs more than a small network's arithmetic on
CPU). That gives the same result only for wrappers that do nothing but read one entry, call
the module, and write one entry; these helpers say which wrappers qualify, or why not.
"""

from __future__ import annotations

from tensordict.nn import (
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
    TensorDictModuleBase,
)
from tensordict.utils import NestedKey
from torch import nn
from torchrl.modules import ValueOperator


def plain_tensordict_module(module, *types) -> str | None:
    """Why ``module`` is not a plain one-in, one-out ``TensorDictModule`` over an nn.Module.

    Args:
        module: the wrapper to inspect.
        *types: the wrapper classes accepted (exactly, not their subclasses).

    Returns:
        ``None`` if it qualifies, else the reason.
    """
    if type(module) not in types:
        return f"{type(module).__name__} is not one of {[t.__name__ for t in types]}"
    if len(module.in_keys) != 1 or len(module.out_keys) != 1:
        return f"{type(module).__name__} does not map one entry to one entry"
    if module._kwargs is not None or module.method is not None or module.method_kwargs:
        return f"{type(module).__name__} calls its module with keyword arguments or a method"
    if not isinstance(module.module, nn.Module) or isinstance(module.module, TensorDictModuleBase):
        return f"{type(module).__name__} does not wrap a plain nn.Module"
    return None


def plain_network(
    wrapper, out_key: NestedKey
) -> tuple[nn.Module, NestedKey, tuple[nn.Module, ...]] | str:
    """The network inside ``wrapper`` that maps its one input to ``out_key``, or why not.

    Accepted: a plain ``TensorDictModule`` / ``ValueOperator`` (:func:`plain_tensordict_module`),
    or a ``ProbabilisticTensorDictSequential`` (e.g. TorchRL's ``ProbabilisticActor``) of such a
    module followed by its distribution module, whose distribution parameters
    (``get_dist_params``, what the losses read) are that module's output.

    Returns:
        ``(network, input key, wrappers)`` (the wrappers whose hooks the fast path would
        bypass), or the reason as a string.
    """
    wrappers: tuple[nn.Module, ...] = (wrapper,)
    body = wrapper
    if isinstance(wrapper, ProbabilisticTensorDictSequential):
        if len(wrapper.module) != 2 or not isinstance(
            wrapper.module[1], ProbabilisticTensorDictModule
        ):
            return "the actor is not a probabilistic sequence of a network and a distribution"
        if (
            wrapper.return_composite
            or type(wrapper).get_dist_params
            is not ProbabilisticTensorDictSequential.get_dist_params
        ):
            return "the actor computes its distribution parameters in its own way"
        body = wrapper.module[0]
        wrappers = (wrapper, *wrapper.module)
    reason = plain_tensordict_module(body, TensorDictModule, ValueOperator)
    if reason is not None:
        return reason
    if body.out_keys[0] != out_key:
        return f"it writes {body.out_keys[0]!r}, not {out_key!r}"
    return body.module, body.in_keys[0], wrappers


def has_hooks(wrappers) -> bool:
    """Whether any of ``wrappers`` has a forward (pre-)hook the fast path would skip."""
    return any(w._forward_hooks or w._forward_pre_hooks for w in wrappers)
