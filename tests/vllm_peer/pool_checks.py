"""Consistency of one hooked vLLM ``BlockPool`` with the plugin's index, recomputed from scratch.

Runs in the vLLM environment: the peer harness calls :func:`check_pool` after every vLLM test, the
randomised pool driver after every step. It reads vLLM's block-pool internals (``vLLM private``,
like the plugin itself: the hash map, the free queue, each block's ``ref_cnt``), which is the point.
"""

from __future__ import annotations

from typing import Any

__all__ = ["cached_keys", "check_pool", "make_hooks"]


def cached_keys(pool: Any) -> list[tuple[int, Any, int]]:
    """``(block id, prefix hash, group id)`` for every entry of vLLM's hash map."""
    from vllm.v1.core.kv_cache_utils import get_block_hash, get_group_id

    keys = []
    for key, blocks in pool.cached_block_hash_to_block._cache.items():         # vLLM private
        for block in (blocks.values() if isinstance(blocks, dict) else (blocks,)):
            keys.append((block.block_id, get_block_hash(key), get_group_id(key)))
    return keys


def check_pool(hooks: Any, held: dict[int, int] | None = None) -> None:
    """Raise AssertionError where ``hooks.pool`` and ``hooks.state`` disagree.

    Checked: every free block has ``ref_cnt`` 0 and every other (non-null) block more; the free
    queue's length is its count; the hash map and each block's ``block_hash`` agree; the plugin's
    free-cached set is exactly the free blocks with a hash; its index holds exactly the hash map
    (``BlockEvictionState.check_invariants``). With ``held`` (block id -> references the caller
    holds), ``ref_cnt`` must equal it for every block.
    """
    pool, state = hooks.pool, hooks.state
    free = pool.free_block_queue.get_all_free_blocks()
    free_ids = {b.block_id for b in free}
    assert len(free_ids) == len(free) == pool.free_block_queue.num_free_blocks, "free queue corrupt"
    for block in pool.blocks:
        if block.is_null:
            continue
        if block.block_id in free_ids:
            assert block.ref_cnt == 0, f"block {block.block_id} free with ref_cnt {block.ref_cnt}"
        else:
            assert block.ref_cnt > 0, f"block {block.block_id} neither free nor referenced"
        if held is not None:
            assert block.ref_cnt == held.get(block.block_id, 0), \
                f"block {block.block_id}: ref_cnt {block.ref_cnt}, held {held.get(block.block_id, 0)}"
    keys = cached_keys(pool)
    hashed = {block_id for block_id, _, _ in keys}
    for block in pool.blocks:
        if block.block_hash is not None:
            assert block.block_id in hashed, f"block {block.block_id} has a hash the map lacks"
    if not pool.enable_caching:
        return
    free_cached = {b.block_id for b in free if b.block_hash is not None}
    got = {int(b) for b in state.free_cached.nonzero()[0]}
    assert got == free_cached, f"plugin's free cached set drifted: {sorted(got ^ free_cached)[:8]}"
    assert state.num_free_cached == len(free_cached)
    state.check_invariants(keys)


def make_hooks(kv_manager: Any, kinds: list[str], spec: Any, block_size: int, config: Any) -> Any:
    """The plugin's hooks for ``kv_manager``'s pool, built but not installed, as ``PoolHooks.attach``
    builds them for a scheduler (``PoolHooks.for_pool`` where the plugin has it; before that, its
    constructor as ``attach`` called it). Raises what they raise (ConfigError for an α source)."""
    from vllm.v1.core.kv_cache_utils import get_block_hash, get_group_id

    from marconi.integrations.vllm.plugin import PoolHooks
    from marconi.integrations.vllm.policy import BlockEvictionState

    if hasattr(PoolHooks, "for_pool"):
        return PoolHooks.for_pool(kv_manager, kinds, spec, block_size, config)
    pool = kv_manager.block_pool
    state = BlockEvictionState(spec, kinds, pool.num_gpu_blocks, block_size, config.make_alpha_source(spec),
                               config.efficiency)
    hooks = PoolHooks(pool, kv_manager, state, config, int(pool.hash_block_size))
    hooks._hash_parts = (get_block_hash, get_group_id)
    return hooks


def count_choices(hooks: Any, counts: dict[str, int]) -> None:
    """Wrap the plugin state's ``evict`` to count its victims into ``counts["victims"]``, and into
    ``counts["victims_not_lru"]`` those LRU would not have taken: the free queue's head, less the
    victims of the same call before it (vLLM private: the queue's sentinels)."""
    state, queue = hooks.state, hooks.pool.free_block_queue
    evict = state.evict

    def counted(count: int) -> Any:
        victims = evict(count)
        tail = queue.fake_free_list_tail
        gone: set[int] = set()
        for block_id, _ in victims:
            head = queue.fake_free_list_head.next_free_block
            while head is not tail and head.block_id in gone:
                head = head.next_free_block
            counts["victims"] = counts.get("victims", 0) + 1
            counts["victims_not_lru"] = counts.get("victims_not_lru", 0) + (head.block_id != block_id)
            gone.add(block_id)
        return victims

    state.evict = counted
