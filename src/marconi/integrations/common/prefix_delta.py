"""Prefix deltas: a request's tokens rebuilt from the tokens past its deepest known prefix.

An engine that names its prefixes (``RequestObservation.prefix_keys``: vLLM's block hashes, chained,
each naming the first ``(i + 1) * key_tokens`` tokens) lets a reader of finished requests skip the
tokens it has seen. :class:`PrefixEncoder` names the deepest prefix the other half holds and cuts the
tokens past it; :class:`PrefixDecoder` rebuilds the whole request from that and the blocks it kept.
The two halves run in two processes (the shadow's replay process,
:mod:`marconi.integrations.common.shadow_process`: only the new tokens cross the pipe) or in one
(:class:`PrefixTokens`: the inline shadow converts only the new tokens from the engine's Python
lists, which is most of an inline replay's cost: docs/vllm-at-scale.md).

Exact: the decoded tokens are the request's, whatever was forgotten (tests/test_shadow_alpha_lag.py).
Bounded: each half keeps the blocks of the last ``kept_tokens`` tokens it saw (int32: 16 MiB at the
default). Nothing here knows an engine.

A list of ids becomes int32 through :func:`int32_bytes`: the compiled ``_ids.c`` where it was built
(``pip install -e .`` with a C compiler; ~1.5 ns an id), else :func:`int32_bytes_python`
(``struct.pack``, ~5.6 ns), which is its specification: the same bytes and the same exceptions
(tests/test_int32_bytes.py).
"""

from __future__ import annotations

import operator
import struct
from collections import deque
from itertools import islice
from typing import Any, Sequence

import numpy as np

__all__ = ["INT32_BYTES_COMPILED", "KEPT_TOKENS", "PrefixEncoder", "PrefixDecoder", "PrefixTokens", "int32_bytes",
           "int32_bytes_python", "packed_ids"]


def _ids(tokens: Sequence[int]) -> list[int] | tuple[int, ...]:
    """Token ids as marshal takes them: a list or tuple of ints as is, anything else (a numpy array,
    an engine's read-only list type) converted once."""
    if type(tokens) is list or type(tokens) is tuple:
        return tokens                  # type: ignore[return-value]
    tolist = getattr(tokens, "tolist", None)
    return tolist() if tolist is not None else [int(t) for t in tokens]


_INT32 = np.iinfo(np.int32)


def int32_bytes_python(tokens: Sequence[int], start: int = 0) -> bytes:
    """``tokens[start:]`` (a list or tuple of token ids) as native int32 bytes: the specification of
    :func:`int32_bytes`. ``start`` spares the caller a slice, which would touch every id once more.

    Raises:
        TypeError: ``tokens`` is not a list or tuple (``"token ids must be a list or tuple, got
            <type>"``), or an id is not an integer (``"token id <repr> at <index> is not an
            integer"``, the index in ``tokens``: neither an int nor an ``__index__``; a float is
            refused, not truncated), or ``start`` is not an integer.
        OverflowError: an id is outside int32 (``"token id <value> at <index> is outside int32"``).
        ValueError: ``start`` is negative (``"start must be >= 0, got <start>"``); a start past the
            end gives ``b""``, as a slice does.
    Negative ids pass: the reader of the array checks them.
    """
    start = operator.index(start)
    if start < 0:
        raise ValueError(f"start must be >= 0, got {start}")
    if not isinstance(tokens, (list, tuple)):
        raise TypeError(f"token ids must be a list or tuple, got {type(tokens).__name__}")
    start = min(start, len(tokens))
    try:
        return struct.pack(f"{len(tokens) - start}i", *islice(tokens, start, None))
    except struct.error:
        pass
    for at in range(start, len(tokens)):       # name the first bad id, as the compiled loop does
        token = tokens[at]
        try:
            value = operator.index(token)
        except TypeError:
            raise TypeError(f"token id {token!r} at {at} is not an integer") from None
        if not _INT32.min <= value <= _INT32.max:
            raise OverflowError(f"token id {value} at {at} is outside int32")
    raise AssertionError("struct.pack refused ids that each fit int32")      # pragma: no cover


try:
    from marconi.integrations.common._ids import int32_bytes as _compiled_int32_bytes
except ImportError:               # no C compiler where the project was installed: the same, 4x slower
    _compiled_int32_bytes = None

#: Whether :func:`int32_bytes` is the compiled loop (``_ids.c``) or :func:`int32_bytes_python`.
INT32_BYTES_COMPILED = _compiled_int32_bytes is not None

#: ``int32_bytes(ids, start=0)``: ``ids[start:]`` (a list or tuple) as native int32 bytes: the compiled
#: ``_ids.c`` where built, else :func:`int32_bytes_python` (same bytes, same exceptions).
int32_bytes = _compiled_int32_bytes if _compiled_int32_bytes is not None else int32_bytes_python


def _array(tokens: Any) -> np.ndarray:
    """Token ids as an int32 array: a Python list through :func:`int32_bytes` (read-only: the bytes'
    memory, no copy), bytes from :func:`packed_ids` read in place, anything else through
    ``np.asarray``. OverflowError for an id outside int32, TypeError for one that is not an integer;
    the cache that reads the array checks the rest (negative ids)."""
    if type(tokens) is list:
        return np.frombuffer(int32_bytes(tokens), dtype=np.int32)
    if type(tokens) is bytes:
        return np.frombuffer(tokens, dtype=np.int32)
    arr = np.asarray(tokens)
    if not arr.size:
        return np.empty(0, dtype=np.int32)
    if arr.dtype.kind not in "iu":              # np.asarray(..., dtype=np.int32) would truncate floats
        raise TypeError(f"token ids must be integers, got {arr.dtype}")
    if arr.dtype != np.int32 and (arr.max() > _INT32.max or arr.min() < _INT32.min):
        raise OverflowError("a token id is outside int32")
    return arr.astype(np.int32, copy=False)


def packed_ids(tokens: Sequence[int], start: int = 0) -> bytes | Sequence[int]:
    """``tokens[start:]`` (a list or tuple of ids) as native int32 bytes (:func:`int32_bytes`), which
    :func:`_array` reads without a copy (the replay process's wire: 4 bytes an id, and no conversion
    in the child); the ids themselves (sliced) where they do not all fit (the reader then raises on
    them as it would have)."""
    try:
        return int32_bytes(tokens, start)
    except (TypeError, OverflowError):
        return tokens[start:] if start else tokens


#: Tokens of known prefixes the child keeps (int32: 16 MiB), and so the blocks the parent may name.
KEPT_TOKENS = 1 << 22


class PrefixEncoder:
    """The parent's half of the delta: which prefix of a request the child already holds.

    An event with ``prefix_keys`` (see :class:`~marconi.integrations.common.alpha.RequestObservation`)
    is sent as the id of its deepest known key plus the tokens past it; every key past it gets the
    next id. The last ``max(1, kept_tokens // key_tokens)`` ids are known, first in first out, and a
    key counts as known only if every block of its chain (back to the chain's first id, kept beside
    it) is still among them, so :class:`PrefixDecoder` can always rebuild it. Cost: a dict lookup per
    new block and a list slice; no per-token Python work.
    """

    def __init__(self, kept_tokens: int = KEPT_TOKENS) -> None:
        self.kept_tokens = kept_tokens
        self.next_id = 0
        self._known: dict[Any, tuple[int, int]] = {}     # key -> (id, the first id of its chain)
        self._order: deque[tuple[int, Any]] = deque()    # (id, key), ids increasing
        self._key_tokens = 0         # the block size the ids are of (another forgets them all)
        self._floor = 0              # ids below are forgotten (the decoder's _oldest)

    def encode(self, prompt: Sequence[int], output: Sequence[int], keys: Sequence[Any], key_tokens: int) -> tuple:
        """The frame's tuple: ``(base id or -1, blocks below the tokens sent, new blocks, key_tokens,
        prompt length, the prompt's tokens past the base, the output's)``, those tokens as
        :func:`packed_ids` gives them (int32 bytes, or the ids where they do not fit); registers the
        new blocks."""
        prompt, output = _ids(prompt), _ids(output)
        count = min(len(keys), (len(prompt) + len(output)) // key_tokens) if key_tokens > 0 else 0
        if not count:
            return -1, 0, 0, 0, len(prompt), packed_ids(prompt), packed_ids(output)
        known, order = self._known, self._order
        if key_tokens != self._key_tokens:      # blocks of another size: start over (PrefixDecoder too)
            known.clear()
            order.clear()
            self._key_tokens, self._floor = key_tokens, self.next_id
        cutoff = self._floor = max(self._floor, self.next_id - max(1, self.kept_tokens // key_tokens))
        while order and order[0][0] < cutoff:
            old_id, key = order.popleft()
            if known.get(key, (None,))[0] == old_id:
                del known[key]
        base, below = -1, 0
        for i in range(count - 1, -1, -1):
            got = known.get(keys[i])
            if got is not None and got[1] >= cutoff:
                base, below = got[0], i + 1
                break
        first = known[keys[below - 1]][1] if base >= 0 else self.next_id
        for i in range(below, count):
            known.pop(keys[i], None)            # a stale key goes to the back with its new id
            known[keys[i]] = (self.next_id, first)
            order.append((self.next_id, keys[i]))
            self.next_id += 1
        cut = below * key_tokens
        if cut <= len(prompt):
            return base, below, count - below, key_tokens, len(prompt), packed_ids(prompt, cut), packed_ids(output)
        return base, below, count - below, key_tokens, len(prompt), b"", packed_ids(output, cut - len(prompt))


class PrefixDecoder:
    """The child's half: rebuilds each request's prompt and output from :meth:`PrefixEncoder.encode`'s
    tuple, keeping each new block's tokens (a copy, so a request's array is not kept whole) and its
    parent's id; forgets the ids the encoder can no longer name."""

    def __init__(self, kept_tokens: int = KEPT_TOKENS) -> None:
        self.kept_tokens = kept_tokens
        self.next_id = 0
        self._oldest = 0             # ids below are forgotten
        self._key_tokens = 0
        self._blocks: dict[int, tuple[np.ndarray, int]] = {}     # id -> (its tokens, its parent's id or -1)

    def decode(self, frame: tuple) -> tuple[np.ndarray, np.ndarray]:
        """``(prompt, output)`` as read-only int32 arrays. KeyError: the frame names a block this
        decoder never kept (the two halves disagree)."""
        base, below, new, key_tokens, prompt_len, rest_of_prompt, rest_of_output = frame
        tail = _array(rest_of_prompt)
        if len(rest_of_output):
            tail = np.concatenate([tail, _array(rest_of_output)])
        if base >= 0 or new:
            blocks = self._blocks
            if key_tokens != self._key_tokens:        # as the encoder: blocks of another size, start over
                blocks.clear()
                self._key_tokens, self._oldest = key_tokens, self.next_id
            cutoff = max(self._oldest, self.next_id - max(1, self.kept_tokens // key_tokens))
            for old in range(self._oldest, cutoff):
                del blocks[old]
            self._oldest = cutoff
        if base >= 0:
            parts, at = [], base
            while at >= 0:
                tokens, at = self._blocks[at]
                parts.append(tokens)
            parts.reverse()
            parts.append(tail)
            seq = np.concatenate(parts)
        else:
            seq = tail
        if new:
            start = below * key_tokens
            kept = seq[start:start + new * key_tokens].copy()
            parent = base
            for j in range(new):
                self._blocks[self.next_id] = (kept[j * key_tokens:(j + 1) * key_tokens], parent)
                parent = self.next_id
                self.next_id += 1
        seq.flags.writeable = False
        return seq[:prompt_len], seq[prompt_len:]


class PrefixTokens:
    """Both halves in one process: each request's ``(prompt, output)`` as int32 arrays, converting
    only the tokens past its deepest known prefix. A request without prefix keys is converted whole
    (:func:`_array`); one whose tokens are arrays already passes through.

    Keys of fewer than ``min_key_tokens`` tokens are not used either: rebuilding a request from many
    small blocks costs more than converting it whole (the bench's 9,000-token requests, CPU µs per
    request, delta against whole: 16-token keys 192 against 62; 64: 77 against 61; 256: 52 against
    60; vLLM's hybrid 1,152: 42 against 62).

    A failure (an id outside int32, or the halves disagreeing, which would be a bug) starts both
    halves over and is raised: the next request is read whole and exact. Where the whole conversion
    fails, the inputs pass through as they are, and the reader's own check names the bad id.
    """

    def __init__(self, kept_tokens: int = KEPT_TOKENS, min_key_tokens: int = 256) -> None:
        self.kept_tokens = kept_tokens
        self.min_key_tokens = min_key_tokens
        self._encoder = PrefixEncoder(kept_tokens)
        self._decoder = PrefixDecoder(kept_tokens)

    def arrays(self, prompt: Sequence[int], output: Sequence[int], keys: Sequence[Any],
               key_tokens: int) -> tuple[Any, Any]:
        """``(prompt, output)``: read-only int32 arrays equal to the request's tokens (lists converted
        or rebuilt from known prefixes), or the inputs themselves (arrays already, or ids an int32
        array cannot hold)."""
        if isinstance(prompt, np.ndarray):
            return prompt, output
        if not keys or key_tokens < max(1, self.min_key_tokens):
            if type(prompt) is not list or type(output) is not list:
                return prompt, output            # the reader converts (and checks) other types
            try:
                return _array(prompt), _array(output)
            except (OverflowError, TypeError):
                return prompt, output
        try:
            return self._decoder.decode(self._encoder.encode(prompt, output, keys, key_tokens))
        except BaseException:
            self._encoder = PrefixEncoder(self.kept_tokens)
            self._decoder = PrefixDecoder(self.kept_tokens)
            raise
