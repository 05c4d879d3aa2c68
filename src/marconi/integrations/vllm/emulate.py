"""``vllm-align``: vLLM 0.32's hybrid prefix cache (Mamba ``align`` mode), emulated block by block.

vLLM caches a hybrid model in fixed-size blocks from one pool shared by all KV cache groups
(attention groups hold KVs, Mamba groups recurrent states). This module replays requests through a
model of that machinery — the block pool and its free queue, the per-group managers, the hybrid
coordinator's lookup, the scheduler's Mamba-aligned prefill split — so that its hit counts are
vLLM's own, token for token, for a trace served one request at a time. The code follows vLLM's
(``vllm/v1/core``: ``block_pool.py``, ``kv_cache_coordinator.py``, ``single_type_kv_cache_manager.py``,
``sched/scheduler.py``); functions are named after the ones they mirror.

What vLLM does, in short (defaults: ``prefix_cache_retention_interval=0``, no EAGLE, no connector):

* a lookup matches whole cached attention blocks from the start, then the deepest block-aligned
  Mamba state within them (capped at ``prompt_len - 1``); the hit is that state's depth;
* prefill is split so a chunk ends at the prompt's last block boundary ``(P-1)//B·B`` and at a
  detected shared-prefix junction (attention matched deeper than any state: Marconi-style
  admission), and at the token budget; a state block is kept (hashed) only at those boundaries
  (retention 0), at every block (retention ``None``), or every ``retention`` tokens;
* attention blocks are hashed as they fill, prompt and output alike;
* a finished request frees its blocks tail first; cached ones queue for LRU eviction, the others
  are reused first. A hit takes its blocks out of the queue; released again, they are recent.

Eviction is vLLM's LRU (``eviction=lru``) or the Marconi plugin's (``eviction=marconi``): the same
:class:`~marconi.integrations.vllm.policy.BlockEvictionState` the plugin runs inside vLLM, with the same α source
(fixed, or adaptive: fed each finished request at the same point as in the plugin, after its
blocks are freed).

With ``prefix_match_unit`` finer than the block, hits may land inside a block: each prompt's last
hash boundary is registered as a partial entry (the prefill stops there so a state exists), and a
block shared with the cache at such a hit is copied on write — vLLM's partial-hash-hit paths.

Limits: requests are served one at a time (``begin`` runs the whole prefill, ``finish`` the decode
and the free); concurrent batching, preemption, EAGLE (hence the shared-prefix checkpoint), KV
connectors and sliding windows are not modelled.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from marconi.core.admission import MatchResult
from marconi.core.cache import as_tokens
from marconi.core.stats import CacheStats
from marconi.core.model import ModelSpec
from marconi.core.registry import ConfigError
from marconi.integrations.vllm.policy import (ATTENTION, DEFAULT_ALPHA, MAMBA, AlphaSource, BlockEvictionState, FixedAlpha, RequestObservation,
                                 parent_depth)

__all__ = ["VllmLayout", "VllmAlignEngine", "VllmAlignCache", "RequestRecord", "layout_for_spec",
           "prefix_hashes", "parent_depth"]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ====================================================================================== layout
@dataclass(frozen=True, slots=True)
class VllmLayout:
    """What vLLM's block manager looks like for one served model and configuration.

    Attributes:
        block_size: tokens per block (vLLM's scheduler block; attention and Mamba blocks in align
            mode are the same size, the attention one inflated so both pages are equal).
        num_blocks: blocks in the pool *including* vLLM's null block (``num_gpu_blocks``).
        group_kinds: ``"attention"``/``"mamba"`` per KV cache group, in vLLM's group order.
        block_bytes: bytes of one block across the layers of a group (for byte capacities).
        max_num_batched_tokens: the scheduler's token budget per step (prefill chunk limit).
        long_prefill_token_threshold: vLLM's per-request prefill chunk cap (0: none).
        retention_interval: ``prefix_cache_retention_interval``: 0 keeps Mamba states only at the
            prompt's replay boundary and at shared-prefix junctions, ``None`` at every block,
            ``k`` also every ``k`` tokens.
        prefix_match_unit: vLLM's hash granularity (``None``: the block). Finer, hits may land inside a
            block: the prompt's last boundary is registered as a partial entry and shared blocks
            are copied on write, as vLLM 0.32 does.
        shared_prefix_checkpoint: ``enable_mamba_shared_prefix_checkpoint``; vLLM 0.32 honours it
            only with an EAGLE drafter, which is not modelled, so it changes nothing (as in vLLM).
    """

    block_size: int
    num_blocks: int
    group_kinds: tuple[str, ...]
    block_bytes: int = 0
    max_num_batched_tokens: int = 2048
    long_prefill_token_threshold: int = 0
    retention_interval: int | None = 0
    prefix_match_unit: int | None = None
    shared_prefix_checkpoint: bool = False

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ConfigError(f"vllm-align: block size must be > 0, got {self.block_size}")
        if self.num_blocks < 2:
            raise ConfigError(f"vllm-align: the pool needs at least 2 blocks (one is vLLM's null block), "
                              f"got {self.num_blocks}; raise the capacity")
        kinds = set(self.group_kinds)
        if not kinds <= {ATTENTION, MAMBA} or ATTENTION not in kinds:
            raise ConfigError(f"vllm-align: groups must include an attention group and only "
                              f"attention/mamba groups, got {self.group_kinds}")
        if self.max_num_batched_tokens <= 0 or self.long_prefill_token_threshold < 0:
            raise ConfigError("vllm-align: max_num_batched_tokens must be > 0 and long_prefill_token_threshold >= 0")
        if self.retention_interval is not None and (self.retention_interval < 0
                                                    or self.retention_interval % self.block_size):
            raise ConfigError(f"vllm-align: retention interval must be >= 0 and a multiple of the block size "
                              f"{self.block_size} (as vLLM requires), got {self.retention_interval}")
        unit = self.prefix_match_unit
        if unit is not None and (unit <= 0 or self.block_size % unit):
            raise ConfigError(f"vllm-align: prefix_match_unit must divide the block size {self.block_size} "
                              f"(as vLLM requires), got {unit}")

    @property
    def hash_block_size(self) -> int:
        return self.prefix_match_unit or self.block_size

    @property
    def has_mamba(self) -> bool:
        return MAMBA in self.group_kinds

    def describe(self) -> dict[str, Any]:
        return {"block_size": self.block_size, "num_blocks": self.num_blocks,
                "groups": ",".join("A" if k == ATTENTION else "M" for k in self.group_kinds),
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "retention_interval": self.retention_interval, "prefix_match_unit": self.hash_block_size,
                "shared_prefix_checkpoint": self.shared_prefix_checkpoint}


def layout_for_spec(spec: ModelSpec, *, capacity_bytes: float | None = None, num_blocks: int | None = None,
                    block_size: int | None = None, kernel_alignment: int = 16, mamba_first: bool = True,
                    **options: Any) -> VllmLayout:
    """The layout vLLM 0.32 would build for ``spec`` (a hybrid with attention and SSM layers).

    Mirrors vLLM's hybrid set-up: the attention block is the smallest multiple of
    ``kernel_alignment`` whose page (one layer's KVs) holds a Mamba layer's state (conv + SSM);
    layers are grouped so every group has the same number of layers (the smaller layer count,
    or the larger if within 1.5x); one block spans that many layers' pages. The pool size comes
    from ``num_blocks`` or from ``capacity_bytes`` (divided by the block bytes, plus the null block).
    ``mamba_first`` orders the Mamba groups first (the model's first layer is an SSM layer).
    """
    if spec.num_attn_layers == 0:
        raise ConfigError(f"vllm-align: {spec.name} has no attention layer; vLLM's hybrid cache needs one")
    kv_per_token_layer = spec.kv_bytes_per_token // spec.num_attn_layers
    state_per_layer = spec.ssm_state_bytes_per_layer + spec.conv_state_bytes_per_layer if spec.num_ssm_layers else 0
    if block_size is None:
        if state_per_layer:
            block_size = kernel_alignment * _cdiv(state_per_layer, kernel_alignment * kv_per_token_layer)
        else:
            block_size = 16
    n_attn, n_ssm = spec.num_attn_layers, spec.num_ssm_layers
    counts = [n for n in (n_attn, n_ssm) if n]
    group_size = min(counts)
    if max(counts) < 1.5 * group_size:
        group_size = max(counts)
    attn_groups = [ATTENTION] * _cdiv(n_attn, group_size)
    mamba_groups = [MAMBA] * (_cdiv(n_ssm, group_size) if n_ssm else 0)
    kinds = tuple(mamba_groups + attn_groups) if mamba_first else tuple(attn_groups + mamba_groups)
    block_bytes = block_size * kv_per_token_layer * group_size
    if num_blocks is None:
        if capacity_bytes is None:
            raise ConfigError("vllm-align: give a capacity or a number of blocks")
        num_blocks = int(capacity_bytes // block_bytes) + 1
    return VllmLayout(block_size=block_size, num_blocks=num_blocks, group_kinds=kinds, block_bytes=block_bytes,
                      **options)


# ====================================================================================== hashes
_ROOT = b"marconi-vllm-align"


def prefix_hashes(tokens: np.ndarray, unit: int, start: Sequence[bytes] = ()) -> list[bytes]:
    """Chained hashes of every full ``unit``-token prefix of ``tokens`` (vLLM's ``block_hashes``).

    ``start``: hashes already computed for a prefix of ``tokens`` (extended, not recomputed).
    Hash ``i`` identifies ``tokens[:(i+1)*unit]``; equal prefixes get equal hashes.
    """
    out = list(start)
    parent = out[-1] if out else _ROOT
    data = np.ascontiguousarray(tokens, dtype=np.int32)
    for i in range(len(out), len(data) // unit):
        parent = hashlib.blake2b(parent + data[i * unit:(i + 1) * unit].tobytes(), digest_size=16).digest()
        out.append(parent)
    return out


# ====================================================================================== block pool
class _Block:
    __slots__ = ("block_id", "ref_cnt", "key", "depth")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.key: tuple[bytes, int] | None = None   # (prefix hash, group id) while cached
        self.depth = 0


@dataclass(slots=True)
class PoolStats:
    evictions: dict[str, int] = field(default_factory=dict)     # "<group kind>:<reason>" -> blocks
    blocks_cached: dict[str, int] = field(default_factory=dict)  # group kind -> hashes inserted

    @property
    def num_evicted(self) -> int:
        return sum(self.evictions.values())


class _BlockPool:
    """vLLM's ``BlockPool``: blocks, the free queue (LRU order) and the hash -> block map."""

    def __init__(self, layout: VllmLayout, index: BlockEvictionState, policy: str) -> None:
        self.layout = layout
        self.blocks = [_Block(i) for i in range(layout.num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(layout.num_blocks))
        self.cached: dict[tuple[bytes, int], dict[int, None]] = {}
        self.extra_keys: dict[int, list[tuple[bytes, int]]] = {}   # partial entries beside a block's own hash
        self.index = index
        self.policy = policy
        self.stats = PoolStats()
        self.null = self.blocks[self.free.popitem(last=False)[0]]
        self.trace: list[tuple[Any, ...]] | None = None    # the plugin's MARCONI_VLLM_TRACE events

    def emit(self, *event: Any) -> None:
        if self.trace is not None:
            self.trace.append(event)

    # --------------------------------------------------------------- lookup
    def get_cached_block(self, prefix: bytes, group_ids: Sequence[int]) -> list[_Block] | None:
        out = []
        for gid in group_ids:
            ids = self.cached.get((prefix, gid))
            if not ids:
                return None
            out.append(self.blocks[next(iter(ids))])
        return out

    # --------------------------------------------------------------- allocation
    def get_new_blocks(self, n: int) -> list[_Block]:
        if n > len(self.free):
            raise ConfigError(f"vllm-align: needed {n} free blocks, the pool has {len(self.free)}; "
                              "raise the capacity (vLLM would not schedule this request)")
        out = [self.blocks[b] for b in self._pick(n)]
        for block in out:
            self._maybe_evict_cached_block(block)
            block.ref_cnt = 1
        self.emit("alloc", [b.block_id for b in out])
        return out

    def _pick(self, n: int) -> list[int]:
        if self.policy == "lru":
            picked = []
            for _ in range(n):
                block_id, _ = self.free.popitem(last=False)
                self.index.taken(block_id)
                picked.append(block_id)
            return picked
        # Marconi: blocks without a hash first (they cost nothing), in queue order, then by utility.
        picked = []
        for block_id in self.free:
            if len(picked) == n:
                break
            if self.blocks[block_id].key is None:
                picked.append(block_id)
        for block_id in picked:
            del self.free[block_id]
        while len(picked) < n:
            victim = self.index.next_victim()
            assert victim is not None, "free blocks exist but none is cached or uncached"
            self.emit("victim", victim.block_id, victim.reason)
            del self.free[victim.block_id]
            self.index.taken(victim.block_id)
            self._maybe_evict_cached_block(self.blocks[victim.block_id])
            picked.append(victim.block_id)
        return picked

    def _maybe_evict_cached_block(self, block: _Block) -> None:
        if block.key is None:
            return
        kind = self.layout.group_kinds[block.key[1]]
        reason = _REASON_NAMES[int(self.index.reason[block.block_id])]
        name = f"{kind}:{reason}"
        self.stats.evictions[name] = self.stats.evictions.get(name, 0) + 1
        self.emit("evict", block.block_id, block.key[1], block.depth)
        self._remove_cached_block_hashes(block)

    def _remove_cached_block_hashes(self, block: _Block) -> list[tuple[bytes, int]]:
        """Drop every hash of ``block`` (its own and its partial entries); return those removed."""
        keys = ([block.key] if block.key is not None else []) + self.extra_keys.pop(block.block_id, [])
        removed = []
        for key in keys:
            ids = self.cached.get(key)
            if ids is None or block.block_id not in ids:
                continue
            del ids[block.block_id]
            if not ids:
                del self.cached[key]
            removed.append(key)
            self.index.uncached(block.block_id, key[0], key[1])
            self.emit("uncache", block.block_id, key[1])
        block.key = None
        block.depth = 0
        return removed

    def touch(self, blocks: Sequence[_Block]) -> None:
        leaving = []
        for block in blocks:
            if block.ref_cnt == 0 and block is not self.null:
                del self.free[block.block_id]
                self.index.taken(block.block_id)
                leaving.append(block.block_id)
            block.ref_cnt += 1
        if leaving:
            self.emit("touch", leaving)

    def free_blocks(self, ordered: Sequence[_Block]) -> None:
        """Release blocks (first = evicted first): uncached ones to the front, cached to the back."""
        first, last, released = [], [], []
        for block in ordered:
            if block is self.null:
                continue
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                (first if block.key is None else last).append(block.block_id)
                released.append(block.block_id)
        for block_id in reversed(first):
            self.free[block_id] = None
            self.free.move_to_end(block_id, last=False)
        for block_id in last:
            self.free[block_id] = None
            self.index.released(block_id)
        if released:
            self.emit("free", released)

    # --------------------------------------------------------------- caching
    def cache_full_blocks(self, req: "_Request", blocks: list[_Block], num_cached: int, num_full: int,
                          group_id: int, mask: list[bool] | None) -> None:
        size = self.layout.block_size
        for i in range(num_cached, num_full):
            block = blocks[i]
            if block is self.null or (mask is not None and not mask[i - num_cached]):
                continue
            depth = (i + 1) * size
            if block.key is not None:          # a partial entry on this block, now full: promote it
                assert block.depth < depth
                self._remove_cached_block_hashes(block)
            self._insert_block_hash(block, req.hash_at(depth), group_id, depth, self._parent(req, depth))

    def cache_partial_block(self, req: "_Request", block: _Block, num_tokens: int, group_id: int,
                            replace_existing: bool = False) -> tuple[bytes, int] | None:
        """``BlockPool.cache_partial_block``: make ``block`` reachable at a boundary inside it."""
        if block is self.null:
            return None
        prefix = req.hash_at(num_tokens)
        key = (prefix, group_id)
        already = block.key == key or block.block_id in self.cached.get(key, ())
        if replace_existing:
            self._remove_cached_block_hashes(block)
        elif not already and block.key is not None and block.depth < num_tokens:
            self._remove_cached_block_hashes(block)
        self._insert_block_hash(block, prefix, group_id, num_tokens, self._parent(req, num_tokens))
        return key

    def move_block_hashes(self, src: _Block, dst: _Block) -> None:
        """Re-point ``src``'s cache entries to ``dst`` (the request keeps writing into ``src``)."""
        assert dst.key is None
        keys = ([src.key] if src.key is not None else []) + self.extra_keys.get(src.block_id, [])
        known = {key[0]: self.index.prefix_info(key[0]) for key in keys}
        for key in self._remove_cached_block_hashes(src):
            depth, parent = known[key[0]]
            self._insert_block_hash(dst, key[0], key[1], depth, parent)

    def _parent(self, req: "_Request", depth: int) -> bytes | None:
        pdepth = parent_depth(depth, self.layout.block_size)
        return req.hash_at(pdepth) if pdepth else None

    def _insert_block_hash(self, block: _Block, prefix: bytes, group_id: int, depth: int,
                           parent: bytes | None) -> None:
        key = (prefix, group_id)
        if block.key == key or block.block_id in self.cached.get(key, ()):
            return
        if block.key is None:
            block.key = key
            block.depth = depth
        else:
            self.extra_keys.setdefault(block.block_id, []).append(key)
        self.cached.setdefault(key, {})[block.block_id] = None
        kind = self.layout.group_kinds[group_id]
        self.stats.blocks_cached[kind] = self.stats.blocks_cached.get(kind, 0) + 1
        self.index.cached(block.block_id, prefix, group_id, depth, parent)
        self.emit("cache", block.block_id, group_id, depth)

    @property
    def num_free(self) -> int:
        return len(self.free)


_REASON_NAMES = ("kv-leaf", "kv-inner", "state", "dead")


# ====================================================================================== requests
class _Request:
    """A request as the block manager sees it: its tokens, hashes and progress."""

    __slots__ = ("rid", "tokens", "num_prompt_tokens", "num_tokens", "num_computed_tokens", "hashes", "unit",
                 "shared_prefix_boundary", "hit_len", "kv_only_len")

    def __init__(self, rid: int, tokens: np.ndarray, num_prompt_tokens: int, unit: int) -> None:
        self.rid = rid
        self.tokens = tokens
        self.num_prompt_tokens = num_prompt_tokens
        self.num_tokens = num_prompt_tokens
        self.num_computed_tokens = 0
        self.unit = unit
        self.hashes = prefix_hashes(tokens[:num_prompt_tokens], unit)
        self.shared_prefix_boundary = 0
        self.hit_len = 0                 # set at admission, reported to the α source at the end
        self.kv_only_len = 0

    def hash_at(self, depth: int) -> bytes:
        """Hash of ``tokens[:depth]`` (``depth`` a positive multiple of the hash unit)."""
        i = depth // self.unit - 1
        if i >= len(self.hashes):
            self.hashes = prefix_hashes(self.tokens[:self.num_tokens], self.unit, self.hashes)
        return self.hashes[i]

    def append_output(self) -> None:
        self.num_tokens += 1


class _GroupManager:
    """What vLLM's ``SingleTypeKVCacheManager`` keeps for one KV cache group: blocks per request,
    and the copy-on-write of a block shared with the cache at a sub-block (partial) hit."""

    kind = ""

    def __init__(self, pool: _BlockPool, group_id: int) -> None:
        self.pool = pool
        self.group_id = group_id
        self.block_size = pool.layout.block_size
        self.hash_unit = pool.layout.hash_block_size
        self.req_to_blocks: dict[int, list[_Block]] = {}
        self.num_cached_block: dict[int, int] = {}
        self.partial_hit_reqs: dict[int, tuple[int, _Block]] = {}
        self.pending_copies: list[tuple[_Block, _Block]] = []

    def num_skipped_tokens(self, num_computed: int) -> int:
        return 0

    def has_partial_local_hit(self, new_computed: Sequence[_Block], num_local_computed: int) -> bool:
        return len(new_computed) > 0 and num_local_computed % self.block_size != 0

    def add_local_computed_blocks(self, req: _Request, blocks: list[_Block], num_local_computed: int) -> None:
        """Take the hit's blocks (out of the free queue); a sub-block hit's last one is shared: CoW it."""
        assert not self.req_to_blocks.get(req.rid)
        skipped = self.num_skipped_tokens(num_local_computed) // self.block_size
        if skipped > 0:
            blocks = blocks[skipped:]
        self.pool.touch(blocks)
        self.req_to_blocks[req.rid] = [self.pool.null] * max(skipped, 0) + list(blocks)
        self.num_cached_block[req.rid] = len(self.req_to_blocks[req.rid])
        if self.has_partial_local_hit(blocks, num_local_computed):
            idx = num_local_computed // self.block_size
            self.partial_hit_reqs[req.rid] = (idx, blocks[-1])
            self.num_cached_block[req.rid] = idx

    def apply_cow(self, req: _Request, idx: int, source: _Block, cow: _Block) -> None:
        blocks = self.req_to_blocks[req.rid]
        assert blocks[idx] is source
        blocks[idx] = cow
        self.pending_copies.append((source, cow))
        cow.ref_cnt += 1                     # both ends stay held until the copy has run

    def take_pending_copies(self) -> list[tuple[_Block, _Block]]:
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def free(self, req: _Request) -> None:
        """Release the request's blocks tail first (so vLLM's LRU evicts tails first)."""
        blocks = self.req_to_blocks.pop(req.rid, [])
        self.num_cached_block.pop(req.rid, None)
        self.partial_hit_reqs.pop(req.rid, None)
        self.pool.free_blocks(blocks[::-1])


class _AttentionManager(_GroupManager):
    """vLLM's ``FullAttentionManager``: whole blocks from the start, then (with a prefix-match unit
    finer than the block) one partial entry inside the next block."""

    kind = ATTENTION

    def find_longest_cache_hit(self, req: _Request, max_length: int, group_ids: list[int]) -> tuple[list[list[_Block]], int]:
        computed: list[list[_Block]] = [[] for _ in group_ids]
        for i in range(max_length // self.block_size):
            cached = self.pool.get_cached_block(req.hash_at((i + 1) * self.block_size), group_ids)
            if not cached:
                break
            for out, block in zip(computed, cached):
                out.append(block)
        hit = len(computed[0]) * self.block_size
        unit = self.hash_unit
        if unit < self.block_size:           # probe the next block's interior boundaries, longest first
            scale = self.block_size // unit
            first = len(computed[0]) * scale
            last = min(first + scale - 1, max_length // unit, req.num_prompt_tokens // unit)
            for fine in range(last - 1, first - 1, -1):
                cached = self.pool.get_cached_block(req.hash_at((fine + 1) * unit), group_ids)
                if cached:
                    for out, block in zip(computed, cached):
                        out.append(block)
                    hit = (fine + 1) * unit
                    break
        return computed, hit

    def remove_skipped_blocks(self, req: _Request, processed: int) -> None:
        return None                    # full attention never skips tokens

    def allocate_new_blocks(self, req: _Request, num_tokens: int) -> None:
        if req.rid in self.partial_hit_reqs:
            idx, source = self.partial_hit_reqs.pop(req.rid)
            self.apply_cow(req, idx, source, self.pool.get_new_blocks(1)[0])
        blocks = self.req_to_blocks.setdefault(req.rid, [])
        num_new = _cdiv(num_tokens, self.block_size) - len(blocks)
        if num_new > 0:
            blocks.extend(self.pool.get_new_blocks(num_new))

    def num_blocks_to_allocate(self, req: _Request, num_tokens: int, new_computed: list[_Block],
                               num_local_computed: int) -> int:
        held = len(self.req_to_blocks.get(req.rid, ()))
        if req.rid in self.num_cached_block:
            return max(_cdiv(num_tokens, self.block_size) - held, 0)
        num_new = max(_cdiv(num_tokens, self.block_size) - (len(new_computed) + held), 0)
        if self.has_partial_local_hit(new_computed, num_local_computed):
            num_new += 1
        return num_new + sum(1 for b in new_computed if b.ref_cnt == 0 and b is not self.pool.null)

    def cache_blocks(self, req: _Request, num_tokens: int) -> None:
        num_cached = self.num_cached_block.get(req.rid, 0)
        num_full = num_tokens // self.block_size
        if num_cached < num_full:
            self.pool.cache_full_blocks(req, self.req_to_blocks[req.rid], num_cached, num_full, self.group_id, None)
            self.num_cached_block[req.rid] = num_full
        if self.hash_unit < self.block_size:
            self._cache_partial_tail_block(req, num_tokens)

    def _cache_partial_tail_block(self, req: _Request, num_tokens: int) -> None:
        """Register the prompt's last hash boundary (``P-1`` rounded down) when it ends inside a block."""
        boundary = (req.num_prompt_tokens - 1) // self.hash_unit * self.hash_unit
        if boundary == 0 or boundary > num_tokens or boundary % self.block_size == 0:
            return
        blocks = self.req_to_blocks[req.rid]
        idx = boundary // self.block_size
        if idx < len(blocks):
            self.pool.cache_partial_block(req, blocks[idx], boundary, self.group_id)


class _MambaManager(_GroupManager):
    """vLLM's ``MambaManager`` in ``align`` mode (no speculative or prefill-checkpoint blocks)."""

    kind = MAMBA

    def __init__(self, pool: _BlockPool, group_id: int) -> None:
        super().__init__(pool, group_id)
        self.last_state_block_idx: dict[int, int] = {}
        self.num_retired_blocks: dict[int, int] = {}
        self.allocated: set[int] = set()

    def num_skipped_tokens(self, num_computed: int) -> int:
        return num_computed - 1                                  # Mamba keeps only the last state

    def find_longest_cache_hit(self, req: _Request, max_length: int, group_ids: list[int]) -> tuple[list[list[_Block]], int]:
        """The deepest state within ``max_length`` (every hash boundary, fine-grained or not)."""
        computed: list[list[_Block]] = [[] for _ in group_ids]
        unit = self.hash_unit if self.hash_unit < self.block_size else self.block_size
        for fine in range(min(max_length // unit, req.num_prompt_tokens // unit) - 1, -1, -1):
            cached = self.pool.get_cached_block(req.hash_at((fine + 1) * unit), group_ids)
            if cached:
                idx = fine // (self.block_size // unit)                # the block holding that boundary
                for out, block in zip(computed, cached):
                    out.extend([self.pool.null] * idx)
                    out.append(block)
                return computed, (fine + 1) * unit
        return computed, 0

    def _free_and_null(self, blocks: list[_Block], indices: Sequence[int]) -> None:
        freed = []
        for i in indices:
            if blocks[i] is not self.pool.null:
                freed.append(blocks[i])
                blocks[i] = self.pool.null
        if freed:
            self.pool.free_blocks(freed)

    def remove_skipped_blocks(self, req: _Request, processed: int) -> None:
        blocks = self.req_to_blocks.setdefault(req.rid, [])
        num_skipped_tokens = self.num_skipped_tokens(processed)
        if num_skipped_tokens > 0:
            last = min(num_skipped_tokens // self.block_size, len(blocks))
            first = self.num_retired_blocks.get(req.rid, 0)
            if first < last:
                self._free_and_null(blocks, range(last - 1, first - 1, -1))
                self.num_retired_blocks[req.rid] = last
        idx = self.last_state_block_idx.get(req.rid)
        if idx is not None and idx < _cdiv(processed, self.block_size) - 1:
            self._free_and_null(blocks, [idx])

    def num_blocks_to_allocate(self, req: _Request, num_tokens: int, new_computed: list[_Block],
                               num_local_computed: int) -> int:
        held = len(self.req_to_blocks.get(req.rid, ()))
        num_new = _cdiv(num_tokens, self.block_size) - len(new_computed) - held
        partial = self.has_partial_local_hit(new_computed, num_local_computed) or req.rid in self.partial_hit_reqs
        if partial:
            num_new = max(num_new, 0) + 1
        if num_new > 0:
            num_new = min(num_new, 1 + int(partial))             # the physical cap: the running block (+ CoW)
        # May be negative, as in vLLM: a request holding more (null-padded) blocks than it needs.
        return num_new + sum(1 for b in new_computed if b.ref_cnt == 0 and b is not self.pool.null)

    def allocate_new_blocks(self, req: _Request, num_tokens: int) -> None:
        blocks = self.req_to_blocks.setdefault(req.rid, [])
        num_required = _cdiv(num_tokens, self.block_size)
        partial = self.partial_hit_reqs.get(req.rid)
        if num_required <= len(blocks) and partial is None:
            self.allocated.add(req.rid)
            return
        prev_len = len(blocks)
        was_allocated = req.rid in self.allocated
        if was_allocated or prev_len > 0:
            self.last_state_block_idx[req.rid] = prev_len - 1     # the state the next one copies
        num_skipped = num_required - 1
        if prev_len < num_skipped:
            blocks.extend([self.pool.null] * (num_skipped - prev_len))
        num_new = max(num_required - len(blocks), 0) + int(partial is not None)
        new = self.pool.get_new_blocks(num_new)
        if partial is not None:
            idx, source = partial
            cow, new = new[0], new[1:]
            if was_allocated:
                # This request keeps computing in ``source``: the cache entry moves to ``cow``,
                # which the copy fills with the boundary state.
                assert blocks[idx] is source
                self.pool.move_block_hashes(source, cow)
                self.pending_copies.append((source, cow))
                source.ref_cnt += 1
            else:
                self.apply_cow(req, idx, source, cow)
        blocks.extend(new)
        self.allocated.add(req.rid)
        self.partial_hit_reqs.pop(req.rid, None)

    def reachable_block_mask(self, start: int, end: int, boundaries: Sequence[int]) -> list[bool] | None:
        interval = self.pool.layout.retention_interval
        if interval is None:
            return None
        mask = [False] * (end - start)
        if interval:
            per_segment = interval // self.block_size
            if per_segment <= 1:
                return None
            first = (start + per_segment) // per_segment * per_segment - 1
            for i in range(first - start, len(mask), per_segment):
                mask[i] = True
        align = min(self.hash_unit, self.block_size)
        for boundary in boundaries:
            aligned = boundary // align * align
            block = aligned // self.block_size - 1
            if start <= block < end:
                mask[block - start] = True
        return mask

    def cache_blocks(self, req: _Request, num_tokens: int) -> None:
        num_cached = self.num_cached_block.get(req.rid, 0)
        num_full = num_tokens // self.block_size
        if num_cached < num_full:
            boundaries = [req.num_prompt_tokens - 1]               # vLLM's replay boundary (no EAGLE)
            if req.shared_prefix_boundary:
                boundaries.append(req.shared_prefix_boundary)
            mask = self.reachable_block_mask(num_cached, num_full, boundaries)
            self.pool.cache_full_blocks(req, self.req_to_blocks[req.rid], num_cached, num_full, self.group_id, mask)
            self.num_cached_block[req.rid] = num_full
        self._cache_partial_tail_block(req, num_tokens)

    def _cache_partial_tail_block(self, req: _Request, num_tokens: int) -> None:
        """At the prompt's last hash boundary, key the running state block there (a producer CoW
        then preserves it when the request moves on)."""
        unit = self.hash_unit
        if num_tokens <= 0 or num_tokens % unit:
            return
        if num_tokens != max((req.num_prompt_tokens - 1) // unit * unit, 0):
            return
        idx = _cdiv(num_tokens, self.block_size) - 1
        blocks = self.req_to_blocks[req.rid]
        if idx >= len(blocks) or blocks[idx] is self.pool.null:
            return
        key = self.pool.cache_partial_block(req, blocks[idx], num_tokens, self.group_id)
        if key is not None and num_tokens % self.block_size:
            self.partial_hit_reqs[req.rid] = (idx, blocks[idx])
            self.num_cached_block[req.rid] = idx

    def free(self, req: _Request) -> None:
        self.allocated.discard(req.rid)
        self.last_state_block_idx.pop(req.rid, None)
        self.num_retired_blocks.pop(req.rid, None)
        super().free(req)


# ====================================================================================== engine
class RequestRecord(tuple):
    """Per request: ``(input_len, hit_len, kv_hit_len)``; ``hit_len`` is vLLM's ``num_cached_tokens``."""

    __slots__ = ()

    def __new__(cls, input_len: int, hit_len: int, kv_hit_len: int) -> "RequestRecord":
        return tuple.__new__(cls, (input_len, hit_len, kv_hit_len))

    input_len = property(lambda self: self[0])
    hit_len = property(lambda self: self[1])
    kv_hit_len = property(lambda self: self[2])


class VllmAlignEngine:
    """vLLM 0.32's block manager and scheduler, for requests served one at a time.

    ``admit(prompt)`` looks the prompt up and runs its prefill (chunk by chunk, as vLLM's
    scheduler splits it), ``complete(request, outputs)`` its decode steps and the free. ``run``
    does both. Counters mirror vLLM's: ``queries``/``hits`` are ``vllm:prefix_cache_queries`` and
    ``vllm:prefix_cache_hits``.
    """

    def __init__(self, layout: VllmLayout, spec: ModelSpec, *, eviction: str = "lru",
                 alpha: float | str | AlphaSource = DEFAULT_ALPHA, efficiency: str = "total") -> None:
        """``alpha``: a number, ``"adaptive"`` (a fresh :class:`~marconi.integrations.vllm.adaptive.AdaptiveAlpha`,
        as ``MARCONI_VLLM_ALPHA=adaptive``) or an α source (stateful: one per engine)."""
        if eviction not in ("lru", "marconi"):
            raise ConfigError(f"vllm-align: eviction must be 'lru' or 'marconi', got {eviction!r}")
        self.layout = layout
        self.spec = spec
        self.eviction = eviction
        if isinstance(alpha, str):
            from marconi.integrations.vllm.config import PluginConfig

            source = PluginConfig(policy=eviction, alpha=alpha).make_alpha_source(spec)
        else:
            source = FixedAlpha(alpha) if isinstance(alpha, (int, float)) else alpha
        self.index = BlockEvictionState(spec, layout.group_kinds, layout.num_blocks, layout.block_size, source,
                                        efficiency)
        self.pool = _BlockPool(layout, self.index, eviction)
        managers: list[Any] = []
        for gid, kind in enumerate(layout.group_kinds):
            managers.append((_AttentionManager if kind == ATTENTION else _MambaManager)(self.pool, gid))
        self.managers = managers
        self.attn_ids = [g for g, k in enumerate(layout.group_kinds) if k == ATTENTION]
        self.mamba_ids = [g for g, k in enumerate(layout.group_kinds) if k == MAMBA]
        self.queries = 0
        self.hits = 0
        self._next_rid = 0

    # --------------------------------------------------------------- public
    def run(self, prompt: Any, outputs: Any) -> RequestRecord:
        req, record = self.admit(prompt)
        self.complete(req, outputs)
        return record

    def admit(self, prompt: Any) -> tuple[_Request, RequestRecord]:
        tokens = as_tokens(prompt, "prompt")
        req = _Request(self._next_rid, tokens, len(tokens), self.layout.hash_block_size)
        self._next_rid += 1
        hit_blocks, hit, kv_hit = self.get_computed_blocks(req)
        self.queries += req.num_prompt_tokens
        self.hits += hit
        first = True
        while req.num_computed_tokens < req.num_prompt_tokens:
            start = hit if first else req.num_computed_tokens
            num_new = min(req.num_prompt_tokens - start, self.layout.max_num_batched_tokens)
            if 0 < self.layout.long_prefill_token_threshold < num_new:
                num_new = self.layout.long_prefill_token_threshold
            if self.layout.has_mamba:
                num_new = self._mamba_block_aligned_split(req, start, num_new)
            self.allocate_slots(req, num_new, hit if first else 0, hit_blocks if first else None)
            if first:      # vLLM records the lookup once the request is admitted (after its first slots)
                self.pool.emit("lookup", req.num_prompt_tokens, hit, kv_hit - hit)
                req.hit_len, req.kv_only_len = hit, kv_hit - hit
            self.release_copies()
            req.num_computed_tokens = start + num_new
            first = False
        return req, RequestRecord(req.num_prompt_tokens, hit, kv_hit)

    def complete(self, req: _Request, outputs: Any) -> None:
        out = as_tokens(outputs, "outputs", allow_empty=True)
        if out.size:
            req.tokens = np.concatenate((req.tokens[:req.num_prompt_tokens], out))
            req.append_output()                   # the prefill's last step samples the first token
            for _ in range(1, len(out)):          # each decode step computes one token, samples the next
                self.allocate_slots(req, 1, 0, None)
                self.release_copies()
                req.num_computed_tokens += 1
                req.append_output()
        self.free(req)
        # As the plugin does after vLLM's ``_free_request``: the finished request goes to the α source.
        changed = self.index.finished(RequestObservation(req.tokens[:req.num_prompt_tokens], out, req.hit_len,
                                                         req.kv_only_len))
        if changed is not None:
            self.pool.emit("alpha", *changed)

    # --------------------------------------------------------------- vLLM's steps
    def get_computed_blocks(self, req: _Request) -> tuple[list[list[_Block]], int, int]:
        """``KVCacheManager.get_computed_blocks`` + the hybrid coordinator's lookup.

        Returns the hit blocks per group, the hit length, and the attention-only hit length (the
        longest single-group hit). Sets the request's shared-prefix boundary as the scheduler does.
        """
        max_len = req.num_prompt_tokens - 1
        blocks: list[list[_Block]] = [[] for _ in self.managers]
        attn = self.managers[self.attn_ids[0]]
        attn_blocks, hit = attn.find_longest_cache_hit(req, max_len, self.attn_ids)
        for gid, b in zip(self.attn_ids, attn_blocks):
            blocks[gid] = b
        longest = hit
        if self.mamba_ids:
            mamba = self.managers[self.mamba_ids[0]]
            mamba_blocks, hit = mamba.find_longest_cache_hit(req, hit, self.mamba_ids)
            for gid, b in zip(self.mamba_ids, mamba_blocks):
                blocks[gid] = b
            longest = max(longest, hit)
            keep = _cdiv(hit, self.layout.block_size)
            for gid in self.attn_ids:
                del blocks[gid][keep:]
        req.shared_prefix_boundary = longest if longest > hit else 0
        return blocks, hit, longest

    def _mamba_block_aligned_split(self, req: _Request, start: int, num_new: int) -> int:
        """``Scheduler._mamba_block_aligned_split``: chunk ends where a state must be cached."""
        size = self.layout.block_size
        prefill_end = max(req.num_prompt_tokens, req.num_tokens - 1)
        if start >= prefill_end:
            return num_new
        last_cache_position = max((req.num_tokens - 1) // size * size, 0)
        end = start + num_new
        if end < prefill_end:
            budget = self.layout.max_num_batched_tokens
            if self.layout.long_prefill_token_threshold > 0:
                budget = min(budget, self.layout.long_prefill_token_threshold)
            aligned_end = end // size * size
            if aligned_end > start or size <= budget:
                end = aligned_end
        # With a prefix-match unit finer than the block, also stop at the prompt's last hash
        # boundary: its state is what a longer sibling's partial hit resumes from.
        unit = self.layout.hash_block_size
        tail = max((req.num_prompt_tokens - 1) // unit * unit, 0) if unit < size else 0
        junction = req.shared_prefix_boundary
        junction_stop = start + (junction - start) // size * size     # block-floored from the start, as in vLLM
        stops = (
            (start // size + 1) * size if start % size else 0,
            last_cache_position,
            tail if last_cache_position < tail < req.num_prompt_tokens else 0,
            junction_stop if start < junction < end else 0,
        )
        end = min((s for s in stops if start < s < end), default=end)
        return max(end - start, 0)

    def allocate_slots(self, req: _Request, num_new: int, num_new_computed: int,
                       new_computed: list[list[_Block]] | None) -> None:
        self.pool.emit("slots", req.num_computed_tokens, num_new_computed, num_new, 0)
        total_computed = req.num_computed_tokens + num_new_computed
        for manager in self.managers:
            manager.remove_skipped_blocks(req, total_computed)
        num_tokens = total_computed + num_new
        need = sum(m.num_blocks_to_allocate(req, num_tokens, new_computed[g] if new_computed else [], total_computed)
                   for g, m in enumerate(self.managers))
        if need > self.pool.num_free:
            raise ConfigError(f"vllm-align: a {req.num_prompt_tokens}-token request needs {need} free blocks at "
                              f"{num_tokens} tokens but the pool has {self.pool.num_free} of "
                              f"{self.layout.num_blocks}; vLLM would never schedule it — raise the capacity")
        if new_computed is not None and any(new_computed):
            for g, manager in enumerate(self.managers):
                manager.add_local_computed_blocks(req, new_computed[g], total_computed)
        for manager in self.managers:
            manager.allocate_new_blocks(req, num_tokens)
        for manager in self.managers:
            manager.cache_blocks(req, min(num_tokens, req.num_tokens))

    def release_copies(self) -> None:
        """End of vLLM's scheduling step: blocks held for this step's copy-on-writes go back."""
        copies = [pair for manager in self.managers for pair in manager.take_pending_copies()]
        if copies:
            self.pool.free_blocks([block for pair in copies for block in pair])

    def free(self, req: _Request) -> None:
        for manager in self.managers:
            manager.free(req)

    # --------------------------------------------------------------- checks
    def check_invariants(self) -> None:
        """Recompute the pool's bookkeeping from scratch (AssertionError on drift)."""
        in_use = {b.block_id for m in self.managers for blocks in m.req_to_blocks.values()
                  for b in blocks if b is not self.pool.null}
        free = set(self.pool.free)
        assert not (in_use & free), "a block is both free and held"
        assert len(free) + len(in_use) == self.layout.num_blocks - 1, "blocks leaked"
        for block in self.pool.blocks[1:]:
            assert (block.ref_cnt == 0) == (block.block_id in free), f"block {block.block_id}: ref count vs free queue"
        keys = [(b.block_id, k[0], k[1]) for b in self.pool.blocks if b.key is not None
                for k in [b.key, *self.pool.extra_keys.get(b.block_id, ())]]
        assert all(self.pool.blocks[b].key is not None for b in self.pool.extra_keys), "partial entry without a hash"
        assert sum(len(v) for v in self.pool.cached.values()) == len(keys), "hash map vs block keys"
        self.index.check_invariants(keys)
        free_cached = {b for b in free if self.pool.blocks[b].key is not None}
        assert set(np.flatnonzero(self.index.free_cached).tolist()) == free_cached, "free cached set drifted"


# ====================================================================================== simulator face
@dataclass(slots=True, eq=False)
class _Handle:
    request_id: int
    tokens: np.ndarray
    match: MatchResult
    req: Any
    prefill_checkpoints: tuple[int, ...] = ()
    active: bool = True


class VllmAlignCache:
    """The emulation behind the simulator's cache interface (``begin`` / ``finish``).

    ``begin`` admits a request (lookup + prefill allocation), ``finish`` runs its decode and frees
    its blocks. ``stats`` is a :class:`~marconi.core.stats.CacheStats`: reused tokens are vLLM's hits,
    ``kv_hit_tokens`` the attention-only matches, ``unusable_tokens`` their difference.
    """

    def __init__(self, spec: ModelSpec, layout: VllmLayout, *, eviction: str = "lru",
                 alpha: float | str | AlphaSource = DEFAULT_ALPHA, efficiency: str = "total") -> None:
        self.spec = spec
        self.layout = layout
        self.engine = VllmAlignEngine(layout, spec, eviction=eviction, alpha=alpha, efficiency=efficiency)
        self.capacity_bytes = layout.num_blocks * layout.block_bytes
        # An adaptive α source reports its rule switches in the simulator's records (``tuning``).
        source = self.engine.index.alpha_source
        self.selector = source if callable(getattr(source, "tuning_record", None)) else None
        self.stats = CacheStats()
        self._observers: list[Any] = []
        self._in_flight: dict[int, _Handle] = {}
        self._next_id = 0

    def add_observer(self, observer: Any) -> None:
        raise ConfigError("vllm-align does not support observers (alpha tuning): give a fixed alpha")

    def begin(self, input_tokens: Any, *, max_hit_len: int | None = None) -> _Handle:
        tokens = as_tokens(input_tokens, "input_tokens")
        req, rec = self.engine.admit(tokens)
        match = MatchResult(rec.input_len, rec.kv_hit_len, rec.hit_len)
        handle = _Handle(self._next_id, tokens, match, req)
        self._next_id += 1
        self._in_flight[handle.request_id] = handle
        self.stats.record_lookup(match, self.spec, from_checkpoint=True)  # vLLM resumes from a state block
        return handle

    def insert_prefill(self, handle: _Handle, **_: Any) -> None:
        """vLLM caches prefill blocks as it computes them: nothing left to do here."""
        return None

    def finish(self, handle: _Handle, output_tokens: Any = (), **_: Any) -> None:
        if not handle.active or self._in_flight.pop(handle.request_id, None) is not handle:
            raise ValueError(f"request {handle.request_id} is not in flight in this cache")
        handle.active = False
        self.engine.complete(handle.req, output_tokens)
        self._sync_eviction_stats()

    def process(self, input_tokens: Any, output_tokens: Any = ()) -> MatchResult:
        handle = self.begin(input_tokens)
        self.finish(handle, output_tokens)
        return handle.match

    def _sync_eviction_stats(self) -> None:
        st, pool = self.stats, self.engine.pool.stats
        ev = pool.evictions
        groups = max(1, len(self.engine.mamba_ids))
        st.checkpoints_admitted = pool.blocks_cached.get(MAMBA, 0) // groups
        st.checkpoints_evicted = sum(v for k, v in ev.items() if k.startswith(MAMBA)) // groups
        st.evictions_leaf = sum(v for k, v in ev.items() if k.startswith(ATTENTION) and not k.endswith("kv-inner"))
        st.evictions_inner = ev.get(f"{ATTENTION}:kv-inner", 0)
        st.kv_tokens_evicted = sum(v for k, v in ev.items() if k.startswith(ATTENTION)) * self.layout.block_size
        st.bytes_evicted = pool.num_evicted * self.layout.block_bytes
        used = (self.layout.num_blocks - 1 - self.engine.pool.num_free) * self.layout.block_bytes
        st.peak_bytes = max(st.peak_bytes, used)

    def describe(self) -> dict[str, Any]:
        return {"admission": "vllm-align", "eviction": self.engine.eviction, **self.layout.describe(),
                "capacity_bytes": self.capacity_bytes, "model": self.spec.name}

    def check_invariants(self) -> None:
        self.engine.check_invariants()
