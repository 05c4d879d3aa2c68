"""Write the reproduction's report: report.md, summary.md/json, figN.jsonl and the PNGs (atomically).

Every figure is computed from the context once (:data:`FIGURES`, in report order); its plot,
section, verdict and "why ours differ" are then drawn from its records alone. The report's own
sections (traces, capacities, run) read the context.

The whole directory is written into a staging directory and swapped in once complete
(:func:`marconi.io.atomic_directory`): an interrupted write leaves the earlier report as it was,
never old and new files mixed, and files of an earlier report that this one lacks are gone.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from marconi.lab.reproduce import (admission, alpha, anatomy, fig7, fig8, fig9, fig10, fig11, fig12,
                                           fig13, headroom)
from marconi.lab.reproduce.context import ReproContext
from marconi.lab.reproduce.figure import Figure, FigureRecords, Finding
from marconi.lab.reproduce.latency import LatencySet, latency_set
from marconi.lab.reproduce.traces import WORKLOAD_LABELS
from marconi.io import atomic_directory, write_text
from marconi.report import MISSING, fmt_pct, md_table
from marconi.sim.sweep import write_records
from marconi.units import format_bytes

__all__ = ["FIGURES", "FigureReport", "write_report"]

FIGURES: tuple[Figure, ...] = (fig7, fig8, fig9, fig10, fig11, fig12, fig13, headroom, alpha, admission, anatomy)

HOLDS_LEGEND = ("*holds*: **yes** = the direction of the paper's finding and, where the paper quotes a magnitude, its "
                "size within 2×; **partly** = the direction only, or on some workloads only; **no** = the direction "
                "fails. Lead observations are judged against the lead's statement.")

TRACE_NOTES = """\
How our traces differ from the paper's (all built by the paper's recipe, `../shared/data/README.md`):

- **Tokenizer**: Mistral-7B v0.1 (32k SentencePiece-BPE, a Llama-2 look-alike) instead of Llama-2's; each message is
  tokenized on its own as `json.dumps(message)` with BOS, as the paper did (`--tokenizer llama2` uses the paper's).
- **LMSys**: LMSys-Chat-1M cannot be redistributed; ShareGPT (first sessions with ≥ 20 messages, in file order) stands in
  for it, and LMSys rows appear only when `--lmsys FILE` is given.
- **SWE**: mini-swe-agent v1.15 trajectories of gemini-3-pro on SWE-bench Verified (the paper: SWE-agent runs), first
  sessions by name, keep the last 5 observations, Poisson gaps of mean 7.5 s, 32k-token / 50-call caps. Their inputs are
  long (see the table) and every session runs many calls, so most turns are past the 6th, where the keep-5 recipe starts
  dropping observations. We also build the **keep-all** variant of the same trajectories.
- **Mooncake** (not in the paper): Kimi's production trace rebuilt at 512-token block granularity: no sessions, prefix
  sharing only at block boundaries.
- **Timing variants** (fig. 8, 13) are derived from the base traces without re-tokenizing: session *k* starts at
  *k* / rate; SWE gaps are the builder's own Poisson draws for each seed and mean (checked equal to rebuilding).
"""

CAPACITY_NOTES = """\
The paper swept 60–140 GB with its 7B model but gives no working sets for its traces. Ours differ by more than an order of
magnitude between workloads (table above), so one GB figure would be a different regime on each. Every capacity here is a
fraction of the trace's **working set** (`working_set_bytes`: what an unbounded cache with Marconi's admission holds at
the end), and the paper's regimes are placed by **contention** = SGLang+'s token hit rate at that capacity ÷ its hit rate
with an unbounded cache: *high* ≈ 0.25 stands for the paper's 60 GB, *moderate* ≈ 0.5 for the middle of its sweep (where
its gain peaked), *low* ≈ 0.85 for its 140 GB. Timing variants use their base trace's working set (same bytes across arrival
rates and seeds); fig. 12's models each use their own working set, so contention stays comparable as the state grows.
"""


@dataclass(slots=True)
class FigureReport:
    """One figure as the report shows it: its records, plots, markdown, findings and "why ours differ"."""

    key: str
    title: str
    records: FigureRecords
    plots: list[Path] = field(default_factory=list)
    body: str = ""
    findings: list[Finding] = field(default_factory=list)
    why: str = ""


def write_report(ctx: ReproContext, out: Path, *, jamba_table: str | Path | None = None,
                 engine_latency: str | Path | None = None, wall_time_s: float | None = None) -> list[FigureReport]:
    """Compute every figure from ``ctx`` and write the report directory; returns the figures.

    Sets ``ctx.latency`` from ``jamba_table`` / ``engine_latency`` (figs. 9 and 10 read it).
    ``out`` is replaced as a whole, once every file is written (see the module docstring).
    """
    lat = ctx.latency = latency_set(jamba_table, engine_latency)
    computed = {fig.KEY: fig.compute(ctx) for fig in FIGURES}
    with atomic_directory(out) as stage:
        write_records(ctx.records, stage / "points.jsonl")
        for key, records in computed.items():
            write_records(records.rows, stage / f"{key}.jsonl")
        reports = [FigureReport(fig.KEY, fig.TITLE, computed[fig.KEY], fig.plot(computed[fig.KEY], stage),
                                fig.section(computed[fig.KEY]), fig.verdict(computed[fig.KEY]),
                                fig.explain(computed[fig.KEY], computed)) for fig in FIGURES]
        findings = [f for rep in reports for f in rep.findings]
        summary = md_table(["figure", "paper's finding", "paper", "ours", "holds"],
                           [[f.figure, f.claim, f.paper, f.ours, f.holds] for f in findings])
        write_text(stage / "summary.md", summary + "\n")
        # the directory's manifest: a later run replaces these and refuses anything else found there
        files = sorted({p.name for p in stage.iterdir()} | {"summary.json", "report.md"})
        write_text(stage / "summary.json", json.dumps(_jsonable({
            "profile": ctx.profile.name, "backend": ctx.backend, "wall_time_s": wall_time_s, "timings": ctx.timings,
            "regimes": ctx.regimes, "contention": ctx.contention,
            "working_sets": [[k, m, v] for (k, m), v in ctx.ws.items()],
            "latency": lat.notes, "findings": [f.as_dict() for f in findings],
            "figures": {rep.key: rep.records.data for rep in reports}, "files": files}), indent=1) + "\n")
        write_text(stage / "report.md", _render(ctx, reports, lat, summary, wall_time_s))
    for rep in reports:  # where the plots are now that the staging directory became ``out``
        rep.plots = [Path(out) / plot.name for plot in rep.plots]
    return reports


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


def _render(ctx: ReproContext, reports: list[FigureReport], lat: LatencySet, summary: str,
            elapsed: float | None) -> str:
    p, model = ctx.profile, ctx.model
    parts = ["# Reproducing Marconi's evaluation (arXiv 2411.19379, §5) on real traces\n",
             f"Profile **{p.name}**, model **{model.name}** ({model.num_attn_layers} attention / "
             f"{model.num_ssm_layers} SSM / {model.num_mlp_layers} MLP layers, D={model.d_model}, "
             f"N={model.ssm_state_dim}; KV {format_bytes(model.kv_bytes_per_token)}/token, SSM checkpoint "
             f"{format_bytes(model.ssm_checkpoint_bytes)}), backend **{ctx.backend}**, "
             f"{len(ctx.records)} simulations" + (f" in **{elapsed:.0f} s** (wall time of the simulation phases)"
                                                  if elapsed is not None else "")
             + f". Data: {p.source.describe()}. Every number below is computed from the JSONL records in this "
               "directory; the paper's numbers are quoted from its §5. Replay is sequential (each request matched, "
               "then inserted), as in the authors' simulator; token hit rate = reused input tokens / input tokens. "
               "*Marconi* in figs. 7–13 is the paper's system (α bootstrap-tuned once, `marconi:tuner=bootstrap`); "
               "this project's default `marconi` (its eviction rule re-chosen online) is measured beside it, with "
               "the `oracle` and `infinite` ceilings, in the Headroom section.\n",
             "## Summary\n", summary, "\n", HOLDS_LEGEND, "\n",
             "## Traces\n", _traces_table(ctx), "\n", TRACE_NOTES, "\n",
             "## Capacities: how the paper's 60–140 GB map onto our traces\n", CAPACITY_NOTES, "\n",
             _capacity_table(ctx), "\n"]
    for rep in reports:
        parts.append(f"## {rep.title}\n")
        for plot in rep.plots:
            parts.append(f"![{rep.key}]({plot.name})\n")
        if rep.body:
            parts.append(rep.body + "\n")
        if rep.why:
            parts.append(f"**Why ours differ.** {rep.why}\n")
        parts.append(f"Records: `{rep.key}.jsonl` ({len(rep.records.rows)} rows).\n")
    parts.append("## Run\n")
    parts.append(md_table(["phase", "seconds"], [[k, f"{v:.1f}"] for k, v in ctx.timings.items() if k.endswith("_s")]))
    parts.append("\nLatency models: " + "; ".join(f"**{k}** — {v}" for k, v in lat.notes.items()) + "\n")
    parts.append("## Summary table (repeated)\n")
    parts.append(summary + "\n")
    return "\n".join(parts)


def _traces_table(ctx: ReproContext) -> str:
    rows = []
    for key, info in ctx.info.items():
        if info.kind == "variant":
            continue
        st = ctx.traces[key].stats()
        ws = ctx.ws.get((key, ctx.model.name))
        rows.append([WORKLOAD_LABELS.get(key, key), st.num_sessions, st.num_requests, f"{st.total_input_tokens:,}",
                     f"{st.input_len_mean:,.0f}", f"{st.input_len_p50:,.0f} / {st.input_len_p90:,.0f}",
                     f"{st.output_len_mean:,.0f}", f"{st.duration_s:,.0f}", format_bytes(ws) if ws else MISSING])
    variants = sum(1 for i in ctx.info.values() if i.kind == "variant")
    return md_table(["trace", "sessions", "requests", "input tokens", "mean input", "P50 / P90 input",
                     "mean output", "span (s)", "working set"], rows) + \
        f"\n\nPlus {variants} timing variants (arrival rates, gap seeds and means) of these traces."


def _capacity_table(ctx: ReproContext) -> str:
    rows = []
    names = [n for n, _ in ctx.profile.regimes]
    for key, chosen in ctx.regimes.items():
        ws = ctx.ws.get((key, ctx.model.name), 0)
        cont = ctx.contention.get(key, {})
        unb = ctx.find(key, "sglang+", "1x")
        rows.append([WORKLOAD_LABELS.get(key, key), fmt_pct(unb["token_hit_rate"]) if unb else MISSING]
                    + [f"{chosen[n]:g}x = {format_bytes(chosen[n] * ws)} ({fmt_pct(cont.get(chosen[n]), 0)})"
                       for n in names]
                    + [", ".join(f"{f:g}x: {fmt_pct(c, 0)}" for f, c in sorted(cont.items()))])
    targets = ", ".join(f"{n} ≈ {t:g}" for n, t in ctx.profile.regimes)
    swe = ""
    if "swe" in ctx.regimes:
        ws = ctx.ws.get(("swe", ctx.model.name), 0)
        swe = (" On keep-5 SWE the regimes come out at " + " / ".join(
            format_bytes(ctx.regimes["swe"][n] * ws) for n in names) + " (paper: 60 … 140 GB on its SWE trace).")
    return (f"Targets (SGLang+ hit rate / its unbounded hit rate): {targets}.{swe}\n\n"
            + md_table(["trace", "SGLang+ unbounded"] + [f"{n} contention" for n in names] + ["contention ladder"], rows))
