"""Reactor's network: shared torso, a policy LSTM and a critic LSTM (Gruslys et al., 2018).

::

                       prev_action  one-hot a_{t−1}, [*B, A]
                       prev_reward  r_{t−1}, [*B, 1]
                                │
    observation ─► torso ─► concat ─► lstm_input ─┬─► policy LSTM ─► linear ─► logits [*B, A]
    (MLP, Nature CNN        [*B, F+A+1]           │       ▲ │
     or MinAtar CNN)                              │stored │ └► ("next", "policy_recurrent_state_*")
                                                  │ ("policy_recurrent_state_h/c")
                                                  │
                                                  └─► critic LSTM ─► linear ─► action_value_logits
                                                          ▲ │                  [*B, A, N]
                                                   stored │ └► ("next", "critic_recurrent_state_*")
                                                    ("critic_recurrent_state_h/c")
                                  (distributional=False: action_value [*B, A] instead)

Each LSTM reads its stored state ``<branch>_recurrent_state_{h,c}`` (zeroed where ``is_init``)
and writes the new one to ``("next", <branch>_recurrent_state_{h,c})``; the environment carries
it to the next step through one merged ``TensorDictPrimer`` (see :func:`reactor_env_transforms`).

Design notes:

* Two LSTMs. The Reactor paper gives the policy and the Q branches their own recurrent and
  fully connected parts after a shared convolutional torso (Gruslys et al., 2018,
  arXiv:1704.04651v2, appendix on the network). We follow it: one torso, two LSTMs, two
  linear heads. It also matches what :func:`make_actor_critic` does for PPO (a
  shared memory let the critic's gradients swamp the policy's).
* LSTM input ``[features, one-hot a_{t−1}, r_{t−1}]``, as in R2D2/R2D1 (Kapturowski et al.,
  2019) and rlpyt's R2D1 model; :class:`PreviousActionReward` puts a_{t−1} and r_{t−1} in the
  observation. Both LSTMs see the same input.
* Stored state (R2D2 §3): the hidden states are stored at collection, so a replayed ``[B, T]``
  sequence can start from the stored state of its first step (recurrent mode) and, with a
  burn-in prefix, refresh it.
* Paper options (§3.4.1), on by default: the policy branch reads the torso's output cut from
  the graph (only the critic trains the shared torso; ``policy_torso_gradient=True`` lets both
  train it), the policy is the softmax mixed with the uniform distribution
  (``policy_epsilon``), and the distributional Q head is dueling (``dueling``).
* Replaying stored data through the whole ``ProbabilisticActor`` samples a fresh ``action``
  and overwrites ``action`` / ``action_log_prob``: a loss should run ``actor.module[0]`` (the
  network without the sampling step) or replay a copy holding only the inputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import Tensor, nn
from torchrl.data import Bounded, Composite, Unbounded
from torchrl.envs import Compose, Transform
from torchrl.modules import LSTMModule, ProbabilisticActor

from ac_extensions.modules.acer import NatureCNN
from ac_extensions.modules.actor_critic import recurrent_env_transforms
from ac_extensions.modules.layers import mlp_torso
from ac_extensions.modules.minatar import MinAtarCNN

PREV_ACTION_KEY = "prev_action"
PREV_REWARD_KEY = "prev_reward"
BRANCHES = ("policy", "critic")


class PreviousActionReward(Transform):
    """Env transform writing the previous action (one-hot) and reward into the observation.

    After each step it writes ``("next", "prev_action")`` = one-hot(a_t) and
    ``("next", "prev_reward")`` = r_t, which ``step_mdp`` moves to the root, so the policy at
    step t+1 reads a_t and r_t. At a reset (including the partial resets of sub-envs inside a
    batched env, given by the ``"_reset"`` mask) both are zero. This is the recurrent core's
    extra input of Reactor (Gruslys et al., 2018, arXiv:1704.04651v2) and R2D2 (Kapturowski
    et al., 2019).

    The reward is read as it stands at this transform's place in the env's transform chain:
    append this transform after any reward clipping or scaling that the network should see.

    Args:
        num_actions: number of discrete actions A. ``None``: read from the parent env's
            ``Categorical`` / ``OneHot`` action spec.
        action_key: the action entry (an index of shape [*B], or a one-hot [*B, A]).
        reward_key: the reward entry, shape [*B, 1].
        out_keys: names of the previous action ([*B, A], float) and reward ([*B, 1]) entries.

    Example:
        >>> from torchrl.envs import GymEnv, TransformedEnv
        >>> base = GymEnv("CartPole-v1", categorical_action_encoding=True)  # index actions
        >>> env = TransformedEnv(base, PreviousActionReward())
        >>> td = env.rollout(3)
        >>> td["prev_action"][0].tolist(), td["prev_reward"][0].tolist()
        ([0.0, 0.0], [0.0])
        >>> bool((td["prev_action"][1:].argmax(-1) == td["action"][:-1]).all())
        True
    """

    def __init__(
        self,
        num_actions: int | None = None,
        *,
        action_key: str = "action",
        reward_key: str = "reward",
        out_keys: Sequence[str] = (PREV_ACTION_KEY, PREV_REWARD_KEY),
    ) -> None:
        if len(out_keys) != 2:
            raise ValueError(f"out_keys must name (prev_action, prev_reward), got {out_keys}")
        super().__init__(in_keys=[action_key, reward_key], out_keys=list(out_keys))
        self.num_actions = num_actions
        self.action_key, self.reward_key = action_key, reward_key
        self.prev_action_key, self.prev_reward_key = out_keys

    def _num_actions(self) -> int:
        if self.num_actions is None:
            if self.parent is None:
                raise ValueError("PreviousActionReward: give num_actions or append it to an env")
            spec = self.parent.full_action_spec[self.action_key]
            n = getattr(spec.space, "n", None)
            if spec.domain != "discrete" or n is None:
                raise ValueError(
                    f"PreviousActionReward needs a discrete action spec, got {type(spec).__name__}"
                )
            self.num_actions = int(n)
        return self.num_actions

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        batch = next_tensordict.batch_size
        action = tensordict.get(self.action_key)
        if action.shape == batch:  # an index [*B] → one-hot [*B, A]
            action = F.one_hot(action.long(), self._num_actions())
        next_tensordict.set(self.prev_action_key, action.to(torch.float32))
        reward = next_tensordict.get(self.reward_key)
        next_tensordict.set(self.prev_reward_key, reward.to(torch.float32).reshape(*batch, 1))
        return next_tensordict

    def _reset(
        self, tensordict: TensorDictBase | None, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        batch = tensordict_reset.batch_size
        device = tensordict_reset.device
        zeros = {
            self.prev_action_key: torch.zeros(*batch, self._num_actions(), device=device),
            self.prev_reward_key: torch.zeros(*batch, 1, device=device),
        }
        reset = None if tensordict is None else tensordict.get("_reset", None)
        for key, zero in zeros.items():
            previous = None if tensordict is None else tensordict.get(key, None)
            if reset is not None and previous is not None and previous.shape == zero.shape:
                # Partial reset of a batched env: zero only the sub-envs that restart
                # (env.reset also merges by the mask; this keeps the transform correct alone).
                mask = reset.reshape(*batch, 1)
                zero = torch.where(mask, zero, previous.to(zero))
            tensordict_reset.set(key, zero)
        return tensordict_reset

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        """Declare ``prev_action`` [*B, A] in [0, 1] and ``prev_reward`` [*B, 1] (float)."""
        batch = observation_spec.shape
        device = observation_spec.device
        observation_spec[self.prev_action_key] = Bounded(
            0.0, 1.0, shape=(*batch, self._num_actions()), dtype=torch.float32, device=device
        )
        observation_spec[self.prev_reward_key] = Unbounded(
            shape=(*batch, 1), dtype=torch.float32, device=device
        )
        return observation_spec

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Not usable outside an env: the previous step is not in a single TensorDict."""
        raise NotImplementedError("PreviousActionReward is an environment transform only")


class _Concat(nn.Module):
    """Concatenate along the last dim (features, one-hot a_{t−1}, r_{t−1}) → [*B, F + A + 1]."""

    def forward(self, *tensors: Tensor) -> Tensor:
        return torch.cat(tensors, -1)


class _ReactorHeads(nn.Module):
    """Policy log-probabilities [*B, A] and Q output [*B, A, N] (distributional) or [*B, A].

    Policy (Gruslys et al., 2018, arXiv:1704.04651v2, §3.4.1): the softmax mixed with the
    uniform distribution, π = (1 − ε) softmax(l) + ε/A, written as its logarithm (normalised
    logits: ``log_softmax`` of them returns them unchanged), so π(a) >= ε/A and the stored
    µ(a|x) of any action stays bounded away from 0. Q (§3.4.1, dueling as Wang et al., 2016,
    arXiv:1511.06581, Eq. 9, per atom): logits_{a,i} = v_i + (adv_{a,i} − mean_b adv_{b,i}).
    """

    def __init__(
        self,
        width: int,
        num_actions: int,
        num_atoms: int | None,
        *,
        policy_epsilon: float = 0.0,
        dueling: bool = False,
    ) -> None:
        super().__init__()
        self.num_actions, self.num_atoms = num_actions, num_atoms
        self.policy_epsilon, self.dueling = policy_epsilon, dueling
        atoms = num_atoms or 1
        self.policy = nn.Linear(width, num_actions)
        self.qvalue = nn.Linear(width, num_actions * atoms)  # the advantages if dueling
        self.state_value = nn.Linear(width, atoms) if dueling else None
        # Small policy head (near-uniform initial π; Andrychowicz et al., 2021, §3.2).
        nn.init.orthogonal_(self.policy.weight, 0.01)
        nn.init.zeros_(self.policy.bias)

    def forward(self, policy_memory: Tensor, critic_memory: Tensor) -> tuple[Tensor, Tensor]:
        q = self.qvalue(critic_memory).unflatten(-1, (self.num_actions, self.num_atoms or 1))
        if self.state_value is not None:  # v_i + adv_{a,i} − mean_b adv_{b,i}     [*B, A, N]
            value = self.state_value(critic_memory).unsqueeze(-2)  # [*B, 1, N]
            q = value + q - q.mean(-2, keepdim=True)
        if self.num_atoms is None:
            q = q.squeeze(-1)  # [*B, A]
        logits = self.policy(policy_memory)
        eps = self.policy_epsilon
        if eps > 0:  # log[(1 − ε) softmax(l) + ε/A]                                  [*B, A]
            logits = torch.logaddexp(
                logits.log_softmax(-1) + math.log1p(-eps),
                torch.full_like(logits, math.log(eps / self.num_actions)),
            )
        return logits, q


class _StopGradient(nn.Module):
    """The input, cut from the graph (Reactor, §3.4.1).

    The policy branch reads it, so the policy's gradient does not reach the shared torso.
    """

    def forward(self, x: Tensor) -> Tensor:
        return x.detach()


def reactor_hidden_state_keys(branch: str) -> list[str]:
    """The stored-state keys ``[h, c]`` of one Reactor LSTM branch (``policy`` / ``critic``).

    Args:
        branch: ``"policy"`` or ``"critic"``.

    Returns:
        ``["<branch>_recurrent_state_h", "<branch>_recurrent_state_c"]``; each entry has shape
        ``[*B, 1, recurrent_size]`` in a TensorDict (Kapturowski et al., 2019, R2D2's stored
        state; Gruslys et al., 2018, arXiv:1704.04651v2).

    Example:
        >>> reactor_hidden_state_keys("critic")
        ['critic_recurrent_state_h', 'critic_recurrent_state_c']
    """
    if branch not in BRANCHES:
        raise ValueError(f"branch must be one of {BRANCHES}, got {branch!r}")
    return [f"{branch}_recurrent_state_h", f"{branch}_recurrent_state_c"]


def make_reactor_actor(
    observation_shape: int | Sequence[int],
    num_actions: int,
    *,
    torso: Literal["mlp", "cnn", "minatar"] = "mlp",
    hidden_sizes: Sequence[int] = (64,),
    recurrent_size: int = 128,
    num_atoms: int = 51,
    distributional: bool = True,
    previous_action_reward: bool = True,
    recurrent: bool = True,
    observation_key: str = "observation",
    policy_epsilon: float = 0.01,
    dueling: bool = True,
    policy_torso_gradient: bool = False,
) -> ProbabilisticActor:
    """Reactor's recurrent policy-plus-distributional-Q network, as one TorchRL actor.

    One shared torso, then two LSTMs (policy and critic, each with its own stored state) fed
    with ``[features, one-hot a_{t−1}, r_{t−1}]``, then a softmax policy head and a
    distributional Q head (N atom logits per action) — see the module docstring's diagram.
    Reference: Gruslys et al., 2018, arXiv:1704.04651v2 (network, appendix: separate policy
    and Q LSTMs after a shared torso); Kapturowski et al., 2019 (R2D2) for the
    previous action/reward input and the stored recurrent state.

    Args:
        observation_shape: observation size (MLP torso), ``(C, 84, 84)`` (CNN torso) or
            ``(C, 10, 10)`` (MinAtar torso).
        num_actions: number of discrete actions A.
        torso: ``"mlp"`` (tanh MLP of ``hidden_sizes``), ``"cnn"`` (:class:`NatureCNN`) or
            ``"minatar"`` (:class:`~ac_extensions.modules.MinAtarCNN`: one 3×3 conv with 16
            channels, then 128 units; Young & Tian, 2019, arXiv:1903.03176), shared by both
            branches.
        hidden_sizes: MLP widths (ignored by the convolutional torsos; ``()``: no torso).
        recurrent_size: hidden size of each LSTM.
        num_atoms: atoms N of the distributional Q head.
        distributional: ``True``: write ``action_value_logits`` [*B, A, N]; ``False``:
            write ``action_value`` [*B, A] (Reactor ND).
        previous_action_reward: feed ``prev_action`` [*B, A] and ``prev_reward`` [*B, 1]
            (written by :class:`PreviousActionReward`) to the LSTMs.
        recurrent: ``True``: the two branches are LSTMs (Reactor's network). ``False``: each
            branch is a feed-forward ``Linear(·, recurrent_size)`` + tanh layer instead, with no
            stored state (for Markov tasks such as CartPole-v1, where memory is not needed and
            replay skips the sequential LSTM pass); the actor then reads no ``is_init`` and no
            ``*_recurrent_state_*`` keys.
        observation_key: the observation entry to read, shape [*B, D], [*B, C, 84, 84] or
            [*B, C, 10, 10].
        policy_epsilon: ε of the policy π = (1 − ε) softmax + ε/A (Reactor, §3.4.1: the
            softmax is mixed with a fixed uniform distribution, so µ(a|x) >= ε/A and the
            importance ratios π/µ stay bounded). 0.01 is this library's choice, not a value
            taken from the paper. 0: the plain softmax (``ReactorConfig.PREVIOUS``).
        dueling: the Q head as state value + mean-centred advantages, per atom (Reactor's
            dueling distributional head; Wang et al., 2016, arXiv:1511.06581, Eq. 9). False:
            one linear layer to A×N logits.
        policy_torso_gradient: False (Reactor, §3.4.1): the policy branch reads the torso's
            output cut from the graph, so only the critic trains the shared torso. True: both
            branches train it (``ReactorConfig.PREVIOUS``, and the MinAtar default).

    Returns:
        A ``ProbabilisticActor`` (Categorical on ``logits``, ``return_log_prob=True``). It
        reads ``observation_key``, ``prev_action``, ``prev_reward``, ``is_init`` and the stored
        states ``policy_recurrent_state_{h,c}``, ``critic_recurrent_state_{h,c}`` (each
        [*B, 1, recurrent_size]); it writes ``logits`` [*B, A], ``action_value_logits``
        [*B, A, N] (or ``action_value`` [*B, A]), ``action`` (an index, [*B]),
        ``action_log_prob`` [*B] = log µ(a_t|x_t), and ``("next", <state key>)``. Outside
        recurrent mode it runs one step on [*B]; under
        ``torchrl.modules.set_recurrent_mode(True)`` the last batch dim is time and each
        sequence starts from its stored state. Build the env with
        :func:`reactor_env_transforms`.

    Example:
        >>> from tensordict import TensorDict
        >>> actor = make_reactor_actor(4, 2, hidden_sizes=(16,), recurrent_size=8, num_atoms=5)
        >>> td = TensorDict(
        ...     {
        ...         "observation": torch.randn(3, 4),
        ...         "prev_action": torch.zeros(3, 2),
        ...         "prev_reward": torch.zeros(3, 1),
        ...         "is_init": torch.ones(3, 1, dtype=torch.bool),
        ...     },
        ...     [3],
        ... )
        >>> out = actor(td)
        >>> out["logits"].shape, out["action_value_logits"].shape, out["action"].shape
        (torch.Size([3, 2]), torch.Size([3, 2, 5]), torch.Size([3]))
        >>> out["next", "policy_recurrent_state_h"].shape
        torch.Size([3, 1, 8])
    """
    if torso == "mlp":
        dim = observation_shape if isinstance(observation_shape, int) else observation_shape[-1]
        body: nn.Module = mlp_torso(int(dim), hidden_sizes)
        width = hidden_sizes[-1] if hidden_sizes else int(dim)
    elif torso in ("cnn", "minatar"):
        if isinstance(observation_shape, int):
            size = 84 if torso == "cnn" else 10
            raise ValueError(f"torso={torso!r} needs observation_shape = (C, {size}, {size})")
        body = (NatureCNN if torso == "cnn" else MinAtarCNN)(int(observation_shape[0]))
        width = body.features
    else:
        raise ValueError(f"torso must be 'mlp', 'cnn' or 'minatar', got {torso!r}")
    if num_atoms < 1:
        raise ValueError(f"num_atoms must be positive, got {num_atoms}")
    modules: list[TensorDictModule] = [TensorDictModule(body, [observation_key], ["features"])]
    lstm_input = "features"
    if previous_action_reward:
        modules.append(
            TensorDictModule(
                _Concat(), ["features", PREV_ACTION_KEY, PREV_REWARD_KEY], ["lstm_input"]
            )
        )
        lstm_input, width = "lstm_input", width + num_actions + 1  # [*B, F + A + 1]
    if not 0.0 <= policy_epsilon < 1.0:
        raise ValueError(f"policy_epsilon must lie in [0, 1), got {policy_epsilon}")
    branch_input = {"policy": lstm_input, "critic": lstm_input}
    if not policy_torso_gradient:  # the policy's gradient stops before the shared torso
        modules.append(TensorDictModule(_StopGradient(), [lstm_input], ["policy_input"]))
        branch_input["policy"] = "policy_input"
    for branch in BRANCHES:
        if not recurrent:  # feed-forward branch: Linear + tanh, no stored state
            modules.append(
                TensorDictModule(
                    mlp_torso(width, (recurrent_size,)),
                    [branch_input[branch]],
                    [f"{branch}_memory"],
                )
            )
            continue
        hidden = reactor_hidden_state_keys(branch)
        modules.append(
            LSTMModule(
                input_size=width,
                hidden_size=recurrent_size,
                in_keys=[branch_input[branch], *hidden],
                out_keys=[f"{branch}_memory", *(("next", k) for k in hidden)],
            )
        )
    q_key = "action_value_logits" if distributional else "action_value"
    heads = _ReactorHeads(
        recurrent_size,
        num_actions,
        num_atoms if distributional else None,
        policy_epsilon=policy_epsilon,
        dueling=dueling,
    )
    modules.append(TensorDictModule(heads, ["policy_memory", "critic_memory"], ["logits", q_key]))
    return ProbabilisticActor(
        TensorDictSequential(*modules),
        in_keys=["logits"],
        out_keys=["action"],
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
    )


def reactor_env_transforms(actor: nn.Module) -> Compose:
    """The env transforms a Reactor actor needs: ``InitTracker``, one primer, prev action/reward.

    ``InitTracker`` writes ``is_init`` (where the LSTMs restart from zero); a single
    ``TensorDictPrimer`` holds the stored states of **both** LSTMs (an env keeps only one of
    several appended primers, see :func:`recurrent_env_transforms`); and, if the actor reads
    them, :class:`PreviousActionReward` writes ``prev_action`` / ``prev_reward``. Append the
    result after any reward transform: ``env.append_transform(reactor_env_transforms(actor))``.
    Stored recurrent state follows R2D2 (Kapturowski et al., 2019); the network is Reactor's
    (Gruslys et al., 2018, arXiv:1704.04651v2).

    Args:
        actor: the module from :func:`make_reactor_actor`.

    Returns:
        A ``Compose`` of ``InitTracker``, the merged primer (4 entries of shape
        [*E, 1, recurrent_size]) and, if needed, ``PreviousActionReward(A)``. For a
        feed-forward actor (``recurrent=False``) only ``PreviousActionReward(A)``, if needed
        (an empty ``Compose`` otherwise).

    Example:
        >>> from torchrl.envs import GymEnv, TransformedEnv
        >>> actor = make_reactor_actor(4, 2, hidden_sizes=(16,), recurrent_size=8, num_atoms=5)
        >>> base = GymEnv("CartPole-v1", categorical_action_encoding=True)
        >>> env = TransformedEnv(base, reactor_env_transforms(actor))
        >>> td = env.rollout(5, actor)
        >>> td["action_value_logits"].shape, td["critic_recurrent_state_c"].shape
        (torch.Size([5, 2, 5]), torch.Size([5, 1, 8]))
    """
    recurrent = any(isinstance(m, LSTMModule) for m in actor.modules())
    transforms = recurrent_env_transforms(actor) if recurrent else Compose()
    if PREV_ACTION_KEY in actor.in_keys or PREV_REWARD_KEY in actor.in_keys:
        heads = [m for m in actor.modules() if isinstance(m, _ReactorHeads)]
        num_actions = heads[0].num_actions if heads else None
        transforms.append(PreviousActionReward(num_actions))
    return transforms


__all__ = [
    "PreviousActionReward",
    "make_reactor_actor",
    "reactor_env_transforms",
    "reactor_hidden_state_keys",
]
