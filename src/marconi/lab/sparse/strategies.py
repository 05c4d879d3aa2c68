"""The study's strategies: one admission policy each, named for the registry and for the tables."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from marconi.workloads.trace import Trace

__all__ = ["Strategy", "block_sizes"]


@dataclass(frozen=True, slots=True)
class Strategy:
    """One admission policy of the study; ``params`` are the policy's parameters in registry order."""

    family: str
    policy: str
    params: tuple[tuple[str, Any], ...] = ()
    budget: int | None = None
    block: int | None = None
    lam: float | None = None
    break_even_tokens: int | None = None

    @property
    def admission(self) -> str:
        """Registry form: ``sparse-dp:m=4,marconi=false``."""
        return self.policy + (":" + ",".join(f"{k}={_fmt_param(v)}" for k, v in self.params) if self.params else "")

    @property
    def system(self) -> str:
        """The ``custom`` system: ``custom:admission=sparse-dp(m=4;marconi=false),eviction=lru``."""
        inner = ";".join(f"{k}={_fmt_param(v)}" for k, v in self.params)
        return f"custom:admission={self.policy}" + (f"({inner})" if inner else "") + ",eviction=lru"

    @property
    def label(self) -> str:
        if self.budget is not None:
            return f"{self.family} M={self.budget}"
        if self.block is not None:
            return f"{self.family} K={self.block}"
        if self.break_even_tokens is not None:
            return f"{self.family} tau={self.break_even_tokens}"
        return self.family

    def describe(self) -> dict[str, Any]:
        return {"strategy": self.family, "label": self.label, "admission": self.admission, "system": self.system,
                "budget": self.budget, "block": self.block, "lam": self.lam,
                "break_even_tokens": self.break_even_tokens}


def _fmt_param(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def block_sizes(trace: Trace, max_budget: int) -> tuple[int, ...]:
    """Powers of two ``K`` from ``K_max / 2**ceil(log2 max_budget)`` to ``K_max``, the largest power
    of two <= the median sequence length (input + output): about 1 .. max_budget blocks per sequence."""
    lengths = trace.input_lens() + trace.output_lens()
    k_max = 2 ** int(math.floor(math.log2(max(2.0, float(np.median(lengths))))))
    steps = int(math.ceil(math.log2(max(1, max_budget))))
    return tuple(sorted({max(1, k_max >> i) for i in range(steps + 1)}))
