"""PPO for ``[B, T]`` batches: TorchRL's ``ClipPPOLoss`` plus what it lacks on sequences.

For the common feed-forward categorical actor-critic the loss also has a fast path
(:attr:`SequencePPOLoss.fast_path`): the same outputs computed from plain tensors by
:func:`~ac_extensions.functional.categorical_ppo_losses`, and :meth:`SequencePPOLoss.
forward_backward`, which also writes the gradients, by hand for MLPs
(``benchmarks/results/ppo_update.md`` measures both).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import (
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
)
from tensordict.utils import NestedKey
from torch import Tensor, nn
from torchrl.modules import ValueOperator
from torchrl.objectives import ClipPPOLoss

from ac_extensions.functional import categorical_ppo_backward, categorical_ppo_losses
from ac_extensions.modules import MLPBackprop
from ac_extensions.objectives._plain import plain_tensordict_module
from ac_extensions.objectives._sequence import SequenceLossMixin
from ac_extensions.objectives.addons import PolicyLossAddon

# The order of the TorchRL path's output keys (ClipPPOLoss.forward, then _finish).
_OUTPUT_ORDER = (
    "loss_objective",
    "clip_fraction",
    "kl_approx",
    "entropy",
    "loss_entropy",
    "loss_critic",
    "value_clip_fraction",
    "ESS",
    "max_ratio",
    "mean_ratio",
    "explained_variance",
)
# Methods of the TorchRL path a subclass may override to change the math: the fast path is
# taken only while they are this class's own.
_TORCHRL_HOOKS = (
    "_log_weight",
    "_get_entropy",
    "_get_cur_log_prob",
    "_critic_loss_inputs",
    "loss_critic",
    "_standardize_advantage",
    "_maybe_normalize_advantage",
    "_weighted_loss_entropy",
    "_reduce_loss",
    "_loss_mask_keys",
    "_valid_mask",
    "_set_diagnostics",
    "_finish",
)


class SequencePPOLoss(SequenceLossMixin, ClipPPOLoss):
    """Clipped PPO (Schulman et al., 2017, arXiv:1707.06347, Eq. 7) over ``[N]`` or ``[B, T]``.

    The losses are TorchRL's ``ClipPPOLoss`` unchanged (same constructor, keys and math: on a
    flat batch the two give identical losses and gradients, see ``tests/objectives``):

        loss_objective = −min(r_t A_t, clip(r_t, 1 − ε, 1 + ε) A_t),  r_t = π_θ(a_t|x_t)/µ(a_t|x_t)
        loss_critic    = critic_coeff · d(V_θ(x_t), G_t)   (optionally value-clipped)
        loss_entropy   = −entropy_coeff · H(π_θ(·|x_t))

    What this class adds, for batches straight from ``MultiSyncCollector`` (``[B, T]``) or a
    slice-sampled replay buffer (padded, with ``("collector", "mask")``):

    * every diagnostic is a detached scalar over the valid (unpadded) steps: ``entropy``,
      ``clip_fraction``, ``kl_approx`` (mean log µ − log π_θ), ``ESS`` (normalised effective
      sample size of π_θ/µ), ``mean_ratio``, ``max_ratio``, ``explained_variance``
      (1 − Var[G − V]/Var[G]);
    * advantage standardisation uses the valid steps only;
    * policy-loss add-ons (:mod:`ac_extensions.objectives.addons`) are composed in:
      their ``loss_*`` terms are reduced with the same mask and returned beside the others;
    * bad input fails early with the key, expected and actual shapes: a missing key, a
      log-prob with a trailing dim, non-finite rewards / advantages, a recurrent policy whose
      hidden state was never stored (no primer), and a missing ``advantage`` (TorchRL would
      silently build a default GAE; here you compute advantages once per batch, or call
      ``make_value_estimator`` explicitly).

    **Fast path.** Most of a call's time on small networks goes to TensorDict and
    distribution bookkeeping, not arithmetic. Where it gives the same result, ``forward``
    therefore reads the input tensors itself (``self.tensor_keys``), calls the two networks'
    ``nn.Module`` s on the observations, flattens ``[B, T]`` to ``[N]`` steps and computes
    every output with :func:`~ac_extensions.functional.categorical_ppo_losses` (Eq. 7 and 9
    of the paper, as above, with ``d`` the squared error): the same keys (in the same order),
    values (up to float rounding) and gradients at a fraction of the cost
    (``benchmarks/results/ppo_update.md``). It applies when all of these hold
    (:meth:`fast_path_blocker` names the first that fails):

    * the actor is a feed-forward categorical policy: a ``ProbabilisticActor`` /
      ``ProbabilisticTensorDictSequential`` of one plain ``TensorDictModule`` mapping one
      observation entry to the logits, then ``torch.distributions.Categorical`` over them (as
      :func:`~ac_extensions.modules.make_actor_critic` builds it); the critic one
      ``TensorDictModule`` / ``ValueOperator`` from one entry to ``state_value``; no hooks on
      these wrappers; no parameter shared between actor and critic, except one shared torso:
      both networks ``nn.Sequential(torso, *head)`` with the same ``torso`` object, reading
      the same entry, heads sharing nothing (``make_actor_critic(..., share_torso=True)``),
      in which case the torso runs once for both heads (no hand gradients: autograd); and
      (with ``functional=True``) the loss's parameters still the networks' own;
    * ``loss_critic_type="l2"``, ``reduction="mean"``, a float ``clip_epsilon`` in [0, 1],
      the entropy bonus on with a scalar coefficient, a critic term, and none of
      ``delay_actor``, ``max_importance_ratio``, ``advantage_norm``,
      ``normalize_advantage_exclude_dims``, add-ons, or subclass overrides of the TorchRL
      hooks;
    * the input has ``advantage`` (no value estimator call), no padding-mask entry
      (``("collector", "mask")`` / ``"shifted_valid"``), and tensors of the expected shapes
      and one floating dtype.

    Settings that change between calls (``clip_epsilon`` annealed in place, the coefficients,
    ``clip_value``, ``normalize_advantage``, :attr:`diagnostics`) are read at every call, and
    input validation (:attr:`check_inputs`) runs on both paths. Differences that remain: an
    out-of-range action or NaN logits raise inside TorchRL's path (``Categorical``'s argument
    checks) but give an indexing error or NaN losses on the fast path; the log-ratio clip
    bounds log(1 ± ε) are computed in float64 from ε (TorchRL: in ε's float32), so a ratio
    within a float32 rounding step of a bound may fall on the other side; with
    ``entropy_coeff=0`` and :attr:`diagnostics` off, ``loss_entropy`` is a constant 0 with no
    graph (its gradient is 0 either way).

    Args:
        actor_network: a TorchRL probabilistic actor (feed-forward or with ``LSTMModule`` /
            ``GRUModule``; the loss runs it in recurrent mode over whole sequences).
        critic_network: a value operator writing ``state_value``.
        addons: policy-loss add-ons, each ``(tensordict, dist) -> {name: per-step tensor}``.
        fast_path: take the fast path where it applies (see above); ``False`` always runs
            TorchRL's ``ClipPPOLoss.forward``. Also the attribute :attr:`fast_path`, which
            may be changed at any time.
        **kwargs: passed to ``ClipPPOLoss`` (``clip_epsilon``, ``entropy_coeff``,
            ``critic_coeff``, ``loss_critic_type``, ``normalize_advantage``, ``clip_value``...).

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.modules import ProbabilisticActor, ValueOperator
        >>> from torch.distributions import Categorical
        >>> actor = ProbabilisticActor(TensorDictModule(torch.nn.Linear(4, 2), ["observation"],
        ...     ["logits"]), in_keys=["logits"], distribution_class=Categorical,
        ...     return_log_prob=True)
        >>> critic = ValueOperator(torch.nn.Linear(4, 1), in_keys=["observation"])
        >>> loss = SequencePPOLoss(actor, critic)
        >>> td = TensorDict({"observation": torch.randn(3, 5, 4),
        ...     "action": torch.randint(2, (3, 5)), "action_log_prob": torch.full((3, 5), -0.7),
        ...     "advantage": torch.randn(3, 5, 1), "value_target": torch.randn(3, 5, 1)}, [3, 5])
        >>> out = loss(td)
        >>> sorted(k for k in out.keys() if k.startswith("loss_"))
        ['loss_critic', 'loss_entropy', 'loss_objective']
        >>> out["explained_variance"].shape, out["ESS"].shape
        (torch.Size([]), torch.Size([]))
        >>> loss.fast_path_blocker(td)  # TorchRL's default critic loss is smooth L1
        'loss_critic_type is not "l2"'
        >>> fast = SequencePPOLoss(actor, critic, loss_critic_type="l2", functional=False)
        >>> fast.fast_path_blocker(td) is None, fast.hand_gradients
        (True, False)
    """

    fast_path: bool = True
    """Compute ``forward`` on plain tensors where that gives the same result (class doc)."""

    def __init__(
        self,
        actor_network: ProbabilisticTensorDictSequential,
        critic_network: TensorDictModule | None = None,
        *,
        addons: Sequence[PolicyLossAddon] = (),
        fast_path: bool = True,
        **kwargs,
    ) -> None:
        # The explained variance is computed here as a scalar over valid steps; TorchRL's
        # per-time-step version would only be overwritten.
        kwargs.setdefault("log_explained_variance", False)
        super().__init__(actor_network, critic_network, **kwargs)
        self._init_sequence(addons)
        self.fast_path = fast_path

    # ------------------------------------------------------------------ forward
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Compute the clipped PPO losses and this class's scalar diagnostics.

        Args:
            tensordict: batch ``[N]`` or ``[B, T]`` with the actor's and critic's inputs,
                ``action`` ([*B]), ``action_log_prob`` ([*B]), ``advantage`` ([*B, 1]) and
                ``value_target`` ([*B, 1]) (``state_value`` [*B, 1] with ``clip_value``).

        Returns:
            Scalars ``loss_objective``, ``loss_critic``, ``loss_entropy`` (and add-on
            ``loss_*`` terms), plus the detached diagnostics when :attr:`diagnostics` is on.
        """
        tensordict = self._validate(tensordict)
        return self._forward_validated(tensordict, self._fast_inputs(tensordict))

    def forward_backward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """The outputs of :meth:`forward`, detached, with ∂L/∂θ written into every ``.grad``.

        L is the sum of the ``loss_*`` outputs; θ every parameter of the loss that requires a
        gradient. Each ``.grad`` is **overwritten**, as by a ``backward()`` after
        ``zero_grad()`` (an existing ``.grad`` tensor is written in place, so views such as
        :class:`~ac_extensions.modules.FlatParameters`' stay attached; a parameter without a
        ``.grad`` gets a new one, a parameter the losses do not reach gets zeros if it had a
        ``.grad``). Gradients must not be accumulated over several calls this way.

        When the fast path applies to ``tensordict`` and :attr:`hand_gradients` holds, the
        gradients come without autograd: the two MLPs run forward keeping their activations
        (:class:`~ac_extensions.modules.MLPBackprop`), ∂L/∂logits and ∂L/∂V come from
        :func:`~ac_extensions.functional.categorical_ppo_backward` (derived by hand from
        Eq. 7 and 9 of Schulman et al., 2017) and are propagated through the layers, equal to
        autograd's up to float rounding. Otherwise the outputs come from :meth:`forward` and
        the gradients from ``torch.autograd.grad`` (with grad mode enabled for the call).

        Args:
            tensordict: a batch as for :meth:`forward`.

        Returns:
            The outputs of :meth:`forward` (keys as :attr:`diagnostics` selects), detached.
        """
        tensordict = self._validate(tensordict)
        inputs = self._fast_inputs(tensordict)
        if inputs is not None and inputs.plan.backprop is not None and _all_trained(inputs.plan):
            out = self._hand_forward_backward(inputs)
            if out is not None:
                return out
        with torch.enable_grad():
            out = self._forward_validated(tensordict, inputs)
            params = [p for p in self.parameters() if p.requires_grad]
            total = sum(value for key, value in out.items() if key.startswith("loss_"))
            if params and total.requires_grad:
                grads = torch.autograd.grad(total, params, allow_unused=True)
            else:  # nothing reaches the parameters: their gradient is 0
                grads = [None] * len(params)
        _write_grads(params, grads)
        return out.detach()

    # ------------------------------------------------------------------ fast path: checks
    @property
    def hand_gradients(self) -> bool:
        """Whether :meth:`forward_backward` writes the gradients by hand on the fast path.

        True when the actor's logits network and the critic's network are both MLPs that
        :class:`~ac_extensions.modules.MLPBackprop` supports (``Linear`` layers, each
        optionally followed by ``Tanh`` / ``ReLU``, as
        :func:`~ac_extensions.modules.make_actor_critic` builds them), their parameters are
        exactly the loss's trained parameters and all require gradients.
        """
        plan = self._fast_plan()
        return isinstance(plan, _FastPlan) and plan.backprop is not None and _all_trained(plan)

    def fast_path_blocker(self, tensordict: TensorDictBase) -> str | None:
        """Why :meth:`forward` would not take the fast path on ``tensordict``, or ``None``.

        Args:
            tensordict: a batch as for :meth:`forward` (not validated here).

        Returns:
            ``None`` when the fast path applies to this input with the current settings,
            otherwise a short description of the first condition (class doc) that fails.
        """
        if not self.fast_path:
            return "fast_path is off"
        reason = self._settings_blocker()
        if reason is not None:
            return reason
        plan = self._fast_plan()
        if isinstance(plan, str):
            return plan
        reason = _inputs_or_blocker(self, plan, tensordict)
        return reason if isinstance(reason, str) else None

    def _fast_plan(self) -> _FastPlan | str:
        """The networks' structure for the fast path (or why not), cached per instance.

        The cache is keyed by ``id(self)`` and the identity of the networks, their wrappers
        and their layers, so a deep copy or an unpickled loss (a deep copy of a
        ``functional=True`` loss no longer shares its parameters with its networks' modules)
        and a network or layer replaced after the first call are checked again.
        """
        cache = self.__dict__.get("_fast_plan_cache")
        structure = (
            id(self),
            *_structure(_attribute(self, "actor_network"), _attribute(self, "critic_network")),
        )
        if cache is None or cache.structure != structure:
            cache = _PlanCache(structure, _plan(self))
            self.__dict__["_fast_plan_cache"] = cache
        return cache.plan

    def _settings_blocker(self) -> str | None:
        """The loss settings the fast path needs, read at call time (class doc)."""
        if self.addons or self._callable_addons:
            return "policy-loss add-ons are set"
        if self.loss_critic_type != "l2":
            return 'loss_critic_type is not "l2"'
        if self.reduction != "mean":
            return 'reduction is not "mean"'
        if not self.entropy_bonus or self._entropy_coeff_map is not None:
            return "the entropy bonus is off or has per-head coefficients"
        if not self._has_critic:
            return "no critic term (critic_coeff is None or 0)"
        if self._asymmetric_clip or self.delay_actor or self.max_importance_ratio is not None:
            return "asymmetric clip_epsilon, delay_actor or max_importance_ratio is set"
        if self.advantage_norm is not None or len(self.normalize_advantage_exclude_dims):
            return "advantage_norm or normalize_advantage_exclude_dims is set"
        if self._recurrent_keys:
            return "the actor or critic is recurrent"
        return None

    def _fast_inputs(self, tensordict: TensorDictBase) -> _FastInputs | None:
        """The fast path's inputs from ``tensordict``, or ``None`` where it does not apply."""
        if not self.fast_path:
            return None
        if self._settings_blocker() is not None:
            return None
        plan = self._fast_plan()
        if isinstance(plan, str):
            return None
        inputs = _inputs_or_blocker(self, plan, tensordict)
        return inputs if isinstance(inputs, _FastInputs) else None

    # ------------------------------------------------------------------ fast path: compute
    def _forward_validated(
        self, tensordict: TensorDictBase, inputs: _FastInputs | None
    ) -> TensorDictBase:
        """:meth:`forward` after validation: the fast path if ``inputs``, else TorchRL's."""
        if inputs is not None:
            out = self._fast_forward(inputs)
            if out is not None:
                return out
        return self._finish(tensordict, super().forward(tensordict))

    def _settings(self, inputs: _FastInputs) -> dict:
        return dict(
            clip_epsilon=inputs.clip_epsilon,
            entropy_coeff=float(_attribute(self, "entropy_coeff")),
            critic_coeff=float(_attribute(self, "critic_coeff")),
            normalize_advantage=bool(self.normalize_advantage),
            clip_value=inputs.clip_value,
            old_value=inputs.old_value,
            diagnostics=self.diagnostics,
        )

    def _fast_forward(self, inputs: _FastInputs) -> TensorDictBase | None:
        """Outputs on the fast path; ``None`` if the networks' outputs have unexpected shapes."""
        plan, batch = inputs.plan, inputs.batch
        if plan.torso is not None:  # one torso for both heads: run it once
            features = plan.torso(inputs.actor_input)  # [*B, F]
            logits = plan.actor_net(features)  # [*B, A]
            value = plan.critic_net(features)  # [*B, 1]
        else:
            logits = plan.actor_net(inputs.actor_input)  # [*B, A]
            value = plan.critic_net(inputs.critic_input)  # [*B, 1]
        if not _network_outputs_ok(logits, value, batch, inputs.dtype):
            return None
        n = batch.numel()
        out = categorical_ppo_losses(
            logits.reshape(n, logits.shape[-1]),
            value.reshape(n),
            inputs.action,
            inputs.log_prob,
            inputs.advantage,
            inputs.value_target,
            **self._settings(inputs),
        )
        return _as_output(out)

    def _hand_forward_backward(self, inputs: _FastInputs) -> TensorDictBase | None:
        """:meth:`forward_backward` on the fast path by hand; ``None`` where it cannot."""
        actor, critic = inputs.plan.backprop
        n, dims = inputs.batch.numel(), len(inputs.batch) + 1
        if inputs.actor_input.dim() != dims or inputs.critic_input.dim() != dims:
            return None  # observations [*B, O] only: MLPBackprop takes [N, O]
        actor_input = inputs.actor_input.reshape(n, -1)
        critic_input = inputs.critic_input.reshape(n, -1)
        logits, actor_saved = actor.forward(actor_input)  # [N, A]
        value, critic_saved = critic.forward(critic_input)  # [N, 1]
        if not _network_outputs_ok(logits, value, torch.Size([n]), inputs.dtype):
            return None
        out, grad_logits, grad_value = categorical_ppo_backward(
            logits,
            value.squeeze(-1),
            inputs.action,
            inputs.log_prob,
            inputs.advantage,
            inputs.value_target,
            **self._settings(inputs),
        )
        actor.backward(actor_saved, grad_logits)
        critic.backward(critic_saved, grad_value.unsqueeze(-1))
        return _as_output(out)

    # ------------------------------------------------------------------ TorchRL path hooks
    # Hooks into ClipPPOLoss.forward: record per-step tensors for the diagnostics.
    def _log_weight(self, tensordict, adv_shape):
        log_weight, dist, kl_approx, log_is_weight = super()._log_weight(tensordict, adv_shape)
        behavior = log_weight if log_is_weight is None else log_weight + log_is_weight
        self._capture.update(
            log_weight=log_weight.detach(),
            log_behavior_weight=behavior.detach(),
            kl_approx=kl_approx.detach(),
            dist=dist,
        )
        return log_weight, dist, kl_approx, log_is_weight

    def _get_entropy(self, dist, adv_shape):
        entropy = super()._get_entropy(dist, adv_shape)
        self._capture["entropy"] = entropy
        return entropy

    def _critic_loss_inputs(self, target_return, state_value, old_state_value):
        out = super()._critic_loss_inputs(target_return, state_value, old_state_value)
        self._capture.update(value_target=out[0].detach(), state_value=out[1].detach())
        return out


# ---------------------------------------------------------------------- fast path helpers
@dataclass
class _FastPlan:
    """The networks the fast path calls directly, and their hand backward passes if any."""

    actor_net: nn.Module  # observation [*B, O] (or the torso's features) → logits [*B, A]
    actor_key: NestedKey
    critic_net: nn.Module  # observation [*B, O] (or the torso's features) → value [*B, 1]
    critic_key: NestedKey
    torso: nn.Module | None  # shared first layer of both networks: observation → features
    value_key: NestedKey
    hooks: tuple[dict, ...]  # the hook dicts of the bypassed TensorDict wrappers (kept empty)
    backprop: tuple[MLPBackprop, MLPBackprop] | None
    params: tuple[nn.Parameter, ...]  # the networks' parameters


@dataclass
class _PlanCache:
    structure: tuple  # compared by identity: id of the loss, networks, wrappers, layers
    plan: _FastPlan | str


def _attribute(module: nn.Module, name: str):
    """``getattr(module, name)``, reading a submodule or buffer from its dict directly.

    ``nn.Module.__getattr__`` (and TorchRL's and tensordict's on top) costs ~1.5 µs per
    lookup; the fast path reads a dozen per call.
    """
    for registry in (module._modules, module._buffers):
        if name in registry:
            return registry[name]
    return getattr(module, name)


def _structure(actor, critic) -> tuple:
    """The objects whose replacement makes a cached :class:`_FastPlan` stale."""
    children = [None, None, None]  # the actor's module list, its first entry, its network
    if isinstance(actor, ProbabilisticTensorDictSequential):
        children[0] = actor._modules.get("module")
        if isinstance(children[0], nn.ModuleList):
            children[1] = children[0]._modules.get("0")
            if isinstance(children[1], nn.Module):
                children[2] = children[1]._modules.get("module")
    critic_net = critic._modules.get("module") if isinstance(critic, nn.Module) else None
    layers = (
        tuple(net._modules.values()) if isinstance(net, nn.Sequential) else ()
        for net in (children[2], critic_net)
    )
    return (actor, critic, *children, critic_net, *layers)


@dataclass
class _FastInputs:
    """One call's fast-path inputs; per-step tensors flattened to [N] (N = batch.numel())."""

    plan: _FastPlan
    batch: torch.Size
    dtype: torch.dtype
    actor_input: Tensor  # [*B, O]
    critic_input: Tensor  # [*B, O']
    action: Tensor  # [N]
    log_prob: Tensor  # [N]
    advantage: Tensor  # [N]
    value_target: Tensor  # [N]
    old_value: Tensor | None  # [N], with clip_value
    clip_epsilon: float
    clip_value: float | None


def _actor_blocker(actor) -> str | None:
    if not isinstance(actor, ProbabilisticTensorDictSequential) or len(actor.module) != 2:
        return "the actor is not a probabilistic sequence of a network and a distribution"
    body, head = actor.module[0], actor.module[1]
    if (
        actor.return_composite
        or type(actor).get_dist is not ProbabilisticTensorDictSequential.get_dist
        or type(actor).get_dist_params is not ProbabilisticTensorDictSequential.get_dist_params
    ):
        return "the actor builds its distribution in its own way"
    reason = plain_tensordict_module(body, TensorDictModule)
    if reason is not None:
        return f"actor: {reason}"
    if (
        not isinstance(head, ProbabilisticTensorDictModule)
        or type(head).get_dist is not ProbabilisticTensorDictModule.get_dist
        or head.distribution_class is not torch.distributions.Categorical
        or len(head.distribution_kwargs)
        or list(head.dist_keys) != ["logits"]
        or list(head.in_keys) != list(body.out_keys)
    ):
        return "the actor's distribution is not a Categorical over its network's logits"
    return None


def _plan(loss: SequencePPOLoss) -> _FastPlan | str:
    """The fast-path plan of ``loss``'s networks, or why they do not allow one."""
    for name in _TORCHRL_HOOKS:
        if getattr(type(loss), name) is not getattr(SequencePPOLoss, name):
            return f"a subclass overrides {name}"
    actor, critic = loss.actor_network, loss.critic_network
    reason = _actor_blocker(actor)
    if reason is not None:
        return reason
    if critic is None:
        return "no critic network"
    reason = plain_tensordict_module(critic, TensorDictModule, ValueOperator)
    if reason is not None:
        return f"critic: {reason}"
    actor_net, critic_net = actor.module[0].module, critic.module
    actor_params = list(actor.parameters())
    critic_params = list(critic.parameters())
    torso = None
    if {id(p) for p in actor_params} & {id(p) for p in critic_params}:
        torso = _shared_torso(actor_net, critic_net)
        if torso is None:
            return "the actor and the critic share parameters outside one common torso"
        if actor.module[0].in_keys[0] != critic.in_keys[0]:
            return "the actor and the critic share a torso but read different entries"
        actor_net, critic_net = actor_net[1:], critic_net[1:]
    params = tuple({id(p): p for p in (*actor_params, *critic_params)}.values())
    addon_params = {id(p) for p in loss.addons.parameters()}
    if {id(p) for p in params} != {id(p) for p in loss.parameters()} - addon_params:
        # functional=True: a deep copy holds new parameters its networks' modules do not use
        return "the loss's parameters are not its networks' own"
    backprop = None
    if torso is None and MLPBackprop.supports(actor_net) and MLPBackprop.supports(critic_net):
        backprop = (MLPBackprop(actor_net), MLPBackprop(critic_net))
        covered = [p for b in backprop for p in b.parameters()]
        if len(covered) != len(params) or {id(p) for p in covered} != {id(p) for p in params}:
            backprop = None
    return _FastPlan(
        actor_net=actor_net,
        actor_key=actor.module[0].in_keys[0],
        critic_net=critic_net,
        critic_key=critic.in_keys[0],
        torso=torso,
        value_key=critic.out_keys[0],
        hooks=tuple(
            hooks
            for wrapper in (actor, *actor.module, critic)
            for hooks in (wrapper._forward_hooks, wrapper._forward_pre_hooks)
        ),
        backprop=backprop,
        params=params,
    )


def _shared_torso(actor_net: nn.Module, critic_net: nn.Module) -> nn.Module | None:
    """The torso of ``nn.Sequential(torso, *actor_head)`` / ``(torso, *critic_head)``, or None.

    None unless both networks are ``nn.Sequential`` s whose first module is the same object and
    whose remaining layers (the heads) share no parameter with each other or with the torso.
    """
    if not (isinstance(actor_net, nn.Sequential) and isinstance(critic_net, nn.Sequential)):
        return None
    if len(actor_net) < 2 or len(critic_net) < 2 or actor_net[0] is not critic_net[0]:
        return None
    groups = [actor_net[0].parameters(), actor_net[1:].parameters(), critic_net[1:].parameters()]
    ids = [[id(p) for p in group] for group in groups]
    if sum(map(len, ids)) != len({i for group in ids for i in group}):
        return None
    return actor_net[0]


def _all_trained(plan: _FastPlan) -> bool:
    return all(p.requires_grad for p in plan.params)


def _step_tensor(tensordict: TensorDictBase, key, shape: tuple) -> Tensor | None:
    """``tensordict[key]`` if it is a plain tensor of ``shape``, else ``None``."""
    value = tensordict.get(key, None)
    if not isinstance(value, Tensor) or value.is_nested or value.shape != shape:
        return None
    return value


def _inputs_or_blocker(  # noqa: C901 (a flat list of checks)
    loss: SequencePPOLoss, plan: _FastPlan, tensordict: TensorDictBase
) -> _FastInputs | str:
    """The fast path's inputs gathered from ``tensordict``, or why it does not apply."""
    if any(plan.hooks):
        return "the actor's or critic's TensorDict wrappers have forward hooks"
    keys = loss.tensor_keys
    if plan.value_key != keys.value:
        return f"the critic writes {plan.value_key!r}, not the loss's value key {keys.value!r}"
    epsilon = float(_attribute(loss, "clip_epsilon"))
    if not 0 <= epsilon <= 1:
        return f"clip_epsilon {epsilon} is outside [0, 1]"
    clip_value = _attribute(loss, "clip_value")
    clip_value = None if clip_value is None else float(clip_value)
    if clip_value is not None and not clip_value >= 0:
        return f"clip_value {clip_value} is negative or NaN"
    clip_value = clip_value or None  # 0: TorchRL clips nothing
    batch = tensordict.batch_size
    if not len(batch):
        return "the input has no batch dims"
    for key in loss._loss_mask_keys():
        if tensordict.get(key, None) is not None:
            return f"the input has the padding mask {key!r}"
    n = batch.numel()
    column = (*batch, 1)
    advantage = _step_tensor(tensordict, keys.advantage, column)
    value_target = _step_tensor(tensordict, keys.value_target, column)
    log_prob = _step_tensor(tensordict, keys.sample_log_prob, batch)
    action = _step_tensor(tensordict, keys.action, batch)
    old_value = _step_tensor(tensordict, keys.value, column) if clip_value else None
    if (
        advantage is None
        or value_target is None
        or log_prob is None
        or action is None
        or (clip_value and old_value is None)
    ):
        return "an input tensor (advantage, value_target, log-prob, action) is missing or shaped"
    if log_prob.requires_grad or action.requires_grad:
        return "the stored log-prob or action requires grad"
    dtype = advantage.dtype
    floats = (value_target, log_prob) if old_value is None else (value_target, log_prob, old_value)
    if not dtype.is_floating_point or any(t.dtype != dtype for t in floats):
        return "advantage, value_target and the log-prob do not share one floating dtype"
    observations = []
    for key in (plan.actor_key, plan.critic_key):
        value = observations[0] if observations and key == plan.actor_key else None
        if value is None:
            value = tensordict.get(key, None)
        if not isinstance(value, Tensor) or value.is_nested or value.shape[: len(batch)] != batch:
            return f"the network input {key!r} is missing or does not start with the batch shape"
        observations.append(value)
    per_step = (action, log_prob, advantage, value_target, old_value)
    steps = [None if t is None else t.reshape(n) for t in per_step]
    return _FastInputs(plan, batch, dtype, *observations, *steps, epsilon, clip_value)


def _network_outputs_ok(logits, value, batch: torch.Size, dtype: torch.dtype) -> bool:
    """Logits ``[*B, A]`` and values ``[*B, 1]`` of the inputs' dtype (else TorchRL's path)."""
    return (
        isinstance(logits, Tensor)
        and isinstance(value, Tensor)
        and logits.dim() == len(batch) + 1
        and logits.shape[:-1] == batch
        and value.shape == (*batch, 1)
        and logits.dtype == dtype
        and value.dtype == dtype
    )


def _as_output(out: dict[str, Tensor]) -> TensorDictBase:
    """The loss dict as the TorchRL path's output TensorDict (same keys, same order)."""
    return TensorDict({key: out[key] for key in _OUTPUT_ORDER if key in out}, batch_size=[])


@torch.no_grad()
def _write_grads(params: list[nn.Parameter], grads: Sequence[Tensor | None]) -> None:
    """Overwrite each ``param.grad`` with its gradient (in place where one exists)."""
    for param, grad in zip(params, grads, strict=True):
        current = param.grad
        writable = current is not None and current.shape == param.shape
        if grad is None:
            if writable:
                current.zero_()
        elif writable:
            current.copy_(grad)
        else:
            param.grad = grad


__all__ = ["SequencePPOLoss"]
