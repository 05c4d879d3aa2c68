"""The replay driver against hand-made traces whose answer SGLang's scheduler code fixes (issue 23).

``no_buffer`` keeps a Mamba state where a prefill ends (``checkpoint_kv_cache``) and where a request
finishes (``prompt + output[:-1]``: the last sampled token is never fed back), nowhere else. The match
is capped at ``len(prompt) - 1``. Every KV slot is either free or held by the tree after each request
(the tree frees its own duplicates; the driver once freed them a second time).
"""

from __future__ import annotations

import json

from sglang_env import run_in_sglang

_SCRIPT = r"""
import json
from marconi.integrations.sglang.replay import RadixReplay

r = RadixReplay(1000, 8)
rows = []
def serve(prompt, output):
    hit, kv_only = r.serve(prompt, output)
    r.sanity_check()
    rows.append({"hit": hit, "kv_only": kv_only, "kv": r.kv_in_use(),
                 "states": int(r.cache.mamba_evictable_size()),
                 "mamba_free": int(r.req_pool.mamba_allocator.available_size())})

A = list(range(1, 101)); out = list(range(1000, 1010))
serve(A, out)                                      # cold: states at 100 and 109
serve(A[:50] + list(range(2000, 2050)), [7])       # shares 50 KVs, no state there
serve(A + list(range(3000, 3020)), [8])            # extends A's prompt: the prefill state
serve(A + out + [5], [9])                          # extends A + output: the finish state at 109
serve(A, out)                                      # A again: capped at 99, no state at or below it
small = RadixReplay(130, 8)                        # a pool that must evict
for k in range(6):
    small.serve([10000 * (k + 1) + i for i in range(60)], [1, 2, 3])
    small.sanity_check()
rows.append({"small_kv": small.kv_in_use()})
print(json.dumps(rows))
"""


def test_driver_hand_made_trace() -> None:
    rows = json.loads(run_in_sglang(_SCRIPT).stdout.strip().splitlines()[-1])
    assert [(r["hit"], r["kv_only"]) for r in rows[:5]] == [(0, 0), (0, 50), (100, 0), (109, 0), (0, 99)]
    assert all(r["kv"] == 1000 for r in rows[:5])            # no slot lost, none freed twice
    assert [r["states"] for r in rows[:5]] == [2, 3, 4, 5, 5]
    assert rows[5]["small_kv"] == 130
