"""Marconi inside vLLM: a general plugin, a real-server benchmark, and vLLM's cache emulated.

* :mod:`marconi.integrations.vllm.plugin` — the ``vllm.general_plugins`` entry point (FLOP-aware eviction in
  vLLM's block pool, counters, a Mamba-2 CPU fix); configured by environment variables
  (:mod:`marconi.integrations.vllm.config`).
* :mod:`marconi.integrations.vllm.policy` — the eviction decision, shared by the plugin and the emulation.
* :mod:`marconi.integrations.vllm.emulate` — ``vllm-align``: vLLM 0.32's hybrid prefix cache in the simulator.
* :mod:`marconi.integrations.vllm.bench` — ``marconi vllm bench``: a real vLLM server, stock and with the plugin,
  on a bundled trace, measured by vLLM's own counters.

Importing this package does not import vLLM (the simulator and the bench client run without it).
"""
