"""Policy-loss add-ons: extra terms composed onto a loss without subclassing it.

An add-on is any callable ``addon(tensordict, dist) -> dict[str, Tensor]`` (an ``nn.Module`` if
it holds parameters or networks, so that it moves with the loss). It receives the loss's input
TensorDict (batch ``[*B]`` or ``[*B, T]``) and the current policy distribution the loss just
built, and returns named per-step tensors shaped like the batch (optionally with a trailing 1):
entries named ``loss_*`` are reduced like the loss's own terms (padding masks honoured) and
summed into the objective by the caller; other entries are reduced to detached diagnostics.
This mirrors pytorchrl's ``policy_loss_addons``.

Example:
    >>> from ac_extensions.objectives import SequencePPOLoss, KLPenalty
    >>> # loss = SequencePPOLoss(actor, critic, addons=[KLPenalty(reference_actor, coeff=0.1)])
"""

from __future__ import annotations

import copy
from typing import Protocol

import torch
from tensordict import TensorDictBase
from tensordict.nn import ProbabilisticTensorDictSequential
from torch import Tensor, nn


class PolicyLossAddon(Protocol):
    """What a policy-loss add-on is: ``(tensordict, dist) -> {name: per-step tensor}``."""

    def __call__(
        self, tensordict: TensorDictBase, dist: torch.distributions.Distribution
    ) -> dict[str, Tensor]:
        """Return named per-step tensors; ``loss_*`` ones are minimised."""
        ...


class KLPenalty(nn.Module):
    """KL penalty towards a fixed reference policy: ``coeff · KL(π(·|x) ‖ π_ref(·|x))``.

    The reference is a frozen copy of a policy (for example the policy before fine-tuning, or a
    behaviour-cloned prior), evaluated without gradient on the same observations. Adds
    ``loss_kl_reference`` (per step, reduced by the loss) and the diagnostic ``kl_reference``.
    KL is computed analytically with ``torch.distributions.kl_divergence``.

    Args:
        reference_actor: a TorchRL probabilistic actor whose ``get_dist`` gives π_ref. It is
            deep-copied and frozen, so later updates of the original do not move the reference.
        coeff: the penalty coefficient (>= 0).
    """

    def __init__(self, reference_actor: ProbabilisticTensorDictSequential, coeff: float) -> None:
        super().__init__()
        if coeff < 0:
            raise ValueError(f"coeff must be >= 0, got {coeff}")
        self.reference_actor = copy.deepcopy(reference_actor).requires_grad_(False)
        self.coeff = coeff

    def forward(
        self, tensordict: TensorDictBase, dist: torch.distributions.Distribution
    ) -> dict[str, Tensor]:
        """Return ``loss_kl_reference`` and ``kl_reference`` for the batch."""
        with torch.no_grad():
            inputs = tensordict.select(*self.reference_actor.in_keys, strict=False).copy()
            reference = self.reference_actor.get_dist(inputs)
        kl = torch.distributions.kl_divergence(dist, reference)  # [*B] or [*B, T]
        return {"loss_kl_reference": self.coeff * kl, "kl_reference": kl.detach()}
