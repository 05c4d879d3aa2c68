"""The benchmark plumbing and the ``engine`` CLI group, on a tiny model (fast; no timing asserted)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.usefixtures("one_torch_thread")

from marconi.engine import bench
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
