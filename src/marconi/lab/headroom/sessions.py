"""What a request's position in its session is, and what kind of entry a prefix is, from the trace.

Two views of a session:

* **the trace's own fields** (``session_id``, ``turn_id``, ``ts``): turn index and the seconds since
  the session's previous request;
* **derived from the tokens alone** (an engine may have no session id): a request's predecessor is
  the latest earlier request sharing the longest prefix with its input (input + output of the
  earlier one), and it joins that request's derived session when the shared prefix covers at least
  :data:`SAME_SESSION_SHARE` of its input; otherwise it opens a new derived session. Derived turn =
  predecessor's + 1; derived gap = seconds since the derived session's latest request.

An entry's **kind** (:func:`entry_kind`): a state at depth ``d`` on a request's input is a
``last-token`` state when ``input[:d]`` is the whole sequence (input + output) of an earlier
request -- where a conversation or an agent loop resumes -- and a ``branch`` state otherwise (Marconi's
admission holds states only there and at branch points). Prefixes are compared by a positional
64-bit polynomial hash (:class:`PrefixHasher`); two different prefixes collide with probability
about 2^-64 per pair.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from marconi.sim.oracle import FutureIndex
from marconi.workloads.trace import Request

__all__ = ["SAME_SESSION_SHARE", "PrefixHasher", "SessionView", "derive_sessions", "trace_sessions", "entry_kind",
           "LAST_TOKEN", "BRANCH", "NONE"]

#: A request continues the derived session of its predecessor when they share this much of its input.
SAME_SESSION_SHARE = 0.5

LAST_TOKEN, BRANCH, NONE = "last-token", "branch", "none"

_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)   # odd: its powers never vanish modulo 2^64


class PrefixHasher:
    """``hashes(tokens)[p - 1]`` identifies ``tokens[:p]``: ``sum_k (t_k + 1) * W^k`` modulo 2^64.

    Positional, so the hash of a prefix is the same in every sequence that starts with it.
    """

    def __init__(self) -> None:
        self._powers = np.ones(1, dtype=np.uint64)

    def _powers_to(self, n: int) -> np.ndarray:
        if len(self._powers) < n:
            size = max(n, 2 * len(self._powers))
            powers = np.empty(size, dtype=np.uint64)
            powers[0] = 1
            with np.errstate(over="ignore"):
                np.cumprod(np.full(size - 1, _MULTIPLIER, dtype=np.uint64), out=powers[1:])
            self._powers = powers
        return self._powers[:n]

    def hashes(self, tokens: np.ndarray) -> np.ndarray:
        """uint64 ``[len(tokens)]``: entry ``p - 1`` is the hash of ``tokens[:p]``."""
        t = np.asarray(tokens).astype(np.uint64) + np.uint64(1)
        with np.errstate(over="ignore"):
            return np.cumsum(t * self._powers_to(len(t)), dtype=np.uint64)


@dataclass(frozen=True, slots=True)
class SessionView:
    """Per request (arrival order): its session, turn, and seconds since the session's previous
    request (NaN for a session's first). ``shared_len`` (derived view only): tokens of the input
    shared with the predecessor (0: none); ``predecessor``: its index, -1 for none."""

    session: np.ndarray        # int64 [n], a dense session index
    turn: np.ndarray           # int64 [n]
    since_last_s: np.ndarray   # float64 [n]
    predecessor: np.ndarray    # int64 [n]
    shared_len: np.ndarray     # int64 [n]


def trace_sessions(trace: Sequence[Request]) -> SessionView:
    """The trace's own ``session_id``, ``turn_id`` and timestamps."""
    n = len(trace)
    ids: dict[object, int] = {}
    last: dict[int, tuple[int, float]] = {}
    session = np.empty(n, dtype=np.int64)
    since = np.full(n, np.nan)
    predecessor = np.full(n, -1, dtype=np.int64)
    for i, req in enumerate(trace):
        s = ids.setdefault(req.session_id, len(ids))
        session[i] = s
        if s in last:
            predecessor[i], ts = last[s]
            since[i] = req.ts - ts
        last[s] = (i, req.ts)
    turn = np.array([r.turn_id for r in trace], dtype=np.int64)
    return SessionView(session, turn, since, predecessor, np.zeros(n, dtype=np.int64))


def derive_sessions(trace: Sequence[Request], share: float = SAME_SESSION_SHARE) -> SessionView:
    """Sessions from the token sequences alone (see the module docstring)."""
    n = len(trace)
    sequences = [np.concatenate((r.input_tokens, r.output_tokens)) for r in trace]
    index = FutureIndex(sequences)   # every sequence; a node's requests all spell its whole prefix
    session = np.empty(n, dtype=np.int64)
    turn = np.zeros(n, dtype=np.int64)
    since = np.full(n, np.nan)
    predecessor = np.full(n, -1, dtype=np.int64)
    shared = np.zeros(n, dtype=np.int64)
    latest_ts: dict[int, float] = {}
    num_sessions = 0
    for i, req in enumerate(trace):
        depth, before = 0, -1
        for end, through in index.segments(np.asarray(req.input_tokens), 0):
            k = int(np.searchsorted(through, i))   # requests through this stretch that came before i
            if k == 0:
                break
            depth, before = end, int(through[k - 1])
        shared[i] = depth
        if before >= 0 and depth >= share * len(req.input_tokens):
            predecessor[i] = before
            session[i] = session[before]
            turn[i] = turn[before] + 1
            since[i] = req.ts - latest_ts[int(session[i])]
        else:
            session[i] = num_sessions
            num_sessions += 1
        latest_ts[int(session[i])] = req.ts
    return SessionView(session, turn, since, predecessor, shared)


def entry_kind(depth: int, prefix_hash: int, sequence_ends: dict[tuple[int, int], int], before: int) -> str:
    """``last-token`` if a request earlier than ``before`` has the whole sequence ``(depth,
    prefix_hash)``, ``branch`` otherwise, ``none`` for depth 0 (no hit)."""
    if depth == 0:
        return NONE
    first = sequence_ends.get((depth, prefix_hash))
    return LAST_TOKEN if first is not None and first < before else BRANCH
