"""vLLM 0.32's ``ARCCachePolicy``, vLLM-free: the emulation's ``arc`` tier policy and the ARC world
(and live ARC order) of the adaptive tier policy (:mod:`marconi.integrations.vllm.tier_chooser`).

Duck-typed over ``OffloadKey`` bytes and chunks with a ``ref_cnt`` (vLLM's ``ChunkStatus``: -1
while the store is pending, > 0 while loads read it). Imports nothing from vLLM or the rest of
the integration, so both the emulation and the chooser build on it without a cycle.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterable, Iterator, Sequence

__all__ = ["ARCPolicy", "order_request_keys"]

OffloadKey = bytes


def order_request_keys(key_groups: Sequence[Sequence[OffloadKey]], ctx: Any) -> list[OffloadKey]:
    """vLLM's ``order_request_keys``: one head-to-tail order across the groups (by each key's end
    position in ``ctx``; the groups' order when any key has none)."""
    keys = [k for group in key_groups for k in group]
    positions = {k: p for k in keys if (p := ctx.get_offload_key_position(k)) is not None}
    if len(positions) == len(keys):
        keys.sort(key=positions.__getitem__)
    return keys


class ARCPolicy:
    """vLLM's ``ARCCachePolicy`` (T1/T2 with ghost lists B1/B2 and an adaptive T1 target), line for
    line; same contract (``evict(n, protected)`` returns exactly ``n`` chunks with ``ref_cnt == 0``
    not in ``protected`` and forgets them into B1/B2, or None and changes nothing).

    Beyond vLLM's interface, for the adaptive tier policy: :meth:`num_held`, :meth:`num_evictable`
    (kept from ``insert``/``mark_*``/``remove``/``evict``, never read by ``evict``) and
    :meth:`retire` (a chunk another order evicted). None of them changes what vLLM's calls do.
    """

    def __init__(self, cache_capacity: int) -> None:
        self.cache_capacity = cache_capacity
        self.target_t1_size = 0.0
        self.t1: OrderedDict[OffloadKey, Any] = OrderedDict()
        self.t2: OrderedDict[OffloadKey, Any] = OrderedDict()
        self.b1: OrderedDict[OffloadKey, None] = OrderedDict()
        self.b2: OrderedDict[OffloadKey, None] = OrderedDict()
        self.idle: set[OffloadKey] = set()       # held with ref_cnt == 0 (for num_evictable only)

    # ------------------------------------------------------------------ vLLM's interface
    def get(self, key: OffloadKey) -> Any | None:
        return self.t1.get(key) or self.t2.get(key)

    def insert(self, key: OffloadKey, chunk: Any, req_context: Any = None) -> None:
        """As vLLM's ARC (``req_context``: passed by vLLM 0.33, unused, as there)."""
        self.t1[key] = chunk
        self.b1.pop(key, None)
        self.b2.pop(key, None)
        if chunk.ref_cnt == 0:
            self.idle.add(key)

    def remove(self, key: OffloadKey) -> None:
        if self.t1.pop(key, None) is None:
            self.t2.pop(key, None)
        self.idle.discard(key)

    def _adapt_to_ghost_hit(self, key: OffloadKey) -> bool:
        if key in self.b1:
            delta = max(1, len(self.b2) / len(self.b1))
            self.target_t1_size = min(self.target_t1_size + delta, self.cache_capacity)
            self.b1.move_to_end(key)
            return True
        if key in self.b2:
            delta = max(1, len(self.b1) / len(self.b2))
            self.target_t1_size = max(self.target_t1_size - delta, 0)
            self.b2.move_to_end(key)
            return True
        return False

    def on_store_miss(self, keys: Iterable[OffloadKey], req_context: Any) -> None:
        for key in reversed(list(keys)):
            self._adapt_to_ghost_hit(key)

    def touch(self, keys: Iterable[OffloadKey], req_context: Any) -> None:
        for key in reversed(list(keys)):
            if key in self.t1:
                chunk = self.t1.pop(key)
                if not chunk.ref_cnt >= 0:      # vLLM's ``not chunk.is_ready``
                    self.t1[key] = chunk
                else:
                    self.t2[key] = chunk
            elif key in self.t2:
                self.t2.move_to_end(key)
            else:
                self._adapt_to_ghost_hit(key)

    def on_request_finished(self, key_groups: Sequence[Sequence[OffloadKey]], insertion_only_keys: set[OffloadKey],
                            reused_keys: set[OffloadKey], req_context: Any) -> None:
        for key in reversed(order_request_keys(key_groups, req_context)):
            if key in insertion_only_keys:
                if key in self.t1:
                    self.t1.move_to_end(key)
                elif key in self.t2:
                    self.t2.move_to_end(key)
                continue
            if key in reused_keys and key in self.t1:
                self.t2[key] = self.t1.pop(key)
            elif key in reused_keys and key in self.t2:
                self.t2.move_to_end(key)

    def clear(self) -> None:
        self.t1.clear()
        self.t2.clear()
        self.b1.clear()
        self.b2.clear()
        self.idle.clear()
        self.target_t1_size = 0.0

    def evict(self, n: int, protected: set[OffloadKey]) -> list[tuple[OffloadKey, Any]] | None:
        if n == 0:
            return []
        candidates: list[tuple[OffloadKey, Any, bool]] = []
        virtual_t1_size = len(self.t1)
        t1_iter = iter(self.t1.items())
        t2_iter = iter(self.t2.items())

        def next_candidate(entries: Iterator[tuple[OffloadKey, Any]]) -> tuple[OffloadKey, Any] | None:
            for key, chunk in entries:
                if chunk.ref_cnt == 0 and key not in protected:
                    return key, chunk
            return None

        for _ in range(n):
            candidate: tuple[OffloadKey, Any, bool] | None = None
            if virtual_t1_size >= int(self.target_t1_size):
                entry = next_candidate(t1_iter)
                if entry is not None:
                    candidate = (*entry, True)
                    virtual_t1_size -= 1
            if candidate is None:
                entry = next_candidate(t2_iter)
                if entry is not None:
                    candidate = (*entry, False)
            if candidate is None:
                entry = next_candidate(t1_iter)
                if entry is None:
                    return None
                candidate = (*entry, True)
                virtual_t1_size -= 1
            candidates.append(candidate)
        result = []
        for key, chunk, from_t1 in candidates:
            if from_t1:
                del self.t1[key]
                self.b1[key] = None
            else:
                del self.t2[key]
                self.b2[key] = None
            self.idle.discard(key)
            result.append((key, chunk))
        self._trim_ghosts()
        return result

    def mark_evictable(self, key: OffloadKey) -> None:
        if key in self.t1 or key in self.t2:
            self.idle.add(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self.idle.discard(key)

    # ------------------------------------------------------------------ beyond vLLM's interface
    def held_chunks(self) -> dict[OffloadKey, Any]:
        """Every chunk held, by key (a copy; for checks)."""
        return {**self.t1, **self.t2}

    def num_held(self) -> int:
        """Chunks held (pending stores included)."""
        return len(self.t1) + len(self.t2)

    def num_evictable(self, protected: set[OffloadKey] = frozenset()) -> int:  # type: ignore[assignment]
        """Chunks ``evict`` may take now (idle, not in ``protected``)."""
        return len(self.idle) - sum(1 for k in protected if k in self.idle)

    def retire(self, key: OffloadKey) -> None:
        """``key`` left the tier by another order's eviction: it goes to the ghost list of the list
        that held it (T1 -> B1, T2 -> B2), as ARC's own eviction would have put it, so a later miss on
        it adapts the T1 target as under ARC. No-op for a key not held."""
        if self.t1.pop(key, None) is not None:
            self.b1[key] = None
        elif self.t2.pop(key, None) is not None:
            self.b2[key] = None
        else:
            return
        self.idle.discard(key)
        self._trim_ghosts()

    def _trim_ghosts(self) -> None:
        for ghost in (self.b1, self.b2):
            for _ in range(len(ghost) - self.cache_capacity):
                ghost.popitem(last=False)

    def check_invariants(self) -> None:
        """T1 and T2 disjoint, ghosts bounded, ``idle`` = the held chunks with ``ref_cnt == 0``."""
        assert not self.t1.keys() & self.t2.keys(), "a chunk in both T1 and T2"
        assert len(self.b1) <= self.cache_capacity and len(self.b2) <= self.cache_capacity, "ghost list unbounded"
        assert self.idle == {k for k, c in self.held_chunks().items() if c.ref_cnt == 0}, "idle set drifted"
