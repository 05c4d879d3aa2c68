"""The benchmark plumbing and the ``engine`` CLI group, on a tiny model (fast; no timing asserted)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.usefixtures("one_torch_thread")

from marconi.lab import engine_bench as bench
from marconi.engine.models import load_model
from marconi.workloads.synthetic import agent_trace




def _small_trace(max_input_len: int = 160):
    """Two agents sharing a 60-token system prompt, both started before either's second call."""
    trace = agent_trace(num_sessions=2, calls=(6, 6), system_prompt_len=60, task_len=25, action_len=6,
                        observation_len=15, sessions_per_second=100.0, mean_gap_s=2.0, max_input_len=400, seed=3)
    return bench.trace_requests(trace, max_input_len=max_input_len)


def test_trace_requests_cut_sessions_to_fit_and_renumber_them():
    reqs = _small_trace()
    assert {r.session_id for r in reqs} == {0, 1} and len(reqs) >= 4
    assert all(len(r.input_tokens) <= 160 and len(r.output_tokens) > 0 for r in reqs)
    by_session = {}
    for r in reqs:  # every later call of a session continues its previous call's input + output
        prev = by_session.get(r.session_id)
        if prev is not None:
            prefix = list(prev.input_tokens) + list(prev.output_tokens)
            assert list(r.input_tokens[: len(prefix)]) == prefix
        by_session[r.session_id] = r
    assert len(bench.trace_requests(_small_trace(), max_input_len=160, max_sessions=1)) < len(reqs)
    assert len(bench.trace_requests(_small_trace(), max_input_len=160, limit=3)) == 3


def test_replay_ttft_records():
    model = load_model("bamba-tiny")
    records = bench.replay_ttft(model, _small_trace(), capacity_bytes=1e9)
    assert records[0].h == 0.0 and records[1].hit_len == 0  # first session, then a KV-only shared prefix
    later = [r for r in records if r.turn > 0]
    assert later and all(r.h > 0.5 and r.ideal_s > 0 for r in later)
    summary = bench.summarize_ttft(records)
    assert summary["requests"] == len(records) and 0 < summary["token_hit_rate"] < 1


def test_whole_prompt_hits_leave_the_ratio_to_ideal_instead_of_dividing_by_zero():
    """Identical prompts hit whole (h = 1, an ideal TTFT of 0): the summary divided by that sum and
    ``marconi engine bench`` died with ZeroDivisionError. They are left out of the ratio (NaN when
    nothing else hit); a partial hit keeps its ratio."""
    def rec(h: float, ideal: float, cached: float = 0.01) -> bench.TTFTRecord:
        ratio = cached / ideal if ideal else float("inf")
        return bench.TTFTRecord(0, 1, 100, int(100 * h), h, cached, 0.02, ideal, ratio, 0.0, 0.0, 0.0, 1)
    whole = bench.summarize_ttft([rec(0.0, 0.02, 0.02), rec(1.0, 0.0), rec(1.0, 0.0)])
    assert whole["ratio_to_ideal_hits"] != whole["ratio_to_ideal_hits"]          # NaN
    mixed = bench.summarize_ttft([rec(1.0, 0.0), rec(0.5, 0.01, 0.012)])
    assert mixed["ratio_to_ideal_hits"] == pytest.approx(1.2)


def test_the_bench_reads_its_trace_as_every_command_does():
    """``engine bench --trace nosuch`` said "unknown trace format"; ``simulate`` says the name is
    neither a file nor a catalog workload. One reader now (``load_trace``), so raw sources work too."""
    from marconi.core.registry import ConfigError

    with pytest.raises(ConfigError, match="'nosuch' is neither a file nor a catalog workload"):
        bench.trace_requests("nosuch", max_input_len=100)
    assert bench.trace_requests("swe-sample", max_input_len=4000, limit=2)


def test_checkpoint_overhead_records():
    model = load_model("bamba-tiny", dtype="float64")
    rows = bench.checkpoint_overhead(model, [64], repeats=1)
    by_mode = {r.mode: r for r in rows}
    assert by_mode["chunk-boundary"].captured_at == 32 and by_mode["segmented"].captured_at == 42
    assert by_mode["chunk-boundary"].bitwise  # chunk-aligned cut in float64
    assert by_mode["segmented"].max_abs_diff <= 1e-12


def test_cli_info_and_bench(tmp_path, capsys):
    from marconi.cli import main
    from marconi.workloads.trace import write_trace

    assert main(["engine", "info", "--model", "lfm2-tiny"]) == 0
    assert "spec check" in capsys.readouterr().out
    reqs = _small_trace()
    trace = tmp_path / "t.jsonl"
    write_trace(trace, reqs)
    out = tmp_path / "bench.jsonl"
    code = main(["engine", "bench", "--model", "bamba-tiny", "--trace", str(trace), "--max-input", "200",
                 "--lengths", "64", "--repeats", "1", "--out", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "measured/ideal" in text and "chunk-boundary" in text
    kinds = [json.loads(line)["kind"] for line in out.read_text().splitlines()]
    assert kinds.count("ttft") == len(reqs) and kinds.count("checkpointing") == 3


# ----------------------------------------------------------------------------- hardening (issue 21)
@pytest.fixture
def no_model_load(monkeypatch):
    """Fails the test if the model loads: the error had to be found before any work."""
    import marconi.engine.models

    def fail(*args, **kwargs):
        raise AssertionError("the model loaded before the error was detected")
    monkeypatch.setattr(marconi.engine.models, "load_model", fail)


@pytest.mark.parametrize("argv, message", [
    (["--out", "/proc/nope/x.jsonl"], "--out /proc/nope/x.jsonl"),
    (["--lengths", "abc"], "--lengths: 'abc' is not a whole number of tokens"),
    (["--lengths", "64,0"], "--lengths: every length must be >= 2 tokens, got 0"),
    (["--capacity", "lots"], "--capacity: cannot read 'lots' as a size"),
])
def test_bench_option_errors_come_before_any_work(argv, message, no_model_load, capsys):
    """Bug 14: --out and --lengths were checked only after the whole TTFT replay."""
    from marconi.cli import main

    assert main(["engine", "bench", "--model", "bamba-tiny", *argv]) == 2
    assert message in capsys.readouterr().err


def test_bench_out_refuses_the_traces_sidecar_and_the_model_directory(tmp_path, no_model_load, capsys):
    from marconi.cli import main
    from marconi.workloads.trace import write_trace

    trace = tmp_path / "t.jsonl"
    write_trace(trace, _small_trace())
    sidecar = tmp_path / "t.jsonl.meta.json"
    before = sidecar.read_bytes()
    assert main(["engine", "bench", "--trace", str(trace), "--out", str(sidecar)]) == 2
    assert "also an input" in capsys.readouterr().err and sidecar.read_bytes() == before
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert main(["engine", "bench", "--model", str(model), "--out", str(model / "config.json")]) == 2
    assert "an input of this command" in capsys.readouterr().err
    assert (model / "config.json").read_text() == "{}"


def test_bench_with_no_request_that_fits_is_an_error_not_a_nan_table(tmp_path, no_model_load, capsys):
    from marconi.cli import main
    from marconi.workloads.trace import write_trace

    trace = tmp_path / "t.jsonl"
    write_trace(trace, _small_trace())
    assert main(["engine", "bench", "--trace", str(trace), "--max-input", "5"]) == 2
    err = capsys.readouterr().err
    assert "no request of" in err and "--max-input 5" in err


def test_bench_with_no_cache_hit_exits_non_zero_after_the_table(tmp_path, capsys):
    from marconi.cli import main
    from marconi.workloads.trace import write_trace

    trace = tmp_path / "t.jsonl"
    write_trace(trace, _small_trace()[:1])  # one request: nothing to hit
    out = tmp_path / "bench.jsonl"
    code = main(["engine", "bench", "--model", "bamba-tiny", "--trace", str(trace), "--max-input", "200",
                 "--lengths", "", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 1
    assert "measured/ideal" in captured.out and out.exists()  # the measurements are shown and kept
    assert "no request hit the cache" in captured.err


def test_engine_bench_writes_an_undefined_ratio_as_null_not_nan(tmp_path, capsys):
    """With no hit, the summary's ratios are undefined: the records file wrote them as ``NaN``, which
    is not JSON (``jq`` and strict parsers refuse the line). They are null now."""
    from marconi.cli import main

    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"session_id": 0, "turn_id": 0, "ts": 0.0, "input_tokens": [1, 2, 3, 4],
                                 "output_tokens": [5]}) + "\n")
    out = tmp_path / "bench.jsonl"
    assert main(["engine", "bench", "--model", "bamba-tiny", "--trace", str(trace), "--lengths", "",
                 "--repeats", "1", "--out", str(out)]) == 1          # nothing hit: said, exit 1

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    records = [json.loads(line, parse_constant=refuse) for line in out.read_text().splitlines()]
    summary = next(r for r in records if r["kind"] == "ttft_summary")
    assert summary["ratio_to_ideal_hits"] is None and summary["speedup"] > 0
    assert "no request hit the cache" in capsys.readouterr().err
