"""Reading one JSON file, with errors that name the file and line (a model's ``config.json``).

The core's only file reading; :mod:`marconi.io` builds its JSONL readers and atomic writers on it.
:func:`json_kind` and :func:`described` are the one wording every message uses for a decoded JSON
value that has the wrong type (``expected a string, got a list``).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from marconi.core.registry import brief_repr

__all__ = ["JsonError", "check_readable", "read_json", "not_regular", "json_kind", "described"]


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
    file and line for a non-regular file, bytes that are not UTF-8, invalid or absurdly nested JSON, or an
    integer too long to convert. A leading byte-order mark is skipped."""
    p = Path(path)
    check_readable(p)
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8-sig")       # a byte-order mark, which some editors write, is not JSON's
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise JsonError(f"{p}:{line}", f"not UTF-8 text (byte 0x{raw[exc.start]:02x})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise JsonError(f"{p}:{exc.lineno}", f"invalid JSON: {exc.msg} (column {exc.colno})") from None
    except RecursionError:
        raise JsonError(str(p), "JSON nested too deeply to decode") from None
    except ValueError as exc:                # an integer of more than 4,300 digits
        raise JsonError(str(p), f"invalid JSON value: {exc}") from None


# Checked in this order: bool before int (True is an int), and subclasses read as their JSON kind.
_JSON_KINDS = ((bool, "a bool"), (int, "an integer"), (float, "a number"), (str, "a string"),
               (list, "a list"), (dict, "an object"))


def json_kind(value: Any) -> str:
    """The JSON kind of a decoded value, with its article, as a message names it: ``"null"``,
    ``"a bool"``, ``"an integer"``, ``"a number"`` (a float, NaN and infinities included),
    ``"a string"``, ``"a list"`` or ``"an object"``; a subclass reads as its base (an ``OrderedDict``
    is an object). Anything ``json.loads`` never returns reads ``"a Python <type>"`` with the type's
    module named unless it is a builtin (``"a Python tuple"``, ``"a Python numpy.ndarray"``), so it
    cannot be taken for a JSON kind.
    """
    if value is None:
        return "null"
    for kind, name in _JSON_KINDS:
        if isinstance(value, kind):
            return name
    cls = type(value)
    module = "" if cls.__module__ == "builtins" else cls.__module__.partition(".")[0] + "."
    return f"a Python {module}{cls.__qualname__}"


def described(value: Any) -> str:
    """``value`` as a message shows what it got: :func:`json_kind`, and for anything but null, a
    list or an object also the value itself, cut by ``brief_repr`` (``"a string ('1,2')"``,
    ``"an integer (-3)"``, ``"a list"``, ``"null"``): a container's kind says enough, and its
    contents could fill the message.
    """
    kind = json_kind(value)
    if value is None or isinstance(value, (list, dict)):
        return kind
    return f"{kind} ({brief_repr(value)})"
