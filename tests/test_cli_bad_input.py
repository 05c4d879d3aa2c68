"""Bad input on the command line: a one-line error naming the file, line and field (or the flag to
change), exit code 2, no traceback, and nothing half-written or replaced."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from marconi.cli import main
from marconi.core.registry import ConfigError
from marconi.sim.latency import make_latency
from marconi.sim.sweep import RESULT_TYPES, read_records

from cli_run import run_cli

# an earlier run's records at --out: a failed or interrupted run must leave them as they were
GOOD = '{"system": "sglang+", "token_hit_rate": 0.5}\n'

# Two sessions of two turns, the second turn extending the first: enough for every command here.
_REQUESTS = [("a", 0, 0.0, list(range(1, 41))), ("b", 0, 1.0, list(range(100, 140))),
             ("a", 1, 2.0, list(range(1, 61))), ("b", 1, 3.0, list(range(100, 160)))]
FAST = ["--quiet", "--workers", "1"]


def _trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"session_id": s, "turn_id": t, "ts": ts, "input_tokens": toks,
                                        "output_tokens": [7, 8]}) + "\n" for s, t, ts, toks in _REQUESTS))
    return path


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """(exit code, stderr) of ``marconi ARGV`` (:func:`cli_run.run_cli`: no traceback, asserted)."""
    return run_cli(argv, capsys)[:2]


# ------------------------------------------------------------------ compare reads typed records
def _record(**fields: object) -> dict:
    rec = {"trace": "t.jsonl", "system": "vanilla", "model": "paper-7b", "capacity": "0.5x", "capacity_bytes": 10,
           "mode": "sequential", "num_requests": 4, "token_hit_rate": 0.25, "hit_rate_p95": 0.5,
           "flops_saved_fraction": 0.2, "ttft_p95_s": 0.03, "vanilla_ttft_p95_s": 0.03,
           "per_request": {"hit_rate": [0.0, 0.5], "ttft_s": [0.02, 0.01], "input_len": [4, 6]}}
    rec.update(fields)
    return rec


@pytest.mark.parametrize("field,value,named", [
    ("token_hit_rate", "high", "'token_hit_rate': expected a number, got a string ('high')"),
    ("token_hit_rate", None, "'token_hit_rate': expected a number, got null"),
    ("system", None, "'system': expected a string, got null"),
    ("ttft_p95_s", "x", "'ttft_p95_s': expected a number or null"),
    ("capacity_bytes", [1], "'capacity_bytes': expected a number or null, got a list"),
    ("num_requests", "9", "'num_requests': expected an integer"),
    ("per_request", "x", "'per_request': expected an object"),
    ("per_request", {"hit_rate": "x", "ttft_s": []}, "'per_request.hit_rate': expected a list of numbers"),
    ("per_request", {"hit_rate": [0.5]}, "'per_request.ttft_s': missing"),
])
def test_compare_names_the_file_line_and_field_of_a_mistyped_record(tmp_path, capsys, field, value, named):
    """A mistyped field was a TypeError/AttributeError traceback from deep in the gains or a plot."""
    results = tmp_path / "r.jsonl"
    results.write_text(json.dumps(_record()) + "\n" + json.dumps(_record(**{"system": "marconi", field: value})) + "\n")
    plots = tmp_path / "plots"
    code, err = _run(["compare", str(results), "--plots", str(plots)], capsys)
    assert code == 2
    assert f"{results}:2: field {named}" in err, err
    assert not plots.exists()   # refused before anything was written


def test_compare_still_takes_what_simulate_writes(tmp_path, capsys):
    """The type check refuses no record `simulate` writes (per-request arrays included)."""
    out = tmp_path / "r.jsonl"
    assert main(["simulate", "--trace", str(_trace(tmp_path)), "--systems", "vanilla,sglang+", "--capacity", "0.5x",
                 "--out", str(out), *FAST]) == 0
    assert len(read_records(out, types=RESULT_TYPES)) == 2
    assert main(["compare", str(out), "--plots", str(tmp_path / "plots")]) == 0
    assert list((tmp_path / "plots").glob("*.png"))


# ------------------------------------------------------------------ empty name lists
@pytest.mark.parametrize("argv,flag", [
    (["simulate", "--systems", ""], "--systems"),
    (["simulate", "--systems", ",,,"], "--systems"),
    (["simulate", "--model", ""], "--model"),
    (["simulate", "--model", "paper-7b,,nemotron-h-8b"], "--model"),
    (["mrc", "--systems", "", "--no-ceilings", "--lo", "0.1", "--points", "2"], "--systems"),
    (["mrc", "--model", ""], "--model"),
])
def test_an_empty_system_or_model_list_is_refused_naming_the_flag(tmp_path, capsys, argv, flag):
    """--systems "" ran 0 points with exit 0; --model "" looked for ./config.json; mrc's min() of nothing."""
    out = tmp_path / "o.jsonl"
    code, err = _run([argv[0], "--trace", str(_trace(tmp_path)), *argv[1:], "--out", str(out), *FAST], capsys)
    assert code == 2 and f"argument {flag}:" in err, err
    assert "config.json" not in err and "min()" not in err
    assert not out.exists()


# ------------------------------------------------------------------ latency parameters
def test_a_latency_parameter_that_is_not_a_number_names_latency_and_the_parameter(tmp_path, capsys, monkeypatch):
    """A bare float() said "could not convert string to float: 'x'", naming neither."""
    import marconi.cli

    monkeypatch.setattr(marconi.cli, "load_trace", lambda *a, **k: pytest.fail("the trace loaded first"))
    code, err = _run(["simulate", "--trace", str(_trace(tmp_path)), "--latency", "a100:efficiency=x", *FAST], capsys)
    assert code == 2 and "--latency: latency 'a100:efficiency=x': parameter 'efficiency'" in err, err
    assert "got 'x'" in err
    assert "could not convert" not in err
    with pytest.raises(ConfigError, match="'num_devices' must be an integer >= 1"):
        make_latency("h100:num_devices=0")


# ------------------------------------------------------------------ a build with no requests
def test_trace_build_of_an_empty_input_is_refused_naming_it_and_writes_nothing(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    out = tmp_path / "x.jsonl"
    code, err = _run(["trace", "build", "mooncake", str(empty), "--out", str(out)], capsys)
    assert code == 2 and f"{empty}: no requests" in err, err
    assert not out.exists() and not Path(f"{out}.meta.json").exists()


# ------------------------------------------------------------------ a failed run keeps --out
def test_a_failed_sweep_never_replaces_out_and_keeps_its_points_beside_it(tmp_path, capsys):
    """A sweep with a point that could not run replaced a good --out with its partial records."""
    out = tmp_path / "results.jsonl"
    out.write_text(GOOD)
    code, err = _run(["simulate", "--trace", "swe-sample", "--limit", "20", "--systems", "vllm-align,sglang+",
                      "--capacity", "30MB", "--out", str(out), "--no-per-request", *FAST], capsys)
    assert code == 2 and "1 of 2 points could not run" in err, err
    assert out.read_text() == GOOD
    partial = tmp_path / "results.partial.jsonl"
    assert [json.loads(line)["system"] for line in partial.read_text().splitlines()] == ["sglang+"]
    assert f"wrote 1 record to {partial}" in err and f"--out {out} left unchanged" in err


# ------------------------------------------------------------------ capacity zero
def test_simulate_refuses_a_zero_capacity_at_parse_time(tmp_path, capsys):
    code, err = _run(["simulate", "--trace", str(_trace(tmp_path)), "--capacity", "1GB,0", *FAST], capsys)
    assert code == 2 and "argument --capacity:" in err and "'0' is 0 bytes" in err, err


# ------------------------------------------------------------------ the trace path
def test_an_empty_trace_path_says_it_is_empty(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = _run(["simulate", "--trace", "", *FAST], capsys)
    assert code == 2 and "the trace is empty" in err and "unknown trace format" not in err, err
    code, err = _run(["trace", "stats", ""], capsys)      # stats takes what --trace takes
    assert code == 2 and "the trace is empty" in err and "unknown trace format" not in err, err


def test_a_directory_as_trace_is_said_to_be_a_directory(tmp_path, capsys):
    folder = tmp_path / "adir"
    folder.mkdir()
    code, err = _run(["simulate", "--trace", str(folder), *FAST], capsys)
    assert code == 2 and f"{folder} is a directory, not a trace file" in err, err
    assert "unknown trace format" not in err


# ------------------------------------------------------------------ an existing file that cannot be replaced
@pytest.mark.skipif(not os.path.isfile("/proc/version"), reason="needs Linux's /proc")
def test_an_out_in_a_pseudo_file_system_gives_the_real_reason(tmp_path, capsys):
    code, err = _run(["simulate", "--trace", str(_trace(tmp_path)), "--out", "/proc/version", *FAST], capsys)
    assert code == 2 and "--out /proc/version: cannot write in /proc (it takes no new files" in err, err
    assert "the existing file cannot be replaced" in err and "No such file or directory" not in err


# ------------------------------------------------------------------ a plot's name (mrc, vllm replay, vllm bench)
def test_mrc_plot_in_a_directory_suggests_a_png_name(tmp_path, capsys):
    folder = tmp_path / "adir"
    folder.mkdir()
    code, err = _run(["mrc", "--trace", str(_trace(tmp_path)), "--plot", str(folder), "--out",
                      str(tmp_path / "m.jsonl"), *FAST], capsys)
    assert code == 2 and f"--plot: {folder} is a directory" in err and f"{folder / 'results.png'}" in err, err
    assert "results.jsonl" not in err


def test_mrc_plot_with_a_suffix_other_than_png_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    """A PNG was written under o_mrc3.xyz, silently, after the sweep."""
    import marconi.sim.mrc

    monkeypatch.setattr(marconi.sim.mrc, "run_sweep", lambda *a, **k: pytest.fail("the sweep ran"))
    plot = tmp_path / "o_mrc3.xyz"
    out = tmp_path / "o_mrc3.jsonl"
    code, err = _run(["mrc", "--trace", str(_trace(tmp_path)), "--lo", "0.1", "--points", "2", "--plot", str(plot),
                      "--out", str(out), *FAST], capsys)
    assert code == 2 and f"--plot: {plot} does not end in .png" in err, err
    assert f"{tmp_path / 'o_mrc3.png'}" in err
    assert not plot.exists() and not out.exists()



@pytest.mark.parametrize("command", [["vllm", "replay", "--vllm-python", "no-such/python", "--capacity", "0.5x",
                                      "--concurrency", "4"],
                                     ["vllm", "bench", "--vllm-python", "no-such/python"]])
def test_a_vllm_plot_with_a_suffix_other_than_png_is_refused_by_the_guard(tmp_path, capsys, command):
    """The same rule for every plot output (add_output's ``suffixes``): the guard refuses the name
    before the command starts (here before ``--vllm-python``, which does not exist, is probed)."""
    plot = tmp_path / "r.xyz"
    code, err = _run([*command, "--trace", str(_trace(tmp_path)), "--out", str(tmp_path / "r.jsonl"),
                      "--plot", str(plot)], capsys)
    assert code == 2 and f"--plot: {plot} does not end in .png" in err and "--vllm-python" not in err, err
    assert not plot.exists() and not (tmp_path / "r.jsonl").exists()

# ------------------------------------------------------------------ stats of an empty trace
def test_trace_stats_refuses_an_empty_trace_as_validate_does(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    code, err, out = run_cli(["trace", "stats", str(empty)], capsys)
    assert code == 2 and f"{empty}: no requests in the file" in err, err
    assert out == ""   # no table of zeros


# ------------------------------------------------------------------ errors that name what is wrong (audit)
def test_a_model_file_that_is_not_a_config_is_named_as_the_model(tmp_path, capsys):
    """--model naming a JSONL trace said "<file>:2: invalid JSON", read as the trace being broken."""
    trace = _trace(tmp_path)
    code, err = _run(["simulate", "--trace", str(trace), "--model", str(trace), *FAST], capsys)
    assert code == 2 and f"{trace} does not read as a Hugging Face config.json" in err, err


def test_mrc_says_it_draws_one_models_curve(capsys):
    code, err = _run(["mrc", "--trace", "swe-sample", "--model", "paper-7b,jamba-1.5-mini"], capsys)
    assert code == 2 and "a miss-ratio curve is one model's; give one model" in err, err   # "unknown model" before


def test_mrc_out_named_as_a_plot_is_told_what_to_rename(tmp_path, capsys):
    out = tmp_path / "curve.png"
    code, err = _run(["mrc", "--trace", "swe-sample", "--out", str(out)], capsys)
    assert code == 2 and f"give it a .jsonl name (e.g. {tmp_path / 'curve.jsonl'})" in err, err


@pytest.mark.parametrize("command", [["simulate", "--trace", "swe-sample"], ["demo"],
                                     ["engine", "bench", "--trace", "swe-sample"]])
def test_records_named_as_a_picture_are_refused_before_any_work(command, tmp_path, capsys):
    """``simulate --out R.png`` wrote JSONL under a picture's name; every text output is refused so,
    before any work, and nothing is written."""
    out = tmp_path / "R.png"
    code, err = _run([*command, "--out", str(out)], capsys)
    assert code == 2 and f"--out {out} names a PNG picture" in err and "R.jsonl" in err, err
    assert not out.exists()


@pytest.mark.parametrize("value", ["0.9", "1.5", ".5"])
def test_a_capacity_with_a_decimal_point_and_no_unit_is_asked_for_its_unit(value, capsys):
    """--capacity 0.9 was refused as "0 bytes" and 1.5 ran as a 1-byte cache: a unit was left off (audit)."""
    code, err = _run(["simulate", "--trace", "swe-sample", "--capacity", value], capsys)
    assert code == 2 and f"'{value}' has no unit" in err and f"({value}x)" in err, err


def test_a_size_with_a_decimal_point_and_no_unit_is_asked_for_its_unit_everywhere(capsys):
    """The check lives in the size parser, so a command that reads a size alone asks too: engine bench
    --capacity 0.5 ran a 0-byte cache (audit)."""
    from marconi.units import parse_bytes

    with pytest.raises(ConfigError, match=r"'1.5' has no unit, and a size in bytes is a whole number: give a size "
                                          r"such as 1.5GB"):
        parse_bytes("1.5")
    assert parse_bytes("1.5KB") == 1500 and parse_bytes("1e9") == 10**9
    code, err = _run(["engine", "bench", "--model", "bamba-tiny", "--capacity", "0.5"], capsys)
    assert code == 2 and "--capacity: '0.5' has no unit" in err, err
