"""Miss-ratio curves: token hit rate against cache capacity, from tight to the whole working set.

``marconi mrc --trace T --systems sglang+,marconi --points 12`` is how a user picks a cache size:
every system is replayed at ``points`` capacities spaced geometrically from ``lo`` × the trace's
working set up to the working set itself (where nothing is ever evicted), in parallel on a sweep
backend (local processes or Ray). ``infinite`` (unbounded capacity: the ceiling, one run) and
``oracle`` (future-aware eviction: how far each policy is from what knowing the future allows)
are drawn on the same plot. Records are the sweep's JSONL records plus ``fraction``.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from marconi.core.registry import ConfigError
from marconi.sim.backends import Backend
from marconi.sim.sweep import SweepPoint, expand_points, run_sweep
from marconi.sim.systems import make_system

__all__ = ["capacity_fractions", "run_mrc", "plot_mrc", "CEILINGS"]

CEILINGS = ("oracle", "infinite")


def capacity_fractions(points: int, lo: float = 0.005) -> list[float]:
    """``points`` fractions of the working set, geometric from ``lo`` to 1 (both included)."""
    if points < 2:
        raise ConfigError(f"a miss-ratio curve needs at least 2 points, got {points}")
    if not 0 < lo < 1:
        raise ConfigError(f"the smallest capacity must be a fraction in (0, 1) of the working set, got {lo}")
    return [float(f"{f:.6g}") for f in np.geomspace(lo, 1.0, points)]


def run_mrc(trace: Sequence[Any], trace_name: str, systems: Sequence[str], *, model: str = "paper-7b",
            points: int = 12, lo: float = 0.005, ceilings: bool = True, latency: str = "a100",
            workers: int | None = None, backend: str | Backend = "local",
            on_record: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Records of every system at every capacity fraction (plus ``oracle`` and one ``infinite``).

    Each record carries ``fraction`` (of the working set) next to ``capacity_bytes``.
    """
    fractions = capacity_fractions(points, lo)
    names = list(dict.fromkeys(systems))
    for name in names:
        make_system(name)
    if ceilings and "oracle" not in names:
        names.append("oracle")
    caps = [f"{f:g}x" for f in fractions]
    pts = expand_points([n for n in names if make_system(n).label != "infinite"], caps, [model])
    if ceilings or any(make_system(n).label == "infinite" for n in names):
        pts.append(SweepPoint("infinite", caps[-1], model))  # capacity-independent: one run
    records = run_sweep(trace, trace_name, pts, latency=latency, workers=workers, per_request=False,
                        on_record=on_record, backend=backend)
    for rec in records:
        rec["fraction"] = float(rec["capacity"].rstrip("x"))
    return records


def plot_mrc(records: Sequence[dict[str, Any]], path: str | Path, *, title: str | None = None) -> Path:
    """One PNG: hit rate vs capacity (log scale, GB) per system; infinite and oracle as references."""
    from marconi.report import pyplot, save_figure

    plt = pyplot()
    curves: dict[str, list[tuple[float, float]]] = defaultdict(list)
    ceiling = None
    for rec in records:
        if rec["system"] == "infinite":
            ceiling = rec["token_hit_rate"]
        else:
            curves[rec["system"]].append((rec["capacity_bytes"] / 1e9, rec["token_hit_rate"]))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for system, pts in curves.items():
        pts.sort()
        style = {"linestyle": ":", "color": "black", "marker": "."} if system == "oracle" else {"marker": "o"}
        ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], label=system, markersize=4, **style)
    if ceiling is not None:
        ax.axhline(100 * ceiling, linestyle="--", color="grey", label="infinite")
    ax.set_xscale("log")
    ax.set_xlabel("cache capacity (GB)")
    ax.set_ylabel("token hit rate (%)")
    trace = records[0].get("trace") if records else ""
    model = records[0].get("model") if records else ""
    ax.set_title(title or f"{Path(str(trace)).name} — {model}: hit rate vs capacity")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path, dpi=120)
