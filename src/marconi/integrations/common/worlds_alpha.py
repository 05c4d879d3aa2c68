"""The exact-worlds α source: the live rule follows whichever rule's own copy of the engine's cache is ahead.

The simulator's default ``marconi`` chooses its eviction rule by exact worlds
(:mod:`marconi.choosers.worlds`): every rule of the family that is not live runs in a cache of its
own fed the same requests; the live rule changes to the best-scoring world's. :class:`WorldsAlpha`
brings that choice to an engine whose cache can be *emulated exactly* request by request (SGLang's
``UnifiedRadixCache``: :mod:`marconi.integrations.sglang.emulate`, which matches the real cache on
every request of the bench). Unlike the shadow α source (:mod:`.shadow_alpha`), which judges rules
on a radix cache of the same bytes with Marconi's admission (a proxy), each world here *is* the
engine's cache under one rule, so a world's hits are the hits that rule would get.

One world per rule, each an engine emulation built by the engine (``make_world(alpha, efficiency)``)
and fed every finished request in finish order. The live rule's world is a mirror of the live cache
(the same requests, the same rule at every step). Each world's score is the decayed sum of the hit
tokens its lookups reused; the live rule changes to the best-scoring one when that one leads by more
than ``hysteresis`` (relative). At a switch from A to B, as in the simulator's worlds, the mirror
keeps running (now under B: it is the live cache) and B's old world is dropped; A's world becomes a
copy of the mirror (which has been running A). Scores carry over. The cost is one emulated replay
per rule of the family.

Deterministic. Engine-agnostic: an engine supplies the worlds (:class:`World`) and the translation of
a rule into its eviction's ``(alpha, efficiency)`` (``rule_map``), which rejects what it cannot apply;
a rule the engine applies whole (its generic path, any :class:`~marconi.core.eviction.Rule`) maps to
``(rule, None)``: its world is built with the rule itself, and while it is live the source answers
α = 0 and names it as ``rule``.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

from marconi.core.eviction import Rule
from marconi.core.registry import ConfigError
from marconi.integrations.common.alpha import RequestObservation
from marconi.choosers.family import parse_rules

__all__ = ["World", "WorldMaker", "WorldsAlpha"]


class World(Protocol):
    """One engine cache under one rule (an emulation; it holds no payloads)."""

    def serve(self, prompt: Sequence[int], output: Sequence[int]) -> int:
        """Serve one request start to finish; the prompt tokens its lookup reused."""
        ...

    def clone(self, alpha: float, efficiency: str | None) -> "World":
        """An independent copy of this cache, evicting by ``(alpha, efficiency)`` from now on."""
        ...

    def follow(self, alpha: float, efficiency: str | None) -> None:
        """Evict by ``(alpha, efficiency)`` from now on (the cache's contents stay)."""
        ...


#: Builds an empty world evicting by ``(alpha, efficiency)`` (efficiency None: irrelevant at α = 0), or
#: by ``(rule, None)`` for a rule the engine applies whole.
WorldMaker = Callable[[Any, "str | None"], World]


class WorldsAlpha:
    """An :class:`~marconi.integrations.common.alpha.AlphaSource` and rule chooser whose live rule is
    the best of the rules' exact worlds (see the module docstring).

    Until :meth:`start` builds the worlds it answers with the family's first rule, which stays live
    until another world leads.

    Args:
        rules: the family (labels joined by ``/``, e.g. ``a2m/a0.5m/lru``; ``"default"`` is the
            simulator's ``lru/a0.5m/a2m``). Rules that cut dead tails are refused.
        rule_map: the engine's translation of a rule (every rule is checked now).
        decay: weight kept by the scores per request (horizon ~ 1 / (1 - decay)).
        hysteresis: switch only to a world scoring more than the live one by this fraction.

    Raises:
        ConfigError: an unknown or cutting rule, one ``rule_map`` rejects, or a decay or hysteresis
            out of range.
    """

    def __init__(self, rules: str | Sequence[Rule], *,
                 rule_map: Callable[[Rule], tuple[Any, str | None]],
                 decay: float = 0.999, hysteresis: float = 0.0) -> None:
        if not 0 < decay <= 1:
            raise ConfigError(f"worlds decay must be in (0, 1], got {decay}")
        if not hysteresis >= 0:
            raise ConfigError(f"worlds hysteresis must be >= 0, got {hysteresis}")
        self.rules = parse_rules(rules)
        cutting = [r.label() for r in self.rules if r.tails]
        if cutting:
            raise ConfigError(f"rules {', '.join(cutting)} cut dead tails, which an engine's eviction cannot do; "
                              "drop the t (e.g. a2m/a0.5m/lru)")
        self._mapped = [rule_map(r) for r in self.rules]
        self.decay = decay
        self.hysteresis = hysteresis
        self.current = 0
        self.scores = [0.0] * len(self.rules)
        self.worlds: list[World] = []
        self.num_observed = 0
        self._switches: list[list[Any]] = []

    @property
    def started(self) -> bool:
        return bool(self.worlds)

    def start(self, make_world: WorldMaker) -> None:
        """Build one empty world per rule (the engine's cache is empty too). ConfigError if started."""
        if self.worlds:
            raise ConfigError("a worlds alpha source serves one cache; build one per cache")
        self.worlds = [make_world(*mapped) for mapped in self._mapped]

    @property
    def rule(self) -> Rule:
        return self.rules[self.current]

    def alpha(self) -> float:
        alpha = self._mapped[self.current][0]
        return alpha if isinstance(alpha, (int, float)) else 0.0     # a whole rule: named by ``rule``

    def efficiency(self) -> str | None:
        return self._mapped[self.current][1]

    def observe(self, event: RequestObservation) -> Rule | None:
        """Serve the finished request in every world, score them, maybe switch the live rule (the
        new rule is returned, else None: the rule chooser's contract). ConfigError before :meth:`start`."""
        if not self.worlds:
            raise ConfigError("worlds alpha: observe before start (the engine builds the worlds for its cache)")
        for k, world in enumerate(self.worlds):
            self.scores[k] = self.scores[k] * self.decay + world.serve(event.prompt_token_ids, event.output_token_ids)
        best = max(range(len(self.scores)), key=lambda k: (self.scores[k], -k))
        switched = best != self.current and self.scores[best] > self.scores[self.current] * (1 + self.hysteresis)
        if switched:
            self._switch(best)
        self.num_observed += 1
        return self.rules[best] if switched else None

    def _switch(self, best: int) -> None:
        old, live = self.current, self.worlds[self.current]
        self.worlds[old] = live.clone(*self._mapped[old])    # A's world: a copy of the live cache
        live.follow(*self._mapped[best])                     # the live mirror now runs B
        self.worlds[best] = live                             # B's old world is dropped
        self.current = best
        self._switches.append([self.num_observed, self.rules[best].label()])

    def tuning_record(self) -> dict[str, Any]:
        """Every switch of the live rule: ``rule_switches`` = ``[[request index (0-based, finish
        order), label], ...]``."""
        return {"rule_switches": [list(s) for s in self._switches]}

    def __repr__(self) -> str:
        family = "/".join(r.label() for r in self.rules)
        return (f"{type(self).__name__}({family}, live={self.rule.label()}, decay={self.decay:g}, "
                f"hysteresis={self.hysteresis:g})")
