"""The rule family the selectors choose from, and how a family is written and served.

A family is a tuple of rules (:class:`~marconi.core.eviction.Rule`: the FLOP-aware
:class:`~marconi.core.eviction.EvictionRule` or any rule class whose labels are registered with
:func:`~marconi.core.eviction.register_rule_label`), written as labels separated by ``/``
(``"lru/a0.5m/a2m"``, the default). Every selector shares this: exact worlds
(:mod:`marconi.selectors.worlds`), counterfactual regret (:mod:`marconi.selectors.regret`) and the
vLLM plugin's adaptive α.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from marconi.core.eviction import LRU, EvictionPolicy, EvictionRule, FlopAware, Rule, RulePolicy, rule_from_label
from marconi.core.registry import ConfigError

__all__ = ["DEFAULT_RULES", "DEFAULT_RULE_LABELS", "TAILS_RULES", "TAILS_RULE_LABELS", "RuleSwitch", "cached_efficiency_variant", "parse_rules",
           "policy_for"]

#: The default family (labels: :meth:`EvictionRule.label`): SGLang+'s LRU, a balanced and an
#: aggressive FLOP-aware rule.
DEFAULT_RULE_LABELS = "lru/a0.5m/a2m"

#: The family with dead-tail cuts (issue 25, ``docs/tails.md``): the default's three rules and the
#: balanced rule that also cuts predicted-dead tails of branched sequences first (``t``,
#: :mod:`marconi.core.tails`), so the exact worlds choose between cutting (tight caches, agents and
#: shared prefixes) and keeping (roomy caches, where a cut tail is sometimes re-entered deeper).
#: Opt in with ``marconi:rules=lru/a0.5m/a0.5mt/a2m``; not the default (``docs/tails.md`` says where
#: it wins and loses). The regret selector and the vLLM plugin cannot use it: they cut nothing.
TAILS_RULE_LABELS = "lru/a0.5m/a0.5mt/a2m"


def parse_rules(text: str | Sequence[Rule], default: str = DEFAULT_RULE_LABELS) -> tuple[Rule, ...]:
    """``"default"`` (``default``'s labels) or labels separated by ``/``: ``"lru/a0/a1m/a2lp"`` ->
    rules (:func:`~marconi.core.eviction.rule_from_label`: registered labels too). ConfigError for an
    unknown label, an empty family or a rule listed twice."""
    if not isinstance(text, str):
        rules = tuple(text)
    else:
        labels = default if text.strip() == "default" else text
        rules = tuple(rule_from_label(t) for t in labels.split("/") if t.strip())
    if not rules:
        raise ConfigError("the adaptive rule family is empty")
    if len(set(rules)) != len(rules):
        raise ConfigError(f"the adaptive rule family lists a rule twice: {[r.label() for r in rules]}")
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
