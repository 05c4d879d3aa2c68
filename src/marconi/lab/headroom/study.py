"""Replaying the variants of one point, the per-request anatomy of the gap, and its records.

A **point** is (trace, model, capacity, default system). :func:`run_point` replays the trace
through every variant of :mod:`.variants` (sequential mode, the simulator's clock and order),
then compares the default and the oracle request by request. For request ``r`` with ``O`` and
``D`` tokens reused by the oracle and the default:

* ``gained = max(O - D, 0)`` tokens are the oracle's, attributed to the entry the oracle resumed
  from (its kind, depth and bytes; whether the default ever admitted a state at that prefix, so
  evicted it, or never did; whether the default still held the KVs there, "KV only");
* ``lost = max(D - O, 0)`` tokens are the default's, attributed to the default's entry the same way;
* ``net = gained - lost``; summed over requests it is ``reused(oracle) - reused(default)``, the gap.

Every breakdown (:data:`DIMENSIONS`) puts each request's gained and lost tokens in exactly one
bucket, so each dimension's buckets sum to the whole gap (tests check it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from marconi.core.cache import ManualClock, PrefixCache
from marconi.core.model import ModelSpec, get_model
from marconi.lab.headroom.sessions import (BRANCH, LAST_TOKEN, NONE, PrefixHasher, SessionView,
                                                   derive_sessions, entry_kind, trace_sessions)
from marconi.lab.headroom.variants import DECOMPOSITION, VARIANTS, build_variant, default_system, future_of
from marconi.sim.oracle import FutureIndex
from marconi.workloads.trace import Request

__all__ = ["VariantRun", "Anatomy", "DIMENSIONS", "replay", "anatomy", "breakdown_rows", "run_point",
           "point_record"]

#: Breakdowns of the gap: (dimension, what it buckets by).
DIMENSIONS = (
    ("entry_kind", "kind of the entry that served the hit (the oracle's for gained tokens, the default's for lost)"),
    ("other_held", "what the other cache held at that depth: the KVs without a state (KV only), or not even those"),
    ("kept_or_evicted", "whether the other cache had admitted a state at that prefix before (so evicted it) or never"),
    ("cause", "entry kind x admitted-and-evicted / never admitted x KV only / no KVs, together"),
    ("turn", "the trace's turn index"),
    ("derived_turn", "turn index derived from token prefixes alone (no session id)"),
    ("since_last", "seconds since the session's previous request (trace session ids)"),
    ("derived_since_last", "seconds since the derived session's previous request"),
    ("depth", "depth of the entry (tokens)"),
    ("entry_bytes", "bytes of the entry's node (edge KVs + states), in units of one SSM state"),
    ("trace_quarter", "where in the trace the request arrives"),
)

_TURN_EDGES = (0, 1, 2, 3, 5, 10, 20)
_TURN_LABELS = ("0", "1", "2", "3-4", "5-9", "10-19", "20+")
_SINCE_EDGES = (1.0, 10.0, 60.0, 300.0, 1800.0)
_SINCE_LABELS = ("<1 s", "1-10 s", "10-60 s", "1-5 min", "5-30 min", ">30 min")
_DEPTH_EDGES = (1024, 4096, 16384, 65536)
_DEPTH_LABELS = ("<1k", "1k-4k", "4k-16k", "16k-64k", ">=64k")
_BYTES_EDGES = (1.25, 3.0, 10.0)
_BYTES_LABELS = ("<=1.25", "1.25-3", "3-10", ">10")


@dataclass(slots=True)
class VariantRun:
    """One replay, per request (arrival order): tokens reused and KV-matched, bytes of the node
    resumed from (0: no hit), and the positions (in input + output) that received a new state."""

    variant: str
    usable: np.ndarray
    kv_hit: np.ndarray
    hit_bytes: np.ndarray
    admitted: list[tuple[int, ...]]
    stats: dict[str, Any]
    elapsed_s: float

    @property
    def reused_tokens(self) -> int:
        return int(self.usable.sum())


def replay(trace: Sequence[Request], cache: PrefixCache, clock: ManualClock, variant: str = "custom",
           progress: Callable[[int], None] | None = None) -> VariantRun:
    """Replay ``trace`` in order through ``cache`` as :func:`marconi.sim.simulate` does in
    sequential mode (clock at each arrival, begin, finish), keeping what the anatomy needs."""
    n = len(trace)
    usable = np.zeros(n, dtype=np.int64)
    kv_hit = np.zeros(n, dtype=np.int64)
    hit_bytes = np.zeros(n, dtype=np.int64)
    admitted: list[tuple[int, ...]] = []
    kv_per_token, state_bytes = cache.spec.kv_bytes_per_token, cache.spec.ssm_checkpoint_bytes
    started = time.perf_counter()
    for i, req in enumerate(trace):
        clock.now = req.ts
        handle = cache.begin(req.input_tokens)
        usable[i], kv_hit[i] = handle.match.usable_hit_len, handle.match.kv_hit_len
        node = handle.hit_node
        if node is not None:
            hit_bytes[i] = node.edge_len * kv_per_token + node.num_checkpoints * state_bytes
        admitted.append(cache.finish(handle, req.output_tokens).admitted)
        if progress is not None and (i + 1) % 256 == 0:
            progress(256)
    if progress is not None:
        progress(n % 256)
    st = cache.stats
    stats = {"token_hit_rate": st.token_hit_rate, "checkpoints_admitted": st.checkpoints_admitted,
             "checkpoints_evicted": st.checkpoints_evicted, "kv_tokens_inserted": st.kv_tokens_inserted,
             "kv_tokens_evicted": st.kv_tokens_evicted, "requests_not_cached": st.requests_not_cached}
    return VariantRun(variant, usable, kv_hit, hit_bytes, admitted, stats, time.perf_counter() - started)


@dataclass(slots=True)
class Anatomy:
    """The per-request comparison of the default (``d_*``) with the oracle (``o_*``): arrays in
    arrival order; ``*_kind`` in {last-token, branch, none}; ``*_known``: the other cache had
    admitted a state at this one's hit prefix before the request (so it evicted it)."""

    input_len: np.ndarray
    o_usable: np.ndarray
    d_usable: np.ndarray
    o_kv: np.ndarray
    d_kv: np.ndarray
    o_kind: np.ndarray
    d_kind: np.ndarray
    o_bytes: np.ndarray
    d_bytes: np.ndarray
    o_known_to_default: np.ndarray
    d_known_to_oracle: np.ndarray
    trace_view: SessionView
    derived_view: SessionView
    state_bytes: int
    ts: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def gained(self) -> np.ndarray:
        return np.maximum(self.o_usable - self.d_usable, 0)

    @property
    def lost(self) -> np.ndarray:
        return np.maximum(self.d_usable - self.o_usable, 0)

    @property
    def net_tokens(self) -> int:
        return int(self.o_usable.sum() - self.d_usable.sum())


def anatomy(trace: Sequence[Request], default: VariantRun, oracle: VariantRun, spec: ModelSpec,
            derived: SessionView | None = None) -> Anatomy:
    """Compare two replays of ``trace`` request by request (see the module docstring)."""
    n = len(trace)
    hasher = PrefixHasher()
    ends: dict[tuple[int, int], int] = {}
    admitted_by = {"default": set(), "oracle": set()}   # (position, prefix hash) of every state admitted so far
    o_kind = np.empty(n, dtype=object)
    d_kind = np.empty(n, dtype=object)
    o_known = np.zeros(n, dtype=bool)
    d_known = np.zeros(n, dtype=bool)
    for i, req in enumerate(trace):
        seq = np.concatenate((req.input_tokens, req.output_tokens))
        h = hasher.hashes(seq)
        o, d = int(oracle.usable[i]), int(default.usable[i])
        o_key = (o, int(h[o - 1])) if o else None
        d_key = (d, int(h[d - 1])) if d else None
        o_kind[i] = entry_kind(o, o_key[1], ends, i) if o_key else NONE
        d_kind[i] = entry_kind(d, d_key[1], ends, i) if d_key else NONE
        o_known[i] = o_key is not None and o_key in admitted_by["default"]
        d_known[i] = d_key is not None and d_key in admitted_by["oracle"]
        for name, run in (("default", default), ("oracle", oracle)):
            admitted_by[name].update((p, int(h[p - 1])) for p in run.admitted[i])
        ends.setdefault((len(seq), int(h[-1])), i)
    return Anatomy(np.array([len(r.input_tokens) for r in trace], dtype=np.int64), oracle.usable, default.usable,
                   oracle.kv_hit, default.kv_hit, o_kind, d_kind, oracle.hit_bytes, default.hit_bytes, o_known,
                   d_known, trace_sessions(trace), derived if derived is not None else derive_sessions(trace),
                   spec.ssm_checkpoint_bytes, np.array([r.ts for r in trace], dtype=np.float64))


# ============================================================================ buckets
def _binned(values: np.ndarray, edges: Sequence[float], labels: Sequence[str]) -> np.ndarray:
    return np.array(labels, dtype=object)[np.searchsorted(np.asarray(edges), values, side="right")]


def _turn(view: SessionView) -> np.ndarray:
    return _binned(view.turn, _TURN_EDGES[1:], _TURN_LABELS)


def _since(view: SessionView) -> np.ndarray:
    out = _binned(np.nan_to_num(view.since_last_s, nan=0.0), _SINCE_EDGES, _SINCE_LABELS)
    out[np.isnan(view.since_last_s)] = "first"
    return out


def _held(other_kv: np.ndarray, depth: np.ndarray) -> np.ndarray:
    return np.where(other_kv >= depth, "KV only", "no KVs").astype(object)


def _known(known: np.ndarray) -> np.ndarray:
    return np.where(known, "evicted", "never admitted").astype(object)


def _sides(a: Anatomy, dimension: str) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """(bucket of each request's gained tokens, bucket of its lost tokens, bucket order)."""
    if dimension == "entry_kind":
        return a.o_kind, a.d_kind, (LAST_TOKEN, BRANCH, NONE)
    if dimension == "other_held":
        return _held(a.d_kv, a.o_usable), _held(a.o_kv, a.d_usable), ("KV only", "no KVs")
    if dimension == "kept_or_evicted":
        return _known(a.o_known_to_default), _known(a.d_known_to_oracle), ("evicted", "never admitted")
    if dimension == "cause":
        gained = a.o_kind + " · " + _known(a.o_known_to_default) + " · " + _held(a.d_kv, a.o_usable)
        lost = a.d_kind + " · " + _known(a.d_known_to_oracle) + " · " + _held(a.o_kv, a.d_usable)
        gained[a.o_kind == NONE] = NONE
        lost[a.d_kind == NONE] = NONE
        order = tuple(f"{k} · {s} · {h}" for k in (LAST_TOKEN, BRANCH) for s in ("evicted", "never admitted")
                      for h in ("KV only", "no KVs"))
        return gained, lost, (*order, NONE)
    if dimension in ("turn", "derived_turn"):
        b = _turn(a.trace_view if dimension == "turn" else a.derived_view)
        return b, b, _TURN_LABELS
    if dimension in ("since_last", "derived_since_last"):
        b = _since(a.trace_view if dimension == "since_last" else a.derived_view)
        return b, b, ("first", *_SINCE_LABELS)
    if dimension == "depth":
        return (_binned(a.o_usable, _DEPTH_EDGES, _DEPTH_LABELS), _binned(a.d_usable, _DEPTH_EDGES, _DEPTH_LABELS),
                _DEPTH_LABELS)
    if dimension == "entry_bytes":
        unit = float(a.state_bytes)
        return (_binned(a.o_bytes / unit, _BYTES_EDGES, _BYTES_LABELS),
                _binned(a.d_bytes / unit, _BYTES_EDGES, _BYTES_LABELS), _BYTES_LABELS)
    if dimension == "trace_quarter":
        n = len(a.input_len)
        b = np.array(["Q1", "Q2", "Q3", "Q4"], dtype=object)[np.minimum(4 * np.arange(n) // max(n, 1), 3)]
        return b, b, ("Q1", "Q2", "Q3", "Q4")
    raise KeyError(dimension)


def breakdown_rows(a: Anatomy, dimension: str) -> list[dict[str, Any]]:
    """One row per bucket of ``dimension``: gained, lost and net tokens, requests, and the net as
    a share of the whole gap (None when the gap is 0). Buckets without gained or lost tokens are
    kept when they hold requests (``requests``: requests whose gained-side bucket it is)."""
    gained_at, lost_at, order = _sides(a, dimension)
    gained, lost = a.gained, a.lost
    total = a.net_tokens
    labels = list(order) + sorted((set(gained_at) | set(lost_at[lost > 0])) - set(order))
    rows = []
    for k, label in enumerate(labels):
        g_in, l_in = gained_at == label, lost_at == label
        g, lo = int(gained[g_in].sum()), int(lost[l_in].sum())
        requests = int(g_in.sum())
        if not (g or lo or requests):
            continue
        rows.append({"dimension": dimension, "bucket": str(label), "order": k, "gained_tokens": g, "lost_tokens": lo,
                     "net_tokens": g - lo, "net_share": (g - lo) / total if total else None,
                     "requests_gained": int((g_in & (gained > 0)).sum()), "requests_lost": int((l_in & (lost > 0)).sum()),
                     "requests": requests, "input_tokens": int(a.input_len[g_in].sum())})
    return rows


# ============================================================================ one point
def _session_agreement(a: Anatomy) -> dict[str, Any]:
    """How the derived sessions match the trace's: of the requests that continue a trace session,
    the share whose derived predecessor is in the same trace session; of those that open one, the
    share that open a derived one too."""
    t, d = a.trace_view, a.derived_view
    cont = t.predecessor >= 0
    pred = d.predecessor
    same = (pred >= 0) & (t.session[np.maximum(pred, 0)] == t.session)
    return {"trace_sessions": int(t.session.max() + 1) if len(t.session) else 0,
            "derived_sessions": int(d.session.max() + 1) if len(d.session) else 0,
            "continuations_found": float(same[cont].mean()) if cont.any() else None,
            "openings_found": float((pred[~cont] < 0).mean()) if (~cont).any() else None}


def _cumulative(a: Anatomy, points: int = 40) -> list[list[float]]:
    """(request count, gap in pp of all input tokens so far) at ``points`` places along the trace."""
    n = len(a.input_len)
    if n == 0:
        return []
    net = np.cumsum(a.o_usable - a.d_usable)
    tokens = np.cumsum(a.input_len)
    at = np.unique(np.linspace(0, n - 1, min(points, n)).astype(int))
    return [[int(i + 1), round(100.0 * float(net[i]) / float(tokens[i]), 4)] for i in at]


def point_record(key: dict[str, Any], runs: dict[str, VariantRun], a: Anatomy) -> dict[str, Any]:
    """The point's summary: every variant's hit rate, the gap and its decomposition (pp of the
    trace's input tokens), the per-request totals, how well sessions were derived."""
    input_tokens = int(a.input_len.sum())
    pp = (lambda tokens: 100.0 * tokens / input_tokens if input_tokens else 0.0)
    reused = {v: r.reused_tokens for v, r in runs.items()}
    gap = reused["oracle"] - reused["default"]
    parts = {name: pp(reused[hi] - reused[lo]) for name, lo, hi in DECOMPOSITION if lo in reused and hi in reused}
    gained, lost = a.gained, a.lost
    return {**key, "kind": "point", "num_requests": len(a.input_len), "input_tokens": input_tokens,
            "reused_tokens": reused, "hit_rate": {v: t / input_tokens if input_tokens else 0.0 for v, t in reused.items()},
            "gap_tokens": gap, "gap_pp": pp(gap),
            "share_of_oracle": reused["default"] / reused["oracle"] if reused["oracle"] else None,
            "decomposition_pp": parts, "gained_tokens": int(gained.sum()), "lost_tokens": int(lost.sum()),
            "requests_gained": int((gained > 0).sum()), "requests_lost": int((lost > 0).sum()),
            "sessions": _session_agreement(a), "cumulative_gap_pp": _cumulative(a),
            "variant_stats": {v: r.stats for v, r in runs.items()},
            "elapsed_s": {v: round(r.elapsed_s, 3) for v, r in runs.items()}}


def request_rows(key: dict[str, Any], a: Anatomy) -> list[dict[str, Any]]:
    """One row per request where the oracle and the default reused different amounts: which
    entry each resumed from, and what the other cache knew of it."""
    rows = []
    for i in np.flatnonzero(a.o_usable != a.d_usable):
        rows.append({**key, "kind": "request", "request": int(i), "input_len": int(a.input_len[i]),
                     "oracle_reused": int(a.o_usable[i]), "default_reused": int(a.d_usable[i]),
                     "oracle_kv_hit": int(a.o_kv[i]), "default_kv_hit": int(a.d_kv[i]),
                     "oracle_entry": {"kind": a.o_kind[i], "depth": int(a.o_usable[i]), "bytes": int(a.o_bytes[i]),
                                      "default_had_admitted": bool(a.o_known_to_default[i])},
                     "default_entry": {"kind": a.d_kind[i], "depth": int(a.d_usable[i]), "bytes": int(a.d_bytes[i]),
                                       "oracle_had_admitted": bool(a.d_known_to_oracle[i])},
                     "session": int(a.trace_view.session[i]), "turn": int(a.trace_view.turn[i]),
                     "since_last_s": None if np.isnan(a.trace_view.since_last_s[i]) else float(a.trace_view.since_last_s[i]),
                     "derived_session": int(a.derived_view.session[i]), "derived_turn": int(a.derived_view.turn[i])})
    return rows


def run_point(trace: Sequence[Request], key: dict[str, Any], model: str | ModelSpec, capacity_bytes: float,
              default: str = "marconi", *, variants: Sequence[str] = VARIANTS,
              future: FutureIndex | None = None, derived: SessionView | None = None,
              progress: Callable[[int], None] | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every variant of one point, then the anatomy: (point + breakdown records, request rows).

    ``key`` (trace, capacity, ... ) is echoed into every record; ``future`` and ``derived`` may be
    passed in when several points share a trace (they depend on the trace only).
    """
    spec = get_model(model)
    system = default_system(default)
    if "default" not in variants or "oracle" not in variants:
        raise ValueError("the variants must include 'default' and 'oracle'")
    index: list[FutureIndex] = [future] if future is not None else []

    def shared_future() -> FutureIndex:
        if not index:
            index.append(future_of(trace))
        return index[0]

    runs = {}
    for variant in variants:
        clock = ManualClock()
        cache = build_variant(variant, system, spec, capacity_bytes, shared_future, clock)
        runs[variant] = replay(trace, cache, clock, variant, progress)
    key = {**key, "model": spec.name, "default": default, "capacity_bytes": int(capacity_bytes)}
    a = anatomy(trace, runs["default"], runs["oracle"], spec, derived)
    records = [point_record(key, runs, a)]
    for dimension, _ in DIMENSIONS:
        records += [{**key, "kind": "breakdown", **row} for row in breakdown_rows(a, dimension)]
    return records, request_rows(key, a)
