"""Fig. 8: Marconi's gain over SGLang+ across arrival rates, seeds and capacities."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping

import numpy as np

from marconi.lab.reproduce.context import ReproContext
from marconi.lab.reproduce.figure import (PAPER, FigureRecords, Finding, dig, label, regime_gains,
                                                  strip_per_request, within_2x)
from marconi.report import MISSING, fmt_pct, fmt_signed_pct, md_table, pyplot, save_figure

KEY = "fig8"
TITLE = "Fig. 8 — Marconi's gain over SGLang+ across arrival rates, seeds and capacities"


def compute(ctx: ReproContext) -> FigureRecords:
    """Per workload: the distribution of the gain over every (variant, regime) point."""
    recs = FigureRecords(KEY)
    gains_by_workload = {}
    for w in ctx.main_workloads():
        gains = regime_gains(ctx, w)
        if not gains:
            continue
        g = np.array([x[2] for x in gains if math.isfinite(x[2])])
        for _, _, _, t in gains:
            recs.rows += [strip_per_request(r) for r in t.values()]
        gains_by_workload[w] = g.tolist()
        recs.data[w] = {"n": int(g.size), "p5": float(np.percentile(g, 5)), "median": float(np.median(g)),
                        "p95": float(np.percentile(g, 95)), "min": float(g.min()), "max": float(g.max()),
                        "fraction_positive": float((g > 0).mean()),
                        "by_regime": {r: float(np.median([x[2] for x in gains if x[1] == r]))
                                      for r, _ in ctx.profile.regimes if any(x[1] == r for x in gains)}}
    recs.series = {"gains": gains_by_workload, "regimes": [r for r, _ in ctx.profile.regimes]}
    return recs


def plot(records: FigureRecords, out_dir: Path) -> list[Path]:
    dists = records.series["gains"]
    if not dists:
        return []
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(dists), 3.4))
    ax.boxplot([np.asarray(d) * 100 for d in dists.values()], whis=(5, 95))
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(range(1, len(dists) + 1), [label(w) for w in dists], fontsize=7, rotation=12)
    ax.set_ylabel("Marconi vs SGLang+ token hit rate (%)")
    fig.tight_layout()
    return [save_figure(fig, Path(out_dir) / "fig8_gain_vs_sglang.png")]


def section(records: FigureRecords) -> str:
    regimes = records.series["regimes"]
    rows = []
    for w, stats in records.data.items():
        paper = PAPER["fig8_p95_gain"].get(w)
        rows.append([label(w), stats["n"], fmt_signed_pct(stats["p5"]), fmt_signed_pct(stats["median"]),
                     fmt_signed_pct(stats["p95"]), fmt_pct(stats["fraction_positive"], 0),
                     " / ".join(fmt_signed_pct(stats["by_regime"].get(r)) for r in regimes),
                     fmt_signed_pct(paper) if paper is not None else f"{MISSING} (not in paper)"])
    return md_table(["workload", "configs", "P5", "median", "P95", "configs with a gain",
                     f"median by contention ({' / '.join(regimes)})", "paper P95"], rows)


def verdict(records: FigureRecords) -> list[Finding]:
    data, findings = records.data, []
    paper_ws = [w for w in data if w in PAPER["fig8_p95_gain"] and w != "swe-keepall"]
    if paper_ws:
        p95 = {w: data[w]["p95"] for w in paper_ws}
        med = {w: data[w]["median"] for w in paper_ws}
        direction = all(p95[w] > 0 for w in paper_ws)
        size = all(within_2x(p95[w], PAPER["fig8_p95_gain"][w]) for w in paper_ws)
        ordered = "swe" not in p95 or max(p95, key=lambda w: p95[w]) == "swe"
        holds = "yes" if direction and size and ordered else "partly" if direction else "no"
        findings.append(Finding(
            "Fig. 8", "FLOP-aware eviction beats LRU (P95 over runs), most on SWE",
            "P95 +45.6% LMSys, +19.0% ShareGPT, +219.7% SWE",
            "; ".join(f"{label(w)} P95 {fmt_signed_pct(p95[w])} (median {fmt_signed_pct(med[w])})" for w in paper_ws),
            holds))
    if "swe-keepall" in data:
        d = data["swe-keepall"]
        findings.append(Finding(
            "Fig. 8 (keep-all SWE)", "same claim on SWE traces that keep every observation",
            "+219.7% (P95, SWE)", f"P95 {fmt_signed_pct(d['p95'])} (median {fmt_signed_pct(d['median'])})",
            "yes" if within_2x(d["p95"], 2.197) else "partly" if d["p95"] > 0 else "no"))
    return findings


def _oracle_gain(computed: Mapping[str, FigureRecords], key: str) -> tuple[float | None, float | None]:
    """The α ablation's best fixed α on a trace: its gain over LRU, and that α."""
    d = dig(computed["alpha"].data, key)
    if not d or not d.get("lru_hit"):
        return None, None
    return d["oracle_hit"] / d["lru_hit"] - 1, d["oracle_alpha"]


def explain(records: FigureRecords, computed: Mapping[str, FigureRecords]) -> str:
    g5, a5 = _oracle_gain(computed, "swe")
    ga, aa = _oracle_gain(computed, "swe-keepall")
    alphas = dig(computed["anatomy"].data, "tuned_alpha_distribution", "alphas", default=[])
    share = float(np.mean([a >= 1 for a in alphas])) if alphas else None
    swe = records.data.get("swe")
    if not swe:
        return ""
    by = swe["by_regime"]
    text = [f"The paper's SWE gains are not reproduced (P95 {fmt_signed_pct(swe['p95'])}, median "
            f"{fmt_signed_pct(swe['median'])}); by contention the SWE medians are "
            + " / ".join(f"{fmt_signed_pct(v)} ({k})" for k, v in by.items())
            + f". The bootstrap tuner picks α ≥ 1 in {fmt_pct(share, 0)} of all runs; where it does, the large α keeps "
              "long dead sequences after its window (Anatomy section), and where nothing is evicted before the trace "
              "drains it never tunes and Marconi tracks LRU"]
    if g5 is not None:
        text.append(f"even the best fixed α chosen on the whole trace (an oracle) gains only {fmt_signed_pct(g5)} "
                    f"(α={a5:g}) over LRU on keep-5 SWE" + (f" and {fmt_signed_pct(ga)} (α={aa:g}) on keep-all SWE"
                                                              if ga is not None else "")
                    + " at moderate contention — the ceiling of FLOP-aware eviction on these traces, far below +219.7%")
    return "; ".join(text) + "."
