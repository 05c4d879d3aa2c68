"""Admission × eviction ablation (not in the paper): every admission policy under LRU and FLOP-aware eviction."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np

from marconi.lab.reproduce.context import ReproContext
from marconi.lab.reproduce.figure import (FigureRecords, Finding, capacity_point, dig, fmt_capacity, label,
                                                  strip_per_request)
from marconi.report import MISSING, fmt_pct, md_table, pyplot, save_figure

KEY = "admission"
TITLE = "Admission × eviction ablation (not in the paper)"


def compute(ctx: ReproContext) -> FigureRecords:
    """Per ablation workload at moderate contention: the token hit rate of every (admission, eviction) pair."""
    recs = FigureRecords(KEY)
    capacity = {}
    for w in [w for w in ctx.profile.ablation_workloads if w in ctx.traces]:
        cap = ctx.regime_capacity(w, "moderate")
        grid: dict[str, dict[str, float]] = {}
        for a in ctx.profile.admissions:
            for e in ctx.profile.evictions:
                rec = ctx.find(w, f"custom:admission={a},eviction={e}", cap)
                if rec is None:
                    # custom labels are "<admission>+<eviction>"
                    rec = ctx.find(w, f"{a}+{e}", cap)
                if rec is not None:
                    recs.rows.append(strip_per_request(rec))
                    grid.setdefault(a, {})[e] = rec["token_hit_rate"]
        if grid:
            best = max(((a, e, h) for a, row in grid.items() for e, h in row.items()), key=lambda x: x[2])
            recs.data[w] = {"capacity": cap, "hit_rate": grid,
                            "best": {"admission": best[0], "eviction": best[1], "hit_rate": best[2]}}
            capacity[w] = capacity_point(ctx, w, "moderate")
    recs.series = {"capacity": capacity, "evictions": list(ctx.profile.evictions)}
    return recs


def plot(records: FigureRecords, out_dir: Path) -> list[Path]:
    if not records.data:
        return []
    evictions = records.series["evictions"]
    plt = pyplot()
    fig, axes = plt.subplots(1, len(records.data), figsize=(4.5 * len(records.data), 3.2), squeeze=False)
    for ax, (w, d) in zip(axes[0], records.data.items()):
        grid = d["hit_rate"]
        adm = list(grid)
        for j, e in enumerate(evictions):
            ax.bar(np.arange(len(adm)) + 0.4 * j, [grid[a].get(e, 0) * 100 for a in adm], 0.4, label=e)
        ax.set_xticks(np.arange(len(adm)) + 0.2, adm, rotation=25, fontsize=7)
        ax.set_ylabel("token hit rate (%)")
        ax.set_title(label(w), fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return [save_figure(fig, Path(out_dir) / "admission_ablation.png")]


def section(records: FigureRecords) -> str:
    evictions = records.series["evictions"]
    parts = []
    for w, d in records.data.items():
        best = d["best"]
        parts.append(f"**{label(w)}** at {fmt_capacity(records.series['capacity'][w])}; best: {best['admission']} + "
                     f"{best['eviction']} ({fmt_pct(best['hit_rate'])})\n\n"
                     + md_table(["admission"] + evictions,
                                [[a] + [fmt_pct(row.get(e)) for e in evictions] for a, row in d["hit_rate"].items()]))
    return "\n\n".join(parts)


def verdict(records: FigureRecords) -> list[Finding]:
    evictions = records.series["evictions"]
    tables = {w: d["hit_rate"] for w, d in records.data.items()}
    beats = [grid["marconi"][e] > grid["every-block"][e] for grid in tables.values()
             for e in evictions if "marconi" in grid and "every-block" in grid and e in grid["marconi"]
             and e in grid["every-block"]]
    if not beats:
        return []
    return [Finding(
        "Admission ablation", "judicious admission beats every-block checkpointing whatever the eviction",
        f"{MISSING} (paper compares only vLLM+ = every-block+LRU with Marconi)",
        "; ".join(f"{label(w)}: marconi {' / '.join(fmt_pct(grid['marconi'].get(e)) for e in evictions)} vs "
                  f"every-block {' / '.join(fmt_pct(grid['every-block'].get(e)) for e in evictions)} "
                  f"({' / '.join(evictions)})" for w, grid in tables.items()),
        "yes" if all(beats) else "partly" if any(beats) else "no")]


def explain(records: FigureRecords, computed: Mapping[str, FigureRecords]) -> str:
    text = ["Not in the paper. The flop-aware column uses the bootstrap-tuned α"]
    swe = dig(records.data, "swe", "hit_rate")
    if swe and "marconi" in swe and "last-token" in swe:
        text.append(f"on keep-5 SWE last-token admission alone gets {fmt_pct(swe['last-token'].get('lru'))} against "
                    f"{fmt_pct(swe['marconi'].get('lru'))} for Marconi's (last token + branch points) under LRU: the "
                    "last-token checkpoints die when the next turn drops an observation (Anatomy), so the branch "
                    "checkpoints carry the reuse, and admissions that checkpoint inside inputs (uniform, sparse-dp) "
                    f"do as well ({fmt_pct(swe.get('uniform', {}).get('lru'))}, "
                    f"{fmt_pct(swe.get('sparse-dp', {}).get('lru'))})")
    return "; ".join(text) + "."
