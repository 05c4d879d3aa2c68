"""The worlds chooser (the default ``marconi``): each rule that is not live runs in a **world** (a
size-only cache with the same admission and capacity, fed the same requests); the live cache is the
live rule's world, follows the best-scoring one, and on a switch from A is cloned into A's world: one
replay per rule. Deterministic; why exact worlds: ``docs/adaptive.md``.
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any, Sequence

from marconi.core.cache import PrefixCache, RequestHandle
from marconi.core.chooser import RequestEvent, check_scoring, follow
from marconi.core.eviction import EVICTION_POLICIES, EvictionPolicy, EvictionRule, Rule
from marconi.core.registry import ConfigError, Domain
from marconi.choosers.family import FamilyPolicy, RuleSwitch, parse_rules, policy_for

if TYPE_CHECKING:
    from marconi.core.model import ModelSpec

__all__ = ["WorldsChooser", "WorldsEviction"]


class WorldsChooser:
    """A :class:`~marconi.core.chooser.RuleChooser` for one live cache. ConfigError: a bad parameter.

    Args:
        rules: the family (:func:`~marconi.choosers.family.parse_rules`); ``current`` (an index into
            it: a whole number in ``[0, len(rules))``) is live until another rule's world is ahead.
        decay: weight kept by the scores per request (horizon ~ 1 / (1 - decay)).
        hysteresis: the relative lead a world needs over the live one for a switch;
            ``tail_hysteresis`` the one to leave a tail-cutting rule, if larger (``docs/tails.md``).
        objective: score reused ``"hit-rate"`` tokens or saved prefill ``"flops"``.
    """

    def __init__(self, rules: str | Sequence[Rule] = "default", *, decay: float = 0.999,
                 hysteresis: float = 0.0, objective: str = "hit-rate", current: int = 0,
                 tail_hysteresis: float = 0.0) -> None:
        check_scoring(decay, hysteresis, "worlds")
        if not hysteresis >= 0 or not tail_hysteresis >= 0:
            raise ConfigError(f"worlds hysteresis must be >= 0, got {hysteresis} and tail_hysteresis {tail_hysteresis}")
        if objective not in ("hit-rate", "flops"):
            raise ConfigError(f"worlds objective must be 'hit-rate' or 'flops', got {objective!r}")
        self.rules = parse_rules(rules)
        if (isinstance(current, bool) or not isinstance(current, numbers.Integral)
                or not 0 <= current < len(self.rules)):
            raise ConfigError(f"worlds current must be the live rule's index in the family of {len(self.rules)} "
                              f"(0 to {len(self.rules) - 1}), got {current!r}")
        self.decay, self.hysteresis, self.objective = decay, hysteresis, objective
        self.tail_hysteresis = tail_hysteresis
        self.current = int(current)
        self.score = [0.0] * len(self.rules)  # floats, not an array: three numbers updated per request
        self.switches: list[RuleSwitch] = []
        self.cache: PrefixCache | None = None
        self.worlds: dict[int, PrefixCache] = {}           # rule -> its world (every rule but the live one)
        self._handles: dict[int, dict[int, RequestHandle]] = {}  # live request id -> rule -> handle there
        self.last_request = -1           # the last request begun (a caller's switch is filed after it)

    def start(self, cache: PrefixCache) -> None:
        """Follow ``cache`` (running the live rule): a world per other rule, each ``cache.clone``.
        ConfigError if already started."""
        if self.cache is not None:
            raise ConfigError("a worlds chooser serves one cache; build one per cache")
        self.cache = cache
        for k in range(len(self.rules)):
            if k != self.current:
                self.worlds[k] = cache.clone(self._pinned(k))

    def _pinned(self, k: int) -> EvictionPolicy:
        """Rule ``k``'s world's policy: the fixed rule alone (a world is never promoted to live)."""
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
        self.last_request = handle.request_id
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
        return self.switch_to(best, request_id)

    def switch_to(self, best: int, request_id: int) -> Rule:
        """Make rule ``best`` live from request ``request_id`` on (the chooser's own switch, or a
        caller's ``set_rule``): the live cache, which ran the old rule, is copied into the old rule's
        world, and ``best``'s world is dropped. Returns the rule."""
        assert self.cache is not None
        if best == self.current:
            return self.rules[best]
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
    """The live cache's policy: the live rule, set by ``chooser`` (followed once bound). Args: the
    :class:`WorldsChooser`'s; ``explore=False`` pins the rule to ``current`` (no worlds)."""

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

    def set_rule(self, rule: Rule) -> None:
        """Make ``rule`` (of the family) live; ConfigError otherwise. A caller's switch is the worlds'
        too: the live cache's copy becomes the old rule's world, as on the chooser's own switch (they
        would otherwise score the live cache as the old rule's), recorded in ``rule_switches``. Before
        the policy is bound, ``rule`` is the one the chooser starts on (as ``current``; no switch
        recorded): the worlds are built for the other rules."""
        super().set_rule(rule)
        chooser = self.chooser
        if chooser is None or chooser.current == self.current:
            return
        if chooser.cache is None:
            chooser.current = self.current
        else:
            chooser.switch_to(self.current, chooser.last_request)

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
