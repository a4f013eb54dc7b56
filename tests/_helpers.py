"""Small constructors shared by the tests."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import torch
from tensordict import TensorDict
from torch import Tensor


def col(*xs: float, dtype: torch.dtype = torch.float64) -> Tensor:
    """A [T, 1] column: one trajectory, no batch dims."""
    return torch.tensor(xs, dtype=dtype).unsqueeze(-1)


def flags(*xs: int) -> Tensor:
    """A [T, 1] bool column."""
    return torch.tensor(xs, dtype=torch.bool).unsqueeze(-1)


def on_policy_batch(shape, seed=0, networks=None, log_prob_noise=0.1, observation_size=4):
    """A synthetic on-policy batch of ``shape``: log-probs from the actor that 'collected' it.

    ``networks`` is ``(actor, critic)``; the stored log-probs are the actor's plus Gaussian
    noise of scale ``log_prob_noise``, so the ratios π_θ / µ spread around 1.
    """
    gen = torch.Generator().manual_seed(seed)
    actor, _ = networks
    obs = torch.randn(*shape, observation_size, generator=gen)
    td = TensorDict({"observation": obs}, batch_size=shape)
    with torch.no_grad():
        dist = actor.get_dist(td.clone())
        action = dist.sample()
        log_prob = dist.log_prob(action) + log_prob_noise * torch.randn(shape, generator=gen)
    td.update(
        {
            "action": action,
            "action_log_prob": log_prob,
            "advantage": torch.randn(*shape, 1, generator=gen),
            "value_target": torch.randn(*shape, 1, generator=gen),
            "state_value": torch.randn(*shape, 1, generator=gen),
            ("next", "reward"): torch.randn(*shape, 1, generator=gen),
        }
    )
    return td


def load_script(path: Path, name: str) -> Iterator[ModuleType]:
    """Import the script at ``path`` as module ``name`` for a fixture to yield, then forget it.

    For the scripts of ``benchmarks/``, which are not a package. ``name`` must not be taken:
    ``minatar`` is the MinAtar package, so ``benchmarks/minatar_grid.py`` loads under another.
    """
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)


@contextmanager
def few_resamples(reps: int = 2_000) -> Iterator[None]:
    """The benchmarks' bootstrap (``_intervals.REPS``) at ``reps`` resamples while it lasts.

    For tests of the results pages on fabricated runs: the pages' 50,000 resamples take most
    of such a test's time, and the verdicts they check are clean separations (or exact ties)
    that a few thousand resamples give the same way. Load the benchmark script first (it
    imports ``_intervals``).
    """
    intervals = sys.modules["_intervals"]
    saved, intervals.REPS = intervals.REPS, reps
    try:
        yield
    finally:
        intervals.REPS = saved


def check_stored_normalisation(monkeypatch, config, train):
    """Every batch's stored normalised observations are the learner's normalisation of them
    (the workers normalise with the statistics the learner last sent)."""
    import torch

    from ac_extensions.modules import NORMALIZED_OBSERVATION
    from ac_extensions.runtime.on_policy import BatchNormalizers

    checks = []
    original = BatchNormalizers.__call__

    def checked(self, batch):
        if self.observations is not None:
            expected = self.observations.normalize(batch["observation"])
            checks.append(torch.allclose(batch[NORMALIZED_OBSERVATION], expected, atol=1e-5))
        return original(self, batch)

    monkeypatch.setattr(BatchNormalizers, "__call__", checked)
    metrics = list(train(config))
    assert len(checks) == len(metrics) >= 3 and all(checks), checks
    return metrics
