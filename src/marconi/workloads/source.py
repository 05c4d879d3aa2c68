"""One way for every command to name its trace: a trace file or a catalog workload (:func:`load_trace`)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from marconi.core.registry import ConfigError, ParsedName

from .catalog import Provenance, build_workload, is_workload, workload_names
from .raw import RAW_SOURCES, first_record, raw_source_of
from .trace import Trace, read_trace
from .trace.formats import format_of, suffix_listing

__all__ = ["load_trace", "check_trace_name", "trace_file_kind", "shortfall", "TOKEN_TRACE"]

#: :func:`trace_file_kind` of a token trace file, which is read (and streamed) by its suffix's reader.
TOKEN_TRACE = "token-trace"


def trace_file_kind(path: str | Path) -> str | None:
    """How :func:`load_trace` reads the file at ``path``: ``"recording"`` (a vLLM block-hash
    recording), ``"mooncake"`` (a Mooncake block-hash trace, ``.jsonl`` or ``.json``), a raw source's catalog entry (a key of
    :data:`~marconi.workloads.raw.RAW_SOURCES`, by its first record), :data:`TOKEN_TRACE` (by its
    suffix), or None (not a regular file, or none of these). Reads at most the first record."""
    from .recording import is_mooncake_file, is_recording   # hash-id traces (issue 32)

    p = Path(path)
    if is_recording(p):
        return "recording"
    # Mooncake's own files are .jsonl; one saved as .json (still a line per request) is read alike
    if p.name.lower().endswith((".jsonl", ".jsonl.gz", ".json")) and is_mooncake_file(p):
        return "mooncake"
    kind = raw_source_of(p)
    if kind is not None:
        return kind
    if not p.is_file() or format_of(p) is None or _foreign_fields(p) is not None:
        return None
    return TOKEN_TRACE


#: Fields of which a token trace's every line has at least one (the rest are checked by its reader).
_TOKEN_FIELDS = frozenset({"session_id", "turn_id", "input_tokens"})


def _foreign_fields(path: Path) -> list[str] | None:
    """The fields of a JSONL file's first record where it is an object with none of a token trace's,
    so that the file is no token trace of any sort (else None)."""
    if not path.name.lower().endswith((".jsonl", ".jsonl.gz")):
        return None
    first = first_record(path)
    return sorted(map(str, first)) if isinstance(first, dict) and not _TOKEN_FIELDS & first.keys() else None


def shortfall(trace: Trace) -> str | None:
    """A sentence saying why a trace built from raw sessions (ShareGPT, LMSys, agent trajectories) has
    fewer sessions than its ``num_sessions`` parameter asked, and which filter to loosen, or that a
    block-hash trace stopped at its request limit before the file's end; None when it has them all,
    asked for all, or was not built so (its ``meta`` lacks the counts)."""
    meta = trace.meta or {}
    if meta.get("more_in_file") and meta.get("files"):      # a block-hash trace read to its request limit
        return (f"the first {meta['num_rows']:,} requests of {meta['files'][0]}, which holds more "
                "(requests=N reads more; --trace FILE, without the catalog name, reads it all)")
    asked = (meta.get("params") or {}).get("num_sessions")
    got, records = meta.get("num_sessions"), meta.get("records")
    if asked is None or got is None or not isinstance(records, dict) or got >= asked:
        return None
    read = records.get("records_read", 0)
    if records.get("without_calls"):
        empty = (f"; {records['without_calls']} of the {got} yield no request (no assistant message after "
                 "their first)")
    elif records.get("without_turns"):
        empty = f"; {records['without_turns']} of the {got} yield no request (no user message answered)"
    else:
        empty = ""
    if "too_few_messages" not in records:     # trajectories: each one is a session
        return f"{got} sessions, not the {asked} asked: the input holds {read} trajectories{empty}"
    params, why = meta["params"], []
    if records["too_few_messages"]:
        why.append(f"{records['too_few_messages']} with fewer than {2 * params.get('min_rounds', 0)} messages "
                   "(loosen with --min-rounds, or min_rounds= on a catalog name)")
    if records.get("too_much_non_ascii"):
        why.append(f"{records['too_much_non_ascii']} with more than {params.get('max_non_ascii_frac')} of their "
                   "characters non-ASCII (the paper's filter; --max-non-ascii on `marconi trace build`)")
    if not why:
        return f"{got} sessions, not the {asked} asked: the input holds {read} records{empty}"
    return f"{got} sessions, not the {asked} asked: of the input's {read} records, {' and '.join(why)}{empty}"


def check_trace_name(text: str) -> None:
    """What :func:`load_trace` refuses before it reads anything, without reading: ConfigError unless
    ``text`` is a catalog workload or an existing path (a command checks its traces before its runs)."""
    if not text.strip():  # Path("") is the current directory, which exists
        raise ConfigError(f"the trace is empty ({text!r}): give a trace file or a catalog workload "
                          f"({', '.join(workload_names())}; `marconi trace list` describes them)")
    if not is_workload(text) and not Path(text).exists():
        raise ConfigError(f"trace {text!r} is neither a file nor a catalog workload ({', '.join(workload_names())}; "
                          "`marconi trace list` describes them)")


def load_trace(text: str, limit: int | None = None, *, notice: Callable[[str], None] | None = None) -> Trace:
    """A catalog workload or a file: a token trace (JSONL/Parquet), a block-hash recording or Mooncake
    trace, or a raw source (ShareGPT, LMSys, agent trajectories, QuALITY: :mod:`.raw`), built by its
    catalog recipe's defaults; ``limit``: the first requests (None: all; 0: none); ``notice``: told when
    a stand-in replaced absent data, or a raw source was built. ConfigError for an empty text or one that
    is neither a file nor a name; TraceFormatError or JsonError for an invalid file."""
    check_trace_name(text)
    if is_workload(text):
        trace = build_workload(text)
        provenance = Provenance.of(trace)
        if notice is not None and provenance is not None and provenance.fallback:
            notice(f"trace {text}: {provenance.describe()}")
        elif notice is not None and (short := shortfall(trace)) is not None:  # a stand-in's note says why
            notice(f"trace {text}: {short}")
        return trace.head(limit) if limit is not None else trace
    path = Path(text)
    kind = trace_file_kind(path)
    if kind == "recording":
        from .recording import build_recording_trace

        return build_recording_trace(path, limit=limit)
    if kind == "mooncake":
        from .mooncake import build_mooncake_trace

        return build_mooncake_trace(path, limit=limit)
    if kind in RAW_SOURCES:            # a raw source: built by its catalog recipe, as `trace build` would
        trace = build_workload(ParsedName(kind, {}), files=[text])
        if notice is not None:
            notice(f"trace {text}: {RAW_SOURCES[kind]}, not a token trace: built by the catalog's {kind!r} recipe "
                   f"with its defaults ({Provenance.of(trace).describe()}); set them on the name "
                   f"(--trace {kind}:files=PATH,...: `marconi trace list`) or write the trace once with "
                   f"`marconi trace build {kind}`"
                   + (f"; {short}" if (short := shortfall(trace)) is not None else ""))
        return trace.head(limit) if limit is not None else trace
    if kind is None and path.is_file():
        fields = _foreign_fields(path)
        seen = "" if not fields else (f" (its first record's fields: {', '.join(fields[:12])}"
                                      + (", ..." if len(fields) > 12 else "") + ")")
        raise ConfigError(f"{text}: neither a token trace ({suffix_listing()}) nor a raw source its first record "
                          f"identifies{seen} ({'; '.join(f'{k}: {v}' for k, v in RAW_SOURCES.items())}); "
                          "`marconi trace build --help` lists the sources it converts")
    return read_trace(path, limit=limit)
