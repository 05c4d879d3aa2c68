"""The rule family the choosers choose from: a tuple of :class:`~marconi.core.eviction.Rule` s,
written as labels separated by ``/`` (``"lru/a0.5m/a2m"``, the default), and
:class:`FamilyPolicy`, the live cache's policy applying whichever rule its chooser sets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from marconi.core.candidates import CandidateSet, CandidateTable, LazyEfficiency, flop_efficiency_array
from marconi.core.eviction import (LRU, EvictionBase, EvictionPolicy, EvictionRule, FlopAware, Rule, RulePolicy,
                                   choose_victim, rule_from_label)
from marconi.core.registry import ConfigError

if TYPE_CHECKING:
    from marconi.core.cache import PrefixCache

__all__ = ["DEFAULT_RULES", "DEFAULT_RULE_LABELS", "FamilyPolicy", "TAILS_RULES", "TAILS_RULE_LABELS", "RuleSwitch", "cached_efficiency_variant", "parse_rules",
           "policy_for"]

#: The default family (labels: :meth:`EvictionRule.label`): SGLang+'s LRU, a balanced and an
#: aggressive FLOP-aware rule.
DEFAULT_RULE_LABELS = "lru/a0.5m/a2m"

#: The family with dead-tail cuts (issue 25, ``docs/tails.md``): the default's rules and ``a0.5mt``,
#: which cuts predicted-dead tails first (:mod:`marconi.core.tails`). Opt-in; worlds chooser only.
TAILS_RULE_LABELS = "lru/a0.5m/a0.5mt/a2m"


def parse_rules(text: str | Sequence[Rule], default: str = DEFAULT_RULE_LABELS) -> tuple[Rule, ...]:
    """``"default"`` (``default``'s labels) or labels separated by ``/``: ``"lru/a0/a1m/a2lp"`` ->
    rules (:func:`~marconi.core.eviction.rule_from_label`: registered labels too). ConfigError for an
    unknown label, an empty family, an empty label (a leading, trailing or doubled ``/``) or a rule
    listed twice."""
    if not isinstance(text, str):
        rules = tuple(text)
    else:
        labels = default if text.strip() == "default" else text
        parts = labels.split("/") if labels.strip() else []
        for i, part in enumerate(parts):
            if not part.strip():
                raise ConfigError(f"the adaptive rule family {labels!r} has an empty label at position {i + 1} of "
                                  f"{len(parts)} (a leading, trailing or doubled '/'): write labels separated by "
                                  f"single '/', e.g. {DEFAULT_RULE_LABELS}")
        rules = tuple(rule_from_label(t) for t in parts)
    if not rules:
        raise ConfigError("the adaptive rule family is empty")
    labels = [r.label() for r in rules]     # one label per decision: a0 and a0m (α 0 ignores efficiency) are one
    if len(set(rules)) != len(rules) or len(set(labels)) != len(labels):
        raise ConfigError(f"the adaptive rule family lists a rule twice: {labels}")
    return rules


DEFAULT_RULES: tuple[EvictionRule, ...] = parse_rules("default")
TAILS_RULES: tuple[EvictionRule, ...] = parse_rules(TAILS_RULE_LABELS)


def cached_efficiency_variant(rules: Sequence[Rule]) -> str:
    """The FLOP efficiency a cache serving ``rules`` keeps on its nodes: the variant most of its
    FLOP-aware rules use (a rule using the other computes it, vectorised, when it scores)."""
    variants = [r.efficiency for r in rules if isinstance(r, EvictionRule) and r.alpha]
    return max(("marginal", "total"), key=variants.count) if variants else "total"


def policy_for(rule: Rule) -> EvictionPolicy:
    """A fixed-rule eviction policy making exactly ``rule``'s decisions: :class:`LRU` for ``lru`` (the
    same decisions, cheaper), :class:`FlopAware` for the rest of the FLOP-aware family,
    :class:`RulePolicy` for any other rule."""
    if not isinstance(rule, EvictionRule):
        return RulePolicy(rule)
    if rule.is_lru and rule.recency == "linear" and not rule.tails:
        return LRU()
    return FlopAware(rule.alpha, rule.efficiency, rule.recency, rule.candidates, rule.touch, rule.tails)


@dataclass(frozen=True, slots=True)
class RuleSwitch:
    """The live rule changed to ``rule`` (an index into the family) when request ``at_request`` began."""

    at_request: int
    rule: int


class FamilyPolicy(EvictionBase):
    """Eviction by the family's live rule (``current``, switched by ``set_rule``). Candidates are
    every unlocked node with at most one child (a leaf-only rule scores the leaves alone), so any
    rule decides as a cache built for it alone would. ConfigError: ``current`` out of range."""

    name = "family"
    evicts_inner_nodes = True

    def __init__(self, rules: str | Sequence[Rule] = "default", current: int = 0) -> None:
        self.rules = parse_rules(rules)
        if not 0 <= current < len(self.rules):
            raise ConfigError(f"the live rule's index {current} is outside the family of {len(self.rules)}")
        self.current = current
        self.efficiency_variant = cached_efficiency_variant(self.rules)
        self.tracks_tails = any(r.tails for r in self.rules)
        self.spec: Any = None

    def bind(self, cache: "PrefixCache") -> None:
        self.spec = cache.spec

    @property
    def rule(self) -> Rule:
        return self.rules[self.current]

    @property
    def trims_tails(self) -> bool:  # type: ignore[override]
        """The live rule cuts predicted-dead tails before any victim (``marconi.core.tails``)."""
        return self.rule.tails

    def set_rule(self, rule: Rule) -> None:
        """Make ``rule`` live; ConfigError if it is not of the family."""
        try:
            self.current = self.rules.index(rule)
        except ValueError:
            raise ConfigError(f"rule {rule.label()!r} is not of the family "
                              f"{'/'.join(r.label() for r in self.rules)}") from None

    def choose(self, candidates: CandidateSet) -> int:
        rule, n = self.rule, len(candidates)
        if not isinstance(rule, EvictionRule):
            efficiency = LazyEfficiency({self.efficiency_variant: candidates.flop_eff[:n]}, spec=self.spec,
                                        cands=candidates)
            return choose_victim(rule, CandidateTable(candidates, efficiency))
        if not rule.alpha or rule.efficiency == self.efficiency_variant:
            eff = candidates.flop_eff[:n]
        else:
            eff = flop_efficiency_array(self.spec, candidates.depth[:n], candidates.edge_len[:n],
                                        candidates.has_ssm[:n], rule.efficiency)
        return rule.choose(candidates, eff)

    def describe(self) -> dict[str, object]:
        return {"eviction": self.name, "rules": "/".join(r.label() for r in self.rules), "rule": self.rule.label()}
