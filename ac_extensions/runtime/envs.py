"""Environments for the recipes: batched TorchRL envs over gymnasium, plus two test envs.

Families (:func:`env_family`): classic control and other vector-observation envs, Atari
(``ALE/…``, preprocessed to ``[4, 84, 84]`` uint8 frames) and MinAtar (``MinAtar/…``, the
optional ``minatar`` extra, float channels-first ``[C, 10, 10]``; its ids are registered by
:func:`make_gym_env` itself, so worker processes, forked or spawned, see them too).

Registered gymnasium ids (registered on import, so worker processes see them too):

* ``MaskedCartPole-v1``: CartPole-v1 with the velocities hidden (observation = cart position
  and pole angle only), so a policy needs memory to balance the pole.
* ``DictCartPole-v1``: CartPole-v1 with a ``Dict`` observation
  ``{"position": (x, θ), "velocity": (ẋ, θ̇)}``, to exercise dict observations.
* ``SparseMountainCar-v0``: MountainCar-v0 rewarding only the flag: 1 on the step that reaches
  it, 0 on every other (the task's own −1 per step tells a learner how long each episode took;
  this one says nothing until the flag is found), so an episode's return is whether it reached
  the flag within 200 steps. An exploration test.
* ``DeepSea-v0``: Osband et al.'s deep-sea exploration task (2019, "Behaviour Suite for
  Reinforcement Learning", bsuite), ``size`` N = 20 by default: a one-hot ``[N·N]`` position
  on an N × N grid, starting top-left; every step goes one row down and one column left or
  right (action 0 or 1; right costs 0.01/N); after N steps the episode ends, paying 1 if the
  agent reached the bottom-right cell, which only moving right at every step does (or left at
  the first, against the wall, then right): a random policy, 2 · 2^−N of its episodes. Unlike
  bsuite, action 1 is "right" in every cell.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
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


class _RewardOnTermination(gym.Wrapper):
    def step(self, action):
        observation, _, terminated, truncated, info = self.env.step(action)
        return observation, float(terminated), terminated, truncated, info


def sparse_mountain_car(**kwargs) -> gym.Env:
    """MountainCar-v0 (its 200-step limit kept) with reward 1 at the flag and 0 elsewhere."""
    return _RewardOnTermination(gym.make("MountainCar-v0", **kwargs))


class DeepSea(gym.Env):
    """The deep-sea task (see the module docstring); ``size`` N ≥ 2."""

    def __init__(self, size: int = 20) -> None:
        if size < 2:
            raise ValueError(f"size must be >= 2, got {size}")
        self.size = size
        self.observation_space = gym.spaces.Box(0.0, 1.0, (size * size,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._row = self._column = 0

    def _observation(self) -> np.ndarray:
        observation = np.zeros(self.size * self.size, dtype=np.float32)
        if self._row < self.size:
            observation[self._row * self.size + self._column] = 1.0
        return observation

    def reset(self, *, seed=None, options=None):
        """Back to the top-left cell."""
        super().reset(seed=seed)
        self._row = self._column = 0
        return self._observation(), {}

    def step(self, action):
        """One row down, one column left (0) or right (1)."""
        right = int(action) == 1
        reward = -0.01 / self.size if right else 0.0
        self._column = min(self._column + 1, self.size - 1) if right else max(self._column - 1, 0)
        self._row += 1
        terminated = self._row == self.size
        if terminated and self._column == self.size - 1:
            reward += 1.0
        return self._observation(), reward, terminated, False, {}


for _id, _entry in (("MaskedCartPole-v1", masked_cartpole), ("DictCartPole-v1", dict_cartpole)):
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=_entry, max_episode_steps=500, reward_threshold=475.0)
if "SparseMountainCar-v0" not in gym.registry:
    gym.register(id="SparseMountainCar-v0", entry_point=sparse_mountain_car, reward_threshold=0.9)
if "DeepSea-v0" not in gym.registry:
    gym.register(id="DeepSea-v0", entry_point=DeepSea, reward_threshold=0.9)


ATARI_PREFIX = "ALE/"
"""Ids starting with this are Atari games: :func:`make_gym_env` preprocesses them."""
MINATAR_PREFIX = "MinAtar/"
"""Ids starting with this are MinAtar games (Young & Tian, 2019, arXiv:1903.03176):
:func:`make_gym_env` registers them and returns channels-first float observations."""

MUJOCO_ENTRY_POINT = "gymnasium.envs.mujoco"
"""Registered ids whose entry point lives in this package are MuJoCo tasks (HalfCheetah-v5,
Hopper-v5, Walker2d-v5, ...): :func:`make_gym_env` prepares them (see there)."""

EnvFamily = Literal["classic", "minatar", "atari", "mujoco"]
"""The env families whose recipe defaults differ (see ``Config.for_env`` of each recipe)."""


def env_family(env_id: str) -> EnvFamily:
    """The family of ``env_id``: ``atari``, ``minatar``, ``mujoco`` or ``classic``.

    ``"atari"`` for ``ALE/…`` ids, ``"minatar"`` for ``MinAtar/…``, ``"mujoco"`` for
    gymnasium's MuJoCo tasks (the registered ids whose entry point is in
    ``gymnasium.envs.mujoco``, read from gymnasium's registry; the ``mujoco`` package itself is
    only needed to build them), else ``"classic"``: classic control and the other
    vector-observation envs (the recipes' own defaults were tuned on CartPole-v1).

    Example:
        >>> env_family("MinAtar/Breakout-v1"), env_family("ALE/Pong-v5"), env_family("CartPole-v1")
        ('minatar', 'atari', 'classic')
        >>> env_family("HalfCheetah-v5"), env_family("Pendulum-v1")
        ('mujoco', 'classic')
    """
    name = env_id.rpartition(":")[2]  # gym.make's "module:Id" form
    if name.startswith(ATARI_PREFIX):
        return "atari"
    if name.startswith(MINATAR_PREFIX):
        return "minatar"
    spec = gym.registry.get(name)
    entry = getattr(spec, "entry_point", None)
    if isinstance(entry, str) and entry.startswith(MUJOCO_ENTRY_POINT):
        return "mujoco"
    return "classic"


def register_minatar() -> None:
    """Register the MinAtar ids (``MinAtar/<Game>-v0`` full action set, ``-v1`` minimal).

    Imports ``minatar`` (the optional extra) and calls its ``minatar.gym.register_envs()`` once
    per process. Games: Asterix, Breakout, Freeway, Seaquest, SpaceInvaders; sticky actions
    with probability 0.1 and difficulty ramping (the package's defaults, as in the paper).

    Raises:
        ImportError: ``minatar`` is not installed (the message names the extra to install).
    """
    if "MinAtar/Breakout-v1" in gym.registry:
        return
    try:
        import minatar.gym
    except ImportError as error:
        raise ImportError(
            "MinAtar environments need the minatar package: pip install 'ac-extensions[minatar]'"
        ) from error
    minatar.gym.register_envs()


def _make_mujoco(env_id: str) -> gym.Env:
    """``gym.make`` of a MuJoCo task, naming the extra to install when ``mujoco`` is missing."""
    try:
        return gym.make(env_id)
    except gym.error.DependencyNotInstalled as error:
        raise ImportError(
            f"{env_id} needs the mujoco package: pip install 'ac-extensions[mujoco]'"
        ) from error


class MinAtarObservation(gym.ObservationWrapper):
    """MinAtar's ``[10, 10, C]`` bool maps as ``[C, 10, 10]`` float32 (channels first).

    The layout the convolutions expect, as the paper's code transposes each state
    (kenjyoung/MinAtar ``examples/dqn.py``, ``get_state``); values stay 0/1.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        height, width, channels = env.observation_space.shape
        self.observation_space = gym.spaces.Box(
            0.0, 1.0, shape=(channels, height, width), dtype=np.float32
        )

    def observation(self, observation):
        """``[10, 10, C]`` bool → ``[C, 10, 10]`` float32."""
        # transpose with explicit axes: ~2 µs against ~10 µs for np.moveaxis (it normalises
        # its axis arguments on every call), paid per env and per step.
        return np.ascontiguousarray(observation.transpose(2, 0, 1), dtype=np.float32)


class Float32Observation(gym.ObservationWrapper):
    """A flat ``Box`` observation as float32 (MuJoCo's are float64); the bounds become ±inf."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.observation_space = gym.spaces.Box(
            -np.inf, np.inf, shape=env.observation_space.shape, dtype=np.float32
        )

    def observation(self, observation):
        """Cast to float32."""
        return np.asarray(observation, dtype=np.float32)


class ClipActionToBounds(gym.ActionWrapper):
    """Clip each action to the ``Box`` bounds before the env steps; the action space is kept.

    gymnasium's ``ClipAction`` clips the same way but widens the advertised action space to
    (−∞, ∞); keeping the bounds lets a policy read them from the env's spec (a tanh-squashed
    Gaussian maps onto them).
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        if not isinstance(env.action_space, gym.spaces.Box):
            raise TypeError(f"ClipActionToBounds needs a Box action space, got {env.action_space}")

    def action(self, action):
        """``action`` clipped to [low, high]."""
        return np.clip(action, self.action_space.low, self.action_space.high)


def prepare_mujoco(env: gym.Env) -> gym.Env:
    """A MuJoCo task as the recipes step it: actions in [−1, 1]^d, clipped; float32 observations.

    The agent's action a (unbounded: a Gaussian sample) is clipped to [−1, 1]^d and mapped
    affinely onto the task's ``Box`` bounds [low, high] (:class:`ClipActionToBounds` over
    gymnasium's ``RescaleAction``; the v5 locomotion tasks' bounds are already [−1, 1], so there
    the mapping is the identity). Clipping happens inside the env, after the collector recorded
    the sampled action, so µ's density is still evaluated at what µ drew (see
    :func:`make_batched_env`), while the task's control cost is charged on the clipped action
    it applies (MuJoCo clamps the dynamics to the control range but charges the raw action
    otherwise: an unbounded sample of norm 3 would pay 9× the cost of one at the bound for the
    same effect). SB3 clips its actions to the bounds the same way before ``env.step``.
    Observations are cast to float32 (:class:`Float32Observation`); the time limit
    (1000 steps) stays a truncation.
    """
    unit = np.ones(env.action_space.shape, dtype=env.action_space.dtype)
    env = ClipActionToBounds(gym.wrappers.RescaleAction(env, -unit, unit))
    return Float32Observation(env)


def make_gym_env(env_id: str) -> gym.Env:
    """One gymnasium env; Atari ids (``ALE/…``) and MinAtar ids (``MinAtar/…``) are prepared.

    Atari (Mnih et al., 2015, Nature 518, "Methods"; Machado et al., 2018, arXiv:1709.06009v2
    for the v5 defaults kept here: sticky actions 0.25, no life-loss terminals): the emulator
    runs at ``frameskip=1`` and gymnasium's ``AtariPreprocessing`` repeats each action 4 times
    (max-pooling the last two frames), starts episodes with up to 30 no-ops, and returns 84×84
    grayscale frames; ``FrameStackObservation`` stacks the last 4, so observations are
    ``uint8`` of shape (4, 84, 84). Rewards are the game's (Pong's are already in {−1, 0, 1}).
    The resizing needs ``opencv-python-headless`` (a dependency of this package).

    MuJoCo (the ``mujoco`` extra; HalfCheetah-v5, Hopper-v5, Walker2d-v5, ...): actions
    clipped to [−1, 1]^d and rescaled to the task's bounds, float32 observations
    (:func:`prepare_mujoco`); observation normalisation is the recipe's
    (:class:`~ac_extensions.modules.ObservationNormalizer`), not the env's.

    MinAtar (Young & Tian, 2019, arXiv:1903.03176; the ``minatar`` extra): the ids are
    registered on first use (:func:`register_minatar`, in whichever process builds the env),
    and observations are float32 ``[C, 10, 10]`` (:class:`MinAtarObservation`). Everything
    else is the package's: sticky actions 0.1, difficulty ramping, no frame skip, no time
    limit (Freeway ends itself after 2500 frames), rewards as the game gives them.

    Any other env with a ``Box`` action space clips its actions to the bounds
    (:class:`ClipActionToBounds`), as SB3 does before ``env.step``: Pendulum-v1 and
    LunarLanderContinuous clip inside ``step`` already, MountainCarContinuous-v0 would charge
    its power cost on the raw action.

    Args:
        env_id: a gymnasium id, e.g. ``"CartPole-v1"``, ``"ALE/Pong-v5"`` or
            ``"MinAtar/Breakout-v1"``.

    Returns:
        The gymnasium env.
    """
    if env_id.startswith(MINATAR_PREFIX):
        register_minatar()
        return MinAtarObservation(gym.make(env_id))
    if env_family(env_id) == "mujoco":
        return prepare_mujoco(_make_mujoco(env_id))
    if not env_id.startswith(ATARI_PREFIX):
        env = gym.make(env_id)
        if isinstance(env.action_space, gym.spaces.Box):
            env = ClipActionToBounds(env)
        return env
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
    ``[E, 4, 84, 84]`` uint8); MinAtar ids (``MinAtar/…``) give ``[E, C, 10, 10]`` float32.

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
    """The per-env shape of ``"observation"``: (O,), (4, 84, 84) for Atari, (C, 10, 10) MinAtar."""
    return tuple(env.observation_spec["observation"].shape[len(env.batch_size) :])


def torso_for(shape: Sequence[int]) -> Literal["mlp", "minatar", "cnn"]:
    """The network torso for a per-env observation shape (the recipes' choice).

    ``(C, 10, 10)`` → ``"minatar"`` (:class:`~ac_extensions.modules.MinAtarCNN`),
    ``(C, 84, 84)`` → ``"cnn"`` (:class:`~ac_extensions.modules.NatureCNN`), anything with
    fewer than three dims → ``"mlp"`` (on the flattened observation).

    Raises:
        ValueError: for another image shape (no torso fits it).

    Example:
        >>> torso_for((4,)), torso_for((4, 10, 10)), torso_for((4, 84, 84))
        ('mlp', 'minatar', 'cnn')
    """
    shape = tuple(int(n) for n in shape)
    if len(shape) < 3:
        return "mlp"
    if len(shape) == 3 and shape[1:] == (10, 10):
        return "minatar"
    if len(shape) == 3 and shape[1:] == (84, 84):
        return "cnn"
    raise ValueError(
        f"no network torso for observations of shape {list(shape)}: expected a vector, "
        "[C, 10, 10] (MinAtar) or [C, 84, 84] (Atari frames)"
    )


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


def action_bounds(env: EnvBase) -> tuple[torch.Tensor, torch.Tensor]:
    """``(low, high)``, each ``[d]``, of a continuous ``"action"`` (±inf where unbounded)."""
    spec = env.full_action_spec["action"]
    shape = spec.shape[len(env.batch_size) :]
    low = getattr(getattr(spec, "space", None), "low", None)
    if low is None:
        infinite = torch.full(shape, math.inf)
        return -infinite, infinite
    index = (0,) * len(env.batch_size)
    return spec.space.low[index].clone(), spec.space.high[index].clone()


ACTION_SPACE_NAMES = {"discrete": "a Discrete action space", "box": "a 1-D Box action space"}
"""The action-space kinds a recipe may accept, as its error messages name them."""


def action_space_kind(env_id: str) -> tuple[str, str]:
    """What ``env_id``'s action space is: ``(kind, description)``.

    ``kind`` is ``"discrete"`` (a gymnasium ``Discrete``), ``"box"`` (a 1-D ``Box``) or
    ``"other"`` (``MultiDiscrete``, a ``Box`` of several dimensions, ...); ``description`` is
    gymnasium's, e.g. ``"Box(-2.0, 2.0, (1,), float32)"``.
    """
    env = make_gym_env(env_id)
    try:
        space = env.action_space
    finally:
        env.close()
    if isinstance(space, gym.spaces.Discrete):
        return "discrete", str(space)
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
        return "box", str(space)
    return "other", str(space)


def require_action_space(env_id: str, accepted: Sequence[str], algorithm: str) -> str:
    """Refuse ``env_id`` unless its action space is of a kind in ``accepted``; return the kind.

    Raises:
        ValueError: one line naming the algorithm, the env, its action space and what the
            algorithm takes.
    """
    kind, description = action_space_kind(env_id)
    if kind not in accepted:
        takes = " or ".join(ACTION_SPACE_NAMES[k] for k in accepted)
        raise ValueError(
            f"{algorithm} cannot train on {env_id}: its action space is {description}, and "
            f"{algorithm} needs {takes}"
        )
    return kind
