"""Reactor's prioritized sequence replay with lazy initialisation, as a TorchRL ``Sampler``.

Gruslys et al., 2018, "The Reactor", arXiv:1704.04651, §3.3 (prioritized sequence replay;
equation numbers unverified). The storage holds flat steps (1-D ``LazyTensorStorage`` or
``LazyMemmapStorage``) written round-robin; the candidates are *all* windows of L consecutive
steps, one per start slot t. A start has a priority only once its sequence has been trained on
(lazy initialisation); the others get an estimate from their assigned neighbours:

    cells     I_k = [a_k, a_{k+1})  for the assigned starts a_1 < … < a_m (storage order),
              except I_1 = [0, a_2) and I_m = [a_m, C), C the capacity; w_k = |I_k|
    estimate  p̂_t = (w_k p_k + w_{k+1} p_{k+1}) / (w_k + w_{k+1})   for a_k < t < a_{k+1}
              p̂_t = p_1 for t < a_1,   p̂_t = p_m for t > a_m

(the cells containing and adjacent to t are those of the nearest assigned start on each side).
Starts are drawn with

    P(t) = ε / V + (1 − ε) · p̃_t^α / Σ_s p̃_s^α       over the V valid starts,

p̃ = p for assigned starts and p̂ otherwise; with nothing assigned, P(t) = 1 / V.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple

import torch
from tensordict import NestedKey
from torch import Tensor
from torchrl.data.replay_buffers.samplers import PrioritizedSampler
from torchrl.data.replay_buffers.storages import Storage

__all__ = ["PrioritizedSequenceSampler", "SequencePriorities"]

_NONE = -1


class SequencePriorities(NamedTuple):
    """Per-start view of a :class:`PrioritizedSequenceSampler` (one entry per storage slot).

    Reference: Gruslys et al., 2018, arXiv:1704.04651, §3.3.

    Args:
        priority: p̃_t, the assigned priority or the neighbour estimate p̂_t (0 when nothing is
            assigned). Shape [C], float64.
        assigned: whether start t has a priority of its own. Shape [C], bool.
        valid: whether the L steps from t form one trajectory behind the write head.
            Shape [C], bool.
        probability: P(t), the probability of drawing start t in one draw. Shape [C], float64.

    Returns:
        A named tuple; built by :meth:`PrioritizedSequenceSampler.priorities`.

    Example:
        >>> table = SequencePriorities(*(torch.zeros(2) for _ in range(4)))
        >>> table.priority.shape
        torch.Size([2])
    """

    priority: Tensor
    assigned: Tensor
    valid: Tensor
    probability: Tensor


class PrioritizedSequenceSampler(PrioritizedSampler):
    """Sample fixed-length sequences with Reactor's lazily initialised priorities.

    Math (Gruslys et al., 2018, arXiv:1704.04651, §3.3; cells and weights as in the module
    docstring): a start t is *valid* when its L slots t, t+1, …, t+L−1 (mod C) hold L
    consecutively written steps (so the window never crosses the write head, including after
    wrap-around) with one trajectory id under ``traj_key`` (the window may contain an episode
    end when ids group by collector row, as Retrace handles ``done`` inside a window), or, when
    the storage has no ``traj_key``, no ``end_key`` flag before its last step. One draw picks
    a start with

        P(t) = ε / V + (1 − ε) · p̃_t^α / Σ_s p̃_s^α,

    and its importance weight is w_t = (V · P(t))^−β / max_s (V · P(s))^−β = (P(t) / P_min)^−β,
    with P_min the smallest positive probability over the valid starts.

    Args:
        max_capacity: C, the storage capacity in steps (``storage.max_size``).
        sequence_length: L, steps per sequence.
        alpha: α, the priority exponent (0: uniform, 1: proportional). Default 1.
        beta: β, the importance-weight exponent. Default 0.4, the starting value of Schaul
            et al., 2016, arXiv:1511.05952, §3.4, for a general sampler; Reactor uses β = 1
            (Gruslys et al., 2018, arXiv:1704.04651v2, appendix; ``ReactorConfig``'s
            ``importance_exponent``).
        uniform_probability: ε, the probability that a draw is uniform over the valid starts.
            Default 0.1 (our choice; the paper's value is unverified).
        traj_key: per-step trajectory id in the stored data; a window never spans two ids.
        end_key: per-step end flag used when the data has no ``traj_key``.
        block_size: slots per block of the two-level sampling table. Default: the power of
            two nearest above √C, within [64, 4096] (1024 at C = 10^6).

    Returns:
        A TorchRL ``Sampler`` for a 1-D storage. :meth:`sample` returns per-step storage
        indices, shape [B·L] (reshape the sample to [B, L]), and ``info`` with
        ``"priority_weight"`` (w, float32) and ``"sequence_start"`` (t), both shape [B·L]
        (constant along each sequence).

    Notes:
        * Priorities live on the start slot. :meth:`update_priority` takes the sample's
          per-step indices ([B, L] or flat [B·L], reduced to one priority per sequence by a
          max, the same reduction ``TensorDictReplayBuffer.update_tensordict_priority`` applies
          to a [B, L] sample) or starts [B] with priorities [B]. A flat index is read as
          per-step when its length is a multiple of L and every group of L entries is L
          consecutive slots, which holds for everything :meth:`sample` returns.
        * Stale updates: the sampler stamps every slot with its write number (a per-slot write
          generation). An update for start t is applied only if the sequence now at t was
          sampled after it was written; writes over any of its slots reset that, so a late
          update for overwritten data is ignored. If the new data at t is itself sampled
          before the late update arrives, the two cannot be told apart.
        * Writes must go through ``ReplayBuffer.extend``/``add`` (which call the sampler's
          hooks); ``rb[i] = x`` bypasses them. The estimate uses storage order 0…C−1 as the
          timeline, so cells may span the write head (only the estimate is affected).
        * Every write unassigns the starts whose window covers a written slot.

    Example:
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
        >>> sampler = PrioritizedSequenceSampler(64, 4, traj_key="traj")
        >>> rb = TensorDictReplayBuffer(
        ...     storage=LazyTensorStorage(64), sampler=sampler, batch_size=8
        ... )
        >>> _ = rb.extend(TensorDict({"traj": torch.arange(32) // 16}, [32]))
        >>> sample = rb.sample().reshape(-1, 4)
        >>> sample["traj"].shape
        torch.Size([2, 4])
        >>> bool((sample["traj"] == sample["traj"][:, :1]).all())
        True
        >>> _ = sample.set("td_error", torch.ones(2, 4))
        >>> rb.update_tensordict_priority(sample)
        >>> bool(sampler.priorities(rb.storage).assigned.any())
        True
    """

    def __init__(
        self,
        max_capacity: int,
        sequence_length: int,
        *,
        alpha: float = 1.0,
        beta: float = 0.4,
        uniform_probability: float = 0.1,
        traj_key: NestedKey = ("collector", "traj_ids"),
        end_key: NestedKey = ("next", "done"),
        block_size: int | None = None,
    ) -> None:
        # PrioritizedSampler.__init__ builds TorchRL's C++ sum tree, which does not load with
        # torch 2.13; we subclass it only so that TensorDictReplayBuffer
        # forwards priorities (update_tensordict_priority checks isinstance).
        if block_size is None:  # ≈ √C: both sampling levels cost O(√C) per draw
            block_size = min(max(64, 1 << math.ceil(math.log2(math.sqrt(max_capacity)))), 4096)
        for name, value in (
            ("max_capacity", max_capacity),
            ("sequence_length", sequence_length),
            ("block_size", block_size),
        ):
            if int(value) != value or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if sequence_length > max_capacity:
            raise ValueError(
                f"sequence_length ({sequence_length}) exceeds max_capacity ({max_capacity})"
            )
        if not 0.0 <= uniform_probability <= 1.0:
            raise ValueError(f"uniform_probability must be in [0, 1], got {uniform_probability}")
        if alpha < 0 or beta < 0:
            raise ValueError(f"alpha and beta must be >= 0, got alpha={alpha}, beta={beta}")
        self._max_capacity = int(max_capacity)
        self.sequence_length = int(sequence_length)
        self._alpha = float(alpha)
        self._beta = float(beta)
        self.uniform_probability = float(uniform_probability)
        self.traj_key = traj_key
        self.end_key = end_key
        self.block_size = int(block_size)
        self.reduction = "max"  # read by TensorDictReplayBuffer for trailing priority dims
        self.dtype = torch.float64
        self._empty()

    # ------------------------------------------------------------------ bookkeeping

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(max_capacity={self._max_capacity}, "
            f"sequence_length={self.sequence_length}, alpha={self._alpha}, beta={self._beta}, "
            f"uniform_probability={self.uniform_probability})"
        )

    @property
    def max_size(self) -> int:
        """C, the capacity in steps."""
        return self._max_capacity

    @property
    def device(self) -> torch.device:
        """The sampler keeps its tables on the CPU."""
        return torch.device("cpu")

    @property
    def alpha(self) -> float:
        """α, the priority exponent; setting it recomputes every mass (O(C))."""
        return self._alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        if value < 0:
            raise ValueError(f"alpha must be >= 0, got {value}")
        self._alpha = float(value)
        self._full_refresh = True

    @property
    def beta(self) -> float:
        """β, the importance-weight exponent."""
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        if value < 0:
            raise ValueError(f"beta must be >= 0, got {value}")
        self._beta = float(value)

    @property
    def default_priority(self) -> float:
        """Priority TorchRL uses when a sample carries none (1)."""
        return 1.0

    def _empty(self) -> None:
        capacity, bs = self._max_capacity, self.block_size
        self._num_blocks = -(-capacity // bs)
        padded = self._num_blocks * bs
        long = dict(dtype=torch.long)
        self._stamp = torch.full((capacity,), _NONE, **long)  # write number held by each slot
        self._sampled_stamp = torch.full((capacity,), _NONE, **long)
        self._traj = torch.zeros(capacity, **long)
        self._end = torch.zeros(capacity, dtype=torch.bool)
        self._valid = torch.zeros(padded, dtype=torch.bool)
        self._assigned = torch.zeros(padded, dtype=torch.bool)
        self._priority = torch.zeros(padded, dtype=torch.float64)
        self._estimate = torch.zeros(padded, dtype=torch.float64)
        self._mass = torch.zeros(padded, dtype=torch.float64)  # valid · p̃^α
        nb = self._num_blocks
        self._block_assigned = torch.zeros(nb, **long)
        self._block_valid = torch.zeros(nb, **long)
        self._block_mass = torch.zeros(nb, dtype=torch.float64)
        self._block_min = torch.full((nb,), float("inf"), dtype=torch.float64)
        self._block_min_positive = torch.full((nb,), float("inf"), dtype=torch.float64)
        self._index_blocks()
        self._write_count = 0
        self._mode: str | None = None  # "traj" or "end", fixed by the first read
        self._pending_writes: list[Tensor] = []
        self._pending_starts: list[Tensor] = []
        self._pending_assign: list[Tensor] = []
        self._full_refresh = False

    # ------------------------------------------------------------------ writer hooks

    def add(self, index: int | Tensor) -> None:
        """Writer hook: one slot was written."""
        self.extend(torch.as_tensor(index).reshape(1))

    def extend(self, index: Tensor | tuple) -> None:
        """Writer hook: slots ``index`` (shape [n], in write order) were written."""
        if isinstance(index, tuple):
            raise ValueError("PrioritizedSequenceSampler needs a 1-D storage (got a tuple index)")
        slots = torch.as_tensor(index, dtype=torch.long).reshape(-1)
        if slots.numel() == 0:
            return
        n = slots.numel()
        self._stamp[slots] = self._write_count + torch.arange(n)
        self._write_count += n
        self._invalidate(slots)

    def mark_update(self, index: int | Tensor, *, storage: Storage | None = None) -> None:
        """Slots ``index`` changed in place: unassign the starts whose window covers them."""
        # Data changed in place: same write order, new content.
        self._invalidate(torch.as_tensor(index, dtype=torch.long).reshape(-1))

    def _invalidate(self, slots: Tensor) -> None:
        """Drop the priorities of every start whose window covers ``slots`` (shape [n])."""
        L, capacity = self.sequence_length, self._max_capacity
        self._pending_writes.append(slots)
        if slots.numel() >= capacity:
            starts = torch.arange(capacity)
        else:
            starts = ((slots[:, None] - torch.arange(L)) % capacity).reshape(-1).unique()
        was_assigned = starts[self._assigned[starts]]
        self._assigned[starts] = False
        self._priority[starts] = 0.0
        self._sampled_stamp[starts] = _NONE
        self._pending_starts.append(starts)
        if was_assigned.numel():
            self._pending_assign.append(was_assigned)

    # ------------------------------------------------------------------ refresh

    def _read_keys(self, storage: Storage, slots: Tensor) -> None:
        """Cache the trajectory ids (or end flags) of the written ``slots`` [n]."""
        data = storage[:]
        if self._mode is None:
            if data.get(self.traj_key, None) is not None:
                self._mode = "traj"
            elif data.get(self.end_key, None) is not None:
                self._mode = "end"
            else:
                raise ValueError(
                    f"the stored data has neither traj_key={self.traj_key!r} nor "
                    f"end_key={self.end_key!r}; keys: {list(data.keys(True, True))}"
                )
        key = self.traj_key if self._mode == "traj" else self.end_key
        values = data.get(key)[slots].reshape(slots.numel(), -1)[:, 0]  # [n]
        if self._mode == "traj":
            self._traj[slots] = values.long()
        else:
            self._end[slots] = values.bool()

    def _refresh(self, storage: Storage) -> None:
        """Bring validity, estimates, masses and block sums up to date (vectorised)."""
        if getattr(storage, "ndim", 1) != 1:
            raise ValueError(f"storage must be 1-D (flat steps), got ndim={storage.ndim}")
        if storage.max_size != self._max_capacity:
            raise ValueError(
                f"storage.max_size ({storage.max_size}) != max_capacity ({self._max_capacity})"
            )
        touched: list[Tensor] = []
        if self._pending_writes:
            slots = torch.cat(self._pending_writes).unique()
            self._pending_writes = []
            if slots.numel():
                self._read_keys(storage, slots)
        revalidated = None
        if self._pending_starts:
            revalidated = torch.cat(self._pending_starts).unique()
            self._pending_starts = []
            self._valid[revalidated] = self._check_windows(revalidated)
            touched.append(revalidated // self.block_size)
        bs, nb = self.block_size, self._num_blocks
        if self._full_refresh:
            self._block_assigned = self._assigned.view(nb, bs).sum(1)
            self._index_blocks()
            whole = torch.tensor([0, self._max_capacity - 1, -1, self._max_capacity])
            touched.append(self._estimate_segments(*whole.view(4, 1)))
            self._pending_assign = []
            self._full_refresh = False
        elif self._pending_assign:
            changed = torch.cat(self._pending_assign).unique()
            self._pending_assign = []
            blocks = (changed // bs).unique()
            self._block_assigned[blocks] = self._assigned.view(nb, bs)[blocks].sum(1)
            self._index_blocks()
            touched.append(self._estimate_segments(*self._affected_segments(changed)))
        if revalidated is not None:  # estimates unchanged there; validity may have changed
            self._mass[revalidated] = self._masses(revalidated)
        if touched:
            self._update_blocks(torch.cat(touched).unique())

    def _check_windows(self, starts: Tensor) -> Tensor:
        """Validity of the windows starting at ``starts`` (shape [K]) → bool [K]."""
        L, capacity = self.sequence_length, self._max_capacity
        offsets = torch.arange(L)
        window = (starts[:, None] + offsets) % capacity  # [K, L]
        stamp = self._stamp[window]  # [K, L]
        # L consecutively written steps: no write head and no stale slot inside the window.
        ok = (stamp[:, :1] >= 0) & (stamp == stamp[:, :1] + offsets).all(1, keepdim=True)
        if self._mode == "traj":
            ok &= (self._traj[window] == self._traj[window[:, :1]]).all(1, keepdim=True)
        elif self._mode == "end":
            ok &= ~self._end[window[:, :-1]].any(1, keepdim=True)
        return ok[:, 0]

    def _masses(self, positions: Tensor) -> Tensor:
        p = self._estimate[positions]
        return torch.where(self._valid[positions], p.pow(self._alpha), 0.0)

    def _update_blocks(self, blocks: Tensor) -> None:
        bs, nb = self.block_size, self._num_blocks
        mass = self._mass.view(nb, bs)[blocks]  # [k, bs]
        valid = self._valid.view(nb, bs)[blocks]
        inf = torch.tensor(float("inf"), dtype=torch.float64)
        self._block_mass[blocks] = mass.sum(1)
        self._block_valid[blocks] = valid.sum(1)
        self._block_min[blocks] = torch.where(valid, mass, inf).amin(1)
        self._block_min_positive[blocks] = torch.where(valid & (mass > 0), mass, inf).amin(1)

    def _index_blocks(self) -> None:
        """Cache the number of assigned starts before each block and up to its end."""
        self._assigned_through = self._block_assigned.cumsum(0)  # [nb]
        self._assigned_before = self._assigned_through - self._block_assigned  # [nb]

    def _rank(self, x: Tensor) -> Tensor:
        """Number of assigned starts < x for each entry of ``x`` [K] → [K]."""
        bs, nb = self.block_size, self._num_blocks
        blk, off = x // bs, x % bs
        row = self._assigned.view(nb, bs)[blk]  # [K, bs]
        return self._assigned_before[blk] + (row & (torch.arange(bs) < off[:, None])).sum(1)

    def _select(self, rank: Tensor) -> Tensor:
        """Position of the assigned start of each ``rank`` [K] (0-based); −1 or C outside."""
        bs, nb = self.block_size, self._num_blocks
        total = int(self._assigned_through[-1])
        r = rank.clamp(0, max(total - 1, 0))
        blk = torch.searchsorted(self._assigned_through, r, right=True).clamp_max(nb - 1)
        k = r - self._assigned_before[blk]  # k-th assigned start inside the block
        row = self._assigned.view(nb, bs)[blk].cumsum(1)  # [K, bs]
        pos = blk * bs + (row <= k[:, None]).sum(1)
        return torch.where(rank < 0, -1, torch.where(rank >= total, self._max_capacity, pos))

    def _affected_segments(self, changed: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Merged slot ranges whose estimate depends on the ``changed`` starts (sorted [K]).

        p̂ on the gap (a_k, a_{k+1}) depends on a_k, a_{k+1}, a_{k+2}, their priorities and
        whether a_k is the first assigned start, so a change at x reaches from the second
        assigned start left of x to the second one right of it. Returns the segments' first
        and last slots and the nearest assigned starts outside them (−1 / C where none),
        each shape [S].
        """
        K, last = changed.numel(), self._max_capacity - 1
        rank = self._rank(changed)
        after = rank + self._assigned[changed].long()  # rank of the first assigned start > x
        offsets = torch.tensor([-1, -2, -3, 0, 1, 2])
        around = self._select((torch.stack([rank] * 3 + [after] * 3) + offsets[:, None]).view(-1))
        p1, p2, p3, n1, n2, n3 = around.view(6, K)
        lo = torch.where(p1 >= 0, p2, 0).clamp_min(0)
        hi = torch.where(n1 <= last, n2, last).clamp_max(last)
        running_hi = hi.cummax(0).values
        new = torch.ones_like(lo, dtype=torch.bool)
        new[1:] = lo[1:] > running_hi[:-1]
        end = torch.ones_like(new)
        end[:-1] = new[1:]
        # The first x of a segment has its smallest lo, the last its largest hi.
        outer_prev = torch.where(p1 >= 0, p3, -1)[new]
        outer_next = torch.where(n1 <= last, n3, self._max_capacity)[end]
        return lo[new], running_hi[end], outer_prev, outer_next

    def _estimate_segments(
        self, seg_lo: Tensor, seg_hi: Tensor, outer_prev: Tensor, outer_next: Tensor
    ) -> Tensor:
        """Recompute p̃ and the masses on slots [seg_lo, seg_hi] (inclusive, sorted, disjoint).

        Each segment starts at an assigned start or at slot 0 and ends at an assigned start
        or at slot C − 1 (:meth:`_affected_segments`). p̂ is constant on each gap between
        assigned starts, so it is computed once per gap and expanded by run lengths. Returns
        the blocks the segments cover, shape [k].
        """
        bs = self.block_size
        lengths = seg_hi - seg_lo + 1  # [S]
        total = int(lengths.sum())
        shift = torch.repeat_interleave(seg_lo - (lengths.cumsum(0) - lengths), lengths)
        pos = torch.arange(total) + shift  # [R] slot positions, segment after segment
        a = pos[self._assigned[pos]]  # [m] assigned starts inside the segments, sorted
        if a.numel() == 0:  # nothing assigned anywhere: no estimate (uniform sampling)
            estimate = torch.zeros(total, dtype=torch.float64)
        else:
            seg = torch.searchsorted(seg_lo, a, right=True) - 1  # [m]
            same_next = torch.zeros_like(a, dtype=torch.bool)
            same_next[:-1] = seg[1:] == seg[:-1]
            same_prev = torch.zeros_like(same_next)
            same_prev[1:] = same_next[:-1]
            after = torch.roll(a, -1)
            nxt = torch.where(same_next, after, outer_next[seg])  # a_{k+1}
            prv = torch.where(same_prev, torch.roll(a, 1), outer_prev[seg])
            # Cell I_k = [a_k, a_{k+1}), or [0, a_2) for the first assigned start; C as the end.
            w = (nxt - torch.where(prv >= 0, a, 0)).double()  # |I_k|
            p = self._priority[a]
            w_next, p_next = torch.roll(w, -1), torch.roll(p, -1)
            # p̂ on (a_k, a_{k+1}) = (w_k p_k + w_{k+1} p_{k+1}) / (w_k + w_{k+1}); after the
            # last assigned start (no a_{k+1} inside the segment) it is p_k.
            gap_value = torch.where(same_next, (w * p + w_next * p_next) / (w + w_next), p)
            gap_end = torch.where(same_next, after, seg_hi[seg] + 1)
            first = ~same_prev
            head = torch.where(first, a - seg_lo[seg], 0)  # slots before a_1 (segment at 0)
            values = torch.stack([torch.where(first, p, 0.0), p, gap_value], 1).reshape(-1)
            runs = torch.stack([head, torch.ones_like(a), gap_end - a - 1], 1).reshape(-1)
            estimate = torch.repeat_interleave(values, runs)  # [R]
        self._estimate[pos] = estimate
        mass = estimate if self._alpha == 1.0 else estimate.pow(self._alpha)
        self._mass[pos] = torch.where(self._valid[pos], mass, 0.0)
        first_block, last_block = seg_lo // bs, seg_hi // bs
        count = last_block - first_block + 1
        blocks = torch.arange(int(count.sum())) + torch.repeat_interleave(
            first_block - (count.cumsum(0) - count), count
        )
        return blocks

    # ------------------------------------------------------------------ sampling

    def _totals(self) -> tuple[int, float, bool]:
        valid = int(self._block_valid.sum())
        mass = float(self._block_mass.sum())
        prioritized = bool(self._block_assigned.sum() > 0) and mass > 0
        return valid, mass, prioritized

    def _probability(self, starts: Tensor, valid: int, mass: float, prioritized: bool) -> Tensor:
        if not prioritized:
            return self._valid[starts].double() / valid
        eps = self.uniform_probability
        return eps * self._valid[starts].double() / valid + (1 - eps) * self._mass[starts] / mass

    def _sampleable_count(self, storage: Storage, batch_size: int) -> int:
        self._refresh(storage)
        return int(self._block_valid.sum())

    def sample(self, storage: Storage, batch_size: int) -> tuple[Tensor, dict]:
        """Draw ``batch_size // L`` sequences; see the class docstring.

        Args:
            storage: the replay buffer's 1-D storage.
            batch_size: B·L, a multiple of L.

        Returns:
            ``index`` (per-step storage indices, shape [B·L]) and ``info`` with
            ``"priority_weight"`` and ``"sequence_start"``, both shape [B·L].
        """
        L = self.sequence_length
        if batch_size % L:
            raise ValueError(
                f"batch_size must be a multiple of sequence_length={L}, got {batch_size}"
            )
        self._refresh(storage)
        valid, mass, prioritized = self._totals()
        if valid == 0:
            raise RuntimeError(f"no complete sequence of {L} steps in the storage yet")
        B, bs, nb = batch_size // L, self.block_size, self._num_blocks
        rng = self._rng
        uniform = torch.rand(B, generator=rng, dtype=torch.float64) < self.uniform_probability
        if not prioritized:
            uniform[:] = True
        block_w = torch.where(uniform[:, None], self._block_valid.double(), self._block_mass)
        blk = self._draw(block_w, rng)  # [B]
        rows_w = torch.where(
            uniform[:, None], self._valid.view(nb, bs)[blk].double(), self._mass.view(nb, bs)[blk]
        )
        starts = blk * bs + self._draw(rows_w, rng)  # [B]
        self._sampled_stamp[starts] = self._stamp[starts]
        weight = self._weights(starts, valid, mass, prioritized)
        index = ((starts[:, None] + torch.arange(L)) % self._max_capacity).reshape(-1)
        info = {
            "priority_weight": weight.float().repeat_interleave(L),
            "sequence_start": starts.repeat_interleave(L),
        }
        return index, info

    @staticmethod
    def _draw(weights: Tensor, rng: torch.Generator | None) -> Tensor:
        """One index per row of ``weights`` [B, n] (≥ 0, positive row sums), ∝ weight."""
        cum = weights.cumsum(1)
        u = torch.rand(weights.shape[0], 1, generator=rng, dtype=torch.float64) * cum[:, -1:]
        pick = torch.searchsorted(cum, u, right=True).clamp_max(weights.shape[1] - 1)
        # Guard against rounding at the top of the row: step back to a positive weight.
        cols = torch.arange(weights.shape[1])
        fallback = torch.where((weights > 0) & (cols <= pick), cols, -1).amax(1, keepdim=True)
        ok = weights.gather(1, pick) > 0
        return torch.where(ok, pick, fallback)[:, 0]

    def _weights(self, starts: Tensor, valid: int, mass: float, prioritized: bool) -> Tensor:
        if not prioritized or self._beta == 0:
            return torch.ones(starts.shape, dtype=torch.float64)
        eps = self.uniform_probability
        if eps > 0:
            p_min = eps / valid + (1 - eps) * float(self._block_min.min()) / mass
        else:
            p_min = float(self._block_min_positive.min()) / mass
        prob = self._probability(starts, valid, mass, prioritized)
        # w = (V·P(t))^−β / max_s (V·P(s))^−β = (P(t) / P_min)^−β
        return (prob / p_min).pow(-self._beta)

    def priorities(self, storage: Storage) -> SequencePriorities:
        """Per-start priorities, assignment, validity and draw probabilities (O(C)).

        Reference: Gruslys et al., 2018, arXiv:1704.04651, §3.3.

        Args:
            storage: the replay buffer's 1-D storage (``rb.storage``).

        Returns:
            :class:`SequencePriorities`, each field of shape [C].

        Example:
            >>> from tensordict import TensorDict
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
            >>> sampler = PrioritizedSequenceSampler(8, 2, traj_key="traj")
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(8), sampler=sampler)
            >>> _ = rb.extend(TensorDict({"traj": torch.zeros(8)}, [8]))
            >>> sampler.priorities(rb.storage).probability  # 7 valid starts, uniform
            tensor([0.1429, 0.1429, 0.1429, 0.1429, 0.1429, 0.1429, 0.1429, 0.0000],
                   dtype=torch.float64)
        """
        self._refresh(storage)
        capacity = self._max_capacity
        positions = torch.arange(capacity)
        valid, mass, prioritized = self._totals()
        prob = (
            self._probability(positions, valid, mass, prioritized)
            if valid
            else torch.zeros(capacity, dtype=torch.float64)
        )
        return SequencePriorities(
            priority=self._estimate[:capacity].clone(),
            assigned=self._assigned[:capacity].clone(),
            valid=self._valid[:capacity].clone(),
            probability=prob,
        )

    # ------------------------------------------------------------------ priorities

    @torch.no_grad()
    def update_priority(
        self,
        index: int | Tensor,
        priority: float | Tensor,
        *,
        storage: Storage | None = None,
    ) -> None:
        """Assign sequence priorities (lazy initialisation: only sampled sequences take them).

        Reference: Gruslys et al., 2018, arXiv:1704.04651, §3.3.

        Args:
            index: the sample's per-step indices, shape [B, L] or [B·L], or starts, shape [B].
            priority: shape of ``index`` (per step; max over each sequence), [B] or [B, 1]
                with a [B, L] index, or a scalar. Finite and ≥ 0.
            storage: unused (TorchRL passes it).

        Returns:
            None. Updates for starts not sampled since their last write are ignored.
        """
        L, capacity = self.sequence_length, self._max_capacity
        index = torch.as_tensor(index, dtype=torch.long)
        priority = torch.as_tensor(priority, dtype=torch.float64).detach().cpu()
        index = index.cpu()
        if index.ndim == 0:
            index = index.reshape(1)
        if priority.ndim == 0:
            priority = priority.expand(index.shape)
        if index.ndim > 2 or (index.ndim == 2 and index.shape[1] != L):
            raise ValueError(
                f"index must have shape [B, L={L}], [B·L] or [B], got {tuple(index.shape)}"
            )
        if bool(((index < 0) | (index >= capacity)).any()):
            raise ValueError(f"index entries must lie in [0, {capacity}), got {index.tolist()}")
        if not bool((torch.isfinite(priority) & (priority >= 0)).all()):
            raise ValueError(f"priority must be finite and >= 0, got {priority.tolist()}")
        flat_per_step = index.ndim == 1 and L > 1 and index.numel() % L == 0
        if flat_per_step:
            rows = index.reshape(-1, L)
            steps = (rows - rows[:, :1]) % capacity
            flat_per_step = bool((steps == torch.arange(L)).all())
        if index.ndim == 2 or flat_per_step:
            rows = index.reshape(-1, L)  # [B, L]
            if priority.shape in ((rows.shape[0],), (rows.shape[0], 1)):
                priority = priority.reshape(-1)
            elif priority.numel() == rows.numel() and priority.shape in (index.shape, rows.shape):
                priority = priority.reshape(-1, L).amax(1)
            else:
                raise ValueError(
                    f"priority must have shape {tuple(index.shape)} or [{rows.shape[0]}] for "
                    f"index of shape {tuple(index.shape)}, got {tuple(priority.shape)}"
                )
            starts = rows[:, 0]
        else:
            if priority.shape != index.shape:
                raise ValueError(
                    f"priority must have the shape of index {tuple(index.shape)} (one priority "
                    f"per start), got {tuple(priority.shape)}"
                )
            starts = index
        # Duplicate starts keep their largest priority.
        starts, inverse = starts.unique(return_inverse=True)
        reduced = torch.zeros(starts.shape, dtype=torch.float64)
        priority = reduced.scatter_reduce(0, inverse, priority, "amax", include_self=False)
        # Stale-update guard: the sequence now at t must have been sampled after its last write.
        fresh = (self._sampled_stamp[starts] == self._stamp[starts]) & (self._stamp[starts] >= 0)
        fresh &= self._valid[starts]
        starts, priority = starts[fresh], priority[fresh]
        if starts.numel() == 0:
            return
        self._assigned[starts] = True
        self._priority[starts] = priority
        self._pending_assign.append(starts)

    # ------------------------------------------------------------------ checkpoints

    _STATE = (
        "_stamp",
        "_sampled_stamp",
        "_traj",
        "_end",
        "_valid",
        "_assigned",
        "_priority",
        "_write_count",
        "_mode",
    )

    def state_dict(self) -> dict[str, Any]:
        """Priorities, assignment, write stamps and pending work (tensors are cloned)."""
        state = {name: getattr(self, name) for name in self._STATE}
        state = {k: v.clone() if isinstance(v, Tensor) else v for k, v in state.items()}
        state["_pending_writes"] = torch.cat(self._pending_writes or [torch.zeros(0).long()])
        state["_pending_starts"] = torch.cat(self._pending_starts or [torch.zeros(0).long()])
        state["config"] = {
            "max_capacity": self._max_capacity,
            "sequence_length": self.sequence_length,
            "alpha": self._alpha,
            "beta": self._beta,
            "uniform_probability": self.uniform_probability,
            "block_size": self.block_size,
        }
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; masses and block sums are rebuilt on the next use."""
        config = state_dict["config"]
        for name in ("max_capacity", "sequence_length", "block_size"):
            if config[name] != getattr(self, "_max_capacity" if name == "max_capacity" else name):
                raise ValueError(
                    f"state_dict has {name}={config[name]}, this sampler "
                    f"{getattr(self, '_max_capacity' if name == 'max_capacity' else name)}"
                )
        self._empty()
        for name in self._STATE:
            value = state_dict[name]
            setattr(self, name, value.clone() if isinstance(value, Tensor) else value)
        self._alpha, self._beta = config["alpha"], config["beta"]
        self.uniform_probability = config["uniform_probability"]
        self._pending_writes = [state_dict["_pending_writes"].clone()]
        starts = torch.cat([state_dict["_pending_starts"], torch.arange(self._max_capacity)])
        self._pending_starts = [starts]  # revalidate everything: cheap, and self-checking
        self._full_refresh = True

    def dumps(self, path: str | Path) -> None:
        """Save :meth:`state_dict` under directory ``path``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), path / "sampler_state.pt")

    def loads(self, path: str | Path) -> None:
        """Load what :meth:`dumps` saved under ``path``.

        Tensors and plain values only (``weights_only=True``): a crafted file cannot run code.
        """
        state = torch.load(Path(path) / "sampler_state.pt", weights_only=True)
        self.load_state_dict(state)
