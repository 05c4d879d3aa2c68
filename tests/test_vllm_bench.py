"""``marconi vllm bench``'s half that needs no vLLM: which requests it replays, from a trace file or a
catalog name (through ``marconi.workloads.load_trace``, as ``simulate`` and ``mrc`` take them)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from marconi.cli import main
from marconi.core.registry import ConfigError
from marconi.integrations.common.server import parse_metrics
from marconi.lab.vllm_bench import BenchConfig, select_requests
from marconi.workloads import build_workload
from marconi.workloads.trace import Request, Trace, write_trace


def _config(trace: str, **fields: object) -> BenchConfig:
    return BenchConfig(vllm_python="unused", trace=trace, **fields)  # type: ignore[arg-type]


def _tokens(requests: list[Request]) -> list[tuple[list[int], list[int]]]:
    return [(r.input_tokens.tolist(), r.output_tokens.tolist()) for r in requests]


def test_a_trace_file_gives_the_same_requests_as_its_catalog_name(tmp_path: Path) -> None:
    source = build_workload("swe-sample:max_input_len=8192")
    path = tmp_path / "mine.jsonl"
    write_trace(path, source.head(12), name="mine")
    from_file = select_requests(_config(str(path), num_requests=5, max_output_len=3))
    from_name = select_requests(_config("swe-sample", num_requests=5, max_output_len=3))
    assert _tokens(from_file.requests) == _tokens(from_name.requests)
    assert from_file.indices == from_name.indices == [0, 1, 2, 3, 4]
    assert all(len(r.output_tokens) <= 3 for r in from_file.requests)
    assert from_file.trace_info == {"trace": "mine", "trace_params": {"max_input_len": 8192}}
    assert from_name.trace_info == {"trace": source.name, "trace_params": {"max_input_len": 8192}}


def test_the_input_cap_ends_a_file_session_at_its_first_longer_input(tmp_path: Path) -> None:
    def req(session: int, turn: int, ts: float, input_len: int) -> Request:
        return Request(session, turn, ts, np.arange(input_len, dtype=np.int32) % 100, np.arange(2, dtype=np.int32))

    # Session 0 grows past the cap at its second turn (its third turn, shorter again, is dropped too).
    trace = Trace([req(0, 0, 0.0, 10), req(1, 0, 1.0, 12), req(0, 1, 2.0, 40), req(1, 1, 3.0, 20),
                   req(0, 2, 4.0, 15)], name="capped")
    path = tmp_path / "capped.jsonl"
    write_trace(path, trace)
    chosen = select_requests(_config(str(path), max_input_len=32))
    assert [(r.session_id, r.turn_id) for r in chosen.requests] == [(0, 0), (1, 0), (1, 1)]
    assert chosen.indices == [0, 1, 2]
    with pytest.raises(ConfigError, match="no request with an input of at most 5 tokens"):
        select_requests(_config(str(path), max_input_len=5))


def test_a_catalog_name_with_parameters_keeps_them() -> None:
    """The cap joins the name's parameters (it used to be appended after a second colon); the
    name's own cap wins and is the one recorded."""
    chosen = select_requests(_config("swe-sample:max_input_len=4096", num_requests=4))
    assert chosen.trace_info["trace_params"] == {"max_input_len": 4096}
    assert len(chosen.requests) == 4 and all(r.input_len <= 4096 for r in chosen.requests)


def test_a_catalog_workload_emptied_by_the_commands_cap_names_the_flag() -> None:
    """Every SWE request with the shared prefix is longer than 8,192 tokens (the replay's default
    cap): the error names the flag to raise, not only the catalog's parameter. A cap the name sets
    itself keeps the catalog's own message."""
    with pytest.raises(ConfigError, match=r"no request with an input of at most 8,192 tokens: raise --max-input-len"):
        select_requests(_config("swe-sample-shared-prefix", max_input_len=8192))
    with pytest.raises(ConfigError, match=r"max_input_len=2048 drops every request.*raise max_input_len") as err:
        select_requests(_config("swe-sample-shared-prefix:max_input_len=2048", max_input_len=8192))
    assert "--max-input-len" not in str(err.value)


def test_the_command_resolves_its_trace_before_it_needs_vllm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mine.jsonl"
    write_trace(path, build_workload("swe-sample").head(3))
    missing_python = str(tmp_path / "no-vllm" / "python")
    work = ["--vllm-python", missing_python, "--work-dir", str(tmp_path / "work"), "--out", str(tmp_path / "o.jsonl")]
    assert main(["vllm", "bench", "--trace", str(tmp_path / "absent.jsonl"), *work]) == 2
    assert "neither a file nor a catalog workload" in capsys.readouterr().err
    assert main(["vllm", "bench", "--trace", str(path), *work]) == 2        # the file resolved; vLLM is missing
    err = capsys.readouterr().err
    assert f"--vllm-python {missing_python}: no such file" in err and "Traceback" not in err   # issue 31: probed


def test_metrics_parse_prometheus_text_without_engine_labels() -> None:
    text = ('# HELP vllm:prefix_cache_hits_total x\n'
            'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 12.0\n'
            'vllm:prefix_cache_hits_total{engine="1",model_name="m"} 3.0\n'
            'marconi:evicted_blocks_total{reason="state",group="mamba",policy="marconi"} 2\n')
    assert parse_metrics(text) == {"vllm:prefix_cache_hits_total": 15.0,
                                   'marconi:evicted_blocks_total{group="mamba",policy="marconi",reason="state"}': 2.0}


def test_a_stand_in_for_absent_data_is_said_even_with_no_notice(monkeypatch, capsys):
    # A bench that passes no notice must not measure the bundled sample believing it the trace asked for
    # (the tier table once measured swe's 307-request stand-in as swe:2000 without a word).
    from marconi.integrations.common import bench as common

    monkeypatch.setenv("MARCONI_SHARED_DATA", "")          # no shared data set: swe falls back to its sample
    common.select_requests("swe", max_input_len=8192, num_requests=3)
    err = capsys.readouterr().err
    assert err.startswith("NOTE: trace swe") and "FALLBACK" in err, err
    said: list[str] = []
    common.select_requests("swe", max_input_len=8192, num_requests=3, notice=said.append)
    assert capsys.readouterr().err == "" and len(said) == 1 and "FALLBACK" in said[0]
    common.select_requests("swe-sample", max_input_len=8192, num_requests=3)   # the sample by name: no stand-in
    assert capsys.readouterr().err == ""
