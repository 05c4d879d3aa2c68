"""Checkpoint placement DP: brute force on small instances, fast vs reference on large ones,
the quadrangle-inequality precondition, the Lagrangian form, and edge cases."""

from __future__ import annotations

import itertools
from typing import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marconi.core.model import PRESETS
from marconi.sparse import dp
from marconi.sparse.dp import (
    TOKEN_COST,
    PotentialCost,
    expected_cost,
    flops_cost,
    place_checkpoints,
    place_checkpoints_lagrangian,
    place_checkpoints_monge,
    place_checkpoints_reference,
    satisfies_quadrangle_inequality,
    segment_cost_matrix,
)

SPEC = PRESETS["paper-7b"]
FLOPS = flops_cost(SPEC)
ScalarCost = Callable[[int, int], float]


# ================================================================================= helpers
def _scalar_of(cost: dp.Cost) -> ScalarCost:
    """An independent scalar view of a cost, for the brute force."""
    if cost is TOKEN_COST:
        return lambda c, d: float(d - c)
    if cost is FLOPS:
        return SPEC.span_flops
    return lambda c, d: float(np.asarray(cost(np.array([c]), np.array([d])))[0])


def _brute_cost(weights: np.ndarray, chosen: tuple[int, ...], scalar: ScalarCost) -> float:
    """Each depth's share of the weight times its cost: shares first, so that a subnormal weight (a
    lone 5e-324, which hypothesis drew once) is not rounded to a multiple of itself by the product."""
    total = float(np.sum(weights))
    acc = 0.0
    for d, w in enumerate(weights):
        if w > 0:
            c = max([0, *[p for p in chosen if p <= d]])
            acc += (w / total) * scalar(c, d)
    return acc


def _brute_curve(weights: np.ndarray, positions: list[int], max_m: int, scalar: ScalarCost) -> list[float]:
    """Least expected cost with at most m checkpoints, m = 0..max_m, by enumerating subsets."""
    by_size = [min((_brute_cost(weights, s, scalar) for s in itertools.combinations(positions, k)),
                   default=np.inf) for k in range(max_m + 1)]
    return list(np.minimum.accumulate(by_size))


def _close(a: float, b: float, scale: float) -> bool:
    return abs(a - b) <= 1e-9 * max(abs(scale), 1e-12)


def _scale(weights: np.ndarray, *costs: float) -> float:
    """The magnitude rounding errors scale with: the costs compared, and the weights they are sums of
    (weights [2.0, 2.2e-16] cost 1.1e-16 with no checkpoint, and the DP's sum of 2.0-sized terms
    leaves ~1e-16 of rounding: relative to the cost alone, that failed as a 100% error)."""
    return max(*(abs(c) for c in costs), float(np.abs(weights).sum()))


def _power_cost(alpha: float, beta: float, seq_len: int) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """Convex-ish user cost ``(d-c)^alpha * (1 + beta*c/N)``: increasing in c when beta > 0 (may break the QI)."""
    def cost(c: np.ndarray, d: np.ndarray) -> np.ndarray:
        c = np.asarray(c, dtype=float)
        return np.abs(np.asarray(d, dtype=float) - c) ** alpha * (1.0 + beta * c / (seq_len + 1))
    return cost


# ================================================================================= strategies
@st.composite
def small_instances(draw: st.DrawFn) -> tuple[np.ndarray, list[int], int]:
    seq_len = draw(st.integers(0, 10))
    kind = draw(st.sampled_from(["random", "point", "sparse"]))
    if kind == "point":
        weights = np.zeros(seq_len + 1)
        weights[draw(st.integers(0, seq_len))] = 1.0
    else:
        values = st.sampled_from([0.0, 0.0, 1.0, 3.0]) if kind == "sparse" else st.floats(0.0, 10.0)
        weights = np.array(draw(st.lists(values, min_size=seq_len + 1, max_size=seq_len + 1)))
        if weights.sum() <= 0:
            weights[draw(st.integers(0, seq_len))] = 1.0
    positions = sorted(draw(st.sets(st.integers(1, seq_len), max_size=seq_len))) if seq_len else []
    return weights, positions, draw(st.integers(0, 4))


@st.composite
def small_costs(draw: st.DrawFn, seq_len: int) -> dp.Cost:
    kind = draw(st.sampled_from(["tokens", "flops", "power"]))
    if kind == "tokens":
        return TOKEN_COST
    if kind == "flops":
        return FLOPS
    return _power_cost(draw(st.floats(1.0, 2.0)), draw(st.floats(-0.9, 3.0)), seq_len)


@st.composite
def large_instances(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, int]:
    """N ~ 200-500 candidates; weights a mix of a smooth density and point masses (QuALITY-like)."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    num_candidates = int(rng.integers(200, 501))
    stride = int(rng.integers(1, 5))
    seq_len = num_candidates * stride + int(rng.integers(0, stride + 1))
    weights = rng.random(seq_len + 1) ** rng.uniform(1, 8) * (rng.random(seq_len + 1) < rng.uniform(0.05, 1))
    spikes = rng.integers(0, seq_len + 1, size=int(rng.integers(0, 6)))
    weights[spikes] += rng.uniform(0, 50, size=spikes.size)
    weights[0] += 1e-3
    if draw(st.booleans()):
        positions = np.arange(1, num_candidates + 1) * stride                      # block boundaries
    else:
        positions = np.sort(rng.choice(np.arange(1, seq_len + 1), num_candidates, replace=False))
    return weights, positions, int(rng.integers(0, 65))


# ================================================================================= brute force
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_budgeted_matches_brute_force(data: st.DataObject) -> None:
    weights, positions, max_m = data.draw(small_instances())
    cost = data.draw(small_costs(weights.size - 1))
    truth = _brute_curve(weights, positions, max_m, _scalar_of(cost))
    for solve in (place_checkpoints, place_checkpoints_reference):
        plan = solve(weights, positions, max_m, cost=cost)
        assert len(plan.cost_by_budget) == max_m + 1
        for m, (got, want) in enumerate(zip(plan.cost_by_budget, truth)):
            assert _close(got, want, _scale(weights, truth[0])), (solve.__name__, plan.solver, m, got, want)
            chosen = plan.positions_by_budget[m]
            assert len(chosen) <= m and set(chosen) <= set(positions) and list(chosen) == sorted(chosen)
            assert _close(_brute_cost(weights, chosen, _scalar_of(cost)), want, _scale(weights, truth[0]))
        assert plan.positions == plan.positions_by_budget[-1]
        assert plan.expected_cost == plan.cost_by_budget[-1]


@pytest.mark.slow  # hundreds of Hypothesis examples against brute force
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_lagrangian_matches_brute_force(data: st.DataObject) -> None:
    weights, positions, _ = data.draw(small_instances())
    cost = data.draw(small_costs(weights.size - 1))
    scalar = _scalar_of(cost)
    scale = _brute_cost(weights, (), scalar)
    lam = data.draw(st.sampled_from([0.0, 0.01, 0.1, 0.5])) * max(scale, 1.0)
    size_bytes = data.draw(st.sampled_from([1.0, 3.0]))
    truth = min(_brute_cost(weights, s, scalar) + lam * size_bytes * len(s)
                for k in range(len(positions) + 1) for s in itertools.combinations(positions, k))
    plan = place_checkpoints_lagrangian(weights, positions, lam, cost=cost, checkpoint_bytes=size_bytes)
    assert _close(plan.objective, truth, _scale(weights, scale, truth))
    assert _close(plan.expected_cost, _brute_cost(weights, plan.positions, scalar), _scale(weights, scale, truth))
    assert plan.penalty == pytest.approx(lam * size_bytes * len(plan.positions))


def test_lagrangian_rounding_on_a_near_zero_cost_is_not_an_error() -> None:
    """The case Hypothesis found in CI (2026-12-05): weights [2.0, 2.2e-16], tokens cost, lambda 0: the
    plan's objective 1.1e-16 against brute force's 0.0 is rounding in sums of 2.0-sized terms."""
    weights, scalar = np.array([2.0, 2.220446049250313e-16]), _scalar_of(TOKEN_COST)
    plan = place_checkpoints_lagrangian(weights, [1], 0.0, cost=TOKEN_COST, checkpoint_bytes=1.0)
    truth = min(_brute_cost(weights, s, scalar) for s in ((), (1,)))
    assert abs(plan.objective - truth) < 1e-15
    assert _close(plan.objective, truth, _scale(weights, _brute_cost(weights, (), scalar), truth))


@pytest.mark.slow  # hundreds of Hypothesis examples against brute force
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_lagrangian_agrees_with_budgeted_at_its_count(data: st.DataObject) -> None:
    weights, positions, _ = data.draw(small_instances())
    cost = data.draw(st.sampled_from([TOKEN_COST, FLOPS]))
    scale = expected_cost(weights, [], cost=cost)
    lam = data.draw(st.floats(0.0, 0.5)) * max(scale, 1.0)
    lagr = place_checkpoints_lagrangian(weights, positions, lam, cost=cost)
    budgeted = place_checkpoints(weights, positions, len(lagr.positions), cost=cost)
    assert _close(lagr.expected_cost, budgeted.expected_cost, scale)


@pytest.mark.slow  # hundreds of Hypothesis examples against brute force
# ================================================================================= fast vs reference
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instance=large_instances(), cost=st.sampled_from([TOKEN_COST, FLOPS]))
def test_fast_matches_reference_on_large_instances(instance: tuple, cost: dp.Cost) -> None:
    weights, positions, max_m = instance
    fast = place_checkpoints(weights, positions, max_m, cost=cost)
    ref = place_checkpoints_reference(weights, positions, max_m, cost=cost)
    assert fast.solver == "monge-dc" and ref.solver == "reference"
    np.testing.assert_allclose(fast.cost_by_budget, ref.cost_by_budget, rtol=1e-9, atol=1e-12 * ref.cost_by_budget[0])
    assert expected_cost(weights, fast.positions, cost=cost) == pytest.approx(fast.expected_cost, rel=1e-12)


@pytest.mark.slow  # hundreds of Hypothesis examples against brute force
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instance=large_instances(), alpha=st.floats(1.0, 2.0))
def test_fast_matches_reference_for_user_cost_passing_the_check(instance: tuple, alpha: float) -> None:
    weights, positions, max_m = instance
    cost = _power_cost(alpha, -0.5, weights.size - 1)   # non-increasing in c: the QI holds
    fast = place_checkpoints(weights, positions, max_m, cost=cost)
    ref = place_checkpoints_reference(weights, positions, max_m, cost=cost)
    assert fast.solver == "monge-dc"
    np.testing.assert_allclose(fast.cost_by_budget, ref.cost_by_budget, rtol=1e-9)


@pytest.mark.slow  # hundreds of Hypothesis examples against brute force
# ================================================================================= precondition
@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), cost=st.sampled_from([TOKEN_COST, FLOPS]))
def test_builtin_costs_satisfy_quadrangle_inequality(seed: int, cost: dp.Cost) -> None:
    rng = np.random.default_rng(seed)
    seq_len = int(rng.integers(1, 60))
    weights = rng.random(seq_len + 1) * (rng.random(seq_len + 1) < rng.uniform(0.1, 1))
    weights[int(rng.integers(0, seq_len + 1))] += rng.uniform(0, 5)
    positions = np.sort(rng.choice(np.arange(1, seq_len + 1), int(rng.integers(0, seq_len + 1)), replace=False))
    w = segment_cost_matrix(weights, positions, cost=cost)
    assert satisfies_quadrangle_inequality(w)
    # Every quadruple a < b < c < d directly, not only the adjacent ones the check uses.
    n = w.shape[0]
    if n >= 4:
        a, b, c, d = np.array(list(itertools.combinations(range(n), 4))).T
        slack = 1e-12 * np.abs(w[np.isfinite(w)]).max()
        assert np.all(w[a, c] + w[b, d] <= w[a, d] + w[b, c] + slack)


def test_flops_cost_is_span_flops_of_the_spec() -> None:
    rng = np.random.default_rng(0)
    for _ in range(100):
        c, d = sorted(int(x) for x in rng.integers(0, 200_000, size=2))
        assert float(FLOPS(np.array([c]), np.array([d]))[0]) == pytest.approx(SPEC.span_flops(c, d), rel=1e-12)


def test_cost_increasing_in_start_breaks_the_inequality_and_falls_back() -> None:
    """A point mass beyond two checkpoints where the deeper one is dearer violates the QI."""
    def cost(c: np.ndarray, d: np.ndarray) -> np.ndarray:
        return (np.asarray(d) - np.asarray(c)) * (1.0 + 3.0 * np.asarray(c))
    weights = np.zeros(6)
    weights[5] = 1.0
    assert not satisfies_quadrangle_inequality(segment_cost_matrix(weights, [1, 2, 3, 4, 5], cost=cost))
    assert place_checkpoints(weights, [1, 2, 3, 4, 5], 2, cost=cost).solver == "reference"


def test_precondition_is_needed_for_the_fast_layers() -> None:
    """On this non-Monge user cost the divide-and-conquer layers alone return a suboptimal cost;
    place_checkpoints detects the violation and returns the optimum."""
    table = np.array([[0, 5, 3, 6, 8, 8], [0, 0, 3, 8, 8, 3], [0, 0, 0, 9, 4, 3],
                      [0, 0, 0, 0, 9, 3], [0, 0, 0, 0, 0, 9], [0, 0, 0, 0, 0, 0]], dtype=float)

    def cost(c: np.ndarray, d: np.ndarray) -> np.ndarray:
        return table[np.asarray(c), np.asarray(d)]
    weights = np.array([0.0, 1.0, 0.0, 0.0, 1.0, 1.0])
    positions = [1, 2, 3, 4, 5]
    fast = place_checkpoints_monge(weights, positions, 1, cost=cost)
    ref = place_checkpoints_reference(weights, positions, 1, cost=cost)
    assert fast.expected_cost > ref.expected_cost + 0.5        # D&C without its precondition: wrong
    plan = place_checkpoints(weights, positions, 1, cost=cost)
    assert plan.solver == "reference"
    assert plan.expected_cost == pytest.approx(_brute_curve(weights, positions, 1, _scalar_of(cost))[1])


@pytest.mark.slow  # hundreds of Hypothesis examples against brute force
# ================================================================================= monotonicity
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_more_budget_never_costs_more(data: st.DataObject) -> None:
    weights, positions, max_m = data.draw(small_instances())
    cost = data.draw(small_costs(weights.size - 1))
    plan = place_checkpoints(weights, positions, max_m, cost=cost)
    assert all(b <= a for a, b in zip(plan.cost_by_budget, plan.cost_by_budget[1:]))
    bigger = place_checkpoints(weights, positions, max_m + 1, cost=cost)
    assert bigger.expected_cost <= plan.expected_cost
    assert bigger.cost_by_budget[: max_m + 1] == pytest.approx(plan.cost_by_budget, rel=1e-12, abs=1e-300)


def test_lagrangian_count_falls_as_lambda_rises() -> None:
    rng = np.random.default_rng(3)
    weights = rng.random(301) ** 3
    positions = np.arange(1, 301)
    scale = expected_cost(weights, [], cost=FLOPS)
    counts = [len(place_checkpoints_lagrangian(weights, positions, f * scale, cost=FLOPS).positions)
              for f in (0.0, 1e-4, 1e-3, 1e-2, 1e-1, 10.0)]
    assert counts == sorted(counts, reverse=True) and counts[-1] == 0 and counts[0] > 10


# ================================================================================= edge cases
def test_zero_budget_stores_nothing() -> None:
    plan = place_checkpoints([1.0, 1.0, 2.0], [1, 2], 0)
    assert plan.positions == () and plan.cost_by_budget == (pytest.approx(1.25),)


def test_empty_sequence() -> None:
    plan = place_checkpoints([1.0], [], 3)
    assert plan.positions == () and plan.cost_by_budget == (0.0, 0.0, 0.0, 0.0)
    assert place_checkpoints_lagrangian([1.0], [], 1.0).objective == 0.0


def test_single_token_sequence() -> None:
    plan = place_checkpoints([0.0, 1.0], [1], 1)
    assert plan.positions == (1,) and plan.cost_by_budget == (1.0, 0.0)


def test_all_mass_at_zero_needs_no_checkpoint() -> None:
    for cost in (TOKEN_COST, FLOPS):
        plan = place_checkpoints([5.0, 0, 0, 0, 0], [1, 2, 3, 4], 4, cost=cost)
        assert plan.positions == () and plan.cost_by_budget == (0.0,) * 5


def test_candidate_at_sequence_end_serves_full_overlaps() -> None:
    weights = np.zeros(101)
    weights[100] = 1.0                                  # every request re-reads the whole sequence
    plan = place_checkpoints(weights, [25, 50, 75, 100], 1, cost=FLOPS)
    assert plan.positions == (100,) and plan.expected_cost == 0.0
    assert plan.cost_by_budget[0] == pytest.approx(SPEC.prefill_flops(100))


def test_budget_beyond_candidates_is_capped() -> None:
    plan = place_checkpoints([0, 1, 1, 1], [1, 3], 5)
    assert len(plan.cost_by_budget) == 6 and plan.positions == (1, 3)
    assert plan.cost_by_budget[2:] == (plan.cost_by_budget[2],) * 4


def test_positions_may_come_unsorted() -> None:
    weights = np.arange(11.0)
    assert place_checkpoints(weights, [9, 3, 6], 2).cost_by_budget == place_checkpoints(weights, [3, 6, 9], 2).cost_by_budget


def test_unnormalised_weights_give_the_same_placement() -> None:
    weights = np.array([0, 2, 0, 5, 1, 0, 9, 3.0])
    a, b = place_checkpoints(weights, range(1, 8), 2), place_checkpoints(weights * 1000, range(1, 8), 2)
    assert a.positions == b.positions and a.expected_cost == pytest.approx(b.expected_cost)


def test_potential_cost_wrapper_matches_a_plain_callable() -> None:
    weights = np.random.default_rng(5).random(40)
    latency = PotentialCost("latency", lambda x: 2.0 * x + 0.01 * x**1.5)
    plain = lambda c, d: latency(c, d)  # noqa: E731 - same cost without the potential fast path
    a, b = place_checkpoints(weights, range(1, 40), 6, cost=latency), place_checkpoints(weights, range(1, 40), 6, cost=plain)
    np.testing.assert_allclose(a.cost_by_budget, b.cost_by_budget, rtol=1e-9)


@pytest.mark.parametrize("weights, positions, message", [
    ([], [], "non-empty"),
    ([[1.0]], [], "non-empty 1-D"),
    ([1.0, -1.0], [1], "non-negative"),
    ([1.0, np.nan], [1], "finite"),
    ([0.0, 0.0], [1], "positive sum"),
    ([1.0, 1.0], [0], r"\[1, N=1\]"),
    ([1.0, 1.0], [2], r"\[1, N=1\]"),
    ([1.0, 1.0, 1.0], [1, 1], "distinct"),
    ([1.0, 1.0, 1.0], [1.5], "integers"),
])
def test_invalid_inputs_raise(weights: list, positions: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        place_checkpoints(weights, positions, 1)


def test_invalid_budget_lambda_and_cost_raise() -> None:
    with pytest.raises(ValueError, match="max_checkpoints"):
        place_checkpoints([1.0, 1.0], [1], -1)
    with pytest.raises(ValueError, match="lam"):
        place_checkpoints_lagrangian([1.0, 1.0], [1], -1.0)
    with pytest.raises(ValueError, match=r"cost\(c, c\)"):
        place_checkpoints([1.0, 1.0, 1.0], [1], 1, cost=lambda c, d: d - c + 1.0)


# ================================================================================= size
@pytest.mark.parametrize("cost", [TOKEN_COST, FLOPS], ids=["tokens", "flops"])
def test_fast_solver_handles_thousands_of_candidates(cost: dp.Cost) -> None:
    """Timings live in benchmarks/sparse_dp_bench.py; here only that a large instance solves."""
    rng = np.random.default_rng(7)
    weights = rng.random(16_001) ** 4
    positions = np.arange(1, 4001) * 4                           # N = 4000 candidates
    plan = place_checkpoints(weights, positions, 64, cost=cost)
    assert plan.solver == "monge-dc" and plan.num_checkpoints == 64
