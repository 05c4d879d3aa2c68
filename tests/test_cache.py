"""Hand-built scenarios with hand-computed answers for the cache core."""

import numpy as np
import pytest

from marconi.core.cache import SIZE_ONLY, PrefixCache
from marconi.core.candidates import flop_efficiency
from marconi.core.eviction import FlopAware
from marconi.core.model import ModelSpec
from marconi.core.registry import ConfigError

# A tiny spec with round numbers: 10 bytes of KV per token, 100 bytes per SSM checkpoint.
SPEC = ModelSpec("tiny", num_attn_layers=1, num_ssm_layers=1, num_mlp_layers=1, d_model=5, ssm_state_dim=1,
                 conv_kernel=0, num_kv_heads=1, head_dim=5, bytes_per_elem=1, ssm_state_width=100)
assert SPEC.kv_bytes_per_token == 10 and SPEC.ssm_checkpoint_bytes == 100


def toks(*ranges):
    return np.concatenate([np.arange(a, b, dtype=np.int32) for a, b in ranges])


def make(capacity=10**9, admission="marconi", eviction="lru", spec=SPEC):
    return PrefixCache(spec, capacity, admission, eviction)


def test_shared_system_prompt_branches_then_hits_from_third_request():
    cache = make()
    system = (0, 500)
    results = []
    for i in range(4):
        question = (10_000 + 100 * i, 10_000 + 100 * i + 50)
        match, ins = cache.process(toks(system, question), toks((20_000 + 100 * i, 20_000 + 100 * i + 20)))
        results.append((match, ins))
        cache.check_invariants()
    (m1, i1), (m2, i2), (m3, i3), (m4, _) = results
    assert (m1.kv_hit_len, m1.usable_hit_len) == (0, 0)
    assert i1.admitted == (570,)
    # second request: the prompt's KVs are found but no state exists at 500 yet -> unusable
    assert (m2.kv_hit_len, m2.usable_hit_len, m2.unusable_len) == (500, 0, 500)
    assert i2.admitted == (500, 570)  # branch point (speculative insertion) + last decoded token
    assert (m3.usable_hit_len, m4.usable_hit_len) == (500, 500)
    assert i3.admitted == (570,) and i3.inserted_tokens == 70
    assert cache.stats.reused_tokens == 1000
    assert cache.stats.checkpoints_reused == 2


def test_second_request_is_told_to_checkpoint_the_branch_during_prefill():
    cache = make()
    cache.process(toks((0, 500), (1000, 1050)), toks((5000, 5010)))
    handle = cache.begin(toks((0, 500), (2000, 2050)))
    assert handle.branch_len == 500
    assert handle.prefill_checkpoints == (500,)
    cache.finish(handle, toks((6000, 6010)))


def test_multi_turn_conversation_hits_previous_last_decoded_token():
    cache = make()
    history = toks((0, 100))
    for turn in range(5):
        output = toks((1000 + 100 * turn, 1000 + 100 * turn + 30))
        match, ins = cache.process(history, output)
        expected_hit = 0 if turn == 0 else len(history) - 40  # everything but the new user message
        assert match.usable_hit_len == expected_hit
        assert match.kv_hit_len == expected_hit
        assert ins.admitted == (len(history) + 30,)
        history = np.concatenate((history, output, toks((5000 + 100 * turn, 5000 + 100 * turn + 40))))
        cache.check_invariants()
    # a linear chain: one node per turn, each with its last-decoded-token checkpoint
    assert cache.tree.num_nodes == 5
    assert all(n.has_ssm for n in cache.tree.iter_nodes())


def test_partial_match_inside_an_edge_gives_kv_hit_beyond_usable_hit():
    cache = make()
    cache.process(toks((0, 300)), toks((900, 920)))          # one leaf: 320 tokens, state at 320
    match, _ = cache.process(toks((0, 200), (5000, 5010)), ())
    assert match.kv_hit_len == 200
    assert match.usable_hit_len == 0      # the only state is at 320: all or nothing
    assert match.unusable_len == 200
    cache.check_invariants()


def test_usable_hit_for_a_pure_transformer_is_the_kv_hit():
    spec = ModelSpec("tf", num_attn_layers=2, num_ssm_layers=0, num_mlp_layers=2, d_model=8, ssm_state_dim=0,
                     num_kv_heads=1, head_dim=8, bytes_per_elem=1)
    cache = make(spec=spec)
    cache.process(toks((0, 300)), toks((900, 920)))
    match, _ = cache.process(toks((0, 200), (5000, 5010)), ())
    assert match.kv_hit_len == match.usable_hit_len == 200


def test_every_block_is_block_granular():
    cache = make(admission="every-block:block=32")
    _, ins = cache.process(toks((0, 100)), toks((500, 510)))  # 110 tokens -> 3 whole blocks kept
    assert ins.inserted_tokens == 96
    assert ins.admitted == (32, 64, 96)
    # diverging at 70 (inside block [64, 96)) matches only 2 whole blocks
    match, _ = cache.process(toks((0, 70), (7000, 7100)), ())
    assert (match.kv_hit_len, match.usable_hit_len) == (64, 64)
    assert all(n.edge_len % 32 == 0 and n.depth % 32 == 0 for n in cache.tree.iter_nodes())
    # under leaf-only eviction consecutive blocks are one run node with a checkpoint per block
    assert sum(n.num_checkpoints for n in cache.tree.iter_nodes()) == cache.ssm_bytes // SPEC.ssm_checkpoint_bytes
    cache.check_invariants()
    # under inner-node eviction every block is its own node
    flop = make(admission="every-block:block=32", eviction="flop-aware")
    flop.process(toks((0, 100)), toks((500, 510)))
    assert sorted(n.depth for n in flop.tree.iter_nodes()) == [32, 64, 96]


def crafted_tree(eviction):
    """Two cached conversations: a short, recent one and a long, older one.

    Capacity leaves room for both; a third request forces evicting one checkpoint's worth.
    """
    long_seq, short_seq = toks((0, 2000)), toks((10_000, 10_050))
    need_long = 2000 * 10 + 100
    need_short = 50 * 10 + 100
    cache = make(capacity=need_long + need_short + 150, eviction=eviction)
    cache.process(long_seq[:1990], long_seq[1990:])      # older, long: high FLOP efficiency
    cache.process(short_seq[:40], short_seq[40:])        # recent, short
    return cache


def test_lru_evicts_the_least_recent_leaf_flop_aware_keeps_the_long_one():
    lru = crafted_tree("lru")
    lru.process(toks((20_000, 20_010)), ())              # needs 200 bytes: evicts a whole leaf
    depths = sorted(n.depth for n in lru.tree.iter_nodes())
    assert 2000 not in depths and 50 in depths           # LRU threw away the long conversation

    flop = crafted_tree(FlopAware(alpha=2.0))
    flop.process(toks((20_000, 20_010)), ())
    depths = sorted(n.depth for n in flop.tree.iter_nodes())
    assert 2000 in depths and 50 not in depths           # FLOP-aware kept the long one
    for cache in (lru, flop):
        cache.check_invariants()
        assert cache.used_bytes <= cache.capacity_bytes


def test_flop_aware_evicts_inner_node_and_child_absorbs_its_kvs():
    cache = make(capacity=1510, eviction=FlopAware(alpha=0.0))
    history = toks((0, 100))
    out1 = toks((1000, 1010))
    cache.process(history, out1)                                   # node A: [0,110) + state: 1,200 bytes
    turn2 = np.concatenate((history, out1, toks((2000, 2010))))
    cache.process(turn2, toks((3000, 3010)))                       # node B: [110,130) + state: 300 bytes
    assert cache.tree.num_nodes == 2 and cache.used_bytes == 1500
    inner = next(n for n in cache.tree.iter_nodes() if n.children)
    # an unrelated 1-token request needs 10 + 100 bytes, 10 are free: exactly one checkpoint must go
    cache.process(toks((9000, 9001)))
    # the older, one-child node A goes (turn 2 resumed from it: its last access is before B's birth)
    assert cache.stats.evictions_inner == 1 and cache.stats.evictions_leaf == 0
    (leaf,) = [n for n in cache.tree.iter_nodes() if n.depth > 1]
    assert leaf.edge_len == 130 and leaf.has_ssm and leaf.depth == 130   # B absorbed A's KVs
    assert cache.used_bytes == 1500 - 100 + 110                    # only the checkpoint was freed
    assert inner.parent is None
    cache.check_invariants()


def test_flop_efficiency_hand_computed():
    # node at depth Lt=30 with a 10-token edge (parent depth 20), holding a checkpoint
    held = 30 * 10 + 100
    total = SPEC.prefill_flops(30) / held
    assert flop_efficiency(SPEC, 30, 10, True, "total") == pytest.approx(total)
    d, n = 5, 1
    marginal_flops = ((12 * 10 * d * d + 16 * 10 * d * n + 10 * 10 * d)           # S * ssm(Lc)
                      + ((8 * 30 * d * d + 4 * 900 * d) - (8 * 20 * d * d + 4 * 400 * d))  # A * (attn(Lt) - attn(Lp))
                      + (16 * 30 * d * d - 16 * 20 * d * d))                        # M * (mlp(Lt) - mlp(Lp))
    assert flop_efficiency(SPEC, 30, 10, True, "marginal") == pytest.approx(marginal_flops / held)
    assert flop_efficiency(SPEC, 30, 10, False, "total") == pytest.approx(SPEC.prefill_flops(30) / 300)
    assert flop_efficiency(SPEC, 1, 1, True, "marginal") >= 0


def test_capacity_is_never_exceeded_and_too_large_requests_are_not_cached():
    cache = make(capacity=1000)
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 60))
        cache.process(rng.integers(0, 50, n).astype(np.int32), rng.integers(0, 50, 5).astype(np.int32))
        assert cache.used_bytes <= 1000
        cache.check_invariants()
    before = cache.stats.requests_not_cached
    _, ins = cache.process(toks((0, 200)), ())            # 2000 bytes of KV alone
    assert not ins.cached
    assert cache.stats.requests_not_cached == before + 1


def test_locked_path_survives_eviction_pressure():
    cache = make(capacity=2 * (100 * 10 + 100))
    cache.process(toks((0, 100)), ())
    handle = cache.begin(np.concatenate((toks((0, 100)), toks((50_000, 50_010)))))  # locks node [0,100)
    assert handle.match.usable_hit_len == 100
    # another request needs nearly everything: only the unlocked space can be reclaimed
    _, ins = cache.process(toks((7000, 7150)), ())
    assert not ins.cached
    assert cache.cached_prefix(handle).length == 100
    cache.check_invariants()
    cache.finish(handle, ())
    _, ins = cache.process(toks((7000, 7150)), ())
    assert ins.cached
    cache.check_invariants()


def test_cached_prefix_lists_payloads_root_first():
    cache = make()
    cache.process(toks((0, 100)), toks((100, 110)))
    cache.process(toks((0, 50), (900, 950)), ())            # splits [0,110) at 50 with a branch state
    handle = cache.begin(toks((0, 50), (3000, 3010)))
    prefix = cache.cached_prefix(handle)
    assert prefix.length == 50 and len(prefix.kv) == 1
    cache.abort(handle)
    with pytest.raises(ValueError, match="not in flight"):
        cache.finish(handle, ())


def test_bad_input_gets_clear_errors():
    with pytest.raises(ConfigError, match="capacity_bytes must be"):
        make(capacity=-1)
    with pytest.raises(ConfigError, match="smaller than one SSM checkpoint"):
        make(capacity=99)
    with pytest.raises(ConfigError, match="unknown admission policy 'bogus'.*marconi"):
        make(admission="bogus")
    with pytest.raises(ConfigError, match="no parameter 'kk'; valid parameters: block, runs, paged"):
        make(admission="every-block:kk=3")
    with pytest.raises(ConfigError, match="unknown eviction policy"):
        make(eviction="mru")
    cache = make()
    with pytest.raises(ValueError, match="input_tokens is empty"):
        cache.begin([])
    with pytest.raises(ValueError, match="integer token ids"):
        cache.begin(np.array([1.5, 2.0]))
    # vanilla may have any capacity: it caches nothing
    vanilla = make(capacity=0, admission="none")
    match, ins = vanilla.process(toks((0, 10)), toks((10, 12)))
    assert match.kv_hit_len == 0 and not ins.cached


def test_a_checkpoint_admitted_on_a_split_node_is_recent():
    """The branch node is split off an older edge; its new checkpoint must not look stale."""
    cache = make(eviction=FlopAware(alpha=0.0))
    cache.process(toks((0, 500), (1000, 1050)), toks((5000, 5010)))     # edge [0, 560) at time 1
    cache.process(toks((7000, 7100)), ())                               # unrelated, time 2
    cache.process(toks((0, 500), (2000, 2050)), toks((6000, 6010)))     # splits at 500, time 3
    branch = next(n for n in cache.tree.iter_nodes() if n.depth == 500)
    unrelated = next(n for n in cache.tree.iter_nodes() if n.tokens[0] == 7000)
    assert branch.has_ssm and branch.access_seq > unrelated.access_seq
    assert branch.last_access == cache.clock()


def test_max_hit_len_keeps_at_least_one_token_to_compute():
    cache = make()
    cache.process(toks((0, 100)), toks((100, 110)))            # checkpoint at 110 only
    same = toks((0, 110))
    match, _ = cache.process(same, (), max_hit_len=len(same) - 1)
    assert (match.kv_hit_len, match.usable_hit_len) == (110, 0)  # all or nothing: nothing before 110
    match, _ = cache.process(same, ())
    assert match.usable_hit_len == 110                          # the paper's accounting: a full hit
    spec = ModelSpec("tf", num_attn_layers=1, num_ssm_layers=0, num_mlp_layers=1, d_model=8, ssm_state_dim=0,
                     num_kv_heads=1, head_dim=8, bytes_per_elem=1)
    tf = make(spec=spec)
    tf.process(toks((0, 100)), ())
    handle = tf.begin(toks((0, 100)), max_hit_len=99)           # a transformer just recomputes the last token
    assert handle.match.usable_hit_len == 99
    assert tf.cached_prefix(handle).length == 99
    tf.finish(handle, ())
    tf.check_invariants()


def test_max_hit_len_inside_a_block_run_resumes_at_its_deepest_state_below():
    """vLLM+'s block runs keep a state per block inside one node. An engine's ``max_hit_len`` of
    ``len - 1`` on a prompt a run covers used to skip the whole run (usable 0, every state asked
    again); it resumes at the deepest state at or before the limit, as one node per block does."""
    prompt = np.arange(2048, dtype=np.int32)
    for admission in ("every-block:block=32", "every-block:block=32,runs=false"):
        cache = PrefixCache("nemotron-h-8b", 64e9, admission, "lru")
        cache.process(prompt, [11, 12, 13])
        handle = cache.begin(prompt, max_hit_len=len(prompt) - 1)
        assert handle.match.usable_hit_len == 2016, admission
        assert handle.prefill_checkpoints == (2048,), admission
        assert cache.cached_prefix(handle).length == 2016
        cache.finish(handle, [])
        cache.check_invariants()
        handle = cache.begin(prompt[:100], max_hit_len=70)       # a limit inside the run, short input
        assert handle.match.usable_hit_len == 64
        cache.abort(handle)
        cache.check_invariants()


def test_a_clone_reads_size_only_states_and_refuses_runs_under_inner_eviction():
    """A clone keeps no payloads: its states read ``SIZE_ONLY``, as a size-only cache's do (they read
    None, which ``cached_prefix`` documents for no state). A tree of block runs cannot be evicted by a
    rule whose candidates are inner nodes (a run is one node): refused, not a broken copy."""
    cache = PrefixCache("paper-7b", 10e9, "marconi", "lru")
    cache.process([1, 2, 3, 4, 5], [])
    twin = cache.clone("flop-aware:alpha=1")
    handle = twin.begin([1, 2, 3, 4, 5, 6])
    assert twin.cached_prefix(handle).ssm is SIZE_ONLY
    twin.abort(handle)
    runs = PrefixCache("paper-7b", 10e9, "every-block:block=4", "lru")
    runs.process(list(range(16)), [])
    with pytest.raises(ConfigError, match="every-block:runs=false"):
        runs.clone("flop-aware:alpha=1")
    leaf_twin = runs.clone("flop-aware:alpha=1,candidates=leaves,touch=path")
    leaf_twin.check_invariants()


def test_a_transformer_hit_past_its_deepest_state_restores_no_state():
    """``cached_prefix(handle).ssm`` is the payload at ``usable_hit_len``. A pure transformer's hit
    can end past its deepest kept state (its KVs slice anywhere); the state at 4 was handed over for
    a hit of 5 tokens, and an engine that reads a hidden state kept beside a checkpoint would have
    resumed from the wrong position."""

    class Ops:
        def split_kv(self, kv, at):
            return kv[:at], kv[at:]

        def join_kv(self, a, b):
            return a + b

        def release(self, payload):
            pass

        def state_at(self, pos):
            return None

    cache = PrefixCache("transformer-7b", 10e9, "marconi", "lru", payloads=Ops())
    for seq in ([1, 2, 3, 4], [1, 2, 3, 4, 5, 6]):
        handle = cache.begin(seq)
        cache.finish(handle, [], states=lambda p: f"state@{p}", kv=lambda a, b, seq=seq: tuple(seq[a:b]))
    for prompt, limit in (([1, 2, 3, 4, 5, 6, 7], 5), ([1, 2, 3, 4, 5, 9], None)):
        handle = cache.begin(prompt, max_hit_len=limit)
        prefix = cache.cached_prefix(handle)
        assert prefix.length == 5 and prefix.kv == [(1, 2, 3, 4), (5,)] and prefix.ssm is None
        cache.abort(handle)
    handle = cache.begin([1, 2, 3, 4, 5, 6, 7])
    assert cache.cached_prefix(handle).ssm == "state@6"            # a hit ending at a state keeps it
    cache.abort(handle)


def test_a_prompt_asked_again_and_answered_alike_hits_without_insert_prefill():
    """Old: ``process`` (begin + finish, a sequential replay) recomputed the branch point from input +
    output only; an input ending inside a cached sequence whose continuation the output repeated
    left no state at the input's end, so every repeat of a prompt with the same answer missed (0%
    for SGLang+, Marconi, the oracle and even the infinite cache on 200 repeats)."""
    prompt, answer = toks((0, 300)), toks((5_000, 5_040))
    cache = make()
    first = cache.process(prompt, answer)
    assert first[1].admitted == (340,)
    handle = cache.begin(prompt)
    assert handle.prefill_checkpoints == (300,)          # speculative insertion: a branch at the input's end
    assert cache.finish_checkpoints(handle, answer) == (300,)
    assert cache.finish(handle, answer).admitted == (300,)
    match, _ = cache.process(prompt, answer)
    assert (match.kv_hit_len, match.usable_hit_len) == (300, 300)
    cache.check_invariants()
    # a driver that calls insert_prefill admits it there, and finish does not admit it again
    other = make()
    other.process(prompt, answer)
    h = other.begin(prompt)
    assert other.insert_prefill(h).admitted == (300,)
    assert other.finish(h, answer).admitted == ()
    assert other.process(prompt, answer)[0].usable_hit_len == 300


@pytest.mark.parametrize("eviction", ["lru", "flop-aware:alpha=1.0"])
def test_one_long_session_keeps_being_cached_once_its_states_fill_the_cache(eviction):
    """Old: every turn's state stays on the one path the next turn locks, so once they filled the
    cache each later turn was refused (``requests_not_cached``) and the hit stopped growing (a
    2,000-turn session at 10 GB: 33.8% for SGLang+, Marconi and the oracle)."""
    cache = make(capacity=6_000, eviction=eviction)  # 10 B a token, 100 B a state: KVs 4,100 B at the end
    seq = toks((0, 50))
    hits = []
    for turn in range(60):
        output = toks((100_000 + 10 * turn, 100_000 + 10 * turn + 4))
        match, result = cache.process(seq, output)
        cache.check_invariants()
        assert result.cached, f"turn {turn} was not cached"
        hits.append(match.usable_hit_len)
        seq = np.concatenate((seq, output, toks((200_000 + 10 * turn, 200_000 + 10 * turn + 2))))
    st = cache.stats
    assert st.requests_not_cached == 0 and st.locked_states_dropped > 0
    assert hits[-1] == len(seq) - 2 - 4 - 2      # the last turn resumes after the previous turn's output
