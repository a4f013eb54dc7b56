"""Random Network Distillation: an exploration bonus from how badly a network predicts a fixed one.

Burda, Edwards, Storkey & Klimov, 2018, "Exploration by Random Network Distillation",
arXiv:1810.12894. A target network f with fixed random weights maps each observation to a
feature vector; a predictor f̂ is trained to reproduce it on the observations the agent visits.
Its error ‖f̂(x) − f(x)‖² stays high on observations unlike those seen so far, and that error is
the intrinsic reward (§2.2). Two normalisations make one bonus scale fit every task (§2.4):

* observations are whitened by running statistics and clipped to [−5, 5] before either network
  sees them (the statistics start from a few random-policy steps);
* the intrinsic reward is divided by a running estimate of the standard deviation of the
  intrinsic return, a discounted sum that episode ends do not cut (§2.3: the intrinsic
  reward is non-episodic).

:class:`RandomNetworkDistillation` holds the two networks and both normalisers: calling it on a
collected ``[B, T]`` batch writes the intrinsic reward, and :meth:`~RandomNetworkDistillation.loss`
is the predictor's ``loss_rnd``, to be added to a policy loss (as
:class:`~ac_extensions.objectives.RNDPPOLoss` does) or stepped on its own.

Example:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> rnd = RandomNetworkDistillation(*rnd_networks(2), observation_shape=(2,))
    >>> td = TensorDict({("next", "observation"): torch.randn(4, 8, 2)}, [4, 8])
    >>> rnd(td)["next", "reward_intrinsic"].shape
    torch.Size([4, 8, 1])
    >>> sorted(rnd.loss(td).keys())
    ['loss_rnd']
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import Tensor, nn

from ac_extensions.modules.layers import orthogonal_init
from ac_extensions.modules.normalization import ObservationNormalizer, RewardNormalizer


def rnd_networks(
    observation_shape: int | Sequence[int],
    *,
    features: int = 64,
    hidden_sizes: Sequence[int] = (64, 64),
) -> tuple[nn.Module, nn.Module]:
    """A target and a predictor network for :class:`RandomNetworkDistillation`.

    Shaped as the paper's (Burda et al., 2018, arXiv:1810.12894): the same torso for both,
    orthogonal initialisation, leaky ReLUs, and a predictor with two more layers than the
    target, so that it can fit the target on visited observations. Vector observations
    ``[*B, O]`` get MLPs of ``hidden_sizes``; image observations ``[*B, C, H, W]`` a 3×3
    convolution with 16 channels (the MinAtar torso's) before them. Sized for small tasks
    (``features`` 64; the paper's Atari networks output 512).

    Args:
        observation_shape: the per-env observation shape, ``O`` or ``(C, H, W)``.
        features: the width of the embedding the predictor regresses.
        hidden_sizes: the MLP widths after the (optional) convolution.

    Returns:
        ``(target, predictor)``: modules mapping ``[N, *S]`` observations to ``[N, features]``.
    """
    if isinstance(observation_shape, int):
        observation_shape = (observation_shape,)
    shape = tuple(observation_shape)
    if len(shape) not in (1, 3):
        raise ValueError(f"observation_shape must be (O,) or (C, H, W), got {shape}")

    def torso() -> tuple[list[nn.Module], int]:
        if len(shape) == 1:
            return [], shape[0]
        channels, height, width = shape
        layers = [nn.Conv2d(channels, 16, 3), nn.LeakyReLU(), nn.Flatten()]
        return layers, 16 * (height - 2) * (width - 2)

    def mlp(extra: int) -> nn.Module:
        layers, width = torso()
        for size in (*hidden_sizes, *([features] * extra)):
            layers += [nn.Linear(width, size), nn.LeakyReLU()]
            width = size
        layers.append(nn.Linear(width, features))
        net = nn.Sequential(*layers)
        for module in net.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                orthogonal_init(module, math.sqrt(2))
        return net

    return mlp(0), mlp(2)


class RandomNetworkDistillation(TensorDictModuleBase):
    """Intrinsic rewards ‖f̂(x') − f(x')‖² of a batch's next observations, normalised.

    Calling the module on a batch ``[B, T]`` whose rows are consecutive steps of one env each
    (a collector's batch):

    1. computes each step's prediction error on ``("next", observation_key)``, whitened with
       the current observation statistics (Burda et al., 2018, arXiv:1810.12894, §2.2);
    2. merges those observations into the statistics;
    3. divides the errors by the running standard deviation of the non-episodic intrinsic
       return (:class:`~ac_extensions.modules.RewardNormalizer` with no done key, γ =
       ``gamma``; §2.4) and writes them to ``("next", reward_key)``, ``[B, T, 1]``.

    The target network never trains (its parameters do not require gradients); the
    predictor trains on :meth:`loss`. Both networks and all the statistics are buffers or
    parameters of this module, so a ``state_dict`` (a checkpoint) keeps them.

    Args:
        target: the fixed random network, ``[N, *S] → [N, F]``.
        predictor: the trained network, ``[N, *S] → [N, F]``.
        observation_shape: the per-env observation shape ``S``.
        gamma: the intrinsic return's discount (0.99, the paper's γ_I).
        proportion: the expected fraction of a batch's steps :meth:`loss` trains on (1: all,
            for the few envs of small tasks; the paper's Atari runs, with 128 envs, use 0.25;
            pytorchrl's ``predictor_proportion``).
        observation_key: the raw observation entry (read under ``"next"``).
        reward_key: the intrinsic reward entry (written under ``"next"``).
        clip: the bound on |whitened observation| (5, the paper's).
        reward_forget: the fraction of the intrinsic-return statistics' weight dropped per
            batch (0: the paper's running estimate over the whole run;
            :class:`~ac_extensions.modules.RewardNormalizer`'s ``forget``).
    """

    def __init__(
        self,
        target: nn.Module,
        predictor: nn.Module,
        observation_shape: int | Sequence[int],
        *,
        gamma: float = 0.99,
        proportion: float = 1.0,
        observation_key: str = "observation",
        reward_key: str = "reward_intrinsic",
        clip: float = 5.0,
        reward_forget: float = 0.0,
    ) -> None:
        super().__init__()
        if not 0 < proportion <= 1:
            raise ValueError(f"proportion must lie in (0, 1], got {proportion}")
        shape = (observation_shape,) if isinstance(observation_shape, int) else observation_shape
        self.target = target.requires_grad_(False)
        self.predictor = predictor
        self.observations = ObservationNormalizer(tuple(shape), in_key=observation_key, clip=clip)
        self.rewards = RewardNormalizer(
            gamma,
            clip=math.inf,
            reward_key=("next", reward_key),
            done_key=None,
            forget=reward_forget,
        )
        self.proportion = float(proportion)
        self.observation_key = observation_key
        self.in_keys = [("next", observation_key)]
        self.out_keys = [("next", reward_key)]

    def prediction_error(self, observation: Tensor) -> Tensor:
        """‖f̂(x) − f(x)‖² / F on whitened observations ``[*B, *S]`` → ``[*B]``.

        Differentiable in the predictor's parameters; the statistics are not updated.
        """
        shape = self.observations.loc.shape
        batch = observation.shape[: observation.dim() - len(shape)]
        if observation.shape[len(batch) :] != shape:
            raise ValueError(
                f"{self.in_keys[0]!r}: expected observations of shape [*B, "
                f"{', '.join(map(str, shape))}], got {list(observation.shape)}"
            )
        x = self.observations.normalize(observation.to(self.observations.loc.dtype))
        x = x.reshape(-1, *shape)
        with torch.no_grad():
            target = self.target(x)
        error = (self.predictor(x) - target).square().mean(-1)
        return error.reshape(batch)

    @torch.no_grad()
    def initialize(self, observations: Tensor) -> None:
        """Start the observation statistics from ``observations`` ``[*B, *S]``.

        Random-policy steps, as the paper takes before training (§2.4).
        """
        self.observations.update(observations)

    @torch.no_grad()
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Write ``("next", reward_key)`` ``[B, T, 1]`` for a batch ``[B, T]``.

        The statistics are updated with the batch: call it once per collected batch.
        """
        if tensordict.batch_dims != 2:
            raise ValueError(
                f"RandomNetworkDistillation needs a [B, T] batch of env rows, got batch_size "
                f"{list(tensordict.batch_size)}"
            )
        observation = tensordict.get(self.in_keys[0], None)
        if observation is None:
            raise KeyError(
                f"RandomNetworkDistillation: the batch has no {self.in_keys[0]!r} (the "
                f"observation each step led to)"
            )
        error = self.prediction_error(observation)
        tensordict.set(self.out_keys[0], error.unsqueeze(-1))
        self.observations.update(observation)
        self.rewards(tensordict)
        return tensordict

    def loss(self, tensordict: TensorDictBase) -> TensorDictBase:
        """The predictor's loss, ``loss_rnd``: the mean prediction error over some steps.

        Those steps are a random ``proportion`` of the valid steps of ``tensordict`` ``[*B]``
        (the ``("collector", "mask")`` and ``"shifted_valid"`` entries honoured).

        Returns:
            ``TensorDict({"loss_rnd": scalar})``.
        """
        observation = tensordict.get(self.in_keys[0], None)
        if observation is None:
            raise KeyError(f"RandomNetworkDistillation.loss: the batch has no {self.in_keys[0]!r}")
        error = self.prediction_error(observation)
        weight = torch.ones_like(error)
        for key in (("collector", "mask"), "shifted_valid"):  # TorchRL's loss-mask entries
            mask = tensordict.get(key, None)
            if mask is not None:
                weight = weight * mask.reshape(error.shape).to(error.dtype)
        if self.proportion < 1:
            weight = weight * (torch.rand_like(error) < self.proportion).to(error.dtype)
        loss = (error * weight).sum() / weight.sum().clamp_min(1.0)
        return TensorDict({"loss_rnd": loss})


__all__ = ["RandomNetworkDistillation", "rnd_networks"]
