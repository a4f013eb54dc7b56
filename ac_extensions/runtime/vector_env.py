"""A lean TorchRL env over a gymnasium vector env: the fast path of ``make_batched_env``.

TorchRL's ``GymWrapper`` over a vector env, with its ``VecGymEnvTransform`` (final observations
on done steps) and ``RewardSum`` (episode returns), spends about 2 ms per step of 8 CartPoles
here, against 0.14 ms for gymnasium itself (``benchmarks/results/collection.md``): readers,
spec checks, a partial reset through ``TensorDict.where`` at every step some copy finished.
:class:`VectorGymEnv` produces the same data (tests/recipes/test_vector_env.py checks it step
for step against that stack) from one ``_step`` that reads the arrays once, and its
``step_and_maybe_reset`` writes the next root directly instead of resetting the finished copies
(the vector env already did, in the same step).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Bounded, Categorical, Composite, Unbounded
from torchrl.envs import EnvBase

_DONE_KEYS = ("done", "terminated", "truncated")


def _box_spec(space: gym.spaces.Box, num_envs: int) -> Bounded | Unbounded:
    dtype = torch.from_numpy(np.zeros((), dtype=space.dtype)).dtype
    shape = (num_envs, *space.shape)
    low = np.array(np.broadcast_to(space.low, space.shape))
    high = np.array(np.broadcast_to(space.high, space.shape))
    if np.isfinite(low).all() and np.isfinite(high).all():
        return Bounded(
            low=torch.as_tensor(low).expand(shape),
            high=torch.as_tensor(high).expand(shape),
            shape=shape,
            dtype=dtype,
        )
    return Unbounded(shape=shape, dtype=dtype)


class VectorGymEnv(EnvBase):
    """``num_envs`` copies of a gymnasium env (``SyncVectorEnv``, same-step autoreset) as ``[E]``.

    Data layout (the same as ``GymWrapper`` + ``VecGymEnvTransform`` + ``RewardSum``):
    ``observation`` ``[E, *O]``; ``action`` ``[E]`` (Discrete) or ``[E, d]`` (Box);
    ``("next", "reward")`` ``[E, 1]`` float32; ``done`` / ``terminated`` / ``truncated``
    ``[E, 1]`` bool; ``episode_reward`` ``[E, 1]``, the running return (at a done step
    ``("next", "episode_reward")`` is the episode's return, and the next root starts at 0).
    At a done step ``("next", "observation")`` is the episode's final observation and the next
    root's observation the reset one.

    Args:
        vector_env: a gymnasium ``SyncVectorEnv`` with ``AutoresetMode.SAME_STEP``, a ``Box``
            observation space and a ``Discrete`` or ``Box`` action space.
    """

    def __init__(self, vector_env: gym.vector.VectorEnv) -> None:
        num_envs = vector_env.num_envs
        super().__init__(batch_size=torch.Size([num_envs]))
        self._env = vector_env
        obs_space = vector_env.single_observation_space
        act_space = vector_env.single_action_space
        if not isinstance(obs_space, gym.spaces.Box):
            raise TypeError(f"VectorGymEnv needs a Box observation space, got {obs_space}")
        self.observation_spec = Composite(
            observation=_box_spec(obs_space, num_envs),
            episode_reward=Unbounded(shape=(num_envs, 1)),
            shape=(num_envs,),
        )
        if isinstance(act_space, gym.spaces.Discrete):
            self.action_spec = Categorical(int(act_space.n), shape=(num_envs,), dtype=torch.int64)
        elif isinstance(act_space, gym.spaces.Box):
            self.action_spec = _box_spec(act_space, num_envs)
        else:
            raise TypeError(f"VectorGymEnv needs a Discrete or Box action space, got {act_space}")
        self.reward_spec = Unbounded(shape=(num_envs, 1))
        self.done_spec = Composite(
            {key: Categorical(2, shape=(num_envs, 1), dtype=torch.bool) for key in _DONE_KEYS},
            shape=(num_envs,),
        )
        self._return = torch.zeros(num_envs, 1)
        self._pending: torch.Tensor | None = None  # reset observations of finished copies

    @staticmethod
    def supports(vector_env: gym.vector.VectorEnv) -> bool:
        """Whether the spaces fit: ``Box`` observations, ``Discrete`` or ``Box`` actions."""
        return isinstance(vector_env.single_observation_space, gym.spaces.Box) and isinstance(
            vector_env.single_action_space, gym.spaces.Discrete | gym.spaces.Box
        )

    # -- the EnvBase interface --------------------------------------------------------------

    def _set_seed(self, seed: int | None) -> None:
        # As GymWrapper: seeding resets (gymnasium seeds copy i with seed + i).
        self.reset(seed=seed)

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        partial = tensordict is not None and "_reset" in tensordict.keys()
        if partial and self._pending is not None and not tensordict["_reset"].all():
            # The vector env reset the finished copies in the step that finished them (their
            # running returns are already 0); the other copies' entries are not used.
            observation = self._pending
        else:
            observation = torch.from_numpy(np.asarray(self._env.reset(**kwargs)[0]))
            self._return.zero_()
        self._pending = None
        return self._root(observation)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        next_td, reset_observation, done = self._transition(tensordict)
        self._pending = reset_observation if done.any() else None
        return next_td

    def step_and_maybe_reset(
        self, tensordict: TensorDictBase
    ) -> tuple[TensorDictBase, TensorDictBase]:
        """One step of every copy; returns (``tensordict`` with ``"next"``, the next root).

        Equals ``EnvBase``'s step → ``step_mdp`` → partial reset, without the reset: a copy
        that finished already holds its reset observation (same-step autoreset). When every
        copy finished, TorchRL's stack resets the whole vector env again; so does this.
        """
        next_td, reset_observation, done = self._transition(tensordict)
        tensordict.set("next", next_td)
        if done.all():  # as TorchRL's stack: every copy finished → a full reset
            return tensordict, self._reset()
        return tensordict, self._root(reset_observation)

    # -- helpers ------------------------------------------------------------------------------

    def _root(self, observation: torch.Tensor) -> TensorDictBase:
        false = torch.zeros(*self.batch_size, 1, dtype=torch.bool)
        return TensorDict(
            {
                "observation": observation,
                "episode_reward": self._return.clone(),
                "done": false,
                "terminated": false.clone(),
                "truncated": false.clone(),
            },
            batch_size=self.batch_size,
        )

    def _transition(self, tensordict: TensorDictBase):
        """Step the vector env; returns the ``"next"`` data, the next roots' observations and done.

        The running returns are updated (and zeroed for finished copies, after being read).
        """
        action = tensordict.get("action").numpy()
        obs, reward, terminated, truncated, info = self._env.step(action)
        observation = torch.from_numpy(np.asarray(obs))
        done_np = np.logical_or(terminated, truncated)
        reward_t = torch.from_numpy(np.asarray(reward, dtype=np.float32)).unsqueeze(-1)
        self._return += reward_t
        episode_reward = self._return.clone()
        next_observation = observation
        if done_np.any():
            finished = np.flatnonzero(done_np)
            final = np.stack([info["final_obs"][i] for i in finished])
            next_observation = observation.clone()
            next_observation[torch.from_numpy(finished)] = torch.from_numpy(final)
            self._return[torch.from_numpy(finished)] = 0.0
        done = torch.from_numpy(done_np).unsqueeze(-1)
        next_td = TensorDict(
            {
                "observation": next_observation,
                "reward": reward_t,
                "done": done,
                "terminated": torch.from_numpy(np.asarray(terminated)).unsqueeze(-1),
                "truncated": torch.from_numpy(np.asarray(truncated)).unsqueeze(-1),
                "episode_reward": episode_reward,
            },
            batch_size=self.batch_size,
        )
        return next_td, observation, done_np

    def close(self, *, raise_if_closed: bool = True) -> None:
        """Close the gymnasium vector env and this TorchRL env."""
        self._env.close()
        super().close(raise_if_closed=raise_if_closed)
