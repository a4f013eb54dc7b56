"""What TorchRL's on-policy losses lack for ``[B, T]`` batches, as a mixin.

TorchRL's ``A2CLoss`` / ``ClipPPOLoss`` compute the right losses on any batch shape and mask
padded steps in their ``loss_*`` terms, but (torchrl 0.14):
diagnostics come out as per-time-step vectors on ``[B, T]`` input (``ESS``,
``explained_variance``) or ignore the padding mask (``entropy``, ``clip_fraction``,
``kl_approx``); advantage standardisation ignores ``("collector", "mask")``; a missing
``advantage`` silently builds a default GAE (pytorch/rl#2462); a log-prob with a trailing
singleton dim broadcasts ``[B, T] × [B, T, 1]`` into ``[B, T, T]`` without complaint; and
bad input (missing keys, NaN rewards, a recurrent policy without its primer) fails late with
unhelpful messages. This mixin fixes exactly those and leaves the loss math to TorchRL.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from torch import Tensor, nn

from ac_extensions.functional.ppo import explained_variance, ratio_diagnostics
from ac_extensions.modules import recurrent_in_keys


def valid_mask(loss, tensordict: TensorDictBase) -> Tensor | None:
    """The conjunction of the loss-mask entries present in the input, shape [*batch].

    The entries are those TorchRL's ``_reduce_loss`` honours (``loss._loss_mask_keys()``:
    ``("collector", "mask")`` and ``"shifted_valid"`` by default); ``None`` if there are none.
    """
    mask = None
    for key in loss._loss_mask_keys():
        value = tensordict.get(key, None)
        if value is None:
            continue
        value = value.reshape(tensordict.batch_size)
        mask = value if mask is None else mask & value
    return mask


def _as_tuple(key) -> tuple:
    return (key,) if isinstance(key, str) else tuple(key)


def _is_multi(key) -> bool:
    """Whether a tensor key names several entries (a list, as TorchRL's multi-head keys)."""
    return isinstance(key, list)


def _key_list(key) -> list:
    return list(key) if _is_multi(key) else [key]


class SequenceLossMixin:
    """Validation, masked scalar diagnostics and add-ons for TorchRL on-policy losses.

    Subclasses call :meth:`_init_sequence` in ``__init__`` and wrap TorchRL's ``forward`` as
    ``self._finish(td, super().forward(self._validate(td)))``; hooks defined by the subclass
    store per-step tensors in ``self._capture`` while TorchRL's forward runs.
    """

    _capture: dict
    _needs_behavior_log_prob: bool = True
    check_inputs: bool = True
    """Validate every input in ``forward``. A training loop that validated a whole batch once
    with :meth:`validate` may turn this off for the minibatches cut from it."""
    diagnostics: bool = True
    """Compute the scalar diagnostics in ``forward``. When off, the output holds only the
    ``loss_*`` terms (add-ons included): a training loop may log diagnostics on some of its
    minibatches only (about 0.2 ms saved per call for a 2×64 MLP)."""

    def _init_sequence(self, addons) -> None:
        addons = list(addons or ())
        for addon in addons:
            if not callable(addon):
                raise TypeError(
                    f"add-ons must be callables (tensordict, dist) -> dict, got {addon!r}"
                )
        # Modules are registered (they move with .to() and appear in state_dict).
        self.addons = nn.ModuleList([a for a in addons if isinstance(a, nn.Module)])
        self._callable_addons = [a for a in addons if not isinstance(a, nn.Module)]
        self._recurrent_keys = recurrent_in_keys(self.actor_network, self.critic_network)
        self._capture = {}

    # ------------------------------------------------------------------ validation
    def _require(self, tensordict: TensorDictBase, key, why: str) -> Tensor:
        value = tensordict.get(key, None)
        if value is None:
            present = sorted(str(k) for k in tensordict.keys(True, True))
            raise KeyError(
                f"{type(self).__name__}: the input TensorDict (batch_size "
                f"{list(tensordict.batch_size)}) has no key {key!r} ({why}). Keys present: "
                f"{present}"
            )
        return value

    def validate(self, tensordict: TensorDictBase) -> None:
        """Check ``tensordict`` (keys, shapes, finite values, recurrent state) or raise."""
        self._validate(tensordict, force=True)

    def _validate(self, tensordict: TensorDictBase, force: bool = False) -> TensorDictBase:
        self._capture = {}
        if not (self.check_inputs or force):
            return tensordict
        name = type(self).__name__
        batch = tensordict.batch_size
        if len(batch) == 0:
            raise ValueError(f"{name}: the input TensorDict needs a batch dim ([N] or [B, T])")
        keys = self.tensor_keys
        computed = [_as_tuple(k) for k in self.actor_network.out_keys]
        for key in self.actor_network.in_keys:
            # (an input the actor writes below itself, e.g. ("params", "head", "loc") under
            # "params", is its own business)
            inside = any(out[: len(_as_tuple(key))] == _as_tuple(key) for out in computed)
            if key not in self._recurrent_keys and not inside:
                self._require(tensordict, key, "an input of the actor")
        for key in self._recurrent_keys:
            if tensordict.get(key, None) is None:
                raise KeyError(
                    f"{name}: the policy is recurrent but the input has no {key!r}: the "
                    f"environment lacks the recurrent primer / InitTracker, so the hidden "
                    f"state was never stored at collection. Build the env with "
                    f"ac_extensions.modules.recurrent_env_transforms(policy) (batch_size "
                    f"{list(batch)})"
                )
        for key in _key_list(keys.action):  # several keys: a multi-head action
            self._require(tensordict, key, "the action taken at collection")
        value_shape = self._validate_values(tensordict)
        for key in _key_list(keys.sample_log_prob):
            log_prob = tensordict.get(key, None)
            if log_prob is None and self._needs_behavior_log_prob:
                self._require(
                    tensordict,
                    key,
                    "log µ(a|x) stored at collection: build the actor with return_log_prob=True",
                )
            # One log-prob per advantage: [*B] for a [*B, 1] advantage, [*B, n] for a
            # per-agent or per-token [*B, n, 1] one (what TorchRL's losses pair them with).
            expected = value_shape[:-1]
            if isinstance(log_prob, Tensor) and not _is_multi(keys.sample_log_prob):
                if log_prob.shape != expected:
                    raise ValueError(
                        f"{name}: {key!r} must have shape {list(expected)} (one per "
                        f"advantage; TorchRL stores log-probs without a trailing dim), got "
                        f"{list(log_prob.shape)}; a mismatch would broadcast silently"
                    )
        return tensordict

    def _validate_values(self, tensordict: TensorDictBase) -> torch.Size:
        """Check advantage, value target and reward; return the advantage's shape.

        That shape is ``[*B, 1]``, or ``[*B, *E, 1]`` with extra dims (per agent, per token)
        that every value entry then shares.
        """
        name, batch, keys = type(self).__name__, tensordict.batch_size, self.tensor_keys
        advantage = tensordict.get(keys.advantage, None)
        if advantage is None and getattr(self, "_value_estimator", None) is None:
            raise KeyError(
                f"{name}: no {keys.advantage!r} in the input and no value estimator was set: "
                f"compute advantages first (TorchRL's GAE, once per batch with the pre-update "
                f"critic) or call loss.make_value_estimator(...) explicitly"
            )
        expected = torch.Size((*batch, 1))
        if isinstance(advantage, Tensor):
            if advantage.shape == batch and batch[-1] != 1:
                raise ValueError(
                    f"{name}: {keys.advantage!r} has shape {list(advantage.shape)}, the batch "
                    f"shape without the trailing dim: against the [*B, 1] log-weight it would "
                    f"broadcast to an outer product. Give it shape {list(expected)}"
                )
            if advantage.shape[: len(batch)] == batch and advantage.shape[-1:] == (1,):
                expected = advantage.shape
        required = self._required_value_keys()
        for key in (keys.advantage, keys.value_target, ("next", keys.reward), *required):
            value = tensordict.get(key, None)
            if key in required:
                value = self._require(tensordict, key, "a value entry this loss reads")
            if value is None or not isinstance(value, Tensor):
                continue
            if tuple(value.shape) != tuple(expected):
                raise ValueError(
                    f"{name}: {key!r} must have shape {list(expected)}, got {list(value.shape)}"
                )
            bad = ~torch.isfinite(value)
            if bool(bad.any()):
                raise ValueError(
                    f"{name}: {key!r} (shape {list(value.shape)}) has {int(bad.sum())} "
                    f"non-finite entries"
                )
        return expected

    def _required_value_keys(self) -> tuple:
        """Further entries shaped like the advantage that must be present (none here)."""
        return ()

    # ------------------------------------------------------------------ diagnostics
    def _valid_mask(self, tensordict: TensorDictBase) -> Tensor | None:
        return valid_mask(self, tensordict)

    @staticmethod
    def _flat_valid(x: Tensor, batch: torch.Size, mask: Tensor | None) -> Tensor:
        """The entries of the valid steps, flat (extra dims, e.g. per agent, kept per step)."""
        x = x.detach().reshape(*batch, -1)
        return (x[mask] if mask is not None else x).reshape(-1)

    def _standardize_advantage(self, advantage: Tensor, tensordict: TensorDictBase) -> Tensor:
        """Standardise with statistics over the valid (unpadded) steps only.

        Uses the same statistics as TorchRL's unmasked path (mean, unbiased std, clamped at
        float32 resolution), so a padded batch and its valid steps alone give the same result
        (TorchRL's own masked path, for ``shifted_valid``, uses the biased std instead).
        """
        mask = self._valid_mask(tensordict)
        if mask is None:
            return super()._standardize_advantage(advantage, tensordict)
        steps = advantage.shape[:-1]  # [*B], or [*B, *E] with per-agent / per-token dims
        extra = len(steps) - mask.dim()
        valid = advantage[mask.reshape(*mask.shape, *([1] * extra)).expand(steps)]
        scale = valid.std().clamp_min(torch.finfo(torch.float).resolution)
        return (advantage - valid.mean()) / scale

    def _finish(self, tensordict: TensorDictBase, out: TensorDictBase) -> TensorDictBase:
        batch = tensordict.batch_size
        mask = self._valid_mask(tensordict)
        cap, self._capture = self._capture, {}
        if self.diagnostics:
            self._set_diagnostics(out, cap, batch, mask)
        else:
            for key in [k for k in out.keys() if not k.startswith("loss_")]:
                del out[key]
        for addon in (*self.addons, *self._callable_addons):
            for key, value in addon(tensordict, cap.get("dist")).items():
                if value.shape == batch:
                    value = value.unsqueeze(-1)
                if key.startswith("loss_"):
                    out.set(key, self._reduce_loss(value, tensordict).squeeze(-1))
                elif self.diagnostics:
                    out.set(key, self._flat_valid(value, batch, mask).mean())
        return out

    def _set_diagnostics(self, out: TensorDictBase, cap: dict, batch, mask) -> None:
        """Replace TorchRL's diagnostics by scalars over the valid steps (see the module doc)."""
        # Composite values (a TensorDict per head) keep TorchRL's own diagnostics.
        cap = {k: v for k, v in cap.items() if k == "dist" or isinstance(v, Tensor)}
        if "entropy" in cap and "entropy" in out:
            out.set("entropy", self._flat_valid(cap["entropy"], batch, mask).mean())
        if "kl_approx" in cap:
            out.set("kl_approx", self._flat_valid(cap["kl_approx"], batch, mask).mean())
        if "log_weight" in cap:  # PPO: the ratio the clip acts on, π_θ / π_prox
            log_weight = self._flat_valid(cap["log_weight"], batch, mask)
            low, high = self._clip_bounds  # 0-d tensors: no host sync, none under compile
            outside = (log_weight < low) | (log_weight > high)
            out.set("clip_fraction", outside.to(log_weight.dtype).mean())
        if "log_behavior_weight" in cap:  # the ratio to the behavior policy, π_θ / µ
            log_ratio = self._flat_valid(cap["log_behavior_weight"], batch, mask)
            for key, value in ratio_diagnostics(log_ratio).items():
                out.set(key, value)
        explained = getattr(self, "log_explained_variance", True)  # (PPO's flag; A2C: on)
        if explained and "value_target" in cap and "state_value" in cap:
            target = self._flat_valid(cap["value_target"], batch, mask)
            pred = self._flat_valid(cap["state_value"], batch, mask)
            out.set("explained_variance", explained_variance(target, pred))
        dist = cap.get("dist")
        if "entropy" not in out.keys() and dist is not None:
            # TorchRL drops the entropy when entropy_coeff == 0; keep it as a diagnostic.
            with torch.no_grad():
                try:
                    entropy = dist.entropy()
                except NotImplementedError:  # e.g. TanhNormal: a Monte-Carlo estimate
                    samples = dist.sample((self.samples_mc_entropy,))
                    entropy = -dist.log_prob(samples).mean(0)
            if isinstance(entropy, Tensor) and entropy.numel() == batch.numel():
                out.set("entropy", self._flat_valid(entropy, batch, mask).mean())
