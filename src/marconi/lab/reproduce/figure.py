"""The seam every figure of the reproduction follows: compute → records → plot / section / verdict.

A figure is a module (``fig7`` … ``fig13``, ``alpha``, ``admission``, ``anatomy``) with

* ``compute(ctx) -> FigureRecords``: select and derive from the sweep what the figure needs;
* ``plot(records, out_dir) -> [paths]``, ``section(records) -> markdown``, ``verdict(records) ->
  [Finding]`` and ``explain(records, computed) -> str`` ("why ours differ"), which read records
  only: no context, no traces, no simulation.

Nothing here hard-codes a result: the paper's numbers are the constants in :data:`PAPER` (quoted
from §5), ours are computed from the records, and every "holds" is a comparison between them
stated next to the number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from marconi.lab.reproduce.context import MAIN_ROLES, ReproContext
from marconi.lab.reproduce.traces import WORKLOAD_LABELS
from marconi.report import fmt_pct
from marconi.units import format_bytes

__all__ = ["PAPER", "Finding", "FigureRecords", "Figure", "safe_ratio", "within_2x", "label", "fmt_alphas",
           "strip_per_request", "per_request_hits", "trio", "capacity_point", "fmt_capacity", "regime_gains", "dig"]

# The paper's numbers (Marconi, arXiv 2411.19379, §5), quoted; used only as the "paper" column.
PAPER = {
    "fig7_vs_vllm_x": {"lmsys": 4.5, "sharegpt": 7.3, "swe": 34.4, "swe-keepall": 34.4},
    "fig8_p95_gain": {"lmsys": 0.456, "sharegpt": 0.190, "swe": 2.197, "swe-keepall": 2.197},
    "fig9_vs_vanilla": {"lmsys": 0.369, "sharegpt": 0.732, "swe": 0.468, "swe-keepall": 0.468},
    "fig9_vs_vllm": {"lmsys": 0.361, "sharegpt": 0.711, "swe": 0.468, "swe-keepall": 0.468},
    "fig9_vs_sglang": {"lmsys": 0.172, "sharegpt": 0.128, "swe": 0.247, "swe-keepall": 0.247},
    "fig10_short": -0.030, "fig10_long": 0.255, "fig10_crossover": 7000,
    "fig10_ttft": {"p5": 0.063, "p50": -0.134, "p95": -0.220},
    "fig11": {"high": 0.243, "peak": 0.683, "low": 0.100},
    "fig12a_vllm": {"1:2": 1.135, "1:4": 1.666, "1:8": 2.6}, "fig12a_sglang": {"1:2": 0.058, "1:4": 0.260, "1:8": 0.597},
    "fig12b_vllm": {16: 5.7, 32: 9.6, 64: 19.9, 128: 35.4},
    "fig13a_abs": (0.487, 0.430), "fig13b_abs": (0.259, 0.241), "fig13_rel": (1.4, 1.6),
}

# ============================================================================ the seam
@dataclass(slots=True)
class Finding:
    figure: str
    claim: str          # the paper's finding, in words
    paper: str          # the paper's number(s)
    ours: str           # ours, computed
    holds: str          # yes | partly | no | n/a

    def as_dict(self) -> dict[str, str]:
        return {"figure": self.figure, "claim": self.claim, "paper": self.paper, "ours": self.ours,
                "holds": self.holds}


@dataclass(slots=True)
class FigureRecords:
    """What a figure's ``compute`` selected and derived from the sweep: all its plot and verdict read.

    ``rows``: the sweep records behind the figure (or rows derived from them), written as
    ``<key>.jsonl``. ``data``: the numbers it computed, written to ``summary.json``. ``series``:
    what only its plot, tables and prose need and the summary does not keep (per-request arrays,
    capacity notes, the profile's axes); plain values, never the context.
    """

    key: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    series: dict[str, Any] = field(default_factory=dict)


class Figure(Protocol):
    """A figure module (see the module doc)."""

    KEY: str
    TITLE: str

    def compute(self, ctx: ReproContext) -> FigureRecords: ...

    def plot(self, records: FigureRecords, out_dir: Path) -> list[Path]: ...

    def section(self, records: FigureRecords) -> str: ...

    def verdict(self, records: FigureRecords) -> list[Finding]: ...

    def explain(self, records: FigureRecords, computed: Mapping[str, FigureRecords]) -> str: ...


# ============================================================================ records-only helpers
def safe_ratio(a: float, b: float) -> float:
    """``a / b``; infinite when only ``b`` is zero, 1 when both are."""
    return a / b if b > 0 else (math.inf if a > 0 else 1.0)


def within_2x(ours: float | None, paper: float | None) -> bool:
    """Same sign and within a factor of two of the paper's number (the summary's "yes" for a magnitude)."""
    if ours is None or paper is None or not math.isfinite(ours) or ours * paper <= 0:
        return False
    return 0.5 <= ours / paper <= 2.0


def label(workload: str) -> str:
    return WORKLOAD_LABELS.get(workload, workload)


def fmt_alphas(alphas: Sequence[float]) -> str:
    """The α values a run tuned to (``0, untuned`` when its bootstrap window never finished)."""
    return ",".join(f"{a:g}" for a in alphas) if alphas else "0, untuned"


def strip_per_request(rec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in rec.items() if k != "per_request"}


def per_request_hits(rec: dict[str, Any]) -> np.ndarray:
    """Each request's token hit rate (reused / input tokens) from a record's ``per_request``."""
    pr = rec["per_request"]
    return np.asarray(pr["reused_len"], dtype=np.float64) / np.maximum(np.asarray(pr["input_len"], dtype=np.float64), 1)


def fmt_capacity(point: Mapping[str, Any]) -> str:
    """``0.05x = 1.2GB (contention 48%)`` from a :func:`capacity_point`."""
    return f"{point['capacity']} = {format_bytes(point['bytes'])} (contention {fmt_pct(point['contention'], 0)})"


def dig(data: Mapping[str, Any], *path: Any, default: Any = None) -> Any:
    """``data[p0][p1]…``, or ``default`` where a level is missing."""
    cur: Any = data
    for p in path:
        if not isinstance(cur, Mapping) or p not in cur:
            return default
        cur = cur[p]
    return cur


# ============================================================================ helpers for compute (read ctx)
def trio(ctx: ReproContext, key: str, cap: str, model: str | None = None) -> dict[str, dict[str, Any]] | None:
    """The paper's three systems' records at one point by role (``vllm+``, ``sglang+``, ``marconi``:
    the bootstrap-tuned Marconi), or None if any is missing."""
    recs = {role: ctx.find(key, name, cap, model) for role, name in MAIN_ROLES.items()}
    return None if any(r is None for r in recs.values()) else recs  # type: ignore[return-value]


def capacity_point(ctx: ReproContext, key: str, regime: str) -> dict[str, Any]:
    """A regime's capacity on a trace: its label, bytes and contention (for :func:`fmt_capacity`)."""
    cap = ctx.regime_capacity(key, regime)
    info = ctx.info[key]
    ws = ctx.ws.get((info.ws_key, ctx.model.name), 0)
    frac = float(cap[:-1])
    cal = key if key in ctx.contention else info.ws_key
    return {"capacity": cap, "bytes": frac * ws, "contention": ctx.contention.get(cal, {}).get(frac)}


def regime_gains(ctx: ReproContext, workload: str) -> list[tuple[str, str, float, dict[str, dict[str, Any]]]]:
    """Marconi's gain over SGLang+ at every (variant, regime) of a workload: (key, regime, gain, trio)."""
    out = []
    for key in ctx.main_keys(workload):
        for regime, _ in ctx.profile.regimes:
            t = trio(ctx, key, ctx.regime_capacity(key, regime))
            if t:
                g = safe_ratio(t["marconi"]["token_hit_rate"], t["sglang+"]["token_hit_rate"]) - 1
                out.append((key, regime, g, t))
    return out
