"""What one Marconi victim costs vLLM's scheduler, by pool size: the victim index, the old scan, vLLM's LRU.

Builds a :class:`~marconi.integrations.vllm.policy.BlockEvictionState` for a pool of N blocks (two KV
cache groups, Mamba + attention, as a Qwen3-Next / Nemotron-H layout), fills it with cached chains
of 1 .. ``--max-chain`` attention blocks each ending in a state block (so the candidates span that
many efficiency levels), releases them all to the free queue, then evicts ``--evictions`` blocks one
at a time as the plugin does, at α = 0.5 and then α = 0. Per victim it times, side by side:

* ``index``: :meth:`~marconi.integrations.vllm.policy.BlockEvictionState.next_victim` (the victim index);
* ``scan``: :func:`~marconi.integrations.vllm.policy.reference_victim`, the O(pool) numpy scan the
  index replaced (asserted to pick the same block);
* ``book``: the bookkeeping after the pick (``taken``, ``uncached``: the state and its index);

and, in the same run, vLLM's LRU on a pool of the same size: ``FreeKVCacheBlockQueue.popleft``
(its pick) and ``BlockPool.get_new_blocks(1)`` on a pool whose free blocks are all cached (its pick
and eviction). Run it in the vLLM environment for those; elsewhere the LRU columns time a stand-in,
an ``OrderedDict.popitem(last=False)`` free queue (the emulation's), and the table says so.

Times are CPU time (``process_time``: a shared machine inflates it less than a wall clock), medians:
of batches of repeated calls for the picks (neither changes the pool, so the index is timed 20 times
and the scan twice, every 5th victim) and for the LRU calls, of single calls for the bookkeeping.
Not a test; the numbers go in reports, not assertions.

    .venv-vllm/bin/python benchmarks/vllm_policy_bench.py --blocks 1000,10000,100000,1000000

Each of ``--cores`` (default ``auto,python``: the compiled core where it is built, and the
pure-Python one it is held to) gets its own state, filled alike, timed interleaved with the others.
``whole`` times pick and bookkeeping together, one ``BlockEvictionState.evict(1)`` call per victim (what
the plugin's ``get_new_blocks`` calls), in batches of 20, as vLLM's ``get_new_blocks(1)`` is timed; the
single-call columns keep a clock read per call.

The last line is one JSON object, ``{"blocks": N, "victim_ratio": x, "victim_ratio_python": y,
"core": "c"}``: the whole victim (``per victim vs LRU`` at α = 0.5: (alloc(1) + whole) / alloc(1))
against vLLM's LRU at the largest pool size asked, for the first core and then the others by
name (``{"blocks": null, "victim_ratio": null}`` with ``--blocks ""``).

``--tier-chunks 1000,14000`` adds the CPU offload tier's policies (issue 33; a 256 GB tier holds
~14,000 Nemotron-H-8B chunks): per tier size, vLLM's ``LRUCachePolicy`` and ``ARCCachePolicy`` and
Marconi's ``MarconiCachePolicy`` (``marconi_rule`` lru, a0.5m and adaptive; lru without reading the
tree's branches, ``marconi_cold_insert`` and ``marconi_second_chance`` off; and a0.5m with the
whole-tree evict it had before its victim index) are each filled with the same stream of chat-like
hybrid requests (:class:`TierWorkload`: 6 Mamba groups + 1 attention group, ``OffloadKey`` = hash +
group index, positions in vLLM's ``ReqContext``) until full and churned, then fed ``--tier-requests``
more, each through every policy in turn, timing every call vLLM's manager makes
(:class:`TierDriver`). The last line then also holds ``tier_chunks`` (the largest size) and
``tier_ratio``: per policy, its evict (median and mean), touch, insert, request end and whole
request against vLLM's LRU at that size.

    .venv-vllm/bin/python benchmarks/vllm_policy_bench.py --blocks "" --tier-chunks 1000,14000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import OrderedDict
from typing import Callable

import numpy as np

from marconi.core.model import get_model
from marconi.integrations.common.alpha import FixedAlpha
from marconi.integrations.vllm.blockcore import BLOCK_CORE_ENV
from marconi.integrations.vllm.policy import ATTENTION, MAMBA, BlockEvictionState, reference_victim
from marconi.report import format_table

BLOCK_SIZE = 384     # tokens per block (vLLM's hybrid block for Qwen3-Next-sized pages)
ALPHAS = (0.5, 0.0)

class Dial(FixedAlpha):
    """An α source the benchmark turns between phases (one pool serves every α): a FixedAlpha whose
    ``value`` the benchmark sets."""


def filled_state(num_blocks: int, max_chain: int, dial: Dial) -> tuple[BlockEvictionState, dict]:
    """A pool whose every block is cached and free: chains of 1, 2, .., ``max_chain``, 1, .. attention
    blocks, each with a state block at its end. Returns the state and block id -> (prefix, group)."""
    state = BlockEvictionState(get_model("qwen3-next-80b-a3b"), (MAMBA, ATTENTION), num_blocks, BLOCK_SIZE, dial)
    keys: dict[int, tuple[tuple[int, int], int]] = {}
    block = chain = 0
    while True:
        length = chain % max_chain + 1
        if block + length + 1 > num_blocks:
            break
        parent = None
        for depth in range(1, length + 1):
            prefix = (chain, depth)
            state.cached(block, prefix, 1, depth * BLOCK_SIZE, parent)
            keys[block] = (prefix, 1)
            parent, block = prefix, block + 1
        state.cached(block, parent, 0, length * BLOCK_SIZE, (chain, length - 1) if length > 1 else None)
        keys[block] = (parent, 0)
        block, chain = block + 1, chain + 1
    for b in keys:
        state.released(b)
    return state, keys


def num_levels(state: BlockEvictionState) -> int:
    """Distinct efficiencies among the free candidates (the index's levels in the set it searches)."""
    pool = state.free_cached & state.candidate
    return int(np.unique(state.flop_eff[pool]).size)


def batch_ns(call: Callable[[], object], repeats: int) -> float:
    """CPU ns per call of ``call``, run ``repeats`` times back to back (``process_time``: time this
    process ran, so other processes on a shared machine inflate it less than a wall clock)."""
    t0 = time.process_time_ns()
    for _ in range(repeats):
        call()
    return (time.process_time_ns() - t0) / repeats


def clock_cost_ns(samples: int = 1000) -> float:
    """Median cost of reading ``process_time_ns`` (a system call): subtracted from single-call timings."""
    costs = []
    for _ in range(samples):
        t0 = time.process_time_ns()
        costs.append(time.process_time_ns() - t0)
    return statistics.median(costs)


def evict_timed(state: BlockEvictionState, keys: dict, count: int, probe_every: int = 5) -> dict[str, list[float]]:
    """Evict ``count`` victims as the plugin does. Every ``probe_every`` victims, check the index
    picks the scan's victim and time both picks on the pool as it stands (the index 20 times, then
    the scan twice: neither changes anything). Time the bookkeeping (``taken``, ``uncached``) of
    the other victims, once each, as it happens (CPU ns less the clock's own cost; not right after a
    scan, whose numpy work slows the next few microseconds of Python by half)."""
    clock_ns = clock_cost_ns()
    times: dict[str, list[float]] = {"scan": [], "index": [], "book": []}
    for i in range(count):
        victim = state.next_victim()
        assert victim is not None
        probe = i % probe_every == 0
        if probe:
            times["index"].append(batch_ns(state.next_victim, 20))
            times["scan"].append(batch_ns(lambda: reference_victim(state), 2))
            assert victim == reference_victim(state), (victim, reference_victim(state))
        t0 = time.process_time_ns()
        state.taken(victim.block_id)
        prefix, group = keys[victim.block_id]
        state.uncached(victim.block_id, prefix, group)
        if not probe:
            times["book"].append(time.process_time_ns() - t0 - clock_ns)
    return times


def lru_timed(num_blocks: int, count: int, batch: int = 20) -> tuple[str, list[float], Callable[[], float] | None]:
    """vLLM's LRU on a pool of ``num_blocks`` whose free blocks are all cached: CPU ns per
    ``popleft`` (over ``count // batch`` batches of ``batch`` calls), and a sampler of
    ``get_new_blocks(1)``: each call times one batch of ``batch`` calls (CPU ns per call), then
    (untimed) caches the blocks again and frees them to the queue's tail, so the pool stays whole
    and every call evicts a cached block. Without vLLM, an OrderedDict free queue stands in for
    ``popleft``, and there is no sampler."""
    count = min(count, num_blocks - 1) // batch
    try:
        from vllm.v1.core.block_pool import BlockPool
        from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock, make_block_hash_with_group_id
    except ImportError:
        queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        pops = [batch_ns(lambda: queue.popitem(last=False), batch) for _ in range(count)]
        return "stand-in: OrderedDict.popitem (vLLM not importable)", pops, None
    free_queue = FreeKVCacheBlockQueue([KVCacheBlock(i) for i in range(num_blocks)])
    pops = [batch_ns(free_queue.popleft, batch) for _ in range(count)]
    pool = BlockPool(num_blocks, enable_caching=True, hash_block_size=16)

    def cache(block) -> None:
        key = make_block_hash_with_group_id(block.block_id.to_bytes(8, "little"), 0)
        block.set_block_hash(key, BLOCK_SIZE)
        pool.cached_block_hash_to_block.insert(key, block)

    for block in pool.blocks[1:]:                 # block 0 is vLLM's null block
        cache(block)

    def sample() -> float:
        got: list = []
        take = pool.get_new_blocks
        t0 = time.process_time_ns()
        for _ in range(batch):
            got += take(1)
        ns = (time.process_time_ns() - t0) / batch
        for block in got:
            cache(block)
        pool.free_blocks(got)
        return ns

    import vllm
    return f"vLLM {vllm.__version__}", pops, sample


def median_us(samples: list[float]) -> float:
    return statistics.median(samples) / 1e3


def evict_batched(state: BlockEvictionState, count: int, lru: Callable[[], float] | None,
                  batch: int = 20) -> tuple[list[float], list[float]]:
    """Evict ``count`` victims as the plugin does, pick and bookkeeping together: one
    :meth:`~marconi.integrations.vllm.policy.BlockEvictionState.evict` call per victim (the plugin
    makes one per ``get_new_blocks`` call that evicts; one victim a call is its dearest case), timed
    in batches of ``batch`` calls as vLLM's ``get_new_blocks(1)`` is, each batch followed by one
    batch of ``lru`` (:func:`lru_timed`'s sampler), so the machine's noise falls on both alike. CPU
    ns per victim and per LRU call, one sample per batch each. The single-call timings of
    :func:`evict_timed` carry a clock read per call (a system call, ~0.1-0.5 µs, subtracted as its
    median), which a compiled core's sub-microsecond work cannot bear; these are the figures the
    ratio uses."""
    samples, allocs = [], []
    evict = state.evict
    for _ in range(count // batch):
        t0 = time.process_time_ns()
        for _ in range(batch):
            evict(1)
        samples.append((time.process_time_ns() - t0) / batch)
        if lru is not None:
            allocs.append(lru())
    return samples, allocs


def measure(num_blocks: int, max_chain: int, evictions: int, cores: list[str]) -> list[dict[str, object]]:
    """Per core (``MARCONI_BLOCK_CORE`` values) and α, the rows of the table: one state per core,
    filled alike; the cores' phases interleaved per α, and each phase's whole victims with vLLM's
    ``get_new_blocks(1)``, batch by batch (its median over the phase is the row's ``alloc(1)``)."""
    dial = Dial(ALPHAS[0])
    started = time.perf_counter()
    states = {}
    before = os.environ.get(BLOCK_CORE_ENV)
    try:
        for core in cores:
            os.environ[BLOCK_CORE_ENV] = core
            states[core] = filled_state(num_blocks, max_chain, dial)
    finally:
        if before is None:
            os.environ.pop(BLOCK_CORE_ENV, None)
        else:
            os.environ[BLOCK_CORE_ENV] = before
    built_s = time.perf_counter() - started
    lru_name, pops, lru = lru_timed(num_blocks, len(ALPHAS) * evictions)
    popleft_us = median_us(pops)
    rows = []
    for alpha in ALPHAS:
        dial.value = alpha
        for core in cores:
            state, keys = states[core]
            levels = num_levels(state)
            count = min(evictions, len(keys) // (2 * len(ALPHAS)))
            times = evict_timed(state, keys, count)
            # the whole victims are cheap to time (no scan): 20 times as many, within the pool's share
            whole, allocs = evict_batched(state, min(20 * count, len(keys) // (2 * len(ALPHAS) * len(cores))), lru)
            alloc_us = median_us(allocs) if allocs else None
            scan_us, index_us, book_us = (median_us(times[k]) for k in ("scan", "index", "book"))
            whole_us = median_us(whole) if whole else index_us + book_us
            rows.append({"blocks": f"{num_blocks:,}", "alpha": f"{alpha:g}", "core": state.core, "levels": levels,
                         "lru": lru_name, "popleft": popleft_us, "alloc": alloc_us, "scan": scan_us, "index": index_us,
                         "book": book_us, "whole": whole_us,
                         "index_vs_pop": index_us / popleft_us, "scan_vs_index": scan_us / index_us,
                         "index_vs_alloc": index_us / alloc_us if alloc_us else None,
                         "cycle_vs_alloc": (index_us + book_us) / alloc_us if alloc_us else None,
                         # the whole per-victim cost: vLLM's own eviction work (the plugin still does it)
                         # plus the pick and the bookkeeping (timed in batches, as vLLM's side is), against
                         # vLLM's LRU eviction of one block
                         "victim_vs_lru": (alloc_us + whole_us) / alloc_us if alloc_us else None,
                         "victim_vs_pop": (popleft_us + whole_us) / popleft_us,
                         "built_s": built_s})
    return rows


COLUMNS = [("pool (blocks)", "blocks", None), ("α", "alpha", None), ("core", "core", None), ("levels", "levels", None),
           ("popleft", "popleft", lambda v: f"{v:.2f} µs"), ("alloc(1)", "alloc", lambda v: f"{v:.2f} µs"),
           ("scan", "scan", lambda v: f"{v:,.1f} µs"), ("index", "index", lambda v: f"{v:.2f} µs"),
           ("index/popleft", "index_vs_pop", lambda v: f"{v:.1f}×"),
           ("index/alloc(1)", "index_vs_alloc", lambda v: f"{v:.1f}×"),
           ("bookkeeping", "book", lambda v: f"{v:.1f} µs"),
           ("(index+book)/alloc(1)", "cycle_vs_alloc", lambda v: f"{v:.1f}×"),
           ("whole (batched)", "whole", lambda v: f"{v:.2f} µs"),
           ("per victim vs LRU", "victim_vs_lru", lambda v: f"{v:.1f}×"),
           ("(popleft+index+book)/popleft", "victim_vs_pop", lambda v: f"{v:.1f}×"),
           ("scan/index", "scan_vs_index", lambda v: f"{v:,.0f}×")]
LEGEND = ("popleft, alloc(1): vLLM's LRU pick (FreeKVCacheBlockQueue.popleft) and its whole eviction of one block "
          "(BlockPool.get_new_blocks(1), timed batch by batch between the row's whole victims); scan, index: the plugin's pick (old O(pool) scan, victim index); "
          "bookkeeping: taken + uncached after a pick (state and index), one clock read per call; whole: one "
          "BlockEvictionState.evict(1) per victim (pick, taken, uncached in one call, as the plugin evicts), "
          "timed in batches of 20, as alloc(1) is; per victim vs LRU: (alloc(1) + whole) / "
          "alloc(1), the plugin's whole cost of one victim (vLLM's eviction work included) against "
          "vLLM's LRU in the same run (target <= 2x at 10^6; needs vLLM, else see the popleft stand-in column); "
          "levels: efficiency levels among the free candidates; core: BlockEvictionState's core (c: compiled, "
          "python: its specification; --cores)")


# --------------------------------------------------------------------------- the CPU tier's policies
TIER_KINDS = (MAMBA,) * 6 + (ATTENTION,)     # Nemotron-H-8B's KV cache groups: 6 Mamba, 1 attention
TIER_ATTN = TIER_KINDS.index(ATTENTION)
TIER_TPC = 1152                              # tokens per offload chunk (vLLM's, for Nemotron-H-8B)
TIER_CALLS = ("touch", "pin", "store_miss", "evict", "insert", "unpin", "finish")


class TierWorkload:
    """A deterministic stream of chat-like requests over a prefix tree: sessions that share a
    2-chunk system prompt and grow 1-3 chunks a turn up to ``max_depth`` chunks (then end), picked
    mostly among the most recent; each request's chunk hashes (32 bytes, as vLLM's) and a state (every
    Mamba group) at its end. Up to ``sessions`` live sessions."""

    def __init__(self, seed: int, sessions: int, max_depth: int = 96) -> None:
        import random

        self.rng = random.Random(seed)
        self.max_sessions, self.max_depth = sessions, max_depth
        self.counter = 0
        self.system = [self._hash(), self._hash()]
        self.sessions: list[list[bytes]] = []

    def _hash(self) -> bytes:
        import hashlib

        self.counter += 1
        return hashlib.sha256(self.counter.to_bytes(8, "little")).digest()

    def next(self) -> list[bytes]:
        rng = self.rng
        if not self.sessions or (len(self.sessions) < self.max_sessions and rng.random() < 0.2):
            chain = self.system[: rng.randint(1, 2)] + [self._hash() for _ in range(rng.randint(2, 8))]
            self.sessions.append(chain)
            return list(chain)
        i = len(self.sessions) - 1 - min(int(rng.expovariate(1 / 8)), len(self.sessions) - 1) \
            if rng.random() < 0.7 else rng.randrange(len(self.sessions))
        chain = self.sessions[i]
        chain.extend(self._hash() for _ in range(rng.randint(1, 3)))
        if len(chain) >= self.max_depth:
            self.sessions.pop(i)
        return list(chain)


def tier_policies(capacity: int) -> tuple[str, dict[str, Callable[[], object]], Callable, Callable]:
    """The policies compared (name -> factory), and the chunk and request-context classes: vLLM's
    own where vLLM imports, else the emulation's stand-ins (vLLM's LRU and ARC, line for line)."""
    from marconi.core.eviction import rule_from_label
    from marconi.core.model import get_model
    from marconi.integrations.vllm.tier_settings import TierSettings, parse_tier_rule
    from marconi.integrations.vllm.tier_tree import reference_victims

    spec = get_model("nemotron-h-8b")
    try:
        import vllm
        from vllm.v1.kv_offload.base import ReqContext
        from vllm.v1.kv_offload.cpu.policies.arc import ARCCachePolicy
        from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus
        from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

        from marconi.integrations.vllm.tier import MarconiCachePolicy as Tier
        where = f"vLLM {vllm.__version__}"
        make_ctx = lambda rid: ReqContext(req_id=str(rid))   # noqa: E731
    except ImportError:
        from marconi.integrations.vllm.emulate.tier import Chunk as ChunkStatus, LRUPolicy as LRUCachePolicy
        from marconi.integrations.vllm.emulate.tier import ReqContext
        from marconi.integrations.vllm.tier_arc import ARCPolicy as ARCCachePolicy
        from marconi.integrations.vllm.tier_chooser import AdaptiveTierPolicy as Tier
        where = "stand-ins (vLLM not importable): the emulation's LRU, tier_arc's ARC, AdaptiveTierPolicy"
        make_ctx = ReqContext

    def marconi(label: str, branches: bool = True) -> Callable[[], object]:
        rule, family = parse_tier_rule(label)
        return lambda: Tier(capacity, TierSettings(TIER_KINDS, spec, TIER_TPC, rule, family=family,
                                                   cold_insert=branches, second_chance=branches))

    class WholeTree(Tier):                                   # type: ignore[misc, valid-type]
        """The tier policy with the evict it had before its victim index (the whole tree judged per
        call: ``reference_victims``), switched on for the timed requests only (same victims)."""

        whole_tree = False

        def evict(self, n, protected):
            if not self.whole_tree:
                return super().evict(n, protected)
            chosen = reference_victims(self, n, protected)
            if chosen is None:
                return None
            out = []
            for key, reason in chosen:
                out.append((key, self.get(key)))
                self.remove(key)
                self.eviction_counts[reason] += 1
            return out

    whole = lambda: WholeTree(capacity, TierSettings(TIER_KINDS, spec, TIER_TPC, rule_from_label("a0.5m")))  # noqa: E731
    factories = {"vLLM LRU": lambda: LRUCachePolicy(capacity), "vLLM ARC": lambda: ARCCachePolicy(capacity),
                 "marconi lru": marconi("lru"), "marconi lru, no branch reading": marconi("lru", branches=False),
                 "marconi a0.5m": marconi("a0.5m"),
                 "marconi adaptive": marconi("adaptive"), "a0.5m whole-tree evict": whole}
    return where, factories, ChunkStatus, make_ctx


class TierDriver:
    """One policy fed as vLLM's ``CPUOffloadingManager`` feeds it, one request at a time: lookup
    (the deepest chunk with every attention chunk up to it and its state held and ready), ``touch``
    and pins of the loaded chunks, ``on_store_miss``, ``evict`` of what the store needs beyond the
    free chunks (the offered keys protected), ``insert`` per miss, the store's and the load's
    completion (``mark_evictable``) and ``on_request_finished``. Each call's CPU ns is recorded
    when ``timed`` (the per-chunk calls as one batch per request, divided by their count)."""

    def __init__(self, policy: object, capacity: int, chunk_cls: Callable, make_ctx: Callable, clock_ns: float) -> None:
        self.p, self.capacity, self.chunk_cls, self.make_ctx = policy, capacity, chunk_cls, make_ctx
        self.held = 0
        self.next_id = 0
        self.clock_ns = clock_ns
        self.times: dict[str, list[float]] = {c: [] for c in TIER_CALLS}
        self.per_request: list[float] = []
        self.victims = 0
        self.evict_calls = 0

    def request(self, chain: list[bytes], rid: int, timed: bool) -> None:
        p, clock = self.p, time.process_time_ns
        ctx = self.make_ctx(rid)
        keys_at = []
        for i, h in enumerate(chain, start=1):
            here = [h + TIER_ATTN.to_bytes(4, "big")]
            if i == len(chain):
                here += [h + g.to_bytes(4, "big") for g in range(len(TIER_KINDS)) if g != TIER_ATTN]
            for key in here:
                ctx.set_offload_key_position(key, i * TIER_TPC)
            keys_at.append(here)
        hit = 0
        for d, h in enumerate(chain, start=1):
            chunk = p.get(h + TIER_ATTN.to_bytes(4, "big"))
            if chunk is None or chunk.ref_cnt < 0:
                break
            if all((c := p.get(h + g.to_bytes(4, "big"))) is not None and c.ref_cnt >= 0
                   for g in range(len(TIER_KINDS))):
                hit = d
        load = [k for i in range(hit) for k in keys_at[i][:1]]
        if hit:
            load += [chain[hit - 1] + g.to_bytes(4, "big") for g in range(len(TIER_KINDS)) if g != TIER_ATTN]
        offer = [k for i in range(hit, len(chain)) for k in keys_at[i]]
        cost: dict[str, float] = {}
        if load:
            t0 = clock()
            p.touch(load, ctx)
            t1 = clock()
            for k in load:
                chunk = p.get(k)
                if chunk.ref_cnt == 0:
                    p.mark_non_evictable(k)
                chunk.ref_cnt += 1
            t2 = clock()
            cost["touch"], cost["pin"] = (t1 - t0 - self.clock_ns, (t2 - t1 - self.clock_ns) / len(load))
        misses = [k for k in offer if p.get(k) is None]
        stored = []
        if misses:
            t0 = clock()
            p.on_store_miss(misses, ctx)
            cost["store_miss"] = clock() - t0 - self.clock_ns
            need = len(misses) - (self.capacity - self.held)
            ok = True
            if need > 0:
                t0 = clock()
                out = p.evict(need, set(offer))
                cost["evict"] = clock() - t0 - self.clock_ns
                ok = out is not None
                if ok:
                    self.held -= len(out)
                    if timed:
                        self.victims += len(out)
                        self.evict_calls += 1
            if ok:
                chunks = [self.chunk_cls(self.next_id + j) for j in range(len(misses))]
                self.next_id += len(misses)
                t0 = clock()
                for k, c in zip(misses, chunks):
                    p.insert(k, c)
                cost["insert"] = (clock() - t0 - self.clock_ns) / len(misses)
                self.held += len(misses)
                stored = misses
        done = stored + load
        if done:
            t0 = clock()
            for k in stored:                               # the store completes (ref_cnt -1 -> 0)
                p.get(k).ref_cnt = 0
                p.mark_evictable(k)
            for k in load:                                 # the load completes
                chunk = p.get(k)
                chunk.ref_cnt -= 1
                if chunk.ref_cnt == 0:
                    p.mark_evictable(k)
            cost["unpin"] = (clock() - t0 - self.clock_ns) / len(done)
        groups: dict[int, list[bytes]] = {}
        for here in keys_at:
            for k in here:
                groups.setdefault(int.from_bytes(k[-4:], "big"), []).append(k)
        t0 = clock()
        p.on_request_finished(tuple(tuple(v) for _, v in sorted(groups.items())), set(stored), set(load), ctx)
        cost["finish"] = clock() - t0 - self.clock_ns
        if timed:
            for name, ns in cost.items():
                self.times[name].append(ns)
            whole = cost.get("touch", 0) + cost.get("store_miss", 0) + cost.get("evict", 0) + cost.get("finish", 0)
            whole += cost.get("pin", 0) * len(load) + cost.get("insert", 0) * len(stored)
            whole += cost.get("unpin", 0) * len(done)
            self.per_request.append(whole)


def tier_measure(capacity: int, requests: int, warmup: float, seed: int = 0) -> tuple[str, list[dict[str, object]]]:
    """Fill a tier of ``capacity`` chunks under each policy with the same request stream, churn
    ``warmup`` x capacity more chunk stores, then time ``requests`` more, each through every policy
    in turn (the order rotating per request). Returns where the policies came from and one row each."""
    import gc

    where, factories, chunk_cls, make_ctx = tier_policies(capacity)
    clock_ns = clock_cost_ns()
    drivers = {name: TierDriver(make(), capacity, chunk_cls, make_ctx, clock_ns) for name, make in factories.items()}
    work = TierWorkload(seed, sessions=max(8, capacity // 30))
    started = time.perf_counter()
    first = drivers["vLLM LRU"]
    rid, churn = 0, 0
    while first.held < capacity or churn < warmup * capacity:
        chain = work.next()
        before = first.next_id
        for d in drivers.values():
            d.request(chain, rid, timed=False)
        if first.held >= capacity:
            churn += first.next_id - before
        rid += 1
    fill_s = time.perf_counter() - started
    for d in drivers.values():
        if hasattr(d.p, "whole_tree"):
            d.p.whole_tree = True
    names = list(drivers)
    gc.collect()
    for r in range(requests):
        chain = work.next()
        for name in names[r % len(names):] + names[: r % len(names)]:
            drivers[name].request(chain, rid, timed=True)
        rid += 1
    rows = []
    base = drivers["vLLM LRU"]
    med = lambda xs: statistics.median(xs) / 1e3 if xs else float("nan")   # noqa: E731
    mean = lambda xs: statistics.fmean(xs) / 1e3 if xs else float("nan")   # noqa: E731
    for name, d in drivers.items():
        row: dict[str, object] = {"chunks": f"{capacity:,}", "policy": name, "held": d.p.num_held() if hasattr(d.p, "num_held") else d.held}
        for call in TIER_CALLS:
            row[call] = med(d.times[call])
        row["evict_mean"] = mean(d.times["evict"])
        row["per_victim"] = sum(d.times["evict"]) / 1e3 / d.victims if d.victims else float("nan")
        row["request"] = mean(d.per_request)
        for call in ("evict", "touch", "insert", "finish"):
            row[f"{call}_x"] = row[call] / med(base.times[call])
        row["evict_mean_x"] = row["evict_mean"] / mean(base.times["evict"])
        row["request_x"] = row["request"] / mean(base.per_request)
        row["fill_s"] = fill_s
        rows.append(row)
    return where, rows


TIER_COLUMNS = [("tier (chunks)", "chunks", None), ("policy", "policy", None),
                ("evict (median)", "evict", lambda v: f"{v:,.1f} µs"), ("evict (mean)", "evict_mean", lambda v: f"{v:,.1f} µs"),
                ("per victim", "per_victim", lambda v: f"{v:,.2f} µs"),
                ("touch", "touch", lambda v: f"{v:,.1f} µs"), ("insert", "insert", lambda v: f"{v:.2f} µs"),
                ("pin", "pin", lambda v: f"{v:.2f} µs"), ("unpin", "unpin", lambda v: f"{v:.2f} µs"),
                ("store miss", "store_miss", lambda v: f"{v:,.1f} µs"), ("request end", "finish", lambda v: f"{v:,.1f} µs"),
                ("per request (mean)", "request", lambda v: f"{v:,.0f} µs"),
                ("evict/LRU", "evict_x", lambda v: f"{v:,.1f}×"), ("evict mean/LRU", "evict_mean_x", lambda v: f"{v:,.1f}×"),
                ("touch/LRU", "touch_x", lambda v: f"{v:,.1f}×"), ("insert/LRU", "insert_x", lambda v: f"{v:,.1f}×"),
                ("request end/LRU", "finish_x", lambda v: f"{v:,.1f}×"), ("per request/LRU", "request_x", lambda v: f"{v:,.1f}×")]
TIER_LEGEND = ("CPU time per call (process_time, the clock's own cost subtracted), medians over the timed requests "
               "unless marked mean; insert, pin (mark_non_evictable at a load), unpin (mark_evictable when a store or "
               "load completes) per chunk; evict per call (vLLM's one call per store that needs room) and per victim; "
               "per request: every call one request made, summed, mean; /LRU: against vLLM's LRUCachePolicy in the "
               "same run. 'a0.5m whole-tree evict': the tier policy at a0.5m with the evict it had before its victim "
               "index (same victims)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", default="1000,10000,100000,1000000",
                        help="pool sizes, comma-separated (empty: skip the pool's section)")
    parser.add_argument("--evictions", type=int, default=300, help="victims timed per α")
    parser.add_argument("--cores", default="auto,python",
                        help="BlockEvictionState cores to time side by side (MARCONI_BLOCK_CORE values: auto, c, "
                             "python); the first gives victim_ratio, the others victim_ratio_<core>")
    parser.add_argument("--max-chain", type=int, default=16, help="chains of 1 .. this many attention blocks")
    parser.add_argument("--tier-chunks", default="",
                        help="CPU tier sizes in chunks, comma-separated (e.g. 1000,14000): time the tier policies")
    parser.add_argument("--tier-requests", type=int, default=300, help="requests timed per tier size")
    parser.add_argument("--tier-warmup", type=float, default=0.5,
                        help="chunk stores after the tier first fills, before timing, as a fraction of its size")
    args = parser.parse_args(argv)
    blocks = [int(x) for x in args.blocks.split(",") if x.strip()]
    cores = [x.strip() for x in args.cores.split(",") if x.strip()]
    if not cores or any(c not in ("auto", "c", "python") for c in cores):
        parser.error(f"--cores {args.cores!r}: a comma-separated list of auto, c, python")
    tiers = [int(x) for x in args.tier_chunks.split(",") if x.strip()]
    if not blocks and not tiers:
        parser.error("--blocks and --tier-chunks are both empty: nothing to time")
    rows = []
    for n in blocks:
        rows.extend(measure(n, args.max_chain, args.evictions, cores))
        print(f"{n:,} blocks done (built in {rows[-1]['built_s']:.1f} s)", file=sys.stderr, flush=True)
    if rows:
        print(f"LRU: {rows[0]['lru']}; CPU time per call, medians (picks and LRU over batches of repeated calls)")
        print(LEGEND)
        print(format_table(rows, COLUMNS))
    tier_rows = []
    for n in tiers:
        where, got = tier_measure(n, args.tier_requests, args.tier_warmup)
        tier_rows.extend(got)
        print(f"{n:,} tier chunks done (filled in {got[0]['fill_s']:.1f} s)", file=sys.stderr, flush=True)
    if tier_rows:
        print(f"\nCPU tier policies ({where}); Nemotron-H-8B groups (6 Mamba + 1 attention), {TIER_TPC}-token "
              f"chunks; {args.tier_requests} requests timed per size, interleaved")
        print(TIER_LEGEND)
        print(format_table(tier_rows, TIER_COLUMNS))
    # The line a script reads (the last): the whole victim against vLLM's LRU at the largest size, at
    # the default α (0.5); the popleft stand-in's ratio where vLLM is not importable. With tier sizes:
    # each tier policy's costs against vLLM's LRUCachePolicy at the largest tier size.
    line: dict[str, object] = {"blocks": None, "victim_ratio": None}
    if rows:
        largest = max(int(r["blocks"].replace(",", "")) for r in rows)
        at = [r for r in rows if int(r["blocks"].replace(",", "")) == largest and r["alpha"] == f"{ALPHAS[0]:g}"]
        line = {"blocks": largest}
        for i, row in enumerate(at):          # one row per core, in --cores order: the first is victim_ratio
            ratio = row["victim_vs_lru"] if row["victim_vs_lru"] is not None else row["victim_vs_pop"]
            line["victim_ratio" if i == 0 else f"victim_ratio_{row['core']}"] = round(ratio, 3)
        line["core"] = at[0]["core"]
    if tier_rows:
        largest = max(tiers)
        line["tier_chunks"] = largest
        line["tier_ratio"] = {r["policy"]: {k: round(r[f"{k}_x"], 3) for k in ("evict", "evict_mean", "touch", "insert",
                                                                                 "finish", "request")}
                              for r in tier_rows if r["chunks"] == f"{largest:,}" and r["policy"] != "vLLM LRU"}
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
