"""What the losses on replayed sequences ``[*B, T]`` share: ACER, continuous ACER, Reactor.

:class:`ReplayedSequenceLoss` is their base: each loss reads prepare (:meth:`~ReplayedSequenceLoss.
_prepare`: input checks, a single sequence as a batch of one, burn-in, padding) → network
outputs (at x_t, and at x_{t+1} with :func:`next_step_outputs` or a joint pass) → targets and
losses from :mod:`ac_extensions.functional`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import Tensor, nn
from torchrl.modules import GRUModule, LSTMModule, set_recurrent_mode
from torchrl.objectives import LossModule

from ac_extensions.modules import recurrent_in_keys
from ac_extensions.objectives._sequence import valid_mask


def is_recurrent(*networks: torch.nn.Module | None) -> bool:
    """Whether any of ``networks`` holds a TorchRL ``LSTMModule`` or ``GRUModule``."""
    return any(
        isinstance(m, (LSTMModule, GRUModule))
        for net in networks
        if net is not None
        for m in net.modules()
    )


def holds_parameters(module: torch.nn.Module, params: TensorDictBase) -> bool:
    """Whether ``module``'s parameters are the very tensors of ``params`` (same objects).

    Then running the module under ``params.to_module(module)`` is the same as running it as
    it is, and the swap (a walk over every submodule, twice) can be skipped.
    """
    own = dict(module.named_parameters())
    flat = params.flatten_keys(".")
    if len(own) != len(flat.keys()):
        return False
    return all(flat.get(name, None) is value for name, value in own.items())


def run_under(
    network: torch.nn.Module, tensordict: TensorDictBase, params: TensorDictBase
) -> TensorDictBase:
    """Everything ``network`` writes on the inputs it reads, under ``params``; no sampling.

    A ``ProbabilisticActor`` returns its distribution parameters (``get_dist_params``), so
    replaying stored data does not overwrite ``action`` / ``action_log_prob``. When the module
    already holds ``params`` (:func:`holds_parameters`: the online parameters of a TorchRL
    loss) it runs as it is; otherwise ``params`` are swapped in for the call (target or
    averaged parameters).
    """
    inputs = tensordict.select(*network.in_keys, strict=False).copy()
    run = network.get_dist_params if hasattr(network, "get_dist_params") else network
    if holds_parameters(network, params):
        return run(inputs)
    with params.to_module(network):
        return run(inputs)


def next_step_plan(
    tensordict: TensorDictBase, nxt: TensorDictBase, in_keys: Iterable[NestedKey], done_key
) -> Tensor:
    """Which next observations a feed-forward network must evaluate itself, bool [*B, T].

    Where the next row continues the stream (x_{t+1} is row t + 1's observation: not done, not
    the last step, and the stored inputs agree) the outputs at x_t shifted by one step serve
    for x_{t+1}; the others (episode ends, the window end) are ``True``. Any disagreement
    between row t + 1's inputs and ``("next", ...)`` makes every step ``True`` (a full pass
    on ``nxt``).

    Args:
        tensordict: the input sequences, batch [*B, T] (time last).
        nxt: ``tensordict.get("next")``, batch [*B, T].
        in_keys: every input key of the networks.
        done_key: the done flag inside ``nxt``, shape [*B, T, 1].
    """
    keys = dict.fromkeys(in_keys)
    pairs = [(tensordict.get(key, None), nxt.get(key, None)) for key in keys]
    return fresh_next_steps(nxt.get(done_key), pairs)


def fresh_next_steps(done: Tensor, inputs: Iterable[tuple[Tensor | None, Tensor | None]]) -> Tensor:
    """:func:`next_step_plan` on tensors: which x_{t+1} need their own evaluation, bool [*B, T].

    Args:
        done: ``("next", done)``, shape [*B, T, 1] bool.
        inputs: for every network input, (its value at x_t, its value at x_{t+1}), each
            [*B, T, ...] (``None`` if missing: then every step is evaluated).
    """
    fresh = done.reshape(done.shape[:-1]).clone()  # [*B, T]
    fresh[..., -1] = True  # x_T must be computed here
    continues = ~fresh[..., :-1]  # [*B, T − 1]
    time_dim, steps = fresh.dim() - 1, fresh.shape[-1]
    for now, later in inputs:
        if now is None or later is None or now.shape != later.shape:
            return torch.ones_like(fresh)
        now, later = now.narrow(time_dim, 1, steps - 1), later.narrow(time_dim, 0, steps - 1)
        if not torch.equal(now[continues], later[continues]):
            return torch.ones_like(fresh)
    return fresh


def assemble_next(
    current: Sequence[Tensor], computed: Sequence[Tensor], fresh: Tensor
) -> tuple[Tensor, ...]:
    """Outputs at x_{t+1}: ``current`` shifted by one step, ``computed`` where ``fresh``.

    Args:
        current: outputs at x_t, each [*B, T, ...].
        computed: the outputs at the ``fresh`` next observations, each [n, ...] (n = the
            number of ``True`` entries of ``fresh``, in ``fresh``'s order).
        fresh: bool [*B, T], from :func:`next_step_plan`.

    Returns:
        The outputs at x_{t+1}, shapes as ``current``, detached.
    """
    time_dim = fresh.dim() - 1
    steps = fresh.shape[-1]
    out = []
    for value_now, value_fresh in zip(current, computed, strict=True):
        tail = value_now.narrow(time_dim, steps - 1, 1)
        shifted = torch.cat([value_now.narrow(time_dim, 1, steps - 1), tail], time_dim).detach()
        shifted[fresh] = value_fresh.detach().to(shifted.dtype)
        out.append(shifted)
    return tuple(out)


def joint_inputs(
    tensordict: TensorDictBase, nxt: TensorDictBase, fresh: Tensor, in_keys: Iterable[NestedKey]
) -> TensorDictBase:
    """The inputs at x_t and at the ``fresh`` x_{t+1} as one flat batch [B·T + n].

    A feed-forward network then runs once for both (one pass instead of two: the per-call
    overhead of TensorDict modules dominates small networks); split its outputs with
    :func:`split_joint`.
    """
    keys = list(dict.fromkeys(in_keys))
    now = tensordict.select(*keys).reshape(-1)
    later = nxt.select(*keys)[fresh]
    return torch.cat([now, later], 0)


def split_joint(value: Tensor, batch: torch.Size) -> tuple[Tensor, Tensor]:
    """A joint pass's output [B·T + n, ...] as ([*B, T, ...], [n, ...])."""
    size = batch.numel()
    return value[:size].unflatten(0, batch), value[size:]


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
    hidden states stored under ``("next", ...)`` at collection. Feed-forward networks: the
    outputs at x_t shifted by one step where the stream continues, ``evaluate`` on the others
    (:func:`next_step_plan`, :func:`assemble_next`).

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
    fresh = next_step_plan(tensordict, nxt, in_keys, done_key)
    return assemble_next(current, evaluate(nxt[fresh]), fresh)


def unrolled_next_outputs(
    nxt: TensorDictBase,
    current: Sequence[Tensor],
    passes: Sequence[TensorDictBase],
    evaluate: Callable[[Sequence[TensorDictBase]], Sequence[Tensor]],
    recurrent_keys: Iterable[NestedKey],
    done_key: NestedKey,
) -> tuple[Tensor, ...]:
    """Recurrent network outputs at x_{t+1} from the pass over the window, [*B, T, ...] each.

    Where the episode goes on, x_{t+1} is row t + 1, whose outputs the pass already holds
    (``current`` shifted by one step). At every done step and at the window's last step,
    x_{t+1} is ``("next", ...)`` (a truncated episode's final observation, or x_T): the
    networks run one step on it from the state the pass reached after step t, which TorchRL's
    recurrent modules write under ``("next", state)`` at the last step of each episode inside
    the window (they split the window at ``is_init``). So burn-in and weight changes refresh
    the bootstrap states as well as the predictions, and no state stored at collection under
    ``("next", ...)`` is read.

    Args:
        nxt: ``tensordict.get("next")``, batch [*B, T].
        current: the outputs at x_t, each [*B, T, ...].
        passes: the passes over the window (recurrent mode) whose reached states feed the
            step, each holding ``("next", key)`` for some of ``recurrent_keys``.
        evaluate: one step TensorDict per pass (the inputs at x_{t+1} with that pass's
            states) → the outputs, in ``current``'s order (run in sequential mode).
        recurrent_keys: the hidden-state keys of the networks (``is_init`` is set False: the
            step continues the episode).
        done_key: the done flag inside ``nxt``, shape [*B, T, 1].

    Returns:
        The outputs at x_{t+1}, shapes as ``current``, detached.
    """
    ends = nxt.get(done_key).reshape(nxt.batch_size).clone()  # [*B, T]
    ends[..., -1] = True
    inputs = nxt[ends]  # [n]
    continuing = torch.zeros(*inputs.batch_size, 1, dtype=torch.bool, device=inputs.device)
    step_inputs = []
    for pass_out in passes:
        step = inputs.clone(recurse=False)
        for key in recurrent_keys:
            if key == "is_init":
                step.set(key, continuing)
                continue
            reached = pass_out.get(("next", key), None)
            if reached is not None:
                step.set(key, reached[ends])
        step_inputs.append(step)
    with torch.no_grad(), set_recurrent_mode(False):
        computed = evaluate(step_inputs)
    return assemble_next(current, computed, ends)  # row t + 1's outputs elsewhere


SEQUENCE_ID_KEYS: tuple[NestedKey, ...] = (("replay", "sequence"),)
"""Per-row sequence ids (``ac_extensions.runtime.label_sequences``, the recipes' slice-sampler
key): a [T] input holding several is a flat sample of several sequences, not one sequence.
(TorchRL's ``("collector", "traj_ids")`` is no such signal: one collector row, a contiguous
stream, legitimately spans several episodes.)"""


def check_sequence_batch(name: str, tensordict: TensorDictBase, flags: Iterable[NestedKey]) -> None:
    """Raise for the two input mistakes the sequence losses cannot survive silently.

    * A flat sample ``[B·L]`` of several sequences (a replay sample not reshaped to
      ``[B, L]``): a 1-D input is read as *one* sequence [T], so its traces would run from one
      sequence into the next. Detected from the sequence ids of :data:`SEQUENCE_ID_KEYS`.
    * ``("next", done)`` / ``("next", terminated)`` that are not bool of shape [*B, T, 1].

    Args:
        name: the loss's class name, for the messages.
        tensordict: the input, batch [*B, T] or [T].
        flags: the done and terminated keys (inside ``("next", ...)``).
    """
    batch = tensordict.batch_size
    if len(batch) == 1:
        for key in SEQUENCE_ID_KEYS:
            ids = tensordict.get(key, None)
            if isinstance(ids, Tensor) and ids.numel() and bool((ids != ids.flatten()[0]).any()):
                count = int(torch.unique(ids).numel())
                raise ValueError(
                    f"{name}: the input has batch shape {list(batch)} but {key!r} holds "
                    f"{count} different sequences: a [T] input is one sequence. Reshape a flat "
                    f"replay sample to [B, L] first (e.g. sample.reshape(-1, L))"
                )
    for key in flags:
        value = tensordict.get(("next", key), None)
        if value is None:
            continue
        if value.dtype != torch.bool or value.shape != (*batch, 1):
            raise ValueError(
                f"{name}: ('next', {key!r}) must be bool of shape {[*batch, 1]}, got "
                f"{value.dtype} of shape {list(value.shape)}"
            )


def cut_traces_at_padding(
    tensordict: TensorDictBase, mask: Tensor | None, done_key: NestedKey
) -> TensorDictBase:
    """End every trace at the last valid step of a row: padding is never read by a target.

    TorchRL's ``split_trajectories`` (and a slice sampler's ``strict_length=False``) pads a
    trajectory cut short by the batch end after a step that is *not* done. Retrace-style
    targets read step t + 1 wherever ``done`` is unset, so without this the targets of the
    last valid steps would mix in the padding. Here ``("next", done)`` of a shallow copy is also
    set at the last valid step of each run of valid steps and at every padded step:
    d̃_t = d_t ∨ ¬m_t ∨ ¬m_{t+1} (m_T = 0). ``terminated`` is left alone, so a trajectory cut
    by the batch end still bootstraps from its own next observation, V(x_{t+1}) read from
    ``("next", ...)``, exactly as at the window end.

    Args:
        tensordict: sequences, batch [*B, T] (time last).
        mask: the valid steps m, shape [*B, T] (``valid_mask``); None: nothing to cut.
        done_key: the done flag inside ``("next", ...)``, shape [*B, T, 1] bool.

    Returns:
        ``tensordict`` itself when ``mask`` is None, else a shallow copy with the new
        ``("next", done_key)`` (the input is not modified).
    """
    if mask is None:
        return tensordict
    nxt = tensordict.get("next")
    done = nxt.get(done_key)  # [*B, T, 1]
    valid = mask.reshape(done.shape[:-1])  # m_t                                 [*B, T]
    following = torch.cat([valid[..., 1:], torch.zeros_like(valid[..., :1])], -1)  # m_{t+1}
    ends = (~valid | ~following).unsqueeze(-1)  # padded, or the last valid step  [*B, T, 1]
    out = tensordict.clone(recurse=False)
    nxt = nxt.clone(recurse=False)
    nxt.set(done_key, done | ends)
    out.set("next", nxt)
    return out


def check_burn_in(steps: int, time: int) -> None:
    """Raise unless 0 <= ``steps`` < ``time`` (T): burn-in must leave steps to learn from."""
    if not 0 <= steps < time:
        raise ValueError(f"burn-in needs 0 <= steps < T = {time}, got steps = {steps}")


def burn_in(
    tensordict: TensorDictBase,
    steps: int,
    run: Callable[[TensorDictBase], TensorDictBase],
    hidden_keys: Sequence[NestedKey],
    init_key: NestedKey = "is_init",
) -> TensorDictBase:
    """Warm the recurrent state up on the first ``steps`` steps, then drop them.

    The hidden state stored with a replayed sequence was computed by the network that acted,
    which may be many updates old. Burn-in (Kapturowski et al., 2019, "Recurrent Experience
    Replay in Distributed RL", ICLR, §3) runs the current recurrent networks over a prefix of
    the sequence, without gradient, from the stored state at its first step, and starts the
    rest of the sequence from the state reached: h_{steps} ← f_θ(x_{0..steps−1}; h_0^stored).
    Where the rest starts a new episode (``is_init`` at its first step) its own stored (reset)
    state is kept. The losses then see only the remaining T − ``steps`` steps.

    Args:
        tensordict: sequences, batch [*B, T] (time last), holding the networks' inputs, the
            stored hidden states (each [*B, T, *H]) and ``init_key`` ([*B, T, 1] bool).
        steps: burn-in length, 0 ≤ ``steps`` < T (0 returns ``tensordict`` itself).
        run: the recurrent networks, TensorDict → TensorDict holding ``("next", key)`` for
            every hidden key (what TorchRL's ``LSTMModule`` / ``GRUModule`` write); called once
            on the prefix [*B, steps] in recurrent mode.
        hidden_keys: the stored hidden-state keys (the recurrent modules' ``in_keys[1:]``
            without ``is_init``).
        init_key: the episode-start flag.

    Returns:
        The last T − ``steps`` steps, batch [*B, T − steps], with the burned-in hidden state at
        their first step (a new TensorDict; the input is not modified).
    """
    check_burn_in(steps, tensordict.batch_size[-1])
    if steps == 0:
        return tensordict
    for key in (init_key, *hidden_keys):
        if tensordict.get(key, None) is None:
            raise KeyError(
                f"burn-in needs {key!r} in the input (batch_size {list(tensordict.batch_size)}):"
                " the recurrent state and is_init stored at collection"
            )
    time_dim = tensordict.batch_dims - 1
    with torch.no_grad(), set_recurrent_mode(True):
        reached = run(tensordict[..., :steps])
    rest = tensordict[..., steps:].clone(recurse=False)
    start = rest.get(init_key).select(time_dim, 0).reshape(rest.batch_size[:-1])  # [*B]
    for key in hidden_keys:
        stored = rest.get(key)  # [*B, T − steps, *H]
        warm = reached.get(("next", key)).select(time_dim, steps - 1)  # [*B, *H]
        keep = start.reshape(*start.shape, *([1] * (warm.dim() - start.dim())))
        hidden = stored.clone()
        hidden.select(time_dim, 0).copy_(torch.where(keep, stored.select(time_dim, 0), warm))
        rest.set(key, hidden)
    return rest


def restart_after_ends(tensordict: TensorDictBase, done_key: NestedKey) -> TensorDictBase:
    """Set ``is_init`` after every ``done`` step, so a recurrent pass ends its episode there.

    Collected data has it already (a reset follows every end). A padded window cut short by
    :func:`cut_traces_at_padding` does not: there the recurrent modules would run on into the
    padding, and :func:`unrolled_next_outputs` would find no state written at the last valid
    step. is_init_{t+1} ← is_init_{t+1} ∨ done_t, on a shallow copy (the input is untouched).

    Args:
        tensordict: sequences, batch [*B, T], with ``is_init`` [*B, T, 1] (else returned as is).
        done_key: the done flag inside ``("next", ...)``, shape [*B, T, 1].
    """
    is_init = tensordict.get("is_init", None)
    if is_init is None:
        return tensordict
    done = tensordict.get(("next", done_key))  # [*B, T, 1]
    init = is_init.reshape(done.shape[:-1])  # [*B, T]
    restart = init | torch.cat([torch.zeros_like(init[..., :1]), done[..., :-1, 0]], -1)
    if torch.equal(restart, init):
        return tensordict
    return tensordict.clone(recurse=False).set("is_init", restart.reshape(is_init.shape))


@dataclass
class PreparedSequences:
    """A loss's input after :meth:`ReplayedSequenceLoss._prepare`."""

    td: TensorDictBase  # [B, T]: burned-in, traces cut at padding (a [T] input as [1, T])
    mask: Tensor | None  # the valid (unpadded) steps, bool [B, T]; None: every step
    single: bool  # the input was one sequence [T]


class ReplayedSequenceLoss(LossModule):
    """Base of the losses on replayed sequences: the steps before their math, in one place.

    Subclasses call :meth:`_init_sequences` in ``__init__``, implement :meth:`_check_input`
    (and :meth:`_run_networks` when they take ``burn_in``), and start ``forward`` with
    :meth:`_prepare`.
    """

    burn_in: int = 0
    """Recurrent networks: the first ``burn_in`` steps of each sequence only warm the memories
    up (:func:`burn_in`); the losses see the other T − ``burn_in``."""

    def _init_sequences(self, networks: Sequence[nn.Module | None], burn_in: int = 0) -> None:
        """Record the networks' recurrence and check ``burn_in`` (an int, 0 unless recurrent)."""
        self._recurrent = is_recurrent(*networks)
        if type(burn_in) is not int or burn_in < 0 or (burn_in and not self._recurrent):
            raise ValueError(
                f"burn_in must be an int >= 0, and > 0 only with a recurrent network; got "
                f"{burn_in!r} (recurrent: {self._recurrent})"
            )
        self.burn_in = burn_in
        self._recurrent_keys = recurrent_in_keys(*networks)
        self._hidden_keys = [k for k in self._recurrent_keys if k != "is_init"]

    def _check_input(self, tensordict: TensorDictBase) -> None:
        """Raise for a bad input (naming the key, the expected and the actual shape)."""
        raise NotImplementedError

    def _check_next_inputs(self, tensordict: TensorDictBase) -> None:
        """Raise a ``KeyError`` naming a network input missing under ``"next"``.

        The networks run on ``("next", ...)`` for the bootstrap values; recurrent hidden states
        are checked with the recurrent inputs.
        """
        recurrent = set(recurrent_in_keys(self.actor_network))
        for key in self.actor_network.in_keys:
            nested = ("next", *((key,) if isinstance(key, str) else key))
            if key not in recurrent and tensordict.get(nested, None) is None:
                raise KeyError(
                    f"{type(self).__name__}: the input (batch_size "
                    f"{list(tensordict.batch_size)}) has no key {nested!r}, the next step's "
                    f"input of the networks (the bootstrap values need it)"
                )

    def _run_networks(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Everything the current networks write (burn-in reads their new hidden states)."""
        raise NotImplementedError

    def _prepare(self, tensordict: TensorDictBase) -> PreparedSequences:
        """Check the input, make a [T] input [1, T], burn in, and cut the traces at padding.

        Padded steps (``("collector", "mask")``, see :func:`valid_mask`) end the traces, so that
        no target reads past a row's last valid step (:func:`cut_traces_at_padding`).
        """
        if tensordict.batch_dims == 0:
            raise ValueError(f"{type(self).__name__}: the input needs a batch shape [T] or [B, T]")
        check_burn_in(self.burn_in, tensordict.batch_size[-1])  # before the key checks
        self._check_input(tensordict)
        self._check_next_inputs(tensordict)
        single = tensordict.batch_dims == 1
        if single:
            tensordict = tensordict.unsqueeze(0)
        if self.burn_in:
            tensordict = burn_in(tensordict, self.burn_in, self._run_networks, self._hidden_keys)
        mask = valid_mask(self, tensordict)
        tensordict = cut_traces_at_padding(tensordict, mask, self.tensor_keys.done)
        if self._recurrent:
            tensordict = restart_after_ends(tensordict, self.tensor_keys.done)
        return PreparedSequences(tensordict, mask, single)
