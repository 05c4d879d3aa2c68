"""Prefill from a restored prefix with SSM checkpoints inside it, and decoding. A checkpoint is taken
by ending a forward call (:class:`ChunkBoundary`: at the last chunk boundary, bitwise exact;
:class:`Segmented`: at the position, exact up to rounding); decoding feeds the last token too and
clones states as it passes them. See docs/engine.md ("Prefill and decode")."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence, Sized
from typing import Any, NamedTuple, Protocol

import torch

from marconi.engine.errors import EngineError
from marconi.engine.states import SSMPayload, capture_ssm
from marconi.core.registry import Registry

__all__ = [
    "CHECKPOINTING",
    "Checkpointing",
    "ChunkBoundary",
    "DecodeResult",
    "PrefillResult",
    "Segmented",
    "append_forced",
    "decode_forced",
    "decode_greedy",
    "make_checkpointing",
    "prefill",
]


# ================================================================================ placement
class Checkpointing(Protocol):
    """Where the state for a checkpoint requested at ``p`` is taken during a prefill from ``start``."""

    name: str

    def place(self, requested: int, start: int, chunk_size: int | None) -> int | None:
        """A position ``b`` with ``start < b <= requested``, or None when no state can be taken."""
        ...

    def state_grid(self, chunk_size: int | None) -> int | None:
        """The grid (from the resume point) states lie on, for the core's ``prefill_chunk_len``; None: any."""
        ...


class Segmented:
    """Exact: end a forward call at ``p`` itself (the paper's two-pass prefill)."""

    name = "segmented"

    def place(self, requested: int, start: int, chunk_size: int | None) -> int | None:
        return requested if requested > start else None

    def state_grid(self, chunk_size: int | None) -> int | None:
        return None


class ChunkBoundary:
    """Coarse, no extra FLOPs: the last scan-chunk boundary ``<= p`` (chunked state passing)."""

    name = "chunk-boundary"

    def state_grid(self, chunk_size: int | None) -> int | None:
        return chunk_size

    def place(self, requested: int, start: int, chunk_size: int | None) -> int | None:
        if requested <= start:
            return None
        if chunk_size is None:
            return requested
        boundary = start + (requested - start) // chunk_size * chunk_size
        return boundary if boundary > start else None


CHECKPOINTING: Registry[Checkpointing] = Registry("checkpointing")


@CHECKPOINTING.register("segmented", "exact state at p: the prefill is cut at p (two-pass)")
def _segmented() -> Checkpointing:
    return Segmented()


@CHECKPOINTING.register("chunk-boundary", "state at the last scan-chunk boundary <= p (no extra FLOPs)")
def _chunk_boundary() -> Checkpointing:
    return ChunkBoundary()


def make_checkpointing(spec: str | Checkpointing) -> Checkpointing:
    return CHECKPOINTING.create(spec) if isinstance(spec, str) else spec


# ================================================================================ prefill
class PrefillResult(NamedTuple):
    """``logits`` ``[k, vocab]``; ``states``: position -> state; ``placed``: requested -> captured
    position (None: not captured); ``num_calls``; ``capture_s``: seconds cloning; ``hidden``: last
    position's final hidden state (a view)."""

    logits: torch.Tensor
    states: dict[int, SSMPayload]
    placed: dict[int, int | None]
    num_calls: int
    capture_s: float
    hidden: torch.Tensor


def prefill(model: Any, cache: Any, token_ids: torch.Tensor, start: int, checkpoints: Iterable[int] = (), *,
            checkpointing: str | Checkpointing = "segmented", keep_logits: int = 1) -> PrefillResult:
    """Prefill ``token_ids[start:]`` into ``cache`` (holding ``token_ids[:start]``; ends holding all),
    cloning states at ``checkpoints`` in ``(start, len]`` as placed by ``checkpointing``;
    ``keep_logits``: trailing positions returned (0: all)."""
    end = len(token_ids)
    if not 0 <= start < end:
        raise EngineError(f"prefill start {start} outside [0, {end}): nothing to compute")
    policy = make_checkpointing(checkpointing)
    placed: dict[int, int | None] = {}
    for p in sorted(set(int(p) for p in checkpoints)):
        if not start < p <= end:
            raise EngineError(f"checkpoint {p} outside the prefilled range ({start}, {end}]")
        placed[p] = end if p == end else policy.place(p, start, model.chunk_size)
    run = _run_cut(model, cache, token_ids, 0, start, end, {b for b in placed.values() if b is not None},
                   keep_logits)
    return PrefillResult(run.logits, run.states, placed, run.num_calls, run.capture_s, run.hidden)


class _CutRun(NamedTuple):
    logits: torch.Tensor
    hidden: torch.Tensor
    states: dict[int, SSMPayload]
    num_calls: int
    capture_s: float


def _run_cut(model: Any, cache: Any, token_ids: torch.Tensor, offset: int, start: int, end: int,
             capture_at: set[int], keep_logits: int = 1) -> _CutRun:
    """Forward ``[start, end)`` as calls ending at each ``capture_at`` and at ``end``, cloning states."""
    cuts = sorted({p for p in capture_at if start < p < end} | {end})
    states: dict[int, SSMPayload] = {}
    pieces: list[torch.Tensor] = []
    position = start
    capture_s = 0.0
    for cut in cuts:
        keep = 0 if keep_logits == 0 else (keep_logits if cut == end else 1)
        fwd = model.forward_full(cache, token_ids[position - offset:cut - offset], position, keep_logits=keep)
        if keep_logits == 0 or cut == end:
            pieces.append(fwd.logits)
        position = cut
        if cut in capture_at and model.layout.ssm_layers:
            t = time.perf_counter()
            states[cut] = capture_ssm(cache, model.layout, cut, fwd.hidden)
            capture_s += time.perf_counter() - t
    logits = torch.cat(pieces) if keep_logits == 0 else pieces[-1][-keep_logits:]
    return _CutRun(logits, fwd.hidden, states, len(cuts), capture_s)


# ================================================================================ decode
class DecodeResult(NamedTuple):
    """``tokens``: the output; ``greedy``: the argmax at each step; ``end``: tokens the cache holds after
    (the last token was fed); ``states``: position -> state captured in ``[start, end]``."""

    tokens: list[int]
    greedy: list[int]
    end: int
    states: dict[int, SSMPayload]


Capture = Callable[[int, Sequence[int]], bool]
"""``capture(position, tokens)``: clone the state at ``position`` (the cache's current depth)?
``tokens`` is the output so far including the token about to be fed — or, once decoding is over
(``position == end``), the whole output."""


def _decode(model: Any, cache: Any, logits: torch.Tensor, start: int, num_steps: int,
            choose: Callable[[int, int], int | None], capture: Capture | None = None,
            hidden: torch.Tensor | None = None) -> DecodeResult:
    """Shared loop: ``choose(i, argmax)`` returns the token to emit (None stops); every emitted token,
    the last included, is fed back."""
    tokens: list[int] = []
    greedy: list[int] = []
    states: dict[int, SSMPayload] = {}
    position = start
    next_logits = logits.reshape(-1, logits.shape[-1])[-1]
    for i in range(num_steps):
        best = int(torch.argmax(next_logits))
        token = choose(i, best)
        if token is None:
            break
        greedy.append(best)
        tokens.append(token)
        if capture is not None and capture(position, tokens):
            states[position] = _capture_here(model, cache, position, hidden)
        fwd = model.forward_full(cache, torch.tensor([token]), position)
        next_logits, hidden = fwd.logits[-1], fwd.hidden
        position += 1
    if capture is not None and tokens and capture(position, tokens):
        states[position] = _capture_here(model, cache, position, hidden)
    return DecodeResult(tokens, greedy, position, states)


def _capture_here(model: Any, cache: Any, position: int, hidden: torch.Tensor | None) -> SSMPayload:
    if hidden is None:
        raise EngineError(f"a state at {position} was asked for, but no final hidden state is known there")
    return capture_ssm(cache, model.layout, position, hidden)


def decode_greedy(model: Any, cache: Any, logits: torch.Tensor, start: int, max_new_tokens: int, *,
                  eos_token_id: int | None = None, capture: Capture | None = None,
                  hidden: torch.Tensor | None = None) -> DecodeResult:
    """Greedy decoding until ``max_new_tokens`` or ``eos_token_id``; ``cache`` goes from ``start`` to
    ``start + len(tokens)`` tokens. ``capture`` / ``hidden``: states to clone (see :data:`Capture`)."""
    if max_new_tokens < 1:
        raise EngineError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    done = [False]

    def choose(_: int, best: int) -> int | None:
        if done[0]:
            return None
        done[0] = eos_token_id is not None and best == eos_token_id
        return best

    return _decode(model, cache, logits, start, max_new_tokens, choose, capture, hidden)


def decode_forced(model: Any, cache: Any, logits: torch.Tensor, start: int, tokens: Sequence[int], *,
                  capture: Capture | None = None, hidden: torch.Tensor | None = None) -> DecodeResult:
    """Teacher-forced decoding of ``tokens`` (1-token forwards); ``greedy`` holds the model's choices.
    Cache and captures as in :func:`decode_greedy`."""
    forced = _forced(model, tokens, "teacher-forced decoding")
    return _decode(model, cache, logits, start, len(forced), lambda i, _: forced[i], capture, hidden)


def append_forced(model: Any, cache: Any, logits: torch.Tensor, start: int, tokens: Sequence[int], *,
                  capture_at: Iterable[int] = (), hidden: torch.Tensor | None = None) -> DecodeResult:
    """Append a known output with one prefill-style forward, cut at ``capture_at``.

    Leaves the cache where :func:`decode_forced` does, up to rounding, far cheaper (TTFT replays).
    ``greedy`` holds only the first choice.
    """
    forced = _forced(model, tokens, "appending an output")
    ids = torch.tensor(forced)
    end = start + len(ids)
    wanted = {int(p) for p in capture_at}
    if any(not start <= p <= end for p in wanted):
        raise EngineError(f"capture positions {sorted(wanted)} outside the appended range [{start}, {end}]")
    states = {start: _capture_here(model, cache, start, hidden)} if start in wanted else {}
    states.update(_run_cut(model, cache, ids, start, start, end, wanted).states)
    first = int(torch.argmax(logits.reshape(-1, logits.shape[-1])[-1]))
    return DecodeResult(forced, [first], end, states)


def _forced(model: Any, tokens: Sequence[int], what: str) -> list[int]:
    if isinstance(tokens, Sized) and len(tokens) == 0:
        raise EngineError(f"{what} needs at least one output token")
    return model.check_tokens(tokens).tolist()
