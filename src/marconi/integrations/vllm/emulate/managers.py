"""vLLM's ``SingleTypeKVCacheManager`` per KV cache group (``vllm/v1/core/single_type_kv_cache_manager.py``).

:class:`AttentionManager` is ``FullAttentionManager`` (whole cached blocks from the start, then a
partial entry inside the next block with a finer prefix-match unit), :class:`MambaManager` is
``MambaManager`` in ``align`` mode (the deepest cached state; only the running state block is
kept). Both copy on write a block shared with the cache at a sub-block hit.
"""

from __future__ import annotations

from typing import Sequence

from marconi.integrations.vllm.emulate.block_pool import Block, BlockPool
from marconi.integrations.vllm.emulate.request import RequestState
from marconi.integrations.vllm.layout import cdiv, checkpoint_position, is_checkpoint_valid
from marconi.integrations.vllm.policy import ATTENTION, MAMBA
from marconi.integrations.vllm.retention import RetentionPlanner

__all__ = ["GroupManager", "AttentionManager", "MambaManager"]


class GroupManager:
    """What vLLM's ``SingleTypeKVCacheManager`` keeps for one KV cache group: blocks per request,
    and the copy-on-write of a block shared with the cache at a sub-block (partial) hit."""

    kind = ""

    def __init__(self, pool: BlockPool, group_id: int) -> None:
        self.pool = pool
        self.group_id = group_id
        self.block_size = pool.layout.block_size
        self.hash_unit = pool.layout.hash_block_size
        self.req_to_blocks: dict[int, list[Block]] = {}
        self.num_cached_block: dict[int, int] = {}
        self.partial_hit_reqs: dict[int, tuple[int, Block]] = {}
        self.pending_copies: list[tuple[Block, Block]] = []

    def num_skipped_tokens(self, num_computed: int) -> int:
        return 0

    def has_partial_local_hit(self, new_computed: Sequence[Block], num_local_computed: int) -> bool:
        return len(new_computed) > 0 and num_local_computed % self.block_size != 0

    def add_local_computed_blocks(self, req: RequestState, blocks: list[Block], num_local_computed: int,
                                  num_external: int = 0) -> None:
        """Take the hit's blocks (out of the free queue); a sub-block hit's last one is shared: CoW it.
        What is skipped counts the ``num_external`` tokens the CPU tier loads past the hit too, as in
        vLLM: a Mamba group keeps only the state at the load's end, not the hit's (taking both held
        one block per group more than vLLM, and a loaded request that then could not fit waited
        for good)."""
        assert not self.req_to_blocks.get(req.rid)
        skipped = self.num_skipped_tokens(num_local_computed + num_external) // self.block_size
        if skipped > 0:
            blocks = blocks[skipped:]
        self.pool.touch(blocks)
        self.req_to_blocks[req.rid] = [self.pool.null] * max(skipped, 0) + list(blocks)
        self.num_cached_block[req.rid] = len(self.req_to_blocks[req.rid])
        if self.has_partial_local_hit(blocks, num_local_computed):
            idx = num_local_computed // self.block_size
            self.partial_hit_reqs[req.rid] = (idx, blocks[-1])
            self.num_cached_block[req.rid] = idx

    def allocate_external_computed_blocks(self, req: RequestState, num_local_computed: int, num_external: int) -> None:
        """vLLM's ``allocate_external_computed_blocks``: blocks for the tokens the CPU tier loads
        (after every group's hit blocks are taken), up to the load's end, less what is skipped."""
        total = num_local_computed + num_external
        skipped = self.num_skipped_tokens(total)
        if skipped > 0:
            num_external = min(total - skipped, num_external)
        if num_external <= 0:
            return
        blocks = self.req_to_blocks[req.rid]
        blocks.extend(self.pool.get_new_blocks(max(0, cdiv(total, self.block_size) - len(blocks))))

    def apply_cow(self, req: RequestState, idx: int, source: Block, cow: Block) -> None:
        blocks = self.req_to_blocks[req.rid]
        assert blocks[idx] is source
        blocks[idx] = cow
        self.pending_copies.append((source, cow))
        cow.ref_cnt += 1                     # both ends stay held until the copy has run

    def take_pending_copies(self) -> list[tuple[Block, Block]]:
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def free(self, req: RequestState) -> None:
        """Release the request's blocks tail first (so vLLM's LRU evicts tails first)."""
        blocks = self.req_to_blocks.pop(req.rid, [])
        self.num_cached_block.pop(req.rid, None)
        self.partial_hit_reqs.pop(req.rid, None)
        self.pool.free_blocks(blocks[::-1])


class AttentionManager(GroupManager):
    """vLLM's ``FullAttentionManager``: whole blocks from the start, then (with a prefix-match unit
    finer than the block) one partial entry inside the next block."""

    kind = ATTENTION

    def find_longest_cache_hit(self, req: RequestState, max_length: int, group_ids: list[int]) -> tuple[list[list[Block]], int]:
        computed: list[list[Block]] = [[] for _ in group_ids]
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
            # vLLM bounds it by the request's hashes: a resumed request's outputs have them too.
            last = min(first + scale - 1, max_length // unit, req.num_tokens // unit)
            for fine in range(last - 1, first - 1, -1):
                cached = self.pool.get_cached_block(req.hash_at((fine + 1) * unit), group_ids)
                if cached:
                    for out, block in zip(computed, cached):
                        out.append(block)
                    hit = (fine + 1) * unit
                    break
        return computed, hit

    def remove_skipped_blocks(self, req: RequestState, processed: int) -> None:
        return None                    # full attention never skips tokens

    def allocate_new_blocks(self, req: RequestState, num_tokens: int) -> None:
        if req.rid in self.partial_hit_reqs:
            idx, source = self.partial_hit_reqs.pop(req.rid)
            self.apply_cow(req, idx, source, self.pool.get_new_blocks(1)[0])
        blocks = self.req_to_blocks.setdefault(req.rid, [])
        num_new = cdiv(num_tokens, self.block_size) - len(blocks)
        if num_new > 0:
            blocks.extend(self.pool.get_new_blocks(num_new))

    def num_blocks_to_allocate(self, req: RequestState, num_tokens: int, new_computed: list[Block],
                               num_computed: int, *, admission: bool = False, num_external: int = 0) -> int:
        held = len(self.req_to_blocks.get(req.rid, ()))
        if req.rid in self.num_cached_block:
            return max(cdiv(num_tokens, self.block_size) - held, 0)
        num_new = max(cdiv(num_tokens, self.block_size) - (len(new_computed) + held), 0)
        if self.has_partial_local_hit(new_computed, num_computed - num_external):
            num_new += 1
        return num_new + sum(1 for b in new_computed if b.ref_cnt == 0 and b is not self.pool.null)

    def cache_blocks(self, req: RequestState, num_tokens: int) -> None:
        num_cached = self.num_cached_block.get(req.rid, 0)
        num_full = num_tokens // self.block_size
        if num_cached < num_full:
            self.pool.cache_full_blocks(req, self.req_to_blocks[req.rid], num_cached, num_full, self.group_id, None)
            self.num_cached_block[req.rid] = num_full
        if self.hash_unit < self.block_size:
            self._cache_partial_tail_block(req, num_tokens)

    def _cache_partial_tail_block(self, req: RequestState, num_tokens: int) -> None:
        """Register the prompt's last hash boundary (``P-1`` rounded down) when it ends inside a block."""
        boundary = (req.num_prompt_tokens - 1) // self.hash_unit * self.hash_unit
        if boundary == 0 or boundary > num_tokens or boundary % self.block_size == 0:
            return
        blocks = self.req_to_blocks[req.rid]
        idx = boundary // self.block_size
        if idx < len(blocks):
            self.pool.cache_partial_block(req, blocks[idx], boundary, self.group_id)


class MambaManager(GroupManager):
    """vLLM's ``MambaManager`` in ``align`` mode (no speculative blocks). With the layout's
    ``prefill_checkpoint_alignment``, a chunk reaching the prefill's end gets one extra checkpoint
    block (column ``cdiv(end, B) - 2``), which the full-sequence admission gate counts too.
    """

    kind = MAMBA

    def __init__(self, pool: BlockPool, group_id: int, *, retention: RetentionPlanner | None = None) -> None:
        super().__init__(pool, group_id)
        self.retention = retention       # the plugin's sparse-dp planner: its boundaries are kept too
        self.last_state_block_idx: dict[int, int] = {}
        self.num_retired_blocks: dict[int, int] = {}
        self.allocated: set[int] = set()
        self.checkpoint_alignment = pool.layout.prefill_checkpoint_alignment
        self.align = min(self.hash_unit, self.block_size)     # vLLM's cache_hit_alignment_tokens
        # Request -> (checkpoint position, checkpoint block index) for the current allocation
        # (vLLM's ``_checkpoints``, set by every non-admission ``get_num_blocks_to_allocate``).
        self.checkpoints: dict[int, tuple[int, int]] = {}
        # Keys of the states cached in this scheduling step: another request cannot resume from them
        # until the step has run (vLLM's ``cached_blocks_this_step``).
        self.cached_this_step: set[tuple[bytes, int]] = set()

    def new_step_starts(self) -> None:
        self.cached_this_step.clear()

    def num_skipped_tokens(self, num_computed: int) -> int:
        return num_computed - 1                                  # Mamba keeps only the last state

    def find_longest_cache_hit(self, req: RequestState, max_length: int, group_ids: list[int]) -> tuple[list[list[Block]], int]:
        """The deepest state within ``max_length`` and the request's hashes (a preempted request's
        run past its prompt), at every hash boundary."""
        computed: list[list[Block]] = [[] for _ in group_ids]
        unit = self.hash_unit if self.hash_unit < self.block_size else self.block_size
        for fine in range(min(max_length // unit, req.num_tokens // unit) - 1, -1, -1):
            cached = self.pool.get_cached_block(req.hash_at((fine + 1) * unit), group_ids)
            if cached:
                idx = fine // (self.block_size // unit)                # the block holding that boundary
                for out, block in zip(computed, cached):
                    out.extend([self.pool.null] * idx)
                    out.append(block)
                return computed, (fine + 1) * unit
        return computed, 0

    def _free_and_null(self, blocks: list[Block], indices: Sequence[int]) -> None:
        freed = []
        for i in indices:
            if blocks[i] is not self.pool.null:
                freed.append(blocks[i])
                blocks[i] = self.pool.null
        if freed:
            self.pool.free_blocks(freed)

    def remove_skipped_blocks(self, req: RequestState, processed: int) -> None:
        blocks = self.req_to_blocks.setdefault(req.rid, [])
        num_skipped_tokens = self.num_skipped_tokens(processed)
        if num_skipped_tokens > 0:
            last = min(num_skipped_tokens // self.block_size, len(blocks))
            first = self.num_retired_blocks.get(req.rid, 0)
            if first < last:
                self._free_and_null(blocks, range(last - 1, first - 1, -1))
                self.num_retired_blocks[req.rid] = last
        idx = self.last_state_block_idx.get(req.rid)
        if idx is not None and idx < cdiv(processed, self.block_size) - 1:
            self._free_and_null(blocks, [idx])

    def _needs_internal_checkpoint(self, req: RequestState, start: int, end: int, position: int) -> bool:
        """vLLM's ``_needs_internal_checkpoint``: the chunk ``[start, end)`` exports ``position``
        into a checkpoint block (a fresh one: that column holds nothing yet)."""
        if self.checkpoint_alignment is None:
            return False
        # Under dense or interval retention every chunk publishes a state (vLLM zeroes prefill_end).
        prefill_end = max(req.num_prompt_tokens, req.num_tokens - 1) if self.pool.layout.retention_interval == 0 else 0
        idx = cdiv(end, self.block_size) - 2
        blocks = self.req_to_blocks.get(req.rid, [])
        return (end >= prefill_end
                and is_checkpoint_valid(start, end, position, self.hash_unit, self.block_size, self.checkpoint_alignment)
                and idx >= 0 and (idx >= len(blocks) or blocks[idx] is self.pool.null))

    def num_blocks_to_allocate(self, req: RequestState, num_tokens: int, new_computed: list[Block],
                               num_computed: int, *, admission: bool = False, num_external: int = 0) -> int:
        if new_computed and new_computed[-1].key in self.cached_this_step:
            return self.pool.layout.num_blocks + 1         # as vLLM: never fits, so it waits a step
        held = len(self.req_to_blocks.get(req.rid, ()))
        num_new = cdiv(num_tokens, self.block_size) - len(new_computed) - held
        partial = (self.has_partial_local_hit(new_computed, num_computed - num_external)
                   or req.rid in self.partial_hit_reqs)
        if partial:
            num_new = max(num_new, 0) + 1
        position = checkpoint_position(num_tokens, self.align)
        checkpoint = self._needs_internal_checkpoint(req, num_computed, num_tokens, position)
        if not admission:                  # as vLLM: the gate's call counts the block, records nothing
            if checkpoint:
                self.checkpoints[req.rid] = (position, cdiv(num_tokens, self.block_size) - 2)
            else:
                self.checkpoints.pop(req.rid, None)
        if num_new > 0:       # the physical cap: the running block (+ CoW) (+ the checkpoint block)
            num_new = min(num_new, 1 + int(partial) + int(checkpoint))
        # May be negative, as in vLLM: a request holding more (null-padded) blocks than it needs.
        return num_new + sum(1 for b in new_computed if b.ref_cnt == 0 and b is not self.pool.null)

    def allocate_new_blocks(self, req: RequestState, num_tokens: int) -> None:
        blocks = self.req_to_blocks.setdefault(req.rid, [])
        num_required = cdiv(num_tokens, self.block_size)
        partial = self.partial_hit_reqs.get(req.rid)
        checkpoint = int(req.rid in self.checkpoints)
        if num_required <= len(blocks) and partial is None and not checkpoint:
            self.allocated.add(req.rid)
            return
        prev_len = len(blocks)
        was_allocated = req.rid in self.allocated
        if was_allocated or prev_len > 0:
            self.last_state_block_idx[req.rid] = prev_len - 1     # the state the next one copies
        num_skipped = num_required - 1
        if prev_len < num_skipped:       # null up to the checkpoint column, which gets a real block
            blocks.extend([self.pool.null] * max(num_skipped - checkpoint - prev_len, 0))
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
                if cow.key is not None:        # filled only by this step's copy
                    self.cached_this_step.add(cow.key)
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

    def cache_blocks(self, req: RequestState, num_tokens: int) -> None:
        num_cached = self.num_cached_block.get(req.rid, 0)
        num_full = num_tokens // self.block_size
        if num_cached < num_full:
            boundaries = [req.num_prompt_tokens - 1]               # vLLM's replay boundary (no EAGLE)
            if self.retention is not None:                        # the plugin's wrapped cache_blocks
                boundaries.extend(self.retention.positions(req.rid))
            if req.shared_prefix_boundary:
                boundaries.append(req.shared_prefix_boundary)
            mask = self.reachable_block_mask(num_cached, num_full, boundaries)
            blocks = self.req_to_blocks[req.rid]
            self.pool.cache_full_blocks(req, blocks, num_cached, num_full, self.group_id, mask)
            self.num_cached_block[req.rid] = num_full
            self.cached_this_step.update(b.key for b in blocks[num_cached:num_full] if b.key is not None)
        self._cache_partial_tail_block(req, num_tokens)

    def _cache_checkpoint_block(self, req: RequestState, position: int, idx: int) -> None:
        """vLLM's checkpoint branch of ``_cache_partial_tail_block``: key the checkpoint block at
        the boundary the pass exported into it, if a later request can resume there; otherwise
        the transient state is not reusable and the block's hash goes."""
        blocks = self.req_to_blocks[req.rid]
        assert 0 <= idx < len(blocks)
        block = blocks[idx]
        is_prompt_checkpoint = position == checkpoint_position(req.num_prompt_tokens, self.align)
        retained = False
        if position % self.block_size == 0:
            block_idx = position // self.block_size - 1
            boundaries = [req.num_prompt_tokens - 1] + ([req.shared_prefix_boundary] if req.shared_prefix_boundary else [])
            mask = self.reachable_block_mask(block_idx, block_idx + 1, boundaries)
            retained = mask is None or mask[0]
        if not is_prompt_checkpoint and not retained and position != req.shared_prefix_boundary:
            self.pool.evict_cached_block(block)
            return
        if block.key is not None and block.depth == position:
            return
        key = self.pool.cache_partial_block(req, block, position, self.group_id, replace_existing=True)
        if key is not None:
            self.cached_this_step.add(key)

    def _cache_partial_tail_block(self, req: RequestState, num_tokens: int) -> None:
        """At the prompt's last hash boundary, key the running state block there (a producer CoW
        then preserves it when the request moves on)."""
        checkpoint = self.checkpoints.get(req.rid)
        if checkpoint is not None:
            self._cache_checkpoint_block(req, *checkpoint)
            return
        unit = self.hash_unit
        if num_tokens <= 0 or num_tokens % unit:
            return
        if num_tokens != max((req.num_prompt_tokens - 1) // unit * unit, 0):
            return
        idx = cdiv(num_tokens, self.block_size) - 1
        blocks = self.req_to_blocks[req.rid]
        if idx >= len(blocks) or blocks[idx] is self.pool.null:
            return
        key = self.pool.cache_partial_block(req, blocks[idx], num_tokens, self.group_id)
        if key is not None:
            self.cached_this_step.add(key)
        if key is not None and num_tokens % self.block_size:
            self.partial_hit_reqs[req.rid] = (idx, blocks[idx])
            self.num_cached_block[req.rid] = idx

    def free(self, req: RequestState) -> None:
        self.allocated.discard(req.rid)
        self.checkpoints.pop(req.rid, None)
        self.last_state_block_idx.pop(req.rid, None)
        self.num_retired_blocks.pop(req.rid, None)
        super().free(req)
