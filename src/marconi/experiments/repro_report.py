"""Write the reproduction's report: report.md, summary.md/json, figN.jsonl and the PNGs (atomically).

Also builds the latency models fig. 9/10 use: the A100 roofline on the paper's 7B model, the
paper's own Jamba-1.5-Mini measurements fitted with a line (read from ../shared/data, never
vendored), and the engine's measured CPU TTFT when a table or ``marconi engine bench`` records exist.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from marconi.experiments import repro_explain
from marconi.experiments.repro_figures import FIGURES, FigureReport, LatencySet, md_table, pct
from marconi.experiments.repro_traces import WORKLOAD_LABELS
from marconi.io import iter_jsonl, write_text
from marconi.sim.latency import RooflineLatency, TableLatency
from marconi.sim.sweep import write_records
from marconi.units import format_bytes
from marconi.workloads import shared_data_dir

__all__ = ["write_report", "latency_set", "engine_latency_from_file", "JAMBA_TABLE"]

JAMBA_TABLE = ("latency", "jamba-1.5-mini_4xA100_ttft.csv")
HOLDS_LEGEND = ("*holds*: **yes** = the direction of the paper's finding and, where the paper quotes a magnitude, its "
                "size within 2×; **partly** = the direction only, or on some workloads only; **no** = the direction "
                "fails. Lead observations are judged against the lead's statement.")


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        value = float(obj)
        return value if math.isfinite(value) else None
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, Path):
        return str(obj)
    return obj


# ============================================================================ latency models
def engine_latency_from_file(path: str | Path) -> TableLatency:
    """The engine's measured TTFT as a fitted line: a CSV (tokens, TTFT) or ``engine bench --out`` JSONL.

    From JSONL, every ``kind == "ttft"`` record gives two points: (input_len, ttft_full_s) and
    (input_len − hit_len, ttft_cached_s).
    """
    path = Path(path)
    if path.suffix.lower() == ".csv":
        return TableLatency.from_csv(path, name=f"engine:{path.stem}")
    xs, ys = [], []
    for _, rec in iter_jsonl(path):
        if not isinstance(rec, dict) or rec.get("kind") != "ttft":
            continue
        xs += [rec["input_len"], rec["input_len"] - rec["hit_len"]]
        ys += [rec["ttft_full_s"], rec["ttft_cached_s"]]
    if len(xs) < 2:
        raise ValueError(f"{path}: no 'ttft' records of `marconi engine bench --out` to fit")
    slope, intercept = np.polyfit(np.asarray(xs, dtype=float), np.asarray(ys, dtype=float), 1)
    return TableLatency(float(intercept), float(slope), f"engine:{path.stem}")


def latency_set(jamba_table: str | Path | None, engine_latency: str | Path | None) -> LatencySet:
    models: dict[str, Any] = {"A100 roofline": RooflineLatency("a100")}
    notes = {"A100 roofline": "prefill FLOPs of the uncached span of the paper's 7B hybrid at 50% of an A100's "
                              "312 TFLOP/s, + 5 ms (`RooflineLatency('a100')`)"}
    if jamba_table is None:
        shared = shared_data_dir()
        jamba_table = shared.joinpath(*JAMBA_TABLE) if shared is not None else None
    if jamba_table is not None and Path(jamba_table).is_file():
        table = TableLatency.from_csv(jamba_table)
        models["Jamba table"] = table
        notes["Jamba table"] = (f"the paper's Jamba-1.5-Mini 4×A100 measurements ({Path(jamba_table).name}, read from "
                                f"../shared, not vendored) fitted with a line as the paper did: "
                                f"TTFT = {table.intercept_s * 1000:.1f} ms + {table.slope_s_per_token * 1e6:.1f} µs × "
                                "uncached tokens")
    else:
        models["Jamba table"] = None
        notes["Jamba table"] = "not available: ../shared/data/latency/jamba-1.5-mini_4xA100_ttft.csv not found"
    if engine_latency is not None:
        eng = engine_latency_from_file(engine_latency)
        models["engine (CPU, measured)"] = eng
        notes["engine (CPU, measured)"] = (f"{Path(engine_latency).name} fitted with a line: TTFT = "
                                           f"{eng.intercept_s * 1000:.1f} ms + {eng.slope_s_per_token * 1e6:.1f} µs × "
                                           "uncached tokens")
    else:
        models["engine (CPU, measured)"] = None
        notes["engine (CPU, measured)"] = ("not available: no engine latency table was given (run `marconi engine "
                                           "bench --out bench.jsonl` and pass `--engine-latency bench.jsonl`)")
    return LatencySet(models, notes)


# ============================================================================ report
def write_report(ctx: Any, out: Path, *, jamba_table: str | Path | None = None,
                 engine_latency: str | Path | None = None, wall_time_s: float | None = None) -> list[FigureReport]:
    """Compute every figure from ``ctx.records`` and write the report directory; returns the figures."""
    import matplotlib

    matplotlib.use("Agg")
    out.mkdir(parents=True, exist_ok=True)
    lat = latency_set(jamba_table, engine_latency)
    reports = [fn(ctx, out, lat) for fn in FIGURES]
    write_records(ctx.records, out / "points.jsonl")
    for rep in reports:
        write_records(rep.records, out / f"{rep.key}.jsonl")
    elapsed = wall_time_s
    findings = [f for rep in reports for f in rep.findings]
    summary = md_table(["figure", "paper's finding", "paper", "ours", "holds"],
                       [[f.figure, f.claim, f.paper, f.ours, f.holds] for f in findings])
    write_text(out / "summary.md", summary + "\n")
    write_text(out / "summary.json", json.dumps(_jsonable({
        "profile": ctx.profile.name, "backend": ctx.backend, "wall_time_s": elapsed, "timings": ctx.timings,
        "regimes": ctx.regimes, "contention": ctx.contention,
        "working_sets": [[k, m, v] for (k, m), v in ctx.ws.items()],
        "latency": lat.notes, "findings": [f.as_dict() for f in findings],
        "figures": {rep.key: rep.data for rep in reports}}), indent=1) + "\n")
    write_text(out / "report.md", _render(ctx, reports, lat, summary, elapsed))
    return reports


def _render(ctx: Any, reports: list[FigureReport], lat: LatencySet, summary: str, elapsed: float | None) -> str:
    p = ctx.profile
    parts = ["# Reproducing Marconi's evaluation (arXiv 2411.19379, §5) on real traces\n",
             f"Profile **{p.name}**, model **{ctx.model.name}** ({ctx.model.num_attn_layers} attention / "
             f"{ctx.model.num_ssm_layers} SSM / {ctx.model.num_mlp_layers} MLP layers, D={ctx.model.d_model}, "
             f"N={ctx.model.ssm_state_dim}; KV {format_bytes(ctx.model.kv_bytes_per_token)}/token, SSM checkpoint "
             f"{format_bytes(ctx.model.ssm_checkpoint_bytes)}), backend **{ctx.backend}**, "
             f"{len(ctx.records)} simulations" + (f" in **{elapsed:.0f} s** (wall time of the simulation phases)"
                                                  if elapsed is not None else "")
             + f". Data: {p.source.describe()}. Every number below is computed from the JSONL records in this directory; the paper's numbers are "
               "quoted from its §5. Replay is sequential (each request matched, then inserted), as in the authors' "
               "simulator; token hit rate = reused input tokens / input tokens.\n",
             "## Summary\n", summary, "\n", HOLDS_LEGEND, "\n",
             "## Traces\n", _traces_table(ctx), "\n", repro_explain.TRACE_NOTES, "\n",
             "## Capacities: how the paper's 60–140 GB map onto our traces\n", repro_explain.CAPACITY_NOTES, "\n",
             _capacity_table(ctx), "\n"]
    by_key = {rep.key: rep for rep in reports}
    for rep in reports:
        parts.append(f"## {rep.title}\n")
        for plot in rep.plots:
            parts.append(f"![{rep.key}]({plot.name})\n")
        if rep.body:
            parts.append(rep.body + "\n")
        why = repro_explain.explain(rep.key, ctx, rep, by_key)
        if why:
            parts.append(f"**Why ours differ.** {why}\n")
        parts.append(f"Records: `{rep.key}.jsonl` ({len(rep.records)} rows).\n")
    parts.append("## Run\n")
    parts.append(md_table(["phase", "seconds"], [[k, f"{v:.1f}"] for k, v in ctx.timings.items() if k.endswith("_s")]))
    parts.append("\nLatency models: " + "; ".join(f"**{k}** — {v}" for k, v in lat.notes.items()) + "\n")
    parts.append("## Summary table (repeated)\n")
    parts.append(summary + "\n")
    return "\n".join(parts)


def _traces_table(ctx: Any) -> str:
    rows = []
    for key, info in ctx.info.items():
        if info.kind == "variant":
            continue
        tr = ctx.traces[key]
        st = tr.stats()
        ws = ctx.ws.get((key, ctx.model.name))
        rows.append([WORKLOAD_LABELS.get(key, key), st.num_sessions, st.num_requests, f"{st.total_input_tokens:,}",
                     f"{st.input_len_mean:,.0f}", f"{st.input_len_p50:,.0f} / {st.input_len_p90:,.0f}",
                     f"{st.output_len_mean:,.0f}", f"{st.duration_s:,.0f}", format_bytes(ws) if ws else "–"])
    variants = sum(1 for i in ctx.info.values() if i.kind == "variant")
    return md_table(["trace", "sessions", "requests", "input tokens", "mean input", "P50 / P90 input",
                     "mean output", "span (s)", "working set"], rows) + \
        f"\n\nPlus {variants} timing variants (arrival rates, gap seeds and means) of these traces."


def _capacity_table(ctx: Any) -> str:
    rows = []
    names = [n for n, _ in ctx.profile.regimes]
    for key, chosen in ctx.regimes.items():
        ws = ctx.ws.get((key, ctx.model.name), 0)
        cont = ctx.contention.get(key, {})
        unb = ctx.find(key, "sglang+", "1x")
        rows.append([WORKLOAD_LABELS.get(key, key), pct(unb["token_hit_rate"]) if unb else "–"]
                    + [f"{chosen[n]:g}x = {format_bytes(chosen[n] * ws)} ({pct(cont.get(chosen[n]), 0)})" for n in names]
                    + [", ".join(f"{f:g}x: {pct(c, 0)}" for f, c in sorted(cont.items()))])
    targets = ", ".join(f"{n} ≈ {t:g}" for n, t in ctx.profile.regimes)
    swe = ""
    if "swe" in ctx.regimes:
        ws = ctx.ws.get(("swe", ctx.model.name), 0)
        swe = (" On keep-5 SWE the regimes come out at " + " / ".join(
            format_bytes(ctx.regimes["swe"][n] * ws) for n in names) + " (paper: 60 … 140 GB on its SWE trace).")
    return (f"Targets (SGLang+ hit rate / its unbounded hit rate): {targets}.{swe}\n\n"
            + md_table(["trace", "SGLang+ unbounded"] + [f"{n} contention" for n in names] + ["contention ladder"], rows))
