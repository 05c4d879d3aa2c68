"""The shadow α source: Marconi's regret selector, run on a size-only shadow of an engine's cache.

``marconi:selector=regret`` (:class:`marconi.selectors.regret.RegretEviction`) keeps re-choosing its
eviction rule among a family (by default ``lru / a0.5m / a2m``: SGLang+'s LRU; recency + 0.5 or 2 ×
the *marginal* FLOP efficiency) by counterfactual eviction regret. :class:`ShadowAlpha` brings that
choice into an engine's own eviction, which ranks its blocks by ``recency + α · efficiency``:

* a size-only shadow :class:`~marconi.core.cache.PrefixCache` — Marconi admission, the regret
  selector's eviction, the served model's :class:`~marconi.core.model.ModelSpec`, the capacity the
  engine's pool holds (the engine computes it: :meth:`ShadowAlpha.start`) — is fed every finished
  request's prompt and output token ids, in finish order;
* its live rule is translated into the engine's terms by ``rule_map`` (an ``EvictionRule`` ->
  ``(alpha, efficiency)``; vLLM's: :func:`marconi.integrations.vllm.policy.block_rule`), which
  rejects the rules the engine's eviction cannot express.

Why a shadow and not the selector re-implemented over an engine's blocks: the shadow runs the
selector that the project tests and measures (docs/adaptive.md), unchanged, through its public API;
it needs only the token ids, which an engine's scheduler and its emulation both have at a request's
end, so the emulation reproduces the live engine's choices exactly; and it costs one size-only
replay of each request. What it gives up: the regret is measured on a radix cache of the same
bytes, not on the engine's blocks (vLLM keeps states only at block boundaries, pads each state
layer to a block, and its candidates differ), so the rule that wins the shadow is a proxy for the
rule that would win the pool. docs/vllm.md measures how good a proxy it is for vLLM.

(The simulator's default ``marconi`` chooses among the same rules by exact worlds,
:mod:`marconi.selectors.worlds`; here that would mean one shadow replay per rule per request
instead of one, and the live-server validation was done for the regret selector.)

Deterministic: the same finished requests in the same order give the same rules. Engine-agnostic:
nothing here knows a block, a pool or an engine.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from marconi.core.cache import PrefixCache
from marconi.core.eviction import EvictionRule
from marconi.core.model import ModelSpec
from marconi.core.registry import ConfigError
from marconi.integrations.common.alpha import RequestObservation
from marconi.selectors.family import parse_rules
from marconi.selectors.regret import RegretEviction

__all__ = ["ShadowAlpha", "RuleMap"]

#: An engine's translation of a simulator rule into its eviction's ``(alpha, efficiency)``
#: (efficiency None: the engine's configured variant); raises ConfigError for rules it cannot apply.
RuleMap = Callable[[EvictionRule], tuple[float, str | None]]


class ShadowAlpha:
    """An :class:`~marconi.integrations.common.alpha.AlphaSource` following the regret selector's
    live rule on a size-only shadow cache.

    Until :meth:`start` builds the shadow (and until the first request finishes) it answers with
    the family's first rule. :meth:`observe` replays a finished request through the shadow.

    Args:
        rules: the family, as ``marconi:rules=`` (``"default"`` = ``lru/a0.5m/a2m``).
        rule_map: the engine's translation of a rule (every rule of the family is checked now).
        decay, hysteresis: the selector's (see :class:`marconi.selectors.regret.RegretEviction`).

    Raises:
        ConfigError: an unknown rule, a rule that cuts dead tails (``a0.5mt``: neither the regret
            selector nor an engine's ranking can follow it), or one ``rule_map`` rejects.
    """

    def __init__(self, rules: str | Sequence[EvictionRule] = "default", *, rule_map: RuleMap,
                 decay: float = 0.999, hysteresis: float = 0.05) -> None:
        self.rules = parse_rules(rules)
        cutting = [r.label() for r in self.rules if r.tails]
        if cutting:        # refused here, when the setting is read, not when a pool binds (issue 31)
            raise ConfigError(f"rules {', '.join(cutting)} cut dead tails, which this adaptive alpha cannot follow: its "
                              "regret selector scores victims, not cuts, and an engine's eviction only ranks blocks; "
                              "use lru, aX and aXm rules (e.g. lru/a0.5m/a2m)")
        self._mapped = [rule_map(r) for r in self.rules]    # validates every rule
        self.decay = decay
        self.hysteresis = hysteresis
        self.cache: PrefixCache | None = None
        self.selector: RegretEviction | None = None
        self.num_observed = 0

    def start(self, spec: ModelSpec, capacity_bytes: float) -> None:
        """Build the shadow: ``spec``'s model, ``capacity_bytes`` (what the engine's pool holds).

        Raises:
            ConfigError: already started (a source serves one pool: build one per pool), or no
                cache of that capacity can be built (the message says why).
        """
        if self.cache is not None:
            raise ConfigError("a shadow alpha source serves one pool; build one per pool")
        selector = RegretEviction(self.rules, decay=self.decay, hysteresis=self.hysteresis)
        self.cache = PrefixCache(spec, capacity_bytes, "marconi", selector)
        self.selector = selector

    @property
    def started(self) -> bool:
        return self.cache is not None

    @property
    def rule(self) -> EvictionRule:
        """The live rule of the shadow (the family's first before any request)."""
        return self.rules[0] if self.selector is None else self.selector.rule

    def alpha(self) -> float:
        return self._mapped[self._current()][0]

    def efficiency(self) -> str | None:
        return self._mapped[self._current()][1]

    def _current(self) -> int:
        return 0 if self.selector is None else self.selector.current

    def observe(self, event: RequestObservation) -> None:
        """Replay the finished request through the shadow (Marconi admission and eviction); its
        selector charges the rules and may switch the live one. ConfigError before :meth:`start`."""
        if self.cache is None:
            raise ConfigError("shadow alpha: observe before start (the engine builds the shadow for its pool)")
        self.cache.process(event.prompt_token_ids, event.output_token_ids)
        self.num_observed += 1

    def tuning_record(self) -> dict[str, Any]:
        """The selector's record: every switch of the live rule, ``rule_switches`` =
        ``[[request index (0-based, finish order), label], ...]``."""
        return {"rule_switches": []} if self.selector is None else self.selector.tuning_record()

    def __repr__(self) -> str:
        family = "/".join(r.label() for r in self.rules)
        return (f"{type(self).__name__}({family}, live={self.rule.label()}, decay={self.decay:g}, "
                f"hysteresis={self.hysteresis:g})")
