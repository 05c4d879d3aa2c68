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

The last line is one JSON object, ``{"blocks": N, "victim_ratio": x}``: the whole victim against
vLLM's LRU (``per victim vs LRU`` at α = 0.5) at the largest pool size asked.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import OrderedDict
from typing import Callable

import numpy as np

from marconi.core.model import get_model
from marconi.integrations.common.alpha import FixedAlpha
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


def lru_timed(num_blocks: int, count: int, batch: int = 20) -> tuple[str, list[float], list[float] | None]:
    """vLLM's LRU on a pool of ``num_blocks`` whose free blocks are all cached: CPU ns per
    ``popleft`` and per ``get_new_blocks(1)`` (over batches of ``batch`` calls). Without vLLM, an
    OrderedDict free queue stands in for ``popleft``, and there is no ``get_new_blocks``."""
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
    for block in pool.blocks[1:]:                 # block 0 is vLLM's null block
        key = make_block_hash_with_group_id(block.block_id.to_bytes(8, "little"), 0)
        block.set_block_hash(key, BLOCK_SIZE)
        pool.cached_block_hash_to_block.insert(key, block)
    allocs = [batch_ns(lambda: pool.get_new_blocks(1), batch) for _ in range(count)]
    import vllm
    return f"vLLM {vllm.__version__}", pops, allocs


def median_us(samples: list[float]) -> float:
    return statistics.median(samples) / 1e3


def measure(num_blocks: int, max_chain: int, evictions: int) -> list[dict[str, object]]:
    dial = Dial(ALPHAS[0])
    started = time.perf_counter()
    state, keys = filled_state(num_blocks, max_chain, dial)
    built_s = time.perf_counter() - started
    lru_name, pops, allocs = lru_timed(num_blocks, len(ALPHAS) * evictions)
    popleft_us, alloc_us = median_us(pops), (median_us(allocs) if allocs else None)
    rows = []
    for alpha in ALPHAS:
        dial.value = alpha
        levels = num_levels(state)
        times = evict_timed(state, keys, min(evictions, len(keys) // len(ALPHAS)))
        scan_us, index_us, book_us = (median_us(times[k]) for k in ("scan", "index", "book"))
        rows.append({"blocks": f"{num_blocks:,}", "alpha": f"{alpha:g}", "levels": levels, "lru": lru_name,
                     "popleft": popleft_us, "alloc": alloc_us, "scan": scan_us, "index": index_us, "book": book_us,
                     "index_vs_pop": index_us / popleft_us, "scan_vs_index": scan_us / index_us,
                     "index_vs_alloc": index_us / alloc_us if alloc_us else None,
                     "cycle_vs_alloc": (index_us + book_us) / alloc_us if alloc_us else None,
                     # the whole per-victim cost: vLLM's own eviction work (the plugin still does it) plus
                     # the pick and the bookkeeping, against vLLM's LRU eviction of one block
                     "victim_vs_lru": (alloc_us + index_us + book_us) / alloc_us if alloc_us else None,
                     "victim_vs_pop": (popleft_us + index_us + book_us) / popleft_us,
                     "built_s": built_s})
    return rows


COLUMNS = [("pool (blocks)", "blocks", None), ("α", "alpha", None), ("levels", "levels", None),
           ("popleft", "popleft", lambda v: f"{v:.2f} µs"), ("alloc(1)", "alloc", lambda v: f"{v:.2f} µs"),
           ("scan", "scan", lambda v: f"{v:,.1f} µs"), ("index", "index", lambda v: f"{v:.2f} µs"),
           ("index/popleft", "index_vs_pop", lambda v: f"{v:.1f}×"),
           ("index/alloc(1)", "index_vs_alloc", lambda v: f"{v:.1f}×"),
           ("bookkeeping", "book", lambda v: f"{v:.1f} µs"),
           ("(index+book)/alloc(1)", "cycle_vs_alloc", lambda v: f"{v:.1f}×"),
           ("per victim vs LRU", "victim_vs_lru", lambda v: f"{v:.1f}×"),
           ("(popleft+index+book)/popleft", "victim_vs_pop", lambda v: f"{v:.1f}×"),
           ("scan/index", "scan_vs_index", lambda v: f"{v:,.0f}×")]
LEGEND = ("popleft, alloc(1): vLLM's LRU pick (FreeKVCacheBlockQueue.popleft) and its whole eviction of one block "
          "(BlockPool.get_new_blocks(1)); scan, index: the plugin's pick (old O(pool) scan, victim index); "
          "bookkeeping: taken + uncached after a pick (state and index); per victim vs LRU: (alloc(1) + index + "
          "bookkeeping) / alloc(1), the plugin's whole cost of one victim (vLLM's eviction work included) against "
          "vLLM's LRU in the same run (target <= 2x at 10^6; needs vLLM, else see the popleft stand-in column); "
          "levels: efficiency levels among the free candidates")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", default="1000,10000,100000,1000000", help="pool sizes, comma-separated")
    parser.add_argument("--evictions", type=int, default=300, help="victims timed per α")
    parser.add_argument("--max-chain", type=int, default=16, help="chains of 1 .. this many attention blocks")
    args = parser.parse_args(argv)
    rows = []
    for n in (int(x) for x in args.blocks.split(",")):
        rows.extend(measure(n, args.max_chain, args.evictions))
        print(f"{n:,} blocks done (built in {rows[-1]['built_s']:.1f} s)", file=sys.stderr, flush=True)
    print(f"LRU: {rows[0]['lru']}; CPU time per call, medians (picks and LRU over batches of repeated calls)")
    print(LEGEND)
    print(format_table(rows, COLUMNS))
    # The line a script reads (the last): the whole victim against vLLM's LRU at the largest size, at
    # the default α (0.5); the popleft stand-in's ratio where vLLM is not importable.
    largest = max(int(r["blocks"].replace(",", "")) for r in rows)
    row = next(r for r in rows if int(r["blocks"].replace(",", "")) == largest and r["alpha"] == f"{ALPHAS[0]:g}")
    ratio = row["victim_vs_lru"] if row["victim_vs_lru"] is not None else row["victim_vs_pop"]
    print(json.dumps({"blocks": largest, "victim_ratio": round(ratio, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
