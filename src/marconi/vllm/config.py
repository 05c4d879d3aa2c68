"""The plugin's configuration: environment variables, read once per process, validated.

vLLM loads general plugins in every process it starts (API server, engine core, workers), before
any command-line option of ours could reach them, so configuration travels in the environment:

=================================  =================================================================
variable                           meaning
=================================  =================================================================
``MARCONI_VLLM_POLICY``            unset/empty: the plugin changes nothing (stock vLLM);
                                   ``lru``: vLLM's own eviction, observed (counters, trace);
                                   ``marconi``: FLOP-aware eviction among cached free blocks
``MARCONI_VLLM_ALPHA``             α, a number >= 0 (default 0.5)
``MARCONI_VLLM_ALPHA_SOURCE``      ``module:factory`` returning an :class:`~marconi.vllm.policy.AlphaSource`
                                   (called as ``factory(spec, config)``); overrides ``MARCONI_VLLM_ALPHA``
``MARCONI_VLLM_EFFICIENCY``        ``total`` (default, the paper's) or ``marginal``
``MARCONI_VLLM_TRACE``             a path: the engine core appends every block-pool event as JSONL
``MARCONI_VLLM_MAMBA2_CPU_FIX``    ``auto`` (default) or ``off``: see :mod:`marconi.vllm.plugin`
=================================  =================================================================
"""

from __future__ import annotations

import importlib
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from marconi.registry import ConfigError
from marconi.vllm.policy import DEFAULT_ALPHA, EFFICIENCIES, POLICIES, AlphaSource, FixedAlpha

__all__ = ["PluginConfig", "ENV_POLICY", "ENV_ALPHA", "ENV_ALPHA_SOURCE", "ENV_EFFICIENCY", "ENV_TRACE",
           "ENV_MAMBA2_CPU_FIX"]

ENV_POLICY = "MARCONI_VLLM_POLICY"
ENV_ALPHA = "MARCONI_VLLM_ALPHA"
ENV_ALPHA_SOURCE = "MARCONI_VLLM_ALPHA_SOURCE"
ENV_EFFICIENCY = "MARCONI_VLLM_EFFICIENCY"
ENV_TRACE = "MARCONI_VLLM_TRACE"
ENV_MAMBA2_CPU_FIX = "MARCONI_VLLM_MAMBA2_CPU_FIX"



@dataclass(frozen=True, slots=True)
class PluginConfig:
    """What the plugin does in this process. ``policy=None``: nothing (stock vLLM)."""

    policy: str | None = None
    alpha: float = DEFAULT_ALPHA
    alpha_source: str | None = None
    efficiency: str = "total"
    trace_path: str | None = None
    mamba2_cpu_fix: bool = True

    def __post_init__(self) -> None:
        if self.policy is not None and self.policy not in POLICIES:
            raise ConfigError(f"{ENV_POLICY}={self.policy!r}: choose one of {', '.join(POLICIES)} (or leave it "
                              "unset for stock vLLM)")
        if not math.isfinite(self.alpha) or self.alpha < 0:
            raise ConfigError(f"{ENV_ALPHA}={self.alpha!r}: alpha must be a finite number >= 0")
        if self.efficiency not in EFFICIENCIES:
            raise ConfigError(f"{ENV_EFFICIENCY}={self.efficiency!r}: choose one of {', '.join(EFFICIENCIES)}")
        if self.alpha_source is not None and ":" not in self.alpha_source:
            raise ConfigError(f"{ENV_ALPHA_SOURCE}={self.alpha_source!r}: write module:factory")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "PluginConfig":
        env = os.environ if env is None else env
        policy = env.get(ENV_POLICY, "").strip().lower() or None
        raw_alpha = env.get(ENV_ALPHA, "").strip()
        try:
            alpha = float(raw_alpha) if raw_alpha else DEFAULT_ALPHA
        except ValueError:
            raise ConfigError(f"{ENV_ALPHA}={raw_alpha!r}: not a number") from None
        fix = env.get(ENV_MAMBA2_CPU_FIX, "auto").strip().lower()
        if fix not in ("auto", "off"):
            raise ConfigError(f"{ENV_MAMBA2_CPU_FIX}={fix!r}: choose auto or off")
        return cls(policy=policy, alpha=alpha, alpha_source=env.get(ENV_ALPHA_SOURCE, "").strip() or None,
                   efficiency=env.get(ENV_EFFICIENCY, "total").strip().lower() or "total",
                   trace_path=env.get(ENV_TRACE, "").strip() or None, mamba2_cpu_fix=fix == "auto")

    def to_env(self) -> dict[str, str]:
        """The environment that reproduces this configuration (for launching a server)."""
        env = {ENV_POLICY: self.policy or "", ENV_ALPHA: repr(self.alpha), ENV_EFFICIENCY: self.efficiency,
               ENV_MAMBA2_CPU_FIX: "auto" if self.mamba2_cpu_fix else "off"}
        if self.alpha_source:
            env[ENV_ALPHA_SOURCE] = self.alpha_source
        if self.trace_path:
            env[ENV_TRACE] = self.trace_path
        return env

    def make_alpha_source(self, spec: Any) -> AlphaSource:
        """The configured α source: ``factory(spec, config)`` if given, else a fixed α."""
        if self.alpha_source is None:
            return FixedAlpha(self.alpha)
        module_name, _, attr = self.alpha_source.partition(":")
        try:
            factory: Callable[..., AlphaSource] = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"{ENV_ALPHA_SOURCE}={self.alpha_source!r}: cannot load it ({exc})") from None
        source = factory(spec, self)
        if not (callable(getattr(source, "alpha", None)) and callable(getattr(source, "observe", None))):
            raise ConfigError(f"{ENV_ALPHA_SOURCE}={self.alpha_source!r} returned {source!r}, which lacks "
                              "alpha() and observe(event)")
        return source
