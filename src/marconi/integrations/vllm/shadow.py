"""The shadow α source bound to a vLLM block pool (``MARCONI_VLLM_ALPHA=adaptive``).

:class:`~marconi.integrations.common.shadow_alpha.ShadowAlpha` is engine-agnostic; this adds what
vLLM decides: its rules are applied by the block policy (:func:`~marconi.integrations.vllm.policy.block_rule`:
``lru``, ``aX``, ``aXm``), and its shadow holds the bytes of the pool it serves, as ``vllm-align``
counts them (:func:`~marconi.integrations.vllm.layout.pool_capacity_bytes`: ``(num_blocks - 1) ×
block bytes``, vLLM's null block excluded). The plugin and the emulation both build it through
:meth:`marconi.integrations.vllm.config.PluginConfig.make_alpha_source`, and the
:class:`~marconi.integrations.vllm.policy.BlockEvictionState` it serves binds it once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from marconi.core.eviction import EvictionRule
from marconi.core.registry import ConfigError
from marconi.integrations.common.prefix_delta import PrefixTokens
from marconi.integrations.common.shadow_alpha import ShadowAlpha
from marconi.integrations.vllm.layout import pool_capacity_bytes
from marconi.integrations.vllm.policy import block_rule

if TYPE_CHECKING:
    from marconi.integrations.vllm.policy import BlockEvictionState

__all__ = ["PoolShadowAlpha"]


class PoolShadowAlpha(ShadowAlpha):
    """A :class:`~marconi.integrations.common.shadow_alpha.ShadowAlpha` whose rules map onto vLLM's
    block policy and whose shadow is sized by the pool that binds it.

    Args:
        rules: the family, as ``MARCONI_VLLM_ADAPTIVE_RULES`` (``"default"`` = ``lru/a0.5m/a2m``).
        decay, hysteresis: the regret chooser's.
        lag: requests by which a rule switch takes effect (``MARCONI_VLLM_ADAPTIVE_LAG``; see
            :class:`~marconi.integrations.common.shadow_alpha.ShadowAlpha`).
        tokens: how an in-process replay reads vLLM's token lists (default: a new
            :class:`~marconi.integrations.common.prefix_delta.PrefixTokens`).

    Raises:
        ConfigError: a rule the block policy cannot apply (``no counterpart in vLLM's block pool``).
    """

    def __init__(self, rules: str | Sequence[EvictionRule] = "default", *, decay: float = 0.999,
                 hysteresis: float = 0.05, lag: int = 0, tokens: PrefixTokens | None = None) -> None:
        super().__init__(rules, rule_map=block_rule, decay=decay, hysteresis=hysteresis, lag=lag, tokens=tokens)

    def bind(self, state: "BlockEvictionState") -> None:
        """Build the shadow for ``state``'s model and pool (once; ConfigError on a second pool, or
        when the pool is too small for a shadow)."""
        if self.started:
            raise ConfigError("an adaptive alpha source serves one block pool; build one per pool")
        capacity = pool_capacity_bytes(state.spec, state.num_blocks, state.block_size)
        try:
            self.start(state.spec, capacity)
        except ConfigError as exc:
            raise ConfigError(f"adaptive alpha: the shadow of a {state.num_blocks}-block pool cannot be built: "
                              f"{exc}") from None
