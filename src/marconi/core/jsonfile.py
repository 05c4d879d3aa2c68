"""Reading one JSON file, with errors that name the file and line (a model's ``config.json``).

The core's only file reading; :mod:`marconi.io` builds its JSONL readers and atomic writers on it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["JsonError", "check_readable", "read_json"]


class JsonError(ValueError):
    """A JSON(L) file could not be read; the message is ``where: reason`` (``where``: ``path:line``)."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason


def check_readable(path: Path) -> None:
    """FileNotFoundError for a missing file, JsonError for a directory."""
    if path.is_dir():
        raise JsonError(str(path), "is a directory, not a file")
    if not path.exists():
        raise FileNotFoundError(f"file not found: {path}")


def read_json(path: str | os.PathLike) -> Any:
    """The value of a whole JSON file, with errors as :class:`JsonError` naming file and line.

    Raises:
        FileNotFoundError: no such file.
        JsonError: a directory, bytes that are not UTF-8, invalid or absurdly nested JSON.
    """
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
