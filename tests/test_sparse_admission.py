"""The sparse-dp admission policy places exactly the DP's optimum (issue 21: the candidate cap; the first,
``estimator=prefix`` estimator: its weights are what these tests recompute).

With a fresh estimator every depth of the prior weighs the same; the old cap of 256 candidates kept
the deepest 256, and at N = 8000, M = 2 placed (7745, 8000), 1.86x the optimum's expected
recompute. The budgeted placement now runs over every depth.
"""

from __future__ import annotations

import numpy as np
import pytest

from marconi.core.admission import AdmissionContext, MatchResult
from marconi.core.cache import PrefixCache
from marconi.core.model import PRESETS
from marconi.sparse.admission import SparseDPAdmission, cap_candidates
from marconi.sparse.dp import expected_cost, place_checkpoints
from marconi.sparse.overlap import EstimatorConfig, OverlapEstimator

SPEC = PRESETS["paper-7b"]


def _context(n: int, resume: int = 0, request_id: int = 0) -> AdmissionContext:
    tokens = np.arange(n, dtype=np.int32)
    return AdmissionContext(tokens, n, MatchResult(n, resume, resume), None, SPEC, request_id)


def _optimum(policy: SparseDPAdmission, n: int, resume: int, m: int) -> tuple[tuple[int, ...], np.ndarray]:
    """The DP over every position in (resume, n], on the weights the policy saw (an independent
    estimator fed the same observation)."""
    twin = OverlapEstimator(EstimatorConfig(half_life_obs=512.0))
    key = hash(np.arange(n, dtype=np.int32)[: policy.key_tokens].tobytes())
    twin.observe(key, resume)
    weights = twin.depth_weights(key, n).copy()
    weights[: resume + 1] = 0.0
    cost = policy.recompute_cost(SPEC, resume)
    best = place_checkpoints(weights, np.arange(resume + 1, n + 1), m, cost=cost, curve=False)
    return best.positions, weights


def test_a_fresh_estimator_places_the_exact_optimum_at_n_8000():
    policy = SparseDPAdmission(m=2, marconi=False, estimator="prefix")
    placed = tuple(policy.prefill_checkpoints(_context(8000)))
    optimum, weights = _optimum(policy, 8000, 0, 2)
    assert placed == optimum == (4039, 8000)
    cost = policy.recompute_cost(SPEC, 0)
    deepest_256 = expected_cost(weights, [7745, 8000], cost=cost)
    assert deepest_256 / expected_cost(weights, placed, cost=cost) > 1.8   # what the old cap placed


@pytest.mark.parametrize("n, resume, m", [(300, 0, 3), (2000, 700, 4), (5000, 1234, 1)])
def test_placements_match_the_dp_over_every_position(n, resume, m):
    policy = SparseDPAdmission(m=m, marconi=False, estimator="prefix")
    placed = tuple(policy.prefill_checkpoints(_context(n, resume)))
    assert placed == _optimum(policy, n, resume, m)[0]
    assert all(resume < p <= n for p in placed)


def test_the_cap_spreads_tied_depths_instead_of_keeping_the_deepest():
    support = np.arange(1, 8001)
    weights = np.ones(8001)
    weights[8000] = 3.0                                  # the end mass: heavier, always kept
    weights[[100, 5000]] = 2.0
    kept = cap_candidates(support, weights, 256)
    assert kept.size == 256 and np.all(np.diff(kept) > 0)
    assert {100, 5000, 8000} <= set(kept.tolist())
    gaps = np.diff(kept[(kept != 100) & (kept != 5000) & (kept != 8000)])
    assert gaps.min() >= 30 and gaps.max() <= 33        # ~8000 / 253 apart: spread over the whole run
    assert cap_candidates(support[:10], weights, 256).tolist() == list(range(1, 11))


def test_the_lagrangian_form_keeps_its_capped_candidates_spread():
    policy = SparseDPAdmission(lam=1e-9, marconi=False, max_candidates=64, estimator="prefix")
    placed = policy.prefill_checkpoints(_context(8000))
    assert placed and min(placed) < 4000                 # not all crowded into the deepest 64 depths


def test_sparse_dp_serves_a_cache_end_to_end():
    cache = PrefixCache(SPEC, 50e9, SparseDPAdmission(m=2), "lru")
    doc = np.arange(3000)
    for i in range(3):
        cache.process(np.concatenate((doc, [40000 + i])), [50000 + i])
        cache.check_invariants()
    assert cache.stats.checkpoints_admitted >= 3
