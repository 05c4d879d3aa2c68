"""The worlds chooser (the default ``marconi``): the live cache follows whichever rule's own cache
is ahead.

The regret chooser (:mod:`marconi.choosers.regret`) judges every rule from the live cache's state alone,
and that estimate is biased against whichever rule is live (``docs/adaptive.md``, second round).
Here nothing is estimated: each rule of the family that is not live runs in a **world** of its own,
a size-only :class:`~marconi.core.cache.PrefixCache` with the same admission and capacity, fed the same
requests. The live cache is the live rule's world. Each world's score is the decayed sum of the
tokens (or prefill FLOPs) its lookups reused; the live rule changes to the best-scoring one when
that one leads by more than ``hysteresis`` (relative).

**Why this costs rules×, not (rules + 1)×.** A cache that has run one rule for a while *is* that
rule's world. On a switch from rule A to rule B, B's world is dropped (the live cache now runs B)
and A's world becomes an exact copy of the live cache (which has been running A): no separate
world for the live rule is ever needed. The copy is taken with the in-flight requests, so it
finishes them as the live cache does. Scores carry over: the live rule's score keeps B's history.

A live cache right after a switch holds A's contents while it runs B; its score is B's, so a rule
whose value is what it *retains* is not judged by its first requests from another rule's state
(what windowed duels from snapshots got wrong).

Cost: one replay per rule of the family (three for the default), measured in
``benchmarks/core_bench.py``. Worlds hold no payloads, only sizes; in a serving engine they are
metadata next to the real cache. Everything is deterministic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from marconi.core.cache import PrefixCache, RequestHandle
from marconi.core.chooser import RequestEvent, follow
from marconi.core.eviction import EVICTION_POLICIES, EvictionPolicy, EvictionRule, Rule
from marconi.core.registry import ConfigError, Domain
from marconi.choosers.family import FamilyPolicy, RuleSwitch, parse_rules, policy_for

if TYPE_CHECKING:
    from marconi.core.model import ModelSpec

__all__ = ["WorldsChooser", "WorldsEviction"]


class WorldsChooser:
    """A :class:`~marconi.core.chooser.RuleChooser`: the rule of a family whose exact world is ahead
    (see the module docstring). Fed :class:`~marconi.core.chooser.RequestEvent` s of one live cache.

    Args:
        rules: the family (``"default"``: ``lru/a0.5m/a2m``; labels such as
            ``"lru/a0.5m/a0.5mt/a2m"``, :data:`~marconi.choosers.family.TAILS_RULE_LABELS`; or
            rules); ``current`` is live until another rule's world is ahead.
        decay: weight kept by the scores per request (horizon ~ 1 / (1 - decay)).
        hysteresis: switch only to a world scoring more than the live one by this fraction.
        tail_hysteresis: the lead a switch needs from a rule that cuts dead tails to one that
            keeps them (``marconi.core.tails``), if larger. Such a switch cannot bring back the
            tails the live cache has cut, so the live cache trails the keeping rule's world and
            may swing back. Off by default (``docs/tails.md``).
        objective: score reused ``"hit-rate"`` tokens or saved prefill ``"flops"``.
    """

    def __init__(self, rules: str | Sequence[Rule] = "default", *, decay: float = 0.999,
                 hysteresis: float = 0.0, objective: str = "hit-rate", current: int = 0,
                 tail_hysteresis: float = 0.0) -> None:
        if not 0 < decay <= 1:
            raise ConfigError(f"worlds decay must be in (0, 1], got {decay}")
        if not hysteresis >= 0 or not tail_hysteresis >= 0:
            raise ConfigError(f"worlds hysteresis must be >= 0, got {hysteresis} and tail_hysteresis {tail_hysteresis}")
        if objective not in ("hit-rate", "flops"):
            raise ConfigError(f"worlds objective must be 'hit-rate' or 'flops', got {objective!r}")
        self.rules = parse_rules(rules)
        self.decay, self.hysteresis, self.objective = decay, hysteresis, objective
        self.tail_hysteresis = tail_hysteresis
        self.current = current
        self.score = [0.0] * len(self.rules)  # floats, not an array: three numbers updated per request
        self.switches: list[RuleSwitch] = []
        self.cache: PrefixCache | None = None
        self.worlds: dict[int, PrefixCache] = {}           # rule -> its world (every rule but the live one)
        self._handles: dict[int, dict[int, RequestHandle]] = {}  # live request id -> rule -> handle there

    def start(self, cache: PrefixCache) -> None:
        """Follow ``cache`` (running the live rule): a world per other rule, each a copy of it
        (``cache.clone``, the one way a world is made). ConfigError if already started (a chooser
        serves one cache)."""
        if self.cache is not None:
            raise ConfigError("a worlds chooser serves one cache; build one per cache")
        self.cache = cache
        for k in range(len(self.rules)):
            if k != self.current:
                self.worlds[k] = cache.clone(self._pinned(k))

    def _pinned(self, k: int) -> EvictionPolicy:
        """Rule ``k``'s world evicts as a cache built for that rule alone (``lru``: SGLang+'s own
        leaf-only LRU, the cheapest world): a world is never promoted to live, so it needs no
        candidates beyond its rule's."""
        return policy_for(self.rules[k])

    @property
    def rule(self) -> Rule:
        return self.rules[self.current]

    @property
    def spec(self) -> "ModelSpec":
        assert self.cache is not None, "a WorldsChooser is started on its live cache first"
        return self.cache.spec

    def observe(self, event: RequestEvent) -> Rule | None:
        """Mirror the live cache's step in every world; on ``begin``, move the scores and return the
        new live rule if the best world leads by enough (None otherwise)."""
        step, handle = event.step, event.handle
        if step == "begin":
            assert handle is not None
            return self._begin(handle)
        if step == "prefill":
            assert handle is not None
            for world, h in self.in_worlds(handle.request_id):
                world.insert_prefill(h)
        elif step == "finish":
            assert handle is not None
            for world, h in self.in_worlds(handle.request_id, done=True):
                world.finish(h, event.output)
        elif step == "abort":
            assert handle is not None
            for world, h in self.in_worlds(handle.request_id, done=True):
                world.abort(h)
        return None

    def _value(self, handle: RequestHandle) -> float:
        usable = handle.match.usable_hit_len
        return float(usable) if self.objective == "hit-rate" else self.spec.prefill_flops(usable)

    def _begin(self, handle: RequestHandle) -> Rule | None:
        """The live cache began ``handle``: every world looks the same input up; scores move."""
        step = [0.0] * len(self.rules)
        step[self.current] = self._value(handle)
        mine = self._handles[handle.request_id] = {}
        for k, world in self.worlds.items():
            mine[k] = h = world.begin(handle.tokens, max_hit_len=handle.max_hit_len)
            step[k] = self._value(h)
        decay = self.decay
        self.score = [s * decay + x for s, x in zip(self.score, step)]
        return self._maybe_switch(handle.request_id)

    def _maybe_switch(self, request_id: int) -> Rule | None:
        best = max(range(len(self.score)), key=self.score.__getitem__)  # the first of equal scores
        lead = self.score[best] - self.score[self.current]
        needed = self.hysteresis
        if self.rules[self.current].tails and not self.rules[best].tails:
            needed = max(needed, self.tail_hysteresis)
        if best == self.current or not lead > self.score[self.current] * needed:
            return None
        assert self.cache is not None
        old = self.current
        # The live cache has been running ``old``: a copy of it is ``old``'s world, in-flight requests too.
        world = self.cache.clone(self._pinned(old))
        self.worlds[old] = world
        del self.worlds[best]
        for rid, mine in self._handles.items():
            mine.pop(best, None)
            mine[old] = world.in_flight(rid)
        self.current = best
        self.switches.append(RuleSwitch(request_id, best))
        return self.rules[best]

    @property
    def num_mirrored(self) -> int:
        """Live requests whose twins the worlds still hold (0 once every request ended)."""
        return len(self._handles)

    def in_worlds(self, request_id: int, *, done: bool = False) -> list[tuple[PrefixCache, RequestHandle]]:
        """Each world with its handle for the live request ``request_id`` (``done``: forget them)."""
        mine = self._handles.pop(request_id, {}) if done else self._handles.get(request_id, {})
        return [(self.worlds[k], h) for k, h in mine.items()]

    def tuning_record(self) -> dict[str, Any]:
        """Record fields: every switch of the live rule (``rule_switches``: request, new rule)."""
        return {"rule_switches": [[s.at_request, self.rules[s.rule].label()] for s in self.switches]}


class WorldsEviction(FamilyPolicy):
    """The live cache's policy under the worlds chooser: it applies the family's live rule; with
    ``explore`` (the default) a :class:`WorldsChooser` (``chooser``) sets that rule, fed through
    :func:`~marconi.core.chooser.follow` once the cache binds this policy.

    Args: the :class:`WorldsChooser`'s, and ``explore``: False: the rule pinned to ``current``, no
    chooser, no worlds.
    """

    name = "worlds"

    def __init__(self, rules: str | Sequence[EvictionRule] = "default", *, decay: float = 0.999,
                 hysteresis: float = 0.0, objective: str = "hit-rate", explore: bool = True,
                 current: int = 0, tail_hysteresis: float = 0.0) -> None:
        chooser = WorldsChooser(rules, decay=decay, hysteresis=hysteresis, objective=objective, current=current,
                                tail_hysteresis=tail_hysteresis)
        super().__init__(chooser.rules, current)
        self.explore = explore
        self.chooser: WorldsChooser | None = chooser if explore else None
        self._bound = False

    def bind(self, cache: PrefixCache) -> None:
        if self._bound:
            raise ConfigError("a worlds eviction policy serves one cache; build one per cache")
        super().bind(cache)
        self._bound = True
        if self.chooser is not None:
            self.chooser.start(cache)
            follow(cache, self.chooser)


@EVICTION_POLICIES.register("worlds", "the rule of a family whose own exact world (a size-only cache running it) "
                                      "is ahead: one replay per rule",
                            domains={"decay": Domain(0, 1, lo_open=True), "hysteresis": Domain(0, 1000),
                                     "tail_hysteresis": Domain(0, 1000)})
def _worlds(rules: str = "default", decay: float = 0.999, hysteresis: float = 0.0,
            objective: str = "hit-rate", tail_hysteresis: float = 0.0) -> EvictionPolicy:
    return WorldsEviction(rules, decay=decay, hysteresis=hysteresis, objective=objective,
                          tail_hysteresis=tail_hysteresis)
