"""Marconi inside vLLM: a general plugin, vLLM's cache emulated, and a real-server benchmark.

* :mod:`~marconi.integrations.vllm.plugin` — the ``vllm.general_plugins`` entry point (FLOP-aware
  eviction in vLLM's block pool, counters, a Mamba-2 CPU fix); the one module that touches vLLM's
  internals. Configured by environment variables (:mod:`~marconi.integrations.vllm.config`).
* :mod:`~marconi.integrations.vllm.policy` — the eviction decision over vLLM's blocks, shared by the
  plugin and the emulation.
* :mod:`~marconi.integrations.vllm.shadow` — the shadow α source bound to a block pool
  (``MARCONI_VLLM_ALPHA=adaptive``; the engine-agnostic part is
  :mod:`marconi.integrations.common.shadow_alpha`).
* :mod:`~marconi.integrations.vllm.emulate` — vLLM 0.32's hybrid prefix cache in the simulator,
  one module per vLLM module (``request``, ``block_pool``, ``managers``, ``engine``)
  and ``cache``, the :class:`~marconi.core.protocol.ReplayCache` that
  :mod:`~marconi.integrations.vllm.system` registers as the ``vllm-align`` system.
* :mod:`~marconi.integrations.vllm.bench` (``marconi vllm bench``, :mod:`~marconi.integrations.vllm.commands`) —
  a real vLLM server, stock and with the plugin, on a trace file or a catalog trace, measured by
  vLLM's own counters; :mod:`~marconi.integrations.vllm.server` is its launch, and
  :mod:`marconi.integrations.common` runs the servers, the client and the paired replay.
* :mod:`~marconi.integrations.vllm.models` (the tiny random-weight checkpoints) and
  :mod:`~marconi.integrations.vllm.offline` (vLLM's in-process engine on a request file; what the
  plugin costs it is measured in the lab, :mod:`marconi.lab.vllm_overhead`).

Importing this package does not import vLLM (the simulator and the bench client run without it);
it imports none of its modules either.
"""
