"""A pytest plugin that runs vLLM's own tests with Marconi's block-pool hooks on every pool.

Loaded into vLLM's test suite by ``make vllm-peer-test``: ``scripts/vllm_peer_test.py`` puts this
folder on ``PYTHONPATH`` and passes ``-p peer_plugin`` (vLLM's own ``tests`` package would shadow
a ``tests.vllm_peer`` module path). vLLM's core tests build ``KVCacheManager`` and
``BlockPool`` directly, with no model, and their schedulers serve models the plugin has no spec
for, so the plugin as vLLM loads it would hook nothing. This harness hooks every
``KVCacheManager`` whose KV cache groups the plugin supports (full attention, Mamba, one block
size), with the tiny Nemotron-H preset's ``ModelSpec`` as the cost model, and

* installs the hooks the plugin installs (:func:`pool_checks.make_hooks`, its pool/manager hooks; the
  finish hook too when a ``Scheduler`` owns the manager, so an adaptive α source is fed);
* after every test that passed, checks each pool it hooked (:func:`pool_checks.check_pool`: ref
  counts, free queue, hash map, the plugin's index), so a drift fails that test;
* counts what was exercised: managers hooked and not (why), the plugin's victims, and how many of
  them differ from the block vLLM's LRU would have taken (the free queue's head).

``MARCONI_PEER_MODE``: ``lru`` (observe only), ``marconi`` (α = 0.5), ``adaptive`` (its shadow
replayed inline: vLLM's tests build hundreds of pools) or ``adaptive-process`` (its shadow in a child
process per pool, where an operator's unset ``MARCONI_VLLM_ADAPTIVE_REPLAY`` puts it on two CPUs).
``MARCONI_PEER_STATS``: a path for those counts as JSON (the runner prints them).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pool_checks import check_pool, count_choices, make_hooks

MODES = {"lru": {"MARCONI_VLLM_POLICY": "lru"},
         "marconi": {"MARCONI_VLLM_POLICY": "marconi", "MARCONI_VLLM_ALPHA": "0.5"},
         "adaptive": {"MARCONI_VLLM_POLICY": "marconi", "MARCONI_VLLM_ALPHA": "adaptive",
                      "MARCONI_VLLM_ADAPTIVE_REPLAY": "inline"},
         # the shadow replayed in a child process per pool, read at each eviction (the same choices)
         "adaptive-process": {"MARCONI_VLLM_POLICY": "marconi", "MARCONI_VLLM_ALPHA": "adaptive",
                              "MARCONI_VLLM_ADAPTIVE_REPLAY": "process"}}

_live: list[Any] = []              # hooks installed during the current test
_stats: Counter[str] = Counter()


def _spec() -> Any:
    """The tiny Nemotron-H preset's cost model: vLLM's test pools hold tens of blocks, and an adaptive
    α's shadow needs room for one SSM state of the model (an 8B model's would not fit)."""
    from marconi.core.model import ModelSpec
    from marconi.integrations.vllm.models import PRESETS

    model_type, fields = PRESETS["nemotron_h-tiny"]
    return ModelSpec.from_hf_config({"model_type": model_type, **fields}, name="nemotron_h-tiny", bytes_per_elem=2)


def _count_choices(hooks: Any) -> None:
    """Count the plugin's victims, and those that are not the LRU head of the free queue."""
    count_choices(hooks, _stats)


def _install(config: Any, spec: Any) -> None:
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.sched.scheduler import Scheduler

    from marconi.core.registry import ConfigError
    from marconi.integrations.vllm.policy import group_kinds

    manager_init, scheduler_init = KVCacheManager.__init__, Scheduler.__init__

    def hooked_manager_init(self: Any, *args: Any, **kwargs: Any) -> None:
        manager_init(self, *args, **kwargs)
        try:
            kinds = group_kinds(self.kv_cache_config, "peer harness", "not hooked")
        except ConfigError:
            kinds = sorted({type(g.kv_cache_spec).__name__ for g in self.kv_cache_config.kv_cache_groups})
            _stats["managers_unsupported_groups:" + "+".join(kinds)] += 1
            return
        sizes = {int(g.kv_cache_spec.block_size) for g in self.kv_cache_config.kv_cache_groups}
        if len(sizes) != 1:
            _stats["managers_mixed_block_sizes"] += 1
            return
        try:
            hooks = make_hooks(self, kinds, spec, sizes.pop(), config)
        except ConfigError:    # adaptive: a pool too small for the shadow's one SSM state (counted, not hooked)
            _stats["managers_alpha_source_refused"] += 1
            return
        hooks._install()
        if config.policy == "marconi":
            _count_choices(hooks)
        self._marconi_peer = hooks
        _live.append(hooks)
        _stats["managers_hooked"] += 1

    def hooked_scheduler_init(self: Any, *args: Any, **kwargs: Any) -> None:
        scheduler_init(self, *args, **kwargs)
        hooks = getattr(getattr(self, "kv_cache_manager", None), "_marconi_peer", None)
        if hooks is not None:
            hooks._install_finish_hook(self)
            _stats["schedulers_hooked"] += 1

    KVCacheManager.__init__ = hooked_manager_init
    Scheduler.__init__ = hooked_scheduler_init


def pytest_configure(config: pytest.Config) -> None:
    mode = os.environ.get("MARCONI_PEER_MODE", "")
    if mode not in MODES:
        raise pytest.UsageError(f"MARCONI_PEER_MODE must be one of {sorted(MODES)}, got {mode!r}")
    from marconi.integrations.vllm.config import PluginConfig

    plugin_config = PluginConfig.from_env({**os.environ, **MODES[mode]})
    _install(plugin_config, _spec())
    _stats["mode:" + mode] = 1


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    first = len(_live)
    result = yield                       # the test raised: its own failure, nothing more to check
    for hooks in _live[first:]:
        check_pool(hooks)
        _stats["pools_checked"] += 1
    del _live[first:]
    return result


def pytest_runtest_teardown(item: pytest.Item) -> None:
    _live.clear()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    stats = dict(sorted(_stats.items()))
    terminalreporter.write_line("marconi peer harness: " + json.dumps(stats))
    path = os.environ.get("MARCONI_PEER_STATS")
    if path:
        Path(path).write_text(json.dumps(stats, indent=1) + "\n")
