"""Token traces rebuilt from block-hash traces: Mooncake's (FAST'25: ms timestamps, 512-token blocks,
each request its own session) and Alibaba's Qwen-Bailian usage traces (seconds, 16-token blocks,
``chat_id``/``parent_chat_id`` sessions). Equal prefixes of hash ids give equal blocks, sibling blocks
differ at their first token, and outputs never match blocks. Layout: docs/data.md ("Block-hash
traces")."""

from __future__ import annotations

import math
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
           "default_mooncake_path", "HashTraceLayout", "MOONCAKE", "BAILIAN", "chain_hash_ids"]

_FIRST_TOKEN = 3
#: the most tokens a request's input or output may claim: a line past it is a bad line, not 400 MB of tokens
MAX_TOKENS = 10**8
#: the vocabulary rebuilt tokens use unless a block has more successors than it leaves ids for
DEFAULT_VOCAB = 32000
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


@dataclass(frozen=True, slots=True)
class HashTraceLayout:
    """How one public block-hash trace writes a request: ``name`` (for messages), ``block_size``
    (tokens a hash id covers), ``ms_per_unit`` (its timestamps' unit in milliseconds), whether its last
    partial block may go unhashed (``tail_unhashed``: ``len(hash_ids)`` may be ``input_length //
    block_size``), and ``chats`` (rows carry ``chat_id``/``parent_chat_id``, which make sessions)."""

    name: str
    block_size: int
    ms_per_unit: float
    tail_unhashed: bool
    chats: bool


#: Mooncake's traces (github.com/kvcache-ai/Mooncake, ``traces/``).
MOONCAKE = HashTraceLayout("Mooncake", 512, 1.0, False, False)
#: Alibaba's Qwen-Bailian usage traces (github.com/alibaba-edu/qwen-bailian-usagetraces-anon).
BAILIAN = HashTraceLayout("Qwen-Bailian", 16, 1000.0, True, True)


def layout_of(obj: dict) -> HashTraceLayout:
    """The layout a trace's first request is written in: Bailian's rows name their chats."""
    return BAILIAN if "chat_id" in obj else MOONCAKE


@dataclass(frozen=True, slots=True)
class MooncakeRow:
    """One block-hash request as read (``where`` is ``path:line``); ``chat_id`` and
    ``parent_chat_id`` (None: a root) where the layout has chats."""

    where: str
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    chat_id: int | None = None
    parent_chat_id: int | None = None


def _int_field(obj: dict, key: str, where: str, minimum: int, maximum: int | None = None) -> int:
    if key not in obj:
        raise ValueError(f"{where}: field {key!r}: missing")
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: field {key!r}: expected an integer, got {described(value)}")
    if value < minimum:
        raise ValueError(f"{where}: field {key!r}: must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{where}: field {key!r}: must be <= {maximum:,}, got {value:,}")
    return value


def read_mooncake_rows(path: str | os.PathLike, limit: int | None = None,
                       block_size: int | None = None) -> list[MooncakeRow]:
    """Parse and check the ``limit`` earliest requests (all when None; the first lines of a file in time
    order) of a Mooncake or Qwen-Bailian trace, in arrival order (:func:`layout_of` its first line;
    ``block_size`` None: the layout's). ValueError names file, line and field; a Bailian trace's chat
    ids must be unique."""
    return _read_rows(path, limit, block_size)[0]


def _read_rows(path: str | os.PathLike, limit: int | None,
               block_size: int | None) -> tuple[list[MooncakeRow], bool, HashTraceLayout]:
    """:func:`read_mooncake_rows`, whether the file holds a request past ``limit``, and the layout
    its first request is written in (:data:`MOONCAKE` for a file without one). Rows come in arrival
    order: a file whose lines are out of time order is read whole and sorted (stable), so ``limit``
    keeps its earliest arrivals, not its first lines; one in order is read only to ``limit``."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be None or >= 0, got {limit}")
    rows: list[MooncakeRow] = []
    layout: HashTraceLayout | None = None
    chats: set[int] = set()
    in_order = True             # every row so far arrives no earlier than the row before it
    for where, obj in iter_jsonl(path):
        if limit is not None and len(rows) >= limit and in_order:
            return rows, True, layout or MOONCAKE
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: expected a JSON object, got {described(obj)}")
        if layout is None:
            layout = layout_of(obj)
            block_size = layout.block_size if block_size is None else block_size
            unit = "milliseconds" if layout.ms_per_unit == 1.0 else "seconds"
        assert block_size is not None
        if "timestamp" not in obj:
            raise ValueError(f"{where}: field 'timestamp': missing")
        ts_ms = _milliseconds(obj["timestamp"], layout.ms_per_unit)
        if ts_ms is None:
            raise ValueError(f"{where}: field 'timestamp': expected finite {unit} >= 0, "
                             f"got {described(obj['timestamp'])}")
        chat_id = parent = None
        if layout.chats:        # a Bailian trace: every row names its chat and its parent (-1: none)
            chat_id = _int_field(obj, "chat_id", where, 0)
            if chat_id in chats:
                raise ValueError(f"{where}: field 'chat_id': {chat_id} names an earlier request too")
            chats.add(chat_id)
            parent = _int_field(obj, "parent_chat_id", where, -1)
            parent = None if parent == -1 else parent
        input_length = _int_field(obj, "input_length", where, 1, MAX_TOKENS)
        output_length = _int_field(obj, "output_length", where, 0, MAX_TOKENS)
        if "hash_ids" not in obj:
            raise ValueError(f"{where}: field 'hash_ids': missing")
        ids = obj["hash_ids"]
        if not isinstance(ids, list):
            raise ValueError(f"{where}: field 'hash_ids': expected a list of integers >= 0, got {described(ids)}")
        bad = next((i for i, h in enumerate(ids) if not (type(h) is int and h >= 0)), None)
        if bad is not None:
            raise ValueError(f"{where}: field 'hash_ids': expected a list of integers >= 0, element {bad} is "
                             f"{described(ids[bad])}")
        full, whole = input_length // block_size, -(-input_length // block_size)
        if len(ids) != whole and not (layout.tail_unhashed and len(ids) == full):
            also = f" (or {full}, its tail unhashed)" if layout.tail_unhashed and full != whole else ""
            raise ValueError(f"{where}: input_length {input_length} needs {whole}{also} blocks of "
                             f"{block_size} (a {layout.name} trace), hash_ids has {len(ids)}"
                             + _other_block_size(input_length, len(ids)))
        if rows and ts_ms < rows[-1].timestamp_ms:
            in_order = False
        rows.append(MooncakeRow(where, ts_ms, input_length, output_length, tuple(ids),
                                chat_id, parent))
    if not in_order:            # read whole: the earliest arrivals, in arrival order (ties: file order)
        rows.sort(key=lambda row: row.timestamp_ms)
        if limit is not None and len(rows) > limit:
            return rows[:limit], True, layout or MOONCAKE
    return rows, False, layout or MOONCAKE


def _milliseconds(ts: object, ms_per_unit: float) -> float | None:
    """A timestamp as finite milliseconds >= 0, or None (not a number, negative, NaN, infinite, or
    too large for a float before or after the unit)."""
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not ts >= 0:
        return None
    try:
        ms = float(ts) * ms_per_unit
    except OverflowError:       # an integer too large for a float
        return None
    return ms if math.isfinite(ms) else None


def _other_block_size(input_length: int, num_ids: int) -> str:
    """A hint for a line whose hash ids do not fit the block size: the powers of two that would fit it
    (``(num_ids - 1) * b < input_length <= num_ids * b``), and where to say so."""
    if num_ids == 0:
        return ""
    fits = [b for b in (2 ** k for k in range(3, 16))
            if (num_ids - 1) * b < input_length <= num_ids * b]
    which = f"blocks of {' or '.join(map(str, fits))} tokens fit this line; " if fits else ""
    return (f". If the trace hashes blocks of another size, {which}give it: --trace "
            f"mooncake:files=PATH,block_size=N, or `marconi trace build mooncake PATH --block-size N`")


def chain_hash_ids(rows: Sequence[MooncakeRow], block_size: int) -> tuple[list[MooncakeRow], int]:
    """``(rows, rechained)``: the rows with hash ids that name prefixes, and how many blocks needed it.

    A block's KV depends on everything before it, so two blocks match only if their whole prefixes
    do. Mooncake's ids are chained that way already (an id always follows the same parent) and come
    back unchanged. An id seen after a different parent than at its first use (a trace that hashes
    each block's content alone) gets a fresh id per parent. A row whose tail is unhashed gets a fresh
    id of its own for it: a partial block is never shared. Ids too large to leave room for fresh ones
    below 2**64 (64-bit hashes) are first numbered densely, in order of first use."""
    first_parent: dict[int, int] = {}
    fresh: dict[tuple[int, int], int] = {}
    next_id = 1 + max((max(r.hash_ids) for r in rows if r.hash_ids), default=-1)
    if next_id + sum(len(r.hash_ids) + 1 for r in rows) > 1 << 64:   # 64-bit ids (a salted hash): no room
        dense: dict[int, int] = {}                                    # for fresh ones; number them densely
        rows = [MooncakeRow(r.where, r.timestamp_ms, r.input_length, r.output_length,
                            tuple(dense.setdefault(h, len(dense)) for h in r.hash_ids), r.chat_id, r.parent_chat_id)
                for r in rows]
        next_id = len(dense)
    out: list[MooncakeRow] = []
    rechained = 0
    for row in rows:
        parent, ids = -1, []
        for h in row.hash_ids:
            if first_parent.setdefault(h, parent) != parent:
                key = (parent, h)
                if key not in fresh:
                    fresh[key] = next_id
                    next_id += 1
                h = fresh[key]
                rechained += 1
            ids.append(h)
            parent = h
        if len(ids) * block_size < row.input_length:        # the unhashed tail: this row's alone
            ids.append(next_id)
            next_id += 1
        out.append(row if ids == list(row.hash_ids) else
                   MooncakeRow(row.where, row.timestamp_ms, row.input_length, row.output_length, tuple(ids),
                               row.chat_id, row.parent_chat_id))
    return out, rechained


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer (uint64 -> uint64, wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class MooncakeTokens:
    """Deterministic block contents for a set of rows (layout: module doc)."""

    def __init__(self, rows: Sequence[MooncakeRow], *, block_size: int = 512, vocab_size: int | None = DEFAULT_VOCAB,
                 output_vocab: int = 1024, seed: int = 0):
        """``vocab_size`` None: :data:`DEFAULT_VOCAB`, raised as far as a block with more successors
        needs (the tokens are those of :data:`DEFAULT_VOCAB` wherever it suffices). ValueError for a
        given ``vocab_size`` that leaves too few ids, naming the block's first line."""
        if block_size <= 0 or output_vocab <= 0:
            raise ValueError("block_size and output_vocab must be > 0")
        self.block_size = block_size
        self.seed = seed
        self.output_lo = _FIRST_TOKEN
        self.output_hi = _FIRST_TOKEN + output_vocab
        self.block_lo = self.output_hi
        self.rank, widest = self._sibling_ranks(rows)
        max_rank = max(self.rank.values(), default=0)
        if vocab_size is None:
            vocab_size = max(DEFAULT_VOCAB, self.block_lo + max(max_rank + 1, 2))
        self.vocab_size = vocab_size
        self.base = vocab_size - self.block_lo
        if self.base < 2:
            raise ValueError(f"vocab_size {vocab_size} leaves no room for block tokens "
                             f"(needs > {self.block_lo + 1})")
        if max_rank >= self.base:
            raise ValueError(f"{widest}: a block there has {max_rank + 1} distinct successors but only {self.base} "
                             f"block token ids are available: raise vocab_size to at least "
                             f"{self.block_lo + max_rank + 1} (or leave it unset) or lower output_vocab")

    @staticmethod
    def _sibling_ranks(rows: Sequence[MooncakeRow]) -> tuple[dict[int, int], str]:
        """Each id's rank among its parent's children, and where the id of the highest rank is first
        used (``path:line``, for messages)."""
        parent_of: dict[int, int] = {}
        children: dict[int, int] = {}
        rank: dict[int, int] = {}
        widest, top = "", -1
        for row in rows:
            parent = -1
            for h in row.hash_ids:
                seen_parent = parent_of.setdefault(h, parent)
                if seen_parent != parent:       # chain_hash_ids makes them so
                    raise ValueError(f"{row.where}: hash id {h} follows {parent}, but followed "
                                     f"{seen_parent} earlier: hash ids are not prefix-chained")
                if h not in rank:
                    rank[h] = children.get(parent, 0)
                    children[parent] = rank[h] + 1
                    if rank[h] > top:
                        widest, top = row.where, rank[h]
                parent = h
        return rank, widest

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


def _sessions(rows: Sequence[MooncakeRow], layout: HashTraceLayout) -> list[int]:
    """The session of each row: a Mooncake row is its own (its index among the file's requests); a
    Bailian chat's turns are one, named by its root's chat id (the earliest ancestor the file holds,
    else the missing parent's id). ValueError naming the line for parents that loop."""
    if not layout.chats:
        return list(range(len(rows)))
    parent_of = {r.chat_id: r.parent_chat_id for r in rows}
    root: dict[int, int] = {}
    sessions = []
    for row in rows:
        chain, c = [], row.chat_id
        on_chain: set[int] = set()
        while c not in root:
            chain.append(c)
            on_chain.add(c)
            p = parent_of.get(c)
            if p is None or p not in parent_of:          # a root, or its parent not in this file
                root[c] = c if p is None else p
                break
            if p in on_chain:
                raise ValueError(f"{row.where}: field 'parent_chat_id': chat {row.chat_id}'s parents "
                                 f"come back to chat {p}")
            c = p
        for x in chain:
            root[x] = root[c]
        sessions.append(root[row.chat_id])
    return sessions


def _turns(sessions: Sequence[int], times: Sequence[float]) -> list[int]:
    """Each request's turn in its session: 0, 1, ... by arrival (file order on ties)."""
    turns = [0] * len(sessions)
    taken: dict[int, int] = {}
    for i in sorted(range(len(sessions)), key=lambda i: (times[i], i)):
        turns[i] = taken.get(sessions[i], 0)
        taken[sessions[i]] = turns[i] + 1
    return turns


def build_mooncake_trace(path: str | os.PathLike | None = None, *, limit: int | None = None,
                         block_size: int | None = None, vocab_size: int | None = None, output_vocab: int = 1024,
                         seed: int = 0, max_input_len: int | None = None,
                         progress: Progress | None = None) -> Trace:
    """Rebuild a token trace from a Mooncake or Qwen-Bailian file (``block_size`` None: the layout's,
    512 or 16; ``vocab_size`` None: :data:`DEFAULT_VOCAB`, raised where a block has more successors
    than it leaves ids for); ``max_input_len`` drops longer requests (counted in
    ``meta["num_dropped"]``). Session ids are request indices (Mooncake) or root chat ids (Bailian),
    stable under drops; turns count the requests kept. ``meta`` counts the blocks
    :func:`chain_hash_ids` had to rename, and says whether the file holds more than ``limit``
    requests (``more_in_file``)."""
    source = Path(path) if path is not None else default_mooncake_path()
    rows, more_in_file, layout = _read_rows(source, limit, block_size)
    block_size = layout.block_size if block_size is None else block_size
    rows, rechained = chain_hash_ids(rows, block_size)
    tokens = MooncakeTokens(rows, block_size=block_size, vocab_size=vocab_size,
                            output_vocab=output_vocab, seed=seed)
    kept = [i for i, row in enumerate(rows) if max_input_len is None or row.input_length <= max_input_len]
    sessions = _sessions(rows, layout)
    turns = _turns([sessions[i] for i in kept], [rows[i].timestamp_ms for i in kept])
    requests: list[Request] = []
    wrap = progress or no_progress
    for i, turn in wrap(list(zip(kept, turns))):
        row = rows[i]
        requests.append(Request(sessions[i], turn, row.timestamp_ms / 1000.0, tokens.input_tokens(row),
                                tokens.output_tokens(row, i)))
    params = dict(limit=limit, block_size=block_size, vocab_size=tokens.vocab_size, output_vocab=output_vocab,
                  seed=seed, max_input_len=max_input_len)
    meta = {"source": "mooncake" if layout is MOONCAKE else "bailian", "recipe": "mooncake-blocks",
            "layout": layout.name, "params": params, "files": [str(source)],
            "num_rows": len(rows), "num_dropped": len(rows) - len(kept), "more_in_file": more_in_file,
            "num_distinct_blocks": len(tokens.rank), "num_rechained_blocks": rechained}
    name = f"{meta['source']}-{source.stem}" + (f"-first{limit}" if limit is not None else "")
    return Trace.from_unsorted(requests, name=name, meta=meta)
