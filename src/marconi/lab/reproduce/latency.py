"""The latency models figs. 9 and 10 apply to per-request hits, and TTFT per request under one.

* the A100 roofline on the paper's 7B model (always);
* the paper's own Jamba-1.5-Mini measurements fitted with a line (read from ../shared/data, never
  vendored);
* the engine's measured CPU TTFT, when a table or ``marconi engine bench --out`` records are given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from marconi.io import iter_jsonl
from marconi.core.model import ModelSpec
from marconi.core.registry import ConfigError
from marconi.sim.latency import LatencyModel, RooflineLatency, TableLatency
from marconi.workloads import shared_data_dir

__all__ = ["LatencySet", "latency_set", "engine_latency_from_file", "ttft", "JAMBA_TABLE"]

JAMBA_TABLE = ("latency", "jamba-1.5-mini_4xA100_ttft.csv")


@dataclass(slots=True)
class LatencySet:
    """The latency models fig. 9/10 apply to per-request hits: name -> model (None: not available, why)."""

    models: dict[str, LatencyModel | None]
    notes: dict[str, str]

    def available(self) -> dict[str, LatencyModel]:
        return {k: v for k, v in self.models.items() if v is not None}

    def preferred(self) -> tuple[str, LatencyModel]:
        """The paper's own model (the Jamba table) when present, else the roofline."""
        avail = self.available()
        for name in avail:
            if name.startswith("Jamba"):
                return name, avail[name]
        name = next(iter(avail))
        return name, avail[name]


def engine_latency_from_file(path: str | Path) -> TableLatency:
    """The engine's measured TTFT as a fitted line: a CSV (tokens, TTFT) or ``engine bench --out`` JSONL.

    From JSONL, every ``kind == "ttft"`` record gives two points: (input_len, ttft_full_s) and
    (input_len − hit_len, ttft_cached_s).
    """
    path = Path(path)
    if path.suffix.lower() == ".csv":
        return TableLatency.from_csv(path, name=f"engine:{path.stem}")
    xs: list[float] = []
    ys: list[float] = []
    for where, rec in iter_jsonl(path):
        if not isinstance(rec, dict) or rec.get("kind") != "ttft":
            continue
        values = {k: rec.get(k) for k in ("input_len", "hit_len", "ttft_full_s", "ttft_cached_s")}
        for key, value in values.items():  # a NaN or negative time would fit a line of free prefills
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ConfigError(f"{where}: {key} is {value!r}: an `engine bench` TTFT record needs finite "
                                  "numbers >= 0 (re-run `marconi engine bench --out`)")
        xs += [values["input_len"], values["input_len"] - values["hit_len"]]
        ys += [values["ttft_full_s"], values["ttft_cached_s"]]
    if len(xs) < 2:
        raise ValueError(f"{path}: no 'ttft' records of `marconi engine bench --out` to fit")
    return TableLatency.fit(xs, ys, f"engine:{path.stem}", where=str(path))


def latency_set(jamba_table: str | Path | None, engine_latency: str | Path | None) -> LatencySet:
    """The latency models of the report: the roofline, the Jamba table (``jamba_table``, or the shared
    data set's when None) and the engine's table (``engine_latency``, when given).

    Cheap (two small files), so ``marconi reproduce`` calls it before any simulation as well as at
    report time: a bad table is refused before the hours of work, not after them.

    Raises:
        ConfigError: naming ``--jamba-table`` / ``--engine-latency`` and the file (and line where it
            has one): a given path that is not a file, or a table that does not parse. Only the
            default (shared) Jamba table may be missing: the report then says it is not available.
    """
    models: dict[str, Any] = {"A100 roofline": RooflineLatency("a100")}
    notes = {"A100 roofline": "prefill FLOPs of the uncached span of the paper's 7B hybrid at 50% of an A100's "
                              "312 TFLOP/s, + 5 ms (`RooflineLatency('a100')`)"}
    table = None
    if jamba_table is not None:
        table = _read_table("--jamba-table", jamba_table, TableLatency.from_csv)
    else:
        shared = shared_data_dir()
        jamba_table = shared.joinpath(*JAMBA_TABLE) if shared is not None else None
        if jamba_table is not None and jamba_table.is_file():
            table = _read_table("--jamba-table (default: the shared data set's table)", jamba_table,
                                TableLatency.from_csv)
    if table is not None:
        models["Jamba table"] = table
        notes["Jamba table"] = (f"the paper's Jamba-1.5-Mini 4×A100 measurements ({Path(jamba_table).name}, read from "
                                f"../shared, not vendored) fitted with a line as the paper did: "
                                f"TTFT = {table.intercept_s * 1000:.1f} ms + {table.slope_s_per_token * 1e6:.1f} µs × "
                                "uncached tokens")
    else:
        from marconi.workloads.paths import shared_data_where

        models["Jamba table"] = None
        notes["Jamba table"] = ("not available: " + (f"{jamba_table} not found" if jamba_table is not None else
                                                      "the shared data set, which holds latency/" + JAMBA_TABLE[1]
                                                      + f", was not found (looked at {shared_data_where()})"))
    if engine_latency is not None:
        eng = _read_table("--engine-latency", engine_latency, engine_latency_from_file)
        models["engine (CPU, measured)"] = eng
        notes["engine (CPU, measured)"] = (f"{Path(engine_latency).name} fitted with a line: TTFT = "
                                           f"{eng.intercept_s * 1000:.1f} ms + {eng.slope_s_per_token * 1e6:.1f} µs × "
                                           "uncached tokens")
    else:
        models["engine (CPU, measured)"] = None
        notes["engine (CPU, measured)"] = ("not available: no engine latency table was given (run `marconi engine "
                                           "bench --out bench.jsonl` and pass `--engine-latency bench.jsonl`)")
    return LatencySet(models, notes)


_WHAT_TO_GIVE = {"--jamba-table": "give the Jamba TTFT CSV (tokens, ttft), or leave --jamba-table out for the "
                                   "shared data set's",
                 "--engine-latency": "give a TTFT CSV (tokens, ttft) or `marconi engine bench --out` JSONL"}


def _read_table(flag: str, path: str | Path, read: Callable[[str | Path], TableLatency]) -> TableLatency:
    """``read(path)``, with any refusal as a ConfigError naming ``flag`` and the file (``path:line``
    where the reader gives one)."""
    if not Path(path).is_file():
        what = "a directory" if Path(path).is_dir() else "no such file"
        raise ConfigError(f"{flag} {path}: {what}" + (f"; {_WHAT_TO_GIVE[flag]}" if flag in _WHAT_TO_GIVE else ""))
    try:
        return read(path)
    except (ValueError, OSError) as exc:   # ConfigError and JsonError are ValueErrors
        reason = str(exc)
        where = "" if str(Path(path)) in reason else f" {path}"
        raise ConfigError(f"{flag}{where}: {reason}") from None


def ttft(rec: dict[str, Any], lat: LatencyModel, spec: ModelSpec) -> tuple[np.ndarray, np.ndarray]:
    """(TTFT with the record's hits, TTFT without any cache) per request, in seconds."""
    pr = rec["per_request"]
    n = np.asarray(pr["input_len"], dtype=np.float64)
    r = np.asarray(pr["reused_len"], dtype=np.float64)
    if isinstance(lat, RooflineLatency):  # its formula is polynomial in the lengths: vectorised
        return (np.asarray(lat.ttft_s(spec, n, r), dtype=np.float64),  # type: ignore[arg-type]
                np.asarray(lat.ttft_s(spec, n, np.zeros_like(n)), dtype=np.float64))  # type: ignore[arg-type]
    if isinstance(lat, TableLatency):
        return (np.maximum(0.0, lat.intercept_s + lat.slope_s_per_token * (n - r)),
                np.maximum(0.0, lat.intercept_s + lat.slope_s_per_token * n))
    with_cache = np.array([lat.ttft_s(spec, int(a), int(b)) for a, b in zip(n, r)], dtype=np.float64)
    without = np.array([lat.ttft_s(spec, int(a), 0) for a in n], dtype=np.float64)
    return with_cache, without
