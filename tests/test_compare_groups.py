"""`marconi compare` compares systems only on the same requests, and only with rates that are rates.

Old: records of `simulate --limit 20` and of the whole trace shared a group (same trace label,
model, capacity label), so a 20-request marconi row was given gains over 307-request baselines
with no word; and a token_hit_rate of 7.0 or NaN was taken as it was, skewing every gain of its
group.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from marconi.sim.compare import gains, plot_records

from cli_run import run_cli

FAST = ["--quiet", "--workers", "1"]


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _record(system: str, hit: float, *, requests: int = 307, tokens: int = 900_000, working_set: int = 12_500,
            capacity: str = "0.1x", trace: str = "swe-sample", **fields: object) -> dict:
    rec = {"trace": trace, "system": system, "model": "paper-7b", "capacity": capacity,
           "capacity_bytes": working_set // 10, "working_set_bytes": working_set, "mode": "sequential",
           "latency": "roofline-a100", "num_requests": requests, "input_tokens": tokens, "token_hit_rate": hit,
           "hit_rate_p95": 0.5, "flops_saved_fraction": 0.2, "ttft_p95_s": 0.03, "vanilla_ttft_p95_s": 0.04}
    rec.update(fields)
    return rec


# ------------------------------------------------------------------ F-1: request sets
def test_compare_of_a_limited_run_beside_the_whole_trace_gives_no_gain_between_them(tmp_path, capsys):
    """The audit's case, end to end: baselines of one `--limit`, marconi of another, one file."""
    base, lim = tmp_path / "base.jsonl", tmp_path / "lim.jsonl"
    common = ["simulate", "--trace", "swe-sample", "--capacity", "0.5x", *FAST]
    assert run_cli([*common, "--limit", "8", "--systems", "vllm+,sglang+", "--out", str(base)], capsys).code == 0
    assert run_cli([*common, "--limit", "5", "--systems", "marconi", "--out", str(lim)], capsys).code == 0
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(base.read_text() + lim.read_text())
    run = run_cli(["compare", str(mixed), "--plots", str(tmp_path / "plots")], capsys)
    assert run.code == 0, run.err
    rows = {line.split("paper-7b")[1].split()[1]: line for line in run.out.splitlines() if "paper-7b" in line}
    assert rows.keys() == {"vllm+", "sglang+", "marconi"}, run.out
    assert rows["marconi"].startswith("swe-sample (5 requests)"), run.out
    assert rows["vllm+"].startswith("swe-sample (8 requests)") and rows["sglang+"].startswith("swe-sample (8 ")
    assert "×" not in rows["marconi"], run.out            # no ratio to the 8-request vLLM+
    assert "NOTE:" in run.err and "2 different request sets (8 requests; 5 requests)" in run.err, run.err
    assert "0.5x" in run.err and "split" in run.err


def test_gains_split_a_group_by_request_set_and_leave_a_one_set_group_as_it_was(capsys):
    records = [_record("vllm+", 0.045), _record("sglang+", 0.5), _record("marconi", 0.056, requests=20,
                                                                         tokens=60_000, working_set=3_330),
               _record("vllm+", 0.1, trace="other"), _record("marconi", 0.2, trace="other")]
    rows = {(r["trace"], r["system"]): r for r in gains(records)}
    assert set(rows) == {("swe-sample (307 requests)", "vllm+"), ("swe-sample (307 requests)", "sglang+"),
                         ("swe-sample (20 requests)", "marconi"), ("other", "vllm+"), ("other", "marconi")}
    lone = rows[("swe-sample (20 requests)", "marconi")]
    assert "vs_vllm_x" not in lone and "vs_sglang_pct" not in lone
    assert rows[("swe-sample (307 requests)", "sglang+")]["vs_vllm_x"] == pytest.approx(0.5 / 0.045)
    assert rows[("other", "marconi")]["vs_vllm_x"] == pytest.approx(2.0)   # one set: compared as before
    notes = capsys.readouterr().err.splitlines()      # by default, NOTE lines on stderr
    assert len(notes) == 1 and notes[0].startswith("NOTE: the records of trace swe-sample"), notes
    assert "capacity 0.1x" in notes[0] and "split" in notes[0]


def test_a_trace_rebuilt_with_as_many_requests_is_told_apart_by_its_tokens_or_working_set():
    notes: list[str] = []      # where ``notice`` sends them (instead of stderr)
    records = [_record("vllm+", 0.1), _record("marconi", 0.3, tokens=850_000),
               _record("sglang+", 0.2, working_set=13_000)]
    rows = {r["system"]: r for r in gains(records, notice=notes.append)}
    assert rows["vllm+"]["trace"] == "swe-sample (900,000 input tokens, working set 12.5KB)"
    assert rows["marconi"]["trace"] == "swe-sample (850,000 input tokens, working set 12.5KB)"
    assert rows["sglang+"]["trace"] == "swe-sample (900,000 input tokens, working set 13KB)"
    assert not any(key.startswith("vs_") for key in rows["marconi"]), rows   # no baseline in its set
    assert "vs_vllm_x" not in rows["sglang+"] and "vs_sglang_pct" not in rows["vllm+"]
    assert len(notes) == 1 and "3 different request sets" in notes[0]


def test_an_infinite_record_is_the_ceiling_only_of_its_own_request_set():
    records = [_record("infinite", 0.6, capacity="1x"), _record("sglang+", 0.3, capacity="0.2x"),
               _record("sglang+", 0.2, capacity="0.2x", requests=20, tokens=60_000, working_set=3_330)]
    rows = {r["trace"]: r for r in gains(records) if r["system"] == "sglang+"}
    assert rows["swe-sample (307 requests)"]["of_infinite"] == pytest.approx(0.5)
    assert "of_infinite" not in rows["swe-sample (20 requests)"]


def test_each_request_set_gets_plots_of_its_own(tmp_path):
    records = [_record("vllm+", 0.1), _record("marconi", 0.3, requests=20, tokens=60_000, working_set=3_330)]
    names = sorted(p.name for p in plot_records(records, tmp_path))
    assert names == ["swe-sample_20req_paper-7b_sequential_hit_rate.png",
                     "swe-sample_307req_paper-7b_sequential_hit_rate.png"]


# ------------------------------------------------------------------ F-3: rates in [0, 1]
@pytest.mark.parametrize("field,value,named", [
    ("token_hit_rate", 7.0, "'token_hit_rate': must be a fraction in [0, 1], got 7.0"),
    ("token_hit_rate", math.nan, "'token_hit_rate': must be a fraction in [0, 1], got nan"),
    ("token_hit_rate", -0.25, "'token_hit_rate': must be a fraction in [0, 1], got -0.25"),
    ("token_hit_rate", math.inf, "'token_hit_rate': must be a fraction in [0, 1], got inf"),
    ("hit_rate_p95", 1.5, "'hit_rate_p95': must be a fraction in [0, 1], got 1.5"),
    ("flops_saved_fraction", math.nan, "'flops_saved_fraction': must be a fraction in [0, 1], got nan"),
    ("per_request", {"hit_rate": [0.5, 0.0, 2], "ttft_s": [0.1, 0.1, 0.1]},
     "'per_request.hit_rate': element 2 must be a fraction in [0, 1], got 2"),
    ("per_request", {"hit_rate": [math.nan], "ttft_s": [0.1]},
     "'per_request.hit_rate': element 0 must be a fraction in [0, 1], got nan"),
])
def test_compare_refuses_a_rate_outside_0_to_1_naming_the_file_line_and_field(tmp_path, capsys, field, value,
                                                                              named):
    results = _write(tmp_path / "r.jsonl", [_record("vllm+", 0.1), _record("marconi", 0.2, **{field: value})])
    plots = tmp_path / "plots"
    run = run_cli(["compare", str(results), "--plots", str(plots)], capsys)
    assert run.code == 2 and f"{results}:2: field {named}" in run.err, run.err
    assert not plots.exists()


def test_compare_takes_rates_of_exactly_0_and_1_and_an_absent_p95(tmp_path, capsys):
    """The bounds are inclusive; a null where null is allowed is not a rate to check. (With a 1.5
    beside them, so the test also shows the old code took any number.)"""
    good = [_record("vllm+", 0), _record("marconi", 1, hit_rate_p95=None, flops_saved_fraction=1.0,
                                           per_request={"hit_rate": [0, 1, 1.0], "ttft_s": [0.1, 0.1, 0.1]})]
    run = run_cli(["compare", str(_write(tmp_path / "ok.jsonl", good)), "--plots", str(tmp_path / "p")], capsys)
    assert run.code == 0, run.err
    bad = _write(tmp_path / "bad.jsonl", [*good, _record("sglang+", 1.5)])
    assert run_cli(["compare", str(bad), "--plots", str(tmp_path / "q")], capsys).code == 2


@pytest.mark.parametrize("field,value,named", [
    ("ttft_p95_s", -1.0, "'ttft_p95_s': must be a time in seconds, finite and >= 0, got -1.0"),
    ("ttft_p95_s", math.nan, "'ttft_p95_s': must be a time in seconds, finite and >= 0, got nan"),
    ("vanilla_ttft_p95_s", math.inf, "'vanilla_ttft_p95_s': must be a time in seconds, finite and >= 0, got inf"),
    ("per_request", {"hit_rate": [0.5, 0.5], "ttft_s": [0.1, -0.2]},
     "'per_request.ttft_s': element 1 must be a time in seconds, finite and >= 0, got -0.2"),
])
def test_compare_refuses_a_time_that_is_no_time_naming_the_file_line_and_field(tmp_path, capsys, field, value, named):
    """A NaN or negative TTFT was taken: the P95-vs-vanilla column and the TTFT plots then read nonsense."""
    results = _write(tmp_path / "r.jsonl", [_record("vllm+", 0.1), _record("marconi", 0.2, **{field: value})])
    plots = tmp_path / "plots"
    run = run_cli(["compare", str(results), "--plots", str(plots)], capsys)
    assert run.code == 2 and f"{results}:2: field {named}" in run.err, run.err
    assert not plots.exists()
    ok = _write(tmp_path / "ok.jsonl", [_record("vllm+", 0.1), _record("marconi", 0.2, ttft_p95_s=0.0)])
    assert run_cli(["compare", str(ok), "--plots", str(tmp_path / "p")], capsys).code == 0
