"""Reading one JSON file, with errors that name the file and line (a model's ``config.json``).

The core's only file reading; :mod:`marconi.io` builds its JSONL readers and atomic writers on it.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

__all__ = ["JsonError", "check_readable", "read_json", "not_regular"]


class JsonError(ValueError):
    """A JSON(L) file could not be read; the message is ``where: reason`` (``where``: ``path:line``)."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISBLK, "a block device"))


def not_regular(st: os.stat_result) -> str | None:
    """What a file with stat ``st`` is, if it is not a regular file (``"a FIFO (named pipe)"``), else None."""
    for test, kind in _KINDS:
        if test(st.st_mode):
            return kind
    return None if stat.S_ISREG(st.st_mode) else "not a regular file"


def check_readable(path: Path) -> None:
    """FileNotFoundError for a missing file, JsonError for anything but a regular file (symlinks are
    followed): a device may never end and a FIFO blocks and is read only once."""
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(f"file not found: {path}") from None
    kind = not_regular(st)
    if kind == "a directory":
        raise JsonError(str(path), "is a directory, not a file")
    if kind is not None:
        raise JsonError(str(path), f"is {kind}, not a regular file: only regular files are read "
                                   "(save the stream to a file first)")


def read_json(path: str | os.PathLike) -> Any:
    """The value of a whole JSON file. FileNotFoundError for no such file; :class:`JsonError` naming
    file and line for a non-regular file, bytes that are not UTF-8, invalid or absurdly nested JSON."""
    p = Path(path)
    check_readable(p)
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise JsonError(f"{p}:{line}", f"not UTF-8 text (byte 0x{raw[exc.start]:02x})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise JsonError(f"{p}:{exc.lineno}", f"invalid JSON: {exc.msg} (column {exc.colno})") from None
    except RecursionError:
        raise JsonError(str(p), "JSON nested too deeply to decode") from None
