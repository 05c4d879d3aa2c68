"""``vllm-align`` in the simulator: the emulated engine behind the :class:`~marconi.core.protocol.ReplayCache` contract.

:class:`VllmAlignCache` is what ``vllm-align`` systems build (:mod:`marconi.integrations.vllm.system`):
``simulate``, sweeps and miss-ratio curves replay a trace through it exactly as through a
:class:`~marconi.core.cache.PrefixCache`, and its :class:`~marconi.core.stats.CacheStats` count a
lookup the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from marconi.core.admission import MatchResult
from marconi.core.cache import as_tokens
from marconi.core.chooser import RuleChooser
from marconi.core.model import ModelSpec
from marconi.core.protocol import ReplayCache
from marconi.core.registry import ConfigError
from marconi.core.stats import CacheStats
from marconi.integrations.common.alpha import AlphaSource
from marconi.integrations.vllm.emulate.engine import VllmAlignEngine
from marconi.integrations.vllm.emulate.request import RequestState
from marconi.integrations.vllm.layout import VllmLayout
from marconi.integrations.vllm.policy import ATTENTION, DEFAULT_ALPHA, MAMBA

__all__ = ["VllmAlignCache", "AlignHandle"]


@dataclass(slots=True, eq=False)
class AlignHandle:
    """One request between ``begin`` and ``finish`` (a :class:`~marconi.core.protocol.ReplayHandle`)."""

    request_id: int
    tokens: np.ndarray
    match: MatchResult
    req: RequestState
    prefill_checkpoints: tuple[int, ...] = ()
    active: bool = True


class VllmAlignCache(ReplayCache):
    """The emulation behind :class:`~marconi.core.protocol.ReplayCache`: ``begin`` admits a request
    (lookup + prefill allocation), ``finish`` runs its decode and frees its blocks. ``stats``: reused
    tokens are vLLM's hits, ``kv_hit_tokens`` the attention-only matches.
    """

    def __init__(self, spec: ModelSpec, layout: VllmLayout, *, eviction: str = "lru",
                 alpha: float | str | AlphaSource = DEFAULT_ALPHA, efficiency: str = "total",
                 retention_budget: int | None = None) -> None:
        self.spec = spec
        self.layout = layout
        self.engine = VllmAlignEngine(layout, spec, eviction=eviction, alpha=alpha, efficiency=efficiency,
                                      retention_budget=retention_budget)
        self.capacity_bytes = layout.num_blocks * layout.block_bytes
        # An adaptive α source reports its rule switches in the simulator's records (``tuning``).
        source = self.engine.index.alpha_source
        self._chooser: RuleChooser | None = source if isinstance(source, RuleChooser) else None
        self.stats = CacheStats()
        self._in_flight: dict[int, AlignHandle] = {}
        self._next_id = 0

    @property
    def chooser(self) -> RuleChooser | None:
        """The α source when it is a rule chooser (the shadows: their rule switches go into records), else None."""
        return self._chooser

    def add_observer(self, observer: Any) -> None:
        raise ConfigError("vllm-align does not support observers (alpha tuning): give a fixed alpha")

    def begin(self, input_tokens: Any, *, max_hit_len: int | None = None) -> AlignHandle:
        """Admit a request: vLLM's lookup and its whole prefill (``max_hit_len`` is ignored: vLLM caps a
        hit at the prompt's length - 1 itself)."""
        tokens = as_tokens(input_tokens, "input_tokens")
        req, rec = self.engine.admit(tokens)
        # with a CPU tier, its loaded tokens are reused too (they end where a tier state does)
        hit = rec.hit_len + req.tier_hit_len
        match = MatchResult(rec.input_len, max(rec.kv_hit_len, hit), hit)
        handle = AlignHandle(self._next_id, tokens, match, req)
        self._next_id += 1
        self._in_flight[handle.request_id] = handle
        self.stats.record_lookup(match, self.spec, from_checkpoint=True)  # vLLM resumes from a state block
        return handle

    def insert_prefill(self, handle: AlignHandle, **_: Any) -> None:
        """vLLM caches prefill blocks as it computes them: nothing left to do here."""
        return None

    def finish(self, handle: AlignHandle, output_tokens: Any = (), **_: Any) -> None:
        if not handle.active or self._in_flight.pop(handle.request_id, None) is not handle:
            raise ValueError(f"request {handle.request_id} is not in flight in this cache")
        handle.active = False
        self.engine.complete(handle.req, output_tokens)
        self._sync_eviction_stats()

    def process(self, input_tokens: Any, output_tokens: Any = ()) -> MatchResult:
        handle = self.begin(input_tokens)
        self.finish(handle, output_tokens)
        return handle.match

    def _sync_eviction_stats(self) -> None:
        st, pool = self.stats, self.engine.pool.stats
        ev = pool.evictions
        groups = max(1, len(self.engine.mamba_ids))
        st.checkpoints_admitted = pool.blocks_cached.get(MAMBA, 0) // groups
        st.checkpoints_evicted = sum(v for k, v in ev.items() if k.startswith(MAMBA)) // groups
        st.evictions_leaf = sum(v for k, v in ev.items() if k.startswith(ATTENTION) and not k.endswith("kv-inner"))
        st.evictions_inner = ev.get(f"{ATTENTION}:kv-inner", 0)
        st.kv_tokens_evicted = sum(v for k, v in ev.items() if k.startswith(ATTENTION)) * self.layout.block_size
        st.bytes_evicted = pool.num_evicted * self.layout.block_bytes
        used = (self.layout.num_blocks - 1 - self.engine.pool.num_free) * self.layout.block_bytes
        st.peak_bytes = max(st.peak_bytes, used)

    def describe(self) -> dict[str, Any]:
        return {"admission": "vllm-align", "eviction": self.engine.eviction, **self.layout.describe(),
                "capacity_bytes": self.capacity_bytes, "model": self.spec.name}

    def check_invariants(self) -> None:
        self.engine.check_invariants()
