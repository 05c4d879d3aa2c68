"""The plugin inside SGLang 0.5.23 (in .venv-sglang): loaded by SGLang's own entry-point loader;
``lru`` through the plugin (and Marconi at α = 0) equals stock SGLang request for request, eviction
state included; ``marconi`` changes the victims and keeps SGLang's ``sanity_check`` green."""

from __future__ import annotations

import json
import os
import subprocess

from sglang_env import REPO, sglang_python

_REPLAY = r"""
import json, random, sys
from marconi.integrations.sglang.replay import RadixReplay

def replay(policy, config):
    r = RadixReplay(700, 6, policy=policy, policy_config=config)
    rng = random.Random(7)
    convs = [[rng.randrange(5000) for _ in range(rng.randrange(5, 60))] for _ in range(8)]
    events = []
    for _ in range(150):
        c = rng.randrange(len(convs))
        prompt = convs[c] + [rng.randrange(5000) for _ in range(rng.randrange(1, 40))]
        if rng.random() < 0.2:                                  # a competing prefix: a shorter fork
            prompt = prompt[: rng.randrange(1, len(prompt))] + [rng.randrange(5000)]
        output = [rng.randrange(5000) for _ in range(rng.randrange(1, 12))]
        hit, kv_only = r.serve(prompt, output)
        r.sanity_check()
        events.append([hit, kv_only, r.allocator.available_size(), r.req_pool.mamba_allocator.available_size(),
                       r.cache.full_evictable_size(), r.cache.mamba_evictable_size()])
        convs[c] = prompt + output if len(prompt) < 400 else convs[c][:10]
    return {"events": events, "hit_rate": r.token_hit_rate, "strategy": type(r.strategy).__name__,
            "counters": dict(getattr(r.strategy, "counters", {})), "backend": r.cache._tree_core_backend}

out = {}
for label, policy, config in json.loads(sys.argv[1]):
    out[label] = replay(policy, config)
print(json.dumps(out))
"""

_LOADER = r"""
from importlib.metadata import entry_points
from sglang.srt.plugins import load_plugins
from sglang.srt.arg_groups.choices import RADIX_EVICTION_POLICY_CHOICES
from sglang.srt.mem_cache import utils
load_plugins()
eps = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
assert eps.get("marconi") == "marconi.integrations.sglang.plugin:register", eps
assert "marconi" in RADIX_EVICTION_POLICY_CHOICES
strategy = utils.get_eviction_strategy("marconi", {"alpha": 0.5, "model": "paper-7b"})
assert type(strategy).__name__ == "MarconiStrategy" and strategy.alpha == 0.5, strategy
print("ok")
"""


def _run(script: str, *args: str, plugins: str | None = None) -> str:
    env = dict(os.environ)
    if plugins is not None:
        env["SGLANG_PLUGINS"] = plugins            # SGLang's own whitelist: a name nobody has = stock SGLang
    proc = subprocess.run([sglang_python(), "-W", "ignore", "-c", script, *args], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout.strip().splitlines()[-1]


def test_the_plugin_loads_through_sglangs_entry_point_loader() -> None:
    assert _run(_LOADER) == "ok"


def test_lru_through_the_plugin_is_stock_sglang_and_marconi_changes_victims() -> None:
    stock = json.loads(_run(_REPLAY, json.dumps([["stock", "lru", None]]), plugins="no-such-plugin"))["stock"]
    runs = json.loads(_run(_REPLAY, json.dumps([
        ["lru", "lru", None],
        ["alpha0", "marconi", {"alpha": 0, "model": "paper-7b"}],
        ["marconi", "marconi", {"alpha": 1.0, "model": "paper-7b"}],
    ])))
    assert stock["strategy"] == runs["lru"]["strategy"] == "LRUStrategy"
    assert runs["lru"]["events"] == stock["events"]                   # request for request, pools included
    assert runs["alpha0"]["events"] == stock["events"]               # Marconi at α = 0 is SGLang's LRU
    marconi = runs["marconi"]
    assert marconi["strategy"] == "MarconiStrategy" and marconi["backend"] == "python"
    assert marconi["events"] != stock["events"]                       # other victims (sanity_check ran each request)
    assert marconi["counters"]["evicted:state-leaf"] + marconi["counters"].get("evicted:state-tombstone", 0) > 0
    assert marconi["counters"]["hit_tokens:usable"] == sum(e[0] for e in marconi["events"])


_PLAIN = r"""
import torch
from array import array
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, EvictParams

class Allocator:
    device = "cpu"
    def free(self, v):
        pass
    def free_segment(self, v, start_pos=0):
        pass

out = []
for config in ({"model": "paper-7b"}, {"model": "transformer-7b", "alpha": 0.5}):
    cache = RadixCache(CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=Allocator(),
                                       page_size=1, eviction_policy="marconi", eviction_policy_config=config))
    base, n = list(range(100, 140)), 0
    for seq in (base, base[:20] + [7] * 10, base + [1, 2, 3], [9] * 15):
        cache.insert(InsertParams(key=RadixKey(array("q", seq)), value=torch.arange(n, n + len(seq))))
        n += len(seq)
    out.append(cache.evict(EvictParams(num_tokens=30)).num_tokens_evicted)
print(out)
"""


def test_marconi_on_sglangs_plain_radix_cache_evicts_attention_kv() -> None:
    """The plugin names ``marconi`` for every cache class; on the plain ``RadixCache`` (FlexKV, pure
    sliding-window models) its first eviction raised an AttributeError: those nodes have no
    components, so no Mamba state (audit)."""
    assert _run(_PLAIN) == "[33, 33]"
