"""vLLM's ``BlockPool`` (``vllm/v1/core/block_pool.py``): blocks, the free queue and the hash map.

Unhashed blocks are reused first; cached ones leave the free queue from its head (vLLM's LRU) or
as the plugin's :class:`~marconi.integrations.vllm.policy.BlockEvictionState` ranks them. Every hash
and queue event goes to that state, as the plugin's hooks send it, and to :attr:`BlockPool.trace`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from marconi.core.registry import ConfigError
from marconi.integrations.vllm.emulate.request import RequestState
from marconi.integrations.vllm.layout import VllmLayout
from marconi.integrations.vllm.policy import REASONS, BlockEvictionState, parent_depth

__all__ = ["Block", "BlockPool", "PoolStats"]


class Block:
    """One block of the pool (vLLM's ``KVCacheBlock``): its reference count and, while cached, its
    primary hash key and the prefix depth that key covers."""

    __slots__ = ("block_id", "ref_cnt", "key", "depth")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.key: tuple[bytes, int] | None = None   # (prefix hash, group id) while cached
        self.depth = 0


@dataclass(slots=True)
class PoolStats:
    """What the pool counts: evictions by group kind and reason, hashes inserted by group kind."""

    evictions: dict[str, int] = field(default_factory=dict)     # "<group kind>:<reason>" -> blocks
    blocks_cached: dict[str, int] = field(default_factory=dict)  # group kind -> hashes inserted

    @property
    def num_evicted(self) -> int:
        return sum(self.evictions.values())


class BlockPool:
    """vLLM's ``BlockPool``: blocks, the free queue (LRU order) and the hash -> block map."""

    def __init__(self, layout: VllmLayout, index: BlockEvictionState, policy: str) -> None:
        self.layout = layout
        self.blocks = [Block(i) for i in range(layout.num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(layout.num_blocks))
        self.cached: dict[tuple[bytes, int], dict[int, None]] = {}
        self.extra_keys: dict[int, list[tuple[bytes, int]]] = {}   # partial entries beside a block's own hash
        self.index = index
        self.policy = policy
        self.stats = PoolStats()
        self.null = self.blocks[self.free.popitem(last=False)[0]]
        self.trace: list[tuple[Any, ...]] | None = None    # the plugin's MARCONI_VLLM_TRACE events
        # told (request, group, depth, block id) of each block a request caches (the CPU tier's hand-offs)
        self.on_cache: Callable[[RequestState, int, int, int], None] | None = None
        # blocks handed to requests since the last take_handed_out(): allocated, or taken as a hit
        # (vLLM's connector watches these for store jobs still reading them)
        self._handed_out: set[int] = set()

    def emit(self, *event: Any) -> None:
        if self.trace is not None:
            self.trace.append(event)

    # --------------------------------------------------------------- lookup
    def get_cached_block(self, prefix: bytes, group_ids: Sequence[int]) -> list[Block] | None:
        out = []
        for gid in group_ids:
            ids = self.cached.get((prefix, gid))
            if not ids:
                return None
            out.append(self.blocks[next(iter(ids))])
        return out

    # --------------------------------------------------------------- allocation
    def get_new_blocks(self, n: int) -> list[Block]:
        if n > len(self.free):
            raise ConfigError(f"vllm-align: needed {n} free blocks, the pool has {len(self.free)}; "
                              "raise the capacity (vLLM would not schedule this request)")
        out = [self.blocks[b] for b in self._pick(n)]
        for block in out:
            self.evict_cached_block(block)
            block.ref_cnt = 1
        self._handed_out.update(b.block_id for b in out)
        self.emit("alloc", [b.block_id for b in out])
        return out

    def take_handed_out(self) -> set[int]:
        """The ids of the blocks allocated or taken as hits since the last call (then forgotten):
        vLLM's connector's ``_current_batch_allocated_block_ids`` for one scheduling step."""
        out, self._handed_out = self._handed_out, set()
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
            self.evict_cached_block(self.blocks[victim.block_id])
            picked.append(victim.block_id)
        return picked

    def evict_cached_block(self, block: Block) -> None:
        """vLLM's ``_maybe_evict_cached_block``: drop ``block``'s hashes (counted by the victim's
        reason); public because the Mamba manager lets a non-reusable checkpoint go through it."""
        if block.key is None:
            return
        kind = self.layout.group_kinds[block.key[1]]
        reason = REASONS[int(self.index.reason[block.block_id])]
        name = f"{kind}:{reason}"
        self.stats.evictions[name] = self.stats.evictions.get(name, 0) + 1
        self.emit("evict", block.block_id, block.key[1], block.depth)
        self._remove_cached_block_hashes(block)

    def _remove_cached_block_hashes(self, block: Block) -> list[tuple[bytes, int]]:
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

    def touch(self, blocks: Sequence[Block]) -> None:
        leaving = []
        for block in blocks:
            if block.ref_cnt == 0 and block is not self.null:
                del self.free[block.block_id]
                self.index.taken(block.block_id)
                leaving.append(block.block_id)
            if block is not self.null:
                self._handed_out.add(block.block_id)
            block.ref_cnt += 1
        if leaving:
            self.emit("touch", leaving)

    def free_blocks(self, ordered: Sequence[Block]) -> None:
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
    def cache_full_blocks(self, req: RequestState, blocks: list[Block], num_cached: int, num_full: int,
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
            self.insert_block_hash(block, req.hash_at(depth), group_id, depth, self._parent(req, depth))
            if self.on_cache is not None:
                self.on_cache(req, group_id, depth, block.block_id)

    def cache_partial_block(self, req: RequestState, block: Block, num_tokens: int, group_id: int,
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
        self.insert_block_hash(block, prefix, group_id, num_tokens, self._parent(req, num_tokens))
        if self.on_cache is not None and not already:
            self.on_cache(req, group_id, num_tokens, block.block_id)
        return key

    def move_block_hashes(self, src: Block, dst: Block) -> None:
        """Re-point ``src``'s cache entries to ``dst`` (the request keeps writing into ``src``)."""
        assert dst.key is None
        keys = ([src.key] if src.key is not None else []) + self.extra_keys.get(src.block_id, [])
        known = {key[0]: self.index.prefix_info(key[0]) for key in keys}
        for key in self._remove_cached_block_hashes(src):
            depth, parent = known[key[0]]
            self.insert_block_hash(dst, key[0], key[1], depth, parent)

    def _parent(self, req: RequestState, depth: int) -> bytes | None:
        pdepth = parent_depth(depth, self.layout.block_size)
        return req.hash_at(pdepth) if pdepth else None

    def insert_block_hash(self, block: Block, prefix: bytes, group_id: int, depth: int,
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
