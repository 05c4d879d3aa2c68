"""Hypothesis: random insert / match / lock / unlock / evict sequences keep every invariant."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marconi.core.cache import PrefixCache
from marconi.core.model import ModelSpec

SPEC = ModelSpec("tiny", num_attn_layers=1, num_ssm_layers=1, num_mlp_layers=1, d_model=5, ssm_state_dim=1,
                 conv_kernel=0, num_kv_heads=1, head_dim=5, bytes_per_elem=1, ssm_state_width=100)
TRANSFORMER = ModelSpec("tf", num_attn_layers=1, num_ssm_layers=0, num_mlp_layers=1, d_model=5, ssm_state_dim=0,
                        num_kv_heads=1, head_dim=5, bytes_per_elem=1)

# Small alphabets and shared stems make prefixes collide often, so splits and merges happen.
STEMS = [np.array(s, dtype=np.int32) for s in ([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 9, 9], [4, 4, 4, 4, 4, 4])]

token_lists = st.lists(st.integers(0, 6), min_size=0, max_size=24)
request = st.tuples(st.integers(0, len(STEMS)), token_lists, st.lists(st.integers(0, 6), max_size=8))
operation = st.one_of(
    st.tuples(st.just("process"), request),
    st.tuples(st.just("begin"), request),
    st.tuples(st.just("finish"), st.integers(0, 7)),
    st.tuples(st.just("abort"), st.integers(0, 7)),
)


def build_tokens(stem_index, tail):
    stem = STEMS[stem_index] if stem_index < len(STEMS) else np.empty(0, dtype=np.int32)
    tokens = np.concatenate((stem, np.array(tail, dtype=np.int32)))
    return tokens if tokens.size else np.array([0], dtype=np.int32)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(operation, min_size=1, max_size=40),
       capacity=st.integers(100, 900),
       admission=st.sampled_from(["marconi", "every-block:block=2", "every-block:block=3", "none"]),
       eviction=st.sampled_from(["lru", "flop-aware:alpha=0", "flop-aware:alpha=1.5",
                                 "flop-aware-marginal:alpha=0.7,recency=inverse-age"]),
       transformer=st.booleans())
def test_random_operations_keep_invariants(ops, capacity, admission, eviction, transformer):
    spec = TRANSFORMER if transformer else SPEC
    cache = PrefixCache(spec, capacity, admission, eviction)
    in_flight = []
    for op in ops:
        kind, arg = op
        if kind in ("process", "begin"):
            stem, tail, out = arg
            tokens = build_tokens(stem, tail)
            if kind == "process":
                match, result = cache.process(tokens, np.array(out, dtype=np.int32))
            else:
                handle = cache.begin(tokens)
                match = handle.match
                in_flight.append((handle, np.array(out, dtype=np.int32)))
                prefix = cache.cached_prefix(handle)
                assert prefix.length == match.usable_hit_len
            assert 0 <= match.usable_hit_len <= match.kv_hit_len <= match.input_len
            if not transformer and match.usable_hit_len:
                # a usable hit is always a node boundary holding a checkpoint
                assert any(n.depth == match.usable_hit_len and n.has_ssm for n in cache.tree.iter_nodes())
        elif in_flight:
            handle, out = in_flight.pop(arg % len(in_flight))
            if kind == "finish":
                cache.finish(handle, out)
            else:
                cache.abort(handle)
        cache.check_invariants()
        assert cache.used_bytes <= capacity
    for handle, out in in_flight:
        cache.finish(handle, out)
    cache.check_invariants()
    assert cache.locked_bytes == 0


@settings(max_examples=60, deadline=None)
@given(seqs=st.lists(st.tuples(st.integers(0, len(STEMS)), token_lists), min_size=1, max_size=25))
def test_unbounded_cache_hits_every_previously_finished_sequence(seqs):
    """With ample capacity and marconi admission, re-sending input+output of a finished request
    resumes from its last-decoded-token checkpoint: the usable hit is the whole previous sequence."""
    cache = PrefixCache(SPEC, 10**9, "marconi", "lru")
    for stem, tail in seqs:
        tokens = build_tokens(stem, tail)
        cache.process(tokens[:-1] if len(tokens) > 1 else tokens, tokens[-1:] if len(tokens) > 1 else ())
        follow_up = np.concatenate((tokens, np.array([99], dtype=np.int32)))
        match, _ = cache.process(follow_up, ())
        assert match.usable_hit_len >= len(tokens)  # earlier follow-ups may extend it
        cache.check_invariants()


@settings(max_examples=150, deadline=None)
@given(reqs=st.lists(st.tuples(st.integers(0, len(STEMS)), token_lists, st.lists(st.integers(0, 6), max_size=8)),
                     min_size=1, max_size=30),
       capacity=st.integers(100, 2000), k=st.integers(1, 3), cut=st.integers(0, 3))
def test_block_runs_make_the_same_decisions_as_one_node_per_block(reqs, capacity, k, cut):
    """vLLM+ keeps consecutive blocks as one run node; under LRU that must not change any decision,
    an engine's ``max_hit_len`` (``cut`` tokens short of the input) inside a run included."""
    runs = PrefixCache(SPEC, capacity, f"every-block:block={k}", "lru")
    blocks = PrefixCache(SPEC, capacity, f"every-block:block={k},runs=false", "lru")
    for stem, tail, out in reqs:
        tokens, output = build_tokens(stem, tail), np.array(out, dtype=np.int32)
        limit = max(0, len(tokens) - cut) if cut else None
        assert runs.process(tokens, output, max_hit_len=limit) == blocks.process(tokens, output, max_hit_len=limit)
        assert (runs.used_bytes, runs.ssm_bytes) == (blocks.used_bytes, blocks.ssm_bytes)
    runs.check_invariants()
    blocks.check_invariants()
    assert runs.stats.checkpoints_evicted == blocks.stats.checkpoints_evicted
