"""The ``vllm-align`` simulator system: vLLM 0.32's hybrid prefix cache, by name, with parameters.

Usable wherever a system is named; its parameters are listed in docs/vllm.md, "The emulation"::

    vllm-align                            stock vLLM (LRU), the block size vLLM picks, pool from --capacity
    vllm-align:eviction=marconi,alpha=adaptive   the plugin with MARCONI_VLLM_ALPHA=adaptive
    vllm-align:block=384,blocks=150       an exact pool (as served with --num-gpu-blocks-override 150)
    vllm-align:cpu_tier=8GB,tier_policy=arc   vLLM's CPU offload tier beside the pool (OffloadingConnector)
    vllm-align:cpu_tier=8GB,tier_policy=marconi,tier_rule=lru   the tier policy under a rule (marconi_rule)
    vllm-align:cpu_tier=8GB,tier_policy=marconi,tier_cold_insert=0   without cold insertion (marconi_cold_insert)
    vllm-align:cpu_tier=8GB,tier_policy=marconi,tier_second_chance=0   without branch points' second chance
    vllm-align:cpu_tier=8GB,store_threshold=2   vLLM's frequency filter on the tier's stores (store_threshold)

``alpha_source`` runs arbitrary code: its module is imported when the name is read (a typo fails
before any point runs) and in every worker, its factory called for every cache built.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from marconi.core.cache import PayloadOps
from marconi.core.model import ModelSpec, get_model
from marconi.core.registry import ConfigError, Domain
from marconi.options import CHECKPOINT_BUDGET
from marconi.integrations.common.alpha import AlphaSource
from marconi.integrations.vllm.config import ADAPTIVE, DEFAULT_RULES, PluginConfig, load_alpha_factory, parse_alpha
from marconi.integrations.vllm.emulate.cache import VllmAlignCache
from marconi.integrations.vllm.emulate.tier import STORE_THRESHOLD, TIER_POLICIES, EmulatedTier, tier_num_chunks
from marconi.integrations.vllm.layout import layout_for_spec
from marconi.integrations.vllm.policy import DEFAULT_ALPHA, EFFICIENCIES
from marconi.integrations.vllm.replay.configs import VLLM_BLOCK_SIZES
from marconi.integrations.vllm.retention import DEFAULT_BUDGET, SPARSE_DP
from marconi.integrations.vllm.shadow import PoolShadowAlpha
from marconi.integrations.vllm.tier_settings import DEFAULT_RULE, parse_tier_rule
from marconi.sim.systems import SYSTEMS
from marconi.units import parse_bytes

__all__ = ["VllmAlignSystem"]


@dataclass(frozen=True, slots=True)
class VllmAlignSystem:
    """A :class:`~marconi.sim.systems.System` whose cache is the vLLM emulation. ``admission`` and
    ``eviction`` are labels for the records, not registry names: vLLM's machinery admits and the
    plugin's policy evicts. The ``vllm-align:…`` factory validates every parameter first.
    """

    label: str
    admission: str
    eviction: str
    layout_options: tuple[tuple[str, Any], ...] = ()
    block_size: int | None = None
    num_blocks: int | None = None
    policy: str = "lru"
    alpha: float | str = DEFAULT_ALPHA    # a number or "adaptive"
    efficiency: str = "total"
    alpha_source: str | None = None       # ``module:factory``, as MARCONI_VLLM_ALPHA_SOURCE
    rules: str = DEFAULT_RULES            # the shadow's family, as MARCONI_VLLM_ADAPTIVE_RULES
    retention_budget: int | None = None   # MARCONI_VLLM_RETENTION=sparse-dp with this budget; None: off
    cpu_tier_bytes: int = 0               # vLLM's CPU offload tier (its cpu_bytes_to_use); 0: none
    tier_policy: str = "lru"              # its eviction_policy: lru, arc or marconi (":store_threshold=N": vLLM's filter)
    tier_rule: str = DEFAULT_RULE         # with tier_policy marconi: its rule (marconi_rule)
    tier_cold_insert: bool = True         # with tier_policy marconi: cold insertion (marconi_cold_insert)
    tier_second_chance: bool = True       # with tier_policy marconi: second chance (marconi_second_chance)
    unbounded: bool = field(default=False, init=False)      # the pool is finite, from the capacity
    needs_future: bool = field(default=False, init=False)   # vLLM does not know the future
    # begin() admits a request's whole prefill (the emulated engine's admit): requests that overlap in
    # time would hit what is still being computed, so --mode event is refused (the replay models it)
    event_mode: bool = field(default=False, init=False)

    def build(self, spec: ModelSpec | str, capacity_bytes: float, *, clock: Callable[[], float] | None = None,
              payloads: PayloadOps | None = None, tuning_workers: int | None = None,
              tuning_mapper: Callable[..., list[Any]] | None = None,
              future: Sequence[Any] | None = None) -> VllmAlignCache:
        """A fresh emulated pool of ``capacity_bytes`` (or of ``num_blocks``). ``clock``, the tuning
        workers and ``future`` are not used; ConfigError with ``payloads`` (it holds none).

        The block is ``block_size``, else vLLM 0.32's own for a model the replay bundles
        (:data:`~marconi.integrations.vllm.replay.configs.VLLM_BLOCK_SIZES`: Nemotron-H's float32 SSM
        state, which the model spec does not know, doubles the page the layout would derive), else
        derived from the spec (:func:`~marconi.integrations.vllm.layout.layout_for_spec`)."""
        if payloads is not None:
            raise ConfigError("vllm-align is a simulation of vLLM's cache: it holds no real payloads")
        spec = get_model(spec)
        layout = self._layout(spec, capacity_bytes=None if self.num_blocks else capacity_bytes,
                              num_blocks=self.num_blocks)
        # A fresh source per cache, built exactly as the plugin builds its own.
        alpha: AlphaSource = self.plugin_config().make_alpha_source(spec, where=_ALPHA_SOURCE)
        # No clock: vLLM's recency is the order blocks return to its free queue, not time.
        cache = VllmAlignCache(spec, layout, eviction=self.policy, alpha=alpha, efficiency=self.efficiency,
                               retention_budget=self.retention_budget)
        if self.cpu_tier_bytes:
            chunks = tier_num_chunks(self.cpu_tier_bytes, layout.block_bytes)
            cache.engine.attach_tier(EmulatedTier(layout, chunks, self.tier_policy, spec, rule=self.tier_rule,
                                                  cold_insert=self.tier_cold_insert,
                                                  second_chance=self.tier_second_chance))
        return cache

    def record_fields(self) -> dict[str, Any]:
        """The record's echo; ``tuning`` stays None (a shadow α source reports ``rule_switches``)."""
        return {"system": self.label, "admission": self.admission, "eviction": self.eviction, "tuning": None}

    def relabel(self, label: str) -> "VllmAlignSystem":
        return replace(self, label=label)

    def least_capacity_bytes(self, spec: ModelSpec | str, requests: Sequence[Any]) -> int:
        """vLLM's least pool for the longest of ``requests``, less its null block (the capacity
        :meth:`build` makes that pool of; below it the engine refuses the request); 0 with a fixed
        ``num_blocks`` or no request."""
        from marconi.integrations.vllm.replay.pool_floor import layout_minimum_pool, replay_max_model_len

        if self.num_blocks or not requests:
            return 0
        layout = self._layout(get_model(spec), num_blocks=2)
        least = layout_minimum_pool(layout, replay_max_model_len(requests))
        return (least.num_blocks - 1) * layout.block_bytes

    def _layout(self, spec: ModelSpec, *, capacity_bytes: float | None = None,
                num_blocks: int | None = None) -> Any:
        """The pool's layout (:func:`~marconi.integrations.vllm.layout.layout_for_spec`) at this system's
        block: ``block_size``, else vLLM 0.32's own for a bundled model, else derived from the spec."""
        block_size = self.block_size if self.block_size is not None else VLLM_BLOCK_SIZES.get(spec.name)
        return layout_for_spec(spec, capacity_bytes=capacity_bytes, num_blocks=num_blocks, block_size=block_size,
                               **dict(self.layout_options))

    def describe(self) -> dict[str, Any]:
        return {"system": self.label, "admission": self.admission, "eviction": self.eviction}

    def plugin_config(self) -> PluginConfig:
        """The plugin configuration this system emulates."""
        return PluginConfig(policy=self.policy, alpha=self.alpha, alpha_source=self.alpha_source,
                            efficiency=self.efficiency, adaptive_rules=self.rules,
                            retention=None if self.retention_budget is None else SPARSE_DP,
                            retention_budget=self.retention_budget)


_ALPHA_SOURCE = "vllm-align: alpha_source"     # how errors name the parameter (not the plugin's variable)


def _retention(text: str) -> int | None:
    if text.strip().lower() in ("none", "dense"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"vllm-align: retention must be 0, none or a token count, got {text!r}") from None
    if value < 0:
        raise ConfigError(f"vllm-align: retention must be >= 0, got {value}")
    return value


def _tier_bytes(text: str) -> int:
    """``cpu_tier=``: bytes (``8GB``, ``8589934592``); empty or 0: no tier. A positive size under one
    tier chunk is refused when the system is built (:func:`tier_num_chunks`): the chunk's size is
    the layout's block, known only then."""
    if not text.strip():
        return 0
    try:
        value = int(parse_bytes(text))
    except (ConfigError, ValueError) as exc:
        raise ConfigError(f"vllm-align: cpu_tier must be a size in bytes such as 8GB, got {text!r} ({exc})") from None
    if value < 0:
        raise ConfigError(f"vllm-align: cpu_tier must be >= 0 bytes, got {text!r}")
    return value


def _budget(text: str) -> int:
    if not text:
        return DEFAULT_BUDGET
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"vllm-align: budget must be an integer >= 0, got {text!r}") from None
    if value < 0:
        raise ConfigError(f"vllm-align: budget must be >= 0, got {value}")
    return value


@SYSTEMS.register("vllm-align", "vLLM 0.32's hybrid prefix cache (Mamba align mode, block pool, LRU or the "
                                "Marconi plugin), emulated block by block",
                  domains={"block": Domain(0, 1 << 24, integer=True), "blocks": Domain(0, 1 << 30, integer=True),
                           "match_unit": Domain(0, 1 << 24, integer=True), "chunk": Domain(1, 1 << 24, integer=True),
                           "kernel_align": Domain(1, 1 << 16, integer=True),
                           "store_threshold": Domain(0, 1 << 20, integer=True),
                           "alpha": Domain(0, 1e6, words=("adaptive",)), "budget": CHECKPOINT_BUDGET,
                           "retention": Domain(0, 1 << 24, integer=True, words=("none", "sparse-dp"))})
def _vllm_align(block: int = 0, blocks: int = 0, match_unit: int = 0, retention: str = "0",
                shared_prefix: bool = False, chunk: int = 2048, eviction: str = "lru", alpha: str = str(DEFAULT_ALPHA),
                efficiency: str = "total", kernel_align: int = 16, attn_first: bool = False,
                alpha_source: str = "", rules: str = DEFAULT_RULES, budget: str = "", cpu_tier: str = "",
                tier_policy: str = "", tier_rule: str = "", store_threshold: int = 0,
                tier_cold_insert: bool = True, tier_second_chance: bool = True) -> VllmAlignSystem:
    if eviction not in ("lru", "marconi"):
        raise ConfigError(f"vllm-align: eviction must be lru or marconi, got {eviction!r}")
    if efficiency not in EFFICIENCIES:
        raise ConfigError(f"vllm-align: efficiency must be one of {', '.join(EFFICIENCIES)}, got {efficiency!r}")
    if block < 0 or blocks < 0 or match_unit < 0 or chunk <= 0 or kernel_align <= 0:
        raise ConfigError("vllm-align: block, blocks and match_unit must be >= 0; chunk and kernel_align > 0")
    alpha_value = parse_alpha(alpha, "vllm-align: alpha")
    if alpha_source and ":" not in alpha_source:
        raise ConfigError(f"vllm-align: alpha_source must be module:factory, got {alpha_source!r}")
    if alpha_value == ADAPTIVE:
        if eviction != "marconi":
            raise ConfigError("vllm-align: alpha=adaptive picks the plugin's eviction rule online; add eviction=marconi")
        if alpha_source:
            raise ConfigError("vllm-align: alpha=adaptive and alpha_source both name the alpha source; keep one")
        if efficiency != "total":
            raise ConfigError("vllm-align: alpha=adaptive chooses the efficiency with its rules; drop efficiency=")
        try:
            PoolShadowAlpha(rules)           # every rule must map onto the block policy, checked at parse time
        except ConfigError as exc:
            raise ConfigError(f"vllm-align: rules={rules}: {exc}") from None
    elif rules != DEFAULT_RULES:
        raise ConfigError("vllm-align: rules= needs alpha=adaptive")
    if alpha_source:
        load_alpha_factory(alpha_source, _ALPHA_SOURCE)   # a typo fails with the name, before any point runs
    sparse = retention.strip().lower() == SPARSE_DP
    if budget and not sparse:
        raise ConfigError(f"vllm-align: budget= needs retention={SPARSE_DP}")
    retention_budget = _budget(budget) if sparse else None
    options: dict[str, Any] = {"retention_interval": 0 if sparse else _retention(retention), "shared_prefix_checkpoint": shared_prefix,
                               "max_num_batched_tokens": chunk, "kernel_alignment": kernel_align,
                               "mamba_first": False if attn_first else None}   # None: vLLM's order for the model
    if match_unit:
        options["prefix_match_unit"] = match_unit
    cpu_tier_bytes = _tier_bytes(cpu_tier)
    if tier_policy and not cpu_tier_bytes:
        raise ConfigError("vllm-align: tier_policy= needs cpu_tier= (the CPU tier's size, e.g. cpu_tier=8GB)")
    if tier_policy and tier_policy not in TIER_POLICIES:
        raise ConfigError(f"vllm-align: tier_policy must be one of {', '.join(TIER_POLICIES)}, got {tier_policy!r}")
    if store_threshold and not cpu_tier_bytes:
        raise ConfigError("vllm-align: store_threshold= filters the CPU tier's stores; add cpu_tier= (e.g. cpu_tier=8GB)")
    if store_threshold == 1 or store_threshold < 0:
        raise ConfigError(f"vllm-align: store_threshold must be 0 (no filter) or >= 2 (vLLM reads 1 as no filter), "
                          f"got {store_threshold}")
    if tier_rule and tier_policy != "marconi":
        raise ConfigError("vllm-align: tier_rule= is the rule of tier_policy=marconi; add tier_policy=marconi")
    for name, value in (("tier_cold_insert", tier_cold_insert), ("tier_second_chance", tier_second_chance)):
        if not value and tier_policy != "marconi":
            raise ConfigError(f"vllm-align: {name}= switches a part of tier_policy=marconi; add tier_policy=marconi")
    if tier_rule:
        try:
            parse_tier_rule(tier_rule, "vllm-align: tier_rule")          # a fixed rule's label or adaptive
        except ConfigError as exc:
            raise ConfigError(f"vllm-align: tier_rule={tier_rule}: {exc}") from None
    retention_label = f"{SPARSE_DP}(budget={retention_budget})" if sparse else retention
    admission = ("vllm-align(" + ",".join(f"{k}={v}" for k, v in (("block", block or "auto"),
                                                                   ("retention", retention_label),
                                                                   ("chunk", chunk))) + ")")
    if cpu_tier_bytes:
        admission = admission[:-1] + f",cpu_tier={cpu_tier_bytes},tier_policy={tier_policy or 'lru'}"
        admission += f",tier_rule={tier_rule}" if tier_rule else ""
        admission += ",tier_cold_insert=0" if not tier_cold_insert else ""
        admission += ",tier_second_chance=0" if not tier_second_chance else ""
        admission += f",{STORE_THRESHOLD}={store_threshold})" if store_threshold else ")"
    if eviction == "lru":
        eviction_name = "lru"
    elif alpha_source:
        eviction_name = f"marconi-blocks(alpha_source={alpha_source},efficiency={efficiency})"
    elif alpha_value == ADAPTIVE:
        eviction_name = f"marconi-blocks(alpha=adaptive,rules={rules})"
    else:
        eviction_name = f"marconi-blocks(alpha={alpha_value:g},efficiency={efficiency})"
    return VllmAlignSystem("vllm-align", admission, eviction_name, layout_options=tuple(options.items()),
                           block_size=block or None, num_blocks=blocks or None, policy=eviction, alpha=alpha_value,
                           efficiency=efficiency, alpha_source=alpha_source or None, rules=rules,
                           retention_budget=retention_budget, cpu_tier_bytes=cpu_tier_bytes,
                           tier_policy=(tier_policy or "lru") + (f":{STORE_THRESHOLD}={store_threshold}" if store_threshold else ""),
                           tier_rule=tier_rule or DEFAULT_RULE, tier_cold_insert=tier_cold_insert,
                           tier_second_chance=tier_second_chance)
