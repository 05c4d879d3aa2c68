"""Latency models: map the uncached part of a prefill to time-to-first-token.

* :class:`ZeroLatency` — requests complete instantly: the strict sequential replay (match, then
  insert) of the Marconi authors' simulator. The default.
* :class:`RooflineLatency` — prefill FLOPs of the uncached span ÷ (peak FLOP/s × efficiency), plus a
  fixed overhead; decode at a fixed per-token time. Presets for A100 and H100.
* :class:`TableLatency` — a measured TTFT-vs-tokens-prefilled table fitted with a straight line,
  as the paper does with its Jamba-1.5-Mini measurements (``../shared/data/latency``), or the
  engine's own CPU measurements.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from marconi.core.model import ModelSpec
from marconi.core.registry import ConfigError

__all__ = ["LatencyModel", "ZeroLatency", "RooflineLatency", "TableLatency", "make_latency", "ACCELERATORS"]


class LatencyModel(Protocol):
    name: str

    def ttft_s(self, spec: ModelSpec, input_len: int, reused_len: int) -> float:
        """Seconds to prefill ``input_len`` tokens when the first ``reused_len`` are cached."""
        ...

    def decode_s(self, spec: ModelSpec, output_len: int) -> float:
        """Seconds to decode ``output_len`` tokens after the first."""
        ...


class ZeroLatency:
    name = "zero"

    def ttft_s(self, spec: ModelSpec, input_len: int, reused_len: int) -> float:
        return 0.0

    def decode_s(self, spec: ModelSpec, output_len: int) -> float:
        return 0.0


# Dense fp16/bf16 tensor-core peaks (no sparsity), from the vendors' datasheets.
ACCELERATORS = {
    "a100": 312e12,
    "h100": 989e12,
}


@dataclass(frozen=True, slots=True)
class RooflineLatency:
    """Compute-bound prefill: FLOPs of the uncached span at ``efficiency`` of the peak."""

    accelerator: str = "a100"
    efficiency: float = 0.5
    num_devices: int = 1
    overhead_s: float = 0.005
    decode_s_per_token: float = 0.02

    def __post_init__(self) -> None:
        if self.accelerator not in ACCELERATORS:
            raise ConfigError(f"unknown accelerator {self.accelerator!r}; known: {', '.join(ACCELERATORS)}")
        if not 0 < self.efficiency <= 1:
            raise ConfigError(f"efficiency must be in (0, 1], got {self.efficiency}")

    @property
    def name(self) -> str:
        return f"roofline-{self.accelerator}"

    def ttft_s(self, spec: ModelSpec, input_len: int, reused_len: int) -> float:
        flops = spec.span_flops(reused_len, input_len)
        return self.overhead_s + flops / (ACCELERATORS[self.accelerator] * self.efficiency * self.num_devices)

    def decode_s(self, spec: ModelSpec, output_len: int) -> float:
        return max(0, output_len - 1) * self.decode_s_per_token


@dataclass(frozen=True, slots=True)
class TableLatency:
    """TTFT = a + b · (tokens to prefill), least-squares fitted to a measured table."""

    intercept_s: float
    slope_s_per_token: float
    name: str = "table"
    decode_s_per_token: float = 0.02

    @classmethod
    def from_csv(cls, path: str | Path, *, name: str | None = None) -> "TableLatency":
        """Read a CSV with a tokens column and a TTFT column in ms (``*_ms``) or s, and fit a line."""
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"latency table {path} not found")
        with path.open() as fh:
            rows = list(csv.DictReader(fh))
        if not rows:
            raise ConfigError(f"{path}: empty latency table")
        cols = list(rows[0])
        tok_col = next((c for c in cols if "token" in c.lower()), None)
        ttft_col = next((c for c in cols if "ttft" in c.lower() or "latency" in c.lower() or c.endswith("_ms")), None)
        if tok_col is None or ttft_col is None:
            raise ConfigError(f"{path}: need a tokens column and a TTFT column, found {cols}")
        x = np.array([float(r[tok_col]) for r in rows])
        y = np.array([float(r[ttft_col]) for r in rows])
        if ttft_col.lower().endswith("ms") or "_ms" in ttft_col.lower():
            y = y / 1000.0
        slope, intercept = np.polyfit(x, y, 1)
        return cls(float(intercept), float(slope), name or f"table:{path.stem}")

    def ttft_s(self, spec: ModelSpec, input_len: int, reused_len: int) -> float:
        return max(0.0, self.intercept_s + self.slope_s_per_token * (input_len - reused_len))

    def decode_s(self, spec: ModelSpec, output_len: int) -> float:
        return max(0, output_len - 1) * self.decode_s_per_token


def make_latency(text: str | LatencyModel | None) -> LatencyModel:
    """``zero``, ``a100``, ``h100``, ``a100:efficiency=0.4``, or ``table:PATH.csv``."""
    if text is None:
        return ZeroLatency()
    if not isinstance(text, str):
        return text
    if text == "zero":
        return ZeroLatency()
    if text.startswith("table:"):
        return TableLatency.from_csv(text.removeprefix("table:"))
    name, _, rest = text.partition(":")
    if name not in ACCELERATORS:
        raise ConfigError(f"unknown latency model {text!r}: use zero, {', '.join(ACCELERATORS)} or table:PATH.csv")
    kwargs: dict[str, float] = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        if key not in ("efficiency", "num_devices", "overhead_s", "decode_s_per_token"):
            raise ConfigError(f"latency {name}: unknown parameter {key!r}; valid: efficiency, num_devices, "
                              "overhead_s, decode_s_per_token")
        kwargs[key] = int(value) if key == "num_devices" else float(value)
    return RooflineLatency(accelerator=name, **kwargs)  # type: ignore[arg-type]
