"""Marconi: prefix caching for hybrid (attention + SSM) LLMs.

Floors, bottom up (docs/architecture.md; a floor imports only floors below it): ``core``; the
plumbing (``io``, ``units``, ``options``, ``commandline``, ``pool``, ``report``); ``workloads``;
``choosers`` and ``sparse``, side by side (the choosers use ``workloads``' ``Request``); ``sim``;
``engine`` and ``integrations``, side by side; ``lab`` (the paper's reproduction: it uses the library,
which never imports it); the CLI (``cli``) on top.
"""

from marconi.core import ConfigError, ModelSpec, PrefixCache, get_model

__all__ = ["PrefixCache", "ModelSpec", "get_model", "ConfigError"]
