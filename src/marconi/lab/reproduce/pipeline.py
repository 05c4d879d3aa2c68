"""The reproduction's orchestration: traces → working sets → calibration → figure points → report.

Every simulation is a sweep point on a backend (local processes or Ray tasks):

1. **Traces** — each workload's base trace from :class:`~.traces.TraceFactory` (ShareGPT from
   ../shared/data, an LMSys-format file if given, SWE agent with the paper's
   keep-last-5-observations recipe and with all observations kept, Mooncake), timing variants
   derived without re-tokenizing, and workload-shift traces (two workloads back to back) for the
   α-tuning ablation.
2. **Working sets** of each (trace, model) — the reference for capacities given as fractions.
3. **Calibration** — SGLang+ over a ladder of capacity fractions and at 1x (nothing evicted). The
   *contention* of a fraction is SGLang+'s hit rate there over its unbounded hit rate; the paper's
   regimes map onto the ladder value whose contention is nearest a target (high ≈ 0.25,
   moderate ≈ 0.5, low ≈ 0.85). The report states the mapping.
4. **Figure points** — all other (trace, system, capacity, model) points at once, longest first.
5. **Report** — :mod:`.report` computes each figure's records from the context, draws its plots,
   sections and findings from those records, and writes ``report.md``, ``summary.md/json`` and
   ``figN.jsonl`` (all files written atomically).

Library code here never prints; the CLI handler (:mod:`.command`) draws progress bars through
``progress``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from marconi.lab.reproduce.context import (HEADROOM_SYSTEMS, MAIN_SYSTEMS, ReproContext, ReproProfile,
                                                   TraceInfo, frac_label, tuned_system, variant_key)
from marconi.lab.reproduce.traces import TraceFactory, data_available
from marconi.core.jsonfile import described, json_kind, read_json
from marconi.core.model import ModelSpec, get_model
from marconi.core.registry import ConfigError
from marconi.sim.backends import Backend, make_backend
from marconi.sim.sweep import SweepPoint, SweepTask, read_records, run_tasks, working_sets

__all__ = ["run_reproduction", "rerender", "read_summary",
           "plan_main_tasks", "choose_regimes", "build_traces", "spec_variants",
           "ProgressFactory"]

ProgressFactory = Callable[[str, int], Callable[[int], None]]


def _no_progress(desc: str, total: int) -> Callable[[int], None]:
    return lambda n: None


# ============================================================================ traces
def _variants(profile: ReproProfile, workload: str) -> list[tuple[float, int, float | None]]:
    if workload == "mooncake":
        return [(1.0, 0, None)]
    if workload in ("lmsys", "sharegpt"):
        return [(sps, 0, None) for sps in profile.arrival_rates]
    out = [(sps, seed, 7.5) for sps in profile.arrival_rates for seed in profile.seeds]
    out += [(1.0, seed, gap) for gap in profile.gaps if gap != 7.5 for seed in profile.seeds]
    return out


def build_traces(ctx: ReproContext, factory: TraceFactory) -> None:
    """All traces of the reproduction (base, timing variants, shifts) into ``ctx``."""
    p = ctx.profile
    for workload in factory.workloads():
        base = factory.base(workload)
        ctx.traces[workload] = base
        ctx.info[workload] = TraceInfo(workload, workload, "base", 1.0 if workload != "mooncake" else None,
                                       0 if workload.startswith("swe") else None,
                                       7.5 if workload.startswith("swe") else None, ws_key=workload)
        for sps, seed, gap in _variants(p, workload):
            key = variant_key(workload, sps, seed, gap)
            if key in ctx.traces:
                continue
            ctx.traces[key] = factory.variant(workload, sessions_per_second=sps, seed=seed,
                                              mean_gap_s=7.5 if gap is None else gap)
            ctx.info[key] = TraceInfo(key, workload, "variant", sps, seed if gap is not None else None, gap,
                                      ws_key=workload)
    for first, second in p.shifts:
        key = f"shift:{first}->{second}"
        ctx.traces[key] = factory.shift(first, second)
        ctx.info[key] = TraceInfo(key, "shift", "shift", ws_key=key)


def spec_variants(model: ModelSpec, profile: ReproProfile) -> dict[str, ModelSpec]:
    """Fig. 12's models: the paper's attention:SSM mixes (36 mixer layers) and SSM state dims."""
    out: dict[str, ModelSpec] = {}
    for attn, ssm in profile.layer_mixes:
        name = f"{model.name}[attn={attn},ssm={ssm}]"
        out[name] = model.with_changes(name=name, num_attn_layers=attn, num_ssm_layers=ssm,
                                       ssm_state_dim=model.ssm_state_dim if ssm else 0)
    for dim in profile.state_dims:
        name = model.name if dim == model.ssm_state_dim else f"{model.name}[N={dim}]"
        out[name] = model if dim == model.ssm_state_dim else model.with_changes(name=name, ssm_state_dim=dim)
    return out


# ============================================================================ tasks
def _task(ctx: ReproContext, key: str, system: str, capacity: str, *, model: str | None = None,
          capture: bool = False, per_request: bool = True) -> SweepTask:
    info = ctx.info[key]
    model_name = model or ctx.model.name
    spec: str | ModelSpec = ctx.specs.get(model_name, model_name)
    ws = ctx.ws.get((info.ws_key, model_name))
    tags = info.tags() + (("capacity_fraction", float(capacity[:-1])),) if capacity.endswith("x") else info.tags()
    return SweepTask(key, SweepPoint(system, capacity, spec), ws, "a100", "sequential", per_request,
                     capture_tuning=capture or (system.startswith("marconi") and "alpha=" not in system),
                     tags=tags)


def calibration_tasks(ctx: ReproContext) -> list[SweepTask]:
    keys = [k for k, i in ctx.info.items() if i.kind in ("base", "shift")]
    fractions = sorted(set(ctx.profile.ladder) | {1.0})
    return [_task(ctx, k, "sglang+", frac_label(f)) for k in keys for f in fractions]


def calibrate(ctx: ReproContext, records: Sequence[dict[str, Any]]) -> None:
    """Contention of each ladder fraction and the fraction chosen for each regime, per calibrated trace."""
    by_key: dict[str, dict[float, float]] = {}
    for rec in records:
        by_key.setdefault(rec["trace"], {})[rec["capacity_fraction"]] = rec["token_hit_rate"]
    for key, hits in by_key.items():
        unbounded = hits.get(1.0, 0.0)
        ladder = sorted(f for f in hits if f != 1.0)
        contention = {f: (hits[f] / unbounded if unbounded > 0 else 0.0) for f in ladder}
        ctx.contention[key] = contention
        ctx.regimes[key] = choose_regimes(contention, ctx.profile.regimes)


def choose_regimes(contention: dict[float, float], regimes: Sequence[tuple[str, float]]) -> dict[str, float]:
    """Distinct ladder fractions for the regimes, in order of increasing capacity.

    The middle regime takes the fraction whose contention is nearest its target; the others the
    nearest among smaller (resp. larger) fractions, so "high" < "moderate" < "low" whenever the
    ladder allows it.
    """
    ladder = sorted(contention)
    names = [n for n, _ in regimes]
    targets = dict(regimes)
    mid = len(names) // 2

    def nearest(cands: list[float], target: float) -> float:
        return min(cands, key=lambda f: (abs(contention[f] - target), f))

    chosen = {names[mid]: nearest(ladder, targets[names[mid]])}
    for i in range(mid - 1, -1, -1):
        below = [f for f in ladder if f < chosen[names[i + 1]]]
        chosen[names[i]] = nearest(below, targets[names[i]]) if below else chosen[names[i + 1]]
    for i in range(mid + 1, len(names)):
        above = [f for f in ladder if f > chosen[names[i - 1]]]
        chosen[names[i]] = nearest(above, targets[names[i]]) if above else chosen[names[i - 1]]
    return {n: chosen[n] for n in names}


def plan_main_tasks(ctx: ReproContext) -> list[SweepTask]:
    """Every point after calibration (figs. 7–13 and the two ablations), deduplicated."""
    p = ctx.profile
    tasks: list[SweepTask] = []
    regime_names = [name for name, _ in p.regimes]
    # figs. 7, 8, 9, 10, 13: every workload variant x regime x the paper's three systems
    for workload in ctx.main_workloads():
        for key in ctx.main_keys(workload):
            for regime in regime_names:
                cap = ctx.regime_capacity(key, regime)
                tasks += [_task(ctx, key, s, cap) for s in MAIN_SYSTEMS]
    # headroom: the project's default and the ceilings at moderate contention of each base trace
    for workload in ctx.main_workloads():
        cap = ctx.regime_capacity(workload, "moderate")
        tasks += [_task(ctx, workload, s, cap) for s in HEADROOM_SYSTEMS]
    # fig. 11: the capacity ladder
    for workload in p.fig11_workloads:
        if workload in ctx.traces:
            tasks += [_task(ctx, workload, s, frac_label(f)) for f in p.ladder for s in MAIN_SYSTEMS]
    # fig. 12: layer mixes and state dims on the SWE trace, moderate contention of each model
    if "swe" in ctx.traces:
        cap = ctx.regime_capacity("swe", "moderate")
        for name in ctx.specs:
            tasks += [_task(ctx, "swe", s, cap, model=name, per_request=False) for s in MAIN_SYSTEMS]
    # alpha ablation: workload shifts and the whole-trace alpha scan
    alphas = sorted(set(p.alpha_grid) | set(p.fixed_alphas))
    for key in ctx.alpha_keys():
        cap = ctx.regime_capacity(key, "moderate")
        tasks += [_task(ctx, key, tuned_system(m), cap) for m in p.multipliers]
        tasks += [_task(ctx, key, f"marconi:alpha={a:g}", cap) for a in alphas]
        tasks.append(_task(ctx, key, "sglang+", cap))
    # admission x eviction ablation
    for workload in p.ablation_workloads:
        if workload in ctx.traces:
            cap = ctx.regime_capacity(workload, "moderate")
            tasks += [_task(ctx, workload, f"custom:admission={a},eviction={e}", cap, per_request=False)
                      for a in p.admissions for e in p.evictions]
    return _dedupe(tasks)


def _dedupe(tasks: Iterable[SweepTask]) -> list[SweepTask]:
    seen: dict[tuple[str, str, str, str], SweepTask] = {}
    for t in tasks:
        model = t.point.model if isinstance(t.point.model, str) else t.point.model.name
        seen.setdefault((t.trace_key, t.point.system, t.point.capacity, model), t)
    return list(seen.values())


def _cost(ctx: ReproContext, task: SweepTask) -> float:
    """A rough cost for ordering (longest first balances the pool): tokens x tuning x admission."""
    tokens = sum(r.input_len for r in ctx.traces[task.trace_key]) if task.trace_key in ctx.traces else 0
    system = task.point.system
    factor = 1.0
    if "alpha=" not in system and ("marconi" == system.split(":")[0] or "flop-aware" in system):
        factor *= 12
    if "sparse-dp" in system:
        factor *= 20
    if "every-block" in system or system.startswith("vllm+"):
        factor *= 2
    return tokens * factor


# ============================================================================ orchestration
def run_reproduction(profile: ReproProfile, out_dir: str | Path, *, backend: str | Backend = "local",
                     workers: int | None = None, address: str | None = None,
                     jamba_table: str | Path | None = None, engine_latency: str | Path | None = None,
                     progress: ProgressFactory | None = None) -> ReproContext:
    """Run the whole reproduction and write ``out_dir`` (report.md, PNGs, JSONL); returns the context.

    Raises:
        FileNotFoundError: data the profile needs is missing.
    """
    from marconi.lab.reproduce import report

    started = time.perf_counter()
    progress = progress or _no_progress
    problems = data_available(profile.source)
    if problems:
        raise FileNotFoundError("; ".join(problems))
    model = get_model(profile.model)
    ctx = ReproContext(profile, model)
    ctx.specs = {k: v for k, v in spec_variants(model, profile).items() if k != model.name}
    be = make_backend(backend, workers=workers, address=address)
    ctx.backend = be.name
    try:
        t0 = time.perf_counter()
        build_traces(ctx, TraceFactory(profile.source))
        ctx.timings["traces_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        pairs = [(k, model.name) for k, i in ctx.info.items() if i.kind in ("base", "shift")]
        pairs_any: list[tuple[str, str | ModelSpec]] = list(pairs)
        pairs_any += [("swe", spec) for spec in ctx.specs.values()] if "swe" in ctx.traces else []
        ws = working_sets({k: ctx.traces[k] for k, _ in pairs_any}, pairs_any, backend=be, workers=workers)
        ctx.ws = {(k, m if isinstance(m, str) else m.name): v for (k, m), v in ws.items()}
        ctx.timings["working_sets_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        calib = calibration_tasks(ctx)
        ctx.add_records(_run(ctx, be, calib, workers, progress("calibration", len(calib))))
        calibrate(ctx, [r for r in ctx.records if r["system"] == "sglang+"])
        ctx.timings["calibration_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        done = {(r["trace"], r["system"], r["capacity"], r["model"]) for r in ctx.records}
        tasks = [t for t in plan_main_tasks(ctx)
                 if (t.trace_key, t.point.system, t.point.capacity,
                     t.point.model if isinstance(t.point.model, str) else t.point.model.name) not in done]
        tasks.sort(key=lambda t: -_cost(ctx, t))
        ctx.add_records(_run(ctx, be, tasks, workers, progress("figure points", len(tasks))))
        ctx.timings["points_s"] = time.perf_counter() - t0
        ctx.timings["num_points"] = float(len(ctx.records))
    finally:
        if be is not backend:
            be.close()
    t0 = time.perf_counter()
    ctx.timings["total_before_report_s"] = time.perf_counter() - started
    report.write_report(ctx, Path(out_dir), jamba_table=jamba_table, engine_latency=engine_latency,
                        wall_time_s=ctx.timings["total_before_report_s"])
    ctx.timings["report_s"] = time.perf_counter() - t0
    return ctx


def rerender(profile: ReproProfile, out_dir: str | Path, *, jamba_table: str | Path | None = None,
             engine_latency: str | Path | None = None) -> ReproContext:
    """Rewrite the report of an earlier run from its ``points.jsonl`` and ``summary.json`` (no simulation).

    The traces are rebuilt (they are deterministic functions of the profile) for the analyses that
    read them. Both files are checked before anything is rebuilt, and the report is replaced as a
    whole (:func:`marconi.io.atomic_directory`) only once complete.

    Raises:
        FileNotFoundError: the earlier run's files are missing.
        ConfigError: ``summary.json`` is not a reproduction's summary, or ``points.jsonl`` holds
            fewer (or more) records than the run made (a truncated file), or records the report cannot read;
            ValueError: another profile's run.
    """
    from marconi.lab.reproduce import report

    out = Path(out_dir)
    summary = read_summary(out)
    if summary["profile"] != profile.name:
        raise ValueError(f"{out} holds a {summary['profile']!r} run, not {profile.name!r}: pass "
                         f"--profile {summary['profile']} to rewrite its report")
    points = out / "points.jsonl"
    if not points.is_file():
        raise FileNotFoundError(f"{points} not found: --report-only rewrites the report of an earlier "
                                f"`marconi reproduce --out {out}` run; run that first")
    records = read_records(points)
    made = summary.get("timings", {}).get("num_points")
    if made is not None and len(records) != int(made):
        raise ConfigError(f"{points}: {len(records)} records, but {out / 'summary.json'} says the run made "
                          f"{int(made)}: the file is truncated or was edited; rerun `marconi reproduce` without "
                          "--report-only to rebuild it")
    model = get_model(profile.model)
    ctx = ReproContext(profile, model, backend=summary.get("backend", "local"))
    ctx.specs = {k: v for k, v in spec_variants(model, profile).items() if k != model.name}
    build_traces(ctx, TraceFactory(profile.source))
    ctx.ws = {(k, m): int(v) for k, m, v in summary["working_sets"]}
    ctx.regimes = {k: {n: float(f) for n, f in v.items()} for k, v in summary["regimes"].items()}
    ctx.contention = {k: {float(f): c for f, c in v.items()} for k, v in summary["contention"].items()}
    ctx.timings = dict(summary.get("timings", {}))
    try:
        ctx.add_records(records)
        report.write_report(ctx, out, jamba_table=jamba_table, engine_latency=engine_latency,
                            wall_time_s=summary.get("wall_time_s"))
    except (KeyError, TypeError, IndexError, AttributeError) as exc:   # the report is staged: out is as it was
        what = f"field {exc.args[0]!r} missing" if isinstance(exc, KeyError) and exc.args else str(exc)
        raise ConfigError(f"{points}: its records cannot be rendered ({type(exc).__name__}: {what}): the file was "
                          f"edited or is not this run's; rerun `marconi reproduce` without --report-only to rebuild "
                          f"it. {out} is unchanged") from None
    return ctx


def read_summary(out: str | Path) -> dict[str, Any]:
    """The ``summary.json`` of an earlier run in ``out``, checked to have what a re-render reads.

    Raises:
        FileNotFoundError: there is none.
        JsonError: it is not JSON (file and line named).
        ConfigError: it is not a reproduction's summary (what is wrong and what to do).
    """
    path = Path(out) / "summary.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: --report-only rewrites the report of an earlier "
                                f"`marconi reproduce --out {out}` run; run that first")
    summary = read_json(path)
    problem = _summary_problem(summary)
    if problem:
        raise ConfigError(f"{path}: not a `marconi reproduce` summary ({problem}): rerun `marconi reproduce` "
                          "without --report-only to rebuild the report")
    return summary


def _summary_problem(summary: Any) -> str | None:
    """What keeps ``summary`` from being a reproduction's summary, or None."""
    if not isinstance(summary, dict):
        return f"{described(summary)}, not an object"
    for key, kind in (("profile", str), ("working_sets", list), ("regimes", dict), ("contention", dict)):
        if key not in summary:
            return f"no {key!r}"
        if not isinstance(summary[key], kind):  # kind() is an empty one: its JSON kind is what we want
            return f"{key!r} is {described(summary[key])}, not {json_kind(kind())}"
    for entry in summary["working_sets"]:
        if not (isinstance(entry, list) and len(entry) == 3 and all(isinstance(v, str) for v in entry[:2])
                and isinstance(entry[2], (int, float)) and not isinstance(entry[2], bool)):
            return f"'working_sets' holds {entry!r}, not [trace, model, bytes]"
    for key in ("regimes", "contention"):
        for name, value in summary[key].items():
            if not isinstance(value, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                      for v in value.values()):
                return f"{key!r}[{name!r}] is not an object of numbers"
    timings = summary.get("timings", {})
    if not isinstance(timings, dict) or not isinstance(timings.get("num_points", 0), (int, float)):
        return "'timings' is not an object of numbers"
    return None


def _run(ctx: ReproContext, be: Backend, tasks: Sequence[SweepTask], workers: int | None,
         step: Callable[[int], None]) -> list[dict[str, Any]]:
    if not tasks:
        return []
    keys = {t.trace_key for t in tasks}
    return run_tasks({k: ctx.traces[k] for k in keys}, tasks, backend=be, workers=workers,
                     on_record=lambda rec: step(1))
