"""A randomised driver of one vLLM ``BlockPool`` with the plugin's hooks, checked after every step.

Run in a vLLM environment (``tests/test_vllm_pool_driver.py`` does, on 0.32 and the 0.33 overlay)::

    python tests/vllm_peer/pool_driver.py --mode marconi --steps 400 --seed 0

Requests are chains of 16-token blocks drawn from a random prefix tree (deep shared trunks and
short one-off prompts), admitted as vLLM's KV cache manager admits them (hits touched, the rest
taken with ``get_new_blocks``, full blocks cached) and finished (blocks freed tail first). The pool
is small, so nearly every admission evicts; deep trunks are released early, so LRU evicts them
while Marconi, preferring to keep deep prefixes, picks other blocks: the choices differ. After
every step :func:`pool_checks.check_pool` recomputes ref counts (against the references the driver
holds), the free queue, the hash map and the plugin's index. Prints one JSON line of counts.

With ``--twin`` (``lru`` mode: the plugin evicts as vLLM does) a stock ``BlockPool`` takes the same
calls beside it, and after every step the two must be the same pool: the free queue's order, each
block's ``ref_cnt`` and hash, the hash map. The twin's requests also pass vLLM's null block to
``touch`` and ``free_blocks`` (as Mamba and sliding-window groups do) and a mask to
``cache_full_blocks``. With ``--scale N`` a block is N hash blocks: requests may end inside their
last block (``cache_partial_block``), grow (a deeper partial entry) and fill it (promotion). The
hooks re-implement these four methods, and this is where they must not differ from vLLM's own.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pool_checks import cached_keys, check_pool, count_choices, make_hooks  # noqa: E402

BLOCK = 16
MODES = {"lru": {"MARCONI_VLLM_POLICY": "lru"},
         "marconi": {"MARCONI_VLLM_POLICY": "marconi", "MARCONI_VLLM_ALPHA": "2.0"}}
# No adaptive mode: its shadow cache needs room for one SSM state of the model, more than this pool.


def _hashes(tokens: list[int]) -> list[bytes]:
    out, parent = [], b""
    for i in range(len(tokens) // BLOCK):
        parent = hashlib.sha256(parent + bytes(str(tokens[i * BLOCK:(i + 1) * BLOCK]), "ascii")).digest()
        out.append(parent)
    return out


def build(mode: str, num_blocks: int, block: int = BLOCK) -> Any:
    from vllm.v1.core.block_pool import BlockPool

    from marconi.core.model import ModelSpec
    from marconi.integrations.vllm.config import PluginConfig
    from marconi.integrations.vllm.policy import ATTENTION

    import marconi

    config_path = Path(marconi.__file__).parent / "data" / "configs" / "nemotron-h-8b" / "config.json"
    spec = ModelSpec.from_hf_config(json.loads(config_path.read_text()), name="nemotron-h-8b")
    pool = BlockPool(num_gpu_blocks=num_blocks, enable_caching=True, hash_block_size=BLOCK)
    manager = SimpleNamespace(block_pool=pool, record_prefix_cache_stats=lambda request, num_hits: None,
                              allocate_slots=lambda *args, **kwargs: None)
    hooks = make_hooks(manager, [ATTENTION], spec, block, PluginConfig.from_env(MODES[mode]))
    hooks._install()
    return hooks


def same_pool(pool: Any, twin: Any) -> None:
    """Raise AssertionError where ``pool`` (hooked) and ``twin`` (stock) are not the same pool."""
    ids = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
    assert ids == [b.block_id for b in twin.free_block_queue.get_all_free_blocks()], "free queues differ"
    for block, other in zip(pool.blocks, twin.blocks, strict=True):
        assert (block.ref_cnt, block.block_hash, block.block_hash_num_tokens) == \
            (other.ref_cnt, other.block_hash, other.block_hash_num_tokens), f"block {block.block_id} differs"
    assert sorted(cached_keys(pool)) == sorted(cached_keys(twin)), "hash maps differ"


def drive(mode: str, steps: int, seed: int, num_blocks: int = 48, twin: bool = False,
          scale: int = 1) -> dict[str, int]:
    """Drive a hooked pool for ``steps`` steps (see the module's docstring); ``scale``: the group's
    block is ``scale`` hash blocks (a request's last, partial block then gets a partial entry, and
    a running request may grow until that block is full and promoted)."""
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

    rng = random.Random(seed)
    block = BLOCK * scale
    hooks = build(mode, num_blocks, block)
    pool = hooks.pool
    stock = BlockPool(num_gpu_blocks=num_blocks, enable_caching=True, hash_block_size=BLOCK) if twin else None

    def both(method: str, *args: Any) -> Any:
        """``pool.method(*args)``, and the same call on the stock twin (its own blocks), whose result
        must name the same blocks."""
        got = getattr(pool, method)(*args)
        if stock is not None:
            def twin_of(b: Any) -> Any:
                return stock.null_block if b.is_null else stock.blocks[b.block_id]

            mirror = [[twin_of(b) for b in a] if isinstance(a, list) and a and hasattr(a[0], "block_id")
                      else twin_of(a) if hasattr(a, "block_id") else a for a in args]
            other = getattr(stock, method)(*mirror)
            if isinstance(got, list):
                assert [b.block_id for b in got] == [b.block_id for b in other], f"{method} differs"
            else:
                assert got == other, f"{method} differs: {got!r}, {other!r}"
        return got

    counts = {"steps": 0, "admitted": 0, "finished": 0, "hit_blocks": 0, "victims": 0, "victims_not_lru": 0,
              "partial": 0, "promoted": 0}
    count_choices(hooks, counts)
    trunks = [[rng.randrange(32000) for _ in range(block * rng.randint(6, 14))] for _ in range(3)]
    running: list[tuple[Any, list[Any], list[int]]] = []
    held: dict[int, int] = {}
    null = [pool.null_block] if twin else []
    for step in range(steps):
        grow = [r for r in running if len(r[2]) // BLOCK % scale] if scale > 1 else []
        if grow and rng.random() < 0.25:           # a running request's partial last block grows
            request, blocks, tokens = rng.choice(grow)
            done = len(tokens) // block
            room = scale - len(tokens) // BLOCK % scale              # hash blocks until the block is full
            tokens += [rng.randrange(32000) for _ in range(BLOCK * rng.randint(1, room))]
            request.block_hashes = _hashes(tokens)
            if len(tokens) % block:                # still partial: a deeper partial entry
                both("cache_partial_block", request, blocks[-1], len(tokens), 0, block, twin and rng.random() < 0.3)
                counts["partial"] += 1
            else:                                  # full: promoted
                both("cache_full_blocks", request, blocks, done, len(tokens) // block, block, 0)
                counts["promoted"] += 1
        elif running and (rng.random() < 0.45 or len(running) > 3):
            _, blocks, _ = running.pop(rng.randrange(len(running)))
            both("free_blocks", list(reversed(blocks + null)))
            for b in blocks:
                held[b.block_id] -= 1
            counts["finished"] += 1
        else:
            base = rng.choice(trunks)[:block * rng.randint(2, 14)] if rng.random() < 0.6 else []
            tokens = base + [rng.randrange(32000) for _ in range(block * rng.randint(1, 4))]
            if scale > 1 and rng.random() < 0.5:    # ends inside a block
                tokens += [rng.randrange(32000) for _ in range(BLOCK * rng.randint(1, scale - 1))]
            request = SimpleNamespace(request_id=f"r{step}", block_hashes=_hashes(tokens))
            full = request.block_hashes[scale - 1::scale]            # vLLM's view at the group's block size
            hits = []
            for block_hash in full:
                found = pool.get_cached_block(block_hash, [0])
                if found is None:
                    break
                hits.append(found[0])
            if stock is not None:
                stock_hits = [stock.get_cached_block(h, [0]) for h in full[:len(hits)]]
                assert [f[0].block_id for f in stock_hits if f] == [b.block_id for b in hits], "hits differ"
            need = -(-len(tokens) // block) - len(hits)
            if need > pool.get_num_free_blocks() - sum(1 for b in hits if b.ref_cnt == 0):
                continue
            both("touch", hits + null)
            blocks = hits + both("get_new_blocks", need)
            mask = [rng.random() < 0.8 for _ in range(len(full) - len(hits))] if twin and rng.random() < 0.3 else None
            both("cache_full_blocks", request, blocks, len(hits), len(full), block, 0, mask)
            if len(tokens) % block:
                both("cache_partial_block", request, blocks[-1], len(tokens) // BLOCK * BLOCK, 0, block,
                     twin and rng.random() < 0.2)
                counts["partial"] += 1
            for b in blocks:
                held[b.block_id] = held.get(b.block_id, 0) + 1
            running.append((request, blocks, tokens))
            counts["admitted"] += 1
            counts["hit_blocks"] += len(hits)
            assert all(pool.cached_block_hash_to_block.get_one_block(make_block_hash_with_group_id(h, 0))
                       is not None for i, h in enumerate(full) if mask is None or i < len(hits) or mask[i - len(hits)])
        check_pool(hooks, held)
        if stock is not None:
            same_pool(pool, stock)
        counts["steps"] += 1
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=sorted(MODES), default="marconi")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--twin", action="store_true", help="drive a stock pool beside it (lru mode) and compare")
    parser.add_argument("--scale", type=int, default=1, help="hash blocks per block (2 and more: partial entries)")
    args = parser.parse_args()
    if args.twin and args.mode != "lru":
        parser.error("--twin needs --mode lru: only there must the two pools stay the same")
    import vllm

    counts = drive(args.mode, args.steps, args.seed, twin=args.twin, scale=args.scale)
    print(json.dumps({"vllm": vllm.__version__, "mode": args.mode, "twin": args.twin, **counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
