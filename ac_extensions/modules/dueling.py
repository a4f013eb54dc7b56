"""Continuous-action ACER networks: a diagonal Gaussian actor and a stochastic dueling critic.

Wang et al., 2017, arXiv:1611.01224v2, §5.1 (continuous ACER). The critic is the stochastic
dueling network (SDN): one head V(x), one head A(x, a), and the action value

    Q̃(x, a) = V(x) + A(x, a) − (1/n) Σ_{i=1}^{n} A(x, u_i),    u_i ∼ π(·|x)

a stochastic estimate whose expectation over the samples is V(x) + A(x, a) − E_{u∼π}[A(x, u)],
so that E_{a∼π}[Q̃(x, a)] = V(x) and V = E_π[Q] holds by construction, as in the discrete
ACER critic. Layout (what :func:`make_continuous_actor_critic` builds)::

    observation ──► MLP ──► loc ─────────┐
    log σ (one parameter per action dim) ┴─► scale ──► N(loc, diag σ²) ──► action, action_log_prob

    observation ──────────────► MLP_V ──► V(x) ───────────────────────┐           state_value
    (observation, action) ────► MLP_A ──► A(x, a) ────────────────────┼─► Q̃(x, a)  action_value
    (observation, u_1..u_n) ──► MLP_A ──► (1/n) Σ_i A(x, u_i) ── (−) ─┘
                 u_i ∼ N(loc, scale), read detached from the TensorDict

The samples u_i are drawn from torch's global random number generator
(``torch.distributions.Normal(loc, scale).sample``), so ``torch.manual_seed`` makes Q̃
reproducible. They are drawn without reparametrisation and from detached ``loc``/``scale``:
a critic loss never sends gradient into the actor through Q̃.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase
from tensordict.nn.distributions import AddStateIndependentNormalScale, NormalParamExtractor
from tensordict.utils import NestedKey
from torch import Tensor, nn
from torchrl.modules import MLP, IndependentNormal, ProbabilisticActor

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

    The samples come from torch's global random number generator (``torch.manual_seed`` makes
    the output reproducible); each call draws fresh ones.

    Args:
        value_network: maps an observation [*B, O] to V(x), shape [*B, 1].
        advantage_network: called as ``advantage_network(observation, action)`` with shapes
            [*B, O] and [*B, d] (also with an extra leading sample dim, [n, *B, O] and
            [n, *B, d]); returns A(x, a), shape [*B, 1].
        num_samples: n, the number of samples u_i ∼ π(·|x) in the dueling correction.
        observation_key: the observation entry.
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
    ) -> None:
        super().__init__()
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be an int >= 1, got {num_samples!r}")
        self.value_network = value_network
        self.advantage_network = advantage_network
        self.num_samples = num_samples
        self.observation_key = observation_key
        self.action_key = action_key
        self.loc_key = loc_key
        self.scale_key = scale_key
        self.state_value_key = state_value_key
        self.action_value_key = action_value_key
        self.in_keys = [observation_key, action_key, loc_key, scale_key]
        self.out_keys = [state_value_key, action_value_key]

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
        """Write ``state_value`` and, given action/loc/scale, ``action_value`` into the input."""
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


def _mlp(in_features: int, out_features: int, hidden: Sequence[int], head_gain: float) -> MLP:
    """Tanh MLP, orthogonal init (√2 hidden, ``head_gain`` on the output layer), zero biases.

    Andrychowicz et al., 2021, arXiv:2006.05990, §3.2 (the same init as ``make_actor_critic``).
    """
    net = MLP(
        in_features=in_features,
        out_features=out_features,
        num_cells=list(hidden),
        activation_class=nn.Tanh,
    )
    linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
    for layer in linears:
        nn.init.orthogonal_(layer.weight, 2**0.5)
        nn.init.zeros_(layer.bias)
    nn.init.orthogonal_(linears[-1].weight, head_gain)
    return net


def make_continuous_actor_critic(
    observation_dim: int,
    action_dim: int,
    *,
    hidden_sizes: Sequence[int] = (64, 64),
    num_samples: int = 5,
    state_dependent_scale: bool = False,
    init_scale: float = 1.0,
    observation_key: str = "observation",
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

    Args:
        observation_dim: O, the size of the flat observation.
        action_dim: d, the number of action dimensions.
        hidden_sizes: MLP widths, for the actor and for both critic heads.
        num_samples: n, the SDN's number of samples u_i (pfrl/dchetelat: 5).
        state_dependent_scale: learn σ(x) with an MLP head instead of one log σ per dim.
        init_scale: initial σ of the state-independent scale (> 0).
        observation_key: the observation entry to read.

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
    """
    if not init_scale > 0:
        raise ValueError(f"init_scale must be > 0, got {init_scale!r}")
    if state_dependent_scale:
        body = nn.Sequential(
            _mlp(observation_dim, 2 * action_dim, hidden_sizes, head_gain=0.01),
            NormalParamExtractor(scale_mapping="biased_softplus_1.0"),
        )
    else:
        body = nn.Sequential(
            _mlp(observation_dim, action_dim, hidden_sizes, head_gain=0.01),
            AddStateIndependentNormalScale(
                action_dim, scale_mapping="exp", init_value=math.log(init_scale)
            ),
        )
    actor = ProbabilisticActor(
        TensorDictModule(body, [observation_key], ["loc", "scale"]),
        in_keys=["loc", "scale"],
        out_keys=["action"],
        distribution_class=IndependentNormal,
        return_log_prob=True,
    )
    critic = StochasticDuelingNetwork(
        _mlp(observation_dim, 1, hidden_sizes, head_gain=1.0),
        _ObservationActionMLP(_mlp(observation_dim + action_dim, 1, hidden_sizes, head_gain=1.0)),
        num_samples=num_samples,
        observation_key=observation_key,
    )
    return actor, critic
