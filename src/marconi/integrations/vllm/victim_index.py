"""The next victim among a pool's free cached blocks without a scan: recency queues per efficiency level.

:class:`~marconi.integrations.vllm.policy.BlockEvictionState` evicts the block that minimises, over a
set ``P`` of free cached blocks (its candidates, or all of them when none is a candidate),

    score = (r - r_min) / (r_max - r_min) + α · (e - e_min) / (e_max - e_min)        (each term 0 on an empty range)

with ties to the smallest release number ``r``, then block id. Only the oldest member of each level
of equal efficiency can win, so only those heads are scored, with the scan's own float operations.
No vLLM or numpy; the soundness argument and costs: ``docs/vllm-at-scale.md``.
"""

from __future__ import annotations

from bisect import insort
from heapq import heapify, heappop, heappush
from operator import itemgetter
from typing import Iterator, Mapping

__all__ = ["CANDIDATES", "OTHERS", "Membership", "VictimIndex"]

#: The two sets a member belongs to: candidates (evicted first), and the free cached blocks that
#: are not candidates (evicted only when no candidate is free).
CANDIDATES, OTHERS = 0, 1
_NONE = -1                  # a block's tier/level while it is not a member

#: ``(set, efficiencies by variant, release number)`` of a member, as :meth:`VictimIndex.members` reports.
Membership = tuple[int, tuple[float, ...], int]

_SLACK = 64                 # stale entries a heap may hold beyond its live ones before a rebuild
_FIRST = itemgetter(0)


class _Level:
    """The members of one set with one efficiency per variant: a min-heap of their entries."""

    __slots__ = ("level_id", "tier", "effs", "heap", "num_live", "sort_keys")

    def __init__(self, level_id: int, tier: int, effs: tuple[float, ...]) -> None:
        self.level_id = level_id
        self.tier = tier
        self.effs = effs              # efficiency in each variant (the index's variant order)
        self.heap: list[int] = []     # entries, stale ones included (never at the top while num_live > 0)
        self.num_live = 0
        # (efficiency, level) per variant: the entries of the set's sorted lists (unpacked in the hot loop)
        self.sort_keys = tuple((eff, self) for eff in effs)


class _Tier:
    """One set (candidates or others): min- and max-heaps (negated) of its entries, and its non-empty
    levels sorted by efficiency per variant."""

    __slots__ = ("num_live", "min_heap", "max_heap", "by_eff")

    def __init__(self, num_variants: int) -> None:
        self.num_live = 0
        self.min_heap: list[int] = []
        self.max_heap: list[int] = []
        self.by_eff: list[list[tuple[float, _Level]]] = [[] for _ in range(num_variants)]


class VictimIndex:
    """Members are block ids, each in at most one set at one level with one release number; the
    owner reports every change (:meth:`place`, :meth:`discard`), the index never reads its state.

    ``num_blocks``: ids are ``0 .. num_blocks-1``; ``num_variants``: the length of ``effs`` tuples.
    """

    def __init__(self, num_blocks: int, num_variants: int) -> None:
        self._shift = max(1, int(num_blocks).bit_length())     # block ids < 2**shift
        self._mask = (1 << self._shift) - 1
        self._num_variants = int(num_variants)
        self._tiers = (_Tier(num_variants), _Tier(num_variants))
        self._levels: list[_Level] = []                       # by level id
        self._level_ids: tuple[dict[tuple[float, ...], int], ...] = ({}, {})   # per set: effs -> level id
        self._level_of = [_NONE] * int(num_blocks)            # block id -> level id, or _NONE
        self._tier_of = [_NONE] * int(num_blocks)             # block id -> CANDIDATES / OTHERS / _NONE
        self._seq_of = [0] * int(num_blocks)                  # block id -> release number (members only)

    def __len__(self) -> int:
        """Members: the free cached blocks."""
        return self._tiers[CANDIDATES].num_live + self._tiers[OTHERS].num_live

    # ------------------------------------------------------------------ updates
    def place(self, block_id: int, tier: int, effs: tuple[float, ...], seq: int) -> None:
        """Make ``block_id`` a member of set ``tier`` with efficiencies ``effs`` (one per variant, exact
        float64 values: they key the levels) and release number ``seq`` (an int >= 0); a no-op if it
        already is exactly that."""
        # (The hot path of every release and re-judgement: a join and a level move inlined.)
        level_id = self._level_ids[tier].get(effs)
        if level_id is None:
            level_id = self._new_level(tier, effs)
        level_of = self._level_of
        current = level_of[block_id]
        levels = self._levels
        if current != _NONE:
            if self._seq_of[block_id] != seq or self._tier_of[block_id] != tier:
                self.discard(block_id)
            elif current == level_id:
                return
            else:                     # same set, same release number: only its level changes
                level_of[block_id] = level_id
                old = levels[current]
                old.num_live -= 1
                if not old.num_live:
                    self._emptied(old)
                self._into_level(levels[level_id], seq << self._shift | block_id)
                return
        # a new member
        level = levels[level_id]
        level_of[block_id] = level_id
        self._tier_of[block_id] = tier
        self._seq_of[block_id] = seq
        entry = seq << self._shift | block_id
        heap = level.heap
        heappush(heap, entry)
        level.num_live += 1
        if level.num_live == 1:
            self._filled(level)
        elif len(heap) > 2 * level.num_live + _SLACK:
            level.heap = self._swept(heap, level_of, level_id)
        tier_set = self._tiers[tier]
        heappush(tier_set.min_heap, entry)
        heappush(tier_set.max_heap, -entry)
        tier_set.num_live += 1
        if len(tier_set.min_heap) > 2 * tier_set.num_live + _SLACK:
            tier_set.min_heap = self._swept(tier_set.min_heap, self._tier_of, tier)
        if len(tier_set.max_heap) > 2 * tier_set.num_live + _SLACK:
            tier_set.max_heap = self._swept(tier_set.max_heap, self._tier_of, tier, negated=True)

    def discard(self, block_id: int) -> None:
        """``block_id`` is no member (any more); a no-op if it was none."""
        level_id = self._level_of[block_id]
        if level_id == _NONE:
            return
        # Lazy: the member's entries stay in the heaps, stale, until a top or a sweep drops them.
        level = self._levels[level_id]
        self._level_of[block_id] = _NONE
        self._tier_of[block_id] = _NONE
        level.num_live -= 1
        if not level.num_live:
            self._emptied(level)
        tier = self._tiers[level.tier]
        tier.num_live -= 1
        if not tier.num_live:
            tier.min_heap = []
            tier.max_heap = []

    def clear(self) -> None:
        """No members (levels are kept: their efficiencies recur)."""
        self._tiers = (_Tier(self._num_variants), _Tier(self._num_variants))
        for level in self._levels:
            level.heap = []
            level.num_live = 0
        n = len(self._level_of)
        self._level_of = [_NONE] * n
        self._tier_of = [_NONE] * n

    # ------------------------------------------------------------------ the decision
    def victim(self, alpha: float, variant: int) -> int | None:
        """The scan's victim, bit-identical (None without members): argmin of ``score`` (module
        docstring) over the candidates, else the others, on efficiency ``variant`` (an index into
        ``effs``); α = 0 (or falsy) scores recency alone."""
        tier_id = CANDIDATES
        tier = self._tiers[CANDIDATES]
        if not tier.num_live:
            tier_id, tier = OTHERS, self._tiers[OTHERS]
            if not tier.num_live:
                return None
        # Removals are lazy (discard pops nothing): drop stale entries off the tops read here.
        shift, mask = self._shift, self._mask
        tier_of, level_of, seq_of = self._tier_of, self._level_of, self._seq_of
        heap = tier.min_heap
        head = heap[0]
        while tier_of[head & mask] != tier_id or seq_of[head & mask] != head >> shift:
            heappop(heap)
            head = heap[0]
        levels = tier.by_eff[variant]
        e_lo = levels[0][0]
        range_e = levels[-1][0] - e_lo
        if not alpha or not range_e > 0:     # every efficiency term is 0: recency alone, the oldest wins
            return head & mask               # entries order by (release number, block id), as the scan's ties
        heap = tier.max_heap
        top = -heap[0]
        while tier_of[top & mask] != tier_id or seq_of[top & mask] != top >> shift:
            heappop(heap)
            top = -heap[0]
        lo = float(head >> shift)
        range_r = float(top >> shift) - lo
        best_entry = -1
        best_score = 0.0
        for eff, level in levels:            # ascending efficiency, so ascending efficiency term
            eff_term = alpha * ((eff - e_lo) / range_e)
            if eff_term > best_score and best_entry >= 0:
                break                        # score >= eff_term here and at every later level
            heap = level.heap
            entry = heap[0]
            level_id = level.level_id
            while level_of[entry & mask] != level_id or seq_of[entry & mask] != entry >> shift:
                heappop(heap)
                entry = heap[0]
            if entry > best_entry >= 0:
                continue                     # older best, no less efficient: it cannot win
            score = ((float(entry >> shift) - lo) / range_r if range_r > 0 else 0.0) + eff_term
            if best_entry < 0 or score < best_score or (score == best_score and entry < best_entry):
                best_entry, best_score = entry, score
        return best_entry & self._mask

    # ------------------------------------------------------------------ checks
    def heap_sizes(self) -> int:
        """Entries in every heap, stale ones included (about twice the live ones at most)."""
        return (sum(len(level.heap) for level in self._levels)
                + sum(len(tier.min_heap) + len(tier.max_heap) for tier in self._tiers))

    def members(self) -> Iterator[tuple[int, Membership]]:
        """``(block id, (set, effs, release number))`` of every member."""
        for block_id, level_id in enumerate(self._level_of):
            if level_id != _NONE:
                level = self._levels[level_id]
                yield block_id, (level.tier, level.effs, self._seq_of[block_id])

    def check_invariants(self, expected: Mapping[int, Membership] | None = None) -> None:
        """Recount every heap and list from the per-block records (cleaning the tops first); with
        ``expected`` also check the members are exactly those. AssertionError on drift."""
        self._clean_tops()
        if expected is not None:
            got = dict(self.members())
            assert got == dict(expected), (f"victim index drifted: {len(got)} members, {len(expected)} expected; "
                                           f"differing: {sorted(set(got.items()) ^ set(expected.items()))[:5]}")
        by_level: dict[int, set[int]] = {}
        for block_id, level_id in enumerate(self._level_of):
            if level_id != _NONE:
                by_level.setdefault(level_id, set()).add(block_id)
                assert self._tier_of[block_id] == self._levels[level_id].tier, "set and level disagree"
        for tier_id, tier in enumerate(self._tiers):
            live = {b for b, t in enumerate(self._tier_of) if t == tier_id}
            assert tier.num_live == len(live), "set size drifted"
            assert {e & self._mask for e in tier.min_heap if self._valid_in_tier(e, tier_id)} == live
            assert {e & self._mask for e in (-x for x in tier.max_heap) if self._valid_in_tier(e, tier_id)} == live
            if live:
                assert self._valid_in_tier(tier.min_heap[0], tier_id), "stale top of a min-heap"
                assert self._valid_in_tier(-tier.max_heap[0], tier_id), "stale top of a max-heap"
            filled = {id(lv) for lv in self._levels if lv.tier == tier_id and lv.level_id in by_level}
            for variant, levels in enumerate(tier.by_eff):
                assert {id(lv) for _, lv in levels} == filled and len(levels) == len(filled), "sorted levels drifted"
                assert all(eff == lv.effs[variant] for eff, lv in levels), "a sort key is not its level's efficiency"
                assert all(a[0] <= b[0] for a, b in zip(levels, levels[1:])), "levels unsorted"
        for level in self._levels:
            members = by_level.get(level.level_id, set())
            assert level.num_live == len(members), "level size drifted"
            valid = [e for e in level.heap if self._valid_in_level(e, level)]
            assert {e & self._mask for e in valid} == members, "level heap lost a member"
            if members:
                assert level.heap[0] == min(valid), "stale or misplaced head of a level"

    # ------------------------------------------------------------------ internals
    def _new_level(self, tier: int, effs: tuple[float, ...]) -> int:
        if len(effs) != self._num_variants:
            raise ValueError(f"expected {self._num_variants} efficiencies, got {effs!r}")
        level_id = len(self._levels)
        self._levels.append(_Level(level_id, tier, effs))
        self._level_ids[tier][effs] = level_id
        return level_id

    def _into_level(self, level: _Level, entry: int) -> None:
        """Push a new member's entry (its records already say ``level``); a level that fills joins
        its set's sorted lists."""
        heap = level.heap
        heappush(heap, entry)
        level.num_live += 1
        if level.num_live == 1:
            self._filled(level)
        elif len(heap) > 2 * level.num_live + _SLACK:
            level.heap = self._swept(heap, self._level_of, level.level_id)

    def _filled(self, level: _Level) -> None:
        """``level`` has its first member: into its set's sorted lists."""
        for levels, key in zip(self._tiers[level.tier].by_eff, level.sort_keys):
            insort(levels, key, key=_FIRST)

    def _emptied(self, level: _Level) -> None:
        """``level`` has no member left: out of its set's sorted lists, its heap dropped."""
        level.heap = []
        for levels, key in zip(self._tiers[level.tier].by_eff, level.sort_keys):
            levels.remove(key)

    def _clean_tops(self) -> None:
        """Drop the stale entries off every top (what :meth:`victim` does for the tops it reads)."""
        for tier_id, tier in enumerate(self._tiers):
            if tier.num_live:
                while not self._valid_in_tier(tier.min_heap[0], tier_id):
                    heappop(tier.min_heap)
                while not self._valid_in_tier(-tier.max_heap[0], tier_id):
                    heappop(tier.max_heap)
        for level in self._levels:
            if level.num_live:
                while not self._valid_in_level(level.heap[0], level):
                    heappop(level.heap)

    def _valid_in_level(self, entry: int, level: _Level) -> bool:
        block_id = entry & self._mask
        return self._level_of[block_id] == level.level_id and self._seq_of[block_id] == entry >> self._shift

    def _valid_in_tier(self, entry: int, tier_id: int) -> bool:
        block_id = entry & self._mask
        return self._tier_of[block_id] == tier_id and self._seq_of[block_id] == entry >> self._shift

    def _swept(self, heap: list[int], owner_of: list[int], owner_id: int, negated: bool = False) -> list[int]:
        """``heap``'s live entries, once each, as a new heap (``owner_of``: ``_level_of`` or
        ``_tier_of``; ``negated``: a max-heap). O(1) amortised per push."""
        mask, shift, seq_of = self._mask, self._shift, self._seq_of
        if negated:
            kept = [-e for e in {-x for x in heap} if owner_of[e & mask] == owner_id and seq_of[e & mask] == e >> shift]
        else:
            kept = [e for e in set(heap) if owner_of[e & mask] == owner_id and seq_of[e & mask] == e >> shift]
        heapify(kept)
        return kept
