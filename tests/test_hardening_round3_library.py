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
