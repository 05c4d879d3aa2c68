"""The ``sglang.srt.plugins`` entry point ``marconi``: ``--radix-eviction-policy marconi`` for SGLang 0.5.23.

:func:`register` runs in SGLang's ``load_plugins()`` (in ``launch_server`` and every scheduler
process). It adds ``marconi`` to the ``--radix-eviction-policy`` choices and to SGLang's strategy
factories (``_EVICTION_POLICY_FACTORIES``: there is no public registry), configured by
``--radix-eviction-policy-config`` (:func:`marconi.integrations.sglang.policy.parse_config`), and
registers ``HookRegistry`` hooks, each a pass-through unless the tree's strategy is Marconi's:
``resolve_tree_core_backend`` (the Python TreeCore, whose Mamba walk can be hooked),
``FullComponent._evict_device_start`` (freeze the utility's normalisation over the walk's leaves),
``MambaComponent._evict_device_next_node`` (point SGLang's cursor at
``MarconiStrategy.pick_state``; SGLang's own step evicts or tombstones it), counters on
``FullComponent._evict_device_next_node`` and ``match_prefix``, and the adaptive α source on
``UnifiedRadixCache.__init__`` / ``checkpoint``. Session radix caching keeps SGLang's own Mamba walk.
"""

from __future__ import annotations

import logging
from typing import Any

from marconi.integrations.sglang.policy import MarconiStrategy

__all__ = ["register", "POLICY", "strategy_of"]

POLICY = "marconi"
logger = logging.getLogger(__name__)
_registered = False


def _served_model() -> str | None:
    try:
        from sglang.srt.server_args import get_global_server_args

        args = get_global_server_args()
    except Exception:                   # no server args yet (a cache built outside a server)
        return None
    path = getattr(args, "model_path", None)
    return None if path in (None, "dummy") else path


def make_strategy(**config: Any) -> MarconiStrategy:
    """SGLang's factory signature: the policy config as keyword arguments."""
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

    return MarconiStrategy.from_config(config, mamba_index=int(ComponentType.MAMBA), default_model=_served_model())


def strategy_of(obj: Any) -> MarconiStrategy | None:
    """The Marconi strategy of a cache, tree core or component (None: another policy)."""
    tree_core = getattr(obj, "tree_core", obj)
    strategy = getattr(tree_core, "eviction_strategy", None)
    return strategy if isinstance(strategy, MarconiStrategy) else None


# ------------------------------------------------------------------------------------- hooks
def _resolve_backend(original, name, params, *args, **kwargs):
    if str(getattr(params, "eviction_policy", "")).lower() == POLICY:
        return "python"
    return original(name, params, *args, **kwargs)


def _full_walk_start(original, self, *args, **kwargs):
    strategy = strategy_of(self)
    if strategy is not None:
        strategy.begin_full_walk(self.tree_core.evictable_device_leaves)
    return original(self, *args, **kwargs)


def _full_walk_next(original, self, *args, **kwargs):
    node_id = original(self, *args, **kwargs)
    strategy = strategy_of(self)
    if strategy is not None and node_id is not None:
        strategy.count("evicted:kv-leaf")
    return node_id


def _lru_order(lru: Any) -> list[Any]:
    order, x = [], lru.get_lru_no_lock()
    while x is not None:
        order.append(x)
        x = lru.get_prev_no_lock(x)
    return order


def _mamba_walk_next(original, self, tracker, *args, **kwargs):
    strategy = strategy_of(self)
    tree_core = self.tree_core
    if strategy is None or tree_core.enable_session_radix_cache:
        return original(self, tracker, *args, **kwargs)
    ct = self.component_type
    leaves = tree_core.evictable_device_leaves
    pick = None
    if tracker[ct] < self._evict_device_request_cnt:     # SGLang's own stop test, checked first
        pick = strategy.pick_state(_lru_order(tree_core.lru_lists[ct]), leaves.__contains__)
    self._evict_device_cursor = pick                     # SGLang's step processes the cursor
    before = tracker[ct]
    result = original(self, tracker, *args, **kwargs)
    if pick is not None:
        if result is not None:
            strategy.count("evicted:state-leaf")
        elif tracker[ct] > before:
            strategy.count("evicted:state-tombstone")
    return result


def _match_prefix(original, self, params, *args, **kwargs):
    result = original(self, params, *args, **kwargs)
    strategy = strategy_of(self)
    if strategy is not None:
        usable = int(result.device_prefix_len)
        strategy.count("hit_tokens:usable", usable)
        strategy.count("hit_tokens:kv_only", max(0, int(result.full_kv_hit_length) - usable))
    return result


def _cache_init(original, self, *args, **kwargs):
    original(self, *args, **kwargs)
    strategy = strategy_of(self)
    if strategy is not None:
        from marconi.integrations.sglang.emulate import world_maker

        kv_tokens = int(self.token_to_kv_pool_allocator.size)
        mamba_pool = getattr(self.req_to_token_pool, "mamba_pool", None)
        mamba_slots = int(getattr(mamba_pool, "size", 0))
        # the worlds emulate this cache as the bench drives it (no_buffer, page 1): exact there, a
        # proxy under extra_buffer or a concurrent scheduler (docs/sglang.md)
        strategy.start_shadow(kv_tokens, mamba_slots, world_maker(strategy.spec, kv_tokens, max(mamba_slots, 2)))


def _checkpoint(original, self, req, *args, **kwargs):
    result = original(self, req, *args, **kwargs)
    strategy = strategy_of(self)
    if strategy is not None and getattr(req, "finished_reason", None) is not None:
        strategy.observe(list(req.origin_input_ids), list(req.output_ids), int(getattr(req, "cached_tokens", 0) or 0))
    return result


_HOOKS = (
    ("sglang.srt.mem_cache.unified_cache.tree_core_registry.resolve_tree_core_backend", _resolve_backend),
    ("sglang.srt.mem_cache.unified_cache.components.full.FullComponent._evict_device_start", _full_walk_start),
    ("sglang.srt.mem_cache.unified_cache.components.full.FullComponent._evict_device_next_node", _full_walk_next),
    ("sglang.srt.mem_cache.unified_cache.components.mamba.MambaComponent._evict_device_next_node",
     _mamba_walk_next),
    ("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.match_prefix", _match_prefix),
    ("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.__init__", _cache_init),
    ("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.checkpoint", _checkpoint),
)


def register() -> None:
    """The entry point: register the policy and the hooks (idempotent). SGLang's ``load_plugins``
    applies the hooks after every plugin ran; a caller outside it calls ``HookRegistry.apply_hooks()``."""
    global _registered
    if _registered:
        return
    from sglang.srt.arg_groups.choices import RADIX_EVICTION_POLICY_CHOICES, add_radix_eviction_policy_choices
    from sglang.srt.mem_cache import utils as mem_utils
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if POLICY not in RADIX_EVICTION_POLICY_CHOICES:
        add_radix_eviction_policy_choices([POLICY])
    mem_utils._EVICTION_POLICY_FACTORIES[POLICY] = make_strategy
    for target, hook in _HOOKS:
        HookRegistry.register(target, hook, HookType.AROUND)
    _registered = True
    logger.info("marconi: --radix-eviction-policy %s registered", POLICY)
