"""The `marconi` command line end to end: real output, clear errors, nothing half-written."""

import json

from marconi.cli import main

# an earlier run's records at --out: a failed or interrupted run must leave them as they were
GOOD = '{"system": "sglang+", "token_hit_rate": 0.5}\n'


def test_models_and_systems_list(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "paper-7b" in out and "26,787,840" in out and "65,536" in out
    assert main(["systems"]) == 0
    out = capsys.readouterr().out
    for name in ("vanilla", "vllm+", "sglang+", "marconi", "flop-aware", "every-block", "sparse-dp", "oracle",
                 "infinite", "adaptive", "tuner=auto", "tuner=bootstrap", "worlds", "selector", "regret"):
        assert name in out


def test_demo_runs_the_readme_job_and_marconi_does_not_lose_to_sglang(tmp_path, capsys):
    # issue 11: the demo keeps its trace and capacities, adds the oracle and a miss-ratio plot, and
    # the default Marconi must not lose to SGLang+ there
    out = tmp_path / "demo" / "demo.jsonl"
    assert main(["demo", "--out", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    by = {(r["capacity"], r["system"]): r["token_hit_rate"] for r in records}
    assert {c for c, _ in by} == {"0.05x", "0.15x"}
    for capacity in ("0.05x", "0.15x"):
        for system in ("marconi", "marconi:selector=regret"):
            assert by[(capacity, system)] >= by[(capacity, "sglang+")]
        assert by[(capacity, "oracle")] >= by[(capacity, "marconi")] >= by[(capacity, "marconi:selector=regret")]
        assert by[(capacity, "infinite")] >= by[(capacity, "oracle")]
    assert by[("0.05x", "marconi")] > by[("0.05x", "sglang+")]
    assert (tmp_path / "demo" / "demo_mrc.png").stat().st_size > 0
    mrc = [json.loads(line) for line in (tmp_path / "demo" / "demo_mrc.jsonl").read_text().splitlines()]
    assert {r["system"] for r in mrc} >= {"vllm+", "sglang+", "marconi", "marconi:selector=regret", "oracle"}
    assert "infinite (unbounded capacity)" in capsys.readouterr().out


def test_demo_refuses_several_models_before_writing_anything(tmp_path, capsys):
    """``demo --model a,b`` ran the sweep and its plots, then its curve step failed on the list: the
    README's demo_mrc files never came (audit). One model, said before anything runs."""
    out = tmp_path / "demo" / "demo.jsonl"
    assert main(["demo", "--model", "paper-7b,nemotron-h-8b", "--out", str(out)]) == 2
    assert "the demo draws one model's miss-ratio curve" in capsys.readouterr().err
    assert not (tmp_path / "demo").exists()


def test_simulate_on_a_bundled_real_trace_writes_records(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    code = main(["simulate", "--trace", "swe-sample", "--systems", "vanilla,vllm+,sglang+,marconi:alpha=1",
                 "--capacity", "0.1x", "--out", str(out), "--quiet", "--workers", "1"])
    assert code == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["system"] for r in records] == ["vanilla", "vllm+", "sglang+", "marconi:alpha=1"]
    assert records[0]["token_hit_rate"] == 0.0
    assert all(0 <= r["token_hit_rate"] <= 1 for r in records)
    assert records[2]["token_hit_rate"] > records[1]["token_hit_rate"]  # judicious admission beats vLLM+ here
    table = capsys.readouterr().out
    assert "sglang+" in table and "TTFT P95" in table
    assert main(["compare", str(out), "--plots", str(tmp_path / "plots")]) == 0
    assert list((tmp_path / "plots").glob("*.png"))


def test_bad_trace_fails_clearly_and_writes_nothing(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    good = {"session_id": 0, "turn_id": 0, "ts": 0.0, "input_tokens": [1, 2, 3], "output_tokens": [4]}
    bad.write_text(json.dumps(good) + "\n" + json.dumps({**good, "ts": 1.0, "input_tokens": [1, "x"]}) + "\n")
    out = tmp_path / "out.jsonl"
    code = main(["simulate", "--trace", str(bad), "--capacity", "1GB", "--out", str(out), "--quiet"])
    assert code == 2
    err = capsys.readouterr().err
    assert "bad.jsonl:2" in err and "input_tokens" in err
    assert not out.exists()
    assert main(["simulate", "--trace", "no-such-trace", "--quiet"]) == 2
    assert "neither a file nor a catalog workload (swe, " in capsys.readouterr().err
    assert main(["simulate", "--trace", "swe-sample", "--systems", "marconi:alfa=1", "--quiet"]) == 2
    assert "valid parameters: alpha" in capsys.readouterr().err
    assert main(["simulate", "--trace", "swe-sample", "--capacity", "1", "--quiet"]) == 2
    assert "smaller than one SSM checkpoint" in capsys.readouterr().err


# ----------------------------------------------------------------------------- hardening (issue 9)
import os  # noqa: E402
import stat  # noqa: E402

import pytest  # noqa: E402

from marconi.workloads import build_workload, bundled_data_dir, write_trace  # noqa: E402

FAST = ["--systems", "vanilla,sglang+", "--capacity", "0.1x", "--quiet", "--workers", "1", "--no-per-request"]


def _line(**fields):
    rec = {"session_id": 0, "turn_id": 0, "ts": 0.0, "input_tokens": [1, 2, 3], "output_tokens": [4]}
    rec.update(fields)
    return json.dumps(rec)


@pytest.fixture
def small_trace(tmp_path):
    path = tmp_path / "small.jsonl"
    write_trace(path, build_workload("swe-sample").head(30))
    return path


@pytest.fixture
def no_sweep(monkeypatch):
    """Fails the test if a sweep starts: the error had to be found before any work."""
    import marconi.sim.sweep

    def fail(*args, **kwargs):
        raise AssertionError("the sweep ran before the error was detected")
    monkeypatch.setattr(marconi.sim.sweep, "run_sweep", fail)


@pytest.fixture
def no_trace_load(monkeypatch):
    """Fails the test if the trace is loaded: the error had to be found at parse time."""
    import marconi.cli

    def fail(*args, **kwargs):
        raise AssertionError("the trace was loaded before the error was detected")
    monkeypatch.setattr(marconi.cli, "load_trace", fail)


def test_out_equal_to_the_trace_is_refused_and_the_trace_kept(small_trace, no_sweep, capsys):
    before = small_trace.read_bytes()
    assert main(["simulate", "--trace", str(small_trace), "--out", str(small_trace), *FAST]) == 2
    assert "also an input" in capsys.readouterr().err
    assert small_trace.read_bytes() == before
    alias = small_trace.parent / "alias.jsonl"  # the same file under another name
    alias.symlink_to(small_trace)
    assert main(["simulate", "--trace", str(small_trace), "--out", str(alias), *FAST]) == 2
    assert small_trace.read_bytes() == before and alias.is_symlink()


def test_out_equal_to_another_input_is_refused(tmp_path, no_sweep, capsys):
    table = tmp_path / "ttft.csv"
    table.write_text("tokens,ttft_ms\n100,10\n200,20\n")
    assert main(["simulate", "--trace", "swe-sample", "--latency", f"table:{table}", "--out", str(table), *FAST]) == 2
    assert "also an input" in capsys.readouterr().err
    assert table.read_text() == "tokens,ttft_ms\n100,10\n200,20\n"
    src = str(bundled_data_dir() / "mooncake" / "conversation_trace_first2000.jsonl")
    copy = tmp_path / "mc.jsonl"
    copy.write_bytes(open(src, "rb").read())
    code = main(["trace", "build", "mooncake", str(copy), "--limit", "5", "--out", str(copy)])
    assert code == 2 and "also an input" in capsys.readouterr().err
    assert copy.read_bytes() == open(src, "rb").read()


def test_out_through_a_symlink_or_to_dev_null_leaves_them_in_place(tmp_path, capsys):
    real = tmp_path / "real.jsonl"
    link = tmp_path / "link.jsonl"
    link.symlink_to(real)
    assert main(["simulate", "--trace", "swe-sample", "--out", str(link), *FAST]) == 0
    assert link.is_symlink() and len(real.read_text().splitlines()) == 2
    null = os.stat("/dev/null")
    assert main(["simulate", "--trace", "swe-sample", "--out", "/dev/null", *FAST]) == 0
    discard = tmp_path / "discard.jsonl"  # a trace's format comes from its name: link one to /dev/null
    discard.symlink_to("/dev/null")
    assert main(["trace", "build", "bundled", "chat-synthetic", "--out", str(discard)]) == 0
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == null.st_rdev and after.st_ino == null.st_ino
    assert discard.is_symlink() and not os.path.exists("/dev/null.meta.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["discard.jsonl", "link.jsonl", "real.jsonl"]


def test_out_to_a_named_pipe_streams_the_records_and_keeps_the_pipe(tmp_path, capsys):
    """A FIFO as --out (e.g. piping results into another tool) is written through, not replaced."""
    import json
    import threading

    fifo = tmp_path / "results.jsonl"
    os.mkfifo(fifo)
    received: list[str] = []
    reader = threading.Thread(target=lambda: received.extend(fifo.read_text().splitlines()), daemon=True)
    reader.start()
    assert main(["simulate", "--trace", "swe-sample", "--out", str(fifo), *FAST]) == 0
    reader.join(timeout=60)
    assert not reader.is_alive() and len(received) == 2
    assert sorted(json.loads(line)["system"] for line in received) == ["sglang+", "vanilla"]
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["results.jsonl"]          # no temp file beside it


def test_results_files_get_normal_permissions_like_trace_files(tmp_path, capsys):
    old = os.umask(0o022)
    try:
        assert main(["simulate", "--trace", "swe-sample", "--out", str(tmp_path / "r.jsonl"), *FAST]) == 0
        assert main(["trace", "build", "bundled", "chat-synthetic", "--out", str(tmp_path / "t.jsonl")]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "r.jsonl").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "t.jsonl").stat().st_mode) == 0o644


def test_out_problems_are_found_before_the_sweep(tmp_path, no_sweep, capsys):
    (tmp_path / "exists").mkdir()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for out, message in [(tmp_path / "exists", "is a directory"),
                         (blocker / "r.jsonl", "not a directory"),
                         ("/proc/self/r.jsonl", "cannot write")]:
        assert main(["simulate", "--trace", "swe-sample", "--out", str(out), *FAST]) == 2
        assert message in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exists", "file"]


@pytest.mark.parametrize("capacity, message", [
    ("1e30", "larger than 1e+18 bytes"), ("1e400", "larger than 1e+18 bytes"), ("infx", "cannot read capacity"),
    ("nan%", "cannot read capacity"), ("abc%", "cannot read capacity"), ("2000x", "above 1000x"),
    ("0%", "must be > 0")])
def test_bad_capacities_are_clear_errors_at_parse_time(capacity, message, no_trace_load, capsys):
    # argparse refuses it (issue 31: every numeric option's domain is its type): exit 2, the option named
    with pytest.raises(SystemExit) as info:
        main(["simulate", "--trace", "swe-sample", "--capacity", capacity, "--quiet"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "argument --capacity" in err and "Traceback" not in err


@pytest.mark.parametrize("system, message", [
    ("marconi:alpha=nan", "alpha: must be a finite number >= 0"), ("marconi:alpha=inf", "alpha: must be a finite number"),
    ("vllm+:block=0", "block: must be an integer >= 1"), ("marconi:multiplier=0", "multiplier: must be a finite number > 0"),
    ("marconi:tolerance=-1", "tolerance: must be a finite number >= 0 and < 1"),
    ("marconi:alpha=1,alpha=2", "'alpha' is given twice"),
    ("marconi:drift=nan", "drift: must be a finite number"),
    ("custom:admission=every-block,block=0", "block: must be an integer >= 1"),
    ("custom:admission=uniform(m=-1)", "m: must be an integer >= 0")])
def test_bad_system_parameters_are_rejected_before_the_trace_loads(system, message, no_trace_load, capsys):
    assert main(["simulate", "--trace", "swe-sample", "--systems", system, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and system.split(",")[0].split("(")[0] in err


def test_inputs_that_used_to_raise_tracebacks_are_clear_errors(tmp_path, capsys):
    (tmp_path / "dir.jsonl").mkdir()
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    listed = tmp_path / "config.json"
    listed.write_text("[1, 2]")
    cases = [
        (["simulate", "--trace", str(tmp_path / "dir.jsonl"), *FAST], "is a directory"),
        (["simulate", "--trace", str(deep), *FAST], "deep.jsonl:1: JSON nested too deeply"),
        (["trace", "stats", str(deep)], "deep.jsonl:1: JSON nested too deeply"),
        (["simulate", "--trace", "swe-sample", "--model", str(listed), "--quiet"], "expected a JSON object"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, argv
    assert main(["trace", "validate", str(deep)]) == 1
    assert "deep.jsonl:1: JSON nested too deeply" in capsys.readouterr().out


def test_compare_on_a_trace_file_says_it_is_not_a_results_file(small_trace, tmp_path, capsys):
    plots = tmp_path / "plots"
    assert main(["compare", str(small_trace), "--plots", str(plots)]) == 2
    err = capsys.readouterr().err
    assert "small.jsonl:1: not one of the `marconi simulate --out` results records" in err
    assert not plots.exists()
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert main(["compare", str(empty), "--plots", str(plots)]) == 2
    assert "no records" in capsys.readouterr().err and not plots.exists()


def test_compare_plots_records_that_carry_a_capacity_label_but_no_bytes(tmp_path, capsys):
    """Old: a KeyError on capacity_bytes, read even where capacity was there (audit)."""
    path = tmp_path / "min.jsonl"
    path.write_text(json.dumps({"trace": "x", "system": "marconi", "token_hit_rate": 0.5, "model": "m",
                                "capacity": "1x", "num_requests": 3}) + "\n")
    assert main(["compare", str(path), "--plots", str(tmp_path / "plots")]) == 0
    assert list((tmp_path / "plots").glob("*.png")) and "Traceback" not in capsys.readouterr().err


def test_sparse_from_records_with_a_wrong_file_copies_nothing(small_trace, tmp_path, capsys):
    out = tmp_path / "study"
    assert main(["experiment", "sparse", "--out", str(out), "--from-records", str(small_trace)]) == 2
    assert "not one of the `marconi experiment sparse` records" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("limit", ["0", "-1", "x"])
def test_limit_below_one_is_an_error_for_every_command(limit, capsys):
    for argv in (["simulate", "--trace", "swe-sample", "--limit", limit],
                 ["simulate", "--trace", "chat-synthetic", "--limit", limit],
                 ["trace", "build", "mooncake", "--limit", limit, "--out", "x.jsonl"],
                 ["engine", "bench", "--limit", limit]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
        assert "--limit" in capsys.readouterr().err


def test_limit_means_the_same_for_files_and_catalog_workloads(small_trace):
    from marconi.cli import load_trace

    for source in (str(small_trace), "swe-sample"):
        assert len(load_trace(source, 7)) == 7
        assert len(load_trace(source, 0)) == 0
        with pytest.raises(ValueError, match="limit"):
            load_trace(source, -1)


def test_a_bad_byte_is_reported_on_its_line(tmp_path, capsys):
    lines = [_line(session_id=i, ts=float(i)).encode() for i in range(400)]
    lines[299] = lines[299].replace(b'"session_id"', b'"sess\xffion_id"')
    path = tmp_path / "bytes.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    assert main(["simulate", "--trace", str(path), *FAST]) == 2
    assert "bytes.jsonl:300: not UTF-8 text" in capsys.readouterr().err
    assert main(["trace", "validate", str(path)]) == 1
    assert capsys.readouterr().out.splitlines() == [f"{path}:300: not UTF-8 text (byte 0xff at column 7)"]


def test_an_empty_trace_is_an_error_not_an_all_zero_record(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    out = tmp_path / "r.jsonl"
    assert main(["simulate", "--trace", str(empty), "--out", str(out), *FAST]) == 2
    assert "has no requests" in capsys.readouterr().err
    assert not out.exists()


def test_duplicate_turns_and_turns_that_do_not_extend_are_reported(tmp_path, capsys):
    path = tmp_path / "odd.jsonl"
    path.write_text("\n".join([
        _line(turn_id=0, input_tokens=[1, 2], output_tokens=[3]),
        _line(turn_id=1, ts=1.0, input_tokens=[1, 2, 3, 4], output_tokens=[5]),   # extends turn 0
        _line(turn_id=1, ts=2.0, input_tokens=[1, 2, 3, 4, 5, 6], output_tokens=[7]),  # repeats turn 1
        _line(turn_id=2, ts=3.0, input_tokens=[9, 9], output_tokens=[]),  # does not extend
        _line(session_id="b", ts=4.0)]) + "\n")
    assert main(["trace", "validate", str(path)]) == 0  # valid, with warnings
    out = capsys.readouterr().out
    assert (f"{path}:3: warning: field 'turn_id': (session 0, turn 1) already appeared at line 2; "
            "1 repeated (session, turn) pair(s) in all") in out
    assert "1 of 3 follow-up turns do not extend their session's previous turn" in out and "(lines 4)" in out
    assert "OK (2 warning(s))" in out
    assert main(["simulate", "--trace", str(path), "--systems", "vanilla", "--capacity", "10GB", "--quiet",
                 "--workers", "1"]) == 0
    err = capsys.readouterr().err
    assert "warning" in err and "(session 0, turn 1) already appeared" in err


def test_clean_traces_have_no_warnings(tmp_path, capsys):
    path = tmp_path / "chat.jsonl"
    assert main(["trace", "build", "bundled", "chat-synthetic", "--out", str(path)]) == 0
    capsys.readouterr()
    assert main(["trace", "validate", str(path)]) == 0
    assert capsys.readouterr().out.strip() == f"{path}: OK"


def test_experiment_output_folders_are_checked_before_any_work(tmp_path, monkeypatch, capsys):
    from marconi.lab.reproduce import pipeline
    from marconi.lab.sparse import command as sparse_command

    def fail(*args, **kwargs):
        raise AssertionError("the study ran before the error was detected")
    monkeypatch.setattr(pipeline, "run_reproduction", fail)
    monkeypatch.setattr(sparse_command, "run_study", fail)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["reproduce", "--profile", "tiny", "--out", str(blocker), "--quiet"]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err
    assert main(["experiment", "sparse", "--tiny", "--out", str(blocker / "sub"), "--quiet"]) == 2
    assert "not a directory" in capsys.readouterr().err


# ----------------------------------------------------------------------------- hardening, round 2 (issue 21)
from pathlib import Path  # noqa: E402

BAMBA_CONFIG = {"model_type": "bamba", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
                "num_key_value_heads": 2, "attn_layer_indices": [1], "mamba_n_heads": 4, "mamba_d_head": 16,
                "mamba_d_state": 8, "mamba_n_groups": 1, "mamba_d_conv": 4, "torch_dtype": "float32"}


def test_out_refuses_a_traces_sidecar(small_trace, no_sweep, capsys):
    """Bug 3: the .meta.json beside a trace is read with it; --out over it destroyed the trace's name and meta."""
    sidecar = Path(str(small_trace) + ".meta.json")
    before = sidecar.read_bytes()
    assert main(["simulate", "--trace", str(small_trace), "--out", str(sidecar), *FAST]) == 2
    assert "also an input" in capsys.readouterr().err
    for option in ("--out", "--plot"):
        argv = ["mrc", "--trace", str(small_trace), "--points", "2", "--quiet", "--workers", "1",
                "--out", str(small_trace.parent / "m.jsonl"), option, str(sidecar)]
        assert main(argv) == 2
        assert "also an input" in capsys.readouterr().err
    assert sidecar.read_bytes() == before


def test_out_refuses_a_file_of_a_model_directory(tmp_path, no_sweep, capsys):
    """Bug 3: --model DIR reads DIR/config.json; --out DIR/config.json destroyed it."""
    model = tmp_path / "model"
    model.mkdir()
    config = model / "config.json"
    config.write_text(json.dumps(BAMBA_CONFIG))
    assert main(["simulate", "--trace", "swe-sample", "--model", str(model), "--out", str(config), *FAST]) == 2
    assert "an input of this command" in capsys.readouterr().err
    assert main(["mrc", "--trace", "swe-sample", "--model", str(model), "--points", "2", "--quiet",
                 "--out", str(config)]) == 2
    assert "an input of this command" in capsys.readouterr().err
    assert json.loads(config.read_text()) == BAMBA_CONFIG


@pytest.mark.parametrize("workers", ["0", "-1"])
def test_workers_below_one_is_an_error_not_one_worker(workers, no_trace_load, capsys):
    for argv in (["simulate", "--trace", "swe-sample", "--workers", workers],
                 ["mrc", "--trace", "swe-sample", "--workers", workers],
                 ["reproduce", "--profile", "tiny", "--workers", workers],
                 ["experiment", "sparse", "--out", "unused", "--workers", workers]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
        assert f"--workers: must be an integer >= 1, got {workers!r}" in capsys.readouterr().err


def test_mrc_limit_zero_is_an_error_as_in_simulate(no_trace_load, capsys):
    with pytest.raises(SystemExit) as info:
        main(["mrc", "--trace", "swe-sample", "--limit", "0"])
    assert info.value.code == 2 and "--limit" in capsys.readouterr().err


def test_huge_workers_are_capped_to_the_cpus_with_a_notice(capsys):
    from marconi.sim.backends import available_cpus

    assert main(["simulate", "--trace", "swe-sample", "--limit", "20", "--workers", "100000", *FAST[:-3]]) == 0
    err = capsys.readouterr().err
    assert f"--workers 100000 is more than the {available_cpus()} CPUs this process may use" in err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_a_full_disk_names_the_path_and_the_table_is_still_printed(capsys):
    assert main(["simulate", "--trace", "swe-sample", "--limit", "20", "--out", "/dev/full", *FAST]) == 2
    captured = capsys.readouterr()
    assert "No space left on device" in captured.err and "/dev/full" in captured.err
    assert "sglang+" in captured.out and "token hit" in captured.out  # the results were not lost with the file


def test_a_missing_ray_is_reported_before_the_trace_loads(monkeypatch, no_trace_load, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    for argv in (["simulate", "--trace", "swe-sample", "--backend", "ray", "--quiet"],
                 ["mrc", "--trace", "swe-sample", "--backend", "ray", "--quiet", "--out", "/dev/null"]):
        assert main(argv) == 2
        assert "the ray backend needs the 'ray' package" in capsys.readouterr().err


def _unused_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.timeout(120)
def test_a_ray_address_with_nothing_listening_fails_fast(small_trace, capsys):
    """Bug 6: ray.init retried an unreachable address for ever (and SIGTERM then took 18 s)."""
    import time

    port = _unused_port()
    started = time.monotonic()
    assert main(["simulate", "--trace", str(small_trace), "--backend", "ray", "--address", f"127.0.0.1:{port}",
                 *FAST]) == 2
    assert time.monotonic() - started < 30
    err = capsys.readouterr().err
    assert f"cannot reach a Ray cluster at 127.0.0.1:{port}" in err and "ray start --head" in err


def test_an_infeasible_point_keeps_the_finished_points(tmp_path, capsys):
    """One vllm-align point its pool cannot serve aborted the sweep and lost the points that had finished.
    The finished points go to r.partial.jsonl: a failed run never replaces --out (an earlier good file)."""
    out = tmp_path / "r.jsonl"
    out.write_text(GOOD)
    code = main(["simulate", "--trace", "swe-sample", "--limit", "20", "--systems", "vllm-align,sglang+",
                 "--capacity", "30MB,3GB", "--out", str(out), "--quiet", "--workers", "1", "--no-per-request"])
    assert code == 2
    captured = capsys.readouterr()
    partial = tmp_path / "r.partial.jsonl"
    records = [json.loads(line) for line in partial.read_text().splitlines()]
    assert [(r["system"], r["capacity"]) for r in records] == [("sglang+", "30MB"), ("vllm-align", "3GB"),
                                                               ("sglang+", "3GB")]
    assert out.read_text() == GOOD
    assert "1 of 4 points could not run: vllm-align at 30MB: vllm-align: a 2097-token request" in captured.err
    assert f"wrote 3 records to {partial}" in captured.err and f"--out {out} left unchanged" in captured.err
    assert "vllm-align" in captured.out and "sglang+" in captured.out  # the table of the finished points
    # a rerun of some of its points keeps the partial: its other points would be lost with it
    assert main(["simulate", "--trace", "swe-sample", "--limit", "20", "--systems", "sglang+", "--capacity", "3GB",
                 "--out", str(out), "--quiet", "--workers", "1", "--no-per-request"]) == 0
    assert len(partial.read_text().splitlines()) == 3 and f"kept {partial}" in capsys.readouterr().err


def test_a_sweep_interrupted_keeps_its_finished_points_beside_out(tmp_path, capsys, monkeypatch):
    """Ctrl-C dropped every point a sweep had finished (an hour of points lost to one key; audit): they
    go to the .partial file beside --out, which stays as it was; the exit is still 130."""
    import importlib

    import marconi.sim.sweep as sweep

    importlib.import_module("marconi.sim.mrc")      # first, so that mrc's own name for run_sweep is the real one

    real = sweep.run_sweep

    def two_then_interrupt(trace, name, points, **kw):
        real(trace, name, points[:2], **kw)             # its on_record sees two finished points
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep, "run_sweep", two_then_interrupt)
    out = tmp_path / "r.jsonl"
    out.write_text(GOOD)
    assert main(["simulate", "--trace", "swe-sample", "--limit", "20", "--systems", "sglang+,vllm+,marconi",
                 "--capacity", "3GB", "--out", str(out), "--quiet", "--workers", "1", "--no-per-request"]) == 130
    partial = tmp_path / "r.partial.jsonl"
    records = [json.loads(line) for line in partial.read_text().splitlines()]
    assert [r["system"] for r in records] == ["sglang+", "vllm+"] and out.read_text() == GOOD
    err = capsys.readouterr().err
    assert f"interrupted after 2 of 3 points: they are in {partial}" in err and "Traceback" not in err


def test_a_curve_interrupted_keeps_the_records_of_its_finished_points(tmp_path, capsys, monkeypatch):
    """As simulate: mrc's finished points, with their fractions, go beside --out; --out and the plot
    stay as they were."""
    import marconi.sim.mrc as mrc
    import marconi.sim.sweep as sweep

    real = sweep.run_sweep             # (mrc's own name for it is bound when mrc is first imported)

    def three_then_interrupt(trace, name, points, **kw):
        real(trace, name, points[:3], **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(mrc, "run_sweep", three_then_interrupt)
    out = tmp_path / "m.jsonl"
    assert main(["mrc", "--trace", "swe-sample", "--limit", "30", "--systems", "sglang+", "--points", "4",
                 "--lo", "0.1", "--workers", "1", "--out", str(out), "--quiet"]) == 130
    records = [json.loads(line) for line in (tmp_path / "m.partial.jsonl").read_text().splitlines()]
    assert len(records) == 3 and all(r["fraction"] == float(r["capacity"].rstrip("x")) for r in records)
    assert not out.exists() and not (tmp_path / "m.png").exists()
    assert "interrupted after 3 of " in capsys.readouterr().err


def test_a_demo_interrupted_before_its_curve_leaves_no_earlier_curve_beside_its_records(tmp_path, capsys,
                                                                                       monkeypatch):
    """An interrupt after demo.jsonl left an earlier run's demo_mrc.jsonl and .png beside it, read as
    this trace's curve (audit)."""
    import marconi.cli as cli

    out = tmp_path / "demo.jsonl"
    for name in ("demo_mrc.jsonl", "demo_mrc.png"):
        (tmp_path / name).write_text("an earlier run's")
    monkeypatch.setattr(cli, "_cmd_mrc", lambda args: (_ for _ in ()).throw(KeyboardInterrupt))
    assert main(["demo", "--trace", "swe-sample", "--capacity", "0.1x", "--out", str(out)]) == 130
    assert out.is_file() and not (tmp_path / "demo_mrc.jsonl").exists() and not (tmp_path / "demo_mrc.png").exists()


def test_compare_and_mrc_plot_a_trace_whose_name_is_not_utf8(tmp_path, capsys):
    """Bug 17: a plot title with an undecodable file name crashed after the records were written."""
    name = os.fsdecode(b"bad\xff.jsonl")
    trace = tmp_path / name
    write_trace(trace, build_workload("swe-sample").head(30))
    out = tmp_path / "r.jsonl"
    assert main(["simulate", "--trace", str(trace), "--out", str(out), *FAST]) == 0
    assert main(["compare", str(out), "--plots", str(tmp_path / "plots")]) == 0
    assert list((tmp_path / "plots").glob("*.png"))
    assert main(["mrc", "--trace", str(trace), "--systems", "sglang+", "--points", "2", "--lo", "0.1",
                 "--workers", "1", "--out", str(tmp_path / "m.jsonl"), "--quiet"]) == 0
    assert (tmp_path / "m.png").stat().st_size > 0
    assert "Traceback" not in capsys.readouterr().err


def test_trace_validate_on_a_catalog_name_says_what_it_is_and_a_misspelt_one_lists_the_catalog(capsys):
    """Old: both said 'unknown trace format (use .jsonl, .jsonl.gz or .parquet)' (audit)."""
    assert main(["trace", "validate", "swe-sample"]) == 0
    assert "a catalog workload, not a file" in capsys.readouterr().out
    assert main(["trace", "validate", "swe-sampel"]) == 2
    err = capsys.readouterr().err
    assert "neither a file nor a catalog workload" in err and "swe-sample" in err


# ------------------------------------------------------------------ results never lost to a later run
SIM = ["--limit", "20", "--quiet", "--workers", "1", "--no-per-request"]


def test_a_run_removes_only_an_earlier_partial_it_covers(tmp_path, capsys):
    """A successful run deleted any .partial file beside --out, even one of another trace's points
    (ten finished points lost to a one-point run; audit)."""
    out = tmp_path / "r.jsonl"
    partial = tmp_path / "r.partial.jsonl"
    other = json.dumps({"system": "marconi", "trace": "another-trace", "capacity": "1GB"}) + "\n"
    partial.write_text(other)
    assert main(["simulate", "--trace", "swe-sample", "--systems", "sglang+", "--capacity", "3GB",
                 "--out", str(out), *SIM]) == 0
    assert partial.read_text() == other and f"kept {partial}" in capsys.readouterr().err
    # a partial of this run's own point is superseded by it
    partial.write_text(out.read_text())
    assert main(["simulate", "--trace", "swe-sample", "--systems", "sglang+", "--capacity", "3GB",
                 "--out", str(out), *SIM]) == 0
    assert not partial.exists() and f"removed {partial}" in capsys.readouterr().err


def test_a_second_interrupted_run_keeps_the_first_ones_points(tmp_path, capsys, monkeypatch):
    """A second Ctrl-C replaced an earlier partial file of 26 points with its own 2 (audit)."""
    import importlib

    import marconi.sim.sweep as sweep

    importlib.import_module("marconi.sim.mrc")
    real = sweep.run_sweep

    def one_then_interrupt(trace, name, points, **kw):
        real(trace, name, points[:1], **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep, "run_sweep", one_then_interrupt)
    out = tmp_path / "r.jsonl"
    for systems in ("vllm+,marconi", "sglang+,marconi"):
        assert main(["simulate", "--trace", "swe-sample", "--systems", systems, "--capacity", "3GB",
                     "--out", str(out), *SIM]) == 130
    partial = tmp_path / "r.partial.jsonl"
    assert [json.loads(line)["system"] for line in partial.read_text().splitlines()] == ["vllm+", "sglang+"]
    assert "with 1 point of an earlier run kept there" in capsys.readouterr().err


def test_a_curve_interrupted_while_it_is_written_keeps_its_points(tmp_path, capsys, monkeypatch):
    """Ctrl-C while mrc wrote its records and plot (about a second, after the whole sweep) lost every
    point: nothing at --out and no partial file (audit)."""
    import marconi.sim.mrc as mrc

    def interrupted(records, path):
        raise KeyboardInterrupt

    monkeypatch.setattr(mrc, "plot_mrc", interrupted)
    out = tmp_path / "m.jsonl"
    assert main(["mrc", "--trace", "swe-sample", "--limit", "30", "--systems", "sglang+", "--points", "3",
                 "--lo", "0.1", "--workers", "1", "--out", str(out), "--quiet"]) == 130
    records = [json.loads(line) for line in (tmp_path / "m.partial.jsonl").read_text().splitlines()]
    curve = [r for r in records if r["system"] == "sglang+"]
    assert len(curve) == 3 and len({r["fraction"] for r in curve}) == 3     # every point of the curve
    assert not out.exists() and not (tmp_path / "m.png").exists()
    assert "interrupted after" in capsys.readouterr().err


def test_out_that_is_not_records_is_never_replaced(tmp_path, capsys):
    """--out naming a trace (or any file that is not records) replaced it with one record (audit)."""
    trace = tmp_path / "mine.jsonl"
    trace.write_text(json.dumps({"input": [1, 2, 3], "output": [4]}) + "\n")
    before = trace.read_text()
    for command in (["simulate", "--trace", "swe-sample", "--systems", "sglang+", "--capacity", "3GB", *SIM],
                    ["mrc", "--trace", "swe-sample", "--limit", "20", "--systems", "sglang+", "--points", "2",
                     "--workers", "1", "--quiet"]):
        assert main([*command, "--out", str(trace)]) == 2
        err = capsys.readouterr().err
        assert f"--out {trace} exists and is not result records" in err and "choose another path" in err
        assert trace.read_text() == before
    # an earlier run's records are replaced, as before
    out = tmp_path / "r.jsonl"
    out.write_text(GOOD)
    assert main(["simulate", "--trace", "swe-sample", "--systems", "sglang+", "--capacity", "3GB",
                 "--out", str(out), *SIM]) == 0
    assert out.read_text() != GOOD


def test_compare_removes_only_the_plots_it_wrote_before(tmp_path, capsys):
    """compare's default plots folder lost a user's own *_hit_rate.png to its stale-plot clean-up (audit)."""
    out = tmp_path / "R.jsonl"
    assert main(["simulate", "--trace", "swe-sample", "--systems", "vllm+,sglang+,marconi", "--capacity", "3GB,6GB",
                 "--out", str(out), *SIM]) == 0
    assert main(["compare", str(out)]) == 0
    plots = tmp_path / "R_plots"
    first = sorted(p.name for p in plots.glob("*.png"))
    mine = plots / "my_annotated_hit_rate.png"
    mine.write_bytes(b"my own figure")
    capsys.readouterr()
    assert main(["simulate", "--trace", "swe-sample", "--systems", "vllm+,sglang+,marconi", "--capacity", "3GB",
                 "--model", "jamba-1.5-mini", "--out", str(out), *SIM]) == 0
    assert main(["compare", str(out)]) == 0
    err = capsys.readouterr().err
    assert mine.read_bytes() == b"my own figure"
    gone = [name for name in first if not (plots / name).exists()]
    assert gone and all(name in err for name in gone) and "my_annotated" not in err


def test_a_reader_that_leaves_early_is_no_error():
    """`marconi systems | head -1` ended with "[Errno 32] Broken pipe" and exit 2 (audit)."""
    import subprocess
    import sys

    proc = subprocess.run(f"{sys.executable} -m marconi systems | head -1", shell=True, capture_output=True,
                          text=True, timeout=120)
    assert proc.stdout.strip() == "systems:" and "Broken pipe" not in proc.stderr and "Error" not in proc.stderr


def test_records_to_dev_stdout_reach_a_pipe():
    """--out /dev/stdout into a pipe resolved to /proc/<pid>/fd/pipe:[N], which names no file: the
    records were lost after the run, with a raw [Errno 2] (audit)."""
    import subprocess
    import sys

    proc = subprocess.run(f"{sys.executable} -m marconi simulate --trace swe-sample --limit 5 --systems marconi "
                          "--capacity 1GB --quiet --workers 1 --no-per-request --out /dev/stdout | cat", shell=True,
                          capture_output=True, text=True, timeout=300)
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["system"] for r in records] == ["marconi"], proc.stderr[-2000:]
    assert "Errno" not in proc.stderr


def test_engine_bench_never_replaces_a_file_that_is_not_its_records(tmp_path, capsys):
    """engine bench --out replaced whatever file it named, notes included (audit); refused before the
    model loads."""
    notes = tmp_path / "notes.jsonl"
    notes.write_text("my notes\n")
    assert main(["engine", "bench", "--model", "bamba-tiny", "--out", str(notes)]) == 2
    err = capsys.readouterr().err
    assert f"--out {notes} exists and is not result records" in err and "'kind'" in err
    assert notes.read_text() == "my notes\n"


def test_engine_bench_names_a_token_past_the_models_vocabulary_before_it_replays(tmp_path, capsys):
    """A token id past the vocabulary failed only when its request was served, after the others had run,
    with the id alone (audit)."""
    trace = tmp_path / "t.jsonl"
    rows = [{"session_id": 0, "turn_id": 0, "ts": 0.0, "input_tokens": [1, 2, 3, 4], "output_tokens": [5, 6]},
            {"session_id": 0, "turn_id": 1, "ts": 1.0, "input_tokens": [1, 2, 3, 4, 5, 6, 40000],
             "output_tokens": [7]}]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["engine", "bench", "--model", "bamba-tiny", "--trace", str(trace), "--lengths", ""]) == 2
    out, err = capsys.readouterr()
    said = "request 2 (session 0, turn 1): token id 40000 is outside the vocabulary [0, 32000) of bamba-tiny"
    assert said in err, err
    assert "TTFT on the" not in out          # refused before any request was replayed


def test_out_dash_is_standard_output(tmp_path, monkeypatch):
    """--out - wrote a file named "-" in the current directory (audit)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "marconi", "simulate", "--trace", "swe-sample", "--limit", "5",
                           "--systems", "marconi", "--capacity", "1GB", "--quiet", "--workers", "1",
                           "--no-per-request", "--out", "-"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [json.loads(line)["system"] for line in proc.stdout.splitlines() if line.startswith("{")] == ["marconi"]
    assert not (tmp_path / "-").exists()


def test_progress_bars_stay_out_of_a_log_file():
    """Run into a log (stderr not a terminal), ``simulate`` wrote its progress bar's every redraw
    (carriage returns, hundreds a run) into it; bars are now drawn on a terminal only, as ``trace
    build`` and ``engine bench`` already did."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "marconi", "simulate", "--trace", "swe-sample", "--limit", "5",
                           "--systems", "marconi", "--capacity", "1GB", "--workers", "1", "--no-per-request",
                           "--out", "-"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "\r" not in proc.stderr and "req/s" not in proc.stderr, proc.stderr[-500:]
