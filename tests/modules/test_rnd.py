"""RandomNetworkDistillation: a fixed target, a predictor that learns, float64 normalisers."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from ac_extensions.modules import RandomNetworkDistillation, RewardNormalizer, rnd_networks


def _rnd(shape=(3,), **kwargs) -> RandomNetworkDistillation:
    torch.manual_seed(0)
    return RandomNetworkDistillation(*rnd_networks(shape), observation_shape=shape, **kwargs)


def _batch(rows=4, steps=6, shape=(3,), scale=1.0, done_every=0) -> TensorDict:
    td = TensorDict(
        {("next", "observation"): scale * torch.randn(rows, steps, *shape)}, [rows, steps]
    )
    done = torch.zeros(rows, steps, 1, dtype=torch.bool)
    if done_every:
        done[:, done_every - 1 :: done_every] = True
    td.set(("next", "done"), done)
    return td


def test_the_target_never_changes_and_the_predictor_does():
    rnd = _rnd()
    target = {k: v.clone() for k, v in rnd.target.state_dict().items()}
    predictor = {k: v.clone() for k, v in rnd.predictor.state_dict().items()}
    assert not any(p.requires_grad for p in rnd.target.parameters())
    optimizer = torch.optim.Adam([p for p in rnd.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(5):
        td = _batch()
        rnd(td)  # statistics move too
        optimizer.zero_grad()
        rnd.loss(td)["loss_rnd"].backward()
        optimizer.step()
    for key, value in rnd.target.state_dict().items():
        torch.testing.assert_close(value, target[key], rtol=0, atol=0)
    assert any(
        not torch.equal(value, predictor[key]) for key, value in rnd.predictor.state_dict().items()
    )


def test_the_intrinsic_reward_falls_on_observations_the_predictor_trained_on():
    rnd = _rnd()
    seen = torch.randn(64, 3)
    rnd.initialize(torch.randn(1000, 3))
    optimizer = torch.optim.Adam(rnd.predictor.parameters(), lr=3e-3)
    td = TensorDict({("next", "observation"): seen}, [64])
    with torch.no_grad():
        before = rnd.prediction_error(seen).mean()
        novel_before = rnd.prediction_error(seen + 3.0).mean()
    for _ in range(300):
        optimizer.zero_grad()
        rnd.loss(td)["loss_rnd"].backward()
        optimizer.step()
    with torch.no_grad():
        after = rnd.prediction_error(seen).mean()
        novel_after = rnd.prediction_error(seen + 3.0).mean()
    assert after < 0.1 * before
    assert novel_after > 5 * after  # far-away observations still surprise it
    assert novel_before > 0


def test_forward_matches_a_naive_float64_computation():
    rnd = _rnd(gamma=0.9)
    start = torch.randn(50, 3, dtype=torch.float64) * 2 + 1
    rnd.initialize(start)
    batches = [_batch(scale=1.5, done_every=2), _batch(scale=0.5, done_every=3)]
    seen = [start]
    running = torch.zeros(4, dtype=torch.float64)
    all_returns = []
    for td in batches:
        observation = td["next", "observation"].to(torch.float64)
        history = torch.cat([s.reshape(-1, 3) for s in seen])
        # Observation statistics: the prior (mean 0, var 1, count 1e-4) merged with every
        # observation so far, then whitened and clipped at 5.
        count = 1e-4 + history.shape[0]
        mean = history.sum(0) / count
        second = (1e-4 * 1.0 + ((history - 0) ** 2).sum(0)) / count  # E[x²] with the prior
        var = second - mean**2
        whitened = ((observation - mean) / torch.sqrt(var + 1e-8)).clamp(-5, 5).float()
        with torch.no_grad():
            flat = whitened.reshape(-1, 3)
            error = (rnd.predictor(flat) - rnd.target(flat)).square().mean(-1).reshape(4, 6)
        # Intrinsic returns ignore episode ends; the reward is divided by their running std.
        returns = torch.empty(4, 6, dtype=torch.float64)
        for t in range(6):
            running = 0.9 * running + error[:, t].double()
            returns[:, t] = running
        all_returns.append(returns.reshape(-1))
        values = torch.cat(all_returns)
        n = 1e-4 + values.numel()
        r_mean = values.sum() / n
        r_var = (1e-4 * 1.0 + (values**2).sum()) / n - r_mean**2
        expected = error.double() / torch.sqrt(r_var + 1e-8)
        rnd(td)
        torch.testing.assert_close(
            td["next", "reward_intrinsic"].squeeze(-1).double(), expected, rtol=1e-5, atol=1e-6
        )
        seen.append(observation)


def test_the_reward_normaliser_without_done_key_never_resets():
    episodic = RewardNormalizer(0.5)
    endless = RewardNormalizer(0.5, done_key=None)
    td = TensorDict(
        {
            ("next", "reward"): torch.ones(1, 4, 1),
            ("next", "done"): torch.tensor([[[False], [True], [False], [False]]]),
        },
        [1, 4],
    )
    episodic(td.clone())
    endless(td.clone())
    assert episodic.returns.tolist() == [1.5]  # 1, 1.5 | reset | 1, 1.5
    assert endless.returns.tolist() == [1.875]  # 1, 1.5, 1.75, 1.875


def test_loss_is_the_mean_error_over_the_valid_and_sampled_steps():
    rnd = _rnd(proportion=0.5)
    td = _batch()
    mask = torch.rand(4, 6) > 0.3
    td.set(("collector", "mask"), mask)
    error = rnd.prediction_error(td["next", "observation"]).detach()
    torch.manual_seed(7)
    loss = rnd.loss(td)["loss_rnd"]
    torch.manual_seed(7)
    sampled = torch.rand_like(error) < 0.5
    weight = (mask & sampled).float()
    torch.testing.assert_close(loss.detach(), (error * weight).sum() / weight.sum())
    full = _rnd(proportion=1.0)
    torch.testing.assert_close(
        full.loss(td)["loss_rnd"].detach(),
        full.prediction_error(td["next", "observation"]).detach()[mask].mean(),
    )


def test_image_observations_and_state_dict_round_trip():
    rnd = _rnd(shape=(4, 10, 10))
    td = _batch(rows=2, steps=3, shape=(4, 10, 10))
    rnd(td)
    other = RandomNetworkDistillation(*rnd_networks((4, 10, 10)), observation_shape=(4, 10, 10))
    other.load_state_dict(rnd.state_dict())
    observation = td["next", "observation"]
    torch.testing.assert_close(
        other.prediction_error(observation), rnd.prediction_error(observation)
    )
    torch.testing.assert_close(other.rewards.returns, rnd.rewards.returns)


def test_bad_input_names_the_key_and_the_shapes():
    rnd = _rnd()
    with pytest.raises(ValueError, match=r"\[\*B, 3\], got \[4, 6, 2\]"):
        rnd(_batch(shape=(2,)))
    with pytest.raises(ValueError, match=r"\[B, T\] batch"):
        rnd(TensorDict({("next", "observation"): torch.randn(5, 3)}, [5]))
    with pytest.raises(KeyError, match="'next', 'observation'"):
        rnd(TensorDict({"observation": torch.randn(2, 5, 3)}, [2, 5]))
    with pytest.raises(ValueError, match="proportion"):
        _rnd(proportion=0.0)


def test_a_forgetting_reward_normaliser_weighs_the_latest_batch_more():
    # Batch 1 returns (γ = 0): 4, 4; batch 2: 1, 1. Forgetting half the weight before batch 2
    # leaves count 1 + 2 for the mean: (1 · 4 + 2 · 1) / 3 = 2 (prior count 1e-4 aside).
    forgetting = RewardNormalizer(0.0, forget=0.5, done_key=None)
    keeping = RewardNormalizer(0.0, done_key=None)
    for norm in (forgetting, keeping):
        for value in (4.0, 1.0):
            norm(TensorDict({("next", "reward"): torch.full((1, 2, 1), value)}, [1, 2]))
    assert float(forgetting.mean) == pytest.approx(2.0, abs=1e-3)
    assert float(keeping.mean) == pytest.approx(2.5, abs=1e-3)
    assert float(forgetting.count) == pytest.approx(3.0, abs=1e-3)
    with pytest.raises(ValueError, match="forget"):
        RewardNormalizer(0.9, forget=1.0)
