"""Recognising TensorDict modules that are plain networks, for the losses' fast paths.

A loss's fast path calls the ``nn.Module`` inside a TensorDict wrapper directly on tensors,
skipping the wrapper's key plumbing (which costs more than a small network's arithmetic on
CPU). That gives the same result only for wrappers that do nothing but read entries, call
the module on them and write what it returns; these helpers say which wrappers qualify, or
why not (:func:`plain_graph`), and run them on dicts of tensors (:class:`PlainGraph`,
:class:`PlainActorCritic`).
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

from ac_extensions.objectives._replay import holds_parameters


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
        flat = params.flatten_keys(".")
        named = {id(m): name for name, m in self.owner.named_modules()}
        out = []
        for module, _, _ in self.steps:
            prefix = named[id(module)] + "."
            out.append({n[len(prefix) :]: v for n, v in flat.items() if n.startswith(prefix)})
        return out

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


@dataclass(frozen=True)
class PlainActorCritic:
    """A loss's actor and critic as :class:`PlainGraph`s, with the inputs of one batch.

    What ACER's and Reactor's fast paths share: the actor writes the policy logits, the
    critic its output (Q values, or their distribution); one network writing both is one
    graph (``critic is actor``). Built by :func:`plain_actor_critic`.
    """

    actor: PlainGraph
    """Writes :attr:`logits_key` (and, shared, :attr:`critic_key`)."""
    critic: PlainGraph
    """Writes :attr:`critic_key` (the actor's graph if one network writes both)."""
    logits_key: NestedKey
    critic_key: NestedKey

    @property
    def inputs(self) -> tuple[NestedKey, ...]:
        """Every entry either graph reads before writing it (actor's first), once each."""
        return tuple(dict.fromkeys((*self.actor.inputs, *self.critic.inputs)))

    def input_pairs(
        self, tensordict: TensorDictBase
    ) -> dict[NestedKey, tuple[Tensor, Tensor]] | str:
        """Each input at x_t and at x_{t+1} (``("next", key)``), or why they do not qualify.

        Args:
            tensordict: a batch ``[*B, T]`` with a ``"next"`` sub-TensorDict.

        Returns:
            ``{key: (value [*B, T, ...], next value [*B, T, ...])}``, or the reason: an input
            missing or not a tensor with the batch's leading shape.
        """
        nxt, batch = tensordict.get("next"), tensordict.batch_size
        pairs = {}
        for key in self.inputs:
            now, later = tensordict.get(key, None), nxt.get(key, None)
            for value in (now, later):
                if not isinstance(value, Tensor) or value.shape[: len(batch)] != batch:
                    return f"the network input {key!r} is not a tensor of batch shape {batch}"
            pairs[key] = (now, later)
        return pairs

    def online(self, values: dict[NestedKey, Tensor]) -> tuple[Tensor, Tensor]:
        """Policy logits and the critic's output of the online networks.

        Returns ``[N, A]`` logits and ``[N, A]`` Q values (or ``[N, A, atoms]`` logits of
        their distributions).

        Args:
            values: every entry in :attr:`inputs`, each ``[N, ...]`` (e.g. from
                :func:`joint_values`).
        """
        if self.critic is self.actor:
            logits, critic = self.actor.run(values, [self.logits_key, self.critic_key])
            return logits, critic
        (logits,) = self.actor.run(values, [self.logits_key])
        (critic,) = self.critic.run(values, [self.critic_key])
        return logits, critic

    def logits(self, values: dict[NestedKey, Tensor], params: list[dict] | None = None) -> Tensor:
        """The policy logits ``[N, A]`` from ``values`` (``[N, ...]`` each).

        Only the steps they depend on run. With ``params``
        (:meth:`PlainGraph.parameters_by_step` of :attr:`actor`) the steps run under them;
        otherwise under their own parameters.
        """
        return self.actor.run(values, [self.logits_key], params)[0]

    def critic_output(
        self, values: dict[NestedKey, Tensor], params: list[dict] | None = None
    ) -> Tensor:
        """The critic's output ``[N, A(, atoms)]`` from ``values`` (``[N, ...]`` each).

        Only the steps it depends on run. With ``params``
        (:meth:`PlainGraph.parameters_by_step` of :attr:`critic`) the steps run under them;
        otherwise under their own parameters.
        """
        return self.critic.run(values, [self.critic_key], params)[0]


def plain_actor_critic(
    actor_network,
    critic_network,
    logits_key: NestedKey,
    critic_key: NestedKey,
    actor_params,
    critic_params,
    critic_name: str = "critic",
) -> PlainActorCritic | str:
    """The actor and critic of a loss as plain graphs (:func:`plain_graph`), or why not.

    Args:
        actor_network: the loss's actor (writing ``logits_key``, and ``critic_key`` as well
            when ``critic_network`` is ``None``).
        critic_network: the loss's critic writing ``critic_key``, or ``None`` (one network).
        logits_key: the entry of the policy logits.
        critic_key: the entry of the critic's output.
        actor_params: the loss's parameters of ``actor_network`` (a TensorDict).
        critic_params: the loss's parameters of ``critic_network`` (ignored when ``None``).
        critic_name: what the reasons call the critic (e.g. ``"Q network"``).

    Returns:
        The :class:`PlainActorCritic`, or the reason (a part that is not plain, an output
        nobody writes, a forward hook on a wrapper the fast path would bypass, the loss's
        parameters not being the networks' own) as a string.
    """
    if critic_network is None:
        actor = plain_graph(actor_network, [logits_key, critic_key])
        if isinstance(actor, str):
            return f"actor (writing the {critic_name}'s output): {actor}"
        critic = actor
    else:
        actor = plain_graph(actor_network, [logits_key])
        if isinstance(actor, str):
            return f"actor: {actor}"
        critic = plain_graph(critic_network, [critic_key])
        if isinstance(critic, str):
            return f"{critic_name}: {critic}"
    if has_hooks((*actor.wrappers, *critic.wrappers)):
        return "a TensorDict wrapper of the networks has forward hooks"
    owned = critic_network is None or holds_parameters(critic_network, critic_params)
    if not (owned and holds_parameters(actor_network, actor_params)):
        return "the loss's parameters are not its networks' own"
    return PlainActorCritic(actor, critic, logits_key, critic_key)


def joint_values(
    pairs: dict[NestedKey, tuple[Tensor, Tensor]], fresh: Tensor, batch: torch.Size
) -> dict[NestedKey, Tensor]:
    """Every input at x_t and at the ``fresh`` x_{t+1} as one flat batch [B·T + n, ...].

    Args:
        pairs: from :meth:`PlainActorCritic.input_pairs`.
        fresh: bool [*B, T], the next steps that need their own pass
            (:func:`~ac_extensions.objectives._replay.fresh_next_steps`).
        batch: the batch shape [*B, T].
    """
    return {
        key: torch.cat([now.flatten(0, len(batch) - 1), later[fresh]], 0)
        for key, (now, later) in pairs.items()
    }
