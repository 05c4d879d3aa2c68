"""The ``sglang-unified`` simulator system: SGLang 0.5.23's hybrid radix cache, by name, with parameters.

Usable wherever a system is named; its options are listed in docs/sglang.md, "The emulation"::

    sglang-unified                                  stock SGLang: no_buffer, page 1, LRU, pools from the capacity
    sglang-unified:eviction=marconi                 the Marconi plugin's default (adaptive, exact worlds)
    sglang-unified:eviction=marconi,alpha=0.5       the plugin at a fixed alpha
    sglang-unified:kv_tokens=50076,mamba_slots=110  exact pools (what `marconi sglang bench` builds)
    sglang-unified:buffer=extra_buffer,page=64      extra_buffer (modelled from SGLang's code; no CPU check)

What is emulated: :mod:`marconi.integrations.sglang.emulate`.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from marconi.core.admission import MatchResult
from marconi.core.cache import PayloadOps, as_tokens
from marconi.core.chooser import RuleChooser
from marconi.core.model import ModelSpec, get_model
from marconi.core.protocol import ReplayCache
from marconi.core.registry import ConfigError, Domain
from marconi.core.stats import CacheStats
from marconi.integrations.sglang.emulate import BUFFERS, PoolExhausted, UnifiedRadixEmulator, emulator_for
from marconi.integrations.sglang.policy import EFFICIENCIES, config_from_words, parse_config
from marconi.integrations.sglang.replay import MAMBA_FULL_MEMORY_RATIO, pool_sizes
from marconi.sim.systems import SYSTEMS

__all__ = ["SglangUnifiedSystem", "SglangUnifiedCache", "UnifiedHandle"]


@dataclass(slots=True, eq=False)
class UnifiedHandle:
    """One request between ``begin`` and ``finish`` (a :class:`~marconi.core.protocol.ReplayHandle`)."""

    request_id: int
    match: MatchResult
    req: Any
    active: bool = True


class SglangUnifiedCache(ReplayCache):
    """The emulation behind the simulator's cache contract. ``begin`` is SGLang's admission,
    ``insert_prefill`` the end-of-prefill checkpoint (run by ``finish`` if the driver did not call it),
    ``finish`` decode and release. ``stats``: reused tokens are SGLang's ``device_prefix_len``,
    ``kv_hit_tokens`` its ``full_kv_hit_length``."""

    def __init__(self, spec: ModelSpec, emulator: UnifiedRadixEmulator, describe: dict[str, Any]) -> None:
        self.spec = spec
        self.emulator = emulator
        self.capacity_bytes = int(emulator.kv_tokens * spec.kv_bytes_per_token
                                  + emulator.mamba_slots * spec.ssm_checkpoint_bytes)
        self.stats = CacheStats()
        self._describe = describe
        self._in_flight: dict[int, UnifiedHandle] = {}
        self._next_id = 0
        source = getattr(emulator.strategy, "alpha_source", None)
        self._chooser: RuleChooser | None = source if isinstance(source, RuleChooser) else None

    @property
    def chooser(self) -> RuleChooser | None:
        return self._chooser

    def begin(self, input_tokens: Any, *, max_hit_len: int | None = None) -> UnifiedHandle:
        """Admit a request (``max_hit_len`` is ignored: SGLang caps a hit at ``len(prompt) - 1`` itself)."""
        tokens = as_tokens(input_tokens, "input_tokens")
        with _infeasible():
            req = self.emulator.admit(tokens)
        m = req.match
        match = MatchResult(m.input_len, m.kv_hit_len, m.hit_len)
        handle = UnifiedHandle(self._next_id, match, req)
        self._next_id += 1
        self._in_flight[handle.request_id] = handle
        self.stats.record_lookup(match, self.spec, from_checkpoint=True)
        return handle

    def insert_prefill(self, handle: UnifiedHandle, **_: Any) -> None:
        with _infeasible():
            self.emulator.prefill_done(handle.req)

    def finish(self, handle: UnifiedHandle, output_tokens: Any = (), **_: Any) -> None:
        if not handle.active or self._in_flight.pop(handle.request_id, None) is not handle:
            raise ValueError(f"request {handle.request_id} is not in flight in this cache")
        handle.active = False
        out = as_tokens(output_tokens, "output_tokens", allow_empty=True)
        with _infeasible():
            self.emulator.complete(handle.req, out)
        self._sync_stats()

    def process(self, input_tokens: Any, output_tokens: Any = ()) -> MatchResult:
        handle = self.begin(input_tokens)
        self.finish(handle, output_tokens)
        return handle.match

    def _sync_stats(self) -> None:
        st, emu, spec = self.stats, self.emulator, self.spec
        c = emu.counters
        st.checkpoints_admitted = c["states_kept"]
        st.checkpoints_evicted = c["evicted:state-leaf"] + c["evicted:state-tombstone"] + c["evicted:kv-leaf"]
        st.evictions_leaf = c["evicted:kv-leaf"] + c["evicted:state-leaf"]
        st.evictions_inner = c["evicted:state-tombstone"]
        kv_bytes = (emu.kv_tokens - emu.kv_free) * spec.kv_bytes_per_token
        ssm_bytes = (emu.mamba_slots - emu.mamba_free) * spec.ssm_checkpoint_bytes
        st.note_usage(kv_bytes + ssm_bytes, kv_bytes, ssm_bytes)

    def describe(self) -> dict[str, Any]:
        return dict(self._describe)

    def check_invariants(self) -> None:
        self.emulator.check_invariants([h.req for h in self._in_flight.values()])


@contextmanager
def _infeasible() -> Iterator[None]:
    """A request the pools cannot hold (after evicting everything unlocked) makes the point infeasible:
    ConfigError, which sweeps report and skip, as for ``vllm-align``."""
    try:
        yield
    except PoolExhausted as exc:
        raise ConfigError(f"sglang-unified: {exc}") from None


@dataclass(frozen=True, slots=True)
class SglangUnifiedSystem:
    """A :class:`~marconi.sim.systems.System` whose cache is the SGLang emulation."""

    label: str
    admission: str
    eviction: str
    buffer: str = "no_buffer"
    page_size: int = 1
    chunk_size: int = 64
    track_interval: int = 256
    ratio: float = MAMBA_FULL_MEMORY_RATIO
    kv_tokens: int = 0
    mamba_slots: int = 0
    policy: str = "lru"
    policy_config: tuple[tuple[str, Any], ...] = ()
    unbounded: bool = field(default=False, init=False)
    needs_future: bool = field(default=False, init=False)
    event_mode: bool = field(default=True, init=False)      # the emulator's prefill lands at insert_prefill

    def pools(self, spec: ModelSpec, capacity_bytes: float) -> tuple[int, int]:
        """``(kv_tokens, mamba_slots)``: the exact pools if given, else SGLang's split of the bytes."""
        kv, slots = pool_sizes(spec, capacity_bytes, 1, self.ratio)
        need = 4 if self.buffer == "extra_buffer" else 2     # what one request in flight holds at its peak
        return self.kv_tokens or kv, self.mamba_slots or max(slots, need)

    def build(self, spec: ModelSpec | str, capacity_bytes: float, *, clock: Callable[[], float] | None = None,
              payloads: PayloadOps | None = None, tuning_workers: int | None = None,
              tuning_mapper: Callable[..., list[Any]] | None = None,
              future: Sequence[Any] | None = None) -> SglangUnifiedCache:
        """A fresh emulated cache; ``clock`` and the tuning workers are not used (SGLang's recency is
        its own access counter); ConfigError with ``payloads`` (it holds none)."""
        if payloads is not None:
            raise ConfigError("sglang-unified is a simulation of SGLang's cache: it holds no real payloads")
        spec = get_model(spec)
        if not spec.has_recurrent_state:     # its pools would be split for states that take no bytes
            raise ConfigError(f"sglang-unified emulates SGLang's hybrid (Mamba) radix cache; {spec.name} has no "
                              "recurrent state, and SGLang serves it from its plain radix cache: use sglang+")
        kv, slots = self.pools(spec, capacity_bytes)
        emulator = emulator_for(spec, kv, slots, policy=self.policy, policy_config=dict(self.policy_config),
                                buffer=self.buffer, page_size=self.page_size, chunk_size=self.chunk_size,
                                track_interval=self.track_interval)
        describe = {"admission": self.admission, "eviction": self.eviction, "kv_tokens": kv, "mamba_slots": slots,
                    "model": spec.name}
        return SglangUnifiedCache(spec, emulator, describe)

    def record_fields(self) -> dict[str, Any]:
        return {"system": self.label, "admission": self.admission, "eviction": self.eviction, "tuning": None}

    def relabel(self, label: str) -> "SglangUnifiedSystem":
        return replace(self, label=label)

    def least_capacity_bytes(self, spec: ModelSpec | str, requests: Sequence[Any]) -> int:
        """The least capacity whose KV pool (SGLang's split, :meth:`pools`) holds the longest of
        ``requests``, input and output (below it the emulator cannot serve it); 0 with a fixed
        ``kv_tokens``, no request, or a model without a recurrent state (refused by :meth:`build`)."""
        spec = get_model(spec)
        if self.kv_tokens or not requests or not spec.has_recurrent_state:
            return 0
        longest = max(len(r.input_tokens) + len(r.output_tokens) for r in requests)
        per_token = max(1, spec.kv_bytes_per_token)         # as pools() divides (a model without KVs: 1)
        least = int(longest * per_token * (1 + self.ratio))
        while self.pools(spec, least)[0] < longest:        # the split's floor division: a byte or two more
            least += per_token
        return least

    def describe(self) -> dict[str, Any]:
        return {"system": self.label, "admission": self.admission, "eviction": self.eviction}


def _eviction(text: str, alpha: str, efficiency: str, rules: str, selector: str = "") -> tuple[str, dict[str, Any]]:
    """``lru`` | ``marconi`` | ``marconi(alpha=X;efficiency=Y;selector=S;rules=Z)`` (+ the separate parameters)
    -> the policy and its ``--radix-eviction-policy-config``, checked by the plugin's own parser."""
    name, paren, rest = text.partition("(")
    params: dict[str, str] = {}
    if paren:
        if not rest.endswith(")"):
            raise ConfigError(f"sglang-unified: unbalanced parentheses in eviction={text!r}: write marconi(alpha=1)")
        for item in filter(str.strip, rest[:-1].split(";")):
            key, eq, value = (part.strip() for part in item.partition("="))
            if not eq or not key or not value:
                raise ConfigError(f"sglang-unified: eviction={text!r}: {item.strip()!r} is not key=value: "
                                  "write marconi(alpha=1;efficiency=marginal)")
            if key in params:
                raise ConfigError(f"sglang-unified: eviction={text!r}: {key} given twice")
            params[key] = value
    if name not in ("lru", "marconi"):
        raise ConfigError(f"sglang-unified: eviction must be lru or marconi, got {name!r}")
    separate = {k: v for k, v in (("alpha", alpha), ("efficiency", efficiency), ("rules", rules),
                                  ("selector", selector)) if v}
    if name == "lru":
        if params or separate:
            raise ConfigError(f"sglang-unified: {', '.join(sorted({*params, *separate}))} need eviction=marconi")
        return "lru", {}
    both = set(params) & set(separate)
    if both:
        raise ConfigError(f"sglang-unified: {', '.join(sorted(both))} given twice (in eviction=… and on its own)")
    params.update(separate)
    config = config_from_words(params, "sglang-unified")
    return "marconi", config


@SYSTEMS.register("sglang-unified", "SGLang 0.5.23's hybrid radix cache (UnifiedRadixCache, FULL + MAMBA: "
                                    "no_buffer/extra_buffer checkpoints, split pools, LRU or the Marconi plugin), "
                                    "emulated node by node",
                  domains={"page": Domain(1, 1 << 16, integer=True), "chunk": Domain(1, 1 << 24, integer=True),
                           "track_interval": Domain(1, 1 << 24, integer=True), "ratio": Domain(0, 1e6, lo_open=True),
                           "kv_tokens": Domain(0, 1 << 40, integer=True), "mamba_slots": Domain(0, 1 << 30, integer=True),
                           "alpha": Domain(0, 1e6, words=("adaptive",))})
def _sglang_unified(buffer: str = "no_buffer", page: int = 1, chunk: int = 64, track_interval: int = 256,
                    ratio: float = MAMBA_FULL_MEMORY_RATIO, kv_tokens: int = 0, mamba_slots: int = 0,
                    eviction: str = "lru", alpha: str = "", efficiency: str = "", rules: str = "",
                    selector: str = "") -> SglangUnifiedSystem:
    if buffer not in BUFFERS:
        raise ConfigError(f"sglang-unified: buffer must be one of {', '.join(BUFFERS)}, got {buffer!r}")
    if buffer == "no_buffer" and page != 1:
        raise ConfigError("sglang-unified: no_buffer needs page=1 (SGLang asserts it); use buffer=extra_buffer")
    if page < 1 or chunk < 1 or track_interval < 1 or kv_tokens < 0 or mamba_slots < 0:
        raise ConfigError("sglang-unified: page, chunk and track_interval must be >= 1; kv_tokens, mamba_slots >= 0")
    if buffer == "extra_buffer" and track_interval < chunk:
        raise ConfigError(f"sglang-unified: track_interval ({track_interval}) must be >= chunk ({chunk}), "
                          "as SGLang's hybrid attention backend asserts")
    if 0 < mamba_slots < (4 if buffer == "extra_buffer" else 2):
        raise ConfigError(f"sglang-unified: mamba_slots={mamba_slots} cannot serve one request "
                          "(no_buffer holds 2 at its peak, extra_buffer 4)")
    if not (np.isfinite(ratio) and ratio > 0):
        raise ConfigError(f"sglang-unified: ratio must be a finite number > 0, got {ratio}")
    if efficiency and efficiency not in EFFICIENCIES:
        raise ConfigError(f"sglang-unified: efficiency must be one of {', '.join(EFFICIENCIES)}, got {efficiency!r}")
    policy, config = _eviction(eviction, alpha, efficiency, rules, selector)
    admission = f"sglang-unified({buffer},page={page}" + (f",track={track_interval}" if buffer == "extra_buffer" else "") + ")"
    if policy == "lru":
        label = "lru"
    else:
        cfg = parse_config(config)
        a = cfg["alpha"]
        label = (f"marconi-radix(alpha=adaptive,selector={cfg['selector']},rules={cfg['rules']})" if a == "adaptive"
                 else f"marconi-radix(alpha={a:g},efficiency={cfg['efficiency']})")
    return SglangUnifiedSystem("sglang-unified", admission, label, buffer=buffer, page_size=page, chunk_size=chunk,
                               track_interval=track_interval, ratio=float(ratio), kv_tokens=kv_tokens,
                               mamba_slots=mamba_slots, policy=policy, policy_config=tuple(sorted(config.items())))

