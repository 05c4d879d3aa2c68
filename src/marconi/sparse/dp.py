"""Exact sparse-checkpoint placement by dynamic programming over overlap depths.

Choose at most ``M`` of ``K`` candidate positions minimising ``E[cost(c(d), d)]`` (``c(d)``: the
deepest checkpoint ``<= d``) or ``E[cost] + lam * bytes * count``. The ``O(M K log K)`` Monge solver
runs where the quadrangle inequality holds (checked), else the ``O(M K^2)`` reference; both exact.
Derivation in docs/sparse.md ("The placement DP").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple, Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray

from marconi.core.model import ModelSpec

__all__ = [
    "Cost",
    "LagrangianPlacement",
    "Placement",
    "PotentialCost",
    "TOKEN_COST",
    "checked_weights",
    "expected_cost",
    "flops_cost",
    "place_checkpoints",
    "place_checkpoints_lagrangian",
    "place_checkpoints_reference",
    "satisfies_quadrangle_inequality",
    "segment_cost_matrix",
    "validate_positions",
]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

# Relative tolerance for "no better": a larger budget is used only if it beats a smaller one by more
# than this (so zero-mass segments never get a useless checkpoint from rounding noise).
_TIE_RTOL = 1e-12
# The most entries ``curve=True`` returns (a budget is otherwise unbounded: past the candidates the
# DP stops, but the curve keeps the contract's M + 1 entries).
_MAX_CURVE_ENTRIES = 1 << 20
# Relative slack allowed in the instance check of the quadrangle inequality (rounding only).
_QI_RTOL = 1e-12


# ================================================================================= costs
@dataclass(frozen=True, slots=True)
class PotentialCost:
    """A path-additive cost ``cost(c, d) = F(d) - F(c)``: O(1) segment costs, fast solver exact iff ``F``
    is non-decreasing at the candidates. ``potential``: vectorised ``F`` over positions."""

    name: str
    potential: Callable[[FloatArray], FloatArray]

    def __call__(self, start: ArrayLike, end: ArrayLike) -> FloatArray:
        start_f = np.asarray(start, dtype=np.float64)
        end_f = np.asarray(end, dtype=np.float64)
        return np.asarray(self.potential(end_f) - self.potential(start_f), dtype=np.float64)


def _token_potential(x: FloatArray) -> FloatArray:
    return x


TOKEN_COST = PotentialCost("tokens", _token_potential)
"""Plain token count: ``cost(c, d) = d - c``."""


def flops_cost(spec: ModelSpec) -> PotentialCost:
    """Prefill FLOPs of ``spec``: ``cost(c, d) = spec.span_flops(c, d) = F(d) - F(c)``, ``F = prefill_flops``."""
    return PotentialCost(f"flops:{spec.name}", spec.prefill_flops)


Cost = PotentialCost | Callable[[IntArray, IntArray], FloatArray]
"""A :class:`PotentialCost`, or any vectorised callable ``cost(c, d)`` over broadcastable int arrays
with ``cost(c, c) == 0``; it is only evaluated at ``c <= d``. Wrap a scalar function with
``np.vectorize``."""


# ================================================================================= results
@dataclass(frozen=True, slots=True)
class Placement:
    """The best placement for a budget (``positions``, ``expected_cost`` in cost units) and the curve:
    ``cost_by_budget[m]`` / ``positions_by_budget[m]`` for at most ``m`` checkpoints (fewest such);
    ``solver``: ``"monge-dc"`` or ``"reference"``."""

    positions: tuple[int, ...]
    expected_cost: float
    cost_by_budget: tuple[float, ...]
    positions_by_budget: tuple[tuple[int, ...], ...]
    solver: str

    @property
    def num_checkpoints(self) -> int:
        return len(self.positions)


class LagrangianPlacement(NamedTuple):
    """Minimiser of ``expected_cost + lam * checkpoint_bytes * len(positions)``."""

    positions: tuple[int, ...]
    expected_cost: float
    penalty: float      # lam * checkpoint_bytes * len(positions)
    objective: float    # expected_cost + penalty


# ================================================================================= instance
@dataclass(frozen=True, slots=True)
class _Instance:
    """Validated data: ``nodes`` = ``[0, p_1..p_K, N+1]``; positive-weight depths and masses summing to 1."""

    nodes: IntArray
    depths: IntArray
    masses: FloatArray

    @property
    def num_nodes(self) -> int:
        return int(self.nodes.size)

    @property
    def candidates(self) -> IntArray:
        return self.nodes[1:-1]


def _make_instance(weights: ArrayLike, positions: ArrayLike) -> _Instance:
    """Raises ValueError for bad weights (not real numbers, not 1-D, negative, non-finite, zero sum)
    or positions. Weights are scaled by their largest before they are summed, so finite weights
    whose sum would overflow still give their distribution."""
    w = checked_weights(weights)
    cand = validate_positions(positions, seq_len=w.size - 1)
    depths = np.flatnonzero(w).astype(np.int64)
    nodes = np.concatenate(([0], cand, [w.size])).astype(np.int64)
    return _Instance(nodes=nodes, depths=depths, masses=w[depths] / float(w.sum()))


def checked_weights(weights: ArrayLike) -> FloatArray:
    """``weights`` (over depths ``0..N``) as float64 scaled so their largest is 1: the same distribution,
    and a sum that cannot overflow. ValueError where they are not a non-empty 1-D array of real,
    finite, non-negative numbers with a positive sum."""
    raw = np.asarray(weights)
    if raw.dtype.kind not in "biuf":
        raise ValueError(f"weights must be real numbers, got an array of {raw.dtype}")
    w = raw.astype(np.float64)
    if w.ndim != 1 or w.size == 0:
        raise ValueError(f"weights must be a non-empty 1-D array over depths 0..N, got shape {w.shape}")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError("weights must be finite and non-negative")
    top = float(w.max())
    if top <= 0:
        raise ValueError("weights must have a positive sum")
    return w / top


def validate_positions(positions: ArrayLike, *, seq_len: int) -> IntArray:
    """Distinct integer positions in ``[1, seq_len]`` as ascending int64; ValueError otherwise."""
    raw = np.asarray(positions)
    if raw.size == 0:
        return np.zeros(0, dtype=np.int64)
    if raw.dtype.kind not in "biuf" or raw.dtype.kind == "f" and not np.all(np.isfinite(raw)):
        raise ValueError(f"positions must be a 1-D array of integers, got an array of {raw.dtype}")
    if raw.ndim != 1 or not (np.issubdtype(raw.dtype, np.integer) or np.all(raw == np.round(raw))):
        raise ValueError("positions must be a 1-D array of integers")
    cand = np.unique(raw.astype(np.int64))
    if cand.size != raw.size:
        raise ValueError("positions must be distinct")
    if cand[0] < 1 or cand[-1] > seq_len:
        raise ValueError(f"positions must lie in [1, N={seq_len}] (0 is the implicit start)")
    return cand


# ================================================================================= segment costs
class _Segments(Protocol):
    """Segment costs ``w(i, j) / scale`` between DP nodes (internally scaled to O(1))."""

    scale: float
    num_nodes: int

    def __call__(self, rows: IntArray, cols: IntArray) -> FloatArray:
        """``w(rows, cols) / scale`` elementwise; every ``rows < cols``."""
        ...

    def matrix(self) -> FloatArray:
        """Full ``(K+2, K+2)`` matrix, ``+inf`` where ``i >= j``."""
        ...

    def satisfies_qi(self) -> bool:
        """Whether the quadrangle inequality holds on this instance (the fast solver's precondition)."""
        ...


class _PotentialSegments:
    """O(1) segment costs of a potential cost from prefix sums of ``P`` and ``P * F``."""

    __slots__ = ("scale", "num_nodes", "_f_rows", "_mass_before", "_mf_before")

    def __init__(self, inst: _Instance, cost: PotentialCost) -> None:
        f_rows = np.asarray(cost.potential(inst.nodes[:-1].astype(np.float64)), dtype=np.float64)
        f_depths = np.asarray(cost.potential(inst.depths.astype(np.float64)), dtype=np.float64)
        if not (np.all(np.isfinite(f_rows)) and np.all(np.isfinite(f_depths))):
            raise ValueError(f"cost {cost.name!r}: potential is not finite at some position")
        # Scale F to O(1): FLOP potentials reach 1e16 and the prefix sums subtract nearby values.
        scale = float(max(np.abs(f_rows).max(), np.abs(f_depths).max(initial=0.0)))
        self.scale = scale if scale > 0 else 1.0
        self._f_rows = f_rows / self.scale
        first_at = np.searchsorted(inst.depths, inst.nodes, side="left")  # depths < node position
        self._mass_before = np.concatenate(([0.0], np.cumsum(inst.masses)))[first_at]
        mf = inst.masses * (f_depths / self.scale)
        self._mf_before = np.concatenate(([0.0], np.cumsum(mf)))[first_at]
        self.num_nodes = inst.num_nodes

    def __call__(self, rows: IntArray, cols: IntArray) -> FloatArray:
        return (self._mf_before[cols] - self._mf_before[rows]
                - self._f_rows[rows] * (self._mass_before[cols] - self._mass_before[rows]))

    def matrix(self) -> FloatArray:
        n = self.num_nodes
        rows, cols = np.triu_indices(n, k=1)
        out = np.full((n, n), np.inf)
        out[rows, cols] = self(rows, cols)
        return out

    def prefix_lists(self) -> tuple[list[float], list[float], list[float]]:
        """``(mf_before, mass_before, f_rows)`` as Python lists (scalar loops index them fast)."""
        return self._mf_before.tolist(), self._mass_before.tolist(), self._f_rows.tolist() + [0.0]

    def satisfies_qi(self) -> bool:
        # Exact for potentials: the QI bracket is F(p_b) - F(p_a) over row nodes a < b.
        return bool(np.all(np.diff(self._f_rows) >= 0))


class _MatrixSegments:
    """Segment costs of an arbitrary callable, tabulated in ``O(K * #depths)``."""

    __slots__ = ("scale", "num_nodes", "_w")

    def __init__(self, inst: _Instance, cost: Callable[[IntArray, IntArray], FloatArray]) -> None:
        self._w = _tabulate_segments(inst, cost)
        self.scale = 1.0
        self.num_nodes = inst.num_nodes

    def __call__(self, rows: IntArray, cols: IntArray) -> FloatArray:
        return self._w[rows, cols]

    def matrix(self) -> FloatArray:
        return self._w

    def satisfies_qi(self) -> bool:
        return satisfies_quadrangle_inequality(self._w)


def _tabulate_segments(inst: _Instance, cost: Callable[[IntArray, IntArray], FloatArray]) -> FloatArray:
    """``w[i, j]`` (``+inf`` if ``i >= j``); ValueError unless cost is finite, ``cost(c, c) == 0``."""
    n = inst.num_nodes
    first_at = np.searchsorted(inst.depths, inst.nodes, side="left")
    w = np.full((n, n), np.inf)
    for i in range(n - 1):  # one vectorised row per start node: K rows of O(#depths)
        lo = first_at[i]
        span = inst.depths[lo:]
        vals = inst.masses[lo:] * np.asarray(cost(np.full(span.size, inst.nodes[i]), span), dtype=np.float64)
        if not np.all(np.isfinite(vals)):
            raise ValueError(f"cost is not finite for some (c={inst.nodes[i]}, d) with c <= d")
        w[i, i + 1:] = np.concatenate(([0.0], np.cumsum(vals)))[first_at[i + 1:] - lo]
    _check_zero_diagonal(inst, cost, w)
    return w


def _check_zero_diagonal(inst: _Instance, cost: Callable[[IntArray, IntArray], FloatArray],
                         w: FloatArray) -> None:
    """``cost(c, c) == 0`` (up to rounding): a request ending at a checkpoint recomputes nothing."""
    pts = inst.nodes[:-1]
    diag = np.asarray(cost(pts, pts), dtype=np.float64)
    finite = w[np.isfinite(w)]
    ref = max(1.0, float(np.abs(finite).max(initial=0.0)))
    if not np.all(np.abs(diag) <= 1e-9 * ref):
        raise ValueError("cost(c, c) must be 0 at every candidate position")


def _segments_for(inst: _Instance, cost: Cost) -> _Segments:
    if isinstance(cost, PotentialCost):
        return _PotentialSegments(inst, cost)
    return _MatrixSegments(inst, cost)


def segment_cost_matrix(weights: ArrayLike, positions: ArrayLike, *, cost: Cost = TOKEN_COST) -> FloatArray:
    """The DP's segment costs ``w`` over nodes ``[0, *sorted(positions), N+1]`` (``+inf`` for ``i >= j``),
    in cost units. For analysis and tests."""
    seg = _segments_for(_make_instance(weights, positions), cost)
    return seg.matrix() * seg.scale


def satisfies_quadrangle_inequality(w: FloatArray, *, rtol: float = _QI_RTOL) -> bool:
    """Whether ``w(a,c) + w(b,d) <= w(a,d) + w(b,c)`` for all ``a < b < c < d`` (up to ``rtol``), via the
    adjacent 2x2 inequalities, which sum to every quadruple."""
    n = w.shape[0]
    if n < 4:
        return True
    finite = w[np.isfinite(w)]
    slack = rtol * max(float(np.abs(finite).max(initial=0.0)), np.finfo(float).tiny)
    rows, cols = np.triu_indices(n - 1, k=2)
    lhs = w[rows, cols] + w[rows + 1, cols + 1]
    rhs = w[rows, cols + 1] + w[rows + 1, cols]
    return bool(np.all(lhs <= rhs + slack))


# ================================================================================= DP layers
def _layers_reference(seg: _Segments, num_layers: int) -> tuple[FloatArray, IntArray]:
    """``O(K^2)``-per-layer min-plus: ``exact[m]`` costs and ``parents[t, j]``."""
    w = seg.matrix()                                  # (K+2, K+2), +inf where i >= j
    n = w.shape[0]
    dist = np.full(n, np.inf)
    dist[0] = 0.0
    parents = np.zeros((num_layers + 1, n), dtype=np.int64)
    exact = np.empty(num_layers)
    for t in range(1, num_layers + 1):
        cand = dist[:, None] + w                      # (i, j): reach i in t-1 edges, then edge i -> j
        parents[t] = np.argmin(cand, axis=0)
        dist = cand[parents[t], np.arange(n)]
        exact[t - 1] = dist[-1]
    return exact, parents


def _layers_monge(seg: _Segments, num_layers: int) -> tuple[FloatArray, IntArray]:
    """Same output as :func:`_layers_reference`, ``O(K log K)`` per layer; needs the QI (module doc)."""
    n = seg.num_nodes
    dist = np.full(n, np.inf)
    dist[0] = 0.0
    parents = np.zeros((num_layers + 1, n), dtype=np.int64)
    exact = np.empty(num_layers)
    for t in range(1, num_layers + 1):
        dist, parents[t] = _column_minima(dist, seg)
        exact[t - 1] = dist[-1]
    return exact, parents


def _column_minima(prev: FloatArray, seg: _Segments) -> tuple[FloatArray, IntArray]:
    """``best[j] = min_{i<j} prev[i] + w(i, j)`` and a leftmost argmin (``best[0] = inf``), by divide and
    conquer on monotone argmins, one recursion level per numpy pass."""
    n = prev.size
    best = np.full(n, np.inf)
    arg = np.zeros(n, dtype=np.int64)
    j_lo, j_hi = np.array([1]), np.array([n - 1])
    i_lo, i_hi = np.array([0]), np.array([n - 2])
    while j_lo.size and n > 1:
        mid = (j_lo + j_hi) // 2
        counts = np.minimum(i_hi, mid - 1) - i_lo + 1                 # >= 1 by the invariant
        starts = np.cumsum(counts) - counts
        owner = np.repeat(np.arange(mid.size), counts)                  # sub-problem of each flat row
        flat = np.arange(owner.size)
        rows = i_lo[owner] + (flat - starts[owner])
        vals = prev[rows] + seg(rows, mid[owner])
        col_min = np.minimum.reduceat(vals, starts)
        first = np.minimum.reduceat(np.where(vals == col_min[owner], flat, owner.size), starts)
        opt = rows[first]
        best[mid], arg[mid] = col_min, opt
        left, right = mid > j_lo, mid < j_hi
        j_lo, j_hi, i_lo, i_hi = (np.concatenate((j_lo[left], mid[right] + 1)),
                                  np.concatenate((mid[left] - 1, j_hi[right])),
                                  np.concatenate((i_lo[left], opt[right])),
                                  np.concatenate((opt[left], i_hi[right])))
    return best, arg


def _backtrack(parents: IntArray, num_edges: int, nodes: IntArray) -> tuple[int, ...]:
    """Checkpoint positions on the best ``num_edges``-edge path to the terminal node."""
    path = []
    node = nodes.size - 1
    for t in range(num_edges, 0, -1):
        node = int(parents[t, node])
        path.append(node)
    assert path[-1] == 0, "a DP path must start at node 0"
    return tuple(int(nodes[i]) for i in reversed(path[:-1]))


def _best_counts(exact: FloatArray, max_checkpoints: int) -> list[int]:
    """For each budget ``m``, the fewest checkpoints whose exact cost is within rounding of the best."""
    finite = exact[np.isfinite(exact)]
    slack = _TIE_RTOL * max(float(np.abs(finite).max(initial=0.0)), np.finfo(float).tiny)
    choice, best = [], 0
    for m in range(max_checkpoints + 1):
        if m < exact.size and exact[m] < exact[best] - slack:
            best = m
        choice.append(best)
    return choice


def _solve_budgeted(inst: _Instance, seg: _Segments, cost: Cost, max_checkpoints: int,
                    use_monge: bool, curve: bool = True) -> Placement:
    requested = _check_budget(max_checkpoints)
    if curve and requested >= _MAX_CURVE_ENTRIES:
        raise ValueError(f"max_checkpoints={requested:,} with curve=True asks for {requested + 1:,} curve entries; "
                         f"pass curve=False (any budget), or a budget of at most the number of candidates "
                         f"({int(inst.candidates.size):,}): the curve is flat past it")
    # No placement holds more checkpoints than there are candidates, so every budget past K has
    # budget K's answer: the DP, the tie-breaking and the re-scoring run to K at most, whatever
    # the budget (a budget of 10**9 once built a 10**9-entry list: MemoryError).
    top = min(requested, int(inst.candidates.size))
    num_layers = top + 1                                              # m + 1 edges for m checkpoints
    layers = _layers_monge if use_monge else _layers_reference
    exact, parents = layers(seg, num_layers)
    by_budget, costs = [], []
    counts = _best_counts(exact, top)
    budgets = range(top + 1) if curve else [top]
    for budget in budgets:
        # Report costs from the definition: prefix-sum differences lose ~1e-16 of the largest
        # potential (visible as -1e-6 FLOPs for a zero cost, or a wrong tie when all the mass is
        # 1e-20 of it): score both the tie-broken count and the full budget directly, keep the
        # better, and keep the curve non-increasing.
        options = {counts[budget], min(budget, exact.size - 1)}
        scored = []
        for m in sorted(options):
            if np.isfinite(exact[m]):
                placement = _backtrack(parents, m + 1, inst.nodes)
                scored.append((_direct_cost(inst, cost, np.array(placement, dtype=np.int64)), m, placement))
        value, _, chosen = min(scored)
        if costs and value >= costs[-1]:
            chosen, value = by_budget[-1], costs[-1]
        by_budget.append(chosen)
        costs.append(value)
    if curve and requested > top:  # the curve is flat past K (the contract's M + 1 entries)
        costs += [costs[-1]] * (requested - top)
        by_budget += [by_budget[-1]] * (requested - top)
    return Placement(positions=by_budget[-1], expected_cost=costs[-1], cost_by_budget=tuple(costs),
                     positions_by_budget=tuple(by_budget), solver="monge-dc" if use_monge else "reference")


def _check_budget(max_checkpoints: object) -> int:
    """``max_checkpoints`` as an int >= 0; ValueError naming the parameter otherwise."""
    if isinstance(max_checkpoints, bool) or not isinstance(max_checkpoints, (int, np.integer)):
        raise ValueError(f"max_checkpoints must be a whole number >= 0, got {type(max_checkpoints).__name__} "
                         f"{max_checkpoints!r}")
    if max_checkpoints < 0:
        raise ValueError(f"max_checkpoints must be >= 0, got {max_checkpoints}")
    return int(max_checkpoints)


def _direct_cost(inst: _Instance, cost: Cost, checkpoints: IntArray) -> float:
    """``sum_d P(d) cost(c(d), d)`` with ``c(d)`` the deepest of ``[0, *checkpoints]`` at or below ``d``."""
    stored = np.concatenate(([0], np.sort(checkpoints))).astype(np.int64)
    resume = stored[np.searchsorted(stored, inst.depths, side="right") - 1]
    return float(np.dot(inst.masses, np.asarray(cost(resume, inst.depths), dtype=np.float64)))


# ================================================================================= public API
def place_checkpoints(weights: ArrayLike, positions: ArrayLike, max_checkpoints: int, *,
                      cost: Cost = TOKEN_COST, curve: bool = True) -> Placement:
    """Optimal placement of at most ``max_checkpoints`` (``M >= 0``) among candidate ``positions``.

    ``weights``: ``(N+1,)`` non-negative depth weights (normalised here); ``positions``: distinct, in
    ``[1, N]``; ``cost``: :data:`TOKEN_COST`, :func:`flops_cost`, a :class:`PotentialCost` or a
    vectorised ``cost(c, d)`` with ``cost(c, c) == 0``. ``curve=False`` keeps only budget ``M`` in the
    curve; with ``curve=True``, ``M >= 2**20`` is refused. ValueError for any invalid input.
    """
    inst = _make_instance(weights, positions)
    seg = _segments_for(inst, cost)
    return _solve_budgeted(inst, seg, cost, max_checkpoints, use_monge=seg.satisfies_qi(), curve=curve)


def place_checkpoints_reference(weights: ArrayLike, positions: ArrayLike, max_checkpoints: int, *,
                                cost: Cost = TOKEN_COST) -> Placement:
    """Same contract as :func:`place_checkpoints`, always by the plain ``O(M K^2)`` DP (the reference)."""
    inst = _make_instance(weights, positions)
    return _solve_budgeted(inst, _segments_for(inst, cost), cost, max_checkpoints, use_monge=False)


def place_checkpoints_monge(weights: ArrayLike, positions: ArrayLike, max_checkpoints: int, *,
                            cost: Cost = TOKEN_COST) -> Placement:
    """As :func:`place_checkpoints`, always by the Monge solver: exact only where the quadrangle
    inequality holds. For studying the precondition."""
    inst = _make_instance(weights, positions)
    return _solve_budgeted(inst, _segments_for(inst, cost), cost, max_checkpoints, use_monge=True)


def place_checkpoints_lagrangian(weights: ArrayLike, positions: ArrayLike, lam: float, *,
                                 cost: Cost = TOKEN_COST, checkpoint_bytes: float = 1.0) -> LagrangianPlacement:
    """Minimise ``E[cost] + lam * checkpoint_bytes * count`` (``lam``: cost units per byte), no budget;
    exact for any cost, ties to the shallower predecessor. ValueError for invalid inputs or a
    negative or non-finite ``lam`` / ``checkpoint_bytes``."""
    try:
        lam, checkpoint_bytes = float(lam), float(checkpoint_bytes)
    except (TypeError, ValueError):
        raise ValueError(f"lam and checkpoint_bytes must be numbers, got {lam!r} and {checkpoint_bytes!r}") from None
    if not (np.isfinite(lam) and lam >= 0 and np.isfinite(checkpoint_bytes) and checkpoint_bytes >= 0
            and np.isfinite(lam * checkpoint_bytes)):
        raise ValueError("lam and checkpoint_bytes must be finite and >= 0, and so must their product")
    inst = _make_instance(weights, positions)
    seg = _segments_for(inst, cost)
    penalty = lam * checkpoint_bytes / seg.scale
    if isinstance(seg, _PotentialSegments) and seg.satisfies_qi():
        chosen = _lagrangian_path_monge(seg, inst.num_nodes, penalty)
    else:
        chosen = _lagrangian_path(seg, inst.num_nodes, penalty)
    exp_cost = _direct_cost(inst, cost, inst.nodes[np.array(chosen, dtype=np.int64)])
    penalty = float(lam * checkpoint_bytes * len(chosen))
    return LagrangianPlacement(positions=tuple(int(inst.nodes[i]) for i in chosen),
                               expected_cost=exp_cost, penalty=penalty, objective=exp_cost + penalty)


def _lagrangian_path(seg: _Segments, n: int, penalty: float) -> list[int]:
    """Node indices of the best path ``0 -> ... -> n-1`` paying ``penalty`` per intermediate node."""
    best = np.full(n, np.inf)
    best[0] = 0.0
    parent = np.zeros(n, dtype=np.int64)
    for j in range(1, n):
        rows = np.arange(j)
        vals = best[:j] + seg(rows, np.full(j, j))
        parent[j] = int(np.argmin(vals))
        best[j] = vals[parent[j]] + (penalty if j < n - 1 else 0.0)
    chosen, node = [], n - 1
    while node != 0:
        node = int(parent[node])
        chosen.append(node)
    return sorted(chosen[:-1])


def _lagrangian_path_monge(seg: "_PotentialSegments", n: int, penalty: float) -> list[int]:
    """:func:`_lagrangian_path` in ``O(K log K)`` under the QI: rows best somewhere form a queue, each
    owning a run of columns; only a strictly better row takes columns (ties stay shallower)."""
    mf, mass, f = seg.prefix_lists()
    best = [math.inf] * n
    parent = [0] * n
    best[0] = 0.0
    g = [0.0] * n                                   # row offsets: best[i] + penalty (0 for the start)

    def value(i: int, j: int) -> float:
        return g[i] + (mf[j] - mf[i]) - f[i] * (mass[j] - mass[i])

    rows = [0]                                      # the queue: rows, each owning columns from starts[k]
    starts = [1]
    head = 0
    for j in range(1, n):
        while head + 1 < len(rows) and starts[head + 1] <= j:
            head += 1
        i = rows[head]
        best[j], parent[j] = value(i, j), i
        if j == n - 1:
            break
        g[j] = best[j] + penalty
        # row j enters: drop queued rows it beats from their first column on, then find where it
        # overtakes the last survivor (the first column > j where it is strictly better)
        while len(rows) > head and value(j, max(starts[-1], j + 1)) < value(rows[-1], max(starts[-1], j + 1)):
            rows.pop()
            starts.pop()
        if len(rows) == head:                       # j beats every queued row from j+1 on
            rows.append(j)
            starts.append(j + 1)
            continue
        last = rows[-1]
        lo, hi = max(starts[-1], j + 1), n          # j is not better at lo; find the first better column
        while lo + 1 < hi:
            mid = (lo + hi) // 2
            if value(j, mid) < value(last, mid):
                hi = mid
            else:
                lo = mid
        if hi < n:
            rows.append(j)
            starts.append(hi)
    chosen, node = [], n - 1
    while node != 0:
        node = parent[node]
        chosen.append(node)
    return sorted(chosen[:-1])


def expected_cost(weights: ArrayLike, checkpoints: ArrayLike, *, cost: Cost = TOKEN_COST) -> float:
    """``E[cost(c(d), d)]`` of given checkpoints (distinct, in ``[1, N]``), from the definition: scores
    heuristics on the DP's distribution."""
    inst = _make_instance(weights, checkpoints)
    return _direct_cost(inst, cost, inst.candidates)
