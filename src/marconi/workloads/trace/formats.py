"""The table of trace file formats: each format module registers what it reads and writes.

A format is found by suffix (:func:`format_of`); adding one is a module calling
:func:`register_format`, imported by :mod:`.files`. Not a :class:`marconi.core.registry.Registry`:
a format has no parameters, is chosen by suffix, and is a bundle of functions.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator, Literal, Mapping

from .schema import Record, Request

__all__ = ["TraceFormat", "register_format", "unregister_format", "format_of", "format_named", "format_names",
           "suffix_listing"]

RecordReader = Callable[[Path], Iterator[Record]]
"""``path -> (position, fields, problems)`` per record, every record checked by :func:`~.schema.check_record`."""
Writer = Callable[[IO[bytes], Iterable[Request], str, Mapping[str, Any]], int]
"""``(binary stream, requests, name, meta) -> count``; the stream is committed by the caller."""
MetaReader = Callable[[Path], Any]
"""``path -> the stored {"name", "meta", ...} value, unchecked`` (``{}`` when none is stored)."""


@dataclass(frozen=True, slots=True)
class TraceFormat:
    """One trace file format: ``suffixes`` (longest match wins), ``records`` (streaming; problems, not
    raises), ``write`` (into a binary stream it must not close), ``read_meta``, ``sidecar`` (meta in
    ``<file>.meta.json``), ``position`` (``line`` 1-based or ``row`` 0-based)."""

    name: str
    suffixes: tuple[str, ...]
    records: RecordReader
    write: Writer
    read_meta: MetaReader
    sidecar: bool = False
    position: Literal["line", "row"] = "line"

    def __post_init__(self) -> None:
        if not self.suffixes or any(not s.startswith(".") or s != s.lower() for s in self.suffixes):
            raise ValueError(f"trace format {self.name!r}: suffixes must be lower-case and start with '.', "
                             f"got {self.suffixes!r}")
        if self.position not in ("line", "row"):
            raise ValueError(f"trace format {self.name!r}: position must be 'line' or 'row', got {self.position!r}")


_FORMATS: dict[str, TraceFormat] = {}


def register_format(fmt: TraceFormat) -> TraceFormat:
    """Add ``fmt`` to the table; ValueError if its name or one of its suffixes is taken."""
    if fmt.name in _FORMATS:
        raise ValueError(f"trace format {fmt.name!r} registered twice")
    taken = {s: other.name for other in _FORMATS.values() for s in other.suffixes}
    for suffix in fmt.suffixes:
        if suffix in taken:
            raise ValueError(f"trace format {fmt.name!r}: suffix {suffix!r} is already {taken[suffix]!r}'s")
    _FORMATS[fmt.name] = fmt
    return fmt


def unregister_format(name: str) -> None:
    """Remove the format called ``name`` (a test's or a plugin's own); KeyError if it is not registered."""
    format_named(name)
    del _FORMATS[name]


def format_names() -> list[str]:
    """Registered format names, in registration order."""
    return list(_FORMATS)


def format_named(name: str) -> TraceFormat:
    """The format called ``name``; KeyError listing the registered ones otherwise."""
    try:
        return _FORMATS[name]
    except KeyError:
        raise KeyError(f"unknown trace format {name!r}; registered: {', '.join(_FORMATS)}") from None


def suffix_listing() -> str:
    """``".jsonl, .jsonl.gz or .parquet"``: every registered suffix, for messages."""
    suffixes = [s for fmt in _FORMATS.values() for s in fmt.suffixes]
    if len(suffixes) <= 1:
        return "".join(suffixes)
    return ", ".join(suffixes[:-1]) + " or " + suffixes[-1]


def format_of(path: str | os.PathLike) -> tuple[TraceFormat, str] | None:
    """(format, matched suffix) of a file name by its longest matching suffix; None if none matches."""
    name = os.fspath(path).lower()
    best: tuple[TraceFormat, str] | None = None
    for fmt in _FORMATS.values():
        for suffix in fmt.suffixes:
            if name.endswith(suffix) and (best is None or len(suffix) > len(best[1])):
                best = (fmt, suffix)
    return best
