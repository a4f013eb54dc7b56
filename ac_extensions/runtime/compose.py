"""Helpers for a pipeline composed from TorchRL's own parts around one of our losses.

* :class:`BehaviorPolicy`: wraps any actor so that what it writes at collection is what the
  off-policy losses read back from a replay: µ's distribution parameters under
  ``("behavior", ...)`` (ACER needs µ's whole distribution, not only log µ(a_t|x_t)) and
  ``action_log_prob`` (Reactor's log µ(a_t|x_t)).
* :func:`check_action_encoding`: one reset and one policy call that fail with a one-line error
  when the policy's actions do not match the env's action spec. The trap it catches:
  ``torchrl.envs.GymEnv`` gives a discrete gymnasium env a **one-hot** action spec unless it
  is built with ``categorical_action_encoding=True``; a categorical actor (ours, or TorchRL's
  ``ProbabilisticActor`` with ``Categorical``) writes an action **index** of shape [*B], and
  the env converts it with ``argmax(-1)``, so every env step silently takes action 0 (with a
  batch of E envs, the argmax over the E indices is taken instead, one action for all of them).

Rows into replayable sequences: :func:`~ac_extensions.runtime.label_sequences`. Priorities
back into a prioritized sampler: TorchRL's ``rb.update_tensordict_priority(sample)`` on the
``[B, L]`` sample the loss wrote ``"td_error"`` into needs nothing more (it reduces each
sequence to one priority). Stopping a collector without TorchRL's exit hang:
:func:`~ac_extensions.runtime.shutdown_collector`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import NestedKey, TensorDictBase
from tensordict.nn import ProbabilisticTensorDictSequential, TensorDictModuleBase
from torch import nn
from torchrl.data import Categorical, OneHot, TensorSpec
from torchrl.envs import EnvBase, ExplorationType, set_exploration_type

__all__ = ["BehaviorPolicy", "action_encoding_error", "check_action_encoding"]

_STATISTICS = ("logits", "probs", "loc", "scale")
"""Distribution parameters recognised among a policy's ``out_keys`` when it is no
``ProbabilisticActor`` (e.g. :func:`~ac_extensions.modules.collection_policy`'s fast path)."""


def action_encoding_error(
    spec: TensorSpec, action: torch.Tensor, batch_shape: Sequence[int], key: NestedKey = "action"
) -> str | None:
    """Why ``action`` does not fit the env's action ``spec``, in one line; ``None`` if it does.

    Compares the action's trailing shape (after the env's ``batch_shape``) with the spec's: a
    ``OneHot`` spec expects ``[*B, A]`` one-hot vectors, a ``Categorical`` spec ``[*B]``
    indices, any other spec its own trailing shape. The message names ``key``, the spec's
    encoding, the expected and the actual shape and dtype, and the fix for the one-hot trap.

    Args:
        spec: the env's spec for ``key`` (``env.full_action_spec[key]``), with the env's batch
            dims.
        action: what the policy wrote under ``key``, shape [*B, ...].
        batch_shape: the env's batch shape [*B] (``env.batch_size``).
        key: the action entry, for the message.

    Returns:
        The message, or ``None`` when the shapes agree.

    Example:
        >>> spec = OneHot(2)  # GymEnv("CartPole-v1")'s default encoding
        >>> print(action_encoding_error(spec, torch.tensor(1), ()))  # doctest: +ELLIPSIS
        action: the env's action spec is OneHot (one-hot vectors of shape [*B, 2] = [2]) but ...
        >>> action_encoding_error(spec, torch.tensor([0, 1]), ()) is None
        True
    """
    batch = tuple(batch_shape)
    batched = tuple(spec.shape[: len(batch)]) == batch  # the spec may carry the batch dims
    if isinstance(spec, OneHot):
        expected: tuple[int, ...] = (int(spec.space.n),)
    elif isinstance(spec, Categorical):
        expected = tuple(spec.shape[len(batch) :]) if batched else ()
    else:
        expected = tuple(spec.shape[len(batch) :] if batched else spec.shape)
    actual = (
        tuple(action.shape[len(batch) :]) if tuple(action.shape[: len(batch)]) == batch else None
    )
    if actual == expected:
        return None
    got = f"shape {list(action.shape)} ({action.dtype})"
    if isinstance(spec, OneHot):
        what = "an index" if actual == () else "a tensor"
        return (
            f"{_name(key)}: the env's action spec is OneHot (one-hot vectors of shape "
            f"[*B, {expected[-1]}] = {[*batch, *expected]}) but the policy wrote {what} of "
            f"{got}; the env would take argmax(-1) of it, i.e. always action 0: build the env "
            "with GymEnv(..., categorical_action_encoding=True) for an index-writing actor"
        )
    if isinstance(spec, Categorical):
        what = "one-hot vectors" if actual is not None and len(actual) == 1 else "a tensor"
        return (
            f"{_name(key)}: the env's action spec is Categorical (indices of shape [*B] = "
            f"{list(batch)}) but the policy wrote {what} of {got}: use an index-writing actor "
            "(Categorical distribution) or an env with one-hot actions"
        )
    return (
        f"{_name(key)}: the env's action spec ({type(spec).__name__}) expects shape "
        f"{[*batch, *expected]} but the policy wrote {got}"
    )


def _name(key: NestedKey) -> str:
    return repr(key) if isinstance(key, tuple) else str(key)


@torch.no_grad()
def check_action_encoding(env: EnvBase, policy: nn.Module, action_key: NestedKey = "action"):
    """Run ``policy`` once on ``env.reset()`` and raise if its action does not fit the env.

    Call it before starting a collector: the one-hot trap (an index-writing actor on
    ``GymEnv``'s default one-hot actions) otherwise trains on an env that always takes action
    0, with no error anywhere. The policy runs with ``ExplorationType.RANDOM``, as collectors
    run it; the env is stepped not at all.

    Args:
        env: the env the collector will step (or one built by the same factory).
        policy: the collection policy.
        action_key: the action entry.

    Returns:
        The policy's output on the reset TensorDict (batch ``env.batch_size``).

    Raises:
        ValueError: the action's shape does not fit ``env.full_action_spec[action_key]`` (see
            :func:`action_encoding_error` for the message).

    Example:
        >>> from torchrl.envs import GymEnv
        >>> from ac_extensions.modules import make_actor_critic
        >>> actor, _ = make_actor_critic(4, 2)
        >>> check_action_encoding(GymEnv("CartPole-v1"), actor)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: action: the env's action spec is OneHot (one-hot vectors of shape [*B, 2] ...
        >>> out = check_action_encoding(GymEnv("CartPole-v1", categorical_action_encoding=True),
        ...                             actor)
        >>> out["action"].shape
        torch.Size([])
    """
    with set_exploration_type(ExplorationType.RANDOM):
        out = policy(env.reset())
    message = action_encoding_error(
        env.full_action_spec[action_key], out.get(action_key), env.batch_size, action_key
    )
    if message is not None:
        raise ValueError(message)
    return out


def _distribution_keys(policy: nn.Module) -> tuple[NestedKey, ...]:
    keys = getattr(policy, "dist_params_keys", None)  # a ProbabilisticActor's parameters
    if keys:
        return tuple(keys)
    keys = tuple(k for k in getattr(policy, "out_keys", ()) if k in _STATISTICS)
    if not keys:
        raise ValueError(
            f"BehaviorPolicy: cannot tell which of the policy's out_keys "
            f"{list(getattr(policy, 'out_keys', []))} are its distribution parameters: pass "
            "statistics=(...), e.g. ('logits',) or ('loc', 'scale')"
        )
    return keys


class BehaviorPolicy(TensorDictModuleBase):
    """Any actor, plus a copy of its distribution parameters under ``("behavior", key)``.

    ACER evaluates the behavior policy µ at every action, or at fresh ones (Wang et al., 2017,
    arXiv:1611.01224v2, §3–5), so the replay must keep µ's whole distribution: its ``logits``
    (:class:`~ac_extensions.objectives.ACERLoss`) or ``loc`` / ``scale``
    (:class:`~ac_extensions.objectives.ContinuousACERLoss`). The actor's own ``logits`` cannot
    serve: the loss re-runs the actor and overwrites them. Reactor reads log µ(a_t|x_t)
    (``action_log_prob``), which a ``ProbabilisticActor`` with ``return_log_prob=True``
    already writes; one without it gets it computed here from the distribution.

    Args:
        policy: the actor: a TorchRL ``ProbabilisticActor`` (its ``dist_params_keys`` are
            copied), or any TensorDict module writing ``logits`` / ``probs`` / ``loc`` /
            ``scale`` (e.g. :func:`~ac_extensions.modules.collection_policy`'s fast sampler).
        statistics: the entries to copy; default: read from ``policy`` as above.
        action_spec: the env's action spec (``env.full_action_spec[action_key]``, with the
            env's batch dims); if given, every call checks the action against it and raises
            ``ValueError`` on a mismatch (the one-hot trap: see :func:`action_encoding_error`)
            — inside a collector worker, TorchRL re-raises it in the trainer.
        action_key: the action entry.
        log_prob_key: where log µ(a_t|x_t) goes.
        prefix: the sub-TensorDict the statistics are copied into.

    Returns (forward):
        The input TensorDict with the policy's outputs, ``(prefix, key)`` for each statistic
        (the same tensor as ``key``) and ``log_prob_key``.

    Example:
        >>> from tensordict import TensorDict
        >>> from ac_extensions.modules import make_actor_critic
        >>> actor, _ = make_actor_critic(4, 2)
        >>> policy = BehaviorPolicy(actor)
        >>> td = policy(TensorDict({"observation": torch.randn(3, 4)}, [3]))
        >>> bool((td["behavior", "logits"] == td["logits"]).all()), td["action_log_prob"].shape
        (True, torch.Size([3]))
    """

    def __init__(
        self,
        policy: nn.Module,
        statistics: Sequence[NestedKey] | None = None,
        *,
        action_spec: TensorSpec | None = None,
        action_key: NestedKey = "action",
        log_prob_key: NestedKey = "action_log_prob",
        prefix: str = "behavior",
    ) -> None:
        super().__init__()
        self.policy = policy
        self.statistics = tuple(statistics) if statistics else _distribution_keys(policy)
        self.action_spec = action_spec
        self.action_key, self.log_prob_key = action_key, log_prob_key
        self.in_keys = list(policy.in_keys)
        copies = [(prefix, *((k,) if isinstance(k, str) else k)) for k in self.statistics]
        self._copies = list(zip(self.statistics, copies, strict=True))
        self.out_keys = list(dict.fromkeys([*policy.out_keys, *copies, log_prob_key]))

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:  # noqa: D102
        tensordict = self.policy(tensordict)
        action = tensordict.get(self.action_key)
        if self.action_spec is not None:
            batch = tensordict.batch_size
            message = action_encoding_error(self.action_spec, action, batch, self.action_key)
            if message is not None:
                raise ValueError(message)
        for key, copy in self._copies:
            tensordict.set(copy, tensordict.get(key))
        if self.log_prob_key not in tensordict.keys(True):
            if not isinstance(self.policy, ProbabilisticTensorDictSequential):
                raise ValueError(
                    f"BehaviorPolicy: the policy wrote no {_name(self.log_prob_key)} and has no "
                    "distribution to compute it from (use return_log_prob=True)"
                )
            dist = self.policy.module[-1].get_dist(tensordict)  # from the parameters just written
            tensordict.set(self.log_prob_key, dist.log_prob(action))
        return tensordict
