"""Marconi's FLOP-aware eviction for vLLM's block pool: which free cached block goes first.

Instead of vLLM's LRU, the lowest ``normalised recency + α · normalised FLOP efficiency`` among the
candidate free cached blocks (release order as recency). The same :class:`BlockEvictionState` runs
in the vLLM plugin and the ``vllm-align`` emulation, so the simulator reproduces the plugin's
decisions; :func:`reference_victim` is the specification the victim index is held to. No vLLM
imports. Details: ``docs/vllm.md``.
"""

from __future__ import annotations

import math
from functools import partial
from operator import itemgetter
from typing import Any, Hashable, Iterable, Sequence

import numpy as np

from marconi.core.candidates import CandidateSet, CandidateTable, LazyEfficiency, flop_efficiency
from marconi.core.eviction import EFFICIENCIES, EvictionRule, Rule, check_cuts_tails, choose_victim
from marconi.core.model import ModelSpec
from marconi.core.registry import ConfigError
from marconi.integrations.common.alpha import AlphaSource, RequestObservation
from marconi.integrations.vllm.blockcore import DEAD, KV_INNER, KV_LEAF, STATE, PyBlockCore, new_core
from marconi.integrations.vllm.victim_index import CANDIDATES, OTHERS

__all__ = ["ATTENTION", "MAMBA", "group_kinds", "POLICIES", "DEFAULT_ALPHA", "EFFICIENCIES", "REASONS", "BlockEvictionState", "Victim",
           "block_rule", "index_serves", "judge", "parent_depth", "reference_victim"]

ATTENTION = "attention"
MAMBA = "mamba"


def group_kinds(kv_cache_config: Any, who: str, fix: str) -> list[str]:
    """Each of vLLM's KV cache groups (``kv_cache_config.kv_cache_groups``) as :data:`ATTENTION` or
    :data:`MAMBA`, by its spec's class: vLLM's ``MambaSpec``, ``FullAttentionSpec`` or a subclass
    (matched by the class names, so no vLLM import). ConfigError for any other kind, naming ``who``
    refuses it, the group and its spec, and ``fix``."""
    kinds = []
    for index, group in enumerate(kv_cache_config.kv_cache_groups):
        spec = group.kv_cache_spec
        lineage = {cls.__name__ for cls in type(spec).__mro__}
        if "MambaSpec" in lineage:
            kinds.append(MAMBA)
        elif "FullAttentionSpec" in lineage:
            kinds.append(ATTENTION)
        else:
            raise ConfigError(f"{who}: KV cache group {index} is {type(spec).__name__} (full attention and Mamba "
                              f"only): {fix}")
    return kinds


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



class BlockEvictionState:
    """The free cached blocks of one vLLM block pool, with what Marconi needs to rank them.

    The owner (plugin or emulation) reports, in vLLM's order (O(log n) each):

    * ``cached(block_id, prefix, group_id, depth, parent)``: ``block_id`` now answers lookups for
      ``prefix`` (a ``depth``-token prefix continuing ``parent``, None for none) in group ``group_id``;
    * ``uncached(block_id, prefix, group_id)``: it no longer does (evicted or re-keyed);
    * ``released(block_id)``: a cached block entered the free queue (recency = now);
    * ``taken(block_id)``: a block left the free queue (hit or allocation);

    and asks :meth:`next_victim`, or has :meth:`evict` pick and drop victims in one call. These four are the core's own methods (:mod:`blockcore`: compiled
    when built, else Python; the same choices), bound on the instance so an event costs no frame
    here. Prefix hashes may be any hashable values; arrays are indexed by block id.

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
        self.num_blocks = int(num_blocks)
        self.block_size = int(block_size)
        self.alpha_source = alpha
        self.efficiency = efficiency
        self._core = core = new_core(tuple(k == ATTENTION for k in group_kinds), self.num_blocks, len(EFFICIENCIES),
                                     partial(_depth_effs, spec, self.block_size, bool(self.mamba_groups)))
        self.cached, self.uncached, self.released, self.taken = core.cached, core.uncached, core.released, core.taken
        self._checked_rule: tuple[float, str] | None = None        # the last rule _current_rule validated
        # (rule_version, alpha, variant id) read last from a source that keeps a rule_version (evict)
        self._known_rule: tuple[Any, float, int] = (None, 0.0, 0)
        self._named: tuple[Any, Rule | None] = (None, None)        # (the source's rule, it if generic)
        self.generic_rule()                                         # refuses a rule the pool cannot apply now
        self._rule = self._current_rule()
        bind = getattr(alpha, "bind", None)
        if bind is not None:         # a source that needs the pool's size or the model (adaptive)
            bind(self)
            self._rule = self._current_rule()

    @property
    def core(self) -> str:
        """Which core runs: ``"c"`` (compiled) or ``"python"``."""
        return "python" if isinstance(self._core, PyBlockCore) else "c"

    @property
    def reason(self) -> list[int]:
        """Why each block would be evicted, an index into :data:`REASONS` per block id (the live
        list: read it, do not keep it across events)."""
        return self._core.reason

    @property
    def free_cached(self) -> np.ndarray:
        """Whether each block is free and cached (a new array, O(pool): for scans and checks)."""
        return np.array(self._core.rows()[0], dtype=np.int64) > 0

    @property
    def release_seq(self) -> np.ndarray:
        """Each block's last release number (0: never released; a new array, O(pool))."""
        return np.array(self._core.rows()[1], dtype=np.int64)

    @property
    def candidate(self) -> np.ndarray:
        """Whether each block is a candidate (a new array, O(pool))."""
        return np.fromiter(map(itemgetter(0), self._core.rows()[2]), dtype=bool, count=self.num_blocks)

    @property
    def flop_eff(self) -> np.ndarray:
        """FLOP efficiency of every block in the configured variant (0 where not cached; a new array)."""
        return self.flop_eff_of(self.efficiency)

    def flop_eff_of(self, variant: str) -> np.ndarray:
        variant_id = _VARIANT_IDS[variant]
        return np.fromiter((verdict[1][variant_id] for verdict in self._core.rows()[2]), dtype=np.float64,
                           count=self.num_blocks)

    @property
    def num_free_cached(self) -> int:
        """Free cached blocks (``free_cached.sum()``, in O(1))."""
        return len(self._core)

    def finished(self, event: RequestObservation) -> tuple[float, str] | None:
        """Show a finished request to the α source; the new ``(alpha, efficiency)`` if the rule of the
        next eviction changed, else None. A source that settles lazily (``settles_lazily``: the shadow
        replayed in a process at lag 0) is not waited for here: a switch it made is reported at the
        first finish after an eviction read it (the evictions apply it at once)."""
        source = self.alpha_source
        if getattr(source, "settles_lazily", False):
            # read without waiting only where an eviction has settled it since the last observe
            rule = self._rule if source.unsettled else self._current_rule()
            source.observe(event)
        else:
            source.observe(event)
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
        return self._core.keys_of(block_id)

    def prefix_info(self, prefix: Hashable) -> tuple[int, Hashable | None]:
        """``(depth, parent prefix)`` of a cached prefix (KeyError if nothing holds it)."""
        return self._core.prefix_info(prefix)

    def clear(self) -> None:
        """Every hash dropped (vLLM's ``reset_prefix_cache``)."""
        self._core.clear()

    # ------------------------------------------------------------------ the decision
    def next_victim(self) -> Victim | None:
        """The free cached block to evict next, or None when there is none; changes nothing. Exactly
        :func:`reference_victim`'s choice under the α source's current rule, in O(1) at α = 0 and
        O(L) over L distinct prefix depths otherwise."""
        core = self._core
        if not len(core):
            return None
        # The hot path of every eviction (a compiled core picks in ~0.1 µs): generic_rule and
        # _current_rule inlined while the source's rule is the one checked last.
        source = self.alpha_source
        rule = getattr(source, "rule", None)
        if rule is not None and (rule is not self._named[0] or self._named[1] is not None):
            generic = self.generic_rule()
            if generic is not None:
                return reference_victim(self, generic)
        alpha = source.alpha()
        variant = source.efficiency() or self.efficiency
        checked = self._checked_rule
        if checked is None or alpha != checked[0] or variant != checked[1] or alpha.__class__ is not float:
            alpha, variant = self._current_rule()
        block, reason = core.victim(alpha, _VARIANT_IDS[variant])
        return tuple.__new__(Victim, (block, REASONS[reason]))   # Victim(...) less a frame

    def evict(self, count: int) -> list[tuple[int, int]]:
        """Evict up to ``count`` victims, one after another: each is :meth:`next_victim`'s choice once
        the one before is gone (taken, and ``uncached`` for each of its keys, here; its parent may be
        the next leaf). Returns ``[(block id, reason id)]`` (``REASONS`` indexes the ids), fewer when
        no free cached block is left. The α source is read once: nothing it observes can arrive
        within one allocation. The caller drops the same keys from its own hash map (``keys_of``
        named them; the plugin's hooks hold vLLM's map equal to them). Same choices as
        ``next_victim``, ``taken``, ``uncached`` in a loop; one call into the core, not three a victim."""
        source = self.alpha_source
        version = getattr(source, "rule_version", None)
        known = self._known_rule
        if version is not None and known[0] == version:       # the source's rule has not moved
            return self._core.evict(known[1], known[2], count)
        rule = getattr(source, "rule", None)
        if rule is not None and (rule is not self._named[0] or self._named[1] is not None):
            generic = self.generic_rule()
            if generic is not None:
                return self._evict_scanned(generic, count)
        alpha = source.alpha()
        variant = source.efficiency() or self.efficiency
        checked = self._checked_rule
        if checked is None or alpha != checked[0] or variant != checked[1] or alpha.__class__ is not float:
            alpha, variant = self._current_rule()
        if version is not None:
            self._known_rule = (version, alpha, _VARIANT_IDS[variant])
        return self._core.evict(alpha, _VARIANT_IDS[variant], count)

    def _evict_scanned(self, rule: Rule, count: int) -> list[tuple[int, int]]:
        """:meth:`evict` for a rule the index does not serve: each victim by the scan."""
        core = self._core
        out = []
        for _ in range(count):
            victim = reference_victim(self, rule)
            if victim is None:
                break
            block = victim[0]
            out.append((block, core.reason[block]))
            core.taken(block)
            for prefix, group in core.keys_of(block):
                core.uncached(block, prefix, group)
        return out

    def table(self, blocks: np.ndarray, candidates: bool) -> CandidateTable:
        """The candidate table of ``blocks`` (free cached block ids): release order as both touches'
        recency, ``candidates`` as the leaf flag, efficiency per variant on first use."""
        seq = self.release_seq[blocks]
        core = self._core
        depth = np.fromiter((max((core.prefix_info(p)[0] for p, _ in core.keys_of(b)), default=0)
                             for b in blocks.tolist()), dtype=np.int64, count=blocks.size)
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

    # ------------------------------------------------------------------ checks
    def check_invariants(self, cached_keys: Iterable[tuple[int, Hashable, int]] | None = None) -> None:
        """Recompute every row from the core's prefixes (their block sets: the definition,
        :func:`judge`) and check the rows, the counts and the victim index against it; with
        ``cached_keys`` (block id, prefix, group) also check the blocks' keys are exactly those.
        Raises AssertionError on drift."""
        core = self._core
        prefixes, kv_children, block_keys = core.snapshot()
        if cached_keys is not None:
            expected: dict[int, set[tuple[Hashable, int]]] = {}
            for block_id, prefix, group_id in cached_keys:
                expected.setdefault(block_id, set()).add((prefix, group_id))
            got = {b: set(k) for b, k in block_keys.items()}
            assert got == expected, f"index drifted: {len(got)} blocks indexed, {len(expected)} cached"
        counted: dict[Hashable, int] = {}
        for prefix, (parent, _, blocks, n_state, n_attn) in prefixes.items():
            assert any(blocks), f"empty prefix {prefix!r} kept"
            assert n_state == sum(bool(blocks[g]) for g in self.mamba_groups), "state count drifted"
            assert n_attn == sum(bool(blocks[g]) for g in self.attn_groups), "attention count drifted"
            if parent is not None and n_attn:
                counted[parent] = counted.get(parent, 0) + 1
        assert counted == kv_children, "KV children counts drifted"
        free_seq, release_seq, verdicts = core.rows()
        assert all(f in (0, r) for f, r in zip(free_seq, release_seq)), "free_seq mirror drifted"
        reasons = core.reason
        assert list(reasons) == [v[2] for v in verdicts], "reason rows drifted"
        for block_id in range(self.num_blocks):
            keys = block_keys.get(block_id)
            if not keys:
                want = (False, _NO_EFFS, _DEAD)
            else:
                prefix, group_id = max(keys, key=lambda k: prefixes[k[0]][1])
                _, depth, blocks, _, _ = prefixes[prefix]
                cand, valued, reason = judge(self.group_kinds, blocks, group_id, kv_children.get(prefix, 0))
                want = (cand, _depth_effs(self.spec, self.block_size, bool(self.mamba_groups), depth) if valued
                        else _NO_EFFS, reason)
            assert tuple(verdicts[block_id]) == want, f"stale row of block {block_id}: {verdicts[block_id]} != {want}"
        expected_members = {b: (CANDIDATES if verdicts[b][0] else OTHERS, tuple(verdicts[b][1]), f)
                            for b, f in enumerate(free_seq) if f}
        got_members = core.members()
        assert got_members == expected_members, (
            f"victim index drifted: {len(got_members)} members, {len(expected_members)} expected; differing: "
            f"{sorted(set(got_members.items()) ^ set(expected_members.items()))[:5]}")
        core.check_index()


def judge(group_kinds: Sequence[str], blocks: Sequence[Sequence[int]], group_id: int,
          kv_children: int) -> tuple[bool, bool, int]:
    """``(candidate, holds something a hit can use, reason id)`` of a block keyed by a prefix whose
    groups hold ``blocks`` (block ids per group), in group ``group_id``, with ``kv_children`` child
    prefixes holding attention blocks: the definition the cores' counted verdicts are held to."""
    if len(blocks[group_id]) > 1:                   # a duplicate: another copy serves the hits
        return True, False, _DEAD
    has_state = all(blocks[g] for g, kind in enumerate(group_kinds) if kind == MAMBA)
    if group_kinds[group_id] == ATTENTION:
        if kv_children:
            return False, False, _KV_INNER
        if not has_state:
            return True, False, _DEAD
        return True, True, _KV_LEAF
    if not (has_state and all(blocks[g] for g, kind in enumerate(group_kinds) if kind == ATTENTION)):
        return True, False, _DEAD
    return kv_children <= 1, True, _STATE


def _depth_effs(spec: ModelSpec, block_size: int, has_state: bool, depth: int) -> tuple[float, ...]:
    """FLOP efficiency of a ``depth``-token prefix per variant (EFFICIENCIES order), as the exact
    float64 values the victim index keys its levels by."""
    edge = min(depth, block_size)
    return tuple(float(np.float64(flop_efficiency(spec, depth, edge, has_state, variant))) for variant in EFFICIENCIES)


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


_KV_LEAF, _KV_INNER, _STATE, _DEAD = KV_LEAF, KV_INNER, STATE, DEAD     # indices into REASONS
_VARIANT_IDS = {variant: i for i, variant in enumerate(EFFICIENCIES)}   # the victim index's effs order
_NO_EFFS = (0.0,) * len(EFFICIENCIES)                                 # a block holding nothing a hit can use
