"""Marconi's FLOP-aware eviction for SGLang's hybrid radix cache (``UnifiedRadixCache``).

Under ``--radix-eviction-policy marconi`` both of SGLang's eviction walks (the FULL-KV leaf heap,
through :meth:`MarconiStrategy.get_priority`, and the Mamba-state walk, through
:meth:`MarconiStrategy.pick_state`) follow ``normalised recency + α · normalised FLOP efficiency``,
lowest first. A node's savings count from its *fallback* (the nearest ancestor holding a Mamba
state), a stateless node is worth 0, and branch points are Mamba candidates last. At α = 0 both walks
take SGLang's own LRU victims in its order. Rules the fast path does not serve
(:func:`strategy_serves`) go through the core's scoring (the generic path); dead-tail cuts are
refused. Nothing here imports SGLang: nodes are read through ``parent``, ``children``, ``key``,
``component_data[i].value`` and ``last_access_time``. Details: ``docs/sglang.md``.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from marconi.choosers.family import parse_rules
from marconi.core.candidates import CandidateSet, CandidateTable, LazyEfficiency, flop_efficiency
from marconi.core.eviction import EFFICIENCIES, EvictionRule, Rule, check_cuts_tails, choose_victim
from marconi.core.model import ModelSpec, SpecError, get_model
from marconi.core.registry import ConfigError, brief_repr
from marconi.integrations.common.alpha import AlphaSource, FixedAlpha, FixedRule, RequestObservation

__all__ = ["DEFAULT_ALPHA", "DEFAULT_CONFIG_ALPHA", "DEFAULT_SELECTOR", "EFFICIENCIES", "SELECTORS", "WORLDS_RULES",
           "MarconiStrategy", "WORDS", "config_from_words", "parse_config", "radix_rule", "strategy_serves",
           "world_rule"]

#: The fixed α the plugin applied by default before issue 31 (``{"alpha": 0.5}`` still asks for it),
#: and :class:`MarconiStrategy`'s when built with a number.
DEFAULT_ALPHA = 0.5
#: What ``--radix-eviction-policy marconi`` does without a config: adaptive, by exact worlds (issue 31:
#: fixed α = 0.5 lost to stock SGLang on swe-sample at 0.05x; docs/sglang.md has the nine points).
DEFAULT_CONFIG_ALPHA = "adaptive"
#: How adaptive α chooses: ``worlds`` (one exact emulation of SGLang's cache per rule,
#: :mod:`marconi.integrations.common.worlds_alpha`) or ``regret`` (the regret selector on a size-only
#: Marconi shadow, :mod:`marconi.integrations.common.shadow_alpha`: the adaptive α before issue 31).
SELECTORS = ("worlds", "regret")
DEFAULT_SELECTOR = "worlds"
#: The worlds' default family, live rule first: a2m beat stock SGLang at every bench point when fixed
#: (lru first lost 0.02 pp at swe-sample 0.02x, switching too late to keep what a2m had kept).
WORLDS_RULES = "a2m/a0.5m/lru"
#: What the strategy calls itself in a refused rule's message.
RADIX_CACHE = "SGLang's radix cache"
_KEYS = {"alpha", "efficiency", "model", "rules", "chooser", "selector"}   # selector: chooser's alias
#: The config keys a command line gives as ``key=value`` words (``model`` comes from its own flag).
WORDS = ("alpha", "efficiency", "selector", "rules")


def strategy_serves(rule: Rule) -> bool:
    """Whether :class:`MarconiStrategy`'s own arithmetic (the fast path) applies ``rule``: ``lru``, and
    FLOP-aware rules with linear recency, single-child candidates and hit touch; none cutting tails."""
    if not isinstance(rule, EvictionRule) or rule.tails:
        return False
    return rule.is_lru or (rule.recency == "linear" and rule.candidates == "single-child" and rule.touch == "hit")


def radix_rule(rule: Rule) -> tuple[float, str | None]:
    """``(alpha, efficiency)`` with which the fast path applies ``rule`` (``lru`` -> α = 0; ``aX`` /
    ``aXm`` -> α = X on the total / marginal efficiency). ConfigError for a rule the fast path does
    not serve (:func:`strategy_serves`)."""
    if not strategy_serves(rule):
        check_cuts_tails(rule, RADIX_CACHE, False)
        raise ConfigError(f"adaptive rule {rule.label()!r} has no counterpart in the adaptive alpha of {RADIX_CACHE}: "
                          "use lru, aX or aXm, e.g. lru/a0.5m/a2m")
    assert isinstance(rule, EvictionRule)
    return (0.0, None) if rule.is_lru else (rule.alpha, rule.efficiency.value if rule.alpha else None)


def world_rule(rule: Rule) -> tuple[Any, str | None]:
    """How the exact-worlds source builds a world for ``rule``: :func:`radix_rule`'s pair for a rule
    the fast path serves, else ``(rule, None)`` (the world's strategy applies it by the generic path).
    ConfigError for a rule that cuts dead tails."""
    if strategy_serves(rule):
        return radix_rule(rule)
    return check_cuts_tails(rule, RADIX_CACHE, False), None


def parse_config(config: Mapping[str, Any] | str | None) -> dict[str, Any]:
    """The ``--radix-eviction-policy-config`` of ``marconi``, checked (ConfigError naming the key): ``alpha``
    (a finite number >= 0, or ``"adaptive"``, the default), ``efficiency`` (with a number only: adaptive
    rules carry their own), ``model`` (a preset or HF config path; default: the served model), and with
    adaptive ``chooser`` (alias ``selector``: ``worlds`` or ``regret``) and ``rules`` (``default``:
    :data:`WORLDS_RULES` for worlds, ``lru/a0.5m/a2m`` for regret; every label checked as that chooser
    will apply it). A string is read as JSON (a key given twice is refused). The result names the
    chooser ``selector``, None for a fixed α."""
    config = _config_mapping(config)
    unknown = set(config) - _KEYS
    if unknown:
        raise ConfigError(f"marconi eviction config: unknown keys {sorted(unknown, key=str)}; known: {sorted(_KEYS)}")
    if "chooser" in config:   # the rule chooser's name; ``selector`` is its alias (the result keeps ``selector``)
        if "selector" in config and config["selector"] != config["chooser"]:
            raise ConfigError(f"marconi eviction config: chooser {config['chooser']!r} and its alias selector "
                              f"{config['selector']!r} disagree")
        config = {**{k: v for k, v in config.items() if k != "chooser"}, "selector": config["chooser"]}
    alpha = _config_alpha(config.get("alpha", DEFAULT_CONFIG_ALPHA))
    efficiency = config.get("efficiency", "total")
    if efficiency not in EFFICIENCIES:
        raise ConfigError(f"marconi eviction config: efficiency must be one of {EFFICIENCIES}, got {efficiency!r}")
    model = _config_model(config.get("model"))
    if alpha != "adaptive":
        for key in ("rules", "selector"):
            if key in config:
                raise ConfigError(f"marconi eviction config: {key!r} goes with alpha 'adaptive'")
        return {"alpha": alpha, "efficiency": efficiency, "model": model, "rules": None, "selector": None}
    if "efficiency" in config:
        raise ConfigError("marconi eviction config: 'efficiency' goes with a number for alpha: with alpha 'adaptive' "
                          "each rule carries its own (aXm marginal, aX total); drop efficiency")
    selector = config.get("selector", DEFAULT_SELECTOR)
    if selector not in SELECTORS:
        raise ConfigError(f"marconi eviction config: selector must be one of {SELECTORS}, got {selector!r}")
    rules = config.get("rules", "default")
    if not isinstance(rules, str) or not rules.strip():
        raise ConfigError(f"marconi eviction config: rules must be labels joined by '/', e.g. {WORLDS_RULES}, "
                          f"got {rules!r}")
    if rules.strip() == "default" and selector == "worlds":
        rules = WORLDS_RULES
    _check_rules(rules, selector)
    return {"alpha": alpha, "efficiency": efficiency, "model": model, "rules": rules, "selector": selector}


def config_from_words(words: Mapping[str, str], where: str, model: Any = None) -> dict[str, Any]:
    """A command line's ``key=value`` words (keys in :data:`WORDS`; ``alpha`` a number or ``adaptive``)
    as the plugin's config, checked by :func:`parse_config` and returned as given (``model`` added
    when not None), for ``--radix-eviction-policy-config``. ConfigError prefixed by ``where`` (the
    option or system the words came from) for an unknown key or a config the parser refuses (an
    ``alpha`` that is neither a number nor ``adaptive`` among them, in the parser's words)."""
    config: dict[str, Any] = {} if model is None else {"model": model}
    for key, value in words.items():
        if key not in WORDS:
            raise ConfigError(f"{where}: unknown parameter {key!r} ({', '.join(WORDS)})")
        if key == "alpha":           # a number as a JSON config holds it; any other word the parser judges
            try:
                config[key] = float(value)
            except ValueError:
                config[key] = value
        else:
            config[key] = value
    try:
        parse_config(config)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return config


def _config_mapping(config: Mapping[str, Any] | str | None) -> Mapping[str, Any]:
    """The config as a mapping: None or a blank string is ``{}``; a string is a JSON object."""
    if config is None:
        return {}
    if isinstance(config, str):
        if not config.strip():
            return {}
        try:
            config = json.loads(config, object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"marconi eviction config (--radix-eviction-policy-config): not JSON: {exc.msg} at "
                              f"line {exc.lineno} column {exc.colno}; write an object, e.g. '{{\"alpha\": 0.5}}'") from None
    if not isinstance(config, Mapping):
        raise ConfigError(f"marconi eviction config (--radix-eviction-policy-config) must be a JSON object, "
                          f"got {brief_repr(config)}")
    return config


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ConfigError(f"marconi eviction config: key {', '.join(map(repr, twice))} given twice")
    return dict(pairs)


def _config_alpha(value: Any) -> float | str:
    """``"adaptive"``, or the number as a float (ConfigError unless finite and >= 0; a bool is no number)."""
    if isinstance(value, str) and value == "adaptive":
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        alpha = math.nan
    else:
        try:
            alpha = float(value)
        except OverflowError:             # an int past float's range
            alpha = math.inf
    if not (math.isfinite(alpha) and alpha >= 0):
        raise ConfigError(f"marconi eviction config: alpha must be a finite number >= 0 or 'adaptive', "
                          f"got {brief_repr(value)}")
    return alpha


def _config_model(value: Any) -> str | ModelSpec | None:
    """``model``: absent/None (the served model), a non-empty preset name or path, or a ModelSpec."""
    if value is None or isinstance(value, ModelSpec) or (isinstance(value, str) and value.strip()):
        return value
    raise ConfigError(f"marconi eviction config: model must be a preset name or a path to a Hugging Face "
                      f"config.json / model directory, got {brief_repr(value)}")


def _check_rules(rules: str, selector: str) -> None:
    """Every label of the family, checked now as the ``selector``'s source will apply it (worlds:
    :func:`world_rule`, regret: :func:`radix_rule`), so a bad family fails here, naming ``rules``."""
    rule_map = world_rule if selector == "worlds" else radix_rule
    try:
        for rule in parse_rules(rules):
            rule_map(rule)
    except ConfigError as exc:
        raise ConfigError(f"marconi eviction config: rules {rules!r}: {exc}") from None


def _min_max(value: float, lo: float, hi: float) -> float:
    if hi <= lo:
        return 0.0
    return min(1.0, max(0.0, (value - lo) / (hi - lo)))


class MarconiStrategy:
    """SGLang's ``EvictionStrategy`` for ``marconi`` (duck-typed: ``get_priority``), plus the Mamba pick.

    ``mamba_index``: SGLang's ``ComponentType.MAMBA`` (index into ``node.component_data``); ``alpha``:
    a number >= 0, a fixed :class:`~marconi.core.eviction.Rule`, or an adaptive
    :class:`AlphaSource`. ConfigError for an unknown efficiency or a rule that cuts dead tails.
    """

    def __init__(self, spec: ModelSpec, mamba_index: int | None, alpha: float | AlphaSource | Rule = DEFAULT_ALPHA,
                 efficiency: str = "total") -> None:
        if efficiency not in EFFICIENCIES:
            raise ConfigError(f"efficiency must be one of {EFFICIENCIES}, got {efficiency!r}")
        self.spec = spec
        self.mamba_index = mamba_index
        if isinstance(alpha, (int, float)):
            alpha = FixedAlpha(alpha)
        elif isinstance(alpha, Rule):
            alpha = FixedRule(alpha)
        self.alpha_source: AlphaSource = alpha
        self._named: tuple[Any, Rule | None] = (None, None)   # (the source's rule, it if generic)
        self._walk: tuple[list[Any], dict[int, float]] = ([], {})   # the generic FULL walk's leaves, scores
        self.generic_rule()                                      # refuses a rule it cannot apply, now
        self.efficiency = efficiency
        self.counters: Counter[str] = Counter()
        self._rec_lo = self._rec_hi = 0.0
        self._eff_lo = self._eff_hi = 0.0
        self._eff_cache: dict[tuple[int, int, bool, str], float] = {}

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | str | None, *, mamba_index: int | None,
                    default_model: str | ModelSpec | None = None) -> "MarconiStrategy":
        cfg = parse_config(config)
        model = cfg["model"] or default_model
        if model is None:
            raise ConfigError("marconi eviction: no model to cost (set 'model' in --radix-eviction-policy-config)")
        try:
            spec = get_model(model)
        except SpecError as exc:
            where = ("marconi eviction config: model" if cfg["model"] else
                     "marconi eviction: the served model (set 'model' in --radix-eviction-policy-config)")
            raise ConfigError(f"{where}: {exc}") from None
        source: float | AlphaSource = cfg["alpha"]
        if cfg["selector"] == "worlds":
            from marconi.integrations.common.worlds_alpha import WorldsAlpha

            source = WorldsAlpha(cfg["rules"], rule_map=world_rule)
        elif cfg["selector"] == "regret":
            from marconi.integrations.common.shadow_alpha import ShadowAlpha

            source = ShadowAlpha(cfg["rules"], rule_map=radix_rule)
        return cls(spec, mamba_index, source, cfg["efficiency"])

    # ----------------------------------------------------------------------------- α
    @property
    def alpha(self) -> float:
        return float(self.alpha_source.alpha())

    @property
    def variant(self) -> str:
        return self.alpha_source.efficiency() or self.efficiency

    def generic_rule(self) -> Rule | None:
        """The rule the generic path applies now: the source's named rule (``rule``) when the fast
        path does not serve it, else None. ConfigError for a rule that cuts dead tails."""
        rule = getattr(self.alpha_source, "rule", None)
        if rule is None:
            return None
        named = self._named
        if rule is not named[0]:
            generic = (None if not isinstance(rule, Rule) or strategy_serves(rule)
                       else check_cuts_tails(rule, RADIX_CACHE, False))
            self._named = named = (rule, generic)
        return named[1]

    def start_shadow(self, kv_tokens: int, mamba_slots: int, make_world: Any = None) -> None:
        """Start an adaptive source (a no-op for a fixed α or when started): the regret shadow gets
        the pools' bytes, the worlds source builds its worlds with ``make_world`` (ConfigError
        without one)."""
        from marconi.integrations.common.shadow_alpha import ShadowAlpha
        from marconi.integrations.common.worlds_alpha import WorldsAlpha

        source = self.alpha_source
        if isinstance(source, WorldsAlpha) and not source.started:
            if make_world is None:
                raise ConfigError("marconi eviction: the worlds selector needs the engine's worlds (make_world)")
            source.start(make_world)
        elif isinstance(source, ShadowAlpha) and not source.started:
            source.start(self.spec, kv_tokens * self.spec.kv_bytes_per_token
                         + mamba_slots * self.spec.ssm_checkpoint_bytes)

    def observe(self, prompt: Sequence[int], output: Sequence[int], hit_len: int, kv_only_len: int = 0) -> None:
        """A finished request (its token ids): what an adaptive source learns from."""
        if getattr(self.alpha_source, "started", True):
            self.alpha_source.observe(RequestObservation(prompt, output, hit_len, kv_only_len))

    # ----------------------------------------------------------------------------- nodes
    def has_state(self, node: Any) -> bool:
        """Whether ``node`` holds a Mamba state (never on SGLang's plain ``RadixCache``, whose nodes
        have no components: the policy then ranks attention KV alone)."""
        if self.mamba_index is None:
            return False
        data = getattr(node, "component_data", None)
        return data is not None and data[self.mamba_index].value is not None

    @staticmethod
    def depth(node: Any) -> int:
        d = 0
        while node is not None and node.parent is not None:
            d += len(node.key)
            node = node.parent
        return d

    def fallback_depth(self, node: Any) -> int:
        """Depth of the nearest proper ancestor holding a Mamba state (0: the root)."""
        anc = node.parent
        while anc is not None and anc.parent is not None:
            if self.mamba_index is None or self.has_state(anc):
                return self.depth(anc)
            anc = anc.parent
        return 0

    def node_efficiency(self, node: Any, variant: str | None = None) -> float:
        """FLOPs saved per byte held by ``node`` (0 where it holds no state a request resumes from), in
        the live variant unless ``variant`` names one."""
        if self.mamba_index is not None and not self.has_state(node):
            return 0.0
        depth = self.depth(node)
        edge = depth - self.fallback_depth(node)
        key = (depth, edge, self.mamba_index is not None, variant or self.variant)
        eff = self._eff_cache.get(key)
        if eff is None:
            eff = flop_efficiency(self.spec, depth, edge, key[2], key[3])
            self._eff_cache[key] = eff
        return eff

    # ----------------------------------------------------------------------------- FULL heap
    def table(self, nodes: Sequence[Any], times: Sequence[float], leaf: Sequence[bool]) -> CandidateTable:
        """The candidate table of ``nodes`` for a rule: ``times`` as the recency of both touches (their
        rank as the order), ``leaf`` flags, depth and edge from the fallback, and efficiency per variant
        on first use (:meth:`node_efficiency`)."""
        time = np.asarray(times, dtype=np.float64)
        order = np.empty(len(nodes), dtype=np.int64)
        order[np.argsort(time, kind="stable")] = np.arange(len(nodes))
        depth = np.fromiter((self.depth(n) for n in nodes), dtype=np.int64, count=len(nodes))
        fallback = np.fromiter((self.fallback_depth(n) for n in nodes), dtype=np.int64, count=len(nodes))
        has_state = [self.mamba_index is None or self.has_state(n) for n in nodes]
        cands = CandidateSet.of(list(nodes), last_access=time, access_seq=order, path_access=time, path_seq=order,
                                depth=depth, edge_len=depth - fallback, has_ssm=has_state, leaf=list(leaf))
        effs = LazyEfficiency({}, compute=lambda v: [self.node_efficiency(n, v) for n in nodes])
        return CandidateTable(cands, effs)

    def _generic_scores(self, rule: Rule, nodes: Sequence[Any]) -> np.ndarray:
        scores = np.asarray(rule.scores(self.table(nodes, [n.last_access_time for n in nodes], [True] * len(nodes))),
                            dtype=np.float64)
        if scores.shape != (len(nodes),) or np.isnan(scores).any():
            raise ConfigError(f"rule {rule.label()!r} scored {len(nodes)} nodes as {scores!r}")
        return scores

    def begin_full_walk(self, leaves: Iterable[Any]) -> None:
        """Freeze the normalisation bounds over the leaves the FULL walk starts with (the generic
        path: score those leaves as one table)."""
        leaves = list(leaves)
        generic = self.generic_rule()
        if generic is not None:
            scores = self._generic_scores(generic, leaves) if leaves else []
            self._walk = (leaves, {id(n): float(v) for n, v in zip(leaves, scores)})
            return
        if not leaves:
            self._rec_lo = self._rec_hi = self._eff_lo = self._eff_hi = 0.0
            return
        times = [n.last_access_time for n in leaves]
        self._rec_lo, self._rec_hi = min(times), max(times)
        if self.alpha > 0:
            effs = [self.node_efficiency(n) for n in leaves]
            self._eff_lo, self._eff_hi = min(effs), max(effs)

    def get_priority(self, node: Any) -> tuple[float, float]:
        """``(utility, last_access_time)``: SGLang's heap pops the lowest first."""
        t = node.last_access_time
        generic = self.generic_rule()
        if generic is not None:
            leaves, scores = self._walk
            score = scores.get(id(node))
            if score is None:               # pushed during the walk: scored among the walk's leaves
                score = float(self._generic_scores(generic, [*leaves, node])[-1])
            return score, t
        utility = _min_max(t, self._rec_lo, self._rec_hi)
        alpha = self.alpha
        if alpha > 0:
            utility += alpha * _min_max(self.node_efficiency(node), self._eff_lo, self._eff_hi)
        return utility, t

    # ----------------------------------------------------------------------------- Mamba walk
    def pick_state(self, lru_order: Sequence[Any], is_leaf: Any) -> Any | None:
        """The Mamba walk's next victim among ``lru_order`` (least recent first; unlocked states);
        ``is_leaf(node)``: SGLang's evictable-leaf test."""
        if not lru_order:
            return None
        generic = self.generic_rule()
        if generic is not None:
            pool = [i for i, x in enumerate(lru_order) if is_leaf(x) or len(x.children) < 2] or range(len(lru_order))
            nodes = [lru_order[i] for i in pool]
            table = self.table(nodes, [float(i) for i in pool], [bool(is_leaf(x)) for x in nodes])
            return nodes[choose_victim(generic, table)]
        alpha = self.alpha
        if alpha == 0:
            return lru_order[0]
        n = len(lru_order)
        effs = [self.node_efficiency(x) for x in lru_order]
        lo, hi = min(effs), max(effs)
        best, best_key = None, None
        for i, x in enumerate(lru_order):
            branch = (not is_leaf(x)) and len(x.children) >= 2
            utility = (i / (n - 1) if n > 1 else 0.0) + alpha * _min_max(effs[i], lo, hi)
            key = (branch, utility, i)
            if best_key is None or key < best_key:
                best, best_key = x, key
        return best

    def count(self, kind: str, n: int = 1) -> None:
        self.counters[kind] += n

    def __repr__(self) -> str:
        return (f"MarconiStrategy(model={self.spec.name!r}, alpha={self.alpha_source!r}, "
                f"efficiency={self.efficiency!r})")
