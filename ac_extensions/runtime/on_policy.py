"""What the on-policy recipes (A2C, PPO) share: their env, networks, advantages, minibatches.

* :func:`make_env`: the env one worker steps (E copies, plus the recurrent primers).
* :func:`make_networks`: actor and critic for the env's specs (categorical or Gaussian).
* :class:`BatchNormalizers`: optional observation and reward normalisation.
* :func:`random_observations`: random-policy steps (Random Network Distillation's start).
* :func:`clip_rewards`: the optional reward clip (Atari's default).
* :func:`reshape_rewards`: the optional reward-shaping hook.
* :func:`compute_advantages`: GAE once per batch with the pre-update critic.
* :func:`minibatches`: shuffled minibatches of steps, or of whole sequences
  (:func:`training_sequences`) for recurrent policies.
* :func:`evaluate`: greedy-policy returns on a fresh env.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictSequential
from torchrl.envs import ExplorationType, set_exploration_type
from torchrl.objectives.value.functional import generalized_advantage_estimate

from ac_extensions.modules import (
    NORMALIZED_OBSERVATION,
    ObservationNormalizer,
    RewardNormalizer,
    collection_policy,
    make_actor_critic,
    recurrent_env_transforms,
)
from ac_extensions.runtime.config import OnPolicyConfig
from ac_extensions.runtime.envs import (
    action_bounds,
    action_size,
    has_continuous_actions,
    make_batched_env,
    observation_shape,
    observation_size,
    torso_for,
)
from ac_extensions.runtime.progress import finished_returns


def make_env(config: OnPolicyConfig):
    """The env one worker steps: E copies, plus the recurrent policy's primers if any."""
    extra = ()
    if config.recurrent is not None:
        probe = make_actor_critic(
            1,
            2,
            hidden_sizes=config.hidden_sizes,
            recurrent=config.recurrent,
            recurrent_size=config.recurrent_size,
        )
        extra = (recurrent_env_transforms(collection_policy(*probe)),)
    return make_batched_env(
        config.env_id,
        config.envs_per_worker,
        observation_keys=config.observation_keys,
        transform_factory=config.transform_factory,
        extra_transforms=extra,
    )


def make_networks(config: OnPolicyConfig, *, value_keys: tuple[str, ...] = ("state_value",)):
    """Actor, critic (:func:`~ac_extensions.modules.make_actor_critic`), :class:`BatchNormalizers`.

    The observation shape and the action space come from a probe env; the shape picks the
    torso (:func:`~ac_extensions.runtime.envs.torso_for`): MLPs for vectors, the MinAtar
    network for ``[C, 10, 10]``, the Nature CNN for ``[C, 84, 84]`` frames. A ``Discrete``
    action space gets a categorical actor, a 1-D ``Box`` a diagonal Gaussian one
    (``"normal"``, or ``"tanh_normal"`` on the env's bounds with ``config.tanh_squash``). With
    ``config.normalize_observations`` both networks read ``"observation_normalized"``
    (:class:`BatchNormalizers` writes it). ``value_keys``: the critic's value heads.
    """
    probe = make_env(config)
    shape = observation_shape(probe)
    obs_dim = observation_size(probe)
    size = action_size(probe)
    continuous = has_continuous_actions(probe)
    bounds = action_bounds(probe) if continuous else None
    probe.close()
    torso = torso_for(shape)
    distribution = "categorical"
    if continuous:
        distribution = "tanh_normal" if config.tanh_squash else "normal"
        if config.tanh_squash and not all(bool(b.isfinite().all()) for b in bounds):
            raise ValueError(
                f"tanh_squash needs a bounded action space; {config.env_id}'s bounds are "
                f"{bounds[0].tolist()} to {bounds[1].tolist()}"
            )
    observation_key = "observation"
    if config.normalize_observations:
        if torso != "mlp":
            raise ValueError(
                f"normalize_observations needs vector observations; {config.env_id} gives "
                f"'observation' of per-env shape {list(shape)}"
            )
        observation_key = NORMALIZED_OBSERVATION
    actor, critic = make_actor_critic(
        obs_dim if torso == "mlp" else shape,
        size,
        torso=torso,
        hidden_sizes=config.hidden_sizes,
        recurrent=config.recurrent,
        recurrent_size=config.recurrent_size,
        share_torso=config.share_torso,
        head_sizes=config.head_sizes,
        observation_key=observation_key,
        distribution=distribution,
        init_scale=config.init_scale,
        action_bounds=bounds if bounds is not None else (-1.0, 1.0),
        value_keys=value_keys,
    )
    return actor.to(config.device), critic.to(config.device), BatchNormalizers(config, shape)


class BatchNormalizers:
    """The observation and reward normalisation of the on-policy recipes (each optional).

    SB3's ``VecNormalize`` for the on-policy learners: the collection policy starts with an
    :class:`~ac_extensions.modules.ObservationNormalizer`, so each step stores the observation
    normalised with the statistics of its collection, which the losses read as they are (the
    ratio π_θ/µ of PPO's first minibatch is exactly 1); calling this object on a fresh batch
    (before its advantages) adds the normalised next observation (for V(x_{t+1})), merges the
    batch's raw observations into the statistics, and scales its rewards with a
    :class:`~ac_extensions.modules.RewardNormalizer`. The statistics reach the workers with
    the weights and are checkpointed through :meth:`state_dict`.

    Args:
        config: ``normalize_observations``, ``normalize_rewards`` and ``gamma`` are read.
        shape: the per-env observation shape.
    """

    def __init__(self, config: OnPolicyConfig, shape) -> None:
        self.shape = tuple(shape)
        """The per-env observation shape."""
        self.observations = None
        if config.normalize_observations:
            self.observations = ObservationNormalizer(shape).to(config.device)
        self.rewards = None
        if config.normalize_rewards:
            self.rewards = RewardNormalizer(config.gamma).to(config.device)

    def policy(self, policy: torch.nn.Module) -> torch.nn.Module:
        """``policy`` preceded by the observation normaliser (``policy`` itself without one)."""
        if self.observations is None:
            return policy
        return TensorDictSequential(self.observations, policy)

    def __call__(self, batch: TensorDictBase) -> None:
        """Normalise ``batch`` ``[B, T]`` in place and update the statistics with it."""
        norm = self.observations
        if norm is not None:
            raw, key = norm.in_keys[0], norm.out_keys[0]
            batch.set(("next", key), norm.normalize(batch.get(("next", raw))))
            norm.update(batch.get(raw))
        if self.rewards is not None:
            self.rewards(batch)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the statistics (``{}`` without normalisers)."""
        state = {}
        if self.observations is not None:
            state["observation_norm"] = self.observations.state_dict()
        if self.rewards is not None:
            state["reward_norm"] = self.rewards.state_dict()
        return state

    def load_state_dict(self, counters: Mapping[str, Any]) -> None:
        """Restore the statistics a checkpoint's counters hold (those present)."""
        if self.observations is not None and "observation_norm" in counters:
            self.observations.load_state_dict(counters["observation_norm"])
        if self.rewards is not None and "reward_norm" in counters:
            self.rewards.load_state_dict(counters["reward_norm"])


@torch.no_grad()
def random_observations(config: OnPolicyConfig, steps: int) -> torch.Tensor:
    """The next observations ``[E, steps, *S]`` of ``steps`` random-policy steps of one worker.

    What Random Network Distillation starts its observation statistics from (Burda et al.,
    2018, arXiv:1810.12894, §2.4); the env is seeded with ``seed + 20000``, apart from training.
    """
    env = make_env(config)
    env.set_seed(config.seed + 20_000)
    rollout = env.rollout(steps, break_when_any_done=False)
    env.close()
    return rollout["next", "observation"]


def clip_rewards(batch: TensorDictBase, config: OnPolicyConfig) -> None:
    """Clip ``("next", "reward")`` of ``batch`` ``[B, T]`` to ±``config.reward_clip`` in place.

    A no-op when ``reward_clip`` is ``None``. The returns logged from
    ``("next", "episode_reward")`` stay the env's.
    """
    if config.reward_clip is not None:
        reward = batch.get(("next", "reward"))
        batch.set(("next", "reward"), reward.clamp(-config.reward_clip, config.reward_clip))


def reshape_rewards(batch: TensorDictBase, config: OnPolicyConfig) -> None:
    """Apply ``config.reshape_reward`` (torch-ac's hook) to ``batch`` ``[B, T]`` in place.

    ``("next", "reward")`` ← ``reshape_reward(observation, action, reward, done)``; a no-op
    without a hook. The returns logged from ``("next", "episode_reward")`` stay the env's.
    """
    if config.reshape_reward is not None:
        batch["next", "reward"] = config.reshape_reward(
            batch["observation"],
            batch["action"],
            batch["next", "reward"],
            batch["next", "done"],
        )


@torch.no_grad()
def compute_advantages(
    batch: TensorDictBase,
    critic,
    gamma: float,
    lmbda: float,
    *,
    intrinsic_gamma: float | None = None,
) -> None:
    """GAE once per batch ``[B, T]`` with the pre-update critic, written into ``batch``.

    Â_t = Σ_l (γλ)^l δ_{t+l}, δ_t = r_t + γ V(x_{t+1}) (1 − terminated_t) − V(x_t), the trace
    cut at ``done`` (Schulman et al., 2016, arXiv:1506.02438, Eq. 16; TorchRL's
    ``generalized_advantage_estimate``). V(x_{t+1}) is read from ``("next", ...)``, so a
    truncated episode bootstraps from its own last observation. V is evaluated step by step
    from the stored hidden state (exactly the collection-time computation for a recurrent
    critic).

    Writes ``advantage`` and ``value_target`` (Â_t + V(x_t)), and ``state_value`` (V(x_t),
    what PPO's value clipping measures against), each ``[B, T, 1]``.

    With ``intrinsic_gamma`` (Random Network Distillation's second stream, Burda et al., 2018,
    arXiv:1810.12894, §2.3), the same critic pass also gives ``state_value_intrinsic``, and
    ``("next", "reward_intrinsic")`` gets its own GAE with γ = ``intrinsic_gamma`` and no cut
    at episode ends (non-episodic): ``advantage_intrinsic`` and ``value_target_intrinsic``.
    The intrinsic stream runs on through an episode end into the next episode's first step,
    so there it bootstraps from V_I of that step (the row's next observation x_{t+1}), as the
    paper's code does, not from the terminal observation; the row's last step bootstraps from
    ``("next", ...)``.
    """
    values, next_values = _values_and_next_values(batch, critic)
    done = batch["next", "done"]
    streams = [("", gamma, done, batch["next", "terminated"])]
    if intrinsic_gamma is not None:
        never = torch.zeros_like(done)
        streams.append(("_intrinsic", intrinsic_gamma, never, never))
    for suffix, discount, cut, terminated in streams:
        value = values[f"state_value{suffix}"]
        next_value = next_values[f"state_value{suffix}"]
        if suffix:  # non-episodic: after an episode end, the next step's own value
            ends = done.clone()
            ends[:, -1] = False
            shifted = torch.cat([value[:, 1:], next_value[:, -1:]], dim=1)
            next_value = torch.where(ends, shifted, next_value)
        advantage, value_target = generalized_advantage_estimate(
            discount,
            lmbda,
            value,
            next_value,
            batch["next", f"reward{suffix}"],
            cut,
            terminated,
        )
        batch.set(f"advantage{suffix}", advantage)
        batch.set(f"value_target{suffix}", value_target)
        batch.set(f"state_value{suffix}", value)


def _values_and_next_values(batch: TensorDictBase, critic) -> tuple[TensorDictBase, TensorDictBase]:
    """The critic at x_t and at x_{t+1} for a ``[B, T]`` batch, each ``[B, T]``.

    Where step t+1 of a row starts from exactly the critic's inputs at ``("next", ...)`` of
    step t (a collector's row inside one episode), V(x_{t+1}) is step t+1's own value, so the
    critic is evaluated a second time only at episode ends, at the rows' last steps and
    wherever the two inputs differ: the result equals two full passes, at about half the cost.
    """
    rows, time = batch.shape
    inputs = batch.select(*critic.in_keys, strict=False)
    next_inputs = batch["next"].select(*critic.in_keys, strict=False)
    values = _state_values(critic(inputs.reshape(-1).clone())).reshape(rows, time)
    fresh = torch.ones(rows, time, dtype=torch.bool)
    if time > 1:
        same = torch.ones(rows, time - 1, dtype=torch.bool)
        for key, tensor in next_inputs[:, :-1].items(include_nested=True, leaves_only=True):
            following = inputs[:, 1:].get(key, None)
            if following is None or following.shape != tensor.shape:
                same.zero_()
                break
            same &= (following == tensor).reshape(rows, time - 1, -1).all(-1)
        fresh[:, :-1] = ~same
    next_values = values.clone()
    next_values[:, :-1] = values[:, 1:]
    if fresh.any():
        next_values[fresh] = _state_values(critic(next_inputs[fresh].clone()))
    return values, next_values


def _state_values(output: TensorDictBase) -> TensorDictBase:
    """The ``state_value*`` entries of a critic's output (its other outputs are not needed)."""
    return output.select(*(key for key in output.keys() if key.startswith("state_value")))


def training_sequences(batch: TensorDictBase, length: int, burn_in: int) -> TensorDictBase:
    """Cut ``[B, T]`` rows into windows of ``burn_in + length`` steps for recurrent training.

    Window i trains on steps [i·L, (i+1)·L) of its row; the ``burn_in`` steps before them
    (after them for the first window) are replayed but masked out of the loss through
    ``("collector", "mask")``, so every step is trained exactly once and each window starts
    ``burn_in`` steps earlier than its trained part, from the state stored there.

    Returns:
        ``[B · T/L, burn_in + L]`` windows.
    """
    rows, time = batch.shape
    width = burn_in + length
    starts = [max(0, i * length - burn_in) for i in range(time // length)]
    index = torch.tensor(starts).unsqueeze(-1) + torch.arange(width)  # [n, width]
    windows = batch[:, index].reshape(rows * len(starts), width)
    trained = torch.zeros(len(starts), width, dtype=torch.bool)
    for i, start in enumerate(starts):
        offset = i * length - start
        trained[i, offset : offset + length] = True
    windows.set(("collector", "mask"), trained.repeat(rows, 1))
    return windows


def minibatches(
    batch: TensorDictBase, size: int, generator: torch.Generator, config: OnPolicyConfig
) -> Iterator[TensorDictBase]:
    """One epoch of shuffled minibatches of ``batch`` ``[B, T]``, about ``size`` frames each.

    Feed-forward policies: minibatches of single steps ``[size]``. Recurrent ones: of whole
    sequences ``[size // L, burn_in + L]`` (:func:`training_sequences`), which the loss replays
    from their stored hidden state. A minibatch that would hold every step is the batch
    itself, unshuffled (its losses are means over the steps, which the order does not
    change; the permutation is drawn all the same, so the generator's stream does not depend
    on it).
    """
    if config.recurrent is None:
        flat = batch.reshape(-1)
        order = torch.randperm(flat.shape[0], generator=generator)
        if size >= flat.shape[0]:
            yield flat
            return
        for start in range(0, flat.shape[0], size):
            yield flat[order[start : start + size]]
        return
    length = config.sequence_length or batch.shape[1]
    if length != batch.shape[1] or config.burn_in:
        batch = training_sequences(batch, length, config.burn_in)
    rows = max(1, size // length)
    order = torch.randperm(batch.shape[0], generator=generator)
    for start in range(0, batch.shape[0], rows):
        yield batch[order[start : start + rows]]


def evaluate(actor, config: OnPolicyConfig, episodes: int) -> list[float]:
    """Greedy-policy returns of ``episodes`` episodes on a fresh env (seed ``seed + 10000``).

    ``actor``: the policy module (with its observation normaliser in front, if any).
    """
    env = make_batched_env(
        config.env_id,
        1,
        observation_keys=config.observation_keys,
        transform_factory=config.transform_factory,
        extra_transforms=(recurrent_env_transforms(actor),) if config.recurrent else (),
    )
    env.set_seed(config.seed + 10_000)
    returns: list[float] = []
    with set_exploration_type(ExplorationType.DETERMINISTIC), torch.no_grad():
        while len(returns) < episodes:
            rollout = env.rollout(10_000, actor, break_when_any_done=True)
            returns.extend(finished_returns(rollout))
    env.close()
    return returns[:episodes]
