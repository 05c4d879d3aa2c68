"""``vllm-align``: vLLM 0.32's hybrid prefix cache (Mamba ``align`` mode), emulated block by block.

The block pool, the per-group managers, the hybrid lookup and the scheduler's Mamba-aligned
prefill split, modelled so that the hit counts are vLLM's own, token for token. Each module
mirrors vLLM's (``vllm/v1/core``): :mod:`.request`, :mod:`.block_pool`, :mod:`.managers`,
:mod:`.engine` (:class:`~.engine.VllmAlignEngine`), :mod:`.scheduler` (the step loop with requests
in flight, :func:`~.scheduler.emulate_closed_loop`) and :mod:`.cache` (the engine as the simulator's
``vllm-align`` :class:`~marconi.core.protocol.ReplayCache`). Eviction is vLLM's LRU or the plugin's
own :class:`~marconi.integrations.vllm.policy.BlockEvictionState`. What is modelled and what is not:
docs/vllm.md, "What the emulation models". Import from those modules; this package imports none.
"""
