"""Sparse prefix caching: where to keep recurrent-state checkpoints along a cached sequence.

:mod:`marconi.sparse.dp` places checkpoints exactly given the overlap-depth distribution;
:mod:`marconi.sparse.overlap` estimates it online; :mod:`marconi.sparse.admission` is the
``sparse-dp`` policy using both.
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
