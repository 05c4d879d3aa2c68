"""vLLM 0.32's scheduler loop over the emulated block manager: requests in flight, step by step.

Mirrors ``Scheduler.schedule`` / ``update_from_output`` as far as prefix-cache decisions depend on
them (token budget, Mamba-aligned chunks, the full-sequence admission gate, recompute preemption).
:func:`emulate_closed_loop` drives a trace as ``marconi vllm replay --concurrency C`` drives vLLM, and
:func:`emulate_admitted` under open-loop arrivals, both with the replay's own admitter.
The rules: docs/vllm.md, "What the emulation models".
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from marconi.core.cache import as_tokens
from marconi.core.registry import ConfigError
from marconi.integrations.common.alpha import RequestObservation
from marconi.integrations.vllm.arrivals import Admitter
from marconi.integrations.vllm.emulate.engine import RequestRecord, VllmAlignEngine
from marconi.integrations.vllm.emulate.request import RequestState

__all__ = ["ScheduledRequest", "VllmAlignScheduler", "ClosedLoopResult", "emulate_closed_loop", "emulate_admitted"]


class ScheduledRequest:
    """One request in the scheduler: its block-manager state, its trace output, its progress."""

    __slots__ = ("index", "state", "num_outputs", "max_tokens", "num_output_tokens", "num_preemptions",
                 "record", "finished", "tier_hit", "loaded")

    def __init__(self, index: int, state: RequestState, outputs: np.ndarray) -> None:
        self.index = index
        self.state = state
        self.num_outputs = len(outputs)
        self.max_tokens = max(1, len(outputs))      # the replay asks for at least one token
        self.num_output_tokens = 0
        self.num_preemptions = 0
        self.record: RequestRecord | None = None    # set at the first admission
        self.finished = False
        self.tier_hit = 0                           # tokens loaded from the CPU tier at the first admission
        self.loaded = True                          # False while a load's blocks are not cached yet


class VllmAlignScheduler:
    """vLLM's scheduler loop (see the module docstring) over one :class:`~.engine.VllmAlignEngine`.

    ``add(prompt, outputs)`` queues a request; ``step()`` runs one scheduling step and its stub
    model output, and returns the requests that finished in it. ``running`` and ``waiting`` are
    vLLM's queues (read them; do not edit).
    """

    def __init__(self, engine: VllmAlignEngine, *, max_num_seqs: int = 256) -> None:
        if max_num_seqs < 1:
            raise ConfigError(f"vllm-align: max_num_seqs must be >= 1, got {max_num_seqs}")
        self.engine = engine
        self.max_num_seqs = max_num_seqs
        self.running: list[ScheduledRequest] = []
        self.waiting: deque[ScheduledRequest] = deque()
        self.loading: deque[ScheduledRequest] = deque()     # vLLM's kv_holding_waiting: loads from the CPU tier
        self._new_loads: list[ScheduledRequest] = []
        self.inflight: set[ScheduledRequest] = set()       # vLLM's _inflight_prefills (kept with a tier only)
        self.num_steps = 0
        self.num_preemptions = 0
        self._num_added = 0
        #: the token spans the last step computed, (start, end) per scheduled request (the step
        #: time model's input)
        self.last_spans: list[tuple[int, int]] = []

    def add(self, prompt: Any, outputs: Any = ()) -> ScheduledRequest:
        """Queue a request at the waiting queue's tail (vLLM's ``add_request``)."""
        engine = self.engine
        tokens = as_tokens(prompt, "prompt")
        out = as_tokens(outputs, "outputs", allow_empty=True)
        # The whole known sequence (an empty output samples one token: 0, as the replay's stub does).
        sequence = np.concatenate((tokens, out if out.size else np.zeros(1, dtype=tokens.dtype)))
        state = RequestState(engine.next_request_id(), sequence, len(tokens), engine.layout.hash_block_size)
        req = ScheduledRequest(self._num_added, state, out)
        self._num_added += 1
        self.waiting.append(req)
        return req

    @property
    def has_requests(self) -> bool:
        return bool(self.running or self.waiting or self.loading)

    # --------------------------------------------------------------- one step
    def step(self) -> list[ScheduledRequest]:
        """``schedule()`` then ``update_from_output()``; the requests finished in this step, in order.

        Raises ConfigError if nothing can be scheduled and nothing was preempted (a request that
        does not fit the pool alone: vLLM would never schedule it), or if a request whose CPU-tier
        load has landed cannot take its next blocks while nothing else runs or is in transit.
        """
        engine = self.engine
        engine.new_step_starts()
        self.num_steps += 1
        budget = engine.layout.max_num_batched_tokens
        num_eligible = len(self.running) + len(self.waiting)
        threshold = engine.layout.long_prefill_token_threshold if num_eligible > 1 else 0
        scheduled: list[tuple[ScheduledRequest, int]] = []
        preempted = self._schedule_running(budget, threshold, scheduled)
        budget -= sum(n for _, n in scheduled)
        num_loading = 0
        if not preempted:
            num_loading = self._schedule_waiting(budget, threshold, scheduled)
        if not scheduled and not preempted and not num_loading:   # (after a preemption: vLLM's too)
            if not self.loading:
                req = (self.waiting or self.running)[0]
                raise ConfigError(f"vllm-align: request #{req.index}, of {req.state.num_prompt_tokens} tokens, does not "
                                  "fit the pool "
                                  f"({engine.layout.num_blocks} blocks, {engine.pool.num_free} free) even alone; "
                                  f"vLLM would never schedule it — raise the capacity")
            if not self.running and (engine.tier is None or not engine.tier.busy):
                # Every load has landed and nothing else runs or is in transit: the next step is this
                # one again. (Before the loaded blocks were counted as vLLM counts them, the emulation
                # spun here for good where vLLM went on.)
                req = self.loading[0]
                raise ConfigError(f"vllm-align: a {req.state.num_prompt_tokens}-token request loaded "
                                  f"{req.state.num_computed_tokens} tokens from the CPU tier and cannot fit the rest "
                                  f"in the pool ({engine.layout.num_blocks} blocks, {engine.pool.num_free} free) "
                                  f"with nothing else running; vLLM would wait for good — raise the capacity")
        engine.release_copies()                    # end of schedule(): this step's copy-on-write sources
        self.last_spans = [(req.state.num_computed_tokens, req.state.num_computed_tokens + num) for req, num in scheduled]
        if engine.tier is not None:                # build_connector_meta: this step's stores
            engine.tier.end_step([(req.state, num) for req, num in scheduled])
        for req, num in scheduled:                 # _update_after_schedule
            req.state.num_computed_tokens += num
            if req.state.num_computed_tokens >= req.state.num_tokens:
                self.inflight.discard(req)
        return self._update_from_output(scheduled)

    def _chunk(self, req: ScheduledRequest, start: int, budget: int, threshold: int) -> int:
        num_new = req.state.num_tokens - start
        if 0 < threshold < num_new:
            num_new = threshold
        num_new = min(num_new, budget)
        if self.engine.layout.has_mamba:
            num_new = self.engine.mamba_block_aligned_split(req.state, start, num_new)
        return num_new

    def _schedule_running(self, budget: int, threshold: int, scheduled: list[tuple[ScheduledRequest, int]]) -> bool:
        """The running requests, in order; True if any was preempted."""
        engine, preempted = self.engine, False
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = self._chunk(req, req.state.num_computed_tokens, budget, threshold)
            if num_new == 0:
                i += 1
                continue
            while not (ok := engine.try_allocate_slots(req.state, num_new, 0, None)):
                victim = self.running.pop()        # the lowest priority: the last one (FCFS)
                if victim is req and not self.running and not self.loading:
                    # Alone and still short of blocks: it would be preempted and resumed forever
                    # (vLLM refuses to start with a pool below one max-length request). Loads
                    # holding blocks will land and free them: then it preempts itself, as vLLM does.
                    raise ConfigError(f"vllm-align: request #{req.index}, of {req.state.num_tokens} tokens, does not "
                                      f"fit the pool ({engine.layout.num_blocks} blocks) even alone; raise the capacity")
                self._preempt(victim, scheduled)
                preempted = True
                if victim is req:
                    break
            if not ok:
                break
            scheduled.append((req, num_new))
            budget -= num_new
            i += 1
        return preempted

    def _schedule_waiting(self, budget: int, threshold: int, scheduled: list[tuple[ScheduledRequest, int]]) -> int:
        """Admit waiting requests in order, those holding loaded blocks first (vLLM's
        ``kv_holding_waiting``); the number admitted to load from the CPU tier."""
        engine, num_loading = self.engine, 0
        skipped: list[ScheduledRequest] = []       # vLLM's skipped waiting requests: back at the head after
        self._new_loads: list[ScheduledRequest] = []   # loads issued in this step: they land at its end
        skipped_loads: list[ScheduledRequest] = []
        while budget > 0 and (self.loading or self.waiting) and len(self.running) < self.max_num_seqs:
            if self.loading:                       # a load finished: cache its blocks, then run it
                req = self.loading[0]
                state = req.state
                assert engine.tier is not None
                if not engine.tier.landed(state):  # still in flight: vLLM skips it this step
                    skipped_loads.append(self.loading.popleft())
                    continue
                if not req.loaded:
                    engine.cache_blocks(state, state.num_computed_tokens)
                    req.loaded = True
                num_new = self._chunk(req, state.num_computed_tokens, budget, threshold)
                if num_new == 0 or not engine.try_allocate_slots(state, num_new, 0, None, full_sequence_must_fit=True):
                    break
                self.loading.popleft()
                self._start(req, num_new, scheduled)
                budget -= num_new
                continue
            req = self.waiting[0]
            state = req.state
            assert state.num_computed_tokens == 0       # recompute preemption leaves nothing computed
            hit_blocks, hit, kv_hit = engine.get_computed_blocks(state)
            if engine.tier is not None:
                ext = engine.tier.lookup(state, hit)
                if ext is None:                    # a hit chunk is still being stored: this one waits
                    skipped.append(self.waiting.popleft())
                    continue
                if ext > 0:
                    if not self._admit_with_load(req, hit_blocks, hit, kv_hit, ext):
                        break
                    num_loading += 1
                    continue
            num_new = self._chunk(req, hit, budget, threshold)
            if num_new == 0:
                break
            if not engine.try_allocate_slots(state, num_new, hit, hit_blocks, full_sequence_must_fit=True):
                break
            self._record_admission(req, hit, kv_hit)
            self.waiting.popleft()
            state.num_computed_tokens = hit
            self._start(req, num_new, scheduled)
            budget -= num_new
        self.waiting.extendleft(reversed(skipped))
        self.loading.extendleft(reversed(skipped_loads))
        self.loading.extend(self._new_loads)
        return num_loading

    def _start(self, req: ScheduledRequest, num_new: int, scheduled: list[tuple[ScheduledRequest, int]]) -> None:
        self.running.append(req)
        scheduled.append((req, num_new))
        if self.engine.tier is not None and req.state.num_computed_tokens + num_new < req.state.num_tokens:
            self.inflight.add(req)             # still prefilling after this chunk: it reserves its blocks

    def _record_admission(self, req: ScheduledRequest, hit: int, kv_hit: int, ext: int = 0) -> None:
        """vLLM's stats count a request's first admission only."""
        if req.record is not None:
            return
        engine, state = self.engine, req.state
        engine.queries += state.num_prompt_tokens
        engine.hits += hit
        engine.pool.emit("lookup", state.num_prompt_tokens, hit, kv_hit - hit)
        state.hit_len, state.kv_only_len = hit, kv_hit - hit
        req.record = RequestRecord(state.num_prompt_tokens, hit, kv_hit)
        req.tier_hit = ext

    def _admit_with_load(self, req: ScheduledRequest, hit_blocks: Any, hit: int, kv_hit: int, ext: int) -> bool:
        """vLLM's asynchronous load: blocks for the GPU hit and the ``ext`` tokens the tier holds
        (if they fit beside what the in-flight prefills still need), caching deferred, the load;
        the request waits in :attr:`loading` (not preemptible) until the next step. False if it
        does not fit."""
        engine, state = self.engine, req.state
        reserved = sum(engine.blocks_needed(r.state, r.state.num_tokens, None, r.state.num_computed_tokens,
                                            admission=True) for r in self.inflight)
        if not engine.try_allocate_slots(state, 0, hit, hit_blocks, full_sequence_must_fit=True, reserved=reserved,
                                         delay_cache=True, num_external=ext):
            return False
        first = req.record is None
        self._record_admission(req, hit, kv_hit, ext)
        assert engine.tier is not None
        engine.tier.load(state, hit, ext, first)
        self.waiting.popleft()
        self._new_loads.append(req)
        self.inflight.add(req)
        req.loaded = False
        state.num_computed_tokens = hit + ext
        return True

    def _preempt(self, victim: ScheduledRequest, scheduled: list[tuple[ScheduledRequest, int]]) -> None:
        """vLLM's recompute preemption: free the blocks, forget the progress, back to the queue's head."""
        for k, (req, _) in enumerate(scheduled):
            if req is victim:               # already scheduled in this step: unschedule it
                del scheduled[k]
                break
        self.engine.free(victim.state)
        if self.engine.tier is not None:
            self.engine.tier.dropped(victim.state)
        victim.state.num_computed_tokens = 0
        self.inflight.discard(victim)
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(victim)

    def _update_from_output(self, scheduled: Sequence[tuple[ScheduledRequest, int]]) -> list[ScheduledRequest]:
        finished = []
        for req, _ in scheduled:
            state = req.state
            if state.num_computed_tokens < state.num_tokens:
                continue                           # a prefill chunk short of the end: nothing sampled
            state.append_output()
            req.num_output_tokens += 1
            if req.num_output_tokens >= req.max_tokens:
                self._finish(req)
                finished.append(req)
        return finished

    def _finish(self, req: ScheduledRequest) -> None:
        engine, state = self.engine, req.state
        self.running.remove(req)
        self.inflight.discard(req)
        if engine.tier is not None:                # before the blocks go back: its last stores read them
            engine.tier.finished(state)
        engine.free(state)
        engine.end_request(state)
        req.finished = True
        prompt = state.tokens[:state.num_prompt_tokens]
        outputs = state.tokens[state.num_prompt_tokens:state.num_prompt_tokens + req.num_outputs]
        changed = engine.index.finished(RequestObservation(prompt, outputs, state.hit_len, state.kv_only_len))
        if changed is not None:
            engine.pool.emit("alpha", *changed)

    # --------------------------------------------------------------- checks
    def check_invariants(self) -> None:
        """The engine's checks (and the tier's), and: only running or loading requests hold blocks;
        waiting ones hold none."""
        self.engine.check_invariants()
        if self.engine.tier is not None:
            self.engine.tier.manager.check_invariants()
        holders = {rid for m in self.engine.managers for rid, blocks in m.req_to_blocks.items()
                   if any(b is not self.engine.pool.null for b in blocks)}
        running = {r.state.rid for r in (*self.running, *self.loading)}
        assert holders <= running, f"requests {sorted(holders - running)} hold blocks but are not running"
        assert all(r.state.num_computed_tokens > 0 for r in self.loading), "a load with nothing to load"
        assert all(r.state.num_computed_tokens == 0 for r in self.waiting), "a waiting request kept its progress"
        assert len(self.running) <= self.max_num_seqs


@dataclass(frozen=True, slots=True)
class ClosedLoopResult:
    """What :func:`emulate_closed_loop` returns: per request (trace order) its record (vLLM's
    ``num_cached_tokens`` as ``hit_len``) and preemptions; vLLM's prefix-cache counters; steps."""

    records: list[RequestRecord]
    num_preemptions: list[int]
    queries: int
    hits: int
    num_steps: int
    tier_hits: list[int] | None = None     # per request, tokens loaded from the CPU tier (None: no tier)

    @property
    def tier_hit_rate(self) -> float:
        return sum(self.tier_hits or ()) / self.queries if self.queries else 0.0

    @property
    def gpu_hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    @property
    def token_hit_rate(self) -> float:
        """GPU-pool and CPU-tier hits over the prompt tokens (first admissions)."""
        return (self.hits + sum(self.tier_hits or ())) / self.queries if self.queries else 0.0


def _result(engine: VllmAlignEngine, sched: VllmAlignScheduler,
            handles: Sequence[ScheduledRequest | None]) -> ClosedLoopResult:
    """A finished loop's result: every request's record (trace order), preemptions and tier hit."""
    records = []
    for h in handles:
        assert h is not None and h.record is not None
        records.append(h.record)
    done = [h for h in handles if h is not None]
    return ClosedLoopResult(records, [h.num_preemptions for h in done], engine.queries, engine.hits, sched.num_steps,
                            None if engine.tier is None else [h.tier_hit for h in done])


def emulate_closed_loop(engine: VllmAlignEngine, requests: Sequence[Any], *, concurrency: int,
                        max_num_seqs: int = 256, check: bool = False) -> ClosedLoopResult:
    """Serve ``requests`` (trace order; each with ``input_tokens``, ``output_tokens`` and
    ``session_id``) through ``engine`` as ``marconi vllm replay --concurrency C`` serves them through
    vLLM: the replay's own closed-loop :class:`~marconi.integrations.vllm.arrivals.Admitter` (before
    each step, requests whose session predecessor has finished are submitted, and new ones are
    admitted while fewer than ``concurrency`` are admitted and unfinished; a turn whose predecessor
    is still running holds its slot and waits), with no clock: a tier's loads land by the end of
    their step. ``check``: run the invariant checks after every step (slow; for tests).
    Deterministic.

    Raises:
        ConfigError: ``concurrency`` < 1; or as :meth:`VllmAlignScheduler.step`.
    """
    if concurrency < 1:
        raise ConfigError(f"concurrency must be >= 1, got {concurrency}")
    admitter = Admitter([r.session_id for r in requests], concurrency=concurrency)
    return _serve(engine, requests, admitter, None, max_num_seqs=max_num_seqs, check=check)


def emulate_admitted(engine: VllmAlignEngine, requests: Sequence[Any], admitter: Any,
                     step_time: Callable[[list[tuple[int, int]]], float], *, max_num_seqs: int = 256,
                     check: bool = False) -> ClosedLoopResult:
    """Serve ``requests`` as ``marconi vllm replay`` serves them under ``admitter`` (its
    :class:`~marconi.integrations.vllm.arrivals.Admitter`: ``admit(clock)``, ``finish(i)``,
    ``next_arrival()``), on the replay's virtual clock: each step adds ``step_time(spans)`` (the
    replay's step-time model); with nothing in flight the clock jumps to the next arrival. With a CPU
    tier the clock is the tier's (it must have the same ``step_time``): a preempted request's stores
    in transit and the loads it waits for move it as in the replay's worker. Open-loop arrivals
    (Poisson, trace times) are what this adds to :func:`emulate_closed_loop`; under a closed-loop
    admitter the two serve identically.

    Raises:
        ConfigError: as :meth:`VllmAlignScheduler.step`; or a tier without a clock.
        RuntimeError: nothing in flight and nothing left to arrive while requests remain.
    """
    tier = engine.tier
    if tier is not None and tier.step_time is None:
        raise ConfigError("vllm-align: an open-loop emulation with a CPU tier needs the tier's step_time (its clock)")
    return _serve(engine, requests, admitter, step_time, max_num_seqs=max_num_seqs, check=check)


def _serve(engine: VllmAlignEngine, requests: Sequence[Any], admitter: Any,
           step_time: Callable[[list[tuple[int, int]]], float] | None, *, max_num_seqs: int,
           check: bool) -> ClosedLoopResult:
    """The one loop of both: submit what ``admitter`` admits, step, tell it what finished.
    ``step_time`` None: no clock (a closed loop, whose admitter never waits on one)."""
    tier = engine.tier
    sched = VllmAlignScheduler(engine, max_num_seqs=max_num_seqs)
    n = len(requests)
    handles: list[ScheduledRequest | None] = [None] * n
    trace_index: dict[int, int] = {}               # scheduler's request index -> trace index
    clock = 0.0
    num_done = 0
    while num_done < n:
        for i in admitter.admit(clock):
            handles[i] = sched.add(requests[i].input_tokens, np.asarray(requests[i].output_tokens, dtype=np.int32))
            trace_index[handles[i].index] = i
        if not sched.has_requests:                 # idle: jump to the next arrival
            due = admitter.next_arrival()
            if due is None:
                raise RuntimeError("emulation stalled: nothing in flight and nothing to admit")
            clock = max(clock, due)
            if tier is not None:
                tier.now = max(tier.now, clock)
            continue
        if tier is not None:
            tier.next_arrival = admitter.next_arrival()
        finished = sched.step()
        if step_time is not None:
            clock = tier.now if tier is not None else clock + step_time(sched.last_spans)
        if check:
            sched.check_invariants()
        for req in finished:
            admitter.finish(trace_index[req.index])
            num_done += 1
    if tier is not None:
        tier.next_arrival = None
    return _result(engine, sched, handles)
