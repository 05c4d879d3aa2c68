"""Replay requests through SGLang's own ``UnifiedRadixCache`` on CPU, driven as its scheduler drives it.

Runs in the SGLang environment. :class:`RadixReplay` builds SGLang's real pools (slots sized from a
byte budget and the model's :class:`~marconi.core.model.ModelSpec`) and a ``UnifiedRadixCache``
(``no_buffer``, page 1, Python TreeCore), then takes each request, one at a time, through admission,
the end-of-prefill checkpoint, decode KV and finish, as SGLang's scheduler does. The tree frees
duplicate KV itself (:meth:`RadixReplay.kv_in_use` checks conservation). Steps and limits:
docs/sglang.md, "The bench".
"""

from __future__ import annotations

from array import array
from typing import Any, Sequence

from marconi.core.model import ModelSpec
from marconi.integrations.sglang.emulate import PoolExhausted

__all__ = ["RadixReplay", "pool_sizes", "MAMBA_FULL_MEMORY_RATIO"]

#: SGLang's default ``--mamba-full-memory-ratio`` (Mamba state memory : full KV memory).
MAMBA_FULL_MEMORY_RATIO = 0.9


def pool_sizes(spec: ModelSpec, capacity_bytes: float, min_kv_tokens: int,
               ratio: float = MAMBA_FULL_MEMORY_RATIO) -> tuple[int, int]:
    """``(kv_tokens, mamba_slots)`` for a byte budget, split by SGLang's memory ratio; at least
    ``min_kv_tokens`` KV slots (the longest request) and 2 Mamba slots."""
    mamba_bytes = capacity_bytes * ratio / (1 + ratio)
    slots = max(2, int(mamba_bytes // max(1, spec.ssm_checkpoint_bytes)))
    kv_tokens = int((capacity_bytes - mamba_bytes) // max(1, spec.kv_bytes_per_token))
    return max(kv_tokens, int(min_kv_tokens)), slots


class RadixReplay:
    """SGLang's hybrid radix cache with real pools of ``kv_tokens`` KV slots and ``mamba_slots``
    Mamba slots, under ``policy`` (``lru`` or ``marconi``) and its config."""

    def __init__(self, kv_tokens: int, mamba_slots: int, *, policy: str = "lru",
                 policy_config: dict[str, Any] | None = None, max_context_len: int = 1 << 16,
                 tree_core_backend: str | None = "python") -> None:
        import torch
        from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
        from sglang.srt.environ import envs
        from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool
        from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
        from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

        from sglang.srt.plugins import load_plugins

        load_plugins()                           # what every scheduler process does first (registers marconi)
        args = ServerArgs(model_path="dummy", page_size=1)
        args._mamba_cache_chunk_size = 64        # what SGLang derives from a real HF config
        set_global_server_args_for_scheduler(args)
        with envs.SGLANG_MAMBA_SSM_DTYPE.override("bfloat16"):
            shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=16, n_groups=1, num_heads=1,
                                            head_dim=16, state_size=1, conv_kernel=2)
            params = Mamba2CacheParams(shape=shape, layers=[0])
        self.req_pool = HybridReqToTokenPool(
            size=2, mamba_size=int(mamba_slots), mamba_spec_state_size=2, max_context_len=max_context_len,
            device="cpu", enable_memory_saver=False, cache_params=params, mamba_layer_ids=[0],
            enable_mamba_extra_buffer=False, speculative_num_draft_tokens=3)
        kv_pool = HybridLinearKVPool(size=int(kv_tokens), dtype=torch.bfloat16, page_size=1, head_num=1, head_dim=1,
                                     full_attention_layer_ids=[1], device="cpu", enable_memory_saver=False,
                                     mamba_pool=self.req_pool.mamba_pool)
        self.allocator = TokenToKVPoolAllocator(size=int(kv_tokens), dtype=torch.bfloat16, device="cpu",
                                                kvcache=kv_pool, need_sort=False)
        init = CacheInitParams(req_to_token_pool=self.req_pool, token_to_kv_pool_allocator=self.allocator,
                               page_size=1, disable=False,
                               tree_components=(ComponentType.FULL, ComponentType.MAMBA),
                               eviction_policy=policy, eviction_policy_config=policy_config or None,
                               tree_core_backend=tree_core_backend)
        self.cache = UnifiedRadixCache(params=init)
        self.kv_tokens, self.mamba_slots = int(kv_tokens), int(mamba_slots)
        self.policy = policy
        self._torch = torch
        self.num_requests = 0
        self.input_tokens = 0
        self.hit_tokens = 0
        self.kv_only_tokens = 0

    @property
    def strategy(self) -> Any:
        return self.cache.tree_core.eviction_strategy

    def _evict(self, **shortfall: int) -> None:
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        self.cache.evict_for_alloc(EvictParams(**shortfall))

    def _alloc_kv(self, n: int) -> Any:
        if n <= 0:
            return self._torch.empty(0, dtype=self._torch.int64)
        short = n - self.allocator.available_size()
        if short > 0:
            self._evict(num_tokens=short)
        out = self.allocator.alloc(n)
        if out is None:
            raise PoolExhausted(f"SGLang's KV pool ({self.kv_tokens} tokens) cannot hold a {n}-token request "
                                "after eviction: raise --capacity")
        return out

    def _alloc_state(self) -> Any:
        mamba = self.req_pool.mamba_allocator
        if mamba.available_size() < 1:
            self._evict(mamba_num=1)
        out = mamba.alloc(1)
        if out is None:
            raise PoolExhausted(f"SGLang's Mamba pool ({self.mamba_slots} slots) has no free state after eviction: "
                                "raise --capacity")
        return out

    def _checkpoint(self, seq: list[int], value: Any, state: Any, protected: int, inserted: int) -> Any:
        """SGLang's ``checkpoint_into_tree`` (page size 1): insert ``seq`` with its KV indices ``value``
        and the Mamba slot ``state``; the tree frees the duplicate KV past ``protected`` itself (its
        insert's ``FreeDeviceKV`` actions). Returns the insert's result."""
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        return self.cache.insert(InsertParams(key=RadixKey(array("q", seq)), value=value, mamba_value=state,
                                              prev_prefix_len=protected, inserted_len=inserted))

    def serve(self, prompt: Sequence[int], output: Sequence[int]) -> tuple[int, int]:
        """One request, start to finish: ``(hit tokens, KV-only tokens)`` as SGLang matched it."""
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        prompt, output = list(prompt), list(output)
        torch = self._torch
        # 1. admission: the match is capped at len(prompt) - 1 (Req._compute_max_prefix_len: one token
        # is always computed, for its logits).
        limit = max(len(prompt) - 1, 0)
        match = self.cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", prompt), limit=limit)))
        hit = int(match.device_prefix_len)
        kv_only = max(0, int(match.full_kv_hit_length) - hit)
        lock = self.cache.lock(match.last_device_node)
        prefix = self.cache.path_device_indices(match.last_device_node)[:hit]
        state = self._alloc_state()                           # the request's working slot (COW of the hit)
        fresh = self._alloc_kv(len(prompt) - hit)             # alloc_for_extend
        value = torch.cat([prefix.to(torch.int64), fresh.to(torch.int64)])
        # 2. end of prefill: checkpoint_kv_cache(up_to=len(prompt)). no_buffer donates a copy of the
        # live state to the tree (a fresh slot, evicting if none is free); the lock moves to the new node.
        copy = self._alloc_state()
        result = self._checkpoint(prompt, value, copy, hit, 0)
        if result.mamba_exist:                                # the node had a state: the copy is not kept
            self.req_pool.mamba_allocator.free(copy)
        node = result.last_device_node
        self.cache.unlock(lock)
        lock = self.cache.lock(node)
        value = self.cache.path_device_indices(node).to(torch.int64)   # the row now holds the tree's indices
        protected = len(value)
        # 3. decode: the KV of every output token but the last (kv_committed_len = prompt + output - 1).
        committed = len(prompt) + max(len(output) - 1, 0)
        decode = self._alloc_kv(committed - protected)
        # 4. finish: release_kv_cache(checkpoint=True) hands the request's own slot to the tree.
        if committed > protected:
            value = torch.cat([value, decode.to(torch.int64)])
            seq = (prompt + output)[:committed]
            result = self._checkpoint(seq, value, state, protected, protected)
            if result.mamba_exist:
                self.req_pool.mamba_allocator.free(state)
        else:                                                 # nothing new to key: the slot goes back
            self.req_pool.mamba_allocator.free(state)
        self.cache.unlock(lock)
        self.num_requests += 1
        self.input_tokens += len(prompt)
        self.hit_tokens += hit
        self.kv_only_tokens += kv_only
        strategy = self.strategy
        if hasattr(strategy, "observe"):
            strategy.observe(prompt, output, hit, kv_only)
        return hit, kv_only

    def kv_in_use(self) -> int:
        """KV slots the tree holds + free slots: equals the pool size when nothing leaked or was freed twice."""
        return int(self.cache.full_evictable_size() + self.cache.full_protected_size() + self.allocator.available_size())

    def sanity_check(self) -> None:
        self.cache.sanity_check()

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.input_tokens if self.input_tokens else 0.0
