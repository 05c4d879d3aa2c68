"""Byte sizes with units, as people type them: ``5GB``, ``10GiB``, ``512MB``, ``1e9``."""

from __future__ import annotations

import re

from marconi.registry import ConfigError

__all__ = ["parse_bytes", "format_bytes", "Capacity", "parse_capacity"]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str | int | float) -> int:
    """``"5GB"`` -> 5_000_000_000 (decimal units; ``GiB`` for binary)."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", text)
        if not m or m.group(2).lower() not in _UNITS:
            raise ConfigError(f"cannot read {text!r} as a size: use e.g. 5GB, 10GiB, 512MB or 1e9")
        value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if value < 0:
        raise ConfigError(f"a size cannot be negative: {text!r}")
    return int(value)


def format_bytes(n: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{int(n)}B"


class Capacity:
    """A cache capacity: absolute bytes, or a fraction of the trace's working set (``0.1x``, ``10%``)."""

    __slots__ = ("label", "absolute", "fraction")

    def __init__(self, label: str, absolute: int | None, fraction: float | None) -> None:
        self.label, self.absolute, self.fraction = label, absolute, fraction

    def resolve(self, working_set_bytes: int) -> int:
        if self.absolute is not None:
            return self.absolute
        assert self.fraction is not None
        return int(self.fraction * working_set_bytes)

    def __repr__(self) -> str:
        return f"Capacity({self.label!r})"


def parse_capacity(text: str) -> Capacity:
    t = text.strip()
    if t.endswith("%"):
        frac = float(t[:-1]) / 100
    elif t.lower().endswith("x"):
        frac = float(t[:-1])
    else:
        return Capacity(t, parse_bytes(t), None)
    if frac <= 0:
        raise ConfigError(f"capacity fraction must be > 0, got {text!r}")
    return Capacity(t, None, frac)
