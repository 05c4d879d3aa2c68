"""`--latency table:FILE.csv` reads the TTFT column's unit from its name, and refuses one it cannot read.

Old: only a name ending in ``ms`` or holding ``_ms`` was read as milliseconds; ``ttft (ms)`` and
``TTFT[ms]`` gave TTFTs 1000 times too long, ``ttft_us`` 10^6 times, with no word.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from marconi.lab.reproduce.latency import engine_latency_from_file
from marconi.sim.latency import TableLatency

from cli_run import run_cli

TOKENS = (100, 1000, 10000)
SECONDS = (0.010, 0.050, 0.400)       # the TTFTs every table below holds, in its own unit


def _table(path: Path, column: str, per_second: float) -> Path:
    path.write_text(f"tokens,{column}\n" + "".join(f"{t},{s * per_second:g}\n" for t, s in zip(TOKENS, SECONDS)),
                    encoding="utf-8")
    return path


def _fit_in_seconds() -> tuple[float, float]:
    line = TableLatency.fit(TOKENS, SECONDS, "s", where="-")
    return line.intercept_s, line.slope_s_per_token


@pytest.mark.parametrize("column,per_second", [
    ("ttft (ms)", 1e3), ("TTFT[ms]", 1e3), ("TTFT {ms}", 1e3), ("prefill latency (msec)", 1e3),
    ("ttft_us", 1e6), ("ttft_µs", 1e6), ("TTFT (μs)", 1e6), ("ttft [usec]", 1e6), ("ttft_ns", 1e9),
])
def test_the_ttft_unit_is_read_from_the_column_name(tmp_path, column, per_second):
    table = TableLatency.from_csv(_table(tmp_path / "t.csv", column, per_second))
    intercept, slope = _fit_in_seconds()
    assert table.intercept_s == pytest.approx(intercept) and table.slope_s_per_token == pytest.approx(slope)
    # reproduce --engine-latency reads a CSV the same way
    engine = engine_latency_from_file(tmp_path / "t.csv")
    assert engine.slope_s_per_token == pytest.approx(slope)


@pytest.mark.parametrize("column", ["ttft (cycles)", "TTFT[p50 ms]", "ttft_min", "ttft (hours)", "ttft_s_ms"])
def test_a_unit_it_cannot_read_is_refused_naming_the_file_column_and_forms(tmp_path, capsys, column):
    path = _table(tmp_path / "t.csv", column, 1.0)
    run = run_cli(["simulate", "--trace", "swe-sample", "--limit", "3", "--systems", "vanilla", "--capacity", "1GB",
                   "--latency", f"table:{path}", "--quiet", "--workers", "1"], capsys)
    assert run.code == 2, run.err
    assert f"--latency: {path}:1:2: cannot read the unit of the TTFT column {column!r}" in run.err, run.err
    assert "'ttft_ms'" in run.err and "'ttft (ms)'" in run.err and "'TTFT[ms]'" in run.err
    assert "'ttft', is read as seconds" in run.err


def test_a_bare_ttft_column_is_still_seconds_and_the_old_ms_names_still_ms(tmp_path):
    """What existing tables and docs rely on (`reproduce --engine-latency`: "a CSV (tokens, ttft)"),
    with a ``ttft (ms)`` beside them that the old code read as seconds."""
    intercept, slope = _fit_in_seconds()
    for column, per_second in (("ttft", 1.0), ("latency", 1.0), ("ttft_ms", 1e3), ("ttftms", 1e3),
                               ("ttft_s", 1.0), ("ttft (s)", 1.0),
                               ("ttft (ms)", 1e3)):
        table = TableLatency.from_csv(_table(tmp_path / f"{per_second:g}.csv", column, per_second))
        assert table.slope_s_per_token == pytest.approx(slope), column
        assert table.intercept_s == pytest.approx(intercept), column
