"""``marconi experiment sparse``: exact checkpoint placement (the DP) against placement heuristics.

For each workload it compares, at checkpoint budgets ``M``, on the same cache (token-level radix
tree, LRU, unbounded capacity unless ``--capacities`` adds a constrained one):

=====================  ===================================================================
strategy               admission policy (every one also keeps the last decoded token)
=====================  ===================================================================
``sparse-dp``          ``sparse-dp(m=M;marconi=false)``: M checkpoints placed by the exact DP
                       over the online overlap-depth estimate (FLOPs cost)
``sparse-dp+marconi``  ``sparse-dp(m=M)``: the same plus Marconi's branch point
``sparse-dp-lam``      ``sparse-dp(lam=X;marconi=false)``: no hard budget; a checkpoint must
                       save ``tau`` tokens' worth of FLOPs per future hit, ``X = tau*F(1)/bytes``
``uniform``            ``uniform(m=M)``: M checkpoints evenly spaced over the input
``every-block``        ``every-block(k=K;paged=false)``: block caching, token-level KV matching,
                       K a power of two from median sequence length / max(M) up to it
``last-token``         only the last decoded token
``marconi``            Marconi's branch point + last token
=====================  ===================================================================

Two views:

* **Simulation** (``kind="simulation"``): the trace replayed through the cache. Per point:
  checkpoints admitted per cached sequence (a checkpoint shared by many sequences counts once),
  peak SSM bytes per cached sequence, recomputed tokens (``unusable_tokens``: KV found but the
  deepest checkpoint on the path was shallower), recomputed FLOPs ``sum_r span_flops(usable_r,
  kv_hit_r)``, token hit rate.
* **Analytic** (``kind="analytic"``): the DP's own problem on the empirical ("oracle") overlap
  distribution. Each request's cached sequence ``S_i`` (input + output, ``T_i`` tokens) is overlapped
  by every later request ``j`` to depth ``d_ij = min(LCP(S_j, S_i), len(input_j))``; ``P_i`` is the
  histogram of those depths. Every strategy keeps the last token ``T_i`` for free; ``sparse-dp``
  places M more by :func:`~marconi.sparse.place_checkpoints` on ``P_i`` (its whole
  ``cost_by_budget`` curve), the heuristics' positions come from their admission policies'
  ``final_plan`` (Marconi's branch point is where ``S_i`` leaves the tree of earlier sequences), and
  are scored by :func:`~marconi.sparse.expected_cost`. Costs are summed over all (sequence, later
  request) pairs and reported per pair, in tokens and in FLOPs (the DP is solved for each). This
  is each sequence alone -- a checkpoint shared by many sequences counts for each -- so it shows
  what exact placement can do with P known, next to what the online estimator does in simulation.

Workloads (:data:`WORKLOADS`): ``quality`` (QuALITY questions on real articles; synthetic doc-qa of
the same shape where ``../shared/data/quality`` is absent, said so in the output), ``system-prompts``
(:func:`prompt_tree_trace`: a base prompt extended by variants to different depths), ``swe``
(mini-swe-agent trajectories; the vendored sample as fallback), ``sharegpt`` (shared data only:
skipped, said so, where absent) and ``doc-qa`` (synthetic questions at 1/4..1 of a document).

Outputs in ``--out`` (each written atomically): ``records.jsonl`` (one record per point, the whole
configuration echoed), ``plots/<workload>_<capacity>_simulation.png`` and
``plots/<workload>_analytic.png`` (Pareto frontiers), ``summary.md`` (tables at M = 1, 2, 4, 8 and
findings computed from the records; ``--from-records`` redraws both from an earlier run). Only the
``_cmd_*`` handlers print::

    marconi experiment sparse --out results/sparse --quick          # M in {1,2,4,8}, about a minute on 2 cores
    marconi experiment sparse --out results/sparse                  # M = 1..16, full traces (~15 min on 2 cores)
    marconi experiment sparse --out results/sparse --capacities large,0.25x --workloads quality,swe
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from marconi.admission import AdmissionContext, MatchResult, make_admission
from marconi.model import ModelSpec, get_model
from marconi.pool import worker_pool
from marconi.registry import ConfigError
from marconi.sparse import (
    TOKEN_COST,
    PotentialCost,
    expected_cost,
    flops_cost,
    place_checkpoints,
)
from marconi.units import parse_capacity
from marconi.workloads.synthetic import prompt_tree_trace
from marconi.io import atomic_write, check_output
from marconi.workloads.trace import Trace

__all__ = [
    "SCALES",
    "WORKLOADS",
    "Strategy",
    "StudyConfig",
    "Verdict",
    "Workload",
    "analytic_records",
    "block_sizes",
    "build_workload",
    "findings",
    "plan_strategies",
    "plan_tasks",
    "prompt_tree_trace",
    "register",
    "run_study",
    "sequence_overlaps",
    "simulation_record",
    "summary_markdown",
    "verdict",
    "write_outputs",
]

SCALES = ("tiny", "quick", "full")
DEFAULT_WORKLOADS = ("quality", "system-prompts", "swe", "sharegpt")
SUMMARY_BUDGETS = (1, 2, 4, 8)
LARGE = "large"
LARGE_CAPACITY_BYTES = 2 ** 60   # "unbounded": placement quality without eviction noise
# Findings: a DP point "ties" a heuristic point when their recomputed FLOPs differ by at most
# max(_TIE_REL * theirs, _TIE_ABS * input FLOPs); "Marconi is enough" when its recomputed FLOPs are
# within _ENOUGH_ABS of input FLOPs of the best DP point's.
_TIE_REL = 0.02
_TIE_ABS = 0.001
_ENOUGH_ABS = 0.01
_DENSITY_SLACK = 1.02  # "at no more checkpoints": a DP point may hold up to 2% more per sequence


# ================================================================================= configuration
@dataclass(frozen=True, slots=True)
class StudyConfig:
    """What to run. ``budgets`` are the M values; ``lam_tokens`` the break-even token counts of the
    ``sparse-dp(lam=...)`` points; ``combined_budgets`` the M values of ``sparse-dp+marconi``."""

    workloads: tuple[str, ...] = DEFAULT_WORKLOADS
    budgets: tuple[int, ...] = tuple(range(1, 17))
    scale: str = "full"
    model: str = "paper-7b"
    capacities: tuple[str, ...] = (LARGE,)
    lam_tokens: tuple[int, ...] = (4, 16, 64, 256, 1024)
    combined_budgets: tuple[int, ...] = SUMMARY_BUDGETS
    seed: int = 0
    workers: int | None = None

    def __post_init__(self) -> None:
        if self.scale not in SCALES:
            raise ConfigError(f"scale must be one of {', '.join(SCALES)}, got {self.scale!r}")
        unknown = [w for w in self.workloads if w not in WORKLOADS]
        if unknown or not self.workloads:
            raise ConfigError(f"unknown workload(s) {', '.join(unknown) or '(none given)'}; "
                              f"choose from {', '.join(WORKLOADS)}")
        if not self.budgets or any(m < 1 for m in self.budgets) or list(self.budgets) != sorted(set(self.budgets)):
            raise ConfigError(f"budgets must be distinct ascending integers >= 1, got {self.budgets}")
        if any(t <= 0 for t in self.lam_tokens):
            raise ConfigError("lam break-even token counts must be > 0")
        for cap in self.capacities:
            if cap != LARGE:
                parse_capacity(cap)
        get_model(self.model)

    @classmethod
    def for_run(cls, *, quick: bool = False, tiny: bool = False, **overrides: Any) -> StudyConfig:
        """Defaults of a full, ``--quick`` or ``--tiny`` run, with explicit overrides on top."""
        base: dict[str, Any] = {}
        if quick or tiny:
            base = {"scale": "tiny" if tiny else "quick", "budgets": SUMMARY_BUDGETS, "lam_tokens": (16, 256)}
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)


# ================================================================================= workloads
@dataclass(frozen=True, slots=True)
class Workload:
    """A trace to study and what it was built from (``source`` says so when a fallback was used)."""

    name: str
    trace: Trace
    source: str

    def describe(self) -> dict[str, Any]:
        lens = self.trace.input_lens()
        return {"workload": self.name, "trace": self.trace.name, "trace_source": self.source,
                "num_requests": len(self.trace), "num_sessions": self.trace.num_sessions,
                "input_tokens": int(lens.sum()), "median_input_len": float(np.median(lens)) if lens.size else 0.0}


def _quality(scale: str, seed: int) -> Workload:
    from marconi.workloads.quality import build_quality_trace, default_quality_files
    from marconi.workloads.synthetic import doc_qa_trace

    files = default_quality_files()
    if files:
        trace = build_quality_trace(files, seed=seed, max_articles=4 if scale == "tiny" else None)
        return Workload("quality", trace, f"QuALITY: {len(files)} files under {files[0].parent} "
                                          f"({trace.meta['num_articles']} articles, {len(trace)} questions)")
    # The same shape as the QuALITY sample (16 articles of ~7.5k tokens, ~12 questions each, a
    # 33-token instruction), questions asked after the whole document.
    docs, doc_len, per_doc = (4, 1500, 6) if scale == "tiny" else (16, 7500, 12)
    trace = doc_qa_trace(num_docs=docs, doc_len=doc_len, questions_per_doc=per_doc, depth_fractions=(1.0,),
                         question_len=75, answer_len=18, instruction_len=33, seed=seed)
    return Workload("quality", trace, "FALLBACK: ../shared/data/quality is absent; synthetic doc-qa "
                                      f"({docs} documents x {per_doc} questions, {doc_len} tokens each)")


def _doc_qa(scale: str, seed: int) -> Workload:
    from marconi.workloads.synthetic import doc_qa_trace

    docs, doc_len, per_doc = {"tiny": (3, 1200, 40), "quick": (6, 6000, 24), "full": (8, 8000, 32)}[scale]
    trace = doc_qa_trace(num_docs=docs, doc_len=doc_len, questions_per_doc=per_doc, instruction_len=64, seed=seed)
    return Workload("doc-qa", trace, f"synthetic doc-qa: {docs} documents x {per_doc} questions, {doc_len} tokens, "
                                     "questions after 1/4, 1/2, 3/4 or all of the document")


def _system_prompts(scale: str, seed: int) -> Workload:
    shrink, sessions = {"tiny": (8, 60), "quick": (1, 240), "full": (1, 600)}[scale]
    trace = prompt_tree_trace(num_sessions=sessions, base_len=1000 // shrink,
                              variant_lens=tuple(n // shrink for n in (230, 710, 1490, 2950)),
                              sub_variant_lens=tuple(n // shrink for n in (430, 1870)), seed=seed)
    depths = trace.meta["prompt_depths"]
    return Workload("system-prompts", trace, f"synthetic prompt tree: a {trace.meta['params']['base_len']}-token base "
                                             f"prompt extended by {len(depths)} variants and sub-variants to depths "
                                             f"{min(depths)}..{max(depths)}, {sessions} user sessions of 1-3 turns")


def _swe(scale: str, seed: int) -> Workload:
    from marconi.workloads import build_swe_trace, bundled_data_dir
    from marconi.workloads.swe import default_swe_paths

    paths = default_swe_paths()
    sessions = {"tiny": 3, "quick": 20, "full": 100}[scale]
    trace = build_swe_trace(paths, num_sessions=sessions, seed=seed)
    vendored = paths and paths[0].is_relative_to(bundled_data_dir())
    note = "FALLBACK: ../shared/data/swe is absent; the vendored 10-trajectory sample" if vendored else \
        f"mini-swe-agent trajectories under {paths[0].parent}"
    return Workload("swe", trace, f"{note}, first {trace.meta['num_sessions']} sessions, paper recipe")


def _sharegpt(scale: str, seed: int) -> Workload | None:
    from marconi.workloads.sharegpt import build_sharegpt_trace, default_sharegpt_files

    files = default_sharegpt_files()
    if not files:
        return None  # research-use data that is never vendored: no fallback
    sessions = {"tiny": 4, "quick": 30, "full": 100}[scale]
    trace = build_sharegpt_trace(files, num_sessions=sessions)
    return Workload("sharegpt", trace, f"ShareGPT V3 (>= 20 messages) under {files[0].parent}, "
                                       f"first {trace.meta['num_sessions']} sessions, paper recipe")


WORKLOADS: dict[str, Callable[[str, int], Workload | None]] = {
    "quality": _quality,
    "system-prompts": _system_prompts,
    "swe": _swe,
    "sharegpt": _sharegpt,
    "doc-qa": _doc_qa,
}
"""Workload builders ``(scale, seed) -> Workload`` (None: the data is absent and there is no fallback)."""


def build_workload(name: str, scale: str, seed: int = 0) -> Workload | None:
    if name not in WORKLOADS:
        raise ConfigError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    return WORKLOADS[name](scale, seed)


# ================================================================================= strategies
@dataclass(frozen=True, slots=True)
class Strategy:
    """One admission policy of the study; ``params`` are the policy's parameters in registry order."""

    family: str
    policy: str
    params: tuple[tuple[str, Any], ...] = ()
    budget: int | None = None
    block: int | None = None
    lam: float | None = None
    break_even_tokens: int | None = None

    @property
    def admission(self) -> str:
        """Registry form: ``sparse-dp:m=4,marconi=false``."""
        return self.policy + (":" + ",".join(f"{k}={_fmt_param(v)}" for k, v in self.params) if self.params else "")

    @property
    def system(self) -> str:
        """The ``custom`` system: ``custom:admission=sparse-dp(m=4;marconi=false),eviction=lru``."""
        inner = ";".join(f"{k}={_fmt_param(v)}" for k, v in self.params)
        return f"custom:admission={self.policy}" + (f"({inner})" if inner else "") + ",eviction=lru"

    @property
    def label(self) -> str:
        if self.budget is not None:
            return f"{self.family} M={self.budget}"
        if self.block is not None:
            return f"{self.family} K={self.block}"
        if self.break_even_tokens is not None:
            return f"{self.family} tau={self.break_even_tokens}"
        return self.family

    def describe(self) -> dict[str, Any]:
        return {"strategy": self.family, "label": self.label, "admission": self.admission, "system": self.system,
                "budget": self.budget, "block": self.block, "lam": self.lam,
                "break_even_tokens": self.break_even_tokens}


def _fmt_param(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def block_sizes(trace: Trace, max_budget: int) -> tuple[int, ...]:
    """Powers of two ``K`` from ``K_max / 2**ceil(log2 max_budget)`` to ``K_max``, the largest power
    of two <= the median sequence length (input + output): about 1 .. max_budget blocks per sequence."""
    lengths = trace.input_lens() + trace.output_lens()
    k_max = 2 ** int(math.floor(math.log2(max(2.0, float(np.median(lengths))))))
    steps = int(math.ceil(math.log2(max(1, max_budget))))
    return tuple(sorted({max(1, k_max >> i) for i in range(steps + 1)}))


def plan_strategies(config: StudyConfig, trace: Trace, spec: ModelSpec) -> list[Strategy]:
    """Every strategy of the study for one trace (block sizes depend on its sequence lengths)."""
    out = [Strategy("sparse-dp", "sparse-dp", (("m", m), ("marconi", False)), budget=m) for m in config.budgets]
    out += [Strategy("sparse-dp+marconi", "sparse-dp", (("m", m),), budget=m)
            for m in config.combined_budgets if m in config.budgets]
    per_token = spec.prefill_flops(1)
    for tau in config.lam_tokens:
        lam = tau * per_token / spec.ssm_checkpoint_bytes
        out.append(Strategy("sparse-dp-lam", "sparse-dp", (("lam", lam), ("marconi", False)), lam=lam,
                            break_even_tokens=tau))
    out += [Strategy("uniform", "uniform", (("m", m),), budget=m) for m in config.budgets]
    out += [Strategy("every-block", "every-block", (("k", k), ("paged", False)), block=k)
            for k in block_sizes(trace, max(config.budgets))]
    out += [Strategy("last-token", "last-token"), Strategy("marconi", "marconi")]
    return out


# ================================================================================= simulation
def simulation_record(workload: Workload, strategy: Strategy, spec: ModelSpec, capacity: str,
                      capacity_bytes: float) -> dict[str, Any]:
    """Replay the workload under one strategy and measure placement quality (one JSONL record)."""
    from marconi.sim import simulate

    result = simulate(workload.trace, strategy.system, spec, capacity_bytes, latency="zero")
    st = result.stats
    potential = flops_cost(spec).potential
    recomputed_flops = float(np.sum(potential(result.kv_hit_len.astype(np.float64))
                                    - potential(result.reused_len.astype(np.float64))))
    cached = max(1, st.num_requests - st.requests_not_cached)
    return {
        "kind": "simulation", **workload.describe(), **strategy.describe(), "model": spec.name,
        "capacity": capacity, "capacity_bytes": int(capacity_bytes), "mode": "sequential",
        "ssm_checkpoint_bytes": spec.ssm_checkpoint_bytes,
        "num_cached_sequences": st.num_requests - st.requests_not_cached,
        "checkpoints_admitted": st.checkpoints_admitted, "checkpoints_evicted": st.checkpoints_evicted,
        "checkpoints_per_seq": st.checkpoints_admitted / cached,
        "ssm_bytes_per_seq": st.peak_ssm_bytes / cached, "peak_ssm_bytes": st.peak_ssm_bytes,
        "peak_kv_bytes": st.peak_kv_bytes,
        "recomputed_tokens": st.unusable_tokens, "recomputed_tokens_per_request": st.unusable_tokens / max(1, st.num_requests),
        "recomputed_flops": recomputed_flops, "input_flops": st.input_flops,
        "recomputed_flops_fraction": recomputed_flops / st.input_flops if st.input_flops else 0.0,
        "kv_hit_tokens": st.kv_hit_tokens, "reused_tokens": st.reused_tokens,
        "token_hit_rate": st.token_hit_rate, "kv_hit_rate": st.kv_hit_tokens / st.input_tokens if st.input_tokens else 0.0,
        "flops_saved_fraction": st.flops_saved_fraction, "elapsed_s": result.elapsed_s,
    }


# ================================================================================= analytic (oracle P)
class _SortedSequences:
    """LCPs of one sequence with all others from one lexicographic sort (``n - 1`` comparisons).

    In lexicographic order, ``LCP(a, c) = min`` of the adjacent LCPs between them, so one row of
    LCPs is two running minima outward from the sequence's rank.
    """

    def __init__(self, seqs: Sequence[np.ndarray]) -> None:
        # Big-endian bytes of non-negative int32 compare like the token sequences themselves.
        keys = [np.ascontiguousarray(s, dtype=">i4").tobytes() for s in seqs]
        self.order = np.array(sorted(range(len(seqs)), key=keys.__getitem__), dtype=np.int64)
        del keys
        self.rank = np.empty_like(self.order)
        self.rank[self.order] = np.arange(self.order.size)
        self.lengths = np.array([s.size for s in seqs], dtype=np.int64)
        self.adjacent = np.array([_lcp(seqs[a], seqs[b]) for a, b in zip(self.order[:-1], self.order[1:])],
                                 dtype=np.int64)

    def row(self, i: int) -> np.ndarray:
        """``(n,)`` LCP of sequence ``i`` with every sequence (itself: its length), by sequence index."""
        r = int(self.rank[i])
        left = np.minimum.accumulate(self.adjacent[:r][::-1])[::-1]      # sorted ranks 0..r-1
        right = np.minimum.accumulate(self.adjacent[r:])                 # sorted ranks r+1..n-1
        by_rank = np.concatenate([left, [self.lengths[i]], right])
        return by_rank[self.rank]


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.size, b.size)
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def sequence_overlaps(trace: Trace) -> Iterator[tuple[int, np.ndarray, int | None]]:
    """For each request ``i`` with later requests: ``(i, depths, branch_len)``.

    ``depths[j'] = min(LCP(S_j, S_i), len(input_j))`` for the later requests ``j`` (``S`` = input +
    output): how deep each overlaps ``S_i``. ``branch_len``: where ``S_i`` leaves the radix tree of the
    earlier sequences (Marconi's branch point), None when it only extends a path or shares nothing.
    """
    seqs = [np.concatenate([r.input_tokens, r.output_tokens]) for r in trace]
    input_lens = trace.input_lens()
    index = _SortedSequences(seqs)
    for i in range(len(seqs) - 1):
        lcp = index.row(i)
        depths = np.minimum(lcp[i + 1:], input_lens[i + 1:])
        earlier, earlier_lens = lcp[:i], index.lengths[:i]
        branch = int(earlier.max()) if i else 0
        continues = bool(np.any((earlier == branch) & (earlier_lens > branch))) if i else False
        yield i, depths, (branch if 0 < branch < seqs[i].size and continues else None)


@dataclass(slots=True)
class _Tally:
    """Sums over (sequence, later request) pairs for one analytic strategy and cost."""

    cost: float = 0.0
    dp_at_count: float = 0.0
    checkpoints: float = 0.0
    sequences: int = 0


@dataclass(frozen=True, slots=True)
class _Heuristic:
    strategy: Strategy
    plan: Callable[[AdmissionContext, int], tuple[int, ...]]


def _heuristics(strategies: Sequence[Strategy]) -> list[_Heuristic]:
    out = []
    for s in strategies:
        if s.policy == "sparse-dp":
            continue
        policy = make_admission(s.admission)
        out.append(_Heuristic(s, lambda ctx, total, p=policy: tuple(p.final_plan(ctx, total).checkpoints)))
    return out


def analytic_records(workload: Workload, strategies: Sequence[Strategy], spec: ModelSpec,
                     max_budget: int) -> list[dict[str, Any]]:
    """The DP's frontier on each sequence's oracle ``P_i`` vs the heuristics' positions (module doc)."""
    costs: dict[str, PotentialCost] = {"tokens": TOKEN_COST, "flops": flops_cost(spec)}
    heuristics = _heuristics(strategies)
    dp = {c: [_Tally() for _ in range(max_budget + 1)] for c in costs}
    tallies = {(h.strategy.label, c): _Tally() for h in heuristics for c in costs}
    no_ckpt = dict.fromkeys(costs, 0.0)
    num_pairs = num_sequences = 0
    for i, depths, branch in sequence_overlaps(workload.trace):
        req = workload.trace[i]
        total_len = req.input_len + req.output_len
        weights = np.bincount(depths, minlength=total_len + 1).astype(np.float64)
        ctx = AdmissionContext(req.input_tokens, req.input_len, MatchResult(req.input_len, 0, 0), branch, spec, i)
        plans = [(h, sorted({p for p in h.plan(ctx, total_len) if 1 <= p <= total_len})) for h in heuristics]
        extra_needed = max([max_budget] + [len(pos) - (total_len in pos) for _, pos in plans])
        num_pairs += depths.size
        num_sequences += 1
        for name, cost in costs.items():
            no_ckpt[name] += float(np.sum(cost.potential(depths.astype(np.float64))))
            curve, counts = _dp_curve(weights, total_len, cost, extra_needed)
            for m in range(max_budget + 1):
                t = dp[name][m]
                t.cost += curve[m]
                t.checkpoints += counts[m]
                t.sequences += 1
            for h, pos in plans:
                t = tallies[(h.strategy.label, name)]
                t.cost += expected_cost(weights, pos, cost=cost) * depths.size
                t.dp_at_count += curve[min(len(pos) - (total_len in pos), len(curve) - 1)]
                t.checkpoints += len(pos)
                t.sequences += 1
    base = {"kind": "analytic", **workload.describe(), "model": spec.name, "ssm_checkpoint_bytes": spec.ssm_checkpoint_bytes,
            "num_sequences": num_sequences, "num_pairs": num_pairs}
    records = []
    for name in costs:
        for m, t in enumerate(dp[name]):
            s = Strategy("sparse-dp", "sparse-dp", (("m", m), ("marconi", False)), budget=m)
            records.append(_analytic_record(base, s, name, t, num_pairs, no_ckpt[name], dp_at_count=t.cost))
        for h in heuristics:
            t = tallies[(h.strategy.label, name)]
            records.append(_analytic_record(base, h.strategy, name, t, num_pairs, no_ckpt[name], t.dp_at_count))
    return records


def _dp_curve(weights: np.ndarray, total_len: int, cost: PotentialCost, max_extra: int) -> tuple[np.ndarray, np.ndarray]:
    """Least total cost over this sequence's pairs with at most ``m`` checkpoints besides the free
    last token (``m = 0..max_extra``), and the checkpoints (incl. the last token) it uses."""
    free = weights.copy()
    free[total_len] = 0.0                      # served by the last-token checkpoint every strategy keeps
    mass = float(free.sum())
    candidates = np.flatnonzero(free[1:total_len]) + 1
    if mass <= 0 or candidates.size == 0:
        return np.zeros(max_extra + 1), np.ones(max_extra + 1)
    plc = place_checkpoints(free, candidates, min(max_extra, int(candidates.size)), cost=cost)
    curve = np.array(plc.cost_by_budget) * mass
    counts = np.array([len(p) + 1 for p in plc.positions_by_budget], dtype=np.float64)
    pad = max_extra + 1 - curve.size
    return np.pad(curve, (0, pad), mode="edge"), np.pad(counts, (0, pad), mode="edge")


def _analytic_record(base: dict[str, Any], strategy: Strategy, cost_name: str, t: _Tally, num_pairs: int,
                     no_ckpt: float, dp_at_count: float) -> dict[str, Any]:
    per_seq = t.checkpoints / max(1, t.sequences)
    return {**base, **strategy.describe(), "cost": cost_name,
            "expected_cost_per_pair": t.cost / max(1, num_pairs),
            "cost_share": t.cost / no_ckpt if no_ckpt > 0 else 0.0,
            "dp_cost_per_pair_at_equal_count": dp_at_count / max(1, num_pairs),
            "dp_cost_share_at_equal_count": dp_at_count / no_ckpt if no_ckpt > 0 else 0.0,
            "checkpoints_per_seq": per_seq, "ssm_bytes_per_seq": per_seq * base["ssm_checkpoint_bytes"]}


# ================================================================================= running
_WORKLOADS: dict[str, Workload] = {}   # inherited by forked workers (no copy per task)


@dataclass(frozen=True, slots=True)
class _Task:
    workload: str
    kind: str                       # "simulation" | "analytic"
    strategy: Strategy | None = None
    strategies: tuple[Strategy, ...] = ()
    capacity: str = LARGE
    capacity_bytes: float = LARGE_CAPACITY_BYTES
    weight: float = 1.0             # rough cost, to start the longest tasks first


def _run_task(task: _Task, model: str, max_budget: int) -> list[dict[str, Any]]:
    workload, spec = _WORKLOADS[task.workload], get_model(model)
    if task.kind == "analytic":
        return analytic_records(workload, task.strategies, spec, max_budget)
    assert task.strategy is not None
    return [simulation_record(workload, task.strategy, spec, task.capacity, task.capacity_bytes)]


def plan_tasks(config: StudyConfig, workloads: Sequence[Workload]) -> list[_Task]:
    """All simulation points and one analytic task per workload, longest first."""
    from marconi.sim import working_set_bytes

    spec = get_model(config.model)
    tasks = []
    for w in workloads:
        strategies = plan_strategies(config, w.trace, spec)
        size = float(w.trace.total_input_tokens)
        working_set = None
        for cap in config.capacities:
            if cap == LARGE:
                cap_bytes = float(LARGE_CAPACITY_BYTES)
            else:
                parsed = parse_capacity(cap)
                if parsed.fraction is not None and working_set is None:
                    working_set = working_set_bytes(w.trace, spec)
                cap_bytes = float(parsed.resolve(working_set or 0))
            tasks += [_Task(w.name, "simulation", s, capacity=cap, capacity_bytes=cap_bytes,
                            weight=size * (20.0 if s.policy == "sparse-dp" else 1.0)) for s in strategies]
        tasks.append(_Task(w.name, "analytic", strategies=tuple(strategies), weight=size * 30.0))
    return sorted(tasks, key=lambda t: -t.weight)


def run_study(config: StudyConfig, workloads: Sequence[Workload],
              on_done: Callable[[_Task], None] | None = None) -> list[dict[str, Any]]:
    """Run every task (in forked worker processes when ``workers > 1``); records in a stable order."""
    _WORKLOADS.clear()
    _WORKLOADS.update({w.name: w for w in workloads})
    tasks = plan_tasks(config, workloads)
    workers = min(len(tasks), config.workers or os.cpu_count() or 1) or 1
    run = functools.partial(_run_task, model=config.model, max_budget=max(config.budgets))
    results: list[list[dict[str, Any]]] = [[] for _ in tasks]
    if workers == 1:
        for i, task in enumerate(tasks):
            results[i] = run(task)
            if on_done:
                on_done(task)
    else:
        with worker_pool(workers) as pool:  # workers die with this process
            futures = {pool.submit(run, task): i for i, task in enumerate(tasks)}
            for future in as_completed(futures):
                results[futures[future]] = future.result()
                if on_done:
                    on_done(tasks[futures[future]])
    echo = {"scale": config.scale, "seed": config.seed, "budgets": list(config.budgets)}
    records = [{**r, **echo} for rs in results for r in rs]
    order = {w.name: i for i, w in enumerate(workloads)}
    return sorted(records, key=lambda r: (order[r["workload"]], r["kind"] != "simulation", r.get("capacity") or "",
                                          r.get("cost") or "", r["strategy"], r["budget"] or 0, r["block"] or 0,
                                          r["break_even_tokens"] or 0))


# ================================================================================= findings
def _sim(records: Iterable[dict[str, Any]], workload: str, capacity: str) -> list[dict[str, Any]]:
    return [r for r in records if r["kind"] == "simulation" and r["workload"] == workload and r["capacity"] == capacity]


def _tolerance(h: dict[str, Any]) -> float:
    return max(_TIE_REL * h["recomputed_flops_fraction"], _TIE_ABS)


def _compare(h: dict[str, Any], dp: Sequence[dict[str, Any]]) -> tuple[str, dict[str, Any] | None]:
    """``better`` / ``tie-fewer`` / ``tie`` / ``worse`` for the DP against heuristic point ``h``, and
    the DP point behind the verdict (the one with the fewest checkpoints per sequence)."""
    tol = _tolerance(h)
    dense_ok = [d for d in dp if d["checkpoints_per_seq"] <= h["checkpoints_per_seq"] * _DENSITY_SLACK]
    better = [d for d in dense_ok if d["recomputed_flops_fraction"] < h["recomputed_flops_fraction"] - tol]
    if better:
        return "better", min(better, key=lambda d: d["checkpoints_per_seq"])
    ties = [d for d in dp if abs(d["recomputed_flops_fraction"] - h["recomputed_flops_fraction"]) <= tol
            or d["recomputed_flops_fraction"] < h["recomputed_flops_fraction"]]
    if ties:
        best = min(ties, key=lambda d: d["checkpoints_per_seq"])
        if best["checkpoints_per_seq"] < h["checkpoints_per_seq"] / _DENSITY_SLACK:
            return "tie-fewer", best
        if best["checkpoints_per_seq"] <= h["checkpoints_per_seq"] * _DENSITY_SLACK:
            return "tie", best
    return "worse", None


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


@dataclass(frozen=True, slots=True)
class Verdict:
    """The DP against the heuristics on one workload and capacity, from its simulation records.

    ``uniform``: ``(M, dp, uniform)`` record pairs at equal M. ``block``: ``(block point, status,
    DP point)`` with status ``better`` / ``tie-fewer`` / ``tie`` / ``worse`` (see :func:`_compare`).
    ``worse``: labels of uniform/block points no DP point matches at the same or lower density.
    """

    workload: str
    uniform: tuple[tuple[int, dict[str, Any], dict[str, Any]], ...]
    block: tuple[tuple[dict[str, Any], str, dict[str, Any] | None], ...]
    worse: tuple[str, ...]
    any_better: bool
    marconi: dict[str, Any] | None
    best_dp: dict[str, Any] | None
    dp_points: tuple[dict[str, Any], ...] = ()

    @property
    def dominates(self) -> bool:
        return bool(self.uniform or self.block) and not self.worse and self.any_better

    @property
    def ties_block_with_fewer(self) -> bool:
        return bool(self.block) and {s for _, s, _ in self.block} <= {"tie", "tie-fewer"} \
            and any(s == "tie-fewer" for _, s, _ in self.block)

    @property
    def marconi_gap(self) -> float | None:
        if self.marconi is None or self.best_dp is None:
            return None
        return self.marconi["recomputed_flops_fraction"] - self.best_dp["recomputed_flops_fraction"]

    @property
    def marconi_beats_dp_at_density(self) -> bool:
        """No DP point (incl. sparse-dp+marconi) at Marconi's density or sparser recomputes as little."""
        return self.marconi is not None and not any(
            d["checkpoints_per_seq"] <= self.marconi["checkpoints_per_seq"] * _DENSITY_SLACK
            and d["recomputed_flops_fraction"] <= self.marconi["recomputed_flops_fraction"] + _tolerance(self.marconi)
            for d in self.dp_points)

    @property
    def marconi_enough(self) -> bool:
        gap = self.marconi_gap
        return gap is not None and gap <= _ENOUGH_ABS


def verdict(records: Sequence[dict[str, Any]], workload: str, capacity: str = LARGE) -> Verdict:
    """Compare the DP points (``sparse-dp``, ``sparse-dp-lam``) with every heuristic point."""
    recs = _sim(records, workload, capacity)
    dp = [r for r in recs if r["strategy"] in ("sparse-dp", "sparse-dp-lam")]
    dp_by_m = {r["budget"]: r for r in recs if r["strategy"] == "sparse-dp"}
    uniform = tuple((r["budget"], dp_by_m[r["budget"]], r) for r in sorted(recs, key=lambda r: r["budget"] or 0)
                    if r["strategy"] == "uniform" and r["budget"] in dp_by_m)
    compared = {k: [(h, *_compare(h, dp)) for h in recs if h["strategy"] == k] for k in ("uniform", "every-block")}
    block = tuple(sorted(compared["every-block"], key=lambda x: x[0]["block"]))
    # last-token is every family's M = 0 point (one checkpoint per sequence): not a point to beat.
    flat = compared["uniform"] + list(block)
    combined = dp + [r for r in recs if r["strategy"] == "sparse-dp+marconi"]
    return Verdict(workload, uniform, block, tuple(h["label"] for h, s, _ in flat if s == "worse"),
                   any(s == "better" for _, s, _ in flat), next((r for r in recs if r["strategy"] == "marconi"), None),
                   min(combined, key=lambda r: (r["recomputed_flops_fraction"], r["checkpoints_per_seq"]))
                   if combined else None, tuple(combined))


def findings(records: Sequence[dict[str, Any]], workload: str, capacity: str = LARGE) -> list[str]:
    """Plain statements about one workload, computed from its records (recomputed FLOPs as a share
    of input prefill FLOPs)."""
    v = verdict(records, workload, capacity)
    if v.best_dp is None:
        return ["no sparse-dp points"]
    out = []
    if v.uniform:
        wins = [m for m, d, u in v.uniform if d["recomputed_flops_fraction"] <= u["recomputed_flops_fraction"]]
        detail = "; ".join(f"M={m}: {_pct(d['recomputed_flops_fraction'])} vs {_pct(u['recomputed_flops_fraction'])}"
                           for m, d, u in v.uniform if m in SUMMARY_BUDGETS)
        which = "at every M" if len(wins) == len(v.uniform) else \
            f"at {len(wins)} of {len(v.uniform)} budgets (not at M={', '.join(str(m) for m, _, _ in v.uniform if m not in wins)})"
        out.append(f"DP vs uniform at equal M: the DP recomputes no more {which} ({detail}).")
    if v.block:
        out.append(_block_sentence(v.block))
    if v.dominates:
        out.append("The DP dominates the fixed-budget heuristics here: every uniform and block-caching point is "
                   "matched or beaten by a DP point with no more checkpoints per sequence.")
    elif not v.worse:
        out.append("The DP only ties the fixed-budget heuristics here (never worse at equal or lower density).")
    else:
        dp = [r for r in _sim(records, workload, capacity) if r["strategy"] in ("sparse-dp", "sparse-dp-lam")]
        heur = {h["label"]: h for h in _sim(records, workload, capacity)}
        out.append("The DP does not dominate: " + "; ".join(_between(heur[label], dp) for label in v.worse) + ".")
    out.append(_marconi_sentence(v, v.dp_points))
    return out


def _block_sentence(points: Sequence[tuple[dict[str, Any], str, dict[str, Any] | None]]) -> str:
    parts = []
    for h, status, d in points:
        name = f"K={h['block']} ({h['checkpoints_per_seq']:.1f} ckpt/seq, {_pct(h['recomputed_flops_fraction'])})"
        if status == "better":
            parts.append(f"{name}: DP better ({d['label']}: {d['checkpoints_per_seq']:.1f} ckpt/seq, "
                         f"{_pct(d['recomputed_flops_fraction'])})")
        elif status == "tie-fewer":
            parts.append(f"{name}: DP ties with fewer checkpoints ({d['label']}: {d['checkpoints_per_seq']:.1f} ckpt/seq, "
                         f"{_pct(d['recomputed_flops_fraction'])})")
        elif status == "tie":
            parts.append(f"{name}: tie")
        else:
            parts.append(f"{name}: block caching better at this density")
    head = "DP vs block caching: only ties, using fewer checkpoints" if {s for _, s, _ in points} == {"tie-fewer"} \
        else "DP vs block caching"
    return f"{head} — " + "; ".join(parts) + "."


def _point(r: dict[str, Any]) -> str:
    return f"{r['label']}: {r['checkpoints_per_seq']:.2f} ckpt/seq, {_pct(r['recomputed_flops_fraction'])}"


def _between(h: dict[str, Any], dp: Sequence[dict[str, Any]]) -> str:
    """``h`` and the DP points just below and above its checkpoint density."""
    below = [d for d in dp if d["checkpoints_per_seq"] <= h["checkpoints_per_seq"] * _DENSITY_SLACK]
    above = [d for d in dp if d["checkpoints_per_seq"] > h["checkpoints_per_seq"] * _DENSITY_SLACK]
    sides = []
    if below:
        sides.append("sparser " + _point(min(below, key=lambda d: d["recomputed_flops_fraction"])))
    if above:
        sides.append("denser " + _point(min(above, key=lambda d: d["checkpoints_per_seq"])))
    return f"{_point(h)} (DP: {'; '.join(sides) or 'none'})"


def _marconi_sentence(v: Verdict, dp: Sequence[dict[str, Any]]) -> str:
    if v.marconi is None or v.best_dp is None or v.marconi_gap is None:
        return "Marconi was not run."
    m, best, gap = v.marconi, v.best_dp, v.marconi_gap
    same = [d for d in dp if d["checkpoints_per_seq"] <= m["checkpoints_per_seq"] * _DENSITY_SLACK]
    at_density = "; no DP point is as sparse"
    if same:
        rival = min(same, key=lambda d: d["recomputed_flops_fraction"])
        at_density = f"; the best DP point at no more checkpoints is {_point(rival)}"
        if v.marconi_beats_dp_at_density:
            at_density += ", so at Marconi's density Marconi is better than the DP"
    head = (f"Marconi ({m['checkpoints_per_seq']:.2f} ckpt/seq, {_pct(m['recomputed_flops_fraction'])}) vs the best "
            f"DP point ({_point(best)}){at_density}")
    if v.marconi_enough:
        return head + f": Marconi's two checkpoints are already enough here (gap {100 * gap:.2f} pp <= {100 * _ENOUGH_ABS:g} pp)."
    return (head + f": more checkpoints placed by the DP save {100 * gap:.2f} pp of prefill FLOPs over Marconi "
            f"at {best['checkpoints_per_seq'] / m['checkpoints_per_seq']:.1f}x its checkpoints per sequence.")


def _analytic_sentence(records: Sequence[dict[str, Any]], workload: str) -> str | None:
    """With P known: the DP's share of overlap FLOPs at M = 1, 2 against uniform and Marconi."""
    recs = [r for r in records if r["kind"] == "analytic" and r["workload"] == workload and r["cost"] == "flops"]
    dp = {r["budget"]: r for r in recs if r["strategy"] == "sparse-dp"}
    if 1 not in dp:
        return None
    uniform = {r["budget"]: r for r in recs if r["strategy"] == "uniform"}
    marconi = next((r for r in recs if r["strategy"] == "marconi"), None)
    parts = []
    for m in (1, 2):
        if m in dp:
            vs = [f"uniform {_pct(uniform[m]['cost_share'])}"] if m in uniform else []
            if m == 1 and marconi is not None:
                vs.append(f"Marconi's branch point {_pct(marconi['cost_share'])}")
            parts.append(f"M={m}: DP {_pct(dp[m]['cost_share'])}" + (f" vs {', '.join(vs)}" if vs else ""))
    near = next((m for m in sorted(dp) if m > 0 and dp[m]["cost_share"] <= 0.01), None)
    heur = [r for r in recs if r["strategy"] != "sparse-dp"]
    never_more = all(r["dp_cost_per_pair_at_equal_count"] <= r["expected_cost_per_pair"] * (1 + 1e-9) for r in heur)
    return (f"Analytic, P known per sequence (share of overlap FLOPs recomputed): {'; '.join(parts)}; the DP is "
            + (f"under 1% from M={near}" if near else "never under 1% within the budgets run")
            + (f". At each heuristic's own checkpoint count the DP recomputes no more on all {len(heur)} points"
               if never_more else ". The DP exceeds a heuristic at its own count (unexpected: the DP is exact)") + ".")


# ================================================================================= outputs
def write_outputs(records: Sequence[dict[str, Any]], out_dir: str | Path, notes: Sequence[str] = (), *,
                  write_jsonl: bool = True) -> list[Path]:
    """``records.jsonl``, the plots and ``summary.md`` under ``out_dir`` (each written atomically).

    Everything is drawn from the records alone, so an earlier run's file can be re-rendered.
    """
    from marconi.sim.sweep import write_records

    out = Path(out_dir)
    paths = [write_records(records, out / "records.jsonl")] if write_jsonl else []
    for w in _workload_rows(records):
        for cap in _capacities(records):
            paths.append(_plot_simulation(records, w["workload"], cap,
                                          out / "plots" / f"{w['workload']}_{_slug(cap)}_simulation.png"))
        paths.append(_plot_analytic(records, w["workload"], out / "plots" / f"{w['workload']}_analytic.png"))
    summary = out / "summary.md"
    with atomic_write(summary, "w") as fh:
        fh.write(summary_markdown(records, notes))
    paths.append(summary)
    return paths


def _workload_rows(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first record of each workload, in record order (it echoes the trace's description)."""
    return list({r["workload"]: r for r in reversed(records)}.values())[::-1]


def _capacities(records: Sequence[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["capacity"] for r in records if r["kind"] == "simulation"))


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "_" for c in text)


_STYLE = {"sparse-dp": ("o-", "C0"), "sparse-dp+marconi": ("s--", "C9"), "sparse-dp-lam": ("*", "C0"),
          "uniform": ("^-", "C1"), "every-block": ("d-", "C2"), "last-token": ("P", "C7"), "marconi": ("X", "C3")}


def _series(recs: Sequence[dict[str, Any]], x: str, y: str, scale_x: float = 1.0,
            scale_y: float = 1.0) -> Iterator[tuple[str, list, list, list]]:
    """Per strategy family: x, y and a short tag (M, K or tau) per point, sorted by x."""
    for family in _STYLE:
        pts = sorted((r[x] * scale_x, r[y] * scale_y, _tag(r)) for r in recs if r["strategy"] == family)
        if pts:
            yield family, [p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts]


def _tag(r: dict[str, Any]) -> str:
    for key, name in (("budget", "M"), ("block", "K"), ("break_even_tokens", "τ")):
        if r.get(key) is not None:
            return f"{name}={r[key]}"
    return ""


def _draw(ax: Any, recs: Sequence[dict[str, Any]], x: str, y: str, scale_x: float, scale_y: float, tags: bool) -> None:
    from matplotlib.ticker import NullFormatter

    for family, xs, ys, labels in _series(recs, x, y, scale_x, scale_y):
        fmt, color = _STYLE[family]
        ax.plot(xs, ys, fmt, color=color, label=family, markersize=9 if len(xs) == 1 else 5)
        if tags and family in ("sparse-dp", "every-block", "sparse-dp-lam"):
            for xv, yv, text in zip(xs, ys, labels):
                if family != "sparse-dp" or text in {f"M={m}" for m in SUMMARY_BUDGETS}:
                    ax.annotate(text, (xv, yv), textcoords="offset points", xytext=(3, 3), fontsize=6, color=color)
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())   # minor log labels overlap on short ranges
    ax.grid(True, alpha=0.3)


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    with atomic_write(path, "wb") as fh:
        fig.savefig(fh, format="png", dpi=110)
    plt.close(fig)
    return path


def _plot_simulation(records: Sequence[dict[str, Any]], workload: str, capacity: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = _sim(records, workload, capacity)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    panels = [("checkpoints_per_seq", 1.0, "recomputed_tokens_per_request", 1.0, "checkpoints per cached sequence",
               "recomputed tokens per request"),
              ("ssm_bytes_per_seq", 1e-6, "recomputed_flops_fraction", 100.0, "SSM MB per cached sequence",
               "recomputed FLOPs (% of prefill FLOPs)"),
              ("checkpoints_per_seq", 1.0, "token_hit_rate", 100.0, "checkpoints per cached sequence", "token hit rate (%)")]
    for i, (ax, (x, kx, y, ky, xl, yl)) in enumerate(zip(axes, panels)):
        _draw(ax, recs, x, y, kx, ky, tags=i == 0)
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
    if recs:
        axes[2].axhline(100 * recs[0]["kv_hit_rate"], color="k", ls=":", lw=1, label="KV hit (dense bound)")
    axes[0].legend(fontsize=8)
    axes[2].legend(fontsize=8)
    fig.suptitle(f"{workload}: simulated placement frontier, capacity {capacity}")
    fig.tight_layout()
    return _save(fig, path)


def _plot_analytic(records: Sequence[dict[str, Any]], workload: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    for i, (ax, cost) in enumerate(zip(axes, ("tokens", "flops"))):
        recs = [r for r in records if r["kind"] == "analytic" and r["workload"] == workload and r["cost"] == cost]
        _draw(ax, recs, "checkpoints_per_seq", "cost_share", 1.0, 100.0, tags=i == 0)
        ax.set_xlabel("checkpoints per sequence (incl. last token)")
        ax.set_ylabel(f"expected recompute (% of overlap {cost})")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{workload}: exact DP on the oracle overlap distribution (sparse-dp) vs heuristic positions")
    fig.tight_layout()
    return _save(fig, path)


def _md_table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _mb(x: float) -> str:
    return f"{x / 1e6:,.0f}"


def _summary_points(recs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of the summary: budgeted strategies at M = 1, 2, 4, 8, then the others."""
    keep = []
    for r in recs:
        if r["budget"] is not None and r["strategy"] in ("sparse-dp", "sparse-dp+marconi", "uniform") \
                and r["budget"] not in SUMMARY_BUDGETS:
            continue
        keep.append(r)
    order = list(_STYLE)
    return sorted(keep, key=lambda r: (order.index(r["strategy"]), r["budget"] or 0, r["block"] or 0,
                                       r["break_even_tokens"] or 0))


def summary_markdown(records: Sequence[dict[str, Any]], notes: Sequence[str] = ()) -> str:
    """The Markdown summary: workloads, per-workload tables and findings, overview, definitions."""
    if not records:
        return "# Sparse prefix caching: no records\n"
    first, workloads, capacities = records[0], _workload_rows(records), _capacities(records)
    out = ["# Sparse prefix caching: exact DP placement vs heuristics", "",
           (f"Model `{first['model']}` (one SSM checkpoint = {_mb(first['ssm_checkpoint_bytes'])} MB); scale "
            f"`{first['scale']}`; budgets M = {', '.join(map(str, first['budgets']))}; capacities "
            f"{', '.join(capacities)} (`large` = {LARGE_CAPACITY_BYTES:.2e} bytes, no eviction). Every strategy also "
            "keeps the last decoded token; eviction is LRU for all. All numbers are read from `records.jsonl`."), ""]
    out += [f"- {n}" for n in notes]
    out += ["", "## Workloads", ""]
    out.append(_md_table([[w["workload"], f"{w['num_requests']:,}", f"{w['num_sessions']:,}", f"{w['input_tokens']:,}",
                           w["trace_source"]] for w in workloads],
                         ["workload", "requests", "sessions", "input tokens", "source"]))
    if LARGE in capacities:
        out += ["", f"## Overview (simulation, capacity {LARGE})", ""] + _overview(records, LARGE)
    for w in (row["workload"] for row in workloads):
        for cap in capacities:
            recs = _sim(records, w, cap)
            out += ["", f"## {w} — simulation, capacity {cap}", ""]
            rows = [[r["label"], f"{r['checkpoints_per_seq']:.2f}", _mb(r["ssm_bytes_per_seq"]),
                     f"{r['recomputed_tokens_per_request']:,.0f}", _pct(r["recomputed_flops_fraction"]),
                     _pct(r["token_hit_rate"])] for r in _summary_points(recs)]
            out.append(_md_table(rows, ["strategy", "ckpt/seq", "SSM MB/seq", "recomputed tok/req",
                                        "recomputed FLOPs", "token hit"]))
            if recs:
                out.append(f"\nKV hit rate (dense upper bound on the token hit rate): {_pct(recs[0]['kv_hit_rate'])}.")
            lines = findings(records, w, cap) if cap == LARGE else [_hit_rate_sentence(recs)]
            out += ["", "Findings:", ""] + [f"- {line}" for line in lines]
        out += ["", f"## {w} — analytic frontier (oracle P(d) per sequence)", "", _analytic_table(records, w)]
        analytic = _analytic_sentence(records, w)
        out += ["", f"- {analytic}"] if analytic else []
    out += ["", "## Definitions", "",
            ("- ckpt/seq: SSM checkpoints admitted per cached sequence (a checkpoint shared by many sequences counts "
             "once); SSM MB/seq: peak SSM bytes / cached sequences."),
            ("- recomputed tokens: KV-cached tokens recomputed because the deepest checkpoint on the path was "
             "shallower (`unusable_tokens`); recomputed FLOPs: sum over requests of `span_flops(usable, kv_hit)`, as "
             "a share of all input prefill FLOPs."),
            (f"- Findings: a DP point (sparse-dp, sparse-dp-lam) beats a heuristic point when it recomputes less by "
             f"more than max({100 * _TIE_REL:g}% of the heuristic's, {100 * _TIE_ABS:g}% of prefill FLOPs) with at most "
             f"{100 * (_DENSITY_SLACK - 1):g}% more checkpoints per sequence; within that margin it ties. Marconi is "
             f"'enough' when the best DP point (any density) is within {100 * _ENOUGH_ABS:g} pp of prefill FLOPs."),
            ("- Analytic: each sequence S_i alone, P_i = depths to which every later request overlaps it; costs "
             "summed over (sequence, later request) pairs; share = of the cost with no checkpoint at all. "
             "`DP @ same count` is the exact DP with the heuristic's own number of checkpoints on each sequence."), ""]
    return "\n".join(out)


def _hit_rate_sentence(recs: Sequence[dict[str, Any]]) -> str:
    """With eviction, recomputed tokens only count KV hits whose state was gone: compare hit rates."""
    best = []
    for family in _STYLE:
        pts = [r for r in recs if r["strategy"] == family]
        if pts:
            top = max(pts, key=lambda r: (r["token_hit_rate"], -r["checkpoints_per_seq"]))
            best.append(f"{top['label']} {_pct(top['token_hit_rate'])} ({top['checkpoints_per_seq']:.2f} ckpt/seq)")
    return "With eviction, the best token hit rate of each strategy: " + "; ".join(best) + "."


def _overview(records: Sequence[dict[str, Any]], capacity: str) -> list[str]:
    verdicts = [verdict(records, w["workload"], capacity) for w in _workload_rows(records)]

    def names(keep: Callable[[Verdict], bool]) -> str:
        return ", ".join(v.workload for v in verdicts if keep(v)) or "none"

    worse = "; ".join(f"{v.workload} ({', '.join(v.worse)})" for v in verdicts if v.worse) or "none"
    return [f"- The DP dominates every uniform and block-caching point: {names(lambda v: v.dominates)}.",
            f"- The DP only ties block caching, with fewer checkpoints: {names(lambda v: v.ties_block_with_fewer)}.",
            f"- A heuristic point beats every DP point at its checkpoint density: {worse}.",
            (f"- Marconi's two checkpoints are already enough: {names(lambda v: v.marconi_enough)}; the DP "
             f"recomputes clearly less than Marconi (at more checkpoints) on: "
             f"{names(lambda v: v.marconi_gap is not None and not v.marconi_enough)}."),
            (f"- At Marconi's own checkpoint density no DP point recomputes as little as Marconi: "
             f"{names(lambda v: v.marconi_beats_dp_at_density)}.")]


def _analytic_table(records: Sequence[dict[str, Any]], workload: str) -> str:
    by_key: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for r in records:
        if r["kind"] != "analytic" or r["workload"] != workload:
            continue
        if r["strategy"] in ("sparse-dp", "uniform") and r["budget"] not in SUMMARY_BUDGETS:
            continue
        by_key.setdefault((r["label"], r["strategy"]), {})[r["cost"]] = r
    order = list(_STYLE)
    rows = []
    for (label, family), costs in sorted(by_key.items(), key=lambda kv: (order.index(kv[0][1]), kv[1]["tokens"]["budget"] or 0,
                                                                          kv[1]["tokens"]["block"] or 0)):
        tok, fl = costs["tokens"], costs["flops"]
        rows.append([label, f"{tok['checkpoints_per_seq']:.2f}", f"{tok['expected_cost_per_pair']:,.1f}",
                     _pct(tok["cost_share"]), f"{tok['dp_cost_per_pair_at_equal_count']:,.1f}", _pct(fl["cost_share"]),
                     _pct(fl["dp_cost_share_at_equal_count"])])
    return _md_table(rows, ["strategy", "ckpt/seq", "recompute tok/pair", "share (tokens)", "DP @ same count tok/pair",
                            "share (FLOPs)", "DP @ same count (FLOPs share)"])


# ================================================================================= CLI
def _cmd_sparse(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    check_output(args.out, directory=True)  # before the study runs, not after
    if args.from_records:
        return _cmd_render(args)

    config = StudyConfig.for_run(
        quick=args.quick, tiny=args.tiny, model=args.model, seed=args.seed, workers=args.workers,
        workloads=tuple(w.strip() for w in args.workloads.split(",") if w.strip()) if args.workloads else None,
        budgets=tuple(int(m) for m in args.budgets.split(",")) if args.budgets else None,
        capacities=tuple(c.strip() for c in args.capacities.split(",") if c.strip()) if args.capacities else None)
    started = time.perf_counter()
    workloads, notes = [], []
    for name in config.workloads:
        w = build_workload(name, config.scale, config.seed)
        if w is None:
            notes.append(f"{name}: skipped — its data (../shared/data) is absent and it has no fallback")
        else:
            workloads.append(w)
            if w.source.startswith("FALLBACK"):
                notes.append(f"{name}: {w.source}")
        print(f"{name}: " + (f"{len(w.trace):,} requests, {w.trace.total_input_tokens:,} input tokens — {w.source}"
                             if w else "skipped (data absent)"), file=sys.stderr)
    if not workloads:
        raise ConfigError("no workload could be built")
    tasks = plan_tasks(config, workloads)
    print(f"{len(tasks)} tasks (simulation points + one analytic frontier per workload), "
          f"built in {time.perf_counter() - started:.1f}s", file=sys.stderr)
    bar = tqdm(total=len(tasks), unit="point", disable=args.quiet, file=sys.stderr, desc="sparse")
    records = run_study(config, workloads, on_done=lambda task: bar.update(1))
    bar.close()
    paths = write_outputs(records, args.out, notes)
    print(f"wrote {len(records)} records, {len(paths) - 2} plots and the summary to {args.out} "
          f"in {time.perf_counter() - started:.0f}s", file=sys.stderr)
    for w in workloads:
        print(f"\n{w.name}:")
        for line in findings(records, w.name, config.capacities[0]):
            print(f"  - {line}")
    return 0


# What every record of a study has (what the plots and the summary read).
RECORD_FIELDS = ("kind", "workload", "strategy", "label", "budget", "block", "break_even_tokens")


def _cmd_render(args: argparse.Namespace) -> int:
    from marconi.sim.sweep import read_records

    # Check every record before anything is written to --out (a wrong file must not be copied there).
    records = read_records(args.from_records, required=RECORD_FIELDS, kind="`marconi experiment sparse`")
    if not records:
        raise ConfigError(f"{args.from_records}: no records to render")
    same = Path(args.from_records).resolve() == (Path(args.out) / "records.jsonl").resolve()
    paths = write_outputs(records, args.out, write_jsonl=not same)
    print(f"rendered {len(records)} records from {args.from_records} into {len(paths)} files under {args.out}",
          file=sys.stderr)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("sparse", help="sparse prefix caching: DP checkpoint placement vs heuristics",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="directory for records.jsonl, plots/ and summary.md")
    p.add_argument("--quick", action="store_true", help="M in {1,2,4,8}, smaller traces (a few minutes)")
    p.add_argument("--tiny", action="store_true", help="smallest traces, M in {1,2,4,8} (a smoke test)")
    p.add_argument("--workloads", help=f"comma list from {', '.join(WORKLOADS)} (default: {','.join(DEFAULT_WORKLOADS)})")
    p.add_argument("--budgets", help="comma list of M (default 1..16; --quick/--tiny: 1,2,4,8)")
    p.add_argument("--capacities", help="'large' (unbounded) and/or sizes or working-set fractions, e.g. large,0.25x")
    p.add_argument("--model", default="paper-7b")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=None, help="parallel processes (default: one per core)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--from-records", metavar="JSONL", help="only redraw plots and summary from an earlier run's records")
    p.set_defaults(func=_cmd_sparse)
