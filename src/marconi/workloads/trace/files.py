"""Trace files of any registered format (by suffix): streaming readers (one request or Parquet batch
in memory) and atomic writers; name and meta travel in the file or a ``<file>.meta.json`` sidecar,
written as a pair."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, Mapping

from marconi.core.jsonfile import described, not_regular
from marconi.io import atomic_write, is_stream

from . import jsonl, parquet  # noqa: F401  (each registers its formats in the table on import)
from .formats import TraceFormat, format_named, format_of, suffix_listing
from .schema import Record, Request, Trace, TraceFormatError, TraceProblem, TraceStats, check_limit
from .sidecar import META_SUFFIX, sidecar_path, sidecar_text

__all__ = ["trace_format", "iter_requests", "read_trace", "read_trace_meta", "stored_meta", "write_trace",
           "trace_stats", "checked_records", "not_a_trace_file", "problem", "META_SUFFIX"]


def _format(path: str | os.PathLike) -> tuple[TraceFormat, str]:
    """The format of ``path`` by suffix. ValueError for an empty path (``Path("")`` is the current
    directory), a directory without a trace suffix (said so, not "unknown format"), or an unknown suffix."""
    text = os.fspath(path)
    if not text.strip():
        raise ValueError(f"the trace path is empty ({text!r}): give a trace file ({suffix_listing()})")
    found = format_of(path)
    if found is None:
        if os.path.isdir(path):
            raise ValueError(f"{text} is a directory, not a trace file (a trace file ends in {suffix_listing()})")
        raise ValueError(f"{text}: unknown trace format (use {suffix_listing()})")
    return found


def trace_format(path: str | os.PathLike) -> str:
    """The format's name (``"jsonl"``, ``"jsonl.gz"``, ``"parquet"``) from the file name; ValueError otherwise."""
    return _format(path)[0].name


def not_a_trace_file(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be read as a trace, or None: only regular files (symlinks followed), since a
    trace is read more than once and devices or FIFOs cannot be."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None  # the caller says "not found"
    kind = not_regular(st)
    if kind is None:
        return None
    if kind == "a directory":
        return f"{os.fspath(path)} is a directory, not a trace file"
    return (f"{os.fspath(path)} is {kind}, not a regular file: traces are read from regular files only "
            "(save the stream to a file first, e.g. cat pipe > trace.jsonl)")


def checked_records(path: str | os.PathLike) -> tuple[str, Iterator[Record]]:
    """(format, every record of the file checked).

    Raises:
        ValueError: unknown suffix, or not a regular file, before anything is opened.
        FileNotFoundError: no such file.
    """
    fmt, _ = _format(path)
    p = Path(path)
    refusal = not_a_trace_file(p)
    if refusal is not None:
        raise ValueError(refusal)
    if not p.exists():
        raise FileNotFoundError(f"trace file not found: {os.fspath(path)}")
    return fmt.name, fmt.records(p)


def problem(label: str, fmt: str, pos: int, field_name: str | None, message: str,
            severity: str = "error") -> TraceProblem:
    """A problem at record ``pos`` of a file in format ``fmt``: a line (JSONL) or a row (Parquet)."""
    if format_named(fmt).position == "row":
        return TraceProblem(label, None, pos, field_name, message, severity)
    return TraceProblem(label, pos, None, field_name, message, severity)


def iter_requests(path: str | os.PathLike, limit: int | None = None) -> Iterator[Request]:
    """Stream the requests of a trace file. FileNotFoundError; ValueError for an unknown suffix;
    TraceFormatError at the first bad record (``file:line: field 'x': ...``)."""
    label = os.fspath(path)
    check_limit(limit)
    fmt, checked = checked_records(path)
    prev_ts = -math.inf
    count = 0
    for pos, fields, problems in checked:
        if limit is not None and count >= limit:
            return
        if problems:
            field_name, message = problems[0]
            raise TraceFormatError(problem(label, fmt, pos, field_name, message))
        if fields["ts"] < prev_ts:
            raise TraceFormatError(problem(label, fmt, pos, "ts",
                                            f"timestamp {fields['ts']} is earlier than the previous "
                                            f"request's {prev_ts}"))
        prev_ts = fields["ts"]
        yield Request(fields["session_id"], fields["turn_id"], fields["ts"],
                      fields["input_tokens"], fields["output_tokens"])
        count += 1


# ============================================================================ name and meta


def _stored_meta_problems(stored: Any) -> list[tuple[str | None, str]]:
    """What is wrong with a stored ``{"name": str|null, "meta": object|null, "num_requests": int >= 0}``."""
    if not isinstance(stored, dict):
        return [(None, f"expected a JSON object, got {described(stored)} (stored meta is "
                       '{"name": ..., "meta": {...}, "num_requests": ...})')]
    out: list[tuple[str | None, str]] = []
    name = stored.get("name")
    if name is not None and not isinstance(name, str):
        out.append(("name", f"expected a string (or null), got {described(name)}"))
    meta = stored.get("meta")
    if meta is not None and not isinstance(meta, dict):
        out.append(("meta", f"expected a JSON object (or null), got {described(meta)}"))
    if "num_requests" in stored:
        count = stored["num_requests"]
        if type(count) is not int or count < 0:
            out.append(("num_requests", f"expected an integer >= 0, got {described(count)}"))
    return out


def stored_meta(path: str | os.PathLike) -> tuple[str, dict[str, Any]]:
    """(where it is stored: the sidecar or the file, the checked ``{"name", "meta", ...}``); ``{}`` if none.

    Raises:
        ValueError: unknown suffix.
        TraceFormatError: unreadable or wrongly shaped; names the file and field, says to fix or delete it.
    """
    fmt, _ = _format(path)
    p = Path(path)
    where = str(sidecar_path(p)) if fmt.sidecar else os.fspath(path)
    stored = fmt.read_meta(p)
    problems = _stored_meta_problems(stored)
    if problems:
        field_name, message = problems[0]
        fix = ("fix the sidecar or delete it (the trace then loads under its file name, with no meta)"
               if fmt.sidecar else "rewrite the file with write_trace")
        raise TraceFormatError(TraceProblem(where, None, None, field_name, f"{message}; {fix}"))
    return where, stored


def read_trace_meta(path: str | os.PathLike) -> tuple[str, dict[str, Any]]:
    """(name, meta) stored with a trace file; the file stem and ``{}`` when there is none.

    Raises:
        ValueError: unknown suffix; TraceFormatError: a malformed sidecar (see :func:`stored_meta`).
    """
    _, suffix = _format(path)
    stem = Path(path).name[: -len(suffix)]
    _, stored = stored_meta(path)
    return str(stored.get("name") or stem), dict(stored.get("meta") or {})


def read_trace(path: str | os.PathLike, limit: int | None = None) -> Trace:
    """Load a trace file (all of it, or its first ``limit`` requests). Errors as :func:`iter_requests`
    and :func:`read_trace_meta`."""
    name, meta = read_trace_meta(path)
    return Trace(list(iter_requests(path, limit=limit)), name=name, meta=meta)


def trace_stats(source: str | os.PathLike | Trace) -> TraceStats:
    """Stats of a Trace or of a trace file (streamed: only lengths are kept)."""
    if isinstance(source, Trace):
        return source.stats()
    return TraceStats.from_requests(iter_requests(source))


# ============================================================================ writing


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


def write_trace(path: str | os.PathLike, trace: Trace | Iterable[Request], *, name: str | None = None,
                meta: Mapping[str, Any] | None = None) -> int:
    """Write a Trace (or requests in arrival order) atomically by suffix, with its meta (JSONL: the
    sidecar, as a pair); streams. Returns the count. ValueError for an unknown suffix, requests out of
    ``ts`` order or mixed session id types (Parquet); on any error nothing at ``path`` changes."""
    fmt, _ = _format(path)
    if isinstance(trace, Trace):
        name = trace.name if name is None else name
        meta = trace.meta if meta is None else meta
    name = name or ""
    meta = dict(meta or {})
    sidecar_text(name, meta, 0)  # fail before touching anything if meta cannot be stored
    stream = _checked_stream(trace)
    if not fmt.sidecar or is_stream(path):  # /dev/null, a pipe: there is no place beside it for a sidecar
        with atomic_write(path, "wb") as fh:
            return fmt.write(fh, stream, name, meta)
    return _write_with_sidecar(path, fmt, stream, name, meta)


def _write_with_sidecar(path: str | os.PathLike, fmt: TraceFormat, stream: Iterator[Request], name: str,
                        meta: dict[str, Any]) -> int:
    """Write trace and sidecar so readers never find a new one beside an old one.

    The trace is flushed to its temp file first (a full disk fails here), then the sidecar is
    committed, then the trace; if the trace's commit fails the old sidecar (kept in memory) is put
    back. Only a crash between the two renames can mismatch them.
    """
    sidecar = sidecar_path(path)
    old_sidecar = sidecar.read_bytes() if sidecar.is_file() else None
    sidecar_committed = False
    try:
        with atomic_write(path, "wb") as fh:
            n = fmt.write(fh, stream, name, meta)
            _flush_to_disk(fh)
            with atomic_write(sidecar, "w") as side:
                side.write(sidecar_text(name, meta, n))
            sidecar_committed = True
    except BaseException as exc:
        if sidecar_committed:
            _restore_sidecar(sidecar, old_sidecar, exc)
        raise
    return n


def _flush_to_disk(fh: IO[bytes]) -> None:
    fh.flush()
    os.fsync(fh.fileno())


def _restore_sidecar(sidecar: Path, old: bytes | None, exc: BaseException) -> None:
    """Put the sidecar back as it was (``None``: there was none); a failure is noted on ``exc``."""
    try:
        if old is None:
            sidecar.unlink(missing_ok=True)
        else:
            with atomic_write(sidecar, "wb") as fh:
                fh.write(old)
    except OSError as undo:
        exc.add_note(f"{sidecar} could not be restored ({undo}); it now describes a trace that was not "
                     "written: delete it or write the trace again")
