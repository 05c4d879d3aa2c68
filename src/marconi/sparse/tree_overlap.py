"""Overlap-depth estimates keyed by the radix tree's own nodes, relative to the node, decayed, bounded.

Where a request leaves the cached tree is a node of the tree (its *attach node*, at depth
``kv_hit_len``): the sequence it inserts hangs below that node. This estimator keeps, per node
(up to ``max_nodes`` of them), a histogram of how far requests that reached the node went past
it -- *relative* depths ``hit_len - node_depth`` -- and composes the histograms of the nodes on a
request's path into the distribution ``P(d)`` the placement DP consumes.

Keys. A node is named by the tokens it spells from the root: ``(depth, H(tokens[:depth]))`` with
``H`` a 64-bit polynomial hash (:func:`path_keys` gives every prefix's key of a sequence in one
numpy pass). Every request passing through the node computes the same key, so the estimate
survives the tree's edge splits, evictions and re-insertions, and the policy needs no handle on
the cache's tree. A longer shared instruction does not merge documents (each document's node is
its own key), and depths relative to the node do not carry one document's boundary into another.

Observing. A request with KV hit ``h`` finds the known nodes on its path at depths ``<= h``
(:meth:`TreeOverlapEstimator.observe`) and records ``h - depth`` at each: each node's histogram is
"how far past me does a request that reaches me go". The deepest one also feeds a pooled histogram
(what a *new* node's estimate starts from). The request's own attach node is then registered
(:meth:`TreeOverlapEstimator.attach`), so the next request that diverges there records 0 under it.

Composing. For a sequence of ``n`` tokens with known nodes ``a_1 < ... < a_k`` on its path (the
root is always one), node ``j`` owns the territory ``[a_j, a_{j+1})``; a request reaching ``a_j``
stops inside it with ``P_j(d - a_j)`` and goes on with the tail mass ``P_j(>= a_{j+1} - a_j)``::

    w(d) = reach_j * P_j(d - a_j)  for a_j <= d < a_{j+1},   reach_{j+1} = reach_j * P_j(>= a_{j+1} - a_j)

with the last territory ending at ``n`` (deeper overlaps clipped to ``n``). ``P_j`` is the node's
histogram shrunk towards the pooled one, which is shrunk towards the prior, by pseudo-counts
(as :class:`~marconi.sparse.overlap.OverlapEstimator` does). The default prior is uniform over the
relative depths ``0..n - a_j`` with no point mass at the end: the end of an input is where a
continuation resumes, and Marconi's last-token checkpoint (kept by every admission) serves that.

Forgetting. An observation's weight halves every ``half_life_obs`` later observations of the same
node (of any node, for the pooled histogram) and every ``half_life_s`` units of the injected clock.

Memory (the cap, and what is evicted). At most ``max_nodes`` nodes besides the root; adding one
more evicts the least recently touched (observed, attached or composed). Each histogram holds at
most ``max_depths`` distinct relative depths; one more merges the lightest depth into its
shallower neighbour (the deeper one for the shallowest depth): mass moved shallower is still served
by a checkpoint placed there. So the estimator holds at most ``(max_nodes + 2) * max_depths``
(depth, weight) pairs whatever the trace's length. The defaults (2048 nodes, 32 depths) bound it
at about 65,600 pairs.

Drift. Each node remembers its own normalised histogram as of the last time its territory was
placed. :meth:`TreeOverlapEstimator.drift` is the total-variation distance between that snapshot
and the histogram now (1 for a node placed before any observation of its own). The admission
re-places a stored sequence's checkpoints only inside drifted territories, and only at positions
the request recomputes anyway: see :mod:`marconi.sparse.admission`.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from numpy.typing import NDArray

from marconi.sparse.overlap import OverlapPrior

__all__ = ["TreeEstimatorConfig", "TreeOverlapEstimator", "path_keys"]

FloatArray = NDArray[np.float64]
KeyArray = NDArray[np.uint64]

# Odd multiplier of the prefix hash (odd: invertible mod 2**64, so distinct positions never alias).
_HASH_BASE = np.uint64(0x9E3779B97F4A7C15)
# Move a histogram's weight origin once stored weights reach 2**_REBASE_HALF_LIVES.
_REBASE_HALF_LIVES = 256.0


def _relative_prior() -> OverlapPrior:
    return OverlapPrior(end_mass=0.0)


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
    """``(n+1,)`` keys: ``[d]`` names the prefix ``tokens[:d]`` (``[0] == 0``, the root).

    ``key[d] = sum_{i<d} (tokens[i] + 1) * B**i mod 2**64``: one numpy pass (uint64 arithmetic wraps).
    Two prefixes of the same depth collide with probability about ``2**-64`` per pair for the
    token sequences caches see; keys are always paired with their depth.
    """
    t = np.asarray(tokens).astype(np.uint64) + np.uint64(1)
    with np.errstate(over="ignore"):
        terms = t * _powers(t.size)
        return np.concatenate((np.zeros(1, dtype=np.uint64), np.cumsum(terms, dtype=np.uint64)))


# ================================================================================= config
@dataclass(frozen=True, slots=True)
class TreeEstimatorConfig:
    """Forgetting, shrinkage and the memory cap of :class:`TreeOverlapEstimator`.

    Attributes:
        prior: cold-start distribution over a node's relative depths ``0..n - depth``.
        half_life_obs: a node's observation halves after this many later observations of that node
            (of any node, for the pooled histogram); ``inf`` = no count decay.
        half_life_s: ... and after this many clock units; ``inf`` = no time decay (needs a clock).
        prior_strength: pseudo-observations of the prior in the pooled estimate.
        node_strength: pseudo-observations of the pooled estimate in a node's estimate.
        max_nodes: nodes kept besides the root (least recently touched evicted beyond it).
        max_depths: distinct relative depths per histogram (the lightest merged beyond it).
    """

    prior: OverlapPrior = field(default_factory=_relative_prior)
    half_life_obs: float = 512.0
    half_life_s: float = math.inf
    prior_strength: float = 4.0
    node_strength: float = 8.0
    max_nodes: int = 2048
    max_depths: int = 32

    def __post_init__(self) -> None:
        for name in ("half_life_obs", "half_life_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 (inf for no decay), got {getattr(self, name)}")
        for name in ("prior_strength", "node_strength"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be finite and >= 0, got {value}")
        if self.max_nodes < 1 or self.max_depths < 2:
            raise ValueError(f"max_nodes must be >= 1 and max_depths >= 2, got {self.max_nodes}, {self.max_depths}")

    @property
    def max_pairs(self) -> int:
        """The memory bound: (depth, weight) pairs the estimator may hold (nodes, root and pool)."""
        return (self.max_nodes + 2) * self.max_depths


# ================================================================================= histogram
class _Histogram:
    """Relative depth -> decayed weight, stored relative to ``origin`` (in half-lives), at most
    ``max_depths`` depths. The weight an observation has now is ``2**(stamp - now)``."""

    __slots__ = ("weights", "total", "origin", "num_observations")

    def __init__(self) -> None:
        self.weights: dict[int, float] = {}
        self.total = 0.0
        self.origin = 0.0
        self.num_observations = 0

    def add(self, depth: int, stamp: float, max_depths: int) -> None:
        if stamp - self.origin > _REBASE_HALF_LIVES:
            factor = 2.0 ** (self.origin - stamp)
            self.weights = {d: w * factor for d, w in self.weights.items() if w * factor > 0}
            self.total = math.fsum(self.weights.values())
            self.origin = stamp
        weight = 2.0 ** (stamp - self.origin)
        self.weights[depth] = self.weights.get(depth, 0.0) + weight
        self.total += weight
        self.num_observations += 1
        if len(self.weights) > max_depths:
            self._merge_lightest()

    def _merge_lightest(self) -> None:
        depths = sorted(self.weights)
        lightest = min(depths, key=lambda d: (self.weights[d], -d))
        i = depths.index(lightest)
        into = depths[i - 1] if i > 0 else depths[1]      # shallower neighbour; the deeper for the first
        self.weights[into] += self.weights.pop(lightest)

    def effective_count(self, now: float) -> float:
        return self.total * 2.0 ** (self.origin - now) if self.total > 0 else 0.0

    def normalised(self) -> dict[int, float]:
        return {d: w / self.total for d, w in self.weights.items()} if self.total > 0 else {}

    def distribution(self, length: int) -> FloatArray:
        """``(length+1,)`` normalised histogram, deeper depths counted at ``length``."""
        out = np.zeros(length + 1)
        for d, w in self.weights.items():
            out[min(d, length)] += w
        return out / self.total

    def check_invariants(self, max_depths: int) -> None:
        assert len(self.weights) <= max_depths, "histogram over its cap"
        assert all(w > 0 and math.isfinite(w) for w in self.weights.values()), "weights must be > 0"
        assert all(d >= 0 for d in self.weights), "depths must be >= 0"
        assert math.isclose(self.total, math.fsum(self.weights.values()), rel_tol=1e-9, abs_tol=1e-300)


class _NodeStats:
    """One known tree node: its depth, histogram and the snapshot its territory was placed with."""

    __slots__ = ("depth", "hist", "placed")

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.hist = _Histogram()
        self.placed: dict[int, float] | None = None   # own normalised histogram at the last placement


def _total_variation(a: dict[int, float], b: dict[int, float]) -> float:
    return 0.5 * sum(abs(a.get(d, 0.0) - b.get(d, 0.0)) for d in a.keys() | b.keys())


# ================================================================================= estimator
class TreeOverlapEstimator:
    """Overlap depths per radix-tree node, relative to the node, composed along a path (module doc).

    Not thread-safe; the cache that owns the admission policy serialises calls.
    """

    def __init__(self, config: TreeEstimatorConfig | None = None, *,
                 clock: Callable[[], float] | None = None) -> None:
        """
        Args:
            config: decay, prior, shrinkage and memory cap (defaults: count half-life 512, no time decay).
            clock: the cache's clock (trace seconds in the simulator); needed (here or by
                :meth:`set_clock` before the first observation) iff ``config.half_life_s`` is finite.
        """
        self.config = config or TreeEstimatorConfig()
        self._clock = clock
        self._root = _NodeStats(0)
        self._nodes: OrderedDict[tuple[int, int], _NodeStats] = OrderedDict()   # LRU order, oldest first
        self._depth_counts: dict[int, int] = {}
        self._depths_sorted: np.ndarray | None = np.zeros(0, dtype=np.int64)
        self._pool = _Histogram()
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
        """Register the node at ``depth`` on this path (where a request's new sequence hangs);
        touch it if known. May evict the least recently touched node (the cap)."""
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
        """A request whose path has ``keys`` matched the cache to ``hit_len`` tokens: record
        ``hit_len - depth`` at every known node on the path at or above ``hit_len``."""
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
        """``(length+1,)`` ``P(r)``, ``r = 0..length``: how far past the node at ``depth`` a request
        that reaches it goes (its histogram shrunk towards the pooled one; the pooled one if unknown)."""
        base = self.pooled_weights(length)
        stats = self._root if depth == 0 else self._nodes.get((depth, int(keys[depth])))
        if stats is None:
            return base
        return _blend(stats.hist, self._now(stats.hist), base, self.config.node_strength, length)

    def path_weights(self, keys: KeyArray, seq_len: int) -> tuple[FloatArray, list[tuple[int, int]]]:
        """``(seq_len+1,)`` ``P(d)`` over absolute depths of this path, composed from the known
        nodes on it (module doc), and the territories ``[(start, end)]`` (one per node, ascending,
        the last ending at ``seq_len + 1``). Sums to 1. Touches every node used."""
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
        """Relative depths the node at ``depth`` or the pooled histogram observed (the data's
        support, without the prior's spread)."""
        stats = self._root if depth == 0 else self._nodes.get((depth, int(keys[depth])))
        own = set() if stats is None else set(stats.hist.weights)
        return sorted(own | set(self._pool.weights))

    # ----------------------------------------------------------------------------- drift
    def drift(self, keys: KeyArray, depth: int) -> float:
        """Total variation between the node's own histogram now and at its last placement
        (:meth:`mark_placed`); 1.0 for a node never placed with data of its own, 0.0 for an
        unknown node or one with no observation."""
        stats = self._root if depth == 0 else self._nodes.get((depth, int(keys[depth])))
        if stats is None or stats.hist.total <= 0:
            return 0.0
        if not stats.placed:
            return 1.0
        return _total_variation(stats.hist.normalised(), stats.placed)

    def mark_placed(self, keys: KeyArray, depth: int) -> None:
        """Remember the node's histogram now as the one its territory was placed with."""
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

    def _now(self, hist: _Histogram) -> float:
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


def _blend(hist: _Histogram, now: float, base: FloatArray, strength: float, length: int) -> FloatArray:
    """``(n * hist + strength * base) / (n + strength)`` with ``n`` the effective count; ``base`` if ``n == 0``."""
    n_eff = hist.effective_count(now)
    if n_eff <= 0:
        return base
    return (n_eff * hist.distribution(length) + strength * base) / (n_eff + strength)
