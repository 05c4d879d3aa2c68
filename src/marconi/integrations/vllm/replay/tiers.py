"""The replay's CPU tier, as both environments see it: tier policy names, vLLM's connector config, the host link.

:func:`extra_config` configures vLLM's own ``OffloadingConnector`` as a server's
``--kv-transfer-config`` does. :data:`DEFAULT_HOST_BANDWIDTH` is one PCIe Gen5 x16 link per GPU and
direction (docs/vllm-tiers.md, "The host link"). Imports nothing from vLLM.
"""

from __future__ import annotations

import math
import re
from typing import Any

from marconi.core.registry import ConfigError
from marconi.integrations.vllm.replay.configs import VLLM_BLOCK_SIZES, model_dir
from marconi.integrations.vllm.emulate.tier import STORE_THRESHOLD, parse_tier_arm, tier_num_chunks
from marconi.units import MAX_CAPACITY_FRACTION, Capacity, parse_bytes, parse_capacity

__all__ = ["TIER_POLICIES", "NO_TIER", "DEFAULT_HOST_BANDWIDTH", "MARCONI_POLICY_MODULE", "extra_config", "parse_tier_policies", "check_tier_arm",
           "tier_capacity", "tier_chunk_bytes", "check_tier_size", "parse_bandwidth",
           "BANDWIDTH_FLAG"]

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


def tier_chunk_bytes(model: str) -> int | None:
    """Bytes of one chunk of vLLM's CPU tier for ``model`` (one GPU block of every KV cache group, at
    vLLM's block, :data:`~marconi.integrations.vllm.replay.configs.VLLM_BLOCK_SIZES`), as the
    ``vllm-align`` emulation lays it out (:func:`~marconi.integrations.vllm.layout.layout_for_spec`'s ``block_bytes``, what
    :func:`~marconi.integrations.vllm.emulate.tier.tier_num_chunks` divides by); None where vLLM's
    block for ``model`` is not known before it runs (a model directory)."""
    from marconi.core.model import ModelSpec
    from marconi.integrations.vllm.layout import layout_for_spec

    block = VLLM_BLOCK_SIZES.get(model)
    if block is None:
        return None
    spec = ModelSpec.from_hf_config(model_dir(model) / "config.json", name=model)
    return layout_for_spec(spec, num_blocks=2, block_size=block).block_bytes


def check_tier_size(text: str, model: str, working_set: int | None = None, *, flag: str = "--cpu-tier",
                    no_tier: str | None = None) -> int | None:
    """A CPU tier's size ``text`` (:func:`tier_capacity`: ``256GB`` or ``0.5x`` of ``working_set``) in
    bytes, refused where it holds no chunk of vLLM's tier for ``model``: the emulation's check
    (:func:`~marconi.integrations.vllm.emulate.tier.tier_num_chunks`) at :func:`tier_chunk_bytes`.
    None for a fraction before the working set is known; the bytes unchecked for a model whose
    block only vLLM knows (the replay's records are checked against vLLM's own block).

    Raises:
        ConfigError: naming ``flag`` and ``text``, the bytes given, one chunk's bytes and the least
            size that holds one (for a fraction, the least fraction too); ``no_tier``: how to ask for
            no tier instead (default: drop ``flag``). Also a ``text`` :func:`tier_capacity` refuses.
    """
    try:
        cap = tier_capacity(text)
    except ConfigError as exc:
        raise ConfigError(f"{flag}: {exc}") from None
    if cap.fraction is not None and working_set is None:
        return None
    chunk = tier_chunk_bytes(model)
    nbytes = cap.resolve(working_set or 0)
    if chunk is None:
        return nbytes
    try:      # a fraction that rounds to 0 bytes asked for a tier too (0 is no tier only as a size)
        tier_num_chunks(nbytes, chunk, f"{flag} {text}", no_tier or f"drop {flag} for no tier",
                        zero_is_no_tier=cap.fraction is None)
    except ConfigError as exc:
        if cap.fraction is None or working_set is None:
            raise
        raise ConfigError(f"{exc} ({text} is of this trace's working set, {working_set:,} bytes: "
                          f"{_least_fraction(chunk, working_set)})") from None
    return nbytes


def _least_fraction(chunk: int, working_set: int) -> str:
    """The smallest fraction of ``working_set``, to three figures, whose tier holds a chunk of
    ``chunk`` bytes by :func:`~marconi.integrations.vllm.emulate.tier.tier_num_chunks` itself (what
    :func:`check_tier_size`'s refusal of a fraction suggests), or that none does."""
    def holds(frac: float) -> bool:
        try:
            return tier_num_chunks(int(frac * working_set), chunk) > 0
        except ConfigError:
            return False

    none = "no fraction of it holds a chunk: give a size"
    if working_set <= 0:
        return none
    step = 10.0 ** (math.floor(math.log10(chunk / working_set)) - 2)
    frac = math.ceil(chunk / working_set / step) * step
    while not holds(frac) and frac <= MAX_CAPACITY_FRACTION:
        frac += step
    return none if frac > MAX_CAPACITY_FRACTION else f"give at least {frac:.3g}x"


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
        except ConfigError as exc:   # unreadable, negative or above 1 EB (a second)
            why = "above 1 EB/s" if "larger than" in str(exc) else "not a size"
            raise ConfigError(f"{BANDWIDTH_FLAG}: cannot read {text!r} as a bandwidth ({why}): give bytes per "
                              "second, e.g. 55GB/s, 25GB/s or 5.5e10") from None
    if not value >= 1:             # a size reads in whole bytes: under one byte a second reads as 0
        raise ConfigError(f"{BANDWIDTH_FLAG}: must be at least 1 byte/s, got {text!r}")
    return value
