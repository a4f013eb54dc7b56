"""modules.make_actor_critic: what its shared-torso option builds and refuses."""

import pytest

from ac_extensions.modules import make_actor_critic


def test_builder_refuses_a_recurrent_shared_torso():
    with pytest.raises(ValueError, match="share_torso=True needs feed-forward"):
        make_actor_critic(4, 2, recurrent="lstm", share_torso=True)
    with pytest.raises(ValueError, match="at least one hidden layer"):
        make_actor_critic(4, 2, hidden_sizes=(), share_torso=True)


def test_shared_torso_is_one_set_of_parameters():
    separate = make_actor_critic((4, 10, 10), 3, torso="minatar")
    shared = make_actor_critic((4, 10, 10), 3, torso="minatar", share_torso=True)
    count = lambda nets: len({id(p) for n in nets for p in n.parameters()})  # noqa: E731
    torso = 4  # conv and linear, weight and bias
    assert count(separate) == count(shared) + torso
    actor, critic = shared
    assert actor.module[0].module[0] is critic.module[0]
