"""The canonical request trace: schema, JSONL and Parquet I/O, and checks.

:mod:`.schema` (``Request``, ``Trace``, valid records), :mod:`.formats` (the format table),
:mod:`.files` (streaming reads, atomic writes of any format), :mod:`.jsonl` and :mod:`.parquet`
(the formats), :mod:`.sidecar` (JSONL meta), :mod:`.checks` (validation). Every public name is
importable from here and from :mod:`marconi.workloads`.
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
