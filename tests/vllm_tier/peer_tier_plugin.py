"""A pytest plugin that runs vLLM's own offload-tier tests with Marconi's tier policy in LRU's place.

Loaded into vLLM's test suite by ``make vllm-tier-peer-test`` (``scripts/vllm_tier_peer_test.py``
puts this folder on ``PYTHONPATH`` and passes ``-p peer_tier_plugin``). vLLM's tier tests build
``CPUOffloadingManager`` with ``cache_policy="lru"`` (directly, or through a spec whose
``eviction_policy`` defaults to it). This harness makes every such manager load
``MarconiCachePolicy`` by module path instead — through vLLM's own ``CachePolicyFactory``, as
``kv_connector_extra_config`` would — and

* gives the policy what vLLM's tests cannot (they build managers with no model and no KV cache
  groups): ``MARCONI_TIER_GROUP_KINDS=attention,mamba`` (the tests' group-0 keys are KV chunks,
  group-1 keys states) and ``MARCONI_TIER_MODEL=nemotron-h-8b``;
* after every test that passed, runs each live Marconi policy's ``check_invariants``, so a drift
  fails that test;
* counts what was exercised: managers built with Marconi, evictions it chose (by reason).

``MARCONI_PEER_STATS``: a path for those counts as JSON (the runner prints them).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

MODULE = "marconi.integrations.vllm.tier"
_live: list[Any] = []
_stats: Counter[str] = Counter()


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("MARCONI_TIER_GROUP_KINDS", "attention,mamba")
    os.environ.setdefault("MARCONI_TIER_MODEL", "nemotron-h-8b")
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    original = CPUOffloadingManager.__init__

    def __init__(self: Any, num_chunks: int, cache_policy: str = "lru", cache_policy_module_path: str | None = None,
                 *args: Any, **kwargs: Any) -> None:
        if cache_policy == "lru" and cache_policy_module_path is None:
            cache_policy, cache_policy_module_path = "MarconiCachePolicy", MODULE
            _stats["managers_with_marconi"] += 1
        else:
            _stats[f"managers_left_{cache_policy}"] += 1
        original(self, num_chunks, cache_policy, cache_policy_module_path, *args, **kwargs)
        policy = self._policy
        if hasattr(policy, "check_invariants"):
            _live.append(policy)

    CPUOffloadingManager.__init__ = __init__


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _live.clear()                               # managers built by fixtures count too


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    outcome = yield
    if outcome.excinfo is None:
        for policy in _live:
            policy.check_invariants()           # raises into the test: a drift fails it
            _stats["invariant_checks"] += 1
    for policy in _live:
        for reason, count in policy.eviction_counts.items():
            _stats[f"evicted_{reason}"] += count
    _live.clear()


def pytest_unconfigure(config: pytest.Config) -> None:
    path = os.environ.get("MARCONI_PEER_STATS")
    if path:
        Path(path).write_text(json.dumps(dict(sorted(_stats.items()))))
