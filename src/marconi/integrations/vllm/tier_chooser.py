"""The CPU tier's rule, chosen online: ghost tiers, one per rule of a family plus one under vLLM's
ARC, and the live policy that follows the best. vLLM-free (duck-typed over ``OffloadKey`` bytes,
as ``tier_tree``).

A **world** is a :class:`~marconi.integrations.vllm.tier_tree.ChunkTreePolicy` under one fixed rule,
or (the last world, ``arc``) vLLM's ARC order (:class:`~marconi.integrations.vllm.tier_arc.ARCPolicy`),
with the live tier's capacity in chunks, holding metadata only (its chunks are idle placeholders,
never vLLM's). Each world sees what the live policy sees: the store misses and inserts (making room
by its own rule), failed stores' removals, touches and request ends, under its own per-request
scratch (the live policy's scratch in vLLM's ``ReqContext`` is never touched). Keys a request offered
or reused that a world lacks are stored in that world when the request ends (a world that lacked
them would have had them offered).

**Score.** When a request ends, each world is credited the tokens a tier lookup would have loaded
from it for that request: from the request's first chunk seen, the run of nodes whose attention
chunks the world held when the policy first saw the request, up to the deepest of them whose
state (every Mamba group) it held too. Scores decay per request (:class:`TierRuleChooser`); the
live rule switches to the best world's when it leads the live rule's own world by a relative
margin. The live tier's chunks stay; only the ranking of the next victims changes: a tree rule's,
or, when the ARC world leads, ARC's order (kept by the live policy over its chunks at all times)
after the tree's dead chunks, which no order's hit can use. Why and what it measured:
``docs/vllm-tiers.md``, "Adaptive rule: ghost tiers".
"""

from __future__ import annotations

import numbers
from collections import OrderedDict
from dataclasses import replace
from typing import Any, Iterable, NamedTuple, Sequence

from marconi.core.chooser import check_scoring
from marconi.core.eviction import Rule
from marconi.core.registry import ConfigError
from marconi.integrations.vllm.policy import ATTENTION
from marconi.integrations.vllm.tier_arc import ARCPolicy
from marconi.integrations.vllm.tier_settings import ArcTreeOrder, TierSettings
from marconi.integrations.vllm.tier_tree import ChunkTreePolicy, get_offload_block_hash, make_offload_key

__all__ = ["AdaptiveTierPolicy", "TierEvent", "TierRuleChooser", "ARC_WORLD", "DEFAULT_DECAY", "DEFAULT_HYSTERESIS"]

#: weight the scores keep per request end (a horizon of ~1,000 requests, the worlds chooser's)
DEFAULT_DECAY = 0.999
#: the relative lead over the live rule's world a world needs for a switch
DEFAULT_HYSTERESIS = 0.05
#: the label of the world (and live order) under vLLM's ARC, beside the family's rules
ARC_WORLD = "arc"

OffloadKey = bytes


class _Shade:
    """A world's chunk: metadata only, never read by vLLM. ``ref_cnt`` follows the live chunk of the
    same key while the live tier holds it (-1 while its store is pending, > 0 while loads read it),
    so a world cannot evict what the live tier could not; 0 once only the world holds it. ``born``:
    the chooser's clock when the world stored it (the world's :attr:`_World.born` maps each key it
    holds to its shade, the very object its policy holds, so a mirrored ref count needs no lookup
    in the policy)."""

    __slots__ = ("ref_cnt", "born")

    def __init__(self, ref_cnt: int, born: int = 0) -> None:
        self.ref_cnt = ref_cnt
        self.born = born


class _WorldContext:
    """One world's view of a request's ``ReqContext``: its own scratch, the request's positions."""

    __slots__ = ("base", "_state", "get_offload_key_position")

    def __init__(self, base: Any) -> None:
        self.base = base
        self._state: dict[type, Any] = {}
        #: the request's own lookup, bound once (the worlds call it per key per call)
        self.get_offload_key_position = base.get_offload_key_position

    def set_state(self, val: Any) -> None:
        self._state[type(val)] = val

    def get_state(self, cls: type) -> Any:
        return self._state.get(cls)


class _Positions(dict):
    """One call's key positions, looked up in the request's context once for every world: each
    key of the call to its position (None where it has none); a key not listed falls back to the
    context itself. The context cannot change while the chooser hands one call to its worlds (they
    never write it), so a world reads exactly what the context would have answered."""

    __slots__ = ("ctx",)

    def __init__(self, ctx: Any, keys: Iterable[OffloadKey]) -> None:
        get = ctx.get_offload_key_position
        super().__init__((k, get(k)) for k in keys)
        self.ctx = ctx

    def __missing__(self, key: OffloadKey) -> int | None:
        return self.ctx.get_offload_key_position(key)


class _Sighting:
    """Per request (in its ``ReqContext``): when the chooser first saw it, and each world's view."""

    __slots__ = ("owner", "generation", "t0", "views")

    def __init__(self, owner: "TierRuleChooser", t0: int, ctx: Any) -> None:
        self.owner = owner
        self.generation = owner.generation       # a sighting from before a clear is stale
        self.t0 = t0
        self.views = [_WorldContext(ctx) for _ in owner.worlds]

    def lend(self, positions: _Positions | None) -> list[_WorldContext]:
        """Point every view's position lookup at ``positions`` (one call's), or back at the
        request's context (None). Returns the views."""
        for view in self.views:
            view.get_offload_key_position = (positions.__getitem__ if positions is not None
                                             else view.base.get_offload_key_position)
        return self.views


class _World:
    """A ghost tier under one order: ``policy`` (a tree under ``rule``, or ARC when ``rule`` is
    None), and when each chunk entered (``born``: every key held, to its :class:`_Shade`) and left
    (``died``: key to its stay's clocks) it."""

    __slots__ = ("policy", "rule", "label", "capacity", "born", "died")

    def __init__(self, capacity: int, policy: ChunkTreePolicy | ARCPolicy, rule: Rule | None) -> None:
        self.policy = policy
        self.rule = rule
        self.label = rule.label() if rule is not None else ARC_WORLD
        self.capacity = capacity
        self.born: dict[OffloadKey, _Shade] = {}
        self.died: OrderedDict[OffloadKey, tuple[int, int]] = OrderedDict()

    def held_at(self, key: OffloadKey, t0: int) -> bool:
        """Whether the world held ``key`` at clock ``t0`` (its last stay only)."""
        shade = self.born.get(key)
        if shade is not None and shade.born < t0:
            return True
        stay = self.died.get(key)
        return stay is not None and stay[0] < t0 <= stay[1]

    def make_room(self, n: int, protected: set[OffloadKey], clock: int) -> None:
        """Evict by the world's order until ``n`` more chunks fit (as many as its evictable chunks
        not ``protected`` allow)."""
        need = self.policy.num_held() + n - self.capacity
        if need <= 0:
            return
        need = min(need, self.policy.num_evictable(protected))
        out = self.policy.evict(need, protected) if need > 0 else None
        for key, _ in out or ():
            self.died[key] = (self.born.pop(key).born, clock)
            self.died.move_to_end(key)
        while len(self.died) > 4 * self.capacity:
            self.died.popitem(last=False)

    def store(self, key: OffloadKey, clock: int, protected: set[OffloadKey], ref_cnt: int = 0) -> None:
        if key in self.born:
            self.pin(key, ref_cnt)
            return
        if self.policy.num_held() >= self.capacity:
            self.make_room(1, protected | {key}, clock)
            if self.policy.num_held() >= self.capacity:
                return                      # nothing evictable: the store fails, as vLLM's would
        shade = self.born[key] = _Shade(ref_cnt, clock)
        self.policy.insert(key, shade)

    def pin(self, key: OffloadKey, ref_cnt: int) -> None:
        """The live chunk ``key`` now has ``ref_cnt``: the world's copy follows (if held)."""
        chunk = self.born.get(key)
        if chunk is None or chunk.ref_cnt == ref_cnt:
            return
        chunk.ref_cnt = ref_cnt
        if ref_cnt == 0:
            self.policy.mark_evictable(key)
        else:
            self.policy.mark_non_evictable(key)

    def remove(self, key: OffloadKey) -> None:
        if self.born.pop(key, None) is not None:
            self.policy.remove(key)

    def clear(self) -> None:
        self.policy.clear()
        self.born.clear()
        self.died.clear()


class TierEvent(NamedTuple):
    """One call the live tier policy received: ``step`` is the method's name (``insert``,
    ``remove``, ``touch``, ``on_store_miss``, ``on_request_finished``, ``clear``) or ``pin`` (a live
    chunk's ``ref_cnt`` changed: ``mark_evictable``/``mark_non_evictable``), ``keys`` its keys (per
    group for ``on_request_finished``), ``ctx`` its request context, ``ref_cnt`` the live chunk's
    (``insert``, ``pin``), ``reused`` and ``inserted`` the request's reused and insertion-only keys
    (request ends only)."""

    step: str
    keys: Any = ()
    ctx: Any = None
    ref_cnt: int = 0
    inserted: frozenset = frozenset()
    reused: frozenset = frozenset()


class TierRuleChooser:
    """A :class:`~marconi.core.chooser.RuleChooser` over :class:`TierEvent` s for one live tier.

    Args:
        capacity: the live tier's chunks (each world holds as many), a whole number >= 0 (vLLM builds
            empty tiers).
        settings: the live tier's settings; ``settings.family`` the rules (a world each), and
            ``settings.rule`` the one in force first.
        decay: weight the scores keep per request end, in (0, 1].
        hysteresis: the relative lead (>= 0) the best world needs over the live rule's world; and a
            lead in tokens of at least :meth:`lead_floor`: one full tier's worth (:attr:`min_lead`,
            so a lucky difference in what the worlds held once cannot switch the rule), or less where
            the leader doubles the live world's score by more than any one request's difference
            between two worlds (:attr:`largest_gap`). The ARC world needs that lead over every
            tree world too, since it replaces the tree's order (dead chunks first, states by node)
            altogether (what an early lead over the live world alone cost: ``docs/vllm-tiers.md``);
            where it is the best world without it, the best tree world is the candidate instead,
            and switches on the usual lead over the live world.
        arc_world: also run a world under vLLM's ARC (:data:`ARC_WORLD`), which the live tier can
            follow. Off by default: since the tree keeps what hits used (second chance), its switches
            to ARC cost more than they gained on two of the three grids measured and changed nothing
            on the third (``docs/vllm-tiers.md``, "The ARC world, off by default").

    ``observe`` returns the label of the new live world on a switch (a rule's label, or
    :data:`ARC_WORLD`), else None; it never touches the live policy's chunks or request scratch.
    :attr:`rule` is the live world's rule (None while ARC leads). ConfigError: no family, or a bad
    parameter.
    """

    def __init__(self, capacity: int, settings: TierSettings, *, decay: float = DEFAULT_DECAY,
                 hysteresis: float = DEFAULT_HYSTERESIS, arc_world: bool = False) -> None:
        if not settings.family:
            raise ConfigError("marconi_rule: an adaptive tier needs a family of rules")
        if isinstance(capacity, bool) or not isinstance(capacity, numbers.Integral) or not capacity >= 0:
            raise ConfigError(f"tier chooser capacity must be a whole number of chunks >= 0, got {capacity!r}")
        check_scoring(decay, hysteresis, "tier chooser")
        self.rules: tuple[Rule, ...] = settings.family
        self.current = self.rules.index(settings.rule)
        self.decay, self.hysteresis = decay, hysteresis
        self.worlds = [_World(capacity, ChunkTreePolicy(capacity, replace(settings, rule=r, family=())), r)
                       for r in self.rules]
        if arc_world:
            self.worlds.append(_World(capacity, ARCPolicy(capacity), None))
        self.labels: tuple[str, ...] = tuple(w.label for w in self.worlds)
        kinds = settings.group_kinds
        self.attn_groups = tuple(g for g, k in enumerate(kinds) if k == ATTENTION)
        self.mamba_groups = tuple(g for g, k in enumerate(kinds) if k != ATTENTION)
        self.tokens_per_chunk = settings.tokens_per_chunk
        #: a lead no one-time difference in what the tiers hold explains: more tokens than one full
        #: tier serves (its chunks over the groups a node spans, in tokens)
        self.min_lead = capacity * (settings.tokens_per_chunk or 1) / len(kinds)
        self.score = [0.0] * len(self.worlds)
        #: the largest difference between two worlds' values on any one request so far, in tokens
        self.largest_gap = 0
        self.clock = 0
        #: how many times the tier was cleared (a request's sighting from before is stale)
        self.generation = 0
        self.requests = 0
        self.switches: list[tuple[int, str]] = []
        self._misses: set[OffloadKey] = set()

    @property
    def rule(self) -> Rule | None:
        """The live world's rule; None while the ARC world is live."""
        return self.worlds[self.current].rule

    @property
    def label(self) -> str:
        """The live world's label: its rule's, or :data:`ARC_WORLD`."""
        return self.labels[self.current]

    # ------------------------------------------------------------------ events
    def observe(self, event: TierEvent) -> str | None:
        step = event.step
        if step == "insert":
            self.clock += 1
            for w in self.worlds:
                w.store(event.keys[0], self.clock, self._misses, event.ref_cnt)
        elif step == "pin":                 # the commonest call: _World.pin inlined
            key, ref_cnt = event.keys[0], event.ref_cnt
            for w in self.worlds:
                chunk = w.born.get(key)
                if chunk is None or chunk.ref_cnt == ref_cnt:
                    continue
                chunk.ref_cnt = ref_cnt
                if ref_cnt == 0:
                    w.policy.mark_evictable(key)
                else:
                    w.policy.mark_non_evictable(key)
        elif step == "on_store_miss":
            keys = list(event.keys)
            seen = self._sighting(event.ctx)
            views = seen.lend(_Positions(event.ctx, keys))
            self._misses = set(keys)
            self.clock += 1
            try:
                for w, view in zip(self.worlds, views):
                    w.policy.on_store_miss(keys, view)
                    w.make_room(sum(1 for k in self._misses if k not in w.born), self._misses, self.clock)
            finally:
                seen.lend(None)
        elif step == "touch":
            keys = list(event.keys)
            seen = self._sighting(event.ctx)
            views = seen.lend(_Positions(event.ctx, keys))
            try:
                for w, view in zip(self.worlds, views):
                    w.policy.touch(keys, view)
            finally:
                seen.lend(None)
        elif step == "remove":
            for w in self.worlds:
                w.remove(event.keys[0])
        elif step == "on_request_finished":
            return self._finish(event)
        elif step == "clear":
            self.generation += 1
            for w in self.worlds:
                w.clear()
            self._misses = set()
        return None

    def _sighting(self, ctx: Any) -> _Sighting:
        seen = ctx.get_state(_Sighting)
        if seen is None or seen.owner is not self or seen.generation != self.generation:
            seen = _Sighting(self, self.clock, ctx)
            ctx.set_state(seen)
        return seen

    def _finish(self, event: TierEvent) -> str | None:
        ctx = event.ctx
        seen = self._sighting(ctx)
        groups = [list(g) for g in event.keys]
        keys = [k for g in groups for k in g]
        lookup = _Positions(ctx, keys)
        positions = {k: p for k, p in lookup.items() if p is not None}
        value = self.request_values(keys, positions, seen.t0)
        self.clock += 1
        protected = set(keys)
        inserted, reused = event.inserted, event.reused      # frozensets: no world changes them
        views = seen.lend(lookup)
        try:
            for w, view in zip(self.worlds, views):
                born = w.born
                missing = [k for k in keys if k not in born]
                if missing:
                    if len(positions.keys() & missing) == len(missing):     # each once, each with a position
                        missing.sort(key=positions.__getitem__)
                    w.policy.on_store_miss(missing, view)
                    w.make_room(len(missing), protected, self.clock)
                    for k in missing:
                        w.store(k, self.clock, protected)
                w.policy.on_request_finished(groups, inserted, reused, view)
        finally:
            seen.lend(None)
        self.requests += 1
        d = self.decay
        self.score = [s * d + v for s, v in zip(self.score, value)]
        if value:
            self.largest_gap = max(self.largest_gap, max(value) - min(value))
        best = max(range(len(self.score)), key=self.score.__getitem__)
        if self.worlds[best].rule is None and not all(self._leads(best, i) for i in range(len(self.rules))):
            # ARC replaces the tree's order: it must lead every tree world; else the best tree world is the candidate
            best = max(range(len(self.rules)), key=self.score.__getitem__)
        if best == self.current or not self._leads(best, self.current):
            return None
        self.current = best
        self.switches.append((self.requests, self.labels[best]))
        return self.labels[best]

    def lead_floor(self, j: int) -> float:
        """The tokens by which a world must lead world ``j`` (beside the relative margin): one full
        tier's worth (:attr:`min_lead`), or, if smaller, the larger of ``j``'s own score and
        :attr:`largest_gap`.

        Why: the tier's worth is a lead no one-time difference in what the tiers hold explains, and on
        a production tier (thousands of chunks) it is millions of tokens. On a small tier thrashing
        under the live rule, the live world scores little, and a rule that keeps the reused chains
        leads it two- or threefold for dozens of requests before reaching a tier's worth, by which
        time a short run is over (``docs/vllm-tiers.md``, "The floor capped by the live world's
        score"). A leader that at least doubles the live world's score, by more than any single
        request's difference, is not one lucky request either; and where the live world serves a
        lot, doubling it is the higher bar, so nothing changes there.
        """
        return min(self.min_lead, max(self.score[j], self.largest_gap))

    def _leads(self, i: int, j: int) -> bool:
        """Whether world ``i`` leads world ``j`` by both margins (relative, and :meth:`lead_floor`)."""
        return self.score[i] - self.score[j] > max(self.hysteresis * self.score[j], self.lead_floor(j))

    def request_values(self, keys: Sequence[OffloadKey], positions: dict[OffloadKey, int], t0: int) -> list[int]:
        """Per world, the tokens a lookup for this request would have loaded from it at ``t0``: from
        the first node seen, the run of nodes with every attention chunk held, to the deepest of them
        with a state held in every Mamba group. ``positions``: the request's keys' positions (those
        it has). The run's nodes and keys are found once for all worlds; each world then only
        checks what it held (:meth:`_World.held_at`, inlined). Same numbers as
        ``tests/test_vllm_tier_chooser.py``'s ``served_reference``, one world at a time."""
        nodes: dict[int, bytes] = {}
        for k in keys:
            p = positions.get(k)
            if p is not None and p not in nodes:
                nodes[p] = get_offload_block_hash(k)
        if not nodes:
            return [0] * len(self.worlds)
        order = sorted(nodes)
        tpc = self.tokens_per_chunk
        base = order[0] - tpc if tpc else 0
        run: list[tuple[int, list[OffloadKey], list[OffloadKey]]] = []   # (position, attention, Mamba keys)
        prev = None
        for p in order:
            if prev is not None and tpc and p - prev != tpc:
                break
            h = nodes[p]
            run.append((p, [make_offload_key(h, g) for g in self.attn_groups], [make_offload_key(h, g) for g in self.mamba_groups]))
            prev = p
        out = []
        for w in self.worlds:
            born, died = w.born.get, w.died.get
            deepest = base
            for p, attn, mamba in run:
                ok = True
                for key in attn:
                    shade = born(key)
                    if shade is not None and shade.born < t0:
                        continue
                    stay = died(key)
                    if stay is None or not stay[0] < t0 <= stay[1]:
                        ok = False
                        break
                if not ok:
                    break
                for key in mamba:
                    shade = born(key)
                    if shade is not None and shade.born < t0:
                        continue
                    stay = died(key)
                    if stay is None or not stay[0] < t0 <= stay[1]:
                        break
                else:
                    deepest = p
            out.append(max(0, deepest - base))
        return out

    def tuning_record(self) -> dict[str, Any]:
        """Record fields: the switches (``tier_rule_switches``: request ends so far, new world's label)
        and the label in force (``tier_rule``: a rule's, or :data:`ARC_WORLD`)."""
        return {"tier_rule_switches": [list(s) for s in self.switches], "tier_rule": self.label}


class AdaptiveTierPolicy(ChunkTreePolicy):
    """The tier policy of :class:`~marconi.integrations.vllm.tier_tree.ChunkTreePolicy`, whose order a
    :class:`TierRuleChooser` sets when ``settings.family`` is not empty (``marconi_rule: adaptive``);
    with a fixed rule it is exactly ``ChunkTreePolicy``, except under
    :class:`~marconi.integrations.vllm.tier_tree.ArcTreeOrder` (``marconi_rule: arc-tree``): the
    tree's dead chunks first, then :attr:`arc`'s victims one at a time. Same contract (vLLM's
    ``CachePolicy``): the chooser's worlds never change the chunks held, ref counts or evictability;
    a switch changes only how the next victims are ranked: by a tree rule (:meth:`set_rule`), or,
    when the ARC world leads, as ``arc-tree``: the tree's dead chunks (no hit can use them, under any
    order), then the order of :attr:`arc`, vLLM's ARC kept over the live chunks (every live call feeds
    it; a chunk the tree evicts goes to its ghost list, :meth:`ARCPolicy.retire`). ``arc_world``:
    the chooser's ARC world (:class:`TierRuleChooser`; off by default)."""

    def __init__(self, cache_capacity: int, settings: TierSettings, *, arc_world: bool = False) -> None:
        super().__init__(cache_capacity, settings)
        self.chooser: TierRuleChooser | None = (TierRuleChooser(cache_capacity, settings, arc_world=arc_world)
                                                if settings.family else None)
        #: ``arc-tree``: dead chunks first, then ARC's order (fixed; no chooser)
        self.arc_tree = isinstance(settings.rule, ArcTreeOrder) and not settings.family
        #: ARC's lists over the live chunks (an adaptive tier with its ARC world, and ``arc-tree``);
        #: evict follows them after the dead chunks under ``arc-tree`` and while ``follows_arc``
        self.arc: ARCPolicy | None = (ARCPolicy(cache_capacity) if (settings.family and arc_world) or self.arc_tree
                                      else None)
        self.follows_arc = False

    def _observe(self, event: TierEvent) -> None:
        assert self.chooser is not None
        if self.chooser.observe(event) is None:
            return
        rule = self.chooser.rule
        self.follows_arc = rule is None
        if rule is not None:
            self.set_rule(rule)

    def insert(self, key: OffloadKey, chunk: Any, req_context: Any = None) -> None:
        super().insert(key, chunk, req_context)
        if self.arc is not None:
            self.arc.insert(key, chunk)
        if self.chooser is not None:
            self._observe(TierEvent("insert", (key,), ref_cnt=chunk.ref_cnt))

    def mark_evictable(self, key: OffloadKey) -> None:
        super().mark_evictable(key)
        if self.arc is not None:
            self.arc.mark_evictable(key)
        if self.chooser is not None:
            self._observe(TierEvent("pin", (key,), ref_cnt=0))

    def mark_non_evictable(self, key: OffloadKey) -> None:
        super().mark_non_evictable(key)
        if self.arc is not None:
            self.arc.mark_non_evictable(key)
        if self.chooser is not None:
            self._observe(TierEvent("pin", (key,), ref_cnt=1))

    def remove(self, key: OffloadKey) -> None:
        super().remove(key)
        if self.arc is not None:
            self.arc.remove(key)
        if self.chooser is not None:
            self._observe(TierEvent("remove", (key,)))

    def touch(self, keys: Iterable[OffloadKey], req_context: Any) -> None:
        keys = list(keys)
        super().touch(keys, req_context)
        if self.arc is not None:
            self.arc.touch(keys, req_context)
        if self.chooser is not None:
            self._observe(TierEvent("touch", keys, req_context))

    def on_store_miss(self, keys: Iterable[OffloadKey], req_context: Any) -> None:
        keys = list(keys)
        super().on_store_miss(keys, req_context)
        if self.arc is not None:
            self.arc.on_store_miss(keys, req_context)
        if self.chooser is not None:
            self._observe(TierEvent("on_store_miss", keys, req_context))

    def on_request_finished(self, key_groups: Sequence[Sequence[OffloadKey]], insertion_only_keys: set[OffloadKey],
                            reused_keys: set[OffloadKey], req_context: Any) -> None:
        super().on_request_finished(key_groups, insertion_only_keys, reused_keys, req_context)
        if self.arc is not None:
            self.arc.on_request_finished(key_groups, insertion_only_keys, reused_keys, req_context)
        if self.chooser is not None:
            self._observe(TierEvent("on_request_finished", key_groups, req_context,
                                    inserted=frozenset(insertion_only_keys), reused=frozenset(reused_keys)))

    def evict(self, n: int, protected: set[OffloadKey]) -> list[tuple[OffloadKey, Any]] | None:
        """vLLM's contract (exactly ``n`` idle chunks not in ``protected``, or None and nothing
        changed): under ``arc-tree``, and while the ARC world is live, the tree's dead chunks, then
        ARC's victims; else the tree rule's."""
        if self.arc is None:
            return super().evict(n, protected)
        if self.arc_tree or self.follows_arc:
            return self._evict_arc_tree(n, protected)
        out = super().evict(n, protected)
        for key, _ in out or ():
            self.arc.retire(key)
        return out

    def _evict_arc_tree(self, n: int, protected: set[OffloadKey]) -> list[tuple[OffloadKey, Any]] | None:
        """``arc-tree``'s victims: every dead chunk (:meth:`evict_dead`, each retired to ARC's ghost
        lists), and while more are needed one ARC victim (forgotten by the tree), then the dead
        chunks it left, and so on."""
        assert self.arc is not None
        if n <= 0:
            return []
        if self.num_evictable(protected) < n:
            return None
        out: list[tuple[OffloadKey, Any]] = []
        while True:
            for key, chunk in self.evict_dead(n - len(out), protected):
                self.arc.retire(key)
                out.append((key, chunk))
            if len(out) == n:
                return out
            taken = self.arc.evict(1, protected)
            assert taken, "ARC's lists lost an evictable chunk"
            ((key, chunk),) = taken
            assert chunk.ref_cnt == 0, "an evictable chunk is pinned"
            self.forget_evicted(key)
            out.append((key, chunk))
            if len(out) == n:
                return out

    def clear(self) -> None:
        super().clear()
        if self.arc is not None:
            self.arc.clear()
        if self.chooser is not None:
            self._observe(TierEvent("clear"))

    def check_invariants(self) -> None:
        """The tree's checks, and (adaptive) ARC's lists hold exactly the live chunks."""
        super().check_invariants()
        if self.arc is not None:
            self.arc.check_invariants()
            assert self.arc.held_chunks().keys() == self.held_chunks().keys(), "ARC's lists drifted from the tier"
