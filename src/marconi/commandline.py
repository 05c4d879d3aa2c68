"""What command modules share beyond option types: the trace loader with its stderr notices, the
files a command reads (for its output guard), comma lists. Below :mod:`marconi.cli`, so command
modules never import the CLI."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from marconi.core.registry import ConfigError

__all__ = ["load_trace", "read_files", "comma_list"]


def load_trace(text: str, limit: int | None = None) -> Any:
    """:func:`marconi.workloads.load_trace`, with its notices on stderr as ``NOTE:`` lines."""
    from marconi.workloads import load_trace as load

    return load(text, limit, notice=lambda line: print(f"NOTE: {line}", file=sys.stderr))


def read_files(*, traces: Sequence[str | None] = (), models: Sequence[str | None] = (),
               files: Sequence[str | None] = ()) -> list[str]:
    """Every existing file (or model directory) a command reads, for ``check_output(inputs=...)``: trace
    files with their sidecars (a trace file's sidecar even where it does not exist yet), model paths,
    and ``files`` (a ``table:`` prefix dropped); catalog and preset names name no file."""
    from marconi.workloads.trace.files import META_SUFFIX

    def items(texts: Sequence[str | None]) -> list[str]:
        return [i.strip().removeprefix("table:") for t in texts for i in (t or "").split(",") if i.strip()]

    out = [p for t in traces if t for p in (t, t + META_SUFFIX)]
    out += items(models) + items(files)
    # a trace file's sidecar counts even before it exists: an output written there breaks the trace
    sidecars = {t + META_SUFFIX for t in traces if t and Path(t).is_file()}
    return [p for p in dict.fromkeys(out) if Path(p).exists() or p in sidecars]


def comma_list(text: Any, flag: str, kind: Callable[[str], Any]) -> list[Any] | None:
    """``--flag a,b,c`` as ``[kind(item), ...]`` (None if not given; an already split list passes).

    Raises:
        ConfigError: naming ``flag``, for an item ``kind`` refuses or an empty list.
    """
    if text is None:
        return None
    if isinstance(text, (list, tuple)):  # checked by the option's type already
        return list(text)
    out = []
    for item in (s.strip() for s in str(text).split(",")):
        try:
            out.append(kind(item))
        except ValueError:
            raise ConfigError(f"{flag}: {item!r} is not a valid value (a comma list of {kind.__name__})") from None
    if not out:
        raise ConfigError(f"{flag}: give at least one value")
    return out
