"""A torso shared by actor and critic runs once per loss evaluation, with the same results."""

from __future__ import annotations

import copy
import pickle

import torch
from tensordict import TensorDict
from torchrl.objectives import ClipPPOLoss

from ac_extensions.modules import FeatureCache, TorsoHead, make_actor_critic, shared_features
from ac_extensions.objectives import SequenceA2CLoss, SequencePPOLoss

KW = dict(
    clip_epsilon=0.2, entropy_coeff=0.01, critic_coeff=0.5, loss_critic_type="l2", functional=False
)


def networks():
    torch.manual_seed(0)
    return make_actor_critic((4, 10, 10), 3, torso="minatar", share_torso=True, head_sizes=(8,))


def batch(n=32):
    torch.manual_seed(1)
    return TensorDict(
        {
            "observation": (torch.rand(n, 4, 10, 10) < 0.2).float(),
            "action": torch.randint(3, (n,)),
            "action_log_prob": torch.full((n,), -1.1),
            "advantage": torch.randn(n, 1),
            "value_target": torch.randn(n, 1),
        },
        [n],
    )


def count_torso_calls(actor):
    calls = []
    actor.module[0].module[0].conv.register_forward_hook(lambda *args: calls.append(1))
    return calls


def grads(loss, td):
    out = loss(td)
    total = sum(v for k, v in out.items() if k.startswith("loss_"))
    params = list(loss.parameters())
    return out, torch.autograd.grad(total, params)


def test_the_torso_runs_once_and_losses_and_gradients_equal_torchrls():
    actor, critic = networks()
    ours = SequencePPOLoss(actor, critic, **KW)
    theirs = ClipPPOLoss(*copy.deepcopy((actor, critic)), **KW)  # runs the torso twice
    calls = count_torso_calls(actor)
    out_a, g_a = grads(ours, batch())
    assert len(calls) == 1
    out_b, g_b = grads(theirs, batch())
    for key in ("loss_objective", "loss_critic", "loss_entropy"):
        torch.testing.assert_close(out_a[key], out_b[key])
    for a, b in zip(g_a, g_b, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    a2c = SequenceA2CLoss(actor, critic, functional=False)
    calls.clear()
    a2c(batch())
    assert len(calls) == 1


def test_the_cache_is_active_only_inside_the_block_and_keyed_on_the_input():
    actor, critic = networks()
    calls = count_torso_calls(actor)
    x = batch()["observation"]
    td = TensorDict({"observation": x}, [32])
    actor(td.clone(False)), critic(td.clone(False))
    assert len(calls) == 2  # outside the block: a plain Sequential each
    with shared_features(actor, critic):
        first = critic(td.clone(False))["state_value"]
        critic(td.clone(False))
        assert len(calls) == 3  # same input tensor: reused
        x.mul_(1.0)  # an in-place change bumps its version: recomputed
        critic(td.clone(False))
        assert len(calls) == 4
        critic(TensorDict({"observation": x.clone()}, [32]))  # another tensor: recomputed
        assert len(calls) == 5
        with torch.no_grad():  # another grad mode: recomputed
            critic(td.clone(False))
        assert len(calls) == 6
    cache = actor.module[0].module.feature_cache
    assert not cache.active and cache._entry is None  # dropped on leaving
    assert first.requires_grad


def test_functional_losses_do_not_share_the_graph():
    # functional=True (TorchRL's default) detaches the critic's copy of the shared torso
    actor, critic = networks()
    calls = count_torso_calls(actor)
    SequencePPOLoss(actor, critic)(batch())
    assert len(calls) == 2


def test_copies_and_pickles_carry_no_cached_tensor():
    actor, critic = networks()
    head = actor.module[0].module
    assert isinstance(head, TorsoHead) and head[0] is critic.module[0]
    with shared_features(actor, critic):
        actor(TensorDict({"observation": batch()["observation"]}, [32]))
        clone = copy.deepcopy(actor)
        restored = pickle.loads(pickle.dumps(critic))
    for module in (clone.module[0].module, restored.module):
        assert isinstance(module.feature_cache, FeatureCache)
        assert module.feature_cache._entry is None and not module.feature_cache.active
    # the state dict keys are those of nn.Sequential(torso, head)
    assert "module.0.conv.weight" in critic.state_dict()
