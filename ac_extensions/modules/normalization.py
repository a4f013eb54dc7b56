"""Running observation normalisation that lives with the networks, not in the environment.

An off-policy learner replays observations collected under older statistics. Normalising in
the environment (TorchRL's ``VecNorm`` / ``ObservationNorm`` transforms, SB3's
``VecNormalize`` on its env) stores observations normalised by whatever statistics held when
they were collected, so a replayed step and a fresh one of the same state reach the networks as
different inputs. Here the replay keeps the raw observation and :class:`ObservationNormalizer`
writes the normalised one under its own key every time the networks read it (collection,
on-policy update, replay): one set of statistics for all of them, the current one, as SB3 does
for its replay buffers (``ReplayBuffer._normalize_obs`` at sample time).
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey
from torch import Tensor, nn

NORMALIZED_OBSERVATION = "observation_normalized"
"""The key :class:`ObservationNormalizer` writes by default (and ``("next", …)`` for the next
observation); networks built for normalised inputs read it."""


class ObservationNormalizer(TensorDictModuleBase):
    """(x − mean) / sqrt(var + eps), clipped to [−clip, clip], with running statistics.

    The statistics (buffers ``loc``, ``var``: shape [*S], the observation's per-env shape;
    ``count``: a scalar) start at mean 0, variance 1 and count ``1e-4`` (as SB3's
    ``RunningMeanStd``) and change only in :meth:`update`, which merges a batch's mean and
    variance into them (Chan, Golub & LeVeque, 1979, the parallel variance update; the same
    rule as TorchRL's ``VecNorm`` and SB3's ``VecNormalize``). ``eps`` 1e-8 and ``clip`` 10 are
    SB3's ``VecNormalize`` defaults. The forward pass never changes the statistics, so
    replaying a batch twice gives the same inputs.

    Being buffers, the statistics travel with the module: ``state_dict`` (checkpoints) and
    TorchRL's collector weight updates (``update_policy_weights_`` ships a policy's buffers
    with its parameters), so workers normalise with the learner's statistics.

    Args:
        shape: the per-env observation shape [*S], e.g. ``(17,)``.
        in_key: the raw observation (read; also under ``"next"`` when present).
        out_key: where the normalised observation goes (also under ``"next"``).
        eps: added to the variance.
        clip: the bound on |normalised value|.

    Example:
        >>> from tensordict import TensorDict
        >>> norm = ObservationNormalizer((2,))
        >>> norm.update(torch.tensor([[0.0, 10.0], [2.0, 30.0]]))
        >>> td = TensorDict({"observation": torch.tensor([[3.0, 0.0]])}, [1])
        >>> norm(td)["observation_normalized"].round(decimals=3)
        tensor([[ 2., -2.]])
        >>> norm.loc.round(decimals=1), norm.var.round(decimals=1)
        (tensor([ 1., 20.]), tensor([  1., 100.]))
    """

    def __init__(
        self,
        shape,
        *,
        in_key: NestedKey = "observation",
        out_key: NestedKey = NORMALIZED_OBSERVATION,
        eps: float = 1e-8,
        clip: float = 10.0,
    ) -> None:
        super().__init__()
        if not (eps > 0 and clip > 0):
            raise ValueError(f"eps and clip must be > 0, got {eps}, {clip}")
        shape = torch.Size(shape)
        self.in_keys = [in_key, ("next", in_key)]
        self.out_keys = [out_key, ("next", out_key)]
        self.eps, self.clip = float(eps), float(clip)
        self.register_buffer("loc", torch.zeros(shape))
        self.register_buffer("var", torch.ones(shape))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    @torch.no_grad()
    def update(self, observations: Tensor) -> None:
        """Merge a batch of raw observations, shape [*B, *S], into the statistics."""
        shape = self.loc.shape
        if observations.shape[observations.dim() - len(shape) :] != shape:
            expected = ", ".join(map(str, shape))
            raise ValueError(
                f"{self.in_keys[0]!r}: expected observations of shape [*B, {expected}], "
                f"got {list(observations.shape)}"
            )
        # On the statistics' device (a CUDA learner's normalizer gets CPU-collected batches).
        flat = observations.reshape(-1, *shape).to(self.loc.device, torch.float64)
        if flat.shape[0] == 0:
            return
        if not torch.isfinite(flat).all():
            raise ValueError(f"{self.in_keys[0]!r}: non-finite observation in the update")
        batch_mean, batch_var = flat.mean(0), flat.var(0, unbiased=False)
        batch_count = float(flat.shape[0])
        count = self.count.item()
        total = count + batch_count
        delta = batch_mean - self.loc.to(torch.float64)
        mean = self.loc + delta * (batch_count / total)
        m2 = self.var * count + batch_var * batch_count
        m2 = m2 + delta.square() * (count * batch_count / total)
        self.loc.copy_(mean)
        self.var.copy_(m2 / total)
        self.count.fill_(total)

    def normalize(self, observation: Tensor) -> Tensor:
        """The normalised observation: the input's shape, the statistics' dtype (float32)."""
        value = (observation - self.loc) / torch.sqrt(self.var + self.eps)
        return value.clamp(-self.clip, self.clip).to(self.loc.dtype)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Write ``out_key`` (and ``("next", out_key)``) for whichever raw entries are present."""
        for source, target in zip(self.in_keys, self.out_keys, strict=True):
            value = tensordict.get(source, None)
            if value is not None:
                tensordict.set(target, self.normalize(value))
        return tensordict


class RewardNormalizer(nn.Module):
    """Rewards divided by the running standard deviation of the discounted return, clipped.

    What SB3's ``VecNormalize`` does to rewards (``norm_reward``; the normalisation the PPO
    implementations of Engstrom et al., 2020, arXiv:2005.12729, §3 call "reward scaling"): per
    env a discounted return R_t = γ R_{t−1} + r_t (reset to 0 after a done step) feeds a
    running variance Var[R], and the learner sees r_t / sqrt(Var[R] + eps), clipped to
    [−clip, clip]. The rewards' sign and the optimal policy are unchanged; the critic's
    targets stay near unit scale whatever the task's reward scale. ``eps`` 1e-8 and ``clip``
    10 are ``VecNormalize``'s defaults.

    Here it runs on the learner, over a collected batch ``[B, T]`` whose rows are consecutive
    steps of one env each: the running returns (one per row, buffer ``returns``) carry over
    from one batch to the next (row i of the next batch continues row i's env under the
    synchronous collector). The statistics are updated with the whole batch's returns, then
    the whole batch is scaled by them (``VecNormalize`` updates and scales step by step). The
    logged episode returns stay the env's.

    Args:
        gamma: the discount of R_t (the learner's γ).
        eps: added to the variance.
        clip: the bound on |normalised reward|.
        reward_key: the reward entry, scaled in place.
        done_key: where R resets; ``None``: never (a non-episodic return, as Random Network
            Distillation's intrinsic reward uses, Burda et al., 2018, arXiv:1810.12894, §2.3).
        forget: the fraction of the accumulated statistics' weight dropped before each batch
            is merged (0: every batch weighs the same, ``VecNormalize``'s rule; > 0: an
            exponential moving estimate that follows a reward scale which keeps shrinking).

    Example:
        >>> from tensordict import TensorDict
        >>> norm = RewardNormalizer(gamma=0.5)
        >>> td = TensorDict({("next", "reward"): torch.tensor([[[2.0], [2.0]]]),
        ...                  ("next", "done"): torch.zeros(1, 2, 1, dtype=torch.bool)}, [1, 2])
        >>> norm(td)["next", "reward"].squeeze().round(decimals=2)  # returns 2, 3: Var ≈ 0.25
        tensor([4., 4.])
    """

    def __init__(
        self,
        gamma: float,
        *,
        eps: float = 1e-8,
        clip: float = 10.0,
        reward_key: NestedKey = ("next", "reward"),
        done_key: NestedKey | None = ("next", "done"),
        forget: float = 0.0,
    ) -> None:
        super().__init__()
        if not 0 <= gamma <= 1:
            raise ValueError(f"gamma must lie in [0, 1], got {gamma}")
        if not 0 <= forget < 1:
            raise ValueError(f"forget must lie in [0, 1), got {forget}")
        self.forget = float(forget)
        if not (eps > 0 and clip > 0):
            raise ValueError(f"eps and clip must be > 0, got {eps}, {clip}")
        self.gamma, self.eps, self.clip = float(gamma), float(eps), float(clip)
        self.reward_key, self.done_key = reward_key, done_key
        self.register_buffer("mean", torch.zeros((), dtype=torch.float64))
        self.register_buffer("var", torch.ones((), dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))
        self.register_buffer("returns", torch.zeros(0, dtype=torch.float64))

    @torch.no_grad()
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Update the statistics with ``tensordict`` ``[B, T]`` and scale its rewards in place."""
        if tensordict.batch_dims != 2:
            raise ValueError(
                f"RewardNormalizer needs a [B, T] batch of env rows, got batch_size "
                f"{list(tensordict.batch_size)}"
            )
        rows, steps = tensordict.batch_size
        reward = tensordict.get(self.reward_key)
        if self.done_key is None:
            done = torch.zeros_like(reward, dtype=torch.bool)
        else:
            done = tensordict.get(self.done_key)
        if reward.shape != (rows, steps, 1) or done.shape != (rows, steps, 1):
            raise ValueError(
                f"{self.reward_key!r} and {self.done_key!r} must have shape "
                f"[{rows}, {steps}, 1], got {list(reward.shape)} and {list(done.shape)}"
            )
        if self.returns.shape != (rows,):  # first batch, or a different number of rows
            self.returns = torch.zeros(rows, dtype=torch.float64, device=self.mean.device)
        r = reward.squeeze(-1).to(self.returns.device, torch.float64)
        keep = (~done.squeeze(-1)).to(self.returns.device, torch.float64)
        running, returns = self.returns.clone(), torch.empty_like(r)
        for t in range(steps):
            running = self.gamma * running + r[:, t]
            returns[:, t] = running
            running = running * keep[:, t]
        self.returns.copy_(running)
        batch_mean, batch_var, batch_count = returns.mean(), returns.var(unbiased=False), r.numel()
        count = float(self.count) * (1.0 - self.forget)
        total = count + batch_count
        delta = batch_mean - self.mean
        m2 = self.var * count + batch_var * batch_count
        m2 = m2 + delta.square() * count * batch_count / total
        self.mean.add_(delta * batch_count / total)
        self.var.copy_(m2 / total)
        self.count.fill_(total)
        scale = torch.sqrt(self.var + self.eps).to(reward.device, reward.dtype)
        tensordict.set(self.reward_key, (reward / scale).clamp(-self.clip, self.clip))
        return tensordict

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # The running returns' length is that of the saved run's rows.
        key = prefix + "returns"
        if key in state_dict:
            self.returns = torch.empty_like(state_dict[key])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
