"""Prefill from a restored prefix with SSM checkpoints inside it, and decoding.

**Where a checkpoint can be taken (paper §4.1, "SSM state checkpointing during prefill").** A
recurrent layer overwrites its state in place, so the state at position ``p`` inside a prefill of
``[start, end)`` exists only if the prefill stops there. Both of the paper's ways are run here as
*segmented* prefills — the forward is cut into calls ``[start, b1) [b1, b2) ... [bk, end)`` that each
resume from the cache the previous one left, and the state is cloned between calls; each token is
computed once (no token is recomputed, unlike a literal "two-pass" prefill). They differ in ``b``:

1. :class:`ChunkBoundary` — the state at the last *chunk boundary* ``<= p`` (coarser). The
   Mamba-2 (SSD) and gated-DeltaNet scans process a forward in chunks of ``C`` tokens counted from
   the forward's first token (``C`` = ``config.mamba_chunk_size`` / ``chunk_size``, 64 for
   the DeltaNet torch scan; see ``HybridModel.chunk_size``), and compute the state at every chunk
   boundary anyway. transformers' torch scan does not return those intermediate states, so we
   obtain the one at ``b = start + C·floor((p - start)/C)`` by ending a forward call there. The
   chunks of ``[start, b)`` + ``[b, end)`` are then exactly the chunks of ``[start, end)``: the
   logits are the same bits as an unsplit prefill (float64) and there are no extra FLOPs — the
   only cost is the extra call's fixed overhead and shorter matmuls, which the benchmark measures.
2. :class:`Segmented` (the paper's two-pass prefill) — ``b = p`` exactly. The chunk grid of the
   second call is shifted, so results equal an unsplit prefill up to rounding (<= 1e-12 in
   float64 with :mod:`marconi.engine.precision`, ~1e-6 in float32).

For LFM2 (no chunked scan) every position is a boundary and both placements coincide. The state
at the prefill's end is exact under both: the last call ends there anyway.

The engine itself asks the cache core where states can be taken (``PrefixCache(prefill_chunk_len=C)``
models chunk-boundary placement, so a simulation makes the same decisions) and then cuts exactly at
the positions the core hands it; the placements here serve direct callers and the benchmark.

**Decode** is greedy or teacher-forced (a trace replay forces the recorded output so the next
turn's input matches what was cached). Either way the loop ends by feeding the *last* output token
through the model — one extra 1-token forward whose logits are discarded — so the cache then
covers input + all output and the last-decoded-token checkpoint (where a conversation resumes)
can be captured from it. Every decode step leaves the state at one more position, so a state the
cache wants inside the output (a branch point, a block boundary) is cloned at the step that
reaches it: ``capture(position, tokens)`` is asked before each token is fed and once at the end.

Every captured state keeps the final hidden state of the forward that produced it (see
``states.SSMPayload``).
"""

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
        """The grid (counted from the resume point) a prefill's states lie on, for the cache
        core's ``prefill_chunk_len``; None: any position."""
        ...


class Segmented:
    """Exact: end a forward call at ``p`` itself (the paper's two-pass prefill)."""

    name = "segmented"

    def place(self, requested: int, start: int, chunk_size: int | None) -> int | None:
        return requested if requested > start else None

    def state_grid(self, chunk_size: int | None) -> int | None:
        return None


class ChunkBoundary:
    """Coarse and free of extra FLOPs: the last scan-chunk boundary ``<= p`` (paper's chunked state passing)."""

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
    """``logits``: ``[k, vocab]`` of the last positions; ``states``: captured position -> state;
    ``placed``: requested position -> captured position (None: not captured); ``num_calls``: forwards run;
    ``capture_s``: seconds spent cloning states; ``hidden``: final hidden state ``[1, 1, D]`` of
    the last position (a view)."""

    logits: torch.Tensor
    states: dict[int, SSMPayload]
    placed: dict[int, int | None]
    num_calls: int
    capture_s: float
    hidden: torch.Tensor


def prefill(model: Any, cache: Any, token_ids: torch.Tensor, start: int, checkpoints: Iterable[int] = (), *,
            checkpointing: str | Checkpointing = "segmented", keep_logits: int = 1) -> PrefillResult:
    """Prefill ``token_ids[start:]`` into ``cache`` (which holds ``token_ids[:start]``), with checkpoints.

    ``checkpoints``: positions ``p`` (``start < p <= len(token_ids)``) whose state is wanted; each
    is placed by ``checkpointing`` (the prefill's end is always exact) and the state there is
    cloned into ``states``. ``keep_logits``: logits of that many trailing positions are returned
    (0: every position of ``[start, end)``). Modifies ``cache`` in place; it ends holding all of
    ``token_ids``.
    """
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
    """Forward positions ``[start, end)`` as calls ending at each of ``capture_at`` (and at
    ``end``), cloning the state after each of them. ``token_ids[i]`` sits at position ``offset + i``."""
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
    """``tokens``: the output; ``greedy``: the model's argmax at each step (== tokens when greedy);
    ``end``: tokens the cache holds afterwards (input + output: the last token was fed);
    ``states``: position -> state captured on the way (positions in ``[start, end]``)."""

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
    """Shared loop: at step ``i`` the model's argmax ``g`` is offered to ``choose(i, g)``, which
    returns the token to emit (None stops). Every emitted token, the last included, is fed back.
    ``hidden``: final hidden state of the forward that left the cache at ``start`` (for a capture
    there)."""
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
    """Greedy decoding from the prefill's last ``logits``; ``cache`` holds ``start`` tokens.

    Stops after ``max_new_tokens`` or after emitting ``eos_token_id``. The cache ends holding
    ``start + len(tokens)`` tokens (the last token is fed through the model). ``capture`` /
    ``hidden``: states to clone on the way (see :data:`Capture`).
    """
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
    """Teacher-forced decoding: emit ``tokens`` one step at a time (each a 1-token decode forward).

    ``greedy`` reports what the model would have chosen at each step. The cache ends holding
    ``start + len(tokens)`` tokens. ``capture`` / ``hidden`` as in :func:`decode_greedy`.
    """
    forced = _forced(model, tokens, "teacher-forced decoding")
    return _decode(model, cache, logits, start, len(forced), lambda i, _: forced[i], capture, hidden)


def append_forced(model: Any, cache: Any, logits: torch.Tensor, start: int, tokens: Sequence[int], *,
                  capture_at: Iterable[int] = (), hidden: torch.Tensor | None = None) -> DecodeResult:
    """Append a known output with one prefill-style forward instead of ``len(tokens)`` decode steps.

    The cache ends exactly where :func:`decode_forced` leaves it (input + output, last token fed),
    equal up to rounding (chunked scan vs per-token recurrence), at a fraction of the cost — for
    trace replays that measure TTFT and do not need real decoding. ``greedy`` holds only the
    model's first choice (the one the prefill's ``logits`` give). ``capture_at``: positions in
    ``[start, start + len(tokens)]`` whose states are cloned (the forward is cut there, as
    decoding would pass each of them); ``hidden`` as in :func:`decode_greedy`.
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
