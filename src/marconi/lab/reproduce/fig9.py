"""Fig. 9: P95 TTFT relative to vanilla (no cache), under every available latency model."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from marconi.lab.reproduce.context import ReproContext
from marconi.lab.reproduce.figure import PAPER, FigureRecords, Finding, label, regime_gains, within_2x
from marconi.lab.reproduce.latency import ttft
from marconi.report import MISSING, fmt_pct, fmt_signed_pct, md_table, pyplot, save_figure

KEY = "fig9"
TITLE = "Fig. 9 — P95 TTFT relative to vanilla (no cache)"


def compute(ctx: ReproContext) -> FigureRecords:
    """Per latency model and workload: each point's P95 TTFT over vanilla's, and Marconi's best reductions."""
    assert ctx.latency is not None, "the report writer sets ctx.latency"
    recs = FigureRecords(KEY)
    curves: list[tuple[str, str, dict[str, list[float]]]] = []
    for lat_name, model in ctx.latency.available().items():
        for w in ctx.main_workloads():
            per_sys: dict[str, list[float]] = defaultdict(list)
            extra: dict[str, list[float]] = {"vanilla": [], "vllm+": [], "sglang+": []}
            ms: dict[str, list[float]] = {"vanilla": [], "vllm+": [], "sglang+": []}
            for key, regime, _, t in regime_gains(ctx, w):
                p95 = {}
                van = None
                for s, rec in t.items():
                    with_cache, without = ttft(rec, model, ctx.model)
                    p95[s] = float(np.percentile(with_cache, 95))
                    van = float(np.percentile(without, 95))
                assert van is not None
                for s in t:
                    per_sys[s].append(p95[s] / van)
                    recs.rows.append({"latency_model": lat_name, "trace": key, "workload": w, "regime": regime,
                                      "capacity": t[s]["capacity"], "system": s, "ttft_p95_s": p95[s],
                                      "vanilla_ttft_p95_s": van, "relative_to_vanilla": p95[s] / van})
                extra["vanilla"].append(1 - p95["marconi"] / van)
                ms["vanilla"].append(van - p95["marconi"])
                for s in ("vllm+", "sglang+"):
                    extra[s].append((p95[s] - p95["marconi"]) / van)
                    ms[s].append(p95[s] - p95["marconi"])
            if not per_sys:
                continue
            curves.append((lat_name, w, dict(per_sys)))
            best = {k: (max(v), ms[k][int(np.argmax(v))] * 1000) for k, v in extra.items()}
            recs.data.setdefault(lat_name, {})[w] = {
                "up_to_vs_vanilla": best["vanilla"][0], "up_to_vs_vanilla_ms": best["vanilla"][1],
                "up_to_vs_vllm": best["vllm+"][0], "up_to_vs_sglang": best["sglang+"][0],
                "up_to_vs_sglang_ms": best["sglang+"][1],
                "median_relative": {s: float(np.median(v)) for s, v in per_sys.items()},
                "median_vs_sglang": float(np.median(extra["sglang+"]))}
    recs.series = {"curves": curves, "latency_notes": dict(ctx.latency.notes),
                   "preferred_latency": ctx.latency.preferred()[0]}
    return recs


def plot(records: FigureRecords, out_dir: Path) -> list[Path]:
    """CDFs over points of P95 TTFT / vanilla P95, one panel per (latency model, workload)."""
    curves = {(n, w): per_sys for n, w, per_sys in records.series["curves"]}
    if not curves:
        return []
    plt = pyplot()
    names = list(dict.fromkeys(k[0] for k in curves))
    ws = list(dict.fromkeys(k[1] for k in curves))
    fig, axes = plt.subplots(len(names), len(ws), figsize=(3.0 * len(ws), 2.6 * len(names)), squeeze=False)
    for i, n in enumerate(names):
        for j, w in enumerate(ws):
            ax = axes[i][j]
            for s, vals in curves.get((n, w), {}).items():
                v = np.sort(vals)
                ax.plot(v, np.arange(1, len(v) + 1) / len(v), marker=".", label=s)
            ax.set_title(f"{label(w)}\n{n}", fontsize=7)
            ax.set_xlabel("P95 TTFT / vanilla P95", fontsize=7)
            ax.tick_params(labelsize=7)
            if i == 0 and j == 0:
                ax.legend(fontsize=7)
    fig.tight_layout()
    return [save_figure(fig, Path(out_dir) / "fig9_p95_ttft_cdf.png")]


def section(records: FigureRecords) -> str:
    rows = []
    for lat_name, by_workload in records.data.items():
        for w, d in by_workload.items():
            medians = d["median_relative"]
            rows.append([lat_name, label(w), f"{fmt_pct(d['up_to_vs_vanilla'])} ({d['up_to_vs_vanilla_ms']:.0f} ms)",
                         fmt_pct(d["up_to_vs_vllm"]), f"{fmt_pct(d['up_to_vs_sglang'])} ({d['up_to_vs_sglang_ms']:.0f} ms)",
                         " / ".join(f"{medians[s]:.2f}" for s in ("vllm+", "sglang+", "marconi")),
                         " / ".join(fmt_pct(PAPER[k].get(w)) for k in ("fig9_vs_vanilla", "fig9_vs_vllm", "fig9_vs_sglang"))
                         if w in PAPER["fig9_vs_vanilla"] else f"{MISSING} (not in paper)"])
    body = md_table(["latency model", "workload", "Marconi P95 reduction vs vanilla (up to)",
                     "extra vs vLLM+ (up to)", "extra vs SGLang+ (up to)",
                     "median P95/vanilla vLLM+ / SGLang+ / Marconi", "paper (vanilla / vLLM+ / SGLang+)"], rows)
    return body + "\n\n" + "\n".join(f"- {k}: {v}" for k, v in records.series["latency_notes"].items())


def verdict(records: FigureRecords) -> list[Finding]:
    name = records.series["preferred_latency"]
    d: dict[str, Any] = records.data.get(name, {})
    paper_ws = [w for w in d if w in PAPER["fig9_vs_vanilla"] and w != "swe-keepall"]
    if not paper_ws:
        return []
    best_ok = all(d[w]["up_to_vs_vanilla"] > 0 for w in paper_ws)
    order_ok = all(d[w]["median_relative"]["marconi"] <= d[w]["median_relative"]["sglang+"] + 1e-9
                   and d[w]["median_relative"]["sglang+"] <= d[w]["median_relative"]["vllm+"] + 1e-9
                   for w in paper_ws)
    size_ok = all(within_2x(d[w]["up_to_vs_vanilla"], PAPER["fig9_vs_vanilla"][w])
                  and within_2x(d[w]["up_to_vs_sglang"], PAPER["fig9_vs_sglang"][w]) for w in paper_ws)
    return [Finding(
        "Fig. 9", f"Marconi cuts P95 TTFT the most (vs vanilla, vLLM+, SGLang+) [{name}]",
        "up to 36.9% / 73.2% / 46.8% vs vanilla; 17.2% / 12.8% / 24.7% more than SGLang+ (LMSys / ShareGPT / SWE)",
        "; ".join(f"{label(w)}: up to {fmt_pct(d[w]['up_to_vs_vanilla'])} vs vanilla, "
                  f"{fmt_pct(d[w]['up_to_vs_sglang'])} more than SGLang+" for w in paper_ws),
        "yes" if best_ok and order_ok and size_ok else "partly" if best_ok else "no")]


def explain(records: FigureRecords, computed: Mapping[str, FigureRecords]) -> str:
    lat = records.data.get("Jamba table") or next(iter(records.data.values()), {})
    swe = lat.get("swe") if isinstance(lat, Mapping) else None
    if not swe:
        return ""
    near = 0.5 <= swe["up_to_vs_vanilla"] / 0.468 <= 2.0
    return (f"The best P95 reductions relative to vanilla follow the hit rates and "
            f"{'land near' if near else 'differ from'} the paper's percentages ({fmt_pct(swe['up_to_vs_vanilla'])} on "
            f"SWE vs 46.8%), but the absolute savings are far smaller ({swe['up_to_vs_vanilla_ms']:.0f} ms at most on SWE "
            "with the Jamba table vs the paper's 617 ms): the line fitted to the authors' own Jamba measurements gives only "
            "~173 ms for a 32k-token prefill, so the paper's milliseconds cannot come from that table alone. Marconi's "
            f"extra reduction over SGLang+ (up to {fmt_pct(swe['up_to_vs_sglang'])}, median "
            f"{fmt_signed_pct(swe['median_vs_sglang'])} of vanilla P95 on SWE) is small because its tuned α rarely beats "
            "LRU there (fig. 8).")
