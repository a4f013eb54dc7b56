"""ACER for discrete actions (Wang et al., 2017, arXiv:1611.01224v2) as a TorchRL loss."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from tensordict import TensorDict, TensorDictBase, TensorDictParams
from tensordict.nn import TensorDictModule
from tensordict.utils import NestedKey
from torch import Tensor
from torchrl.objectives.utils import dispatch_value_estimator

import ac_extensions.functional as F
from ac_extensions.objectives._replay import (
    ReplayedSequenceLoss,
    assemble_next,
    check_sequence_batch,
    joint_inputs,
    next_step_plan,
    run_under,
    split_joint,
    unrolled_next_outputs,
)
from ac_extensions.objectives.value import ACValueEstimators, RetraceEstimator


class ACERLoss(ReplayedSequenceLoss):
    """ACER: Retrace critic, truncated IS with bias correction, efficient trust region.

    Input: sequences ``[B, T]`` (or ``[T]``), fresh or replayed, holding ``observation``,
    ``action`` (indices), the behavior policy's logits stored at collection
    (``("behavior", "logits")``), and ``("next", ...)`` with ``reward``, ``done``,
    ``terminated`` and the next observation. Output keys (each a scalar; ``loss_*`` are summed
    for backward):

    ===================  =========================================================================
    ``loss_critic``      critic_coeff · ½ (Q^ret_t − Q(x_t, a_t))²                       (§3.1)
    ``loss_objective``   −min(c, ρ_t)(Q^ret_t − V_t) log π(a_t|x_t)
                         − Σ_a [1 − c/ρ_t(a)]_+ π(a)(Q(x_t, a) − V_t) log π(a|x_t)    (Eq. 9),
                         with the trust region applied (below)
    ``loss_entropy``     −entropy_coeff · H(π(·|x_t))
    diagnostics          ``entropy``, ``ratio_mean``, ``truncation_fraction`` (ρ_t > c),
                         ``trust_region_active`` (fraction of steps with λ > 0), ``kl_average``
                         (KL(π_avg ‖ π)), ``q_ret_mean``
    ===================  =========================================================================

    Q^ret comes from the value estimator, by default the registered
    :class:`~ac_extensions.objectives.value.RetraceEstimator` with λ = 1 (trace min(1, ρ), i.e.
    :func:`~ac_extensions.functional.retrace_targets` with
    :func:`~ac_extensions.functional.acer_trace`); ``loss.make_value_estimator("retrace",
    gamma=..., lmbda=...)`` changes it. V(x) = Σ_a π(a|x) Q(x, a) and Q come from the current
    networks (ACER has no target network); the whole target is a constant.

    Efficient trust region (§3.3, Eq. 11–12), per sample, on the statistics φ = π(·|x_t) (the
    action probabilities, as in the paper): with g_t = ∂J_t/∂φ_t the gradient of the step-t
    policy objective (entropy included, as openai/baselines) and k_t = −π_avg/π the gradient of
    KL(π_avg ‖ π), the loss adds sg(λ_t)·KL_t with λ_t = max(0, (k_tᵀg_t − δ)/‖k_t‖²), so that
    the gradient reaching φ_t is −z*_t (:func:`~ac_extensions.functional.trust_region_loss`).
    π_avg comes from the actor's **target parameters**, the Polyak-averaged policy: keep them up
    to date with ``torchrl.objectives.SoftUpdate(loss, eps=average_policy_decay)`` stepped after
    every optimiser step (θ_avg ← α θ_avg + (1 − α) θ). ``trust_region_delta=inf`` disables it.

    Networks: either a separate ``qvalue_network``, or ``qvalue_network=None`` and an actor
    that writes ``action_value`` beside ``logits`` in the same pass (the policy-plus-Q head
    with a shared torso, :func:`~ac_extensions.modules.make_acer_actor`). Recurrent networks
    (``LSTMModule`` / ``GRUModule`` inside) run over the whole ``[B, T]`` sequence from the
    hidden state stored at its first step; the outputs at the next states come from that pass
    (row t + 1's where the episode goes on, one more step from the state the pass reached at
    episode ends and at the window's end), never from states stored under ``("next", ...)``.

    Args:
        actor_network: module writing the policy logits (``logits``) from the observation; a
            TorchRL ``ProbabilisticActor`` works (its distribution parameters are used).
        qvalue_network: module writing ``action_value`` ([*B, A]); ``None`` if the actor
            writes it.
        gamma: discount γ.
        truncation_threshold: c of the truncated importance weight (paper: 10).
        trust_region_delta: δ (paper: 1; ``inf`` disables the trust region).
        entropy_coeff: entropy bonus coefficient.
        critic_coeff: critic loss coefficient (openai/baselines ``q_coef`` 0.5).
        burn_in: recurrent networks only: the first ``burn_in`` steps of each sequence only
            warm the memory up from the stored state, without gradient, and are left out of
            every loss term (Kapturowski et al., 2019, R2D2 §3; see
            ``objectives._replay.burn_in``); the losses see T − ``burn_in`` steps.

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> actor = TensorDictModule(torch.nn.Linear(4, 3), ["observation"], ["logits"])
        >>> qvalue = TensorDictModule(torch.nn.Linear(4, 3), ["observation"], ["action_value"])
        >>> loss = ACERLoss(actor, qvalue, gamma=0.99)
        >>> td = TensorDict({"observation": torch.randn(2, 5, 4),
        ...     "action": torch.randint(3, (2, 5)), ("behavior", "logits"): torch.randn(2, 5, 3),
        ...     ("next", "observation"): torch.randn(2, 5, 4),
        ...     ("next", "reward"): torch.randn(2, 5, 1),
        ...     ("next", "done"): torch.zeros(2, 5, 1, dtype=torch.bool),
        ...     ("next", "terminated"): torch.zeros(2, 5, 1, dtype=torch.bool)}, [2, 5])
        >>> sorted(k for k in loss(td).keys() if k.startswith("loss_"))
        ['loss_critic', 'loss_entropy', 'loss_objective']
    """

    @dataclass
    class _AcceptedKeys:
        """Configurable input keys (change them with ``loss.set_keys(...)``).

        ``action`` (indices), ``behavior_logits`` (stored at collection), ``logits`` /
        ``action_value`` (written by the networks), and the ``("next", ...)`` entries
        ``reward``, ``done``, ``terminated``.
        """

        action: NestedKey = "action"
        behavior_logits: NestedKey = ("behavior", "logits")
        logits: NestedKey = "logits"
        action_value: NestedKey = "action_value"
        reward: NestedKey = "reward"
        done: NestedKey = "done"
        terminated: NestedKey = "terminated"

    default_keys = _AcceptedKeys
    default_value_estimator = ACValueEstimators.Retrace
    SUPPORTED_VALUE_ESTIMATORS = (ACValueEstimators.Retrace,)
    actor_network: TensorDictModule
    qvalue_network: TensorDictModule
    actor_network_params: TensorDictParams
    qvalue_network_params: TensorDictParams
    target_actor_network_params: TensorDictParams
    target_qvalue_network_params: TensorDictParams

    def __init__(
        self,
        actor_network: TensorDictModule,
        qvalue_network: TensorDictModule | None = None,
        *,
        gamma: float = 0.99,
        truncation_threshold: float = 10.0,
        trust_region_delta: float = 1.0,
        entropy_coeff: float = 0.01,
        critic_coeff: float = 0.5,
        burn_in: int = 0,
    ) -> None:
        super().__init__()
        if truncation_threshold <= 0 or trust_region_delta < 0:
            raise ValueError(
                f"truncation_threshold must be > 0 and trust_region_delta >= 0, got "
                f"{truncation_threshold}, {trust_region_delta}"
            )
        self._tensor_keys = self._AcceptedKeys()
        # The average policy is the actor's target parameters (kept by SoftUpdate).
        self.convert_to_functional(actor_network, "actor_network", create_target_params=True)
        self._init_sequences((actor_network, qvalue_network), burn_in)
        self._shared_head = qvalue_network is None
        if not self._shared_head:
            self.convert_to_functional(qvalue_network, "qvalue_network")
        self.gamma = gamma
        self._value_estimator = None
        self.truncation_threshold = truncation_threshold
        self.trust_region_delta = trust_region_delta
        self.register_buffer("entropy_coeff", torch.tensor(float(entropy_coeff)))
        self.register_buffer("critic_coeff", torch.tensor(float(critic_coeff)))
        self.reduction = "mean"

    @property
    def in_keys(self) -> list:
        """Keys read from the input."""
        keys = self.tensor_keys
        net_keys = [*self.actor_network.in_keys, *self._qvalue_in_keys()]
        return [
            *dict.fromkeys(net_keys),
            keys.action,
            keys.behavior_logits,
            *(("next", k) for k in dict.fromkeys(net_keys) if k not in self._recurrent_keys),
            ("next", keys.reward),
            ("next", keys.done),
            ("next", keys.terminated),
        ]

    @property
    def out_keys(self) -> list[str]:
        """Keys of the output TensorDict."""
        return [
            "loss_objective",
            "loss_critic",
            "loss_entropy",
            "entropy",
            "ratio_mean",
            "truncation_fraction",
            "trust_region_active",
            "kl_average",
            "q_ret_mean",
        ]

    @property
    def gamma(self) -> float:
        """Discount γ; setting it also sets the value estimator's, so it takes effect at once."""
        return self._gamma

    @gamma.setter
    def gamma(self, value: float) -> None:
        if not 0.0 <= float(value) <= 1.0:
            raise ValueError(f"gamma must lie in [0, 1], got {value}")
        self._gamma = float(value)
        estimator = self._modules.get("_value_estimator")
        if estimator is not None:
            estimator.gamma.fill_(self._gamma)

    def make_value_estimator(self, value_type=None, **hyperparams):
        """Build the critic's target estimator; ``"retrace"`` (the default) with λ = 1 is Q^ret.

        ``loss.make_value_estimator("retrace", gamma=0.99, lmbda=0.95)`` gives Retrace(λ).
        """
        value_type, hyperparams = self._prepare_value_estimator_kwargs(value_type, **hyperparams)
        if value_type is None:
            return self
        keys = self.tensor_keys
        dispatch_value_estimator(
            self,
            value_type,
            supported=self.SUPPORTED_VALUE_ESTIMATORS,
            tensor_keys={
                "action": keys.action,
                "behavior_logits": keys.behavior_logits,
                "logits": keys.logits,
                "action_value": keys.action_value,
                "reward": keys.reward,
                "done": keys.done,
                "terminated": keys.terminated,
            },
            **hyperparams,
        )
        self._gamma = float(self._value_estimator.gamma)  # the estimator's γ is the loss's
        return self

    def _forward_value_estimator_keys(self, **kwargs) -> None:
        if self._value_estimator is not None:
            accepted = self._value_estimator._AcceptedKeys.__dataclass_fields__
            self._value_estimator.set_keys(
                **{k: getattr(self.tensor_keys, k) for k in kwargs if k in accepted}
            )

    # ------------------------------------------------------------------ helpers
    def _qvalue_in_keys(self) -> list:
        return [] if self._shared_head else list(self.qvalue_network.in_keys)

    def _run_actor(self, tensordict: TensorDictBase, params: TensorDictParams) -> TensorDictBase:
        """Everything the actor writes (no action sampled)."""
        return run_under(self.actor_network, tensordict, params)

    def _actor_outputs(
        self, tensordict: TensorDictBase, params: TensorDictParams
    ) -> tuple[Tensor, Tensor | None]:
        """(logits, action values written by the actor or None), both [*B, T, A]."""
        out = self._run_actor(tensordict, params)
        return out.get(self.tensor_keys.logits), out.get(self.tensor_keys.action_value, None)

    def _run_networks(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Everything the current actor and Q network write (burn-in reads their new states)."""
        out = self._run_actor(tensordict, self.actor_network_params)
        if not self._shared_head:
            out.update(run_under(self.qvalue_network, tensordict, self.qvalue_network_params))
        return out

    def _policy_and_q(
        self, tensordict: TensorDictBase, batch: torch.Size | None = None
    ) -> tuple[Tensor, Tensor]:
        """Current logits and Q(x, ·), [*B, T, A] each (``batch``: the shape errors name)."""
        batch = tensordict.batch_size if batch is None else batch
        return self._policy_and_q_from(self._run_networks(tensordict), batch)

    def _policy_and_q_from(self, out: TensorDictBase, batch: torch.Size) -> tuple[Tensor, Tensor]:
        """Logits and Q(x, ·) from what the current networks wrote (:meth:`_run_networks`)."""
        logits = out.get(self.tensor_keys.logits)
        q = out.get(self.tensor_keys.action_value, None)
        if q is None:
            writer = (
                "qvalue_network is None but the actor"
                if self._shared_head
                else "the qvalue_network"
            )
            raise KeyError(
                f"{type(self).__name__}: {writer} wrote no {self.tensor_keys.action_value!r} "
                f"(expected shape {[*batch, logits.shape[-1]]})"
            )
        if q.shape != logits.shape:
            self._mismatched_actions(logits, q, batch)
        return logits, q

    def _mismatched_actions(self, logits: Tensor, q: Tensor, batch: torch.Size) -> None:
        keys, shown = self.tensor_keys, list(batch)
        raise ValueError(
            f"{type(self).__name__}: the actor's {keys.logits!r} (shape "
            f"{[*shown, logits.shape[-1]]}: {logits.shape[-1]} actions) and the Q network's "
            f"{keys.action_value!r} (shape {[*shown, q.shape[-1]]}) must have the same shape "
            f"[*B, T, A]: one Q value per action of the policy"
        )

    def _check_input(self, tensordict: TensorDictBase) -> None:
        keys, batch = self.tensor_keys, tensordict.batch_size
        name = type(self).__name__
        required = [
            keys.action,
            keys.behavior_logits,
            ("next", keys.reward),
            ("next", keys.done),
            ("next", keys.terminated),
        ]
        for key in [*self.actor_network.in_keys, *self._qvalue_in_keys(), *required]:
            if tensordict.get(key, None) is None:
                raise KeyError(
                    f"{name}: the input (batch_size {list(batch)}) has no key {key!r}"
                    + (
                        " (the behavior policy's logits, stored at collection)"
                        if key == keys.behavior_logits
                        else ""
                    )
                )
        check_sequence_batch(name, tensordict, (keys.done, keys.terminated))
        action = tensordict.get(keys.action)
        if action.shape != batch or action.is_floating_point():
            raise ValueError(
                f"{name}: {keys.action!r} must hold integer action indices of shape "
                f"{list(batch)}, got {list(action.shape)} ({action.dtype})"
            )
        behavior = tensordict.get(keys.behavior_logits)
        if behavior.shape[:-1] != batch:
            raise ValueError(
                f"{name}: {keys.behavior_logits!r} must have shape {list(batch)} + [A], got "
                f"{list(behavior.shape)}"
            )
        reward = tensordict.get(("next", keys.reward))
        if reward.shape != (*batch, 1) or not bool(torch.isfinite(reward).all()):
            raise ValueError(
                f"{name}: ('next', {keys.reward!r}) must be finite with shape "
                f"{[*batch, 1]}, got shape {list(reward.shape)} with "
                f"{int((~torch.isfinite(reward)).sum())} non-finite entries"
            )

    def _check_behavior(self, behavior_log_probs: Tensor, action: Tensor) -> None:
        """Raise where µ gave the taken action probability 0 (log µ [B, T, A], a [B, T, 1])."""
        taken = behavior_log_probs.gather(-1, action)
        if bool((taken == -math.inf).any()):
            raise ValueError(
                f"{type(self).__name__}: the behavior probability of the taken action is 0 at "
                f"{int((taken == -math.inf).sum())} steps ({self.tensor_keys.behavior_logits!r},"
                f" shape {list(behavior_log_probs.shape)}): the data cannot come from that policy"
            )

    def _outputs(self, tensordict: TensorDictBase) -> tuple[Tensor, ...]:
        """Network outputs through the TensorDict wrappers, each [*B, T, A].

        Returns ``(logits, q, average_logits, next_logits, next_q)``: π's logits and Q at x_t
        (with gradient), the average policy's logits at x_t, π's logits and Q at x_{t+1}.
        π and Q at x_{t+1} are the current pass shifted by one step where the stream continues,
        the networks run only at episode ends and the window end (for feed-forward networks in
        the same pass as x_t: ``joint_inputs``).
        """
        keys = self.tensor_keys
        nxt = tensordict.get("next")
        in_keys = [*self.actor_network.in_keys, *self._qvalue_in_keys()]
        batch = tensordict.batch_size
        if self._recurrent:  # one pass over the window; its reached states feed x_{t+1}
            window = self._run_networks(tensordict)
            logits, q = self._policy_and_q_from(window, batch)  # [*B, T, A] each
        else:
            fresh = next_step_plan(tensordict, nxt, in_keys, keys.done)
            joint = joint_inputs(tensordict, nxt, fresh, in_keys)
            joint_logits, joint_q = self._policy_and_q(joint, batch)
            (logits, fresh_logits), (q, fresh_q) = (
                split_joint(joint_logits, batch),
                split_joint(joint_q, batch),
            )
        with torch.no_grad():
            average_logits, _ = self._actor_outputs(tensordict, self.target_actor_network_params)
            if self._recurrent:
                next_logits, next_q = unrolled_next_outputs(
                    nxt,
                    (logits, q),
                    (window,),
                    lambda steps: self._policy_and_q(steps[0]),
                    self._recurrent_keys,
                    keys.done,
                )
            else:
                next_logits, next_q = assemble_next((logits, q), (fresh_logits, fresh_q), fresh)
        return logits, q, average_logits, next_logits, next_q

    @torch.no_grad()
    def _q_ret(
        self,
        tensordict: TensorDictBase,
        action: Tensor,
        behavior_log_probs: Tensor,
        logits: Tensor,
        q: Tensor,
        next_logits: Tensor,
        next_q: Tensor,
    ) -> Tensor:
        """Q^ret (Eq. 5) from the registered estimator on detached outputs, [*B, T, 1]."""
        keys, nxt = self.tensor_keys, tensordict.get("next")
        estimator = self.value_estimator
        if type(estimator) is RetraceEstimator:  # the default: its functional directly
            q_ret, _ = F.categorical_q_retrace(
                logits.detach(),
                q.detach(),
                next_logits,
                next_q,
                action,
                behavior_log_probs,
                nxt.get(keys.reward),
                nxt.get(keys.done),
                nxt.get(keys.terminated),
                float(estimator.gamma),
                float(estimator.lmbda),
            )
            return q_ret
        estimate = TensorDict(
            {
                keys.action: tensordict.get(keys.action),
                keys.behavior_logits: tensordict.get(keys.behavior_logits),
                keys.logits: logits.detach(),
                keys.action_value: q.detach(),
                "next": {
                    keys.logits: next_logits,
                    keys.action_value: next_q,
                    keys.reward: nxt.get(keys.reward),
                    keys.done: nxt.get(keys.done),
                    keys.terminated: nxt.get(keys.terminated),
                },
            },
            batch_size=tensordict.batch_size,
        )
        return estimator(estimate).get(estimator.tensor_keys.value_target)

    # ------------------------------------------------------------------ forward
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Compute the ACER losses for a batch of sequences."""
        keys = self.tensor_keys
        prepared = self._prepare(tensordict)  # checked, [B, T], burned in, cut at padding
        tensordict, mask = prepared.td, prepared.mask
        action = tensordict.get(keys.action).unsqueeze(-1)  # a_t                 [B, T, 1]
        behavior_log_probs = tensordict.get(keys.behavior_logits).log_softmax(-1)  # [B, T, A]
        self._check_behavior(behavior_log_probs, action)
        logits, q, average_logits, next_logits, next_q = self._outputs(tensordict)
        q_ret = self._q_ret(tensordict, action, behavior_log_probs, logits, q, next_logits, next_q)
        out = F.categorical_acer_losses(
            logits,
            q,
            average_logits,
            q_ret,
            action,
            behavior_log_probs,
            truncation_threshold=self.truncation_threshold,
            trust_region_delta=self.trust_region_delta,
            entropy_coeff=self.entropy_coeff,
            critic_coeff=self.critic_coeff,
            mask=mask,
        )
        return TensorDict(out, batch_size=[])
