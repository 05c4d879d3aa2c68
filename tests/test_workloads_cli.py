"""The ``trace`` command group, driven through ``register`` on a fresh argparse parser."""

from __future__ import annotations

import argparse
import json

import pytest

from marconi.workloads import bundled_data_dir, read_trace, shared_data_dir
from marconi.workloads.commands import register

SHARED = shared_data_dir()


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="marconi")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    return args.func(args)


def test_build_swe_then_stats_and_validate(tmp_path, capsys):
    out = tmp_path / "swe.parquet"
    sample = str(bundled_data_dir() / "swe" / "msa_gemini3pro_verified_first10.json")
    assert run("trace", "build", "swe", sample, "--sessions", "2", "--keep-observations", "off",
               "--gaps", "real", "--out", str(out)) == 0
    trace = read_trace(out)
    assert trace.num_sessions == 2 and trace.meta["params"]["keep_observations"] is None
    assert "wrote" in capsys.readouterr().out

    assert run("trace", "validate", str(out)) == 0
    assert "OK" in capsys.readouterr().out

    assert run("trace", "stats", str(out), "--json") == 0
    record = json.loads(capsys.readouterr().out)
    assert record["num_requests"] == len(trace) and record["num_sessions"] == 2
    assert record["total_input_tokens"] == trace.total_input_tokens

    assert run("trace", "stats", str(out)) == 0
    text = capsys.readouterr().out
    assert f"requests            {len(trace)}" in text and "p50" in text and "p99" in text


def test_build_mooncake_synthetic_and_bundled(tmp_path, capsys):
    mc = tmp_path / "mc.jsonl.gz"
    sample = str(bundled_data_dir() / "mooncake" / "conversation_trace_first2000.jsonl")
    assert run("trace", "build", "mooncake", sample, "--limit", "40", "--out", str(mc)) == 0
    assert len(read_trace(mc)) == 40

    syn = tmp_path / "dq.jsonl"
    assert run("trace", "build", "synthetic", "doc-qa", "--seed", "4", "--set", "num_docs=2",
               "--set", "questions_per_doc=5", "--set", "depth_fractions=0.5,1", "--out", str(syn)) == 0
    trace = read_trace(syn)
    assert len(trace) == 10 and trace.meta["params"]["depth_fractions"] == [0.5, 1.0]
    assert trace.meta["params"]["seed"] == 4

    chat = tmp_path / "chat.jsonl"
    assert run("trace", "build", "synthetic", "chat", "--set", "num_sessions=3", "--set", "turns=2:2",
               "--out", str(chat)) == 0
    assert len(read_trace(chat)) == 6

    assert run("trace", "build", "bundled", "chat-synthetic", "--out", str(tmp_path / "b.parquet")) == 0
    assert read_trace(tmp_path / "b.parquet").meta["provenance"]["workload"] == "chat-synthetic"
    assert run("trace", "build", "bundled", "chat-synthetic:sesions=3", "--out", str(tmp_path / "c.parquet")) == 2
    assert "valid parameters: scale, seed, sessions" in capsys.readouterr().err
    assert not (tmp_path / "c.parquet").exists()
    capsys.readouterr()


def test_validate_reports_all_problems_and_exit_code(tmp_path, capsys):
    good = {"session_id": 0, "turn_id": 0, "ts": 1.0, "input_tokens": [1, 2], "output_tokens": [3]}
    lines = [json.dumps(good),
             json.dumps({**good, "input_tokens": [1, "x"]}),
             json.dumps({**good, "ts": 0.5}),
             '{"session_id": 0, "turn_id": 0, "ts": 2.0, "input_tok']
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines))
    assert run("trace", "validate", str(path)) == 1
    out = capsys.readouterr()
    assert f"{path}:2: field 'input_tokens'" in out.out
    assert f"{path}:3: field 'ts'" in out.out
    assert f"{path}:4: invalid JSON" in out.out
    assert "3 problem(s)" in out.err

    assert run("trace", "stats", str(path)) == 2
    assert f"{path}:2" in capsys.readouterr().err


def test_errors_exit_2_and_write_nothing(tmp_path, capsys):
    out = tmp_path / "o.jsonl"
    missing_tok = tmp_path / "no" / "tokenizer.json"
    sample = str(bundled_data_dir() / "swe" / "msa_gemini3pro_verified_first10.json")
    assert run("trace", "build", "swe", sample, "--tokenizer", str(missing_tok), "--out", str(out)) == 2
    assert str(missing_tok) in capsys.readouterr().err
    assert run("trace", "build", "synthetic", "chat", "--set", "bogus=1", "--out", str(out)) == 2
    assert "bogus" in capsys.readouterr().err
    # several parameters in one --set: was a bare "could not convert string to float"
    assert run("trace", "build", "synthetic", "chat", "--set", "user_len=1,output_len=1", "--out", str(out)) == 2
    assert "--set 'user_len=1,output_len=1': user_len takes a number" in capsys.readouterr().err
    assert run("trace", "build", "synthetic", "chat", "--set", "num_sessions=many", "--out", str(out)) == 2
    assert "num_sessions takes an integer, got 'many'" in capsys.readouterr().err
    # a reversed range or a count below 1: was "bad range (16, 4)" / "no requests to write" (audit)
    assert run("trace", "build", "synthetic", "chat", "--set", "turns=16:4", "--out", str(out)) == 2
    assert "--set 'turns=16:4': turns takes a range lo:hi with 0 <= lo <= hi" in capsys.readouterr().err
    assert run("trace", "build", "synthetic", "chat", "--set", "num_sessions=-1", "--out", str(out)) == 2
    assert "--set 'num_sessions=-1': num_sessions must be at least 1" in capsys.readouterr().err
    assert run("trace", "build", "lmsys", str(tmp_path / "none.jsonl"), "--out", str(out)) == 2
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(SystemExit):
        run("trace", "build", "synthetic", "chat", "--out", str(tmp_path / "o.csv"))


@pytest.mark.shared
@pytest.mark.skipif(SHARED is None, reason="../shared/data is absent (set MARCONI_SHARED_DATA)")
def test_build_sharegpt_from_the_shared_data(tmp_path, capsys):
    out = tmp_path / "sg.jsonl"
    assert run("trace", "build", "sharegpt", "--sessions", "5", "--out", str(out)) == 0
    trace = read_trace(out)
    assert trace.num_sessions == 5 and trace.meta["source"] == "sharegpt"
    assert trace.meta["params"]["pairing"] == "roles"
    capsys.readouterr()


def test_build_refuses_an_out_whose_sidecar_is_an_input(tmp_path, capsys):
    """`trace build --out X.jsonl` also writes X.jsonl.meta.json: that file must not be one the build reads."""
    source = tmp_path / "conv.jsonl.meta.json"          # a Mooncake export that happens to be named so
    source.write_bytes((bundled_data_dir() / "mooncake" / "conversation_trace_first2000.jsonl").read_bytes())
    out = tmp_path / "conv.jsonl"
    assert run("trace", "build", "mooncake", str(source), "--limit", "5", "--out", str(out)) == 2
    assert "conv.jsonl.meta.json" in capsys.readouterr().err
    assert not out.exists() and source.stat().st_size > 0


def test_validate_checks_a_mooncake_file_with_the_reader_trace_uses(tmp_path, capsys):
    # a Mooncake trace has no token fields: the token-trace schema used to report every line as a problem
    rows = [{"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [0, 1]},
            {"timestamp": 5, "input_length": 1200, "output_length": 10, "hash_ids": [0, 1, 2]}]
    good = tmp_path / "mooncake.jsonl"
    good.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert run("trace", "validate", str(good)) == 0
    said = capsys.readouterr().out
    assert "OK (a Mooncake file" in said and "2 requests" in said, said

    bad = tmp_path / "bad_mooncake.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in [*rows, {**rows[1], "input_length": -3}]))
    assert run("trace", "validate", str(bad)) == 1
    out = capsys.readouterr()
    assert f"{bad}:3" in out.out and "input_length" in out.out, out
    assert "1 problem(s)" in out.err


def _sharegpt_file(path, lengths):
    """A ShareGPT-format file with one record per entry of ``lengths`` (messages, alternating roles)."""
    records = [{"id": f"r{k}", "conversations": [{"from": "human" if i % 2 == 0 else "gpt", "value": f"turn {i} of {k}"}
                                                 for i in range(n)]} for k, n in enumerate(lengths)]
    path.write_text(json.dumps(records))
    return str(path)


def test_a_build_with_fewer_sessions_than_asked_says_which_filter_dropped_them(tmp_path, capsys):
    data = _sharegpt_file(tmp_path / "sg.json", [20, 4, 6, 22])
    out = tmp_path / "o.jsonl"
    assert run("trace", "build", "sharegpt", data, "--sessions", "5", "--out", str(out)) == 0
    err = capsys.readouterr().err
    assert read_trace(out).num_sessions == 2
    assert "2 sessions, not the 5 asked: of the input's 4 records, 2 with fewer than 20 messages" in err
    assert "--min-rounds" in err

    assert run("trace", "build", "sharegpt", data, "--sessions", "2", "--out", str(out)) == 0
    assert "NOTE" not in capsys.readouterr().err          # all asked were found: nothing to say
    assert run("trace", "build", "sharegpt", data, "--sessions", "all", "--out", str(out)) == 0
    assert "NOTE" not in capsys.readouterr().err

    sample = str(bundled_data_dir() / "swe" / "msa_gemini3pro_verified_first10.json")
    assert run("trace", "build", "swe", sample, "--sessions", "12", "--out", str(tmp_path / "s.jsonl")) == 0
    assert "10 sessions, not the 12 asked: the input holds 10 trajectories" in capsys.readouterr().err


def test_a_catalog_name_with_fewer_sessions_than_asked_is_noted_where_it_is_loaded(tmp_path):
    from marconi.workloads import load_trace

    data = _sharegpt_file(tmp_path / "sg.json", [20, 4])
    notes: list[str] = []
    trace = load_trace(f"sharegpt:files={data},sessions=3", notice=notes.append)
    assert trace.num_sessions == 1
    assert any("1 sessions, not the 3 asked" in n and "min_rounds=" in n for n in notes), notes
