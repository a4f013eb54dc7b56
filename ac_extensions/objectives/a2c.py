"""A2C for ``[B, T]`` batches: TorchRL's ``A2CLoss`` plus what it lacks on sequences."""

from __future__ import annotations

from collections.abc import Sequence

from tensordict import TensorDictBase
from tensordict.nn import ProbabilisticTensorDictSequential, TensorDictModule, dispatch
from torchrl.objectives import A2CLoss

from ac_extensions.modules import shared_features
from ac_extensions.objectives._sequence import SequenceLossMixin, _key_list
from ac_extensions.objectives.addons import PolicyLossAddon


class SequenceA2CLoss(SequenceLossMixin, A2CLoss):
    """Advantage actor-critic (Mnih et al., 2016, arXiv:1602.01783, Algorithm S3) over ``[B, T]``.

    The losses are TorchRL's ``A2CLoss`` unchanged (identical losses and gradients on a flat
    batch, see ``tests/objectives``):

        loss_objective = −A_t · log π_θ(a_t|x_t)
        loss_critic    = critic_coeff · d(V_θ(x_t), G_t)
        loss_entropy   = −entropy_coeff · H(π_θ(·|x_t))

    Added, as for :class:`~ac_extensions.objectives.SequencePPOLoss`: scalar diagnostics over
    the valid steps (``entropy``, ``explained_variance``, and ``kl_approx`` = mean log µ − log π_θ
    when the behavior log-prob is stored), policy-loss add-ons, padding masks in every term, and
    early errors naming the key and shapes. The stored behavior log-prob is optional for A2C.

    Args:
        actor_network: a TorchRL probabilistic actor (feed-forward or recurrent).
        critic_network: a value operator writing ``state_value``.
        addons: policy-loss add-ons, each ``(tensordict, dist) -> {name: per-step tensor}``.
        **kwargs: passed to ``A2CLoss`` (``entropy_coeff``, ``critic_coeff``,
            ``loss_critic_type``, ``clip_value``...).

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
        >>> loss = SequenceA2CLoss(actor, critic)
        >>> td = TensorDict({"observation": torch.randn(3, 5, 4),
        ...     "action": torch.randint(2, (3, 5)), "advantage": torch.randn(3, 5, 1),
        ...     "value_target": torch.randn(3, 5, 1)}, [3, 5])
        >>> sorted(loss(td).keys())
        ['entropy', 'explained_variance', 'loss_critic', 'loss_entropy', 'loss_objective']
    """

    _needs_behavior_log_prob = False

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

    @dispatch
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Compute TorchRL's A2C losses and this class's scalar diagnostics."""
        tensordict = self._validate(tensordict)
        networks = () if self.functional else (self.actor_network, self.critic_network)
        with shared_features(*networks):  # a torso shared by actor and critic runs once
            out = super().forward(tensordict)
        return self._finish(tensordict, out)

    @property
    def in_keys(self):
        """TorchRL's inputs (each key of a multi-head action once), advantage and value target.

        The advantage and value target are listed so that keyword calls through ``@dispatch``
        can pass them.
        """
        keys = self.tensor_keys
        actor_keys = list(self.actor_network.in_keys)
        names = [
            *_key_list(keys.action),
            ("next", keys.reward),
            ("next", keys.done),
            ("next", keys.terminated),
            *actor_keys,
            *[("next", key) for key in actor_keys],
            keys.advantage,
            keys.value_target,
        ]
        if self.critic_coeff is not None:
            names.extend(self.critic_network.in_keys)
        return list(dict.fromkeys(names))

    # Hooks into A2CLoss.forward: record per-step tensors for the diagnostics.
    def _log_probs(self, tensordict):
        log_probs, dist = super()._log_probs(tensordict)
        self._capture["dist"] = dist
        behavior = tensordict.get(self.tensor_keys.sample_log_prob, None)
        if behavior is not None:
            self._capture["kl_approx"] = (behavior - log_probs.reshape(behavior.shape)).detach()
        return log_probs, dist

    def get_entropy_bonus(self, dist):
        """Entropy of π_θ(·|x_t), recorded for the masked diagnostic."""
        entropy = super().get_entropy_bonus(dist)
        self._capture["entropy"] = entropy
        return entropy

    def loss_critic(self, tensordict):
        """TorchRL's critic loss; records V_θ(x_t) and G_t for ``explained_variance``."""
        values = []
        hook = self.critic_network.register_forward_hook(
            lambda module, args, output: values.append(output.get(self.tensor_keys.value))
        )
        try:
            result = super().loss_critic(tensordict)
        finally:
            hook.remove()
        if values:
            self._capture["state_value"] = values[-1].detach()
            self._capture["value_target"] = tensordict.get(self.tensor_keys.value_target)
        return result


__all__ = ["SequenceA2CLoss"]
