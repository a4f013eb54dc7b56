"""Pure-torch math of the actor-critic family: off-policy returns, policy gradients, trust region.

Everything here imports only ``torch``: no ``nn.Module``, no TensorDict, no keys. Tensors are
batch-first ``[*B, T, F]`` with time at dim -2 and a trailing feature dim (``F = 1`` for
per-step scalars, ``A`` for per-action tensors, ``N`` for categorical atoms); see
``docs/guide.md`` § Conventions of the functional layer. For GAE and TD(λ), use TorchRL's
own functionals (``torchrl.objectives.value.functional.generalized_advantage_estimate``,
``td_lambda_return_estimate``), which share this layout.

Index:

- :mod:`.off_policy`: :func:`retrace_targets` and the trace builders (:func:`retrace_trace`,
  :func:`acer_trace`, :func:`continuous_acer_trace`, :func:`tree_backup_trace`,
  :func:`opc_trace`), :func:`importance_ratio`, Reactor's :func:`sequence_priority`.
- :mod:`.policy_gradients`: ACER's :func:`truncated_is_policy_loss`,
  :func:`bias_correction_loss`, :func:`sampled_bias_correction_loss`; Reactor's
  :func:`beta_loo_policy_loss`.
- :mod:`.trust_region`: :func:`trust_region_step`, :func:`trust_region_multiplier`,
  :func:`trust_region_loss`, :func:`categorical_kl_gradient`,
  :func:`scaled_categorical_kl_gradient`, :func:`normal_kl_gradient`.
- :mod:`.distributional`: :func:`categorical_projection`,
  :func:`distributional_retrace_targets`, :func:`total_variation`.
- :mod:`.reactor`: Reactor's critic, :func:`reactor_critic_targets` (the distributional or
  scalar Retrace target from the target network) and :func:`reactor_critic_loss`.
- :mod:`.acer`: discrete ACER on plain tensors, :func:`categorical_q_retrace` (Q^ret from π and
  Q) and :func:`categorical_acer_losses` (critic, Eq. 9 policy gradient, entropy, trust region).
- :mod:`.masks`: ``masked_mean`` (means over the valid steps of padded windows).
- :mod:`.ppo`: :func:`standardize_advantage`; ``ratio_diagnostics`` and
  ``explained_variance`` (the on-policy losses' diagnostics).
"""

from __future__ import annotations

from ac_extensions.functional.acer import categorical_acer_losses, categorical_q_retrace
from ac_extensions.functional.distributional import (
    categorical_projection,
    distributional_retrace_targets,
    total_variation,
)
from ac_extensions.functional.off_policy import (
    acer_trace,
    continuous_acer_trace,
    importance_ratio,
    opc_trace,
    retrace_targets,
    retrace_trace,
    sequence_priority,
    tree_backup_trace,
)
from ac_extensions.functional.policy_gradients import (
    beta_loo_policy_loss,
    bias_correction_loss,
    sampled_bias_correction_loss,
    truncated_is_policy_loss,
)
from ac_extensions.functional.ppo import standardize_advantage
from ac_extensions.functional.reactor import reactor_critic_loss, reactor_critic_targets
from ac_extensions.functional.trust_region import (
    categorical_kl_gradient,
    normal_kl_gradient,
    scaled_categorical_kl_gradient,
    trust_region_loss,
    trust_region_multiplier,
    trust_region_step,
)

__all__ = [
    "acer_trace",
    "beta_loo_policy_loss",
    "bias_correction_loss",
    "categorical_acer_losses",
    "categorical_kl_gradient",
    "categorical_projection",
    "categorical_q_retrace",
    "continuous_acer_trace",
    "distributional_retrace_targets",
    "importance_ratio",
    "normal_kl_gradient",
    "opc_trace",
    "reactor_critic_loss",
    "reactor_critic_targets",
    "retrace_targets",
    "retrace_trace",
    "sampled_bias_correction_loss",
    "scaled_categorical_kl_gradient",
    "sequence_priority",
    "standardize_advantage",
    "total_variation",
    "tree_backup_trace",
    "truncated_is_policy_loss",
    "trust_region_loss",
    "trust_region_multiplier",
    "trust_region_step",
]
