"""Overlap-depth estimates ``P(d)`` for the placement DP, by key: :class:`OverlapEstimator` (an opaque
key, absolute depths), :class:`TreeOverlapEstimator` (radix-tree nodes via :func:`path_keys`, the
simulator's), :class:`BlockOverlapEstimator` (vLLM block hashes, the retention planner's; kept apart
because each engine's pinned results use its own). Arithmetic in docs/sparse.md. Not thread-safe."""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Hashable, Protocol, Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from marconi.sparse.dp import IntArray, validate_positions

__all__ = [
    "BlockEstimatorConfig",
    "BlockOverlapEstimator",
    "EstimatorConfig",
    "GeometricSpread",
    "OverlapEstimator",
    "OverlapPrior",
    "TreeEstimatorConfig",
    "TreeOverlapEstimator",
    "UniformSpread",
    "bin_depths",
    "binned_depth_weights",
    "path_keys",
]

FloatArray = NDArray[np.float64]
KeyArray = NDArray[np.uint64]

# Move the weight origin once stored weights reach 2**_REBASE_HALF_LIVES (float64 tops out near 2**1023).
_REBASE_HALF_LIVES = 256.0
# On a rebase, drop depths holding less than this fraction of the total weight (bounds memory).
_PRUNE_FRACTION = 1e-15
# Odd multiplier of the prefix hash (odd: invertible mod 2**64, so distinct positions never alias).
_HASH_BASE = np.uint64(0x9E3779B97F4A7C15)


# ================================================================================= prior
class Spread(Protocol):
    """Shape of the prior's non-end mass over depths ``0..N``."""

    def weights(self, seq_len: int) -> FloatArray:
        """``(seq_len+1,)`` non-negative weights summing to 1."""
        ...


@dataclass(frozen=True, slots=True)
class UniformSpread:
    """Every depth ``0..N`` equally likely: no knowledge of where requests diverge."""

    def weights(self, seq_len: int) -> FloatArray:
        return np.full(seq_len + 1, 1.0 / (seq_len + 1))


@dataclass(frozen=True, slots=True)
class GeometricSpread:
    """``P(d) ∝ q**d`` on ``0..N``; ``mean_frac``: the untruncated mean as a fraction of ``N``."""

    mean_frac: float = 0.25

    def __post_init__(self) -> None:
        if not (self.mean_frac > 0 and math.isfinite(self.mean_frac)):
            raise ValueError(f"mean_frac must be finite and > 0, got {self.mean_frac}")

    def weights(self, seq_len: int) -> FloatArray:
        if seq_len == 0:
            return np.ones(1)
        mean = self.mean_frac * seq_len
        log_q = math.log(mean / (1.0 + mean))
        w = np.exp(log_q * np.arange(seq_len + 1))
        return w / w.sum()


@dataclass(frozen=True, slots=True)
class OverlapPrior:
    """Cold-start ``P(d)``: ``end_mass`` at ``d = N`` (a full continuation), the rest spread by ``spread``."""

    end_mass: float = 0.5
    spread: Spread = field(default_factory=UniformSpread)

    def __post_init__(self) -> None:
        if not 0.0 <= self.end_mass <= 1.0:
            raise ValueError(f"end_mass must lie in [0, 1], got {self.end_mass}")

    def weights(self, seq_len: int) -> FloatArray:
        """``(seq_len+1,)`` prior probabilities of depths ``0..seq_len``; sums to 1."""
        _check_seq_len(seq_len)
        return self.end_mass * _point_mass(seq_len, seq_len) + (1.0 - self.end_mass) * self.spread.weights(seq_len)


def _point_mass(seq_len: int, depth: int) -> FloatArray:
    out = np.zeros(seq_len + 1)
    out[depth] = 1.0
    return out


def _check_seq_len(seq_len: int) -> None:
    if seq_len < 0:
        raise ValueError(f"seq_len must be >= 0, got {seq_len}")


# ================================================================================= histogram
def _check_decay(config: object, strengths: tuple[str, ...]) -> None:
    """Half-lives > 0 (``inf``: no decay); pseudo-count strengths finite and >= 0."""
    for name in ("half_life_obs", "half_life_s"):
        if not getattr(config, name) > 0:
            raise ValueError(f"{name} must be > 0 (inf for no decay), got {getattr(config, name)}")
    for name in strengths:
        value = getattr(config, name)
        if not (value >= 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be finite and >= 0, got {value}")


class _DecayedHistogram:
    """Depth -> weight ``2**(stamp - origin)`` (stamps in half-lives; nothing rescaled per add); past
    ``max_depths`` the lightest depth but the shallowest merges into its shallower neighbour: a state
    there still serves the requests that stopped deeper, so the estimate never credits a state with
    requests it cannot serve (the shallowest has no shallower neighbour, so it is never merged)."""

    __slots__ = ("weights", "total", "origin", "num_observations")

    def __init__(self) -> None:
        self.weights: dict[int, float] = {}
        self.total = 0.0
        self.origin = 0.0
        self.num_observations = 0

    def add(self, depth: int, stamp: float, max_depths: int | None = None) -> None:
        if stamp - self.origin > _REBASE_HALF_LIVES:
            self._rebase(stamp)
        weight = 2.0 ** (stamp - self.origin)
        self.weights[depth] = self.weights.get(depth, 0.0) + weight
        self.total += weight
        self.num_observations += 1
        if max_depths is not None and len(self.weights) > max_depths:
            self._merge_lightest()

    def _rebase(self, new_origin: float) -> None:
        factor = 2.0 ** (self.origin - new_origin)
        floor = _PRUNE_FRACTION * self.total * factor
        self.weights = {d: w * factor for d, w in self.weights.items() if w * factor > floor}
        self.total = math.fsum(self.weights.values())
        self.origin = new_origin

    def _merge_lightest(self) -> None:
        depths = sorted(self.weights)
        i = min(range(1, len(depths)), key=lambda j: (self.weights[depths[j]], -depths[j]))
        self.weights[depths[i - 1]] += self.weights.pop(depths[i])

    def effective_count(self, now: float) -> float:
        return self.total * 2.0 ** (self.origin - now) if self.total > 0 else 0.0

    def normalised(self) -> dict[int, float]:
        return {d: w / self.total for d, w in self.weights.items()} if self.total > 0 else {}

    def distribution(self, seq_len: int) -> FloatArray:
        """``(seq_len+1,)`` normalised histogram, depths beyond ``seq_len`` counted at ``seq_len``."""
        depths = np.fromiter(self.weights.keys(), dtype=np.int64, count=len(self.weights))
        weights = np.fromiter(self.weights.values(), dtype=np.float64, count=len(self.weights))
        hist = np.bincount(np.minimum(depths, seq_len), weights=weights, minlength=seq_len + 1)
        return hist / hist.sum()

    def check_invariants(self, max_depths: int | None = None) -> None:
        assert max_depths is None or len(self.weights) <= max_depths, "histogram over its cap"
        assert all(w > 0 and math.isfinite(w) for w in self.weights.values()), "weights must be > 0"
        assert all(d >= 0 for d in self.weights), "depths must be >= 0"
        recomputed = math.fsum(self.weights.values())
        assert math.isclose(self.total, recomputed, rel_tol=1e-9, abs_tol=1e-300), (self.total, recomputed)
        assert (self.total > 0) == (self.num_observations > 0), "weight without observations or vice versa"


def _blend(hist: _DecayedHistogram, now: float, base: FloatArray, strength: float, length: int) -> FloatArray:
    """``(n * hist + strength * base) / (n + strength)``, ``n`` the effective count (``base`` if 0)."""
    n_eff = hist.effective_count(now)
    if n_eff <= 0:
        return base
    return (n_eff * hist.distribution(length) + strength * base) / (n_eff + strength)


# ================================================================================= opaque key
@dataclass(frozen=True, slots=True)
class EstimatorConfig:
    """Forgetting and shrinkage of :class:`OverlapEstimator`: ``half_life_obs`` (observations) and
    ``half_life_s`` (clock seconds; finite needs a clock) halve a weight, ``inf`` for none;
    ``prior_strength`` / ``global_strength``: pseudo-observations of the prior in the global estimate
    and of the global estimate in a key's."""

    prior: OverlapPrior = field(default_factory=OverlapPrior)
    half_life_obs: float = math.inf
    half_life_s: float = math.inf
    prior_strength: float = 4.0
    global_strength: float = 8.0

    def __post_init__(self) -> None:
        _check_decay(self, ("prior_strength", "global_strength"))


class OverlapEstimator:
    """Per-key overlap-depth distribution (absolute tokens, clipped to the asked ``N``), shrunk towards
    the global estimate and the prior. Call :meth:`forget` when the keyed sequence leaves the cache."""

    def __init__(self, config: EstimatorConfig | None = None, *, clock: Callable[[], float] | None = None) -> None:
        """Raises ValueError if ``config.half_life_s`` is finite and ``clock`` (seconds) is None."""
        self.config = config or EstimatorConfig()
        if math.isfinite(self.config.half_life_s) and clock is None:
            raise ValueError("half_life_s is finite: pass a clock")
        self._clock = clock
        self._by_key: dict[Hashable, _DecayedHistogram] = {}
        self._global = _DecayedHistogram()

    # ----------------------------------------------------------------------------- updates
    def observe(self, key: Hashable, depth: int) -> None:
        """Record a request overlapping ``key``'s sequence to ``depth >= 0`` tokens (ValueError if
        negative)."""
        if depth < 0:
            raise ValueError(f"depth must be >= 0, got {depth}")
        hist = self._by_key.setdefault(key, _DecayedHistogram())
        seconds = self._time_stamp()
        hist.add(int(depth), hist.num_observations / self.config.half_life_obs + seconds)
        self._global.add(int(depth), self._global.num_observations / self.config.half_life_obs + seconds)

    def forget(self, key: Hashable) -> None:
        """Drop ``key``'s own history (the global estimate keeps it); no-op if unknown."""
        self._by_key.pop(key, None)

    def num_depths(self, key: Hashable) -> int:
        """Distinct depths ``key``'s own history holds (its memory; decayed weights drop out)."""
        hist = self._by_key.get(key)
        return 0 if hist is None else len(hist.weights)

    # ----------------------------------------------------------------------------- estimates
    def depth_weights(self, key: Hashable, seq_len: int) -> FloatArray:
        """``(seq_len+1,)`` estimated ``P(d)`` under ``key``; sums to 1."""
        base = self.global_depth_weights(seq_len)
        hist = self._by_key.get(key)
        if hist is None:
            return base
        return _blend(hist, self._now_stamp(hist), base, self.config.global_strength, seq_len)

    def observed_depths(self, key: Hashable) -> IntArray:
        """Sorted distinct depths observed under ``key`` or globally (no prior spread)."""
        depths = set(self._global.weights)
        hist = self._by_key.get(key)
        if hist is not None:
            depths.update(hist.weights)
        return np.array(sorted(depths), dtype=np.int64)

    def global_depth_weights(self, seq_len: int) -> FloatArray:
        """The pooled estimate (all keys) shrunk towards the prior; the prior when nothing was observed."""
        prior = self.config.prior.weights(seq_len)
        return _blend(self._global, self._now_stamp(self._global), prior, self.config.prior_strength, seq_len)

    def candidate_weights(self, key: Hashable, seq_len: int, candidates: ArrayLike) -> FloatArray:
        """``(K+1,)`` mass of each candidate interval ``[0,p_1), [p_1,p_2), ..., [p_K, seq_len]``."""
        return bin_depths(self.depth_weights(key, seq_len), candidates)

    def effective_observations(self, key: Hashable) -> float:
        """Decayed observation count behind ``key``'s own histogram (0 for an unknown key)."""
        hist = self._by_key.get(key)
        return 0.0 if hist is None else hist.effective_count(self._now_stamp(hist))

    def keys(self) -> list[Hashable]:
        return list(self._by_key)

    # ----------------------------------------------------------------------------- internals
    def _time_stamp(self) -> float:
        if self._clock is None or math.isinf(self.config.half_life_s):
            return 0.0
        return float(self._clock()) / self.config.half_life_s

    def _now_stamp(self, hist: _DecayedHistogram) -> float:
        # "Now" is the latest observation's count stamp: the newest observation weighs 1 (before time decay).
        latest = max(hist.num_observations - 1, 0)
        return latest / self.config.half_life_obs + self._time_stamp()

    def check_invariants(self) -> None:
        """Recompute every histogram's total; the global count equals the sum over all observations ever."""
        for hist in self._by_key.values():
            hist.check_invariants()
        self._global.check_invariants()
        assert self._global.num_observations >= sum(h.num_observations for h in self._by_key.values())


# ================================================================================= token path
_POWERS = np.ones(1, dtype=np.uint64)


def _powers(n: int) -> KeyArray:
    """``_HASH_BASE ** i mod 2**64`` for ``i < n`` (grown on demand, shared by every estimator)."""
    global _POWERS
    if _POWERS.size < n:
        size = max(n, 2 * _POWERS.size)
        with np.errstate(over="ignore"):
            _POWERS = np.cumprod(np.concatenate(([np.uint64(1)], np.full(size - 1, _HASH_BASE, dtype=np.uint64))),
                                 dtype=np.uint64)
    return _POWERS[:n]


def path_keys(tokens: np.ndarray) -> KeyArray:
    """``(n+1,)`` uint64 keys, ``[d]`` naming ``tokens[:d]`` (``[0] == 0``), a wrapping polynomial hash;
    same-depth collisions about ``2**-64``."""
    t = np.asarray(tokens).astype(np.uint64) + np.uint64(1)
    with np.errstate(over="ignore"):
        terms = t * _powers(t.size)
        return np.concatenate((np.zeros(1, dtype=np.uint64), np.cumsum(terms, dtype=np.uint64)))


def _relative_prior() -> OverlapPrior:
    return OverlapPrior(end_mass=0.0)


@dataclass(frozen=True, slots=True)
class TreeEstimatorConfig:
    """Forgetting, shrinkage and memory cap of :class:`TreeOverlapEstimator`: half-lives as in
    :class:`EstimatorConfig` per node; ``node_strength``: pooled pseudo-observations in a node's
    estimate; at most ``max_nodes`` nodes besides the root (LRU) of ``max_depths`` depths each."""

    prior: OverlapPrior = field(default_factory=_relative_prior)
    half_life_obs: float = 512.0
    half_life_s: float = math.inf
    prior_strength: float = 4.0
    node_strength: float = 8.0
    max_nodes: int = 2048
    max_depths: int = 32

    def __post_init__(self) -> None:
        _check_decay(self, ("prior_strength", "node_strength"))
        if self.max_nodes < 1 or self.max_depths < 2:
            raise ValueError(f"max_nodes must be >= 1 and max_depths >= 2, got {self.max_nodes}, {self.max_depths}")

    @property
    def max_pairs(self) -> int:
        """The memory bound: (depth, weight) pairs the estimator may hold (nodes, root and pool)."""
        return (self.max_nodes + 2) * self.max_depths


class _NodeStats:
    """A known node: depth, histogram, and the normalised snapshot of its last placement."""

    __slots__ = ("depth", "hist", "placed")

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.hist = _DecayedHistogram()
        self.placed: dict[int, float] | None = None   # own normalised histogram at the last placement


def _total_variation(a: dict[int, float], b: dict[int, float]) -> float:
    return 0.5 * sum(abs(a.get(d, 0.0) - b.get(d, 0.0)) for d in a.keys() | b.keys())


class TreeOverlapEstimator:
    """Overlap depths per radix-tree node ``(depth, path_keys(tokens)[depth])``, relative to the node, so
    they survive splits and evictions: :meth:`observe` records hits, :meth:`attach` registers nodes,
    :meth:`path_weights` composes ``P(d)``, :meth:`drift` compares with the last placement. Holds at most
    ``config.max_pairs`` (depth, weight) pairs."""

    def __init__(self, config: TreeEstimatorConfig | None = None, *,
                 clock: Callable[[], float] | None = None) -> None:
        """``clock``: the cache's; needed (here or via :meth:`set_clock`) iff ``config.half_life_s`` is
        finite."""
        self.config = config or TreeEstimatorConfig()
        self._clock = clock
        self._root = _NodeStats(0)
        self._nodes: OrderedDict[tuple[int, int], _NodeStats] = OrderedDict()   # LRU order, oldest first
        self._depth_counts: dict[int, int] = {}
        self._depths_sorted: np.ndarray | None = np.zeros(0, dtype=np.int64)
        self._pool = _DecayedHistogram()
        self.num_evicted = 0

    def set_clock(self, clock: Callable[[], float]) -> None:
        """Read time from ``clock`` from now on (the cache's, once the policy is bound to a cache)."""
        self._clock = clock

    # ----------------------------------------------------------------------------- nodes
    @property
    def num_nodes(self) -> int:
        """Known nodes besides the root (at most ``config.max_nodes``)."""
        return len(self._nodes)

    @property
    def num_pairs(self) -> int:
        """(depth, weight) pairs held now: at most ``config.max_pairs``."""
        return (sum(len(s.hist.weights) for s in self._nodes.values()) + len(self._root.hist.weights)
                + len(self._pool.weights))

    def knows(self, keys: KeyArray, depth: int) -> bool:
        """Whether the node spelling ``tokens[:depth]`` (``keys`` from :func:`path_keys`) is known."""
        return depth == 0 or (depth, int(keys[depth])) in self._nodes

    def nodes_on_path(self, keys: KeyArray, max_depth: int) -> list[tuple[int, _NodeStats]]:
        """Known nodes spelling prefixes of the path, depth ``<= max_depth``, ascending (root first)."""
        depths = self._sorted_depths()
        depths = depths[: np.searchsorted(depths, min(max_depth, keys.size - 1), side="right")]
        found = [(0, self._root)]
        for d in depths.tolist():
            stats = self._nodes.get((d, int(keys[d])))
            if stats is not None:
                found.append((d, stats))
        return found

    def _sorted_depths(self) -> np.ndarray:
        if self._depths_sorted is None:
            self._depths_sorted = np.array(sorted(self._depth_counts), dtype=np.int64)
        return self._depths_sorted

    def attach(self, keys: KeyArray, depth: int) -> None:
        """Register (or touch) the node at ``depth`` on this path; may evict the LRU node."""
        if depth <= 0:
            return
        key = (depth, int(keys[depth]))
        if key in self._nodes:
            self._nodes.move_to_end(key)
            return
        self._nodes[key] = _NodeStats(depth)
        self._count_depth(depth, +1)
        while len(self._nodes) > self.config.max_nodes:
            (old_depth, _), _ = self._nodes.popitem(last=False)
            self._count_depth(old_depth, -1)
            self.num_evicted += 1

    def _count_depth(self, depth: int, delta: int) -> None:
        count = self._depth_counts.get(depth, 0) + delta
        if count:
            self._depth_counts[depth] = count
        else:
            del self._depth_counts[depth]
        self._depths_sorted = None

    def _touch(self, depth: int, keys: KeyArray) -> None:
        if depth:
            self._nodes.move_to_end((depth, int(keys[depth])))

    # ----------------------------------------------------------------------------- updates
    def observe(self, keys: KeyArray, hit_len: int) -> None:
        """Record ``hit_len - depth`` at every known node on the path at depth <= ``hit_len``; ValueError
        if ``hit_len < 0``."""
        if hit_len < 0:
            raise ValueError(f"hit_len must be >= 0, got {hit_len}")
        nodes = self.nodes_on_path(keys, hit_len)
        seconds = self._time_stamp()
        cap = self.config.max_depths
        for depth, stats in nodes:
            hist = stats.hist
            hist.add(hit_len - depth, hist.num_observations / self.config.half_life_obs + seconds, cap)
            self._touch(depth, keys)
        deepest = nodes[-1][0]
        self._pool.add(hit_len - deepest, self._pool.num_observations / self.config.half_life_obs + seconds, cap)

    # ----------------------------------------------------------------------------- estimates
    def pooled_weights(self, length: int) -> FloatArray:
        """``(length+1,)`` the pooled relative-depth estimate shrunk towards the prior."""
        prior = self.config.prior.weights(length)
        return _blend(self._pool, self._now(self._pool), prior, self.config.prior_strength, length)

    def node_weights(self, keys: KeyArray, depth: int, length: int) -> FloatArray:
        """``(length+1,)`` relative-depth ``P(r)`` past the node at ``depth`` (the pooled one if unknown)."""
        base = self.pooled_weights(length)
        stats = self._root if depth == 0 else self._nodes.get((depth, int(keys[depth])))
        if stats is None:
            return base
        return _blend(stats.hist, self._now(stats.hist), base, self.config.node_strength, length)

    def path_weights(self, keys: KeyArray, seq_len: int) -> tuple[FloatArray, list[tuple[int, int]]]:
        """``(seq_len+1,)`` composed ``P(d)`` (sums to 1) and the territories ``[(start, end)]`` per node,
        the last ending at ``seq_len + 1``. Touches every node used."""
        nodes = self.nodes_on_path(keys, seq_len)
        out = np.zeros(seq_len + 1)
        reach = 1.0
        territories = []
        for j, (start, _) in enumerate(nodes):
            end = nodes[j + 1][0] if j + 1 < len(nodes) else seq_len + 1
            p = self.node_weights(keys, start, seq_len - start)
            out[start:end] = reach * p[: end - start]
            reach *= float(p[end - start:].sum())
            territories.append((start, end))
            self._touch(start, keys)
        total = out.sum()
        return (out / total if total > 0 else out), territories

    def observed_depths(self, keys: KeyArray, depth: int) -> list[int]:
        """Relative depths the node or the pool observed (no prior spread)."""
        stats = self._root if depth == 0 else self._nodes.get((depth, int(keys[depth])))
        own = set() if stats is None else set(stats.hist.weights)
        return sorted(own | set(self._pool.weights))

    # ----------------------------------------------------------------------------- drift
    def drift(self, keys: KeyArray, depth: int) -> float:
        """Total variation between the node's histogram and its last placement's snapshot; 1.0 if never
        placed, 0.0 for an unknown or empty node."""
        stats = self._root if depth == 0 else self._nodes.get((depth, int(keys[depth])))
        if stats is None or stats.hist.total <= 0:
            return 0.0
        if not stats.placed:
            return 1.0
        return _total_variation(stats.hist.normalised(), stats.placed)

    def mark_placed(self, keys: KeyArray, depth: int) -> None:
        """Snapshot the node's histogram as the one its territory was placed with."""
        stats = self._root if depth == 0 else self._nodes.get((depth, int(keys[depth])))
        if stats is not None:
            stats.placed = stats.hist.normalised()

    # ----------------------------------------------------------------------------- internals
    def _time_stamp(self) -> float:
        if math.isinf(self.config.half_life_s):
            return 0.0
        if self._clock is None:
            raise ValueError("half_life_s is finite: pass a clock (or bind the policy to a cache)")
        return float(self._clock()) / self.config.half_life_s

    def _now(self, hist: _DecayedHistogram) -> float:
        latest = max(hist.num_observations - 1, 0)
        return latest / self.config.half_life_obs + self._time_stamp()

    def effective_observations(self, keys: KeyArray, depth: int) -> float:
        """Decayed observation count of the node's own histogram (0 for an unknown node)."""
        stats = self._root if depth == 0 else self._nodes.get((depth, int(keys[depth])))
        return 0.0 if stats is None else stats.hist.effective_count(self._now(stats.hist))

    def check_invariants(self) -> None:
        """The caps hold; depth counts match the nodes; every histogram's total is its sum."""
        cap = self.config.max_depths
        assert len(self._nodes) <= self.config.max_nodes, "over the node cap"
        counts: dict[int, int] = {}
        for (depth, _), stats in self._nodes.items():
            assert stats.depth == depth > 0
            counts[depth] = counts.get(depth, 0) + 1
            stats.hist.check_invariants(cap)
        assert counts == self._depth_counts, "depth index out of date"
        self._root.hist.check_invariants(cap)
        self._pool.check_invariants(cap)
        assert self.num_pairs <= self.config.max_pairs


# ================================================================================= block path
@dataclass(frozen=True, slots=True)
class BlockEstimatorConfig:
    """Memory and forgetting of :class:`BlockOverlapEstimator`: ``max_keys`` block hashes, ``max_anchors``
    anchors and branch points (each LRU), ``max_bins`` depths per histogram (lightest dropped),
    ``decay`` per observation, ``prior`` pseudo-count of the global histogram."""

    max_keys: int = 1 << 16
    max_anchors: int = 4096
    max_bins: int = 64
    decay: float = 0.98
    prior: float = 1.0

    def __post_init__(self) -> None:
        if min(self.max_keys, self.max_anchors, self.max_bins) < 1:
            raise ValueError("max_keys, max_anchors and max_bins must be >= 1")
        if not 0 < self.decay <= 1 or not (0 <= self.prior < math.inf):
            raise ValueError(f"decay must be in (0, 1] and prior finite and >= 0, got {self.decay}, {self.prior}")


class _BlockHistogram:
    """Relative depths (blocks) with eager decay; drops (not merges) the lightest bin, as vLLM's
    pinned retention results assume."""

    __slots__ = ("weights", "max_bins", "decay")

    def __init__(self, max_bins: int, decay: float) -> None:
        self.weights: dict[int, float] = {}
        self.max_bins = max_bins
        self.decay = decay

    def add(self, depth: int) -> None:
        for k in self.weights:
            self.weights[k] *= self.decay
        self.weights[depth] = self.weights.get(depth, 0.0) + 1.0
        if len(self.weights) > self.max_bins:    # the lightest goes (ties: the deepest), never the new one
            victim = min((k for k in self.weights if k != depth), key=lambda k: (self.weights[k], -k))
            del self.weights[victim]

    @property
    def mass(self) -> float:
        return sum(self.weights.values())


class BlockOverlapEstimator:
    """Where requests diverge from a sequence, by vLLM block path (``keys[j]`` names ``j + 1`` blocks). A
    sequence owns the hashes it brings first, with its novelty start and anchor; an overlap of ``d``
    blocks counts at the owner's anchor (relative), globally (absolute) and at its branch point
    ``keys[d - 1]``. Bounded by :class:`BlockEstimatorConfig`; deterministic."""

    def __init__(self, config: BlockEstimatorConfig = BlockEstimatorConfig()) -> None:
        self.config = config
        self._owner: OrderedDict[Hashable, tuple[Hashable | None, int]] = OrderedDict()
        self._local: OrderedDict[Hashable | None, _BlockHistogram] = OrderedDict()
        self._global = _BlockHistogram(config.max_bins, config.decay)
        # Block hash -> decayed count of requests whose overlap ended right after that block.
        self._branches: OrderedDict[Hashable, float] = OrderedDict()
        self.num_observations = 0

    @property
    def num_keys(self) -> int:
        return len(self._owner)

    @property
    def num_anchors(self) -> int:
        return len(self._local)

    def observe(self, keys: Sequence[Hashable]) -> tuple[Hashable | None, int]:
        """Record a new sequence's divergence and own its new blocks; returns ``(anchor, novelty start)``."""
        depth = 0
        while depth < len(keys) and keys[depth] in self._owner:
            depth += 1
        if depth:
            anchor, start = self._owner[keys[depth - 1]]
            self._record(anchor, depth - start, depth)
            self._branch(keys[depth - 1])
            for key in keys[:depth]:
                self._owner.move_to_end(key)
        anchor = keys[depth - 1] if depth else None
        for key in keys[depth:]:
            self._owner[key] = (anchor, depth)
        while len(self._owner) > self.config.max_keys:
            self._owner.popitem(last=False)
        return anchor, depth

    def _record(self, anchor: Hashable | None, relative: int, absolute: int) -> None:
        hist = self._local.get(anchor)
        if hist is None:
            hist = self._local[anchor] = _BlockHistogram(self.config.max_bins, self.config.decay)
            while len(self._local) > self.config.max_anchors:
                self._local.popitem(last=False)
        else:
            self._local.move_to_end(anchor)
        hist.add(relative)
        self._global.add(absolute)
        self.num_observations += 1

    def _branch(self, key: Hashable) -> None:
        """One more request left the tree right after block ``key`` (its count decays as a bin does)."""
        count = self._branches.pop(key, 0.0)
        self._branches[key] = count * self.config.decay + 1.0
        while len(self._branches) > self.config.max_anchors:
            self._branches.popitem(last=False)

    def _tail(self, anchor: Hashable | None, start: int) -> dict[int, float]:
        """Unnormalised relative-depth weights past ``start``: the anchor's counts plus ``prior`` (1 if the
        anchor has none) pseudo-counts of the global depths past ``start``."""
        beyond = {k - start: w for k, w in self._global.weights.items() if k > start}
        g_mass = sum(beyond.values())
        local = self._local.get(anchor)
        l_mass = local.mass if local is not None else 0.0
        if g_mass <= 0 and l_mass <= 0:
            return {}
        prior = self.config.prior if l_mass > 0 else 1.0
        out = {k: prior * w / g_mass for k, w in beyond.items()}
        if local is not None and l_mass > 0:
            for k, w in local.weights.items():
                out[k] = out.get(k, 0.0) + w            # l_mass * (w / l_mass)
        return out

    def distribution(self, anchor: Hashable | None, start: int = 0) -> dict[int, float]:
        """Relative divergence depth (blocks, >= 1) -> probability (normalised :meth:`_tail`); empty if no
        data."""
        return _normalised(self._tail(anchor, start))

    def path_distribution(self, keys: Sequence[Hashable], anchor: Hashable | None, start: int) -> dict[int, float]:
        """Absolute divergence depth (blocks, >= 1) -> probability for the sequence ``keys`` (``anchor``,
        ``start`` from :meth:`observe`): branch-point counts up to ``start``, the :meth:`_tail` estimate
        shifted by ``start`` past it. Touches the branch points it reads."""
        out: dict[int, float] = {}
        for j in range(min(start, len(keys))):
            count = self._branches.get(keys[j])
            if count is not None:
                self._branches.move_to_end(keys[j])
                out[j + 1] = count
        for k, w in self._tail(anchor, start).items():
            out[start + k] = out.get(start + k, 0.0) + w
        return _normalised(out)

    @property
    def num_branches(self) -> int:
        """Branch points remembered (at most ``max_anchors``)."""
        return len(self._branches)

    def check_invariants(self) -> None:
        assert len(self._owner) <= self.config.max_keys and len(self._local) <= self.config.max_anchors
        assert len(self._branches) <= self.config.max_anchors and all(c > 0 for c in self._branches.values())
        for hist in (self._global, *self._local.values()):
            assert len(hist.weights) <= self.config.max_bins and all(k >= 1 and w > 0 for k, w in hist.weights.items())


def _normalised(weights: dict[int, float]) -> dict[int, float]:
    total = sum(weights.values())
    return {k: v / total for k, v in sorted(weights.items())} if total > 0 else {}


# ================================================================================= binning
def bin_depths(depth_weights: ArrayLike, candidates: ArrayLike) -> FloatArray:
    """``(K+1,)`` weight per interval ``[0,p_1), ..., [p_K, N]`` of ``depth_weights`` (over ``0..N``);
    ``candidates``: distinct positions in ``[1, N]``, any order. ValueError for weights that are not
    a 1-D array of finite, non-negative real numbers, or bad candidates."""
    raw = np.asarray(depth_weights)
    if raw.dtype.kind not in "biuf" or raw.ndim != 1:
        raise ValueError(f"depth_weights must be a 1-D array of real numbers, got {raw.dtype} of shape {raw.shape}")
    w = raw.astype(np.float64)
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError("depth_weights must be finite and non-negative")
    cand = validate_positions(candidates, seq_len=w.size - 1)
    edges = np.concatenate(([0], cand, [w.size]))
    return np.diff(np.concatenate(([0.0], np.cumsum(w)))[edges])


def binned_depth_weights(depth_weights: ArrayLike, candidates: ArrayLike) -> FloatArray:
    """``(N+1,)`` weights with each candidate interval's mass moved to its left end; for a potential
    cost the optimal placement is unchanged (see :mod:`marconi.sparse.dp`)."""
    w = np.asarray(depth_weights, dtype=np.float64)
    cand = validate_positions(candidates, seq_len=w.size - 1)
    out = np.zeros_like(w)
    out[np.concatenate(([0], cand))] = bin_depths(w, cand)
    return out
