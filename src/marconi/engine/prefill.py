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

For LFM2 (no chunked scan) every position is a boundary and both placements coincide.

**Decode** is greedy or teacher-forced (a trace replay forces the recorded output so the next
turn's input matches what was cached). Either way the loop ends by feeding the *last* output token
through the model — one extra 1-token forward whose logits are discarded — so the cache then
covers input + all output and the last-decoded-token checkpoint (where a conversation resumes)
can be captured from it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, Protocol

import torch

from marconi.engine.errors import EngineError
from marconi.engine.states import SSMPayload, capture_ssm
from marconi.registry import Registry

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


class Segmented:
    """Exact: end a forward call at ``p`` itself (the paper's two-pass prefill)."""

    name = "segmented"

    def place(self, requested: int, start: int, chunk_size: int | None) -> int | None:
        return requested if requested > start else None


class ChunkBoundary:
    """Coarse and free of extra FLOPs: the last scan-chunk boundary ``<= p`` (paper's chunked state passing)."""

    name = "chunk-boundary"

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
    ``capture_s``: seconds spent cloning states."""

    logits: torch.Tensor
    states: dict[int, SSMPayload]
    placed: dict[int, int | None]
    num_calls: int
    capture_s: float


def prefill(model: Any, cache: Any, token_ids: torch.Tensor, start: int, checkpoints: Iterable[int] = (), *,
            checkpointing: str | Checkpointing = "segmented", keep_logits: int = 1) -> PrefillResult:
    """Prefill ``token_ids[start:]`` into ``cache`` (which holds ``token_ids[:start]``), with checkpoints.

    ``checkpoints``: positions ``p`` (``start < p <= len(token_ids)``) whose state is wanted; each
    is placed by ``checkpointing`` and the state there is cloned into ``states``. ``keep_logits``:
    logits of that many trailing positions are returned (0: every position of ``[start, end)``).
    Modifies ``cache`` in place; it ends holding all of ``token_ids``.
    """
    end = len(token_ids)
    if not 0 <= start < end:
        raise EngineError(f"prefill start {start} outside [0, {end}): nothing to compute")
    policy = make_checkpointing(checkpointing)
    placed: dict[int, int | None] = {}
    for p in sorted(set(int(p) for p in checkpoints)):
        if not start < p <= end:
            raise EngineError(f"checkpoint {p} outside the prefilled range ({start}, {end}]")
        placed[p] = policy.place(p, start, model.chunk_size)
    cuts = sorted({b for b in placed.values() if b is not None} | {end})
    states: dict[int, SSMPayload] = {}
    pieces: list[torch.Tensor] = []
    position = start
    capture_s = 0.0
    for cut in cuts:
        keep = 0 if keep_logits == 0 else (keep_logits if cut == end else 1)
        logits = model.forward(cache, token_ids[position:cut], position, keep_logits=keep)
        if keep_logits == 0 or cut == end:
            pieces.append(logits)
        position = cut
        if cut in placed.values() and model.layout.ssm_layers:
            t = time.perf_counter()
            states[cut] = capture_ssm(cache, model.layout, cut)
            capture_s += time.perf_counter() - t
    logits = torch.cat(pieces) if keep_logits == 0 else pieces[-1][-keep_logits:]
    return PrefillResult(logits, states, placed, len(cuts), capture_s)


# ================================================================================ decode
class DecodeResult(NamedTuple):
    """``tokens``: the output; ``greedy``: the model's argmax at each step (== tokens when greedy);
    ``end``: tokens the cache holds afterwards (input + output: the last token was fed)."""

    tokens: list[int]
    greedy: list[int]
    end: int


def _decode(model: Any, cache: Any, logits: torch.Tensor, start: int, num_steps: int,
            choose: Callable[[int, int], int | None]) -> DecodeResult:
    """Shared loop: at step ``i`` the model's argmax ``g`` is offered to ``choose(i, g)``, which
    returns the token to emit (None stops). Every emitted token, the last included, is fed back."""
    tokens: list[int] = []
    greedy: list[int] = []
    position = start
    next_logits = logits.reshape(-1, logits.shape[-1])[-1]
    for i in range(num_steps):
        best = int(torch.argmax(next_logits))
        token = choose(i, best)
        if token is None:
            break
        greedy.append(best)
        tokens.append(token)
        next_logits = model.forward(cache, torch.tensor([token]), position)[-1]
        position += 1
    return DecodeResult(tokens, greedy, position)


def decode_greedy(model: Any, cache: Any, logits: torch.Tensor, start: int, max_new_tokens: int, *,
                  eos_token_id: int | None = None) -> DecodeResult:
    """Greedy decoding from the prefill's last ``logits``; ``cache`` holds ``start`` tokens.

    Stops after ``max_new_tokens`` or after emitting ``eos_token_id``. The cache ends holding
    ``start + len(tokens)`` tokens (the last token is fed through the model).
    """
    if max_new_tokens < 1:
        raise EngineError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    done = [False]

    def choose(_: int, best: int) -> int | None:
        if done[0]:
            return None
        done[0] = eos_token_id is not None and best == eos_token_id
        return best

    return _decode(model, cache, logits, start, max_new_tokens, choose)


def decode_forced(model: Any, cache: Any, logits: torch.Tensor, start: int, tokens: Sequence[int]) -> DecodeResult:
    """Teacher-forced decoding: emit ``tokens`` one step at a time (each a 1-token decode forward).

    ``greedy`` reports what the model would have chosen at each step. The cache ends holding
    ``start + len(tokens)`` tokens.
    """
    if len(tokens) == 0:
        raise EngineError("teacher-forced decoding needs at least one output token")
    forced = model.check_tokens(list(tokens)).tolist()
    return _decode(model, cache, logits, start, len(forced), lambda i, _: forced[i])


def append_forced(model: Any, cache: Any, logits: torch.Tensor, start: int, tokens: Sequence[int]) -> DecodeResult:
    """Append a known output with one prefill-style forward instead of ``len(tokens)`` decode steps.

    The cache ends exactly where :func:`decode_forced` leaves it (input + output, last token fed),
    equal up to rounding (chunked scan vs per-token recurrence), at a fraction of the cost — for
    trace replays that measure TTFT and do not need real decoding. ``greedy`` holds only the
    model's first choice (the one the prefill's ``logits`` give).
    """
    if len(tokens) == 0:
        raise EngineError("appending an output needs at least one token")
    ids = model.check_tokens(list(tokens))
    model.forward(cache, ids, start)
    first = int(torch.argmax(logits.reshape(-1, logits.shape[-1])[-1]))
    return DecodeResult(ids.tolist(), [first], start + len(ids))
