"""Environments for the recipes: batched TorchRL envs over gymnasium, plus two test envs.

Registered gymnasium ids (registered on import, so worker processes see them too):

* ``MaskedCartPole-v1``: CartPole-v1 with the velocities hidden (observation = cart position
  and pole angle only), so a policy needs memory to balance the pole.
* ``DictCartPole-v1``: CartPole-v1 with a ``Dict`` observation
  ``{"position": (x, θ), "velocity": (ẋ, θ̇)}``, to exercise dict observations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import gymnasium as gym
import numpy as np
from torchrl.envs import CatTensors, EnvBase, GymWrapper, RewardSum, Transform, TransformedEnv

from ac_extensions.runtime.vector_env import VectorGymEnv

POSITION = [0, 2]  # cart position x, pole angle θ
VELOCITY = [1, 3]  # cart velocity ẋ, pole angular velocity θ̇


class _KeepIndices(gym.ObservationWrapper):
    def __init__(self, env: gym.Env, indices: Sequence[int]) -> None:
        super().__init__(env)
        self.indices = list(indices)
        box = env.observation_space
        self.observation_space = gym.spaces.Box(
            box.low[self.indices], box.high[self.indices], dtype=box.dtype
        )

    def observation(self, observation):
        return observation[self.indices]


class _SplitPositionVelocity(gym.ObservationWrapper):
    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        box = env.observation_space
        self.observation_space = gym.spaces.Dict(
            {
                "position": gym.spaces.Box(box.low[POSITION], box.high[POSITION], dtype=box.dtype),
                "velocity": gym.spaces.Box(box.low[VELOCITY], box.high[VELOCITY], dtype=box.dtype),
            }
        )

    def observation(self, observation):
        return {"position": observation[POSITION], "velocity": observation[VELOCITY]}


def masked_cartpole(**kwargs) -> gym.Env:
    """CartPole-v1 observing only (x, θ): velocities must be inferred from memory."""
    return _KeepIndices(gym.make("CartPole-v1", **kwargs), POSITION)


def dict_cartpole(**kwargs) -> gym.Env:
    """CartPole-v1 with a Dict observation {"position", "velocity"}."""
    return _SplitPositionVelocity(gym.make("CartPole-v1", **kwargs))


for _id, _entry in (("MaskedCartPole-v1", masked_cartpole), ("DictCartPole-v1", dict_cartpole)):
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=_entry, max_episode_steps=500, reward_threshold=475.0)


ATARI_PREFIX = "ALE/"
"""Ids starting with this are Atari games: :func:`make_gym_env` preprocesses them."""


def make_gym_env(env_id: str) -> gym.Env:
    """One gymnasium env; Atari ids (``ALE/…``) get the usual DQN preprocessing.

    Atari (Mnih et al., 2015, Nature 518, "Methods"; Machado et al., 2018, arXiv:1709.06009v2
    for the v5 defaults kept here: sticky actions 0.25, no life-loss terminals): the emulator
    runs at ``frameskip=1`` and gymnasium's ``AtariPreprocessing`` repeats each action 4 times
    (max-pooling the last two frames), starts episodes with up to 30 no-ops, and returns 84×84
    grayscale frames; ``FrameStackObservation`` stacks the last 4, so observations are
    ``uint8`` of shape (4, 84, 84). Rewards are the game's (Pong's are already in {−1, 0, 1}).
    The resizing needs ``opencv-python-headless`` (a dependency of this package).

    Args:
        env_id: a gymnasium id, e.g. ``"CartPole-v1"`` or ``"ALE/Pong-v5"``.

    Returns:
        The gymnasium env.
    """
    if not env_id.startswith(ATARI_PREFIX):
        return gym.make(env_id)
    import ale_py

    gym.register_envs(ale_py)
    env = gym.make(env_id, frameskip=1)
    env = gym.wrappers.AtariPreprocessing(
        env, noop_max=30, frame_skip=4, screen_size=84, terminal_on_life_loss=False
    )
    return gym.wrappers.FrameStackObservation(env, 4)


def make_batched_env(
    env_id: str,
    num_envs: int,
    *,
    observation_keys: Sequence[str] = ("observation",),
    transform_factory: Callable[[], Transform] | None = None,
    extra_transforms: Sequence[Transform] = (),
    lean: bool = True,
) -> EnvBase:
    """``num_envs`` copies of a gymnasium env stepped in-process, as one TorchRL env ``[E]``.

    One TorchRL step drives all copies (gymnasium ``SyncVectorEnv`` with same-step autoreset),
    so TorchRL's per-step overhead is paid once per ``num_envs`` frames. Without transforms, a
    ``Box`` observation and a ``Discrete`` or ``Box`` action space give the lean
    :class:`~ac_extensions.runtime.vector_env.VectorGymEnv` (the same data as TorchRL's
    ``GymWrapper`` + ``RewardSum`` stack, at about half the collection cost); everything else
    (transforms, ``Dict`` observations) uses that stack. At a done step
    ``("next", "observation")`` is the final observation of the episode (a truncated step can
    bootstrap from it) and the next row starts from the reset observation.

    Actions: a ``Discrete`` action space becomes a ``Categorical`` spec (integer actions,
    shape [E]); a ``Box`` action space a bounded continuous spec (shape [E, d], see
    :func:`has_continuous_actions` and :func:`action_size`). Continuous actions reach the
    gymnasium env **unclipped**: TorchRL's ``GymWrapper`` converts them with
    ``spec.to_numpy(action, safe=False)``, which neither checks nor projects onto the bounds,
    and no transform here clips them. This is deliberate: an off-policy learner stores the
    action it sampled and evaluates the behavior density µ(a_t|x_t) at it (clipped actions
    pile up as point masses at the bounds, which a Gaussian µ's density does not describe),
    so the env must do any clipping after the action is recorded. gymnasium's classic-control
    and Box2D continuous envs clip inside ``step``: Pendulum-v1 applies ``np.clip(u, -max_torque,
    max_torque)`` before both the dynamics and the reward, so an out-of-bounds action acts and
    is rewarded exactly as the nearest bound. Others clip only the dynamics and charge the raw
    action (MountainCarContinuous-v0's power cost, the MuJoCo envs' control cost).

    Atari ids (``ALE/…``) are preprocessed by :func:`make_gym_env` (observations
    ``[E, 4, 84, 84]`` uint8).

    Args:
        env_id: a gymnasium id with a ``Discrete`` or a flat ``Box`` action space.
        num_envs: copies stepped together.
        observation_keys: observation entries; several (a Dict observation) are flattened and
            concatenated into ``"observation"``.
        transform_factory: optional callable returning a TorchRL transform for observation
            preprocessing, appended after the concatenation (must be picklable for workers).
        extra_transforms: further transforms (e.g. a recurrent policy's primers).
        lean: allow :class:`~ac_extensions.runtime.vector_env.VectorGymEnv`. ``False`` keeps
            TorchRL's stack, whose construction also draws from torch's global random stream
            (``GymWrapper`` checks its specs with a random-action rollout): code whose seeded
            runs must repeat those from before the lean env existed passes ``False``.

    Returns:
        A TorchRL env with batch size ``[num_envs]`` and ``("next", "episode_reward")``.
    """
    vector = gym.vector.SyncVectorEnv(
        [partial(make_gym_env, env_id)] * num_envs,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    bare = lean and transform_factory is None and not extra_transforms
    if bare and tuple(observation_keys) == ("observation",) and VectorGymEnv.supports(vector):
        # The lean env (the same data as the stack below, about half the collection cost;
        # it keeps the running return itself, so no RewardSum), returned bare so that
        # collectors use its own step_and_maybe_reset.
        return VectorGymEnv(vector)
    env = TransformedEnv(GymWrapper(vector, categorical_action_encoding=True))
    if tuple(observation_keys) != ("observation",):
        env.append_transform(
            CatTensors(list(observation_keys), out_key="observation", del_keys=False)
        )
    if transform_factory is not None:
        env.append_transform(transform_factory())
    env.append_transform(RewardSum())
    for transform in extra_transforms:
        env.append_transform(transform)
    return env


def observation_size(env: EnvBase) -> int:
    """The flat size of ``"observation"`` in an env built by :func:`make_batched_env`."""
    return int(np.prod(observation_shape(env)))


def observation_shape(env: EnvBase) -> tuple[int, ...]:
    """The per-env shape of ``"observation"``: ``(O,)`` for vectors, ``(4, 84, 84)`` for Atari."""
    return tuple(env.observation_spec["observation"].shape[len(env.batch_size) :])


def has_continuous_actions(env: EnvBase) -> bool:
    """Whether ``"action"`` is continuous (a gymnasium ``Box``) rather than discrete."""
    return env.full_action_spec["action"].domain == "continuous"


def action_size(env: EnvBase) -> int:
    """A, the number of discrete actions, or d, the size of a flat continuous action.

    Raises:
        ValueError: for an action space that is neither ``Discrete`` nor a 1-D ``Box``
            (e.g. ``MultiDiscrete``, or a ``Box`` of shape (2, 3)).
    """
    spec = env.full_action_spec["action"]
    shape = tuple(spec.shape[len(env.batch_size) :])
    if spec.domain == "continuous" and len(shape) == 1:
        return int(shape[0])
    if spec.domain == "discrete" and shape == () and hasattr(spec.space, "n"):
        return int(spec.space.n)
    raise ValueError(
        f"unsupported action spec {type(spec).__name__} (domain {spec.domain!r}, per-env "
        f"shape {list(shape)}): expected a Discrete action space or a 1-D Box"
    )
