"""Composed-pipeline helpers: µ stored at collection, the one-hot trap, sequences, priorities."""

from __future__ import annotations

from functools import partial

import gymnasium as gym
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torchrl.collectors import Collector, MultiSyncCollector
from torchrl.data import (
    Bounded,
    Categorical,
    LazyTensorStorage,
    OneHot,
    SliceSampler,
    TensorDictReplayBuffer,
)
from torchrl.envs import GymEnv, SerialEnv
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import ProbabilisticActor

from ac_extensions.data import PrioritizedSequenceSampler
from ac_extensions.modules import (
    collection_policy,
    make_actor_critic,
    make_continuous_actor_critic,
    make_reactor_actor,
)
from ac_extensions.objectives import ReactorLoss
from ac_extensions.runtime import (
    BehaviorPolicy,
    action_encoding_error,
    check_action_encoding,
    label_sequences,
    shutdown_collector,
)


def observations(n: int = 6) -> TensorDict:
    return TensorDict({"observation": torch.randn(n, 4)}, [n])


# ---------------------------------------------------------------- BehaviorPolicy: µ at collection


def test_behavior_logits_are_the_actors_logits_and_log_prob_is_log_mu(seed):
    actor, _ = make_actor_critic(4, 2)
    policy = BehaviorPolicy(actor)
    assert policy.statistics == ("logits",)
    with set_exploration_type(ExplorationType.RANDOM):
        td = policy(observations())
    expected = actor.module[0].module(td["observation"])  # the network, run again
    torch.testing.assert_close(td["behavior", "logits"], expected)
    log_mu = expected.log_softmax(-1).gather(-1, td["action"].unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(td["action_log_prob"], log_mu)
    assert ("behavior", "logits") in policy.out_keys and "action_log_prob" in policy.out_keys


def test_behavior_logits_survive_the_actor_running_again(seed):
    actor, _ = make_actor_critic(4, 2)
    td = BehaviorPolicy(actor)(observations())
    stored = td["behavior", "logits"].clone()
    with torch.no_grad():
        for p in actor.parameters():
            p.add_(1.0)
    actor(td)  # what a loss does: overwrites "logits", not the stored µ
    assert not torch.allclose(td["logits"], stored)
    torch.testing.assert_close(td["behavior", "logits"], stored)


def test_fast_sampler_of_collection_policy_is_recognised(seed):
    actor, critic = make_actor_critic(4, 2)
    fast = collection_policy(actor, critic)  # a TensorDictModule, no ProbabilisticActor
    policy = BehaviorPolicy(fast)
    assert policy.statistics == ("logits",)
    td = policy(observations())
    torch.testing.assert_close(td["behavior", "logits"], actor.module[0].module(td["observation"]))


def test_gaussian_statistics_and_joint_log_density(seed):
    actor, _ = make_continuous_actor_critic(4, 2, hidden_sizes=(8,), init_scale=0.5)
    policy = BehaviorPolicy(actor)
    assert policy.statistics == ("loc", "scale")
    with set_exploration_type(ExplorationType.RANDOM):
        td = policy(observations())
    torch.testing.assert_close(td["behavior", "loc"], td["loc"])
    torch.testing.assert_close(td["behavior", "scale"], torch.full((6, 2), 0.5))
    normal = torch.distributions.Normal(td["loc"], td["scale"])
    torch.testing.assert_close(td["action_log_prob"], normal.log_prob(td["action"]).sum(-1))


def test_log_prob_is_computed_when_the_actor_does_not_write_it(seed):
    net = TensorDictModule(torch.nn.Linear(4, 3), ["observation"], ["logits"])
    actor = ProbabilisticActor(
        net, in_keys=["logits"], distribution_class=torch.distributions.Categorical
    )
    with set_exploration_type(ExplorationType.RANDOM):
        td = BehaviorPolicy(actor)(observations())
    expected = td["logits"].log_softmax(-1).gather(-1, td["action"].unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(td["action_log_prob"], expected)


def test_unknown_statistics_are_an_error_that_says_what_to_pass():
    module = TensorDictModule(torch.nn.Linear(4, 2), ["observation"], ["action"])
    with pytest.raises(ValueError, match=r"statistics=\(\.\.\.\)"):
        BehaviorPolicy(module)
    policy = BehaviorPolicy(module, statistics=["action"], log_prob_key="lp")
    with pytest.raises(ValueError, match="wrote no lp"):
        policy(observations())


def test_behavior_logits_in_a_collected_batch_equal_the_actors(seed):
    actor, _ = make_actor_critic(4, 2)
    env = GymEnv("CartPole-v1", categorical_action_encoding=True)
    collector = Collector(env, BehaviorPolicy(actor), frames_per_batch=32, total_frames=32)
    batch = next(iter(collector))
    shutdown_collector(collector)
    with torch.no_grad():
        expected = actor.module[0].module(batch["observation"])
    torch.testing.assert_close(batch["behavior", "logits"], expected)
    log_mu = expected.log_softmax(-1).gather(-1, batch["action"].unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(batch["action_log_prob"], log_mu)


# ---------------------------------------------------------------- the one-hot action trap


def test_the_trap_an_index_on_a_one_hot_env_always_takes_action_0(seed):
    """Reproduce it: GymEnv's default one-hot spec turns the index 1 ("push right") into 0."""
    env = GymEnv("CartPole-v1")  # one-hot actions by default
    assert isinstance(env.full_action_spec["action"], OneHot)
    push_right = TensorDictModule(
        lambda obs: torch.ones(obs.shape[:-1], dtype=torch.long), ["observation"], ["action"]
    )
    env.set_seed(3)
    rollout = env.rollout(5, push_right)
    assert (rollout["action"] == 1).all()  # what was stored: "push right"
    plain = gym.make("CartPole-v1").unwrapped  # the same dynamics, from the same state
    plain.reset()
    plain.state = rollout["observation"][0].double().numpy()
    for t in range(5):  # what the env did: action 0 ("push left") every step
        obs, *_ = plain.step(0)
        torch.testing.assert_close(rollout["next", "observation"][t], torch.as_tensor(obs))
    assert (rollout["next", "observation"][:, 1] < 0).all()  # the cart moves left


def test_check_action_encoding_names_key_encoding_shapes_and_fix(seed):
    actor, _ = make_actor_critic(4, 2)
    with pytest.raises(ValueError) as info:
        check_action_encoding(GymEnv("CartPole-v1"), actor)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("action: the env's action spec is OneHot")
    for part in (
        "[*B, 2] = [2]",
        "an index of shape [] (torch.int64)",
        "always action 0",
        "categorical_action_encoding=True",
    ):
        assert part in message, (part, message)


def test_check_action_encoding_on_a_batch_of_envs(seed):
    actor, _ = make_actor_critic(4, 2)
    env = SerialEnv(3, partial(GymEnv, "CartPole-v1"))
    with pytest.raises(
        ValueError,
        match=r"\[\*B, 2\] = \[3, 2\]\) but the policy wrote an index "
        r"of shape \[3\]",
    ):
        check_action_encoding(env, actor)
    env.close()
    good = SerialEnv(3, partial(GymEnv, "CartPole-v1", categorical_action_encoding=True))
    assert check_action_encoding(good, actor)["action"].shape == (3,)
    good.close()


def test_action_encoding_error_for_each_spec():
    assert action_encoding_error(OneHot(3, shape=(5, 3)), torch.zeros(5, 3), (5,)) is None
    assert action_encoding_error(Categorical(3, shape=(5,)), torch.zeros(5), (5,)) is None
    assert action_encoding_error(Categorical(3), torch.zeros(5), (5,)) is None  # unbatched spec
    one_hot_on_index = action_encoding_error(Categorical(3, shape=(5,)), torch.zeros(5, 3), (5,))
    assert one_hot_on_index.startswith("action: the env's action spec is Categorical")
    assert "wrote one-hot vectors of shape [5, 3]" in one_hot_on_index
    box = Bounded(-2.0, 2.0, shape=(5, 1))
    assert action_encoding_error(box, torch.zeros(5, 1), (5,)) is None
    message = action_encoding_error(box, torch.zeros(5), (5,), key=("agent", "action"))
    assert message == (
        "('agent', 'action'): the env's action spec (BoundedContinuous) expects shape [5, 1] "
        "but the policy wrote shape [5] (torch.float32)"
    )


def test_behavior_policy_with_the_action_spec_raises_on_the_trap(seed):
    actor, _ = make_actor_critic(4, 2)
    env = GymEnv("CartPole-v1")
    policy = BehaviorPolicy(actor, action_spec=env.full_action_spec["action"])
    with pytest.raises(ValueError, match="action spec is OneHot"):
        policy(env.reset())
    fixed = GymEnv("CartPole-v1", categorical_action_encoding=True)
    policy = BehaviorPolicy(actor, action_spec=fixed.full_action_spec["action"])
    assert policy(fixed.reset())["behavior", "logits"].shape == (2,)


def make_one_hot_pair():
    return SerialEnv(2, partial(GymEnv, "CartPole-v1"))


@pytest.mark.timeout(120)
def test_the_trap_raises_in_the_trainer_when_the_worker_sees_it(seed):
    actor, _ = make_actor_critic(4, 2)
    spec = make_one_hot_pair().full_action_spec["action"]
    policy = BehaviorPolicy(actor, action_spec=spec)
    with pytest.raises(ValueError, match="action spec is OneHot") as info:
        collector = MultiSyncCollector(
            [make_one_hot_pair], policy, frames_per_batch=16, total_frames=16
        )
        try:
            next(iter(collector))
        finally:
            shutdown_collector(collector)
    assert "[*B, 2] = [2, 2]" in str(info.value)


# ---------------------------------------------------------------- sequences and priorities


def test_label_sequences_rows_become_slice_sampler_sequences(seed):
    w, e, t = 1, 4, 10  # a MultiSyncCollector batch [W, E, T]
    step = torch.arange(w * e * t).reshape(w, e, t)
    batch = TensorDict(
        {"step": step, ("next", "reward"): torch.ones(w, e, t, 1), "noise": torch.zeros(w, e, t)},
        [w, e, t],
    )
    rows = label_sequences(batch, ["step", ("next", "reward")], 7, reward_scale=0.5)
    assert rows.shape == (4, 10) and "noise" not in rows.keys()
    assert rows["replay", "sequence"].tolist() == [[7 + r] * 10 for r in range(4)]
    assert (rows["next", "reward"] == 0.5).all() and (batch["next", "reward"] == 1).all()
    sampler = SliceSampler(slice_len=5, traj_key=("replay", "sequence"), strict_length=True)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), sampler=sampler, batch_size=40)
    rb.extend(rows.reshape(-1))
    for _ in range(5):
        sample = rb.sample().reshape(-1, 5)
        ids, steps = sample["replay", "sequence"], sample["step"]
        assert (ids == ids[:, :1]).all()  # a window never spans two rows
        assert (steps.diff(dim=-1) == 1).all()  # consecutive steps of one env
        assert ((steps // t) == ids - 7).all()


def test_update_tensordict_priority_writes_the_losss_priority_per_window(seed):
    length, rows, steps = 4, 3, 8
    actor = make_reactor_actor(
        4,
        2,
        hidden_sizes=(8,),
        recurrent_size=8,
        num_atoms=5,
        recurrent=False,
        previous_action_reward=False,
    )
    loss = ReactorLoss(actor, num_atoms=5)
    data = TensorDict(
        {
            "observation": torch.randn(rows, steps, 4),
            "action": torch.randint(2, (rows, steps)),
            "action_log_prob": torch.full((rows, steps), -0.7),
            ("next", "observation"): torch.randn(rows, steps, 4),
            ("next", "reward"): torch.randn(rows, steps, 1),
            ("next", "done"): torch.zeros(rows, steps, 1, dtype=torch.bool),
            ("next", "terminated"): torch.zeros(rows, steps, 1, dtype=torch.bool),
        },
        [rows, steps],
    )
    data = label_sequences(data, None, 0)
    sampler = PrioritizedSequenceSampler(rows * steps, length, traj_key=("replay", "sequence"))
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(rows * steps),
        sampler=sampler,
        batch_size=5 * length,
        priority_key="td_error",
    )
    rb.extend(data.reshape(-1))
    sample = rb.sample().reshape(-1, length)
    loss(sample)  # writes the per-window priority at every step of the sample
    assert sample["td_error"].shape == (5, length)
    rb.update_tensordict_priority(sample)  # TorchRL's call, as is
    table = sampler.priorities(rb.storage)
    starts = sample["index"][:, 0]
    assert table.assigned[starts].all() and int(table.assigned.sum()) == len(starts.unique())
    torch.testing.assert_close(
        table.priority[starts].float(), sample["td_error"][:, 0], rtol=1e-6, atol=1e-6
    )
