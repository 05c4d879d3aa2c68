"""The `marconi` command line end to end: real output, clear errors, nothing half-written."""

import json

from marconi.cli import main


def test_models_and_systems_list(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "paper-7b" in out and "26,787,840" in out and "65,536" in out
    assert main(["systems"]) == 0
    out = capsys.readouterr().out
    for name in ("vanilla", "vllm+", "sglang+", "marconi", "flop-aware", "every-block", "sparse-dp", "oracle",
                 "infinite", "adaptive", "tuner=auto", "tuner=bootstrap"):
        assert name in out


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
    assert "neither a file nor a bundled trace" in capsys.readouterr().err
    assert main(["simulate", "--trace", "swe-sample", "--systems", "marconi:alfa=1", "--quiet"]) == 2
    assert "valid parameters: alpha" in capsys.readouterr().err
    assert main(["simulate", "--trace", "swe-sample", "--capacity", "1", "--quiet"]) == 2
    assert "smaller than one SSM checkpoint" in capsys.readouterr().err
