"""The regret chooser (``marconi:chooser=regret``): the live rule is the one least charged for
counterfactual evictions. Each rule names the victims it would evict in the live state; it is
charged (decayed tokens or FLOPs) when one is needed later, evicted ones as *ghosts*. Cheaper than
exact worlds, but biased against the live rule (``docs/adaptive.md``). Deterministic.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from marconi.core.cache import PrefixCache, RequestHandle
from marconi.core.candidates import CandidateSet, LazyEfficiency
from marconi.core.chooser import RequestEvent, check_scoring, follow
from marconi.core.eviction import EVICTION_POLICIES, EvictionBase, EvictionPolicy, EvictionRule, Rule, score_rules
from marconi.choosers.family import RuleSwitch, cached_efficiency_variant, parse_rules
from marconi.core.registry import ConfigError, Domain

if TYPE_CHECKING:
    from marconi.core.model import ModelSpec
    from marconi.core.radix import Node

__all__ = ["RegretEviction", "LeadNoise"]

_GHOSTS_PER_NODE = 16


class LeadNoise:
    """The noise of the regret gaps between rules, for the confidence bound: ``standard_error(a, b)``
    is the root of the decayed (``decay``² per request) sum of squared per-request charge
    differences; ``step`` holds this request's charges until ``end_request`` folds them in.
    """

    def __init__(self, num_rules: int, decay: float) -> None:
        self.decay = decay
        self.step = np.zeros(num_rules)                   # this request's charges
        self.gap_sq = np.zeros((num_rules, num_rules))    # decayed sum of squared charge differences

    def end_request(self) -> None:
        self.gap_sq *= self.decay * self.decay
        step = self.step
        if step.any():
            self.gap_sq += (step[:, None] - step[None, :]) ** 2
            step[:] = 0

    def standard_error(self, a: int, b: int) -> float:
        return float(np.sqrt(self.gap_sq[a, b]))


@dataclass(slots=True)
class _Ghost:
    """A node the live cache evicted while some rules wanted it gone: where it was, who wanted it."""

    edge: np.ndarray | None      # a leaf's edge tokens (None: an inner checkpoint on its child's edge)
    depth: int
    blamed: tuple[int, ...]


class RegretEviction(EvictionBase):
    """Eviction by the rule of a family with the least counterfactual regret; its own rule chooser.
    Candidates as :class:`~marconi.choosers.family.FamilyPolicy`'s. ConfigError: a bad parameter, or
    a rule outside the FLOP-aware family or one cutting tails.

    Args: ``rules``, ``decay``, ``hysteresis``, ``objective`` as
    :class:`~marconi.choosers.worlds.WorldsChooser`'s (charges for scores; the first rule starts live);
    ``reach_weight`` (finite, >= 0): the weight of a charge for tokens whose KVs, not a checkpoint, a
    request reached (a branch point found there); ``confidence`` > 0: leave the first rule only on a
    lead of that many standard errors (opt-in)."""

    name = "regret"
    evicts_inner_nodes = True

    def __init__(self, rules: str | Sequence[EvictionRule] = "default", *, decay: float = 0.999,
                 hysteresis: float = 0.05, objective: str = "hit-rate", reach_weight: float = 1.0,
                 confidence: float = 0.0) -> None:
        self.check_scoring(decay, hysteresis)
        if not (math.isfinite(reach_weight) and reach_weight >= 0):
            raise ConfigError(f"adaptive reach_weight must be a finite number >= 0, got {reach_weight}")
        if not confidence >= 0:
            raise ConfigError(f"adaptive confidence must be >= 0 (standard errors; 0: off), got {confidence}")
        if objective not in ("hit-rate", "flops"):
            raise ConfigError(f"adaptive objective must be 'hit-rate' or 'flops', got {objective!r}")
        self.rules = parse_rules(rules)
        other = [r.label() for r in self.rules if not isinstance(r, EvictionRule)]
        if other:
            raise ConfigError(f"the regret chooser scores the FLOP-aware family only (rules {', '.join(other)} are "
                              "not of it): its counterfactuals share score_rules; use the worlds chooser")
        cutting = [r.label() for r in self.rules if r.tails]
        if cutting:
            raise ConfigError(f"the regret chooser cannot judge dead-tail cuts (rules {', '.join(cutting)}): its "
                              "counterfactuals score victims, not cuts; use the worlds chooser (chooser=worlds)")
        self.efficiency_variant = cached_efficiency_variant(self.rules)
        self.decay = decay
        self.reach_weight = reach_weight
        self.hysteresis = hysteresis
        self.objective = objective
        self.current = 0
        self.regret = np.zeros(len(self.rules))
        self.confidence = confidence
        self.noise = LeadNoise(len(self.rules), decay)   # the regret gaps' noise (used with ``confidence``)
        self.switches: list[RuleSwitch] = []
        self.cache: PrefixCache | None = None
        self.last_request = -1           # the last request begun (a caller's switch is filed after it)
        self._wanted: dict[int, set[int]] = {}                     # node id -> rules that wanted it gone
        self._ghosts: defaultdict[int, list[_Ghost]] = defaultdict(list)  # node id -> ghosts next to it
        self._burst_key: tuple[int, int, int] | None = None
        self._burst_live = 0
        self._burst_rules = np.zeros(len(self.rules))
        self._kv_per_token = self._ckpt_bytes = 0

    # ---------------------------------------------------------------- binding
    def bind(self, cache: PrefixCache) -> None:
        if self.cache is not None:
            raise ConfigError("an adaptive eviction policy serves one cache; build one per cache")
        self.cache = cache
        self._kv_per_token = cache.spec.kv_bytes_per_token
        self._ckpt_bytes = cache.spec.ssm_checkpoint_bytes
        follow(cache, self)

    @property
    def rule(self) -> EvictionRule:
        return self.rules[self.current]

    def set_rule(self, rule: Rule) -> None:
        """Make ``rule`` live; ConfigError if it is not of the family. Once bound, a caller's switch is
        recorded in ``rule_switches`` (at the last request begun; -1 before any), as the chooser's own
        are; before, ``rule`` is the one the cache starts on (no switch recorded)."""
        if rule not in self.rules:
            raise ConfigError(f"rule {rule.label()!r} is not of the family {'/'.join(r.label() for r in self.rules)}")
        k = self.rules.index(rule)
        if k != self.current and self.cache is not None:
            self.switches.append(RuleSwitch(self.last_request, k))
        self.current = k

    @staticmethod
    def check_scoring(decay: float, hysteresis: float) -> None:
        """ConfigError unless ``decay`` is a number in (0, 1] and ``hysteresis`` one >= 0 (NaN and
        bools refused): the checks of the constructor, for a caller that builds the chooser later."""
        check_scoring(decay, hysteresis, "adaptive")

    @property
    def spec(self) -> "ModelSpec":
        assert self.cache is not None, "RegretEviction is used by a cache (which binds it)"
        return self.cache.spec

    # ---------------------------------------------------------------- eviction
    def choose(self, candidates: CandidateSet) -> int:
        n = len(candidates)
        scored = score_rules(self.rules, candidates, LazyEfficiency(
            {self.efficiency_variant: candidates.flop_eff[:n]}, spec=self.spec, cands=candidates))
        victim = scored[self.current][0]
        self._record_wants(candidates, scored)
        self._remember(candidates.nodes[victim])
        return victim

    def _freed_bytes(self, node: "Node") -> int:
        if node.children:
            return self._ckpt_bytes
        return node.edge_len * self._kv_per_token + node.num_checkpoints * self._ckpt_bytes

    def _record_wants(self, candidates: CandidateSet, scored: list[tuple[int, np.ndarray, np.ndarray]]) -> None:
        """Mark what each rule would evict to free as many bytes as the live cache has so far in
        this eviction burst: its victim and next choices, nothing once it has freed as much."""
        assert self.cache is not None
        st = self.cache.stats
        key = (st.num_requests, st.kv_tokens_inserted, st.checkpoints_admitted)
        if key != self._burst_key:
            self._burst_key, self._burst_live = key, 0
            self._burst_rules[:] = 0
        nodes = candidates.nodes
        self._burst_live += self._freed_bytes(nodes[scored[self.current][0]])
        for k, (victim, scores, order) in enumerate(scored):
            if self._burst_rules[k] >= self._burst_live:
                continue
            self._want(k, nodes[victim])
            if self._burst_rules[k] >= self._burst_live:
                continue
            ranked = np.lexsort((order, scores))  # the rule's next choices, best first
            for i in ranked[1:]:
                if not np.isfinite(scores[i]) or self._burst_rules[k] >= self._burst_live:
                    break
                self._want(k, nodes[int(i)])

    def _want(self, k: int, node: "Node") -> None:
        self._wanted.setdefault(node.node_id, set()).add(k)
        self._burst_rules[k] += self._freed_bytes(node)

    def _remember(self, victim: "Node") -> None:
        """The live cache evicts ``victim``: the rules that wanted it gone keep answering for it."""
        blamed = self._wanted.pop(victim.node_id, None)
        self._ghosts.pop(victim.node_id, None)
        if not blamed:
            return
        if victim.children:  # an inner checkpoint: it lived at ``depth`` on its child's edge
            (child,) = victim.children.values()
            host, ghost = child, _Ghost(None, victim.depth, tuple(sorted(blamed)))
        else:
            assert victim.parent is not None
            host, ghost = victim.parent, _Ghost(victim.tokens.copy(), victim.depth, tuple(sorted(blamed)))
        ghosts = self._ghosts[host.node_id]
        ghosts.append(ghost)
        del ghosts[:-_GHOSTS_PER_NODE]

    # ---------------------------------------------------------------- charging
    def _lost(self, depth: int, fallback: int) -> float:
        if depth <= fallback:
            return 0.0
        if self.objective == "hit-rate":
            return float(depth - fallback)
        return self.spec.prefill_flops(depth) - self.spec.prefill_flops(fallback)

    def _charge(self, blamed: Any, amount: float) -> None:
        if amount > 0:
            for k in blamed:
                self.regret[k] += amount
                self.noise.step[k] += amount

    @staticmethod
    def _checkpoint_above(node: "Node") -> int:
        parent = node.parent
        while parent is not None and parent.parent is not None and not parent.has_ssm:
            parent = parent.parent
        return 0 if parent is None or parent.parent is None else parent.depth

    def observe(self, event: RequestEvent) -> EvictionRule | None:
        """The :class:`~marconi.core.chooser.RuleChooser` feed: on a request's ``begin``, charge the
        rules for what it needed, then re-choose the live rule (returned if it changed)."""
        if event.step != "begin":
            return None
        handle = event.handle
        assert handle is not None
        self.last_request = handle.request_id
        self.regret *= self.decay
        usable = handle.match.usable_hit_len
        hit = handle.hit_node
        if hit is not None:  # it resumed from ``hit``: rules that wanted ``hit`` gone lose down to the next checkpoint
            blamed = self._wanted.pop(hit.node_id, None)
            if blamed:
                self._charge(blamed, self._lost(hit.depth, self._checkpoint_above(hit)))
        reached = handle.lock_node
        if reached is not None and handle.match.kv_hit_len > usable:  # its KVs reach into ``reached``
            blamed = self._wanted.pop(reached.node_id, None)
            if blamed:
                self._charge(blamed, self.reach_weight * self._lost(handle.match.kv_hit_len, usable))
        self._charge_ghosts(handle, usable)
        if self.confidence:
            self.noise.end_request()
        return self._switch(handle.request_id)

    def _charge_ghosts(self, handle: RequestHandle, usable: int) -> None:
        assert self.cache is not None
        tokens, kv_hit = handle.tokens, handle.match.kv_hit_len
        matched = handle.matched_node if handle.matched_node is not None else self.cache.tree.root
        hosts = [matched] if handle.lock_node is None or handle.lock_node is matched else [matched, handle.lock_node]
        for node in hosts:
            ghosts = self._ghosts.get(node.node_id)
            if not ghosts:
                continue
            next_token = int(tokens[node.depth]) if node.depth < len(tokens) and node.depth <= kv_hit else None
            kept = []
            for ghost in ghosts:
                weight = 1.0
                if ghost.edge is None:   # an inner checkpoint on this node's edge: passed if the KVs reach it
                    reach = ghost.depth if kv_hit >= ghost.depth else 0
                elif next_token is not None and ghost.edge[0] == next_token:  # a leaf below this node
                    reach = self._ghost_reach(ghost, node.depth, tokens)
                    if reach < ghost.depth:
                        weight = self.reach_weight  # its KVs, not its checkpoint: a branch point found there
                else:
                    reach = 0
                if reach > usable:
                    self._charge(ghost.blamed, weight * self._lost(reach, usable))
                else:
                    kept.append(ghost)
            self._ghosts[node.node_id] = kept

    @staticmethod
    def _ghost_reach(ghost: _Ghost, start: int, tokens: np.ndarray) -> int:
        """How deep the request would have matched into a ghost leaf hanging at ``start``."""
        assert ghost.edge is not None
        segment = tokens[start:start + len(ghost.edge)]
        differ = np.flatnonzero(segment != ghost.edge[: len(segment)])
        return start + (int(differ[0]) if differ.size else len(segment))

    def _switch(self, request_id: int) -> EvictionRule | None:
        best = float(self.regret.min())
        if self.regret[self.current] > best * (1.0 + self.hysteresis) + 1e-9:
            k = int(np.flatnonzero(self.regret == best)[0])
            if self.current == 0 and self.confidence and not self.lead_is_significant(k):
                return None
            self.current = k
            self.switches.append(RuleSwitch(request_id, self.current))
            return self.rules[k]
        return None

    def tuning_record(self) -> dict[str, Any]:
        """Record fields: every switch of the live rule (``rule_switches``: request, new rule)."""
        return {"rule_switches": [[s.at_request, self.rules[s.rule].label()] for s in self.switches]}

    def lead_is_significant(self, k: int) -> bool:
        """Whether rule ``k``'s regret lead over the first rule exceeds ``confidence`` standard errors
        (:class:`LeadNoise`), so a few large charges alone do not move the cache off it."""
        lead = self.regret[0] - self.regret[k]
        return bool(lead > self.confidence * self.noise.standard_error(0, k))

    def describe(self) -> dict[str, object]:
        return {"eviction": self.name, "rules": "/".join(r.label() for r in self.rules), "rule": self.rule.label()}


@EVICTION_POLICIES.register("regret", "FLOP-aware eviction whose rule (alpha, efficiency, SGLang's or Marconi's "
                                      "candidates and recency) is re-chosen online by counterfactual regret",
                            domains={"decay": Domain(0, 1, lo_open=True), "hysteresis": Domain(0, 1000),
                                     "confidence": Domain(0, 1000)})
def _regret(rules: str = "default", decay: float = 0.999, hysteresis: float = 0.05,
            objective: str = "hit-rate", confidence: float = 0.0) -> EvictionPolicy:
    return RegretEviction(rules, decay=decay, hysteresis=hysteresis, objective=objective, confidence=confidence)
