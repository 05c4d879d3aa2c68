"""Bootstrap tuning of α, the weight of FLOP efficiency in Marconi's eviction utility (paper §4.2).

A :class:`~marconi.core.chooser.RuleChooser` (``marconi:tuner=bootstrap``): α = 0 until the first
eviction; then a window of requests is recorded after a snapshot, every α of a grid replays it from
the snapshot (size-only), and the best α is adopted. Deterministic whatever the number of workers.
"""

from __future__ import annotations

import copy
import math
import numbers
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from marconi.core.cache import ManualClock, PrefixCache, RequestHandle, TreeSnapshot
from marconi.core.chooser import RequestEvent
from marconi.core.eviction import EvictionRule, FlopAware, check_alpha
from marconi.core.model import ModelSpec
from marconi.pool import worker_pool
from marconi.core.registry import ConfigError
from marconi.workloads.trace import Request

__all__ = ["DEFAULT_ALPHA_GRID", "TuningJob", "TuningEvent", "WindowResult", "BootstrapTuner", "evaluate_alphas",
           "replay_window"]

DEFAULT_ALPHA_GRID: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(21))
OBJECTIVES = ("hit-rate", "flops")


@dataclass(frozen=True, slots=True)
class WindowResult:
    """One α's replay of a tuning window."""

    alpha: float
    reused_tokens: int
    flops_saved: float
    input_tokens: int

    @property
    def hit_rate(self) -> float:
        return self.reused_tokens / self.input_tokens if self.input_tokens else 0.0


@dataclass(slots=True)
class TuningJob:
    """Everything a replay needs; picklable (sent to worker processes or Ray tasks). ``efficiency``,
    ``recency``, ``candidates``, ``touch`` and ``tails``: the live rule's (:class:`FlopAware`'s
    arguments), which every α's replay keeps."""

    snapshot: TreeSnapshot
    window: list[Request]
    spec: ModelSpec
    capacity_bytes: int
    admission: Any
    efficiency: str
    recency: str
    candidates: str = "single-child"
    touch: str = "hit"
    tails: bool = False


@dataclass(frozen=True, slots=True)
class TuningEvent:
    """One completed grid search: every α's replay of the window, and the α adopted."""

    at_request: int
    window_size: int
    alpha: float
    results: tuple[WindowResult, ...]
    seconds: float

    def scores(self, objective: str = "hit-rate") -> dict[float, float]:
        """α -> the window's token hit rate (``hit-rate``) or FLOPs saved (``flops``)."""
        return {r.alpha: (r.hit_rate if objective == "hit-rate" else r.flops_saved) for r in self.results}


def replay_window(job: TuningJob, alpha: float) -> WindowResult:
    """Replay the job's window from its snapshot with a fixed α, under the job's rule otherwise
    (efficiency, recency, candidates, touch, tails). A rule with tails tracks dead tails from the
    snapshot on (a snapshot holds the tree, not what the live cache had learnt of its tails)."""
    clock = ManualClock()
    policy = FlopAware(alpha, job.efficiency, job.recency, job.candidates, job.touch, job.tails)
    cache = PrefixCache.from_snapshot(job.snapshot, job.spec, job.capacity_bytes, copy.deepcopy(job.admission), policy,
                                clock=clock)
    for req in job.window:
        clock.now = req.ts
        cache.process(req.input_tokens, req.output_tokens)
    st = cache.stats
    return WindowResult(float(alpha), st.reused_tokens, st.flops_saved, st.input_tokens)


_WORKER_JOB: TuningJob | None = None


def _init_worker(job: TuningJob) -> None:
    global _WORKER_JOB
    _WORKER_JOB = job


def _replay_in_worker(alpha: float) -> WindowResult:
    assert _WORKER_JOB is not None
    return replay_window(_WORKER_JOB, alpha)


def default_workers() -> int:
    return max(1, min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, 8))


def evaluate_alphas(job: TuningJob, grid: Sequence[float], workers: int | None = None,
                    mapper: Callable[[Callable[[float], Any], Sequence[float]], list[Any]] | None = None
                    ) -> list[WindowResult]:
    """Replay the window once per α. ``mapper`` (e.g. a Ray map) overrides the process pool."""
    if mapper is not None:
        return list(mapper(lambda a: replay_window(job, a), grid))
    workers = default_workers() if workers is None else workers
    if workers <= 1 or len(grid) <= 1:
        return [replay_window(job, a) for a in grid]
    with worker_pool(min(workers, len(grid)), initializer=_init_worker, initargs=(job,)) as pool:
        return list(pool.map(_replay_in_worker, grid))


def best_alpha(results: Sequence[WindowResult], objective: str, tolerance: float = 0.0) -> float:
    """The α with the highest objective (reused tokens or FLOPs saved), ties to the smaller; with
    ``tolerance`` > 0 the smallest α within that relative margin of the best (a window is noisy).
    """
    value = (lambda r: r.reused_tokens) if objective == "hit-rate" else (lambda r: r.flops_saved)
    ranked = sorted(results, key=lambda r: r.alpha)
    top = max(value(r) for r in ranked)
    threshold = top * (1.0 - tolerance) if tolerance else top
    return next(r.alpha for r in ranked if value(r) >= threshold)


def _is_whole(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


class BootstrapTuner:
    """A rule chooser: the α of a cache's FLOP-aware rule, by bootstrap replay.

    Args:
        policy: the cache's :class:`FlopAware` policy (the tuned rule differs in α only: every α is
            replayed under its efficiency, recency, candidates, touch and tails).
        multiplier: window = multiplier × requests seen before the first eviction (paper: 5–15); a
            finite number > 0.
        grid, objective, tolerance: as :func:`best_alpha`.
        workers: processes for the grid search (None: one per core, 1: in-process; else a whole
            number >= 1); ``mapper`` (e.g. Ray's map) replaces the pool.
        retune_every: a whole number >= 0; if > 0, every that many completed requests after a tuning,
            a token hit-rate drop larger than ``drift`` (a finite number >= 0) starts a new cycle.

    ConfigError: a parameter out of range.
    """

    def __init__(self, policy: FlopAware, *, multiplier: float = 5, grid: Sequence[float] = DEFAULT_ALPHA_GRID,
                 objective: str = "hit-rate", workers: int | None = None, retune_every: int = 0,
                 drift: float = 0.05, tolerance: float = 0.0, mapper: Callable[..., list[Any]] | None = None) -> None:
        if not (math.isfinite(multiplier) and multiplier > 0):
            raise ConfigError(f"bootstrap multiplier must be > 0 and finite, got {multiplier}")
        if not (math.isfinite(drift) and drift >= 0):
            raise ConfigError(f"bootstrap drift must be a finite number >= 0 (a token hit-rate drop), got {drift}")
        if not (_is_whole(retune_every) and retune_every >= 0):
            raise ConfigError(f"bootstrap retune_every must be a whole number >= 0 (0: never), got {retune_every!r}")
        if workers is not None and not (_is_whole(workers) and workers >= 1):
            raise ConfigError(f"bootstrap workers must be None (one per core) or a whole number >= 1, "
                              f"got {workers!r}")
        if objective not in OBJECTIVES:
            raise ConfigError(f"tuning objective must be one of {OBJECTIVES}, got {objective!r}")
        if not grid:
            raise ConfigError("the alpha grid must be non-empty and non-negative")
        for a in grid:  # an infinite α would pass a sign check and kill the replay of the grid
            check_alpha(a, "the bootstrap alpha grid")
        if not 0 <= tolerance < 1:
            raise ConfigError(f"tuning tolerance must be in [0, 1), got {tolerance}")
        self.tolerance = tolerance
        self.policy = policy
        self.multiplier = multiplier
        self.grid = tuple(sorted(grid))
        self.objective = objective
        self.workers = workers
        self.retune_every = retune_every
        self.drift = drift
        self.mapper = mapper
        self.events: list[TuningEvent] = []
        self.requests_before_first_eviction: int | None = None
        self._snapshot_due = False
        self._snapshot: TreeSnapshot | None = None
        self._window_size = 0
        self._window: list[Request] = []
        self._recording_ids: dict[int, tuple[float, np.ndarray]] = {}
        self._completed = 0
        self._drift_marks: list[tuple[int, int]] = []  # (reused, input) at each drift checkpoint
        self._since_mark = 0

    # ---------------------------------------------------------------- the chooser's feed
    @property
    def rule(self) -> EvictionRule:
        return self.policy.rule

    def observe(self, event: RequestEvent) -> EvictionRule | None:
        """Learn from one step of a request; returns the tuned rule when a grid search ends."""
        step, cache, handle = event.step, event.cache, event.handle
        if step == "begin":
            assert handle is not None
            self.on_begin(cache, handle)
        elif step == "finish":
            assert handle is not None and event.output is not None
            return self.on_finish(cache, handle, event.output)
        elif step == "first-eviction":
            self.on_first_eviction(cache)
        return None

    def on_first_eviction(self, cache: PrefixCache) -> None:
        self.requests_before_first_eviction = cache.stats.num_requests
        self._window_size = max(1, int(round(self.multiplier * cache.stats.num_requests)))
        self._snapshot_due = True

    def on_begin(self, cache: PrefixCache, handle: RequestHandle) -> None:
        if self._snapshot is not None:
            self._recording_ids[handle.request_id] = (handle.begin_time, handle.tokens)

    def on_finish(self, cache: PrefixCache, handle: RequestHandle, output_tokens: np.ndarray) -> EvictionRule | None:
        self._completed += 1
        tuned = None
        recorded = self._recording_ids.pop(handle.request_id, None)
        if recorded is not None and self._snapshot is not None:
            self._window.append(Request(handle.request_id, 0, recorded[0], recorded[1], output_tokens))
            if len(self._window) >= self._window_size:
                tuned = self._tune(cache)
        if self._snapshot_due:
            self._start_cycle(cache)
        elif self.retune_every and self.events and self._snapshot is None:
            self._check_drift(cache)
        return tuned

    # ---------------------------------------------------------------- cycle
    def _start_cycle(self, cache: PrefixCache) -> None:
        self._snapshot_due = False
        self._snapshot = cache.snapshot()
        self._window = []
        self._recording_ids = {}

    def _tune(self, cache: PrefixCache) -> EvictionRule:
        assert self._snapshot is not None
        # Replayed in arrival order: the window fills in finish order, which overlapping requests
        # (an event-driven replay, a live engine) change; its clock may not run backwards.
        window = sorted(self._window, key=lambda r: (r.ts, r.session_id))
        policy = self.policy
        job = TuningJob(self._snapshot, window, cache.spec, cache.capacity_bytes, cache.admission,
                        policy.efficiency_variant, policy.recency, policy.candidates, policy.touch, policy.trims_tails)
        started = time.perf_counter()
        results = evaluate_alphas(job, self.grid, self.workers, self.mapper)
        alpha = best_alpha(results, self.objective, self.tolerance)
        rule = self.policy.rule
        tuned = EvictionRule(alpha, rule.efficiency, rule.recency, rule.candidates, rule.touch, rule.tails)
        self.events.append(TuningEvent(cache.stats.num_requests, len(self._window), alpha, tuple(results),
                                       time.perf_counter() - started))
        self._snapshot = None
        self._window = []
        self._recording_ids = {}
        self._drift_marks = [(cache.stats.reused_tokens, cache.stats.input_tokens)]
        self._since_mark = 0
        return tuned

    def _check_drift(self, cache: PrefixCache) -> None:
        self._since_mark += 1
        if self._since_mark < self.retune_every:
            return
        self._since_mark = 0
        reused, inputs = cache.stats.reused_tokens, cache.stats.input_tokens
        self._drift_marks.append((reused, inputs))
        if len(self._drift_marks) < 3:
            return
        (r0, i0), (r1, i1), (r2, i2) = self._drift_marks[-3:]
        before = (r1 - r0) / max(1, i1 - i0)
        now = (r2 - r1) / max(1, i2 - i1)
        if before - now > self.drift:
            self._window_size = max(1, int(round(self.multiplier * self.retune_every)))
            self._start_cycle(cache)

    # ---------------------------------------------------------------- reporting
    def tuning_record(self) -> dict[str, Any]:
        """Record fields: each tuning's α (``tuned_alphas``), the time spent, and every α's replay
        of each window (``tuning_windows``)."""
        return {
            "tuned_alphas": [[e.at_request, e.alpha] for e in self.events],
            "tuning_seconds": sum(e.seconds for e in self.events),
            "tuning_windows": [{"at_request": e.at_request, "alpha": e.alpha, "grid": [r.alpha for r in e.results],
                                "hit_rate": [r.hit_rate for r in e.results],
                                "flops_saved": [r.flops_saved for r in e.results]} for e in self.events],
        }

    def describe(self) -> dict[str, Any]:
        return {"tuning": "bootstrap", "multiplier": self.multiplier, "objective": self.objective,
                "tuned_alphas": [e.alpha for e in self.events],
                "requests_before_first_eviction": self.requests_before_first_eviction}
