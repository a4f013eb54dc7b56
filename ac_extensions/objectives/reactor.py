"""Reactor (Gruslys et al., 2018, arXiv:1704.04651v2) as a TorchRL loss over replayed sequences."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from tensordict import TensorDict, TensorDictBase, TensorDictParams
from tensordict.nn import TensorDictModule
from tensordict.utils import NestedKey
from torch import Tensor
from torchrl.modules import set_recurrent_mode

import ac_extensions.functional as F
from ac_extensions.functional.masks import masked_mean
from ac_extensions.objectives._replay import (
    ReplayedSequenceLoss,
    assemble_next,
    check_sequence_batch,
    joint_inputs,
    next_step_outputs,
    next_step_plan,
    run_under,
    split_joint,
    unrolled_next_outputs,
)

__all__ = ["ReactorLoss"]


@dataclass
class _Terms:
    """Per-step quantities of one forward pass, batch [*B, T] (a [T] input gets B = 1)."""

    td: TensorDictBase  # the input, with a batch dim added for a single sequence
    mask: Tensor | None  # its valid (unpadded) steps                   [*B, T]; None: all
    probs: Tensor  # π(·|x_t), carries gradient                        [*B, T, A]
    log_probs: Tensor  # log π(·|x_t)                                   [*B, T, A]
    action: Tensor  # a_t                                               [*B, T, 1]
    behavior_prob: Tensor  # µ(a_t|x_t)                                 [*B, T, 1]
    ratio: Tensor  # ρ_t = π(a_t|x_t)/µ(a_t|x_t)                        [*B, T, 1]
    q: Tensor  # Q(x_t, ·) of the online critic (E[Z]), with gradient   [*B, T, A]
    critic: Tensor  # per-step critic loss                              [*B, T, 1]
    target: Tensor  # q*_t [*B, T, N], or G_t [*B, T, 1] (Reactor ND)
    corrected_return: Tensor  # G_t = Σ_i z_i q*_t(i), or G_t           [*B, T, 1]
    chosen_distribution: Tensor | None  # q(x_t, a_t, ·), online, detached [*B, T, N]; ND: None


class ReactorLoss(ReplayedSequenceLoss):
    """Reactor: distributional Retrace critic with a target network and β-LOO policy gradient.

    Input: replayed sequences ``[B, T]`` (or one sequence ``[T]``) holding the network inputs
    (``observation``, hidden states for recurrent networks), ``action`` (indices), the behavior
    policy's log-probability of the taken action stored at collection (``action_log_prob``,
    TorchRL's ``sample_log_prob``, shape ``[*B, T]`` or ``[*B, T, 1]``) and ``("next", ...)``
    with ``reward``, ``done``, ``terminated`` and the next network inputs.

    Critic (Gruslys et al., 2018, arXiv:1704.04651v2, §3.2). Categorical over the support
    z_i = v_min + iΔz, i < N; q_i(x, a) = softmax_i of ``action_value_logits`` ([*B, T, A, N],
    atoms last) and Q(x, a) = Σ_i z_i q_i(x, a). The target q*_t is the distributional Retrace
    target (:func:`~ac_extensions.functional.distributional_retrace_targets`)

        q*_t = Φ[ Σ_{n≥1} Σ_a α_{n,a} q(x_{t+n}, a, ·) shifted to G_{t,n} + γ^n z ],
        α_{n,a} = (Π_{s=t+1}^{t+n−1} c_s)(π(a|x_{t+n}) − 𝟙{a = a_{t+n}} c_{t+n}),
        c_s = λ min(1, ρ_s),  ρ_s = π(a_s|x_s)/µ(a_s|x_s)

    (the Retrace(λ) trace, Munos et al., 2016, arXiv:1606.02647v1, Eq. 4), with the bootstrap
    distributions q(x_{t+n}, ·) from the **target network** and π from the current policy
    (detached). The target is a signed mixture (α can be negative); it is used as is, without
    clipping or renormalisation (it still sums to 1). ``distributional=False`` gives
    "Reactor ND": the critic writes ``action_value`` ([*B, T, A]) and the target is the scalar
    Retrace target G_t (:func:`~ac_extensions.functional.retrace_targets`) with Q and
    V = Σ_a π(a) Q(a) from the target network.

    Policy (§3.1, β-LOO, :func:`~ac_extensions.functional.beta_loo_policy_loss`): with â = a_t,
    R(â) = G_t the Retrace return of the taken action (the mean Σ_i z_i q*_t(i) of the
    distributional target) and Q = E[Z] from the online critic (detached),

        Ĝ = β (R(â) − Q(x_t, â)) ∇π(â|x_t) + Σ_a Q(x_t, a) ∇π(a|x_t),   β = min(c, 1/µ(â|x_t)).

    Output keys (scalars; the ``loss_*`` terms are summed for backward; w_t is the optional IS
    weight, 1 without it; means run over the valid steps):

    ==========================  ===================================================================
    ``loss_objective``          mean_t w_t · −[β(R − Q(â))π(â) + Σ_a Q(a)π(a)]            (§3.1)
    ``loss_critic``             critic_coeff · mean_t w_t · −Σ_i q*_t(i) log q_i(x_t, a_t)  (§3.2);
                                ND: critic_coeff · mean_t w_t · ½(G_t − Q(x_t, a_t))²
    ``loss_entropy``            −entropy_coeff · mean_t w_t · H(π(·|x_t))
    ``entropy``                 mean H(π(·|x_t))
    ``ratio_mean``              mean ρ_t
    ``beta_mean``               mean β_t
    ``q_mean``                  mean Q(x_t, a_t) of the online critic
    ``target_negative_mass``    mean Σ_i max(0, −q*_t(i)) (0 in ND): how signed the targets are
    ``td_error_mean``           mean |G_t − Q(x_t, a_t)|
    ==========================  ===================================================================

    Priorities: the loss writes into the **input** TensorDict, under ``tensor_keys.priority``
    (``"td_error"``), the per-sequence priority
    (:func:`~ac_extensions.functional.sequence_priority`)

        p = η max_t δ_t + (1 − η) mean_t δ_t

    over the valid steps, repeated at every step (shape [*B, T], like the input's batch), so
    that ``rb.update_tensordict_priority(sample)`` works. The paper's (§3.3, the default,
    ``priority_metric="auto"``, η = 0): the mean along the sequence of the total variation
    δ_t = ½ Σ_i |q*_t(i) − q_i(x_t, a_t)| between the target and the online critic's
    distribution (distributional critic, ``"tv"``), or of |G_t − Q(x_t, a_t)| (scalar critic,
    ``"td"``). ``priority_metric="td"`` with the distributional critic compares only the
    means, which is ~0 for two distributions that disagree completely but share their mean;
    ``priority_eta=0.9`` is R2D2's max/mean mixture (Kapturowski et al., 2019): both were this
    library's defaults before, kept as named options. If the input holds
    ``tensor_keys.priority_weight``
    (``"priority_weight"``, [*B, T] or [*B, T, 1]: one weight per step, a sequence's weight
    repeated at its steps, as TorchRL's samplers write it into a sample) and
    ``use_prioritized_weights`` is not False, every per-step loss is multiplied by it before the
    mean (Schaul et al., 2016, arXiv:1511.05952; not TorchRL's Σwl/Σw, which would ignore the
    weights' scale; TorchRL's samplers already normalise them by their max).

    Masks, episode ends: padded steps (``("collector", "mask")``) are left out of every mean and
    of the priority. ``done`` cuts the traces, ``terminated`` stops the bootstrap, a truncated
    step bootstraps from its own ``("next", observation)``.

    Networks: an actor writing ``logits`` and either a separate ``critic_network`` or
    ``critic_network=None`` with an actor that writes the critic's output in the same pass
    (shared torso). The target network is the critic's (or the shared network's) target
    parameters (``create_target_params=True``): keep them with
    ``torchrl.objectives.HardUpdate(loss, value_network_update_interval=K)`` stepped after
    every optimiser step. Recurrent networks (``LSTMModule`` / ``GRUModule`` inside) run over
    the whole sequence from the hidden state stored at its first step; the outputs at the next
    states come step by step from the hidden states stored under ``("next", ...)``.
    Feed-forward networks reuse the outputs of row t + 1 for x_{t+1} where the episode goes on.
    ``bootstrap_states`` picks where a recurrent network's state at x_{t+1} comes from:
    ``"unroll"`` (default) reuses the pass over the window (row t + 1's outputs, and for the
    window's last step and every episode end inside it one more step from the state the pass
    reached there), so burn-in and weight changes refresh the targets as well as the
    predictions; ``"stored"`` starts every x_{t+1} from the state stored at collection under
    ``("next", ...)`` (cheaper, but stale by as many updates as the data is old).

    Args:
        actor_network: module writing the policy logits (``logits``, [*B, T, A]); a TorchRL
            ``ProbabilisticActor`` works (its distribution parameters are used).
        critic_network: module writing ``action_value_logits`` ([*B, T, A, N]) or, if not
            ``distributional``, ``action_value`` ([*B, T, A]); ``None`` if the actor writes it.
        distributional: categorical critic (Reactor) or scalar critic (Reactor ND).
        v_min: z_0, lowest atom. The default ±10 and 51 atoms are C51's (Bellemare et al.,
            2017, arXiv:1707.06887); Reactor's values are unverified.
        v_max: z_{N−1}, highest atom.
        num_atoms: N >= 2.
        gamma: discount γ.
        lmbda: Retrace λ ∈ [0, 1]; 1, ACER's Q^ret trace and Reactor's (Gruslys et al., 2018,
            arXiv:1704.04651v2, appendix).
        loo_threshold: c >= 0 of β = min(c, 1/µ(â)). c = 1 ⇒ plain leave-one-out (β = 1, as
            µ <= 1), c = inf ⇒ unbiased (β = 1/µ, high variance), c = 0 ⇒ critic-only gradient
            Σ_a Q(a)∇π(a). Default 1, the paper's β = 1 (Gruslys et al., 2018,
            arXiv:1704.04651v2, appendix).
        entropy_coeff: entropy bonus coefficient (0.01 as A3C/ACER; Reactor's unverified).
        critic_coeff: critic loss coefficient.
        priority_eta: η ∈ [0, 1] of the priority aggregation (0: the paper's mean).
        priority_metric: per-step error δ_t of the priority: ``"auto"`` (the paper's: ``"tv"``
            for the distributional critic, ``"td"`` for ND), ``"tv"`` (total variation between
            q*_t and q(x_t, a_t); distributional only) or ``"td"`` (|G_t − Q(x_t, a_t)|).
        bootstrap_states: ``"unroll"`` or ``"stored"``: where a recurrent network's state at
            x_{t+1} comes from (see above; no effect on feed-forward networks).

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.objectives import HardUpdate
        >>> class Critic(torch.nn.Linear):
        ...     def forward(self, x):
        ...         return super().forward(x).unflatten(-1, (3, 51))  # [*B, T, A, N]
        >>> actor = TensorDictModule(torch.nn.Linear(4, 3), ["observation"], ["logits"])
        >>> critic = TensorDictModule(Critic(4, 3 * 51), ["observation"],
        ...                           ["action_value_logits"])
        >>> loss = ReactorLoss(actor, critic, gamma=0.99)
        >>> updater = HardUpdate(loss, value_network_update_interval=100)
        >>> td = TensorDict({"observation": torch.randn(2, 5, 4),
        ...     "action": torch.randint(3, (2, 5)), "action_log_prob": torch.full((2, 5), -1.1),
        ...     ("next", "observation"): torch.randn(2, 5, 4),
        ...     ("next", "reward"): torch.randn(2, 5, 1),
        ...     ("next", "done"): torch.zeros(2, 5, 1, dtype=torch.bool),
        ...     ("next", "terminated"): torch.zeros(2, 5, 1, dtype=torch.bool)}, [2, 5])
        >>> out = loss(td)
        >>> sorted(k for k in out.keys() if k.startswith("loss_"))
        ['loss_critic', 'loss_entropy', 'loss_objective']
        >>> td["td_error"].shape  # the per-sequence priority, at every step
        torch.Size([2, 5])
    """

    @dataclass
    class _AcceptedKeys:
        """Configurable keys (change them with ``loss.set_keys(...)``).

        Read: ``action`` (indices, [*B, T]), ``sample_log_prob`` (log µ(a_t|x_t) stored at
        collection, [*B, T] or [*B, T, 1]), the network outputs ``logits`` and
        ``action_value_logits`` (or ``action_value`` in ND mode), the ``("next", ...)`` entries
        ``reward``, ``done``, ``terminated``, and the optional IS weight ``priority_weight``.
        Written into the input: ``priority`` (the per-sequence priority, [*B, T]).
        """

        action: NestedKey = "action"
        sample_log_prob: NestedKey = "action_log_prob"
        logits: NestedKey = "logits"
        action_value_logits: NestedKey = "action_value_logits"
        action_value: NestedKey = "action_value"
        reward: NestedKey = "reward"
        done: NestedKey = "done"
        terminated: NestedKey = "terminated"
        priority: NestedKey = "td_error"
        priority_weight: NestedKey = "priority_weight"

    default_keys = _AcceptedKeys
    actor_network: TensorDictModule
    critic_network: TensorDictModule
    actor_network_params: TensorDictParams
    critic_network_params: TensorDictParams
    target_actor_network_params: TensorDictParams
    target_critic_network_params: TensorDictParams

    def __init__(
        self,
        actor_network: TensorDictModule,
        critic_network: TensorDictModule | None = None,
        *,
        distributional: bool = True,
        v_min: float = -10.0,
        v_max: float = 10.0,
        num_atoms: int = 51,
        gamma: float = 0.99,
        lmbda: float = 1.0,
        loo_threshold: float = 1.0,
        entropy_coeff: float = 0.01,
        critic_coeff: float = 1.0,
        priority_eta: float = 0.0,
        priority_metric: str = "auto",
        bootstrap_states: str = "unroll",
    ) -> None:
        super().__init__()
        for name, value in (("gamma", gamma), ("lmbda", lmbda), ("priority_eta", priority_eta)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {value}")
        if not (v_min < v_max and num_atoms >= 2):
            raise ValueError(
                f"need v_min < v_max and num_atoms >= 2, got {v_min}, {v_max}, {num_atoms}"
            )
        if math.isnan(loo_threshold) or loo_threshold < 0:
            raise ValueError(f"loo_threshold must be >= 0 (inf allowed), got {loo_threshold}")
        if priority_metric not in ("auto", "tv", "td"):
            raise ValueError(
                f"priority_metric must be 'auto', 'tv' or 'td', got {priority_metric!r}"
            )
        if priority_metric == "tv" and not distributional:
            raise ValueError("priority_metric='tv' needs the distributional critic")
        if bootstrap_states not in ("unroll", "stored"):
            raise ValueError(
                f"bootstrap_states must be 'unroll' or 'stored', got {bootstrap_states!r}"
            )
        self._tensor_keys = self._AcceptedKeys()
        self._shared_head = critic_network is None
        self._init_sequences((actor_network, critic_network))
        # The bootstrap comes from a target copy of the critic (of the shared net if shared).
        self.convert_to_functional(
            actor_network, "actor_network", create_target_params=self._shared_head
        )
        if not self._shared_head:
            self.convert_to_functional(critic_network, "critic_network", create_target_params=True)
        self.distributional = distributional
        self.gamma = gamma
        self.lmbda = lmbda
        self.loo_threshold = float(loo_threshold)
        self.priority_eta = priority_eta
        if priority_metric == "auto":
            priority_metric = "tv" if distributional else "td"
        self.priority_metric = priority_metric
        self.bootstrap_states = bootstrap_states
        self.register_buffer("support", torch.linspace(v_min, v_max, num_atoms))
        self.register_buffer("entropy_coeff", torch.tensor(float(entropy_coeff)))
        self.register_buffer("critic_coeff", torch.tensor(float(critic_coeff)))
        self.reduction = "mean"

    # ------------------------------------------------------------------ keys
    @property
    def _critic_key(self) -> NestedKey:
        keys = self.tensor_keys
        return keys.action_value_logits if self.distributional else keys.action_value

    def _network_in_keys(self) -> list:
        critic = [] if self._shared_head else list(self.critic_network.in_keys)
        return list(dict.fromkeys([*self.actor_network.in_keys, *critic]))

    @property
    def in_keys(self) -> list:
        """Keys read from the input."""
        keys = self.tensor_keys
        net_keys = self._network_in_keys()
        return [
            *net_keys,
            keys.action,
            keys.sample_log_prob,
            *(("next", k) for k in net_keys),
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
            "beta_mean",
            "q_mean",
            "target_negative_mass",
            "td_error_mean",
        ]

    def make_value_estimator(self, value_type=None, **hyperparams):
        """Not supported: Reactor's targets need the target network and the stored µ(a_t|x_t).

        The Retrace targets are computed in the loss with ``gamma`` and ``lmbda`` (constructor
        arguments or attributes). Calling this without arguments is a no-op.
        """
        if value_type is None and not hyperparams:
            return self
        raise NotImplementedError(
            f"{type(self).__name__} computes its (distributional) Retrace targets itself, from "
            f"the target network; set loss.gamma / loss.lmbda instead of a value estimator"
        )

    # ------------------------------------------------------------------ networks
    def _actor(self, tensordict: TensorDictBase, params: TensorDictParams) -> TensorDictBase:
        return run_under(self.actor_network, tensordict, params)

    def _critic_pass(self, tensordict: TensorDictBase, params: TensorDictParams) -> TensorDictBase:
        """The critic's (or the shared actor's) whole output under ``params``."""
        if self._shared_head:
            out = self._actor(tensordict, params)
            if out.get(self._critic_key, None) is None:
                raise KeyError(
                    f"{type(self).__name__}: critic_network is None but the actor wrote no "
                    f"{self._critic_key!r} (batch_size {list(tensordict.batch_size)})"
                )
            return out
        return run_under(self.critic_network, tensordict, params)

    def _critic(self, tensordict: TensorDictBase, params: TensorDictParams) -> Tensor:
        """The critic's output key, read from the critic (or the shared actor) under params."""
        return self._critic_pass(tensordict, params).get(self._critic_key)

    def _online(self, tensordict: TensorDictBase) -> tuple[Tensor, Tensor, TensorDictBase]:
        """Online policy logits, critic output and the whole online pass.

        Returns logits [*B, T, A], the critic output ([*B, T, A, N] or [*B, T, A]) and the
        pass's outputs (holding the recurrent states it reached).
        """
        out = self._actor(tensordict, self.actor_network_params)
        logits = out.get(self.tensor_keys.logits)
        if self._shared_head:
            critic = out.get(self._critic_key, None)
            if critic is None:
                raise KeyError(
                    f"{type(self).__name__}: critic_network is None but the actor wrote no "
                    f"{self._critic_key!r} beside {self.tensor_keys.logits!r} of shape "
                    f"{list(logits.shape)}"
                )
            return logits, critic, out
        critic_out = self._critic_pass(tensordict, self.critic_network_params)
        return logits, critic_out.get(self._critic_key), out.update(critic_out)

    def _target_params(self) -> TensorDictParams:
        if self._shared_head:
            return self.target_actor_network_params
        return self.target_critic_network_params

    def _bootstrap_outputs(self, tensordict: TensorDictBase) -> tuple[Tensor, Tensor]:
        """Current policy logits and target-network critic output at the given inputs."""
        logits = self._actor(tensordict, self.actor_network_params).get(self.tensor_keys.logits)
        return logits, self._critic(tensordict, self._target_params())

    # ------------------------------------------------------------------ validation
    def _fail_missing(self, tensordict: TensorDictBase, key: NestedKey, why: str) -> None:
        raise KeyError(
            f"{type(self).__name__}: the input (batch_size {list(tensordict.batch_size)}) has "
            f"no key {key!r} ({why})"
        )

    def _check_keys(self, tensordict: TensorDictBase) -> None:
        keys = self.tensor_keys
        required = {
            keys.action: "the action taken at collection",
            keys.sample_log_prob: "log µ(a_t|x_t) stored at collection: build the actor with "
            "return_log_prob=True",
            ("next", keys.reward): "the reward",
            ("next", keys.done): "the done flag",
            ("next", keys.terminated): "the terminated flag",
        }
        for key in self._network_in_keys():
            required.setdefault(key, "an input of the networks")
            if key not in self._recurrent_keys:
                required.setdefault(("next", key), "the next input of the networks")
        for key, why in required.items():
            if tensordict.get(key, None) is None:
                self._fail_missing(tensordict, key, why)

    def _check_input(self, tensordict: TensorDictBase) -> None:
        keys, batch, name = self.tensor_keys, tensordict.batch_size, type(self).__name__
        self._check_keys(tensordict)
        check_sequence_batch(name, tensordict, (keys.done, keys.terminated))
        action = tensordict.get(keys.action)
        if action.shape != batch or action.is_floating_point() or action.dtype == torch.bool:
            raise ValueError(
                f"{name}: {keys.action!r} must hold integer action indices of shape "
                f"{list(batch)}, got {list(action.shape)} ({action.dtype})"
            )
        log_mu = tensordict.get(keys.sample_log_prob)
        if log_mu.shape not in (batch, (*batch, 1)) or not log_mu.is_floating_point():
            raise ValueError(
                f"{name}: {keys.sample_log_prob!r} (log µ(a_t|x_t)) must be a float tensor of "
                f"shape {list(batch)} or {[*batch, 1]}, got {list(log_mu.shape)} ({log_mu.dtype})"
            )
        log_mu = log_mu.reshape(*batch, 1)
        if bool((log_mu.isnan() | (log_mu == -math.inf)).any()):
            raise ValueError(
                f"{name}: the behavior probability of the taken action is 0 or NaN at "
                f"{int((~(log_mu > -math.inf)).sum())} steps ({keys.sample_log_prob!r}, shape "
                f"{list(log_mu.shape)}): the data cannot come from that policy"
            )
        for key in (keys.reward, keys.done, keys.terminated):
            value = tensordict.get(("next", key))
            if value.shape != (*batch, 1):
                raise ValueError(
                    f"{name}: ('next', {key!r}) must have shape {[*batch, 1]}, got "
                    f"{list(value.shape)}"
                )
        reward = tensordict.get(("next", keys.reward))
        if not bool(torch.isfinite(reward).all()):
            raise ValueError(
                f"{name}: ('next', {keys.reward!r}) (shape {list(reward.shape)}) has "
                f"{int((~torch.isfinite(reward)).sum())} non-finite entries"
            )

    def _check_outputs(self, batch: torch.Size, logits: Tensor, critic: Tensor, action) -> None:
        name, keys = type(self).__name__, self.tensor_keys
        if logits.dim() != len(batch) + 1 or logits.shape[:-1] != batch:
            raise ValueError(
                f"{name}: {keys.logits!r} must have shape {[*batch, 'A']}, got {list(logits.shape)}"
            )
        num_actions = logits.shape[-1]
        expected = [*batch, num_actions] + ([self.support.shape[0]] if self.distributional else [])
        if list(critic.shape) != expected:
            raise ValueError(
                f"{name}: {self._critic_key!r} must have shape {expected} (atoms last), got "
                f"{list(critic.shape)}"
            )
        if bool(((action < 0) | (action >= num_actions)).any()):
            raise ValueError(
                f"{name}: {keys.action!r} holds indices outside [0, {num_actions}) (shape "
                f"{list(action.shape[:-1])})"
            )

    # ------------------------------------------------------------------ math
    def _terms(self, tensordict: TensorDictBase) -> _Terms:
        """Every per-step quantity of the losses; the targets are detached."""
        keys = self.tensor_keys
        prepared = self._prepare(tensordict)  # checked, [B, T], traces cut at padding
        tensordict = prepared.td
        nxt = tensordict.get("next")
        batch = tensordict.batch_size
        action = tensordict.get(keys.action).unsqueeze(-1)  # a_t                 [B, T, 1]
        log_mu = tensordict.get(keys.sample_log_prob).reshape(*batch, 1)  # log µ(a_t|x_t)
        if self._recurrent:
            logits, critic, online_pass = self._online(tensordict)
        else:  # one pass over x_t and the next observations not in the window (joint_inputs)
            fresh = next_step_plan(tensordict, nxt, self._network_in_keys(), keys.done)
            joint = joint_inputs(tensordict, nxt, fresh, self._network_in_keys())
            joint_logits, joint_critic, online_pass = self._online(joint)
            (logits, fresh_logits), (critic, _) = (
                split_joint(joint_logits, batch),
                split_joint(joint_critic, batch),
            )
        self._check_outputs(batch, logits, critic, action)
        log_probs = logits.log_softmax(-1)  # log π(·|x_t)                        [*B, T, A]
        probs = log_probs.exp()
        dtype = logits.dtype
        reward = nxt.get(keys.reward).to(dtype)  # r_t                            [*B, T, 1]
        done, terminated = nxt.get(keys.done), nxt.get(keys.terminated)
        support = self.support.to(logits.device, dtype)  # the networks' device
        with torch.no_grad():
            if not self._recurrent:
                target_joint = self._critic(joint, self._target_params())
                target_now, fresh_target = split_joint(target_joint, batch)
                next_logits, target_next = assemble_next(
                    (logits, target_now), (fresh_logits, fresh_target), fresh
                )
            elif self.bootstrap_states == "unroll":
                target_pass = self._critic_pass(tensordict, self._target_params())
                target_now = target_pass.get(self._critic_key)
                next_logits, target_next = unrolled_next_outputs(
                    nxt,
                    (logits, target_now),
                    (online_pass, target_pass),
                    lambda steps: (
                        self._actor(steps[0], self.actor_network_params).get(keys.logits),
                        self._critic(steps[1], self._target_params()),
                    ),
                    self._recurrent_keys,
                    keys.done,
                )
            else:
                target_now = self._critic(tensordict, self._target_params())
                next_logits, target_next = next_step_outputs(
                    tensordict,
                    nxt,
                    (logits, target_now),
                    self._bootstrap_outputs,
                    self._network_in_keys(),
                    keys.done,
                    True,
                )
            next_probs = next_logits.softmax(-1)  # π(·|x_{t+1}), current policy   [*B, T, A]
            target, corrected_return, ratio = F.reactor_critic_targets(
                log_probs,
                target_now,
                next_probs,
                target_next,
                action,
                log_mu,
                reward,
                done,
                terminated,
                self.gamma,
                self.lmbda,
                support if self.distributional else None,
            )  # q*_t [*B, T, N] or G_t [*B, T, 1]; Σ_i z_i q*_i [*B, T, 1]; ρ_t [*B, T, 1]
        critic_loss, q, chosen_distribution = F.reactor_critic_loss(
            critic, target, action, support if self.distributional else None
        )  # [*B, T, 1]; Q(x_t, ·) [*B, T, A]; q(x_t, a_t, ·) [*B, T, N] or None
        return _Terms(
            td=tensordict,
            mask=prepared.mask,
            probs=probs,
            log_probs=log_probs,
            action=action,
            behavior_prob=log_mu.to(dtype).exp(),
            ratio=ratio,
            q=q,
            critic=critic_loss,
            target=target,
            corrected_return=corrected_return,
            chosen_distribution=chosen_distribution,
        )

    def targets(self, tensordict: TensorDictBase) -> Tensor:
        """The critic's target for a batch of sequences (no loss, no priority written).

        Distributional: q*_t = Φ[Σ_n Σ_a α_{n,a} q̄(x_{t+n}, a, ·) at G_{t,n} + γ^n z] from the
        target network (Gruslys et al., 2018, arXiv:1704.04651v2, §3.2); ND: the scalar Retrace
        target G_t (Munos et al., 2016, arXiv:1606.02647v1, Eq. 4).

        Args:
            tensordict: input sequences, batch [*B, T] or [T], as for ``forward``.

        Returns:
            q*_t of shape [*B, T, N] (a signed mixture summing to 1), or G_t of shape
            [*B, T, 1] in ND mode; detached. A [T] input gives [T, N] / [T, 1].

        Example:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from tensordict.nn import TensorDictModule
            >>> from torchrl.objectives import HardUpdate
            >>> actor = TensorDictModule(torch.nn.Linear(4, 2), ["observation"], ["logits"])
            >>> critic = TensorDictModule(torch.nn.Linear(4, 2), ["observation"],
            ...                           ["action_value"])
            >>> loss = ReactorLoss(actor, critic, distributional=False)
            >>> _ = HardUpdate(loss, value_network_update_interval=100)
            >>> td = TensorDict({"observation": torch.randn(3, 4),
            ...     "action": torch.zeros(3, dtype=torch.long),
            ...     "action_log_prob": torch.full((3,), -0.7),
            ...     ("next", "observation"): torch.randn(3, 4),
            ...     ("next", "reward"): torch.ones(3, 1),
            ...     ("next", "done"): torch.ones(3, 1, dtype=torch.bool),
            ...     ("next", "terminated"): torch.ones(3, 1, dtype=torch.bool)}, [3])
            >>> with torch.no_grad():
            ...     loss.targets(td)  # every step terminal: G_t = r_t
            tensor([[1.],
                    [1.],
                    [1.]])
        """
        single = tensordict.batch_dims == 1
        with set_recurrent_mode(True):
            target = self._terms(tensordict).target.detach()
        return target.squeeze(0) if single else target

    # ------------------------------------------------------------------ forward
    def _sample_weight(self, tensordict: TensorDictBase, batch: torch.Size) -> Tensor | None:
        """IS weights w_t as [*B, T, 1]; None if absent or ``use_prioritized_weights`` is off."""
        if self.use_prioritized_weights not in (True, "auto"):
            return None
        weight = tensordict.get(self.tensor_keys.priority_weight, None)
        if weight is None:
            return None
        given = tensordict.batch_size
        if weight.shape not in (given, (*given, 1)):
            raise ValueError(
                f"{type(self).__name__}: {self.tensor_keys.priority_weight!r} must have shape "
                f"{list(given)} or {[*given, 1]} (one weight per step; a sequence's weight "
                f"repeated at its steps), got {list(weight.shape)}"
            )
        return weight.reshape(batch).unsqueeze(-1)

    def _write_priority(
        self, tensordict: TensorDictBase, error: Tensor, mask: Tensor | None
    ) -> None:
        """Write p = η max_t δ_t + (1 − η) mean_t δ_t (valid steps) at every step of the input."""
        priority = F.sequence_priority(error, mask, self.priority_eta)  # [*B]
        steps = error.shape[-2]
        priority = priority.unsqueeze(-1).expand(*priority.shape, steps)
        priority = priority.reshape(tensordict.batch_size).clone()
        if tensordict.device is not None:
            priority = priority.to(tensordict.device)
        tensordict.set(self.tensor_keys.priority, priority.detach(), inplace=True)

    _mean = staticmethod(masked_mean)  # mean over valid steps of a [*B, T, 1] tensor

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Compute the Reactor losses for a batch of sequences and write their priorities."""
        x = self._terms(tensordict)
        batch = x.td.batch_size
        mask = x.mask  # [*B, T] or None
        weight = self._sample_weight(tensordict, batch)  # [*B, T, 1] or None
        c = self.loo_threshold
        policy_loss = F.beta_loo_policy_loss(
            x.probs, x.action, x.behavior_prob, x.q, x.corrected_return, c
        )  # −[β(R − Q(â))π(â) + Σ_a Q(a)π(a)]                                 [*B, T, 1]
        entropy = -(x.probs * x.log_probs).sum(-1, keepdim=True)  # H(π(·|x_t))  [*B, T, 1]
        with torch.no_grad():
            chosen_q = x.q.gather(-1, x.action)  # Q(x_t, a_t)                   [*B, T, 1]
            td_error = (x.corrected_return - chosen_q).abs()  # |G_t − Q(x_t, a_t)|  [*B, T, 1]
            if self.priority_metric == "tv":  # ½ Σ_i |q*_t(i) − q_i(x_t, a_t)|     [*B, T, 1]
                error = F.total_variation(x.target, x.chosen_distribution)
            else:
                error = td_error
            beta = x.behavior_prob.reciprocal().clamp(max=c)  # β = min(c, 1/µ(â))
            negative = (-x.target).clamp_min(0).sum(-1, keepdim=True)  # Σ_i max(0, −q*_i)
            if not self.distributional:
                negative = torch.zeros_like(negative)
        self._write_priority(tensordict, error, mask)
        mean = self._mean
        return TensorDict(
            {
                "loss_objective": mean(policy_loss, mask, weight),
                "loss_critic": self.critic_coeff * mean(x.critic, mask, weight),
                "loss_entropy": -self.entropy_coeff * mean(entropy, mask, weight),
                "entropy": mean(entropy.detach(), mask),
                "ratio_mean": mean(x.ratio, mask),
                "beta_mean": mean(beta, mask),
                "q_mean": mean(chosen_q, mask),
                "target_negative_mass": mean(negative, mask),
                "td_error_mean": mean(td_error, mask),
            },
            batch_size=[],
        )
