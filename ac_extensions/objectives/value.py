"""A Retrace(λ) value estimator registered in TorchRL's value-estimator registry.

``loss.make_value_estimator("retrace", gamma=..., lmbda=...)`` then works like TorchRL's own
estimators (the string alias resolves to :attr:`ACValueEstimators.Retrace`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torchrl.objectives.utils import register_value_estimator
from torchrl.objectives.value import ValueEstimatorBase

import ac_extensions.functional as F


class ACValueEstimators(Enum):
    """Value estimators added by ac_extensions (TorchRL's ``ValueEstimators`` is closed)."""

    Retrace = "Retrace(lambda)"


@register_value_estimator(ACValueEstimators.Retrace, default_kwargs={"gamma": 0.99, "lmbda": 1.0})
class RetraceEstimator(ValueEstimatorBase):
    """Retrace(λ) action-value targets from network outputs already in the TensorDict.

        G_t = r_t + γ(1 − term_t)[V(x_{t+1}) + (1 − done_t) c_{t+1}(G_{t+1} − Q(x_{t+1}, a_{t+1}))],
        c_t = λ min(1, π(a_t|x_t)/µ(a_t|x_t)),  V(x) = Σ_a π(a|x) Q(x, a)

    (Munos et al., 2016, arXiv:1606.02647v1, Eq. 4; λ = 1 is ACER's Q^ret, Wang et al., 2017,
    arXiv:1611.01224v2, Eq. 5), computed by :func:`ac_extensions.functional.categorical_q_retrace`.
    Reads, over ``[*B, T]``: ``action_value`` and ``logits`` (current Q and policy at x_t),
    ``("next", "action_value")`` / ``("next", "logits")`` (at x_{t+1}), ``action`` (indices),
    ``behavior_logits`` (µ, stored at collection), ``("next", reward / done / terminated)``.
    Writes ``value_target`` (G_t, ``[*B, T, 1]``, detached) and ``advantage`` (G_t − V(x_t)).
    It calls no network: the loss evaluates its networks once and hands the outputs over.

    Args:
        gamma: discount γ.
        lmbda: trace decay λ ∈ [0, 1].
        device: device of the buffers.
    """

    @dataclass
    class _AcceptedKeys:
        """Keys read and written (a full declaration, as TorchRL's ``set_keys`` requires)."""

        advantage: NestedKey = "advantage"
        value_target: NestedKey = "value_target"
        value: NestedKey = "state_value"
        reward: NestedKey = "reward"
        done: NestedKey = "done"
        terminated: NestedKey = "terminated"
        steps_to_next_obs: NestedKey = "steps_to_next_obs"
        sample_log_prob: NestedKey = "action_log_prob"
        action: NestedKey = "action"
        action_value: NestedKey = "action_value"
        logits: NestedKey = "logits"
        behavior_logits: NestedKey = ("behavior", "logits")

    default_keys = _AcceptedKeys

    def __init__(self, *, gamma: float = 0.99, lmbda: float = 1.0, device=None, **kwargs) -> None:
        super().__init__(value_network=None, device=device, **kwargs)
        if not 0.0 <= lmbda <= 1.0 or not 0.0 <= float(gamma) <= 1.0:
            raise ValueError(f"gamma and lmbda must lie in [0, 1], got {gamma}, {lmbda}")
        self.register_buffer("gamma", torch.tensor(float(gamma), device=self._device))
        self.register_buffer("lmbda", torch.tensor(float(lmbda), device=self._device))

    @classmethod
    def for_loss(cls, loss_module, **hyperparams):
        """Build for ``loss_module`` (no network is needed)."""
        hyperparams.pop("value_network", None)
        return cls(**hyperparams)

    @property
    def in_keys(self) -> list:
        """Keys read."""
        k = self.tensor_keys
        return [
            k.action_value,
            k.logits,
            ("next", k.action_value),
            ("next", k.logits),
            k.action,
            k.behavior_logits,
            ("next", k.reward),
            ("next", k.done),
            ("next", k.terminated),
        ]

    @property
    def out_keys(self) -> list:
        """Keys written."""
        return [self.tensor_keys.value_target, self.tensor_keys.advantage]

    @torch.no_grad()
    def forward(
        self, tensordict: TensorDictBase, *, params=None, target_params=None, time_dim=None
    ) -> TensorDictBase:
        """Write ``value_target`` and ``advantage`` into ``tensordict`` and return it."""
        k = self.tensor_keys
        q_ret, value = F.categorical_q_retrace(
            tensordict.get(k.logits),
            tensordict.get(k.action_value),
            tensordict.get(("next", k.logits)),
            tensordict.get(("next", k.action_value)),
            tensordict.get(k.action).unsqueeze(-1),
            tensordict.get(k.behavior_logits).log_softmax(-1),
            tensordict.get(("next", k.reward)),
            tensordict.get(("next", k.done)),
            tensordict.get(("next", k.terminated)),
            float(self.gamma),
            float(self.lmbda),
        )
        tensordict.set(k.value_target, q_ret)
        tensordict.set(k.advantage, q_ret - value)
        return tensordict

    def value_estimate(self, tensordict: TensorDictBase, **kwargs) -> torch.Tensor:
        """The Retrace target G_t alone, shape [*B, T, 1]."""
        return self.forward(tensordict.copy())[self.tensor_keys.value_target]
