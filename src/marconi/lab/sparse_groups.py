"""Checkpoint placement per recurrent layer group (issue 24 item 3), exact, at a byte budget.

Why
---
:mod:`marconi.sparse.dp` stores one checkpoint as the states of *every* recurrent layer at one
position. Where a hybrid's recurrent layers fall into groups with different state sizes or
per-token costs (a Mamba-2 stack of big states under a Gated-DeltaNet stack of small ones), the
same bytes may buy more if each group keeps its own positions. This module places them exactly
and compares with the one shared placement. No bundled model has such groups (every
:class:`~marconi.core.model.ModelSpec` has one recurrent kind), so it is exercised on synthetic
specs only (``python -m marconi.lab.sparse_groups``).

Model
-----
Layers run bottom-up. Recurrent groups ``g = 0`` (lowest) .. ``G-1`` (top); a checkpoint of group
``g`` at position ``p`` is the states of all its layers after ``p`` tokens, ``state_bytes[g]``
bytes; recomputing one token through it costs ``flops_per_token[g]``. Attention and MLP layers
are charged to the recurrent group directly above them: they must produce that group's inputs at
every position it recomputes (their own KVs of earlier positions are cached). Layers above the
top group recompute only from the overlap depth, since KVs slice to any prefix: a constant no
placement changes, left out.

A request overlapping the sequence to depth ``d`` (probability ``P(d)``, ``d = 0..N``)::

    s_{G-1}(d) = deepest checkpoint of the top group <= d            (0: from scratch)
    s_g(d)     = deepest checkpoint of group g <= s_{g+1}(d)         (g must feed the group above
                                                                      from s_{g+1} on)
    cost(d)    = sum_g flops_per_token[g] * (d - s_g(d))

which is dp.py's convention (the recompute of ``[s, d)``; the ``d..L`` part costs the same under
every placement). Minimise ``E[cost]`` subject to ``sum_g state_bytes[g] * |positions(g)| <= B``.

Nesting (w.l.o.g. ``positions(g) ⊆ positions(g+1)``)
-----------------------------------------------------
A checkpoint of group ``g`` at ``p`` serves a depth only when ``s_{g+1}(d) >= p``, a checkpoint of
``g+1`` at ``q >= p``. Move it to the least such ``q`` (drop it if there is none, or if ``g``
already holds ``q``): every depth it served now resumes ``g`` at ``q >= p``, still
``<= s_{g+1}(d)``, so no ``s_g`` decreases, the groups below keep every option, and no byte is
added. Doing this from the top group down nests any placement at no extra cost or bytes. Under
nesting the deepest ``g`` checkpoint ``<= d`` is a ``g+1`` checkpoint ``<= d``, so
``s_g(d) = deepest checkpoint of g <= d``: the groups' costs decouple, tied only by the nesting
and the budget. ``tests/test_sparse_groups.py`` checks the claim by brute force over all
placements, nested or not.

DP
--
A position held by exactly the top ``k`` groups is a level-``k`` vertex and costs
``c_k = sum of the top k groups' state_bytes``. Group ``g``'s checkpoints form a path
``0 -> ... -> N+1`` of vertices held by groups ``g..G-1``; between two consecutive ones ``(a, b)``
group ``g`` pays ``f_g * w(a, b)`` (``w``: dp.py's token segment cost) and the groups above, which
hold ``a`` and ``b`` too, lay their own path from ``a`` to ``b``. With ``r = G - g`` and spend
vectors ``x = (n_1..n_r)`` counting vertices per level (feasible iff ``sum_k n_k c_k <= B``; counts,
not rounded bytes, so the budget is exact for any state sizes)::

    C_r[a, b, z] = f_g * w(a, b) + R_{r-1}[a, b, z]             (R_0[a, b, 0] = 0: nothing above)
    R_r[a, b, x] = min(C_r[a, b, x],  min_{a<v<b, y+z+e_r=x} R_r[a, v, y] + C_r[v, b, z])

and the answer is ``min_x R_G[0, N+1, x]`` (ties: fewest bytes). The top group (``r = 1``) is the
single-group layered DP from every source, by dp.py's Monge divide and conquer (token costs satisfy
its quadrangle inequality): ``O(M_1 K^2 log K)`` for ``M_1 = B // state_bytes[G-1]``. The bottom
group runs from node 0 only: ``O(K^2 P)`` with ``P`` the number of (spend, edge spend) pairs;
middle groups (``G >= 3``) from every source, ``O(K^3 P)``: fine for tens of candidates. For
``G = 2``, ``K = 300`` and a budget of a few shared checkpoints this takes a fraction of a second.

Limits: per-token costs are constants (attention's context-length term is left out; a group's
true span cost grows with depth), every group's checkpoint is all-or-nothing over its layers, and
a request resumes every group at its deepest usable checkpoint (the cost-optimal choice, since
deeper upper resumes only widen the lower groups' choices).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from marconi.core.model import PRESETS
from marconi.core.registry import ConfigError
from marconi.sparse.dp import place_checkpoints, segment_cost_matrix, validate_positions
from marconi.sparse.overlap import GeometricSpread, OverlapPrior

__all__ = [
    "SYNTHETIC_SPECS",
    "BudgetComparison",
    "GroupPlacement",
    "LayerGroups",
    "compare_budgets",
    "doc_qa_depth_probs",
    "expected_group_cost",
    "geometric_depth_probs",
    "place_per_group",
    "place_shared",
    "synthetic_groups",
]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

# |sum(P) - 1| allowed for a depth distribution.
_PROB_ATOL = 1e-9
# Relative slack under which two DP costs tie (then the fewer bytes win).
_TIE_RTOL = 1e-12
# Largest DP table (entries; 160 MB of float64) the solver builds: past it the grid or budget is too fine.
_MAX_TABLE_ENTRIES = 20_000_000


# ================================================================================= spec
@dataclass(frozen=True, slots=True)
class LayerGroups:
    """A hybrid's recurrent layer groups, bottom-up (index 0 is the lowest).

    Attributes:
        names: one label per group.
        state_bytes: bytes of one checkpoint of the group (every recurrent and conv state of its
            layers); positive integers in any unit shared with the budget.
        flops_per_token: cost of recomputing one token through the group and the attention/MLP
            layers charged to it (those directly below it, up to the next group down).
    """

    names: tuple[str, ...]
    state_bytes: tuple[int, ...]
    flops_per_token: tuple[float, ...]

    def __post_init__(self) -> None:
        for attr in ("names", "state_bytes", "flops_per_token"):
            object.__setattr__(self, attr, tuple(getattr(self, attr)))
        counts = {attr: len(getattr(self, attr)) for attr in ("names", "state_bytes", "flops_per_token")}
        if len(set(counts.values())) != 1:
            raise ConfigError(f"layer groups: mismatched lengths {counts}; give one name, state size and "
                              "per-token cost per group, bottom-up")
        if not self.names:
            raise ConfigError("layer groups: at least one group is needed")
        for name, size in zip(self.names, self.state_bytes):
            if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size <= 0:
                raise ConfigError(f"layer group {name!r}: state_bytes must be a positive integer, got {size!r}")
        for name, flops in zip(self.names, self.flops_per_token):
            if not (isinstance(flops, (int, float, np.number)) and math.isfinite(flops) and flops >= 0):
                raise ConfigError(f"layer group {name!r}: flops_per_token must be finite and >= 0, got {flops!r}")

    @property
    def num_groups(self) -> int:
        return len(self.names)

    def level_bytes(self) -> tuple[int, ...]:
        """``[k-1]`` = bytes of a position held by the top ``k`` groups, ``k = 1..G``."""
        return tuple(int(sum(self.state_bytes[self.num_groups - k:])) for k in range(1, self.num_groups + 1))

    def shared(self) -> "LayerGroups":
        """The one group a shared placement sees: summed state sizes and costs (today's checkpoint)."""
        return LayerGroups(("+".join(self.names),), (int(sum(self.state_bytes)),), (float(sum(self.flops_per_token)),))


# ================================================================================= results
class GroupPlacement(NamedTuple):
    """Checkpoint positions per group and what they cost.

    positions: ``[g]`` ascending positions of group ``g`` (0 = lowest); expected_cost:
    ``E[sum_g flops_per_token[g] (d - s_g(d))]`` in the groups' FLOP unit; used_bytes: total state bytes.
    """

    positions: tuple[tuple[int, ...], ...]
    expected_cost: float
    used_bytes: int


class BudgetComparison(NamedTuple):
    """Shared against per-group placement at one byte budget (a result record)."""

    budget_bytes: float
    shared: GroupPlacement
    per_group: GroupPlacement
    no_checkpoint_cost: float        # E[cost] with no checkpoint at all: every group from scratch

    @property
    def saving(self) -> float:
        """Fraction of the shared placement's expected recompute that per-group placement removes."""
        return 0.0 if self.shared.expected_cost <= 0 else 1.0 - self.per_group.expected_cost / self.shared.expected_cost


# ================================================================================= validation
def _check_probs(depth_probs: ArrayLike) -> FloatArray:
    p = np.asarray(depth_probs, dtype=np.float64)
    if p.ndim != 1 or p.size == 0:
        raise ConfigError(f"depth_probs must be a non-empty 1-D array over depths 0..N, got shape {p.shape}")
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        raise ConfigError("depth_probs must be finite and non-negative")
    total = float(p.sum())
    if abs(total - 1.0) > _PROB_ATOL:
        raise ConfigError(f"depth_probs must sum to 1, they sum to {total:.9g}: pass a distribution over "
                          "depths 0..N (counts / counts.sum())")
    return p


def _check_budget(budget_bytes: float) -> float:
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, (int, float, np.number)) \
            or not math.isfinite(budget_bytes) or budget_bytes < 0:
        raise ConfigError(f"budget_bytes must be a finite number >= 0, got {budget_bytes!r}")
    return float(budget_bytes)


def _check_positions(positions: ArrayLike | None, seq_len: int, what: str) -> IntArray:
    if positions is None:
        return np.arange(1, seq_len + 1, dtype=np.int64)
    try:
        return validate_positions(positions, seq_len=seq_len)
    except ValueError as err:
        raise ConfigError(f"{what}: {err}") from None


# ================================================================================= evaluation
def expected_group_cost(groups: LayerGroups, depth_probs: ArrayLike,
                        positions: Sequence[ArrayLike]) -> float:
    """``E[sum_g flops_per_token[g] (d - s_g(d))]`` of any per-group placement, nested or not.

    ``positions[g]``: distinct positions in ``[1, N]`` of group ``g`` (0 = lowest). The resume rule
    is the module's: the top group from its deepest checkpoint ``<= d``, each lower group from its
    deepest ``<= `` the resume point of the group above.

    Raises:
        ConfigError: a bad distribution, positions, or not one position list per group.
    """
    probs = _check_probs(depth_probs)
    if len(positions) != groups.num_groups:
        raise ConfigError(f"positions: {len(positions)} lists for {groups.num_groups} groups; give one per group")
    stored = [_check_positions(p, probs.size - 1, f"positions of group {groups.names[g]!r}")
              for g, p in enumerate(positions)]
    return _cost_of(groups, probs, stored)


def _cost_of(groups: LayerGroups, probs: FloatArray, stored: list[IntArray]) -> float:
    depths = np.arange(probs.size)
    resume = depths
    total = 0.0
    for g in reversed(range(groups.num_groups)):
        points = np.concatenate(([0], stored[g]))
        resume = points[np.searchsorted(points, resume, side="right") - 1]
        total += groups.flops_per_token[g] * float(np.dot(probs, depths - resume))
    return total


def _placement(groups: LayerGroups, probs: FloatArray, positions: Sequence[Sequence[int]]) -> GroupPlacement:
    stored = [np.array(sorted(p), dtype=np.int64) for p in positions]
    used = sum(size * len(p) for size, p in zip(groups.state_bytes, stored))
    return GroupPlacement(positions=tuple(tuple(int(x) for x in p) for p in stored),
                          expected_cost=_cost_of(groups, probs, stored), used_bytes=int(used))


# ================================================================================= shared baseline
def place_shared(groups: LayerGroups, depth_probs: ArrayLike, budget_bytes: float, *,
                 candidates: ArrayLike | None = None) -> GroupPlacement:
    """Today's placement: every group at the same positions, ``budget // sum(state_bytes)`` of them.

    The cost is ``sum_g f_g`` times the token cost, so dp.py's token DP places it exactly.
    ``candidates`` defaults to ``1..N``. Raises ConfigError on bad input.
    """
    probs = _check_probs(depth_probs)
    budget = _check_budget(budget_bytes)
    cand = _check_positions(candidates, probs.size - 1, "candidates")
    count = int(budget // sum(groups.state_bytes))
    plan = place_checkpoints(probs, cand, count, curve=False)
    return _placement(groups, probs, [plan.positions] * groups.num_groups)


# ================================================================================= per-group DP
class _Lattice:
    """Spend vectors ``(n_1..n_r)`` of each recursion level ``r`` (vertex counts per level).

    ``vecs[r]``: ``(|V_r|, r)`` ints, every vector with ``sum_k n_k c_k <= B`` and ``sum_k n_k <= K``;
    ``index[r]``: vector -> row. ``V_{r-1}`` embeds in ``V_r`` with ``n_r = 0``.
    """

    def __init__(self, level_bytes: tuple[int, ...], budget: float, max_vertices: int) -> None:
        self.level_bytes = level_bytes
        self.vecs: dict[int, IntArray] = {}
        self.index: dict[int, dict[tuple[int, ...], int]] = {}
        for r in range(1, len(level_bytes) + 1):
            found: list[tuple[int, ...]] = []
            self._enumerate(r, 0, (), budget, max_vertices, found)
            self.vecs[r] = np.array(found, dtype=np.int64).reshape(len(found), r)
            self.index[r] = {v: i for i, v in enumerate(found)}

    def _enumerate(self, r: int, k: int, prefix: tuple[int, ...], left: float, slots: int,
                   out: list[tuple[int, ...]]) -> None:
        if k == r:
            out.append(prefix)
            return
        size = self.level_bytes[k]
        for n in range(min(slots, int(left // size)) + 1):
            self._enumerate(r, k + 1, prefix + (n,), left - n * size, slots - n, out)

    def bytes_of(self, r: int) -> FloatArray:
        return self.vecs[r] @ np.array(self.level_bytes[:r], dtype=np.float64)

    def embed(self, r: int) -> IntArray:
        """Row in ``V_r`` of each vector of ``V_{r-1}`` (``n_r = 0``)."""
        return np.array([self.index[r][tuple(v) + (0,)] for v in self.vecs[r - 1].tolist()], dtype=np.int64)

    def pairs(self, r: int) -> tuple[IntArray, IntArray, IntArray]:
        """Every feasible ``x = y + z + e_r`` (``y`` in ``V_r``, edge spend ``z`` in ``V_{r-1}``) as row
        arrays ``(ys, zs, xs)``, sorted by ``xs``."""
        found = []
        for zi, z in enumerate(self.vecs[r - 1].tolist()):
            step = tuple(z) + (1,)
            for yi, y in enumerate(self.vecs[r].tolist()):
                xi = self.index[r].get(tuple(a + b for a, b in zip(y, step)))
                if xi is not None:
                    found.append((xi, yi, zi))
        xs, ys, zs = (np.array(col, dtype=np.int64) for col in zip(*sorted(found))) if found else \
            (np.zeros(0, dtype=np.int64),) * 3
        return ys, zs, xs


class _TopPaths(NamedTuple):
    """Top group's paths from each source: ``cost[s, b, m]`` with ``m`` interior vertices; ``parents[t, s, j]``."""

    cost: FloatArray
    parents: IntArray


class _GroupPaths(NamedTuple):
    """A lower group's paths: ``cost[s, b, x]``, last vertex ``last[s, b, x]`` (the source: one edge),
    and that edge's spend row ``edge_spend[s, b, x]`` in ``V_{r-1}``."""

    cost: FloatArray
    last: IntArray
    edge_spend: IntArray


def _per_source_column_minima(prev: FloatArray, w: FloatArray, sources: IntArray) -> tuple[FloatArray, IntArray]:
    """``best[s, j] = min_{i < j} prev[s, i] + w[i, j]`` and a leftmost minimiser, every source at once.

    dp.py's divide and conquer on monotone argmins (``w`` Monge), with each pending sub-problem
    tagged by its source ``s``: columns ``(sources[s], n)``, rows ``[sources[s], n-1)``.
    """
    n = w.shape[0]
    best = np.full(prev.shape, np.inf)
    arg = np.zeros(prev.shape, dtype=np.int64)
    live = np.flatnonzero(sources < n - 1)
    owner, col_lo, row_lo = live, sources[live] + 1, sources[live].copy()
    col_hi, row_hi = np.full(live.size, n - 1), np.full(live.size, n - 2)
    while owner.size:
        col = (col_lo + col_hi) // 2
        width = np.minimum(row_hi, col - 1) - row_lo + 1
        first_row = np.cumsum(width) - width
        task = np.repeat(np.arange(col.size), width)
        flat = np.arange(task.size)
        rows = row_lo[task] + flat - first_row[task]
        vals = prev[owner[task], rows] + w[rows, col[task]]
        low = np.minimum.reduceat(vals, first_row)
        pick = rows[np.minimum.reduceat(np.where(vals == low[task], flat, task.size), first_row)]
        best[owner, col], arg[owner, col] = low, pick
        go_left, go_right = col > col_lo, col < col_hi
        owner = np.concatenate((owner[go_left], owner[go_right]))
        col_lo, col_hi = (np.concatenate((col_lo[go_left], col[go_right] + 1)),
                          np.concatenate((col[go_left] - 1, col_hi[go_right])))
        row_lo, row_hi = (np.concatenate((row_lo[go_left], pick[go_right])),
                          np.concatenate((pick[go_left], row_hi[go_right])))
    return best, arg


def _scaled(flops: float, costs: FloatArray) -> FloatArray:
    """``flops * costs`` with ``+inf`` (no path) kept ``+inf`` when a group's cost is 0 (not ``nan``)."""
    out = np.full(costs.shape, np.inf)
    np.multiply(flops, costs, out=out, where=np.isfinite(costs))
    return out


def _top_paths(w: FloatArray, flops: float, sources: IntArray, max_vertices: int) -> _TopPaths:
    n = w.shape[0]
    dist = np.full((sources.size, n), np.inf)
    dist[np.arange(sources.size), sources] = 0.0
    parents = np.zeros((max_vertices + 2, sources.size, n), dtype=np.int64)
    cost = np.empty((sources.size, n, max_vertices + 1))
    for edges in range(1, max_vertices + 2):
        dist, parents[edges] = _per_source_column_minima(dist, w, sources)
        cost[:, :, edges - 1] = _scaled(flops, dist)
    return _TopPaths(cost, parents)


def _group_paths(edge_cost: FloatArray, sources: IntArray, lattice: _Lattice, r: int) -> _GroupPaths:
    """Paths of the group at recursion level ``r >= 2`` from each source (see the module's DP)."""
    n = edge_cost.shape[0]
    num_spend = lattice.vecs[r].shape[0]
    cost = np.full((sources.size, n, num_spend), np.inf)
    last = np.zeros(cost.shape, dtype=np.int64)
    edge_spend = np.zeros(cost.shape, dtype=np.int64)
    embed = lattice.embed(r)
    ys, zs, xs = lattice.pairs(r)
    # pairs sharing a target spend x are contiguous: reduce over each run
    x_rows, run_starts = np.unique(xs, return_index=True)
    run_of = np.repeat(np.arange(x_rows.size), np.diff(np.append(run_starts, xs.size)))
    flat = np.arange(xs.size)
    for b in range(1, n):
        cost[:, b, embed] = edge_cost[sources, b, :]          # one edge from the source
        last[:, b, embed] = sources[:, None]
        edge_spend[:, b, embed] = np.arange(embed.size)
        if not xs.size:
            continue
        # ... or a path to v with spend y, then v -> b with spend z: (sources, v, pair)
        vals = cost[:, :b, ys] + edge_cost[:b, b, zs][None, :, :]
        via = np.argmin(vals, axis=1)
        low = np.min(vals, axis=1)                                        # (sources, pair)
        run_low = np.minimum.reduceat(low, run_starts, axis=1)            # (sources, x_rows)
        first = np.minimum.reduceat(np.where(low == run_low[:, run_of], flat, xs.size), run_starts, axis=1)
        s_idx, k_idx = np.nonzero(run_low < cost[:, b, x_rows])
        pair = first[s_idx, k_idx]
        cost[s_idx, b, x_rows[k_idx]] = run_low[s_idx, k_idx]
        last[s_idx, b, x_rows[k_idx]] = via[s_idx, pair]
        edge_spend[s_idx, b, x_rows[k_idx]] = zs[pair]
    return _GroupPaths(cost, last, edge_spend)


class _Solver:
    """The nested DP of the module docstring, level by level from the top group down, and its backtrack."""

    def __init__(self, groups: LayerGroups, w: FloatArray, budget: float) -> None:
        self.groups = groups
        n = w.shape[0]
        num_groups = groups.num_groups
        self.lattice = _Lattice(groups.level_bytes(), budget, max_vertices=n - 2)
        scale = max(groups.flops_per_token) or 1.0
        flops = [f / scale for f in groups.flops_per_token]
        every, root = np.arange(n, dtype=np.int64), np.zeros(1, dtype=np.int64)
        sizes = [n * n * self.lattice.vecs[r].shape[0] for r in range(1, num_groups)]
        sizes.append(n * self.lattice.vecs[num_groups].shape[0])
        if max(sizes) > _MAX_TABLE_ENTRIES:
            raise ConfigError(f"per-group DP: {max(sizes):,} table entries for {n - 2} candidates at this budget "
                              f"(at most {_MAX_TABLE_ENTRIES:,}); use a coarser candidate grid or a smaller budget")
        top_sources = root if num_groups == 1 else every
        self.top = _top_paths(w, flops[-1], top_sources, self.lattice.vecs[1].shape[0] - 1)
        self.levels: dict[int, _GroupPaths] = {}
        below = self.top.cost
        for r in range(2, num_groups + 1):
            g = num_groups - r
            edge_cost = _scaled(flops[g], w)[:, :, None] + below
            self.levels[r] = _group_paths(edge_cost, root if r == num_groups else every, self.lattice, r)
            below = self.levels[r].cost

    def best_spend(self) -> int:
        """Row of ``V_G`` with the least cost at the root, fewest bytes among ties."""
        num_groups = self.groups.num_groups
        table = self.top.cost if num_groups == 1 else self.levels[num_groups].cost
        at_root = table[0, -1, :]
        best = float(at_root.min())
        slack = _TIE_RTOL * max(abs(best), float(np.abs(at_root[np.isfinite(at_root)]).max()), 1e-300)
        tied = np.flatnonzero(at_root <= best + slack)
        return int(tied[np.argmin(self.lattice.bytes_of(num_groups)[tied])])

    def positions(self, nodes: IntArray) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in range(self.groups.num_groups)]
        self._expand(self.groups.num_groups, 0, nodes.size - 1, self.best_spend(), nodes, out)
        return out

    def _expand(self, r: int, a: int, b: int, spend: int, nodes: IntArray, out: list[list[int]]) -> None:
        """Add the vertices of level ``r``'s best path ``a -> b`` at spend row ``spend`` (and above)."""
        num_groups = self.groups.num_groups
        if r == 1:
            node = b
            for edges in range(int(self.lattice.vecs[1][spend, 0]) + 1, 1, -1):
                node = int(self.top.parents[edges, a, node])
                out[num_groups - 1].append(int(nodes[node]))
            return
        paths = self.levels[r]
        node, x = b, spend
        while True:
            v, zi = int(paths.last[a, node, x]), int(paths.edge_spend[a, node, x])
            self._expand(r - 1, v, node, zi, nodes, out)
            if v == a:
                return
            for g in range(num_groups - r, num_groups):
                out[g].append(int(nodes[v]))
            step = tuple(self.lattice.vecs[r - 1][zi].tolist()) + (1,)
            x = self.lattice.index[r][tuple(int(p - q) for p, q in zip(self.lattice.vecs[r][x], step))]
            node = v


def place_per_group(groups: LayerGroups, depth_probs: ArrayLike, budget_bytes: float, *,
                    candidates: ArrayLike | None = None) -> GroupPlacement:
    """Exact least-``E[cost]`` placement with per-group positions at ``sum_g bytes_g |pos_g| <= budget``.

    ``depth_probs``: ``P(d)``, ``d = 0..N``, summing to 1; ``candidates``: positions allowed
    (default ``1..N``). The result nests (``positions[g] ⊆ positions[g+1]``), is never worse than
    :func:`place_shared` at the same budget, and among equal costs uses the fewest bytes.

    Raises:
        ConfigError: bad distribution, budget or candidates, or a DP table too large (the message
            says to coarsen the grid or the budget).
    """
    probs = _check_probs(depth_probs)
    budget = _check_budget(budget_bytes)
    cand = _check_positions(candidates, probs.size - 1, "candidates")
    nodes = np.concatenate(([0], cand, [probs.size])).astype(np.int64)
    w = segment_cost_matrix(probs, cand)                       # tokens, (K+2, K+2), +inf where i >= j
    return _placement(groups, probs, _Solver(groups, w, budget).positions(nodes))


# ================================================================================= synthetic study
# Per-layer figures the synthetic groups borrow: Nemotron-H-8B's Mamba-2 layer (128 heads x 64 x
# N=128 state + conv, 2,179,072 B) and FLOP model (d_model 4096; the project's FLOP model charges
# every recurrent layer alike), and Qwen3-Next's Gated-DeltaNet head geometry (16 key heads, value
# heads of 128 x 128, conv kernel 4, bf16).
_GDN_HEAD_DIM, _GDN_KEY_HEADS, _GDN_CONV, _BF16 = 128, 16, 4, 2
SYNTHETIC_SPECS = ("gdn-over-mamba2", "mamba2-over-gdn", "gdn24-over-mamba2")


def _gdn_layer_bytes(value_heads: int) -> int:
    state = value_heads * _GDN_HEAD_DIM * _GDN_HEAD_DIM * _BF16
    conv = (2 * _GDN_KEY_HEADS + value_heads) * _GDN_HEAD_DIM * _GDN_CONV * _BF16
    return state + conv


def synthetic_groups(name: str = "gdn-over-mamba2") -> LayerGroups:
    """A *synthetic* two-group hybrid (no bundled model has groups), built from real per-layer figures.

    Each group's recurrent layers come with one MLP each and two attention layers charged to it.

    * ``gdn-over-mamba2``: 12 Mamba-2 layers (26.1 MB a checkpoint) under 12 GDN layers of 32 value
      heads (Qwen3-Next's: 13.4 MB); equal FLOPs per token (6.01 G each).
    * ``mamba2-over-gdn``: the same two groups, the other way up.
    * ``gdn24-over-mamba2``: 12 Mamba-2 layers under 24 GDN layers of 16 value heads (13.8 MB, twice
      the FLOPs per token): a GDN stack that is cheaper in bytes and dearer to recompute.

    Raises:
        ConfigError: an unknown name.
    """
    if name not in SYNTHETIC_SPECS:
        raise ConfigError(f"unknown synthetic spec {name!r}: use one of {', '.join(SYNTHETIC_SPECS)}")
    spec = PRESETS["nemotron-h-8b"]
    layer_flops = spec.ssm_flops(1) + spec.mlp_flops(1)
    attn_flops = 2 * spec.attn_flops(1)

    def group(label: str, layers: int, layer_bytes: int) -> tuple[str, int, float]:
        return label, layers * layer_bytes, float(layers * layer_flops + attn_flops)

    mamba2 = group("mamba2-like", 12, spec.ssm_state_bytes_per_layer + spec.conv_state_bytes_per_layer)
    gdn = group("gdn-like", 24, _gdn_layer_bytes(16)) if name == "gdn24-over-mamba2" else \
        group("gdn-like", 12, _gdn_layer_bytes(32))
    bottom_up = (gdn, mamba2) if name == "mamba2-over-gdn" else (mamba2, gdn)
    return LayerGroups(*(tuple(col) for col in zip(*bottom_up)))


def geometric_depth_probs(seq_len: int = 6656) -> FloatArray:
    """Short shared prefixes likelier than long ones: :mod:`marconi.sparse.overlap`'s prior with a
    geometric spread (mean a quarter of ``N``) and 0.2 at ``N`` (system-prompt-like sharing)."""
    return OverlapPrior(end_mass=0.2, spread=GeometricSpread(0.25)).weights(seq_len)


def doc_qa_depth_probs(*, instruction_len: int = 256, doc_len: int = 6144, tail_len: int = 256) -> FloatArray:
    """A *synthetic* doc-QA overlap distribution for one cached sequence (instruction, document,
    question and answer: ``N = instruction_len + doc_len + tail_len``).

    0.30 at the instruction's end (a question on another document), 0.10 at each quarter of the
    document (follow-ups that stop after part of it), 0.20 at ``N`` (the next turn) and 0.10 spread
    uniformly (edits, retries). The shape of the drift trace in docs/sparse.md, not a measurement.
    """
    seq_len = instruction_len + doc_len + tail_len
    probs = np.full(seq_len + 1, 0.10 / (seq_len + 1))
    probs[instruction_len] += 0.30
    for quarter in range(1, 5):
        probs[instruction_len + quarter * doc_len // 4] += 0.10
    probs[seq_len] += 0.20
    return probs / probs.sum()


def compare_budgets(groups: LayerGroups, depth_probs: ArrayLike, budgets_bytes: Sequence[float], *,
                    candidates: ArrayLike | None = None) -> list[BudgetComparison]:
    """Shared and per-group placement at each budget: one record per budget."""
    no_checkpoint = expected_group_cost(groups, depth_probs, [()] * groups.num_groups)
    return [BudgetComparison(float(b), place_shared(groups, depth_probs, b, candidates=candidates),
                             place_per_group(groups, depth_probs, b, candidates=candidates), no_checkpoint)
            for b in budgets_bytes]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m marconi.lab.sparse_groups",
                                     description="Shared vs per-group checkpoint placement on synthetic "
                                                 "two-group hybrids and synthetic overlap distributions.")
    parser.add_argument("--block", type=int, default=64, help="candidate grid in tokens (default 64)")
    parser.add_argument("--budgets", default="0.5,1,1.5,2,3,4,6",
                        help="budgets in shared checkpoints (the sum of the groups' state bytes)")
    parser.add_argument("--specs", default=",".join(SYNTHETIC_SPECS), help="synthetic specs, comma separated")
    args = parser.parse_args(argv)
    workloads = {"doc-qa": doc_qa_depth_probs()}
    workloads["geometric"] = geometric_depth_probs(workloads["doc-qa"].size - 1)
    for spec_name in args.specs.split(","):
        groups = synthetic_groups(spec_name.strip())
        unit = sum(groups.state_bytes)
        print(f"{spec_name} (synthetic), bottom-up: " + ", ".join(
            f"{n} {b / 1e6:.1f} MB {f / 1e9:.2f} GFLOP/token"
            for n, b, f in zip(groups.names, groups.state_bytes, groups.flops_per_token)))
        for workload, probs in workloads.items():
            seq_len = probs.size - 1
            candidates = np.unique(np.append(np.arange(args.block, seq_len + 1, args.block), seq_len))
            print(f"  {workload}: N = {seq_len}, {candidates.size} candidates")
            print(f"  {'budget':>6} {'MB':>6} {'shared':>6} {'shared %':>9} {'per-group':>10} "
                  f"{'per-group %':>12} {'saving':>7}")
            for rec in compare_budgets(groups, probs, [float(x) * unit for x in args.budgets.split(",")],
                                       candidates=candidates):
                counts = "/".join(str(len(p)) for p in rec.per_group.positions)
                shared_pct = 100 * rec.shared.expected_cost / rec.no_checkpoint_cost
                grouped_pct = 100 * rec.per_group.expected_cost / rec.no_checkpoint_cost
                print(f"  {rec.budget_bytes / unit:>6g} {rec.budget_bytes / 1e6:>6.1f} "
                      f"{len(rec.shared.positions[0]):>6} {shared_pct:>8.2f}% {counts:>10} {grouped_pct:>11.2f}% "
                      f"{100 * rec.saving:>6.1f}%")
        print()
    print("budget in shared checkpoints; shared / per-group: checkpoints (per-group: lower/upper group); "
          "% = expected recompute FLOPs as a share of recomputing every overlap from scratch")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
