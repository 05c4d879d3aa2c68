"""The canonical request trace: schema, streaming readers, atomic writers and a validator.

On disk a trace is JSONL (optionally gzipped) in exactly the format of the Marconi authors' artifact,
one request per line::

    {"session_id": 0, "turn_id": 0, "ts": 0.0, "num_input_tokens": 3, "num_output_tokens": 2,
     "input_tokens": [1, 415, 2936], "output_tokens": [1, 733]}

``session_id`` is an int or a str (kept as given), ``turn_id`` an int >= 0, ``ts`` the arrival time in
seconds (non-decreasing from line to line), ``input_tokens`` the whole history plus the new user
message (non-empty), ``output_tokens`` this turn's reply; ``num_*_tokens`` are optional and, when
present, must equal the list lengths. Token ids are integers in ``[0, 2**31)``. Unknown fields are
ignored. Or it is Parquet with the same columns (``list<int32>`` token columns).

A trace's ``name`` and ``meta`` (recipe and parameters) travel in the Parquet schema metadata, and
for JSONL in a sidecar ``<file>.meta.json`` (so the JSONL itself stays loadable by the authors' code).

Reading streams: :func:`iter_requests` yields one :class:`Request` at a time (JSONL line by line,
Parquet batch by batch), so memory is bounded by one request (one batch) plus what the caller keeps.
Writing is atomic: a temp file in the target directory is renamed over the target only once it is
complete; on any error it is removed and the target is untouched.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import math
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, NamedTuple, Sequence

import numpy as np

from marconi.io import JsonError, atomic_write, decode_line, is_stream, iter_lines, loads

__all__ = [
    "Request",
    "Trace",
    "TraceStats",
    "TraceFormatError",
    "TraceProblem",
    "iter_requests",
    "read_trace",
    "read_trace_meta",
    "write_trace",
    "validate_trace",
    "inspect_trace",
    "SessionCheck",
    "session_warnings",
    "trace_stats",
    "atomic_output",
    "trace_format",
]

INT32_MAX = 2**31 - 1
SessionId = int | str
META_SUFFIX = ".meta.json"
_PARQUET_META_KEY = b"marconi.trace"
_ROW_GROUP_TOKENS = 1024 * 1024  # tokens per Parquet row group (4 MiB of int32): bounds reader memory
_ROW_GROUP_ROWS = 4096


# ============================================================================ errors


class TraceProblem(NamedTuple):
    """One problem found in a trace file. ``line`` is 1-based (JSONL), ``row`` 0-based (Parquet)."""

    path: str
    line: int | None
    row: int | None
    field: str | None
    message: str
    severity: str = "error"  # "error": the file is invalid; "warning": valid, but look at it

    def __str__(self) -> str:
        where = self.path
        if self.line is not None:
            where += f":{self.line}"
        elif self.row is not None:
            where += f":row {self.row}"
        what = f"field {self.field!r}: " if self.field else ""
        tag = "warning: " if self.severity == "warning" else ""
        return f"{where}: {tag}{what}{self.message}"


class TraceFormatError(ValueError):
    """A trace file (or a request in it) does not follow the schema; the message says where."""

    def __init__(self, problem: TraceProblem):
        super().__init__(str(problem))
        self.problem = problem

    @property
    def path(self) -> str:
        return self.problem.path

    @property
    def line(self) -> int | None:
        return self.problem.line

    @property
    def field(self) -> str | None:
        return self.problem.field


# ============================================================================ in-memory schema


def _as_token_array(value: Any, what: str) -> np.ndarray:
    """``value`` as a read-only 1-D int32 array; raises ValueError naming ``what`` otherwise."""
    if isinstance(value, np.ndarray) and value.dtype == np.int32:
        arr = value
    else:
        arr = np.asarray(value)
        if arr.size == 0:
            arr = arr.astype(np.int32)
        elif arr.dtype.kind not in "iu":
            raise ValueError(f"{what}: token ids must be integers, got dtype {arr.dtype}")
        elif arr.size and (int(arr.max()) > INT32_MAX or int(arr.min()) < 0):
            raise ValueError(f"{what}: token ids must lie in [0, {INT32_MAX}]")
        arr = arr.astype(np.int32, copy=False)
    if arr.ndim != 1:
        raise ValueError(f"{what}: expected a 1-D token array, got shape {arr.shape}")
    if arr.size and int(arr.min()) < 0:
        raise ValueError(f"{what}: token ids must be >= 0")
    if arr.flags.writeable:
        arr = arr.view()
        arr.flags.writeable = False
    return arr


@dataclass(frozen=True, slots=True, eq=False)
class Request:
    """One LLM call of a trace.

    Attributes:
        session_id: int or str, as given by the source (multi-turn requests share it).
        turn_id: index of the request within its session (>= 0).
        ts: arrival time in seconds (finite, >= 0).
        input_tokens: int32 ``[input_len]``, the whole history plus the new message (non-empty).
        output_tokens: int32 ``[output_len]``, the reply (may be empty).

    Token arrays are converted to int32 on construction and kept as **read-only** views (builders
    share one buffer between the requests of a session); copy before mutating.
    """

    session_id: SessionId
    turn_id: int
    ts: float
    input_tokens: np.ndarray
    output_tokens: np.ndarray

    def __post_init__(self) -> None:
        if isinstance(self.session_id, bool) or not isinstance(self.session_id, (int, str, np.integer)):
            raise ValueError(f"session_id must be an int or a str, got {type(self.session_id).__name__}")
        if isinstance(self.session_id, np.integer):
            object.__setattr__(self, "session_id", int(self.session_id))
        if isinstance(self.turn_id, bool) or not isinstance(self.turn_id, (int, np.integer)):
            raise ValueError(f"turn_id must be an int, got {type(self.turn_id).__name__}")
        if self.turn_id < 0:
            raise ValueError(f"turn_id must be >= 0, got {self.turn_id}")
        object.__setattr__(self, "turn_id", int(self.turn_id))
        ts = float(self.ts)
        if not math.isfinite(ts) or ts < 0:
            raise ValueError(f"ts must be a finite number of seconds >= 0, got {self.ts!r}")
        object.__setattr__(self, "ts", ts)
        object.__setattr__(self, "input_tokens", _as_token_array(self.input_tokens, "input_tokens"))
        object.__setattr__(self, "output_tokens", _as_token_array(self.output_tokens, "output_tokens"))
        if self.input_tokens.size == 0:
            raise ValueError("input_tokens must not be empty")

    @property
    def input_len(self) -> int:
        return int(self.input_tokens.size)

    @property
    def output_len(self) -> int:
        return int(self.output_tokens.size)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Request):
            return NotImplemented
        return (
            self.session_id == other.session_id
            and self.turn_id == other.turn_id
            and self.ts == other.ts
            and np.array_equal(self.input_tokens, other.input_tokens)
            and np.array_equal(self.output_tokens, other.output_tokens)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"Request(session_id={self.session_id!r}, turn_id={self.turn_id}, ts={self.ts}, "
                f"input_len={self.input_len}, output_len={self.output_len})")

    def to_record(self) -> dict[str, Any]:
        """The JSON-able dict of the on-disk schema (with ``num_*_tokens``)."""
        return {
            "session_id": self.session_id,
            "turn_id": self.turn_id,
            "ts": self.ts,
            "num_input_tokens": self.input_len,
            "num_output_tokens": self.output_len,
            "input_tokens": self.input_tokens.tolist(),
            "output_tokens": self.output_tokens.tolist(),
        }


@dataclass(frozen=True, slots=True)
class TraceStats:
    """Summary of a trace; lengths in tokens, times in seconds."""

    num_requests: int
    num_sessions: int
    total_input_tokens: int
    total_output_tokens: int
    input_len_min: int
    input_len_mean: float
    input_len_p50: float
    input_len_p90: float
    input_len_p99: float
    input_len_max: int
    output_len_mean: float
    output_len_max: int
    max_turns_per_session: int
    first_ts: float
    last_ts: float

    @property
    def duration_s(self) -> float:
        return self.last_ts - self.first_ts

    def as_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["duration_s"] = self.duration_s
        return out

    @classmethod
    def from_requests(cls, requests: Iterable[Request]) -> "TraceStats":
        """Stats of any stream of requests; keeps only lengths and per-session turn counts."""
        input_lens: list[int] = []
        output_lens: list[int] = []
        turns: dict[SessionId, int] = {}
        first_ts = last_ts = 0.0
        for i, req in enumerate(requests):
            if i == 0:
                first_ts = req.ts
            last_ts = req.ts
            input_lens.append(req.input_len)
            output_lens.append(req.output_len)
            turns[req.session_id] = turns.get(req.session_id, 0) + 1
        ins = np.asarray(input_lens, dtype=np.int64)
        outs = np.asarray(output_lens, dtype=np.int64)
        if ins.size == 0:
            return cls(0, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0, 0.0, 0, 0, 0.0, 0.0)
        p50, p90, p99 = (float(x) for x in np.percentile(ins, [50, 90, 99]))
        return cls(
            num_requests=int(ins.size),
            num_sessions=len(turns),
            total_input_tokens=int(ins.sum()),
            total_output_tokens=int(outs.sum()),
            input_len_min=int(ins.min()),
            input_len_mean=float(ins.mean()),
            input_len_p50=p50,
            input_len_p90=p90,
            input_len_p99=p99,
            input_len_max=int(ins.max()),
            output_len_mean=float(outs.mean()),
            output_len_max=int(outs.max()),
            max_turns_per_session=max(turns.values()),
            first_ts=first_ts,
            last_ts=last_ts,
        )


@dataclass(slots=True, eq=False)
class Trace:
    """An in-memory trace: requests in arrival order (``ts`` non-decreasing), a name and a meta dict.

    ``meta`` records where the trace came from (``source``) and the recipe's parameters, so a result
    file can echo it. Constructing a Trace whose requests are out of order raises ValueError; use
    :meth:`from_unsorted` to sort (stably) first.
    """

    requests: list[Request]
    name: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.requests = list(self.requests)
        prev = -math.inf
        for i, req in enumerate(self.requests):
            if not isinstance(req, Request):
                raise TypeError(f"request {i} is a {type(req).__name__}, not a Request")
            if req.ts < prev:
                raise ValueError(f"request {i}: ts {req.ts} is earlier than the previous request's {prev}")
            prev = req.ts

    @classmethod
    def from_unsorted(cls, requests: Iterable[Request], name: str = "",
                      meta: Mapping[str, Any] | None = None) -> "Trace":
        """Sort by ``ts`` (stable: ties keep their given order) and build a Trace."""
        ordered = sorted(requests, key=lambda r: r.ts)
        return cls(ordered, name=name, meta=dict(meta or {}))

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[Request]:
        return iter(self.requests)

    def __getitem__(self, index: int) -> Request:
        return self.requests[index]

    def __repr__(self) -> str:
        return (f"Trace(name={self.name!r}, num_requests={len(self)}, num_sessions={self.num_sessions}, "
                f"total_input_tokens={self.total_input_tokens})")

    @property
    def num_requests(self) -> int:
        return len(self.requests)

    @property
    def session_ids(self) -> list[SessionId]:
        """Distinct session ids in order of first appearance."""
        return list(dict.fromkeys(r.session_id for r in self.requests))

    @property
    def num_sessions(self) -> int:
        return len(self.session_ids)

    @property
    def total_input_tokens(self) -> int:
        return sum(r.input_len for r in self.requests)

    @property
    def total_output_tokens(self) -> int:
        return sum(r.output_len for r in self.requests)

    @property
    def duration_s(self) -> float:
        return self.requests[-1].ts - self.requests[0].ts if self.requests else 0.0

    def input_lens(self) -> np.ndarray:
        return np.fromiter((r.input_len for r in self.requests), dtype=np.int64, count=len(self))

    def output_lens(self) -> np.ndarray:
        return np.fromiter((r.output_len for r in self.requests), dtype=np.int64, count=len(self))

    def sessions(self) -> dict[SessionId, list[Request]]:
        """Requests grouped by session, each list in arrival order."""
        out: dict[SessionId, list[Request]] = {}
        for req in self.requests:
            out.setdefault(req.session_id, []).append(req)
        return out

    def head(self, n: int) -> "Trace":
        """The first ``n`` requests (same name and meta); ``n`` must be >= 0."""
        _check_limit(n)
        return Trace(self.requests[:n], name=self.name, meta=dict(self.meta))

    def stats(self) -> TraceStats:
        return TraceStats.from_requests(self.requests)


# ============================================================================ paths and atomic output


def _check_limit(limit: int | None) -> None:
    """``limit`` means "the first ``limit`` requests": None (all) or an int >= 0 (0: none)."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 0):
        raise ValueError(f"limit must be None or an int >= 0, got {limit!r}")


def trace_format(path: str | os.PathLike) -> str:
    """``"jsonl"``, ``"jsonl.gz"`` or ``"parquet"`` from the file name; ValueError otherwise."""
    name = os.fspath(path).lower()
    if name.endswith(".jsonl.gz"):
        return "jsonl.gz"
    if name.endswith(".jsonl"):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    raise ValueError(f"{os.fspath(path)}: unknown trace format (use .jsonl, .jsonl.gz or .parquet)")


def _meta_path(path: str | os.PathLike) -> Path:
    return Path(os.fspath(path) + META_SUFFIX)


atomic_output = atomic_write  # the old name; every writer is :func:`marconi.io.atomic_write`


# ============================================================================ record checking


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_token_list(value: Any, name: str) -> tuple[np.ndarray | None, str | None]:
    """Convert a decoded JSON token list; return (array, None) or (None, problem message)."""
    if not isinstance(value, list):
        return None, f"expected a list of integers, got {_type_name(value)}"
    # Vectorised check: numpy infers a 1-D integer dtype only if every element is an int or bool.
    try:
        arr = np.array(value) if value else np.zeros(0, dtype=np.int64)
    except (ValueError, OverflowError):  # ragged nesting and the like: find the culprit below
        arr = np.zeros(0, dtype=object)
    if arr.ndim == 1 and arr.dtype.kind in "iu" and not any(type(x) is bool for x in value):
        if arr.size:
            bad = np.flatnonzero((arr < 0) | (arr > INT32_MAX))
            if bad.size:
                i = int(bad[0])
                if arr[i] < 0:
                    return None, f"element {i} is negative ({value[i]})"
                return None, f"element {i} ({value[i]}) does not fit int32 (max {INT32_MAX})"
        return arr.astype(np.int32), None
    for i, x in enumerate(value):  # error path only: find the first offending element
        if not _is_int(x):
            return None, f"element {i} is not an integer ({_short_repr(x)})"
        if x < 0:
            return None, f"element {i} is negative ({x})"
        if x > INT32_MAX:
            return None, f"element {i} ({x}) does not fit int32 (max {INT32_MAX})"
    return None, "unreadable token list"  # pragma: no cover - unreachable


def _check_record(obj: Any, tokens: Mapping[str, np.ndarray] | None = None,
                  skip: set[str] | frozenset[str] = frozenset()
                  ) -> tuple[dict[str, Any], list[tuple[str | None, str]]]:
    """Check one decoded record; return (converted fields, problems as (field, message)).

    ``tokens`` carries token arrays already parsed elsewhere (fast path, Parquet): they take the
    place of ``obj``'s entries. A token field in ``skip`` but not in ``tokens`` was already reported.
    """
    problems: list[tuple[str | None, str]] = []
    out: dict[str, Any] = {}
    if not isinstance(obj, dict):
        return out, [(None, f"expected a JSON object, got {_type_name(obj)}")]

    sid = obj.get("session_id")
    if "session_id" not in obj:
        problems.append(("session_id", "missing"))
    elif not (_is_int(sid) or isinstance(sid, str)):
        problems.append(("session_id", f"expected an int or a str, got {_type_name(sid)}"))
    else:
        out["session_id"] = sid

    turn = obj.get("turn_id")
    if "turn_id" not in obj:
        problems.append(("turn_id", "missing"))
    elif not _is_int(turn):
        problems.append(("turn_id", f"expected an int, got {_type_name(turn)} ({_short_repr(turn)})"))
    elif turn < 0:
        problems.append(("turn_id", f"must be >= 0, got {turn}"))
    else:
        out["turn_id"] = turn

    ts = obj.get("ts")
    if "ts" not in obj:
        problems.append(("ts", "missing"))
    elif isinstance(ts, bool) or not isinstance(ts, (int, float)):
        problems.append(("ts", f"expected a number of seconds, got {_type_name(ts)} ({_short_repr(ts)})"))
    elif not math.isfinite(ts) or ts < 0:
        problems.append(("ts", f"must be finite and >= 0, got {ts}"))
    else:
        out["ts"] = float(ts)

    for name in ("input_tokens", "output_tokens"):
        length: int | None = None
        if tokens is not None and name in tokens:
            out[name] = tokens[name]
            length = int(tokens[name].size)
        elif name in skip:
            pass
        elif name not in obj:
            problems.append((name, "missing"))
        else:
            value = obj[name]
            arr, msg = _check_token_list(value, name)
            if msg:
                problems.append((name, msg))
            else:
                out[name] = arr
            if isinstance(value, list):
                length = len(value)
        if name == "input_tokens" and length == 0:
            problems.append((name, "empty (a request needs at least one input token)"))
            out.pop(name, None)
        count_name = "num_" + name
        if count_name in obj:
            count = obj[count_name]
            if not _is_int(count):
                problems.append((count_name, f"expected an int, got {_type_name(count)}"))
            elif length is not None and count != length:
                problems.append((count_name, f"says {count} but {name} has {length} tokens"))
    return out, problems


# ============================================================================ JSONL decoding

_TOKEN_LIST_RE = re.compile(r'"(input_tokens|output_tokens)"\s*:\s*\[([^\[\]]*)\]')


class _Fallback(Exception):
    pass


def _parse_int_list(text: str) -> np.ndarray:
    """Parse ``"1, 2, 3"`` at C speed; raise _Fallback unless it is a clean list of int32 >= 0."""
    if not text.strip():
        return np.zeros(0, dtype=np.int32)
    if "+" in text:
        raise _Fallback
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # numpy < 2 warns on partial reads
            arr = np.fromstring(text, dtype=np.int64, sep=",")
    except ValueError:
        raise _Fallback from None
    if arr.size != text.count(",") + 1:
        raise _Fallback
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) > INT32_MAX):
        raise _Fallback
    return arr.astype(np.int32)


def _fast_decode(line: str) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """Decode a well-formed line without building Python ints for the tokens; None to fall back.

    The token lists are cut out with a regex, the rest is decoded by ``json``. Any doubt (a key seen
    twice, an odd element, the key nested somewhere else) returns None and the slow path decides.
    """
    lists: dict[str, str] = {}

    def cut(match: re.Match[str]) -> str:
        key = match.group(1)
        if key in lists:
            raise _Fallback
        lists[key] = match.group(2)
        return f'"{key}": 0'

    try:
        rest = _TOKEN_LIST_RE.sub(cut, line)
        if len(lists) != 2:
            return None
        obj = json.loads(rest)
        if not isinstance(obj, dict) or obj.get("input_tokens") != 0 or obj.get("output_tokens") != 0:
            return None
        if type(obj["input_tokens"]) is not int or type(obj["output_tokens"]) is not int:
            return None
        tokens = {key: _parse_int_list(text) for key, text in lists.items()}
    except (_Fallback, ValueError, RecursionError):
        return None
    return obj, tokens


def _decode_line(line: str, where: str) -> tuple[dict[str, Any], list[tuple[str | None, str]]]:
    fast = _fast_decode(line)
    if fast is not None:
        return _check_record(*fast)
    try:
        obj = loads(line, where)
    except JsonError as exc:
        return {}, [(None, exc.reason)]
    return _check_record(obj)


_Record = tuple[int, dict[str, Any], list[tuple[str | None, str]]]  # (position, fields, problems)


def _jsonl_records(path: Path, fmt: str) -> Iterator[_Record]:
    """Yield (1-based line, fields, problems) for each non-blank line.

    Lines are decoded one at a time (:func:`marconi.io.iter_lines`), so a bad byte is a problem of
    its own line and reading goes on; an unreadable stream (corrupt gzip) ends the file with one.
    """
    label = os.fspath(path)
    lineno = 0
    try:
        for lineno, raw in iter_lines(path):
            if not raw.strip():
                continue
            where = f"{label}:{lineno}"
            try:
                line = decode_line(raw, where)
            except JsonError as exc:
                yield lineno, {}, [(None, exc.reason)]
                continue
            yield (lineno, *_decode_line(line, where))
    except JsonError as exc:
        yield lineno + 1, {}, [(None, exc.reason)]


# ============================================================================ Parquet decoding


def _pa():
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pa, pq


def _is_int_list_type(pa: Any, typ: Any) -> bool:
    return (pa.types.is_list(typ) or pa.types.is_large_list(typ)) and pa.types.is_integer(typ.value_type)


def _token_column(col: Any, row0: int) -> tuple[list[np.ndarray] | None, list[tuple[int, str]]]:
    """Split a list<int> Arrow column into per-row int32 arrays; problems as (row, message)."""
    problems: list[tuple[int, str]] = []
    if col.null_count:
        for i in np.flatnonzero(np.asarray(col.is_null())):
            problems.append((row0 + int(i), "null"))
    flat = col.flatten()
    if flat.null_count:
        return None, problems + [(row0, "null token ids in the list")]
    values = flat.to_numpy(zero_copy_only=False)
    offsets = np.asarray(col.offsets, dtype=np.int64)
    offsets = offsets - offsets[0]
    if values.size:
        bad = np.flatnonzero((values < 0) | (values > INT32_MAX))
        if bad.size:
            rows = np.searchsorted(offsets, bad, side="right") - 1
            seen: set[int] = set()
            for flat_i, r in zip(bad.tolist(), rows.tolist()):
                if r in seen:
                    continue
                seen.add(r)
                v = int(values[flat_i])
                what = "is negative" if v < 0 else f"does not fit int32 (max {INT32_MAX})"
                problems.append((row0 + r, f"element {flat_i - int(offsets[r])} ({v}) {what}"))
    values = np.array(values, dtype=np.int32)  # own the memory: Arrow batch buffers are freed
    arrays = [values[offsets[i]:offsets[i + 1]] for i in range(len(col))]
    return arrays, problems


def _parquet_records(path: Path, batch_rows: int = 128) -> Iterator[_Record]:
    """Yield (0-based row, fields, problems) for each row, one Arrow batch in memory at a time."""
    _, pq = _pa()
    try:
        pf = pq.ParquetFile(path, pre_buffer=False)  # pre-buffering reads far ahead: memory
    except Exception as exc:  # pyarrow raises ArrowInvalid / OSError variants
        yield 0, {}, [(None, f"not a readable Parquet file ({exc})")]
        return
    names = set(pf.schema_arrow.names)
    missing = [c for c in ("session_id", "turn_id", "ts", "input_tokens", "output_tokens") if c not in names]
    if missing:
        yield 0, {}, [(c, "missing column") for c in missing]
        return
    pa, _ = _pa()
    bad_types = [(c, f"expected a list<int> column, got {pf.schema_arrow.field(c).type}")
                 for c in ("input_tokens", "output_tokens")
                 if not _is_int_list_type(pa, pf.schema_arrow.field(c).type)]
    if bad_types:
        yield 0, {}, bad_types
        return
    columns = [c for c in ("session_id", "turn_id", "ts", "input_tokens", "output_tokens",
                           "num_input_tokens", "num_output_tokens") if c in names]
    row0 = 0
    for batch in pf.iter_batches(batch_size=batch_rows, columns=columns):
        n = batch.num_rows
        row_problems: dict[int, list[tuple[str | None, str]]] = {}
        token_arrays: dict[str, list[np.ndarray] | None] = {}
        for name in ("input_tokens", "output_tokens"):
            arrays, probs = _token_column(batch.column(name), row0)
            token_arrays[name] = arrays
            for r, msg in probs:
                row_problems.setdefault(r, []).append((name, msg))
        scalars = {c: batch.column(c).to_pylist() for c in columns
                   if c not in ("input_tokens", "output_tokens")}
        for i in range(n):
            obj = {c: values[i] for c, values in scalars.items()}
            for c in ("num_input_tokens", "num_output_tokens"):
                if c in obj and obj[c] is None:
                    del obj[c]  # a null count in an optional column means "not given"
            reported = row_problems.get(row0 + i, [])
            skip = {f for f, _ in reported}
            tokens = {name: arrays[i] for name, arrays in token_arrays.items()
                      if arrays is not None and name not in skip}
            fields, problems = _check_record(obj, tokens, skip=skip | set(token_arrays))
            yield row0 + i, fields, reported + problems
        row0 += n


# ============================================================================ public readers


def _records(path: str | os.PathLike) -> tuple[str, Iterator[tuple[int, dict[str, Any], list]]]:
    fmt = trace_format(path)
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{os.fspath(path)} is a directory, not a trace file")
    if not p.exists():
        raise FileNotFoundError(f"trace file not found: {os.fspath(path)}")
    if fmt == "parquet":
        return fmt, _parquet_records(p)
    return fmt, _jsonl_records(p, fmt)


def _problem(label: str, fmt: str, pos: int, field_name: str | None, message: str,
             severity: str = "error") -> TraceProblem:
    if fmt == "parquet":
        return TraceProblem(label, None, pos, field_name, message, severity)
    return TraceProblem(label, pos, None, field_name, message, severity)


def iter_requests(path: str | os.PathLike, limit: int | None = None) -> Iterator[Request]:
    """Yield the requests of a trace file one at a time (streaming).

    Raises:
        FileNotFoundError: no such file.
        ValueError: the suffix is not .jsonl / .jsonl.gz / .parquet.
        TraceFormatError: at the first malformed record (message: ``file:line: field 'x': ...``).
    """
    label = os.fspath(path)
    _check_limit(limit)
    fmt, records = _records(path)
    prev_ts = -math.inf
    count = 0
    for pos, fields, problems in records:
        if limit is not None and count >= limit:
            return
        if problems:
            field_name, message = problems[0]
            raise TraceFormatError(_problem(label, fmt, pos, field_name, message))
        if fields["ts"] < prev_ts:
            raise TraceFormatError(_problem(label, fmt, pos, "ts",
                                            f"timestamp {fields['ts']} is earlier than the previous "
                                            f"request's {prev_ts}"))
        prev_ts = fields["ts"]
        yield Request(fields["session_id"], fields["turn_id"], fields["ts"],
                      fields["input_tokens"], fields["output_tokens"])
        count += 1


def read_trace_meta(path: str | os.PathLike) -> tuple[str, dict[str, Any]]:
    """(name, meta) stored with a trace file; the file stem and ``{}`` when there is none."""
    p = Path(path)
    stem = p.name
    for suffix in (".jsonl.gz", ".jsonl", ".parquet"):
        if stem.lower().endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    stored: Mapping[str, Any] = {}
    if trace_format(path) == "parquet":
        _, pq = _pa()
        try:
            md = pq.read_schema(p).metadata or {}
        except Exception:
            md = {}
        if _PARQUET_META_KEY in md:
            stored = json.loads(md[_PARQUET_META_KEY])
    else:
        mp = _meta_path(p)
        if mp.exists():
            stored = json.loads(mp.read_text(encoding="utf-8"))
    return str(stored.get("name") or stem), dict(stored.get("meta") or {})


def read_trace(path: str | os.PathLike, limit: int | None = None) -> Trace:
    """Load a trace file (all of it, or its first ``limit`` requests). Errors as :func:`iter_requests`."""
    name, meta = read_trace_meta(path)
    return Trace(list(iter_requests(path, limit=limit)), name=name, meta=meta)


class SessionCheck:
    """Finds what the schema allows but a multi-turn trace rarely means: repeated (session, turn)
    pairs, and turns whose input does not start with their session's previous input + output.

    The second is expected of some recipes (SWE traces that keep only the last observations, doc-QA
    sessions whose questions branch off one document), so both are *warnings*. Memory is one
    (length, digest) pair per session and one position per (session, turn).
    """

    def __init__(self) -> None:
        self.first_seen: dict[tuple[SessionId, int], int] = {}
        self.previous: dict[SessionId, tuple[int, bytes]] = {}  # session -> (len(input + output), digest)
        self.duplicates: list[tuple[int, SessionId, int, int]] = []  # (pos, session, turn, first pos)
        self.not_extending: list[int] = []
        self.num_followups = 0

    def add(self, pos: int, session_id: SessionId, turn_id: int, input_tokens: np.ndarray,
            output_tokens: np.ndarray) -> None:
        key = (session_id, turn_id)
        if key in self.first_seen:
            self.duplicates.append((pos, session_id, turn_id, self.first_seen[key]))
        else:
            self.first_seen[key] = pos
        prev = self.previous.get(session_id)
        if prev is not None:
            self.num_followups += 1
            length, digest = prev
            if input_tokens.size < length or _digest(input_tokens[:length]) != digest:
                self.not_extending.append(pos)
        history = np.concatenate([input_tokens, output_tokens]) if output_tokens.size else input_tokens
        self.previous[session_id] = (int(history.size), _digest(history))

    def warnings(self, label: str, fmt: str, max_positions: int = 3) -> list[TraceProblem]:
        """One summary warning per kind (a trace may have thousands of either).

        ``fmt``: ``"jsonl"``/``"jsonl.gz"`` (positions are lines), ``"parquet"`` (rows) or
        ``"memory"`` (positions are request indices, named in the message).
        """
        unit = {"parquet": "row", "memory": "request"}.get(fmt, "line")
        out = []
        if self.duplicates:
            pos, sid, turn, first = self.duplicates[0]
            message = (f"(session {sid!r}, turn {turn}) already appeared at {unit} {first}; "
                       f"{len(self.duplicates)} repeated (session, turn) pair(s) in all")
            if fmt == "memory":
                out.append(TraceProblem(label, None, None, "turn_id", f"{unit} {pos}: {message}", "warning"))
            else:
                out.append(_problem(label, fmt, pos, "turn_id", message, severity="warning"))
        if self.not_extending:
            shown = ", ".join(str(p) for p in self.not_extending[:max_positions])
            more = ", ..." if len(self.not_extending) > max_positions else ""
            out.append(TraceProblem(
                label, None, None, None,
                f"{len(self.not_extending)} of {self.num_followups} follow-up turns do not extend their "
                f"session's previous turn (input + output) ({unit}s {shown}{more}); expected where a recipe "
                "drops old context or a session's requests branch, else the trace may be mis-built",
                severity="warning"))
        return out


def _digest(tokens: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(tokens, dtype=np.int32).tobytes(), digest_size=16).digest()


def session_warnings(trace: Trace | Iterable[Request], label: str = "trace") -> list[TraceProblem]:
    """:class:`SessionCheck` warnings of an in-memory trace (positions are 0-based request indices)."""
    check = SessionCheck()
    for i, req in enumerate(trace):
        check.add(i, req.session_id, req.turn_id, req.input_tokens, req.output_tokens)
    return check.warnings(label, "memory")


def validate_trace(path: str | os.PathLike) -> list[TraceProblem]:
    """Check a whole trace file and return EVERY problem found (empty list: the file is valid).

    Each record is checked field by field (all its problems are reported, the first bad element of
    each token list), plus the order of timestamps against the previous valid one.
    """
    return inspect_trace(path)[0]


def inspect_trace(path: str | os.PathLike) -> tuple[list[TraceProblem], list[TraceProblem]]:
    """(problems, warnings) of a trace file in one pass: :func:`validate_trace`'s problems, and
    :class:`SessionCheck`'s warnings (which do not make the file invalid)."""
    label = os.fspath(path)
    fmt = trace_format(path)
    if not Path(path).exists():
        return [TraceProblem(label, None, None, None, "file not found")], []
    _, records = _records(path)
    out: list[TraceProblem] = []
    prev_ts = -math.inf
    count = 0
    sessions = SessionCheck()
    for pos, fields, problems in records:
        count += 1
        for field_name, message in problems:
            out.append(_problem(label, fmt, pos, field_name, message))
        if not problems:
            sessions.add(pos, fields["session_id"], fields["turn_id"], fields["input_tokens"],
                         fields["output_tokens"])
        if "ts" in fields:
            if fields["ts"] < prev_ts:
                out.append(_problem(label, fmt, pos, "ts", f"timestamp {fields['ts']} is earlier than "
                                                           f"the previous request's {prev_ts}"))
            else:
                prev_ts = fields["ts"]
    if count == 0 and not out:
        out.append(TraceProblem(label, None, None, None, "no requests in the file"))
    return out, sessions.warnings(label, fmt)


def trace_stats(source: str | os.PathLike | Trace) -> TraceStats:
    """Stats of a Trace or of a trace file (streamed: only lengths are kept)."""
    if isinstance(source, Trace):
        return source.stats()
    return TraceStats.from_requests(iter_requests(source))


# ============================================================================ writers


_ID_STRINGS: list[str] = []


def _join_ids(arr: np.ndarray) -> str:
    """``"1, 2, 3"``; ids below 2**17 come from a string table (2.5x faster than ``str`` per id)."""
    global _ID_STRINGS
    if not _ID_STRINGS:
        _ID_STRINGS = [str(i) for i in range(1 << 17)]
    ids = arr.tolist()
    if arr.size and int(arr.max()) < len(_ID_STRINGS):
        table = _ID_STRINGS
        return ", ".join([table[i] for i in ids])
    return ", ".join(map(str, ids))


def _jsonl_line(req: Request) -> str:
    return (
        f'{{"session_id": {json.dumps(req.session_id)}, "turn_id": {req.turn_id}, '
        f'"ts": {json.dumps(req.ts)}, "num_input_tokens": {req.input_len}, '
        f'"num_output_tokens": {req.output_len}, '
        f'"input_tokens": [{_join_ids(req.input_tokens)}], '
        f'"output_tokens": [{_join_ids(req.output_tokens)}]}}\n'
    )


def _checked_stream(requests: Iterable[Request]) -> Iterator[Request]:
    prev = -math.inf
    for i, req in enumerate(requests):
        if not isinstance(req, Request):
            raise TypeError(f"request {i} is a {type(req).__name__}, not a Request")
        if req.ts < prev:
            raise ValueError(f"request {i}: ts {req.ts} is earlier than the previous request's {prev}; "
                             "a trace must be in arrival order")
        prev = req.ts
        yield req


def _write_jsonl(fh: io.IOBase, requests: Iterable[Request]) -> int:
    n = 0
    buf: list[str] = []
    for req in requests:
        buf.append(_jsonl_line(req))
        n += 1
        if len(buf) >= 64:
            fh.write("".join(buf))
            buf.clear()
    fh.write("".join(buf))
    return n


def _parquet_table(batch: Sequence[Request], sid_type: Any, schema: Any) -> Any:
    pa, _ = _pa()

    def tokens(attr: str) -> Any:
        arrays = [getattr(r, attr) for r in batch]
        lens = np.fromiter((a.size for a in arrays), dtype=np.int32, count=len(arrays))
        offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
        np.cumsum(lens, out=offsets[1:])
        values = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int32)
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=pa.int32()))

    sids = [r.session_id for r in batch]
    for s in sids:
        if not isinstance(s, int if sid_type == pa.int64() else str):
            raise ValueError("Parquet traces need all session ids of one type (all int or all str); "
                             f"got {type(s).__name__} after {'int' if sid_type == pa.int64() else 'str'}")
    return pa.Table.from_arrays(
        [pa.array(sids, type=sid_type),
         pa.array([r.turn_id for r in batch], type=pa.int64()),
         pa.array(np.fromiter((r.ts for r in batch), dtype=np.float64, count=len(batch))),
         tokens("input_tokens"),
         tokens("output_tokens")],
        schema=schema,
    )


def _write_parquet(fh: io.IOBase, requests: Iterable[Request], name: str, meta: Mapping[str, Any]) -> int:
    pa, pq = _pa()
    writer = None
    batch: list[Request] = []
    batch_tokens = 0
    n = 0
    sid_type = schema = None

    def flush() -> None:
        nonlocal writer
        table = _parquet_table(batch, sid_type, schema)
        if writer is None:
            writer = pq.ParquetWriter(fh, schema, compression="zstd")
        writer.write_table(table, row_group_size=len(batch))

    try:
        for req in requests:
            if schema is None:
                sid_type = pa.int64() if isinstance(req.session_id, int) else pa.string()
                schema = _parquet_schema(sid_type, name, meta)
            batch.append(req)
            batch_tokens += req.input_len + req.output_len
            n += 1
            if batch_tokens >= _ROW_GROUP_TOKENS or len(batch) >= _ROW_GROUP_ROWS:
                flush()
                batch, batch_tokens = [], 0
        if schema is None:  # an empty trace still gets a valid file with the schema
            sid_type = pa.int64()
            schema = _parquet_schema(sid_type, name, meta)
        if batch or writer is None:
            flush()
    finally:
        if writer is not None:
            writer.close()
    return n


def _parquet_schema(sid_type: Any, name: str, meta: Mapping[str, Any]) -> Any:
    pa, _ = _pa()
    return pa.schema(
        [("session_id", sid_type), ("turn_id", pa.int64()), ("ts", pa.float64()),
         ("input_tokens", pa.list_(pa.int32())), ("output_tokens", pa.list_(pa.int32()))],
        metadata={_PARQUET_META_KEY: json.dumps({"name": name, "meta": meta}, default=str).encode()},
    )


def write_trace(path: str | os.PathLike, trace: Trace | Iterable[Request], *, name: str | None = None,
                meta: Mapping[str, Any] | None = None) -> int:
    """Write a Trace (or any iterable of requests in arrival order) atomically; return the count.

    The format comes from the suffix (.jsonl, .jsonl.gz, .parquet). ``name``/``meta`` default to the
    Trace's; for JSONL they go to the sidecar ``<path>.meta.json``. Requests are streamed: an iterator
    is consumed once, one Parquet row group (about 4M tokens) is buffered at a time.

    Raises:
        ValueError: unknown suffix; requests out of ``ts`` order; mixed session id types (Parquet).
        Nothing is left at ``path`` (or its sidecar) when an error is raised.
    """
    fmt = trace_format(path)
    if isinstance(trace, Trace):
        name = trace.name if name is None else name
        meta = trace.meta if meta is None else meta
    name = name or ""
    meta = dict(meta or {})
    json.dumps(meta, default=str)  # fail before touching anything if meta cannot be stored
    stream = _checked_stream(trace)
    if fmt == "parquet":
        with atomic_write(path, "wb") as fh:
            n = _write_parquet(fh, stream, name, meta)
        return n
    if fmt == "jsonl.gz":
        with atomic_write(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, \
                io.TextIOWrapper(gz, encoding="utf-8") as text:
            n = _write_jsonl(text, stream)
    else:
        with atomic_write(path, "w") as fh:
            n = _write_jsonl(fh, stream)
    if is_stream(path):  # /dev/null, a pipe: there is no place beside it for a sidecar
        return n
    with atomic_write(_meta_path(path), "w") as fh:
        json.dump({"name": name, "meta": meta, "num_requests": n}, fh, indent=1, default=str)
        fh.write("\n")
    return n
