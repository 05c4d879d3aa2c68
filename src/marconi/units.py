"""Byte sizes with units, as people type them: ``5GB``, ``10GiB``, ``512MB``, ``1e9``."""

from __future__ import annotations

import argparse
import math
import re

from marconi.core.registry import ConfigError, Domain

__all__ = ["parse_bytes", "format_bytes", "Capacity", "parse_capacity", "request_limit", "MAX_CAPACITY_BYTES",
           "MAX_CAPACITY_FRACTION"]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15, "eb": 10**18,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50, "eib": 2**60}
_NUMBER = r"[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?"  # no sign, no inf/nan, no "1_000": what people type

# Sane bounds, so a typo fails at parse time instead of deep inside a run (1e30 bytes overflowed
# int64 there; 1e400 is infinity). A capacity beyond a petabyte-scale cluster's memory, or beyond
# 1000x the trace's working set (anything above 1x already evicts nothing), is a mistake.
MAX_CAPACITY_BYTES = 10**18        # 1 EB
MAX_CAPACITY_FRACTION = 1000.0     # of the working set


#: A size written with a decimal point and no unit (``0.9``, ``1.5``): as bytes it would be cut to a whole
#: number (0, 1), so a unit (or, for a capacity, an ``x``) was left off.
_BARE_DECIMAL = re.compile(r"\s*(?:[0-9]*\.[0-9]+|[0-9]+\.)\s*")


def parse_bytes(text: str | int | float) -> int:
    """``"5GB"`` -> 5_000_000_000 (decimal units; ``GiB`` binary); finite, >= 0, at most
    :data:`MAX_CAPACITY_BYTES` (1 EB); ConfigError otherwise, and for text with a decimal point and no
    unit (``"0.9"``: 0 bytes once cut)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    elif _BARE_DECIMAL.fullmatch(str(text)):
        t = str(text).strip()
        raise ConfigError(f"{t!r} has no unit, and a size in bytes is a whole number: give a size such as {t}GB")
    else:
        m = re.fullmatch(rf"\s*({_NUMBER})\s*([A-Za-z]*)\s*", str(text))
        if not m or m.group(2).lower() not in _UNITS:
            raise ConfigError(f"cannot read {text!r} as a size: use e.g. 5GB, 10GiB, 512MB or 1e9")
        value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if math.isnan(value) or value < 0:
        raise ConfigError(f"a size must be a number >= 0, got {text!r}")
    if value > MAX_CAPACITY_BYTES:
        raise ConfigError(f"size {text!r} is larger than {MAX_CAPACITY_BYTES:.0e} bytes (1 EB): "
                          "use e.g. 10GB, or a fraction of the working set such as 0.5x")
    return int(value)


def format_bytes(n: float) -> str:
    for unit, size in (("EB", 1e18), ("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
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
    """``"10GB"`` (:func:`parse_bytes`), ``"0.1x"`` or ``"10%"`` (of the working set; finite, > 0, at
    most :data:`MAX_CAPACITY_FRACTION`); ConfigError listing the forms otherwise."""
    t = str(text).strip()
    if t.endswith("%") or t.lower().endswith("x"):
        number, scale = (t[:-1].strip(), 0.01) if t.endswith("%") else (t[:-1].strip(), 1.0)
        if not re.fullmatch(_NUMBER, number):
            raise ConfigError(f"cannot read capacity {text!r}: use a size (10GB, 512MiB) or a fraction of "
                              "the working set (0.1x, 10%)")
        frac = float(number) * scale
        if not frac > 0:
            raise ConfigError(f"capacity fraction must be > 0, got {text!r}")
        if frac > MAX_CAPACITY_FRACTION:
            raise ConfigError(f"capacity fraction {text!r} is above {MAX_CAPACITY_FRACTION:g}x the working set; "
                              "anything above 1x already holds everything")
        return Capacity(t, None, frac)
    if _BARE_DECIMAL.fullmatch(t):      # a fraction or a size whose unit was left off, not 0 or 1 byte
        raise ConfigError(f"{t!r} has no unit, and a size in bytes is a whole number: give a fraction of the "
                          f"working set ({t}x) or a size ({t}GB)")
    return Capacity(t, parse_bytes(t), None)


class _RequestLimit:
    """argparse type of every ``--limit``: an integer >= 1 (a run over no requests is never meant; the
    library's ``limit=0`` means none). ``domain`` is what the parser walk reads."""

    domain = Domain(1, 10**9, integer=True, hint="the first N requests")
    __name__ = "integer"

    def __call__(self, text: str) -> int:
        try:
            return int(self.domain.parse(text))
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None


request_limit = _RequestLimit()
