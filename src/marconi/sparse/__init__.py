"""Sparse prefix caching: where to keep recurrent-state checkpoints along a cached sequence.

A hybrid model can resume from one stored SSM state instead of a dense per-token history, so a
cache may keep states at a few positions only. Given the distribution of how deep future requests
overlap a sequence, :mod:`marconi.sparse.dp` places checkpoints exactly (budgeted or Lagrangian),
and :mod:`marconi.sparse.overlap` estimates that distribution online from the depths a cache sees,
keyed by an opaque key, by the token path or by the block path.

    weights = estimator.depth_weights(key, seq_len)            # P(d), d = 0..seq_len
    plan = place_checkpoints(weights, candidates, 8, cost=flops_cost(spec))
    plan.positions, plan.expected_cost, plan.cost_by_budget    # budget-8 placement + Pareto curve
"""

from marconi.sparse.dp import (
    TOKEN_COST,
    Cost,
    LagrangianPlacement,
    Placement,
    PotentialCost,
    expected_cost,
    flops_cost,
    place_checkpoints,
    place_checkpoints_lagrangian,
    place_checkpoints_monge,
    place_checkpoints_reference,
    satisfies_quadrangle_inequality,
    segment_cost_matrix,
    validate_positions,
)
from marconi.sparse.overlap import (
    BlockEstimatorConfig,
    BlockOverlapEstimator,
    EstimatorConfig,
    GeometricSpread,
    OverlapEstimator,
    OverlapPrior,
    TreeEstimatorConfig,
    TreeOverlapEstimator,
    UniformSpread,
    bin_depths,
    binned_depth_weights,
    path_keys,
)

__all__ = [
    "TOKEN_COST",
    "BlockEstimatorConfig",
    "BlockOverlapEstimator",
    "Cost",
    "EstimatorConfig",
    "GeometricSpread",
    "LagrangianPlacement",
    "OverlapEstimator",
    "OverlapPrior",
    "Placement",
    "PotentialCost",
    "TreeEstimatorConfig",
    "TreeOverlapEstimator",
    "UniformSpread",
    "bin_depths",
    "binned_depth_weights",
    "expected_cost",
    "flops_cost",
    "path_keys",
    "place_checkpoints",
    "place_checkpoints_lagrangian",
    "place_checkpoints_monge",
    "place_checkpoints_reference",
    "satisfies_quadrangle_inequality",
    "segment_cost_matrix",
    "validate_positions",
]
