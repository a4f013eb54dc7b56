"""Recognising TensorDict modules that are plain networks, for the losses' fast paths.

A loss's fast path calls the ``nn.Module`` inside a TensorDict wrapper directly on tensors,
skipping the wrapper's key plumbing (which costs more than a small network's arithmetic on
CPU). That gives the same result only for wrappers that do nothing but read one entry, call
the module, and write one entry; these helpers say which wrappers qualify, or why not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tensordict import TensorDictBase
from tensordict.nn import (
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
    TensorDictModuleBase,
    TensorDictSequential,
)
from tensordict.utils import NestedKey
from torch import Tensor, nn
from torchrl.modules import ValueOperator


def plain_tensordict_module(
    module, *types, outputs: int | None = 1, inputs: int | None = 1
) -> str | None:
    """Why ``module`` is not a plain ``TensorDictModule`` over an nn.Module.

    Args:
        module: the wrapper to inspect.
        *types: the wrapper classes accepted (exactly, not their subclasses).
        outputs: the number of entries it must write (its module returns a tuple if > 1);
            ``None``: any number.
        inputs: the number of entries it must read (positional arguments of its module, in
            order); ``None``: any number.

    Returns:
        ``None`` if it qualifies, else the reason.
    """
    if type(module) not in types:
        return f"{type(module).__name__} is not one of {[t.__name__ for t in types]}"
    name = type(module).__name__
    if inputs is not None and len(module.in_keys) != inputs:
        return f"{name} reads {len(module.in_keys)} entries, not {inputs}"
    if outputs is not None and len(module.out_keys) != outputs:
        return f"{name} writes {len(module.out_keys)} entries, not {outputs}"
    if module._kwargs is not None or module.method is not None or module.method_kwargs:
        return f"{type(module).__name__} calls its module with keyword arguments or a method"
    if not isinstance(module.module, nn.Module) or isinstance(module.module, TensorDictModuleBase):
        return f"{type(module).__name__} does not wrap a plain nn.Module"
    return None


def _unwrap_actor(wrapper) -> tuple[nn.Module, tuple[nn.Module, ...]] | str:
    """The network module inside a probabilistic actor (or ``wrapper`` itself), or why not.

    A ``ProbabilisticTensorDictSequential`` (e.g. TorchRL's ``ProbabilisticActor``) qualifies
    when it is one network module followed by its distribution module and its distribution
    parameters (``get_dist_params``, what the losses read) are that module's outputs.

    Returns:
        ``(network module, wrappers)``: the wrappers whose hooks a fast path would bypass so
        far (the actor and its two modules, or ``wrapper`` alone); or the reason as a string.
    """
    if not isinstance(wrapper, ProbabilisticTensorDictSequential):
        return wrapper, (wrapper,)
    if len(wrapper.module) != 2 or not isinstance(wrapper.module[1], ProbabilisticTensorDictModule):
        return "the actor is not a probabilistic sequence of a network and a distribution"
    if wrapper.return_composite or (
        type(wrapper).get_dist_params is not ProbabilisticTensorDictSequential.get_dist_params
    ):
        return "the actor computes its distribution parameters in its own way"
    return wrapper.module[0], (wrapper, *wrapper.module)


def _network_parts(wrapper) -> tuple[list, tuple[nn.Module, ...]] | str:
    """The modules of the network inside ``wrapper`` (:func:`_unwrap_actor`), or why not.

    Returns:
        ``(modules, wrappers)``: the modules of an exact ``TensorDictSequential`` (else the
        network module alone), and the wrappers whose hooks a fast path would bypass (those
        modules included); or the reason as a string.
    """
    unwrapped = _unwrap_actor(wrapper)
    if isinstance(unwrapped, str):
        return unwrapped
    body, wrappers = unwrapped
    if type(body) is not TensorDictSequential:
        return [body], wrappers
    parts = list(body.module)
    if not parts:
        return "the network is an empty sequence"
    return parts, (*wrappers, *parts)


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
    unwrapped = _unwrap_actor(wrapper)
    if isinstance(unwrapped, str):
        return unwrapped
    body, wrappers = unwrapped
    reason = plain_tensordict_module(body, TensorDictModule, ValueOperator)
    if reason is not None:
        return reason
    if body.out_keys[0] != out_key:
        return f"it writes {body.out_keys[0]!r}, not {out_key!r}"
    return body.module, body.in_keys[0], wrappers


def plain_chain(
    wrapper, out_keys: list[NestedKey]
) -> tuple[tuple[nn.Module, ...], NestedKey, tuple[nn.Module, ...]] | str:
    """The networks inside ``wrapper`` that, called in turn, map its one input to ``out_keys``.

    For an actor that writes several entries in one pass, such as ACER's policy-plus-Q network
    (:func:`~ac_extensions.modules.make_acer_actor`: a torso module writing ``features``, then a
    head module writing ``logits`` and ``action_value``). Accepted: a
    ``ProbabilisticTensorDictSequential`` of one network part and its distribution module (as
    :func:`plain_network`), where the part is either one plain ``TensorDictModule`` writing
    ``out_keys``, or an exact ``TensorDictSequential`` of plain ``TensorDictModule`` wrappers,
    each reading the one entry the one before wrote, the last writing ``out_keys`` (its module
    returning them as a tuple, in that order).

    Returns:
        ``(networks, input key, wrappers)``: calling the networks one after the other on the
        input tensor gives the tuple of ``out_keys``; ``wrappers`` are the TensorDict modules
        whose hooks the fast path would bypass. Or the reason as a string.
    """
    if not isinstance(wrapper, ProbabilisticTensorDictSequential):
        return f"{type(wrapper).__name__} is not a probabilistic actor"
    split = _network_parts(wrapper)
    if isinstance(split, str):
        return split
    parts, wrappers = split
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        outputs = len(out_keys) if last else 1
        reason = plain_tensordict_module(part, TensorDictModule, outputs=outputs)
        if reason is not None:
            return f"part {index} of the actor's network: {reason}"
        if index and list(part.in_keys) != list(parts[index - 1].out_keys):
            return (
                f"part {index} of the actor's network reads {part.in_keys[0]!r}, not what "
                f"part {index - 1} writes ({parts[index - 1].out_keys[0]!r})"
            )
    if list(parts[-1].out_keys) != list(out_keys):
        return f"the actor's network writes {list(parts[-1].out_keys)}, not {list(out_keys)}"
    return tuple(p.module for p in parts), parts[0].in_keys[0], wrappers


class FastPathMixin:
    """``fast_path`` and :meth:`fast_path_blocker` of a loss with a fast path.

    The loss defines ``_fast_plan(tensordict)``: its plan for a ``[B, T]`` batch, or the
    reason (a string) why the fast path does not apply.
    """

    fast_path: bool = True
    """Take the fast path where it applies (``False``: always the general path)."""

    def fast_path_blocker(self, tensordict: TensorDictBase) -> str | None:
        """Why ``forward`` would not take the fast path on ``tensordict``, or ``None``.

        Args:
            tensordict: a batch as for ``forward``, ``[B, T]`` or ``[T]`` (not validated
                here).

        Returns:
            ``None`` when the fast path applies, else the first condition (the loss's class
            doc) that fails.
        """
        if not self.fast_path:
            return "fast_path is off"
        if tensordict.batch_dims == 1:
            tensordict = tensordict.unsqueeze(0)
        plan = self._fast_plan(tensordict)
        return plan if isinstance(plan, str) else None


def parameters_by_module(
    owner: nn.Module, modules: Sequence[nn.Module], params
) -> list[dict[str, Tensor]]:
    """``params`` of ``owner`` split into one ``{name: tensor}`` per submodule, by its own names.

    For ``torch.func.functional_call`` on each of ``modules`` (submodules of ``owner``) under
    parameters a TorchRL loss keeps for ``owner`` (e.g. its target or averaged parameters).

    Args:
        owner: the module ``params`` belong to.
        modules: submodules of ``owner``.
        params: a TensorDict of ``owner``'s parameters and buffers.
    """
    flat = params.flatten_keys(".")
    named = {id(m): name for name, m in owner.named_modules()}
    out = []
    for module in modules:
        prefix = named[id(module)] + "."
        out.append({n[len(prefix) :]: v for n, v in flat.items() if n.startswith(prefix)})
    return out


def has_hooks(wrappers) -> bool:
    """Whether any of ``wrappers`` has a forward (pre-)hook the fast path would skip."""
    return any(w._forward_hooks or w._forward_pre_hooks for w in wrappers)


@dataclass(frozen=True)
class PlainGraph:
    """Plain networks that read and write named entries, run on a dict of tensors.

    What a ``TensorDictSequential`` of plain ``TensorDictModule`` wrappers computes, without
    the TensorDicts: each step calls its module on the entries it reads (in order) and stores
    what it returns under the entries it writes. Built by :func:`plain_graph`.
    """

    steps: tuple[tuple[nn.Module, tuple[NestedKey, ...], tuple[NestedKey, ...]], ...]
    """(module, entries read, entries written), in the order the sequence runs them."""
    inputs: tuple[NestedKey, ...]
    """The entries read before any step writes them: what :meth:`run` needs."""
    wrappers: tuple[nn.Module, ...]
    """The TensorDict modules whose hooks running the graph bypasses."""
    owner: nn.Module
    """The module the graph came from (for :meth:`parameters_by_step`)."""

    def needed(self, outputs: Sequence[NestedKey]) -> tuple[int, ...]:
        """The indices of the steps that ``outputs`` depend on, in order."""
        wanted, kept = set(outputs), []
        for index in reversed(range(len(self.steps))):
            _, reads, writes = self.steps[index]
            if wanted.intersection(writes):
                kept.append(index)
                wanted.update(reads)
        return tuple(reversed(kept))

    def parameters_by_step(self, params) -> list[dict[str, Tensor]]:
        """``params`` as one ``{name: tensor}`` per step, by the step module's own names.

        Args:
            params: a TensorDict of :attr:`owner`'s parameters and buffers, as TorchRL's losses
                keep them (e.g. a loss's target parameters).
        """
        return parameters_by_module(self.owner, [step[0] for step in self.steps], params)

    def run(
        self,
        values: dict[NestedKey, Tensor],
        outputs: Sequence[NestedKey],
        params: list[dict[str, Tensor]] | None = None,
    ) -> tuple[Tensor, ...]:
        """The ``outputs`` computed from ``values`` (holding at least :attr:`inputs`).

        Only the steps the outputs depend on run. With ``params`` (from
        :meth:`parameters_by_step`) every step runs under them through
        ``torch.func.functional_call``; otherwise under its own parameters.
        """
        values = dict(values)
        for index in self.needed(outputs):
            module, reads, writes = self.steps[index]
            args = tuple(values[key] for key in reads)
            if params is None or not params[index]:
                result = module(*args)
            else:
                result = torch.func.functional_call(module, params[index], args)
            if len(writes) == 1:
                values[writes[0]] = result
            else:
                values.update(zip(writes, result, strict=True))
        return tuple(values[key] for key in outputs)


def plain_graph(wrapper, out_keys: Sequence[NestedKey]) -> PlainGraph | str:
    """The plain networks inside ``wrapper`` that compute ``out_keys``, or why not.

    For networks that are not one chain, such as Reactor's feed-forward network
    (:func:`~ac_extensions.modules.make_reactor_actor` with ``recurrent=False``: a torso, a
    gradient stop, a policy and a critic branch, then heads reading both). Accepted:
    ``wrapper`` is a plain ``TensorDictModule`` / ``ValueOperator``, an exact
    ``TensorDictSequential`` of plain ``TensorDictModule`` wrappers (any number of entries
    read and written each, the module called with the entries read, in order, and returning
    one tensor per entry written), or a ``ProbabilisticTensorDictSequential`` (e.g. TorchRL's
    ``ProbabilisticActor``) of one of those and its distribution module, whose distribution
    parameters are the network's outputs. No entry may be written by two steps.

    Returns:
        The :class:`PlainGraph`, or the reason as a string.
    """
    split = _network_parts(wrapper)
    if isinstance(split, str):
        return split
    parts, wrappers = split
    steps, inputs, written = [], [], set()
    for index, part in enumerate(parts):
        reason = plain_tensordict_module(
            part, TensorDictModule, ValueOperator, outputs=None, inputs=None
        )
        if reason is not None:
            return f"part {index} of the network: {reason}"
        reads, writes = tuple(part.in_keys), tuple(part.out_keys)
        for key in writes:
            if key in written:
                return f"part {index} of the network writes {key!r} again"
        inputs.extend(k for k in reads if k not in written and k not in inputs)
        written.update(writes)
        steps.append((part.module, reads, writes))
    missing = [key for key in out_keys if key not in written]
    if missing:
        return f"the network writes no {missing}"
    return PlainGraph(tuple(steps), tuple(inputs), wrappers, wrapper)
