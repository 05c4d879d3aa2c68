"""Agent traces from SWE agent trajectories by the paper's recipe: each assistant message is a
request whose input is every message before it (older observations past ``keep_observations``
rounds dropped), with seeded Poisson or real gaps. Recipe: docs/data.md ("The SWE agent recipe")."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .messages import (Message, Progress, call_fields, check_text_form, concat_with_offsets, content_text,
                       encode_messages, listed_messages, no_progress, normalize_role, preamble)
from marconi.core.jsonfile import described
from marconi.io import iter_jsonl, read_json

from .paths import bundled_data_dir, shared_data_dir
from .raw import trajectory_files
from .tokenizer import TextTokenizer, load_tokenizer
from .trace import Request, Trace

__all__ = ["Trajectory", "load_trajectories", "load_shared_prefix", "build_swe_trace", "swe_session",
           "SHARED_PREFIXES", "GAP_MODES", "default_swe_paths"]

GAP_MODES = ("poisson", "real")
TRAJECTORY_FIELDS = ("messages", "history", "trajectory")
"""Where a trajectory keeps its messages, first found wins: mini-swe-agent's and the OpenAI format's
(SWE-smith's as a JSON string), SWE-agent's ``.traj``, and nebius's SWE-agent exports (``role``
``system``/``user``/``ai`` and ``text``)."""
SHARED_PREFIXES = {"sweagent-demo": "swe/sweagent_gpt4_pydicom-1458.traj"}
"""Named shared prefixes -> vendored ``.traj`` (relative to ``marconi/data``) they are extracted from."""


@dataclass(frozen=True, slots=True)
class Trajectory:
    """One agent run: its name (instance id or file stem), messages, and the file it came from."""

    name: str
    messages: tuple[Message, ...]
    source: str


def _message(obj: Any, where: str) -> Message:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: a message must be an object with a 'role', got {described(obj)}")
    if "role" not in obj:
        raise ValueError(f"{where}: a message must be an object with a 'role'")
    try:
        role = normalize_role(obj["role"])
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    content = content_text(obj.get("content") if "content" in obj else obj.get("text"), where)
    created = obj.get("created")
    if created is not None and (isinstance(created, bool) or not isinstance(created, (int, float))
                                or not math.isfinite(created)):
        raise ValueError(f"{where}: 'created' must be a unix time in seconds, got {described(created)}")
    return Message(role=role, content=content, raw={"role": obj["role"], "content": content, **call_fields(obj)},
                   created=None if created is None else float(created))


def _trajectory(obj: Any, name: str, source: str) -> Trajectory:
    if not isinstance(obj, dict):
        raise ValueError(f"{source}: a trajectory must be an object, got {described(obj)}")
    listed = listed_messages(obj, TRAJECTORY_FIELDS)
    if listed is None:
        raise ValueError(f"{source}: trajectory {name!r} has no 'messages' or 'history'")
    field, msgs = listed
    if field != "history":
        name = str(obj.get("instance_id") or name)
    if not isinstance(msgs, list):
        raise ValueError(f"{source}: trajectory {name!r}: messages must be a list, got {described(msgs)}")
    messages = tuple(_message(m, f"{source}: trajectory {name!r} message {i}") for i, m in enumerate(msgs))
    return Trajectory(name=name, messages=preamble(obj) + messages, source=source)


def _file_stem(path: Path) -> str:
    name = path.name
    for suffix in (".traj.json", ".traj", ".json", ".jsonl.gz", ".jsonl"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _trajectory_files(paths: Sequence[str | os.PathLike]) -> list[Path]:
    files: list[Path] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            files.extend(trajectory_files(path))
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"trajectory file or directory not found: {p}")
    return files


_INDEXED = re.compile(r"(.*)\[(\d+)\]")


def _name_order(name: str) -> tuple[str, int]:
    """A trajectory's place in name order: a name given for its index in a file (``stem[10]``: a
    record without an ``instance_id``) sorts by that index as a number, after ``stem[9]``."""
    indexed = _INDEXED.fullmatch(name)
    return (indexed[1], int(indexed[2])) if indexed else (name, -1)


def load_trajectories(paths: Sequence[str | os.PathLike]) -> list[Trajectory]:
    """All trajectories in the given files/directories, sorted by name (stable on ties; names given for
    a record's index in its file by that index, as a number): a ``.json`` or
    ``.traj`` file holds one trajectory or a list of them, a ``.jsonl`` (``.jsonl.gz``) file one a line."""
    out: list[Trajectory] = []
    for path in _trajectory_files(paths):
        if path.name.lower().endswith(".parquet"):
            raise ValueError(f"{path}: the SWE recipe reads .json, .traj and .jsonl trajectories, not Parquet "
                             "(export the table's rows as JSONL)")
        if path.name.lower().endswith((".jsonl", ".jsonl.gz")):    # one trajectory a line
            for where, obj in iter_jsonl(path):
                out.append(_trajectory(obj, f"{_file_stem(path)}[{where.rsplit(':', 1)[1]}]", where))
            continue
        data = read_json(path)
        if isinstance(data, list):
            for i, obj in enumerate(data):
                out.append(_trajectory(obj, f"{_file_stem(path)}[{i}]", str(path)))
        else:
            out.append(_trajectory(data, _file_stem(path), str(path)))
    out.sort(key=lambda t: _name_order(t.name))
    return out


def load_shared_prefix(spec: str | os.PathLike) -> tuple[Message, ...]:
    """The leading system and demonstration (``is_demo``) messages of a trajectory file, or of a named
    prefix (``"sweagent-demo"``: the vendored SWE-agent GPT-4 run's, about 7.7k tokens)."""
    text = os.fspath(spec)
    path = bundled_data_dir() / SHARED_PREFIXES[text] if text in SHARED_PREFIXES else Path(text)
    if not path.is_file():
        known = ", ".join(SHARED_PREFIXES)
        raise FileNotFoundError(f"shared prefix not found: {text!r} (not a file; known names: {known})")
    data = read_json(path)
    raw_msgs = (data.get("history") or data.get("messages") or []) if isinstance(data, dict) else []
    prefix: list[Message] = []
    for i, obj in enumerate(raw_msgs):
        if not isinstance(obj, dict):
            break
        is_demo = str(obj.get("is_demo", "")).lower() == "true"
        if obj.get("role") != "system" and not is_demo:
            break
        prefix.append(_message(obj, f"{path}: message {i}"))
    if not prefix:
        raise ValueError(f"{path}: no leading system/demonstration messages to use as a shared prefix")
    return tuple(prefix)


def _calls(messages: Sequence[Message]) -> list[int]:
    """The LLM calls: every assistant message but a first message, which has no input to be called
    with (it is history, as in the chat recipe)."""
    return [i for i, m in enumerate(messages) if m.role == "assistant" and i > 0]


def swe_session(session_id: int, start_ts: float, messages: Sequence[Message],
                tokens: Sequence[np.ndarray], *, keep_observations: int | None, gap_s: np.ndarray,
                max_input_len: int, max_turns: int) -> list[Request]:
    """Requests of one tokenized trajectory (``tokens[i]`` of ``messages[i]``; ``gap_s[j]``: gap before
    call j)."""
    calls = _calls(messages)
    stream, offsets = concat_with_offsets(tokens)
    requests: list[Request] = []
    ts = start_ts
    for j, call in enumerate(calls):
        if j >= max_turns:
            break
        if keep_observations is None or j - 1 - keep_observations <= 0:
            inputs = stream[:int(offsets[call])]
        else:
            # round i spans [calls[i], calls[i+1]); its observations are (calls[i], calls[i+1])
            parts = [stream[:int(offsets[calls[0]])]]
            for i in range(j):
                a_start, a_end = int(offsets[calls[i]]), int(offsets[calls[i] + 1])
                round_end = int(offsets[calls[i + 1]])
                keep = i >= j - 1 - keep_observations
                parts.append(stream[a_start:round_end] if keep else stream[a_start:a_end])
            inputs = np.concatenate(parts)
        if inputs.size > max_input_len:
            break
        ts += float(gap_s[j])
        requests.append(Request(session_id, j, ts, inputs, stream[int(offsets[call]):int(offsets[call + 1])]))
    return requests


def _gaps(traj: Trajectory, messages: Sequence[Message], gaps: str, mean_gap_s: float,
          rng: np.random.Generator) -> np.ndarray:
    calls = _calls(messages)
    n = len(calls)
    if gaps == "poisson":
        return np.concatenate([[0.0], rng.poisson(mean_gap_s, size=max(n - 1, 0)).astype(np.float64)])
    created = [messages[c].created for c in calls]
    if any(c is None for c in created):
        raise ValueError(f"{traj.source}: trajectory {traj.name!r} has assistant messages without a "
                         "'created' time; use gaps='poisson'")
    times = np.maximum.accumulate(np.asarray(created, dtype=np.float64)) if n else np.zeros(0)
    return np.diff(times, prepend=times[:1])


def default_swe_paths() -> list[Path]:
    """The shared data set's mini-swe-agent trajectories (compacted arrays, or the original ``trajs/``
    tree read recursively), else the vendored 10-trajectory sample."""
    shared = shared_data_dir()
    folder = shared / "swe" / "mini-swe-agent-gemini3pro" if shared is not None else None
    if folder is not None and folder.is_dir():
        return sorted(folder.glob("msa_*_part*.json")) or [folder]
    return [bundled_data_dir() / "swe" / "msa_gemini3pro_verified_first10.json"]


def build_swe_trace(paths: Sequence[str | os.PathLike] | None = None, *, num_sessions: int | None = 100,
                    sessions_per_second: float = 1.0, keep_observations: int | None = 5,
                    gaps: str = "poisson", mean_gap_s: float = 7.5, seed: int = 0,
                    max_input_len: int = 32768, max_turns: int = 50,
                    shared_prefix: str | os.PathLike | None = None, text_form: str = "json",
                    add_bos: bool = True, tokenizer: TextTokenizer | str | os.PathLike | None = None,
                    progress: Progress | None = None) -> Trace:
    """Build an agent trace (``paths`` default to :func:`default_swe_paths`); session ids 0, 1, ... in
    name order (names in ``meta["source_ids"]``), requests by time. FileNotFoundError for a missing
    file or prefix; ValueError for malformed input, bad parameters or ``gaps="real"`` without times."""
    if gaps not in GAP_MODES:
        raise ValueError(f"unknown gaps {gaps!r} (choose from {', '.join(GAP_MODES)})")
    if sessions_per_second <= 0 or mean_gap_s < 0 or max_input_len <= 0 or max_turns <= 0:
        raise ValueError("sessions_per_second, max_input_len and max_turns must be > 0, mean_gap_s >= 0")
    if keep_observations is not None and keep_observations < 0:
        raise ValueError(f"keep_observations must be >= 0 or None, got {keep_observations}")
    check_text_form(text_form)
    tok = tokenizer if isinstance(tokenizer, TextTokenizer) else load_tokenizer(tokenizer)
    files = list(paths) if paths else default_swe_paths()
    trajectories = load_trajectories(files)
    records = {"records_read": len(trajectories)}
    if num_sessions is not None:
        trajectories = trajectories[:num_sessions]
    records["without_calls"] = sum(1 for t in trajectories if not _calls(t.messages))    # of those kept
    prefix = load_shared_prefix(shared_prefix) if shared_prefix is not None else ()
    prefix_tokens = encode_messages(tok, prefix, text_form, add_bos) if prefix else []

    requests: list[Request] = []
    wrap = progress or no_progress
    for k, traj in enumerate(wrap(trajectories)):
        messages = prefix + traj.messages
        tokens = prefix_tokens + encode_messages(tok, traj.messages, text_form, add_bos)
        gap_s = _gaps(traj, messages, gaps, mean_gap_s, np.random.default_rng([seed, k]))
        requests.extend(swe_session(k, k / sessions_per_second, messages, tokens,
                                    keep_observations=keep_observations, gap_s=gap_s,
                                    max_input_len=max_input_len, max_turns=max_turns))
    params = dict(num_sessions=num_sessions, sessions_per_second=sessions_per_second,
                  keep_observations=keep_observations, gaps=gaps, mean_gap_s=mean_gap_s, seed=seed,
                  max_input_len=max_input_len, max_turns=max_turns,
                  shared_prefix=None if shared_prefix is None else os.fspath(shared_prefix),
                  text_form=text_form, add_bos=add_bos)
    meta = {"source": "swe", "recipe": "marconi-paper-swe", "params": params,
            "files": [str(p) for p in files], "tokenizer": tok.name,
            "num_sessions": len(trajectories), "source_ids": [t.name for t in trajectories],
            "records": records, "shared_prefix_len": int(sum(t.size for t in prefix_tokens))}
    name = f"swe-n{len(trajectories)}-sps{sessions_per_second:g}-{gaps}"
    return Trace.from_unsorted(requests, name=name, meta=meta)
