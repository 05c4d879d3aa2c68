"""Marconi's FLOP-aware eviction for vLLM's block pool: which free cached block goes first.

Instead of vLLM's LRU, the lowest ``normalised recency + α · normalised FLOP efficiency`` among the
candidate free cached blocks (release order as recency). The same :class:`BlockEvictionState` runs
in the vLLM plugin and the ``vllm-align`` emulation, so the simulator reproduces the plugin's
decisions; :func:`reference_victim` is the specification the victim index is held to. No vLLM
imports. Details: ``docs/vllm.md``.
"""

from __future__ import annotations

import math
from operator import itemgetter
from typing import Any, Hashable, Iterable, Mapping, Sequence

import numpy as np

from marconi.core.candidates import CandidateSet, CandidateTable, LazyEfficiency, flop_efficiency
from marconi.core.eviction import EFFICIENCIES, EvictionRule, Rule, check_cuts_tails, choose_victim
from marconi.core.model import ModelSpec
from marconi.core.registry import ConfigError
from marconi.integrations.common.alpha import AlphaSource, RequestObservation
from marconi.integrations.vllm.victim_index import CANDIDATES, OTHERS, VictimIndex

__all__ = ["ATTENTION", "MAMBA", "POLICIES", "DEFAULT_ALPHA", "EFFICIENCIES", "REASONS", "BlockEvictionState", "Victim",
           "block_rule", "index_serves", "parent_depth", "reference_victim"]

ATTENTION = "attention"
MAMBA = "mamba"
POLICIES = ("lru", "marconi")
# 0.5: never below LRU in the emulated sweeps of docs/vllm.md, "The emulation" (SWE, chat and agent
# traces, 60-300 blocks); alpha = 1 wins more on chat but loses up to 2 pp elsewhere.
DEFAULT_ALPHA = 0.5
#: What the pool calls itself in a refused rule's message.
BLOCK_POOL = "vLLM's block pool"
#: Why a block was chosen (``Victim.reason``, ``BlockEvictionState.reason`` indexes it; the plugin's
#: counters and the emulation's eviction stats label evictions with it).
REASONS = ("kv-leaf", "kv-inner", "state", "dead")


class Victim(tuple):
    """``(block_id, reason)``: reason is ``"kv-leaf"``, ``"kv-inner"``, ``"state"`` or ``"dead"``."""

    __slots__ = ()

    def __new__(cls, block_id: int, reason: str) -> "Victim":
        return tuple.__new__(cls, (block_id, reason))

    @property
    def block_id(self) -> int:
        return self[0]

    @property
    def reason(self) -> str:
        return self[1]


class _Prefix:
    """One prefix hash: its parent prefix, depth, the cached blocks of each group (a shared empty
    frozenset for a group holding none: most prefixes hold one group), how many state (Mamba) and
    attention groups hold a block, and its valued verdicts (:data:`_Verdicts`, shared per depth)."""

    __slots__ = ("parent", "depth", "blocks", "n_state", "n_attn", "valued")

    def __init__(self, parent: Hashable | None, depth: int, num_groups: int, valued: "_Verdicts") -> None:
        self.parent = parent
        self.depth = depth
        self.blocks: list[set[int] | frozenset[int]] = [_EMPTY] * num_groups
        self.n_state = 0
        self.n_attn = 0
        self.valued = valued

    def empty(self) -> bool:
        return not any(self.blocks)


class BlockEvictionState:
    """The free cached blocks of one vLLM block pool, with what Marconi needs to rank them.

    The owner (plugin or emulation) reports :meth:`cached`, :meth:`uncached`, :meth:`released` and
    :meth:`taken` in vLLM's order (O(log n) each) and asks :meth:`next_victim`. Prefix hashes may be
    any hashable values; arrays are indexed by block id.

    ``group_kinds``: ``ATTENTION`` or ``MAMBA`` per KV cache group id, in vLLM's order; ``alpha``: the
    α source; ``efficiency``: ``"total"`` or ``"marginal"`` (one block's tokens). ConfigError for an
    unknown efficiency or group kind, or a source naming a rule that cuts dead tails.
    """

    def __init__(self, spec: ModelSpec, group_kinds: Sequence[str], num_blocks: int, block_size: int,
                 alpha: AlphaSource, efficiency: str = "total") -> None:
        if efficiency not in EFFICIENCIES:
            raise ConfigError(f"efficiency must be one of {EFFICIENCIES}, got {efficiency!r}")
        bad = [k for k in group_kinds if k not in (ATTENTION, MAMBA)]
        if bad or not group_kinds:
            raise ConfigError(f"group kinds must be {ATTENTION!r} or {MAMBA!r}, got {list(group_kinds)}")
        self.spec = spec
        self.group_kinds = tuple(group_kinds)
        self.attn_groups = tuple(g for g, k in enumerate(group_kinds) if k == ATTENTION)
        self.mamba_groups = tuple(g for g, k in enumerate(group_kinds) if k == MAMBA)
        self._is_attn = tuple(k == ATTENTION for k in group_kinds)
        self.num_blocks = int(num_blocks)
        self.block_size = int(block_size)
        self.alpha_source = alpha
        self.efficiency = efficiency
        self._num_state_groups = len(self.mamba_groups)
        self._num_attn_groups = len(self.attn_groups)
        self._prefixes: dict[Hashable, _Prefix] = {}
        # Per prefix hash, how many cached child prefixes hold an attention block (a child names its
        # parent when cached; the parent need not be cached): what a judgement asks of the children.
        self._kv_children: dict[Hashable, int] = {}
        self._block_keys: dict[int, list[tuple[Hashable, int]]] = {}   # block id -> its (prefix, group)s
        # The per-block rows are Python lists (a list write costs a fraction of a numpy scalar write,
        # and every event writes a few): the numpy views (free_cached, candidate, release_seq,
        # flop_eff) are built from them on demand, for the scan and the checks.
        self._release_seq = [0] * self.num_blocks
        # Per block its verdict (candidate?, efficiency in every variant in EFFICIENCIES order (an
        # adaptive source may switch between them at any eviction), reason): one shared tuple per
        # depth and kind, so a row write is one pointer and "unchanged" one identity test.
        self._verdict: list[_Verdict] = [_UNKEYED] * self.num_blocks
        self._reason: list[int] = [_DEAD] * self.num_blocks         # its reason, index into REASONS (read: reason)
        # Prefixes whose blocks' rows are stale: cached() marks them (a request caches a chain of
        # blocks in one call, each the parent of the next, so eager refreshes would judge every
        # prefix twice) and _flush judges them once, before anything reads a row or the index.
        self._dirty: set[Hashable] = set()
        # The free cached blocks by (candidate?, efficiencies, release_seq): mirrors the rows above,
        # updated wherever they change, so next_victim needs no scan. _free_seq is release_seq where
        # the block is free and cached, else 0 (release numbers start at 1).
        self._index = VictimIndex(num_blocks, len(EFFICIENCIES))
        self._free_seq = [0] * self.num_blocks
        self._seq = 0
        self._effs_by_depth: dict[int, tuple[float, ...]] = {}      # depth -> efficiency per variant
        self._valued_by_depth: dict[int, _Verdicts] = {}            # depth -> its valued verdicts
        self._checked_rule: tuple[float, str] | None = None        # the last rule _current_rule validated
        self._named: tuple[Any, Rule | None] = (None, None)        # (the source's rule, it if generic)
        self.generic_rule()                                         # refuses a rule the pool cannot apply now
        self._rule = self._current_rule()
        bind = getattr(alpha, "bind", None)
        if bind is not None:         # a source that needs the pool's size or the model (adaptive)
            bind(self)
            self._rule = self._current_rule()

    @property
    def reason(self) -> list[int]:
        """Why each block would be evicted, an index into :data:`REASONS` per block id (the live
        list: read it, do not keep it across events)."""
        if self._dirty:
            self._flush()
        return self._reason

    @property
    def free_cached(self) -> np.ndarray:
        """Whether each block is free and cached (a new array, O(pool): for scans and checks)."""
        return np.array(self._free_seq, dtype=np.int64) > 0

    @property
    def release_seq(self) -> np.ndarray:
        """Each block's last release number (0: never released; a new array, O(pool))."""
        return np.array(self._release_seq, dtype=np.int64)

    @property
    def candidate(self) -> np.ndarray:
        """Whether each block is a candidate (a new array, O(pool))."""
        if self._dirty:
            self._flush()
        return np.fromiter(map(itemgetter(0), self._verdict), dtype=bool, count=self.num_blocks)

    @property
    def flop_eff(self) -> np.ndarray:
        """FLOP efficiency of every block in the configured variant (0 where not cached; a new array)."""
        return self.flop_eff_of(self.efficiency)

    def flop_eff_of(self, variant: str) -> np.ndarray:
        if self._dirty:
            self._flush()
        variant_id = _VARIANT_IDS[variant]
        return np.fromiter((verdict[1][variant_id] for verdict in self._verdict), dtype=np.float64,
                           count=self.num_blocks)

    # ------------------------------------------------------------------ events
    def cached(self, block_id: int, prefix: Hashable, group_id: int, depth: int, parent: Hashable | None) -> None:
        """``block_id`` now answers lookups for ``prefix`` in group ``group_id``."""
        node = self._prefixes.get(prefix)
        if node is None:
            valued = self._valued_by_depth.get(depth)
            if valued is None:
                valued = self._valued(depth)
            node = self._prefixes[prefix] = _Prefix(parent, depth, len(self.group_kinds), valued)
        ids = node.blocks[group_id]
        dirty = self._dirty
        if ids:
            ids.add(block_id)            # a second copy: the group's blocks become duplicates
        else:
            node.blocks[group_id] = {block_id}
            if self._is_attn[group_id]:
                node.n_attn += 1
                # The parent's blocks depend on this prefix only through "does it hold KVs".
                if node.n_attn == 1 and node.parent is not None:
                    kv_children = self._kv_children
                    kv_children[node.parent] = kv_children.get(node.parent, 0) + 1
                    dirty.add(node.parent)
            else:
                node.n_state += 1
        keys = self._block_keys.get(block_id)
        if keys is None:
            self._block_keys[block_id] = [(prefix, group_id)]
        else:
            keys.append((prefix, group_id))
        dirty.add(prefix)

    def uncached(self, block_id: int, prefix: Hashable, group_id: int) -> None:
        """``block_id`` no longer answers lookups for ``prefix`` (evicted or re-keyed)."""
        # The hot path of every eviction: only the blocks whose judgement can change are judged again
        # (the block itself; its group's copies when it was one of two; every block of the prefix
        # when "holds every state" or "holds every attention group" stops holding; the parent's
        # blocks when the prefix's last attention block goes).
        keys = self._block_keys.get(block_id)
        key = (prefix, group_id)
        if keys is None or key not in keys:
            return
        keys.remove(key)
        node = self._prefixes[prefix]
        blocks = node.blocks
        ids = blocks[group_id]
        refresh_all = refresh_parent = False
        if block_id in ids:
            ids.discard(block_id)
            if not ids:
                blocks[group_id] = _EMPTY
                if self._is_attn[group_id]:
                    refresh_all = node.n_attn == self._num_attn_groups      # the states' verdict reads it
                    node.n_attn -= 1
                    if not node.n_attn and node.parent is not None:
                        refresh_parent = True
                        kv_children = self._kv_children
                        left = kv_children[node.parent] - 1
                        if left:
                            kv_children[node.parent] = left
                        else:
                            del kv_children[node.parent]
                else:
                    refresh_all = node.n_state == self._num_state_groups    # every verdict reads it
                    node.n_state -= 1
        if keys:
            self._refresh_block(block_id)
        else:                       # still free, but now a block without a hash: no member, no value
            del self._block_keys[block_id]
            self._free_seq[block_id] = 0
            self._index.discard(block_id)
            self._verdict[block_id] = _UNKEYED
            self._reason[block_id] = _DEAD
        if not node.n_attn and not node.n_state:
            del self._prefixes[prefix]
        elif refresh_all:
            self._refresh_node(node, prefix)
        elif len(ids) == 1:         # the copy left alone is no duplicate any more
            self._refresh_node(node, prefix, group_id)
        if refresh_parent:
            self._refresh_prefix(node.parent)

    def released(self, block_id: int) -> None:
        """A cached block entered the free queue: it is a candidate from now, recency = now."""
        if self._dirty:
            self._flush()
        self._seq += 1
        self._release_seq[block_id] = self._free_seq[block_id] = seq = self._seq
        verdict = self._verdict[block_id]
        self._index.place(block_id, CANDIDATES if verdict[0] else OTHERS, verdict[1], seq)

    def taken(self, block_id: int) -> None:
        """A block left the free queue (hit or allocation)."""
        self._free_seq[block_id] = 0
        self._index.discard(block_id)

    @property
    def num_free_cached(self) -> int:
        """Free cached blocks (``free_cached.sum()``, in O(1))."""
        return len(self._index)

    def finished(self, event: RequestObservation) -> tuple[float, str] | None:
        """Show a finished request to the α source; the new ``(alpha, efficiency)`` if the rule of the
        next eviction changed, else None."""
        self.alpha_source.observe(event)
        rule = self._current_rule()
        if rule == self._rule:
            return None
        self._rule = rule
        return rule

    def generic_rule(self) -> Rule | None:
        """The rule the generic path applies at the next victim: the source's named rule (``rule``)
        when the victim index does not serve it, else None (the index decides by ``(alpha,
        efficiency)``). ConfigError for a rule that cuts dead tails."""
        rule = getattr(self.alpha_source, "rule", None)
        if rule is None:
            return None
        named = self._named
        if rule is not named[0]:         # (a ``rule`` that is no Rule is some source's own business)
            generic = (None if index_serves(rule) or not isinstance(rule, Rule)
                       else check_cuts_tails(rule, BLOCK_POOL, False))
            self._named = named = (rule, generic)
        return named[1]

    def _current_rule(self) -> tuple[float, str]:
        source = self.alpha_source
        alpha = float(source.alpha())
        variant = source.efficiency() or self.efficiency
        checked = self._checked_rule
        if checked is not None and alpha == checked[0] and variant == checked[1]:
            return checked              # checked before (every victim asks: the checks cost as much as the pick)
        if variant not in EFFICIENCIES:
            raise ConfigError(f"alpha source {self.alpha_source!r} named efficiency {variant!r}; "
                              f"choose one of {EFFICIENCIES}")
        if not math.isfinite(alpha) or alpha < 0:
            raise ConfigError(f"alpha source {self.alpha_source!r} gave alpha {alpha}; it must be finite and >= 0")
        self._checked_rule = (alpha, variant)
        return alpha, variant

    def keys_of(self, block_id: int) -> tuple[tuple[Hashable, int], ...]:
        """The ``(prefix, group)`` keys ``block_id`` answers lookups for (empty: none)."""
        return tuple(self._block_keys.get(block_id, ()))

    def prefix_info(self, prefix: Hashable) -> tuple[int, Hashable | None]:
        """``(depth, parent prefix)`` of a cached prefix (KeyError if nothing holds it)."""
        node = self._prefixes[prefix]
        return node.depth, node.parent

    def clear(self) -> None:
        """Every hash dropped (vLLM's ``reset_prefix_cache``)."""
        self._prefixes.clear()
        self._kv_children.clear()
        self._block_keys.clear()
        self._verdict = [_UNKEYED] * self.num_blocks
        self._reason = [_DEAD] * self.num_blocks
        self._dirty.clear()
        self._free_seq = [0] * self.num_blocks
        self._index.clear()

    # ------------------------------------------------------------------ the decision
    def next_victim(self) -> Victim | None:
        """The free cached block to evict next, or None when there is none; changes nothing. Exactly
        :func:`reference_victim`'s choice under the α source's current rule, in O(1) at α = 0 and
        O(L) over L distinct prefix depths otherwise."""
        if not len(self._index):
            return None
        if self._dirty:
            self._flush()
        generic = self.generic_rule()
        if generic is not None:
            return reference_victim(self, generic)
        alpha, variant = self._current_rule()
        block = self._index.victim(alpha, _VARIANT_IDS[variant])
        assert block is not None
        return tuple.__new__(Victim, (block, REASONS[self._reason[block]]))   # Victim(...) less a frame: hot path

    def table(self, blocks: np.ndarray, candidates: bool) -> CandidateTable:
        """The candidate table of ``blocks`` (free cached block ids): release order as both touches'
        recency, ``candidates`` as the leaf flag, efficiency per variant on first use."""
        seq = self.release_seq[blocks]
        keys, prefixes = self._block_keys, self._prefixes
        depth = np.fromiter((max((prefixes[k].depth for k, _ in keys.get(b, ())), default=0) for b in blocks.tolist()),
                            dtype=np.int64, count=blocks.size)
        time = seq.astype(np.float64)
        cands = CandidateSet.of(blocks.tolist(), last_access=time, access_seq=seq, path_access=time, path_seq=seq,
                                depth=depth, edge_len=np.minimum(depth, self.block_size),
                                has_ssm=np.full(blocks.size, bool(self.mamba_groups)),
                                leaf=np.full(blocks.size, candidates))
        return CandidateTable(cands, LazyEfficiency({}, compute=lambda variant: self.flop_eff_of(variant)[blocks]))

    def describe(self) -> dict[str, Any]:
        generic = self.generic_rule()
        if generic is not None:
            return {"eviction": "marconi-blocks", "rule": generic.label(), "alpha_source": repr(self.alpha_source)}
        alpha, variant = self._current_rule()
        return {"eviction": "marconi-blocks", "alpha": alpha, "efficiency": variant,
                "alpha_source": repr(self.alpha_source)}

    # ------------------------------------------------------------------ bookkeeping
    def _flush(self) -> None:
        """Judge the blocks of every prefix cached() marked (each once), as eagerly as before."""
        dirty, self._dirty = self._dirty, set()
        for prefix in dirty:
            self._refresh_prefix(prefix)

    def _refresh_prefix(self, prefix: Hashable) -> None:
        node = self._prefixes.get(prefix)
        if node is not None:
            self._refresh_node(node, prefix)

    def _verdicts(self, node: _Prefix, prefix: Hashable) -> tuple["_Verdict", "_Verdict"]:
        """The verdicts of ``node``'s attention blocks and of its state blocks, each the only copy in
        its group: :meth:`_judge` from the node's counts (the same answers, no set read)."""
        kv_children = self._kv_children.get(prefix, 0)
        valued = node.valued
        if node.n_state != self._num_state_groups:              # not every state: nothing a hit can use
            return (_INNER if kv_children else _WORTHLESS), _WORTHLESS
        attn = _INNER if kv_children else valued[0]
        if node.n_attn != self._num_attn_groups:
            return attn, _WORTHLESS
        return attn, (valued[1] if kv_children <= 1 else valued[2])

    def _refresh_node(self, node: _Prefix, prefix: Hashable, only_group: int = -1) -> None:
        """Bring the rows (and the index) of ``node``'s blocks, or of group ``only_group``'s, up to date."""
        attn, state = self._verdicts(node, prefix)
        is_attn, block_keys = self._is_attn, self._block_keys
        verdicts, reasons, free_seq = self._verdict, self._reason, self._free_seq
        for group_id, ids in enumerate(node.blocks):
            if not ids or (only_group >= 0 and group_id != only_group):
                continue
            verdict = (attn if is_attn[group_id] else state) if len(ids) == 1 else _WORTHLESS
            for block_id in ids:
                if verdicts[block_id] is verdict:
                    continue            # unchanged: the rows and the index already say so
                if len(block_keys[block_id]) > 1:                 # its deepest key decides
                    self._refresh_block(block_id)
                    continue
                verdicts[block_id] = verdict
                reasons[block_id] = verdict[2]
                seq = free_seq[block_id]
                if seq:                 # a member (not free: no member, see taken and uncached)
                    self._index.place(block_id, CANDIDATES if verdict[0] else OTHERS, verdict[1], seq)

    def _refresh_block(self, block_id: int) -> None:
        keys = self._block_keys.get(block_id)
        if not keys:
            verdict = _UNKEYED
        else:
            # A block holds one primary hash; partial (sub-block) entries are extra lookup keys on the
            # same block. Rank it by its deepest key: that is the prefix its contents complete.
            prefix, group_id = keys[0] if len(keys) == 1 else max(keys, key=lambda k: self._prefixes[k[0]].depth)
            node = self._prefixes[prefix]
            if len(node.blocks[group_id]) > 1:
                verdict = _WORTHLESS
            else:
                attn, state = self._verdicts(node, prefix)
                verdict = attn if self._is_attn[group_id] else state
        if verdict is self._verdict[block_id]:
            return                  # unchanged: the rows and the index already say so
        self._verdict[block_id] = verdict
        self._reason[block_id] = verdict[2]
        seq = self._free_seq[block_id]
        if seq:                     # a member (not free: no member, see taken and uncached)
            self._index.place(block_id, CANDIDATES if verdict[0] else OTHERS, verdict[1], seq)

    def _judge(self, node: _Prefix, prefix: Hashable, group_id: int,
               kv_children: Mapping[Hashable, int]) -> tuple[bool, bool, int]:
        """``(candidate, holds something a hit can use, reason)`` of a block keyed ``prefix``, from
        the sets alone (the definition :meth:`check_invariants` holds the counted verdicts to;
        ``kv_children``: per prefix, its child prefixes holding attention blocks)."""
        blocks = node.blocks
        if len(blocks[group_id]) > 1:                   # a duplicate: another copy serves the hits
            return True, False, _DEAD
        kv = kv_children.get(prefix, 0)
        has_state = all(map(blocks.__getitem__, self.mamba_groups))
        if self.group_kinds[group_id] == ATTENTION:
            if kv:
                return False, False, _KV_INNER
            if not has_state:
                return True, False, _DEAD
            return True, True, _KV_LEAF
        if not (has_state and all(map(blocks.__getitem__, self.attn_groups))):
            return True, False, _DEAD
        return kv <= 1, True, _STATE

    def _valued(self, depth: int) -> "_Verdicts":
        """The verdicts of a block holding something a hit can use at ``depth`` (shared per depth)."""
        effs = self._effs(depth)
        valued = self._valued_by_depth[depth] = ((True, effs, _KV_LEAF), (True, effs, _STATE), (False, effs, _STATE))
        return valued

    def _effs(self, depth: int) -> tuple[float, ...]:
        """FLOP efficiency of a ``depth``-token prefix per variant (EFFICIENCIES order), as the exact
        float64 values the victim index keys its levels by."""
        effs = self._effs_by_depth.get(depth)
        if effs is None:
            edge = min(depth, self.block_size)
            effs = self._effs_by_depth[depth] = tuple(
                float(np.float64(flop_efficiency(self.spec, depth, edge, bool(self.mamba_groups), variant)))
                for variant in EFFICIENCIES)
        return effs

    # ------------------------------------------------------------------ checks
    def check_invariants(self, cached_keys: Iterable[tuple[int, Hashable, int]] | None = None) -> None:
        """Recompute the derived arrays from scratch; with ``cached_keys`` (block id, prefix, group)
        also check the index holds exactly those. Raises AssertionError on drift."""
        if cached_keys is not None:
            expected: dict[int, set[tuple[Hashable, int]]] = {}
            for block_id, prefix, group_id in cached_keys:
                expected.setdefault(block_id, set()).add((prefix, group_id))
            got = {b: set(k) for b, k in self._block_keys.items()}
            assert got == expected, f"index drifted: {len(got)} blocks indexed, {len(expected)} cached"
        if self._dirty:
            self._flush()
        kv_children: dict[Hashable, int] = {}
        for prefix, node in self._prefixes.items():
            assert not node.empty(), f"empty prefix {prefix!r} kept"
            assert all(isinstance(ids, set) and ids for ids in node.blocks if ids), "an empty group set kept"
            assert node.n_state == sum(map(bool, map(node.blocks.__getitem__, self.mamba_groups))), "state count drifted"
            assert node.n_attn == sum(map(bool, map(node.blocks.__getitem__, self.attn_groups))), "attention count drifted"
            assert node.valued == self._valued_by_depth[node.depth], "verdicts of another depth"
            if node.parent is not None and node.n_attn:
                kv_children[node.parent] = kv_children.get(node.parent, 0) + 1
        assert kv_children == self._kv_children, "KV children counts drifted"
        self._check_index()
        assert self._reason == [verdict[2] for verdict in self._verdict], "reason rows drifted"
        snapshot = ([v[0] for v in self._verdict], [v[1] for v in self._verdict], list(self._reason))
        recomputed = [self._judged(block_id, kv_children) for block_id in range(self.num_blocks)]
        for name, before, after in zip(("candidate", "efficiency", "reason"), snapshot, zip(*recomputed)):
            assert before == list(after), f"stale {name} rows"      # recomputed from the prefixes' sets alone

    def _judged(self, block_id: int, kv_children: Mapping[Hashable, int]) -> tuple[bool, tuple[float, ...], int]:
        """``(candidate, effs, reason)`` of a block from the prefixes alone (the rows' definition)."""
        keys = self._block_keys.get(block_id)
        if not keys:
            return False, _NO_EFFS, _DEAD
        prefix, group_id = max(keys, key=lambda k: self._prefixes[k[0]].depth)
        node = self._prefixes[prefix]
        cand, valued, reason = self._judge(node, prefix, group_id, kv_children)
        return cand, self._effs(node.depth) if valued else _NO_EFFS, reason

    def _check_index(self) -> None:
        """The victim index holds exactly the free cached blocks, as their rows say."""
        assert all(f in (0, r) for f, r in zip(self._free_seq, self._release_seq)), "free_seq mirror drifted"
        expected = {b: (CANDIDATES if self._verdict[b][0] else OTHERS, self._verdict[b][1], f)
                    for b, f in enumerate(self._free_seq) if f}
        self._index.check_invariants(expected)


def reference_victim(state: BlockEvictionState, rule: Rule | None = None) -> Victim | None:
    """The victim of ``rule`` (default: the pool's live rule) by an O(pool) scan: the core's
    :func:`~marconi.core.eviction.choose_victim` over :meth:`BlockEvictionState.table` of the
    candidates (of all free cached blocks if none is one). The specification of the victim index
    for the rules :func:`index_serves`, the decision itself for any other."""
    free = np.flatnonzero(state.free_cached)
    if free.size == 0:
        return None
    candidate = state.candidate[free]
    pool = free[candidate]
    if pool.size == 0:
        pool = free
    if rule is None:
        rule = state.generic_rule()
        if rule is None:
            alpha, variant = state._current_rule()
            rule = EvictionRule(alpha, variant)
    block = int(pool[choose_victim(rule, state.table(pool, bool(candidate.any())))])
    return Victim(block, REASONS[state.reason[block]])


def index_serves(rule: Rule) -> bool:
    """Whether the victim index applies ``rule`` exactly: FLOP-aware rules with linear recency (any at
    α = 0) that cut no tails; touch and candidates do not change a block decision."""
    return (isinstance(rule, EvictionRule) and not rule.tails
            and (rule.recency == "linear" or rule.alpha == 0))


def block_rule(rule: Rule) -> tuple[float, str | None]:
    """``(alpha, efficiency)`` with which the victim index applies ``rule`` (efficiency None at
    α = 0): ``lru`` -> α = 0, ``aX``/``aXm`` -> α = X on the total/marginal efficiency. ConfigError
    for a rule the index does not serve (:func:`index_serves`)."""
    if not index_serves(rule):
        check_cuts_tails(rule, BLOCK_POOL, False)
        raise ConfigError(f"adaptive rule {rule.label()!r} has no counterpart in the victim index of {BLOCK_POOL}, "
                          "which an adaptive alpha drives: use lru, aX (whole-prefix efficiency) or aXm (marginal), "
                          "e.g. lru/a0.5m/a2m")
    assert isinstance(rule, EvictionRule)
    return rule.alpha, rule.efficiency.value if rule.alpha else None


def parent_depth(depth: int, block_size: int) -> int:
    """Depth of the block a ``depth``-token prefix continues (0: none): the previous block boundary."""
    return (depth - 1) // block_size * block_size


_KV_LEAF, _KV_INNER, _STATE, _DEAD = range(len(REASONS))     # indices into REASONS
_VARIANT_IDS = {variant: i for i, variant in enumerate(EFFICIENCIES)}   # the victim index's effs order
_NO_EFFS = (0.0,) * len(EFFICIENCIES)                                 # a block holding nothing a hit can use
_EMPTY: frozenset[int] = frozenset()                                 # a group of a prefix holding no block
# A judgement as the rows hold it: (candidate, efficiency per variant, reason); _Verdicts: a depth's
# valued ones (an attention leaf, a state that is a candidate, a state kept for its two children).
_Verdict = tuple[bool, tuple[float, ...], int]
_Verdicts = tuple[_Verdict, _Verdict, _Verdict]
_INNER: _Verdict = (False, _NO_EFFS, _KV_INNER)                       # attention below a child's attention
_WORTHLESS: _Verdict = (True, _NO_EFFS, _DEAD)                        # a duplicate, or nothing a hit can use
_UNKEYED: _Verdict = (False, _NO_EFFS, _DEAD)                         # no hash at all
