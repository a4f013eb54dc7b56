"""ACER for continuous actions (Wang et al., 2017, arXiv:1611.01224v2, §5) as a TorchRL loss."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from tensordict import TensorDict, TensorDictBase, TensorDictParams
from tensordict.nn import ProbabilisticTensorDictModule, TensorDictModule, TensorDictModuleBase
from tensordict.utils import NestedKey
from torch import Tensor
from torch.distributions import Independent, Normal
from torchrl.modules import IndependentNormal, set_recurrent_mode

import ac_extensions.functional as F
from ac_extensions.functional.masks import masked_mean
from ac_extensions.objectives._replay import (
    PreparedSequences,
    ReplayedSequenceLoss,
    check_sequence_batch,
    run_under,
    unrolled_next_outputs,
)
from ac_extensions.objectives._sequence import valid_mask

_GAUSSIAN_CLASSES = (IndependentNormal, Normal)


def _gaussian(loc: Tensor, scale: Tensor) -> Independent:
    """N(loc, diag scale²) over the last dim: log-densities and entropies sum over the d dims."""
    return Independent(Normal(loc, scale, validate_args=False), 1, validate_args=False)


class ContinuousACERLoss(ReplayedSequenceLoss):
    """Continuous-action ACER: SDN critic, Q^ret / Q^opc, sampled bias correction, trust region.

    Wang et al., 2017, arXiv:1611.01224v2, §5 (continuous actor critic with experience replay)
    and its continuous-action pseudo-code in the appendix. Input: sequences ``[B, T]`` (or
    ``[T]``), fresh or replayed, holding ``observation``, ``action`` (shape [*B, T, d]), the
    behavior policy's Gaussian statistics stored at collection (``("behavior", "loc")`` and
    ``("behavior", "scale")``, shape [*B, T, d] each), and ``("next", ...)`` with ``reward``,
    ``done``, ``terminated`` and the next observation. Output keys (each a scalar; the
    ``loss_*`` entries are summed for backward):

    =======================  =================================================================
    ``loss_critic``          critic_coeff · [½ (Q^ret_t − Q̃(x_t, a_t))² + ½ (V^tgt_t − V(x_t))²]
                             (§5.1: both critic terms folded into one entry, see below)
    ``loss_objective``       −min(c, ρ_t)(Q^opc_t − V_t) log π(a_t|x_t)
                             − [1 − c/ρ_t(a'_t)]_+ (Q̃(x_t, a'_t) − V_t) log π(a'_t|x_t),
                             a'_t ∼ π(·|x_t), with the trust region applied (below)   (§5)
    ``loss_entropy``         −entropy_coeff · H(π(·|x_t))
    diagnostics              ``entropy``, ``ratio_mean``, ``truncation_fraction`` (ρ_t > c),
                             ``trust_region_active`` (fraction of steps with λ_t > 0),
                             ``kl_average`` (KL(π_avg ‖ π)), ``q_ret_mean``, ``q_opc_mean``,
                             ``critic_q_term`` / ``critic_v_term`` (the two halves of
                             ``loss_critic`` before critic_coeff)
    =======================  =================================================================

    All means run over the valid steps (``("collector", "mask")`` honoured).

    **Densities.** π(·|x) = N(loc(x), diag scale(x)²), recomputed from the actor's ``loc`` /
    ``scale``; log π(a|x) = Σ_{i=1}^{d} log N(a_i; loc_i, scale_i), the joint density (summed
    over the d action dims), and likewise µ from the stored behavior statistics. The ratio
    ρ_t = π(a_t|x_t)/µ(a_t|x_t) is the ratio of joint densities.

    **Targets** (constants, no gradient; ACER has no target network, so V and Q̃ come from the
    current critic):

    - Q^ret (§5.1): :func:`~ac_extensions.functional.retrace_targets` on Q̃(x_t, a_t) and
      V(x_{t+1}) with the trace c_t = min(1, ρ_t^{1/d})
      (:func:`~ac_extensions.functional.continuous_acer_trace`),
      G_t = r_t + γ(1 − term_t)[V(x_{t+1}) + (1 − done_t) c_{t+1}(G_{t+1} − Q̃(x_{t+1}, a_{t+1}))].
    - Q^opc (§5): the same recursion with c ≡ 1 (:func:`~ac_extensions.functional.opc_trace`);
      it replaces Q^ret in the policy gradient, as the paper recommends for continuous actions.
    - V^tgt (§5.1): V^tgt_t = min(1, ρ_t)(Q^ret_t − Q̃(x_t, a_t)) + V(x_t). Its critic term
      ½ (V^tgt_t − V(x_t))² has the value ½ (min(1, ρ_t)(Q^ret_t − Q̃_t))² and the gradient
      −min(1, ρ_t)(Q^ret_t − Q̃_t) ∇V(x_t), the pseudo-code's update of the V head. It is
      folded into ``loss_critic`` (so that the usual ``loss_objective + loss_critic +
      loss_entropy`` sum cannot miss it) and reported alone as ``critic_v_term``.

    Q̃ is the stochastic dueling network's estimate (§5.1,
    :class:`~ac_extensions.modules.StochasticDuelingNetwork`): the critic network reads
    ``observation``, ``action`` and the current policy's ``loc`` / ``scale`` (detached; its n
    samples u_i ∼ π(·|x_t) come from them) and writes ``state_value`` V(x) and
    ``action_value`` Q̃(x, a). Called with the observation alone (plus, for a recurrent critic,
    its stored hidden state and ``is_init``) it must write ``state_value`` (used for
    V(x_{t+1})). The gradient of ``loss_critic`` reaches the V and A heads (and a recurrent
    critic's memory) through Q̃ and V, and never the actor.

    **Policy term** (§5): truncated importance sampling with c (paper: 10) on the stored action,
    plus the bias correction estimated with **one** fresh sample a'_t ∼ π(·|x_t) per step
    (:func:`~ac_extensions.functional.truncated_is_policy_loss`,
    :func:`~ac_extensions.functional.sampled_bias_correction_loss`); every weight is detached,
    only log π carries gradient.

    **Efficient trust region** (§5.2 with §3.3, Eq. 11–12), per sample, on the Gaussian
    statistics φ_t = (loc_t, scale_t) (φ = loc alone if the actor's scale has no gradient, the
    paper's fixed-covariance case): with g_t = ∂J_t/∂φ_t the gradient of the step-t objective
    J_t = −(policy loss)_t + entropy_coeff · H_t (entropy included, as the discrete
    :class:`~ac_extensions.objectives.ACERLoss`) and k_t = ∂KL(π_avg ‖ π)/∂φ_t
    (:func:`~ac_extensions.functional.normal_kl_gradient`), the loss adds sg(λ_t)·KL_t with
    λ_t = max(0, (k_tᵀg_t − δ)/‖k_t‖²) (:func:`~ac_extensions.functional.trust_region_loss`),
    so that the gradient reaching φ_t is −z*_t. π_avg comes from the actor's **target
    parameters**, the Polyak-averaged policy: step ``torchrl.objectives.SoftUpdate(loss,
    eps=average_policy_decay)`` after every optimiser step (θ_avg ← α θ_avg + (1 − α) θ,
    paper α = 0.99). ``trust_region_delta=inf`` disables it.

    **Recurrent networks** (a TorchRL ``LSTMModule`` / ``GRUModule`` inside the actor or the
    critic, e.g. :func:`~ac_extensions.modules.make_continuous_actor_critic` with
    ``recurrent="lstm"``): the input also holds the hidden states stored at collection (the
    networks' own keys, e.g. ``actor_recurrent_state_h``, each [*B, T, *H]) and ``is_init``
    (hidden states under ``("next", ...)`` are not read). The networks run in
    recurrent mode over the whole ``[B, T]`` sequence from the state stored at its first step
    (restarting from the stored state where ``is_init`` is set), as
    :class:`~ac_extensions.objectives.ACERLoss`; the next-state values V(x_{t+1}) come from
    that pass too (row t + 1's value where the episode goes on, one more critic step from the
    state the pass reached at episode ends and at the window's end), so they follow the current
    weights. The stored first state may be stale (computed by an older network): ``burn_in``
    rebuilds it (Kapturowski et al., 2019, "Recurrent Experience Replay in Distributed RL",
    R2D2 §3).

    **Randomness.** The fresh actions a'_t and the dueling network's samples u_i are drawn from
    torch's global random number generator: the loss is deterministic under ``torch.manual_seed``
    and stochastic otherwise.

    Args:
        actor_network: module writing the Gaussian statistics ``loc`` and ``scale``
            (shape [*B, T, d] each, scale > 0) from the observation, e.g. the actor of
            :func:`~ac_extensions.modules.make_continuous_actor_critic`. A
            ``ProbabilisticActor`` must use a diagonal Gaussian (``IndependentNormal`` /
            ``Normal``): the loss differentiates that density (a ``TanhNormal`` is refused).
        critic_network: a stochastic dueling network as described above (reads the loss's
            ``action`` / ``loc`` / ``scale`` keys, writes ``state_value`` / ``action_value``).
        gamma: discount γ.
        truncation_threshold: c of the truncated importance weight (paper: 10).
        trust_region_delta: δ (paper: 1; ``inf`` disables the trust region).
        entropy_coeff: entropy bonus coefficient.
        critic_coeff: critic loss coefficient (openai/baselines and pfrl ``Q_loss_coef``: 0.5).
        burn_in: recurrent networks only: the first ``burn_in`` steps of each sequence only
            warm the memories up from the stored state, without gradient, and are left out of
            every loss term and of :meth:`targets` (Kapturowski et al., 2019, R2D2 §3; see
            ``objectives._replay.burn_in``): the losses see T − ``burn_in`` steps, which must be
            at least 1. ``burn_in > 0`` without a recurrent network is a ``ValueError``.

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from ac_extensions.modules import make_continuous_actor_critic
        >>> actor, critic = make_continuous_actor_critic(4, 2, hidden_sizes=(16,))
        >>> loss = ContinuousACERLoss(actor, critic, gamma=0.99)
        >>> td = TensorDict({"observation": torch.randn(2, 5, 4),
        ...     "action": torch.randn(2, 5, 2),
        ...     ("behavior", "loc"): torch.zeros(2, 5, 2),
        ...     ("behavior", "scale"): torch.ones(2, 5, 2),
        ...     ("next", "observation"): torch.randn(2, 5, 4),
        ...     ("next", "reward"): torch.randn(2, 5, 1),
        ...     ("next", "done"): torch.zeros(2, 5, 1, dtype=torch.bool),
        ...     ("next", "terminated"): torch.zeros(2, 5, 1, dtype=torch.bool)}, [2, 5])
        >>> out = loss(td)
        >>> sorted(k for k in out.keys() if k.startswith("loss_"))
        ['loss_critic', 'loss_entropy', 'loss_objective']
        >>> loss.targets(td)["q_ret"].shape
        torch.Size([2, 5, 1])

        Recurrent networks with burn-in (the hidden states and ``is_init`` come from the
        collector; zeros and a reset at t = 0 here):

        >>> actor, critic = make_continuous_actor_critic(
        ...     4, 2, hidden_sizes=(16,), recurrent="gru", recurrent_size=8)
        >>> loss = ContinuousACERLoss(actor, critic, burn_in=2)
        >>> is_init = torch.zeros(2, 5, 1, dtype=torch.bool)
        >>> is_init[:, 0] = True
        >>> for key in ("actor_recurrent_state", "critic_recurrent_state"):
        ...     td[key] = torch.zeros(2, 5, 1, 8)
        ...     td["next", key] = torch.zeros(2, 5, 1, 8)
        >>> td["is_init"], td["next", "is_init"] = is_init, torch.zeros_like(is_init)
        >>> loss.targets(td)["q_ret"].shape  # the last T − burn_in = 3 steps
        torch.Size([2, 3, 1])
    """

    @dataclass
    class _AcceptedKeys:
        """Configurable input keys (change them with ``loss.set_keys(...)``).

        ``action`` (shape [*B, T, d]); ``behavior_loc`` / ``behavior_scale``, the behavior
        policy's statistics stored at collection (the actor's own ``loc`` / ``scale`` entries
        written at collection are exactly that: ``set_keys(behavior_loc="loc",
        behavior_scale="scale")`` reads them in place); ``loc`` / ``scale``, written by the
        actor and read by the critic; ``state_value`` / ``action_value``, written by the
        critic; and the ``("next", ...)`` entries ``reward``, ``done``, ``terminated``.
        """

        action: NestedKey = "action"
        behavior_loc: NestedKey = ("behavior", "loc")
        behavior_scale: NestedKey = ("behavior", "scale")
        loc: NestedKey = "loc"
        scale: NestedKey = "scale"
        state_value: NestedKey = "state_value"
        action_value: NestedKey = "action_value"
        reward: NestedKey = "reward"
        done: NestedKey = "done"
        terminated: NestedKey = "terminated"

    default_keys = _AcceptedKeys
    actor_network: TensorDictModule
    critic_network: TensorDictModuleBase
    actor_network_params: TensorDictParams
    critic_network_params: TensorDictParams
    target_actor_network_params: TensorDictParams
    target_critic_network_params: TensorDictParams

    def __init__(
        self,
        actor_network: TensorDictModule,
        critic_network: TensorDictModuleBase,
        *,
        gamma: float = 0.99,
        truncation_threshold: float = 10.0,
        trust_region_delta: float = 1.0,
        entropy_coeff: float = 0.01,
        critic_coeff: float = 0.5,
        burn_in: int = 0,
    ) -> None:
        super().__init__()
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must lie in [0, 1], got {gamma}")
        if not truncation_threshold > 0 or not trust_region_delta >= 0:
            raise ValueError(
                f"truncation_threshold must be > 0 and trust_region_delta >= 0, got "
                f"{truncation_threshold}, {trust_region_delta}"
            )
        for module in actor_network.modules():
            cls = getattr(module, "distribution_class", None)
            if isinstance(module, ProbabilisticTensorDictModule) and not (
                isinstance(cls, type) and issubclass(cls, _GAUSSIAN_CLASSES)
            ):
                raise ValueError(
                    f"{type(self).__name__}: the actor's distribution is "
                    f"{getattr(cls, '__name__', cls)}, but the loss computes log π with a "
                    f"diagonal Gaussian N(loc, scale) (use IndependentNormal, e.g. "
                    f"ac_extensions.modules.make_continuous_actor_critic)"
                )
        self._tensor_keys = self._AcceptedKeys()
        # The average policy π_avg is the actor's target parameters (kept by SoftUpdate).
        self.convert_to_functional(actor_network, "actor_network", create_target_params=True)
        self.convert_to_functional(critic_network, "critic_network")
        self._init_sequences((actor_network, critic_network), burn_in)
        self.gamma = gamma
        self.truncation_threshold = truncation_threshold
        self.trust_region_delta = trust_region_delta
        self.register_buffer("entropy_coeff", torch.tensor(float(entropy_coeff)))
        self.register_buffer("critic_coeff", torch.tensor(float(critic_coeff)))
        self.reduction = "mean"

    # ------------------------------------------------------------------ keys
    @property
    def in_keys(self) -> list:
        """Keys read from the input."""
        keys = self.tensor_keys
        observations = self._critic_observation_keys()
        return [
            *dict.fromkeys([*self.actor_network.in_keys, *observations]),
            keys.action,
            keys.behavior_loc,
            keys.behavior_scale,
            *(("next", k) for k in observations if k not in self._recurrent_keys),
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
            "q_opc_mean",
            "critic_q_term",
            "critic_v_term",
        ]

    def make_value_estimator(self, value_type=None, **hyperparams):
        """Not supported: Q^ret and Q^opc are computed inside the loss (§5.1)."""
        raise NotImplementedError(
            f"{type(self).__name__} computes Q^ret (trace min(1, ρ^(1/d))) and Q^opc itself with "
            f"ac_extensions.functional.retrace_targets; it takes no value estimator"
        )

    def _forward_value_estimator_keys(self, **kwargs) -> None:
        """No value estimator to forward keys to."""

    def _critic_observation_keys(self) -> list:
        keys = self.tensor_keys
        supplied = {keys.action, keys.loc, keys.scale}
        return [k for k in self.critic_network.in_keys if k not in supplied]

    # ------------------------------------------------------------------ networks
    def _policy_statistics(
        self, tensordict: TensorDictBase, params: TensorDictParams
    ) -> tuple[Tensor, Tensor]:
        """(loc, scale) of π(·|x_t) (or π_avg with the target params), shape [*B, T, d] each."""
        out = run_under(self.actor_network, tensordict, params)
        return out.get(self.tensor_keys.loc), out.get(self.tensor_keys.scale)

    def _critic(
        self,
        tensordict: TensorDictBase,
        action: Tensor | None = None,
        loc: Tensor | None = None,
        scale: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """V(x) and, given an action and π's statistics, Q̃(x, a); shape [*B, T, 1] each."""
        out = self._critic_pass(tensordict, action, loc, scale)
        keys = self.tensor_keys
        return out.get(keys.state_value), out.get(keys.action_value) if action is not None else None

    def _critic_pass(
        self,
        tensordict: TensorDictBase,
        action: Tensor | None = None,
        loc: Tensor | None = None,
        scale: Tensor | None = None,
    ) -> TensorDictBase:
        """Everything the critic writes (V, Q̃ given an action, a recurrent critic's states)."""
        keys = self.tensor_keys
        inputs = tensordict.select(*self._critic_observation_keys(), strict=False).copy()
        if action is not None:
            inputs.set(keys.action, action)
            inputs.set(keys.loc, loc.detach())
            inputs.set(keys.scale, scale.detach())
        with self.critic_network_params.to_module(self.critic_network):
            return self.critic_network(inputs)

    def _run_networks(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Everything the current actor and critic (V only) write; burn-in reads their states."""
        out = run_under(self.actor_network, tensordict, self.actor_network_params)
        return out.update(self._critic_pass(tensordict))

    def _next_state_value(
        self, tensordict: TensorDictBase, value: Tensor, window: TensorDictBase
    ) -> Tensor:
        """V(x_{t+1}), shape [*B, T, 1], detached.

        Feed-forward critic: one pass on ``("next", ...)``. Recurrent networks: V at row t + 1
        where the episode goes on, and one step from the state the critic's pass over the
        window (``window``) reached at episode ends and at the window's end
        (``objectives._replay.unrolled_next_outputs``).
        """
        nxt = tensordict.get("next")
        if not self._recurrent:
            return self._critic(nxt)[0]
        (next_value,) = unrolled_next_outputs(
            nxt,
            (value,),
            (window,),
            lambda steps: (self._critic(steps[0])[0],),
            self._recurrent_keys,
            self.tensor_keys.done,
        )
        return next_value

    # ------------------------------------------------------------------ validation
    def _check_input(self, tensordict: TensorDictBase) -> None:
        """Check keys, shapes and values of the input or raise (naming key, expected, actual)."""
        self._validate_keys(tensordict)
        keys = self.tensor_keys
        check_sequence_batch(type(self).__name__, tensordict, (keys.done, keys.terminated))
        self._validate_behavior(tensordict)
        self._validate_next(tensordict)

    def _validate_keys(self, tensordict: TensorDictBase) -> None:
        keys, name = self.tensor_keys, type(self).__name__
        critic_in = set(self.critic_network.in_keys)
        missing_inputs = [k for k in (keys.action, keys.loc, keys.scale) if k not in critic_in]
        if missing_inputs:
            raise KeyError(
                f"{name}: the critic network must read the action and the policy statistics "
                f"under the loss's keys {missing_inputs}, its in_keys are "
                f"{list(self.critic_network.in_keys)}"
            )
        behavior = (keys.behavior_loc, keys.behavior_scale)
        recurrent = set(self._recurrent_keys)
        for key in self.in_keys:
            if tensordict.get(key, None) is None:
                why = ""
                if key in behavior:
                    why = " (the behavior policy's Gaussian statistics, stored at collection)"
                elif key in recurrent:
                    why = (
                        " (a recurrent network's stored state: build the env with "
                        "ac_extensions.modules.recurrent_env_transforms(collection_policy(actor,"
                        " critic)) and collect with collection_policy(actor, critic))"
                    )
                raise KeyError(
                    f"{name}: the input (batch_size {list(tensordict.batch_size)}) has no key "
                    f"{key!r}" + why
                )

    def _validate_behavior(self, tensordict: TensorDictBase) -> None:
        keys, batch, name = self.tensor_keys, tensordict.batch_size, type(self).__name__
        action = tensordict.get(keys.action)
        if action.dim() != len(batch) + 1 or not action.is_floating_point():
            raise ValueError(
                f"{name}: {keys.action!r} must hold real actions of shape {list(batch)} + [d], "
                f"got shape {list(action.shape)} ({action.dtype})"
            )
        expected = list(action.shape)
        # Values are checked on the valid steps only: padding (zeros) is never used.
        valid = valid_mask(self, tensordict)  # [*B, T] or None

        def on_valid(value: Tensor) -> Tensor:
            return value if valid is None else value[valid]

        for key in (keys.behavior_loc, keys.behavior_scale):
            value = tensordict.get(key)
            if list(value.shape) != expected:
                raise ValueError(
                    f"{name}: {key!r} must have the action's shape {expected} "
                    f"([*B, T, d]), got {list(value.shape)}"
                )
            bad = ~torch.isfinite(on_valid(value))
            if bool(bad.any()):
                raise ValueError(
                    f"{name}: {key!r} (shape {list(value.shape)}) has {int(bad.sum())} "
                    f"non-finite entries"
                )
        scale = on_valid(tensordict.get(keys.behavior_scale))
        if bool((scale <= 0).any()):
            raise ValueError(
                f"{name}: {keys.behavior_scale!r} must be > 0 (a standard deviation), found "
                f"{int((scale <= 0).sum())} entries <= 0 (min {scale.min().item():.4g}) in shape "
                f"{list(scale.shape)}"
            )

    def _validate_next(self, tensordict: TensorDictBase) -> None:
        keys, batch, name = self.tensor_keys, tensordict.batch_size, type(self).__name__
        for key in (keys.reward, keys.done, keys.terminated):
            value = tensordict.get(("next", key))
            if list(value.shape) != [*batch, 1]:
                raise ValueError(
                    f"{name}: ('next', {key!r}) must have shape {[*batch, 1]}, got "
                    f"{list(value.shape)}"
                )
            if key != keys.reward and value.dtype != torch.bool:
                raise ValueError(f"{name}: ('next', {key!r}) must be bool, got {value.dtype}")
        reward = tensordict.get(("next", keys.reward))
        valid = valid_mask(self, tensordict)
        bad = ~torch.isfinite(reward if valid is None else reward[valid])
        if bool(bad.any()):
            raise ValueError(
                f"{name}: ('next', {keys.reward!r}) must be finite with shape {[*batch, 1]}, got "
                f"shape {list(reward.shape)} with {int(bad.sum())} non-finite entries"
            )

    def _check_statistics(self, loc: Tensor, scale: Tensor, action: Tensor) -> None:
        keys, name = self.tensor_keys, type(self).__name__
        for key, value in ((keys.loc, loc), (keys.scale, scale)):
            if value is None or value.shape != action.shape:
                shape = None if value is None else list(value.shape)
                raise ValueError(
                    f"{name}: the actor's {key!r} has shape {shape} but {keys.action!r} has "
                    f"{list(action.shape)}: the action's last dim must be the policy's d"
                )

    # ------------------------------------------------------------------ per-step terms
    def _step_targets(self, tensordict: TensorDictBase) -> dict[str, Tensor]:
        """Everything per step up to the targets; tensors [*B, T, ·], B present."""
        keys = self.tensor_keys
        nxt = tensordict.get("next")
        action = tensordict.get(keys.action)  # a_t                                [*B, T, d]
        loc, scale = self._policy_statistics(tensordict, self.actor_network_params)
        self._check_statistics(loc, scale, action)
        policy = _gaussian(loc, scale)  # π(·|x_t), joint over the d dims
        behavior = _gaussian(tensordict.get(keys.behavior_loc), tensordict.get(keys.behavior_scale))
        log_prob = policy.log_prob(action).unsqueeze(-1)  # log π(a_t|x_t)          [*B, T, 1]
        ratio = F.importance_ratio(
            log_prob.detach(), behavior.log_prob(action).unsqueeze(-1)
        )  # ρ_t = π(a_t|x_t)/µ(a_t|x_t)                                           [*B, T, 1]
        # V(x_t) and Q̃(x_t, a_t) from the stochastic dueling network (§5.1)     [*B, T, 1]
        window = self._critic_pass(tensordict, action, loc, scale)
        value, chosen_q = window.get(keys.state_value), window.get(keys.action_value)
        with torch.no_grad():
            next_value = self._next_state_value(tensordict, value, window)  # V(x_{t+1}) [*B, T, 1]
            reward, done, terminated = (
                nxt.get(k) for k in (keys.reward, keys.done, keys.terminated)
            )
            trace = F.continuous_acer_trace(ratio, action.shape[-1])  # min(1, ρ_t^{1/d})
            q_ret = F.retrace_targets(
                reward, chosen_q, value, next_value, trace, done, terminated, self.gamma
            )  # Q^ret_t                                                             [*B, T, 1]
            q_opc = F.retrace_targets(
                reward,
                chosen_q,
                value,
                next_value,
                F.opc_trace(ratio),
                done,
                terminated,
                self.gamma,
            )  # Q^opc_t (trace ≡ 1)                                                 [*B, T, 1]
            # V^tgt_t = min(1, ρ_t)(Q^ret_t − Q̃(x_t, a_t)) + V(x_t)   (§5.1)         [*B, T, 1]
            value_target = ratio.clamp(max=1.0) * (q_ret - chosen_q) + value
        return {
            "action": action,
            "loc": loc,
            "scale": scale,
            "policy": policy,
            "behavior": behavior,
            "log_prob": log_prob,
            "ratio": ratio,
            "value": value,
            "chosen_q": chosen_q,
            "next_value": next_value,
            "trace": trace,
            "q_ret": q_ret,
            "q_opc": q_opc,
            "value_target": value_target,
        }

    def _prepare(self, tensordict: TensorDictBase) -> PreparedSequences:
        """The shared preparation; padded steps' behavior statistics become N(0, 1).

        Zeros from ``split_trajectories`` at padded steps would give NaN densities; µ's density
        is never used there.
        """
        prepared = super()._prepare(tensordict)
        if prepared.mask is not None:
            keys = self.tensor_keys
            padded = ~prepared.mask.unsqueeze(-1)  # [B, T, 1]
            td = prepared.td.clone(recurse=False)
            for key, fill in ((keys.behavior_loc, 0.0), (keys.behavior_scale, 1.0)):
                td.set(key, td.get(key).masked_fill(padded, fill))
            prepared.td = td
        return prepared

    def targets(self, tensordict: TensorDictBase) -> TensorDictBase:
        """The per-step quantities the loss builds its targets from (detached).

        Recurrent networks run in recurrent mode, as in :meth:`forward`.

        Args:
            tensordict: the same input as :meth:`forward`, batch shape [T] or [B, T].

        Returns:
            A TensorDict with the input's batch shape (with ``burn_in`` > 0: its last
            T − ``burn_in`` steps) holding, each of shape [*B, T, 1]:
            ``ratio`` (ρ_t), ``trace`` (c_t = min(1, ρ_t^{1/d})), ``state_value`` (V(x_t)),
            ``action_value`` (Q̃(x_t, a_t)), ``next_state_value`` (V(x_{t+1})), ``q_ret``,
            ``q_opc`` and ``value_target`` (V^tgt_t). Q̃ is stochastic: under the same seed
            as a :meth:`forward` call, these are the values that call used.
        """
        with set_recurrent_mode(True):
            prepared = self._prepare(tensordict)
            with torch.no_grad():
                step = self._step_targets(prepared.td)
        out = TensorDict(
            {
                "ratio": step["ratio"],
                "trace": step["trace"],
                "state_value": step["value"],
                "action_value": step["chosen_q"],
                "next_state_value": step["next_value"],
                "q_ret": step["q_ret"],
                "q_opc": step["q_opc"],
                "value_target": step["value_target"],
            },
            batch_size=prepared.td.batch_size,
        )
        return out[0] if prepared.single else out

    # ------------------------------------------------------------------ forward
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Compute the continuous ACER losses for a batch of sequences."""
        prepared = self._prepare(tensordict)
        tensordict, mask = prepared.td, prepared.mask  # [B, T]; valid steps [B, T] or None
        step = self._step_targets(tensordict)
        policy, behavior, value = step["policy"], step["behavior"], step["value"].detach()
        loc, scale, ratio = step["loc"], step["scale"], step["ratio"]
        c = self.truncation_threshold

        # Critic (§5.1): ½(Q^ret − Q̃(x_t, a_t))² + ½(V^tgt − V(x_t))², targets constant.
        critic_q = 0.5 * (step["q_ret"] - step["chosen_q"]).pow(2)  #              [*B, T, 1]
        critic_v = 0.5 * (step["value_target"] - step["value"]).pow(2)  #          [*B, T, 1]

        # Bias correction with one fresh action a'_t ∼ π(·|x_t) (§5).
        with torch.no_grad():
            fresh = policy.sample()  # a'_t                                         [*B, T, d]
            _, fresh_q = self._critic(tensordict, fresh, loc, scale)  # Q̃(x_t, a'_t) [*B, T, 1]
        fresh_log_prob = policy.log_prob(fresh).unsqueeze(-1)  # log π(a'_t|x_t)    [*B, T, 1]
        fresh_ratio = F.importance_ratio(
            fresh_log_prob.detach(), behavior.log_prob(fresh).unsqueeze(-1)
        )  # ρ_t(a'_t)                                                              [*B, T, 1]
        policy_loss = F.truncated_is_policy_loss(
            step["log_prob"], ratio, step["q_opc"] - value, c
        ) + F.sampled_bias_correction_loss(fresh_log_prob, fresh_ratio, fresh_q - value, c)
        entropy = policy.entropy().unsqueeze(-1)  # H(π(·|x_t))                    [*B, T, 1]
        objective = -policy_loss + self.entropy_coeff * entropy  # J_t             [*B, T, 1]

        # Efficient trust region, per sample (§5.2, Eq. 11–12), on φ_t = (loc_t, scale_t).
        with torch.no_grad():
            average_loc, average_scale = self._policy_statistics(
                tensordict, self.target_actor_network_params
            )
        kl = torch.distributions.kl_divergence(_gaussian(average_loc, average_scale), policy)
        kl = kl.unsqueeze(-1)  # KL(π_avg ‖ π)                                     [*B, T, 1]
        if math.isinf(self.trust_region_delta) or not loc.requires_grad:
            penalty = torch.zeros_like(kl)
            active = torch.zeros_like(kl)
        else:
            k_loc, k_scale = F.normal_kl_gradient(average_loc, average_scale, loc, scale)
            if scale.requires_grad:  # φ = (loc, scale), D = 2d
                g_loc, g_scale = torch.autograd.grad(
                    objective.sum(), (loc, scale), retain_graph=True
                )  # g_t = ∂J_t/∂φ_t: J_t depends on φ_t only, so the sum's gradient is per sample
                g, k = torch.cat([g_loc, g_scale], -1), torch.cat([k_loc, k_scale], -1)
            else:  # fixed covariance: φ = loc
                (g,) = torch.autograd.grad(objective.sum(), loc, retain_graph=True)
                k = k_loc
            penalty = F.trust_region_loss(kl, g, k, self.trust_region_delta)
            active = (F.trust_region_multiplier(g, k, self.trust_region_delta) > 0).to(kl.dtype)

        return TensorDict(
            {
                "loss_objective": self._mean(policy_loss + penalty, mask),
                "loss_critic": self.critic_coeff * self._mean(critic_q + critic_v, mask),
                "loss_entropy": -self.entropy_coeff * self._mean(entropy, mask),
                "entropy": self._mean(entropy.detach(), mask),
                "ratio_mean": self._mean(ratio, mask),
                "truncation_fraction": self._mean((ratio > c).to(ratio.dtype), mask),
                "trust_region_active": self._mean(active, mask),
                "kl_average": self._mean(kl.detach(), mask),
                "q_ret_mean": self._mean(step["q_ret"], mask),
                "q_opc_mean": self._mean(step["q_opc"], mask),
                "critic_q_term": self._mean(critic_q.detach(), mask),
                "critic_v_term": self._mean(critic_v.detach(), mask),
            },
            batch_size=[],
        )

    _mean = staticmethod(masked_mean)  # mean over valid steps of a [*B, T, 1] tensor
