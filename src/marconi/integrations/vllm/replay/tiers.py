"""The replay's CPU tier, as both environments see it: tier policy names, vLLM's connector config, the host link.

:func:`extra_config` configures vLLM's own ``OffloadingConnector`` as a server's
``--kv-transfer-config`` does. :data:`DEFAULT_HOST_BANDWIDTH` is one PCIe Gen5 x16 link per GPU and
direction (docs/vllm-tiers.md, "The host link"). Imports nothing from vLLM.
"""

from __future__ import annotations

import re
from typing import Any

from marconi.core.registry import ConfigError
from marconi.integrations.vllm.emulate.tier import STORE_THRESHOLD, parse_tier_arm
from marconi.units import Capacity, parse_bytes, parse_capacity

__all__ = ["TIER_POLICIES", "NO_TIER", "DEFAULT_HOST_BANDWIDTH", "MARCONI_POLICY_MODULE", "extra_config", "parse_tier_policies", "check_tier_arm",
           "tier_capacity", "parse_bandwidth", "BANDWIDTH_FLAG"]

#: Effective host↔GPU bandwidth per direction and per GPU, bytes/s (PCIe Gen5 x16 with pinned copies).
DEFAULT_HOST_BANDWIDTH = 55e9

#: Where vLLM's ``CachePolicyFactory`` finds Marconi's tier policy (``cache_policy_module_path``).
MARCONI_POLICY_MODULE = "marconi.integrations.vllm.tier"
MARCONI_POLICY_CLASS = "MarconiCachePolicy"

#: Tier policy name -> the ``kv_connector_extra_config`` keys that select it in vLLM.
TIER_POLICIES: dict[str, dict[str, str]] = {
    "lru": {"eviction_policy": "lru"},
    "arc": {"eviction_policy": "arc"},
    "marconi": {"eviction_policy": MARCONI_POLICY_CLASS, "cache_policy_module_path": MARCONI_POLICY_MODULE},
}

#: In ``--tier-policies``, the GPU-only arm on the same run (no connector), for the tier's gain.
NO_TIER = "none"


def extra_config(policy: str, cpu_bytes: int, host_bandwidth: float = DEFAULT_HOST_BANDWIDTH) -> dict[str, Any]:
    """vLLM's ``kv_connector_extra_config`` for a CPU tier of ``cpu_bytes`` under ``policy``, a tier
    arm's label (one of :data:`TIER_POLICIES`, optionally ``:store_threshold=N``, vLLM's frequency
    filter on stores); everything else stays vLLM's default (``offload_prompt_only``, one GPU block
    per chunk). Marconi's policy also hears the host link's bandwidth (``marconi_host_gbps``,
    GB/s), which prices a load against the FLOPs it saves. Raises ConfigError for an unknown
    policy or option, or a tier under one byte."""
    name, threshold = parse_tier_arm(policy)
    if cpu_bytes < 1:
        raise ConfigError(f"--cpu-tier must be at least one byte, got {cpu_bytes}")
    extra: dict[str, Any] = {"cpu_bytes_to_use": int(cpu_bytes), **TIER_POLICIES[name]}
    if threshold:
        extra[STORE_THRESHOLD] = threshold
    if name == "marconi":
        extra["marconi_host_gbps"] = host_bandwidth / 1e9
    return extra


def parse_tier_policies(text: str) -> tuple[str, ...]:
    """``--tier-policies lru,arc,marconi`` as names, each checked (:func:`parse_tier_arm`: a policy,
    optionally with ``:store_threshold=N``), none twice; ``none`` is the GPU-only arm (:data:`NO_TIER`)."""
    names = tuple(s.strip() for s in str(text).split(",") if s.strip())
    if not names:
        raise ConfigError("--tier-policies: give at least one of " + ", ".join(TIER_POLICIES))
    for name in names:
        check_tier_arm(name)
    if len(set(names)) != len(names):
        raise ConfigError(f"--tier-policies: {text!r} names a policy twice")
    return names


def check_tier_arm(name: str) -> None:
    """One ``--tier-policies`` entry: ``none`` or a tier arm's label; ConfigError naming the flag."""
    if name == NO_TIER:
        return
    try:
        parse_tier_arm(name)
    except ConfigError as exc:
        raise ConfigError(f"{exc}; or {NO_TIER} (GPU only)") from None


def tier_capacity(text: str) -> Capacity:
    """A CPU tier's size as ``vllm replay --cpu-tier`` and ``vllm diagnose --cpu-tiers`` take it: a
    size of at least one byte (256GB) or a fraction of the trace's working set (0.5x). ConfigError
    otherwise, without a flag: the caller names its own."""
    cap = parse_capacity(text)
    if cap.absolute is not None and cap.absolute < 1:
        raise ConfigError(f"{text!r} is under one byte: give a size (256GB) or a fraction of the working set (0.5x)")
    return cap


#: The option :func:`parse_bandwidth` reads (its errors begin ``--host-bandwidth: ``).
BANDWIDTH_FLAG = "--host-bandwidth"


def parse_bandwidth(text: str | float) -> float:
    """``--host-bandwidth``: bytes per second, as ``55GB/s``, ``55GB`` or ``5.5e10``; > 0. ConfigError
    naming the flag (:data:`BANDWIDTH_FLAG`) otherwise."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        try:
            value = float(parse_bytes(re.sub(r"\s*/\s*s\s*$", "", str(text), flags=re.IGNORECASE)))
        except ConfigError:          # unreadable, negative or above 1 EB
            raise ConfigError(f"{BANDWIDTH_FLAG}: cannot read {text!r} as a bandwidth: give bytes per second, "
                              "e.g. 55GB/s, 25GB/s or 5.5e10") from None
    if not value > 0:
        raise ConfigError(f"{BANDWIDTH_FLAG}: must be > 0 bytes/s, got {text!r}")
    return value
