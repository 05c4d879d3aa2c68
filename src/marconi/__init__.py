"""Marconi: prefix caching for hybrid (attention + SSM) LLMs.

Floors, bottom up (docs/architecture.md): ``core``, ``choosers``, ``sparse``, ``workloads``,
``sim``, ``engine``, ``integrations``, the CLI. :mod:`marconi.lab` uses the library; the library
never imports it.
"""

from marconi.core import ConfigError, ModelSpec, PrefixCache, get_model

__all__ = ["PrefixCache", "ModelSpec", "get_model", "ConfigError"]
