"""What one Marconi victim costs vLLM's scheduler, by pool size: the plugin's block ranking alone.

Builds a :class:`~marconi.integrations.vllm.policy.BlockEvictionState` for a pool of N blocks (two KV cache
groups, Mamba + attention, as a Qwen3-Next / Nemotron-H layout), fills it with cached chains of 8
attention blocks ending in a state block, releases them all to the free queue, then evicts
``--evictions`` blocks one at a time as the plugin does (``next_victim``, ``taken``, ``uncached``)
and prints microseconds per victim, fixed α and α = 0, fastest of ``--repeats``. vLLM's own LRU pops
the head of a linked list (O(1)); the plugin ranks every free cached block per victim (O(N) numpy),
which is what this measures. Not a test.

    python benchmarks/vllm_policy_bench.py --blocks 1000,10000,100000
"""

from __future__ import annotations

import argparse
import sys
import time

from marconi.core.model import get_model
from marconi.report import format_table
from marconi.integrations.common.alpha import FixedAlpha
from marconi.integrations.vllm.policy import ATTENTION, MAMBA, BlockEvictionState

CHAIN = 8            # attention blocks per cached chain; one state block at its end


def filled_state(num_blocks: int, alpha: float, block_size: int = 384) -> tuple[BlockEvictionState, dict]:
    """A pool whose every block is cached and free: chains of CHAIN attention blocks + 1 state."""
    state = BlockEvictionState(get_model("qwen3-next-80b-a3b"), (MAMBA, ATTENTION), num_blocks, block_size,
                               FixedAlpha(alpha))
    keys: dict[int, tuple[tuple[int, int], int]] = {}       # block id -> (prefix, group)
    block = chain = 0
    while block + CHAIN + 1 <= num_blocks:
        parent = None
        for depth in range(1, CHAIN + 1):
            prefix = (chain, depth)
            state.cached(block, prefix, 1, depth * block_size, parent)
            keys[block] = (prefix, 1)
            parent, block = prefix, block + 1
        state.cached(block, parent, 0, CHAIN * block_size, (chain, CHAIN - 1))
        keys[block] = (parent, 0)
        block, chain = block + 1, chain + 1
    for b in keys:
        state.released(b)
    return state, keys


def evict(state: BlockEvictionState, keys: dict, count: int) -> float:
    """Seconds to pick and remove ``count`` victims, one at a time."""
    started = time.perf_counter()
    for _ in range(count):
        victim = state.next_victim()
        assert victim is not None
        state.taken(victim.block_id)
        prefix, group = keys[victim.block_id]
        state.uncached(victim.block_id, prefix, group)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", default="1000,10000,100000", help="pool sizes, comma-separated")
    parser.add_argument("--evictions", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    rows = []
    for n in (int(x) for x in args.blocks.split(",")):
        row: dict[str, object] = {"blocks": f"{n:,}"}
        for alpha in (0.5, 0.0):
            best = float("inf")
            for _ in range(args.repeats):
                state, keys = filled_state(n, alpha)
                best = min(best, evict(state, keys, min(args.evictions, len(keys))))
            row[f"a{alpha:g}"] = f"{1e6 * best / min(args.evictions, n):,.0f} µs"
        rows.append(row)
        print(f"{n:,} blocks done", file=sys.stderr, flush=True)
    print(format_table(rows, [("pool (blocks)", "blocks", None), ("per victim, α=0.5", "a0.5", None),
                              ("per victim, α=0", "a0", None)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
