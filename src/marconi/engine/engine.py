"""The real engine: serves requests one at a time through the one cache core, on real tensors.

Per request (``docs/cache-api.md``)::

    handle = cache.begin(input)                 # match + lock the matched path + admission plan
    prefix = cache.cached_prefix(handle)        # KV payloads [0, h) + the SSM state at h
    work   = build_cache(model, prefix)         # restore into a fresh DynamicCache (a copy)
    prefill input[h:], capturing the states at handle.prefill_checkpoints   -> first token (TTFT)
    decode (greedy, or teacher-forced to a trace's output), feeding the last token
    cache.finish(handle, output, states={p: state}, kv=lambda s, e: KVs of (input+output)[s:e])

There is no second cache: the engine keeps no tensors of its own between requests — every payload
lives in ``PrefixCache``'s tree, and the core's byte accounting (from the checked ``ModelSpec``)
is what bounds memory. The core locks the matched path from ``begin`` to ``finish``/``abort``, so
an in-flight request's prefix cannot be evicted (the restored working cache is a copy anyway).

The engine looks up with ``max_hit_len = len(input) - 1``: it must compute at least the last input
token to get the logits of the first output token, so a checkpoint exactly at the input's end is not
a usable hit for it (all or nothing: it resumes from the deepest checkpoint before that). The core
then accounts exactly what the engine computes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from marconi.cache import PrefixCache
from marconi.engine.errors import EngineError
from marconi.engine.models import HybridModel
from marconi.engine.prefill import (
    Checkpointing,
    DecodeResult,
    PrefillResult,
    append_forced,
    decode_forced,
    decode_greedy,
    make_checkpointing,
    prefill,
)
from marconi.engine.states import TensorPayloads, build_cache, capture_ssm, slice_kv

__all__ = ["Engine", "EngineResult"]


@dataclass(frozen=True, slots=True)
class EngineResult:
    """What one request did and how long each step took (seconds, ``time.perf_counter``).

    ``ttft_s`` runs from ``begin`` to the end of the prefill, whose last logits give the first
    output token (lookup + restore + prefill with its checkpoint captures); ``ttft_cpu_s`` is the
    same span in CPU time of the serving thread (what an uncontended core would take, with one
    torch thread). With ``ttft_repeats > 1`` restore + prefill are timed that many times and the
    fastest run is reported. ``save_s`` is the work after decoding that stores
    states: the last-token capture, KV slicing and ``finish``.
    """

    request_id: int
    input_len: int
    output_tokens: tuple[int, ...]
    greedy_tokens: tuple[int, ...]
    kv_hit_len: int
    usable_hit_len: int
    prefill_checkpoints: tuple[int, ...]
    captured: tuple[int, ...]          # positions whose state was captured during prefill
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
        out["hit_fraction"] = self.hit_fraction
        return out


class Engine:
    """Serve a :class:`HybridModel` one request at a time through a :class:`PrefixCache`.

    Args:
        model: the model (its checked ``spec`` drives the cache's byte accounting).
        capacity_bytes: cache capacity for KVs + SSM checkpoints.
        admission / eviction: cache-core policies (registry names or objects); ``admission="none"``
            serves without caching (vanilla), through the same code path.
        checkpointing: where prefill checkpoints are taken (``segmented``: exactly at the
            requested positions; ``chunk-boundary``: at the last scan-chunk boundary, offered to
            the cache under that position — only used if the cache planned a checkpoint there).
        clock: the cache's clock (default: its logical per-request clock).
        tokenizer: used for text input; default ``marconi.workloads.tokenizer.load_tokenizer()``.
        ttft_repeats: run restore + prefill this many times per request and report the fastest
            (benchmarks on a shared machine); the results are identical each time.
    """

    def __init__(self, model: HybridModel, capacity_bytes: float, *, admission: Any = "marconi",
                 eviction: Any = "lru", checkpointing: str | Checkpointing = "segmented",
                 clock: Callable[[], float] | None = None, tokenizer: Any = None, ttft_repeats: int = 1) -> None:
        if ttft_repeats < 1:
            raise EngineError(f"ttft_repeats must be >= 1, got {ttft_repeats}")
        self.ttft_repeats = ttft_repeats
        self.model = model
        self.payloads = TensorPayloads()
        self.cache = PrefixCache(model.spec, capacity_bytes, admission, eviction, clock=clock,
                                 payloads=self.payloads)
        self.checkpointing = make_checkpointing(checkpointing)
        self._tokenizer = tokenizer

    # ------------------------------------------------------------------ public API
    def generate(self, prompt: str | Sequence[int] | np.ndarray | torch.Tensor, max_new_tokens: int = 32, *,
                 eos_token_id: int | None = None) -> EngineResult:
        """Greedy generation for a prompt (text is tokenized with the project tokenizer)."""
        ids = self._token_ids(prompt)
        return self._serve(ids, lambda work, logits, start: decode_greedy(
            self.model, work, logits, start, max_new_tokens, eos_token_id=eos_token_id))

    def replay(self, input_tokens: Sequence[int] | np.ndarray | torch.Tensor,
               output_tokens: Sequence[int] | np.ndarray | torch.Tensor) -> EngineResult:
        """A trace request: prefill ``input_tokens``, then teacher-force ``output_tokens``.

        Forcing the recorded output makes the next turn's input (history + output + new message)
        continue exactly what was cached.
        """
        ids = self._token_ids(input_tokens)
        forced = self.model.check_tokens(output_tokens).tolist()
        return self._serve(ids, lambda work, logits, start: decode_forced(self.model, work, logits, start, forced))

    def replay_appended(self, input_tokens: Sequence[int] | np.ndarray | torch.Tensor,
                        output_tokens: Sequence[int] | np.ndarray | torch.Tensor) -> EngineResult:
        """Like :meth:`replay`, but the recorded output is appended with one forward instead of
        decoded token by token (see ``prefill.append_forced``): same cache decisions and TTFT,
        much cheaper — for TTFT benchmarks that do not measure decoding."""
        ids = self._token_ids(input_tokens)
        forced = self.model.check_tokens(output_tokens).tolist()
        return self._serve(ids, lambda work, logits, start: append_forced(self.model, work, logits, start, forced))

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

    def _load_tokenizer(self) -> Any:
        try:
            from marconi.workloads.tokenizer import load_tokenizer
        except ImportError as exc:
            raise EngineError(f"text input needs the project tokenizer ({exc}); pass token ids or a tokenizer") from None
        self._tokenizer = load_tokenizer()
        return self._tokenizer

    def _prefill_from_prefix(self, ids: torch.Tensor, prefix: Any, checkpoints: Sequence[int]) -> _Prefilled:
        """Restore ``prefix`` into a fresh cache and prefill the rest of ``ids`` (the TTFT path)."""
        model = self.model
        w0, c0 = time.perf_counter(), time.thread_time()
        start = prefix.length  # < len(ids): begin() was given max_hit_len = len(ids) - 1
        work = build_cache(model, prefix.kv, prefix.ssm)
        w1 = time.perf_counter()
        pre = prefill(model, work, ids, start, [p for p in checkpoints if p > start],
                      checkpointing=self.checkpointing)
        w2, c2 = time.perf_counter(), time.thread_time()
        return _Prefilled(work, pre, start, w1 - w0, w2 - w1, c2 - c0)

    def _serve(self, ids: torch.Tensor, decode: Callable[[Any, torch.Tensor, int], DecodeResult]) -> EngineResult:
        layout = self.model.layout
        t0, c0 = time.perf_counter(), time.thread_time()
        handle = self.cache.begin(ids.numpy(), max_hit_len=len(ids) - 1)
        try:
            prefix = self.cache.cached_prefix(handle)
            lookup_s, lookup_cpu_s = time.perf_counter() - t0, time.thread_time() - c0
            runs = [self._prefill_from_prefix(ids, prefix, handle.prefill_checkpoints)
                    for _ in range(self.ttft_repeats)]
            best = min(runs, key=lambda r: r.restore_s + r.prefill_s)
            work, pre = runs[-1].work, runs[-1].pre  # every run computes the same tensors
            t3 = time.perf_counter()  # the first token is the argmax of pre.logits (decode takes it)
            out = decode(work, pre.logits, len(ids))
            t4 = time.perf_counter()
            seq_states = dict(pre.states)
            if layout.ssm_layers:
                seq_states[out.end] = capture_ssm(work, layout, out.end)
            result = self.cache.finish(handle, np.asarray(out.tokens, dtype=np.int64),
                                       states=seq_states, kv=lambda s, e: slice_kv(work, layout, s, e))
            t5 = time.perf_counter()
        except BaseException:
            if handle.active:
                self.cache.abort(handle)
            raise
        return EngineResult(
            request_id=handle.request_id, input_len=len(ids), output_tokens=tuple(out.tokens),
            greedy_tokens=tuple(out.greedy), kv_hit_len=handle.match.kv_hit_len,
            usable_hit_len=handle.match.usable_hit_len, prefill_checkpoints=handle.prefill_checkpoints,
            captured=tuple(sorted(pre.states)), admitted=result.admitted, cached=result.cached,
            num_prefill_calls=pre.num_calls,
            lookup_s=lookup_s, restore_s=best.restore_s, prefill_s=best.prefill_s, capture_s=best.pre.capture_s,
            ttft_s=lookup_s + best.restore_s + best.prefill_s, ttft_cpu_s=lookup_cpu_s + best.cpu_s,
            decode_s=t4 - t3, save_s=t5 - t4)


class _Prefilled(NamedTuple):
    work: Any            # the DynamicCache after the prefill
    pre: PrefillResult
    start: int           # where the prefill started (0 after a full-input hit)
    restore_s: float
    prefill_s: float
    cpu_s: float         # thread CPU time of restore + prefill
