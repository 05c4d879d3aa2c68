"""The canonical request trace: schema, JSONL and Parquet I/O, and checks.

* :mod:`.schema` -- :class:`Request` (the one request type: traces, the simulator and the
  builders all use it), :class:`Trace`, :class:`TraceStats`, the errors, and what a valid
  on-disk record is (:func:`~.schema.check_record`).
* :mod:`.formats` -- the table of formats (:class:`~.formats.TraceFormat`: suffixes, reader,
  writer, meta reader); each format module registers its own, so a new format is one new module.
* :mod:`.files` -- the format from the suffix; :func:`iter_requests` / :func:`read_trace` stream
  any format, :func:`write_trace` writes any format atomically (name and meta included, a JSONL
  trace and its sidecar as a pair).
* :mod:`.jsonl` -- JSONL lines (``jsonl``, ``jsonl.gz``), with a NumPy fast path for the token lists
  that reads exactly what ``json.loads`` reads.
* :mod:`.parquet` -- Parquet row groups (``parquet``; PyArrow, imported only when used).
* :mod:`.sidecar` -- the ``<file>.meta.json`` that holds a JSONL trace's name and meta.
* :mod:`.checks` -- :func:`inspect_trace` / :func:`validate_trace` (every problem of a file, with
  its line) and :class:`SessionCheck` (the warnings ``marconi trace validate`` prints).

Every public name is importable from here and from :mod:`marconi.workloads`.
"""


from .checks import SessionCheck, inspect_trace, session_warnings, validate_trace
from .files import iter_requests, read_trace, read_trace_meta, trace_format, trace_stats, write_trace
from .formats import TraceFormat, register_format
from .schema import Request, SessionId, Trace, TraceFormatError, TraceProblem, TraceStats

__all__ = [
    "Request",
    "Trace",
    "TraceStats",
    "TraceFormatError",
    "TraceProblem",
    "SessionId",
    "iter_requests",
    "read_trace",
    "read_trace_meta",
    "write_trace",
    "validate_trace",
    "inspect_trace",
    "SessionCheck",
    "session_warnings",
    "trace_stats",
    "trace_format",
    "TraceFormat",
    "register_format",
]
