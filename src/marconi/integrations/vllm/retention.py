"""Where on vLLM's block grid to keep a sequence's recurrent states: the sparse DP, constrained.

:func:`place_on_grid` places at most ``budget`` block boundaries beyond the fixed ones (resume point,
vLLM's junction, replay boundary) with the least expected recompute cost, exactly.
:class:`RetentionPlanner` is what ``MARCONI_VLLM_RETENTION=sparse-dp`` runs in the engine core and
``vllm-align:retention=sparse-dp`` in the emulation: one plan per request, weighed by
:class:`~marconi.sparse.overlap.BlockOverlapEstimator`. The derivation and measurements: docs/vllm.md,
"Sparse retention". Nothing here imports vLLM.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Hashable, Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from marconi.sparse.dp import TOKEN_COST, PotentialCost, checked_weights, flops_cost, place_checkpoints
from marconi.sparse.overlap import BlockEstimatorConfig, BlockOverlapEstimator

__all__ = ["GridPlacement", "grid_candidates", "place_on_grid", "brute_force_on_grid", "grid_expected_cost",
           "RetentionPlanner", "SPARSE_DP", "DEFAULT_BUDGET"]

#: The value of ``MARCONI_VLLM_RETENTION`` / ``vllm-align:retention=`` that selects DP placement.
SPARSE_DP = "sparse-dp"
#: Boundaries placed per sequence beyond the fixed ones, unless configured.
DEFAULT_BUDGET = 2

FloatArray = NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class GridPlacement:
    """The boundaries to keep beyond the fixed ones, and what they buy.

    Attributes:
        positions: chosen block boundaries (token positions, multiples of the block), ascending.
        expected_cost: ``E[cost(c(d), d)]`` with the fixed and chosen boundaries, weights normalised.
        baseline_cost: the same with the fixed boundaries alone (what vLLM's retention 0 keeps).
    """

    positions: tuple[int, ...]
    expected_cost: float
    baseline_cost: float


def grid_candidates(seq_len: int, block_size: int, fixed: Sequence[int] = ()) -> list[int]:
    """Block boundaries in ``[1, seq_len]`` that are not already kept."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    kept = set(fixed)
    return [p for p in range(block_size, seq_len + 1, block_size) if p not in kept]


def _checked(weights: ArrayLike, block_size: int, fixed: Sequence[int], budget: int) -> tuple[FloatArray, list[int]]:
    w = checked_weights(weights)            # ValueError on bad weights; scaled so the sum cannot overflow
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    n = w.size - 1
    bad = [f for f in fixed if not (0 < f <= n) or f % block_size]
    if bad:
        raise ValueError(f"fixed boundaries must be block multiples in [1, {n}], got {bad}")
    return w / w.sum(), sorted(set(fixed))


def grid_expected_cost(weights: ArrayLike, kept: Sequence[int], *, cost: PotentialCost = TOKEN_COST) -> float:
    """``E[cost(c(d), d)]`` under ``weights`` (normalised) with states at ``kept`` (and 0)."""
    w = checked_weights(weights)
    w = w / w.sum()
    depths = np.flatnonzero(w)
    stored = np.array(sorted({0, *kept}), dtype=np.int64)
    resume = stored[np.searchsorted(stored, depths, side="right") - 1]
    return float(np.dot(w[depths], cost(resume, depths)))


def _shifted(cost: PotentialCost, origin: int) -> PotentialCost:
    """``cost`` in a segment's own coordinates: position ``x`` there is ``origin + x`` in the sequence."""
    return PotentialCost(f"{cost.name}@{origin}", lambda x: cost.potential(x + origin))


def place_on_grid(weights: ArrayLike, *, block_size: int, fixed: Sequence[int] = (), budget: int,
                  cost: PotentialCost = TOKEN_COST) -> GridPlacement:
    """The placement of at most ``budget`` block boundaries beyond ``fixed`` with the least
    ``E[cost(c(d), d)]``, exactly; ties go to fewer states. Raises ValueError on bad weights.

    Args:
        weights: ``(N+1,)`` non-negative weights of future overlap depths ``0..N`` with this sequence.
        block_size: vLLM's Mamba block (tokens); candidates are its multiples in ``[1, N]``.
        fixed: boundaries kept anyway (resume point, junction, replay boundary), block multiples.
        cost: the recompute cost; its potential must be non-decreasing.
    """
    w, kept = _checked(weights, block_size, fixed, budget)
    n = w.size - 1
    # past the candidates another state buys nothing: the curves and their convolution stop there
    budget = min(budget, len(grid_candidates(n, block_size, kept)))
    cuts = [0, *kept, n + 1]
    curves: list[list[float]] = []          # per segment: least cost with at most m added, m = 0..budget
    plans: list[list[tuple[int, ...]]] = []
    for lo, hi in zip(cuts, cuts[1:]):
        seg = w[lo:hi]                      # depths lo .. hi-1, relative 0 .. hi-lo-1
        cands = [p - lo for p in range(block_size, n + 1, block_size) if lo < p < hi]
        if seg.sum() <= 0 or not cands or budget == 0:
            base = 0.0 if seg.sum() <= 0 else float(np.dot(seg, _shifted(cost, lo)(0, np.arange(seg.size))))
            curves.append([base] * (budget + 1))
            plans.append([()] * (budget + 1))
            continue
        mass = float(seg.sum())
        placed = place_checkpoints(seg, cands, budget, cost=_shifted(cost, lo))
        curves.append([mass * c for c in placed.cost_by_budget])
        plans.append([tuple(lo + p for p in ps) for ps in placed.positions_by_budget])
    # min-plus convolution of the curves, keeping the split
    best = curves[0][:]
    split: list[list[int]] = [[m] for m in range(budget + 1)]
    for curve in curves[1:]:
        new_best, new_split = [], []
        for m in range(budget + 1):
            options = [(best[m - k] + curve[k], k) for k in range(m + 1)]
            value, k = min(options, key=lambda o: (o[0], o[1]))
            new_best.append(value)
            new_split.append(split[m - k] + [k])
        best, split = new_best, new_split
    m = min(range(budget + 1), key=lambda b: (best[b] - best[-1] > 1e-12 * max(1.0, abs(best[-1])), b))
    positions = tuple(sorted(p for seg_plans, k in zip(plans, split[m]) for p in seg_plans[k]))
    return GridPlacement(positions=positions, expected_cost=grid_expected_cost(w, [*kept, *positions], cost=cost),
                         baseline_cost=grid_expected_cost(w, kept, cost=cost))


def brute_force_on_grid(weights: ArrayLike, *, block_size: int, fixed: Sequence[int] = (), budget: int,
                        cost: PotentialCost = TOKEN_COST) -> float:
    """The least expected cost over every placement of at most ``budget`` boundaries (small N only)."""
    w, kept = _checked(weights, block_size, fixed, budget)
    cands = grid_candidates(w.size - 1, block_size, kept)
    return min(grid_expected_cost(w, [*kept, *extra], cost=cost)
               for m in range(min(budget, len(cands)) + 1) for extra in itertools.combinations(cands, m))


# ====================================================================================== online
class RetentionPlanner:
    """Per request, the block boundaries to keep beyond vLLM's own: :meth:`plan` once (a preempted
    request keeps its plan), :meth:`stop` clips a prefill chunk at a planned boundary,
    :meth:`positions` feed the Mamba managers, :meth:`finish` drops the plan."""

    def __init__(self, *, block_size: int, budget: int, cost: PotentialCost = TOKEN_COST,
                 estimator: BlockEstimatorConfig = BlockEstimatorConfig()) -> None:
        if block_size <= 0 or budget < 0:
            raise ValueError(f"block_size must be > 0 and budget >= 0, got {block_size}, {budget}")
        self.block_size = block_size
        self.budget = budget
        self.cost = cost
        self.estimator = BlockOverlapEstimator(estimator)
        self._plans: dict[Hashable, tuple[int, ...]] = {}
        self.num_planned = 0
        self.num_placed = 0              # boundaries placed, summed over the plans made

    @classmethod
    def for_model(cls, spec: object, *, block_size: int, budget: int) -> "RetentionPlanner":
        """The planner with the model's prefill FLOPs as the recompute cost."""
        return cls(block_size=block_size, budget=budget, cost=flops_cost(spec))  # type: ignore[arg-type]

    def describe(self) -> dict[str, object]:
        return {"retention": SPARSE_DP, "budget": self.budget, "block_size": self.block_size, "cost": self.cost.name}

    def plan(self, request_id: Hashable, keys: Sequence[Hashable], *, num_prompt_tokens: int, resume: int,
             junction: int) -> tuple[int, ...]:
        """The request's boundaries (token positions, block multiples, ascending), made at its first call.

        ``keys``: the prompt's block hashes, one per full block. ``resume`` (its hit), ``junction``
        (vLLM's shared-prefix boundary, 0: none) and the replay boundary are floored to the grid
        and fixed. Depths at or below ``resume`` get no weight: the budget goes only where the
        request computes.
        """
        known = self._plans.get(request_id)
        if known is not None:
            return known
        anchor, start = self.estimator.observe(keys)
        positions = self._place(self.estimator.path_distribution(keys, anchor, start), num_prompt_tokens, resume, junction)
        self._plans[request_id] = positions
        self.num_planned += 1
        self.num_placed += len(positions)
        return positions

    def _place(self, dist: dict[int, float], n: int, resume: int, junction: int) -> tuple[int, ...]:
        b = self.block_size
        if not dist or self.budget == 0 or n < b:
            return ()
        weights = np.zeros(n + 1)
        for depth, p in dist.items():
            weights[min(depth * b, n)] += p
        weights[:resume + 1] = 0.0          # resumed from the hit whatever is placed
        if weights.sum() <= 0:
            return ()
        fixed = sorted({x // b * b for x in (resume, junction, n - 1) if 0 < x // b * b <= n})
        return place_on_grid(weights, block_size=b, fixed=fixed, budget=self.budget, cost=self.cost).positions

    def __contains__(self, request_id: Hashable) -> bool:
        """Whether ``request_id`` has a plan (made, not yet finished)."""
        return request_id in self._plans

    def positions(self, request_id: Hashable) -> tuple[int, ...]:
        return self._plans.get(request_id, ())

    def stop(self, request_id: Hashable, start: int, num_new_tokens: int) -> int:
        """``num_new_tokens`` clipped so the chunk from ``start`` ends at the first planned boundary inside it."""
        end = start + num_new_tokens
        for p in self._plans.get(request_id, ()):
            if start < p < end:
                return p - start
        return num_new_tokens

    def finish(self, request_id: Hashable) -> None:
        self._plans.pop(request_id, None)

    @property
    def num_open_plans(self) -> int:
        return len(self._plans)
