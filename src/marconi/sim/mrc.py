"""Miss-ratio curves: hit rate at ``points`` capacities geometric from ``lo`` × the working set to all
of it, with ``infinite`` and ``oracle`` references; records carry ``fraction``. Failures are said
in ``lo`` terms (a capacity below one checkpoint is refused up front)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Sequence

import math
import re

import numpy as np

from marconi.core.model import get_model
from marconi.core.registry import ConfigError
from marconi.sim.backends import Backend
from marconi.sim.compare import plot_text
from marconi.sim.sweep import PointsFailed, SweepPoint, backend_scope, expand_points, run_sweep, working_sets
from marconi.sim.systems import SystemConfig, make_system
from marconi.units import format_bytes

__all__ = ["capacity_fractions", "mrc_points", "run_mrc", "plot_mrc", "CEILINGS", "DEFAULT_LO"]

CEILINGS = ("oracle", "infinite")
#: The smallest capacity a curve starts at, as a fraction of the working set, unless told otherwise.
DEFAULT_LO = 0.005


def capacity_fractions(points: int, lo: float = DEFAULT_LO) -> list[float]:
    """Up to ``points`` distinct fractions of the working set, geometric from ``lo`` to 1 inclusive,
    rounded to 6 significant digits (equal neighbours kept once)."""
    if points < 2:
        raise ConfigError(f"a miss-ratio curve needs at least 2 points, got {points}")
    if not 0 < lo < 1:
        raise ConfigError(f"the smallest capacity must be a fraction in (0, 1) of the working set, got {lo}")
    return list(dict.fromkeys(float(f"{f:.6g}") for f in np.geomspace(lo, 1.0, points)))


def mrc_points(systems: Sequence[str], *, model: str = "paper-7b", points: int = 12, lo: float = DEFAULT_LO,
               ceilings: bool = True) -> list[SweepPoint]:
    """The sweep points of a curve: every system at every fraction, ``oracle`` too (with ``ceilings``),
    and one ``infinite`` run (capacity-independent). Names are checked here, before any work;
    ConfigError for none."""
    caps = [f"{f:g}x" for f in capacity_fractions(points, lo)]
    names = list(dict.fromkeys(systems))
    if not names:
        raise ConfigError("a miss-ratio curve needs at least one system (--systems): none was given")
    for name in names:
        make_system(name)
    if ceilings and "oracle" not in names:
        names.append("oracle")
    pts = expand_points([n for n in names if make_system(n).label != "infinite"], caps, [model])
    if ceilings or any(make_system(n).label == "infinite" for n in names):
        pts.append(SweepPoint("infinite", caps[-1], model))  # capacity-independent: one run
    return pts


def run_mrc(trace: Sequence[Any], trace_name: str, systems: Sequence[str], *, model: str = "paper-7b",
            points: int = 12, lo: float = DEFAULT_LO, ceilings: bool = True, latency: str = "a100",
            workers: int | None = None, backend: str | Backend = "local",
            on_record: Callable[[dict[str, Any]], None] | None = None, raise_lo: bool = False) -> list[dict[str, Any]]:
    """Records of every system at every fraction (plus ``oracle`` and one ``infinite``; ``on_record``
    gets each as it finishes, its ``fraction`` set). ConfigError if ``lo`` x the working set is below
    what a system needs (``System.least_capacity_bytes``: one SSM checkpoint, or an emulated engine's
    least pool for the longest request; ``raise_lo``: ``lo`` is raised to the least fraction that
    every system runs at instead, while that is below 1); PointsFailed (in ``lo`` terms) otherwise."""
    spec = get_model(model)
    with backend_scope(backend, workers) as be:
        ws = working_sets({"trace": trace}, [("trace", model)], backend=be)[("trace", model)]
        names = [*systems, *(["oracle"] if ceilings else [])]
        floors = {name: make_system(name).least_capacity_bytes(spec, trace) for name in dict.fromkeys(names)}
        binding = max(floors, key=lambda n: floors[n], default=None)
        floor = floors[binding] if binding is not None else 0
        need = _least_fraction(floor, ws)
        if raise_lo:
            lo = max(lo, need)
        pts = mrc_points(systems, model=model, points=points, lo=lo, ceilings=ceilings) if lo < 1 else []
        smallest = min((float(p.capacity.rstrip("x")) for p in pts), default=lo)
        if not pts or smallest * ws < floor:
            what = (f"one SSM checkpoint of {spec.name} ({format_bytes(floor)}): nothing could be cached there"
                    if isinstance(make_system(binding), SystemConfig) else
                    f"what {binding} needs ({format_bytes(floor)}: its least pool for the longest request)")
            raise ConfigError(f"--lo {lo:g} makes the smallest capacity {format_bytes(int(smallest * ws))} "
                              f"(of a {format_bytes(ws)} working set), less than {what}; "
                              + (f"raise --lo to at least {need:g}" if need < 1 else
                                 "the whole working set is smaller than that: use a longer trace"))
        def recorded(rec: dict[str, Any]) -> None:     # whole as it finishes: what an interrupt keeps
            _add_fractions([rec])
            if on_record is not None:
                on_record(rec)

        try:
            records = run_sweep(trace, trace_name, pts, latency=latency, workers=workers, per_request=False,
                                on_record=recorded, backend=be, working_set_bytes={model: ws})
        except PointsFailed as exc:
            _add_fractions(exc.records)
            raise _in_lo_terms(exc, lo) from None
    _add_fractions(records)
    return records


def _least_fraction(floor_bytes: float, working_set_bytes: float) -> float:
    """``floor_bytes`` as a fraction of the working set, rounded up to 3 significant digits (0 for no
    floor; inf for an empty working set)."""
    if not floor_bytes:
        return 0.0
    return _round_up(floor_bytes / working_set_bytes) if working_set_bytes else float("inf")


def _round_up(value: float, digits: int = 3) -> float:
    """``value`` rounded *up* to ``digits`` significant digits (advice that is enough when followed)."""
    step = 10.0 ** (math.floor(math.log10(value)) - digits + 1)
    return float(f"{math.ceil(value / step) * step:.{digits}g}")


def _add_fractions(records: list[dict[str, Any]]) -> None:
    for rec in records:
        rec["fraction"] = float(rec["capacity"].rstrip("x"))


# A point's own advice names a capacity, which a curve does not take: its knob is --lo.
_CAPACITY_ADVICE = re.compile(r"[;,]?\s*(?:—\s*)?raise the capacity\b[^;]*")


def _in_lo_terms(exc: PointsFailed, lo: float) -> PointsFailed:
    """The same failure, said in the curve's terms (``--lo``), not a ``--capacity`` it does not have."""
    fractions = sorted({float(t.point.capacity.rstrip("x")) for t, _ in exc.failures})
    first_task, first = exc.failures[0]
    system = first_task.point.system
    reason = _CAPACITY_ADVICE.sub("", first)
    reason = reason if reason.startswith(system) else f"{system}: {reason}"
    at = ", ".join(f"{f:g}x" for f in fractions[:5]) + (" ..." if len(fractions) > 5 else "")
    kept = len(exc.records)
    message = (f"{len(exc.failures)} of {exc.total} points could not run, at {at} of the working set "
               f"(e.g. {reason}); the curve's capacities run from --lo {lo:g} to 1x of the working set: "
               f"raise --lo above {fractions[-1]:g} to leave them out ({kept} other point{'s' * (kept != 1)} kept)")
    return PointsFailed(exc.records, exc.failures, exc.total, message)


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
        ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], label=plot_text(system), markersize=4, **style)
    if ceiling is not None:
        ax.axhline(100 * ceiling, linestyle="--", color="grey", label="infinite")
    ax.set_xscale("log")
    ax.set_xlabel("cache capacity (GB)")
    ax.set_ylabel("token hit rate (%)")
    trace = records[0].get("trace") if records else ""
    model = records[0].get("model") if records else ""
    ax.set_title(plot_text(title or f"{Path(str(trace)).name} — {model}: hit rate vs capacity"))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path, dpi=120)
