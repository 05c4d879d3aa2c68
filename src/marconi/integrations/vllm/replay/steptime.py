"""How long one scheduler step takes on a named GPU: a roofline over the step's batch.

``overhead_s`` plus the larger of compute (the spans' FLOPs, :meth:`ModelSpec.span_flops`, over
``peak × compute_efficiency``) and memory (weights once, plus each request's KVs and state, over
``bandwidth × memory_efficiency``). A deterministic model that ranks policies, not a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from marconi.core.model import ModelSpec
from marconi.core.registry import ConfigError
from marconi.sim.latency import ACCELERATORS

__all__ = ["GPUS", "GpuSpec", "StepTimeModel"]


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """Dense bf16 peak (FLOP/s) and HBM bandwidth (bytes/s), from the vendors' datasheets."""

    name: str
    peak_flops: float
    bandwidth_bytes_s: float
    memory_bytes: int


GPUS = {
    "a100": GpuSpec("a100", ACCELERATORS["a100"], 2.039e12, 80 * 10**9),
    "h100": GpuSpec("h100", ACCELERATORS["h100"], 3.35e12, 80 * 10**9),
    "h200": GpuSpec("h200", ACCELERATORS["h100"], 4.8e12, 141 * 10**9),   # H100's compute, more and faster HBM
}


@dataclass(frozen=True, slots=True)
class StepTimeModel:
    """Seconds per step for ``spec`` with ``weight_bytes`` of parameters on ``num_gpus`` × ``gpu``
    (tensor parallel: each GPU does ``1/num_gpus`` of the FLOPs and reads ``1/num_gpus`` of the
    bytes; the all-reduces are not modelled)."""

    spec: ModelSpec
    gpu: GpuSpec
    weight_bytes: int
    compute_efficiency: float = 0.5
    memory_efficiency: float = 0.8
    overhead_s: float = 0.002
    num_gpus: int = 1

    def __post_init__(self) -> None:
        if not (0 < self.compute_efficiency <= 1 and 0 < self.memory_efficiency <= 1):
            raise ConfigError("step-time efficiencies must be in (0, 1]")
        if self.weight_bytes < 0 or self.overhead_s < 0:
            raise ConfigError("weight bytes and overhead must be >= 0")
        if self.num_gpus < 1:
            raise ConfigError(f"num_gpus must be >= 1, got {self.num_gpus}")

    @classmethod
    def named(cls, spec: ModelSpec, gpu: str, weight_bytes: int, num_gpus: int = 1) -> "StepTimeModel":
        if gpu not in GPUS:
            raise ConfigError(f"unknown GPU {gpu!r}; known: {', '.join(GPUS)}")
        return cls(spec, GPUS[gpu], weight_bytes, num_gpus=num_gpus)

    def step_s(self, spans: Iterable[tuple[int, int]]) -> float:
        """Seconds for one step that computes token positions ``[start, end)`` of each request."""
        flops = 0.0
        nbytes = float(self.weight_bytes)
        state = self.spec.ssm_checkpoint_bytes
        any_span = False
        for start, end in spans:
            any_span = True
            flops += self.spec.span_flops(start, end)
            nbytes += self.spec.kv_bytes(end) + state
        if not any_span:
            return 0.0
        compute = flops / (self.num_gpus * self.gpu.peak_flops * self.compute_efficiency)
        memory = nbytes / (self.num_gpus * self.gpu.bandwidth_bytes_s * self.memory_efficiency)
        return self.overhead_s + max(compute, memory)
