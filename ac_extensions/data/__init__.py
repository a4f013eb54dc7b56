"""Replay-buffer parts for TorchRL: samplers that TorchRL lacks or cannot load here.

Index:

- :mod:`.prioritized_sequence`: :class:`PrioritizedSequenceSampler`, Reactor's prioritized
  sequence replay with lazy initialisation (Gruslys et al., 2018, arXiv:1704.04651, §3.3), a
  pure-torch ``Sampler`` over flat step storage; :class:`SequencePriorities`, its per-start view.
"""

from __future__ import annotations

from ac_extensions.data.prioritized_sequence import (
    PrioritizedSequenceSampler,
    SequencePriorities,
)

__all__ = ["PrioritizedSequenceSampler", "SequencePriorities"]
