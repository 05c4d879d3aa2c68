"""The sparse placement's inputs at their edges: weights whose sum overflows, values that are not
real numbers, a depth cap that meets the shallowest depth, and the vLLM grid's block size and budget.
Each case was a wrong answer or an unrelated error before (an audit of the DP against brute force)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from marconi.integrations.vllm.retention import brute_force_on_grid, place_on_grid
from marconi.sparse.dp import expected_cost, place_checkpoints, place_checkpoints_lagrangian
from marconi.sparse.overlap import (BlockEstimatorConfig, TreeEstimatorConfig, TreeOverlapEstimator, bin_depths,
                                    path_keys)


def brute_force(weights: list[float], budget: int) -> float:
    """The least expected tokens recomputed over every placement of at most ``budget`` states."""
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    n = w.size - 1
    return min(expected_cost(w, placed) for m in range(min(budget, n) + 1)
               for placed in itertools.combinations(range(1, n + 1), m))


def test_weights_whose_sum_overflows_keep_their_distribution():
    huge = [1e308, 1e308, 1e308]                 # each finite; their sum is not
    assert expected_cost(huge, []) == pytest.approx(1.0)
    placed = place_checkpoints(huge, [1, 2], 1)
    assert placed.expected_cost == pytest.approx(brute_force([1, 1, 1], 1)) and placed.positions == (1,)
    # mass at depths 0 and 4 only: one state at 4 serves half the requests whole
    at_ends = [1e308, 0, 0, 0, 1e308]
    assert place_checkpoints(at_ends, [1, 2, 3, 4], 1).positions == (4,)
    lagrangian = place_checkpoints_lagrangian(huge, [1, 2], 0.1)
    assert lagrangian.expected_cost == pytest.approx(0.0) and lagrangian.positions == (1, 2)


def test_the_grid_placement_reads_huge_weights_as_their_distribution():
    w = [1e308] * 9
    got = place_on_grid(w, block_size=2, budget=2)
    assert got.expected_cost == pytest.approx(brute_force_on_grid([1] * 9, block_size=2, budget=2))


@pytest.mark.parametrize("call, names", [
    (lambda: place_checkpoints([1 + 1j, 1, 1], [1], 1), "weights must be real numbers"),
    (lambda: place_checkpoints(["1", "2", "3"], [1], 1), "weights must be real numbers"),
    (lambda: place_checkpoints([1, 1, 1], ["1"], 1), "positions must be a 1-D array of integers"),
    (lambda: place_checkpoints([1, 1, 1], [float("nan")], 1), "positions must be a 1-D array of integers"),
    (lambda: place_checkpoints_lagrangian([1, 1, 1], [1], None), "lam and checkpoint_bytes must be numbers"),
    (lambda: place_checkpoints_lagrangian([1, 1, 1], [1], 1e300, checkpoint_bytes=1e300), "so must their product"),
    (lambda: bin_depths([1.0, -1.0, 1.0], [1]), "finite and non-negative"),
    (lambda: bin_depths([1.0, float("nan"), 1.0], [1]), "finite and non-negative"),
    (lambda: BlockEstimatorConfig(prior=math.inf), "prior finite"),
    (lambda: place_on_grid([1] * 9, block_size=0, budget=1), "block_size must be positive, got 0"),
    (lambda: place_on_grid([1] * 9, block_size=-2, budget=1), "block_size must be positive, got -2"),
])
def test_bad_input_is_a_value_error_that_names_it(call, names):
    with pytest.raises(ValueError, match=names):
        call()


def test_a_budget_past_the_candidates_costs_nothing_more():
    w = [1] * 9
    small = place_on_grid(w, block_size=2, fixed=(4,), budget=3)
    huge = place_on_grid(w, block_size=2, fixed=(4,), budget=1 << 20)      # refused before, as a curve too long
    assert huge == small and huge.positions == (2, 6, 8)


def test_the_depth_cap_never_merges_the_shallowest_depth_into_a_deeper_one():
    # two depths allowed: hits at 20 (x5) and 10 (x5) at the root, then one at 3, the shallowest and
    # lightest. A state at 10 or 20 cannot serve a request that stopped at 3, so 3 must keep its mass.
    est = TreeOverlapEstimator(TreeEstimatorConfig(half_life_obs=math.inf, max_depths=2, prior_strength=0.0,
                                                   node_strength=0.0))
    keys = path_keys(np.arange(30))
    for depth in [20] * 5 + [10] * 5 + [3]:
        est.observe(keys, depth)
    w, _ = est.path_weights(keys, 30)
    assert w[3] == pytest.approx(1 / 11)                     # 0 before: merged into 10
    assert w[10] + w[20] == pytest.approx(10 / 11)
    # every depth's mass sits at or above its own (a merge moves mass shallower, never deeper):
    # the mass at depth 10 or shallower is at least what was observed there
    assert w[:11].sum() >= 6 / 11 - 1e-12
    est.check_invariants()
