"""The trace schema: :class:`Request`, :class:`Trace`, :class:`TraceStats`, the errors, and
:func:`check_record`, the one definition of a valid on-disk record both readers use (fields in
docs/data.md, "Trace files")."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, NamedTuple

import numpy as np

from marconi.core.jsonfile import described
from marconi.core.registry import brief_repr

__all__ = ["Request", "Trace", "TraceStats", "TraceFormatError", "TraceProblem", "SessionId", "INT32_MAX",
           "Record", "check_limit", "check_record"]

INT32_MAX = 2**31 - 1
SessionId = int | str
Record = tuple[int, dict[str, Any], list[tuple[str | None, str]]]
"""What a reader yields per record: (position: 1-based line or 0-based row, fields, problems as (field, message))."""


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
    """One LLM call: ``session_id`` (int or str), ``turn_id`` (>= 0), ``ts`` (arrival, seconds, finite
    >= 0), ``input_tokens`` (the whole history plus the new message, non-empty) and ``output_tokens``,
    stored as read-only int32 views (a session may share one buffer)."""

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
    """An in-memory trace: requests in arrival order, a name and a ``meta`` dict (source, recipe
    parameters). Out-of-order requests raise ValueError; :meth:`from_unsorted` sorts stably first."""

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
        check_limit(n)
        return Trace(self.requests[:n], name=self.name, meta=dict(self.meta))

    def stats(self) -> TraceStats:
        return TraceStats.from_requests(self.requests)


def check_limit(limit: int | None) -> None:
    """``limit`` means "the first ``limit`` requests": None (all) or an int >= 0 (0: none)."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 0):
        raise ValueError(f"limit must be None or an int >= 0, got {limit!r}")


# ============================================================================ record checking


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_token_list(value: Any, name: str) -> tuple[np.ndarray | None, str | None]:
    """Convert a decoded JSON token list; return (array, None) or (None, problem message)."""
    if not isinstance(value, list):
        return None, f"expected a list of integers, got {described(value)}"
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
            return None, f"element {i} is not an integer ({brief_repr(x, 40)})"
        if x < 0:
            return None, f"element {i} is negative ({x})"
        if x > INT32_MAX:
            return None, f"element {i} ({x}) does not fit int32 (max {INT32_MAX})"
    return None, "unreadable token list"  # pragma: no cover - unreachable


def check_record(obj: Any, tokens: Mapping[str, np.ndarray] | None = None,
                  skip: set[str] | frozenset[str] = frozenset()
                  ) -> tuple[dict[str, Any], list[tuple[str | None, str]]]:
    """Check one decoded record; returns (converted fields, problems as (field, message)).

    ``tokens``: token arrays parsed elsewhere, replacing ``obj``'s entries; a token field in ``skip``
    but not in ``tokens`` was already reported.
    """
    problems: list[tuple[str | None, str]] = []
    out: dict[str, Any] = {}
    if not isinstance(obj, dict):
        return out, [(None, f"expected a JSON object, got {described(obj)}")]

    sid = obj.get("session_id")
    if "session_id" not in obj:
        problems.append(("session_id", "missing"))
    elif not (_is_int(sid) or isinstance(sid, str)):
        problems.append(("session_id", f"expected an integer or a string, got {described(sid)}"))
    else:
        out["session_id"] = sid

    turn = obj.get("turn_id")
    if "turn_id" not in obj:
        problems.append(("turn_id", "missing"))
    elif not _is_int(turn):
        problems.append(("turn_id", f"expected an integer, got {described(turn)}"))
    elif turn < 0:
        problems.append(("turn_id", f"must be >= 0, got {turn}"))
    else:
        out["turn_id"] = turn

    ts = obj.get("ts")
    if "ts" not in obj:
        problems.append(("ts", "missing"))
    elif isinstance(ts, bool) or not isinstance(ts, (int, float)):
        problems.append(("ts", f"expected a number of seconds, got {described(ts)}"))
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
                problems.append((count_name, f"expected an integer, got {described(count)}"))
            elif length is not None and count != length:
                problems.append((count_name, f"says {count} but {name} has {length} tokens"))
    return out, problems
