"""The MinAtar torso and its use in the three builders: shapes, keys, gradients, errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tensordict import TensorDict
from torch import nn
from torchrl.modules import set_recurrent_mode

from ac_extensions.modules import (
    MinAtarCNN,
    make_acer_actor,
    make_actor_critic,
    make_reactor_actor,
    reactor_hidden_state_keys,
)

C, A, B, T = 4, 3, 2, 5
SHAPE = (C, 10, 10)


def observations(*batch: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand(*batch, *SHAPE, generator=gen) < 0.2).float()  # binary maps


def assert_every_parameter_gets_a_gradient(module: nn.Module) -> None:
    for name, param in module.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all(), name
        assert param.grad.abs().sum() > 0, name


def test_torso_is_the_papers_network():
    net = MinAtarCNN(C)
    # one 3×3 conv with 16 filters, stride 1, no padding (10 → 8), then 128 units
    assert net.conv.kernel_size == (3, 3) and net.conv.stride == (1, 1)
    assert net.conv.in_channels == C and net.conv.out_channels == 16
    assert net.linear.in_features == 16 * 8 * 8 and net.linear.out_features == 128
    x = observations(B, T)
    out = net(x)
    assert out.shape == (B, T, 128) and (out >= 0).all()  # ReLU features
    # the leading dims are only flattened: the same as one forward per sample
    torch.testing.assert_close(out[1, 3], net(x[1, 3]))
    # bool / uint8 maps give the float result
    torch.testing.assert_close(net(x.bool()), out)
    torch.testing.assert_close(net(x.to(torch.uint8)), out)
    out.sum().backward()
    assert_every_parameter_gets_a_gradient(net)


@pytest.mark.parametrize("shape", [(C, 10), (C + 1, 10, 10), (C, 84, 84), (10, 10, C)])
def test_torso_rejects_other_shapes(shape):
    with pytest.raises(ValueError, match="channels first"):
        MinAtarCNN(C)(torch.zeros(2, *shape))


@pytest.mark.parametrize("recurrent", [None, "lstm", "gru"])
def test_actor_critic_with_the_minatar_torso(recurrent):
    torch.manual_seed(0)
    actor, critic = make_actor_critic(SHAPE, A, torso="minatar", recurrent=recurrent)
    td = TensorDict({"observation": observations(B, T)}, [B, T])
    if recurrent is not None:
        td["is_init"] = torch.zeros(B, T, 1, dtype=torch.bool)
        td["is_init"][:, 0] = True
    with set_recurrent_mode(recurrent is not None):
        out = critic(actor(td))
    assert out["logits"].shape == (B, T, A)
    assert out["action"].shape == (B, T) and out["action"].dtype == torch.int64
    assert out["action_log_prob"].shape == (B, T)
    assert out["state_value"].shape == (B, T, 1)
    # separate torsos: actor and critic share no parameter
    assert not {id(p) for p in actor.parameters()} & {id(p) for p in critic.parameters()}
    assert sum(isinstance(m, MinAtarCNN) for m in actor.modules()) == 1
    assert sum(isinstance(m, MinAtarCNN) for m in critic.modules()) == 1
    log_prob = out["logits"].log_softmax(-1).gather(-1, out["action"].unsqueeze(-1))
    (log_prob.sum() + out["state_value"].square().sum()).backward()
    assert_every_parameter_gets_a_gradient(actor)
    assert_every_parameter_gets_a_gradient(critic)


def test_actor_critic_keeps_the_mlp_default():
    torch.manual_seed(0)
    actor, _ = make_actor_critic(4, 2)
    torch.manual_seed(0)
    again, _ = make_actor_critic(4, 2, torso="mlp")
    assert not any(isinstance(m, MinAtarCNN) for m in actor.modules())
    for p, q in zip(actor.parameters(), again.parameters(), strict=True):
        torch.testing.assert_close(p, q)
    with pytest.raises(ValueError, match="torso must be"):
        make_actor_critic(SHAPE, A, torso="resnet")
    with pytest.raises(ValueError, match=r"\(C, H, W\)"):
        make_actor_critic(400, A, torso="minatar")


def test_acer_actor_with_the_minatar_torso():
    torch.manual_seed(0)
    actor = make_acer_actor(SHAPE, A, torso="minatar")
    out = actor(TensorDict({"observation": observations(B, T)}, [B, T]))
    assert out["logits"].shape == (B, T, A) and out["action_value"].shape == (B, T, A)
    assert out["action"].shape == (B, T)
    assert sum(isinstance(m, MinAtarCNN) for m in actor.modules()) == 1  # one shared torso
    (out["logits"].logsumexp(-1).sum() + out["action_value"].sum()).backward()
    assert_every_parameter_gets_a_gradient(actor)
    with pytest.raises(ValueError, match="needs observation_shape"):
        make_acer_actor(400, A, torso="minatar")


@pytest.mark.parametrize("recurrent", [False, True])
def test_reactor_actor_with_the_minatar_torso(recurrent):
    torch.manual_seed(0)
    atoms, hidden = 7, 16
    actor = make_reactor_actor(
        SHAPE,
        A,
        torso="minatar",
        recurrent_size=hidden,
        num_atoms=atoms,
        recurrent=recurrent,
        previous_action_reward=recurrent,
    )
    gen = torch.Generator().manual_seed(1)
    td = TensorDict({"observation": observations(B, T)}, [B, T])
    if recurrent:
        td["prev_action"] = F.one_hot(torch.randint(A, (B, T), generator=gen), A).float()
        td["prev_reward"] = torch.randn(B, T, 1, generator=gen)
        td["is_init"] = torch.zeros(B, T, 1, dtype=torch.bool)
        td["is_init"][:, 0] = True
        for key in reactor_hidden_state_keys("policy") + reactor_hidden_state_keys("critic"):
            td[key] = torch.zeros(B, T, 1, hidden)
    with set_recurrent_mode(recurrent):
        out = actor(td)
    assert out["logits"].shape == (B, T, A)
    assert out["action_value_logits"].shape == (B, T, A, atoms)
    assert out["action"].shape == (B, T) and out["action_log_prob"].shape == (B, T)
    assert sum(isinstance(m, MinAtarCNN) for m in actor.modules()) == 1
    (out["logits"].logsumexp(-1).sum() + out["action_value_logits"].square().sum()).backward()
    assert_every_parameter_gets_a_gradient(actor)
    with pytest.raises(ValueError, match=r"\(C, 10, 10\)"):
        make_reactor_actor(400, A, torso="minatar")


def test_actor_critic_with_the_nature_cnn_for_atari_frames():
    from ac_extensions.modules import NatureCNN

    torch.manual_seed(0)
    actor, critic = make_actor_critic((4, 84, 84), 6, torso="cnn")
    frames = torch.randint(0, 256, (2, 3, 4, 84, 84), dtype=torch.uint8)
    out = critic(actor(TensorDict({"observation": frames}, [2, 3])))
    assert out["logits"].shape == (2, 3, 6) and out["state_value"].shape == (2, 3, 1)
    assert any(isinstance(m, NatureCNN) for m in actor.modules())
    assert any(isinstance(m, NatureCNN) for m in critic.modules())
