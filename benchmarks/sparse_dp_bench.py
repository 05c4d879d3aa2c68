"""Checkpoint-placement DP speed: the O(M K^2) reference vs the O(M K log K) Monge solver.

Prints seconds per solve for growing candidate counts K (budget M = 64), both costs, and the
largest relative difference between the two solvers' optimal costs. Not a test.

    python benchmarks/sparse_dp_bench.py
"""

from __future__ import annotations

import sys
import time

import numpy as np

from marconi.core.model import PRESETS
from marconi.report import format_table
from marconi.sparse import TOKEN_COST, flops_cost, place_checkpoints, place_checkpoints_reference


def best_of(fn, repeats: int = 3) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> int:
    rng = np.random.default_rng(0)
    rows = []
    for k in (500, 1000, 2000, 4000):
        n = 4 * k
        weights = rng.random(n + 1) ** 4
        positions = np.arange(1, k + 1) * 4
        for name, cost in (("tokens", TOKEN_COST), ("flops", flops_cost(PRESETS["paper-7b"]))):
            fast_s, fast = best_of(lambda: place_checkpoints(weights, positions, 64, cost=cost))
            row = {"K": k, "cost": name, "fast_s": fast_s, "solver": fast.solver}
            if k <= 2000:
                ref_s, ref = best_of(lambda: place_checkpoints_reference(weights, positions, 64, cost=cost), 1)
                row["reference_s"] = ref_s
                row["max_rel_diff"] = max(abs(a - b) / max(abs(ref.cost_by_budget[0]), 1e-300)
                                          for a, b in zip(fast.cost_by_budget, ref.cost_by_budget))
            rows.append(row)
    print(format_table(rows, [("K", "K", None), ("cost", "cost", None), ("solver", "solver", None),
                              ("fast (s)", "fast_s", lambda v: f"{v:.3f}"),
                              ("reference (s)", "reference_s", lambda v: f"{v:.3f}"),
                              ("max rel diff", "max_rel_diff", lambda v: f"{v:.1e}")]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
