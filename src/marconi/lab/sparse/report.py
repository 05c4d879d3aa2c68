"""The study's report, from records alone: findings, Pareto plots and ``summary.md``.

Everything here reads the JSONL records (``--from-records`` redraws an earlier run); nothing
simulates. A DP point "ties" a heuristic point when their recomputed FLOPs differ by at most
``max(_TIE_REL * theirs, _TIE_ABS * input FLOPs)``; "Marconi is enough" when its recomputed FLOPs
are within ``_ENOUGH_ABS`` of input FLOPs of the best DP point's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from marconi.lab.sparse.study import LARGE, LARGE_CAPACITY_BYTES, SUMMARY_BUDGETS
from marconi.report import drop_stale_plots, fmt_pct, md_table, pyplot, save_figure
from marconi.io import atomic_write

__all__ = ["Verdict", "verdict", "findings", "summary_markdown", "write_outputs"]

_TIE_REL = 0.02
_TIE_ABS = 0.001
_ENOUGH_ABS = 0.01
_DENSITY_SLACK = 1.02  # "at no more checkpoints": a DP point may hold up to 2% more per sequence


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
    return fmt_pct(x, 2)   # the study's shares are small: two decimals


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
    from marconi.io import output_group
    from marconi.sim.sweep import write_records

    out = Path(out_dir)
    summary = out / "summary.md"
    with output_group():     # all or none: an interrupt leaves the earlier run's files whole
        paths = [write_records(records, out / "records.jsonl")] if write_jsonl else []
        for w in _workload_rows(records):
            for cap in _capacities(records):
                paths.append(_plot_simulation(records, w["workload"], cap,
                                              out / "plots" / f"{w['workload']}_{_slug(cap)}_simulation.png"))
            paths.append(_plot_analytic(records, w["workload"], out / "plots" / f"{w['workload']}_analytic.png"))
        with atomic_write(summary, "w") as fh:
            fh.write(summary_markdown(records, notes))
    drop_stale_plots(out / "plots", ("*_simulation.png", "*_analytic.png"), paths)
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


def _plot_simulation(records: Sequence[dict[str, Any]], workload: str, capacity: str, path: Path) -> Path:
    plt = pyplot()
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
    return save_figure(fig, path)


def _plot_analytic(records: Sequence[dict[str, Any]], workload: str, path: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    for i, (ax, cost) in enumerate(zip(axes, ("tokens", "flops"))):
        recs = [r for r in records if r["kind"] == "analytic" and r["workload"] == workload and r["cost"] == cost]
        _draw(ax, recs, "checkpoints_per_seq", "cost_share", 1.0, 100.0, tags=i == 0)
        ax.set_xlabel("checkpoints per sequence (incl. last token)")
        ax.set_ylabel(f"expected recompute (% of overlap {cost})")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{workload}: exact DP on the oracle overlap distribution (sparse-dp) vs heuristic positions")
    fig.tight_layout()
    return save_figure(fig, path)


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
    out.append(md_table(["workload", "requests", "sessions", "input tokens", "source"],
                        [[w["workload"], f"{w['num_requests']:,}", f"{w['num_sessions']:,}", f"{w['input_tokens']:,}",
                          w["trace_source"]] for w in workloads]))
    if LARGE in capacities:
        out += ["", f"## Overview (simulation, capacity {LARGE})", ""] + _overview(records, LARGE)
    for w in (row["workload"] for row in workloads):
        for cap in capacities:
            recs = _sim(records, w, cap)
            out += ["", f"## {w} — simulation, capacity {cap}", ""]
            rows = [[r["label"], f"{r['checkpoints_per_seq']:.2f}", _mb(r["ssm_bytes_per_seq"]),
                     f"{r['recomputed_tokens_per_request']:,.0f}", _pct(r["recomputed_flops_fraction"]),
                     _pct(r["token_hit_rate"])] for r in _summary_points(recs)]
            out.append(md_table(["strategy", "ckpt/seq", "SSM MB/seq", "recomputed tok/req", "recomputed FLOPs",
                                 "token hit"], rows))
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
            (f"- Findings, density slack: a DP point (sparse-dp, sparse-dp-lam) is at *no more* checkpoints than a "
             f"heuristic point when it holds at most {_DENSITY_SLACK:g}x the heuristic's checkpoints per sequence "
             f"({100 * (_DENSITY_SLACK - 1):g}% more), and at *fewer* when under 1/{_DENSITY_SLACK:g} of them. "
             f"Recompute margin: max({100 * _TIE_REL:g}% of the heuristic's recomputed FLOPs, {100 * _TIE_ABS:g}% of "
             "prefill FLOPs). The DP *beats* the point when a DP point at no more checkpoints recomputes less by more "
             "than the margin; it *ties* (*ties with fewer*) when the sparsest DP point that recomputes no more than "
             "the heuristic plus the margin is at no more (at fewer) checkpoints; otherwise the heuristic is better "
             f"at its density. Marconi is 'enough' when the best DP point (any density) is within "
             f"{100 * _ENOUGH_ABS:g} pp of prefill FLOPs."),
            ("- Analytic: each sequence S_i alone, P_i = depths to which every later request overlaps it; costs "
             "summed over (sequence, later request) pairs; share = of the cost with no checkpoint at all. "
             "`DP @ same count` is the exact DP with the heuristic's own number of checkpoints on each sequence. "
             "ckpt/seq counts each sequence's own checkpoints (what its budget caps); `shared once` counts distinct "
             "states over all sequences (a checkpoint is the state of the prefix before it, so sequences placing one "
             "at the same shared prefix hold one state), per sequence."), ""]
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
        shared = tok.get("shared_checkpoints_per_seq")     # absent from records written before it existed
        rows.append([label, f"{tok['checkpoints_per_seq']:.2f}", "-" if shared is None else f"{shared:.2f}",
                     f"{tok['expected_cost_per_pair']:,.1f}",
                     _pct(tok["cost_share"]), f"{tok['dp_cost_per_pair_at_equal_count']:,.1f}", _pct(fl["cost_share"]),
                     _pct(fl["dp_cost_share_at_equal_count"])])
    return md_table(["strategy", "ckpt/seq", "shared once", "recompute tok/pair", "share (tokens)", "DP @ same count tok/pair",
                     "share (FLOPs)", "DP @ same count (FLOPs share)"], rows)
