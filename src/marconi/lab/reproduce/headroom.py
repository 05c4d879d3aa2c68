"""Headroom (not in the paper): every system as a fraction of the ``oracle`` and ``infinite`` ceilings.

At moderate contention of each base trace: vLLM+, SGLang+, the paper's Marconi (bootstrap-tuned α),
this project's default ``marconi`` (its eviction rule re-chosen online by exact worlds), the future-aware
``oracle`` and the unbounded ``infinite``. The oracle is a strong reference, not a proven bound
(Belady's rule with variable sizes and a tree's dependencies); ``infinite`` is the absolute ceiling
of the admission policy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np

from marconi.lab.reproduce.context import PAPER_MARCONI, ReproContext
from marconi.lab.reproduce.figure import (FigureRecords, Finding, capacity_point, fmt_capacity, label,
                                                  safe_ratio, strip_per_request)
from marconi.report import MISSING, fmt_pct, fmt_pts, md_table, pyplot, save_figure

KEY = "headroom"
TITLE = "Headroom (not in the paper): every system as a fraction of the oracle and of the infinite cache"

#: (record system name, report label), in table order.
SYSTEMS = (("vllm+", "vLLM+"), ("sglang+", "SGLang+"), (PAPER_MARCONI, "Marconi (paper: bootstrap α)"),
           ("marconi", "Marconi (default: adaptive, exact worlds)"), ("oracle", "oracle"), ("infinite", "infinite"))


def compute(ctx: ReproContext) -> FigureRecords:
    """Per base trace at moderate contention: each system's hit rate and its share of the ceilings."""
    recs = FigureRecords(KEY)
    capacity = {}
    for w in ctx.main_workloads():
        cap = ctx.regime_capacity(w, "moderate")
        found = {name: ctx.find(w, name, cap) for name, _ in SYSTEMS}
        if any(r is None for r in found.values()):
            continue
        recs.rows += [strip_per_request(r) for r in found.values()]
        hit = {name: r["token_hit_rate"] for name, r in found.items()}
        recs.data[w] = {"capacity": cap, "hit_rate": hit,
                        "of_oracle": {n: safe_ratio(h, hit["oracle"]) for n, h in hit.items()},
                        "of_infinite": {n: safe_ratio(h, hit["infinite"]) for n, h in hit.items()}}
        capacity[w] = capacity_point(ctx, w, "moderate")
    recs.series = {"capacity": capacity}
    return recs


def plot(records: FigureRecords, out_dir: Path) -> list[Path]:
    """Hit rate per system and trace, with the oracle and infinite ceilings drawn over the bars."""
    if not records.data:
        return []
    plt = pyplot()
    online = [(n, lab) for n, lab in SYSTEMS if n not in ("oracle", "infinite")]
    traces = list(records.data)
    fig, ax = plt.subplots(figsize=(2.2 + 1.8 * len(traces), 3.6))
    width = 0.8 / len(online)
    x = np.arange(len(traces))
    for j, (name, lab) in enumerate(online):
        ax.bar(x + j * width, [100 * records.data[w]["hit_rate"][name] for w in traces], width, label=lab)
    left, right = x - width / 2, x + width * (len(online) - 0.5)
    for ceiling, style in (("oracle", "k-"), ("infinite", "k:")):
        for i, w in enumerate(traces):
            ax.plot([left[i], right[i]], [100 * records.data[w]["hit_rate"][ceiling]] * 2, style,
                    label=ceiling if i == 0 else None)
    ax.set_xticks(x + width * (len(online) - 1) / 2, [label(w) for w in traces], fontsize=8)
    ax.set_ylabel("token hit rate (%)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return [save_figure(fig, Path(out_dir) / "headroom.png")]


def section(records: FigureRecords) -> str:
    rows = []
    for w, d in records.data.items():
        rows.append([label(w), fmt_capacity(records.series["capacity"][w])]
                    + [f"{fmt_pct(d['hit_rate'][n])} ({fmt_pct(d['of_oracle'][n], 0)} / {fmt_pct(d['of_infinite'][n], 0)})"
                       for n, _ in SYSTEMS if n not in ("oracle", "infinite")]
                    + [fmt_pct(d["hit_rate"]["oracle"]), fmt_pct(d["hit_rate"]["infinite"])])
    return ("Each cell: token hit rate (its share of the oracle's / of the infinite cache's). The oracle "
            "is a strong reference, not a proven bound.\n\n"
            + md_table(["trace", "capacity (moderate)"] + [lab for n, lab in SYSTEMS], rows) if rows else "")


def verdict(records: FigureRecords) -> list[Finding]:
    d = records.data
    if not d:
        return []
    ours = {w: v["hit_rate"]["marconi"] for w, v in d.items()}
    lru = {w: v["hit_rate"]["sglang+"] for w, v in d.items()}
    paper = {w: v["hit_rate"][PAPER_MARCONI] for w, v in d.items()}
    beats_lru = [w for w in d if ours[w] >= lru[w]]
    beats_paper = [w for w in d if ours[w] >= paper[w]]
    under_oracle = [w for w in d if max(v for n, v in d[w]["hit_rate"].items() if n not in ("oracle", "infinite"))
                    <= d[w]["hit_rate"]["oracle"] + 1e-12]
    listing = "; ".join(f"{label(w)} {fmt_pct(ours[w])} vs SGLang+ {fmt_pct(lru[w])}, paper's {fmt_pct(paper[w])}, "
                        f"{fmt_pct(d[w]['of_oracle']['marconi'], 0)} of the oracle" for w in d)
    return [
        Finding("Headroom", "(ours) the default Marconi is at least SGLang+ and at least the paper's bootstrap "
                            "Marconi", f"{MISSING} (not in the paper)", listing,
                "yes" if len(beats_lru) == len(d) and len(beats_paper) == len(d)
                else "partly" if beats_lru or beats_paper else "no"),
        Finding("Headroom (oracle)", "(ours) the future-aware oracle is at least every online system",
                f"{MISSING} (a reference, not a proven bound)",
                f"{len(under_oracle)}/{len(d)} traces", "yes" if len(under_oracle) == len(d) else "partly"),
    ]


def explain(records: FigureRecords, computed: Mapping[str, FigureRecords]) -> str:
    d = records.data
    if not d:
        return ""
    gaps = {w: v["hit_rate"]["oracle"] - v["hit_rate"]["marconi"] for w, v in d.items()}
    widest = max(gaps, key=lambda w: gaps[w])
    return (f"The oracle shows what eviction alone could still win at this capacity over the default Marconi: "
            f"up to {fmt_pts(gaps[widest])} on {label(widest)}; the rest of the gap to the infinite cache is "
            "capacity, which no eviction policy recovers.")
