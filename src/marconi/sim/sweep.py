"""Sweeps: every (system, capacity, model) point of a trace, in parallel on a backend, as flat JSONL
records written atomically. A point raising :class:`ConfigError` does not stop the others;
:class:`PointsFailed` carries the finished records. :func:`run_points` serves any engine."""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from marconi.io import iter_jsonl, write_jsonl
from marconi.core.jsonfile import described
from marconi.core.model import ModelSpec, get_model
from marconi.core.registry import ConfigError, brief_repr
from marconi.sim.backends import Backend, TaskFn, make_backend
from marconi.sim.replay import check_mode, simulate_system, working_set_bytes
from marconi.units import Capacity, parse_capacity

__all__ = ["SweepPoint", "SweepTask", "PointsFailed", "expand_points", "run_points", "run_sweep", "run_tasks",
           "working_sets", "backend_scope", "write_records", "read_records", "RESULT_FIELDS", "RESULT_TYPES",
           "FieldType", "TIMING_FIELDS", "counting_requests"]

# Record fields that measure this machine, not the simulation (they differ between runs and backends).
TIMING_FIELDS = ("elapsed_s", "requests_per_s", "tuning_seconds")


@dataclass(frozen=True, slots=True)
class SweepPoint:
    system: str
    capacity: str
    model: str | ModelSpec
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class SweepTask:
    """One point of one trace, shipped to a worker (the trace travels apart).

    ``working_set`` resolves fractional capacities; ``tags`` are echoed into the record;
    ``capture_tuning`` adds the bootstrap window's score of every α (``tuning_windows``).
    """

    trace_key: str
    point: SweepPoint
    working_set: int | None = None
    latency: str = "a100"
    mode: str = "sequential"
    per_request: bool = True
    capture_tuning: bool = False
    tags: tuple[tuple[str, Any], ...] = ()
    trace_name: str | None = None        # echoed as the record's "trace" (default: trace_key)


#: While :func:`counting_requests` is open: a counter in shared memory of the requests every point
#: has replayed so far (this process's and its forked workers'); None otherwise.
_REQUESTS_DONE: Any = None


@contextmanager
def counting_requests() -> Iterator[Callable[[], int]]:
    """Count, while open, the requests each :func:`run_point` replays here or in a worker forked
    while open (the local backend's), every 256 requests; yields a reader of the sum. What a
    progress bar needs inside a point: one point is a whole replay, minutes on a large trace.
    Points on other machines (ray) are not counted; nothing else changes."""
    import multiprocessing

    global _REQUESTS_DONE
    previous, _REQUESTS_DONE = _REQUESTS_DONE, multiprocessing.get_context("fork").Value("q", 0)
    counter = _REQUESTS_DONE
    try:
        yield lambda: int(counter.value)
    finally:
        _REQUESTS_DONE = previous


def _request_reporter() -> Callable[[int], None] | None:
    """``simulate``'s ``progress`` callback adding to the open counter (None where none is open)."""
    counter = _REQUESTS_DONE
    if counter is None:
        return None
    reported = 0

    def report(done: int) -> None:
        nonlocal reported
        with counter.get_lock():
            counter.value += done - reported
        reported = done
    return report


@dataclass(frozen=True, slots=True)
class _PointFailure:
    """What a worker returns instead of a record when its point could not run."""

    message: str


class PointsFailed(ConfigError):
    """Some points of a sweep could not run; every other point finished.

    ``records``: finished results in point order; ``failures``: ``(point, message)``; ``total``: points.
    """

    def __init__(self, records: list[Any], failures: list[tuple[Any, str]], total: int,
                 message: str | None = None) -> None:
        self.records = records
        self.failures = failures
        self.total = total
        super().__init__(message or f"{len(failures)} of {total} points could not run: " + describe_failures(failures))


def point_label(task: SweepTask, *, with_trace: bool = False) -> str:
    """``system at capacity`` (``... on trace``): how a point is named in messages."""
    label = f"{task.point.system} at {task.point.capacity}"
    return label + (f" on {task.trace_name or task.trace_key}" if with_trace else "")


def describe_failures(failures: Sequence[tuple[Any, str]], shown: int = 3) -> str:
    """``label: message; ...`` for the first ``shown`` failures, then how many more (a point is labelled
    by :func:`point_label`, its ``label``, or ``str``)."""
    with_trace = len({t.trace_key for t, _ in failures if isinstance(t, SweepTask)}) > 1

    def label(point: Any) -> str:
        if isinstance(point, SweepTask):
            return point_label(point, with_trace=with_trace)
        return str(getattr(point, "label", point))
    text = "; ".join(f"{label(t)}: {m}" for t, m in failures[:shown])
    return text + (f"; and {len(failures) - shown} more" if len(failures) > shown else "")


def expand_points(systems: Sequence[str], capacities: Sequence[str], models: Sequence[str],
                  mode: str = "sequential") -> list[SweepPoint]:
    """The cross product, validating every name up front, and each system against ``mode``
    (:func:`~marconi.sim.replay.check_mode`): a typo fails before any work starts."""
    for system in systems:
        check_mode(system, mode)
    for cap in capacities:
        parse_capacity(cap)
    for model in models:
        get_model(model)
    return [SweepPoint(s, c, m) for m in models for c in capacities for s in systems]


def run_point(trace: Any, trace_name: str, task: SweepTask, *, tuning_workers: int | None = None,
              tuning_mapper: Callable[..., list[Any]] | None = None) -> dict[str, Any]:
    """Simulate one task on ``trace`` as a flat record (``SimResult.record``, plus per-request
    ``reused_len``)."""
    point = task.point
    spec = get_model(point.model)
    capacity: Capacity = parse_capacity(point.capacity)
    if capacity.fraction is not None and task.working_set is None:
        raise ValueError(f"capacity {point.capacity!r} is a fraction but no working set was given")
    capacity_bytes = capacity.resolve(task.working_set or 0)
    result = simulate_system(trace, point.system, spec, capacity_bytes, latency=task.latency, mode=task.mode,
                             tuning_workers=tuning_workers, tuning_mapper=tuning_mapper,
                             progress=_request_reporter())
    extra: dict[str, Any] = {"trace": trace_name, "capacity": point.capacity}
    if capacity.fraction is not None:
        extra["working_set_bytes"] = task.working_set
    if point.seed is not None:
        extra["seed"] = point.seed
    extra.update(dict(task.tags))
    rec = result.record(per_request=task.per_request, **extra)
    if task.per_request:
        rec["per_request"]["reused_len"] = result.reused_len.tolist()
    if not task.capture_tuning:
        rec.pop("tuning_windows", None)
    return rec


# ----------------------------------------------------------------------------- backend tasks
def _task_fn(shared: Mapping[str, Any], task: SweepTask) -> dict[str, Any]:
    return run_point(shared[task.trace_key], task.trace_name or task.trace_key, task,
                     tuning_workers=shared["__tuning_workers__"], tuning_mapper=shared["__tuning_mapper__"])


@dataclass(frozen=True, slots=True)
class _Guarded:
    """``fn(shared, item)`` with a :class:`ConfigError` returned as a :class:`_PointFailure` (picklable)."""

    fn: TaskFn

    def __call__(self, shared: Mapping[str, Any], item: Any) -> Any:
        try:
            return self.fn(shared, item)
        except ConfigError as exc:  # this point cannot run (its capacity, its pool): the others still can
            return _PointFailure(str(exc))


def run_points(fn: TaskFn, items: Sequence[Any], *, backend: str | Backend = "local", workers: int | None = None,
               shared: Mapping[str, Any] | None = None, needs: Callable[[Any], Sequence[str]] | None = None,
               on_result: Callable[[Any], None] | None = None) -> list[Any]:
    """``[fn(shared, item) for item in items]`` on ``backend`` in item order (``fn`` module-level;
    ``needs(item)``: the shared keys it reads; ``on_result``: each success). PointsFailed once every
    other item finished if some raised :class:`ConfigError`."""
    def on_success(result: Any) -> None:
        if on_result is not None and not isinstance(result, _PointFailure):
            on_result(result)
    with backend_scope(backend, workers) as be:
        results = be.map(_Guarded(fn), items, shared=shared or {}, on_result=on_success, needs=needs)
    failures = [(i, r.message) for i, r in zip(items, results) if isinstance(r, _PointFailure)]
    if failures:
        raise PointsFailed([r for r in results if not isinstance(r, _PointFailure)], failures, len(items))
    return results


def _working_set_fn(shared: Mapping[str, Any], item: tuple[str, str | ModelSpec]) -> int:
    key, model = item
    return working_set_bytes(shared[key], model)


@contextmanager
def backend_scope(backend: str | Backend, workers: int | None) -> Iterator[Backend]:
    """The backend to use; one made here from a name is closed (a Ray instance it started stops)."""
    be = make_backend(backend, workers=workers)
    try:
        yield be
    finally:
        if be is not backend:
            be.close()


def _task_needs(task: SweepTask) -> tuple[str, ...]:
    return (task.trace_key, "__tuning_mapper__", "__tuning_workers__")


def _working_set_needs(item: tuple[str, Any]) -> tuple[str, ...]:
    return (item[0],)


def working_sets(traces: Mapping[str, Any], pairs: Iterable[tuple[str, str | ModelSpec]], *,
                 backend: str | Backend = "local", workers: int | None = None) -> dict[tuple[str, Any], int]:
    """Working set bytes (see :func:`working_set_bytes`) of each distinct (trace key, model), in parallel."""
    items = list(dict.fromkeys(pairs))
    with backend_scope(backend, workers) as be:
        values = be.map(_working_set_fn, items, shared=dict(traces), needs=_working_set_needs)
    return dict(zip(items, values))


def run_tasks(traces: Mapping[str, Any], tasks: Sequence[SweepTask], *, backend: str | Backend = "local",
              workers: int | None = None, names: Mapping[str, str] | None = None,
              on_record: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Run tasks over several traces on shared workers, records in ``tasks`` order (``names``: the trace
    echo per key; ``on_record``: each success). Concurrent points tune α in-process. PointsFailed
    as :func:`run_points`."""
    with backend_scope(backend, workers) as be:
        parallel = be.parallelism > 1 and len(tasks) > 1
        mapper = be.tuning_mapper()
        tuning_workers = 1 if parallel else None
        shared = {**traces, "__tuning_mapper__": mapper, "__tuning_workers__": tuning_workers}
        if names:
            tasks = [replace(t, trace_name=names.get(t.trace_key, t.trace_name)) for t in tasks]
        return run_points(_task_fn, tasks, backend=be, shared=shared, needs=_task_needs, on_result=on_record)


def run_sweep(trace: Sequence[Any], trace_name: str, points: Sequence[SweepPoint], *, latency: str = "a100",
              mode: str = "sequential", workers: int | None = None, per_request: bool = True,
              on_record: Callable[[dict[str, Any]], None] | None = None,
              backend: str | Backend = "local",
              working_set_bytes: Mapping[str | ModelSpec, int] | None = None) -> list[dict[str, Any]]:
    """Simulate every point, records in ``points`` order; fractional capacities resolve against each
    model's working set (``working_set_bytes`` or computed). PointsFailed as :func:`run_points`."""
    key = "trace"
    known = dict(working_set_bytes or {})
    models = list(dict.fromkeys(p.model for p in points if parse_capacity(p.capacity).fraction is not None
                                and p.model not in known))
    with backend_scope(backend, workers) as be:
        ws = working_sets({key: trace}, [(key, m) for m in models], backend=be) if models else {}
        ws.update({(key, m): v for m, v in known.items()})
        tasks = [SweepTask(key, p, ws.get((key, p.model)), latency, mode, per_request) for p in points]
        return run_tasks({key: trace}, tasks, backend=be, names={key: trace_name}, on_record=on_record)


def write_records(records: Iterable[dict[str, Any]], path: str | Path) -> Path:
    """Write JSONL atomically (:func:`marconi.io.write_jsonl`)."""
    return write_jsonl(path, records)


# What every `marconi simulate` record has (what `compare` and the plots read).
RESULT_FIELDS = ("trace", "system", "model", "capacity", "num_requests", "token_hit_rate")


@dataclass(frozen=True, slots=True)
class FieldType:
    """What a record field must hold for :func:`read_records`: ``test(value)`` says whether it does,
    ``expected`` says it in a message's words (``"a number"``); ``required``: absent is wrong too;
    ``bound(value)``, for a value ``test`` passed: why it is out of range (``"must be a fraction in
    [0, 1], got 7.0"``), or None where it is in range."""

    test: Callable[[Any], bool]
    expected: str
    required: bool = False
    bound: Callable[[Any], str | None] | None = None


_NUMBER_TYPES = frozenset({int, float})   # what json.loads makes of a number (a bool is not one)


def _is_number(value: Any) -> bool:
    return type(value) in _NUMBER_TYPES


def _is_numbers(value: Any) -> bool:
    return isinstance(value, list) and _NUMBER_TYPES.issuperset(map(type, value))   # C speed: lists are long


def _bound(what: str, inside: Callable[[Any], Any]) -> tuple[Callable[[Any], str | None],
                                                             Callable[[list[Any]], str | None]]:
    """The two ``FieldType`` bounds for a range: why a number (None: absent) is not ``what``, and why
    a list of numbers is not all ``what`` (naming its first bad element, 0-based); None where they
    are. ``inside`` takes a number or a float array (NaN must fail it)."""
    def one(value: Any) -> str | None:
        if value is None or inside(value):
            return None
        return f"must be {what}, got {brief_repr(value)}"

    def each(values: list[Any]) -> str | None:
        try:
            array = np.asarray(values, dtype=np.float64)
        except OverflowError:               # an integer beyond a float: out of range, found below
            first = next(i for i, v in enumerate(values) if not inside(v))
        else:
            bad = np.flatnonzero(~inside(array))
            if not len(bad):
                return None
            first = int(bad[0])
        return f"element {first} must be {what}, got {brief_repr(values[first])}"

    return one, each


# NaN fails every comparison, an infinity the upper bound
_outside_fraction, _outside_fractions = _bound("a fraction in [0, 1]", lambda v: (v >= 0) & (v <= 1))
_outside_seconds, _outside_seconds_list = _bound("a time in seconds, finite and >= 0",
                                                 lambda v: (v >= 0) & (v < math.inf))


_TEXT = FieldType(lambda v: isinstance(v, str), "a string")
_NUMBER_OR_NULL = FieldType(lambda v: v is None or _is_number(v), "a number or null")
_FRACTION_OR_NULL = FieldType(lambda v: v is None or _is_number(v), "a number or null", bound=_outside_fraction)
_SECONDS_OR_NULL = FieldType(lambda v: v is None or _is_number(v), "a number or null", bound=_outside_seconds)

# The type of every field `compare`, its table and its plots compute with (a bad one was a TypeError
# deep in a plot). A top-level field's presence is read_records' ``required``; a dotted name is a
# field of an object field, checked when that field is an object. Rates and fractions (token_hit_rate,
# hit_rate_p95, flops_saved_fraction, per_request.hit_rate) must also be finite and in [0, 1]: a 7.0
# or a NaN skewed every gain of its group; times (ttft_p95_s, vanilla_ttft_p95_s, per_request.ttft_s)
# finite and >= 0: a NaN or a negative one made the P95-vs-vanilla column nonsense.
RESULT_TYPES: dict[str, FieldType] = {
    "trace": _TEXT, "system": _TEXT, "model": _TEXT,
    "mode": FieldType(lambda v: v is None or isinstance(v, str), "a string or null"),
    "capacity": FieldType(lambda v: isinstance(v, str) or _is_number(v), "a string (10GB, 0.1x) or a number"),
    "capacity_bytes": _NUMBER_OR_NULL,
    "num_requests": FieldType(lambda v: type(v) is int, "an integer"),
    "input_tokens": FieldType(lambda v: v is None or type(v) is int, "an integer or null"),
    "working_set_bytes": _NUMBER_OR_NULL,                  # with num_requests: what compare groups by
    "token_hit_rate": FieldType(_is_number, "a number", bound=_outside_fraction),
    "hit_rate_p95": _FRACTION_OR_NULL, "flops_saved_fraction": _FRACTION_OR_NULL, "ttft_p95_s": _SECONDS_OR_NULL,
    "vanilla_ttft_p95_s": _SECONDS_OR_NULL,
    "per_request": FieldType(lambda v: isinstance(v, dict), "an object of per-request lists"),
    "per_request.hit_rate": FieldType(_is_numbers, "a list of numbers", required=True, bound=_outside_fractions),
    "per_request.ttft_s": FieldType(_is_numbers, "a list of numbers", required=True, bound=_outside_seconds_list),
}


def _type_error(rec: dict[str, Any], types: Mapping[str, FieldType]) -> str | None:
    """``field 'x': expected ..., got ...`` (or ``field 'x': must be ...``, its ``bound``) for the first
    field of ``rec`` that ``types`` refuses, or None."""
    for name, kind in types.items():
        parent, _, key = name.rpartition(".")
        holder = rec.get(parent) if parent else rec
        if not isinstance(holder, dict):
            continue
        if key not in holder:
            if kind.required:
                return f"field {name!r}: missing (expected {kind.expected})"
            continue
        if not kind.test(holder[key]):
            return f"field {name!r}: expected {kind.expected}, got {described(holder[key])}"
        why = kind.bound(holder[key]) if kind.bound is not None else None
        if why is not None:
            return f"field {name!r}: {why}"
    return None


def read_records(path: str | Path, required: Sequence[str] = (), kind: str = "results",
                 types: Mapping[str, FieldType] | None = None) -> list[dict[str, Any]]:
    """The JSONL records at ``path``, each an object with the ``required`` keys (``kind`` names them)
    whose fields hold what ``types`` says (one pass, no copies: e.g. :data:`RESULT_TYPES`).

    Raises:
        FileNotFoundError: no such file.
        JsonError: a line that is not JSON (naming ``path:line``).
        ConfigError: naming ``path:line`` (and the field): a record that is not an object, lacks a
            required key, or holds a field of the wrong type or outside its ``bound`` (with
            :data:`RESULT_TYPES`: a rate or fraction that is not finite and in [0, 1]).
    """
    out = []
    for where, rec in iter_jsonl(path):
        missing = [k for k in required if k not in rec] if isinstance(rec, dict) else list(required)
        if not isinstance(rec, dict) or missing:
            got = described(rec)
            raise ConfigError(f"{where}: not one of the {kind} records: {got}"
                              + (f" without {', '.join(repr(k) for k in missing)}" if missing else ""))
        wrong = _type_error(rec, types) if types else None
        if wrong is not None:
            raise ConfigError(f"{where}: {wrong}")
        out.append(rec)
    return out
