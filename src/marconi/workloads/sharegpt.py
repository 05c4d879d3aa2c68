"""Multi-turn chat traces from ShareGPT, LMSys-Chat-1M or OpenAI-format chat exports by the paper's
recipe: qualifying conversations become sessions, messages are tokenized one by one, turns arrive after
typing time and are grouped by role (or by position). Recipe: docs/data.md ("The chat recipe")."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from marconi.core.jsonfile import described
from marconi.io import iter_jsonl, read_json

from .messages import (Message, Progress, call_fields, check_text_form, concat_with_offsets, content_text,
                       count_words, encode_messages, listed_messages, no_progress, normalize_role, preamble)
from .paths import shared_data_dir
from .tokenizer import TextTokenizer, load_tokenizer
from .trace import Request, Trace

__all__ = ["CHAT_FIELDS", "ChatRecord", "read_chat_records", "chat_turns", "build_chat_trace",
           "build_sharegpt_trace", "build_lmsys_trace", "default_sharegpt_files", "typed_words", "PAIRINGS"]

PAIRINGS = ("roles", "positional")


CHAT_FIELDS = ("conversations", "conversation", "messages")
"""The field holding a record's messages, first found wins: ShareGPT's, LMSys-Chat's (WildChat's), and
the OpenAI chat format's (``{"messages": [{"role", "content"}]}``, most instruction sets); a JSON
string there that encodes the list is read as the list (some exports store it so)."""


@dataclass(frozen=True, slots=True)
class ChatRecord:
    """One conversation as read from a file: its source id and messages (roles normalized)."""

    id: str
    messages: tuple[Message, ...]


def _message(obj: Any, where: str) -> Message:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: a message must be an object, got {described(obj)}")
    role_key = _field(obj, ("from", "role"))
    content_key = _field(obj, ("value", "content"))
    calls = call_fields(obj)
    if role_key is None or content_key is None and not calls:     # a tool call may stand without content
        raise ValueError(f"{where}: a message needs from/role and value/content, got keys {sorted(obj)}")
    content = content_text(obj[content_key], where) if content_key else ""
    try:
        role = normalize_role(obj[role_key])
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    # the source's keys in its order (the json text form dumps them); content parts as their text
    raw = {k: content if k == content_key and isinstance(v, list) else v
           for k, v in obj.items() if k in (role_key, content_key)}
    return Message(role=role, content=content, raw={**raw, **calls})


def _field(obj: dict, keys: tuple[str, str]) -> str | None:
    """The first of ``keys`` that ``obj`` holds with a value, else the first it holds (null), else None:
    a table that unites ShareGPT's and the OpenAI format's rows has both, one of them null."""
    held = [k for k in keys if k in obj]
    return next((k for k in held if obj[k] is not None), held[0] if held else None)


def _record(obj: Any, where: str, index: int) -> ChatRecord:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: a record must be an object, got {described(obj)}")
    listed = listed_messages(obj, CHAT_FIELDS)
    if listed is None:
        raise ValueError(f"{where}: no 'conversations' (ShareGPT), 'conversation' (LMSys) or 'messages' (OpenAI "
                         "chat) field")
    msgs = listed[1]
    if not isinstance(msgs, list):
        raise ValueError(f"{where}: the conversation must be a list, got {described(msgs)}")
    rid = obj.get("id", obj.get("conversation_id", index))
    return ChatRecord(str(rid), preamble(obj) + tuple(_message(m, f"{where}: message {j}")
                                                      for j, m in enumerate(msgs)))


def _file_objects(path: Path) -> Iterator[tuple[str, Any]]:
    name = path.name.lower()
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        row = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=256):
            for obj in batch.to_pylist():
                yield f"{path}:row {row}", obj
                row += 1
    elif name.endswith((".jsonl", ".jsonl.gz")):
        yield from iter_jsonl(path)
    else:
        data = read_json(path)
        if isinstance(data, dict) and any(field in data for field in CHAT_FIELDS):
            yield f"{path}: record 0", data          # one conversation in a file of its own
            return
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON list of conversation records, got {described(data)}")
        for i, obj in enumerate(data):
            yield f"{path}: record {i}", obj


def read_chat_records(paths: Sequence[str | os.PathLike]) -> Iterator[ChatRecord]:
    """Records of the given files, in order (lazily: later files are opened only when reached)."""
    index = 0
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise FileNotFoundError(f"chat data file not found: {p}")
        for where, obj in _file_objects(path):
            yield _record(obj, where, index)
            index += 1


def _non_ascii_frac(record: ChatRecord) -> float:
    text = "".join(m.content for m in record.messages)
    if not text or text.isascii():
        return 0.0
    return (len(text) - len(text.encode("ascii", "ignore"))) / len(text)


def chat_turns(messages: Sequence[Message], pairing: str = "roles") -> tuple[int, list[tuple[int, int, int]]]:
    """``(num_stream_messages, turns)``: the stream is ``messages[:num_stream_messages]``; a turn
    ``(first_user, first_reply, end)`` has new input ``[first_user, first_reply)`` and output
    ``[first_reply, end)``."""
    if pairing == "positional":
        n = len(messages) // 2
        return 2 * n, [(2 * t, 2 * t + 1, 2 * t + 2) for t in range(n)]
    if pairing != "roles":
        raise ValueError(f"unknown pairing {pairing!r} (choose from {', '.join(PAIRINGS)})")
    n = len(messages)
    i = next((j for j, m in enumerate(messages) if m.role == "user"), n)  # prefix: messages[:i]
    turns: list[tuple[int, int, int]] = []
    while i < n:
        j = i
        while j < n and messages[j].role != "assistant":
            j += 1
        k = j
        while k < n and messages[k].role == "assistant":
            k += 1
        if k == j:  # trailing user messages without a reply
            break
        turns.append((i, j, k))
        i = k
    end = turns[-1][2] if turns else 0
    return end, turns


def typed_words(messages: Sequence[Message], turn: tuple[int, int, int], pairing: str) -> int:
    """Words the user types for a turn: of its user messages (roles), of message ``2t`` (positional)."""
    u0, r0, _ = turn
    if pairing == "positional":
        return count_words(messages[u0].content)
    return sum(count_words(m.content) for m in messages[u0:r0] if m.role == "user")


def _session_requests(session_id: int, start_ts: float, messages: Sequence[Message],
                      tokens: Sequence[np.ndarray], turns: list[tuple[int, int, int]],
                      max_input_len: int, words_per_s: float, pairing: str) -> list[Request]:
    stream, offsets = concat_with_offsets(tokens)
    requests: list[Request] = []
    ts = start_ts
    for t, (u0, r0, end) in enumerate(turns):
        input_end = int(offsets[r0])
        if input_end > max_input_len:
            break
        if t > 0:
            ts += typed_words(messages, (u0, r0, end), pairing) / words_per_s
        requests.append(Request(session_id, t, ts, stream[:input_end], stream[input_end:int(offsets[end])]))
    return requests


def build_chat_trace(paths: Sequence[str | os.PathLike], *, num_sessions: int | None = 100,
                     min_rounds: int = 10, sessions_per_second: float = 1.0,
                     max_input_len: int = 32768, words_per_min: float = 90.0, text_form: str = "json",
                     add_bos: bool = True, pairing: str = "roles",
                     max_non_ascii_frac: float | None = None,
                     tokenizer: TextTokenizer | str | os.PathLike | None = None,
                     source: str = "chat", progress: Progress | None = None) -> Trace:
    """Build a chat trace from ShareGPT/LMSys files (``num_sessions=None``: all qualifying); session ids
    0, 1, ... in file order (source ids in ``meta["source_ids"]``), requests by time.
    FileNotFoundError for a missing file; ValueError (naming file and record) for bad input."""
    if sessions_per_second <= 0 or words_per_min <= 0:
        raise ValueError("sessions_per_second and words_per_min must be > 0")
    if num_sessions is not None and num_sessions < 0:
        raise ValueError(f"num_sessions must be >= 0, got {num_sessions}")
    if max_input_len <= 0 or min_rounds < 0:
        raise ValueError("max_input_len must be > 0 and min_rounds >= 0")
    check_text_form(text_form)
    if pairing not in PAIRINGS:
        raise ValueError(f"unknown pairing {pairing!r} (choose from {', '.join(PAIRINGS)})")
    tok = tokenizer if isinstance(tokenizer, TextTokenizer) else load_tokenizer(tokenizer)
    words_per_s = words_per_min / 60.0

    counts = {"records_read": 0, "too_few_messages": 0, "too_much_non_ascii": 0, "without_turns": 0}

    def qualifying() -> Iterator[ChatRecord]:
        taken = 0
        for rec in read_chat_records(paths):
            if num_sessions is not None and taken >= num_sessions:
                return
            counts["records_read"] += 1
            if len(rec.messages) < 2 * min_rounds:
                counts["too_few_messages"] += 1
                continue
            if max_non_ascii_frac is not None and _non_ascii_frac(rec) > max_non_ascii_frac:
                counts["too_much_non_ascii"] += 1
                continue
            taken += 1
            yield rec

    wrap = progress or no_progress
    requests: list[Request] = []
    source_ids: list[str] = []
    for k, rec in enumerate(wrap(qualifying())):
        source_ids.append(rec.id)
        n_stream, turns = chat_turns(rec.messages, pairing)
        counts["without_turns"] += not turns
        messages = rec.messages[:n_stream]
        tokens = encode_messages(tok, messages, text_form, add_bos)
        requests.extend(_session_requests(k, k / sessions_per_second, messages, tokens, turns,
                                          max_input_len, words_per_s, pairing))
    params = dict(num_sessions=num_sessions, min_rounds=min_rounds,
                  sessions_per_second=sessions_per_second, max_input_len=max_input_len,
                  words_per_min=words_per_min, text_form=text_form, add_bos=add_bos, pairing=pairing,
                  max_non_ascii_frac=max_non_ascii_frac)
    meta = {"source": source, "recipe": "marconi-paper-chat", "params": params,
            "files": [str(p) for p in paths], "tokenizer": tok.name,
            "num_sessions": len(source_ids), "source_ids": source_ids, "records": counts}
    name = f"{source}-n{len(source_ids)}-sps{sessions_per_second:g}"
    return Trace.from_unsorted(requests, name=name, meta=meta)


def default_sharegpt_files() -> list[Path]:
    """The shared data set's ShareGPT parts with >= 20 messages, else its original unfiltered file (same
    sessions after the builder's filter), else []."""
    shared = shared_data_dir()
    if shared is None:
        return []
    folder = shared / "sharegpt"
    return (sorted(folder.glob("sharegpt_v3_ge10rounds_fileorder_part*.json"))
            or sorted(folder.glob("ShareGPT_V3_unfiltered_cleaned_split.json")))


def build_sharegpt_trace(paths: Sequence[str | os.PathLike] | None = None, **params: Any) -> Trace:
    """ShareGPT by the paper's recipe; ``paths`` default to the shared data set's filtered parts."""
    files = list(paths) if paths else default_sharegpt_files()
    if not files:
        raise FileNotFoundError("no ShareGPT files given and the shared data set is absent "
                                "(set MARCONI_SHARED_DATA or pass the files)")
    return build_chat_trace(files, source="sharegpt", **params)


def build_lmsys_trace(paths: Sequence[str | os.PathLike], **params: Any) -> Trace:
    """LMSys-Chat-1M exports (users bring the files): the paper's recipe, incl. its non-ASCII filter."""
    params.setdefault("max_non_ascii_frac", 0.5)
    return build_chat_trace(list(paths), source="lmsys", **params)
