"""vLLM's ``KVCacheManager``, hybrid coordinator and scheduler steps, for requests served one at a time.

Mirrors ``kv_cache_manager.py`` (``get_computed_blocks``, ``allocate_slots``), ``kv_cache_coordinator.py``
(attention first, then the deepest state within it) and ``sched/scheduler.py`` (the Mamba-aligned
split, the free) over :mod:`.block_pool` and :mod:`.managers`; a finished request then goes to the
α source, as in the plugin.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from marconi.core.cache import as_tokens
from marconi.core.model import ModelSpec
from marconi.core.registry import ConfigError
from marconi.integrations.common.alpha import AlphaSource, FixedAlpha, RequestObservation
from marconi.integrations.vllm.config import PluginConfig
from marconi.integrations.vllm.emulate.block_pool import Block, BlockPool
from marconi.integrations.vllm.emulate.managers import AttentionManager, MambaManager
from marconi.integrations.vllm.emulate.request import RequestState
from marconi.integrations.vllm.emulate.tier import EmulatedTier
from marconi.integrations.vllm.layout import VllmLayout, cdiv, checkpoint_position, is_checkpoint_valid
from marconi.integrations.vllm.policy import ATTENTION, DEFAULT_ALPHA, MAMBA, BlockEvictionState
from marconi.integrations.vllm.retention import RetentionPlanner

__all__ = ["VllmAlignEngine", "RequestRecord"]


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
                 alpha: float | str | AlphaSource = DEFAULT_ALPHA, efficiency: str = "total",
                 retention_budget: int | None = None) -> None:
        """``alpha``: a number, ``"adaptive"`` (a fresh shadow α source,
        :class:`~marconi.integrations.vllm.shadow.PoolShadowAlpha`, as ``MARCONI_VLLM_ALPHA=adaptive``)
        or an α source (stateful: one per engine). ``retention_budget``: ``MARCONI_VLLM_RETENTION=sparse-dp``
        with that budget (the plugin's planner, :class:`~marconi.integrations.vllm.retention.RetentionPlanner`;
        it needs retention interval 0 and a Mamba group); ``None``: vLLM's own retention."""
        if eviction not in ("lru", "marconi"):
            raise ConfigError(f"vllm-align: eviction must be 'lru' or 'marconi', got {eviction!r}")
        self.retention: RetentionPlanner | None = None
        if retention_budget is not None:
            if layout.retention_interval != 0 or not layout.has_mamba:
                raise ConfigError("vllm-align: retention=sparse-dp needs a Mamba group and retention interval 0 (as "
                                  f"the plugin), got interval {layout.retention_interval!r}")
            self.retention = RetentionPlanner.for_model(spec, block_size=layout.block_size, budget=retention_budget)
        self.layout = layout
        self.spec = spec
        self.eviction = eviction
        if isinstance(alpha, str):       # built exactly as the plugin builds its own
            source = PluginConfig(policy=eviction, alpha=alpha).make_alpha_source(spec)
        else:
            source = FixedAlpha(alpha) if isinstance(alpha, (int, float)) else alpha
        self.index = BlockEvictionState(spec, layout.group_kinds, layout.num_blocks, layout.block_size, source,
                                        efficiency)
        self.pool = BlockPool(layout, self.index, eviction)
        managers: list[AttentionManager | MambaManager] = []
        for gid, kind in enumerate(layout.group_kinds):
            managers.append(AttentionManager(self.pool, gid) if kind == ATTENTION
                            else MambaManager(self.pool, gid, retention=self.retention))
        self.managers = managers
        self.attn_ids = [g for g, k in enumerate(layout.group_kinds) if k == ATTENTION]
        self.mamba_ids = [g for g, k in enumerate(layout.group_kinds) if k == MAMBA]
        self.queries = 0
        self.hits = 0
        self._next_rid = 0
        self.tier: EmulatedTier | None = None

    def attach_tier(self, tier: "EmulatedTier") -> None:
        """Put vLLM's CPU offload tier (:class:`~.tier.EmulatedTier`) beside the pool: the
        scheduler then looks it up on a GPU-pool miss and the pool hands it the states it caches."""
        self.tier = tier
        self.pool.on_cache = tier.on_cache
        managers = self.managers
        tier.bind(lambda req: [[b.block_id for b in m.req_to_blocks.get(req.rid, ())] for m in managers],
                  self.pool.take_handed_out)

    # --------------------------------------------------------------- public
    def run(self, prompt: Any, outputs: Any) -> RequestRecord:
        req, record = self.admit(prompt)
        self.complete(req, outputs)
        return record

    def admit(self, prompt: Any) -> tuple[RequestState, RequestRecord]:
        tokens = as_tokens(prompt, "prompt")
        req = RequestState(self.next_request_id(), tokens, len(tokens), self.layout.hash_block_size)
        hit_blocks, hit, kv_hit = self.get_computed_blocks(req)
        self.queries += req.num_prompt_tokens
        self.hits += hit
        first = True
        ext = self.tier.lookup(req, hit) or 0 if self.tier is not None else 0
        if ext:            # the tier's load: blocks for the hit and the loaded tokens, cached once it lands
            assert self.tier is not None
            self.new_step_starts()
            self.allocate_slots(req, 0, hit, hit_blocks, delay_cache=True, num_external=ext)
            self.pool.emit("lookup", req.num_prompt_tokens, hit, kv_hit - hit)
            req.hit_len, req.kv_only_len, req.tier_hit_len = hit, kv_hit - hit, ext
            self.tier.load(req, hit, ext, True)
            self.release_copies()
            self.tier.end_step(())
            req.num_computed_tokens = hit + ext
            self.cache_blocks(req, req.num_computed_tokens)
            first = False
        while req.num_computed_tokens < req.num_prompt_tokens:
            self.new_step_starts()
            start = hit if first else req.num_computed_tokens
            num_new = min(req.num_prompt_tokens - start, self.layout.max_num_batched_tokens)
            if 0 < self.layout.long_prefill_token_threshold < num_new:
                num_new = self.layout.long_prefill_token_threshold
            if self.layout.has_mamba:
                num_new = self.mamba_block_aligned_split(req, start, num_new)
            self.allocate_slots(req, num_new, hit if first else 0, hit_blocks if first else None)
            if first:      # vLLM records the lookup once the request is admitted (after its first slots)
                self.pool.emit("lookup", req.num_prompt_tokens, hit, kv_hit - hit)
                req.hit_len, req.kv_only_len = hit, kv_hit - hit
            self.release_copies()
            if self.tier is not None:
                self.tier.end_step([(req, num_new)])
            req.num_computed_tokens = start + num_new
            first = False
        return req, RequestRecord(req.num_prompt_tokens, hit, kv_hit)

    def complete(self, req: RequestState, outputs: Any) -> None:
        out = as_tokens(outputs, "outputs", allow_empty=True)
        if out.size:
            req.tokens = np.concatenate((req.tokens[:req.num_prompt_tokens], out))
            req.append_output()                   # the prefill's last step samples the first token
            for _ in range(1, len(out)):          # each decode step computes one token, samples the next
                self.new_step_starts()
                self.allocate_slots(req, 1, 0, None)
                self.release_copies()
                req.num_computed_tokens += 1
                req.append_output()
        if self.tier is not None:       # before its blocks go back: its last stores read them
            self.tier.finished(req)
        self.free(req)
        self.end_request(req)
        if self.tier is not None:       # one request at a time: its access ends and every store lands
            self.tier.end_step(())
            self.tier.end_step(())
        # As the plugin does after vLLM's ``_free_request``: the finished request goes to the α source.
        changed = self.index.finished(RequestObservation(req.tokens[:req.num_prompt_tokens], out, req.hit_len,
                                                         req.kv_only_len))
        if changed is not None:
            self.pool.emit("alpha", *changed)

    # --------------------------------------------------------------- vLLM's steps
    def get_computed_blocks(self, req: RequestState) -> tuple[list[list[Block]], int, int]:
        """``KVCacheManager.get_computed_blocks`` + the hybrid coordinator's lookup.

        Returns the hit blocks per group, the hit length, and the attention-only hit length (the
        longest single-group hit). Sets the request's shared-prefix boundary as the scheduler does.
        """
        max_len = req.num_tokens - 1          # a resumed (preempted) request also matches its outputs
        blocks: list[list[Block]] = [[] for _ in self.managers]
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
            keep = cdiv(hit, self.layout.block_size)
            for gid in self.attn_ids:
                del blocks[gid][keep:]
        req.shared_prefix_boundary = longest if longest > hit else 0
        return blocks, hit, longest

    def end_request(self, req: RequestState) -> None:
        """A request finished (not preempted): its retention plan goes, as the plugin's ``_free_request`` hook."""
        if self.retention is not None:
            self.retention.finish(req.rid)

    def next_request_id(self) -> int:
        """A fresh request id (admission order), shared by the sequential path and the scheduler."""
        rid = self._next_rid
        self._next_rid += 1
        return rid

    def mamba_block_aligned_split(self, req: RequestState, start: int, num_new: int) -> int:
        """``Scheduler._mamba_block_aligned_split``: chunk ends where a state must be cached."""
        size = self.layout.block_size
        prefill_end = max(req.num_prompt_tokens, req.num_tokens - 1)
        if start >= prefill_end:
            return num_new
        last_cache_position = checkpoint_position(req.num_tokens, size)
        end = start + num_new
        unit = self.layout.hash_block_size
        # A chunk reaching the prefill's end whose backend can export the boundary state from inside
        # the pass (MambaMixer2's prefill checkpoint) is not split there: the state goes to a
        # checkpoint block the Mamba manager reserves (``MambaManager._checkpoints``).
        internal = end >= prefill_end and is_checkpoint_valid(
            start, end, checkpoint_position(prefill_end, min(unit, size)), unit, size,
            self.layout.prefill_checkpoint_alignment)
        if internal:
            last_cache_position = 0
        if end < prefill_end:
            budget = self.layout.max_num_batched_tokens
            if self.layout.long_prefill_token_threshold > 0:
                budget = min(budget, self.layout.long_prefill_token_threshold)
            aligned_end = end // size * size
            if aligned_end > start or size <= budget:
                end = aligned_end
        # With a prefix-match unit finer than the block, also stop at the prompt's last hash
        # boundary: its state is what a longer sibling's partial hit resumes from (unless the
        # backend exports it from inside the pass).
        tail = checkpoint_position(req.num_prompt_tokens, unit) if unit < size and not internal else 0
        junction = req.shared_prefix_boundary
        junction_stop = start + (junction - start) // size * size     # block-floored from the start, as in vLLM
        stops = (
            (start // size + 1) * size if start % size and not internal else 0,
            last_cache_position,
            tail if last_cache_position < tail < req.num_prompt_tokens else 0,
            junction_stop if start < junction < end else 0,
        )
        end = min((s for s in stops if start < s < end), default=end)
        num = max(end - start, 0)
        if self.retention is None:
            return num
        if req.rid not in self.retention:            # the plugin's hook: planned at the first call
            keys = [req.hash_at((i + 1) * size) for i in range(req.num_prompt_tokens // size)]
            self.retention.plan(req.rid, keys, num_prompt_tokens=req.num_prompt_tokens, resume=start,
                                junction=req.shared_prefix_boundary)
        return self.retention.stop(req.rid, start, num)

    def new_step_starts(self) -> None:
        """``KVCacheManager.new_step_starts``: forget which states were cached in the last step."""
        for gid in self.mamba_ids:
            self.managers[gid].new_step_starts()

    def allocate_slots(self, req: RequestState, num_new: int, num_new_computed: int,
                       new_computed: list[list[Block]] | None, *, delay_cache: bool = False,
                       num_external: int = 0) -> None:
        """:meth:`try_allocate_slots` for requests served one at a time: ConfigError if it does not fit."""
        if not self.try_allocate_slots(req, num_new, num_new_computed, new_computed, delay_cache=delay_cache,
                                       num_external=num_external):
            raise ConfigError(f"vllm-align: a {req.num_prompt_tokens}-token request needs more free blocks at "
                              f"{req.num_computed_tokens + num_new_computed + num_new} tokens than the pool has "
                              f"({self.pool.num_free} of {self.layout.num_blocks}); vLLM would never schedule it "
                              f"— raise the capacity")

    def blocks_needed(self, req: RequestState, num_tokens: int, new_computed: list[list[Block]] | None,
                       total_computed: int, admission: bool = False, num_external: int = 0) -> int:
        """``get_num_blocks_to_allocate`` summed over the groups; ``admission``: the full-sequence
        gate's call (vLLM's ``apply_admission_cap``), which counts a prefill checkpoint block but
        does not record it. ``total_computed`` includes the ``num_external`` tokens a CPU-tier load
        brings (a sub-block hit is judged on the local hit alone, as vLLM judges it)."""
        return sum(m.num_blocks_to_allocate(req, num_tokens, new_computed[g] if new_computed else [], total_computed,
                                            admission=admission, num_external=num_external)
                   for g, m in enumerate(self.managers))

    def try_allocate_slots(self, req: RequestState, num_new: int, num_new_computed: int,
                           new_computed: list[list[Block]] | None, *, full_sequence_must_fit: bool = False,
                           reserved: int = 0, delay_cache: bool = False, num_external: int = 0) -> bool:
        """``KVCacheManager.allocate_slots``: take the hit's blocks, allocate ``num_new`` tokens' slots and
        cache the blocks they fill; False (vLLM's None) when the free blocks do not suffice.

        ``full_sequence_must_fit``: vLLM's admission gate (``scheduler_reserve_full_isl``, on by
        default) for a waiting request: refuse unless the whole known sequence fits. On refusal only
        the skipped blocks have been released, as in vLLM. ``reserved``: free blocks the allocation
        must leave (vLLM's in-flight prefills' reservation for an asynchronous load);
        ``delay_cache``: cache nothing yet (an asynchronous load; :meth:`cache_blocks` once it lands);
        ``num_external``: tokens past the hit loaded from the CPU tier, computed as far as the blocks go.
        """
        self.pool.emit("slots", req.num_computed_tokens, num_new_computed, num_new, 0)
        total_computed = req.num_computed_tokens + num_new_computed + num_external
        if full_sequence_must_fit and self.blocks_needed(
                req, req.num_tokens, new_computed, total_computed, admission=True,
                num_external=num_external) > self.pool.num_free:
            return False
        for manager in self.managers:
            manager.remove_skipped_blocks(req, total_computed)
        num_tokens = total_computed + num_new
        if self.blocks_needed(req, num_tokens, new_computed, total_computed,
                              num_external=num_external) > self.pool.num_free - reserved:
            return False
        # vLLM's allocate_new_computed_blocks, two phases: every group's hit, then the tier's blocks;
        # a request already holding blocks (running) adds none
        if ((new_computed is not None and any(new_computed)) or num_external > 0) and not any(
                req.rid in m.num_cached_block for m in self.managers):
            num_local = total_computed - num_external
            for g, manager in enumerate(self.managers):
                manager.add_local_computed_blocks(req, new_computed[g] if new_computed else [], num_local, num_external)
            if num_external > 0:
                for manager in self.managers:
                    manager.allocate_external_computed_blocks(req, num_local, num_external)
        for manager in self.managers:
            manager.allocate_new_blocks(req, num_tokens)
        if not delay_cache:
            self.cache_blocks(req, min(num_tokens, req.num_tokens))
        return True

    def cache_blocks(self, req: RequestState, num_tokens: int) -> None:
        """``KVCacheManager.cache_blocks``: make the request's blocks up to ``num_tokens`` reachable.
        vLLM's hybrid coordinator caches a block-aligned prefix only (``get_num_cacheable_tokens``)
        unless hits may end inside a block: so a request resuming from its prompt's last boundary
        re-registers that state in the step, and a sibling hitting it waits a step, as in vLLM."""
        layout = self.layout
        if layout.has_mamba and layout.hash_block_size >= layout.block_size:
            num_tokens = num_tokens // layout.block_size * layout.block_size
        for manager in self.managers:
            manager.cache_blocks(req, num_tokens)

    def release_copies(self) -> None:
        """End of vLLM's scheduling step: blocks held for this step's copy-on-writes go back."""
        copies = [pair for manager in self.managers for pair in manager.take_pending_copies()]
        if copies:
            self.pool.free_blocks([block for pair in copies for block in pair])

    def free(self, req: RequestState) -> None:
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
