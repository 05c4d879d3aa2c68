"""The vLLM-free core of Marconi's CPU-tier policy: the chunk tree, its judgement and eviction.

:class:`ChunkTreePolicy` implements vLLM 0.32's ``CachePolicy`` interface by duck typing over
``OffloadKey`` bytes; :mod:`marconi.integrations.vllm.tier` binds it to vLLM's base class (and
finds its settings inside vLLM's connector), and the ``vllm-align`` emulation's CPU tier
(:mod:`marconi.integrations.vllm.emulate.tier`) runs it without vLLM. Its settings (rules, keys,
checks) are :mod:`marconi.integrations.vllm.tier_settings`. Imports nothing from vLLM.
Semantics and defaults: ``docs/vllm-tiers.md``.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import OrderedDict
from dataclasses import replace
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from marconi.core.candidates import CandidateSet, CandidateTable, LazyEfficiency, flop_efficiency
from marconi.core.eviction import EvictionRule, Rule, choose_victim
from marconi.core.registry import ConfigError
from marconi.integrations.vllm.policy import ATTENTION, MAMBA
from marconi.integrations.vllm.tier_settings import ArcTreeOrder, TierSettings

__all__ = ["ChunkTreePolicy", "TreeJudgement", "reference_victims", "HIT_TRUST_CAP", "REASONS", "COLD_START", "COLD_CAP",
           "make_offload_key", "get_offload_block_hash", "get_offload_group_idx"]

#: cold insertion's count per branch point (:attr:`TierSettings.cold_insert`): where an unseen
#: branch point starts (warm), and its cap (a few unused branches in a row cool a point that
#: served many)
COLD_START, COLD_CAP = 1, 3
#: second chance's trust in hits (:attr:`TierSettings.second_chance`): a count in [-cap, cap], from
#: 0; a hit that ends again where an earlier hit ended adds one, a hit that ends deeper on an
#: earlier hit's path takes one, and a hit grants its node a chance only while the count is >= 0
HIT_TRUST_CAP = 8
#: Why a chunk was evicted (the keys of :attr:`ChunkTreePolicy.eviction_counts`).
REASONS = ("dead-kv", "dead-state", "kv", "state")
_DEAD, _CAND, _OTHER = 0, 1, 2

OffloadKey = bytes


def make_offload_key(block_hash: bytes, group_idx: int) -> OffloadKey:
    """vLLM's ``make_offload_key``: the block hash, then the group index as 4 big-endian bytes."""
    return block_hash + group_idx.to_bytes(4, "big", signed=False)


def get_offload_block_hash(key: OffloadKey) -> bytes:
    """vLLM's ``get_offload_block_hash``."""
    return key[:-4]


def get_offload_group_idx(key: OffloadKey) -> int:
    """vLLM's ``get_offload_group_idx``."""
    return int.from_bytes(key[-4:], "big", signed=False)


class _Node:
    """One block hash held in the tier: its depth, parent hash, its chunk per group, and its standing
    (kept current by every call, as :class:`TreeJudgement` would compute it from scratch): ``kv``
    (a chunk in every attention group), ``state`` (in every Mamba group), ``alive`` (``kv`` and a hit
    can end here or below: ``state``, open, or an alive child), ``kv_kids`` and ``alive_kids``
    (held children with ``kv``, with ``alive``)."""

    __slots__ = ("depth", "parent", "keys", "kv", "state", "alive", "kv_kids", "alive_kids")

    def __init__(self) -> None:
        self.depth: int | None = None
        self.parent: bytes | None = None
        self.keys: dict[int, OffloadKey] = {}
        self.kv = self.state = self.alive = False
        self.kv_kids = self.alive_kids = 0


class _TierRequest:
    """Per-request scratch (``Any.set_state``): hashes by end position, nodes it opened; ``owner`` and
    ``generation`` (the policy's :meth:`ChunkTreePolicy.clear` count when it was made) tell a stale
    one, as vLLM's manager tells its own request state after ``reset_cache``."""

    __slots__ = ("owner", "generation", "by_position", "sorted_positions", "opened")

    def __init__(self, owner: "ChunkTreePolicy") -> None:
        self.owner = owner
        self.generation = owner.generation
        self.by_position: dict[int, bytes] = {}
        self.sorted_positions: list[int] = []     # by_position's keys, ascending (parents by bisection)
        self.opened: set[bytes] = set()


class ChunkTreePolicy:
    """vLLM's ``CachePolicy`` interface (duck-typed, no vLLM import), ranking tier chunks by Marconi's
    utility over the chunk tree.

    Contract (vLLM's): ``evict(n, protected)`` returns exactly ``n`` evictable (``ref_cnt == 0``,
    not in ``protected``) chunks and forgets them, or None and changes nothing. Chunks become
    evictable through ``insert`` with ``ref_cnt == 0`` or ``mark_evictable``.

    Args:
        cache_capacity: chunks in the tier (vLLM passes only this).
        settings: the group kinds, model, rule and load cost (:class:`TierSettings`).

    Keys are vLLM's ``OffloadKey`` bytes (a block hash, then the group index as 4 big-endian
    bytes: :func:`make_offload_key`); a request context needs ``get_state``/``set_state`` and
    ``get_offload_key_position``; a chunk needs ``ref_cnt`` (vLLM's ``Any``: -1 while its
    store is pending).

    ``evict`` is incremental: each node keeps its standing (:class:`_Node`) through every call,
    and each evictable chunk sits in heaps by (category, recency) and, under a FLOP-aware rule,
    by depth (lazy entries, refreshed at the next ``evict`` for the chunks and nodes changed since).
    A victim costs O(log chunks + depths), not O(chunks); the victims are exactly those of
    :func:`reference_victims` (the whole-tree judgement it replaced), given what vLLM's positions
    guarantee: a node's parent is shallower than the node (``tests/test_vllm_tier_incremental.py``).

    **Cold insertion** (``settings.cold_insert``; SHiP's signature-based hit prediction, Wu et al.,
    MICRO 2011, with the branch point as signature). A request's *head* is the first node it stored;
    its *branch point* the node the head hangs from. Each branch point keeps a count in
    [0, :data:`COLD_CAP`] (:data:`COLD_START` when unseen): a head that a later request reuses warms
    its branch point (+1), a head forgotten unreused cools it (−1). A head whose request entered
    cold and that was forgotten unreused, then stored again by a later request (the same block hash:
    as a ghost hit is in ARC, the prediction was wrong, the head was needed), warms its point back
    (+1). Without that, a session whose call entered cold under a point at 0 loses it, stores it
    again under the same point, enters cold again, and keeps the point at 0 for every other head:
    an agent's sessions then hit only the shared prompt, call after call. When a request ends under a
    branch point at 0, its deepest node's chunks (its own tail and the state after it, which no
    other request has shared) take recency stamps below every other chunk's, the newest lowest:
    they go first among candidates, as an insertion at LRU's old end, until a reuse refreshes them.
    Only recency changes; the rule still weighs them. A request whose head has no known parent
    predicts nothing. Where it helps (branches that go unused, as one-off questions under a shared
    prompt) and what it measured: ``docs/vllm-tiers.md``, "Cold insertion".

    **Second chance** (``settings.second_chance``; CLOCK's second chance, given to nodes with evidence
    of reuse). A node gets a chance
    - when it *branches*: a way through it other than its first is seen. A way is a child placed
      under it, or a request whose tier hit ended at its state: the way that request went on (its
      next node), or the node itself where the request stopped there;
    - when a request's tier hit ends at it (the deepest node whose state the request reused: ARC's
      "seen twice", at the node a hit can use). Such a chance, while the node has not branched, is
      withdrawn when a later hit ends deeper on the same path: a chain that grows (a session's
      turns) is served from its newest state, so the states it passed are no longer evidence.
      Whether hits are evidence at all is counted (:data:`HIT_TRUST_CAP`): each node a hit ended at
      is remembered until a hit ends deeper on its path (one down) or ends there again (one up),
      and hits grant chances only while the ups keep pace with the downs. Where every hit is a
      growing chain's (an agent's calls) the count goes negative and hits stop granting, so the
      states they passed no longer push out the newest ones; a repeated prefix brings it back.
    When the rule picks a chunk of a node holding a chance, the chance is spent instead: every
    chunk of the node is refreshed (as a request's end would, in the node's key order) and the pick
    is made again. A shared prefix whose branches were evicted, or a state that served a hit, thus
    outlives one round of one-off tails, where recency alone would take it first, and a stale one
    goes on the next round (one chance at a time: no protection piles up). Dead chunks get none.
    What it measured: ``docs/vllm-tiers.md``, "Second chance".
    """

    def __init__(self, cache_capacity: int, settings: TierSettings) -> None:
        self.cache_capacity = cache_capacity
        self.settings = settings
        kinds = self.settings.group_kinds
        self._attn_groups = tuple(g for g, k in enumerate(kinds) if k == ATTENTION)
        self._mamba_groups = tuple(g for g, k in enumerate(kinds) if k == MAMBA)
        self._is_attn = tuple(k == ATTENTION for k in kinds)
        self._attn_set, self._mamba_set = frozenset(self._attn_groups), frozenset(self._mamba_groups)
        self._chunks: dict[OffloadKey, Any] = {}
        self._seq: dict[OffloadKey, int] = {}
        self._evictable: set[OffloadKey] = set()
        self._nodes: dict[bytes, _Node] = {}
        self._children: dict[bytes, set[bytes]] = {}     # held nodes by their parent hash (held or not)
        self._open: dict[bytes, int] = {}
        # the store misses' depths and parents, for the nodes insert() creates (kept past this store,
        # bounded: a store that failed for room is retried by vLLM without a second on_store_miss)
        self._recent: OrderedDict[bytes, tuple[int, bytes | None]] = OrderedDict()
        self._clock = 0
        self._effs: dict[int, float] = {}
        self.eviction_counts: dict[str, int] = dict.fromkeys(REASONS, 0)
        # the victim index: per evictable chunk its (category, depth, seq) as last indexed; chunks and
        # nodes changed since; heaps of (seq, key) (max heaps: (-seq, key)), stale entries skipped
        self._slot: dict[OffloadKey, tuple[int, int, int]] = {}
        self._dirty_keys: set[OffloadKey] = set()
        self._dirty_seq: set[OffloadKey] = set()        # only their recency changed
        self._dirty_nodes: set[bytes] = set()
        self._mode = _index_mode(settings.rule)
        self._mins: dict[int, list[tuple[int, OffloadKey]]] = {}
        self._maxs: dict[int, list[tuple[int, OffloadKey]]] = {}
        self._levels: dict[int, dict[int, list[tuple[int, OffloadKey]]]] = {}
        self._pushes = 0
        # cold insertion: per branch point its count (only counts != COLD_START, oldest update
        # first, bounded), per unresolved head its branch point and whether its request entered
        # cold, per head that entered cold and was forgotten unreused its branch point (oldest
        # first, bounded), and the cold stamps (negative)
        self._warmth: OrderedDict[bytes, int] = OrderedDict()
        self._heads: dict[bytes, tuple[bytes, bool]] = {}
        self._lost_heads: OrderedDict[bytes, bytes] = OrderedDict()
        self._cold_clock = 0
        # second chance: per parent hash its first child (oldest update first, bounded), and the
        # nodes holding a chance (oldest grant first, bounded), each True if it branched, False if
        # only a hit earned it (a deeper hit withdraws those)
        self._first_kid: OrderedDict[bytes, bytes] = OrderedDict()
        self._chance: OrderedDict[bytes, bool] = OrderedDict()
        # ... and the nodes a hit ended at that no hit has passed since (oldest first, bounded),
        # with the trust they earned hits (HIT_TRUST_CAP)
        self._hit_ends: OrderedDict[bytes, bool] = OrderedDict()
        self._hit_trust = 0
        #: how many times :meth:`clear` ran (a request's scratch from before is stale)
        self.generation = 0
        self._rebuild()

    # ------------------------------------------------------------------ vLLM's interface
    def get(self, key: OffloadKey) -> Any | None:
        return self._chunks.get(key)

    def insert(self, key: OffloadKey, chunk: Any, req_context: Any = None) -> None:
        """A newly allocated chunk (``req_context``: the storing request's, which vLLM 0.33 passes and
        0.32 does not; unused: ``on_store_miss`` has told its position)."""
        group = get_offload_group_idx(key)
        if group >= len(self.settings.group_kinds):
            raise ConfigError(f"MarconiCachePolicy: key of KV cache group {group}, but marconi_group_kinds names "
                              f"{len(self.settings.group_kinds)} groups: fix kv_connector_extra_config "
                              "'marconi_group_kinds'")
        self._chunks[key] = chunk
        self._tick(key)
        block_hash = get_offload_block_hash(key)
        node = self._nodes.get(block_hash)
        if node is None:
            node = self._nodes[block_hash] = _Node()
            kids = self._children.get(block_hash)
            if kids:                        # children held while this node was not: count them again
                nodes = self._nodes
                node.kv_kids = sum(nodes[c].kv for c in kids)
                node.alive_kids = sum(nodes[c].alive for c in kids)
            learned = self._recent.get(block_hash)
            if learned is not None:
                self._place(block_hash, node, *learned)
        node.keys[group] = key
        self._restand(block_hash, node)
        if chunk.ref_cnt == 0:
            self._evictable.add(key)

    def remove(self, key: OffloadKey) -> None:
        self._forget(key)

    def touch(self, keys: Iterable[OffloadKey], req_context: Any) -> None:
        keys = list(keys)
        self._learn(keys, req_context)
        for key in reversed(keys):
            if key in self._chunks:
                self._tick(key)

    def on_store_miss(self, keys: Iterable[OffloadKey], req_context: Any) -> None:
        """Learn the misses' depths and parents, and hold their nodes open until the request ends
        (a running request's KV may be followed by its state next step); no recency change."""
        keys = list(keys)
        state = self._learn(keys, req_context, stash=True)
        for block_hash in {get_offload_block_hash(k) for k in keys} - state.opened:
            state.opened.add(block_hash)
            count = self._open.get(block_hash, 0)
            self._open[block_hash] = count + 1
            if not count:
                self._opened_or_closed(block_hash)

    def on_request_finished(self, key_groups: Sequence[Sequence[OffloadKey]], insertion_only_keys: set[OffloadKey],
                            reused_keys: set[OffloadKey], req_context: Any) -> None:
        keys = [key for group in key_groups for key in group]
        state = self._learn(keys, req_context)
        positions = {k: p for k in keys if (p := req_context.get_offload_key_position(k)) is not None}
        if len(positions) == len(keys):
            keys.sort(key=positions.__getitem__)
        cold = (self._cold_keys(keys, positions, insertion_only_keys, reused_keys, state)
                if self.settings.cold_insert else ())
        if self.settings.second_chance and reused_keys:
            self._saw_hit(keys, positions, reused_keys)
        for key in reversed(keys):          # LRU's order: the head ends most recent
            if key in self._chunks:
                if key in cold:
                    self._cold_clock -= 1
                    self._seq[key] = self._cold_clock
                    self._dirty_seq.add(key)
                else:
                    self._tick(key)
        for block_hash in state.opened:
            left = self._open.get(block_hash, 0) - 1
            if left > 0:
                self._open[block_hash] = left
            elif self._open.pop(block_hash, None) is not None:
                self._opened_or_closed(block_hash)
        state.opened.clear()

    def _cold_keys(self, keys: Sequence[OffloadKey], positions: Mapping[OffloadKey, int],
                   inserted: set[OffloadKey], reused: set[OffloadKey], state: _TierRequest) -> set[OffloadKey]:
        """Cold insertion at a request's end: warm the branch points of the heads it reused, and of
        the cold-entered heads forgotten unreused that it stores again (needed after all), note its
        own head's branch point, and return the keys to stamp cold (its deepest node's, when that
        branch point is at 0; else none)."""
        heads = self._heads
        for key in reused:
            followed = heads.pop(get_offload_block_hash(key), None)
            if followed is not None:
                self._warm(followed[0], +1)
        new = [k for k in keys if k in inserted and k in positions]
        if not new:
            return set()
        lost = self._lost_heads
        if lost:
            for block_hash in dict.fromkeys(get_offload_block_hash(k) for k in new):   # in key order
                back = lost.pop(block_hash, None)
                if back is not None:
                    self._warm(back, +1)
        first = min(positions[k] for k in new)
        head = get_offload_block_hash(next(k for k in new if positions[k] == first))
        branch = state.by_position.get(self._parent_position(first, state))
        if branch is None or branch == head:
            node = self._nodes.get(head)
            branch = node.parent if node is not None else None
        if branch is None or head not in self._nodes:
            return set()
        cold = self._warmth.get(branch, COLD_START) <= 0
        heads[head] = (branch, cold)
        if not cold:
            return set()
        last = max(positions[k] for k in new)
        return {k for k in new if positions[k] == last}

    def _warm(self, branch: bytes, step: int) -> None:
        """Move ``branch``'s count by ``step`` within [0, COLD_CAP]; the table forgets its oldest
        update beyond 4 × capacity + 1,024 branch points (a forgotten one starts again warm)."""
        count = min(COLD_CAP, max(0, self._warmth.pop(branch, COLD_START) + step))
        if count != COLD_START:
            self._remember(self._warmth, branch, count)

    def _remember(self, table: OrderedDict, key: bytes, value: Any) -> None:
        """Set ``table[key]`` as its newest entry, forgetting the oldest beyond
        :meth:`_branch_bound` entries (the bound every branch table keeps)."""
        table.pop(key, None)
        table[key] = value
        if len(table) > self._branch_bound():
            table.popitem(last=False)

    def _branch_bound(self) -> int:
        """How many entries each table for reading the branches keeps: 4 × capacity + 1,024."""
        return 4 * self.cache_capacity + 1024

    def evict(self, n: int, protected: set[OffloadKey]) -> list[tuple[OffloadKey, Any]] | None:
        if n <= 0:
            return []
        if self.num_evictable(protected) < n:
            return None
        out = []
        for key, chunk, reason in self._take(n, protected):
            self.eviction_counts[reason] += 1
            out.append((key, chunk))
        return out

    def clear(self) -> None:
        self.generation += 1        # every request's scratch is stale: its opened nodes went with the tree
        self._chunks.clear()
        self._seq.clear()
        self._evictable.clear()
        self._nodes.clear()
        self._children.clear()
        self._open.clear()
        self._recent.clear()
        self._clock = 0
        self._warmth.clear()
        self._heads.clear()
        self._lost_heads.clear()
        self._cold_clock = 0
        self._first_kid.clear()
        self._chance.clear()
        self._hit_ends.clear()
        self._hit_trust = 0
        self._slot.clear()
        self._dirty_keys.clear()
        self._dirty_seq.clear()
        self._dirty_nodes.clear()
        self._rebuild()

    def mark_evictable(self, key: OffloadKey) -> None:
        self._evictable.add(key)
        self._dirty_keys.add(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self._evictable.discard(key)
        self._dirty_keys.add(key)

    def forget_evicted(self, key: OffloadKey) -> None:
        """Forget ``key``, an idle chunk another order evicted (an adaptive tier's ARC), and count it
        in :attr:`eviction_counts` by its kind (``kv``/``state``; its standing is not judged).
        KeyError for a key not held."""
        self._forget(key)
        self.eviction_counts[self._kind(key)] += 1

    def set_rule(self, rule: Rule) -> None:
        """Rank candidates by ``rule`` from the next ``evict`` on (the chunks held stay; an adaptive
        tier's switch). ConfigError for a rule the tier cannot apply."""
        self.settings = replace(self.settings, rule=rule)
        self._effs.clear()
        mode = _index_mode(rule)
        if mode != self._mode:
            self._mode = mode
            self._rebuild()

    def num_held(self) -> int:
        """Chunks held (pending stores included)."""
        return len(self._chunks)

    def num_evictable(self, protected: set[OffloadKey] = frozenset()) -> int:  # type: ignore[assignment]
        """Chunks ``evict`` may take now (idle, not in ``protected``)."""
        return len(self._evictable) - len(self._evictable.intersection(protected))

    # ------------------------------------------------------------------ the tree
    def held_chunks(self) -> dict[OffloadKey, Any]:
        """Every chunk held, by key (a copy; for checks)."""
        return dict(self._chunks)

    def usable_depths(self) -> list[int]:
        """Depths of the nodes a tier hit could end at (own KV in every attention group and a state
        in every Mamba group), ascending; for tests and reports."""
        view = TreeJudgement(self)
        return sorted(self._nodes[h].depth or 0 for h in self._nodes if view.usable[h])

    def classify(self) -> dict[OffloadKey, str]:
        """Every chunk's standing now: ``"dead"``, ``"candidate"`` or ``"other"`` (for tests)."""
        names = {_DEAD: "dead", _CAND: "candidate", _OTHER: "other"}
        view = TreeJudgement(self)
        return {k: names[view.category(k)] for k in self._chunks}

    def idle_keys(self) -> frozenset[OffloadKey]:
        """The chunks ``evict`` may take before any protection: held, landed and unpinned."""
        return frozenset(self._evictable)

    def recency(self, key: OffloadKey) -> int:
        """``key``'s recency stamp: larger is more recent (the order ``evict`` reads; cold insertion's
        stamps are negative, below every other; KeyError if not held)."""
        return self._seq[key]

    def kind(self, key: OffloadKey) -> str:
        """``"kv"`` for an attention group's chunk, ``"state"`` for a Mamba group's."""
        return self._kind(key)

    def index_entries(self) -> int:
        """Entries in the victim index's heaps, live and stale (for tests: compaction bounds them)."""
        return (sum(map(len, self._mins.values())) + sum(map(len, self._maxs.values()))
                + sum(len(h) for levels in self._levels.values() for h in levels.values()))

    def branch_memory(self) -> dict[str, int]:
        """Entries kept for reading the branches, each table bounded by 4 × capacity + 1,024 (for
        tests and reports): ``warmth`` (branch points whose cold-insertion count is not the
        start's), ``cold_heads`` (unresolved heads whose request entered cold), ``lost_heads`` (such
        heads forgotten unreused), ``first_kids`` (parents whose first child second chance
        remembers), ``chances`` (nodes holding a second chance) and ``hit_ends`` (nodes a hit ended
        at that no hit has passed since)."""
        return {"warmth": len(self._warmth), "cold_heads": sum(cold for _, cold in self._heads.values()),
                "lost_heads": len(self._lost_heads), "first_kids": len(self._first_kid),
                "chances": len(self._chance), "hit_ends": len(self._hit_ends)}

    @property
    def hit_trust(self) -> int:
        """Second chance's trust in hits, in [-:data:`HIT_TRUST_CAP`, :data:`HIT_TRUST_CAP`]: hits
        grant chances while it is >= 0."""
        return self._hit_trust

    def _eff(self, depth: int | None, variant: str | None = None) -> float:
        """FLOPs saved per byte held by a hit at ``depth``, less what the load costs (>= 0); in the
        settings' variant unless ``variant`` names another."""
        if not depth:
            return 0.0
        s = self.settings
        if variant is not None and variant != s.efficiency:
            edge = min(depth, s.tokens_per_chunk or depth)
            return max(0.0, flop_efficiency(s.spec, depth, edge, True, variant) - s.load_flops_per_byte)
        eff = self._effs.get(depth)
        if eff is None:
            edge = min(depth, s.tokens_per_chunk or depth)
            raw = flop_efficiency(s.spec, depth, edge, True, s.efficiency)
            eff = self._effs[depth] = max(0.0, raw - s.load_flops_per_byte)
        return eff

    def _table(self, rows: np.ndarray, seq: np.ndarray, eff: np.ndarray, depth: np.ndarray,
               cat: np.ndarray) -> CandidateTable:
        """The candidate table of ``rows`` (indices into the evict call's pool): recency order for
        both touches, candidacy as the leaf flag, the settings' efficiency, any other on first use."""
        order, d = seq[rows], depth[rows]
        time = order.astype(np.float64)
        cands = CandidateSet.of(rows.tolist(), last_access=time, access_seq=order, path_access=time, path_seq=order,
                                depth=d, has_ssm=np.ones(rows.size, dtype=bool), leaf=cat[rows] == _CAND,
                                edge_len=np.minimum(d, self.settings.tokens_per_chunk or d))
        other = lambda variant: np.array([self._eff(int(x), variant) for x in d], dtype=np.float64)  # noqa: E731
        return CandidateTable(cands, LazyEfficiency({self.settings.efficiency: eff[rows]}, compute=other))

    # ------------------------------------------------------------------ the victim index
    def _push(self, key: OffloadKey, slot: tuple[int, int, int]) -> None:
        cat, depth, seq = slot
        if cat == _DEAD or self._mode == "min":
            heapq.heappush(self._mins[cat], (seq, key))
        elif self._mode == "level":
            heapq.heappush(self._levels[cat].setdefault(depth, []), (seq, key))
            heapq.heappush(self._maxs[cat], (-seq, key))
        self._pushes += 1

    def _rebuild(self) -> None:
        """The heaps afresh from :attr:`_slot` (at a rule switch that changes the index, and when
        stale entries outnumber live ones)."""
        self._mins = {_DEAD: [], _CAND: [], _OTHER: []}
        self._maxs = {_CAND: [], _OTHER: []}
        self._levels = {_CAND: {}, _OTHER: {}}
        mode = self._mode
        for key, (cat, depth, seq) in self._slot.items():
            if cat == _DEAD or mode == "min":
                self._mins[cat].append((seq, key))
            elif mode == "level":
                self._levels[cat].setdefault(depth, []).append((seq, key))
                self._maxs[cat].append((-seq, key))
        for heap in (*self._mins.values(), *self._maxs.values(), *self._levels[_CAND].values(),
                     *self._levels[_OTHER].values()):
            heapq.heapify(heap)
        self._pushes = 0

    def _flush(self) -> None:
        """Index the chunks changed since the last flush (their own, or their node's standing)."""
        keys = self._dirty_keys
        if self._dirty_nodes:
            nodes = self._nodes
            for h in self._dirty_nodes:
                node = nodes.get(h)
                if node is not None:
                    keys.update(node.keys.values())
            self._dirty_nodes.clear()
        slots, seqs = self._slot, self._seq
        if self._dirty_seq:                 # recency alone: the entry moves, its category stays
            mode, mins, levels, maxs, push = self._mode, self._mins, self._levels, self._maxs, heapq.heappush
            for key in self._dirty_seq:
                slot = slots.get(key)
                if slot is None or key in keys:
                    continue                # not indexed (then judged below if evictable), or judged below
                seq = seqs[key]
                if seq != slot[2]:
                    cat, depth = slot[0], slot[1]
                    slots[key] = (cat, depth, seq)
                    if cat == _DEAD or mode == "min":
                        push(mins[cat], (seq, key))
                    elif mode == "level":
                        push(levels[cat].setdefault(depth, []), (seq, key))
                        push(maxs[cat], (-seq, key))
                    self._pushes += 1
            self._dirty_seq.clear()
        if not keys:
            if self._pushes > 2 * len(slots) + 256:
                self._rebuild()
            return
        evictable, nodes, is_attn, opened = self._evictable, self._nodes, self._is_attn, self._open
        for key in keys:
            if key in evictable and key in seqs:
                h = key[:-4]
                node = nodes[h]
                if is_attn[int.from_bytes(key[-4:], "big")]:      # TreeJudgement.category's rule
                    cat = _DEAD if not node.alive else (_CAND if node.kv_kids == 0 else _OTHER)
                elif not ((node.kv and node.state) or h in opened):
                    cat = _DEAD
                else:
                    cat = _CAND if node.kv_kids <= 1 else _OTHER
                slot = (cat, node.depth or 0, seqs[key])
                if slots.get(key) != slot:
                    slots[key] = slot
                    self._push(key, slot)
            else:
                slots.pop(key, None)
        keys.clear()
        if self._pushes > 2 * len(slots) + 256:
            self._rebuild()

    def _top(self, heap: list, cat: int, depth: int | None, sign: int, protected: set[OffloadKey],
             aside: list) -> tuple[int, OffloadKey] | None:
        """The first live entry of ``heap`` (``sign`` -1: a max heap), stale ones dropped and
        ``protected`` ones set ``aside`` (pushed back when the call ends); None if none."""
        slots = self._slot
        while heap:
            entry = heap[0]
            key = entry[1]
            slot = slots.get(key)
            if slot is None or slot[0] != cat or slot[2] != sign * entry[0] or (depth is not None and slot[1] != depth):
                heapq.heappop(heap)
            elif key in protected:
                aside.append((heap, heapq.heappop(heap)))
            else:
                return entry
        return None

    def _take(self, n: int, protected: set[OffloadKey]) -> list[tuple[OffloadKey, Any, str]]:
        """Choose ``n`` victims (the caller checked there are as many), forgetting each as it is
        chosen: dead chunks oldest first (every chunk dead now at once: dead stays dead as chunks
        go), else the rule's pick among the candidates (among every other chunk when none is one).
        Returns (key, chunk, reason) in order."""
        chosen: list[tuple[OffloadKey, Any, str]] = []
        aside: list[tuple[list, tuple[int, OffloadKey]]] = []
        try:
            while len(chosen) < n:
                self._flush()                       # (may rebuild the heaps: read them after it)
                batch = self._dead_batch(n - len(chosen), protected, aside)
                if not batch:
                    key = self._pick(_CAND, protected, aside)
                    if key is None:
                        key = self._pick(_OTHER, protected, aside)
                    assert key is not None, "the victim index lost an evictable chunk"
                    h = get_offload_block_hash(key)
                    if self._chance.pop(h, None) is not None:   # a second chance: refreshed, pick again
                        for k in self._nodes[h].keys.values():
                            self._tick(k)
                        continue
                for key in batch or (key,):
                    chunk = self._chunks[key]
                    assert chunk.ref_cnt == 0, "an evictable chunk is pinned"
                    chosen.append((key, chunk, ("dead-" if batch else "") + self._kind(key)))
                    self._forget(key)
        finally:
            for heap, entry in aside:
                heapq.heappush(heap, entry)
        return chosen

    def _dead_batch(self, limit: int, protected: set[OffloadKey], aside: list) -> list[OffloadKey]:
        """Up to ``limit`` indexed dead chunks not ``protected``, oldest first, out of the index (the
        caller flushed it and forgets them)."""
        dead_heap = self._mins[_DEAD]
        batch: list[OffloadKey] = []
        while len(batch) < limit:
            top = self._top(dead_heap, _DEAD, None, 1, protected, aside)
            if top is None:
                break
            heapq.heappop(dead_heap)
            del self._slot[top[1]]          # a duplicate entry of it is stale now
            batch.append(top[1])
        return batch

    def evict_dead(self, n: int, protected: set[OffloadKey]) -> list[tuple[OffloadKey, Any]]:
        """Evict up to ``n`` idle dead chunks not in ``protected`` (those no hit can use), as
        :meth:`evict` takes them first: oldest first, again after each batch (a chunk gone may leave
        others dead), counted as ``dead-kv``/``dead-state``. Returns them in order; fewer than ``n``
        (possibly none) when no dead chunk is left. For an order that takes the rest by other means
        (``arc-tree``: :class:`~marconi.integrations.vllm.tier_chooser.AdaptiveTierPolicy`)."""
        out: list[tuple[OffloadKey, Any]] = []
        aside: list[tuple[list, tuple[int, OffloadKey]]] = []
        try:
            while len(out) < n:
                self._flush()
                batch = self._dead_batch(n - len(out), protected, aside)
                if not batch:
                    break
                for key in batch:
                    chunk = self._chunks[key]
                    assert chunk.ref_cnt == 0, "an evictable chunk is pinned"
                    self.eviction_counts["dead-" + self._kind(key)] += 1
                    out.append((key, chunk))
                    self._forget(key)
        finally:
            for heap, entry in aside:
                heapq.heappush(heap, entry)
        return out

    def _pick(self, cat: int, protected: set[OffloadKey], aside: list) -> OffloadKey | None:
        """The rule's victim among the indexed chunks of ``cat`` not ``protected``; None if none."""
        mode = self._mode
        if mode == "min":                   # α = 0: every recency transform ranks the oldest first
            top = self._top(self._mins[cat], cat, None, 1, protected, aside)
            return None if top is None else top[1]
        if mode == "generic":
            return self._pick_generic(cat, protected)
        tops = []
        slots = self._slot
        for depth, heap in self._levels[cat].items():
            if not heap:
                continue
            top = heap[0]                   # _top's test, inline for the common case: a live top
            slot = slots.get(top[1])
            if slot is None or slot[0] != cat or slot[1] != depth or slot[2] != top[0] or top[1] in protected:
                top = self._top(heap, cat, depth, 1, protected, aside)
            if top is not None:
                tops.append((top[0], depth, top[1]))
        if not tops:
            return None
        rule = self.settings.rule
        assert isinstance(rule, EvictionRule)
        hi = -self._top(self._maxs[cat], cat, None, -1, protected, aside)[0]
        lo = min(t[0] for t in tops)
        cached = self._effs
        effs = [cached[d] if d in cached else self._eff(d) for _, d, _ in tops]
        elo, ehi = min(effs), max(effs)
        best = None
        # score_rules' arithmetic, term by term (min_max of the recency, plus α times min_max of
        # the efficiency), on each depth's oldest chunk: the same floats, so the same victim
        if rule.recency == "linear":
            flo, fhi = float(lo), float(hi)
            span = fhi - flo
        else:
            vlo, vhi = 1.0 / ((hi - lo) + 1.0), 1.0 / ((hi - hi) + 1.0)
            span = vhi - vlo
        espan = ehi - elo
        alpha = rule.alpha
        for (seq, _, key), eff in zip(tops, effs):
            if span > 0:
                r = (float(seq) - flo) / span if rule.recency == "linear" else (1.0 / ((hi - seq) + 1.0) - vlo) / span
            else:
                r = 0.0
            score = r + alpha * ((eff - elo) / espan if espan > 0 else 0.0)
            if best is None or score < best[0] or (score == best[0] and seq < best[1]):
                best = (score, seq, key)
        return best[2]

    def _pick_generic(self, cat: int, protected: set[OffloadKey]) -> OffloadKey | None:
        """A rule other than :class:`EvictionRule`: its own scores over the whole set (O(chunks))."""
        keys = [k for k, slot in self._slot.items() if slot[0] == cat and k not in protected]
        if not keys:
            return None
        seq = np.fromiter((self._slot[k][2] for k in keys), dtype=np.int64, count=len(keys))
        depth = np.fromiter((self._slot[k][1] for k in keys), dtype=np.int64, count=len(keys))
        eff = np.fromiter((self._eff(int(d)) for d in depth), dtype=np.float64, count=len(keys))
        cats = np.full(len(keys), cat, dtype=np.int8)
        rows = np.arange(len(keys))
        return keys[choose_victim(self.settings.rule, self._table(rows, seq, eff, depth, cats))]

    # ------------------------------------------------------------------ bookkeeping
    def _kind(self, key: OffloadKey) -> str:
        return "kv" if self.settings.group_kinds[get_offload_group_idx(key)] == ATTENTION else "state"

    def _tick(self, key: OffloadKey) -> None:
        self._clock += 1
        self._seq[key] = self._clock
        self._dirty_seq.add(key)

    def _restand(self, h: bytes, node: _Node) -> None:
        """Node ``h``'s keys changed: its ``kv`` and ``state``, its parent's ``kv_kids``, and the
        ``alive`` flips up its chain; every node whose chunks' categories may change is marked."""
        keys = node.keys
        kv = keys.keys() >= self._attn_set
        node.state = keys.keys() >= self._mamba_set
        self._dirty_nodes.add(h)
        if kv != node.kv:
            node.kv = kv
            parent = self._nodes.get(node.parent) if node.parent is not None else None
            if parent is not None:
                parent.kv_kids += 1 if kv else -1
                self._dirty_nodes.add(node.parent)
        self._realive(h, node)

    def _realive(self, h: bytes, node: _Node) -> None:
        """Recompute ``alive`` at ``h`` and carry each flip to the parent's ``alive_kids``, upwards."""
        nodes, opened, dirty = self._nodes, self._open, self._dirty_nodes
        while True:
            now = node.kv and (node.state or node.alive_kids > 0 or h in opened)
            if now == node.alive:
                return
            node.alive = now
            dirty.add(h)
            up = node.parent
            parent = nodes.get(up) if up is not None else None
            if parent is None:
                return
            parent.alive_kids += 1 if now else -1
            h, node = up, parent

    def _opened_or_closed(self, h: bytes) -> None:
        """``h`` entered or left :attr:`_open` (its states' standing, its ``alive``)."""
        node = self._nodes.get(h)
        if node is not None:
            self._dirty_nodes.add(h)
            self._realive(h, node)

    def _forget(self, key: OffloadKey) -> None:
        del self._chunks[key]
        self._seq.pop(key, None)
        self._evictable.discard(key)
        self._slot.pop(key, None)
        block_hash = get_offload_block_hash(key)
        node = self._nodes.get(block_hash)
        if node is None:
            return
        node.keys.pop(get_offload_group_idx(key), None)
        self._restand(block_hash, node)
        if not node.keys:                   # kv and alive are False: its parent no longer counts it
            del self._nodes[block_hash]
            followed = self._heads.pop(block_hash, None)
            if followed is not None:        # a head forgotten unreused: its branch point cools
                branch, cold = followed
                self._warm(branch, -1)
                if cold:                    # ... and it entered cold: remembered, should it come back
                    self._remember(self._lost_heads, block_hash, branch)
            if node.parent is not None:
                siblings = self._children.get(node.parent)
                if siblings is not None:
                    siblings.discard(block_hash)
                    if not siblings:
                        del self._children[node.parent]

    def _learn(self, keys: Sequence[OffloadKey], req_context: Any, *, stash: bool = False) -> _TierRequest:
        """Record the keys' end positions for the request and give held nodes depth and parent
        (``stash``: also for the nodes the coming ``insert`` calls create)."""
        state = req_context.get_state(_TierRequest)
        if state is None or state.owner is not self or state.generation != self.generation:
            state = _TierRequest(self)
            req_context.set_state(state)
        fresh = []
        for key in keys:
            position = req_context.get_offload_key_position(key)
            if position is not None:
                block_hash = get_offload_block_hash(key)
                if position not in state.by_position:
                    insort(state.sorted_positions, position)
                state.by_position[position] = block_hash
                fresh.append((position, block_hash))
        for position, block_hash in fresh:
            parent = state.by_position.get(self._parent_position(position, state))
            if parent == block_hash:
                parent = None
            if stash:
                self._remember(self._recent, block_hash, (position, parent))
            node = self._nodes.get(block_hash)
            if node is not None:
                self._place(block_hash, node, position, parent)
        return state

    def _place(self, block_hash: bytes, node: _Node, depth: int, parent: bytes | None) -> None:
        """Give ``node`` its depth and (if not known yet) its parent, which counts it from now on."""
        if node.depth is None:
            node.depth = depth
            self._dirty_nodes.add(block_hash)
        if node.parent is None and parent is not None:
            if self.settings.second_chance:
                self._saw_child(parent, block_hash)
            node.parent = parent
            self._children.setdefault(parent, set()).add(block_hash)
            up = self._nodes.get(parent)
            if up is not None:
                if node.kv:
                    up.kv_kids += 1
                    self._dirty_nodes.add(parent)
                if node.alive:
                    up.alive_kids += 1
                    self._realive(parent, up)

    def _saw_child(self, parent: bytes, child: bytes) -> None:
        """Second chance: ``child`` is a way through ``parent`` (a child placed under it, or from a
        hit that ended at it the request's next node, or ``parent`` itself where the request stopped
        there); a way other than its first makes ``parent`` a branch point, with a chance no hit
        withdraws. The table forgets its oldest update beyond 4 × capacity + 1,024 parents."""
        first = self._first_kid.get(parent, child)
        self._remember(self._first_kid, parent, first)
        if first != child:
            self._grant(parent, True)

    def _grant(self, h: bytes, branched: bool) -> None:
        """Second chance: give node ``h`` a chance (``branched``: for a new branch, which no hit
        withdraws). The table forgets its oldest grant beyond 4 × capacity + 1,024 nodes."""
        self._remember(self._chance, h, self._chance.get(h, False) or branched)

    def _saw_hit(self, keys: Sequence[OffloadKey], positions: Mapping[OffloadKey, int],
                 reused: set[OffloadKey]) -> None:
        """Second chance at a request's end (``reused``: the keys it reused from the tier): the
        deepest node whose state it reused, where its hit ended, gets a chance while hits are
        trusted, and the way the request went through it (its next node, or the node itself) counts
        as one of the node's ways; the chances that hits alone gave the nodes above it on its path
        are withdrawn (a node that branched keeps its own). Trust: one down per node above it where
        an earlier hit ended (passed), one up if an earlier hit ended at it too (repeated)."""
        mamba = self._mamba_set
        deepest = None
        for k in keys:
            if k in reused and get_offload_group_idx(k) in mamba and k in positions:
                if deepest is None or positions[k] > positions[deepest]:
                    deepest = k
        if deepest is None:
            return
        h = get_offload_block_hash(deepest)
        node = self._nodes.get(h)
        if node is None:
            return
        chance, nodes, ends = self._chance, self._nodes, self._hit_ends
        trust = self._hit_trust
        up, steps = node.parent, 0
        while up is not None and steps < len(nodes):
            if chance.get(up) is False:
                del chance[up]
            if ends.pop(up, None) is not None:
                trust = max(-HIT_TRUST_CAP, trust - 1)
            above = nodes.get(up)
            up = above.parent if above is not None else None
            steps += 1
        if h in ends:
            trust = min(HIT_TRUST_CAP, trust + 1)
        self._hit_trust = trust
        self._remember(ends, h, True)
        if trust >= 0:
            self._grant(h, False)
        # the hit's way through h: the request's next node past it, or h itself where it stopped there
        at = positions[deepest]
        beyond = [(p, k) for k, p in positions.items() if p > at]
        self._saw_child(h, get_offload_block_hash(min(beyond)[1]) if beyond else h)

    def _parent_position(self, position: int, state: _TierRequest) -> int:
        tpc = self.settings.tokens_per_chunk
        if tpc:
            return position - tpc if position % tpc == 0 else position // tpc * tpc
        at = bisect_left(state.sorted_positions, position)    # the nearest earlier position the request told
        return state.sorted_positions[at - 1] if at else -1

    # ------------------------------------------------------------------ checks
    def check_invariants(self) -> None:
        """Recompute the tree from the chunks; AssertionError on drift (of the nodes' kept
        standing and the victim index too)."""
        assert self._evictable <= self._chunks.keys(), "evictable chunk not held"
        for key in self._evictable:
            assert self._chunks[key].ref_cnt == 0, "evictable chunk with ref_cnt != 0"
        for key, chunk in self._chunks.items():
            if chunk.ref_cnt == 0:
                assert key in self._evictable, "idle chunk not evictable"
            node = self._nodes.get(get_offload_block_hash(key))
            assert node is not None and node.keys.get(get_offload_group_idx(key)) == key, "chunk missing from its node"
        assert self._seq.keys() == self._chunks.keys(), "recency rows drifted"
        assert self._heads.keys() <= self._nodes.keys(), "cold insertion follows a head not held"
        assert all(n <= self._branch_bound() for n in self.branch_memory().values()), "a branch table past its bound"
        assert -HIT_TRUST_CAP <= self._hit_trust <= HIT_TRUST_CAP, "hit trust past its cap"
        for h, node in self._nodes.items():
            assert node.keys, "empty node kept"
            assert all(k in self._chunks for k in node.keys.values()), "node names a chunk not held"
            if node.parent is not None:
                assert h in self._children.get(node.parent, ()), "child not listed under its parent"
        for parent, children in self._children.items():
            for child in children:
                assert child in self._nodes and self._nodes[child].parent == parent, "child link drifted"
        view = TreeJudgement(self)
        for h, node in self._nodes.items():
            kept = (node.kv, node.state, node.alive, node.kv_kids, node.alive_kids)
            fresh = (view.kv[h], view.state[h], view.alive[h], view.kv_kids[h], view.alive_kids[h])
            assert kept == fresh, f"kept standing {kept} drifted from a fresh pass {fresh}"
        self._flush()
        assert self._slot.keys() == self._evictable, "victim index drifted from the evictable chunks"
        for key, slot in self._slot.items():
            depth = self._nodes[get_offload_block_hash(key)].depth or 0
            assert slot == (view.category(key), depth, self._seq[key]), "victim index entry drifted"


def _index_mode(rule: Rule) -> str:
    """How the victim index ranks under ``rule``: ``min`` (α = 0: the oldest), ``level`` (α > 0:
    each depth's oldest, normalised as ``score_rules`` does), ``generic`` (another kind of rule: its
    own scores over the whole set). :class:`ArcTreeOrder`: ``min`` (``lru``'s order, its scores)."""
    if isinstance(rule, ArcTreeOrder):
        return "min"
    if isinstance(rule, EvictionRule):
        return "level" if rule.alpha else "min"
    return "generic"


def reference_victims(policy: ChunkTreePolicy, n: int,
                       protected: set[OffloadKey]) -> list[tuple[OffloadKey, str]] | None:
    """The victims (key, reason) ``policy.evict(n, protected)`` takes, by the whole-tree judgement
    it used before its index (a :class:`TreeJudgement` and a candidate table per call, O(chunks)):
    the reference the incremental ``evict`` is held to. A pick whose node holds a second chance
    spends it (on a copy) and refreshes the node's chunks as ``evict`` does. Changes nothing."""
    if n <= 0:
        return []
    pool = [k for k in policy._evictable if k not in protected]
    if len(pool) < n:
        return None
    view = TreeJudgement(policy)
    where = {key: i for i, key in enumerate(pool)}
    seq = np.fromiter((policy._seq[k] for k in pool), dtype=np.int64, count=len(pool))
    cat = np.fromiter((view.category(k) for k in pool), dtype=np.int8, count=len(pool))
    eff = np.fromiter((view.efficiency(k) for k in pool), dtype=np.float64, count=len(pool))
    depth = np.fromiter((policy._nodes[get_offload_block_hash(k)].depth or 0 for k in pool), dtype=np.int64,
                        count=len(pool))
    avail = np.ones(len(pool), dtype=bool)
    rule = policy.settings.rule
    chance, clock = set(policy._chance), policy._clock
    chosen: list[tuple[OffloadKey, str]] = []
    while len(chosen) < n:
        dead = np.flatnonzero(avail & (cat == _DEAD))
        if dead.size:                    # dead stays dead as chunks go: take them oldest first
            picks = dead[np.argsort(seq[dead], kind="stable")][: n - len(chosen)].tolist()
        else:
            cands = np.flatnonzero(avail & (cat == _CAND))
            if not cands.size:
                cands = np.flatnonzero(avail)
            picks = [int(cands[choose_victim(rule, policy._table(cands, seq, eff, depth, cat))])]
            h = get_offload_block_hash(pool[picks[0]])
            if h in chance:                 # evict's second chance: its ticks, on the node's chunks left
                chance.discard(h)
                taken = {k for k, _ in chosen}
                for k in policy._nodes[h].keys.values():
                    if k in taken:
                        continue
                    clock += 1
                    if k in where:
                        seq[where[k]] = clock
                continue
        for i in picks:
            key = pool[i]
            avail[i] = False
            chosen.append((key, ("dead-" if cat[i] == _DEAD else "") + policy._kind(key)))
            for other in view.remove(key):
                j = where.get(other)
                if j is not None and avail[j]:
                    cat[j], eff[j] = view.category(other), view.efficiency(other)
    return chosen


class TreeJudgement:
    """The tree's standing from scratch (per node: KVs held, whole state, ``usable``, ``alive``, KV
    children), built in O(nodes + chunks): :func:`reference_victims`' judgement, and what the
    policy's kept standing is checked against; :meth:`remove` updates only the node and its
    ancestors. Reads the policy's fields, never writes them."""

    def __init__(self, policy: "ChunkTreePolicy") -> None:
        self.p = policy
        nodes = policy._nodes
        self.gone: set[OffloadKey] = set()
        self.kv = {h: all(g in n.keys for g in policy._attn_groups) for h, n in nodes.items()}
        self.state = {h: all(g in n.keys for g in policy._mamba_groups) for h, n in nodes.items()}
        self.usable = {h: self.kv[h] and self.state[h] for h in nodes}
        self.kv_kids = dict.fromkeys(nodes, 0)
        self.alive_kids = dict.fromkeys(nodes, 0)
        self.alive: dict[bytes, bool] = {}
        for h in _children_first(nodes, policy._children):
            parent = nodes[h].parent
            self.alive[h] = alive = self._alive(h)
            if parent in nodes:
                self.kv_kids[parent] += self.kv[h]
                self.alive_kids[parent] += alive

    def _alive(self, h: bytes) -> bool:
        return self.kv[h] and (self.usable[h] or h in self.p._open or self.alive_kids[h] > 0)

    def dead(self, key: OffloadKey) -> bool:
        """Whether no hit can use ``key`` now (its category is the one ``evict`` empties first)."""
        return self.category(key) == _DEAD

    def category(self, key: OffloadKey) -> int:
        h = get_offload_block_hash(key)
        if self.p.settings.group_kinds[get_offload_group_idx(key)] == ATTENTION:
            return _DEAD if not self.alive[h] else (_CAND if self.kv_kids[h] == 0 else _OTHER)
        if not (self.usable[h] or h in self.p._open):
            return _DEAD
        return _CAND if self.kv_kids[h] <= 1 else _OTHER

    def efficiency(self, key: OffloadKey) -> float:
        return self.p._eff(self.p._nodes[get_offload_block_hash(key)].depth)

    def remove(self, key: OffloadKey) -> list[OffloadKey]:
        """Take ``key`` away; the chunks (still present) whose standing may have changed."""
        nodes = self.p._nodes
        self.gone.add(key)
        h = get_offload_block_hash(key)
        was_kv = self.kv[h]
        if self.p.settings.group_kinds[get_offload_group_idx(key)] == ATTENTION:
            self.kv[h] = False
        else:
            self.state[h] = False
        self.usable[h] = self.kv[h] and self.state[h]
        touched = [h]
        parent = nodes[h].parent
        if was_kv and not self.kv[h] and parent in nodes:
            self.kv_kids[parent] -= 1
            touched.append(parent)
        x = h
        while x is not None and x in nodes:        # alive flips travel up the chain
            now = self._alive(x)
            if now == self.alive[x]:
                break
            self.alive[x] = now
            up = nodes[x].parent
            if up in nodes:
                self.alive_kids[up] += 1 if now else -1
                touched.append(up)
            x = up
        return [k for t in touched for k in nodes[t].keys.values() if k not in self.gone]


def _children_first(nodes: Mapping[bytes, _Node], children: Mapping[bytes, set[bytes]]) -> list[bytes]:
    """The held nodes, each after every held child (a post-order over the parent links; by the
    links, not by depth, since a position gap can give a child its parent's depth)."""
    order: list[bytes] = []
    seen: set[bytes] = set()
    for root in nodes:
        if root in seen:
            continue
        seen.add(root)
        stack = [(root, False)]
        while stack:
            h, done = stack.pop()
            if done:
                order.append(h)
                continue
            stack.append((h, True))
            for c in children.get(h, ()):
                if c in nodes and c not in seen:
                    seen.add(c)
                    stack.append((c, False))
    return order
