"""TorchRL ``LossModule`` subclasses over :mod:`ac_extensions.functional`."""

from __future__ import annotations

from ac_extensions.objectives.a2c import SequenceA2CLoss
from ac_extensions.objectives.acer import ACERLoss
from ac_extensions.objectives.acer_continuous import ContinuousACERLoss
from ac_extensions.objectives.addons import KLPenalty, PolicyLossAddon
from ac_extensions.objectives.ppo import RNDPPOLoss, SequencePPOLoss
from ac_extensions.objectives.reactor import ReactorLoss
from ac_extensions.objectives.value import ACValueEstimators, RetraceEstimator

__all__ = [
    "ACERLoss",
    "ACValueEstimators",
    "ContinuousACERLoss",
    "KLPenalty",
    "PolicyLossAddon",
    "RNDPPOLoss",
    "ReactorLoss",
    "RetraceEstimator",
    "SequenceA2CLoss",
    "SequencePPOLoss",
]
