"""``--gpu-memory``'s arithmetic: what vLLM's KV cache gets of a GPU's memory, in both environments.

One check, three callers: ``marconi vllm replay`` refuses a GPU that cannot hold the weights on the
host, before its worker starts (:class:`~marconi.integrations.vllm.replay.run.ReplayConfig`); the
worker's executor budgets with it (:mod:`~marconi.integrations.vllm.replay.engine`, with vLLM's own
parameter count); ``marconi vllm diagnose`` sizes its pool with it. Imports nothing from vLLM.
"""

from __future__ import annotations

import math
from typing import Any

from marconi.core.registry import ConfigError
from marconi.units import format_bytes, parse_bytes

__all__ = ["ACTIVATION_RESERVE_BYTES", "GPU_MEMORY_UTILIZATION", "BUNDLED_NUM_PARAMS", "parse_gpu_memory",
           "available_kv_bytes", "estimated_num_params"]

#: What ``--gpu-memory`` keeps aside for activations, the CUDA graphs' pool and the allocator's
#: fragmentation, beside the weights (vLLM measures this by profiling a forward pass; we cannot).
ACTIVATION_RESERVE_BYTES = 4 * 2**30

#: vLLM's ``gpu_memory_utilization`` default: the share of a GPU's memory it takes.
GPU_MEMORY_UTILIZATION = 0.9

#: Parameters of the bundled configs (``data/configs``), as vLLM 0.32 counts them (the replay worker's
#: ``num_params``), so the host's arithmetic (``vllm diagnose --gpu-memory``, the replay's checks)
#: gives vLLM's pool; others are estimated from config.json (:func:`estimated_num_params`).
BUNDLED_NUM_PARAMS = {"nemotron-h-8b": 8_100_852_736, "falcon-h1-7b": 7_585_906_784,
                      "qwen3-next-80b-a3b": 79_674_391_296}


def parse_gpu_memory(text: str) -> int:
    """``--gpu-memory`` in bytes: one GPU's memory as a size (80GB, 141GiB); ConfigError naming the flag."""
    try:
        return parse_bytes(text)
    except ConfigError as exc:
        raise ConfigError(f"--gpu-memory: {exc} (one GPU's memory: 80GB)") from None


def available_kv_bytes(gpu_memory_bytes: int, num_params: int, bytes_per_param: int, *,
                       tensor_parallel: int = 1, gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
                       activation_reserve_bytes: int = ACTIVATION_RESERVE_BYTES,
                       weight_flag: str | None = "--weight-bytes") -> int:
    """vLLM's KV budget, in bytes of the whole model's KV cache: per GPU ``utilization × memory −
    weights / TP − activation reserve``, times ``tensor_parallel``.

    Weights are ``num_params × bytes_per_param`` (1 for FP8), split over the GPUs; the activation
    reserve is an estimate where vLLM profiles. Under tensor parallelism each GPU's blocks are
    ``1/TP`` of the model's, so the pool has as many blocks as one GPU with ``TP ×`` the budget;
    that holds only where TP divides every layer's KV and recurrent heads (the caller checks it).

    Raises:
        ConfigError: nothing is left for the KV cache; the message names ``--gpu-memory`` (with the
            least that fits), ``--tensor-parallel`` and ``weight_flag`` (None: a caller without one).
    """
    if tensor_parallel < 1:
        raise ConfigError(f"--tensor-parallel must be >= 1, got {tensor_parallel}")
    weights = num_params * bytes_per_param
    left = int(gpu_memory_utilization * gpu_memory_bytes) - weights // tensor_parallel - activation_reserve_bytes
    if left <= 0:
        least = math.ceil((weights // tensor_parallel + activation_reserve_bytes + 1) / gpu_memory_utilization / 1e9)
        split = f" split over {tensor_parallel} GPUs" if tensor_parallel > 1 else ""
        fp8 = f", or FP8 weights ({weight_flag} 1)" if weight_flag and bytes_per_param > 1 else ""
        raise ConfigError(f"--gpu-memory {format_bytes(gpu_memory_bytes)} per GPU: {gpu_memory_utilization:g} of it "
                          f"does not hold {num_params / 1e9:.1f}B parameters ({weights / 1e9:.1f} GB at "
                          f"{bytes_per_param} bytes each{split}) and the {activation_reserve_bytes / 2**30:.0f} GiB "
                          f"activation reserve: give --gpu-memory {least}GB or more, a larger --tensor-parallel"
                          f"{fp8}")
    return left * tensor_parallel


def estimated_num_params(model: str, config_json: dict[str, Any]) -> int:
    """The model's parameters: a bundled config's (:data:`BUNDLED_NUM_PARAMS`), else a dense
    transformer's estimate from ``config.json`` (``12·h²·layers + 2·vocab·h``)."""
    if model in BUNDLED_NUM_PARAMS:
        return BUNDLED_NUM_PARAMS[model]
    h = int(config_json.get("hidden_size", 4096))
    layers = int(config_json.get("num_hidden_layers", 32))
    vocab = int(config_json.get("vocab_size", 32000))
    return 12 * h * h * layers + 2 * vocab * h
