"""Marconi inside vLLM: the plugin (:mod:`~marconi.integrations.vllm.plugin`, configured by
:mod:`~marconi.integrations.vllm.config`), its block policy (:mod:`~marconi.integrations.vllm.policy`),
vLLM's cache emulated (:mod:`~marconi.integrations.vllm.emulate`, the ``vllm-align`` system) and a
model-free replay (:mod:`~marconi.integrations.vllm.replay`). Importing it imports neither vLLM nor
its modules.
"""
