"""Eviction policies: they score candidates, the cache owns the eviction loop.

The cache keeps every evictable node in a :class:`CandidateSet` — parallel numpy arrays of
last-access time, access order and FLOP efficiency — so a policy picks its victim with a few
vectorised operations instead of walking the tree. Which nodes are candidates, and which nodes a
cache hit refreshes, are the policy's two other decisions:

* ``lru`` (SGLang+, vLLM+): leaves only; a hit refreshes every node on the matched path.
* ``flop-aware`` (Marconi): every unlocked node with at most one child; a hit refreshes only the
  matched node. Utility = normalised recency + α · normalised FLOP efficiency, both min-max
  normalised over the current candidates; the lowest utility is evicted, one node at a time.

FLOP efficiency of a node (paper §4.2, App. A) = FLOPs a hit at the node saves ÷ bytes its entry
holds (its SSM checkpoint + the KVs of its whole prefix). The ``marginal`` variant counts only the
FLOPs of the node's own edge, as the Marconi authors' simulator does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Protocol, Sequence

import numpy as np

from marconi.registry import ConfigError, Registry

if TYPE_CHECKING:
    from marconi.model import ModelSpec
    from marconi.radix import Node

__all__ = ["CandidateSet", "EvictionPolicy", "LRU", "FlopAware", "EVICTION_POLICIES", "make_eviction",
           "flop_efficiency"]


class CandidateSet:
    """Evictable nodes as parallel arrays; O(1) add/remove (swap-remove), vectorised scoring."""

    def __init__(self, capacity: int = 64) -> None:
        self.nodes: list[Node] = []
        self.last_access = np.zeros(capacity, dtype=np.float64)
        self.access_seq = np.zeros(capacity, dtype=np.int64)
        self.flop_eff = np.zeros(capacity, dtype=np.float64)

    def __len__(self) -> int:
        return len(self.nodes)

    def _grow(self) -> None:
        size = 2 * len(self.last_access)
        for name in ("last_access", "access_seq", "flop_eff"):
            old = getattr(self, name)
            new = np.zeros(size, dtype=old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)

    def add(self, node: "Node") -> None:
        i = len(self.nodes)
        if i == len(self.last_access):
            self._grow()
        self.nodes.append(node)
        node.slot = i
        self.last_access[i] = node.last_access
        self.access_seq[i] = node.access_seq
        self.flop_eff[i] = node.flop_eff

    def remove(self, node: "Node") -> None:
        i = node.slot
        assert i is not None and self.nodes[i] is node
        last = len(self.nodes) - 1
        moved = self.nodes[last]
        if i != last:
            self.nodes[i] = moved
            moved.slot = i
            self.last_access[i] = self.last_access[last]
            self.access_seq[i] = self.access_seq[last]
            self.flop_eff[i] = self.flop_eff[last]
        self.nodes.pop()
        node.slot = None

    def refresh(self, node: "Node") -> None:
        """Copy a candidate's recency and efficiency into the arrays after they changed."""
        i = node.slot
        if i is not None:
            self.last_access[i] = node.last_access
            self.access_seq[i] = node.access_seq
            self.flop_eff[i] = node.flop_eff


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


class EvictionPolicy(Protocol):
    """What an eviction policy decides; the cache does the bookkeeping and the surgery."""

    name: str
    evicts_inner_nodes: bool   # candidates: nodes with <= 1 child (True) or leaves only (False)
    efficiency_variant: str    # which FLOP efficiency the cache keeps on nodes ("total"/"marginal")

    def touched_on_hit(self, path: Sequence["Node"], hit: "Node | None") -> Iterable["Node"]:
        """Nodes whose recency a cache hit refreshes (``path`` = root's child .. hit node)."""
        ...

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

    def touched_on_hit(self, path: Sequence["Node"], hit: "Node | None") -> Iterable["Node"]:
        return path

    def choose(self, candidates: CandidateSet) -> int:
        return int(np.argmin(candidates.access_seq[: len(candidates)]))

    def describe(self) -> dict[str, object]:
        return {"eviction": self.name}


class FlopAware:
    """Marconi's FLOP-aware eviction over nodes with <= 1 child (paper §4.2).

    ``alpha`` is mutable: the bootstrap tuner sets it once it has searched the grid.
    ``recency="linear"`` min-max normalises last-access times; ``"inverse-age"`` normalises
    1 / (age in accesses + 1), the transform the authors' simulator uses.
    """

    name = "flop-aware"
    evicts_inner_nodes = True

    def __init__(self, alpha: float = 0.0, efficiency: str = "total", recency: str = "linear") -> None:
        if alpha < 0:
            raise ConfigError(f"flop-aware: alpha must be >= 0, got {alpha}")
        if efficiency not in ("total", "marginal"):
            raise ConfigError(f"flop-aware: efficiency must be 'total' or 'marginal', got {efficiency!r}")
        if recency not in ("linear", "inverse-age"):
            raise ConfigError(f"flop-aware: recency must be 'linear' or 'inverse-age', got {recency!r}")
        self.alpha = float(alpha)
        self.efficiency_variant = efficiency
        self.recency = recency

    def touched_on_hit(self, path: Sequence["Node"], hit: "Node | None") -> Iterable["Node"]:
        return () if hit is None else (hit,)

    def recency_scores(self, candidates: CandidateSet) -> np.ndarray:
        n = len(candidates)
        if self.recency == "linear":
            return _min_max(candidates.last_access[:n])
        seq = candidates.access_seq[:n]
        return _min_max(1.0 / (seq.max() - seq + 1.0))

    def utility(self, candidates: CandidateSet) -> np.ndarray:
        """Normalised recency + α · normalised FLOP efficiency (higher = keep)."""
        scores = self.recency_scores(candidates)
        if self.alpha:
            scores = scores + self.alpha * _min_max(candidates.flop_eff[: len(candidates)])
        return scores

    def choose(self, candidates: CandidateSet) -> int:
        return _argmin_ties_by_order(self.utility(candidates), candidates.access_seq[: len(candidates)])

    def describe(self) -> dict[str, object]:
        return {"eviction": self.name, "alpha": self.alpha, "efficiency": self.efficiency_variant,
                "recency": self.recency}


EVICTION_POLICIES: Registry[EvictionPolicy] = Registry("eviction policy")


@EVICTION_POLICIES.register("lru", "least recently used leaf (SGLang); hits refresh the whole path")
def _lru() -> EvictionPolicy:
    return LRU()


@EVICTION_POLICIES.register("flop-aware", "Marconi: recency + alpha * FLOP efficiency over nodes with <= 1 child")
def _flop_aware(alpha: float = 0.0, efficiency: str = "total", recency: str = "linear") -> EvictionPolicy:
    return FlopAware(alpha=alpha, efficiency=efficiency, recency=recency)


@EVICTION_POLICIES.register("flop-aware-marginal", "flop-aware with the FLOPs of the node's own edge only")
def _flop_aware_marginal(alpha: float = 0.0, recency: str = "linear") -> EvictionPolicy:
    return FlopAware(alpha=alpha, efficiency="marginal", recency=recency)


def make_eviction(spec: "str | EvictionPolicy") -> EvictionPolicy:
    return EVICTION_POLICIES.create(spec) if isinstance(spec, str) else spec
