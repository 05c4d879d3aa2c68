"""Overlap-depth estimates: the distribution ``P(d)`` of how deep future requests will match a
sequence, which the placement DP (:mod:`marconi.sparse.dp`) consumes.

One module, three keys:

* :class:`OverlapEstimator`: an opaque key (a document id, a hash of the first tokens), absolute
  depths. No tree: ``sparse-dp(estimator=prefix)`` keeps it to reproduce earlier figures.
* :class:`TreeOverlapEstimator`: the token path (:func:`path_keys` names every prefix of the
  tokens), depths relative to the radix-tree nodes on it, composed along the path; drift
  snapshots drive the simulator admission's re-placement (:mod:`marconi.sparse.admission`).
* :class:`BlockOverlapEstimator`: the block path (vLLM's block hashes, each naming its whole
  prefix), depths in blocks relative to the sequence a request diverged from, plus counts at the
  blocks requests left the tree after; vLLM's retention planner
  (:mod:`marconi.integrations.vllm.retention`) calls it.

The token-path and block-path estimators answer the same question from different evidence (every
known node on the path, composed, vs the owner's anchor and branch counts on a block grid): each
engine's pinned results are computed with its own, so they stay two classes.

The opaque-key and token-path estimators share one histogram, decayed by observation counts and
by an injected clock and shrunk towards a pooled histogram and a cold-start prior by pseudo-counts
(the block-path one decays per observation, see :class:`BlockEstimatorConfig`). It decays
lazily: observation ``i`` is stored with weight ``2**(stamp_i - origin)`` where ``stamp`` counts
half-lives, so nothing is rescaled per observation; the origin moves (and negligible depths are
dropped) only when weights would otherwise overflow. Shrinkage, for ``n`` the decayed (effective) observation count::

    P_pooled = (n_g * H_pooled + prior_strength * prior)    / (n_g + prior_strength)
    P_key    = (n_k * H_key    + key_strength   * P_pooled) / (n_k + key_strength)

so a new key gets the pooled estimate, an empty estimator the prior, and a key with many recent
observations essentially its own history.

None of these is thread-safe; the cache (or planner) that owns one serialises calls.
"""

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
    """``P(d) ∝ q**d`` on ``0..N``: short shared prefixes (system prompts) more likely than long ones.

    Attributes:
        mean_frac: mean of the untruncated geometric law as a fraction of ``N`` (``q/(1-q) = mean_frac*N``).
    """

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
    """Cold-start ``P(d)`` for a sequence of ``N`` tokens.

    Attributes:
        end_mass: probability of a full overlap ``d = N`` (a multi-turn continuation re-reads the
            whole sequence).
        spread: how the remaining ``1 - end_mass`` is spread over ``0..N``.
    """

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
    """Depth -> decayed weight, stored relative to ``origin`` (in half-lives).

    ``weights[d] = sum over observations i at d of 2**(stamp_i - origin)``; the weight an
    observation has *now* is ``2**(stamp_i - now)``, so ``effective_count(now) = total * 2**(origin - now)``.
    With ``max_depths``, one depth too many merges the lightest into its shallower neighbour (the
    deeper one for the shallowest depth): mass moved shallower is still served by a checkpoint there.
    """

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
        lightest = min(depths, key=lambda d: (self.weights[d], -d))
        i = depths.index(lightest)
        into = depths[i - 1] if i > 0 else depths[1]
        self.weights[into] += self.weights.pop(lightest)

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
    """``(n * hist + strength * base) / (n + strength)`` with ``n`` the effective count; ``base`` if ``n == 0``."""
    n_eff = hist.effective_count(now)
    if n_eff <= 0:
        return base
    return (n_eff * hist.distribution(length) + strength * base) / (n_eff + strength)


# ================================================================================= opaque key
@dataclass(frozen=True, slots=True)
class EstimatorConfig:
    """How fast estimates forget and how strongly they shrink towards the fallbacks.

    Attributes:
        prior: cold-start distribution.
        half_life_obs: an observation's weight halves after this many later observations of the same
            key (of any key, for the global estimate); ``inf`` = no count decay.
        half_life_s: ... and after this many clock seconds; ``inf`` = no time decay (needs a clock).
        prior_strength: pseudo-observations of the prior in the global estimate (> 0 keeps a cold
            estimator equal to the prior and every depth's probability from collapsing early).
        global_strength: pseudo-observations of the global estimate in a key's estimate.
    """

    prior: OverlapPrior = field(default_factory=OverlapPrior)
    half_life_obs: float = math.inf
    half_life_s: float = math.inf
    prior_strength: float = 4.0
    global_strength: float = 8.0

    def __post_init__(self) -> None:
        _check_decay(self, ("prior_strength", "global_strength"))


class OverlapEstimator:
    """Per-key, drift-following estimate of the overlap-depth distribution, with fallbacks.

    Depths are absolute token counts; asking for a sequence of length ``N`` clips deeper
    observations to ``N`` (a request cannot overlap a sequence past its end). The prior is relative
    to ``N``. Memory is one small dict per key: call :meth:`forget` when the keyed sequence leaves
    the cache.
    """

    def __init__(self, config: EstimatorConfig | None = None, *, clock: Callable[[], float] | None = None) -> None:
        """
        Args:
            config: decay, prior and blending settings (defaults: no decay, uniform+end prior).
            clock: seconds, e.g. the simulator's trace time or ``time.monotonic``; required iff
                ``config.half_life_s`` is finite.
        """
        self.config = config or EstimatorConfig()
        if math.isfinite(self.config.half_life_s) and clock is None:
            raise ValueError("half_life_s is finite: pass a clock")
        self._clock = clock
        self._by_key: dict[Hashable, _DecayedHistogram] = {}
        self._global = _DecayedHistogram()

    # ----------------------------------------------------------------------------- updates
    def observe(self, key: Hashable, depth: int) -> None:
        """Record that a request overlapped the sequence under ``key`` to ``depth`` tokens (``>= 0``)."""
        if depth < 0:
            raise ValueError(f"depth must be >= 0, got {depth}")
        hist = self._by_key.setdefault(key, _DecayedHistogram())
        seconds = self._time_stamp()
        hist.add(int(depth), hist.num_observations / self.config.half_life_obs + seconds)
        self._global.add(int(depth), self._global.num_observations / self.config.half_life_obs + seconds)

    def forget(self, key: Hashable) -> None:
        """Drop a key's own history (the global estimate keeps its contribution). No-op if unknown."""
        self._by_key.pop(key, None)

    def num_depths(self, key: Hashable) -> int:
        """Distinct depths ``key``'s own history holds (its memory; decayed weights drop out)."""
        hist = self._by_key.get(key)
        return 0 if hist is None else len(hist.weights)

    # ----------------------------------------------------------------------------- estimates
    def depth_weights(self, key: Hashable, seq_len: int) -> FloatArray:
        """``(seq_len+1,)`` estimated ``P(d)`` for ``d = 0..seq_len`` under ``key``; sums to 1.

        Ready for :func:`marconi.sparse.dp.place_checkpoints`.
        """
        base = self.global_depth_weights(seq_len)
        hist = self._by_key.get(key)
        if hist is None:
            return base
        return _blend(hist, self._now_stamp(hist), base, self.config.global_strength, seq_len)

    def observed_depths(self, key: Hashable) -> IntArray:
        """Sorted distinct depths observed under ``key`` or globally (the support of the data,
        without the prior's spread): where an optimal checkpoint can sit for observed overlaps."""
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
    """``(n+1,)`` keys: ``[d]`` names the prefix ``tokens[:d]`` (``[0] == 0``, the root).

    ``key[d] = sum_{i<d} (tokens[i] + 1) * B**i mod 2**64``: one numpy pass (uint64 arithmetic wraps).
    Two prefixes of the same depth collide with probability about ``2**-64`` per pair for the
    token sequences caches see; keys are always paired with their depth.
    """
    t = np.asarray(tokens).astype(np.uint64) + np.uint64(1)
    with np.errstate(over="ignore"):
        terms = t * _powers(t.size)
        return np.concatenate((np.zeros(1, dtype=np.uint64), np.cumsum(terms, dtype=np.uint64)))


def _relative_prior() -> OverlapPrior:
    return OverlapPrior(end_mass=0.0)


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
        _check_decay(self, ("prior_strength", "node_strength"))
        if self.max_nodes < 1 or self.max_depths < 2:
            raise ValueError(f"max_nodes must be >= 1 and max_depths >= 2, got {self.max_nodes}, {self.max_depths}")

    @property
    def max_pairs(self) -> int:
        """The memory bound: (depth, weight) pairs the estimator may hold (nodes, root and pool)."""
        return (self.max_nodes + 2) * self.max_depths


class _NodeStats:
    """One known tree node: its depth, histogram and the snapshot its territory was placed with."""

    __slots__ = ("depth", "hist", "placed")

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.hist = _DecayedHistogram()
        self.placed: dict[int, float] | None = None   # own normalised histogram at the last placement


def _total_variation(a: dict[int, float], b: dict[int, float]) -> float:
    return 0.5 * sum(abs(a.get(d, 0.0) - b.get(d, 0.0)) for d in a.keys() | b.keys())


class TreeOverlapEstimator:
    """Overlap depths per radix-tree node, relative to the node, composed along a token path.

    Where a request leaves the cached tree is a node of the tree (its *attach node*, at depth
    ``kv_hit_len``): the sequence it inserts hangs below that node. Per node (up to ``max_nodes``)
    this keeps a histogram of how far requests that reached the node went past it -- *relative*
    depths ``hit_len - node_depth`` -- and composes the histograms of the nodes on a path into
    the distribution ``P(d)`` the placement DP consumes.

    Keys. A node is named by the tokens it spells from the root: ``(depth, path_keys(tokens)[depth])``.
    Every request passing through the node computes the same key, so the estimate survives the
    tree's edge splits, evictions and re-insertions, and the policy needs no handle on the tree.

    Observing. A request with KV hit ``h`` records ``h - depth`` at every known node on its path at
    depth ``<= h`` (:meth:`observe`); the deepest one also feeds the pooled histogram (what a *new*
    node's estimate starts from). The request's attach node is then registered (:meth:`attach`).

    Composing. For a sequence of ``n`` tokens with known nodes ``a_1 < ... < a_k`` on its path (the
    root is always one), node ``j`` owns the territory ``[a_j, a_{j+1})``; a request reaching ``a_j``
    stops inside it with ``P_j(d - a_j)`` and goes on with the tail mass ``P_j(>= a_{j+1} - a_j)``::

        w(d) = reach_j * P_j(d - a_j)  for a_j <= d < a_{j+1},   reach_{j+1} = reach_j * P_j(>= a_{j+1} - a_j)

    with the last territory ending at ``n`` (deeper overlaps clipped to ``n``). ``P_j`` is the node's
    histogram shrunk towards the pooled one, which is shrunk towards the prior (uniform over the
    relative depths ``0..n - a_j`` by default, with no point mass at the end: Marconi's last-token
    checkpoint serves continuations).

    Memory. At most ``max_nodes`` nodes besides the root (one more evicts the least recently
    observed, attached or composed) of at most ``max_depths`` relative depths each: at most
    ``(max_nodes + 2) * max_depths`` (depth, weight) pairs whatever the trace's length.

    Drift. Each node remembers its own normalised histogram as of its territory's last placement;
    :meth:`drift` is the total-variation distance between that snapshot and the histogram now.
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
    """Memory bound and forgetting of :class:`BlockOverlapEstimator`.

    Attributes:
        max_keys: block hashes remembered (LRU: a lookup touches the shared ones, the oldest go
            first); 65,536 blocks are about 25M tokens at vLLM's 384-token hybrid block.
        max_anchors: anchors with a histogram of their own (LRU), and separately branch points
            (blocks right after which requests left the tree) with a count of their own (LRU).
        max_bins: distinct relative depths per histogram; past it the lightest bin goes.
        decay: every observation multiplies a histogram's weights by this first (count decay:
            the effective sample is at most ``1 / (1 - decay)``, 50 at 0.98).
        prior: pseudo-count of the global histogram in an anchor's blend (its own observations
            dominate once it has a few).
    """

    max_keys: int = 1 << 16
    max_anchors: int = 4096
    max_bins: int = 64
    decay: float = 0.98
    prior: float = 1.0

    def __post_init__(self) -> None:
        if min(self.max_keys, self.max_anchors, self.max_bins) < 1:
            raise ValueError("max_keys, max_anchors and max_bins must be >= 1")
        if not 0 < self.decay <= 1 or not self.prior >= 0:
            raise ValueError(f"decay must be in (0, 1] and prior >= 0, got {self.decay}, {self.prior}")


class _BlockHistogram:
    """Decayed weights of relative divergence depths (in blocks), at most ``max_bins`` of them.

    Decays eagerly (every observation multiplies the others by ``decay``) and drops, not merges,
    the lightest bin: vLLM's retention results are pinned with this arithmetic, not the half-life one.
    """

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
    """Where future requests will diverge from a sequence, learnt from the requests seen, by block path.

    ``keys[j]`` is block ``j``'s hash and names the whole prefix of ``j + 1`` blocks (vLLM's block
    hashes chain their parent). Keyed by the radix tree itself, not by a token window: every block
    hash a sequence brings first is *owned* by it, with the sequence's *novelty start* ``h`` (its overlap, in blocks, with
    what was seen before it) and its *anchor* (the hash of its last shared block: its branch point
    in the tree; ``None`` for the root). A new request's overlap ``d`` (leading blocks seen) ends in
    a block some earlier sequence owns; ``d - h_owner`` (>= 1) is the observation, added to the
    owner's anchor's histogram. Depths are relative to the node, so one document's length does not
    land at another document's offset. A node with few observations of its own borrows from the
    global histogram of *absolute* depths ``d`` (where requests diverged, counted from the root),
    restricted to depths past the sequence's novelty start: sequences of one shape (questions at
    the same depths of same-length documents) share a prior, and a node's own evidence takes over
    as it accumulates.

    Every observation also counts one more request at its *branch point*, the block ``keys[d - 1]``
    the request left the tree after. A later sequence passing through that block learns exactly
    where along its own known prefix requests diverged (:meth:`path_distribution`), whatever the
    documents' lengths; counts decay by ``decay`` at each observation of the same branch point.

    Memory is bounded by :class:`BlockEstimatorConfig`. Deterministic: the same keys in the same order
    give the same state.
    """

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
        """A new sequence's leading block hashes (one per block, in order): record its divergence
        and take ownership of its new blocks. Returns its anchor and novelty start ``h`` (blocks)."""
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
        """Unnormalised weights of relative depths past ``start``: the anchor's own decayed counts
        plus ``prior`` pseudo-counts of the global absolute depths past ``start`` (one pseudo-count
        when the anchor has none of its own)."""
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
        """Relative divergence depth (blocks, >= 1) -> probability for a sequence anchored at
        ``anchor`` with novelty start ``start``: its anchor's histogram blended with the global
        absolute depths past ``start`` (shifted by it; ``prior`` pseudo-counts of them); empty
        when neither has anything."""
        return _normalised(self._tail(anchor, start))

    def path_distribution(self, keys: Sequence[Hashable], anchor: Hashable | None, start: int) -> dict[int, float]:
        """Absolute divergence depth (blocks, >= 1) -> probability over the whole sequence whose
        block hashes are ``keys`` (``anchor`` and ``start``: what :meth:`observe` returned for it).

        Up to ``start`` the sequence spells a known path and the evidence there is exact: every
        branch point on it (a block right after which earlier requests left the path), weighted
        by its decayed count of those requests. Past ``start``, where no request has been, the
        relative estimate of :meth:`distribution` with its own mass (the anchor's counts plus the
        prior's pseudo-count), shifted by ``start``: a sequence with no branch point on its path
        gets :meth:`distribution` exactly. Touches the branch points it reads (their LRU order).

        Why both: a request that recomputes a known prefix (the cache evicted it; the estimator
        remembers it) is the one chance to keep a state where that prefix's siblings diverge."""
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
    """``(K+1,)`` total weight per candidate interval ``[0,p_1), [p_1,p_2), ..., [p_K, N]``.

    ``depth_weights`` is over depths ``0..N``; ``candidates`` are distinct positions in ``[1, N]``
    (any order, sorted here). A depth ``d`` counts for the interval it falls in, so interval ``k``
    is exactly the set of requests that resume from ``p_k`` if ``p_k`` and ``p_{k+1}`` are stored.
    """
    w = np.asarray(depth_weights, dtype=np.float64)
    cand = validate_positions(candidates, seq_len=w.size - 1)
    edges = np.concatenate(([0], cand, [w.size]))
    return np.diff(np.concatenate(([0.0], np.cumsum(w)))[edges])


def binned_depth_weights(depth_weights: ArrayLike, candidates: ArrayLike) -> FloatArray:
    """``(N+1,)`` weights with each candidate interval's mass moved to its left end (``0`` or ``p_k``).

    For a potential cost (tokens, FLOPs) the optimal placement on these weights is optimal on the
    original ones: every placement's expected cost shifts by the same constant (see
    :mod:`marconi.sparse.dp`). Use it when only interval masses are known or to shrink the DP input.
    """
    w = np.asarray(depth_weights, dtype=np.float64)
    cand = validate_positions(candidates, seq_len=w.size - 1)
    out = np.zeros_like(w)
    out[np.concatenate(([0], cand))] = bin_depths(w, cand)
    return out
