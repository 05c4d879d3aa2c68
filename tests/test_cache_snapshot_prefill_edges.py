"""The cache core at three edges an embedding engine reaches (from an audit of the core's contract):
a prefill insertion that raises, a snapshot a caller writes to, and a snapshot whose clock is behind
its nodes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from marconi.core.cache import ManualClock, PrefixCache
from marconi.core.registry import ConfigError


def test_a_prefill_insertion_that_raises_leaves_finish_to_admit_its_checkpoints():
    def finished(fail: bool) -> tuple[int, ...]:
        cache = PrefixCache("paper-7b", 10**12, admission="marconi")
        cache.process([1, 2, 3, 4, 5, 6], [])
        handle = cache.begin([1, 2, 3])          # ends inside a cached sequence: a branch point at 3
        assert handle.prefill_checkpoints == (3,)
        if fail:
            def out_of_memory(position: int) -> object:
                raise MemoryError("the engine's allocator is full")

            with pytest.raises(MemoryError):
                cache.insert_prefill(handle, states=out_of_memory)
            assert handle.active
        result = cache.finish(handle, [4, 5, 9])
        cache.check_invariants()
        return result.admitted

    assert finished(fail=False) == (3, 5, 6)
    assert finished(fail=True) == (3, 5, 6)        # (5, 6) before: the prefill's state was lost


def test_a_snapshot_cannot_change_the_cache_it_was_taken_from():
    cache = PrefixCache("paper-7b", 10**12)
    cache.process([1, 2, 3], [4])
    snap = cache.snapshot()
    with pytest.raises(ValueError, match="read-only"):
        snap.tokens[0][:] = 7
    assert cache.begin([1, 2, 3, 4]).match.kv_hit_len == 4
    cache.check_invariants()


def test_a_restored_cache_keeps_its_own_copy_of_a_callers_buffers():
    cache = PrefixCache("paper-7b", 10**12)
    cache.process([1, 2, 3], [4])
    snap = cache.snapshot()
    mine = [np.array(t, dtype=np.int32) for t in snap.tokens]          # writable, the caller's
    restored = PrefixCache.from_snapshot(dataclasses.replace(snap, tokens=mine), "paper-7b", 10**12, "marconi",
                                         "lru", clock=ManualClock())
    for buffer in mine:
        buffer[:] = 7
    assert restored.begin([1, 2, 3, 4]).match.kv_hit_len == 4
    restored.check_invariants()


def test_a_snapshot_whose_clock_is_behind_its_nodes_is_refused():
    cache = PrefixCache("paper-7b", 10**12, clock=ManualClock())
    cache.clock.now = 2.0
    cache.process([1, 2, 3], [4])
    snap = cache.snapshot()
    behind = dataclasses.replace(snap, clock_value=-5.0)     # accepted before: recency ran backwards
    with pytest.raises(ConfigError, match=r"snapshot.last_access\[0\] = 2.0 is later than snapshot.clock_value"):
        PrefixCache.from_snapshot(behind, "paper-7b", 10**12, "marconi", "lru", clock=ManualClock())
    PrefixCache.from_snapshot(snap, "paper-7b", 10**12, "marconi", "lru", clock=ManualClock()).check_invariants()


def test_an_empty_edge_in_a_snapshot_is_named_as_such():
    cache = PrefixCache("paper-7b", 10**12)
    cache.process([1, 2, 3], [4])
    snap = cache.snapshot()
    empty = dataclasses.replace(snap, tokens=[np.zeros(0, dtype=np.int32)])
    with pytest.raises(ConfigError, match=r"snapshot.tokens\[0\] is empty: every node below the root"):
        PrefixCache.from_snapshot(empty, "paper-7b", 10**12, "marconi", "lru", clock=ManualClock())
