"""Measured TTFT of the real engine with and without the prefix cache (CPU, one thread).

Three measurements, each a function returning plain records (the CLI and
``benchmarks/engine_bench.py`` print them):

* :func:`replay_ttft` — replay a multi-turn trace through two engines on the same model, one with
  the cache (Marconi admission) and one without (``admission="none"``, same code path). Per
  request: TTFT both ways, the cached fraction ``h``, and measured / ideal where
  ideal = (1 − h) × TTFT without the cache; plus the state save/restore time.
* :func:`checkpoint_overhead` — one prefill of ``L`` tokens unsplit, with a chunk-boundary
  checkpoint and with an exact (segmented) checkpoint at an off-grid position.
* :func:`trace_requests` — a trace's requests cut to what a CPU serves in seconds; with no trace
  file, the catalog's ``agent-cpu-synthetic`` (agents sharing a system prompt, growing histories).

Timings are the fastest of ``repeats`` runs, in thread CPU time by default (``clock="cpu"``: on a
shared machine, what an uncontended core would take with one torch thread) or wall-clock time.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable

import torch

from marconi.engine.engine import Engine
from marconi.engine.models import HybridModel
from marconi.engine.prefill import prefill
from marconi.workloads.trace import Request

__all__ = [
    "CheckpointRecord",
    "TTFTRecord",
    "checkpoint_overhead",
    "replay_ttft",
    "summarize_ttft",
    "trace_requests",
]


def trace_requests(source: Any, *, max_input_len: int, max_sessions: int | None = None,
                   limit: int | None = None) -> list[Request]:
    """Requests of a trace (a ``Trace``, or what ``--trace`` takes: a catalog workload name, a token
    trace, a recording or a raw source, :func:`marconi.workloads.source.load_trace`), cut to fit a CPU.

    Each session keeps its turns up to (not including) the first whose input exceeds
    ``max_input_len`` or whose output is empty; at most ``max_sessions`` sessions (first come) and
    ``limit`` requests are kept, in trace order. Sessions are renumbered 0, 1, ... in order of arrival.
    """
    from marconi.workloads.source import load_trace

    if isinstance(source, str):          # as every command reads --trace: catalog, token trace or raw source
        source = load_trace(source)
    out: list[Request] = []
    sessions: dict[Any, int] = {}
    stopped: set[Any] = set()
    for req in source:
        sid = req.session_id
        if sid in stopped:
            continue
        if req.input_len > max_input_len or req.output_len == 0:
            stopped.add(sid)
            continue
        if sid not in sessions:
            if max_sessions is not None and len(sessions) >= max_sessions:
                stopped.add(sid)
                continue
            sessions[sid] = len(sessions)
        out.append(replace(req, session_id=sessions[sid]))
        if limit is not None and len(out) >= limit:
            break
    return out


# ================================================================================ TTFT replay
@dataclass(frozen=True, slots=True)
class TTFTRecord:
    session: int
    turn: int
    input_len: int
    hit_len: int
    h: float                   # cached fraction of the input
    ttft_cached_s: float       # on the chosen clock (cpu or wall)
    ttft_full_s: float         # same request without the cache
    ideal_s: float             # (1 - h) * ttft_full_s
    ratio: float               # ttft_cached_s / ideal_s
    restore_s: float           # rebuilding the DynamicCache from payloads (in TTFT)
    capture_s: float           # cloning prefill checkpoints (in TTFT)
    save_s: float              # last-token capture + KV slicing + finish (after decode)
    prefill_calls: int

    def to_record(self) -> dict[str, Any]:
        return asdict(self)


def replay_ttft(model: HybridModel, requests: Sequence[Request], *, capacity_bytes: float,
                admission: str = "marconi", eviction: str = "lru", checkpointing: str = "segmented",
                clock: str = "cpu", repeats: int = 1, warmup: bool = True,
                on_request: Callable[[TTFTRecord], None] | None = None) -> list[TTFTRecord]:
    """Replay ``requests`` with and without the cache; one record each (``on_request`` is told each
    as it is measured: a progress bar).

    Outputs are teacher-forced and appended with one forward (``Engine.replay_appended``): TTFT is
    what is measured, not decoding. ``clock``: ``cpu`` (thread CPU time — on a shared machine the
    time an uncontended core would take) or ``wall``; ``repeats``: restore + prefill timed that many
    times, fastest kept. The two engines alternate which goes first, to spread any drift.
    """
    if clock not in ("cpu", "wall"):
        raise ValueError(f"clock must be 'cpu' or 'wall', got {clock!r}")
    cached = Engine(model, capacity_bytes, admission=admission, eviction=eviction, checkpointing=checkpointing,
                    ttft_repeats=repeats)
    plain = Engine(model, 0, admission="none", ttft_repeats=repeats)
    if warmup:  # the first large forwards pay one-time allocation costs
        longest = max((len(r.input_tokens) for r in requests), default=64)
        for _ in range(2):
            prefill(model, model.new_cache(), torch.arange(longest) % model.vocab_size, 0)
        if requests:    # and the first request an engine serves pays its path's (a lookup's first call: ~6 ms):
            first = requests[0]     # throwaway engines serve it, a miss and a hit, so neither side pays it
            warm = Engine(model, capacity_bytes, admission=admission, eviction=eviction, checkpointing=checkpointing)
            for _ in range(2):
                warm.replay_appended(first.input_tokens, first.output_tokens)
            Engine(model, 0, admission="none").replay_appended(first.input_tokens, first.output_tokens)
    ttft = (lambda r: r.ttft_cpu_s) if clock == "cpu" else (lambda r: r.ttft_s)
    records = []
    for i, req in enumerate(requests):
        if i % 2:
            without = plain.replay_appended(req.input_tokens, req.output_tokens)
            with_cache = cached.replay_appended(req.input_tokens, req.output_tokens)
        else:
            with_cache = cached.replay_appended(req.input_tokens, req.output_tokens)
            without = plain.replay_appended(req.input_tokens, req.output_tokens)
        h = with_cache.hit_fraction
        ideal = (1.0 - h) * ttft(without)
        records.append(TTFTRecord(int(req.session_id), req.turn_id, with_cache.input_len, with_cache.usable_hit_len, h,
                                  ttft(with_cache), ttft(without), ideal,
                                  ttft(with_cache) / ideal if ideal > 0 else float("inf"),
                                  with_cache.restore_s, with_cache.capture_s, with_cache.save_s,
                                  with_cache.num_prefill_calls))
        if on_request is not None:
            on_request(records[-1])
    return records


def summarize_ttft(records: Iterable[TTFTRecord], *, long_prompt_len: int = 2048) -> dict[str, float]:
    """Aggregates: total TTFT both ways, ratio to ideal (all hits / long prompts), save+restore share.
    The ratios to ideal leave out whole-prompt hits (``h`` = 1: an ideal TTFT of 0, nothing to be a
    ratio of); NaN where no hit is left."""
    recs = list(records)
    hits = [r for r in recs if r.h > 0 and r.ideal_s > 0]
    long_hits = [r for r in hits if r.input_len >= long_prompt_len]
    total_cached = sum(r.ttft_cached_s for r in recs)
    total_full = sum(r.ttft_full_s for r in recs)
    overhead = sum(r.restore_s + r.capture_s + r.save_s for r in recs)
    in_ttft = sum(r.restore_s + r.capture_s for r in recs)
    prefill_cached = sum(r.ttft_cached_s - r.restore_s - r.capture_s for r in recs)
    return {
        "requests": len(recs),
        "token_hit_rate": sum(r.hit_len for r in recs) / max(1, sum(r.input_len for r in recs)),
        "ttft_cached_total_s": total_cached,
        "ttft_full_total_s": total_full,
        "speedup": total_full / total_cached if total_cached else float("nan"),
        "ratio_to_ideal_hits": (sum(r.ttft_cached_s for r in hits) / sum(r.ideal_s for r in hits)) if hits else float("nan"),
        "ratio_to_ideal_long": (sum(r.ttft_cached_s for r in long_hits) / sum(r.ideal_s for r in long_hits))
        if long_hits else float("nan"),
        "save_restore_pct_of_full_prefill": 100.0 * overhead / total_full if total_full else float("nan"),
        "save_restore_pct_of_cached_prefill": 100.0 * overhead / prefill_cached if prefill_cached else float("nan"),
        "restore_capture_pct_of_cached_ttft": 100.0 * in_ttft / total_cached if total_cached else float("nan"),
    }


# ================================================================================ checkpointing
@dataclass(frozen=True, slots=True)
class CheckpointRecord:
    length: int
    requested: int             # checkpoint position asked for
    mode: str                  # unsplit | chunk-boundary | segmented
    captured_at: int | None    # where the state was taken
    prefill_s: float           # min over repeats
    overhead_pct: float        # vs unsplit
    max_abs_diff: float        # last-position logits vs unsplit
    bitwise: bool

    def to_record(self) -> dict[str, Any]:
        return asdict(self)


def _timed_prefill(model: HybridModel, ids: torch.Tensor, checkpoints: list[int], mode: str,
                   repeats: int, clock: str) -> tuple[float, Any]:
    timer = time.thread_time if clock == "cpu" else time.perf_counter
    best, result = float("inf"), None
    for _ in range(repeats):
        cache = model.new_cache()
        t = timer()
        result = prefill(model, cache, ids, 0, checkpoints, checkpointing=mode)
        best = min(best, timer() - t)
    return best, result


def checkpoint_overhead(model: HybridModel, lengths: Sequence[int] = (1024, 2048, 4096), *, repeats: int = 2,
                        clock: str = "cpu", seed: int = 0) -> list[CheckpointRecord]:
    """Prefill cost with one checkpoint at an off-grid position ``p = 0.55·L + 7`` taken two ways."""
    gen = torch.Generator().manual_seed(seed)
    records = []
    for length in lengths:
        ids = torch.randint(0, model.vocab_size, (length,), generator=gen)
        p = min(int(0.55 * length) + 7, length - 1)  # off the chunk grid
        base_s, base = _timed_prefill(model, ids, [], "segmented", repeats, clock)
        records.append(CheckpointRecord(length, p, "unsplit", None, base_s, 0.0, 0.0, True))
        for mode in ("chunk-boundary", "segmented"):
            seconds, res = _timed_prefill(model, ids, [p], mode, repeats, clock)
            diff = (res.logits - base.logits).abs().max().item()
            records.append(CheckpointRecord(length, p, mode, res.placed[p], seconds,
                                            100.0 * (seconds - base_s) / base_s, diff,
                                            bool(torch.equal(res.logits, base.logits))))
    return records
