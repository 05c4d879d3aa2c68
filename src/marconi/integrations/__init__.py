"""Marconi inside serving engines: what every integration shares, and one package per engine.

* :mod:`~marconi.integrations.common` — what no engine owns: the α-source contract
  (:mod:`~marconi.integrations.common.alpha`), the shadow α source
  (:mod:`~marconi.integrations.common.shadow_alpha`), a server process's life
  (:mod:`~marconi.integrations.common.server`), a streaming completions client
  (:mod:`~marconi.integrations.common.client`) and the paired-replay bench
  (:mod:`~marconi.integrations.common.bench`).
* :mod:`~marconi.integrations.vllm` — the vLLM plugin, its block policy, vLLM's cache emulated
  module by module (``vllm-align``), the bench.

Dependencies point one way: ``vllm`` builds on ``common``, ``common`` on the core
(:mod:`marconi.core`), the selectors and the workloads, never the other way. A new engine (SGLang
next) gets a package beside ``vllm`` and reuses ``common``. Importing this package imports no
engine.
"""
