"""Networks and TensorDict wrappers (torch, tensordict.nn, torchrl.modules). No loss math."""

from __future__ import annotations

from ac_extensions.modules.acer import NatureCNN, make_acer_actor
from ac_extensions.modules.actor_critic import (
    CategoricalSampler,
    FeatureCache,
    TorsoHead,
    collection_policy,
    make_actor_critic,
    make_qvalue,
    recurrent_env_transforms,
    recurrent_in_keys,
    shared_features,
)
from ac_extensions.modules.dueling import (
    FixedNormalScale,
    StochasticDuelingNetwork,
    make_continuous_actor_critic,
)
from ac_extensions.modules.minatar import MinAtarCNN
from ac_extensions.modules.normalization import (
    NORMALIZED_OBSERVATION,
    ObservationNormalizer,
    RewardNormalizer,
)
from ac_extensions.modules.reactor import (
    PreviousActionReward,
    make_reactor_actor,
    reactor_env_transforms,
    reactor_hidden_state_keys,
)
from ac_extensions.modules.rnd import RandomNetworkDistillation, rnd_networks

__all__ = [
    "NORMALIZED_OBSERVATION",
    "CategoricalSampler",
    "FeatureCache",
    "FixedNormalScale",
    "MinAtarCNN",
    "NatureCNN",
    "ObservationNormalizer",
    "PreviousActionReward",
    "RandomNetworkDistillation",
    "RewardNormalizer",
    "StochasticDuelingNetwork",
    "TorsoHead",
    "collection_policy",
    "make_acer_actor",
    "make_actor_critic",
    "make_continuous_actor_critic",
    "make_qvalue",
    "make_reactor_actor",
    "reactor_env_transforms",
    "reactor_hidden_state_keys",
    "recurrent_env_transforms",
    "recurrent_in_keys",
    "rnd_networks",
    "shared_features",
]
