"""Marconi inside vLLM: a general plugin, vLLM's cache emulated, and a real-server benchmark.

* :mod:`~marconi.integrations.vllm.plugin` — the ``vllm.general_plugins`` entry point, the one
  module that touches vLLM's internals, configured by :mod:`~marconi.integrations.vllm.config`;
* :mod:`~marconi.integrations.vllm.policy` — the eviction decision over vLLM's blocks, shared by
  the plugin and the emulation (:mod:`~marconi.integrations.vllm.emulate`, the ``vllm-align`` system);
* :mod:`~marconi.integrations.vllm.bench`, :mod:`~marconi.integrations.vllm.replay` — a real server
  and vLLM's own scheduler on a trace.

Importing this package imports neither vLLM nor any of its modules.
"""
