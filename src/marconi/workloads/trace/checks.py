"""Checks of a whole trace: :func:`inspect_trace` (every problem of a file, plus the warnings
``marconi trace validate`` prints) and :class:`SessionCheck` (what the schema allows but a
multi-turn trace rarely means), also for traces in memory (:func:`session_warnings`).
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path
from typing import Iterable

import numpy as np

from .files import checked_records, not_a_trace_file, problem, stored_meta, trace_format
from .formats import format_named
from .schema import Request, SessionId, Trace, TraceFormatError, TraceProblem

__all__ = ["SessionCheck", "session_warnings", "validate_trace", "inspect_trace"]


class SessionCheck:
    """Warns of repeated (session, turn) pairs and turns whose input does not extend their session's
    previous input + output (expected of some recipes, so warnings). Memory: one (length, digest) per
    session and one position per (session, turn)."""

    def __init__(self) -> None:
        self.first_seen: dict[tuple[SessionId, int], int] = {}
        self.previous: dict[SessionId, tuple[int, bytes]] = {}  # session -> (len(input + output), digest)
        self.duplicates: list[tuple[int, SessionId, int, int]] = []  # (pos, session, turn, first pos)
        self.not_extending: list[int] = []
        self.num_followups = 0

    def add(self, pos: int, session_id: SessionId, turn_id: int, input_tokens: np.ndarray,
            output_tokens: np.ndarray) -> None:
        key = (session_id, turn_id)
        if key in self.first_seen:
            self.duplicates.append((pos, session_id, turn_id, self.first_seen[key]))
        else:
            self.first_seen[key] = pos
        prev = self.previous.get(session_id)
        if prev is not None:
            self.num_followups += 1
            length, digest = prev
            if input_tokens.size < length or _digest(input_tokens[:length]) != digest:
                self.not_extending.append(pos)
        history = np.concatenate([input_tokens, output_tokens]) if output_tokens.size else input_tokens
        self.previous[session_id] = (int(history.size), _digest(history))

    def warnings(self, label: str, fmt: str, max_positions: int = 3) -> list[TraceProblem]:
        """One summary warning per kind; ``fmt``: a file format (positions are lines or rows) or
        ``"memory"``."""
        unit = "request" if fmt == "memory" else format_named(fmt).position
        out = []
        if self.duplicates:
            pos, sid, turn, first = self.duplicates[0]
            message = (f"(session {sid!r}, turn {turn}) already appeared at {unit} {first}; "
                       f"{len(self.duplicates)} repeated (session, turn) pair(s) in all")
            if fmt == "memory":
                out.append(TraceProblem(label, None, None, "turn_id", f"{unit} {pos}: {message}", "warning"))
            else:
                out.append(problem(label, fmt, pos, "turn_id", message, severity="warning"))
        if self.not_extending:
            shown = ", ".join(str(p) for p in self.not_extending[:max_positions])
            more = ", ..." if len(self.not_extending) > max_positions else ""
            out.append(TraceProblem(
                label, None, None, None,
                f"{len(self.not_extending)} of {self.num_followups} follow-up turns do not extend their "
                f"session's previous turn (input + output) ({unit}s {shown}{more}); expected where a recipe "
                "drops old context or a session's requests branch, else the trace may be mis-built",
                severity="warning"))
        return out


def _digest(tokens: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(tokens, dtype=np.int32).tobytes(), digest_size=16).digest()


def session_warnings(trace: Trace | Iterable[Request], label: str = "trace") -> list[TraceProblem]:
    """:class:`SessionCheck` warnings of an in-memory trace (positions are 0-based request indices)."""
    check = SessionCheck()
    for i, req in enumerate(trace):
        check.add(i, req.session_id, req.turn_id, req.input_tokens, req.output_tokens)
    return check.warnings(label, "memory")


def validate_trace(path: str | os.PathLike) -> list[TraceProblem]:
    """Every problem of a trace file (empty: valid): all of each record's field problems and timestamp
    order against the previous valid record."""
    return inspect_trace(path)[0]


def inspect_trace(path: str | os.PathLike) -> tuple[list[TraceProblem], list[TraceProblem]]:
    """(problems, warnings) of a trace file in one pass: :func:`validate_trace`'s (a malformed sidecar
    included), :class:`SessionCheck`'s, and one when the sidecar counts other requests."""
    label = os.fspath(path)
    fmt = trace_format(path)
    if not Path(path).exists():
        return [TraceProblem(label, None, None, None, "file not found")], []
    refusal = not_a_trace_file(path)
    if refusal is not None:  # before anything opens it: a FIFO would block, /dev/zero never end
        return [TraceProblem(label, None, None, None, refusal.removeprefix(f"{label} "))], []
    out: list[TraceProblem] = []
    try:
        meta_where, stored = stored_meta(path)
    except TraceFormatError as exc:
        out.append(exc.problem)
        meta_where, stored = label, {}
    _, checked = checked_records(path)
    prev_ts = -math.inf
    count = 0
    sessions = SessionCheck()
    for pos, fields, problems in checked:
        count += 1
        for field_name, message in problems:
            out.append(problem(label, fmt, pos, field_name, message))
        if not problems:
            sessions.add(pos, fields["session_id"], fields["turn_id"], fields["input_tokens"],
                         fields["output_tokens"])
        if "ts" in fields:
            if fields["ts"] < prev_ts:
                out.append(problem(label, fmt, pos, "ts", f"timestamp {fields['ts']} is earlier than "
                                                           f"the previous request's {prev_ts}"))
            else:
                prev_ts = fields["ts"]
    if count == 0 and not out:
        out.append(TraceProblem(label, None, None, None, "no requests in the file"))
    warnings = sessions.warnings(label, fmt)
    stored_count = stored.get("num_requests")
    if not out and stored_count is not None and stored_count != count:
        beside = meta_where != label
        warnings.append(TraceProblem(
            meta_where, None, None, "num_requests",
            f"the {'sidecar' if beside else 'stored metadata'} says {stored_count} requests but the file has "
            f"{count}: it may describe another version of this trace (its name and meta too); write the "
            f"trace again{', or delete the sidecar' if beside else ''}",
            severity="warning"))
    return out, warnings
