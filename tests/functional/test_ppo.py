"""functional.categorical_ppo_losses against SequencePPOLoss / ClipPPOLoss and by hand."""

from __future__ import annotations

import math

import pytest
import torch

from ac_extensions.functional import (
    categorical_ppo_backward,
    categorical_ppo_losses,
    standardize_advantage,
)
from ac_extensions.modules import make_actor_critic
from ac_extensions.objectives import SequencePPOLoss
from tests._helpers import on_policy_batch

OBS, ACT, N = 4, 3, 64


@pytest.mark.parametrize(
    "settings",
    [
        dict(normalize_advantage=True),
        dict(normalize_advantage=False, entropy_coeff=0.0),
        dict(normalize_advantage=True, clip_value=0.3),
        dict(normalize_advantage=True, clip_epsilon=0.0),
    ],
    ids=["normalized", "raw-no-entropy", "value-clip", "eps-0"],
)
def test_equals_the_loss_module_on_a_flat_batch(settings):
    torch.manual_seed(0)
    actor, critic = make_actor_critic(OBS, ACT, hidden_sizes=(16,))
    kw = dict(clip_epsilon=0.2, entropy_coeff=0.01, critic_coeff=0.5) | settings
    # fast_path=False: TorchRL's ClipPPOLoss math (the fast path is this function itself).
    module = SequencePPOLoss(
        actor, critic, loss_critic_type="l2", functional=False, fast_path=False, **kw
    )
    # Behaviour log-probs perturbed by 0.3: ratios spread on both sides of the clip range.
    td = on_policy_batch((N,), networks=(actor, critic), log_prob_noise=0.3, observation_size=OBS)
    expected = module(td.clone())
    params = list(module.parameters())
    total = sum(v for k, v in expected.items() if k.startswith("loss_"))
    expected_grads = torch.autograd.grad(total, params)

    actor_net, critic_net = actor.module[0].module, critic.module
    obs = td["observation"]
    got = categorical_ppo_losses(
        actor_net(obs),
        critic_net(obs).squeeze(-1),
        td["action"],
        td["action_log_prob"],
        td["advantage"].squeeze(-1),
        td["value_target"].squeeze(-1),
        old_value=td["state_value"].squeeze(-1),
        diagnostics=True,
        **kw,
    )
    names = [
        "loss_objective",
        "loss_critic",
        "loss_entropy",
        "entropy",
        "kl_approx",
        "clip_fraction",
        "ESS",
        "mean_ratio",
        "max_ratio",
        "explained_variance",
    ] + (["value_clip_fraction"] if "clip_value" in settings else [])
    for name in names:
        torch.testing.assert_close(got[name], expected[name].reshape(()), msg=name)
    # The batch must exercise the clip, or the test could not tell clipped from unclipped.
    assert 0 < got["clip_fraction"] < 1 or kw["clip_epsilon"] == 0
    total = got["loss_objective"] + got["loss_critic"] + got["loss_entropy"]
    for a, b in zip(torch.autograd.grad(total, params), expected_grads, strict=True):
        torch.testing.assert_close(a, b)


def test_hand_case_clipped_and_unclipped_steps():
    # Uniform π over 2 actions (π(a) = 0.5). Step 0: µ = 0.25 → r = 2, A = +1: the clip binds,
    # gain = 1.2. Step 1: µ = 0.25 → r = 2, A = −1: min(−2, −1.2) = −2, unclipped.
    # Step 2: µ = 0.5 → r = 1, A = 3: gain 3. loss = −(1.2 − 2 + 3)/3.
    logits = torch.zeros(3, 2, requires_grad=True)
    out = categorical_ppo_losses(
        logits,
        torch.tensor([0.0, 2.0, 1.0]),
        torch.tensor([0, 1, 0]),
        torch.log(torch.tensor([0.25, 0.25, 0.5])),
        torch.tensor([1.0, -1.0, 3.0]),
        torch.tensor([1.0, 0.0, 1.0]),
        clip_epsilon=0.2,
        entropy_coeff=0.5,
        critic_coeff=2.0,
        normalize_advantage=False,
        diagnostics=True,
    )
    assert out["loss_objective"].item() == pytest.approx(-(1.2 - 2 + 3) / 3)
    assert out["loss_critic"].item() == pytest.approx(2.0 * (1 + 4 + 0) / 3)
    assert out["loss_entropy"].item() == pytest.approx(-0.5 * math.log(2))
    assert out["clip_fraction"].item() == pytest.approx(2 / 3)
    assert out["kl_approx"].item() == pytest.approx(-2 * math.log(2) / 3)
    # Only the unclipped steps carry gradient: d/dlogit of −r·A/3 at step 1 and step 2.
    out["loss_objective"].backward()
    assert logits.grad[0].abs().sum() == 0


def test_standardize_advantage_matches_mean_and_unbiased_std():
    x = torch.tensor([1.0, 2.0, 4.0, 9.0])
    torch.testing.assert_close(standardize_advantage(x), (x - 4.0) / x.std())
    assert torch.all(standardize_advantage(torch.ones(5)) == 0)


@pytest.mark.parametrize(
    "name, shape", [("action", (3, 1)), ("behavior_log_prob", (4,)), ("advantage", (3, 1))]
)
def test_bad_shapes_name_the_argument(name, shape):
    args = dict(
        logits=torch.zeros(3, 2),
        value=torch.zeros(3),
        action=torch.zeros(3, dtype=torch.long),
        behavior_log_prob=torch.zeros(3),
        advantage=torch.zeros(3),
        value_target=torch.zeros(3),
    )
    args[name] = torch.zeros(shape)
    with pytest.raises(ValueError, match=rf"{name} must have shape \[N\] = \[3\].*{list(shape)}"):
        categorical_ppo_losses(**args, clip_epsilon=0.2)


def test_value_clipping_needs_old_values():
    with pytest.raises(ValueError, match="old_value"):
        categorical_ppo_losses(
            torch.zeros(2, 2),
            torch.zeros(2),
            torch.zeros(2, dtype=torch.long),
            torch.zeros(2),
            torch.zeros(2),
            torch.zeros(2),
            clip_epsilon=0.2,
            clip_value=0.1,
        )


def _autograd_reference(logits, value, *args, **kw):
    """categorical_ppo_losses and autograd's gradient of their sum w.r.t. logits and value."""
    logits = logits.detach().requires_grad_()
    value = value.detach().requires_grad_()
    out = categorical_ppo_losses(logits, value, *args, **kw)
    total = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
    grad_logits, grad_value = torch.autograd.grad(total, (logits, value))
    return out, grad_logits, grad_value


@pytest.mark.parametrize(
    "settings",
    [
        dict(),
        dict(normalize_advantage=False, entropy_coeff=0.0),
        dict(clip_value=0.3),
        dict(clip_epsilon=0.0),
        dict(clip_epsilon=1.5, entropy_coeff=0.3, critic_coeff=2.0),
    ],
    ids=["default", "raw-no-entropy", "value-clip", "eps-0", "eps-1.5"],
)
def test_backward_equals_autograd(settings):
    # Differential: the hand-derived gradient against autograd through categorical_ppo_losses,
    # on ratios spread on both sides of the clip range and values on both sides of the value
    # clip; losses and every diagnostic must match too.
    torch.manual_seed(1)
    n, a = 200, 5
    kw = dict(clip_epsilon=0.2, entropy_coeff=0.05, critic_coeff=0.5, diagnostics=True)
    kw |= settings
    logits = torch.randn(n, a)
    value = torch.randn(n)
    action = torch.randint(0, a, (n,))
    behavior = logits.log_softmax(-1).gather(-1, action[:, None]).squeeze(-1)
    behavior = behavior + 0.4 * torch.randn(n)
    args = (action, behavior, torch.randn(n), torch.randn(n))
    kw["old_value"] = value + 0.5 * torch.randn(n)
    expected, exp_logits, exp_value = _autograd_reference(logits, value, *args, **kw)
    out, grad_logits, grad_value = categorical_ppo_backward(logits, value, *args, **kw)
    assert set(out) == set(expected)
    for name in expected:
        torch.testing.assert_close(out[name], expected[name].detach(), msg=name)
    torch.testing.assert_close(grad_logits, exp_logits)
    torch.testing.assert_close(grad_value, exp_value)
    assert not grad_logits.requires_grad and not out["loss_objective"].requires_grad
    # The batch exercised both clips (or the test could not tell their branches apart).
    if kw["clip_epsilon"] == 0.2:
        assert 0.1 < out["clip_fraction"] < 0.9
    if "clip_value" in settings:
        assert 0.1 < out["value_clip_fraction"] < 0.9


@pytest.mark.parametrize("bound", ["high", "low"])
def test_backward_ties_and_boundaries_split_as_torch_does(bound):
    # Hand-built edge cases (gradients equal to autograd's up to float rounding):
    # step 0: log r exactly on a clip bound (ε chosen so that the float32 bound equals the
    #   step's log r); the clamp passes the gradient on the closed range, so the step keeps
    #   its whole gradient (a strict inequality would halve it);
    # step 1: log r = 1, far outside, with Â = 0: min's two terms tie;
    # steps 2, 3: value steps exactly at ±c_v with tied squared errors; step 4: a value step
    #   beyond c_v whose plain error wins; step 5: a tie inside the value range.
    c = 0.5
    logits = torch.zeros(6, 2)
    log_pi = logits.log_softmax(-1)[0, 0]
    offset = 0.2 if bound == "high" else -0.25
    behavior = torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0, 0.0]).neg() + log_pi
    behavior[0] = log_pi - offset
    on_bound = float(log_pi - behavior[0])  # float32 log r of step 0
    eps = math.expm1(on_bound) if bound == "high" else -math.expm1(on_bound)
    assert float(torch.tensor(math.log1p(eps if bound == "high" else -eps))) == on_bound
    advantage = torch.tensor([1.5, 0.0, 1.0, -2.0, 3.0, -3.0])
    old_value = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 1.0])
    value = torch.tensor([0.0, 0.0, 0.5, -0.5, 2.0, 1.25])
    target = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.125])
    kw = dict(
        clip_epsilon=eps,
        clip_value=c,
        old_value=old_value,
        normalize_advantage=False,
        entropy_coeff=0.1,
    )
    args = (torch.tensor([0, 1, 0, 1, 0, 1]), behavior, advantage, target)
    expected, exp_logits, exp_value = _autograd_reference(logits, value, *args, **kw)
    out, grad_logits, grad_value = categorical_ppo_backward(logits, value, *args, **kw)
    torch.testing.assert_close(grad_logits, exp_logits)
    torch.testing.assert_close(grad_value, exp_value)
    torch.testing.assert_close(out["loss_objective"], expected["loss_objective"].detach())
    assert grad_logits[0].abs().sum() > 0.1  # the on-bound step kept its gradient


def test_backward_checks_its_input_like_the_losses():
    with pytest.raises(ValueError, match=r"advantage must have shape \[N\] = \[3\]"):
        categorical_ppo_backward(
            torch.zeros(3, 2),
            torch.zeros(3),
            torch.zeros(3, dtype=torch.long),
            torch.zeros(3),
            torch.zeros(3, 1),
            torch.zeros(3),
            clip_epsilon=0.2,
        )
