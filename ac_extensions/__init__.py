"""ac_extensions: actor-critic losses for TorchRL (A2C, PPO, ACER, Reactor).

Layers (README § Layout): :mod:`ac_extensions.functional` holds the math as pure torch
functions; ``modules`` (networks), ``objectives`` (TorchRL ``LossModule`` subclasses),
``data`` (samplers), ``runtime`` (collection, checkpoints, guards, progress) and ``recipes``
(whole training loops, one per algorithm) build on it, in that order. Importing the
top-level package imports only the functional layer, so ``import ac_extensions`` stays cheap.
"""

from __future__ import annotations

from ac_extensions import functional

__version__ = "0.1.0.dev0"

__all__ = ["__version__", "functional"]
