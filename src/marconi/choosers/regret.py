"""The regret chooser (``marconi:chooser=regret``): FLOP-aware eviction whose rule is re-chosen
online, for the whole trace, from the live cache alone. The default chooser is exact worlds
(:mod:`marconi.choosers.worlds`).

The paper's bootstrap tuner (:mod:`marconi.choosers.bootstrap`) picks α once, from one window replayed from one
snapshot, and keeps it: it wins its window and can lose the trace. Here the choice is never frozen.

**A family that contains SGLang+.** The live cache keeps both recency signals on every node (a hit
refreshes the node it resumed from; a matched path, every node on it) and indexes every node with
at most one child, so it can apply any :class:`~marconi.core.eviction.EvictionRule` at any eviction and
switch instantly. The default family has one rule per regime, spread so that they disagree:

* ``lru`` — SGLang+'s own rule (leaves, path recency, α = 0); the rule used until the evidence
  says otherwise, so "no worse than LRU" is the starting point, not a hope;
* ``a0.5m`` — Marconi's candidates and hit recency, recency + 0.5 · FLOP efficiency;
* ``a2m`` — the same with FLOP efficiency dominating (α = 2).

Both FLOP-aware members use the *marginal* efficiency (FLOPs of the node's own edge per byte it
holds): across our real traces it beat the whole-prefix definition at every α we tried.

**Counterfactual eviction regret.** At every eviction each rule names the victim it would have
chosen in the live state (a few vectorised scorings). Each rule is charged when a node it wanted
gone is needed later: a request resumes from it (the tokens it saved over the next checkpoint up),
a request's KVs reach into it (it found a branch point there), or — for nodes the live cache did
evict — a request would have resumed from it or matched into it (kept as "ghosts" next to where
they were). A rule whose victims free more bytes than the live cache's in an eviction burst stops
naming victims for that burst (it would have needed fewer evictions). Charges decay by ``decay``
per request; the live rule is the least charged one, and it changes only when another rule's
charge is lower by more than ``hysteresis`` (relative). This is the regret-minimisation idea of
LeCaR/CACHEUS, made deterministic and tree-aware.

Why it is no longer the default: its estimate is made from the live cache's state alone, and it is
measurably biased against whichever rule is live, so it mixes rules where holding one pays
(``docs/adaptive.md``, second round). Exact worlds of every rule (the default ``marconi``,
:mod:`marconi.choosers.worlds`) stay closer to the best rule across our real traces (within 0.5 pp of it at
41 of 45 points, regret at 32), at one replay per rule (about 3.1× a fixed-α replay against
regret's 1.7×). Shadow caches on a sample of sessions (SHARDS)
or windows replayed from snapshots fit a 2× budget but are too noisy or too short-sighted at these
trace sizes and chose worse than regret. Regret costs a few scorings per eviction and sees every
request: it remains the choice where one shadow replay is all that can be afforded (the vLLM
plugin's adaptive α).

Everything is deterministic: the same trace gives the same choices, whatever the number of workers.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from marconi.core.cache import PrefixCache, RequestHandle
from marconi.core.candidates import CandidateSet, LazyEfficiency
from marconi.core.chooser import RequestEvent, follow
from marconi.core.eviction import EVICTION_POLICIES, EvictionBase, EvictionPolicy, EvictionRule, Rule, score_rules
from marconi.choosers.family import RuleSwitch, cached_efficiency_variant, parse_rules
from marconi.core.registry import ConfigError, Domain

if TYPE_CHECKING:
    from marconi.core.model import ModelSpec
    from marconi.core.radix import Node

__all__ = ["RegretEviction", "LeadNoise"]

_GHOSTS_PER_NODE = 16


class LeadNoise:
    """The noise of the regret gaps between rules: what the confidence bound measures a lead against.

    ``step`` holds the current request's charges per rule; ``end_request`` folds their pairwise
    differences, squared, into ``gap_sq`` (decayed by ``decay``² per request, the square of the
    regret's own weights), so ``standard_error(a, b)`` is the root of the decayed sum of squared
    per-request charge differences between rules ``a`` and ``b``.
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
    """Eviction by whichever rule of a family currently has the least counterfactual regret.

    Candidates are every unlocked node with at most one child; a leaf-only rule scores only the
    leaves among them (normalising over those alone), so each rule decides here exactly as a cache
    built for that rule alone would in the same state. It is its own rule chooser (``chooser``): it
    sees each eviction's candidates through ``choose`` (where every rule names its victim), and is
    fed the cache's requests (:func:`~marconi.core.chooser.follow`, once bound), which charge the
    rules and switch ``current``.

    Args:
        rules: the family (``"default"``, labels ``"lru/a0.5m/a2m"``, or rules); the first is used
            until the evidence says otherwise.
        decay: weight kept by the accumulated charges per request (horizon ~ 1 / (1 - decay)).
        hysteresis: switch only to a rule charged less than the live one by more than this fraction.
        objective: charge lost ``"hit-rate"`` (tokens) or ``"flops"`` (prefill FLOPs).
        confidence: 0 (default): off. Else a burden of proof for leaving the first rule (SGLang+'s
            LRU in the default family): leave it only when another rule's regret lead exceeds this
            many standard errors of the per-request charge differences. Opt-in: across our 40
            real-trace points (z = 2) it trades "near the best rule" for "never below LRU"
            (``docs/adaptive.md``, second round); the regret estimator is biased against the live
            rule, which this bound does not remove.
    """

    name = "regret"
    evicts_inner_nodes = True

    def __init__(self, rules: str | Sequence[EvictionRule] = "default", *, decay: float = 0.999,
                 hysteresis: float = 0.05, objective: str = "hit-rate", reach_weight: float = 1.0,
                 confidence: float = 0.0) -> None:
        if not 0 < decay <= 1:
            raise ConfigError(f"adaptive decay must be in (0, 1], got {decay}")
        if hysteresis < 0:
            raise ConfigError(f"adaptive hysteresis must be >= 0, got {hysteresis}")
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
        """Make ``rule`` live; ConfigError if it is not of the family."""
        if rule not in self.rules:
            raise ConfigError(f"rule {rule.label()!r} is not of the family {'/'.join(r.label() for r in self.rules)}")
        self.current = self.rules.index(rule)

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
        """Each rule wanted gone what it would have evicted to free as many bytes as the live cache
        has by the end of this eviction: its victim, and its next choices while they free less (a
        rule that drops small checkpoints needs more evictions than one that drops long leaves) —
        nothing once, in this eviction burst, its choices already freed more than the live's."""
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
        """Whether rule ``k``'s lead over the first rule exceeds ``confidence`` standard errors.

        The lead is a decayed sum of per-request charge differences; its noise, the root of the
        decayed sum of their squares (the same weights squared, :class:`LeadNoise`). A few large
        charges — one long context that one rule lost — then do not move the cache off the first
        rule by themselves."""
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
