"""JSONL traces: reading records line by line (with a regex fast path for the token lists) and
writing requests as lines.

The fast path cuts the two token lists out of a line with a regex and parses them with NumPy, so
a 32k-token line never becomes 32k Python ints; ``json`` decodes the rest. Any doubt (a key seen
twice, an odd element, the key nested somewhere else) falls back to ``json`` for the whole line,
and :func:`~.schema.check_record` judges both paths' results alike.
"""

from __future__ import annotations

import io
import json
import os
import re
import warnings
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from marconi.io import JsonError, decode_line, iter_lines, loads

from .schema import INT32_MAX, Record, Request, check_record

__all__ = ["jsonl_records", "write_jsonl"]


# ============================================================================ JSONL decoding

_TOKEN_LIST_RE = re.compile(r'"(input_tokens|output_tokens)"\s*:\s*\[([^\[\]]*)\]')


class _Fallback(Exception):
    pass


def _parse_int_list(text: str) -> np.ndarray:
    """Parse ``"1, 2, 3"`` at C speed; raise _Fallback unless it is a clean list of int32 >= 0."""
    if not text.strip():
        return np.zeros(0, dtype=np.int32)
    if "+" in text:
        raise _Fallback
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # numpy < 2 warns on partial reads
            arr = np.fromstring(text, dtype=np.int64, sep=",")
    except ValueError:
        raise _Fallback from None
    if arr.size != text.count(",") + 1:
        raise _Fallback
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) > INT32_MAX):
        raise _Fallback
    return arr.astype(np.int32)


def _fast_decode(line: str) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """Decode a well-formed line without building Python ints for the tokens; None to fall back.

    The token lists are cut out with a regex, the rest is decoded by ``json``. Any doubt (a key seen
    twice, an odd element, the key nested somewhere else) returns None and the slow path decides.
    """
    lists: dict[str, str] = {}

    def cut(match: re.Match[str]) -> str:
        key = match.group(1)
        if key in lists:
            raise _Fallback
        lists[key] = match.group(2)
        return f'"{key}": 0'

    try:
        rest = _TOKEN_LIST_RE.sub(cut, line)
        if len(lists) != 2:
            return None
        obj = json.loads(rest)
        if not isinstance(obj, dict) or obj.get("input_tokens") != 0 or obj.get("output_tokens") != 0:
            return None
        if type(obj["input_tokens"]) is not int or type(obj["output_tokens"]) is not int:
            return None
        tokens = {key: _parse_int_list(text) for key, text in lists.items()}
    except (_Fallback, ValueError, RecursionError):
        return None
    return obj, tokens


def _decode_line(line: str, where: str) -> tuple[dict[str, Any], list[tuple[str | None, str]]]:
    fast = _fast_decode(line)
    if fast is not None:
        return check_record(*fast)
    try:
        obj = loads(line, where)
    except JsonError as exc:
        return {}, [(None, exc.reason)]
    return check_record(obj)


def jsonl_records(path: Path) -> Iterator[Record]:
    """Yield (1-based line, fields, problems) for each non-blank line.

    Lines are decoded one at a time (:func:`marconi.io.iter_lines`), so a bad byte is a problem of
    its own line and reading goes on; an unreadable stream (corrupt gzip) ends the file with one.
    """
    label = os.fspath(path)
    lineno = 0
    try:
        for lineno, raw in iter_lines(path):
            if not raw.strip():
                continue
            where = f"{label}:{lineno}"
            try:
                line = decode_line(raw, where)
            except JsonError as exc:
                yield lineno, {}, [(None, exc.reason)]
                continue
            yield (lineno, *_decode_line(line, where))
    except JsonError as exc:
        yield lineno + 1, {}, [(None, exc.reason)]


# ============================================================================ JSONL encoding


_ID_STRINGS: list[str] = []


def _join_ids(arr: np.ndarray) -> str:
    """``"1, 2, 3"``; ids below 2**17 come from a string table (2.5x faster than ``str`` per id)."""
    global _ID_STRINGS
    if not _ID_STRINGS:
        _ID_STRINGS = [str(i) for i in range(1 << 17)]
    ids = arr.tolist()
    if arr.size and int(arr.max()) < len(_ID_STRINGS):
        table = _ID_STRINGS
        return ", ".join([table[i] for i in ids])
    return ", ".join(map(str, ids))


def _jsonl_line(req: Request) -> str:
    return (
        f'{{"session_id": {json.dumps(req.session_id)}, "turn_id": {req.turn_id}, '
        f'"ts": {json.dumps(req.ts)}, "num_input_tokens": {req.input_len}, '
        f'"num_output_tokens": {req.output_len}, '
        f'"input_tokens": [{_join_ids(req.input_tokens)}], '
        f'"output_tokens": [{_join_ids(req.output_tokens)}]}}\n'
    )


def write_jsonl(fh: io.IOBase, requests: Iterable[Request]) -> int:
    """Write ``requests`` to the text stream ``fh``, one line each (64 lines per write); return the count."""
    n = 0
    buf: list[str] = []
    for req in requests:
        buf.append(_jsonl_line(req))
        n += 1
        if len(buf) >= 64:
            fh.write("".join(buf))
            buf.clear()
    fh.write("".join(buf))
    return n
