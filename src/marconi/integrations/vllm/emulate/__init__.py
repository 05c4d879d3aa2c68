"""``vllm-align``: vLLM 0.32's hybrid prefix cache (Mamba ``align`` mode), emulated block by block.

Hit counts are vLLM's own, token for token. Each module mirrors vLLM's (``vllm/v1/core``):
:mod:`.request`, :mod:`.block_pool`, :mod:`.managers`, :mod:`.engine`, :mod:`.scheduler` (requests in
flight) and :mod:`.cache` (the simulator's ``vllm-align`` cache). Eviction is vLLM's LRU or the
plugin's own :class:`~marconi.integrations.vllm.policy.BlockEvictionState`. What is modelled:
docs/vllm.md, "What the emulation models". This package imports none of its modules.
"""
