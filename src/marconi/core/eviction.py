"""Eviction rules and policies: a rule scores candidates, the cache owns the eviction loop.

A :class:`Rule` is a value every engine applies to the candidate table it fills, so a rule is written
once; :func:`score_rules` is the one scoring specification every engine's fast path is held to.
Semantics of ``lru`` and ``flop-aware``: ``docs/cache-api.md``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence, runtime_checkable

import numpy as np

from marconi.core.candidates import CandidateSet, CandidateTable, LazyEfficiency
from marconi.core.registry import ConfigError, Domain, Registry

if TYPE_CHECKING:
    from marconi.core.cache import PrefixCache

__all__ = ["EvictionPolicy", "EvictionRule", "Rule", "RulePolicy", "LRU", "FlopAware", "EVICTION_POLICIES",
           "EvictionBase", "make_eviction", "check_alpha", "score_rules", "min_max", "argmin_ties_by_order", "choose_victim",
           "Efficiency", "Recency", "Candidates", "Touch", "EFFICIENCIES", "register_rule_label",
           "unregister_rule_label", "rule_from_label", "rule_labels", "check_cuts_tails"]


class Efficiency(StrEnum):
    """Which FLOP efficiency a rule weighs: the whole prefix's (the paper's) or the node's own edge's."""

    TOTAL = "total"
    MARGINAL = "marginal"


class Recency(StrEnum):
    """How recency is scored: linear in the last access, or inverse age in accesses."""

    LINEAR = "linear"
    INVERSE_AGE = "inverse-age"


class Candidates(StrEnum):
    """Which nodes may be victims: those with at most one child (Marconi) or leaves only (SGLang)."""

    SINGLE_CHILD = "single-child"
    LEAVES = "leaves"


class Touch(StrEnum):
    """Which recency signal: refreshed on the node a hit resumed from, or on every matched node."""

    HIT = "hit"
    PATH = "path"


#: The efficiency variants, as plain strings (every engine validates against this one tuple).
EFFICIENCIES: tuple[str, ...] = tuple(e.value for e in Efficiency)
RECENCIES: tuple[str, ...] = tuple(r.value for r in Recency)
CANDIDATE_KINDS: tuple[str, ...] = tuple(c.value for c in Candidates)
TOUCHES: tuple[str, ...] = tuple(t.value for t in Touch)


@runtime_checkable
class Rule(Protocol):
    """What every engine needs to apply an eviction rule (immutable, hashable): ``candidates``
    (``single-child``, or ``leaves`` by the table's leaf flags), ``touch`` (the recency signal),
    ``tails`` (cut predicted-dead tails first: :func:`check_cuts_tails`) and ``scores(table)``, one
    float per row, lowest evicted (``inf`` where the rule does not look; ties: :func:`choose_victim`).
    """

    candidates: Candidates
    touch: Touch
    tails: bool

    def label(self) -> str:
        ...

    def scores(self, table: CandidateTable) -> np.ndarray:
        ...


def choose_victim(rule: Rule, table: CandidateTable) -> int:
    """Row of ``table`` (non-empty) ``rule`` evicts: the lowest score, exact ties to the smallest
    access order under the rule's touch. Raises ConfigError if the rule's scores are not one finite
    or infinite float per row (a nan leaves no victim)."""
    scores = np.asarray(rule.scores(table), dtype=np.float64)
    if scores.shape != (len(table),) or np.isnan(scores).any() or not np.isfinite(scores).any():
        raise ConfigError(f"rule {rule.label()!r} scored {len(table)} candidates as {scores!r}: want one float per "
                          "candidate, no nan, at least one finite")
    return argmin_ties_by_order(scores, table.recency(rule.touch)[1])


def check_cuts_tails(rule: Rule, where: str, cuts_tails: bool) -> Rule:
    """``rule``, or ConfigError if it cuts dead tails (``t``) and ``where`` cannot (``cuts_tails``
    False: only a cache that tracks the tails' prediction can cut them)."""
    if rule.tails and not cuts_tails:
        raise ConfigError(f"{where} cannot cut dead tails: rule {rule.label()!r} asks for it (t); drop the t")
    return rule


#: Label parsers of rule classes other than :class:`EvictionRule`, by name, in registration order.
_RULE_LABELS: dict[str, Callable[[str], "Rule | None"]] = {}


def register_rule_label(name: str, parse: Callable[[str], "Rule | None"]) -> None:
    """Make :func:`rule_from_label` accept the labels ``parse`` recognises: it returns the rule a label
    names, or None for a label that is not its own (then the next parser, and finally
    :meth:`EvictionRule.from_label`, are asked). Raises ConfigError if ``name`` is registered."""
    if name in _RULE_LABELS:
        raise ConfigError(f"rule label parser {name!r} is registered already")
    _RULE_LABELS[name] = parse


def unregister_rule_label(name: str) -> None:
    """Forget the parser registered as ``name`` (KeyError if none is)."""
    del _RULE_LABELS[name]


def rule_labels() -> tuple[str, ...]:
    """Names of the registered label parsers."""
    return tuple(_RULE_LABELS)


#: What a label looks like, for error messages.
_LABEL_FORMS = "lru[t] or a<alpha>[m][i][l][p][t] (e.g. lru, a1m, a2lp, a0.5mt)"


def rule_from_label(label: str) -> Rule:
    """The rule ``label`` names: a registered parser's, else :meth:`EvictionRule.from_label`'s
    (whose ConfigError, naming the registered parsers, is raised when no one knows it).
    Every bad label is a ConfigError naming it and what labels look like: a label that is not a
    string, and a label on which a parser raised (ValueError, TypeError, LookupError, AttributeError,
    ArithmeticError; chained as the cause) instead of returning None or raising ConfigError."""
    if not isinstance(label, str):
        raise ConfigError(f"a rule label is a string, {_LABEL_FORMS}, got {type(label).__name__} {label!r}")
    text = label.strip()
    for name, parse in tuple(_RULE_LABELS.items()):
        try:
            rule = parse(text)
        except (ValueError, TypeError, LookupError, AttributeError, ArithmeticError) as exc:
            raise ConfigError(f"rule {label!r}: label parser {name!r} raised {type(exc).__name__}: {exc}; a label "
                              f"is {_LABEL_FORMS} or one a registered parser knows ({', '.join(_RULE_LABELS)}), "
                              "and a parser returns None for a label not its own") from exc
        if rule is not None:
            return rule
    try:
        return EvictionRule.from_label(text)
    except ConfigError as exc:
        if not _RULE_LABELS:
            raise
        raise ConfigError(f"{exc} (or a label of: {', '.join(_RULE_LABELS)})") from None


def check_alpha(alpha: Any, where: str) -> None:
    """Raise ConfigError unless ``alpha`` is a finite real number >= 0 (an infinite α makes a nan
    utility, ``inf * 0``, which leaves no victim)."""
    if (isinstance(alpha, bool) or not isinstance(alpha, numbers.Real)
            or not math.isfinite(alpha) or alpha < 0):
        raise ConfigError(f"{where}: alpha must be >= 0 and finite (a number), got {alpha!r}")


@dataclass(frozen=True, slots=True)
class EvictionRule:
    """One rule of the FLOP-aware family: utility = normalised recency + ``alpha`` · normalised
    FLOP efficiency, lowest evicted. The four kinds are the enums above; ``tails`` cuts predicted
    dead tails first (:mod:`marconi.core.tails`). ``EvictionRule(candidates="leaves",
    touch="path")`` decides exactly as SGLang+'s LRU.
    """

    alpha: float = 0.0
    efficiency: Efficiency = Efficiency.TOTAL
    recency: Recency = Recency.LINEAR
    candidates: Candidates = Candidates.SINGLE_CHILD
    touch: Touch = Touch.HIT
    tails: bool = False

    def __post_init__(self) -> None:
        """Strings are accepted for the four kinds and converted (ConfigError naming the allowed ones)."""
        check_alpha(self.alpha, "flop-aware")
        for what, kind in (("efficiency", Efficiency), ("recency", Recency), ("candidates", Candidates),
                           ("touch", Touch)):
            value = getattr(self, what)
            try:
                object.__setattr__(self, what, kind(value))
            except (ValueError, TypeError):
                raise ConfigError(f"flop-aware: {what} must be one of {', '.join(k.value for k in kind)}; "
                                  f"got {value!r}") from None

    @property
    def is_lru(self) -> bool:
        """SGLang+'s semantics: recency only (any transform ranks the same), leaves, path touch."""
        return self.alpha == 0 and self.candidates == "leaves" and self.touch == "path"

    def label(self) -> str:
        """A compact name: ``lru``, or ``a`` + α + flags ``m`` (marginal efficiency), ``i``
        (inverse-age recency), ``l`` (leaf candidates), ``p`` (path touch), ``t`` (dead tails
        first): ``a1m``, ``a2lp``, ``a0.5mt``; ``lrut`` is ``lru`` with dead tails first."""
        if self.is_lru and self.recency == "linear":
            return "lrut" if self.tails else "lru"
        flags = "".join(flag for flag, on in (("m", self.efficiency == "marginal" and self.alpha > 0),
                                               ("i", self.recency == "inverse-age"), ("l", self.candidates == "leaves"),
                                               ("p", self.touch == "path"), ("t", self.tails)) if on)
        return f"a{self.alpha:g}{flags}"

    @classmethod
    def from_label(cls, label: str) -> "EvictionRule":
        """The inverse of :meth:`label` (``lru``, ``a0``, ``a0.5m``, ``a1mi``, ``a2lp`` ...)."""
        text = label.strip()
        if text in ("lru", "lrut"):
            return cls(candidates="leaves", touch="path", tails=text == "lrut")
        if not text.startswith("a"):
            raise ConfigError(f"rule {label!r}: write lru[t] or a<alpha>[m][i][l][p][t], e.g. a1m, a2lp, a0.5mt")
        body = text[1:]
        end = len(body.rstrip("milpt"))
        flags, number = body[end:], body[:end]
        try:
            alpha = float(number)
        except ValueError:
            raise ConfigError(f"rule {label!r}: {number!r} is not a number (write a<alpha>[m][i][l][p][t])") from None
        check_alpha(alpha, f"rule {label!r}")  # float() accepts 'inf' and 'nan'
        if len(set(flags)) != len(flags):
            raise ConfigError(f"rule {label!r}: a flag is repeated")
        return cls(alpha, "marginal" if "m" in flags else "total", "inverse-age" if "i" in flags else "linear",
                   "leaves" if "l" in flags else "single-child", "path" if "p" in flags else "hit", "t" in flags)

    def describe(self) -> dict[str, object]:
        out: dict[str, object] = {"alpha": self.alpha, "efficiency": self.efficiency.value,
                                  "recency": self.recency.value, "candidates": self.candidates.value,
                                  "touch": self.touch.value}
        if self.tails:
            out["tails"] = True
        return out

    def scores(self, table: CandidateTable) -> np.ndarray:
        """The :class:`Rule` contract: :func:`score_rules`' full row for this rule (``inf`` outside a
        leaf-only rule's leaves); the efficiency variant is read from the table only when α > 0."""
        ((_, scores, _),) = score_rules((self,), table.cands, table.efficiency, full=True)
        return scores

    def choose(self, cands: CandidateSet, efficiency: np.ndarray) -> int:
        """Index of the victim among ``cands`` (non-empty); ``efficiency`` per candidate in this rule's
        variant. Normalised over the rule's own candidates only, so a larger candidate set decides alike."""
        ((victim, _, _),) = score_rules((self,), cands, {self.efficiency: efficiency}, full=False)
        return victim


def score_rules(rules: Sequence[EvictionRule], cands: CandidateSet, efficiency: "dict[str, np.ndarray]", *,
                full: bool = True) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Per rule: (its victim, its scores, its tie-break order) over the candidates, sharing normalised
    terms between rules. ``efficiency`` (variant -> per candidate) is read only for α > 0. A leaf-only
    rule looks at leaves only (at every candidate if none is a leaf); with ``full`` its scores are
    ``inf`` and its order 0 elsewhere, so every row spans all candidates.
    """
    n = len(cands)
    leaf = cands.leaf[:n]
    subsets: dict[str, np.ndarray | None] = {"single-child": None, "leaves": None}
    if not leaf.all():
        found = np.flatnonzero(leaf)
        subsets["leaves"] = found if found.size else None
    recency: dict[tuple[str, str, str], np.ndarray] = {}
    normalised_eff: dict[tuple[str, str], np.ndarray] = {}
    out = []
    for rule in rules:
        subset = subsets[rule.candidates]
        if rule.touch == "hit":
            last, seq = cands.last_access[:n], cands.access_seq[:n]
        else:
            last, seq = cands.path_access[:n], cands.path_seq[:n]
        if subset is not None:
            last, seq = last[subset], seq[subset]
        key = (rule.candidates, rule.touch, rule.recency)
        if key not in recency:
            recency[key] = min_max(last) if rule.recency == "linear" else min_max(1.0 / (seq.max() - seq + 1.0))
        scores = recency[key]
        if rule.alpha:
            ekey = (rule.candidates, rule.efficiency)
            if ekey not in normalised_eff:
                eff = efficiency[rule.efficiency]
                normalised_eff[ekey] = min_max(eff if subset is None else eff[subset])
            scores = scores + rule.alpha * normalised_eff[ekey]
        best = argmin_ties_by_order(scores, seq)
        if subset is None:
            out.append((best, scores, seq))
        elif not full:
            out.append((int(subset[best]), scores, seq))
        else:
            all_scores = np.full(n, np.inf)
            all_scores[subset] = scores
            all_seq = np.zeros(n, dtype=seq.dtype)
            all_seq[subset] = seq
            out.append((int(subset[best]), all_scores, all_seq))
    return out


def min_max(values: np.ndarray) -> np.ndarray:
    """``values`` scaled to [0, 1] (all zeros when they are all equal): the utility's normalisation."""
    lo, hi = values.min(), values.max()
    if hi <= lo:
        return np.zeros_like(values)
    return (values - lo) / (hi - lo)


def argmin_ties_by_order(scores: np.ndarray, order: np.ndarray) -> int:
    """argmin of ``scores``; exact ties go to the least recently accessed (smallest order)."""
    best = scores.min()
    ties = np.flatnonzero(scores == best)
    if ties.size == 1:
        return int(ties[0])
    return int(ties[np.argmin(order[ties])])


@runtime_checkable
class EvictionPolicy(Protocol):
    """What an eviction policy decides and declares; the cache does the bookkeeping and the surgery.

    :class:`EvictionBase` gives every member but ``choose`` and ``describe`` its default. ``bind``
    is called once, at the cache's construction (and on a clone's copy). ``tracks_tails``: the cache
    keeps the dead-tail prediction (:mod:`marconi.core.tails`), read once at construction;
    ``trims_tails``: cut predicted-dead tails before a victim now (read at every eviction).
    ``set_rule`` applies a rule from now on (ConfigError for one the policy cannot apply);
    ``chooser`` is the :class:`~marconi.core.chooser.RuleChooser` that sets it online, or None.
    """

    name: str
    evicts_inner_nodes: bool   # candidates: nodes with <= 1 child (True) or leaves only (False)
    efficiency_variant: str    # which FLOP efficiency the cache keeps on nodes ("total"/"marginal")
    tracks_tails: bool
    trims_tails: bool
    chooser: Any

    def bind(self, cache: "PrefixCache") -> None:
        ...

    def set_rule(self, rule: "Rule") -> None:
        ...

    def choose(self, candidates: CandidateSet) -> int:
        """Index (into ``candidates``) of the next node to evict; ``candidates`` is non-empty."""
        ...

    def describe(self) -> dict[str, object]:
        ...


class EvictionBase:
    """Defaults of :class:`EvictionPolicy`'s declared capabilities: binds to nothing, keeps and cuts
    no dead tails, applies no rule but its own (``set_rule`` raises ConfigError), no chooser."""

    tracks_tails = False
    trims_tails = False
    chooser: Any = None

    def bind(self, cache: "PrefixCache") -> None:
        return None

    def set_rule(self, rule: "Rule") -> None:
        raise ConfigError(f"eviction policy {getattr(self, 'name', type(self).__name__)!r} applies one fixed rule; "
                          f"it cannot switch to {rule.label()!r}")


class LRU(EvictionBase):
    """SGLang-style LRU: evict the least recently used leaf; hits refresh the whole matched path."""

    name = "lru"
    evicts_inner_nodes = False
    efficiency_variant = "total"

    def choose(self, candidates: CandidateSet) -> int:
        return int(np.argmin(candidates.path_seq[: len(candidates)]))

    def describe(self) -> dict[str, object]:
        return {"eviction": self.name}


class FlopAware(EvictionBase):
    """Marconi's FLOP-aware eviction (paper §4.2), one :class:`EvictionRule` with the paper's
    defaults. ``alpha`` is mutable (the bootstrap tuner sets it); setting it validates it at once."""

    name = "flop-aware"

    def __init__(self, alpha: float = 0.0, efficiency: str = "total", recency: str = "linear",
                 candidates: str = "single-child", touch: str = "hit", tails: bool = False) -> None:
        try:
            value = alpha if isinstance(alpha, bool) else float(alpha)  # a bool is refused below
        except (TypeError, ValueError):
            raise ConfigError(f"flop-aware: alpha must be >= 0 and finite (a number), got {alpha!r}") from None
        rule = EvictionRule(value, efficiency, recency, candidates, touch, bool(tails))  # validates
        self._alpha = rule.alpha
        self.efficiency_variant = efficiency
        self.recency = recency
        self.candidates = candidates
        self.touch = touch
        self.evicts_inner_nodes = candidates == "single-child"
        self.trims_tails = self.tracks_tails = bool(tails)  # the cache reads both (``marconi.core.tails``)

    @property
    def alpha(self) -> float:
        """The weight of normalised FLOP efficiency in the utility (finite, >= 0)."""
        return self._alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        check_alpha(value, "flop-aware")
        self._alpha = float(value)

    @property
    def rule(self) -> EvictionRule:
        return EvictionRule(self.alpha, self.efficiency_variant, self.recency, self.candidates, self.touch,
                            self.trims_tails)

    def set_rule(self, rule: "Rule") -> None:
        """Apply ``rule``, a FLOP-aware rule differing from this policy's in α only (ConfigError else:
        the cache's candidates and kept efficiency are this policy's)."""
        if not (isinstance(rule, EvictionRule) and rule == EvictionRule(rule.alpha, self.efficiency_variant,
                                                                        self.recency, self.candidates, self.touch,
                                                                        self.trims_tails)):
            raise ConfigError(f"flop-aware: can switch to a rule differing in alpha only, not {rule.label()!r} "
                              f"(this policy applies {self.rule.label()!r})")
        self.alpha = rule.alpha

    def choose(self, candidates: CandidateSet) -> int:
        return self.rule.choose(candidates, candidates.flop_eff[: len(candidates)])

    def describe(self) -> dict[str, object]:
        out: dict[str, object] = {"eviction": self.name, "alpha": self.alpha, "efficiency": self.efficiency_variant,
                                  "recency": self.recency}
        if self.candidates != "single-child" or self.touch != "hit":
            out.update(candidates=self.candidates, touch=self.touch)
        if self.trims_tails:
            out["tails"] = True
        return out


class RulePolicy(EvictionBase):
    """Any :class:`Rule` as a cache's eviction policy over the cache's candidate table. The cache keeps
    the rule's efficiency variant on its nodes (else ``total``); the other is computed on demand."""

    name = "rule"

    def __init__(self, rule: Rule) -> None:
        if not isinstance(rule, Rule):
            raise ConfigError(f"eviction rule {rule!r} lacks the Rule contract (label, candidates, touch, tails, scores)")
        self.rule = rule
        self.evicts_inner_nodes = rule.candidates == Candidates.SINGLE_CHILD
        variant = str(getattr(rule, "efficiency", Efficiency.TOTAL))
        self.efficiency_variant = variant if variant in EFFICIENCIES else Efficiency.TOTAL.value
        self.trims_tails = self.tracks_tails = bool(rule.tails)  # the cache reads both
        self.spec: Any = None

    def bind(self, cache: "PrefixCache") -> None:
        self.spec = cache.spec

    def choose(self, candidates: CandidateSet) -> int:
        n = len(candidates)
        efficiency = LazyEfficiency({self.efficiency_variant: candidates.flop_eff[:n]}, spec=self.spec,
                                    cands=candidates)
        return choose_victim(self.rule, CandidateTable(candidates, efficiency))

    def describe(self) -> dict[str, object]:
        return {"eviction": self.name, "rule": self.rule.label()}


# The online choosers (regret, worlds, oracle) register here through the marconi.eviction_policies
# entry points, imported the first time the registry is read, so this module never imports them.
EVICTION_POLICIES: Registry[EvictionPolicy] = Registry("eviction policy", entry_points="marconi.eviction_policies")


@EVICTION_POLICIES.register("lru", "least recently used leaf (SGLang); hits refresh the whole path")
def _lru() -> EvictionPolicy:
    return LRU()


@EVICTION_POLICIES.register("flop-aware", "Marconi: recency + alpha * FLOP efficiency over nodes with <= 1 child",
                            domains={"alpha": Domain(0, 1e6)})
def _flop_aware(alpha: float = 0.0, efficiency: str = "total", recency: str = "linear",
                candidates: str = "single-child", touch: str = "hit", tails: bool = False) -> EvictionPolicy:
    return FlopAware(alpha=alpha, efficiency=efficiency, recency=recency, candidates=candidates, touch=touch,
                     tails=tails)


@EVICTION_POLICIES.register("flop-aware-marginal", "flop-aware with the FLOPs of the node's own edge only",
                            domains={"alpha": Domain(0, 1e6)})
def _flop_aware_marginal(alpha: float = 0.0, recency: str = "linear") -> EvictionPolicy:
    return FlopAware(alpha=alpha, efficiency="marginal", recency=recency)


@EVICTION_POLICIES.register("oracle", "future-aware (Belady-style) reference; needs the whole trace (simulator only)")
def _oracle() -> EvictionPolicy:
    raise ConfigError("the oracle eviction knows the future, so it needs the whole trace: use the 'oracle' "
                      "system through the simulator (marconi simulate), which hands it over")


def make_eviction(spec: "str | EvictionPolicy") -> EvictionPolicy:
    """The registry's policy ``spec`` names, or ``spec`` itself; ConfigError for an unknown name
    (``marconi`` is answered with the eviction that makes the default system: ``worlds``) or an object
    lacking the :class:`EvictionPolicy` contract (inherit :class:`EvictionBase` for its defaults)."""
    names = EVICTION_POLICIES.names()
    if isinstance(spec, str) and spec.partition(":")[0].strip() == "marconi" and "marconi" not in names:
        raise ConfigError(f"unknown eviction policy 'marconi'; choose one of: {', '.join(names)}. 'marconi' is an "
                          "admission policy (and the simulator's system), not an eviction policy: the default "
                          "marconi system is admission='marconi', eviction='worlds' (its rule chosen online); "
                          "for one fixed rule write eviction='flop-aware:alpha=1.0'")
    policy = EVICTION_POLICIES.create(spec) if isinstance(spec, str) else spec
    if not isinstance(policy, EvictionPolicy):
        raise ConfigError(f"{policy!r} lacks the EvictionPolicy contract (name, evicts_inner_nodes, efficiency_variant, "
                          "tracks_tails, trims_tails, chooser, bind, set_rule, choose, describe): inherit "
                          "marconi.core.eviction.EvictionBase for the defaults")
    return policy
