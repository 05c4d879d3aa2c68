"""``sparse-dp``: admission that places a sequence's checkpoints by the exact DP over overlap depths.

Per prefill: record the KV-hit depth, estimate ``P(d)`` (``estimator=tree``, the default, or
``prefix``), and place at most ``m`` checkpoints in ``(resume, input length]`` minimising recompute
charged from the resume point (or + ``lam`` · bytes), keeping Marconi's last-token (and, unless
``marconi=false``, branch-point) checkpoints. ``drift`` bounds re-placement inside the recomputed
span. See docs/sparse.md.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Iterable

import numpy as np

from marconi.core.admission import ADMISSION_POLICIES, AdmissionContext, BaseAdmission, FinalPlan, MarconiAdmission
from marconi.core.registry import ConfigError, Domain
from marconi.options import CHECKPOINT_BUDGET
from marconi.sparse.dp import TOKEN_COST, PotentialCost, flops_cost, place_checkpoints, place_checkpoints_lagrangian
from marconi.sparse.overlap import (
    EstimatorConfig,
    OverlapEstimator,
    TreeEstimatorConfig,
    TreeOverlapEstimator,
    path_keys,
)

if TYPE_CHECKING:
    from marconi.core.cache import PrefixCache
    from marconi.core.model import ModelSpec

__all__ = ["SparseDPAdmission", "cap_candidates"]


class SparseDPAdmission(BaseAdmission):
    """Checkpoint placement by dynamic programming over the estimated overlap-depth distribution."""

    name = "sparse-dp"
    page_size = 1
    caches = True

    def __init__(self, m: int = 4, lam: float = -1.0, cost: str = "flops", marconi: bool = True,
                 key_tokens: int = 128, half_life: float = 512.0, max_candidates: int = 0,
                 candidates: str = "all", estimator: str = "tree", half_life_s: float = -1.0,
                 max_nodes: int = 2048, drift: float = 0.1) -> None:
        if m < 0:
            raise ConfigError(f"sparse-dp: m must be >= 0, got {m}")
        if cost not in ("flops", "tokens"):
            raise ConfigError(f"sparse-dp: cost must be 'flops' or 'tokens', got {cost!r}")
        if key_tokens < 1 or max_candidates < 0 or max_nodes < 1:
            raise ConfigError("sparse-dp: key_tokens and max_nodes must be >= 1, max_candidates >= 0")
        if candidates not in ("observed", "all"):
            raise ConfigError(f"sparse-dp: candidates must be 'observed' or 'all', got {candidates!r}")
        if estimator not in ("tree", "prefix"):
            raise ConfigError(f"sparse-dp: estimator must be 'tree' or 'prefix', got {estimator!r}")
        if not 0.0 <= drift <= 1.0:
            raise ConfigError(f"sparse-dp: drift must lie in [0, 1], got {drift}")
        if not half_life > 0 or half_life_s == 0:
            raise ConfigError("sparse-dp: half_life must be > 0 and half_life_s > 0 (or < 0: no time decay)")
        self.candidate_rule = candidates
        self.m = m
        self.lam = None if lam < 0 else lam
        self.cost_name = cost
        self.marconi = MarconiAdmission() if marconi else None
        self.key_tokens = key_tokens
        self.max_candidates = max_candidates
        self.estimator_name = estimator
        self.drift = drift
        self.half_life_s = math.inf if half_life_s < 0 else half_life_s
        self.estimator = OverlapEstimator(EstimatorConfig(half_life_obs=half_life))
        self.tree_estimator = TreeOverlapEstimator(TreeEstimatorConfig(
            half_life_obs=half_life, half_life_s=self.half_life_s, max_nodes=max_nodes))
        self._plans: dict[int, tuple[int, ...]] = {}
        self.num_planned = 0
        self.num_replaced = 0   # planned requests that re-placed checkpoints inside a drifted stored span

    def bind(self, cache: "PrefixCache") -> None:
        """The cache this policy admits for: time decay reads its clock (trace time in the simulator)."""
        self.tree_estimator.set_clock(cache.clock)

    # ------------------------------------------------------------------ admission protocol
    def prefill_checkpoints(self, ctx: AdmissionContext) -> Iterable[int]:
        if self.estimator_name == "tree":
            planned = self._plan_tree(ctx)
        else:
            key = hash(ctx.tokens[: self.key_tokens].tobytes())
            self.estimator.observe(key, min(ctx.match.kv_hit_len, ctx.input_len))
            planned = self._plan(key, ctx)
        self._plans[ctx.request_id] = planned
        base = tuple(self.marconi.prefill_checkpoints(ctx)) if self.marconi else ()
        return sorted(set(planned) | set(base))

    def final_plan(self, ctx: AdmissionContext, total_len: int) -> FinalPlan:
        # Read, not popped: the cache may ask again (``PrefixCache.finish_checkpoints`` dry runs).
        planned = self._plans.get(ctx.request_id, ())
        base = self.marconi.final_plan(ctx, total_len).checkpoints if self.marconi else (total_len,)
        return FinalPlan(total_len, tuple(sorted(set(planned) | set(base))))

    def end_request(self, request_id: int) -> None:
        """The cache finished or aborted the request: forget its plan."""
        self._plans.pop(request_id, None)

    @property
    def num_open_plans(self) -> int:
        """Plans of requests still in flight (0 once every request ended: no plan outlives its request)."""
        return len(self._plans)

    def describe(self) -> dict[str, object]:
        return {"admission": self.name, "m": self.m, "lam": self.lam, "cost": self.cost_name,
                "marconi": self.marconi is not None, "estimator": self.estimator_name,
                **({"drift": self.drift, "half_life_s": self.half_life_s} if self.estimator_name == "tree" else {})}

    # ------------------------------------------------------------------ the DP
    def recompute_cost(self, spec: "ModelSpec", resume: int) -> PotentialCost:
        """The placement's cost for a request resumed at ``resume``: FLOPs (or tokens) from the deepest kept
        state, nothing below ``resume`` paid."""
        base = flops_cost(spec) if self.cost_name == "flops" else TOKEN_COST
        potential = base.potential
        return PotentialCost(f"{base.name}-from-{resume}", lambda x: potential(np.maximum(x, resume)))

    def _candidates(self, key: int, weights: np.ndarray, resume: int, n: int) -> np.ndarray:
        """Candidate depths in (resume, n], ascending: every depth with mass (``candidates="all"``: exact,
        since an optimal checkpoint sits at a depth with mass) or only observed depths (``"observed"``)."""
        if self.candidate_rule == "observed":
            observed = self.estimator.observed_depths(key)
            support = observed[(observed > resume) & (observed <= n)]
            return support[weights[support] > 0]
        return np.flatnonzero(weights[resume + 1: n + 1] > 0) + resume + 1

    def _plan(self, key: int, ctx: AdmissionContext) -> tuple[int, ...]:
        n, resume = ctx.input_len, ctx.match.usable_hit_len
        if n <= resume or (self.m == 0 and self.lam is None):
            return ()
        weights = self.estimator.depth_weights(key, n).copy()
        weights[: resume + 1] = 0.0           # served by checkpoints this request already resumed from
        if weights.sum() <= 0:
            return ()
        candidates = self._candidates(key, weights, resume, n)
        if candidates.size == 0:
            return ()
        return self._solve(ctx, weights, candidates, resume)

    def _solve(self, ctx: AdmissionContext, weights: np.ndarray, candidates: np.ndarray,
               resume: int) -> tuple[int, ...]:
        cost = self.recompute_cost(ctx.spec, resume)
        self.num_planned += 1
        if self.lam is not None:
            if self.max_candidates:
                candidates = cap_candidates(candidates, weights, self.max_candidates)
            placement = place_checkpoints_lagrangian(weights, candidates, self.lam, cost=cost,
                                                     checkpoint_bytes=ctx.spec.ssm_checkpoint_bytes)
            return tuple(int(p) for p in placement.positions)
        placement = place_checkpoints(weights, candidates, self.m, cost=cost, curve=False)
        return tuple(int(p) for p in placement.positions)

    def _plan_tree(self, ctx: AdmissionContext) -> tuple[int, ...]:
        """Observe, attach and place with the tree estimator (module doc: re-placement on drift)."""
        n, resume = ctx.input_len, ctx.match.usable_hit_len
        hit = min(ctx.match.kv_hit_len, n)
        est = self.tree_estimator
        keys = path_keys(ctx.tokens[:n])
        est.observe(keys, hit)
        est.attach(keys, hit)
        if n <= resume or (self.m == 0 and self.lam is None):
            return ()
        weights, territories = est.path_weights(keys, n)
        weights = weights.copy()
        weights[: resume + 1] = 0.0           # served by checkpoints this request already resumed from
        replaced = []
        for start, end in territories:
            lo, hi = max(start, resume + 1), min(end, hit)
            if lo >= hi:                      # no stored span of this node that the request recomputes
                continue
            if est.drift(keys, start) > self.drift:
                replaced.append(start)
            else:
                weights[lo:hi] = 0.0          # its stored checkpoints were placed for what it still sees
        if weights.sum() <= 0:
            return ()
        if self.candidate_rule == "observed":
            candidates = self._observed_tree_candidates(keys, territories, weights, resume, n)
        else:
            candidates = np.flatnonzero(weights[resume + 1: n + 1] > 0) + resume + 1
        if candidates.size == 0:
            return ()
        planned = self._solve(ctx, weights, candidates, resume)
        for start in replaced:
            est.mark_placed(keys, start)
        if any(start < p < hit for start in replaced for p in planned):
            self.num_replaced += 1
        for start, _ in territories:
            if start >= hit:                  # the request's own new part was placed just now
                est.mark_placed(keys, start)
        return planned

    def _observed_tree_candidates(self, keys: np.ndarray, territories: list[tuple[int, int]],
                                  weights: np.ndarray, resume: int, n: int) -> np.ndarray:
        found = set()
        for start, end in territories:
            for rel in self.tree_estimator.observed_depths(keys, start):
                d = min(start + rel, n)
                if start <= d < end and d > resume and weights[d] > 0:
                    found.add(d)
        return np.array(sorted(found), dtype=np.int64)


def cap_candidates(support: np.ndarray, weights: np.ndarray, cap: int) -> np.ndarray:
    """At most ``cap`` of the ascending ``support``: the heaviest, ascending; depths tied at the cut-off
    are spread evenly over their range. An approximation once the support exceeds the cap."""
    if support.size <= cap:
        return support
    w = weights[support]
    cutoff = np.sort(w)[-cap]                      # the cap-th largest weight
    above = support[w > cutoff]
    tied = support[w == cutoff]
    need = cap - above.size                        # 1 <= need <= tied.size
    # the middle of each of ``need`` equal parts of the tied run: strictly increasing, since the
    # numerators grow by 2·tied.size >= the denominator 2·need
    spread = (2 * np.arange(need) + 1) * tied.size // (2 * need)
    return np.sort(np.concatenate((above, tied[spread])))


@ADMISSION_POLICIES.register("sparse-dp", "checkpoints placed by the exact DP over estimated overlap depths "
                                          "(+ Marconi's branch point and last token)",
                             domains={"m": CHECKPOINT_BUDGET, "lam": Domain(),
                                      "key_tokens": Domain(1, 1 << 24, integer=True),
                                      "half_life": Domain(0, 1e12, lo_open=True),
                                      "max_candidates": Domain(0, 1 << 24, integer=True), "half_life_s": Domain(),
                                      "max_nodes": Domain(1, 1 << 24, integer=True), "drift": Domain(0, 1)})
def _sparse_dp(m: int = 4, lam: float = -1.0, cost: str = "flops", marconi: bool = True, key_tokens: int = 128,
               half_life: float = 512.0, max_candidates: int = 0, candidates: str = "all", estimator: str = "tree",
               half_life_s: float = -1.0, max_nodes: int = 2048, drift: float = 0.1) -> SparseDPAdmission:
    return SparseDPAdmission(m=m, lam=lam, cost=cost, marconi=marconi, key_tokens=key_tokens, half_life=half_life,
                             max_candidates=max_candidates, candidates=candidates, estimator=estimator,
                             half_life_s=half_life_s, max_nodes=max_nodes, drift=drift)
