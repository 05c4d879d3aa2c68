"""Replay a request trace through a cache, libCacheSim-style: :func:`simulate` takes a built
:class:`~marconi.core.protocol.ReplayCache`, :func:`simulate_system` builds a named system's.
Modes ``sequential`` and ``event`` (docs/simulator.md, "Timing modes"). Returns data; never prints."""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from marconi.core.cache import ManualClock, PrefixCache
from marconi.core.protocol import ReplayCache
from marconi.core.model import ModelSpec, get_model
from marconi.sim.latency import LatencyModel, make_latency
from marconi.core.stats import CacheStats
from marconi.sim.systems import System, make_system
from marconi.workloads.trace import Request

__all__ = ["SimResult", "simulate", "simulate_system", "check_mode", "working_set_bytes", "MODES"]

MODES = ("sequential", "event")


@dataclass(slots=True)
class SimResult:
    """Everything one simulation produced; ``record()`` flattens it for JSONL (``system``: the echo;
    ``tuning``: what the cache's tuner reported)."""

    system: dict[str, Any]
    spec: ModelSpec
    capacity_bytes: int
    mode: str
    latency: str
    stats: CacheStats
    input_len: np.ndarray
    reused_len: np.ndarray
    kv_hit_len: np.ndarray
    ttft_s: np.ndarray
    vanilla_ttft_s: np.ndarray
    arrival_s: np.ndarray
    tuning: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0

    @property
    def tuned_alphas(self) -> list[tuple[int, float]]:
        """The bootstrap tuner's choices: (request count when it tuned, α)."""
        return [(int(i), float(a)) for i, a in self.tuning.get("tuned_alphas", [])]

    @property
    def rule_switches(self) -> list[tuple[int, str]]:
        """The adaptive eviction's switches: (request that began under the new rule, its label)."""
        return [(int(i), str(r)) for i, r in self.tuning.get("rule_switches", [])]

    @property
    def num_requests(self) -> int:
        return len(self.input_len)

    @property
    def hit_rate_per_request(self) -> np.ndarray:
        return self.reused_len / np.maximum(self.input_len, 1)

    def record(self, *, per_request: bool = True, **extra: Any) -> dict[str, Any]:
        st = self.stats
        hits = self.hit_rate_per_request
        pct = (lambda a, q: float(np.percentile(a, q)) if len(a) else 0.0)
        rec: dict[str, Any] = {
            **extra,
            "system": self.system.get("system"),
            "admission": self.system.get("admission"),
            "eviction": self.system.get("eviction"),
            "tuning": self.system.get("tuning"),
            "model": self.spec.name,
            "capacity_bytes": self.capacity_bytes,
            "mode": self.mode,
            "latency": self.latency,
            "num_requests": self.num_requests,
            "input_tokens": st.input_tokens,
            "reused_tokens": st.reused_tokens,
            "token_hit_rate": st.token_hit_rate,
            "kv_hit_rate": st.kv_hit_tokens / st.input_tokens if st.input_tokens else 0.0,
            "unusable_rate": st.unusable_tokens / st.input_tokens if st.input_tokens else 0.0,
            "request_hit_fraction": st.num_hits / st.num_requests if st.num_requests else 0.0,
            "flops_saved": st.flops_saved,
            "flops_saved_fraction": st.flops_saved_fraction,
            "hit_rate_p5": pct(hits, 5), "hit_rate_p50": pct(hits, 50), "hit_rate_p95": pct(hits, 95),
            "hit_rate_mean": float(hits.mean()) if len(hits) else 0.0,
            "ttft_p5_s": pct(self.ttft_s, 5), "ttft_p50_s": pct(self.ttft_s, 50), "ttft_p95_s": pct(self.ttft_s, 95),
            "vanilla_ttft_p95_s": pct(self.vanilla_ttft_s, 95),
            "checkpoints_admitted": st.checkpoints_admitted, "checkpoints_evicted": st.checkpoints_evicted,
            "checkpoints_reused": st.checkpoints_reused, "checkpoints_unavailable": st.checkpoints_unavailable,
            "evictions_leaf": st.evictions_leaf, "evictions_inner": st.evictions_inner,
            "requests_not_cached": st.requests_not_cached,
            "peak_bytes": st.peak_bytes, "peak_kv_bytes": st.peak_kv_bytes, "peak_ssm_bytes": st.peak_ssm_bytes,
            "tuned_alphas": [[i, a] for i, a in self.tuned_alphas],
            "rule_switches": [[i, r] for i, r in self.rule_switches],
            "tuning_seconds": float(self.tuning.get("tuning_seconds", 0.0)),
            **({"tuning_windows": self.tuning["tuning_windows"]} if "tuning_windows" in self.tuning else {}),
            "elapsed_s": self.elapsed_s,
            "requests_per_s": self.num_requests / self.elapsed_s if self.elapsed_s > 0 else None,
        }
        if per_request:
            rec["per_request"] = {
                "hit_rate": np.round(hits, 5).tolist(),
                "input_len": self.input_len.tolist(),
                "ttft_s": np.round(self.ttft_s, 6).tolist(),
            }
        return rec


def _check_order(prev_ts: float, ts: float, index: int) -> None:
    if ts < prev_ts:
        raise ValueError(f"request {index}: timestamp {ts} is earlier than the previous request's {prev_ts}; "
                         "traces must be sorted by ts")


def simulate(trace: Iterable[Request], cache: ReplayCache, *, clock: ManualClock | None = None,
             latency: LatencyModel | str | None = "a100", mode: str = "sequential", progress: Any = None,
             system: Mapping[str, Any] | None = None) -> SimResult:
    """Replay ``trace`` (timestamp order) through the built ``cache``.

    ``clock``: the :class:`ManualClock` the cache reads, set to each arrival (and event ends); None:
    the cache's own. ``latency``: the TTFT model. ``mode``: ``sequential`` or ``event``. ``progress``:
    called with the count replayed (every 256 and at the end). ``system``: the record's echo (default
    ``cache.describe()``). ValueError if timestamps decrease or the mode is unknown.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {MODES}")
    spec = cache.spec
    lat = make_latency(latency)
    clock = clock if clock is not None else _NoClock()
    started = time.perf_counter()
    rows = _run_sequential(trace, cache, clock, progress) if mode == "sequential" else \
        _run_event(trace, cache, clock, lat, spec, progress)
    elapsed = time.perf_counter() - started
    input_len = np.array([r[0] for r in rows], dtype=np.int64)
    reused = np.array([r[1] for r in rows], dtype=np.int64)
    kv_hit = np.array([r[2] for r in rows], dtype=np.int64)
    arrival = np.array([r[3] for r in rows], dtype=np.float64)
    ttft = np.array([lat.ttft_s(spec, int(n), int(h)) for n, h in zip(input_len, reused)], dtype=np.float64)
    vanilla = np.array([lat.ttft_s(spec, int(n), 0) for n in input_len], dtype=np.float64)
    chooser = cache.chooser
    if system is None:
        described = cache.describe()
        system = {"system": "custom", **{k: described.get(k) for k in ("admission", "eviction")}, "tuning": None}
    return SimResult(dict(system), spec, cache.capacity_bytes, mode, lat.name, cache.stats, input_len, reused,
                     kv_hit, ttft, vanilla, arrival, chooser.tuning_record() if chooser is not None else {}, elapsed)


def check_mode(system: System | str, mode: str) -> None:
    """Whether ``system`` can be replayed in ``mode``. ValueError for an unknown mode, and for ``event``
    where the system's cache cannot take requests in flight together (``System.event_mode``:
    ``vllm-align`` admits a whole prefill at arrival, so an overlapping request would hit what is
    still being computed)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {MODES}")
    system = make_system(system)
    if mode == "event" and not system.event_mode:
        raise ValueError(f"{system.label}: --mode event is not modelled for it (it admits a request's whole prefill "
                         "on arrival, so requests in flight together would hit what is still being computed): use "
                         "--mode sequential, or `marconi vllm replay --trace-times` (vLLM's own scheduler on the "
                         "trace's times)")


def simulate_system(trace: Iterable[Request], system: System | str, spec: ModelSpec | str,
                    capacity_bytes: float, *, latency: LatencyModel | str | None = "a100", mode: str = "sequential",
                    tuning_workers: int | None = None, tuning_mapper: Any = None, progress: Any = None) -> SimResult:
    """:func:`simulate` through a fresh cache of ``system`` whose clock follows arrival times; ``oracle``
    gets the whole trace, ``infinite`` reports the requested capacity. ValueError: :func:`check_mode`."""
    system = make_system(system)
    check_mode(system, mode)
    clock = ManualClock()
    future = None
    if system.needs_future:
        trace = trace if isinstance(trace, Sequence) else list(trace)
        future = trace
    cache = system.build(spec, capacity_bytes, clock=clock, tuning_workers=tuning_workers, tuning_mapper=tuning_mapper,
                         future=future)
    result = simulate(trace, cache, clock=clock, latency=latency, mode=mode, progress=progress,
                      system=system.record_fields())
    if system.unbounded:
        result.capacity_bytes = int(capacity_bytes)
    return result


class _NoClock:
    """Stands in for the clock when the cache keeps its own: setting ``now`` does nothing."""

    __slots__ = ()

    @property
    def now(self) -> float:
        return 0.0

    @now.setter
    def now(self, value: float) -> None:
        pass


def _run_sequential(trace: Iterable[Request], cache: ReplayCache, clock: ManualClock,
                    progress: Any) -> list[tuple[int, int, int, float]]:
    rows = []
    prev = float("-inf")
    for i, req in enumerate(trace):
        _check_order(prev, req.ts, i)
        prev = clock.now = req.ts
        handle = cache.begin(req.input_tokens)
        m = handle.match
        cache.finish(handle, req.output_tokens)
        rows.append((m.input_len, m.usable_hit_len, m.kv_hit_len, req.ts))
        if progress is not None and (i + 1) % 256 == 0:
            progress(i + 1)
    if progress is not None:
        progress(len(rows))
    return rows


def _run_event(trace: Iterable[Request], cache: ReplayCache, clock: ManualClock, lat: LatencyModel,
               spec: ModelSpec, progress: Any) -> list[tuple[int, int, int, float]]:
    rows = []
    events: list[tuple[float, int, str, Any, Any]] = []
    order = 0
    prev = float("-inf")

    def drain(until: float) -> None:
        while events and events[0][0] <= until:
            at, _, kind, handle, output = heapq.heappop(events)
            clock.now = at
            if kind == "prefill":
                cache.insert_prefill(handle)
            else:
                cache.finish(handle, output)

    for i, req in enumerate(trace):
        _check_order(prev, req.ts, i)
        prev = req.ts
        drain(req.ts)
        clock.now = req.ts
        handle = cache.begin(req.input_tokens)
        m = handle.match
        prefill_end = req.ts + lat.ttft_s(spec, m.input_len, m.usable_hit_len)
        done = prefill_end + lat.decode_s(spec, len(req.output_tokens))
        heapq.heappush(events, (prefill_end, order, "prefill", handle, None))
        heapq.heappush(events, (done, order + 1, "finish", handle, req.output_tokens))
        order += 2
        rows.append((m.input_len, m.usable_hit_len, m.kv_hit_len, req.ts))
        if progress is not None and (i + 1) % 256 == 0:
            progress(i + 1)
    drain(float("inf"))
    if progress is not None:
        progress(len(rows))
    return rows


def working_set_bytes(trace: Sequence[Request], spec: ModelSpec | str) -> int:
    """Bytes an unbounded Marconi-admission cache holds after the whole trace (KVs of every distinct
    sequence plus its checkpoints): the reference for fractional capacities (``0.1x``)."""
    spec = get_model(spec)
    cache = PrefixCache(spec, 2**62, "marconi", "lru")
    for req in trace:
        cache.process(req.input_tokens, req.output_tokens)
    return cache.used_bytes
