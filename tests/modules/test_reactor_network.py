"""Reactor's network: shapes, the previous action/reward transform, stored-state replay."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tensordict import TensorDict
from torchrl.collectors import Collector
from torchrl.envs import InitTracker, TensorDictPrimer
from torchrl.envs.utils import check_env_specs
from torchrl.modules import LSTMModule, set_recurrent_mode

from ac_extensions.modules import (
    PreviousActionReward,
    make_reactor_actor,
    reactor_env_transforms,
    reactor_hidden_state_keys,
)
from ac_extensions.runtime.envs import make_batched_env

OBS, ACT, ATOMS, HID = 4, 2, 5, 8
STATE_KEYS = reactor_hidden_state_keys("policy") + reactor_hidden_state_keys("critic")
OUTPUTS = ["logits", "action_value_logits", "action", "action_log_prob"]


def small_actor(**kwargs):
    torch.manual_seed(0)
    kwargs = {"hidden_sizes": (16,), "recurrent_size": HID, "num_atoms": ATOMS, **kwargs}
    return make_reactor_actor(OBS, ACT, **kwargs)


def inputs(shape, *, obs_shape=(OBS,), seed=0):
    gen = torch.Generator().manual_seed(seed)
    td = TensorDict(
        {
            "observation": torch.randn(*shape, *obs_shape, generator=gen),
            "prev_action": F.one_hot(torch.randint(ACT, shape, generator=gen), ACT).float(),
            "prev_reward": torch.randn(*shape, 1, generator=gen),
            "is_init": torch.zeros(*shape, 1, dtype=torch.bool),
        },
        shape,
    )
    td["is_init"][..., 0, :] = True
    for key in STATE_KEYS:
        td[key] = torch.randn(*shape, 1, HID, generator=gen)
    return td


def reactor_env(actor, num_envs=3, seed=0):
    env = make_batched_env(
        "CartPole-v1", num_envs, extra_transforms=[reactor_env_transforms(actor)]
    )
    env.set_seed(seed)
    return env


@pytest.mark.parametrize("distributional", [True, False])
def test_output_shapes_for_steps_and_sequences(distributional):
    actor = small_actor(distributional=distributional)
    q_key, q_shape = ("action_value_logits", (ACT, ATOMS))
    if not distributional:
        q_key, q_shape = ("action_value", (ACT,))
    assert set(actor.in_keys) == {
        "observation",
        "prev_action",
        "prev_reward",
        "is_init",
        *STATE_KEYS,
    }

    step = actor(inputs((3,)))  # [B]
    assert step["logits"].shape == (3, ACT)
    assert step[q_key].shape == (3, *q_shape)
    assert step["action"].shape == step["action_log_prob"].shape == (3,)
    for key in STATE_KEYS:
        assert step["next", key].shape == (3, 1, HID)
    other = "action_value" if distributional else "action_value_logits"
    assert other not in step.keys()

    with set_recurrent_mode(True):
        seq = actor(inputs((3, 6)))  # [B, T]
    assert seq["logits"].shape == (3, 6, ACT)
    assert seq[q_key].shape == (3, 6, *q_shape)
    assert seq["action"].shape == seq["action_log_prob"].shape == (3, 6)
    for key in STATE_KEYS:
        assert seq["next", key].shape == (3, 6, 1, HID)


def test_cnn_torso_on_frames():
    torch.manual_seed(0)
    actor = make_reactor_actor((4, 84, 84), 6, torso="cnn", recurrent_size=HID, num_atoms=ATOMS)
    gen = torch.Generator().manual_seed(0)
    for shape in [(2,), (2, 3)]:
        td = TensorDict(
            {
                "observation": torch.randint(0, 256, (*shape, 4, 84, 84), dtype=torch.uint8),
                "prev_action": F.one_hot(torch.randint(6, shape, generator=gen), 6).float(),
                "prev_reward": torch.zeros(*shape, 1),
                "is_init": torch.ones(*shape, 1, dtype=torch.bool),
            },
            shape,
        )
        with set_recurrent_mode(len(shape) == 2):
            out = actor(td)
        assert out["logits"].shape == (*shape, 6)
        assert out["action_value_logits"].shape == (*shape, 6, ATOMS)
        assert out["action"].shape == shape
    with pytest.raises(ValueError, match="84, 84"):
        make_reactor_actor(4, 6, torso="cnn")


@pytest.mark.parametrize("policy_torso_gradient", [False, True])
def test_policy_and_critic_have_their_own_lstm_and_share_the_torso(policy_torso_gradient):
    actor = small_actor(policy_torso_gradient=policy_torso_gradient)
    lstms = [m for m in actor.modules() if isinstance(m, LSTMModule)]
    assert len(lstms) == 2 and lstms[0].lstm is not lstms[1].lstm
    assert lstms[0].in_keys[1:3] == reactor_hidden_state_keys("policy")
    assert lstms[1].in_keys[1:3] == reactor_hidden_state_keys("critic")
    out = actor(inputs((3,)))
    torso = list(actor.module[0].module[0].module.parameters())
    policy_lstm, critic_lstm = (list(m.lstm.parameters()) for m in lstms)
    grads = torch.autograd.grad(
        out["logits"].sum() + out["logits"][..., 0].sum(),
        torso + policy_lstm + critic_lstm,
        allow_unused=True,
        retain_graph=True,
    )
    n = len(torso)
    if policy_torso_gradient:  # both branches train the torso
        assert all(g is not None and g.abs().sum() > 0 for g in grads[:n])
    else:  # Reactor (§3.4.1): the policy's gradient stops before the shared torso
        assert all(g is None for g in grads[:n])
    assert all(g is not None and g.abs().sum() > 0 for g in grads[n : n + len(policy_lstm)])
    assert all(g is None for g in grads[n + len(policy_lstm) :])  # logits ignore critic LSTM
    q_grads = torch.autograd.grad(
        out["action_value_logits"].sum(), torso + policy_lstm, allow_unused=True
    )
    assert all(g is not None and g.abs().sum() > 0 for g in q_grads[:n])  # the critic trains it
    assert all(g is None for g in q_grads[n:])


@pytest.mark.parametrize("epsilon", [0.0, 0.01, 0.3])
def test_policy_is_the_softmax_mixed_with_uniform(epsilon):
    actor = small_actor(policy_epsilon=epsilon, recurrent=False)
    head = actor.module[0].module[-1].module  # the heads
    td = inputs((7,)).exclude(*STATE_KEYS, "is_init")
    out = actor(td.clone())
    raw = head.policy(out["policy_memory"])  # l, before the mixture
    expected = (1 - epsilon) * raw.softmax(-1) + epsilon / ACT  # π = (1 − ε) softmax(l) + ε/A
    log_pi = out["logits"].log_softmax(-1)
    torch.testing.assert_close(log_pi.exp(), expected)
    if epsilon > 0:  # written as normalised log-probabilities
        torch.testing.assert_close(log_pi, out["logits"])
    assert bool((log_pi.exp() >= epsilon / ACT - 1e-7).all())
    log_mu = log_pi.gather(-1, out["action"].unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(out["action_log_prob"], log_mu)  # µ of the mixed policy
    with pytest.raises(ValueError, match="policy_epsilon"):
        small_actor(policy_epsilon=1.0)


@pytest.mark.parametrize("distributional", [True, False])
def test_dueling_q_head_is_value_plus_centred_advantage(distributional):
    actor = small_actor(recurrent=False, distributional=distributional)
    head = actor.module[0].module[-1].module
    td = inputs((5,)).exclude(*STATE_KEYS, "is_init")
    out = actor(td.clone())
    key = "action_value_logits" if distributional else "action_value"
    q = out[key] if distributional else out[key].unsqueeze(-1)  # [5, A, N or 1]
    value = head.state_value(out["critic_memory"])  # [5, N or 1]
    torch.testing.assert_close(q.mean(-2), value)  # mean_a (v + adv_a − mean adv) = v
    advantage = head.qvalue(out["critic_memory"]).unflatten(-1, (ACT, -1))
    torch.testing.assert_close(q - value.unsqueeze(-2), advantage - advantage.mean(-2, True))
    plain = small_actor(recurrent=False, distributional=distributional, dueling=False)
    assert plain.module[0].module[-1].module.state_value is None


def test_env_transforms_hold_one_primer_for_both_lstms_and_check_specs():
    actor = small_actor()
    transforms = reactor_env_transforms(actor)
    kinds = [type(t) for t in transforms.transforms]
    assert kinds == [InitTracker, TensorDictPrimer, PreviousActionReward]
    assert set(transforms[1].primers.keys()) == set(STATE_KEYS)
    env = reactor_env(actor)
    check_env_specs(env)
    spec = env.observation_spec
    assert spec["prev_action"].shape == (3, ACT) and spec["prev_reward"].shape == (3, 1)
    for key in STATE_KEYS:
        assert spec[key].shape == (3, 1, HID)
    # Without the previous action/reward input, the transform is left out.
    plain = reactor_env_transforms(small_actor(previous_action_reward=False))
    assert [type(t) for t in plain.transforms] == [InitTracker, TensorDictPrimer]


def test_previous_action_and_reward_on_a_batched_rollout_with_autoresets():
    actor = small_actor()
    env = reactor_env(actor)
    with torch.no_grad():
        td = env.rollout(80, actor, break_when_any_done=False)  # [E=3, T=80]
    done = td["next", "done"].squeeze(-1)  # [E, T]
    is_init = td["is_init"].squeeze(-1)
    # make_batched_env's same-step autoreset: the row after a done step restarts (is_init).
    assert is_init[:, 0].all() and torch.equal(is_init[:, 1:], done[:, :-1])
    # Some sub-env restarts while another one continues (a partial reset).
    partial = done[:, :-1].any(0) & ~done[:, :-1].all(0)
    assert partial.any() and done.sum() >= 4

    prev_action, prev_reward = td["prev_action"], td["prev_reward"]  # [E, T, A], [E, T, 1]
    assert prev_action.dtype == torch.float32 and prev_reward.shape == (3, 80, 1)
    expected_action = F.one_hot(td["action"][:, :-1], ACT).float()
    expected_reward = td["next", "reward"][:, :-1]
    cont = ~done[:, :-1]  # [E, T-1]: within an episode
    torch.testing.assert_close(prev_action[:, 1:][cont], expected_action[cont], rtol=0, atol=0)
    torch.testing.assert_close(prev_reward[:, 1:][cont], expected_reward[cont], rtol=0, atol=0)
    assert expected_reward[cont].eq(1).all()  # CartPole: the check is not on zeros
    assert prev_action[is_init].eq(0).all() and prev_reward[is_init].eq(0).all()
    assert prev_action[~is_init].sum(-1).eq(1).all()
    # ("next", ...) carries the values step_mdp moves to the root.
    torch.testing.assert_close(td["next", "prev_action"], F.one_hot(td["action"], ACT).float())
    torch.testing.assert_close(td["next", "prev_reward"], td["next", "reward"])


def test_partial_reset_zeroes_only_the_restarting_sub_envs():
    # The env path (env.reset merging by the "_reset" mask) is checked on the rollout above;
    # here the transform alone, as env.reset calls it, on a hand-built partial reset.
    actor = small_actor()
    env = reactor_env(actor)
    (transform,) = [t for t in env.transform.modules() if isinstance(t, PreviousActionReward)]
    td = env.reset()
    for _ in range(2):
        td = env.step(actor(td))["next"]
    before = td.select("prev_action", "prev_reward").clone()
    assert before["prev_action"].sum(-1).eq(1).all()
    td["_reset"] = torch.tensor([[False], [True], [False]])
    out = transform._reset(td, td.exclude("prev_action", "prev_reward"))
    assert out["prev_action"][1].eq(0).all() and out["prev_reward"][1].eq(0).all()
    for i in (0, 2):
        torch.testing.assert_close(out["prev_action"][i], before["prev_action"][i])
        torch.testing.assert_close(out["prev_reward"][i], before["prev_reward"][i])
    full = transform._reset(td.exclude("_reset"), td.exclude("prev_action", "prev_reward"))
    assert full["prev_action"].eq(0).all() and full["prev_reward"].eq(0).all()


def collect(actor, num_envs, frames, seed=0):
    env = reactor_env(actor, num_envs, seed)
    collector = Collector(env, actor, frames_per_batch=frames, total_frames=frames)
    batch = next(iter(collector))
    collector.shutdown()
    return batch


@pytest.mark.timeout(120)
@pytest.mark.parametrize("distributional", [True, False])
def test_recurrent_replay_reproduces_collection_outputs(distributional):
    # Stored state (R2D2): replaying the collected [E, T] sequence in recurrent mode from the
    # stored hidden states reproduces the collection-time logits and Q outputs, across
    # episode ends, and so does a window starting mid-episode (the burn-in case).
    actor = small_actor(distributional=distributional)
    q_key = "action_value_logits" if distributional else "action_value"
    batch = collect(actor, 2, 120)  # [2, 60]
    assert batch.shape == (2, 60)
    done = batch["next", "done"].squeeze(-1)
    assert done[:, :-1].any()
    for key in STATE_KEYS:  # the hidden state is carried from step to step within episodes
        carried = batch[key][:, 1:][~done[:, :-1]]
        torch.testing.assert_close(carried, batch["next", key][:, :-1][~done[:, :-1]])
        assert carried.abs().sum() > 0
    outputs = [*STATE_KEYS, "is_init", "observation", "prev_action", "prev_reward"]
    for start in (0, 17):
        window = batch[:, start:]
        with set_recurrent_mode(True), torch.no_grad():
            replay = actor(window.select(*outputs).clone())
        for key in ("logits", q_key):
            diff = (replay[key] - window[key]).abs().max()
            assert diff < 1e-5, (start, key, diff)
    # Zeroing the stored state at a mid-episode start changes the outputs (it is used).
    window = batch[:, 17:].select(*outputs).clone()
    assert not window["is_init"][:, 0].any()  # both rows start mid-episode (seeded)
    for key in STATE_KEYS:
        window[key].zero_()
    with set_recurrent_mode(True), torch.no_grad():
        zeroed = actor(window)
    assert (zeroed["logits"] - batch["logits"][:, 17:]).abs().max() > 1e-5


@pytest.mark.timeout(120)
def test_collector_smoke_stores_the_behaviour_log_prob():
    actor = small_actor()
    env = reactor_env(actor, 4)
    collector = Collector(env, actor, frames_per_batch=40, total_frames=80)
    batches = list(collector)
    collector.shutdown()
    assert len(batches) == 2
    for batch in batches:
        assert batch.shape == (4, 10)
        for key in [*OUTPUTS, "prev_action", "prev_reward", "is_init", *STATE_KEYS]:
            assert key in batch.keys(), key
        log_mu = batch["logits"].log_softmax(-1).gather(-1, batch["action"].unsqueeze(-1))
        torch.testing.assert_close(batch["action_log_prob"], log_mu.squeeze(-1))
        assert batch["action_value_logits"].shape == (4, 10, ACT, ATOMS)


@pytest.mark.parametrize("previous_action_reward", [True, False])
def test_feed_forward_branches_keep_no_state(previous_action_reward):
    # recurrent=False: each branch is Linear + tanh, so outputs depend on the current step
    # only, no state is stored and the env needs no InitTracker / primer.
    actor = small_actor(recurrent=False, previous_action_reward=previous_action_reward)
    assert not any(isinstance(m, LSTMModule) for m in actor.modules())
    assert "is_init" not in actor.in_keys and not set(STATE_KEYS) & set(actor.in_keys)
    td = inputs((3, 5)).exclude(*STATE_KEYS, "is_init")
    out = actor(td.clone())
    assert out["logits"].shape == (3, 5, ACT)
    assert out["action_value_logits"].shape == (3, 5, ACT, ATOMS)
    assert ("next", STATE_KEYS[0]) not in out.keys(True)
    step = actor(td[:, 2].clone())  # a single step gives the same outputs as inside a sequence
    torch.testing.assert_close(step["logits"], out["logits"][:, 2])
    kinds = [type(t) for t in reactor_env_transforms(actor).transforms]
    assert kinds == ([PreviousActionReward] if previous_action_reward else [])
    env = reactor_env(actor)
    check_env_specs(env)
    rollout = env.rollout(4, actor)
    assert rollout["action_log_prob"].shape == (3, 4)
