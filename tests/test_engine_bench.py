"""The benchmark plumbing and the ``engine`` CLI group, on a tiny model (fast; no timing asserted)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.usefixtures("one_torch_thread")

from marconi.engine import bench
from marconi.engine.models import load_model




def _small_trace():
    return bench.swe_like_trace(2, system_len=60, task_len=(20, 30), action_len=(5, 8), observation_len=(10, 20),
                                max_input_len=160)


def test_swe_like_trace_grows_histories():
    reqs = _small_trace()
    assert {r.session for r in reqs} == {0, 1}
    for a, b in zip(reqs, reqs[2:]):  # round robin: the next turn of the same session
        if a.session == b.session:
            prefix = list(a.input_tokens) + list(a.output_tokens)
            assert list(b.input_tokens[: len(prefix)]) == prefix
    assert all(len(r.input_tokens) <= 160 for r in reqs)


def test_replay_ttft_records():
    model = load_model("bamba-tiny")
    records = bench.replay_ttft(model, _small_trace(), capacity_bytes=1e9)
    assert records[0].h == 0.0 and records[1].hit_len == 0  # first session, then a KV-only shared prefix
    later = [r for r in records if r.turn > 0]
    assert later and all(r.h > 0.5 and r.ideal_s > 0 for r in later)
    summary = bench.summarize_ttft(records)
    assert summary["requests"] == len(records) and 0 < summary["token_hit_rate"] < 1


def test_checkpoint_overhead_records():
    model = load_model("bamba-tiny", dtype="float64")
    rows = bench.checkpoint_overhead(model, [64], repeats=1)
    by_mode = {r.mode: r for r in rows}
    assert by_mode["chunk-boundary"].captured_at == 32 and by_mode["segmented"].captured_at == 42
    assert by_mode["chunk-boundary"].bitwise  # chunk-aligned cut in float64
    assert by_mode["segmented"].max_abs_diff <= 1e-12


def test_cli_info_and_bench(tmp_path, capsys):
    from marconi.cli import main
    from marconi.workloads.trace import Request, write_trace

    assert main(["engine", "info", "--model", "lfm2-tiny"]) == 0
    assert "spec check" in capsys.readouterr().out
    reqs = [Request(r.session, r.turn, float(i), r.input_tokens, r.output_tokens) for i, r in enumerate(_small_trace())]
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
