"""Replay a request trace through a cache: ``(trace, system, spec, capacity) -> SimResult``.

Two timing modes:

* ``sequential`` (default): each request is matched, then inserted, before the next one arrives
  — the strict order of the Marconi authors' simulator, so results compare with the paper's.
  The latency model then only *reports* TTFT from each request's uncached tokens.
* ``event``: at arrival a request is matched and its path locked; its prefill checkpoints are
  admitted when its modelled prefill ends; input + output are inserted (and the path unlocked)
  when its modelled decode ends. Concurrent requests therefore miss what is still in flight.

Only the CLI prints; this module returns data.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from marconi.cache import ManualClock, PrefixCache
from marconi.stats import CacheStats
from marconi.model import ModelSpec, get_model
from marconi.sim.latency import LatencyModel, make_latency
from marconi.systems import SystemConfig, make_system
from marconi.adaptive import AdaptiveEviction
from marconi.tuning import BootstrapTuner
from marconi.workloads.trace import Request

__all__ = ["SimResult", "simulate", "working_set_bytes", "MODES"]

MODES = ("sequential", "event")


@dataclass(slots=True)
class SimResult:
    """Everything one simulation produced; ``record()`` flattens it for JSONL."""

    system: SystemConfig
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
    tuned_alphas: list[tuple[int, float]] = field(default_factory=list)
    tuning_seconds: float = 0.0
    elapsed_s: float = 0.0
    rule_switches: list[tuple[int, str]] = field(default_factory=list)   # adaptive: (request, new rule)

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
            "system": self.system.label,
            "admission": self.system.admission,
            "eviction": self.system.eviction,
            "tuning": _tuning_label(self.system),
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
            "tuning_seconds": self.tuning_seconds,
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


def _tuning_label(system: SystemConfig) -> str | None:
    if system.tuning is not None:
        return f"bootstrap:multiplier={system.tuning.multiplier}"
    return "adaptive" if system.eviction.startswith("adaptive") else None


def _check_order(prev_ts: float, ts: float, index: int) -> None:
    if ts < prev_ts:
        raise ValueError(f"request {index}: timestamp {ts} is earlier than the previous request's {prev_ts}; "
                         "traces must be sorted by ts")


def simulate(trace: Iterable[Request], system: SystemConfig | str, spec: ModelSpec | str,
             capacity_bytes: float, *, latency: LatencyModel | str | None = "a100", mode: str = "sequential",
             tuning_workers: int | None = None, tuning_mapper: Any = None, progress: Any = None) -> SimResult:
    """Replay ``trace`` (requests in timestamp order) through a fresh cache of ``system``.

    ``progress`` is an optional callable invoked with the number of requests processed so far
    (every 256 requests and at the end). Raises ValueError if timestamps decrease. Systems that
    read the future (``oracle``) are handed the whole trace.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {MODES}")
    system = make_system(system)
    spec = get_model(spec)
    lat = make_latency(latency)
    clock = ManualClock()
    future = None
    if system.needs_future:
        trace = trace if isinstance(trace, Sequence) else list(trace)
        future = trace
    cache = system.build(spec, capacity_bytes, clock=clock, tuning_workers=tuning_workers, tuning_mapper=tuning_mapper,
                         future=future)
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
    tuners = [o for o in getattr(cache, "_observers", ()) if isinstance(o, BootstrapTuner)]
    tuned = [(e.at_request, e.alpha) for t in tuners for e in t.events]
    tuning_s = sum(e.seconds for t in tuners for e in t.events)
    switches: list[tuple[int, str]] = []
    if isinstance(getattr(cache, "eviction", None), AdaptiveEviction):
        rules = cache.eviction.rules
        switches = [(s.at_request, rules[s.rule].label()) for s in cache.eviction.switches]
    capacity = cache.capacity_bytes if not system.unbounded else int(capacity_bytes)
    return SimResult(system, spec, capacity, mode, lat.name, cache.stats, input_len, reused, kv_hit,
                     ttft, vanilla, arrival, tuned, tuning_s, elapsed, switches)


def _run_sequential(trace: Iterable[Request], cache: PrefixCache, clock: ManualClock,
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


def _run_event(trace: Iterable[Request], cache: PrefixCache, clock: ManualClock, lat: LatencyModel,
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
    """Bytes an unbounded cache with Marconi admission holds after the whole trace.

    The reference for capacities given as a fraction (``0.1x``): KVs of every distinct token
    sequence plus Marconi's (at most two per request) checkpoints.
    """
    spec = get_model(spec)
    cache = PrefixCache(spec, 2**62, "marconi", "lru")
    for req in trace:
        cache.process(req.input_tokens, req.output_tokens)
    return cache.used_bytes
