"""The headroom report from records alone: ``report.md``, the plots, and computed findings.

Reads the ``point`` and ``breakdown`` records of :mod:`.study` (``--from-records`` redraws an earlier
run); nothing here simulates. Figures are in percentage points (pp) of the trace's input tokens:
a bucket's ``net`` pp is what it adds to ``hit rate(oracle) - hit rate(default)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from marconi.lab.headroom.study import DIMENSIONS
from marconi.lab.headroom.variants import DECOMPOSITION
from marconi.io import write_jsonl, write_text
from marconi.report import drop_stale_plots, fmt_pct, md_table, pyplot, save_figure

__all__ = ["points", "breakdown", "findings", "report_markdown", "write_outputs", "PART_LABELS"]

#: Decomposition parts, as the report names them.
PART_LABELS = {"admission_states": "decline dead states (admission)",
               "admission_kv": "decline dead KV tails (admission)",
               "dead_entries": "evict dead entries first (eviction: what)",
               "ordering": "next-use order (eviction: when)"}
#: The dimensions each point's section shows (all are in the records).
REPORT_DIMENSIONS = ("entry_kind", "cause", "turn", "derived_turn", "since_last", "derived_since_last", "depth",
                     "entry_bytes", "trace_quarter")
_PLOT_DIMENSIONS = ("entry_kind", "kept_or_evicted", "other_held", "turn", "derived_turn", "since_last", "depth",
                    "entry_bytes", "trace_quarter")


def points(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("kind") == "point"]


def _same_point(r: dict[str, Any], p: dict[str, Any]) -> bool:
    return all(r.get(k) == p.get(k) for k in ("trace", "capacity", "model", "default"))


def breakdown(records: Iterable[dict[str, Any]], point: dict[str, Any], dimension: str) -> list[dict[str, Any]]:
    """The point's rows of one dimension, in bucket order."""
    rows = [r for r in records if r.get("kind") == "breakdown" and r["dimension"] == dimension and _same_point(r, point)]
    return sorted(rows, key=lambda r: r["order"])


def _pp(tokens: float, point: dict[str, Any]) -> float:
    return 100.0 * tokens / point["input_tokens"] if point["input_tokens"] else 0.0


def _name(p: dict[str, Any]) -> str:
    return f"{p['trace']} {p['capacity']}"


def _share(part: float, whole: float) -> str:
    return fmt_pct(part / whole) if whole else "—"


# ============================================================================ findings
def _top(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    return max(rows, key=lambda r: r["net_tokens"], default=None)


def findings(records: Sequence[dict[str, Any]], point: dict[str, Any]) -> list[str]:
    """Sentences computed from one point's records."""
    gap = point["gap_pp"]
    parts = point["decomposition_pp"]
    hit = point["hit_rate"]
    out = [f"{point['default']} {100 * hit['default']:.2f}% vs oracle {100 * hit['oracle']:.2f}%: a gap of "
           f"{gap:.2f} pp ({_share(hit['default'], hit['oracle'])} of the oracle). Oracle ahead on "
           f"{point['requests_gained']} requests (+{_pp(point['gained_tokens'], point):.2f} pp), behind on "
           f"{point['requests_lost']} (-{_pp(point['lost_tokens'], point):.2f} pp)."]
    if parts:
        adm = parts.get("admission_states", 0.0) + parts.get("admission_kv", 0.0)
        out.append(f"What to keep, at admission: {adm:+.2f} pp (states {parts.get('admission_states', 0.0):+.2f}, "
                   f"KV tails {parts.get('admission_kv', 0.0):+.2f}); at eviction (dead first) "
                   f"{parts.get('dead_entries', 0.0):+.2f}; when (next-use order) {parts.get('ordering', 0.0):+.2f} pp.")
        if "oracle-filtered" in hit:
            out.append(f"The oracle with the filtered admission: {100 * hit['oracle-filtered']:.2f}% "
                       f"({100 * (hit['oracle-filtered'] - hit['oracle']):+.2f} pp over the oracle).")
    kinds = {r["bucket"]: r for r in breakdown(records, point, "entry_kind")}
    kept = {r["bucket"]: r for r in breakdown(records, point, "kept_or_evicted")}
    held = {r["bucket"]: r for r in breakdown(records, point, "other_held")}
    g = point["gained_tokens"]
    if g:
        out.append(f"Of the oracle's extra tokens, {_share(kinds.get('branch', {}).get('gained_tokens', 0), g)} came "
                   f"from branch states and {_share(kinds.get('last-token', {}).get('gained_tokens', 0), g)} from "
                   f"last-token states; the default had never admitted a state at that prefix for "
                   f"{_share(kept.get('never admitted', {}).get('gained_tokens', 0), g)} (evicted it: "
                   f"{_share(kept.get('evicted', {}).get('gained_tokens', 0), g)}), and still held the KVs there "
                   f"(KV only) for {_share(held.get('KV only', {}).get('gained_tokens', 0), g)}.")
    for dim, what in (("turn", "turn"), ("since_last", "time since the session's last request"),
                      ("depth", "entry depth")):
        top = _top(breakdown(records, point, dim))
        if top is not None and gap:
            out.append(f"By {what}, the largest net share is {top['bucket']} ({_pp(top['net_tokens'], point):+.2f} pp, "
                       f"{_share(top['net_tokens'], point['gap_tokens'])} of the gap, "
                       f"{top['requests']} requests).")
    s = point["sessions"]
    if s.get("continuations_found") is not None:
        out.append(f"Sessions from token prefixes alone: {s['derived_sessions']} derived vs {s['trace_sessions']} in "
                   f"the trace; {fmt_pct(s['continuations_found'])} of the trace's continuations found, "
                   f"{fmt_pct(s['openings_found'])} of its openings.")
    return out


# ============================================================================ markdown
def _decomposition_table(pts: Sequence[dict[str, Any]]) -> str:
    parts = [name for name, _, _ in DECOMPOSITION]
    headers = ["trace", "capacity", "default", "oracle", "share", "gap (pp)", *(PART_LABELS[p] for p in parts),
               "oracle + filtered admission"]
    rows = []
    for p in pts:
        h = p["hit_rate"]
        rows.append([p["trace"], p["capacity"], fmt_pct(h["default"], 2), fmt_pct(h["oracle"], 2),
                     _share(h["default"], h["oracle"]), f"{p['gap_pp']:.2f}",
                     *(f"{p['decomposition_pp'][k]:+.2f}" if k in p["decomposition_pp"] else "—" for k in parts),
                     fmt_pct(h["oracle-filtered"], 2) if "oracle-filtered" in h else "—"])
    return md_table(headers, rows)


def _dimension_table(records: Sequence[dict[str, Any]], point: dict[str, Any], dimension: str) -> str:
    rows = [[r["bucket"], f"{_pp(r['gained_tokens'], point):.2f}", f"{_pp(r['lost_tokens'], point):.2f}",
             f"{_pp(r['net_tokens'], point):+.2f}", _share(r["net_tokens"], point["gap_tokens"]),
             r["requests"], r["requests_gained"], r["requests_lost"]] for r in breakdown(records, point, dimension)]
    return md_table([dimension, "gained (pp)", "lost (pp)", "net (pp)", "share of gap", "requests",
                     "oracle ahead", "default ahead"], rows)


def report_markdown(records: Sequence[dict[str, Any]], *, command: str | None = None,
                    notes: Sequence[str] = ()) -> str:
    pts = points(records)
    default = pts[0]["default"] if pts else "marconi"
    lines = [f"# Headroom: where `{default}` misses the hits the oracle gets", ""]
    if command:
        lines += [f"Generated by `{command}`.", ""]
    lines += [
        "The future-aware `oracle` and the default replay the same trace at the same capacity (sequential mode, "
        "the simulator's accounting). Figures are percentage points (pp) of the trace's input tokens. "
        "Per request, the tokens the oracle reused beyond the default are *gained*, the reverse *lost*; "
        "every breakdown puts each in one bucket, so each table's *net* column sums to the gap.", "",
        "**Entry kinds.** A `last-token` state sits where an earlier request's whole sequence (input + output) "
        "ends; a `branch` state anywhere else (Marconi's admission keeps states only there). *evicted*: the other "
        "cache had admitted a state at that prefix before and no longer held it; *never admitted*: it never had "
        "one (for a branch: the branch was not detected, since the earlier sequence's KVs were gone). *KV only*: "
        "the other cache still held the KVs to that depth, without a state; *no KVs*: not even those.", "",
        "**What vs when.** Both systems use Marconi's admission policy, so the literal cross (one's eviction "
        "with the other's admission) is the pair itself. The decomposition instead adds the oracle's knowledge "
        "in steps: declining the states no later request resumes from, then the KV tails no later input "
        "reaches (admission), then evicting dead entries first (eviction, *what*), then the oracle itself "
        "(*when*: the next-use order of live entries). The steps telescope to the gap exactly; a negative step "
        "means that knowledge, added alone, hurt.", "",
        "## The gap and its decomposition", "", _decomposition_table(pts), ""]
    for note in notes:
        lines += [f"- {note}"]
    if notes:
        lines.append("")
    for p in pts:
        lines += [f"## {_name(p)}", "", f"![anatomy](plots/{_plot_name(p)})", ""]
        lines += [f"- {f}" for f in findings(records, p)]
        lines.append("")
        for dim in REPORT_DIMENSIONS:
            lines += [f"**{dim}** — {dict(DIMENSIONS)[dim]}", "", _dimension_table(records, p, dim), ""]
    lines += ["## Plots", "", "![decomposition](plots/decomposition.png)", "",
              "![cumulative gap](plots/cumulative_gap.png)", ""]
    return "\n".join(lines)


# ============================================================================ plots
def _plot_name(p: dict[str, Any]) -> str:
    """The point's plot file: its trace and capacity, made safe; where that changed the name, a hash of
    the original too, so traces x/one.jsonl and x_one.jsonl do not share one plot."""
    raw = f"{p['trace']}_{p['capacity']}"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in raw)
    if safe != raw:
        import hashlib

        safe += "-" + hashlib.sha1(raw.encode()).hexdigest()[:8]
    return f"{safe}_anatomy.png"


def plot_point(records: Sequence[dict[str, Any]], point: dict[str, Any], path: Path) -> Path:
    """One panel per dimension: gained (up), lost (down) and net (marker), in pp."""
    plt = pyplot()
    dims = list(_PLOT_DIMENSIONS)
    cols = 3
    fig, axes = plt.subplots((len(dims) + cols - 1) // cols, cols, figsize=(13, 3.2 * ((len(dims) + cols - 1) // cols)))
    for ax, dim in zip(np.ravel(axes), dims):
        rows = breakdown(records, point, dim)
        x = np.arange(len(rows))
        ax.bar(x, [_pp(r["gained_tokens"], point) for r in rows], color="tab:green", label="oracle ahead")
        ax.bar(x, [-_pp(r["lost_tokens"], point) for r in rows], color="tab:red", label="default ahead")
        ax.plot(x, [_pp(r["net_tokens"], point) for r in rows], "k_", markersize=14, mew=2, label="net")
        ax.axhline(0, color="grey", lw=0.6)
        ax.set_xticks(x, [r["bucket"] for r in rows], rotation=30, ha="right", fontsize=7)
        ax.set_title(dim, fontsize=9)
        ax.set_ylabel("pp of input tokens", fontsize=7)
    for ax in np.ravel(axes)[len(dims):]:
        ax.axis("off")
    np.ravel(axes)[0].legend(fontsize=7)
    fig.suptitle(f"{_name(point)}: {point['default']} {100 * point['hit_rate']['default']:.1f}% vs oracle "
                 f"{100 * point['hit_rate']['oracle']:.1f}% (gap {point['gap_pp']:.1f} pp)")
    fig.tight_layout()
    return save_figure(fig, path)


def plot_decomposition(pts: Sequence[dict[str, Any]], path: Path) -> Path:
    """Per point, the decomposition's parts stacked (positive up, negative down), the gap as a marker."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(2 + 1.1 * len(pts), 4))
    x = np.arange(len(pts))
    up, down = np.zeros(len(pts)), np.zeros(len(pts))
    for name, _, _ in DECOMPOSITION:
        v = np.array([p["decomposition_pp"].get(name, 0.0) for p in pts])
        base = np.where(v >= 0, up, down)
        ax.bar(x, v, bottom=base, label=PART_LABELS[name])
        up, down = up + np.maximum(v, 0), down + np.minimum(v, 0)
    ax.plot(x, [p["gap_pp"] for p in pts], "k_", markersize=18, mew=2.5, label="gap (sum)")
    ax.axhline(0, color="grey", lw=0.6)
    ax.set_xticks(x, [_name(p) for p in pts], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("pp of input tokens")
    ax.set_title("oracle - default, decomposed")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_cumulative(pts: Sequence[dict[str, Any]], path: Path) -> Path:
    """The gap so far (pp of the input tokens so far) along each trace: when it opens."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for p in pts:
        series = np.array(p["cumulative_gap_pp"], dtype=float).reshape(-1, 2)
        if len(series):
            ax.plot(series[:, 0] / series[-1, 0], series[:, 1], label=_name(p))
    ax.set_xlabel("fraction of the trace's requests")
    ax.set_ylabel("gap so far (pp)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)


def write_outputs(records: Sequence[dict[str, Any]], out: str | Path, *, requests: Sequence[dict[str, Any]] | None = None,
                  command: str | None = None, notes: Sequence[str] = (), write_records: bool = True) -> list[Path]:
    """``records.jsonl`` (unless ``write_records`` is False), ``requests.jsonl`` (when given),
    ``plots/*.png`` and ``report.md`` under ``out``; returns the paths written."""
    from marconi.io import output_group

    out = Path(out)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    written = []
    with output_group():     # all or none: an interrupt leaves the earlier run's files whole
        if write_records:
            written.append(write_jsonl(out / "records.jsonl", records))
        if requests is not None:
            written.append(write_jsonl(out / "requests.jsonl", requests))
        pts = points(records)
        for p in pts:
            written.append(plot_point(records, p, out / "plots" / _plot_name(p)))
        if pts:
            written.append(plot_decomposition(pts, out / "plots" / "decomposition.png"))
            written.append(plot_cumulative(pts, out / "plots" / "cumulative_gap.png"))
        written.append(write_text(out / "report.md", report_markdown(records, command=command, notes=notes)))
    drop_stale_plots(out / "plots", ("*_anatomy.png",), written)
    return written
