"""Online estimate of the overlap-depth distribution ``P(d)`` that the placement DP consumes.

A cache observes, for each request that reaches a cached sequence, how deep the request's tokens
match it (its overlap depth). :class:`OverlapEstimator` keeps, per caller-chosen key (the radix node
id of the sequence's first branch, a session id, ...), a histogram of those depths in which each
observation's weight halves every ``half_life_obs`` observations of that key and every
``half_life_s`` seconds of the injected clock -- so the estimate follows drift. Estimates shrink
towards a pooled global histogram, which shrinks towards a cold-start prior, each by pseudo-counts::

    P_global = (n_g * H_global + prior_strength * prior)   / (n_g + prior_strength)
    P_key    = (n_k * H_key    + global_strength * P_global) / (n_k + global_strength)

with ``n`` the decayed (effective) observation count. A new key therefore gets the global estimate,
an empty estimator the prior, and a key with many recent observations essentially its own history.

Depths are absolute token counts; asking for a sequence of length ``N`` clips deeper observations
to ``N`` (a request cannot overlap a sequence past its end). The prior is relative to ``N``.

Decay is lazy (the cachetools habit): observation ``i`` is stored with weight ``2**(stamp_i - origin)``
where ``stamp`` counts half-lives, so nothing is rescaled per observation; the origin moves (and
negligible depths are dropped) only when weights would otherwise overflow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Hashable, Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray

from marconi.sparse.dp import IntArray, validate_positions

__all__ = [
    "EstimatorConfig",
    "GeometricSpread",
    "OverlapEstimator",
    "OverlapPrior",
    "UniformSpread",
    "bin_depths",
    "binned_depth_weights",
]

FloatArray = NDArray[np.float64]

# Move the weight origin once stored weights reach 2**_REBASE_HALF_LIVES (float64 tops out near 2**1023).
_REBASE_HALF_LIVES = 256.0
# On a rebase, drop depths holding less than this fraction of the total weight (bounds memory).
_PRUNE_FRACTION = 1e-15


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


# ================================================================================= config
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
        for name in ("half_life_obs", "half_life_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 (inf for no decay), got {getattr(self, name)}")
        for name in ("prior_strength", "global_strength"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be finite and >= 0, got {value}")


# ================================================================================= histogram
class _DecayedHistogram:
    """Depth -> decayed weight, stored relative to ``origin`` (in half-lives).

    ``weight_by_depth[d] = sum over observations i at d of 2**(stamp_i - origin)``; the weight an
    observation has *now* is ``2**(stamp_i - now)``, so ``effective_count(now) = total * 2**(origin - now)``.
    """

    __slots__ = ("weight_by_depth", "total", "origin", "num_observations")

    def __init__(self) -> None:
        self.weight_by_depth: dict[int, float] = {}
        self.total = 0.0
        self.origin = 0.0
        self.num_observations = 0

    def add(self, depth: int, stamp: float) -> None:
        if stamp - self.origin > _REBASE_HALF_LIVES:
            self._rebase(stamp)
        weight = 2.0 ** (stamp - self.origin)
        self.weight_by_depth[depth] = self.weight_by_depth.get(depth, 0.0) + weight
        self.total += weight
        self.num_observations += 1

    def _rebase(self, new_origin: float) -> None:
        factor = 2.0 ** (self.origin - new_origin)
        floor = _PRUNE_FRACTION * self.total * factor
        self.weight_by_depth = {d: w * factor for d, w in self.weight_by_depth.items() if w * factor > floor}
        self.total = math.fsum(self.weight_by_depth.values())
        self.origin = new_origin

    def effective_count(self, now: float) -> float:
        return self.total * 2.0 ** (self.origin - now) if self.total > 0 else 0.0

    def distribution(self, seq_len: int) -> FloatArray:
        """``(seq_len+1,)`` normalised histogram, depths beyond ``seq_len`` counted at ``seq_len``."""
        depths = np.fromiter(self.weight_by_depth.keys(), dtype=np.int64, count=len(self.weight_by_depth))
        weights = np.fromiter(self.weight_by_depth.values(), dtype=np.float64, count=len(self.weight_by_depth))
        hist = np.bincount(np.minimum(depths, seq_len), weights=weights, minlength=seq_len + 1)
        return hist / hist.sum()

    def check_invariants(self) -> None:
        assert all(w > 0 and math.isfinite(w) for w in self.weight_by_depth.values()), "weights must be > 0"
        assert all(d >= 0 for d in self.weight_by_depth), "depths must be >= 0"
        recomputed = math.fsum(self.weight_by_depth.values())
        assert math.isclose(self.total, recomputed, rel_tol=1e-9, abs_tol=1e-300), (self.total, recomputed)
        assert (self.total > 0) == (self.num_observations > 0), "weight without observations or vice versa"


# ================================================================================= estimator
class OverlapEstimator:
    """Per-key, drift-following estimate of the overlap-depth distribution, with fallbacks.

    Not thread-safe; the cache that owns it serialises calls. Memory is one small dict per key:
    call :meth:`forget` when the keyed sequence leaves the cache.
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
        return 0 if hist is None else len(hist.weight_by_depth)

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
        depths = set(self._global.weight_by_depth)
        hist = self._by_key.get(key)
        if hist is not None:
            depths.update(hist.weight_by_depth)
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


def _blend(hist: _DecayedHistogram, now: float, base: FloatArray, strength: float, seq_len: int) -> FloatArray:
    """``(n * hist + strength * base) / (n + strength)`` with ``n`` the effective count; ``base`` if ``n == 0``."""
    n_eff = hist.effective_count(now)
    if n_eff <= 0:
        return base
    return (n_eff * hist.distribution(seq_len) + strength * base) / (n_eff + strength)


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
