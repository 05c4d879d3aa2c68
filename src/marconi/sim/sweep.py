"""Sweeps: every (system, capacity, model) point of a trace, in parallel processes, as records.

The trace is loaded once in the parent; worker processes are forked and inherit it (no copy per
point). Each point yields one flat JSONL record with its whole configuration echoed, written
atomically (temp file + rename) so an interrupted sweep never leaves a half-written ``--out``.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import tempfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from marconi.model import get_model
from marconi.sim.replay import simulate, working_set_bytes
from marconi.systems import make_system
from marconi.tuning import default_workers
from marconi.units import Capacity, parse_capacity

__all__ = ["SweepPoint", "expand_points", "run_sweep", "write_records", "read_records"]


@dataclass(frozen=True, slots=True)
class SweepPoint:
    system: str
    capacity: str
    model: str
    seed: int | None = None


def expand_points(systems: Sequence[str], capacities: Sequence[str], models: Sequence[str]) -> list[SweepPoint]:
    """The cross product, validating every name up front (a typo fails before any work starts)."""
    for system in systems:
        make_system(system)
    for cap in capacities:
        parse_capacity(cap)
    for model in models:
        get_model(model)
    return [SweepPoint(s, c, m) for m in models for c in capacities for s in systems]


_TRACE: Any = None
_TRACE_NAME = ""
_WORKING_SETS: dict[str, int] = {}


def _run_point(point: SweepPoint, latency: str, mode: str, per_request: bool, tuning_workers: int | None,
               tuning_mapper: Any = None) -> dict[str, Any]:
    spec = get_model(point.model)
    capacity: Capacity = parse_capacity(point.capacity)
    capacity_bytes = capacity.resolve(_WORKING_SETS.get(point.model, 0))
    result = simulate(_TRACE, point.system, spec, capacity_bytes, latency=latency, mode=mode,
                      tuning_workers=tuning_workers, tuning_mapper=tuning_mapper)
    extra = {"trace": _TRACE_NAME, "capacity": point.capacity}
    if capacity.fraction is not None:
        extra["working_set_bytes"] = _WORKING_SETS[point.model]
    return result.record(per_request=per_request, **extra)


def run_sweep(trace: Sequence[Any], trace_name: str, points: Sequence[SweepPoint], *, latency: str = "a100",
              mode: str = "sequential", workers: int | None = None, per_request: bool = True,
              on_record: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Simulate every point; records come back in the order of ``points``.

    Capacities given as fractions (``0.1x``) resolve against the working set of the trace for each
    model (computed once). ``on_record`` is called as each point completes (progress bars).
    """
    global _TRACE, _TRACE_NAME
    _TRACE, _TRACE_NAME = trace, trace_name
    _WORKING_SETS.clear()
    for model in {p.model for p in points if parse_capacity(p.capacity).fraction is not None}:
        _WORKING_SETS[model] = working_set_bytes(trace, model)
    workers = default_workers() if workers is None else max(1, workers)
    workers = min(workers, len(points)) or 1
    # Nested parallelism would oversubscribe the cores: tune in-process when points run in parallel.
    tuning_workers = 1 if workers > 1 else None
    records: list[dict[str, Any] | None] = [None] * len(points)
    if workers == 1:
        for i, point in enumerate(points):
            records[i] = _run_point(point, latency, mode, per_request, tuning_workers)
            if on_record:
                on_record(records[i])  # type: ignore[arg-type]
    else:
        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futures = {pool.submit(_run_point, p, latency, mode, per_request, tuning_workers): i
                       for i, p in enumerate(points)}
            for future in as_completed(futures):
                records[futures[future]] = future.result()
                if on_record:
                    on_record(records[futures[future]])  # type: ignore[arg-type]
    return [r for r in records if r is not None]


def write_records(records: Iterable[dict[str, Any]], path: str | Path) -> Path:
    """Write JSONL atomically: a temp file in the same directory, then ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            for rec in records:
                fh.write(json.dumps(rec) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_records(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"results file {path} not found")
    out = []
    with path.open() as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
    return out
