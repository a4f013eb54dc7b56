"""Continuous-action ACER networks: a diagonal Gaussian actor and a stochastic dueling critic.

Wang et al., 2017, arXiv:1611.01224v2, §5.1 (continuous ACER). The critic is the stochastic
dueling network (SDN): one head V(x), one head A(x, a), and the action value

    Q̃(x, a) = V(x) + A(x, a) − (1/n) Σ_{i=1}^{n} A(x, u_i),    u_i ∼ π(·|x)

a stochastic estimate whose expectation over the samples is V(x) + A(x, a) − E_{u∼π}[A(x, u)],
so that E_{a∼π}[Q̃(x, a)] = V(x) and V = E_π[Q] holds by construction, as in the discrete
ACER critic. Feed-forward layout (what :func:`make_continuous_actor_critic` builds)::

    observation ──► MLP ──► loc ─────────┐
    log σ (one parameter per action dim) ┴─► scale ──► N(loc, diag σ²) ──► action, action_log_prob

    observation ──────────────► MLP_V ──► V(x) ───────────────────────┐           state_value
    (observation, action) ────► MLP_A ──► A(x, a) ────────────────────┼─► Q̃(x, a)  action_value
    (observation, u_1..u_n) ──► MLP_A ──► (1/n) Σ_i A(x, u_i) ── (−) ─┘
                 u_i ∼ N(loc, scale), read detached from the TensorDict

Recurrent layout (``recurrent="lstm"`` or ``"gru"``): separate memories for actor and critic,
each with its own hidden-state keys, as :func:`~ac_extensions.modules.make_actor_critic`::

    observation ──► MLP ──► actor_embed ──► LSTM/GRU ──► actor_memory ──► linear ──► loc ─┐
                                               ▲  │               log σ (or linear) ──► scale
          ("actor_recurrent_state_*") stored ──┘  └──► ("next", "actor_recurrent_state_*")

    observation ──► MLP ──► critic_embed ──► LSTM/GRU ──► critic_memory = h(x)  (the SDN's torso)
          ("critic_recurrent_state_*") stored ──┘  └──► ("next", "critic_recurrent_state_*")
    h(x) ──────────────► linear ──► V(x) ──────────────────────┐
    (h(x), action) ────► MLP_A ──► A(x, a) ────────────────────┼─► Q̃(x, a)
    (h(x), u_1..u_n) ──► MLP_A ──► (1/n) Σ_i A(x, u_i) ── (−) ─┘

The hidden states are read from the TensorDict and reset where ``is_init`` is set: build the
environment with :func:`~ac_extensions.modules.recurrent_env_transforms` and collect with
:func:`~ac_extensions.modules.collection_policy` (actor then critic), so that both memories
run at every step and both hidden states are stored. A loss replays whole ``[B, T]``
sequences in recurrent mode from the states stored at their first step.

The samples u_i are drawn from torch's global random number generator
(``torch.distributions.Normal(loc, scale).sample``), so ``torch.manual_seed`` makes Q̃
reproducible. They are drawn without reparametrisation and from detached ``loc``/``scale``:
a critic loss never sends gradient into the actor through Q̃.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase, TensorDictSequential
from tensordict.nn.distributions import AddStateIndependentNormalScale, NormalParamExtractor
from tensordict.utils import NestedKey
from torch import Tensor, nn
from torchrl.modules import GRUModule, IndependentNormal, LSTMModule, ProbabilisticActor

from ac_extensions.modules.actor_critic import make_encoder
from ac_extensions.modules.layers import ACTIVATIONS, linear, mlp

__all__ = ["StochasticDuelingNetwork", "make_continuous_actor_critic"]


class StochasticDuelingNetwork(TensorDictModuleBase):
    """Stochastic dueling network (SDN): V(x) and Q̃(x, a) for continuous actions.

        V(x)       = value_network(x)
        Q̃(x, a)   = V(x) + A(x, a) − (1/n) Σ_{i=1}^{n} A(x, u_i),   u_i ∼ N(loc(x), diag scale(x)²)

    Wang et al., 2017, arXiv:1611.01224v2, §5.1 (the stochastic dueling network; n = 5 in
    pfrl's and dchetelat's ports, the default here). In expectation over a and the u_i, both
    drawn from π, Q̃ equals V: the critic is trained through Q̃ (against Q^ret) and V (against
    V^target), and both losses reach both heads.

    Reads ``observation`` (shape [*B, O]) and, when all three are present, ``action``
    (shape [*B, d]) and the policy statistics ``loc`` / ``scale`` (shape [*B, d] each; the u_i
    are drawn from them, detached). Writes ``state_value`` V(x) (shape [*B, 1]) always and
    ``action_value`` Q̃(x, a) (shape [*B, 1]) when the action and the statistics are present:
    V of a next state needs neither. Giving only some of the three raises an error.

    With a ``torso`` (a TensorDict module, e.g. an encoder followed by TorchRL's
    ``LSTMModule`` / ``GRUModule``), :meth:`forward` runs it first and both heads read the
    features it writes under ``observation_key`` (shape [*B, F]) instead of the observation;
    the module's ``in_keys`` are then the torso's (observation, stored hidden states,
    ``is_init``) plus action / loc / scale, and its ``out_keys`` include what the torso writes
    (e.g. ``("next", hidden)``). The tensor API (:meth:`state_value`, :meth:`advantage`,
    :meth:`action_value`) always takes the heads' input, i.e. the features.

    The samples come from torch's global random number generator (``torch.manual_seed`` makes
    the output reproducible); each call draws fresh ones.

    Args:
        value_network: maps an observation [*B, O] to V(x), shape [*B, 1].
        advantage_network: called as ``advantage_network(observation, action)`` with shapes
            [*B, O] and [*B, d] (also with an extra leading sample dim, [n, *B, O] and
            [n, *B, d]); returns A(x, a), shape [*B, 1].
        num_samples: n, the number of samples u_i ∼ π(·|x) in the dueling correction.
        observation_key: the entry both heads read: the observation, or with a ``torso`` the
            features it writes (one of its ``out_keys``).
        torso: optional TensorDict module run before the heads (see above), e.g. the critic
            memory of :func:`make_continuous_actor_critic` with ``recurrent="lstm"``.
        action_key: the action entry a.
        loc_key: the policy mean entry.
        scale_key: the policy standard deviation entry (> 0).
        state_value_key: where V(x) is written.
        action_value_key: where Q̃(x, a) is written.

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> _, sdn = make_continuous_actor_critic(3, 2, hidden_sizes=(8,))
        >>> td = TensorDict({"observation": torch.randn(4, 3), "action": torch.randn(4, 2),
        ...                  "loc": torch.zeros(4, 2), "scale": torch.ones(4, 2)}, [4])
        >>> out = sdn(td)
        >>> out["state_value"].shape, out["action_value"].shape
        (torch.Size([4, 1]), torch.Size([4, 1]))
        >>> sdn(TensorDict({"observation": torch.randn(4, 3)}, [4]))["state_value"].shape
        torch.Size([4, 1])
    """

    def __init__(
        self,
        value_network: nn.Module,
        advantage_network: nn.Module,
        *,
        num_samples: int = 5,
        observation_key: NestedKey = "observation",
        action_key: NestedKey = "action",
        loc_key: NestedKey = "loc",
        scale_key: NestedKey = "scale",
        state_value_key: NestedKey = "state_value",
        action_value_key: NestedKey = "action_value",
        torso: TensorDictModuleBase | None = None,
    ) -> None:
        super().__init__()
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be an int >= 1, got {num_samples!r}")
        if torso is not None:
            if not isinstance(torso, TensorDictModuleBase):
                raise TypeError(
                    f"torso must be a TensorDict module (TensorDictModuleBase), got "
                    f"{type(torso).__name__}"
                )
            if observation_key not in torso.out_keys:
                raise ValueError(
                    f"with a torso, observation_key ({observation_key!r}) must be one of the "
                    f"torso's out_keys {list(torso.out_keys)}: the heads read its features"
                )
        self.torso = torso
        self.value_network = value_network
        self.advantage_network = advantage_network
        self.num_samples = num_samples
        self.observation_key = observation_key
        self.action_key = action_key
        self.loc_key = loc_key
        self.scale_key = scale_key
        self.state_value_key = state_value_key
        self.action_value_key = action_value_key
        inputs = [observation_key] if torso is None else list(torso.in_keys)
        self.in_keys = [*dict.fromkeys([*inputs, action_key, loc_key, scale_key])]
        outputs = [] if torso is None else list(torso.out_keys)
        self.out_keys = [*dict.fromkeys([*outputs, state_value_key, action_value_key])]

    # ------------------------------------------------------------------ tensor API
    def state_value(self, observation: Tensor) -> Tensor:
        """V(x), shape [*B, 1], from an observation of shape [*B, O]."""
        value = self.value_network(observation)
        if value.shape != (*observation.shape[:-1], 1):
            raise ValueError(
                f"{type(self).__name__}: value_network must return shape "
                f"{[*observation.shape[:-1], 1]} for an observation of shape "
                f"{list(observation.shape)}, got {list(value.shape)}"
            )
        return value

    def advantage(self, observation: Tensor, action: Tensor) -> Tensor:
        """A(x, a), shape [*B, 1], from shapes [*B, O] and [*B, d]."""
        advantage = self.advantage_network(observation, action)
        if advantage.shape != (*action.shape[:-1], 1):
            raise ValueError(
                f"{type(self).__name__}: advantage_network must return shape "
                f"{[*action.shape[:-1], 1]} for an action of shape {list(action.shape)}, got "
                f"{list(advantage.shape)}"
            )
        return advantage

    def sample_actions(self, loc: Tensor, scale: Tensor) -> Tensor:
        """Draw u_1..u_n ∼ N(loc, diag scale²), detached; shape [n, *B, d].

        Uses torch's global random number generator (``Normal.sample``, no reparametrisation).
        """
        if loc.shape != scale.shape:
            raise ValueError(
                f"{type(self).__name__}: {self.loc_key!r} {list(loc.shape)} and "
                f"{self.scale_key!r} {list(scale.shape)} must have the same shape [*B, d]"
            )
        normal = torch.distributions.Normal(loc.detach(), scale.detach(), validate_args=False)
        return normal.sample((self.num_samples,))

    def action_value(
        self,
        observation: Tensor,
        action: Tensor,
        loc: Tensor,
        scale: Tensor,
        state_value: Tensor | None = None,
    ) -> Tensor:
        """Q̃(x, a) = V(x) + A(x, a) − (1/n) Σ_i A(x, u_i), u_i ∼ N(loc, scale); shape [*B, 1].

        Wang et al., 2017, arXiv:1611.01224v2, §5.1. ``state_value`` (V(x), [*B, 1]) is
        recomputed when not given. Shapes: observation [*B, O]; action, loc, scale [*B, d].
        """
        if action.shape != loc.shape:
            raise ValueError(
                f"{type(self).__name__}: {self.action_key!r} {list(action.shape)} and "
                f"{self.loc_key!r} {list(loc.shape)} must have the same shape [*B, d]"
            )
        value = self.state_value(observation) if state_value is None else state_value
        samples = self.sample_actions(loc, scale)  # u_i                          [n, *B, d]
        repeated = observation.expand(self.num_samples, *observation.shape)  # [n, *B, O]
        sampled_mean = self.advantage(repeated, samples).mean(0)  # (1/n) Σ_i A(x, u_i) [*B, 1]
        return value + self.advantage(observation, action) - sampled_mean

    # ------------------------------------------------------------------ TensorDict API
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Write ``state_value`` and, given action/loc/scale, ``action_value`` into the input.

        With a torso, it runs first and writes its outputs (features, next hidden states) too.
        """
        if self.torso is not None:
            tensordict = self.torso(tensordict)
        observation = tensordict.get(self.observation_key)
        value = self.state_value(observation)
        tensordict.set(self.state_value_key, value)
        keys = (self.action_key, self.loc_key, self.scale_key)
        present = [tensordict.get(key, None) for key in keys]
        if all(x is not None for x in present):
            action, loc, scale = present
            tensordict.set(
                self.action_value_key, self.action_value(observation, action, loc, scale, value)
            )
        elif any(x is not None for x in present):
            missing = [k for k, x in zip(keys, present, strict=True) if x is None]
            raise KeyError(
                f"{type(self).__name__}: Q̃(x, a) needs {list(keys)}, the input (batch_size "
                f"{list(tensordict.batch_size)}) lacks {missing}"
            )
        return tensordict


class _ObservationActionMLP(nn.Module):
    """A(x, a): an MLP on the concatenation [x, a] (shapes [*B, O] and [*B, d] → [*B, 1])."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, observation: Tensor, action: Tensor) -> Tensor:
        return self.net(torch.cat([observation, action.to(observation.dtype)], dim=-1))


def _memory(
    name: str,
    observation_key: str,
    observation_dim: int,
    hidden_sizes: Sequence[int],
    recurrent: str,
    recurrent_size: int,
) -> TensorDictSequential:
    """Observation → tanh MLP encoder → LSTM/GRU with its own hidden keys → ``{name}_memory``.

    The encoder's last layer is activated (as ``make_actor_critic``'s recurrent branches); with
    no ``hidden_sizes`` the memory reads the observation itself. Hidden-state keys:
    ``{name}_recurrent_state_h`` / ``_c`` (LSTM) or ``{name}_recurrent_state`` (GRU), each of
    shape [*B, 1, recurrent_size].
    """
    modules: list[TensorDictModuleBase] = []
    memory_in, width = observation_key, observation_dim
    if hidden_sizes:
        encoder, width = make_encoder("mlp", observation_dim, hidden_sizes)
        memory_in = f"{name}_embed"
        modules.append(TensorDictModule(encoder, [observation_key], [memory_in]))
    if recurrent == "lstm":
        hidden, memory_cls = [f"{name}_recurrent_state_h", f"{name}_recurrent_state_c"], LSTMModule
    else:
        hidden, memory_cls = [f"{name}_recurrent_state"], GRUModule
    modules.append(
        memory_cls(
            input_size=width,
            hidden_size=recurrent_size,
            in_keys=[memory_in, *hidden],
            out_keys=[f"{name}_memory", *(("next", k) for k in hidden)],
        )
    )
    return TensorDictSequential(*modules)


def make_continuous_actor_critic(
    observation_dim: int,
    action_dim: int,
    *,
    hidden_sizes: Sequence[int] = (64, 64),
    num_samples: int = 5,
    state_dependent_scale: bool = False,
    init_scale: float = 1.0,
    fixed_scale: float | None = None,
    observation_key: str = "observation",
    recurrent: Literal["lstm", "gru"] | None = None,
    recurrent_size: int = 64,
    activation: Literal["tanh", "relu"] = "tanh",
) -> tuple[ProbabilisticActor, StochasticDuelingNetwork]:
    """Build continuous ACER's diagonal Gaussian actor and stochastic dueling critic.

        π(·|x) = N(loc(x), diag σ²),  log π(a|x) = Σ_{i=1}^{d} log N(a_i; loc_i(x), σ_i)
        Q̃(x, a) = V(x) + A(x, a) − (1/n) Σ_i A(x, u_i),  u_i ∼ π(·|x)

    Wang et al., 2017, arXiv:1611.01224v2, §5.1. The distribution is TorchRL's
    ``IndependentNormal`` (``Independent(Normal(loc, scale), 1)``, raw ``loc``, no tanh
    squashing): its log-density is the **sum** over the d action dimensions, i.e. the joint
    density that the importance ratio ρ = π(a|x)/µ(a|x) and the trace min(1, ρ^{1/d}) need.
    Actions are unbounded; clip or rescale them in the environment (a ``TanhNormal`` would
    change the density the loss differentiates).

    The scale is by default **state-independent**: one learned log σ per action dimension
    (tensordict's ``AddStateIndependentNormalScale``, ``exp`` mapping). The paper used a fixed
    diagonal covariance; a learned but state-independent σ stays closest to it while still
    letting the exploration noise shrink, it cannot collapse on individual (replayed) states,
    and it is the usual choice for Gaussian actor-critics on MuJoCo (dchetelat's ACER port,
    Andrychowicz et al., 2021, arXiv:2006.05990, §3.2). ``state_dependent_scale=True`` instead
    has the MLP output 2d values split by ``NormalParamExtractor`` (biased softplus, σ(0) = 1).
    ``fixed_scale=σ`` is the paper's own setting for its MuJoCo tasks: a fixed diagonal
    covariance, σ = 0.3 in every dimension (§6; :class:`FixedNormalScale`, a buffer, no
    gradient, so the trust region then acts on loc alone).

    **Recurrent torsos** (``recurrent="lstm"`` or ``"gru"``; see the module docstring's
    diagram). Actor and critic get separate memories (TorchRL ``LSTMModule`` / ``GRUModule``,
    as :func:`~ac_extensions.modules.make_actor_critic`): observation → tanh MLP encoder
    (``hidden_sizes``, last layer activated) → memory of ``recurrent_size`` → the heads. The
    actor's head is one linear layer to loc (or to 2d values for a state-dependent scale);
    the critic's memory is the SDN's ``torso``, whose features feed V (one linear layer) and
    A(x, a) (a tanh MLP with one hidden layer of ``hidden_sizes[-1]`` on [features, action]).
    Hidden-state keys, each of shape [*B, 1, recurrent_size]: ``actor_recurrent_state_h`` /
    ``actor_recurrent_state_c`` and ``critic_recurrent_state_h`` / ``critic_recurrent_state_c``
    (LSTM), or ``actor_recurrent_state`` and ``critic_recurrent_state`` (GRU); both modules
    also read ``is_init``. Build the env with
    ``recurrent_env_transforms(collection_policy(actor, critic))`` and collect with
    ``collection_policy(actor, critic)`` so that both hidden states are stored (the critic then
    also writes Q̃ at collection, drawing its u_i from the global generator). Replaying the
    stored sequences (recurrent mode, :class:`~ac_extensions.objectives.ContinuousACERLoss`)
    reproduces the collection-time loc/scale; the stored states can be refreshed with the
    loss's ``burn_in`` (Kapturowski et al., 2019, R2D2 §3).

    Args:
        observation_dim: O, the size of the flat observation.
        action_dim: d, the number of action dimensions.
        hidden_sizes: MLP widths, for the actor and for both critic heads.
        num_samples: n, the SDN's number of samples u_i (pfrl/dchetelat: 5).
        state_dependent_scale: learn σ(x) with an MLP head instead of one log σ per dim.
        init_scale: initial σ of the state-independent scale (> 0).
        fixed_scale: a constant σ (> 0) instead of a learned one (paper: 0.3); not with
            ``state_dependent_scale``.
        observation_key: the observation entry to read.
        recurrent: ``"lstm"`` or ``"gru"`` for recurrent torsos, ``None`` (default) for the
            feed-forward networks above.
        recurrent_size: hidden size of each memory (recurrent torsos only).
        activation: the hidden layers' activation of the feed-forward networks, ``"tanh"``
            (default; Andrychowicz et al., 2021, §3.2) or ``"relu"`` (SB3 zoo's choice for
            these tasks; cheaper on CPU: see ``benchmarks/results/acer_continuous_update.md``).
            Recurrent torsos keep tanh.

    Returns:
        ``(actor, critic)``. The actor (a ``ProbabilisticActor``) reads ``observation``
        (shape [*B, O]) and writes ``loc`` and ``scale`` (shape [*B, d] each), ``action``
        (shape [*B, d]) and ``action_log_prob`` (shape [*B]). The critic is a
        :class:`StochasticDuelingNetwork` writing ``state_value`` and ``action_value``
        (shape [*B, 1] each). Store the actor's ``loc``/``scale`` at collection: they are the
        behavior policy's statistics that continuous ACER needs.

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.envs.utils import ExplorationType, set_exploration_type
        >>> actor, critic = make_continuous_actor_critic(3, 2, hidden_sizes=(8,))
        >>> td = TensorDict({"observation": torch.randn(5, 3)}, [5])
        >>> with set_exploration_type(ExplorationType.RANDOM):
        ...     td = actor(td)
        >>> td["action"].shape, td["action_log_prob"].shape, td["scale"][0]
        (torch.Size([5, 2]), torch.Size([5]), tensor([1., 1.], grad_fn=<SelectBackward0>))
        >>> critic(td)["action_value"].shape
        torch.Size([5, 1])

        A recurrent pair, one step at a time (sequential mode, as at collection):

        >>> actor, critic = make_continuous_actor_critic(
        ...     3, 2, hidden_sizes=(8,), recurrent="gru", recurrent_size=6)
        >>> td = TensorDict({"observation": torch.randn(5, 3),
        ...                  "is_init": torch.ones(5, 1, dtype=torch.bool),
        ...                  "actor_recurrent_state": torch.zeros(5, 1, 6),
        ...                  "critic_recurrent_state": torch.zeros(5, 1, 6)}, [5])
        >>> td = critic(actor(td))
        >>> td["next", "actor_recurrent_state"].shape, td["action_value"].shape
        (torch.Size([5, 1, 6]), torch.Size([5, 1]))
    """
    if not init_scale > 0:
        raise ValueError(f"init_scale must be > 0, got {init_scale!r}")
    if fixed_scale is not None and not (fixed_scale > 0 and math.isfinite(fixed_scale)):
        raise ValueError(f"fixed_scale must be finite and > 0 (or None), got {fixed_scale!r}")
    if fixed_scale is not None and state_dependent_scale:
        raise ValueError("fixed_scale and state_dependent_scale exclude each other")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    if recurrent is not None:
        if recurrent not in ("lstm", "gru"):
            raise ValueError(f"recurrent must be 'lstm', 'gru' or None, got {recurrent!r}")
        if activation != "tanh":
            raise ValueError(f"recurrent torsos use tanh; got activation={activation!r}")
        if type(recurrent_size) is not int or recurrent_size < 1:
            raise ValueError(f"recurrent_size must be an int >= 1, got {recurrent_size!r}")
        return _recurrent_actor_critic(
            observation_dim,
            action_dim,
            hidden_sizes=hidden_sizes,
            num_samples=num_samples,
            state_dependent_scale=state_dependent_scale,
            init_scale=init_scale,
            fixed_scale=fixed_scale,
            observation_key=observation_key,
            recurrent=recurrent,
            recurrent_size=recurrent_size,
        )
    if state_dependent_scale:
        body = nn.Sequential(
            mlp(observation_dim, 2 * action_dim, hidden_sizes, 0.01, activation),
            NormalParamExtractor(scale_mapping="biased_softplus_1.0"),
        )
    else:
        body = nn.Sequential(
            mlp(observation_dim, action_dim, hidden_sizes, 0.01, activation),
            _scale_head(action_dim, init_scale, fixed_scale),
        )
    actor = ProbabilisticActor(
        TensorDictModule(body, [observation_key], ["loc", "scale"]),
        in_keys=["loc", "scale"],
        out_keys=["action"],
        distribution_class=IndependentNormal,
        return_log_prob=True,
    )
    critic = StochasticDuelingNetwork(
        mlp(observation_dim, 1, hidden_sizes, 1.0, activation),
        _ObservationActionMLP(mlp(observation_dim + action_dim, 1, hidden_sizes, 1.0, activation)),
        num_samples=num_samples,
        observation_key=observation_key,
    )
    return actor, critic


class FixedNormalScale(nn.Module):
    """loc → (loc, σ): a fixed diagonal Gaussian scale, the same σ in every dimension.

    The paper's continuous-control policy (Wang et al., 2017, arXiv:1611.01224v2, §6: "a
    diagonal Gaussian with fixed σ = 0.3"). σ is a buffer: it travels with the weights and
    checkpoints but has no gradient.

    Args:
        action_dim: d.
        scale: σ (> 0).
    """

    def __init__(self, action_dim: int, scale: float) -> None:
        super().__init__()
        self.register_buffer("scale", torch.full((action_dim,), float(scale)))

    def forward(self, loc: Tensor) -> tuple[Tensor, Tensor]:
        """Map ``loc`` [*B, d] to (loc, σ expanded to [*B, d])."""
        return loc, self.scale.expand_as(loc)


def _scale_head(action_dim: int, init_scale: float, fixed_scale: float | None) -> nn.Module:
    """The scale head, loc → (loc, scale): a learned state-independent log σ, or a fixed σ."""
    if fixed_scale is not None:
        return FixedNormalScale(action_dim, fixed_scale)
    return AddStateIndependentNormalScale(
        action_dim, scale_mapping="exp", init_value=math.log(init_scale)
    )


def _recurrent_actor_critic(
    observation_dim: int,
    action_dim: int,
    *,
    hidden_sizes: Sequence[int],
    num_samples: int,
    state_dependent_scale: bool,
    init_scale: float,
    fixed_scale: float | None,
    observation_key: str,
    recurrent: str,
    recurrent_size: int,
) -> tuple[ProbabilisticActor, StochasticDuelingNetwork]:
    """The recurrent variant of :func:`make_continuous_actor_critic` (see its docstring)."""
    if state_dependent_scale:
        head = nn.Sequential(
            linear(recurrent_size, 2 * action_dim, gain=0.01),
            NormalParamExtractor(scale_mapping="biased_softplus_1.0"),
        )
    else:
        head = nn.Sequential(
            linear(recurrent_size, action_dim, gain=0.01),
            _scale_head(action_dim, init_scale, fixed_scale),
        )
    actor_memory = _memory(
        "actor", observation_key, observation_dim, hidden_sizes, recurrent, recurrent_size
    )
    actor = ProbabilisticActor(
        TensorDictSequential(
            actor_memory, TensorDictModule(head, ["actor_memory"], ["loc", "scale"])
        ),
        in_keys=["loc", "scale"],
        out_keys=["action"],
        distribution_class=IndependentNormal,
        return_log_prob=True,
    )
    critic_memory = _memory(
        "critic", observation_key, observation_dim, hidden_sizes, recurrent, recurrent_size
    )
    advantage_hidden = list(hidden_sizes[-1:])
    critic = StochasticDuelingNetwork(
        linear(recurrent_size, 1, gain=1.0),
        _ObservationActionMLP(mlp(recurrent_size + action_dim, 1, advantage_hidden, head_gain=1.0)),
        num_samples=num_samples,
        observation_key="critic_memory",
        torso=critic_memory,
    )
    return actor, critic
