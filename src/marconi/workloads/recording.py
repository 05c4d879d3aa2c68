"""Hash-id recordings of a live vLLM server (``MARCONI_VLLM_RECORD``), read as traces: the block-hash
chains are rebuilt as tokens with exactly their prefix equalities, so every engine can serve them.
Malformed input raises :class:`RecordingError` (file, line, field). See docs/data.md ("Block-hash traces")."""

from __future__ import annotations

import gzip
import json
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marconi.core.jsonfile import JsonError, described, not_regular, read_json
from marconi.io import open_binary

from .messages import Progress, no_progress
from .mooncake import MooncakeRow, MooncakeTokens
from .trace import Request, Trace

__all__ = ["RecordedRequest", "Recording", "RecordingError", "read_recording", "build_recording_trace",
           "is_recording", "is_mooncake_file", "sidecar_of", "RECORDING_FORMAT", "MAX_REQUEST_TOKENS",
           "SETTINGS_MINIMUM"]

RECORDING_FORMAT = "marconi-vllm-recording"     # marconi.integrations.vllm.record writes it (same value)
META_SUFFIX = ".meta.json"
_FRESH = 1 << 63        # ids of blocks no recording names (partial tails): above every salted id
_GZIP_MAGIC = b"\x1f\x8b"
#: The most tokens (prompt and output) a recorded request may hold: 2**24, above any model's context
#: window (the longest, 10M tokens). A line past it is refused: its tokens are rebuilt in memory.
MAX_REQUEST_TOKENS = 1 << 24


class RecordingError(ValueError):
    """A recording that cannot be read; the message names file, line and field."""


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One recorded request (``where``: ``path:line``)."""

    where: str
    arrival: float
    finish: float
    prompt_len: int
    output_len: int
    hash_ids: tuple[int, ...]
    num_cached_tokens: int
    num_preemptions: int


@dataclass
class Recording:
    """A recording as read: its sidecar, its requests in file order (finishing order), and warnings;
    ``num_read``: the requests read, before a ``limit`` kept the first to arrive."""

    path: str
    meta: dict[str, Any]
    requests: list[RecordedRequest]
    warnings: list[str] = field(default_factory=list)
    num_read: int = 0

    @property
    def block_size(self) -> int:
        return int(self.meta["block_size"])


def sidecar_of(path: str | os.PathLike) -> Path:
    """A recording's sidecar: ``path + .meta.json``; for a gzipped recording (``rec.jsonl.gz``) whose
    own is absent, the sidecar of the name it was gzipped from (``rec.jsonl.meta.json``), which
    ``gzip`` leaves where it was."""
    side = Path(os.fspath(path) + META_SUFFIX)
    name = os.fspath(path)
    if not side.is_file() and name.lower().endswith(".gz"):
        plain = Path(name[:-3] + META_SUFFIX)
        if plain.is_file():
            return plain
    return side


def is_recording(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a recording: it has a recording sidecar (``format: marconi-vllm-recording``),
    or its first line is a recording's header (``{"recording": ...}``; its reader then names the
    missing sidecar). Reads at most 1 MiB and never raises."""
    side = sidecar_of(path)
    if side.is_file():
        try:
            meta = read_json(side)
        except JsonError:
            meta = None
        if isinstance(meta, dict) and meta.get("format") == RECORDING_FORMAT:
            return True
    first = _first_object(path)
    return first is not None and "recording" in first and "hash_ids" not in first


# How far is_mooncake_file looks for its first line: a Mooncake request is a few KiB; a file with no
# newline (or /dev/zero) must not be read whole just to sniff its format.
_SNIFF_BYTES = 1 << 20


def _first_object(path: str | os.PathLike) -> dict | None:
    """The first non-blank line of a regular file (of its text, if gzipped: a ``.gz`` name) where it is
    a JSON object, else None; reads at most 1 MiB and never raises."""
    try:
        if not_regular(os.stat(path)) is not None:
            return None
        with open_binary(path) as fh:
            head = fh.read(_SNIFF_BYTES)
    except (OSError, EOFError, zlib.error):     # a bad gzip stream: BadGzipFile, cut short, or corrupt
        return None
    lines = head.splitlines()
    if len(head) == _SNIFF_BYTES and not head.endswith(b"\n"):
        lines = lines[:-1]  # cut at the limit: the last line is not whole
    for raw in lines:
        if raw.strip():
            try:
                obj = json.loads(raw)
            except (ValueError, RecursionError):  # RecursionError: a line nested thousands deep
                return None
            return obj if isinstance(obj, dict) else None
    return None


def is_mooncake_file(path: str | os.PathLike) -> bool:
    """Whether ``path``'s first non-blank line is a Mooncake request; reads at most 1 MiB of a regular
    file (of its text, if gzipped: a ``.gz`` name) and never raises."""
    obj = _first_object(path)
    # a block-hash request, even one missing a field (its reader then names the field): token traces
    # have neither hash_ids nor input_length
    return obj is not None and ("hash_ids" in obj or {"timestamp", "input_length"} <= obj.keys())


def _where(path: str, line: int, name: str | None = None) -> str:
    return f"{path}:{line}" + (f": field {name!r}" if name else "")


def _int(obj: dict, key: str, path: str, line: int, minimum: int = 0) -> int:
    value = obj.get(key)
    if key not in obj:
        raise RecordingError(f"{_where(path, line, key)}: missing")
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise RecordingError(f"{_where(path, line, key)}: expected an integer >= {minimum}, got {described(value)}")
    return value


def _time(obj: dict, key: str, path: str, line: int) -> float:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or value == float("inf"):
        raise RecordingError(f"{_where(path, line, key)}: expected seconds >= 0, got {described(value)}")
    return float(value)


def _read_meta(path: str) -> dict[str, Any]:
    side = os.fspath(sidecar_of(path))
    if not Path(side).is_file():
        raise RecordingError(f"{side}: missing: a recording's sidecar holds its block size and model (it is written "
                             "next to the file by MARCONI_VLLM_RECORD); copy it along with the recording")
    try:
        meta = read_json(side)
    except JsonError as exc:
        raise RecordingError(f"{exc.where}: {exc.reason}") from None
    if not isinstance(meta, dict):
        raise RecordingError(f"{side}: expected a JSON object (a recording's sidecar), got {described(meta)}")
    if "format" not in meta:
        raise RecordingError(f"{side}: field 'format': missing (expected {RECORDING_FORMAT!r})")
    if meta["format"] != RECORDING_FORMAT:
        raise RecordingError(f"{side}: field 'format': expected {RECORDING_FORMAT!r}, got {described(meta['format'])}")
    for key in ("block_size", "salt_id"):
        if key not in meta:
            raise RecordingError(f"{side}: field {key!r}: missing")
    bs = meta["block_size"]
    if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1:
        raise RecordingError(f"{side}: field 'block_size': expected an integer >= 1, got {described(bs)}")
    _check_settings(side, meta)
    return meta


#: The sidecar's scheduler fields that a diagnosis reads: each an integer of at least this, or null
#: (absent: the diagnosis's default). ``num_blocks`` counts vLLM's null block, so a pool has two.
SETTINGS_MINIMUM = {"block_size": 1, "num_blocks": 2, "max_num_batched_tokens": 1, "retention_interval": 0,
                    "long_prefill_token_threshold": 0}


def _check_settings(side: str, meta: dict[str, Any]) -> None:
    """RecordingError naming the sidecar and its field where a field the diagnosis reads is of the
    wrong type or out of range: ``settings`` (an object or null), each of :data:`SETTINGS_MINIMUM`
    in it, ``settings.retention_interval`` a multiple of ``settings.block_size`` (as vLLM requires),
    and ``max_num_seqs`` (an integer >= 1 or null)."""

    def integer(name: str, value: Any, minimum: int) -> None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
            raise RecordingError(f"{side}: field {name!r}: expected an integer >= {minimum} (or null), got "
                                 f"{described(value)}")

    integer("max_num_seqs", meta.get("max_num_seqs"), 1)
    settings = meta.get("settings")
    if settings is None:
        return
    if not isinstance(settings, dict):
        raise RecordingError(f"{side}: field 'settings': expected a JSON object (the server's scheduler settings) "
                             f"or null, got {described(settings)}")
    for key, minimum in SETTINGS_MINIMUM.items():
        integer(f"settings.{key}", settings.get(key), minimum)
    interval, block = settings.get("retention_interval"), settings.get("block_size")
    if interval and block and interval % block:
        raise RecordingError(f"{side}: field 'settings.retention_interval': expected a multiple of "
                             f"settings.block_size {block} (as vLLM requires), got {interval}")


def read_recording(path: str | os.PathLike, limit: int | None = None) -> Recording:
    """Read and check a recording and its sidecar; RecordingError (naming file, line and field) or
    FileNotFoundError.

    ``limit``: keep the first ``limit`` requests by arrival (ties in file order), not the first lines:
    a line is written when its request finishes, so the file is in finishing order. Every line is
    read and checked all the same (a cut last line is skipped with a warning, a bad line refused);
    the requests kept stay in file order. A request vLLM freed before computing a token of it
    (``num_computed_tokens`` 0, no output, no preemption: aborted while it waited) is left out, with
    a warning: the server never computed or cached its prompt.

    Refused (RecordingError): a sidecar field the diagnosis reads of the wrong type or range
    (``max_num_seqs``, ``settings`` and its :data:`SETTINGS_MINIMUM` fields), a line whose ``finish``
    is before its ``arrival``, a request of more than :data:`MAX_REQUEST_TOKENS` tokens, and a gzip
    stream under a name without ``.gz`` (said to be gzip). ``truncated`` in the sidecar is a warning,
    with its ``truncated_reason`` where given."""
    path = os.fspath(path)
    meta = _read_meta(path)
    bs = int(meta["block_size"])
    try:
        with open_binary(path) as fh:        # gzipped where the name ends in .gz
            lines = fh.read().split(b"\n")
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise RecordingError(f"{path}: not a whole gzip stream ({exc}): gunzip it, or copy it again") from None
    if lines[0].startswith(_GZIP_MAGIC) and not path.lower().endswith(".gz"):
        raise RecordingError(f"{path}: gzip-compressed (it starts with gzip's magic bytes 1f 8b), but its name does "
                             "not end in .gz: gunzip it, or rename it to end in .gz (its sidecar is still found)")
    numbered = [(i + 1, raw) for i, raw in enumerate(lines) if raw.strip()]
    if not numbered:
        raise RecordingError(f"{path}: empty: no header and no request (was the server stopped before any request "
                             "finished?)")
    rec = Recording(path, meta, [])
    parent_of: dict[int, int] = {}
    depth_of: dict[int, int] = {}
    first_seen: dict[int, int] = {}
    never_served = 0
    seen_lines: dict[tuple, int] = {}        # a request's whole content -> its first line
    repeated: list[tuple[int, int]] = []
    last_line = numbered[-1][0]
    for k, (line, raw) in enumerate(numbered):
        try:
            obj = json.loads(raw)
        except ValueError as exc:
            if line == last_line and not raw.endswith(b"}"):
                rec.warnings.append(f"{path}:{line}: the last line is cut short (a server stopped mid-write?); "
                                    "it is skipped")
                break
            raise RecordingError(f"{path}:{line}: not JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise RecordingError(f"{path}:{line}: expected a JSON object, got {described(obj)}")
        if k == 0:
            if "recording" not in obj:
                raise RecordingError(f"{path}:{line}: field 'recording': missing: the first line of a recording is "
                                     "its header (written by MARCONI_VLLM_RECORD)")
            if obj["recording"] != meta["salt_id"]:
                raise RecordingError(f"{path}:{line}: field 'recording': salt mismatch: the file was recorded with "
                                     f"salt {obj['recording']!r}, its sidecar {sidecar_of(path)} holds "
                                     f"{meta['salt_id']!r} (a sidecar from another recording?)")
            continue
        if "recording" in obj:
            raise RecordingError(f"{path}:{line}: field 'recording': a second header (two recordings concatenated? "
                                 "their hash ids cannot be compared: diagnose them apart)")
        arrival = _time(obj, "arrival", path, line)
        finish = _time(obj, "finish", path, line)
        if finish < arrival:
            raise RecordingError(f"{_where(path, line, 'finish')}: {finish} is before field 'arrival' {arrival}: a "
                                 "request is freed after it arrives (a clock stepped back while recording?)")
        prompt_len = _int(obj, "prompt_len", path, line, 1)
        output_len = _int(obj, "output_len", path, line, 0)
        if prompt_len + output_len > MAX_REQUEST_TOKENS:
            name = "prompt_len" if prompt_len > MAX_REQUEST_TOKENS else "output_len"
            raise RecordingError(f"{_where(path, line, name)}: prompt_len {prompt_len:,} + output_len {output_len:,} "
                                 f"tokens exceed {MAX_REQUEST_TOKENS:,}, more than any model's context window "
                                 "(a corrupt line?)")
        cached = _int(obj, "num_cached_tokens", path, line, 0)
        preempt = _int(obj, "num_preemptions", path, line, 0)
        if "num_computed_tokens" in obj:   # recordings before it lack the field: every request was served
            computed = _int(obj, "num_computed_tokens", path, line, 0)
            if computed == 0 and output_len == 0 and preempt == 0:
                never_served += 1      # aborted while it waited (a client that gave up): the server computed nothing
                continue
        if cached > prompt_len:
            raise RecordingError(f"{_where(path, line, 'num_cached_tokens')}: {cached} exceeds prompt_len {prompt_len}")
        ids = obj.get("hash_ids")
        if not isinstance(ids, list):
            raise RecordingError(f"{_where(path, line, 'hash_ids')}: expected a list of integers in [0, 2**63), "
                                 f"got {described(ids)}")
        if not all(type(h) is int and 0 <= h < _FRESH for h in ids):
            i, h = next((i, h) for i, h in enumerate(ids) if not (type(h) is int and 0 <= h < _FRESH))
            raise RecordingError(f"{_where(path, line, 'hash_ids')}: expected a list of integers in [0, 2**63), "
                                 f"element {i} is {described(h)}")
        if len(ids) < prompt_len // bs or len(ids) > (prompt_len + output_len) // bs:
            raise RecordingError(f"{_where(path, line, 'hash_ids')}: {len(ids)} blocks of {bs} tokens do not fit "
                                 f"prompt_len {prompt_len} + output_len {output_len} (expected "
                                 f"{prompt_len // bs} to {(prompt_len + output_len) // bs}; is the sidecar's "
                                 "block_size this recording's?)")
        parent = -1
        for d, h in enumerate(ids):
            seen = parent_of.setdefault(h, parent)
            if seen != parent or depth_of.setdefault(h, d) != d:
                raise RecordingError(f"{_where(path, line, 'hash_ids')}: hash chains contradict each other: id {h} at "
                                     f"block {d} follows {parent}, but followed {seen} at block {depth_of[h]} on "
                                     f"line {first_seen[h]}")
            first_seen.setdefault(h, line)
            parent = h
        rec.requests.append(RecordedRequest(f"{path}:{line}", arrival, finish, prompt_len, output_len, tuple(ids),
                                            cached, preempt))
        twin = seen_lines.setdefault((arrival, finish, prompt_len, output_len, tuple(ids)), line)
        if twin != line:
            repeated.append((line, twin))
    if repeated:        # two real requests never share both times to the last digit: a file joined to itself?
        shown = ", ".join(f"{a} repeats {b}" for a, b in repeated[:5]) + (", ..." if len(repeated) > 5 else "")
        rec.warnings.append(f"{path}: {len(repeated)} line(s) repeat an earlier line exactly (the same arrival and "
                            f"finish times and blocks: lines {shown}); a copy joined to the file? both are kept: "
                            "remove the copies for a true diagnosis")
    if never_served:
        rec.warnings.append(f"{path}: field 'num_computed_tokens': {never_served} request(s) left out, aborted "
                            "before vLLM computed a token of them (clients that gave up while they waited): "
                            "replayed, they would compute and cache prompts the server never did")
    if not rec.requests:
        raise RecordingError(f"{path}: holds no request (only its header): nothing finished while it recorded"
                             + (f" ({never_served} aborted before being served)" if never_served else ""))
    rec.num_read = len(rec.requests)
    if limit is not None and len(rec.requests) > limit:      # the first to arrive, not the first to finish
        first = sorted(range(len(rec.requests)), key=lambda i: rec.requests[i].arrival)[:limit]
        rec.requests = [rec.requests[i] for i in sorted(first)]
    if meta.get("truncated"):
        why = meta.get("truncated_reason")
        why = why if isinstance(why, str) and why.strip() else "at its size cap"
        rec.warnings.append(f"{sidecar_of(path)}: field 'truncated': the recording stopped early ({why}); "
                            "later traffic is missing")
    return rec


def build_recording_trace(source: str | os.PathLike | Recording, *, limit: int | None = None,
                          vocab_size: int = 32000, output_vocab: int = 1024, seed: int = 0,
                          progress: Progress | None = None) -> Trace:
    """The token trace of a recording (see the module docstring), ordered by arrival."""
    rec = source if isinstance(source, Recording) else read_recording(source, limit=limit)
    bs = rec.block_size
    order = sorted(range(len(rec.requests)), key=lambda i: rec.requests[i].arrival)
    reqs = [rec.requests[i] for i in order]
    t0 = reqs[0].arrival
    rows = []
    fresh = _FRESH
    for r in reqs:
        total = r.prompt_len + max(1, r.output_len)
        ids = list(r.hash_ids)
        while len(ids) * bs < total:
            ids.append(fresh)
            fresh += 1
        rows.append(MooncakeRow(r.where, (r.arrival - t0) * 1000.0, total, 0, tuple(ids)))
    tokens = MooncakeTokens(rows, block_size=bs, vocab_size=vocab_size, output_vocab=output_vocab, seed=seed)
    out = []
    wrap = progress or no_progress
    for i, (r, row) in enumerate(wrap(list(zip(reqs, rows)))):
        seq = tokens.input_tokens(row)
        out.append(Request(i, 0, r.arrival - t0, seq[:r.prompt_len], seq[r.prompt_len:r.prompt_len + r.output_len]))
    meta = {"source": "vllm-recording", "files": [str(rec.path)], "block_size": bs,
            "num_requests_read": rec.num_read or len(rec.requests),
            "recording": {k: v for k, v in rec.meta.items() if k != "salt"},
            "recorded": {"num_cached_tokens": [r.num_cached_tokens for r in reqs],
                         "num_preemptions": [r.num_preemptions for r in reqs],
                         "arrival": [r.arrival - t0 for r in reqs], "finish": [r.finish - t0 for r in reqs],
                         "where": [r.where for r in reqs]},
            "warnings": list(rec.warnings)}
    trace = Trace(out, name=f"recording-{Path(rec.path).stem}", meta=meta)
    return trace
