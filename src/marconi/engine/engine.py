"""The real engine: serves requests through the one cache core, on real tensors. Per request it
begins, restores the cached prefix, prefills (TTFT), decodes and finishes with exactly the states
``cache.finish_checkpoints`` asks for, keeping no tensors of its own, so it decides as a size-only
simulation would. Thread-safe; see docs/cache-api.md."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from marconi.core.cache import PrefixCache
from marconi.engine.errors import EngineError
from marconi.engine.models import HybridModel
from marconi.engine.prefill import (
    Capture,
    Checkpointing,
    DecodeResult,
    PrefillResult,
    append_forced,
    decode_forced,
    decode_greedy,
    make_checkpointing,
    prefill,
)
from marconi.engine.states import TensorPayloads, build_cache, slice_kv

__all__ = ["Engine", "EngineResult", "TOP_LOGITS"]


@dataclass(frozen=True, slots=True)
class EngineResult:
    """What one request did and its timings (seconds, ``time.perf_counter``).

    ``ttft_s``: ``begin`` to the end of the prefill; ``ttft_cpu_s``: the same in the thread's CPU
    time; with ``ttft_repeats > 1``, the fastest run. ``save_s``: KV slicing and ``finish`` after
    decoding.
    """

    request_id: int
    input_len: int
    output_tokens: tuple[int, ...]
    greedy_tokens: tuple[int, ...]
    kv_hit_len: int
    usable_hit_len: int
    prefill_checkpoints: tuple[int, ...]
    captured: tuple[int, ...]          # positions whose state was captured (prefill and decode)
    admitted: tuple[int, ...]          # positions the cache admitted a checkpoint at
    cached: bool                       # input + output inserted (False: no room, or no caching)
    num_prefill_calls: int
    lookup_s: float
    restore_s: float
    prefill_s: float
    capture_s: float
    ttft_s: float
    ttft_cpu_s: float
    decode_s: float
    save_s: float
    #: the first output token's :data:`TOP_LOGITS` largest logits, ``(token id, value)`` in descending
    #: order, from the prefill: what a test compares between a cached and an uncached run (greedy
    #: tokens of a random model barely move under a wrong state; these logits do)
    first_top_logits: tuple[tuple[int, float], ...] = ()

    @property
    def output_len(self) -> int:
        return len(self.output_tokens)

    @property
    def hit_fraction(self) -> float:
        """Share of the input restored from the cache (h)."""
        return self.usable_hit_len / self.input_len

    def to_record(self) -> dict[str, Any]:
        out = asdict(self)
        out["output_tokens"] = list(self.output_tokens)
        out["greedy_tokens"] = list(self.greedy_tokens)
        out["first_top_logits"] = [list(pair) for pair in self.first_top_logits]
        out["hit_fraction"] = self.hit_fraction
        return out


class Engine:
    """Serve a :class:`HybridModel` one request at a time through a :class:`PrefixCache` of
    ``capacity_bytes``. ``admission="none"`` serves without caching; ``checkpointing``: ``segmented`` or
    ``chunk-boundary`` (the core plans on ``model.chunk_size``); ``clock``: the cache's; ``tokenizer``:
    for text; ``ttft_repeats``: report the fastest of that many restore + prefill runs."""

    def __init__(self, model: HybridModel, capacity_bytes: float, *, admission: Any = "marconi",
                 eviction: Any = "lru", checkpointing: str | Checkpointing = "segmented",
                 clock: Callable[[], float] | None = None, tokenizer: Any = None, ttft_repeats: int = 1) -> None:
        if ttft_repeats < 1:
            raise EngineError(f"ttft_repeats must be >= 1, got {ttft_repeats}")
        self.ttft_repeats = ttft_repeats
        self.model = model
        self.payloads = TensorPayloads()
        self.checkpointing = make_checkpointing(checkpointing)
        self.cache = PrefixCache(model.spec, capacity_bytes, admission, eviction, clock=clock,
                                 payloads=self.payloads,
                                 prefill_chunk_len=self.checkpointing.state_grid(model.chunk_size))
        self._tokenizer = tokenizer

    # ------------------------------------------------------------------ public API
    def generate(self, prompt: str | Sequence[int] | np.ndarray | torch.Tensor, max_new_tokens: int = 32, *,
                 eos_token_id: int | None = None) -> EngineResult:
        """Greedy generation for a prompt (text is tokenized with the project tokenizer)."""
        ids = self._token_ids(prompt)
        if max_new_tokens < 1:
            raise EngineError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        return self._serve(ids, None, lambda work, pre, start, capture, _: decode_greedy(
            self.model, work, pre.logits, start, max_new_tokens, eos_token_id=eos_token_id, capture=capture,
            hidden=pre.hidden))

    def replay(self, input_tokens: Sequence[int] | np.ndarray | torch.Tensor,
               output_tokens: Sequence[int] | np.ndarray | torch.Tensor) -> EngineResult:
        """A trace request: prefill ``input_tokens``, then teacher-force ``output_tokens`` so the next turn
        continues exactly what was cached."""
        ids = self._token_ids(input_tokens)
        forced = self._output_ids(output_tokens)
        return self._serve(ids, forced, lambda work, pre, start, capture, _: decode_forced(
            self.model, work, pre.logits, start, forced, capture=capture, hidden=pre.hidden))

    def replay_appended(self, input_tokens: Sequence[int] | np.ndarray | torch.Tensor,
                        output_tokens: Sequence[int] | np.ndarray | torch.Tensor) -> EngineResult:
        """:meth:`replay` with the output appended by one cut forward (``prefill.append_forced``): same cache
        decisions and TTFT, much cheaper."""
        ids = self._token_ids(input_tokens)
        forced = self._output_ids(output_tokens)
        return self._serve(ids, forced, lambda work, pre, start, _, wanted: append_forced(
            self.model, work, pre.logits, start, forced, capture_at=wanted, hidden=pre.hidden))

    def replay_trace(self, requests: Iterable[Any]) -> list[EngineResult]:
        """Replay trace requests (objects with ``input_tokens`` / ``output_tokens``) in order."""
        return [self.replay(r.input_tokens, r.output_tokens) for r in requests]

    # ------------------------------------------------------------------ internals
    def _token_ids(self, prompt: Any) -> torch.Tensor:
        if isinstance(prompt, str):
            tokenizer = self._tokenizer or self._load_tokenizer()
            encoded = tokenizer.encode(prompt)
            prompt = getattr(encoded, "ids", encoded)
        return self.model.check_tokens(prompt)

    def _output_ids(self, output_tokens: Any) -> list[int]:
        if isinstance(output_tokens, str):
            raise EngineError("output_tokens must be token ids, got text; tokenize it first")
        ids = self.model.check_tokens(output_tokens)
        return ids.tolist()

    def _load_tokenizer(self) -> Any:
        try:
            from marconi.workloads.tokenizer import load_tokenizer
        except ImportError as exc:
            raise EngineError(f"text input needs the project tokenizer ({exc}); pass token ids or a tokenizer") from None
        self._tokenizer = load_tokenizer()
        return self._tokenizer

    def _prefill_from_prefix(self, ids: torch.Tensor, prefix: Any, checkpoints: Sequence[int]) -> _Prefilled:
        """Restore ``prefix`` into a fresh cache and prefill the rest of ``ids``, cut at ``checkpoints``; a
        whole-input hit prefills nothing."""
        model = self.model
        w0, c0 = time.perf_counter(), time.thread_time()
        start = prefix.length
        work = build_cache(model, prefix.kv, prefix.ssm)
        w1 = time.perf_counter()
        if start == len(ids):
            hidden = prefix.ssm.hidden
            pre = PrefillResult(model.logits_from_hidden(hidden), {}, {}, 0, 0.0, hidden)
        else:
            pre = prefill(model, work, ids, start, [p for p in checkpoints if p > start], checkpointing="segmented")
        w2, c2 = time.perf_counter(), time.thread_time()
        return _Prefilled(work, pre, start, w1 - w0, w2 - w1, c2 - c0)

    def _plan_captures(self, handle: Any, input_len: int,
                       forced: list[int] | None) -> tuple[tuple[int, ...], Capture, tuple[int, ...]]:
        """(prefill capture positions, the decode's capture rule, output positions): one dry run of
        ``finish`` for a known output, a query per step for a generated one."""
        cache = self.cache
        if forced is not None:
            wanted = cache.finish_checkpoints(handle, forced)
            in_output = tuple(p for p in wanted if p > input_len)
            targets = set(in_output)
            return tuple(p for p in wanted if p <= input_len), (lambda pos, _: pos in targets), in_output
        at_prefill = handle.prefill_checkpoints

        def capture(pos: int, tokens: Sequence[int]) -> bool:
            if pos == input_len and pos in at_prefill:
                return False  # the prefill took it
            return pos in cache.finish_checkpoints(handle, tokens)

        return at_prefill, capture, ()

    def _serve(self, ids: torch.Tensor, forced: list[int] | None,
               decode: Callable[[Any, PrefillResult, int, Capture, tuple[int, ...]], DecodeResult]) -> EngineResult:
        layout = self.model.layout
        t0, c0 = time.perf_counter(), time.thread_time()
        handle = self.cache.begin(ids.numpy())
        try:
            prefix = self.cache.cached_prefix(handle)
            at_prefill, capture, in_output = self._plan_captures(handle, len(ids), forced)
            lookup_s, lookup_cpu_s = time.perf_counter() - t0, time.thread_time() - c0
            runs = [self._prefill_from_prefix(ids, prefix, at_prefill) for _ in range(self.ttft_repeats)]
            best = min(runs, key=lambda r: r.restore_s + r.prefill_s)
            work, pre = runs[-1].work, runs[-1].pre  # every run computes the same tensors
            t3 = time.perf_counter()  # the first token is the argmax of pre.logits (decode takes it)
            out = decode(work, pre, len(ids), capture, in_output)
            t4 = time.perf_counter()
            states = {**pre.states, **out.states}
            result = self.cache.finish(handle, np.asarray(out.tokens, dtype=np.int64),
                                       states=states, kv=lambda s, e: slice_kv(work, layout, s, e))
            t5 = time.perf_counter()
        except BaseException:
            if handle.active:
                self.cache.abort(handle)
            raise
        return EngineResult(
            request_id=handle.request_id, input_len=len(ids), output_tokens=tuple(out.tokens),
            greedy_tokens=tuple(out.greedy), kv_hit_len=handle.match.kv_hit_len,
            usable_hit_len=handle.match.usable_hit_len, prefill_checkpoints=handle.prefill_checkpoints,
            captured=tuple(sorted(states)), admitted=result.admitted, cached=result.cached,
            num_prefill_calls=pre.num_calls,
            lookup_s=lookup_s, restore_s=best.restore_s, prefill_s=best.prefill_s, capture_s=best.pre.capture_s,
            ttft_s=lookup_s + best.restore_s + best.prefill_s, ttft_cpu_s=lookup_cpu_s + best.cpu_s,
            decode_s=t4 - t3, save_s=t5 - t4, first_top_logits=_top_logits(pre.logits[-1]))


#: how many of the first token's logits an :class:`EngineResult` keeps
TOP_LOGITS = 8


def _top_logits(logits: torch.Tensor) -> tuple[tuple[int, float], ...]:
    values, ids = torch.topk(logits.detach().double(), min(TOP_LOGITS, logits.shape[-1]))
    return tuple(zip(ids.tolist(), values.tolist()))


class _Prefilled(NamedTuple):
    work: Any            # the DynamicCache after the prefill
    pre: PrefillResult
    start: int           # where the prefill started (the input's length after a whole-input hit)
    restore_s: float
    prefill_s: float
    cpu_s: float         # thread CPU time of restore + prefill
