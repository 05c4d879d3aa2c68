"""Token traces rebuilt from Mooncake's block-level traces: equal hash ids give equal blocks, sibling
blocks differ at their first token, and outputs never match blocks; each request is its own
session at its real time. Layout: docs/data.md ("Block-hash traces")."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from marconi.core.jsonfile import described
from marconi.io import iter_jsonl

from .messages import Progress, no_progress
from .paths import bundled_data_dir, shared_data_dir
from .trace import Request, Trace

__all__ = ["MooncakeRow", "read_mooncake_rows", "build_mooncake_trace", "MooncakeTokens",
           "default_mooncake_path"]

_FIRST_TOKEN = 3
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


@dataclass(frozen=True, slots=True)
class MooncakeRow:
    """One Mooncake request as read (``where`` is ``path:line``)."""

    where: str
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def _int_field(obj: dict, key: str, where: str, minimum: int) -> int:
    if key not in obj:
        raise ValueError(f"{where}: field {key!r}: missing")
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: field {key!r}: expected an integer, got {described(value)}")
    if value < minimum:
        raise ValueError(f"{where}: field {key!r}: must be >= {minimum}, got {value}")
    return value


def read_mooncake_rows(path: str | os.PathLike, limit: int | None = None,
                       block_size: int = 512) -> list[MooncakeRow]:
    """Parse and check the first ``limit`` lines (all when None). ValueError names file and line."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be None or >= 0, got {limit}")
    rows: list[MooncakeRow] = []
    for where, obj in iter_jsonl(path):
        if limit is not None and len(rows) >= limit:
            break
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: expected a JSON object, got {described(obj)}")
        ts = obj.get("timestamp")
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not ts >= 0:
            raise ValueError(f"{where}: field 'timestamp': expected milliseconds >= 0, got {described(ts)}")
        input_length = _int_field(obj, "input_length", where, 1)
        output_length = _int_field(obj, "output_length", where, 0)
        ids = obj.get("hash_ids")
        if not isinstance(ids, list):
            raise ValueError(f"{where}: field 'hash_ids': expected a list of integers >= 0, got {described(ids)}")
        bad = next((i for i, h in enumerate(ids) if not (type(h) is int and h >= 0)), None)
        if bad is not None:
            raise ValueError(f"{where}: field 'hash_ids': expected a list of integers >= 0, element {bad} is "
                             f"{described(ids[bad])}")
        if not (len(ids) - 1) * block_size < input_length <= len(ids) * block_size:
            raise ValueError(f"{where}: input_length {input_length} needs "
                             f"{-(-input_length // block_size)} blocks of {block_size}, "
                             f"hash_ids has {len(ids)}")
        rows.append(MooncakeRow(where, float(ts), input_length, output_length, tuple(ids)))
    return rows


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer (uint64 -> uint64, wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class MooncakeTokens:
    """Deterministic block contents for a set of rows (layout: module doc)."""

    def __init__(self, rows: Sequence[MooncakeRow], *, block_size: int = 512, vocab_size: int = 32000,
                 output_vocab: int = 1024, seed: int = 0):
        if block_size <= 0 or output_vocab <= 0:
            raise ValueError("block_size and output_vocab must be > 0")
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.seed = seed
        self.output_lo = _FIRST_TOKEN
        self.output_hi = _FIRST_TOKEN + output_vocab
        self.block_lo = self.output_hi
        self.base = vocab_size - self.block_lo
        if self.base < 2:
            raise ValueError(f"vocab_size {vocab_size} leaves no room for block tokens "
                             f"(needs > {self.block_lo + 1})")
        self.rank = self._sibling_ranks(rows)
        max_rank = max(self.rank.values(), default=0)
        if max_rank >= self.base:
            raise ValueError(f"a block has {max_rank + 1} distinct successors but only {self.base} "
                             "block token ids are available: raise vocab_size or lower output_vocab")

    @staticmethod
    def _sibling_ranks(rows: Sequence[MooncakeRow]) -> dict[int, int]:
        parent_of: dict[int, int] = {}
        children: dict[int, int] = {}
        rank: dict[int, int] = {}
        for row in rows:
            parent = -1
            for h in row.hash_ids:
                seen_parent = parent_of.setdefault(h, parent)
                if seen_parent != parent:
                    raise ValueError(f"{row.where}: hash id {h} follows {parent}, but followed "
                                     f"{seen_parent} earlier: hash ids are not prefix-chained")
                if h not in rank:
                    rank[h] = children.get(parent, 0)
                    children[parent] = rank[h] + 1
                parent = h
        return rank

    def input_tokens(self, row: MooncakeRow) -> np.ndarray:
        """int32 ``[input_length]``: the row's blocks back to back, the last one cut to length."""
        bs, base = self.block_size, np.uint64(self.base)
        ids = np.asarray(row.hash_ids, dtype=np.uint64)
        pos = np.arange(row.input_length, dtype=np.uint64)
        block = (pos // np.uint64(bs)).astype(np.int64)
        offset = pos % np.uint64(bs)
        h = ids[block]
        seed = np.uint64(self.seed & 0xFFFFFFFF)
        key = (h * np.uint64(bs) + offset) ^ (seed << np.uint64(40))
        tok = _mix64(key + np.uint64(0x9E3779B97F4A7C15)) % base
        first = offset == 0
        ranks = np.asarray([self.rank[x] for x in row.hash_ids], dtype=np.uint64)
        tok[first] = ranks[block[first]]
        tok[offset == 1] = h[offset == 1] % base
        tok[offset == 2] = (h[offset == 2] // base) % base
        return (tok + np.uint64(self.block_lo)).astype(np.int32)

    def output_tokens(self, row: MooncakeRow, index: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, index])
        return rng.integers(self.output_lo, self.output_hi, size=row.output_length, dtype=np.int32)


def default_mooncake_path() -> Path:
    """The shared data set's full conversation trace, else the vendored first 2,000 lines."""
    shared = shared_data_dir()
    if shared is not None and (shared / "mooncake" / "conversation_trace.jsonl").is_file():
        return shared / "mooncake" / "conversation_trace.jsonl"
    return bundled_data_dir() / "mooncake" / "conversation_trace_first2000.jsonl"


def build_mooncake_trace(path: str | os.PathLike | None = None, *, limit: int | None = None,
                         block_size: int = 512, vocab_size: int = 32000, output_vocab: int = 1024,
                         seed: int = 0, max_input_len: int | None = None,
                         progress: Progress | None = None) -> Trace:
    """Rebuild a token trace from a Mooncake file; ``max_input_len`` drops longer requests (counted in
    ``meta["num_dropped"]``); session ids are line indices, stable under drops."""
    source = Path(path) if path is not None else default_mooncake_path()
    rows = read_mooncake_rows(source, limit=limit, block_size=block_size)
    tokens = MooncakeTokens(rows, block_size=block_size, vocab_size=vocab_size,
                            output_vocab=output_vocab, seed=seed)
    requests: list[Request] = []
    dropped = 0
    wrap = progress or no_progress
    for i, row in enumerate(wrap(rows)):
        if max_input_len is not None and row.input_length > max_input_len:
            dropped += 1
            continue
        requests.append(Request(i, 0, row.timestamp_ms / 1000.0, tokens.input_tokens(row),
                                tokens.output_tokens(row, i)))
    params = dict(limit=limit, block_size=block_size, vocab_size=vocab_size, output_vocab=output_vocab,
                  seed=seed, max_input_len=max_input_len)
    meta = {"source": "mooncake", "recipe": "mooncake-blocks", "params": params, "files": [str(source)],
            "num_rows": len(rows), "num_dropped": dropped,
            "num_distinct_blocks": len(tokens.rank)}
    name = f"mooncake-{source.stem}" + (f"-first{limit}" if limit is not None else "")
    return Trace.from_unsorted(requests, name=name, meta=meta)
