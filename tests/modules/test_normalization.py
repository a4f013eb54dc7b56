"""ObservationNormalizer: running statistics against the whole data, the forward pass, errors."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from ac_extensions.modules import NORMALIZED_OBSERVATION, ObservationNormalizer, RewardNormalizer


def test_running_statistics_equal_those_of_all_the_data_seen():
    # Three batches of different sizes and scales: the merged mean and (population) variance
    # equal those of the concatenation, up to the 1e-4 prior count at mean 0, variance 1.
    torch.manual_seed(0)
    batches = [torch.randn(7, 3) * 5 + 2, torch.randn(2, 4, 3) * 0.1 - 1, torch.randn(40, 3)]
    norm = ObservationNormalizer((3,))
    for batch in batches:
        norm.update(batch)
    data = torch.cat([b.reshape(-1, 3) for b in batches]).double()
    n, prior = data.shape[0], 1e-4
    mean = data.sum(0) / (n + prior)
    second = (data.square().sum(0) + prior * 1.0) / (n + prior)  # E[x²] with the prior's 0, 1
    torch.testing.assert_close(norm.loc.double(), mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(norm.var.double(), second - mean.square(), rtol=1e-5, atol=1e-6)
    assert norm.count.item() == pytest.approx(n + prior)


def test_forward_normalises_clips_and_writes_the_next_observation_without_updating():
    norm = ObservationNormalizer((2,), clip=3.0)
    norm.update(torch.tensor([[0.0, 10.0], [2.0, 30.0]]))  # mean (1, 20), var (1, 100)
    td = TensorDict(
        {
            "observation": torch.tensor([[3.0, 20.0]]),
            "next": {"observation": torch.tensor([[1.0, 1000.0]])},
        },
        [1],
    )
    before = {k: v.clone() for k, v in norm.state_dict().items()}
    out = norm(td)
    torch.testing.assert_close(
        out[NORMALIZED_OBSERVATION], torch.tensor([[2.0, 0.0]]), atol=1e-3, rtol=0
    )
    # (1000 − 20)/10 = 98 is clipped to 3.
    torch.testing.assert_close(
        out["next", NORMALIZED_OBSERVATION], torch.tensor([[0.0, 3.0]]), atol=1e-3, rtol=0
    )
    assert torch.equal(out["observation"], torch.tensor([[3.0, 20.0]]))  # the raw entry stays
    for key, value in norm.state_dict().items():
        assert torch.equal(value, before[key]), key
    # Without ("next", "observation") only the current one is written.
    assert ("next", NORMALIZED_OBSERVATION) not in norm(
        TensorDict({"observation": torch.zeros(4, 2)}, [4])
    ).keys(True)


def test_float64_observations_come_out_in_the_statistics_dtype():
    norm = ObservationNormalizer((2,))
    out = norm(TensorDict({"observation": torch.ones(3, 2, dtype=torch.float64)}, [3]))
    assert out[NORMALIZED_OBSERVATION].dtype == torch.float32


def test_bad_input_names_the_key_and_the_shapes():
    norm = ObservationNormalizer((3,))
    with pytest.raises(ValueError, match=r"'observation'.*\[\*B, 3\].*\[5, 4\]"):
        norm.update(torch.zeros(5, 4))
    with pytest.raises(ValueError, match="non-finite"):
        norm.update(torch.tensor([[0.0, float("nan"), 1.0]]))
    with pytest.raises(ValueError, match="eps and clip"):
        ObservationNormalizer((3,), clip=0.0)


def test_statistics_round_trip_through_state_dict():
    norm = ObservationNormalizer((2,))
    norm.update(torch.randn(10, 2) * 4 + 1)
    other = ObservationNormalizer((2,))
    other.load_state_dict(norm.state_dict())
    x = torch.randn(6, 2)
    assert torch.equal(other.normalize(x), norm.normalize(x))


# ------------------------------------------------------------------ RewardNormalizer


def _reward_batch(rewards, dones):
    rewards, dones = torch.as_tensor(rewards, dtype=torch.float32), torch.as_tensor(dones)
    return TensorDict(
        {("next", "reward"): rewards.unsqueeze(-1), ("next", "done"): dones.unsqueeze(-1)},
        list(rewards.shape),
    )


def test_reward_normalizer_scales_by_the_std_of_discounted_returns_carried_across_batches():
    # Naive reference from the definition: per env R_t = γ R_{t−1} + r_t, reset after a done;
    # every R_t of both batches enters the variance (population, as VecNormalize's).
    torch.manual_seed(0)
    gamma = 0.9
    rewards = torch.randn(3, 10) * 4 + 1
    dones = torch.zeros(3, 10, dtype=torch.bool)
    dones[0, 3] = dones[1, 7] = dones[2, 4] = True  # row 2's return also carries over the cut
    returns = torch.zeros(3, 10, dtype=torch.float64)
    for row in range(3):
        running = 0.0
        for t in range(10):
            running = gamma * running + float(rewards[row, t])
            returns[row, t] = running
            running = 0.0 if dones[row, t] else running
    norm = RewardNormalizer(gamma)
    first = norm(_reward_batch(rewards[:, :6], dones[:, :6]))
    second = norm(_reward_batch(rewards[:, 6:], dones[:, 6:]))
    # After the first batch, its rewards are scaled by the std of its own returns ...
    std_first = returns[:, :6].reshape(-1).var(unbiased=False).sqrt()
    assert torch.allclose(
        first["next", "reward"].squeeze(-1), (rewards[:, :6] / std_first).float(), rtol=1e-4
    )
    # ... and the second by that of every return so far (the 1e-4 prior count aside).
    std_all = returns.reshape(-1).var(unbiased=False).sqrt()
    assert torch.allclose(
        second["next", "reward"].squeeze(-1), (rewards[:, 6:] / std_all).float(), rtol=1e-4
    )
    assert torch.allclose(norm.returns, returns[:, -1] * (~dones[:, -1]))


def test_reward_normalizer_clips_and_round_trips_through_state_dict():
    norm = RewardNormalizer(0.99, clip=2.0)
    out = norm(_reward_batch([[0.0] * 9 + [100.0]], [[False] * 10]))
    assert float(out["next", "reward"].max()) == 2.0  # 100 / std(returns) > 2: clipped
    restored = RewardNormalizer(0.99, clip=2.0)
    restored.load_state_dict(norm.state_dict())  # the running returns' length comes along
    for name in ("mean", "var", "count", "returns"):
        assert torch.equal(getattr(restored, name), getattr(norm, name)), name


def test_reward_normalizer_names_the_keys_and_shapes_of_bad_input():
    norm = RewardNormalizer(0.99)
    with pytest.raises(ValueError, match=r"\[B, T\] batch"):
        norm(TensorDict({("next", "reward"): torch.zeros(4, 1)}, [4]))
    bad = TensorDict(
        {("next", "reward"): torch.zeros(2, 3), ("next", "done"): torch.zeros(2, 3, 1).bool()},
        [2, 3],
    )
    with pytest.raises(ValueError, match=r"must have shape \[2, 3, 1\], got \[2, 3\]"):
        norm(bad)
    with pytest.raises(ValueError, match="gamma"):
        RewardNormalizer(1.5)
