"""The reproduction's trace factory: workloads, their timing variants, shifted mixes, reuse anatomy.

* :class:`TraceFactory` builds each workload's base trace once from the workload catalog
  (:mod:`marconi.workloads.catalog`: real data by the paper's recipe, or the catalog's vendored /
  synthetic stand-ins; :meth:`WorkloadSource.spec` names the catalog entry of each workload,
  :func:`data_available` says what a profile lacks) and derives timing variants without
  re-tokenizing:
  :func:`retime_sessions` (session *k* starts at ``k / sessions_per_second``) and :func:`retime_swe`
  (the SWE builder's own Poisson gaps for another seed / mean, drawn exactly as it draws them).
* :func:`concat_traces`: a workload shift half-way (the second trace starts when the first ends).
* :func:`continuation_stats` / :func:`reuse_kinds`: does a turn's input extend the previous turn's
  input + output (a last-decoded-token checkpoint can only be hit then), and which kind of
  checkpoint served each hit.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from marconi.workloads import Request, Trace, build_workload

__all__ = ["TraceFactory", "WorkloadSource", "retime_sessions", "retime_swe", "concat_traces",
           "continuation_stats", "reuse_kinds", "WORKLOAD_LABELS"]

WORKLOAD_LABELS = {
    "lmsys": "LMSys",
    "sharegpt": "ShareGPT",
    "swe": "SWE agent (keep 5 obs.)",
    "swe-keepall": "SWE agent (keep all obs.)",
    "mooncake": "Mooncake",
}


# ============================================================================ timing variants
def retime_sessions(trace: Trace, sessions_per_second: float, *, name: str | None = None) -> Trace:
    """Shift whole sessions so the *k*-th session (by first arrival) starts at ``k / sessions_per_second``.

    Gaps inside a session are kept (chat builders: the user's typing time), as the paper varies the
    session arrival rate.
    """
    if sessions_per_second <= 0:
        raise ValueError(f"sessions_per_second must be > 0, got {sessions_per_second}")
    start: dict[Any, float] = {}
    for req in trace:
        start.setdefault(req.session_id, req.ts)
    rank = {sid: k for k, sid in enumerate(start)}
    reqs = [Request(r.session_id, r.turn_id, r.ts - start[r.session_id] + rank[r.session_id] / sessions_per_second,
                    r.input_tokens, r.output_tokens) for r in trace]
    meta = {**trace.meta, "retimed": {"sessions_per_second": sessions_per_second}}
    return Trace.from_unsorted(reqs, name=name or f"{trace.name}@sps={sessions_per_second:g}", meta=meta)


def retime_swe(trace: Trace, *, sessions_per_second: float = 1.0, mean_gap_s: float = 7.5, seed: int = 0,
               name: str | None = None) -> Trace:
    """The timing ``build_swe_trace(gaps="poisson", ...)`` gives with these parameters, on built requests.

    Session ``k`` (its int id) starts at ``k / sessions_per_second``; the gap before its call ``j > 0``
    is the ``j``-th draw of ``Poisson(mean_gap_s)`` from ``default_rng([seed, k])`` -- the builder's
    draws (NumPy's Poisson stream is prefix-consistent, so fewer kept calls change nothing).
    """
    if sessions_per_second <= 0 or mean_gap_s < 0:
        raise ValueError("sessions_per_second must be > 0 and mean_gap_s >= 0")
    sessions = trace.sessions()
    reqs: list[Request] = []
    for sid, turns in sessions.items():
        if not isinstance(sid, int):
            raise ValueError(f"retime_swe needs the builder's int session ids, got {sid!r}")
        gaps = np.random.default_rng([seed, sid]).poisson(mean_gap_s, size=max(len(turns) - 1, 0))
        ts = sid / sessions_per_second + np.concatenate([[0.0], np.cumsum(gaps, dtype=np.float64)])
        turns = sorted(turns, key=lambda r: r.turn_id)
        reqs.extend(Request(sid, r.turn_id, float(t), r.input_tokens, r.output_tokens) for r, t in zip(turns, ts))
    params = {"sessions_per_second": sessions_per_second, "mean_gap_s": mean_gap_s, "seed": seed}
    meta = {**trace.meta, "retimed": params}
    return Trace.from_unsorted(reqs, name=name or f"{trace.name}@{params}", meta=meta)


def concat_traces(first: Trace, second: Trace, *, gap_s: float = 1.0, name: str | None = None) -> Trace:
    """``first`` then ``second``: the second's first request arrives ``gap_s`` after the first's last.

    Session ids become ``"A:<id>"`` / ``"B:<id>"`` so the two never collide; ``meta["shift_at"]`` is
    the index of the first request of ``second``.
    """
    if not len(first) or not len(second):
        raise ValueError("both traces must be non-empty")
    offset = first.requests[-1].ts + gap_s - second.requests[0].ts
    reqs = [Request(f"A:{r.session_id}", r.turn_id, r.ts, r.input_tokens, r.output_tokens) for r in first]
    reqs += [Request(f"B:{r.session_id}", r.turn_id, r.ts + offset, r.input_tokens, r.output_tokens) for r in second]
    meta = {"source": "shift", "first": first.name, "second": second.name, "shift_at": len(first),
            "shift_ts": second.requests[0].ts + offset}
    return Trace(reqs, name=name or f"{first.name}->{second.name}", meta=meta)


def first_sessions(trace: Trace, num_requests: int, *, skip_sessions: int = 0) -> Trace:
    """Whole sessions, in order of first arrival after skipping ``skip_sessions``, until ``num_requests``."""
    sessions = list(trace.sessions().items())[skip_sessions:]
    keep: set[Any] = set()
    count = 0
    for sid, reqs in sessions:
        if count >= num_requests:
            break
        keep.add(sid)
        count += len(reqs)
    return Trace([r for r in trace if r.session_id in keep], name=f"{trace.name}[{len(keep)} sessions]",
                 meta=dict(trace.meta))


# ============================================================================ reuse anatomy
def _digest(tokens: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(tokens, dtype=np.int32).tobytes(), digest_size=16).digest()


def continuation_stats(trace: Trace, *, split_turn: int = 7) -> dict[str, Any]:
    """How often turn ``t > 0``'s input starts with turn ``t-1``'s input + output.

    Only then can the previous turn's last-decoded-token checkpoint be hit. Counted separately for
    turns ``1 .. split_turn-1`` and ``>= split_turn`` (the keep-5 recipe starts dropping observations
    at turn 7).
    """
    prev: dict[Any, np.ndarray] = {}
    counts = {"early": [0, 0], "late": [0, 0]}
    for req in trace:
        before = prev.get(req.session_id)
        if before is not None:
            bucket = counts["early" if req.turn_id < split_turn else "late"]
            bucket[1] += 1
            n = before.size
            bucket[0] += int(req.input_tokens.size >= n and np.array_equal(req.input_tokens[:n], before))
        prev[req.session_id] = np.concatenate([req.input_tokens, req.output_tokens])
    out: dict[str, Any] = {"split_turn": split_turn}
    for key, (cont, total) in counts.items():
        out[f"{key}_turns"] = total
        out[f"{key}_continuations"] = cont
        out[f"{key}_fraction"] = cont / total if total else None
    total = counts["early"][1] + counts["late"][1]
    out["fraction"] = (counts["early"][0] + counts["late"][0]) / total if total else None
    return out


def reuse_kinds(trace: Trace, reused_len: Sequence[int]) -> dict[str, Any]:
    """Classify each hit: ``last-token`` if the reused prefix equals an earlier request's input +
    output (a last-decoded-token checkpoint), else ``branch`` (a checkpoint inside an input).

    ``reused_len`` is per request in trace order (a record's ``per_request.reused_len``).
    """
    if len(reused_len) != len(trace):
        raise ValueError(f"{len(reused_len)} reused lengths for a trace of {len(trace)} requests")
    finished: set[bytes] = set()
    hits = {"last-token": 0, "branch": 0}
    tokens = {"last-token": 0, "branch": 0}
    for req, used in zip(trace, reused_len):
        used = int(used)
        if used > 0:
            kind = "last-token" if _digest(req.input_tokens[:used]) in finished else "branch"
            hits[kind] += 1
            tokens[kind] += used
        finished.add(_digest(np.concatenate([req.input_tokens, req.output_tokens])))
    reused = tokens["last-token"] + tokens["branch"]
    return {"hits_last_token": hits["last-token"], "hits_branch": hits["branch"],
            "tokens_last_token": tokens["last-token"], "tokens_branch": tokens["branch"],
            "last_token_share": tokens["last-token"] / reused if reused else None}


# ============================================================================ workloads
@dataclass(frozen=True, slots=True)
class WorkloadSource:
    """Where each workload's base trace comes from and how big it is, as catalog choices.

    ``chat``: ``"shared"`` (ShareGPT from ../shared/data, the paper's ≥ 20-message filter) or
    ``"synthetic"`` (the catalog's stand-in); ``swe`` / ``mooncake``: ``"shared"`` (all data) or
    ``"bundled"`` (the vendored samples). These are the catalog entries' ``data`` values, never
    ``auto``: a profile says which data it runs on, and :func:`with_available_data` switches all of
    it at once (and says so) where the shared data set is absent.
    """

    chat: str = "shared"
    chat_sessions: int = 100
    swe: str = "shared"
    swe_sessions: int = 100
    swe_max_turns: int = 50
    mooncake: str = "shared"
    mooncake_limit: int = 2000
    lmsys_files: tuple[str, ...] = ()
    tokenizer: str | None = None

    def needs_shared_data(self) -> bool:
        return "shared" in (self.chat, self.swe, self.mooncake)

    def bundled(self) -> "WorkloadSource":
        """The same sizes on data in the repository alone: a synthetic chat trace for ShareGPT, the
        vendored SWE and Mooncake samples (10 trajectories, 2,000 requests: sizes are capped there)."""
        return replace(self, chat="synthetic", swe="bundled", mooncake="bundled")

    def describe(self) -> str:
        """Which data each workload is built from, in words (for the CLI and the report)."""
        chat = ("ShareGPT from the shared data set" if self.chat == "shared"
                else "a synthetic chat trace (no ShareGPT)")
        swe = ("mini-swe-agent trajectories from the shared data set" if self.swe == "shared"
               else "the 10 vendored mini-swe-agent trajectories")
        mooncake = ("the Mooncake conversation trace from the shared data set" if self.mooncake == "shared"
                    else "the vendored first 2,000 Mooncake requests")
        lmsys = f"; LMSys from {len(self.lmsys_files)} file(s)" if self.lmsys_files else ""
        return f"chat: {chat}; SWE: {swe}; Mooncake: {mooncake}{lmsys}"

    def spec(self, workload: str) -> str:
        """The catalog spec of a workload's base trace (:func:`marconi.workloads.build_workload`)."""
        swe = f"sessions={self.swe_sessions},max_turns={self.swe_max_turns},data={self.swe}"
        specs = {"lmsys": f"lmsys:sessions={self.chat_sessions}",
                 "sharegpt": f"sharegpt:sessions={self.chat_sessions},data={self.chat}",
                 "swe": f"swe:{swe}",
                 "swe-keepall": f"swe-keepall:{swe}",
                 "mooncake": f"mooncake:requests={self.mooncake_limit},data={self.mooncake}"}
        if workload not in specs:
            raise ValueError(f"unknown workload {workload!r} (choose from {', '.join(specs)})")
        return specs[workload]


@dataclass(slots=True)
class TraceFactory:
    """Builds base traces once (from the catalog) and derives variants."""

    source: WorkloadSource
    _bases: dict[str, Trace] = field(default_factory=dict)

    def workloads(self) -> list[str]:
        out = ["lmsys"] if self.source.lmsys_files else []
        return out + ["sharegpt", "swe", "swe-keepall", "mooncake"]

    def base(self, workload: str) -> Trace:
        if workload not in self._bases:
            self._bases[workload] = self._build(workload)
        return self._bases[workload]

    def _build(self, workload: str) -> Trace:
        # Files and tokenizer travel as overrides (paths may hold commas); entries without them ignore them.
        return build_workload(self.source.spec(workload), files=self.source.lmsys_files,
                              tokenizer=self.source.tokenizer)

    def variant(self, workload: str, *, sessions_per_second: float = 1.0, seed: int = 0,
                mean_gap_s: float = 7.5) -> Trace:
        """The base trace with another arrival rate (chat, SWE) and gap seed / mean (SWE only)."""
        base = self.base(workload)
        if workload in ("swe", "swe-keepall"):
            return retime_swe(base, sessions_per_second=sessions_per_second, mean_gap_s=mean_gap_s, seed=seed)
        if workload == "mooncake":
            return base
        return retime_sessions(base, sessions_per_second)

    def shift(self, first: str, second: str) -> Trace:
        """``first`` then about as many requests of ``second`` (whole sessions; for the same source,
        the second half's sessions are the ones the first half did not use)."""
        a = self.base(first)
        b_full = self.base(second)
        same_source = {first, second} <= {"swe", "swe-keepall"}
        if same_source:  # disjoint trajectories: first half of the sessions, then the second half
            half = max(1, b_full.num_sessions // 2)
            a = Trace([r for r in a if isinstance(r.session_id, int) and r.session_id < half],
                      name=a.name, meta=a.meta)
            b = Trace([r for r in b_full if isinstance(r.session_id, int) and r.session_id >= half],
                      name=b_full.name, meta=b_full.meta)
        else:
            b = first_sessions(b_full, len(a))
        return concat_traces(a, b, name=f"{first}->{second}")


def data_available(source: WorkloadSource) -> list[str]:
    """Problems that stop the real-data profile (empty when everything needed is there)."""
    from marconi.workloads import shared_data_dir
    from marconi.workloads.paths import shared_data_where

    problems = []
    shared = shared_data_dir()
    if source.needs_shared_data() and shared is None:
        problems.append(f"the shared data set was not found (looked at {shared_data_where()}); or use --profile tiny")
    for f in source.lmsys_files:
        if not Path(os.fspath(f)).is_file():
            problems.append(f"--lmsys file not found: {f}")
    return problems
