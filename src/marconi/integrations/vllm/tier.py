"""Marconi's policy for vLLM's CPU offload tier: a ``CachePolicy`` loaded by vLLM's own config.

Plugged into vLLM 0.32's ``OffloadingConnector`` through ``kv_connector_extra_config`` alone
(``"eviction_policy": "MarconiCachePolicy", "cache_policy_module_path":
"marconi.integrations.vllm.tier"``, plus the ``marconi_*`` keys of :meth:`TierSettings.from_extra_config`).
The tier's chunks form Marconi's radix tree (one block hash = one node: attention chunks its KVs,
Mamba chunks its state); ``evict`` takes chunks no hit can use first, then one victim at a time the
configured rule's among the candidates, on FLOP efficiency less the host load's cost. Stores are the
manager's choice, so admission acts at eviction time. A configuration it cannot serve raises
:class:`ConfigError` naming the key to change. This module imports vLLM. Details, defaults and
their reasons: ``docs/vllm-tiers.md``.
"""

from __future__ import annotations

import os
import sys

from vllm.v1.kv_offload.cpu.policies.base import CachePolicy

from marconi.core.registry import ConfigError
from marconi.integrations.vllm.policy import group_kinds
from marconi.integrations.vllm.tier_settings import (  # noqa: F401  (re-exported: the policy's public names)
    DEFAULT_GPU_TFLOPS, DEFAULT_HOST_GBPS, DEFAULT_RULE, ENV_COLD_INSERT, ENV_GROUP_KINDS, ENV_MODEL, ENV_RULE,
    ENV_SECOND_CHANCE, TierSettings, check_group_kinds)
from marconi.integrations.vllm.tier_tree import REASONS, TreeJudgement  # noqa: F401  (re-exported)
from marconi.integrations.vllm.tier_chooser import AdaptiveTierPolicy

__all__ = ["MarconiCachePolicy", "TierSettings", "DEFAULT_RULE", "DEFAULT_HOST_GBPS", "DEFAULT_GPU_TFLOPS",
           "REASONS", "ENV_COLD_INSERT", "ENV_SECOND_CHANCE", "ENV_GROUP_KINDS", "ENV_MODEL", "ENV_RULE"]

_SUPPORTED_VLLM = ("0.32", "0.33")
_Judgement = TreeJudgement      # the name the tier's tests use for the tree's standing


class MarconiCachePolicy(AdaptiveTierPolicy, CachePolicy):
    """vLLM ``CachePolicy`` ranking tier chunks by Marconi's utility over the chunk tree
    (:class:`~marconi.integrations.vllm.tier_tree.ChunkTreePolicy`, bound to vLLM's base class), under
    the rule ``marconi_rule`` names, or (``adaptive``, the default) the rule chosen online by
    :class:`~marconi.integrations.vllm.tier_chooser.TierRuleChooser`.

    Contract (vLLM's): ``evict(n, protected)`` returns exactly ``n`` evictable (``ref_cnt == 0``,
    not in ``protected``) chunks and forgets them, or None and changes nothing. Chunks become
    evictable through ``insert`` with ``ref_cnt == 0`` or ``mark_evictable``.

    Args:
        cache_capacity: chunks in the tier (vLLM passes only this).
        settings: explicit settings; None (vLLM's factory path) finds the building
            ``OffloadingSpec`` on the call stack, else reads ``MARCONI_TIER_*``.

    Raises:
        ConfigError: a configuration it cannot serve (not hybrid, unknown vLLM, a bad key), naming
            the key to change.
    """

    def __init__(self, cache_capacity: int, settings: TierSettings | None = None) -> None:
        AdaptiveTierPolicy.__init__(self, cache_capacity, settings if settings is not None else _discover_settings())


def _discover_settings() -> TierSettings:
    """Settings of the policy vLLM's factory is building, from the ``OffloadingSpec`` and connector
    found on the call stack; what they do not give, from ``MARCONI_TIER_*``."""
    import vllm

    version = getattr(vllm, "__version__", "?")
    if ".".join(version.split("+")[0].split(".")[:2]) not in _SUPPORTED_VLLM:
        raise ConfigError(f"MarconiCachePolicy supports vLLM {', '.join(s + '.x' for s in _SUPPORTED_VLLM)}, not "
                          f"{version}: set kv_connector_extra_config 'eviction_policy' to 'lru' or 'arc'")
    from vllm.v1.kv_offload.base import OffloadingSpec

    spec_obj = kv_cache_config = vllm_config = None
    frame = sys._getframe(2)
    for _ in range(12):
        if frame is None:
            break
        local = frame.f_locals
        for name in ("self", "spec"):
            if spec_obj is None and isinstance(local.get(name), OffloadingSpec):
                spec_obj = local[name]
        if kv_cache_config is None and hasattr(local.get("kv_cache_config"), "kv_cache_groups"):
            kv_cache_config = local["kv_cache_config"]
        if vllm_config is None and hasattr(local.get("vllm_config"), "model_config"):
            vllm_config = local["vllm_config"]
        frame = frame.f_back
    if spec_obj is None:
        return TierSettings.from_env()
    extra = dict(spec_obj.extra_config)
    # vLLM's groups and model where the config does not name them; the MARCONI_TIER_* variables fill in
    # the rest, each checked (and refused) under its own name by TierSettings.from_extra_config
    kinds = None
    if kv_cache_config is not None:
        kinds = group_kinds(kv_cache_config, "MarconiCachePolicy",
                            "set kv_connector_extra_config 'eviction_policy' to 'lru' or 'arc'")
        check_group_kinds(kinds)
    model = None
    if "marconi_model" not in extra and vllm_config is not None:
        from marconi.integrations.vllm.plugin import model_spec

        try:
            model = model_spec(vllm_config)
        except ValueError as exc:
            raise ConfigError(f"MarconiCachePolicy cannot read the served model's FLOPs and bytes ({exc}): set "
                              "kv_connector_extra_config 'marconi_model'") from None
    tpc = None
    sizes = {int(t) * int(spec_obj.blocks_per_chunk) for t in spec_obj.tokens_per_block}
    if len(sizes) == 1:
        tpc = sizes.pop()
    settings = TierSettings.from_extra_config(extra, group_kinds=None if "marconi_group_kinds" in extra else kinds,
                                              spec=model, tokens_per_chunk=tpc, env=os.environ)
    if kinds is not None and list(settings.group_kinds) != kinds:
        # a wrong override would judge every node by the wrong groups (or fail mid-store): refused at start
        raise ConfigError(f"kv_connector_extra_config 'marconi_group_kinds' says {list(settings.group_kinds)}, but "
                          f"vLLM's KV cache groups are {kinds}: fix the key or remove it (vLLM's are read)")
    return settings


