"""JSONL traces: reading records line by line (with a fast path for the token lists) and writing
requests as lines; registers the ``jsonl`` and ``jsonl.gz`` formats (meta in the sidecar).

The fast path cuts the two token lists out of a line and parses them with NumPy (no Python int
per token); it must read exactly what ``json.loads`` reads, so every doubt falls back to ``json``
for the whole line and :func:`~.schema.check_record` judges both alike. Why each step is sound is
in docs/data.md ("The JSONL fast path").
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import warnings
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, Mapping

import numpy as np

from marconi.core.jsonfile import check_readable
from marconi.io import JsonError, decode_line, iter_lines, loads

from .formats import TraceFormat, register_format
from .schema import INT32_MAX, Record, Request, check_record
from .sidecar import read_sidecar

__all__ = ["jsonl_records", "write_jsonl", "parse_token_list", "decode_record", "JSONL", "JSONL_GZ"]


# ============================================================================ token lists

_JSON_WS = "[ \t\n\r]*"  # JSON's whitespace; Python's \s also matches \x0b, \xa0, ... which json refuses
_TOKEN_KEY_RE = re.compile(rf'"(input_tokens|output_tokens)"{_JSON_WS}:')
_TOKEN_KEYS = ("input_tokens", "output_tokens")
_SHORT_BODY = 512  # characters: below this, ``json.loads`` of the list is as fast as the proof


def parse_token_list(body: str) -> np.ndarray | None:
    """The int32 ids of a JSON list's ``body`` (between ``[`` and ``]``), or None: "ask json".

    A result is exactly ``json.loads("[" + body + "]")``. Given for every list of ids in
    ``[0, INT32_MAX]`` under 512 characters, and for longer ones in the writers' forms (no leading
    zeros, ``", "`` or ``","`` separators, no other whitespace), proven by :func:`_count_plain_ids`.
    """
    if len(body) < _SHORT_BODY:
        return _short_token_list(body)
    try:
        raw = body.encode("ascii")
    except UnicodeEncodeError:
        return None
    num_ids = _count_plain_ids(np.frombuffer(raw, dtype=np.uint8))
    if num_ids is None:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # numpy < 2 warns on partial reads
        arr = np.fromstring(body, dtype=np.int64, sep=",")
    # an id of 11+ digits without a leading zero is >= 10**10, so the range check refuses it
    if arr.size != num_ids or int(arr.max()) > INT32_MAX:
        return None
    return arr.astype(np.int32)


def _short_token_list(body: str) -> np.ndarray | None:
    try:
        values = json.loads("[" + body + "]")
    except (ValueError, RecursionError):
        return None
    if not all(type(v) is int and 0 <= v <= INT32_MAX for v in values):
        return None
    return np.array(values, dtype=np.int32)


def _count_plain_ids(chars: np.ndarray) -> int | None:
    """How many ids ``chars`` hold if they are digit strings without leading zeros joined by ``", "``
    or ``","``, else None (vectorised checks over the bytes)."""
    if chars.size == 0:
        return None
    is_digit = (chars - np.uint8(ord("0"))) < 10  # uint8 wraps below '0'
    is_comma = chars == ord(",")
    is_space = chars == ord(" ")
    num_commas = np.count_nonzero(is_comma)
    num_spaces = np.count_nonzero(is_space)
    if np.count_nonzero(is_digit) + num_commas + num_spaces != chars.size:
        return None  # a sign, a dot, a tab, a letter, ...
    if not (is_digit[0] and is_digit[-1]):
        return None  # a leading or trailing separator
    if np.count_nonzero(is_comma[:-1] & is_comma[1:]):
        return None  # ",,": an empty id
    if num_spaces and (np.count_nonzero(is_comma[:-1] & is_space[1:]) != num_spaces
                       or np.count_nonzero(is_space[:-1] & is_digit[1:]) != num_spaces):
        return None  # a space elsewhere than inside ", " before an id
    starts_zero = (chars[:-1] == ord("0")) & is_digit[1:]
    if starts_zero[0] or np.count_nonzero(~is_digit[:-2] & starts_zero[1:]):
        return None  # a leading zero
    return int(num_commas) + 1


def _cut_token_list(line: str, key: str) -> tuple[str, str] | None:
    """(``line`` with ``"key": [body]`` replaced by ``"key": 0``, body), or None if the key is not
    followed by a flat list."""
    quoted = f'"{key}"'
    start = line.find(quoted)
    if start < 0:
        return None
    pos = _skip_json_ws(line, start + len(quoted))
    if not line.startswith(":", pos):
        return None
    pos = _skip_json_ws(line, pos + 1)
    if not line.startswith("[", pos):
        return None
    end = line.find("]", pos + 1)
    if end < 0:
        return None
    return f'{line[:start]}{quoted}: 0{line[end + 1:]}', line[pos + 1:end]


def _skip_json_ws(line: str, pos: int) -> int:
    while pos < len(line) and line[pos] in " \t\n\r":
        pos += 1
    return pos


def _fast_decode(line: str) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """Decode a well-formed line without Python ints for the tokens; None to fall back to ``json``
    (a key seen twice, nested or escaped, a backslash left, an unproven body)."""
    rest = line
    bodies: dict[str, str] = {}
    for key in _TOKEN_KEYS:
        cut = _cut_token_list(rest, key)
        if cut is None:
            return None
        rest, bodies[key] = cut
    if "\\" in rest or any(rest.count(f'"{key}"') != 1 for key in _TOKEN_KEYS):
        return None
    try:
        obj = json.loads(rest)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or any(type(obj.get(key)) is not int or obj[key] != 0 for key in _TOKEN_KEYS):
        return None
    tokens = {}
    for key, body in bodies.items():
        arr = parse_token_list(body)
        if arr is None:
            return None
        tokens[key] = arr
    return obj, tokens


# what may lie between a token list's key and a syntax error inside that list: an opened list not
# yet closed (which may have swallowed the next key as an element), or numbers with no bracket
_INSIDE_LIST_RE = re.compile(rf'{_JSON_WS}\[[^\[\]{{}}"]*(?:"[^"\\]*"{_JSON_WS})?|{_JSON_WS}[0-9.eE+\-, \t\n\r]*')


def _syntax_error_field(line: str) -> str | None:
    """The token list a JSON syntax error of ``line`` lies in, or None."""
    try:
        json.loads(line)
        return None
    except json.JSONDecodeError as exc:
        pos = exc.pos
    except (ValueError, RecursionError):    # not syntax: an integer too long to convert, absurd nesting
        return None
    keys = list(_TOKEN_KEY_RE.finditer(line, 0, pos))
    if keys and _INSIDE_LIST_RE.fullmatch(line, keys[-1].end(), pos):
        return keys[-1].group(1)
    return None


def decode_record(line: str, where: str) -> tuple[dict[str, Any], list[tuple[str | None, str]]]:
    """(fields, problems) of one JSONL line, as :func:`~.schema.check_record` judges ``json.loads(line)``;
    ``where`` (``path:line``) shapes JSON errors, which name the token list they lie in."""
    fast = _fast_decode(line)
    if fast is not None:
        return check_record(*fast)
    try:
        obj = loads(line, where)
    except JsonError as exc:
        return {}, [(_syntax_error_field(line), exc.reason)]
    return check_record(obj)


_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_PARQUET_MAGIC = b"PAR1"


def _misnamed(path: Path) -> str | None:
    """Why the file's first bytes contradict its name (e.g. gzip named ``.jsonl``) and what to do, or None."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError:
        return None  # reading the file says why
    if not head:
        return None
    name = path.name
    if name.lower().endswith(".gz"):
        if head.startswith(_GZIP_MAGIC):
            return None
        if head.startswith(_ZSTD_MAGIC):
            return ("looks zstd-compressed, not gzip (it starts with the zstd magic bytes 28 b5 2f fd): "
                    f"decompress it (zstd -d) and name it {name[:-3]}, or recompress it with gzip")
        return (f"is not gzip-compressed (it does not start with the gzip magic bytes 1f 8b): "
                f"if it is plain JSONL, rename it to {name[:-3]}")
    if head.startswith(_GZIP_MAGIC):
        return (f"looks gzip-compressed (it starts with the gzip magic bytes 1f 8b) but is named like plain "
                f"JSONL: rename it to {name}.gz (gzip-compressed JSONL is read as such), or decompress it")
    if head.startswith(_ZSTD_MAGIC):
        return ("looks zstd-compressed (it starts with the zstd magic bytes 28 b5 2f fd), which trace files "
                f"cannot be: decompress it (zstd -d), or recompress it with gzip as {name}.gz")
    if head.startswith(_PARQUET_MAGIC):
        stem = name[: -len(".jsonl")] if name.lower().endswith(".jsonl") else name
        return f"looks like a Parquet file (it starts with PAR1): rename it to {stem}.parquet"
    return None


def jsonl_records(path: Path) -> Iterator[Record]:
    """Yield (1-based line, fields, problems) for each non-blank line.

    A bad line is a problem of its own and reading goes on; an unreadable stream, a line over
    ``$MARCONI_MAX_LINE_BYTES``, a non-regular file or a misnamed compression ends the file with one.
    """
    label = os.fspath(path)
    try:
        check_readable(Path(path))  # before ``_misnamed`` opens it: a FIFO would block there
    except JsonError as exc:
        yield 1, {}, [(None, exc.reason)]
        return
    misnamed = _misnamed(Path(path))
    if misnamed is not None:
        yield 1, {}, [(None, misnamed)]
        return
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
            yield (lineno, *decode_record(line, where))
    except JsonError as exc:
        yield lineno + 1, {}, [(None, exc.reason)]


# ============================================================================ JSONL encoding


_ID_STRINGS: list[str] = []


def _join_ids(arr: np.ndarray) -> str:
    """``"1, 2, 3"``; ids below 2**17 come from a string table."""
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


def _write_plain(fh: IO[bytes], requests: Iterable[Request], name: str, meta: Mapping[str, Any]) -> int:
    """The ``jsonl`` writer: UTF-8 lines into the binary ``fh``, left open (meta goes to the sidecar)."""
    text = io.TextIOWrapper(fh, encoding="utf-8")
    try:
        n = write_jsonl(text, requests)
    except BaseException:
        try:
            text.detach()  # the owner of ``fh`` discards it; a second error here would hide the first
        except (OSError, ValueError):
            pass
        raise
    text.detach()  # flushes; closing the wrapper instead would close ``fh``, which its owner commits
    return n


def _write_gzip(fh: IO[bytes], requests: Iterable[Request], name: str, meta: Mapping[str, Any]) -> int:
    """The ``jsonl.gz`` writer: gzip (``mtime=0``: the same trace gives the same bytes) into ``fh``."""
    with gzip.GzipFile(fileobj=fh, mode="wb", mtime=0) as gz, io.TextIOWrapper(gz, encoding="utf-8") as text:
        return write_jsonl(text, requests)


JSONL = register_format(TraceFormat("jsonl", (".jsonl",), jsonl_records, _write_plain, read_sidecar, sidecar=True))
JSONL_GZ = register_format(TraceFormat("jsonl.gz", (".jsonl.gz",), jsonl_records, _write_gzip, read_sidecar,
                                       sidecar=True))
