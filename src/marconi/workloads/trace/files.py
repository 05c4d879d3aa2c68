"""Trace files: the format from the suffix, streaming readers and atomic writers for every format.

Reading streams: :func:`iter_requests` yields one :class:`~.schema.Request` at a time (JSONL line by
line, Parquet batch by batch), so memory is bounded by one request (one batch) plus what the caller
keeps. A trace's ``name`` and ``meta`` (recipe, parameters, provenance) travel in the Parquet schema
metadata, and for JSONL in a sidecar ``<file>.meta.json`` (so the JSONL itself stays loadable by the
authors' code). Writing is atomic (:func:`marconi.io.atomic_write`): a temp file in the target
directory is renamed over the target only once it is complete; on any error it is removed and the
target is untouched.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from marconi.io import atomic_write, is_stream

from .jsonl import jsonl_records, write_jsonl
from .parquet import parquet_records, read_parquet_meta, write_parquet
from .schema import Record, Request, Trace, TraceFormatError, TraceProblem, TraceStats, check_limit

__all__ = ["trace_format", "iter_requests", "read_trace", "read_trace_meta", "write_trace", "trace_stats",
           "checked_records", "problem", "META_SUFFIX"]

META_SUFFIX = ".meta.json"


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


def checked_records(path: str | os.PathLike) -> tuple[str, Iterator[Record]]:
    """(format, every record of the file checked): what :func:`iter_requests` and the checks read."""
    fmt = trace_format(path)
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{os.fspath(path)} is a directory, not a trace file")
    if not p.exists():
        raise FileNotFoundError(f"trace file not found: {os.fspath(path)}")
    if fmt == "parquet":
        return fmt, parquet_records(p)
    return fmt, jsonl_records(p)


def problem(label: str, fmt: str, pos: int, field_name: str | None, message: str,
            severity: str = "error") -> TraceProblem:
    """A problem at record ``pos``: a line of a JSONL file, a row of a Parquet file."""
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
        stored = read_parquet_meta(p)
    else:
        mp = _meta_path(p)
        if mp.exists():
            stored = json.loads(mp.read_text(encoding="utf-8"))
    return str(stored.get("name") or stem), dict(stored.get("meta") or {})


def read_trace(path: str | os.PathLike, limit: int | None = None) -> Trace:
    """Load a trace file (all of it, or its first ``limit`` requests). Errors as :func:`iter_requests`."""
    name, meta = read_trace_meta(path)
    return Trace(list(iter_requests(path, limit=limit)), name=name, meta=meta)


def trace_stats(source: str | os.PathLike | Trace) -> TraceStats:
    """Stats of a Trace or of a trace file (streamed: only lengths are kept)."""
    if isinstance(source, Trace):
        return source.stats()
    return TraceStats.from_requests(iter_requests(source))


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
            n = write_parquet(fh, stream, name, meta)
        return n
    if fmt == "jsonl.gz":
        with atomic_write(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, \
                io.TextIOWrapper(gz, encoding="utf-8") as text:
            n = write_jsonl(text, stream)
    else:
        with atomic_write(path, "w") as fh:
            n = write_jsonl(fh, stream)
    if is_stream(path):  # /dev/null, a pipe: there is no place beside it for a sidecar
        return n
    with atomic_write(_meta_path(path), "w") as fh:
        json.dump({"name": name, "meta": meta, "num_requests": n}, fh, indent=1, default=str)
        fh.write("\n")
    return n
