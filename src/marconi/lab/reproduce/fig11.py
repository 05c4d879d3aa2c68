"""Fig. 11: Marconi's gain over SGLang+ as the cache grows (the capacity ladder)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping

from marconi.lab.reproduce.context import ReproContext
from marconi.lab.reproduce.figure import (FigureRecords, Finding, fmt_alphas, label, safe_ratio,
                                                  strip_per_request, trio)
from marconi.report import fmt_pct, fmt_signed_pct, md_table, pyplot, save_figure

KEY = "fig11"
TITLE = "Fig. 11 — gain over SGLang+ vs cache size"


def compute(ctx: ReproContext) -> FigureRecords:
    """Per ladder trace: the gain at every capacity fraction, its peak, and the gains at the high / low regimes."""
    recs = FigureRecords(KEY)
    for w in [w for w in ctx.profile.fig11_workloads if w in ctx.traces]:
        points = []
        for f in ctx.profile.ladder:
            t = trio(ctx, w, f"{f:g}x")
            if t is None:
                continue
            recs.rows += [strip_per_request(r) for r in t.values()]
            points.append({"fraction": f, "bytes": t["marconi"]["capacity_bytes"],
                           "contention": ctx.contention.get(w, {}).get(f),
                           "gain": safe_ratio(t["marconi"]["token_hit_rate"], t["sglang+"]["token_hit_rate"]) - 1,
                           "tuned_alpha": [a for _, a in t["marconi"]["tuned_alphas"]],
                           "hit": {s: r["token_hit_rate"] for s, r in t.items()}})
        if not points:
            continue
        finite = [p for p in points if math.isfinite(p["gain"])]
        peak = max(finite, key=lambda p: p["gain"])
        hi_f, lo_f = ctx.regimes[w]["high"], ctx.regimes[w]["low"]
        at = {p["fraction"]: p["gain"] for p in points}
        interior = finite[0]["fraction"] < peak["fraction"] < finite[-1]["fraction"]
        recs.data[w] = {"points": points, "peak": peak, "gain_high": at.get(hi_f), "gain_low": at.get(lo_f),
                        "high_fraction": hi_f, "low_fraction": lo_f, "interior_peak": interior}
    return recs


def plot(records: FigureRecords, out_dir: Path) -> list[Path]:
    if not records.data:
        return []
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for w, d in records.data.items():
        points = d["points"]
        ax.plot([p["fraction"] for p in points], [p["gain"] * 100 for p in points], marker="o", label=label(w))
    ax.set_xscale("log")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("cache capacity (fraction of the trace's working set)")
    ax.set_ylabel("Marconi vs SGLang+ hit rate (%)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return [save_figure(fig, Path(out_dir) / "fig11_gain_vs_capacity.png")]


def section(records: FigureRecords) -> str:
    rows = []
    for w, d in records.data.items():
        peak, hi_f, lo_f = d["peak"], d["high_fraction"], d["low_fraction"]
        rows.append([label(w), f"{fmt_signed_pct(d['gain_high'])} at {hi_f:g}x",
                     f"{fmt_signed_pct(peak['gain'])} at {peak['fraction']:g}x (contention "
                     f"{fmt_pct(peak['contention'], 0)})",
                     f"{fmt_signed_pct(d['gain_low'])} at {lo_f:g}x",
                     ", ".join(f"{p['fraction']:g}x: {fmt_signed_pct(p['gain'], 0)} (α={fmt_alphas(p['tuned_alpha'])})"
                               for p in d["points"])])
    return md_table(["trace", "high contention (paper 60 GB)", "peak", "low contention (paper 140 GB)",
                     "every capacity (Marconi's bootstrap-tuned α)"], rows)


def verdict(records: FigureRecords) -> list[Finding]:
    if "swe" not in records.data:
        return []
    d = records.data["swe"]
    g_hi, g_lo, peak = d["gain_high"], d["gain_low"], d["peak"]["gain"]
    in_band = d["high_fraction"] <= d["peak"]["fraction"] <= d["low_fraction"]
    nonmono = in_band and g_hi is not None and g_lo is not None and peak > max(g_hi, g_lo)
    return [Finding(
        "Fig. 11", "gain over SGLang+ peaks at moderate contention (non-monotonic in cache size)",
        "+24.3% at 60 GB, +68.3% peak, +10.0% at 140 GB",
        f"{fmt_signed_pct(g_hi)} at {d['high_fraction']:g}x, peak {fmt_signed_pct(peak)} at "
        f"{d['peak']['fraction']:g}x, {fmt_signed_pct(g_lo)} at {d['low_fraction']:g}x (SWE keep-5)",
        "yes" if nonmono and peak > 0 else "partly" if d["interior_peak"] and peak > 0 else "no")]


def explain(records: FigureRecords, computed: Mapping[str, FigureRecords]) -> str:
    d = records.data.get("swe")
    if not d:
        return ""
    neg = [p for p in d["points"] if p["gain"] < 0]
    hi_alpha = [p for p in neg if p["tuned_alpha"] and max(p["tuned_alpha"]) >= 1]
    untuned = [p for p in d["points"] if not p["tuned_alpha"]]
    flat = [p for p in untuned if abs(p["gain"]) < 0.01]
    return (f"Our curve follows which α the bootstrap window picks at each size more than contention: "
            f"{len(neg)}/{len(d['points'])} capacities lose to LRU on keep-5 SWE, {len(hi_alpha)} of them with a tuned "
            f"α ≥ 1; {len(untuned)} capacities never tune (nothing evicted early enough for a window to finish), "
            f"{len(flat)} of which are within 1% of LRU. The paper's 60–140 GB is a 2.3× range; our ladder spans "
            f"{d['points'][0]['fraction']:g}x–{d['points'][-1]['fraction']:g}x and on keep-5 SWE its high/low regimes sit "
            f"at {d['high_fraction']:g}x / {d['low_fraction']:g}x.")
