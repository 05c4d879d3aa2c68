"""Harness and checks that run inside the vLLM environment (``make vllm-peer-test``, the pool driver)."""
