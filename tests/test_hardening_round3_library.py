"""Issue 31 (hardening, round 3), the library and reader rows.

Each test names the issue row it covers. The mechanisms: every index the cache keeps is checked by
``PrefixCache.check_invariants`` and bounded by the tree; trace readers read bounded lines from
regular files only; the sparse-DP budget is clamped inside the DP; the cache's arguments and
snapshots are validated where they enter.
"""

from __future__ import annotations

import numpy as np
import pytest

from marconi.core.cache import InvariantError, PrefixCache
from marconi.core.model import get_model
from marconi.workloads.synthetic import chat_trace
from tests.marks import slow

FAMILY = "worlds:rules=lru/a0.5m/a0.5mt/a2m"  # marconi:rules=lru/a0.5m/a0.5mt/a2m's eviction


# ============================================================================ bug 7: the dead-tail index


def _tight_cache(admission: str, states: int = 60, kv_tokens: int = 20_000) -> PrefixCache:
    spec = get_model("paper-7b")
    return PrefixCache(spec, states * spec.ssm_checkpoint_bytes + kv_tokens * spec.kv_bytes_per_token,
                       admission, FAMILY)


def _conversations(num_sessions: int) -> list:
    """Chats over one shared system prompt: each first turn branches off the prompt (a dead-tail
    candidate), each later turn continues it (so it must leave the index), and inner evictions merge
    continued leaves away (where the index leaked)."""
    return list(chat_trace(num_sessions=num_sessions, turns=(1, 6), user_len=30, output_len=30,
                           system_prompt_len=200))


def _every_cache(cache: PrefixCache) -> list[PrefixCache]:
    return [cache, *cache.eviction.worlds.values()]


def _run_checking_bounds(cache: PrefixCache, requests: list, check_every: int) -> int:
    """Replay ``requests``; every ``check_every`` requests, every cache (the live one and each
    rule's world) passes ``check_invariants`` and its dead-tail index holds no more entries than
    the tree has nodes. Returns the largest index seen."""
    largest = 0
    for i, req in enumerate(requests, start=1):
        cache.process(req.input_tokens, req.output_tokens)
        if i % check_every == 0 or i == len(requests):
            for c in _every_cache(cache):
                c.check_invariants()
                assert c.num_tail_leaves <= c.tree.num_nodes, (i, c.num_tail_leaves, c.tree.num_nodes)
                largest = max(largest, c.num_tail_leaves)
    return largest


def test_dead_tail_index_holds_only_leaves_of_the_tree():
    """Issue 31, bug 7: entries for nodes that gained a child or left the tree were pruned only when
    a margin existed (continuing chats never have one), so the index grew with the trace (old code:
    134 entries, 125 stale, against a tree of 84 nodes after these 1,062 requests)."""
    cache = _tight_cache("marconi")
    largest = _run_checking_bounds(cache, _conversations(300), check_every=50)
    assert largest > 0  # the trace does exercise the index


@slow
def test_dead_tail_index_stays_bounded_over_tens_of_thousands_of_requests():
    """Issue 31, bug 7 (the long run): ~17,500 requests through the tails family, and a shorter run
    with sparse-dp admission (its DP makes each request ~10x dearer), never hold more index entries
    than tree nodes; every index passes check_invariants along the way."""
    requests = _conversations(5000)
    assert len(requests) > 15_000
    cache = _tight_cache("marconi")
    largest = _run_checking_bounds(cache, requests, check_every=1000)
    assert 0 < largest <= max(c.tree.num_nodes for c in _every_cache(cache)) + 60
    sparse = _tight_cache("sparse-dp")
    _run_checking_bounds(sparse, _conversations(120), check_every=100)


def test_check_invariants_refuses_a_stale_dead_tail_entry():
    """Issue 31, bug 7 (the mechanism): check_invariants looks at the dead-tail index, so an entry
    for a node that left the tree, or one that has children, is an InvariantError."""
    cache = _tight_cache("marconi")
    for req in _conversations(40):
        cache.process(req.input_tokens, req.output_tokens)
    cache.check_invariants()
    inner = next(n for n in cache.tree.iter_nodes() if n.parent is not None and n.children)
    gone = type(inner)(10**9, np.arange(4, dtype=np.int32), None, 4)  # as a node evicted or merged away
    for node, fragment in ((inner, "has children"), (gone, "no longer in the tree")):
        base = node.tail_base
        node.tail_base = max(base, 0)
        cache._tail_leaves[node.node_id] = node
        with pytest.raises(InvariantError, match=fragment):
            cache.check_invariants()
        del cache._tail_leaves[node.node_id]
        node.tail_base = base
    cache.check_invariants()


def test_check_invariants_refuses_a_malformed_ghost():
    """Issue 31, bug 7 (the mechanism): the ghosts of evicted branched leaves are checked too."""
    cache = _tight_cache("marconi")
    for req in _conversations(40):
        cache.process(req.input_tokens, req.output_tokens)
    node = next(n for n in cache.tree.iter_nodes() if n.parent is not None)
    node.ghost = (np.zeros(0, dtype=np.int32), 3, node.node_id)
    with pytest.raises(InvariantError, match="ghost"):
        cache.check_invariants()
    node.ghost = (np.arange(4, dtype=np.int32), -1, node.node_id)
    with pytest.raises(InvariantError, match="negative tail base"):
        cache.check_invariants()
    node.ghost = None
    cache.check_invariants()


# ============================================================================ bug 4: the sparse-DP budget


def _dp_instance(num_candidates: int = 40):
    rng = np.random.default_rng(31)
    weights = rng.random(num_candidates * 5 + 1)
    return weights, np.arange(5, num_candidates * 5 + 1, 5)


@pytest.mark.parametrize("budget", [41, 10**5, 10**9, 10**18])
def test_a_huge_sparse_dp_budget_places_as_the_number_of_candidates(budget):
    """Issue 31, bug 4: a budget of 10**9 built a 10**9-entry list (MemoryError) and 10**5 took
    minutes; the DP now stops at the K candidates, so any budget past K gives budget K's placement."""
    from marconi.core.model import get_model
    from marconi.sparse.dp import flops_cost, place_checkpoints, place_checkpoints_reference

    weights, cands = _dp_instance()
    for cost in (None, flops_cost(get_model("paper-7b"))):
        kw = {} if cost is None else {"cost": cost}
        at_k = place_checkpoints(weights, cands, cands.size, **kw)
        huge = place_checkpoints(weights, cands, budget, curve=False, **kw)
        assert huge.positions == at_k.positions and huge.expected_cost == at_k.expected_cost
    ref = place_checkpoints_reference(weights, cands[:8], budget if budget < 2**20 else 8)
    assert ref.positions == place_checkpoints_reference(weights, cands[:8], 8).positions


def test_a_sparse_dp_curve_past_the_candidates_is_flat_and_a_huge_one_is_refused():
    """Issue 31, bug 4: the curve keeps its M + 1 entries (flat past K, as callers index it) up to a
    bound; past the bound curve=True is a ValueError naming max_checkpoints, not an OOM."""
    from marconi.sparse.dp import place_checkpoints

    weights, cands = _dp_instance(10)
    plan = place_checkpoints(weights, cands, 1000)
    assert len(plan.cost_by_budget) == 1001 and len(set(plan.cost_by_budget[10:])) == 1
    assert plan.positions_by_budget[1000] == plan.positions_by_budget[10] == plan.positions
    with pytest.raises(ValueError, match="max_checkpoints=1,000,000,000 with curve=True.*curve=False"):
        place_checkpoints(weights, cands, 10**9)
    for bad in (-1, 2.5, True, "4"):
        with pytest.raises(ValueError, match="max_checkpoints"):
            place_checkpoints(weights, cands, bad)


def test_sparse_dp_admission_with_a_huge_m_plans_like_m_equal_to_the_candidates():
    """Issue 31, bug 4 (``sparse-dp(m=...)``): the admission policy's budget goes through the same
    clamp, so a policy built in the library with m = 10**9 (the registry now bounds the name's m)
    runs and keeps what m = 1,000 (more than any request's candidates) keeps."""
    from marconi.sparse.admission import SparseDPAdmission
    from marconi.workloads.synthetic import doc_qa_trace

    trace = doc_qa_trace(num_docs=2, doc_len=60, questions_per_doc=4, seed=3)
    assert max(r.input_len for r in trace) < 1000
    spec = get_model("paper-7b")
    cap = 200 * spec.ssm_checkpoint_bytes + 5000 * spec.kv_bytes_per_token
    reused = []
    for m in (10**9, 1000):
        cache = PrefixCache(spec, cap, SparseDPAdmission(m=m, cost="tokens"), "lru")
        for req in trace:
            cache.process(req.input_tokens, req.output_tokens)
        cache.check_invariants()
        reused.append((cache.stats.checkpoints_admitted, cache.stats.kv_tokens_inserted))
    assert reused[0] == reused[1] and reused[0][0] > 0
