"""The cache core's contract with its callers: it owns its copy of the input, and it is safe to
share between threads."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

from marconi.cache import PrefixCache
from marconi.model import ModelSpec

# 10 bytes of KV per token, 100 bytes per checkpoint (as in test_cache.py).
SPEC = ModelSpec("tiny", num_attn_layers=1, num_ssm_layers=1, num_mlp_layers=1, d_model=5, ssm_state_dim=1,
                 conv_kernel=0, num_kv_heads=1, head_dim=5, bytes_per_elem=1, ssm_state_width=100)


def toks(*ranges):
    return np.concatenate([np.arange(a, b, dtype=np.int32) for a, b in ranges])


# ================================================================================ item: input copied
def test_changing_the_input_array_after_begin_changes_nothing():
    cache = PrefixCache(SPEC, 10**9, "marconi", "lru")
    buffer = toks((0, 100))
    handle = cache.begin(buffer)
    buffer[:] = 7777  # the caller reuses its buffer while the request is in flight
    cache.finish(handle, toks((500, 510)))
    cache.check_invariants()
    # the tree holds what the request really computed: tokens 0..99 + output, state at 110
    match, _ = cache.process(toks((0, 100), (500, 510), (900, 905)))
    assert match.usable_hit_len == 110
    bogus, _ = cache.process(np.concatenate((np.full(100, 7777, dtype=np.int32), toks((500, 510), (900, 905)))))
    assert bogus.kv_hit_len == 0 and bogus.usable_hit_len == 0
    with pytest.raises(ValueError, match="read-only"):
        handle.tokens[0] = 1


def test_int32_input_is_copied_too():
    cache = PrefixCache(SPEC, 10**9, "marconi", "lru")
    buffer = toks((0, 10))
    handle = cache.begin(buffer)
    assert not np.shares_memory(handle.tokens, buffer)
    cache.abort(handle)


# ================================================================================ item: threads
@pytest.mark.parametrize("admission,eviction", [("marconi", "flop-aware:alpha=1.0"), ("every-block:k=4", "lru")])
def test_threads_sharing_one_cache_keep_every_invariant(admission, eviction):
    """8 threads begin / finish / abort on one small cache (heavy eviction). Before the cache took
    a lock this raised InvariantError, exceeded the capacity or leaked locks."""
    cache = PrefixCache(SPEC, 40 * 100 + 600 * 10, admission, eviction)
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            start.wait()
            for i in range(150):
                system = int(rng.integers(0, 3)) * 1000
                inp = toks((system, system + int(rng.integers(8, 40))),
                           (10_000 + seed * 1000 + i * 7, 10_000 + seed * 1000 + i * 7 + int(rng.integers(1, 12))))
                handle = cache.begin(inp)
                if rng.random() < 0.1:
                    cache.abort(handle)
                    continue
                cache.cached_prefix(handle)
                cache.finish(handle, toks((50_000 + i, 50_000 + i + int(rng.integers(0, 9)))))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: races show up at once
    try:
        threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(before)
    assert not errors, errors[0]
    assert cache.num_in_flight == 0 and cache.locked_bytes == 0
    assert cache.used_bytes <= cache.capacity_bytes
    assert cache.stats.num_requests == 8 * 150
    assert cache.stats.evictions_leaf + cache.stats.evictions_inner > 0
    cache.check_invariants()


def test_the_lock_is_public_for_consistent_reads():
    cache = PrefixCache(SPEC, 10**9)
    with cache.lock:  # re-entrant: methods can be called while holding it
        cache.process(toks((0, 10)), toks((20, 22)))
        assert cache.stats.num_requests == 1
