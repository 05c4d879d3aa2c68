"""Latency models: map the uncached part of a prefill to time-to-first-token (seconds).

:class:`ZeroLatency` (the default: the strict sequential replay of the paper's simulator),
:class:`RooflineLatency` (uncached prefill FLOPs at a fraction of peak, plus overhead; A100 and
H100 presets) and :class:`TableLatency` (a straight line fitted to a measured TTFT table, checked
before it is fitted, as the paper does with its Jamba-1.5-Mini measurements).
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np

from marconi.core.model import ModelSpec
from marconi.core.registry import ConfigError, Domain

__all__ = ["LatencyModel", "ZeroLatency", "RooflineLatency", "TableLatency", "make_latency", "ACCELERATORS",
           "ROOFLINE_PARAMS", "ttft_unit"]


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
        """Read a CSV with a tokens column and a TTFT column, and fit a line (TTFT in seconds).

        The TTFT column's unit is read from its name (:func:`ttft_unit`): ``ttft_s``, ``ttft_ms``,
        ``ttft_us`` / ``ttft_µs``, ``ttft (ms)``, ``TTFT[ms]``, ...; a name with no unit (``ttft``,
        ``latency``) is in seconds.

        Raises:
            ConfigError: no such file or column; a TTFT column whose name holds a unit other than s, ms,
                us/µs, ns (``path:1:column``); a value missing, not finite, negative (or a zero TTFT);
                token counts not increasing (``path:line:column`` names it); or a non-growing fit.
        """
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"latency table {path} not found")
        try:
            with path.open(encoding="utf-8", newline="") as fh:
                reader = csv.reader(fh)
                header = [c.strip() for c in next(reader, [])]
                tok_col = next((c for c in header if "token" in c.lower()), None)
                ttft_col = next((c for c in header if "ttft" in c.lower() or "latency" in c.lower()
                                 or c.endswith("_ms")), None)
                if not header:
                    raise ConfigError(f"{path}: empty latency table")
                if tok_col is None or ttft_col is None:
                    raise ConfigError(f"{path}: need a tokens column and a TTFT column, found {header}")
                ti, yi = header.index(tok_col), header.index(ttft_col)
                scale = ttft_unit(ttft_col, where=f"{path}:1:{yi + 1}")
                xs: list[float] = []
                ys: list[float] = []
                last: tuple[str, int] | None = None  # the previous row's token count (as written) and line
                for row in reader:
                    if not any(cell.strip() for cell in row):
                        continue
                    line = reader.line_num
                    tokens, raw = _cell(row, ti, tok_col, f"{path}:{line}")
                    if not (math.isfinite(tokens) and tokens >= 0):
                        raise ConfigError(f"{path}:{line}:{ti + 1}: {tok_col} is {raw}: a token count must be a "
                                          "finite number >= 0")
                    if last is not None and tokens <= xs[-1]:
                        raise ConfigError(f"{path}:{line}:{ti + 1}: {tok_col} {raw} does not increase on {last[0]} "
                                          f"(line {last[1]}): list the rows by increasing tokens to prefill")
                    ttft, raw_ttft = _cell(row, yi, ttft_col, f"{path}:{line}")
                    if not (math.isfinite(ttft) and ttft > 0):
                        raise ConfigError(f"{path}:{line}:{yi + 1}: {ttft_col} is {raw_ttft}: a TTFT must be a "
                                          "finite number > 0")
                    xs.append(tokens)
                    ys.append(ttft)
                    last = (raw, line)
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        except csv.Error as exc:
            raise ConfigError(f"{path}: not a CSV table ({exc})") from None
        return cls.fit(xs, np.asarray(ys) * scale, name or f"table:{path.stem}", where=str(path))

    @classmethod
    def fit(cls, tokens: Sequence[float] | np.ndarray, ttft_s: Sequence[float] | np.ndarray, name: str, *,
            where: str) -> "TableLatency":
        """The least-squares line through ``(tokens, ttft_s)``.

        Raises:
            ConfigError: fewer than 2 distinct token counts, or a TTFT that does not grow with the tokens
                (prefills would be free); ``where`` names the source.
        """
        x = np.asarray(tokens, dtype=np.float64)
        y = np.asarray(ttft_s, dtype=np.float64)
        if len(np.unique(x)) < 2:
            raise ConfigError(f"{where}: a latency table needs at least 2 distinct token counts to fit a line, "
                              f"found {len(np.unique(x))}")
        slope, intercept = (float(v) for v in np.polyfit(x, y, 1))
        if not slope > 0:
            trend = "falls as the tokens to prefill grow" if slope < 0 else "stays flat as the tokens to prefill grow"
            raise ConfigError(f"{where}: the fitted TTFT {trend} (slope {slope * 1e6:.3g} µs/token over {len(x)} "
                              "rows), so every prefill would cost nothing: check that the columns hold tokens to "
                              "prefill and the TTFT they took")
        return cls(intercept, slope, name)

    def ttft_s(self, spec: ModelSpec, input_len: int, reused_len: int) -> float:
        return max(0.0, self.intercept_s + self.slope_s_per_token * (input_len - reused_len))

    def decode_s(self, spec: ModelSpec, output_len: int) -> float:
        return max(0, output_len - 1) * self.decode_s_per_token


# Seconds per unit, by the names a TTFT column's header may give it (casefolded: µ is μ).
_TIME_UNITS = {
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1.0),
    **dict.fromkeys(("ms", "msec", "msecs", "millis", "millisecond", "milliseconds"), 1e-3),
    **dict.fromkeys(("us", "μs", "usec", "usecs", "micros", "microsecond", "microseconds"), 1e-6),
    **dict.fromkeys(("ns", "nsec", "nsecs", "nanosecond", "nanoseconds"), 1e-9),
}
# Time units a header may name that are not read (refused rather than taken for seconds).
_UNREAD_UNITS = frozenset(("m", "min", "mins", "minute", "minutes", "h", "hr", "hrs", "hour", "hours"))
_UNIT_FORMS = ("ttft_s", "ttft_ms", "ttft_us", "ttft_µs", "ttft (ms)", "TTFT[ms]")


def ttft_unit(column: str, *, where: str) -> float:
    """Seconds per unit of a TTFT column, read from its name ``column``: its last bracketed part
    (``ttft (ms)``, ``TTFT[us]``) if it has one, else a word of it (split at anything but letters and
    digits: ``ttft_ms``, ``ttft-us``, ``latency ms``) or its end after ``ttft``/``latency``
    (``ttftms``), naming s, ms, us/µs or ns (or a long form: ``sec``, ``msec``, ``microseconds``, ...).
    A name with no unit (``ttft``, ``latency``, ``ttft_p50``) is in seconds: 1.0.

    Raises:
        ConfigError: ``where`` (the file, line 1 and column), the column and the accepted forms: a
            bracketed part that is not one unit (``ttft (cycles)``), a time unit not read (minutes,
            hours), or two different units in one name (``ttft_s_ms``).
    """
    folded = column.strip().casefold()
    bracket = re.search(r"[(\[{]([^()\[\]{}]*)[)\]}]\s*$", folded)
    words = re.findall(r"[^\W_]+", bracket.group(1) if bracket else folded)
    units = {w for w in words if w in _TIME_UNITS}
    glued = re.fullmatch(r"(?:ttft|latency)(\w+)", words[-1]) if words and not bracket else None
    if not units and glued and glued.group(1) in _TIME_UNITS:
        units = {glued.group(1)}
    if len({_TIME_UNITS[u] for u in units}) == 1 and not (bracket and len(words) != 1):
        return _TIME_UNITS[units.pop()]
    if bracket or units or any(w in _UNREAD_UNITS for w in words):
        raise ConfigError(f"{where}: cannot read the unit of the TTFT column {column!r}: name it with one unit, "
                          f"s, ms, us (µs) or ns, as in {', '.join(repr(f) for f in _UNIT_FORMS)} (a name with no "
                          "unit, such as 'ttft', is read as seconds)")
    return 1.0


def _cell(row: list[str], index: int, column: str, where: str) -> tuple[float, str]:
    """The number in ``row[index]`` and its text; ConfigError ``where:column: ...`` if missing or not one."""
    raw = row[index].strip() if index < len(row) else ""
    if not raw:
        raise ConfigError(f"{where}:{index + 1}: {column} is missing")
    try:
        return float(raw), raw
    except ValueError:
        raise ConfigError(f"{where}:{index + 1}: {column} is {raw!r}, not a number") from None


# The parameters of ``a100:...`` / ``h100:...`` and the values each takes (checked before any is used).
ROOFLINE_PARAMS: dict[str, Domain] = {
    "efficiency": Domain(0, 1, lo_open=True, hint="a fraction of the peak FLOP/s"),
    "num_devices": Domain(1, 1 << 20, integer=True),
    "overhead_s": Domain(0, 3600),
    "decode_s_per_token": Domain(0, 3600),
}


def make_latency(text: str | LatencyModel | None) -> LatencyModel:
    """``zero``, ``a100``, ``h100``, ``a100:efficiency=0.4``, or ``table:PATH.csv``.

    Raises:
        ConfigError: an unknown model or parameter, or a value outside :data:`ROOFLINE_PARAMS` (naming
            the text and the parameter); a bad table (see :meth:`TableLatency.from_csv`).
    """
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
    for item in filter(None, (i.strip() for i in rest.split(","))):
        key, _, value = (part.strip() for part in item.partition("="))
        if key not in ROOFLINE_PARAMS:
            raise ConfigError(f"latency {text!r}: unknown parameter {key!r}; valid: {', '.join(ROOFLINE_PARAMS)}")
        if key in kwargs:
            raise ConfigError(f"latency {text!r}: parameter {key!r} is given twice; give it once")
        try:
            kwargs[key] = ROOFLINE_PARAMS[key].parse(value)
        except ConfigError as exc:
            raise ConfigError(f"latency {text!r}: parameter {key!r} {exc}") from None
    return RooflineLatency(accelerator=name, **kwargs)  # type: ignore[arg-type]
