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

from pool_checks import check_pool, count_choices, make_hooks  # noqa: E402

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


def build(mode: str, num_blocks: int) -> Any:
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
    hooks = make_hooks(manager, [ATTENTION], spec, BLOCK, PluginConfig.from_env(MODES[mode]))
    hooks._install()
    return hooks


def drive(mode: str, steps: int, seed: int, num_blocks: int = 48) -> dict[str, int]:
    from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

    rng = random.Random(seed)
    hooks = build(mode, num_blocks)
    pool, state = hooks.pool, hooks.state
    counts = {"steps": 0, "admitted": 0, "finished": 0, "hit_blocks": 0, "victims": 0, "victims_not_lru": 0}
    count_choices(hooks, counts)
    trunks = [[rng.randrange(32000) for _ in range(BLOCK * rng.randint(6, 14))] for _ in range(3)]
    running: list[tuple[Any, list[Any]]] = []
    held: dict[int, int] = {}
    for step in range(steps):
        if running and (rng.random() < 0.45 or len(running) > 3):
            _, blocks = running.pop(rng.randrange(len(running)))
            pool.free_blocks(reversed(blocks))
            for block in blocks:
                held[block.block_id] -= 1
            counts["finished"] += 1
        else:
            base = rng.choice(trunks)[:BLOCK * rng.randint(2, 14)] if rng.random() < 0.6 else []
            tokens = base + [rng.randrange(32000) for _ in range(BLOCK * rng.randint(1, 4))]
            request = SimpleNamespace(request_id=f"r{step}", block_hashes=_hashes(tokens))
            hits = []
            for block_hash in request.block_hashes:
                found = pool.get_cached_block(block_hash, [0])
                if found is None:
                    break
                hits.append(found[0])
            need = len(request.block_hashes) - len(hits)
            if need > pool.get_num_free_blocks() - sum(1 for b in hits if b.ref_cnt == 0):
                continue
            pool.touch(hits)
            blocks = hits + pool.get_new_blocks(need)
            pool.cache_full_blocks(request, blocks, len(hits), len(blocks), BLOCK, 0)
            for block in blocks:
                held[block.block_id] = held.get(block.block_id, 0) + 1
            running.append((request, blocks))
            counts["admitted"] += 1
            counts["hit_blocks"] += len(hits)
            assert all(pool.cached_block_hash_to_block.get_one_block(make_block_hash_with_group_id(h, 0))
                       is not None for h in request.block_hashes)
        check_pool(hooks, held)
        counts["steps"] += 1
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=sorted(MODES), default="marconi")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import vllm

    print(json.dumps({"vllm": vllm.__version__, "mode": args.mode, **drive(args.mode, args.steps, args.seed)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
