"""The sparse DP on vLLM's block grid (issue 24 item 1): exact against a brute force, vLLM-free."""

from __future__ import annotations

import numpy as np
import pytest

from marconi.core.model import get_model
from marconi.integrations.vllm.retention import (brute_force_on_grid, grid_candidates, grid_expected_cost,
                                                 place_on_grid)
from marconi.sparse.dp import TOKEN_COST, flops_cost


def _instance(rng: np.random.Generator) -> tuple[np.ndarray, int, list[int], int]:
    block = int(rng.integers(1, 5))
    n = int(rng.integers(block, 9 * block + 1))
    weights = rng.random(n + 1) * (rng.random(n + 1) < 0.5)
    if weights.sum() == 0:
        weights[int(rng.integers(0, n + 1))] = 1.0
    grid = list(range(block, n + 1, block))
    fixed = sorted(rng.choice(grid, size=int(rng.integers(0, min(3, len(grid)) + 1)), replace=False).tolist())
    return weights, block, fixed, int(rng.integers(0, 4))


@pytest.mark.parametrize("cost_name", ["tokens", "flops"])
def test_place_on_grid_equals_a_brute_force(cost_name: str) -> None:
    """400 random instances: random block sizes, sparse weights, 0-3 fixed boundaries, budgets 0-3."""
    rng = np.random.default_rng(7 if cost_name == "tokens" else 8)
    cost = TOKEN_COST if cost_name == "tokens" else flops_cost(get_model("paper-7b"))
    for _ in range(400):
        weights, block, fixed, budget = _instance(rng)
        placed = place_on_grid(weights, block_size=block, fixed=fixed, budget=budget, cost=cost)
        best = brute_force_on_grid(weights, block_size=block, fixed=fixed, budget=budget, cost=cost)
        assert placed.expected_cost == pytest.approx(best, rel=1e-9, abs=1e-9 * max(1.0, best))
        assert len(placed.positions) <= budget
        assert all(p % block == 0 and p not in fixed for p in placed.positions)
        assert placed.expected_cost <= placed.baseline_cost * (1 + 1e-12) + 1e-12
        assert placed.expected_cost == pytest.approx(
            grid_expected_cost(weights, [*fixed, *placed.positions], cost=cost), rel=1e-12)


def test_a_document_boundary_is_found_off_the_fixed_points() -> None:
    """Questions over one 40-block document diverge just past its end; the prompt's end and the
    resume point are fixed. One more state goes at the document's last block boundary."""
    block, n = 16, 800
    weights = np.zeros(n + 1)
    weights[645:660] = 1.0                 # the question starts at 640 + a few tokens of template
    placed = place_on_grid(weights, block_size=block, fixed=[784], budget=1)
    assert placed.positions == (640,)
    assert placed.expected_cost < 0.02 * placed.baseline_cost


def test_no_state_is_spent_where_it_buys_nothing() -> None:
    """All the mass sits at a fixed boundary: no budget is spent, whatever the budget."""
    weights = np.zeros(65)
    weights[32] = 1.0
    placed = place_on_grid(weights, block_size=8, fixed=[32], budget=3)
    assert placed.positions == () and placed.expected_cost == 0.0


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="block multiples"):
        place_on_grid(np.ones(33), block_size=8, fixed=[12], budget=1)
    with pytest.raises(ValueError, match="positive sum"):
        place_on_grid(np.zeros(33), block_size=8, budget=1)
    with pytest.raises(ValueError, match="budget"):
        place_on_grid(np.ones(33), block_size=8, budget=-1)
    assert grid_candidates(33, 8, fixed=[16]) == [8, 24, 32]
