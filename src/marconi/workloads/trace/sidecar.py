"""The ``<trace>.meta.json`` sidecar holding a JSONL trace's ``name``, ``meta`` and ``num_requests``.

Only names, reads and renders it; :func:`~.files.write_trace` writes it with its trace and
:func:`~.files.stored_meta` checks its shape.
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
        TraceFormatError: a directory, not UTF-8 or not JSON (naming the sidecar and line).
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
