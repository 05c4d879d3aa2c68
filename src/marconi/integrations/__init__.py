"""Marconi inside serving engines: what every integration shares, and one package per engine.

* :mod:`~marconi.integrations.common` — a server process's life, a streaming client, the paired
  replay bench and the shadow α source (none of them engine-specific).
* :mod:`~marconi.integrations.vllm` — the vLLM plugin, its policy, vLLM's cache emulated, the bench.

Importing this package imports no engine.
"""
