"""PPO for ``[B, T]`` batches: TorchRL's ``ClipPPOLoss`` plus what it lacks on sequences."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import TensorDictBase
from tensordict.nn import ProbabilisticTensorDictSequential, TensorDictModule, dispatch
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.utils import distance_loss

from ac_extensions.modules import shared_features
from ac_extensions.objectives._sequence import SequenceLossMixin
from ac_extensions.objectives.addons import PolicyLossAddon


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

    Args:
        actor_network: a TorchRL probabilistic actor (feed-forward or with ``LSTMModule`` /
            ``GRUModule``; the loss runs it in recurrent mode over whole sequences).
        critic_network: a value operator writing ``state_value``.
        addons: policy-loss add-ons, each ``(tensordict, dist) -> {name: per-step tensor}``.
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
    """

    def __init__(
        self,
        actor_network: ProbabilisticTensorDictSequential,
        critic_network: TensorDictModule | None = None,
        *,
        addons: Sequence[PolicyLossAddon] = (),
        **kwargs,
    ) -> None:
        super().__init__(actor_network, critic_network, **kwargs)
        self._init_sequence(addons)

    # ------------------------------------------------------------------ forward
    @dispatch
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
        networks = () if self.functional else (self.actor_network, self.critic_network)
        with shared_features(*networks):  # a torso shared by actor and critic runs once
            out = super().forward(tensordict)
        return self._finish(tensordict, out)

    def _set_in_keys(self):
        # TorchRL's inputs, plus the advantage and value target, so that keyword calls
        # (``loss(observation=..., advantage=..., ...)`` through ``@dispatch``) can pass them.
        super()._set_in_keys()
        extra = [self.tensor_keys.advantage, self.tensor_keys.value_target]
        self._in_keys = [*self._in_keys, *(k for k in extra if k not in self._in_keys)]

    # ------------------------------------------------------------------ TorchRL hooks
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


class RNDPPOLoss(SequencePPOLoss):
    """PPO with an extrinsic and an intrinsic value head, for Random Network Distillation.

    Burda et al., 2018, "Exploration by Random Network Distillation", arXiv:1810.12894, §2.3:
    the extrinsic reward is episodic and the intrinsic one is not, so each gets its own value
    head and its own advantage (computed outside the loss, like PPO's: GAE with γ_E and done
    cuts for the extrinsic stream, γ_I and no cuts for the intrinsic one), and the policy
    follows their weighted sum

        A_t = c_E · A^E_t + c_I · A^I_t      (c_E = 2, c_I = 1: the paper's)

    which then goes through :class:`SequencePPOLoss` unchanged (standardised, clipped
    surrogate). ``loss_critic`` sums both heads' losses,
    ``critic_coeff · (d(V^E, G^E) + d(V^I, G^I))``; with ``critic_coeff`` 0.5 and ``"l2"`` this
    is the paper's value loss. Given a :class:`~ac_extensions.modules.RandomNetworkDistillation`
    module, its predictor's ``loss_rnd`` is added to the output too, so one backward pass
    trains policy, both values and predictor.

    Inputs beyond :class:`SequencePPOLoss`'s: ``advantage_intrinsic`` and
    ``value_target_intrinsic`` ([*B, 1]); the critic must write ``state_value_intrinsic`` as
    well as ``state_value`` (``make_actor_critic(..., value_keys=("state_value",
    "state_value_intrinsic"))``); with ``rnd``, the ``("next", observation)`` it reads.

    Args:
        actor_network: as :class:`SequencePPOLoss`.
        critic_network: a value operator writing both value keys in one pass.
        rnd: the intrinsic-reward module whose predictor trains with this loss (None: the
            intrinsic reward comes from elsewhere and only the two heads are trained here).
        extrinsic_coeff: c_E.
        intrinsic_coeff: c_I.
        intrinsic_advantage_key, intrinsic_value_target_key, intrinsic_value_key: the
            intrinsic entries' names.
        **kwargs: as :class:`SequencePPOLoss` (``clip_value``, ``separate_losses`` and
            ``advantage_norm`` are not supported: the intrinsic head has no clipped loss, and
            a return scale learned from the extrinsic targets would not fit the combined
            advantage).

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from ac_extensions.modules import make_actor_critic
        >>> actor, critic = make_actor_critic(4, 2, value_keys=("state_value",
        ...     "state_value_intrinsic"))
        >>> loss = RNDPPOLoss(actor, critic)
        >>> td = TensorDict({"observation": torch.randn(3, 5, 4),
        ...     "action": torch.randint(2, (3, 5)), "action_log_prob": torch.full((3, 5), -0.7),
        ...     "advantage": torch.randn(3, 5, 1), "value_target": torch.randn(3, 5, 1),
        ...     "advantage_intrinsic": torch.randn(3, 5, 1),
        ...     "value_target_intrinsic": torch.randn(3, 5, 1)}, [3, 5])
        >>> sorted(k for k in loss(td).keys() if k.startswith("loss_"))
        ['loss_critic', 'loss_entropy', 'loss_objective']
    """

    def __init__(
        self,
        actor_network: ProbabilisticTensorDictSequential,
        critic_network: TensorDictModule,
        rnd: torch.nn.Module | None = None,
        *,
        extrinsic_coeff: float = 2.0,
        intrinsic_coeff: float = 1.0,
        intrinsic_advantage_key: str = "advantage_intrinsic",
        intrinsic_value_target_key: str = "value_target_intrinsic",
        intrinsic_value_key: str = "state_value_intrinsic",
        **kwargs,
    ) -> None:
        for name in ("clip_value", "separate_losses", "advantage_norm"):
            if kwargs.get(name):
                raise ValueError(f"RNDPPOLoss does not support {name}={kwargs[name]!r}")
        if critic_network is None:
            raise ValueError("RNDPPOLoss needs a critic_network with both value heads")
        self.intrinsic_advantage_key = intrinsic_advantage_key
        self.intrinsic_value_target_key = intrinsic_value_target_key
        self.intrinsic_value_key = intrinsic_value_key
        super().__init__(actor_network, critic_network, **kwargs)
        if intrinsic_value_key not in critic_network.out_keys:
            raise ValueError(
                f"RNDPPOLoss: the critic must write {intrinsic_value_key!r} besides "
                f"{self.tensor_keys.value!r}; its out_keys are {critic_network.out_keys}"
            )
        self.rnd = rnd
        self.extrinsic_coeff, self.intrinsic_coeff = float(extrinsic_coeff), float(intrinsic_coeff)
        self._set_in_keys()  # now with the RND module's inputs

    @property
    def out_keys(self):
        """TorchRL's outputs, plus ``loss_rnd`` with an RND module (``@dispatch`` returns these)."""
        keys = list(super().out_keys)
        if getattr(self, "rnd", None) is not None and "loss_rnd" not in keys:
            keys.append("loss_rnd")
        return keys

    @out_keys.setter
    def out_keys(self, values):
        ClipPPOLoss.out_keys.fset(self, values)

    @dispatch
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """The PPO losses on the combined advantage, both value losses and ``loss_rnd``.

        Args:
            tensordict: as :meth:`SequencePPOLoss.forward`, plus the intrinsic advantage and
                value target (``[*B, 1]``) and, with ``rnd``, ``("next", observation)``.
        """
        out = super().forward(tensordict)
        if self.rnd is not None:
            out.update(self.rnd.loss(tensordict))
        return out

    def _set_in_keys(self):
        super()._set_in_keys()
        extra = [self.intrinsic_advantage_key, self.intrinsic_value_target_key]
        rnd = getattr(self, "rnd", None)
        extra += list(rnd.in_keys) if rnd is not None else []
        self._in_keys = [*self._in_keys, *(k for k in extra if k not in self._in_keys)]

    def _required_value_keys(self) -> tuple:
        # The intrinsic stream's GAE output, checked like the advantage (shape, finite).
        return (self.intrinsic_advantage_key, self.intrinsic_value_target_key)

    def _maybe_normalize_advantage(self, advantage, tensordict, *, update_norm):
        # A = c_E·A^E + c_I·A^I (Burda et al., 2018, §2.3), then PPO's standardisation.
        intrinsic = tensordict.get(self.intrinsic_advantage_key)
        advantage = self.extrinsic_coeff * advantage + self.intrinsic_coeff * intrinsic
        return super()._maybe_normalize_advantage(advantage, tensordict, update_norm=update_norm)

    def loss_critic(self, tensordict: TensorDictBase):
        """``critic_coeff · (d(V^E, G^E) + d(V^I, G^I))`` per step, and TorchRL's extras."""
        # TorchRL's loss_critic runs the critic on the tensordict it is given, writing both
        # heads into it; an intrinsic value left in the input (from GAE) must not be read.
        inputs = tensordict.exclude(self.intrinsic_value_key)
        loss, clip_fraction, explained = super().loss_critic(inputs)
        value = inputs.get(self.intrinsic_value_key, None)
        if value is None or (torch.is_grad_enabled() and not value.requires_grad):
            raise ValueError(
                f"RNDPPOLoss: the critic must write {self.intrinsic_value_key!r} into the "
                f"tensordict it is called on (a TensorDictModule with inplace=True, as "
                f"ValueOperator), beside {self.tensor_keys.value!r}"
            )
        target = tensordict.get(self.intrinsic_value_target_key)
        intrinsic = distance_loss(target, value, loss_function=self.loss_critic_type)
        if self._has_critic:
            intrinsic = self.critic_coeff * intrinsic
        return loss + intrinsic, clip_fraction, explained


__all__ = ["RNDPPOLoss", "SequencePPOLoss"]
