"""The ``<trace>.meta.json`` sidecar: where a format that cannot hold metadata (JSONL) keeps the
trace's ``name``, ``meta`` and ``num_requests``, so the JSONL itself stays loadable by the authors'
code.

This module only names, reads and renders the sidecar. Writing it *together with* its trace, so
that the two never disagree, is :func:`~.files.write_trace`'s job; checking the shape of what was
read is :func:`~.files.stored_meta`'s, which checks Parquet's embedded metadata the same way.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from marconi.core.jsonfile import JsonError, read_json

from .schema import TraceFormatError, TraceProblem

__all__ = ["META_SUFFIX", "sidecar_path", "read_sidecar", "sidecar_text"]

META_SUFFIX = ".meta.json"


def sidecar_path(path: str | os.PathLike) -> Path:
    """``<path>.meta.json``, beside the name given (a symlinked trace keeps its sidecar by the link)."""
    return Path(os.fspath(path) + META_SUFFIX)


def read_sidecar(path: Path) -> Any:
    """The decoded sidecar of the trace at ``path``, unchecked; ``{}`` when there is none.

    Raises:
        TraceFormatError: the sidecar is a directory, not UTF-8 or not JSON; the message names the
            sidecar (and its line) and says to fix or delete it.
    """
    sidecar = sidecar_path(path)
    if not sidecar.exists():
        return {}
    try:
        return read_json(sidecar)
    except JsonError as exc:
        line = _line_of(exc.where, sidecar)
        raise TraceFormatError(TraceProblem(str(sidecar), line, None, None,
                                            f"{exc.reason}; fix the sidecar or delete it (the trace then "
                                            "loads under its file name, with no meta)")) from None


def _line_of(where: str, sidecar: Path) -> int | None:
    """The line in ``where`` (``"<sidecar>:<line>"``), or None when it names the file alone."""
    prefix = f"{sidecar}:"
    tail = where[len(prefix):] if where.startswith(prefix) else ""
    return int(tail) if tail.isdigit() else None


def sidecar_text(name: str, meta: Mapping[str, Any], num_requests: int) -> str:
    """The sidecar's content: ``{"name", "meta", "num_requests"}``, indented, one trailing newline."""
    return json.dumps({"name": name, "meta": dict(meta), "num_requests": num_requests}, indent=1, default=str) + "\n"
