"""Which raw source a file holds, when it is not a token trace: chats (ShareGPT, OpenAI-format messages),
LMSys, agent trajectories or QuALITY (:func:`raw_source_of`).

A command given such a file as its trace builds it by the catalog entry's recipe (``files=``), as
``marconi trace build`` would, instead of refusing it as an unknown format. The file's first record
decides, but for one: a file (JSONL, or a JSON array) of bare OpenAI-format ``messages`` records is
an agent's trajectories when any of its first :data:`_SNIFF_RECORDS` records shows a tool (a chat-shaped first
record is an agent that answered without one), else chats. A recipe's own reader checks every
record, naming the file and record of a bad one.
"""

from __future__ import annotations

import json
import os
import re
import zlib
from pathlib import Path
from typing import Any, Callable

from marconi.core.jsonfile import not_regular
from marconi.io import line_limit, open_binary

from .messages import call_fields, has_tool_blocks, listed_messages, normalize_role

__all__ = ["raw_source_of", "RAW_SOURCES", "trajectory_files", "first_record"]

#: The catalog entry that builds each raw source, and the source in words.
RAW_SOURCES = {"sharegpt": "chat conversations (ShareGPT, or OpenAI-format messages)",
               "lmsys": "LMSys-Chat conversations",
               "swe": "agent trajectories (mini-swe-agent / SWE-agent)", "quality": "QuALITY articles"}

#: Files a mini-swe-agent or SWE-agent run folder holds beside its trajectories that are not ones
#: (``preds.json``: each instance's patch; ``results.json``: SWE-agent's evaluation):
#: :func:`trajectory_files` skips them; named alone, a file is read (and refused).
_RUN_FILES = frozenset({"preds.json", "results.json"})

_CHUNK = 1 << 16
_SNIFF_RECORDS = 64          # records of a bare-``messages`` file read for a tool (within the line limit)
_SPACE = re.compile(r"\s*")


def trajectory_files(folder: Path) -> list[Path]:
    """The ``.json``/``.traj`` files under ``folder`` (recursively, by path), as the SWE reader reads a
    folder of trajectories (suffixes in any case); a run folder's ``preds.json`` and ``results.json``
    are not ones."""
    return sorted(f for f in folder.rglob("*") if f.suffix.lower() in (".json", ".traj")
                  and f.name.lower() not in _RUN_FILES and f.is_file())


def _kind(obj: Any) -> str | None:
    """The raw source of one record, by the fields each source's reader requires."""
    if not isinstance(obj, dict):
        return None
    for field, kind in (("conversations", "sharegpt"), ("conversation", "lmsys")):
        if _list_at(obj, field) is not None:
            return kind
    info = obj.get("info")
    messages = _list_at(obj, "messages")
    if messages is not None:
        if "instance_id" in obj or "exit_status" in obj or "trajectory_format" in obj or isinstance(info, dict):
            return "swe"     # mini-swe-agent (compact, or its own .traj.json with its "info" header)
        if messages and all(isinstance(m, dict) and "role" in m for m in messages[:8]):
            return "swe" if any(_agentic(m) for m in messages) else "sharegpt"    # an OpenAI-format record
    for field in ("history", "trajectory"):    # SWE-agent's .traj (its demonstrations carry the history alone);
        steps = obj.get(field)                 # nebius's SWE-agent exports
        if isinstance(steps, list) and steps and all(isinstance(m, dict) and "role" in m for m in steps[:8]):
            return "swe"
    if "article" in obj and isinstance(obj.get("questions"), list):
        return "quality"
    return None


def _list_at(record: dict, field: str) -> list | None:
    """The list ``record`` holds at ``field`` (a JSON string encoding one read as it, as the readers do:
    :func:`~marconi.workloads.messages.listed_messages`), else None."""
    listed = listed_messages(record, (field,))
    return listed[1] if listed is not None and isinstance(listed[1], list) else None


def _agentic(message: Any) -> bool:
    """Whether a message shows an agent's loop: a tool's result, or a call to one. A bare
    ``{"messages": [...]}`` record with such a message is an agent's trajectory, else a chat."""
    if not isinstance(message, dict):
        return False
    if call_fields(message) or has_tool_blocks(message.get("content")):
        return True
    try:
        return normalize_role(message.get("role")) == "tool"
    except ValueError:
        return False


def _first_json_lines(path: Path, limit: int = 1) -> list[Any]:
    """The first ``limit`` records of a JSONL file, in order, within :func:`~marconi.io.line_limit` bytes (64 MiB, or
    ``$MARCONI_MAX_LINE_BYTES``: as the reader's own limit); the look
    ends at a line that does not decode or is cut at the cap (its reader names it)."""
    records: list[Any] = []
    read, cap = 0, line_limit()
    with open_binary(path) as fh:
        for raw in iter(lambda: fh.readline(cap), b""):
            read += len(raw)
            if read > cap or not raw.endswith(b"\n") and len(raw) >= cap:
                break
            if raw.strip():
                try:
                    records.append(json.loads(raw))
                except (ValueError, RecursionError):
                    break
                if len(records) >= limit:
                    break
    return records


def _bare_chat(obj: Any) -> bool:
    """A bare OpenAI-format ``messages`` record that :func:`_kind` reads as a chat (no tool in it)."""
    return (isinstance(obj, dict) and _kind(obj) == "sharegpt" and _list_at(obj, "conversations") is None
            and _list_at(obj, "messages") is not None)


def _sniffed_kind(first_records: Callable[[int], list[Any]]) -> str | None:
    """The raw source of a file whose first ``n`` records ``first_records(n)`` reads: its first
    record's, except that bare ``messages`` chats are an agent's trajectories where one of the first
    :data:`_SNIFF_RECORDS` records is one."""
    first = first_records(1)
    kind = _kind(first[0] if first else None)
    if not first or not _bare_chat(first[0]):
        return kind
    return "swe" if any(_kind(r) == "swe" for r in first_records(_SNIFF_RECORDS)[1:]) else kind


def _first_json_values(path: Path, limit: int = 1) -> list[Any]:
    """The first ``limit`` elements of a JSON array (or the whole value when it is not an array), reading
    no more of the file than it needs: those that decode within :func:`~marconi.io.line_limit` bytes, in order."""
    decoder = json.JSONDecoder()
    text, values = "", []
    array, pos = None, 0          # whether the file is an array; where its next element (or separator) starts
    cap = line_limit()
    with open(path, "r", encoding="utf-8-sig", errors="replace") as fh:
        while len(text) < cap:
            chunk = fh.read(max(_CHUNK, len(text)))     # doubling: each failed decode rescans what is read
            text += chunk
            if array is None:
                pos = _SPACE.match(text).end()
                if pos == len(text):
                    if not chunk:
                        return values
                    continue
                array = text[pos] == "["
                pos += array
            while len(values) < limit:
                i = _SPACE.match(text, pos).end()
                if array and text.startswith("]", i):
                    return values
                if array and values:                  # an element read: a comma must follow
                    if i == len(text):
                        break
                    if text[i] != ",":
                        return values
                    i = _SPACE.match(text, i + 1).end()
                try:
                    value, pos = decoder.raw_decode(text, i)
                except ValueError:
                    break                             # cut short: read more (or not JSON: its reader says why)
                values.append(value)
                if not array:
                    return values
            if len(values) >= limit or not chunk:
                return values
    return values


def _parquet_kind(path: Path) -> str | None:
    """Chat records in Parquet (the chat readers take it), by column name: ShareGPT's ``conversations`` or
    the OpenAI format's ``messages`` (read as chats: the SWE reader takes no Parquet), LMSys's
    ``conversation``."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        return None
    names = set(pq.read_schema(path).names)
    if "conversations" in names or "messages" in names:
        return "sharegpt"
    return "lmsys" if "conversation" in names else None


def first_record(path: str | os.PathLike) -> Any:
    """The first record of a JSONL (``.jsonl.gz``) file, or None where there is none or it cannot be
    read (its reader says why). Never raises."""
    try:
        first = _first_json_lines(Path(path))
    except (OSError, EOFError, zlib.error):
        return None
    return first[0] if first else None


def raw_source_of(path: str | os.PathLike) -> str | None:
    """The catalog entry whose recipe reads ``path`` (a key of :data:`RAW_SOURCES`), or None: not a
    regular file, unreadable, or its first record is none of the raw sources (a file of bare
    OpenAI-format chats whose first records show a tool: ``swe``, as the module says). A directory is ``swe``
    when its first ``.json``/``.traj`` file (by name, recursively, as the SWE reader orders them)
    holds trajectories: mini-swe-agent writes one file per instance. A ``.jsonl.gz`` file is sniffed through gzip
    (every reader of a JSONL source reads it gzipped). Never raises."""
    p = Path(path)
    try:
        if p.is_dir():
            files = trajectory_files(p)
            return "swe" if files and raw_source_of(files[0]) == "swe" else None
        if not p.is_file() or not_regular(os.stat(p)) is not None:
            return None
        name = p.name.lower()
        if name.endswith(".parquet"):
            return _parquet_kind(p)
        if name.endswith((".jsonl", ".jsonl.gz")):     # every reader of a .jsonl source reads it gzipped too
            return _sniffed_kind(lambda n: _first_json_lines(p, n))
        if name.endswith((".json", ".traj")):
            return _sniffed_kind(lambda n: _first_json_values(p, n))
    except (OSError, EOFError, zlib.error, ValueError, RecursionError):   # unsniffable, or bad gzip: its reader says
        return None
    return None
