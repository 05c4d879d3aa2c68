"""Marconi: prefix caching for hybrid (attention + SSM) LLMs.

The floors, bottom up (``docs/architecture.md``): :mod:`marconi.core` (numpy only: the cache an
engine embeds), :mod:`marconi.selectors` (choosing the eviction rule online; the oracle),
:mod:`marconi.sparse` (DP checkpoint placement), :mod:`marconi.workloads` (traces),
:mod:`marconi.sim` (replay, latency, sweeps, named systems), :mod:`marconi.engine` (exact cached
prefill on transformers hybrids), :mod:`marconi.integrations` (vLLM, SGLang),
and the CLI. Apart from the floors, :mod:`marconi.lab` (the paper's reproduction, the studies and
the benches) uses the library; the library never imports it.
"""

from marconi.core import ConfigError, ModelSpec, PrefixCache, get_model

__all__ = ["PrefixCache", "ModelSpec", "get_model", "ConfigError"]
