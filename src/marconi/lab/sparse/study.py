"""The study: what to run (:class:`StudyConfig`), every strategy per trace, and the runner -> records.

Each simulation point replays a workload's trace through one strategy's cache
(:func:`simulation_record`); each workload also gets one analytic task (:mod:`.oracle`). Records
come back in a stable order whatever the number of worker processes.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from concurrent.futures import as_completed
from dataclasses import dataclass
from typing import Any

import numpy as np

from marconi.lab.sparse.oracle import analytic_records
from marconi.lab.sparse.strategies import Strategy, block_sizes
from marconi.lab.sparse.workloads import SCALES, WORKLOADS, Workload
from marconi.core.model import ModelSpec, get_model
from marconi.pool import worker_pool
from marconi.core.registry import ConfigError
from marconi.sparse import flops_cost
from marconi.units import parse_capacity
from marconi.workloads.trace import Trace

__all__ = ["StudyConfig", "plan_strategies", "plan_tasks", "run_study", "simulation_record", "DEFAULT_WORKLOADS",
           "SUMMARY_BUDGETS", "LARGE", "LARGE_CAPACITY_BYTES"]

DEFAULT_WORKLOADS = ("quality", "system-prompts", "swe", "sharegpt")
SUMMARY_BUDGETS = (1, 2, 4, 8)
LARGE = "large"
LARGE_CAPACITY_BYTES = 2 ** 60   # "unbounded": placement quality without eviction noise


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
    out += [Strategy("every-block", "every-block", (("block", k), ("paged", False)), block=k)
            for k in block_sizes(trace, max(config.budgets))]
    out += [Strategy("last-token", "last-token"), Strategy("marconi", "marconi")]
    return out


# ================================================================================= simulation
def simulation_record(workload: Workload, strategy: Strategy, spec: ModelSpec, capacity: str,
                      capacity_bytes: float) -> dict[str, Any]:
    """Replay the workload under one strategy and measure placement quality (one JSONL record)."""
    from marconi.sim import simulate_system

    result = simulate_system(workload.trace, strategy.system, spec, capacity_bytes, latency="zero")
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
