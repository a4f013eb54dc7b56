"""Actor-critic networks as TorchRL modules, feed-forward or recurrent (LSTM / GRU).

Feed-forward::

    observation ──► MLP ──► logits ──► Categorical ──► action, action_log_prob     (actor)
    observation ──► MLP ──► state_value                                              (critic)

With image observations the MLP is replaced by a convolutional torso and a linear head
(``torso="minatar"``: :class:`~ac_extensions.modules.MinAtarCNN`, ``[*B, C, 10, 10]``;
``torso="cnn"``: :class:`~ac_extensions.modules.NatureCNN`, ``[*B, C, 84, 84]``), one torso
each for actor and critic as with the MLPs.

Recurrent (separate memories for actor and critic, as SB3-contrib's RecurrentPPO: a shared
memory lets the critic's larger gradients swamp the policy's, which measurably stopped PPO from
learning CartPole here)::

    observation ──► MLP ──► actor_embed ──► LSTM/GRU ──► actor_memory ──► linear ──► logits
                                               ▲  │
          ("actor_recurrent_state_*") stored ──┘  └──► ("next", "actor_recurrent_state_*")
    observation ──► MLP ──► critic_embed ──► LSTM/GRU ──► critic_memory ──► linear ──► state_value
                                               (its own "critic_recurrent_state_*" keys)

Both memories must run at collection so that both hidden states are stored:
:func:`collection_policy` chains actor and critic for that.

The recurrent module reads its hidden state from the TensorDict (written at collection by the
module itself and fed back through a ``TensorDictPrimer``) and resets it where ``is_init`` is
set (``InitTracker``): :func:`recurrent_env_transforms` builds both for an environment. In a
loss (recurrent mode) it runs over whole ``[B, T]`` sequences, starting from the stored hidden
state of each sequence's first step.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Literal

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from tensordict.nn.distributions import AddStateIndependentNormalScale
from torch import nn
from torchrl.data import Composite
from torchrl.envs import Compose, ExplorationType, InitTracker, TensorDictPrimer
from torchrl.envs.utils import exploration_type
from torchrl.modules import (
    MLP,
    GRUModule,
    IndependentNormal,
    LSTMModule,
    ProbabilisticActor,
    TanhNormal,
    ValueOperator,
)
from torchrl.modules.utils import get_primers_from_module

from ac_extensions.modules.acer import NatureCNN
from ac_extensions.modules.layers import mlp, orthogonal_init
from ac_extensions.modules.minatar import MinAtarCNN

Torso = Literal["mlp", "minatar", "cnn"]
"""Observation torsos: a tanh MLP, the MinAtar network's, the Nature DQN's."""
Distribution = Literal["categorical", "normal", "tanh_normal"]
"""Policy distributions of :func:`make_actor_critic`."""
DISTRIBUTIONS = ("categorical", "normal", "tanh_normal")


def _image_torso(torso: str, observation_shape) -> MinAtarCNN | NatureCNN:
    """The convolutional torso ``torso`` for ``observation_shape`` = (C, H, W)."""
    if isinstance(observation_shape, int) or len(observation_shape) != 3:
        raise ValueError(
            f"torso={torso!r} needs observation_shape (C, H, W), got {observation_shape!r}"
        )
    if torso == "minatar":
        return MinAtarCNN(int(observation_shape[0]))
    return NatureCNN(int(observation_shape[0]))


def _image_net(torso: str, observation_shape, out_features: int, head_gain: float) -> nn.Module:
    """Convolutional torso → linear head (orthogonal, ``head_gain``)."""
    body = _image_torso(torso, observation_shape)
    return nn.Sequential(body, orthogonal_init(nn.Linear(body.features, out_features), head_gain))


def make_encoder(torso: str, observation_dim, hidden_sizes: Sequence[int]) -> tuple[nn.Module, int]:
    """Observation → features, and their width: the shared torso or a recurrent branch's embed.

    ``"mlp"``: the tanh MLP of ``hidden_sizes`` with its last layer activated (orthogonal, √2);
    otherwise the convolutional torso.
    """
    if torso != "mlp":
        body = _image_torso(torso, observation_dim)
        return body, body.features
    if not hidden_sizes:
        raise ValueError("the MLP torso needs at least one hidden layer, got hidden_sizes=()")
    body = MLP(
        in_features=observation_dim,
        out_features=hidden_sizes[-1],
        num_cells=list(hidden_sizes[:-1]),
        activation_class=nn.Tanh,
        activate_last_layer=True,
    )
    return orthogonal_init(body, 2**0.5), hidden_sizes[-1]


def _recurrent_branch(
    name: str,
    observation_key: str,
    observation_dim,
    out_features: int,
    hidden_sizes: Sequence[int],
    recurrent: str,
    recurrent_size: int,
    out_key: str | list[str],
    head_gain: float,
    torso: str = "mlp",
    head_extra: nn.Module | None = None,
) -> TensorDictSequential:
    """Observation → MLP (or conv) encoder → LSTM/GRU (its own hidden-state keys) → head.

    ``head_extra`` follows the linear head (the Gaussian scale); ``out_key`` names its outputs.
    """
    embed, width = make_encoder(torso, observation_dim, hidden_sizes)
    encoder = TensorDictModule(embed, [observation_key], [f"{name}_embed"])
    hidden = [f"{name}_recurrent_state_h", f"{name}_recurrent_state_c"]
    if recurrent == "gru":
        hidden = [f"{name}_recurrent_state"]
    memory_cls = {"lstm": LSTMModule, "gru": GRUModule}[recurrent]
    memory = memory_cls(
        input_size=width,
        hidden_size=recurrent_size,
        in_keys=[f"{name}_embed", *hidden],
        out_keys=[f"{name}_memory", *(("next", k) for k in hidden)],
    )
    head_net: nn.Module = orthogonal_init(nn.Linear(recurrent_size, out_features), head_gain)
    if head_extra is not None:
        head_net = nn.Sequential(head_net, head_extra)
    out_keys = [out_key] if isinstance(out_key, str) else list(out_key)
    head = TensorDictModule(head_net, [f"{name}_memory"], out_keys)
    return TensorDictSequential(encoder, memory, head)


def make_actor_critic(
    observation_dim: int | Sequence[int],
    num_actions: int,
    *,
    torso: Torso = "mlp",
    hidden_sizes: Sequence[int] = (64, 64),
    recurrent: Literal["lstm", "gru"] | None = None,
    recurrent_size: int = 64,
    observation_key: str = "observation",
    share_torso: bool = False,
    head_sizes: Sequence[int] = (),
    distribution: Distribution = "categorical",
    init_scale: float = 1.0,
    action_bounds: tuple[float, float] = (-1.0, 1.0),
    value_keys: Sequence[str] = ("state_value",),
) -> tuple[ProbabilisticActor, TensorDictModule]:
    """Build an actor (categorical or diagonal Gaussian) and a state-value critic.

    Torsos: ``"mlp"`` (tanh MLP of ``hidden_sizes``, observations ``[*B, O]``); ``"minatar"``
    (:class:`~ac_extensions.modules.MinAtarCNN`, the MinAtar paper's one 3×3 conv with 16
    channels and 128 units, Young & Tian, 2019, arXiv:1903.03176; observations
    ``[*B, C, 10, 10]``); ``"cnn"`` (:class:`~ac_extensions.modules.NatureCNN`, Mnih et al.,
    2015; ``[*B, C, 84, 84]``). A convolutional torso is followed by a linear head (orthogonal
    init, gain 0.01 for the policy head, 1 for the value). By default actor and critic get
    **separate** torsos (SB3's default for MLP policies), which keeps the critic's gradients off
    the policy's features. ``share_torso=True`` builds **one** torso feeding both heads, as the
    MinAtar paper's AC(λ) and SB3's ``CnnPolicy`` do: each network is then a
    :class:`TorsoHead` ``(torso, head)`` with the same ``torso`` object, its parameters trained
    by the sum of the policy and value losses (inside :func:`shared_features`, as the
    on-policy losses run them, the torso runs once for both heads). With the MLP torso the shared
    part is every hidden layer (``hidden_sizes``) and each head one linear layer.

    Distributions:

    * ``"categorical"``: π(·|x) = softmax(logits(x)) over ``num_actions`` discrete actions.
    * ``"normal"``: a diagonal Gaussian N(loc(x), diag σ²) over a ``num_actions``-dimensional
      action, σ **state-independent** (one learned log σ per dimension, initialised at
      ``init_scale``): the PPO paper's MuJoCo policy (Schulman et al., 2017, arXiv:1707.06347,
      §6.1; SB3's ``log_std_init`` 0 is ``init_scale`` 1). TorchRL's ``IndependentNormal``:
      log π(a|x) sums over the dimensions. Samples are unbounded; the env clips them
      (:func:`~ac_extensions.runtime.envs.make_gym_env`), and the stored action is the sample.
    * ``"tanh_normal"``: the same Gaussian squashed by tanh onto ``action_bounds`` (TorchRL's
      ``TanhNormal``; Haarnoja et al., 2018, arXiv:1801.01290, Appendix C): actions never
      leave the bounds. It has no closed-form entropy; TorchRL's losses estimate it by sampling.

    Args:
        observation_dim: size of the (flat) observation (``"mlp"``), or its shape
            ``(C, H, W)`` (``"minatar"``: H = W = 10; ``"cnn"``: 84).
        num_actions: number of discrete actions A, or the action's dimension d (Gaussians).
        torso: ``"mlp"``, ``"minatar"`` or ``"cnn"``.
        hidden_sizes: MLP widths (the encoder before the memory when recurrent); ignored by
            the convolutional torsos.
        recurrent: ``"lstm"`` or ``"gru"`` for recurrent memories after the torso (its
            output is the memory's input), ``None`` for feed-forward networks.
        recurrent_size: hidden size of the memory.
        observation_key: the observation entry to read.
        share_torso: one torso for both heads (feed-forward networks only).
        head_sizes: hidden widths of each head after a shared torso (tanh MLPs, one per head,
            as SB3's ``net_arch`` after a shared features extractor); ``()``: linear heads.
        distribution: ``"categorical"``, ``"normal"`` or ``"tanh_normal"``.
        init_scale: the Gaussians' initial σ (> 0).
        action_bounds: ``(low, high)`` of ``"tanh_normal"`` (scalars or ``[d]`` tensors).
        value_keys: the critic's value heads, one output each on the same network (two for
            :class:`~ac_extensions.objectives.RNDPPOLoss`: extrinsic and intrinsic values).

    Returns:
        ``(actor, critic)``: the actor writes ``logits`` (``[*B, A]``) or ``loc`` and ``scale``
        (``[*B, d]`` each), ``action`` (an index ``[*B]``, or ``[*B, d]``) and
        ``action_log_prob`` (``[*B]``); the critic writes ``state_value`` (``[*B, 1]``; each
        of ``value_keys``).

    Example:
        >>> from tensordict import TensorDict
        >>> actor, critic = make_actor_critic((4, 10, 10), 3, torso="minatar")
        >>> td = TensorDict({"observation": torch.zeros(5, 7, 4, 10, 10)}, [5, 7])
        >>> actor(td)["logits"].shape, critic(td)["state_value"].shape
        (torch.Size([5, 7, 3]), torch.Size([5, 7, 1]))
        >>> actor, critic = make_actor_critic((4, 10, 10), 3, torso="minatar", share_torso=True)
        >>> actor.module[0].module[0] is critic.module[0]  # nn.Sequential(torso, head) each
        True
        >>> actor, critic = make_actor_critic(3, 2, distribution="normal")
        >>> td = actor(TensorDict({"observation": torch.zeros(5, 3)}, [5]))
        >>> td["action"].shape, td["action_log_prob"].shape, td["scale"][0]
        (torch.Size([5, 2]), torch.Size([5]), tensor([1., 1.], grad_fn=<SelectBackward0>))
    """
    _check_arguments(torso, distribution, init_scale, share_torso, recurrent, head_sizes)
    continuous = distribution != "categorical"
    # A Gaussian's head writes loc, and a learned state-independent log σ adds the scale.
    out_keys = ["loc", "scale"] if continuous else ["logits"]

    def gaussian_scale() -> nn.Module:
        return AddStateIndependentNormalScale(
            num_actions, scale_mapping="exp", init_value=math.log(init_scale)
        )

    def policy_net(net: nn.Module) -> nn.Module:
        return nn.Sequential(net, gaussian_scale()) if continuous else net

    value_keys = list(value_keys)
    heads = len(value_keys)

    def value_operator(net: nn.Module) -> TensorDictModule:
        if heads == 1:
            return ValueOperator(net, in_keys=[observation_key], out_keys=value_keys)
        return ValueOperator(
            nn.Sequential(net, SplitHeads(heads)), in_keys=[observation_key], out_keys=value_keys
        )

    if share_torso:
        body, width = make_encoder(torso, observation_dim, hidden_sizes)
        cache = FeatureCache()
        actor_net = TorsoHead(body, mlp(width, num_actions, head_sizes, head_gain=0.01), cache)
        critic_net = TorsoHead(body, mlp(width, heads, head_sizes, head_gain=1.0), cache)
        actor_body = TensorDictModule(policy_net(actor_net), [observation_key], out_keys)
        critic = value_operator(critic_net)
    elif recurrent is None and torso == "mlp":
        actor_net = mlp(observation_dim, num_actions, hidden_sizes, head_gain=0.01)
        critic_net = mlp(observation_dim, heads, hidden_sizes, head_gain=1.0)
        actor_body = TensorDictModule(policy_net(actor_net), [observation_key], out_keys)
        critic = value_operator(critic_net)
    elif recurrent is None:
        actor_net = _image_net(torso, observation_dim, num_actions, head_gain=0.01)
        critic_net = _image_net(torso, observation_dim, heads, head_gain=1.0)
        actor_body = TensorDictModule(policy_net(actor_net), [observation_key], out_keys)
        critic = value_operator(critic_net)
    else:
        actor_body = _recurrent_branch(
            "actor",
            observation_key,
            observation_dim,
            num_actions,
            hidden_sizes,
            recurrent,
            recurrent_size,
            out_key=out_keys,
            head_gain=0.01,
            torso=torso,
            head_extra=gaussian_scale() if continuous else None,
        )
        critic = _recurrent_branch(
            "critic",
            observation_key,
            observation_dim,
            heads,
            hidden_sizes,
            recurrent,
            recurrent_size,
            out_key=value_keys,
            head_gain=1.0,
            torso=torso,
            head_extra=SplitHeads(heads) if heads > 1 else None,
        )
    actor = ProbabilisticActor(
        actor_body,
        in_keys=out_keys,
        out_keys=["action"],
        return_log_prob=True,
        **_distribution(distribution, action_bounds),
    )
    return actor, critic


class SplitHeads(nn.Module):
    """``[*B, n]`` → n tensors ``[*B, 1]``: one output per value head of a critic."""

    def __init__(self, heads: int) -> None:
        super().__init__()
        self.heads = heads

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Split the last dim into ``heads`` columns."""
        return tuple(x.split(1, dim=-1))


def _check_arguments(torso, distribution, init_scale, share_torso, recurrent, head_sizes) -> None:
    """Refuse :func:`make_actor_critic` arguments that do not fit together."""
    if torso not in ("mlp", "minatar", "cnn"):
        raise ValueError(f"torso must be 'mlp', 'minatar' or 'cnn', got {torso!r}")
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"distribution must be one of {list(DISTRIBUTIONS)}, got {distribution!r}")
    if not (init_scale > 0 and math.isfinite(init_scale)):
        raise ValueError(f"init_scale must be finite and > 0, got {init_scale!r}")
    if share_torso and recurrent is not None:
        raise ValueError(
            f"share_torso=True needs feed-forward networks, got recurrent={recurrent!r} "
            "(the recurrent actor and critic keep separate memories)"
        )
    if head_sizes and not share_torso:
        raise ValueError(f"head_sizes={tuple(head_sizes)!r} needs share_torso=True")


def _distribution(distribution: str, action_bounds) -> dict:
    """``ProbabilisticActor``'s distribution keywords for :func:`make_actor_critic`."""
    if distribution == "normal":
        return {"distribution_class": IndependentNormal}
    if distribution == "tanh_normal":
        low, high = (torch.as_tensor(bound, dtype=torch.float32) for bound in action_bounds)
        return {"distribution_class": TanhNormal, "distribution_kwargs": {"low": low, "high": high}}
    return {"distribution_class": torch.distributions.Categorical}


class FeatureCache:
    """One torso output, reused by the heads that share the torso while :attr:`active`.

    Keyed on the input tensor object, its version counter (an in-place change invalidates it)
    and the grad mode. Only :func:`shared_features` activates it, for the length of one loss
    evaluation, inside which the parameters do not change and no backward pass runs. Under
    ``torch.compile`` it stands aside (its weak references and version keys do not trace):
    the traced graph holds one torso call per head.
    """

    def __init__(self) -> None:
        self.active = False
        self._entry: tuple | None = None

    def features(self, torso: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """``torso(x)``, computed once per input while active (not under ``torch.compile``)."""
        if not self.active or torch.compiler.is_compiling():
            return torso(x)
        key = (x._version, torch.is_grad_enabled())
        entry = self._entry
        if entry is not None and entry[0]() is x and entry[1] == key:
            return entry[2]
        out = torso(x)
        self._entry = (weakref.ref(x), key, out)
        return out

    def clear(self) -> None:
        """Drop the cached output (and with it its autograd graph)."""
        self._entry = None

    def __getstate__(self) -> dict:  # (copied or pickled: no cached tensor travels)
        return {"active": False, "_entry": None}


class TorsoHead(nn.Sequential):
    """``Sequential(torso, head)`` whose torso output the other heads on it can reuse.

    The actor and the critic of ``make_actor_critic(share_torso=True)`` are two of these with
    the same torso and the same :class:`FeatureCache`. Outside :func:`shared_features` each
    runs its torso as a plain ``Sequential`` would; inside, a second head on the same input
    tensor reuses the first one's features (and their graph: the backward pass through the
    torso then runs once, with both heads' gradients summed). Parameters and state-dict keys
    are those of ``nn.Sequential(torso, head)``.

    Args:
        torso: the shared module, input → features.
        head: this network's head, features → output.
        cache: the cache shared with the other heads on ``torso``.
    """

    def __init__(self, torso: nn.Module, head: nn.Module, cache: FeatureCache) -> None:
        super().__init__(torso, head)
        self.feature_cache = cache

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return self[1](self.feature_cache.features(self[0], x))


@contextmanager
def shared_features(*networks: nn.Module | None) -> Iterator[None]:
    """Run the shared torsos in ``networks`` once per input inside the block.

    See :class:`TorsoHead`; the cached features are dropped on leaving the block. The
    on-policy losses wrap each evaluation in it (TorchRL's losses call the actor, then the
    critic, on the same observation tensor) unless they run functionally
    (``functional=True``, TorchRL's default), where the critic's copy of a shared parameter is
    detached and the two heads must not share one graph.
    """
    caches = {
        id(module.feature_cache): module.feature_cache
        for network in networks
        if network is not None
        for module in network.modules()
        if isinstance(module, TorsoHead)
    }
    for cache in caches.values():
        cache.active = True
    try:
        yield
    finally:
        for cache in caches.values():
            cache.active = False
            cache.clear()


def make_qvalue(
    observation_dim: int,
    num_actions: int,
    *,
    hidden_sizes: Sequence[int] = (64, 64),
    observation_key: str = "observation",
) -> TensorDictModule:
    """An action-value network Q(x, ·): observation → MLP → ``action_value`` ([*B, A]).

    Args:
        observation_dim: size of the (flat) observation.
        num_actions: number of discrete actions A.
        hidden_sizes: MLP widths.
        observation_key: the observation entry to read.

    Returns:
        A TensorDictModule writing ``action_value``.
    """
    net = mlp(observation_dim, num_actions, hidden_sizes, head_gain=1.0)
    return TensorDictModule(net, [observation_key], ["action_value"])


class CategoricalSampler(nn.Module):
    """A feed-forward categorical policy in one call: net → logits → action, log π(action).

    What ``ProbabilisticActor(net, Categorical, return_log_prob=True)`` computes, without
    building a distribution object per step (about 0.5 ms less per collection step here).
    Under ``ExplorationType.RANDOM`` (what collectors set) the action is drawn with
    ``torch.multinomial`` on the softmax probabilities, the draw ``Categorical.sample`` makes;
    otherwise (deterministic / mode, or unset, the actor's default) it is the argmax.

    Args:
        net: maps observations ``[*B, O]`` to logits ``[*B, A]``.

    Returns (forward):
        ``(logits [*B, A], action [*B] int64, log_prob [*B])``.
    """

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, observation: torch.Tensor):  # noqa: D102
        logits = self.net(observation)
        log_probs = logits.log_softmax(-1)
        if exploration_type() == ExplorationType.RANDOM:
            probs = logits.softmax(-1).reshape(-1, logits.shape[-1])
            action = torch.multinomial(probs, 1, True).reshape(logits.shape[:-1])
        else:
            action = logits.argmax(-1)
        log_prob = log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        return logits, action, log_prob


def collection_policy(actor: ProbabilisticActor, critic: TensorDictModule) -> nn.Module:
    """The module to collect with: the actor, followed by the critic if it is recurrent.

    A recurrent critic must see every step at collection for its hidden state to be stored;
    a feed-forward critic is left out (nothing to store). A feed-forward categorical actor of
    :func:`make_actor_critic` is replaced by its :class:`CategoricalSampler` (same network and
    parameters, same output keys, less per-step overhead).
    """
    if recurrent_in_keys(critic):
        return TensorDictSequential(actor, critic)
    body, head = actor.module[0], actor.module[-1]
    if (
        len(actor.module) == 2
        and type(body) is TensorDictModule
        and body.out_keys == ["logits"]
        and head.distribution_class is torch.distributions.Categorical
        and not recurrent_in_keys(actor)
    ):
        return TensorDictModule(
            CategoricalSampler(body.module), body.in_keys, ["logits", "action", head.log_prob_key]
        )
    return actor


def recurrent_in_keys(*networks: nn.Module | None) -> list:
    """The hidden-state input keys of every ``LSTMModule`` / ``GRUModule`` in ``networks``.

    Each recurrent module reads ``is_init`` and its hidden states besides its input; these are
    the keys after the input, in order, each once (``None`` networks are skipped).

    Example:
        >>> from ac_extensions.modules import make_actor_critic
        >>> actor, critic = make_actor_critic(4, 2, recurrent="gru")
        >>> recurrent_in_keys(actor, critic)
        ['actor_recurrent_state', 'is_init', 'critic_recurrent_state']
    """
    keys: list = []
    for network in networks:
        if network is None:
            continue
        for module in network.modules():
            if isinstance(module, (LSTMModule, GRUModule)):
                keys.extend(k for k in module.in_keys[1:] if k not in keys)
    return keys


def recurrent_env_transforms(policy: nn.Module) -> Compose:
    """The transforms a recurrent policy needs on its environment: ``InitTracker`` + primers.

    ``InitTracker`` writes ``is_init`` (where the hidden state is reset); the primers, collected
    from every ``LSTMModule`` / ``GRUModule`` inside ``policy``, make the environment carry the
    hidden state from one step to the next, so that the collector stores it (without them
    recurrence is silently lost: pytorch/rl#2327). Append the result to the env with
    ``env.append_transform(...)``.

    Args:
        policy: the actor (or any module containing the recurrent modules).

    Returns:
        A ``Compose`` of ``InitTracker`` and the primers.
    """
    primers = get_primers_from_module(policy)
    if primers is None:
        raise ValueError("the policy has no LSTMModule / GRUModule: it needs no primer")
    # One primer holding every hidden-state spec: an env keeps only one TensorDictPrimer
    # when several are appended (observed with torchrl 0.14.1: the critic's was dropped).
    parts = primers.transforms if isinstance(primers, Compose) else [primers]
    specs = Composite()
    for part in parts:
        specs.update(part.primers)
    return Compose(InitTracker(), TensorDictPrimer(specs, expand_specs=True))
