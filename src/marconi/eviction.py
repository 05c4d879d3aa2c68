"""Eviction policies: they score candidates, the cache owns the eviction loop.

The cache keeps every evictable node in a :class:`CandidateSet` — parallel numpy arrays of
last-access time, access order and FLOP efficiency — so a policy picks its victim with a few
vectorised operations instead of walking the tree. Which nodes are candidates, and which recency
signal it scores with, are the policy's two other decisions (the cache keeps both signals: a hit
refreshes the node it resumed from, a matched path every node on it up to there):

* ``lru`` (SGLang+, vLLM+): leaves only; path recency (a hit refreshes every node on the path).
* ``flop-aware`` (Marconi): every unlocked node with at most one child; hit recency (a hit
  refreshes only the matched node). Utility = normalised recency + α · normalised FLOP efficiency,
  both min-max normalised over the current candidates; the lowest utility is evicted, one node at
  a time. Its :class:`EvictionRule` can also take SGLang's candidates and touch, which with α = 0
  is exactly ``lru``: the family that the adaptive policy (:mod:`marconi.adaptive`) chooses from.

FLOP efficiency of a node (paper §4.2, App. A) = FLOPs a hit at the node saves ÷ bytes its entry
holds (its SSM checkpoint + the KVs of its whole prefix). The ``marginal`` variant counts only the
FLOPs of the node's own edge, as the Marconi authors' simulator does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, Sequence

import numpy as np

from marconi.registry import ConfigError, Registry

if TYPE_CHECKING:
    from marconi.model import ModelSpec
    from marconi.radix import Node

__all__ = ["CandidateSet", "EvictionPolicy", "EvictionRule", "LRU", "FlopAware", "EVICTION_POLICIES", "make_eviction",
           "flop_efficiency", "flop_efficiency_array", "score_many"]


class CandidateSet:
    """Evictable nodes as parallel arrays; O(1) add/remove (swap-remove), vectorised scoring.

    Columns: both recency signals (``last_access``/``access_seq`` for hits, ``path_access``/
    ``path_seq`` for matched paths, see :class:`~marconi.radix.Node`), the cached FLOP efficiency
    of the cache's policy, and the structural facts a policy may score with instead (``depth``,
    ``edge_len``, ``has_ssm``, ``leaf``).
    """

    COLUMNS: tuple[tuple[str, Any], ...] = (
        ("last_access", np.float64), ("access_seq", np.int64), ("path_access", np.float64),
        ("path_seq", np.int64), ("flop_eff", np.float64), ("depth", np.int64), ("edge_len", np.int64),
        ("has_ssm", np.bool_), ("leaf", np.bool_))

    def __init__(self, capacity: int = 64) -> None:
        self.nodes: list[Node] = []
        for name, dtype in self.COLUMNS:
            setattr(self, name, np.zeros(capacity, dtype=dtype))

    def __len__(self) -> int:
        return len(self.nodes)

    def _grow(self) -> None:
        size = 2 * len(self.last_access)
        for name, _ in self.COLUMNS:
            old = getattr(self, name)
            new = np.zeros(size, dtype=old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)

    def _write(self, i: int, node: "Node") -> None:
        self.last_access[i] = node.last_access
        self.access_seq[i] = node.access_seq
        self.path_access[i] = node.path_access
        self.path_seq[i] = node.path_seq
        self.flop_eff[i] = node.flop_eff
        self.depth[i] = node.depth
        self.edge_len[i] = len(node.tokens)
        self.has_ssm[i] = node.has_ssm
        self.leaf[i] = not node.children

    def add(self, node: "Node") -> None:
        i = len(self.nodes)
        if i == len(self.last_access):
            self._grow()
        self.nodes.append(node)
        node.slot = i
        self._write(i, node)

    def remove(self, node: "Node") -> None:
        i = node.slot
        assert i is not None and self.nodes[i] is node
        last = len(self.nodes) - 1
        moved = self.nodes[last]
        if i != last:
            self.nodes[i] = moved
            moved.slot = i
            for name, _ in self.COLUMNS:
                column = getattr(self, name)
                column[i] = column[last]
        self.nodes.pop()
        node.slot = None

    def refresh(self, node: "Node") -> None:
        """Copy a candidate's recency, efficiency and shape into the arrays after they changed."""
        i = node.slot
        if i is not None:
            self._write(i, node)

    def stale_columns(self, node: "Node") -> list[str]:
        """Columns whose stored value differs from the node's (for ``check_invariants``)."""
        i = node.slot
        assert i is not None
        fresh = CandidateSet(1)
        fresh._write(0, node)
        return [name for name, _ in self.COLUMNS if getattr(fresh, name)[0] != getattr(self, name)[i]]


def flop_efficiency(spec: "ModelSpec", depth: int, edge_len: int, has_ssm: bool, variant: str) -> float:
    """FLOPs saved per byte held by a node ending at ``depth`` whose edge is ``edge_len`` tokens.

    Bytes = its SSM checkpoint (if any) + the KVs of its whole prefix. ``variant="total"`` counts the
    FLOPs of the whole prefix (the paper's definition); ``"marginal"`` only those of the node's edge:
    ``S·ssm(Lc) + A·(attn(Lt) − attn(Lp)) + M·(mlp(Lt) − mlp(Lp))``. Both are >= 0.
    """
    held = spec.kv_bytes(depth) + (spec.ssm_checkpoint_bytes if has_ssm else 0)
    if held == 0:
        return 0.0
    if variant == "total":
        saved = spec.prefill_flops(depth)
    else:
        saved = spec.span_flops(depth - edge_len, depth)
    return saved / held


def flop_efficiency_array(spec: "ModelSpec", depth: np.ndarray, edge_len: np.ndarray, has_ssm: np.ndarray,
                          variant: str) -> np.ndarray:
    """:func:`flop_efficiency` of many nodes at once, bit for bit (same operations, same order)."""
    d, n = float(spec.d_model), float(spec.ssm_state_dim)
    depth_f = depth.astype(np.float64)
    held = (depth * spec.kv_bytes_per_token + np.where(has_ssm, spec.ssm_checkpoint_bytes, 0)).astype(np.float64)

    def attn(length: np.ndarray) -> np.ndarray:
        return 8.0 * length * d * d + 4.0 * length * length * d

    def linear(length: np.ndarray) -> np.ndarray:  # ssm and mlp layers together, as prefill_flops sums them
        return (spec.num_ssm_layers * (12.0 * length * d * d + 16.0 * length * d * n + 10.0 * length * d),
                spec.num_mlp_layers * (16.0 * length * d * d))

    if variant == "total":
        ssm, mlp = linear(depth_f)
        saved = spec.num_attn_layers * attn(depth_f) + ssm + mlp
    else:
        span = edge_len.astype(np.float64)
        ssm, mlp = linear(span)
        saved = spec.num_attn_layers * (attn(depth_f) - attn((depth - edge_len).astype(np.float64))) + ssm + mlp
    out = np.zeros_like(held)
    np.divide(saved, held, out=out, where=held > 0)
    return out


EFFICIENCIES = ("total", "marginal")
RECENCIES = ("linear", "inverse-age")
CANDIDATE_KINDS = ("single-child", "leaves")
TOUCHES = ("hit", "path")


@dataclass(frozen=True, slots=True)
class EvictionRule:
    """One scoring rule of the FLOP-aware family: the knobs that decide a victim.

    ``alpha`` weighs normalised FLOP efficiency (``efficiency``: whole-prefix ``total`` or the
    node's own edge ``marginal``) against normalised recency (``recency``: ``linear`` in the last
    access time, or ``inverse-age`` in accesses, the authors' simulator's transform). ``candidates``:
    nodes with <= 1 child (Marconi) or leaves only (SGLang); ``touch``: which recency signal —
    ``hit`` (only the node a request resumed from, Marconi) or ``path`` (every matched node up to
    it, SGLang). ``EvictionRule(candidates="leaves", touch="path")`` makes exactly SGLang+'s LRU
    decisions.
    """

    alpha: float = 0.0
    efficiency: str = "total"
    recency: str = "linear"
    candidates: str = "single-child"
    touch: str = "hit"

    def __post_init__(self) -> None:
        if not self.alpha >= 0:
            raise ConfigError(f"flop-aware: alpha must be >= 0, got {self.alpha}")
        for value, allowed, what in ((self.efficiency, EFFICIENCIES, "efficiency"), (self.recency, RECENCIES, "recency"),
                                     (self.candidates, CANDIDATE_KINDS, "candidates"), (self.touch, TOUCHES, "touch")):
            if value not in allowed:
                raise ConfigError(f"flop-aware: {what} must be one of {', '.join(allowed)}; got {value!r}")

    @property
    def is_lru(self) -> bool:
        """SGLang+'s semantics: recency only (any transform ranks the same), leaves, path touch."""
        return self.alpha == 0 and self.candidates == "leaves" and self.touch == "path"

    def label(self) -> str:
        """A compact name: ``lru``, or ``a`` + α + flags ``m`` (marginal efficiency), ``i``
        (inverse-age recency), ``l`` (leaf candidates), ``p`` (path touch): ``a1m``, ``a2lp``."""
        if self.is_lru and self.recency == "linear":
            return "lru"
        flags = "".join(flag for flag, on in (("m", self.efficiency == "marginal" and self.alpha > 0),
                                               ("i", self.recency == "inverse-age"), ("l", self.candidates == "leaves"),
                                               ("p", self.touch == "path")) if on)
        return f"a{self.alpha:g}{flags}"

    @classmethod
    def from_label(cls, label: str) -> "EvictionRule":
        """The inverse of :meth:`label` (``lru``, ``a0``, ``a0.5m``, ``a1mi``, ``a2lp`` ...)."""
        text = label.strip()
        if text == "lru":
            return cls(candidates="leaves", touch="path")
        if not text.startswith("a"):
            raise ConfigError(f"rule {label!r}: write lru or a<alpha>[m][i][l][p], e.g. a1m, a2lp")
        body = text[1:]
        end = len(body.rstrip("milp"))
        flags, number = body[end:], body[:end]
        try:
            alpha = float(number)
        except ValueError:
            raise ConfigError(f"rule {label!r}: {number!r} is not a number (write a<alpha>[m][i][l][p])") from None
        if len(set(flags)) != len(flags):
            raise ConfigError(f"rule {label!r}: a flag is repeated")
        return cls(alpha, "marginal" if "m" in flags else "total", "inverse-age" if "i" in flags else "linear",
                   "leaves" if "l" in flags else "single-child", "path" if "p" in flags else "hit")

    def describe(self) -> dict[str, object]:
        return {"alpha": self.alpha, "efficiency": self.efficiency, "recency": self.recency,
                "candidates": self.candidates, "touch": self.touch}

    def choose(self, cands: "CandidateSet", efficiency: np.ndarray) -> int:
        """Index of the victim among ``cands`` (non-empty); ``efficiency`` per candidate for this
        rule's variant. Normalisation runs over the rule's own candidates only, so the rule decides
        the same inside a cache whose candidate set is larger (an adaptive policy's)."""
        n = len(cands)
        subset: np.ndarray | None = None
        if self.candidates == "leaves":
            leaf = cands.leaf[:n]
            if not leaf.all():
                subset = np.flatnonzero(leaf)
                if subset.size == 0:
                    subset = None  # no leaf is evictable (all locked): fall back to any candidate
        if self.touch == "hit":
            last, seq = cands.last_access[:n], cands.access_seq[:n]
        else:
            last, seq = cands.path_access[:n], cands.path_seq[:n]
        if subset is not None:
            last, seq, efficiency = last[subset], seq[subset], efficiency[subset]
        if self.recency == "linear":
            scores = _min_max(last)
        else:
            scores = _min_max(1.0 / (seq.max() - seq + 1.0))
        if self.alpha:
            scores = scores + self.alpha * _min_max(efficiency)
        best = _argmin_ties_by_order(scores, seq)
        return best if subset is None else int(subset[best])


def score_many(rules: "Sequence[EvictionRule]", cands: "CandidateSet",
               efficiency: dict[str, np.ndarray]) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Per rule: (its victim, its scores, its tie-break order) over all candidates, sharing the work.

    The victim is exactly :meth:`EvictionRule.choose`'s (the same arithmetic on the same arrays);
    scores are ``inf`` where the rule does not look (non-leaves for a leaf-only rule). Rules with
    the same candidates, recency signal and transform share their normalised recency; with the
    same candidates and efficiency, their normalised efficiency.
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
            recency[key] = _min_max(last) if rule.recency == "linear" else _min_max(1.0 / (seq.max() - seq + 1.0))
        scores = recency[key]
        if rule.alpha:
            ekey = (rule.candidates, rule.efficiency)
            if ekey not in normalised_eff:
                eff = efficiency[rule.efficiency]
                normalised_eff[ekey] = _min_max(eff if subset is None else eff[subset])
            scores = scores + rule.alpha * normalised_eff[ekey]
        best = _argmin_ties_by_order(scores, seq)
        if subset is None:
            out.append((best, scores, seq))
        else:
            full = np.full(n, np.inf)
            full[subset] = scores
            full_seq = np.zeros(n, dtype=seq.dtype)
            full_seq[subset] = seq
            out.append((int(subset[best]), full, full_seq))
    return out


class EvictionPolicy(Protocol):
    """What an eviction policy decides; the cache does the bookkeeping and the surgery.

    The cache keeps both recency signals on every node (hit and path, see
    :class:`~marconi.radix.Node`); a policy scores with the one it wants. A policy may define
    ``bind(cache)``: the cache calls it once, at construction (policies that need the model's cost
    model or watch requests).
    """

    name: str
    evicts_inner_nodes: bool   # candidates: nodes with <= 1 child (True) or leaves only (False)
    efficiency_variant: str    # which FLOP efficiency the cache keeps on nodes ("total"/"marginal")

    def choose(self, candidates: CandidateSet) -> int:
        """Index (into ``candidates``) of the next node to evict; ``candidates`` is non-empty."""
        ...

    def describe(self) -> dict[str, object]:
        ...


def _min_max(values: np.ndarray) -> np.ndarray:
    lo, hi = values.min(), values.max()
    if hi <= lo:
        return np.zeros_like(values)
    return (values - lo) / (hi - lo)


def _argmin_ties_by_order(scores: np.ndarray, order: np.ndarray) -> int:
    """argmin of ``scores``; exact ties go to the least recently accessed (smallest order)."""
    best = scores.min()
    ties = np.flatnonzero(scores == best)
    if ties.size == 1:
        return int(ties[0])
    return int(ties[np.argmin(order[ties])])


class LRU:
    """SGLang-style LRU: evict the least recently used leaf; hits refresh the whole matched path."""

    name = "lru"
    evicts_inner_nodes = False
    efficiency_variant = "total"

    def choose(self, candidates: CandidateSet) -> int:
        return int(np.argmin(candidates.path_seq[: len(candidates)]))

    def describe(self) -> dict[str, object]:
        return {"eviction": self.name}


class FlopAware:
    """Marconi's FLOP-aware eviction (paper §4.2), one :class:`EvictionRule` of the family.

    ``alpha`` is mutable: the bootstrap tuner sets it once it has searched the grid. The defaults
    are the paper's: nodes with <= 1 child, hits refresh only the hit node, linear recency.
    """

    name = "flop-aware"

    def __init__(self, alpha: float = 0.0, efficiency: str = "total", recency: str = "linear",
                 candidates: str = "single-child", touch: str = "hit") -> None:
        rule = EvictionRule(float(alpha), efficiency, recency, candidates, touch)  # validates
        self.alpha = rule.alpha
        self.efficiency_variant = efficiency
        self.recency = recency
        self.candidates = candidates
        self.touch = touch
        self.evicts_inner_nodes = candidates == "single-child"

    @property
    def rule(self) -> EvictionRule:
        return EvictionRule(self.alpha, self.efficiency_variant, self.recency, self.candidates, self.touch)

    def choose(self, candidates: CandidateSet) -> int:
        return self.rule.choose(candidates, candidates.flop_eff[: len(candidates)])

    def describe(self) -> dict[str, object]:
        out: dict[str, object] = {"eviction": self.name, "alpha": self.alpha, "efficiency": self.efficiency_variant,
                                  "recency": self.recency}
        if self.candidates != "single-child" or self.touch != "hit":
            out.update(candidates=self.candidates, touch=self.touch)
        return out


EVICTION_POLICIES: Registry[EvictionPolicy] = Registry("eviction policy")


@EVICTION_POLICIES.register("lru", "least recently used leaf (SGLang); hits refresh the whole path")
def _lru() -> EvictionPolicy:
    return LRU()


@EVICTION_POLICIES.register("flop-aware", "Marconi: recency + alpha * FLOP efficiency over nodes with <= 1 child")
def _flop_aware(alpha: float = 0.0, efficiency: str = "total", recency: str = "linear",
                candidates: str = "single-child", touch: str = "hit") -> EvictionPolicy:
    return FlopAware(alpha=alpha, efficiency=efficiency, recency=recency, candidates=candidates, touch=touch)


@EVICTION_POLICIES.register("flop-aware-marginal", "flop-aware with the FLOPs of the node's own edge only")
def _flop_aware_marginal(alpha: float = 0.0, recency: str = "linear") -> EvictionPolicy:
    return FlopAware(alpha=alpha, efficiency="marginal", recency=recency)


@EVICTION_POLICIES.register("adaptive", "FLOP-aware eviction whose rule (alpha, efficiency, SGLang's or Marconi's "
                                        "candidates and recency) is re-chosen online by counterfactual regret")
def _adaptive(rules: str = "default", decay: float = 0.999, hysteresis: float = 0.05,
              objective: str = "hit-rate", confidence: float = 0.0) -> EvictionPolicy:
    from marconi.adaptive import AdaptiveEviction  # imports the cache, which imports this module

    return AdaptiveEviction(rules, decay=decay, hysteresis=hysteresis, objective=objective, confidence=confidence)


@EVICTION_POLICIES.register("worlds", "the rule of a family whose own exact world (a size-only cache running it) "
                                      "is ahead: one replay per rule")
def _worlds(rules: str = "default", decay: float = 0.999, hysteresis: float = 0.0,
            objective: str = "hit-rate") -> EvictionPolicy:
    from marconi.worlds import WorldsEviction  # imports the cache, which imports this module

    return WorldsEviction(rules, decay=decay, hysteresis=hysteresis, objective=objective)


@EVICTION_POLICIES.register("oracle", "future-aware (Belady-style) reference; needs the whole trace (simulator only)")
def _oracle() -> EvictionPolicy:
    raise ConfigError("the oracle eviction knows the future, so it needs the whole trace: use the 'oracle' "
                      "system through the simulator (marconi simulate / marconi.sim.simulate), which hands it over")


def make_eviction(spec: "str | EvictionPolicy") -> EvictionPolicy:
    return EVICTION_POLICIES.create(spec) if isinstance(spec, str) else spec
