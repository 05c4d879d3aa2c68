"""vLLM's engine core without a model: its own KV cache config, ``Scheduler``, ``KVCacheManager`` and ``BlockPool``.

Runs in the vLLM environment. :func:`build_engine_core` builds vLLM's ``EngineCore`` (general plugins
loaded, as in a server) around :class:`StubExecutor`, whose model is the real vLLM class on the
``meta`` device, so the ``KVCacheConfig`` is vLLM's own: nothing is mirrored.
"""

from __future__ import annotations

import atexit
import functools
import os
import tempfile
from pathlib import Path
from typing import Any

# The arithmetic is vLLM-free (the host checks --gpu-memory with it before a worker starts); the
# executor below budgets with it, by vLLM's own parameter count.
from marconi.integrations.vllm.replay.gpu_memory import ACTIVATION_RESERVE_BYTES, available_kv_bytes

__all__ = ["StubExecutor", "build_engine_core", "kv_config_summary", "available_kv_bytes", "ACTIVATION_RESERVE_BYTES"]


def _executor_base() -> type:
    from vllm.v1.executor.abstract import Executor

    return Executor


@functools.cache
def _dist_store() -> str:
    """The file gloo's store lives in, one per process (vLLM initialises torch.distributed once and
    skips it for later engines), removed when the process exits: torch removes it only when the
    process group is destroyed, which a replay or bench process never does (one was left in the
    temporary folder per run)."""
    store = tempfile.mktemp(prefix="marconi-replay-dist-")
    atexit.register(Path(store).unlink, missing_ok=True)
    return store


class StubExecutor(_executor_base()):  # type: ignore[misc]
    """An executor with the model's layers on the ``meta`` device and no forward pass (the replay
    drives the scheduler itself). :func:`build_engine_core` sets the class attributes below."""

    uses_ray = False
    supports_pp = False
    available_bytes = 1 << 40                   # determine_available_memory's (ignored under num_gpu_blocks_override)
    gpu_memory_bytes: int | None = None         # set: the KV budget is available_kv_bytes(...) of it
    tensor_parallel = 1                         # GPUs the weights and heads are split over (arithmetic only)
    weight_bytes_per_param: int | None = None   # None: the model dtype's (2 for bf16); 1 for FP8 weights

    def _init_executor(self) -> None:
        import torch
        from vllm.config.vllm import set_current_vllm_config
        from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
        from vllm.model_executor.model_loader.utils import initialize_model
        from vllm.platforms import current_platform

        vc = self.vllm_config
        with set_current_vllm_config(vc):
            init_distributed_environment(1, 0, f"file://{_dist_store()}", 0, "gloo")
            ensure_model_parallel_initialized(1, 1)
            with torch.device("meta"):
                self.model = initialize_model(vc)
        # As the uniproc executor does after load_model: align the hybrid block and Mamba page sizes.
        current_platform.update_block_size_for_backend(vc)
        self.num_params = int(sum(p.numel() for p in self.model.parameters()))

    def _kv_cache_spec(self) -> dict[str, Any]:
        # The model runner's get_kv_cache_spec, minus KV sharing (no supported hybrid uses it).
        from vllm.config.vllm import get_layers_from_vllm_config
        from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
        from vllm.v1.kv_cache_interface import AttentionSpec
        from vllm.v1.worker.utils import customize_attention_spec

        specs: dict[str, Any] = {}
        for name, layer in get_layers_from_vllm_config(self.vllm_config, AttentionLayerBase).items():
            if getattr(layer, "kv_sharing_target_layer_name", None):
                raise NotImplementedError(f"layer {name} shares another layer's KV cache: not supported here")
            spec = layer.get_kv_cache_spec(self.vllm_config)
            if spec is None:
                continue
            if isinstance(spec, AttentionSpec):
                spec = customize_attention_spec(layer.get_attn_backend(), spec)
            specs[name] = spec
        return specs

    def get_kv_cache_specs(self) -> list[dict[str, Any]]:
        return [self._kv_cache_spec()]

    def determine_available_memory(self) -> list[int]:
        """The KV budget, raised (``floor_applied``) to what vLLM needs for one request of
        ``max_model_len`` if it is smaller: vLLM would refuse to start, and a tight fraction of a
        trace's working set (``--capacity 0.05x``) can be below that."""
        if self.gpu_memory_bytes is not None:
            budget = available_kv_bytes(self.gpu_memory_bytes, self.num_params, self.bytes_per_param,
                                        tensor_parallel=self.tensor_parallel)
        else:
            budget = int(self.available_bytes)
        floor = kv_memory_floor(self.vllm_config, self._kv_cache_spec())
        self.requested_bytes, self.floor_applied = budget, floor > budget
        return [max(budget, floor)]

    @property
    def bytes_per_param(self) -> int:
        """Bytes one weight takes: ``weight_bytes_per_param`` if set, else the model dtype's."""
        if self.weight_bytes_per_param is not None:
            return int(self.weight_bytes_per_param)
        return 4 if str(self.vllm_config.model_config.dtype).endswith("float32") else 2

    def get_supported_kv_cache_layouts(self) -> list[list[str]]:
        return [["NHD"]]

    def set_kv_cache_layout(self, layout_name: str, *_: Any) -> None:
        """vLLM 0.33 also passes the context-parallel interleave size; nothing runs a kernel here."""

    def initialize_from_config(self, kv_cache_configs: list[Any]) -> None:
        pass

    def compile_or_warm_up_model(self) -> None:
        pass

    def collective_rpc(self, method: Any, timeout: float | None = None, args: tuple = (),
                       kwargs: dict | None = None, non_block: bool = False) -> Any:
        return [None]

    def check_health(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


def kv_memory_floor(vllm_config: Any, kv_cache_spec: dict[str, Any]) -> int:
    """The smallest KV budget vLLM starts with: one ``max_model_len`` request plus the null block,
    by the functions ``get_kv_cache_configs`` checks the budget with (vLLM privates, 0.32 or 0.33)."""
    try:
        from vllm.v1.core import kv_cache_planning as plan          # vLLM >= 0.33
    except ImportError:
        from vllm.v1.core import kv_cache_utils as kcu              # vLLM 0.32

        groups = kcu.get_kv_cache_groups(vllm_config, kv_cache_spec)
        return int(kcu._max_memory_usage_bytes_from_groups(vllm_config, groups)
                   + kcu._pool_bytes_per_block(vllm_config, groups))
    from vllm.v1.core.kv_cache_config_builder import get_kv_cache_config_builder

    builder = get_kv_cache_config_builder(vllm_config)
    groups = plan.get_kv_cache_groups(vllm_config, kv_cache_spec)
    return int(plan._max_memory_usage_bytes_from_groups(builder, vllm_config, groups)
               + plan._pool_bytes_per_block_from_builder(builder, vllm_config, groups))


def build_engine_core(model_dir: str, *, num_blocks: int | None = None, available_bytes: int | None = None,
                      gpu_memory_bytes: int | None = None, tensor_parallel: int = 1,
                      weight_bytes_per_param: int | None = None, max_model_len: int = 8192, max_num_batched_tokens: int = 2048, max_num_seqs: int = 256,
                      block_size: int | None = None, dtype: str = "bfloat16", retention_interval: int | None = 0,
                      offload_extra_config: dict[str, Any] | None = None) -> Any:
    """vLLM's ``EngineCore`` for the model in ``model_dir`` (only its ``config.json`` is read), with
    prefix caching, chunked prefill, the general plugins and :class:`StubExecutor`.

    Give one of ``num_blocks`` (null block included), ``available_bytes`` (the KV budget) or
    ``gpu_memory_bytes`` (budget by :func:`available_kv_bytes`). ``retention_interval``: vLLM's
    ``prefix_cache_retention_interval`` (None: dense). ``offload_extra_config``: a CPU tier, vLLM's
    ``OffloadingConnector`` with this ``kv_connector_extra_config`` (None: no tier).
    """
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.core import EngineCore

    if sum(x is not None for x in (num_blocks, available_bytes, gpu_memory_bytes)) != 1:
        raise ValueError("give exactly one of num_blocks, available_bytes, gpu_memory_bytes")
    if available_bytes is not None and available_bytes <= 0:  # never the class's 1 TiB stand-in (issue 31, bug 5)
        raise ValueError(f"available_bytes must be > 0 (a KV budget of {available_bytes} bytes holds no block): "
                         "raise --capacity")
    kwargs: dict[str, Any] = {}
    if block_size is not None:
        kwargs["block_size"] = block_size
    if retention_interval != 0:
        kwargs["prefix_cache_retention_interval"] = retention_interval
    if offload_extra_config is not None:
        from vllm.config import KVTransferConfig

        kwargs["kv_transfer_config"] = KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both",
                                                        kv_connector_extra_config=dict(offload_extra_config))
    args = EngineArgs(model=model_dir, skip_tokenizer_init=True, enable_prefix_caching=True,
                      enable_chunked_prefill=True, max_model_len=max_model_len, dtype=dtype,
                      num_gpu_blocks_override=num_blocks, max_num_batched_tokens=max_num_batched_tokens,
                      max_num_seqs=max_num_seqs, load_format="dummy", enforce_eager=True, **kwargs)
    vllm_config = args.create_engine_config()
    executor = type("StubExecutor", (StubExecutor,), {"available_bytes": StubExecutor.available_bytes if available_bytes is None
                                                                 else available_bytes,
                                                            "gpu_memory_bytes": gpu_memory_bytes,
                                                            "tensor_parallel": tensor_parallel,
                                                            "weight_bytes_per_param": weight_bytes_per_param})
    return EngineCore(vllm_config, executor, log_stats=True)


def kv_config_summary(kv_cache_config: Any, block_size: int) -> dict[str, Any]:
    """The parts of a ``KVCacheConfig`` that decide caching, as JSON: the pool's blocks, the
    scheduler's block size, each group's layers and spec (type, block size, page bytes, fields)."""
    import dataclasses

    groups = []
    for group in kv_cache_config.kv_cache_groups:
        spec = group.kv_cache_spec
        fields = {f.name: _plain(getattr(spec, f.name)) for f in dataclasses.fields(spec)}
        groups.append({"layers": list(group.layer_names), "spec": type(spec).__name__,
                       "block_size": int(spec.block_size), "page_size_bytes": int(spec.page_size_bytes),
                       "fields": fields})
    tensors = [{"size": int(t.size), "layers": list(t.shared_by if hasattr(t, "shared_by") else t.layers)}
               for t in kv_cache_config.kv_cache_tensors]
    # The groups alias one buffer from byte 0 (vLLM 0.32+: every tensor entry spans the whole pool,
    # each group uses a block id for its own layers), so the pool is the largest entry, not their sum.
    return {"num_blocks": int(kv_cache_config.num_blocks), "block_size": int(block_size), "groups": groups,
            "tensors": tensors, "pool_bytes": int(max((t["size"] for t in tensors), default=0))}


def _plain(value: Any) -> Any:
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return str(value)
