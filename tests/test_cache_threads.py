"""The cache core's contract with its callers: it owns its copy of the input, it is safe to share
between threads, and its dry run (``finish_checkpoints``) says exactly what ``finish`` asks for."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

from marconi.core.cache import PrefixCache
from marconi.core.model import ModelSpec

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


@pytest.mark.parametrize("make", [lambda: toks((0, 10)), lambda: toks((0, 20))[::2], lambda: toks((0, 20))[5:],
                                  lambda: np.arange(10, dtype=np.int64)], ids=["int32", "strided", "slice", "int64"])
def test_the_handle_never_shares_the_callers_memory(make):
    cache = PrefixCache(SPEC, 10**9, "marconi", "lru")
    buffer = make()
    handle = cache.begin(buffer)
    assert not np.shares_memory(handle.tokens, buffer) and not handle.tokens.flags.writeable
    assert np.array_equal(handle.tokens, buffer)
    cache.abort(handle)


def test_a_read_only_input_is_kept_without_a_copy():
    """Read-only is the caller's promise (trace token arrays are): no copy on the simulator path."""
    cache = PrefixCache(SPEC, 10**9, "marconi", "lru")
    frozen = toks((0, 10))
    frozen.flags.writeable = False
    handle = cache.begin(frozen)
    assert handle.tokens is frozen
    cache.abort(handle)


# ================================================================================ item: threads
@pytest.mark.parametrize("admission,eviction", [("marconi", "flop-aware:alpha=1.0"), ("every-block:block=4", "lru")])
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
                cache.finish_checkpoints(handle, toks((50_000 + i, 50_000 + i + 5)))
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


# ================================================================================ dry run
def _record_asked(cache: PrefixCache, handle, output) -> list[int]:
    """The positions ``finish`` asks its ``states`` callback for (each gets a dummy payload)."""
    asked: list[int] = []
    cache.finish(handle, output, states=lambda p: (asked.append(p), "state")[1])
    return asked


@pytest.mark.parametrize("admission", ["marconi", "every-block:block=8", "every-block:block=8,paged=false", "last-token",
                                       "uniform:m=3", "sparse-dp:m=2,key_tokens=8"])
@pytest.mark.parametrize("chunk", [None, 16])
def test_finish_checkpoints_is_exactly_what_finish_asks_for(admission, chunk):
    """Over a random workload, the dry run equals the positions finish requests, and a per-step
    dry run over a growing output (what a generating engine does) finds every one below the end."""
    rng = np.random.default_rng(3)
    cache = PrefixCache(SPEC, 60 * 100 + 900 * 10, admission, "lru", prefill_chunk_len=chunk)
    roots = [toks((0, 40)), toks((1000, 1037))]
    outputs: list[np.ndarray] = []
    total_past_input = 0
    for i in range(60):
        base = roots[int(rng.integers(0, 2))]
        if outputs and rng.random() < 0.4:  # the same prompt again: outputs may share a prefix
            prev_in, prev_out = outputs[int(rng.integers(0, len(outputs)))]
            inp = prev_in
            keep = int(rng.integers(0, len(prev_out) + 1))
            out = np.concatenate((prev_out[:keep], toks((70_000 + 50 * i, 70_000 + 50 * i + int(rng.integers(1, 20))))))
        else:
            inp = np.concatenate((base, toks((5000 + 100 * i, 5000 + 100 * i + int(rng.integers(1, 30))))))
            out = toks((60_000 + 100 * i, 60_000 + 100 * i + int(rng.integers(1, 30))))
        outputs.append((inp, out))
        handle = cache.begin(inp)
        planned = cache.finish_checkpoints(handle, out)
        n = len(inp)
        online = [n + j for j in range(len(out))
                  if n + j in cache.finish_checkpoints(handle, out[: j + 1])]
        online += [p for p in cache.finish_checkpoints(handle, out) if p == n + len(out)]
        assert [p for p in planned if p >= n] == online, i
        assert set(p for p in planned if p < n) <= set(handle.prefill_checkpoints), i
        total_past_input += sum(p > n for p in planned if p < n + len(out))
        assert _record_asked(cache, handle, out) == list(planned), i
        cache.check_invariants()
    assert cache.stats.checkpoints_unavailable == 0
    if admission.startswith(("marconi", "every-block")):
        assert total_past_input > 0  # the workload did ask for states inside decoded outputs


def test_finish_checkpoints_changes_nothing():
    cache = PrefixCache(SPEC, 10**9, "sparse-dp:m=2,key_tokens=8")
    cache.process(toks((0, 40)), toks((100, 110)))
    handle = cache.begin(toks((0, 30), (200, 220)))
    before = (cache.tree.num_nodes, cache.used_bytes, cache.stats.to_dict())
    first = cache.finish_checkpoints(handle, toks((300, 305)))
    assert cache.finish_checkpoints(handle, toks((300, 305))) == first  # sparse-dp's plan is still there
    assert (cache.tree.num_nodes, cache.used_bytes, cache.stats.to_dict()) == before
    result = cache.finish(handle, toks((300, 305)))
    assert result.admitted == first
    assert cache.admission.num_open_plans == 0  # forgotten once the request ended


# ================================================================================ chunk grid
def test_prefill_states_move_to_the_chunk_grid():
    """With ``prefill_chunk_len`` a checkpoint inside a prefill is taken at the last chunk boundary
    counted from the resume point (the paper's example: chunk 32, token 80 -> 64)."""
    cache = PrefixCache(SPEC, 10**9, "marconi", prefill_chunk_len=32)
    cache.process(toks((0, 80), (1000, 1050)), toks((2000, 2005)))
    handle = cache.begin(toks((0, 80), (3000, 3020)))
    assert handle.branch_len == 80 and handle.prefill_checkpoints == (64,)
    result = cache.finish(handle, toks((4000, 4003)))
    assert result.admitted == (64, 103)  # the state at the input's end and after decoding is exact
    # a third request resumes at 64 and recomputes 16 tokens of the shared prefix
    match, _ = cache.process(toks((0, 80), (5000, 5010)))
    assert match.usable_hit_len == 64
    cache.check_invariants()


def test_chunk_grid_counts_from_the_resume_point_and_keeps_pages():
    cache = PrefixCache(SPEC, 10**9, "every-block:block=8", prefill_chunk_len=12)  # grid lcm(12, 8) = 24
    handle = cache.begin(toks((0, 70)))
    assert handle.prefill_checkpoints == (24, 48)  # blocks 8, 16, 32, 40, 56 have no boundary of their own
    assert cache.finish(handle, toks((100, 120))).admitted == (24, 48, 72, 80, 88)  # decode: every block
    cache.check_invariants()
    unpaged = PrefixCache(SPEC, 10**9, "every-block:block=8,paged=false", prefill_chunk_len=12)
    unpaged.process(toks((0, 21)), toks((100, 101)))              # a last-token checkpoint at 22
    handle = unpaged.begin(toks((0, 21), (100, 101), (200, 240)))
    assert handle.match.usable_hit_len == 22
    assert handle.prefill_checkpoints == (34, 46)                 # blocks 40, 48, 56 -> 22 + 12j below
    unpaged.abort(handle)


def test_a_resume_point_inside_a_page_places_no_state_off_the_pages():
    """A pure transformer resumes where its KVs end, so a ``max_hit_len`` inside a page puts the
    resume point off the page grid, and every grid point counted from it too: the core placed
    boundaries at 5, 7 and 9 on a 2-token paged tree, whose nodes then had 1-token edges (invariants
    broken, the cache serving on) or whose split raised mid-``finish``. No in-prefill boundary is
    placed from such a point; the input's end and decoded positions stay exact."""
    cache = PrefixCache("transformer-7b", 10e9, "every-block:block=2", "lru", prefill_chunk_len=2)
    cache.process([1, 2, 3, 4], [])
    handle = cache.begin(list(range(1, 11)), max_hit_len=3)
    assert handle.match.usable_hit_len == 3 and handle.prefill_checkpoints == (10,)
    assert cache.finish(handle, [11, 12]).admitted == (10, 12)
    cache.check_invariants()
    handle = cache.begin([1, 2, 3, 4, 5, 6, 9, 9], max_hit_len=5)        # off the grid inside the cached path
    assert handle.prefill_checkpoints == (8,)
    cache.finish(handle, [])
    cache.check_invariants()
    match, _ = cache.process([1, 2, 3, 4, 5, 6, 7, 8, 0])                 # on the grid: boundaries as before
    assert match.usable_hit_len == 8
    cache.check_invariants()


def test_prefill_chunk_len_is_validated():
    with pytest.raises(ValueError, match="prefill_chunk_len"):
        PrefixCache(SPEC, 10**9, prefill_chunk_len=0)
