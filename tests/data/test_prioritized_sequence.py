from __future__ import annotations

import math
import pickle
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ReplayBuffer,
    TensorDictReplayBuffer,
)

from ac_extensions.data import PrioritizedSequenceSampler

TRAJ = ("collector", "traj_ids")


def make(capacity, length, traj=None, *, td=False, **kwargs):
    """A replay buffer of ``capacity`` steps, optionally extended with trajectory ids."""
    sampler = PrioritizedSequenceSampler(capacity, length, traj_key=TRAJ, **kwargs)
    cls = TensorDictReplayBuffer if td else ReplayBuffer
    rb = cls(storage=LazyTensorStorage(capacity), sampler=sampler)
    if traj is not None:
        extend(rb, traj)
    return rb, sampler


def extend(rb, traj):
    traj = torch.as_tensor(traj)
    rb.extend(TensorDict({TRAJ: traj, "obs": torch.arange(traj.numel()).float()}, [len(traj)]))


def sample_starts(sampler, rb, n):
    index, info = sampler.sample(rb.storage, n * sampler.sequence_length)
    return info["sequence_start"][:: sampler.sequence_length], index, info


def sample_everything(sampler, rb, draws=4000):
    """Mark every valid start as sampled (lazy initialisation only assigns sampled starts)."""
    starts, _, _ = sample_starts(sampler, rb, draws)
    table = sampler.priorities(rb.storage)
    assert set(starts.tolist()) == set(table.valid.nonzero().flatten().tolist())


def assign(sampler, rb, starts, priorities):
    sampler.update_priority(torch.tensor(starts), torch.tensor(priorities, dtype=torch.float))


def naive_estimate(assigned: dict[int, float], capacity: int) -> list[float]:
    """Python-loop p̃ from the module docstring's cell rule."""
    a = sorted(assigned)
    out = []
    for t in range(capacity):
        if t in assigned:
            out.append(assigned[t])
            continue
        left = [s for s in a if s < t]
        right = [s for s in a if s > t]
        if not left and not right:
            out.append(0.0)
        elif not left:
            out.append(assigned[right[0]])
        elif not right:
            out.append(assigned[left[-1]])
        else:
            k, k1 = left[-1], right[0]
            w_k = k1 - (k if a.index(k) > 0 else 0)
            after = a[a.index(k1) + 1] if a.index(k1) + 1 < len(a) else capacity
            w_k1 = after - k1
            out.append((w_k * assigned[k] + w_k1 * assigned[k1]) / (w_k + w_k1))
    return out


def frequencies(starts, capacity):
    return torch.bincount(starts, minlength=capacity).double() / starts.numel()


class TestUniformWhenNothingAssigned:
    def test_frequencies_uniform_over_valid_starts(self, seed):
        # C = 50, L = 5, one trajectory filling the buffer: starts 0..45 are valid (46).
        rb, sampler = make(50, 5, torch.zeros(50))
        n = 4600
        starts, _, info = sample_starts(sampler, rb, n)
        counts = torch.bincount(starts, minlength=50).double()
        assert counts[46:].sum() == 0
        p = 1 / 46
        std = math.sqrt(n * p * (1 - p))  # binomial std ≈ 9.9
        assert ((counts[:46] - n * p).abs() < 5 * std).all()
        chi2 = ((counts[:46] - n * p) ** 2 / (n * p)).sum()
        assert chi2 < 45 + 5 * math.sqrt(2 * 45)  # df = 45
        assert torch.equal(info["priority_weight"], torch.ones(n * 5))

    def test_equal_priorities_give_uniform_probabilities(self, seed):
        rb, sampler = make(30, 3, torch.zeros(30), uniform_probability=0.0)
        sample_everything(sampler, rb)
        valid = sampler.priorities(rb.storage).valid.nonzero().flatten()
        assign(sampler, rb, valid.tolist(), [3.0] * valid.numel())
        table = sampler.priorities(rb.storage)
        assert table.assigned.sum() == 28
        torch.testing.assert_close(table.probability[:28], torch.full((28,), 1 / 28).double())
        assert table.probability[28:].sum() == 0

    def test_epsilon_one_is_uniform_despite_priorities(self, seed):
        rb, sampler = make(20, 1, torch.zeros(20), uniform_probability=1.0)
        sample_everything(sampler, rb)
        assign(sampler, rb, [2, 15], [1.0, 40.0])
        torch.testing.assert_close(
            sampler.priorities(rb.storage).probability, torch.full((20,), 0.05).double()
        )
        n = 4000
        starts, _, info = sample_starts(sampler, rb, n)
        counts = torch.bincount(starts, minlength=20).double()
        std = math.sqrt(n * 0.05 * 0.95)
        assert ((counts - n * 0.05).abs() < 5 * std).all()
        assert torch.equal(info["priority_weight"], torch.ones(n))


class TestNeighbourEstimate:
    def test_one_assigned_start_sets_every_estimate(self, seed):
        # The neighbour estimate (Reactor, §3.3): p = 2 at index 10, one cell covering 0..19
        # ⇒ p̂ = 2 everywhere.
        rb, sampler = make(20, 1, torch.zeros(20), uniform_probability=0.0)
        sample_everything(sampler, rb)
        assign(sampler, rb, [10], [2.0])
        table = sampler.priorities(rb.storage)
        assert table.assigned.nonzero().flatten().tolist() == [10]
        torch.testing.assert_close(table.priority, torch.full((20,), 2.0).double())
        torch.testing.assert_close(table.probability, torch.full((20,), 1 / 20).double())

    def test_two_assigned_cells(self, seed):
        # C = 20, L = 1. p = 1 at 2, p = 4 at 15. Cells: I_1 = [0, 15) (first cell starts at
        # 0), w_1 = 15; I_2 = [15, 20), w_2 = 5.
        # t < 2: p̂ = p_1 = 1; 2 < t < 15: (15·1 + 5·4) / 20 = 1.75; t > 15: p̂ = p_2 = 4.
        # α = 1: Σ p̃ = 3·1 + 12·1.75 + 5·4 = 44; ε = 0.1: P(t) = 0.1/20 + 0.9·p̃_t/44.
        rb, sampler = make(20, 1, torch.zeros(20), uniform_probability=0.1)
        sample_everything(sampler, rb)
        assign(sampler, rb, [2, 15], [1.0, 4.0])
        table = sampler.priorities(rb.storage)
        expected = torch.tensor([1.0] * 3 + [1.75] * 12 + [4.0] * 5).double()
        torch.testing.assert_close(table.priority, expected)
        torch.testing.assert_close(table.probability, 0.1 / 20 + 0.9 * expected / 44)
        assert table.probability.sum().item() == pytest.approx(1.0)

    def test_three_assigned_cells(self, seed):
        # p = 1 at 2, 3 at 8, 4 at 15; cells [0, 8) w=8, [8, 15) w=7, [15, 20) w=5.
        # Gap (2, 8): (8·1 + 7·3) / 15 = 29/15; gap (8, 15): (7·3 + 5·4) / 12 = 41/12.
        rb, sampler = make(20, 1, torch.zeros(20))
        sample_everything(sampler, rb)
        assign(sampler, rb, [2, 8, 15], [1.0, 3.0, 4.0])
        p = sampler.priorities(rb.storage).priority
        assert p[5].item() == pytest.approx(29 / 15)
        assert p[12].item() == pytest.approx(41 / 12)
        assert p[:2].tolist() == [1.0, 1.0] and p[16:].tolist() == [4.0] * 4

    def test_incremental_matches_loop_reference(self, seed):
        # Random interleaving of writes, draws and updates; p̃ equals a from-scratch loop.
        capacity, length = 97, 3
        rb, sampler = make(capacity, length, block_size=8)
        g = torch.Generator().manual_seed(1)
        traj = 0
        for step in range(40):
            n = int(torch.randint(1, 15, (1,), generator=g))
            if step % 5 == 0:
                traj += 1
            extend(rb, torch.full((n,), traj))
            if sampler._sampleable_count(rb.storage, length) == 0:
                continue
            starts, index, _ = sample_starts(sampler, rb, 6)
            prio = torch.rand(6, generator=g) * 5
            if step % 3:
                sampler.update_priority(index, prio.repeat_interleave(length))
            else:
                sampler.update_priority(starts, prio)
            table = sampler.priorities(rb.storage)
            assigned = {
                int(t): float(table.priority[t]) for t in table.assigned.nonzero().flatten()
            }
            expected = torch.tensor(naive_estimate(assigned, capacity)).double()
            torch.testing.assert_close(table.priority, expected)
            assert not (table.assigned & ~table.valid).any()


class TestValidity:
    def test_never_crosses_trajectory_boundary(self, seed):
        # traj 0 in slots 0..9, traj 1 in 10..16, traj 2 in 17..29; L = 4.
        traj = torch.tensor([0] * 10 + [1] * 7 + [2] * 13)
        rb, sampler = make(30, 4, traj)
        valid = sampler.priorities(rb.storage).valid.nonzero().flatten().tolist()
        assert valid == list(range(0, 7)) + list(range(10, 14)) + list(range(17, 27))
        _, index, _ = sample_starts(sampler, rb, 500)
        steps = index.reshape(-1, 4)
        assert ((steps - steps[:, :1]) == torch.arange(4)).all()
        assert (traj[steps] == traj[steps[:, :1]]).all()

    def test_never_crosses_write_head_after_wrap(self, seed):
        # C = 12, L = 3, one trajectory id, 16 steps: slots 4..7 hold steps 4..7, 8..11 steps
        # 8..11, 0..3 steps 12..15; the write head sits between slot 3 (newest) and 4 (oldest),
        # so starts 2 (slots 2,3,4) and 3 (3,4,5) are invalid, starts 10, 11 wrap validly.
        rb, sampler = make(12, 3, torch.zeros(8))
        extend(rb, torch.zeros(8))
        valid = sampler.priorities(rb.storage).valid.nonzero().flatten().tolist()
        assert valid == [0, 1, *range(4, 12)]
        _, index, _ = sample_starts(sampler, rb, 500)
        obs = rb.storage[:]["obs"][index].reshape(-1, 3)  # obs restarts at 0 per extend
        steps = index.reshape(-1, 3)
        assert ((steps - steps[:, :1]) % 12 == torch.arange(3)).all()
        assert not (steps[:, :1] == 2).any() and not (steps[:, :1] == 3).any()
        assert obs.shape == (500, 3)

    def test_partial_buffer_and_trajectory_change_after_wrap(self, seed):
        rb, sampler = make(12, 3, torch.zeros(8))
        assert sampler.priorities(rb.storage).valid.nonzero().flatten().tolist() == list(range(6))
        extend(rb, torch.ones(8))  # traj 1 in slots 8..11, 0..3; traj 0 left in 4..7
        valid = sampler.priorities(rb.storage).valid.nonzero().flatten().tolist()
        assert valid == [0, 1, 4, 5, 8, 9, 10, 11]

    def test_end_key_when_no_traj_key(self, seed):
        # done after step 4: windows of L = 3 may end on it but not contain it earlier.
        sampler = PrioritizedSequenceSampler(10, 3, traj_key="missing")
        rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=sampler)
        done = torch.zeros(10, 1, dtype=torch.bool)
        done[4] = True
        rb.extend(TensorDict({("next", "done"): done}, [10]))
        valid = sampler.priorities(rb.storage).valid.nonzero().flatten().tolist()
        assert valid == [0, 1, 2, 5, 6, 7]

    def test_missing_keys_raise(self):
        sampler = PrioritizedSequenceSampler(10, 3, traj_key="missing")
        rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=sampler)
        rb.extend(TensorDict({"obs": torch.zeros(10)}, [10]))
        with pytest.raises(ValueError, match="neither traj_key"):
            rb.sample(6)


class TestLazyInitialisationAndStaleness:
    def test_overwritten_slots_lose_their_priority(self, seed):
        rb, sampler = make(12, 3, torch.zeros(12))
        sample_everything(sampler, rb)
        assign(sampler, rb, list(range(10)), [float(t + 1) for t in range(10)])
        extend(rb, torch.zeros(2))  # slots 0, 1 rewritten: windows of starts 10, 11, 0, 1
        table = sampler.priorities(rb.storage)
        assert table.assigned.nonzero().flatten().tolist() == list(range(2, 10))
        assert table.priority[2:10].tolist() == [float(t + 1) for t in range(2, 10)]
        # Head now between slot 1 (newest) and 2 (oldest): starts 0, 1 would cross it; 10, 11
        # (slots 10, 11, 0 and 11, 0, 1) are new, valid, unassigned sequences.
        assert table.valid.nonzero().flatten().tolist() == list(range(2, 12))

    def test_stale_update_is_ignored(self, seed):
        rb, sampler = make(12, 3, torch.zeros(12))
        starts, index, _ = sample_starts(sampler, rb, 4)
        extend(rb, torch.zeros(12))  # everything rewritten since the draw
        sampler.update_priority(index, torch.full((12,), 5.0))
        assert not sampler.priorities(rb.storage).assigned.any()
        starts, index, _ = sample_starts(sampler, rb, 4)  # a fresh draw is accepted
        sampler.update_priority(index, torch.full((12,), 5.0))
        assigned = sampler.priorities(rb.storage).assigned.nonzero().flatten()
        assert assigned.tolist() == sorted(set(starts.tolist()))

    def test_unsampled_start_is_not_assigned(self, seed):
        rb, sampler = make(12, 3, torch.zeros(12))
        assign(sampler, rb, [4], [1.0])
        assert not sampler.priorities(rb.storage).assigned.any()

    def test_empty_resets(self, seed):
        rb, sampler = make(12, 3, torch.zeros(12))
        sample_everything(sampler, rb)
        assign(sampler, rb, [4], [1.0])
        rb.empty()
        assert not sampler._assigned.any() and not sampler._valid.any()
        extend(rb, torch.zeros(5))
        assert sampler.priorities(rb.storage).valid.sum() == 3


class TestSamplingDistribution:
    def test_empirical_frequencies_match_probabilities(self, seed):
        rb, sampler = make(20, 1, torch.zeros(20), uniform_probability=0.1)
        sample_everything(sampler, rb)
        assign(sampler, rb, [2, 15], [1.0, 4.0])
        p = sampler.priorities(rb.storage).probability
        n = 5000
        starts, _, _ = sample_starts(sampler, rb, n)
        counts = torch.bincount(starts, minlength=20).double()
        std = (n * p * (1 - p)).sqrt()
        assert ((counts - n * p).abs() < 5 * std).all(), (counts, n * p)

    def test_alpha_zero_is_uniform_and_alpha_two_squares(self, seed):
        rb, sampler = make(20, 1, torch.zeros(20), uniform_probability=0.0, alpha=2.0)
        sample_everything(sampler, rb)
        assign(sampler, rb, [2, 15], [1.0, 4.0])
        p = sampler.priorities(rb.storage)
        torch.testing.assert_close(p.probability, p.priority**2 / (p.priority**2).sum())
        sampler.alpha = 0.0
        torch.testing.assert_close(
            sampler.priorities(rb.storage).probability, torch.full((20,), 0.05).double()
        )

    def test_importance_weights_by_hand(self, seed):
        # Two-assigned case: P(t) = 0.005 + 0.9·p̃_t/44, P_min = 0.005 + 0.9/44 (p̃ = 1).
        # w_t = (P(t)/P_min)^−β with β = 0.5, e.g. t = 15: (0.005 + 0.9·4/44)/(0.005 + 0.9/44)
        # = 0.0868182/0.0254545 = 3.4107, w = 3.4107^−½ = 0.54147.
        rb, sampler = make(20, 1, torch.zeros(20), uniform_probability=0.1, beta=0.5)
        sample_everything(sampler, rb)
        assign(sampler, rb, [2, 15], [1.0, 4.0])
        starts, _, info = sample_starts(sampler, rb, 2000)
        p_tilde = torch.tensor([1.0] * 3 + [1.75] * 12 + [4.0] * 5).double()
        prob = 0.005 + 0.9 * p_tilde / 44
        expected = (prob / (0.005 + 0.9 / 44)) ** -0.5
        torch.testing.assert_close(info["priority_weight"], expected[starts].float())
        assert info["priority_weight"][starts == 15][0].item() == pytest.approx(0.54147, 1e-4)
        assert info["priority_weight"].max() <= 1.0


class TestReplayBufferIntegration:
    def test_tensordict_replay_buffer_end_to_end(self, seed):
        L, B = 5, 8
        rb, sampler = make(64, L, td=True)
        rb.extend(TensorDict({TRAJ: torch.arange(40) // 10, "x": torch.arange(40)}, [40]))
        for flat in (False, True):
            sample = rb.sample(B * L)
            assert sample.shape == (B * L,)
            seq = sample.reshape(-1, L)
            index = seq["index"]
            assert ((index - index[:, :1]) == torch.arange(L)).all()
            assert (seq[TRAJ] == seq[TRAJ][:, :1]).all()
            assert torch.equal(seq["x"], index)
            assert torch.equal(seq["sequence_start"], index[:, :1].expand(B, L))
            prio = torch.arange(1.0, B + 1).unsqueeze(-1).expand(B, L)
            if flat:  # per-step flat sample: the sampler takes the max over each sequence
                sample.set("td_error", prio.reshape(-1))
                rb.update_tensordict_priority(sample)
            else:  # [B, L] sample: TorchRL reduces to [B] and passes the starts
                seq.set("td_error", prio)
                rb.update_tensordict_priority(seq)
            table = sampler.priorities(rb.storage)
            starts = index[:, 0]
            for s, p in zip(starts.tolist(), range(1, B + 1), strict=True):
                assert table.assigned[s]
                assert table.priority[s] >= p  # duplicates keep the max
        rb2 = TensorDictReplayBuffer(
            storage=LazyTensorStorage(64),
            sampler=PrioritizedSequenceSampler(64, L, traj_key=TRAJ),
            batch_size=B * L,
        )
        rb2.load_state_dict(rb.state_dict())
        torch.testing.assert_close(
            rb2.sampler.priorities(rb2.storage).probability, table.probability
        )

    def test_memmap_storage(self, tmp_path, seed):
        sampler = PrioritizedSequenceSampler(40, 4, traj_key=TRAJ)
        rb = ReplayBuffer(storage=LazyMemmapStorage(40, scratch_dir=tmp_path), sampler=sampler)
        extend(rb, torch.arange(40) // 10)
        data, info = rb.sample(32, return_info=True)
        seq = data.reshape(-1, 4)
        assert (seq[TRAJ] == seq[TRAJ][:, :1]).all()
        rb.update_priority(info["index"], torch.ones(32))
        assert sampler.priorities(rb.storage).assigned.sum() >= 1

    def test_replay_buffer_update_priority_per_step_2d(self, seed):
        rb, sampler = make(40, 4, torch.zeros(40))
        _, info = rb.sample(16, return_info=True)
        index = info["index"].reshape(-1, 4)
        rb.update_priority(index, torch.full((4, 4), 2.0))
        assigned = sampler.priorities(rb.storage).assigned.nonzero().flatten()
        assert assigned.tolist() == sorted(set(index[:, 0].tolist()))


class TestStateDict:
    def test_round_trip(self, seed):
        rb, sampler = make(30, 3, torch.arange(30) // 10)
        _, index, _ = sample_starts(sampler, rb, 10)
        sampler.update_priority(index, torch.rand(30))
        extend(rb, torch.full((4,), 7))  # pending writes carried over too
        state = sampler.state_dict()
        other = PrioritizedSequenceSampler(30, 3, traj_key=TRAJ)
        other.load_state_dict(state)
        a, b = sampler.priorities(rb.storage), other.priorities(rb.storage)
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(x, y)
        torch.manual_seed(3)
        first = sampler.sample(rb.storage, 30)
        torch.manual_seed(3)
        second = other.sample(rb.storage, 30)
        assert torch.equal(first[0], second[0])
        torch.testing.assert_close(first[1]["priority_weight"], second[1]["priority_weight"])

    def test_dumps_loads(self, tmp_path, seed):
        rb, sampler = make(30, 3, torch.zeros(30))
        _, index, _ = sample_starts(sampler, rb, 10)
        sampler.update_priority(index, torch.rand(30))
        sampler.dumps(tmp_path)
        other = PrioritizedSequenceSampler(30, 3, traj_key=TRAJ)
        other.loads(tmp_path)
        torch.testing.assert_close(
            other.priorities(rb.storage).priority, sampler.priorities(rb.storage).priority
        )

    def test_loads_refuses_a_state_that_would_run_code(self, tmp_path):
        marker = tmp_path / "written-by-unpickling"

        class WritesAFile:
            def __reduce__(self):
                return (Path.touch, (marker,))

        torch.save({"config": WritesAFile()}, tmp_path / "sampler_state.pt")
        with pytest.raises(pickle.UnpicklingError, match="GLOBAL"):
            PrioritizedSequenceSampler(30, 3, traj_key=TRAJ).loads(tmp_path)
        assert not marker.exists()

    def test_mismatched_config_raises(self):
        state = PrioritizedSequenceSampler(30, 3).state_dict()
        with pytest.raises(ValueError, match="sequence_length=3"):
            PrioritizedSequenceSampler(30, 4).load_state_dict(state)


class TestBadInput:
    def test_batch_size_not_multiple_of_length(self, seed):
        rb, sampler = make(30, 4, torch.zeros(30))
        with pytest.raises(ValueError, match="multiple of sequence_length=4, got 10"):
            sampler.sample(rb.storage, 10)

    @pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
    def test_bad_priority_values(self, bad, seed):
        rb, sampler = make(30, 3, torch.zeros(30))
        _, index, _ = sample_starts(sampler, rb, 2)
        prio = torch.ones(6)
        prio[2] = bad
        with pytest.raises(ValueError, match="priority must be finite and >= 0"):
            sampler.update_priority(index, prio)

    def test_bad_shapes(self, seed):
        rb, sampler = make(30, 3, torch.zeros(30))
        _, index, _ = sample_starts(sampler, rb, 2)
        with pytest.raises(ValueError, match=r"priority must have shape \(2, 3\) or \[2\].*\(5,\)"):
            sampler.update_priority(index.reshape(2, 3), torch.ones(5))
        with pytest.raises(ValueError, match=r"index must have shape \[B, L=3\].*\(2, 4\)"):
            sampler.update_priority(torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 4))
        with pytest.raises(ValueError, match=r"shape of index \(4,\).*\(3,\)"):
            sampler.update_priority(torch.tensor([0, 5, 9, 2]), torch.ones(3))
        with pytest.raises(ValueError, match=r"index entries must lie in \[0, 30\)"):
            sampler.update_priority(torch.tensor([30]), torch.ones(1))

    def test_bad_constructor_arguments(self):
        with pytest.raises(ValueError, match="sequence_length must be a positive integer"):
            PrioritizedSequenceSampler(10, 0)
        with pytest.raises(ValueError, match="exceeds max_capacity"):
            PrioritizedSequenceSampler(10, 11)
        with pytest.raises(ValueError, match="uniform_probability"):
            PrioritizedSequenceSampler(10, 2, uniform_probability=1.5)

    def test_storage_mismatch(self, seed):
        rb, _ = make(30, 3, torch.zeros(30))
        other = PrioritizedSequenceSampler(40, 3, traj_key=TRAJ)
        with pytest.raises(ValueError, match=r"storage.max_size \(30\) != max_capacity \(40\)"):
            other.sample(rb.storage, 3)
