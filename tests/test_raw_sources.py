"""Raw source files given as a trace: recognised by their first record, built by the catalog's recipe
(``files=``) with a notice, the same trace as the catalog name with ``files=`` and as ``marconi trace
build``; anything else is refused naming both what a token trace is and which sources are recognised."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from marconi.cli import main
from marconi.core.registry import ConfigError
from marconi.workloads import TraceFormatError, build_workload, bundled_data_dir, load_trace, read_trace
from marconi.workloads.raw import RAW_SOURCES, raw_source_of
from marconi.workloads.source import TOKEN_TRACE, trace_file_kind


def _conversation(n: int, text: str, key_from: str = "from", key_text: str = "value") -> list[dict]:
    return [{key_from: "human" if i % 2 == 0 else "gpt", key_text: f"{text} {i} " * 4} for i in range(2 * n)]


@pytest.fixture
def sharegpt_file(tmp_path):
    path = tmp_path / "held_out_part.json"
    path.write_text(json.dumps([{"id": f"s{k}", "conversations": _conversation(11, f"session {k}")}
                                for k in range(3)]))
    return path


@pytest.fixture
def quality_file(tmp_path):
    questions = [{"question": f"question {q}?", "options": ["a", "b", "c", "d"], "gold_label": 1}
                 for q in range(3)]
    path = tmp_path / "quality_held_out.jsonl"
    path.write_text("\n".join(json.dumps({"article_id": str(k), "title": f"t{k}", "article": "words " * 300,
                                          "questions": questions}) for k in range(2)) + "\n")
    return path


def _tokens(trace) -> list[tuple[list[int], list[int]]]:
    return [(r.input_tokens.tolist(), r.output_tokens.tolist()) for r in trace]


def test_each_source_is_recognised_by_its_first_record(tmp_path, sharegpt_file, quality_file):
    swe = bundled_data_dir() / "swe" / "msa_gemini3pro_verified_first10.json"
    traj = bundled_data_dir() / "swe" / "sweagent_gpt4_pydicom-1458.traj"
    lmsys = tmp_path / "lmsys.jsonl"
    lmsys.write_text(json.dumps({"conversation_id": "c", "conversation": _conversation(2, "x", "role", "content")})
                     + "\n")
    parquet = tmp_path / "sharegpt.parquet"
    pq.write_table(pa.Table.from_pylist([{"id": "a", "conversations": _conversation(2, "y")}]), parquet)
    assert {raw_source_of(p) for p in (sharegpt_file, parquet)} == {"sharegpt"}
    assert raw_source_of(lmsys) == "lmsys" and raw_source_of(quality_file) == "quality"
    assert raw_source_of(swe) == "swe" and raw_source_of(traj) == "swe"
    # Not raw sources: a token trace, an empty array, a broken file, a directory, a missing path.
    token_trace = tmp_path / "t.jsonl"
    token_trace.write_text(json.dumps({"session_id": 0, "turn_id": 0, "ts": 0.0, "input_tokens": [1, 2],
                                       "output_tokens": [3]}) + "\n")
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    broken = tmp_path / "broken.json"
    broken.write_text('[{"conversations": [')
    for path in (token_trace, empty, broken, tmp_path, tmp_path / "missing.json"):
        assert raw_source_of(path) is None, path
    assert set(RAW_SOURCES) == {"sharegpt", "lmsys", "swe", "quality"}


def test_a_folder_of_trajectories_is_the_swe_recipe_on_the_folder(tmp_path):
    trajectories = json.loads((bundled_data_dir() / "swe" / "msa_gemini3pro_verified_first10.json").read_text())
    folder = tmp_path / "trajs"
    for i, traj in enumerate(trajectories[:3]):
        (folder / traj["instance_id"]).mkdir(parents=True)
        (folder / traj["instance_id"] / f"{traj['instance_id']}.traj.json").write_text(json.dumps(traj))
    assert raw_source_of(folder) == "swe"
    assert _tokens(load_trace(str(folder))) == _tokens(build_workload(f"swe:files={folder}"))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "a.json").write_text("[1, 2]")
    assert raw_source_of(tmp_path / "other") is None


def test_a_mini_swe_agent_run_folder_with_its_preds_json_is_its_trajectories(tmp_path):
    """mini-swe-agent's run folder holds ``preds.json`` (each instance's patch) beside the trajectories.
    Old: "trajectory 'preds' has no 'messages' or 'history'"; and where it sorted first (instances
    named after 'preds', e.g. sympy's), the folder was not recognised at all."""
    trajectories = json.loads((bundled_data_dir() / "swe" / "msa_gemini3pro_verified_first10.json").read_text())
    folder = tmp_path / "run"
    for traj in trajectories[:2]:
        name = "sympy__" + traj["instance_id"]           # sorts after preds.json
        (folder / name).mkdir(parents=True)
        (folder / name / f"{name}.traj.json").write_text(json.dumps({**traj, "instance_id": name}))
    (folder / "preds.json").write_text(json.dumps({"x": {"instance_id": "x", "model_patch": "diff"}}))
    assert raw_source_of(folder) == "swe"
    trace = load_trace(str(folder))
    assert trace.meta["num_sessions"] == 2
    with pytest.raises(ValueError, match="trajectory 'preds' has no 'messages' or 'history'"):
        build_workload(f"swe:files={folder / 'preds.json'}")       # named alone: read, and refused


def test_mini_swe_agents_own_trajectory_files_are_the_swe_recipe(tmp_path):
    """mini-swe-agent writes ``<id>/<id>.traj.json`` as ``{"info": {"exit_status", ...}, "messages": [...],
    "trajectory_format": ...}``: no top-level ``instance_id`` or ``exit_status``. Old: refused as an
    unknown format (a file) or "is a directory" (its folder), though ``swe:files=`` read both."""
    trajectories = json.loads((bundled_data_dir() / "swe" / "msa_gemini3pro_verified_first10.json").read_text())
    folder = tmp_path / "trajs"
    for traj in trajectories[:2]:
        native = {"info": {"exit_status": traj.get("exit_status", "Submitted"), "submission": ""},
                  "messages": traj["messages"], "trajectory_format": "mini-swe-agent-1"}
        (folder / traj["instance_id"]).mkdir(parents=True)
        (folder / traj["instance_id"] / f"{traj['instance_id']}.traj.json").write_text(json.dumps(native))
    one = next(folder.rglob("*.traj.json"))
    assert raw_source_of(one) == "swe" and raw_source_of(folder) == "swe"
    assert _tokens(load_trace(str(one))) == _tokens(build_workload(f"swe:files={one}"))
    assert _tokens(load_trace(str(folder))) == _tokens(build_workload(f"swe:files={folder}"))
    header = tmp_path / "no_status.json"         # mini-swe-agent's header without an exit status yet
    header.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}], "info": {"model": "m"}}))
    assert raw_source_of(header) == "swe"


def test_gzipped_mooncake_and_chat_files_are_read_as_their_sources(tmp_path, sharegpt_file):
    """Old: a ``.jsonl.gz`` Mooncake or ShareGPT file given as a trace was read as a gzipped token trace
    ("field 'session_id': missing"), and ``sharegpt:files=`` did not read it ("not UTF-8 text")."""
    import gzip

    rows = [{"timestamp": 1000 * i, "input_length": 1024, "output_length": 4, "hash_ids": [0, i + 1]}
            for i in range(3)]
    mooncake = tmp_path / "held_out.jsonl.gz"
    with gzip.open(mooncake, "wt") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in rows))
    plain = tmp_path / "held_out.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert trace_file_kind(mooncake) == "mooncake"
    assert _tokens(load_trace(str(mooncake))) == _tokens(load_trace(str(plain)))
    saved_as_json = tmp_path / "held_out.json"             # old: "neither a token trace nor a raw source"
    saved_as_json.write_text(plain.read_text())
    assert trace_file_kind(saved_as_json) == "mooncake"
    assert _tokens(load_trace(str(saved_as_json))) == _tokens(load_trace(str(plain)))
    chat = tmp_path / "chat.jsonl.gz"
    with gzip.open(chat, "wt") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in json.loads(sharegpt_file.read_text())))
    assert raw_source_of(chat) == "sharegpt"
    assert _tokens(load_trace(str(chat))) == _tokens(load_trace(str(sharegpt_file)))
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(b"\x1f\x8b\x08 not a gzip stream")
    assert raw_source_of(broken) is None and trace_file_kind(broken) == TOKEN_TRACE   # its reader says why:
    with pytest.raises(TraceFormatError, match=r"broken.jsonl.gz:1: unreadable \(error: Error -3 while decompressing"):
        load_trace(str(broken))                  # old: zlib.error's traceback


def test_a_first_record_larger_than_one_read_is_still_recognised(tmp_path):
    path = tmp_path / "big.json"
    path.write_text(json.dumps([{"id": "a", "conversations": _conversation(400, "long text " * 20)}]))
    assert os.path.getsize(path) > 1 << 18
    assert raw_source_of(path) == "sharegpt"


def test_a_raw_file_builds_as_the_catalog_recipe_with_files_and_says_so(sharegpt_file, quality_file):
    told: list[str] = []
    trace = load_trace(str(sharegpt_file), notice=told.append)
    named = build_workload(f"sharegpt:files={sharegpt_file}")
    assert len(trace) > 0 and _tokens(trace) == _tokens(named)
    assert len(told) == 1 and "chat conversations (ShareGPT, or OpenAI-format messages), not a token trace" in told[0]
    assert "sharegpt:files=" in told[0] and "marconi trace build sharegpt" in told[0]
    assert _tokens(load_trace(str(sharegpt_file), 2)) == _tokens(named)[:2]
    q = load_trace(str(quality_file))
    assert len(q) == 2 * 3 and _tokens(q) == _tokens(build_workload(f"quality:files={quality_file}"))
    swe = bundled_data_dir() / "swe" / "msa_gemini3pro_verified_first10.json"
    assert _tokens(load_trace(str(swe))) == _tokens(build_workload("swe-sample"))


def test_files_replaces_the_data_and_conflicts_with_data(sharegpt_file):
    trace = build_workload(f"sharegpt:files={sharegpt_file},sessions=2")
    p = trace.meta["provenance"]
    assert p["fallback"] is None and str(sharegpt_file) in p["data"] and p["licence"] == "the given files' own"
    assert trace.meta["num_sessions"] == 2
    with pytest.raises(ConfigError, match=r"give files= or data=synthetic, not both"):
        build_workload(f"sharegpt:files={sharegpt_file},data=synthetic")
    mooncake = bundled_data_dir() / "mooncake" / "conversation_trace_first2000.jsonl"
    assert _tokens(build_workload(f"mooncake:files={mooncake},requests=30")) == \
        _tokens(build_workload("mooncake-sample:requests=30"))
    with pytest.raises(ConfigError, match=r"mooncake: files= takes one trace file, got 2"):
        build_workload(f"mooncake:files={mooncake}{os.pathsep}{mooncake}")


def test_the_cli_simulates_a_raw_file_and_matches_trace_build(sharegpt_file, tmp_path, capsys):
    built = tmp_path / "built.jsonl"
    assert main(["trace", "build", "sharegpt", str(sharegpt_file), "--out", str(built)]) == 0
    assert _tokens(read_trace(built)) == _tokens(load_trace(str(sharegpt_file)))
    capsys.readouterr()
    out = tmp_path / "r.jsonl"
    assert main(["simulate", "--trace", str(sharegpt_file), "--systems", "marconi", "--capacity", "0.5x",
                 "--quiet", "--out", str(out)]) == 0
    assert "not a token trace" in capsys.readouterr().err
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 1 and records[0]["num_requests"] == len(read_trace(built))


def test_an_unrecognised_file_names_both_token_traces_and_raw_sources(tmp_path, capsys):
    path = tmp_path / "notes.json"
    path.write_text(json.dumps([{"notes": [{"author": "me", "text": "hi"}]}]))
    with pytest.raises(ConfigError, match=r"notes\.json: neither a token trace \(\.jsonl.*\) nor a raw source .*"
                                          r"sharegpt: chat conversations \(ShareGPT, or OpenAI-format messages\)"
                                          r".*marconi trace build --help"):
        load_trace(str(path))
    assert main(["simulate", "--trace", str(path), "--systems", "marconi", "--capacity", "1GB", "--quiet"]) == 2
    assert "neither a token trace" in capsys.readouterr().err


def test_trace_stats_takes_what_a_trace_option_takes(sharegpt_file, quality_file, tmp_path, capsys):
    """A raw file or a catalog name gets the stats of the trace its recipe builds; a token trace file
    still streams (the same figures as the built trace's)."""
    built = tmp_path / "built.jsonl"
    assert main(["trace", "build", "sharegpt", str(sharegpt_file), "--out", str(built)]) == 0
    capsys.readouterr()
    figures = []
    for source in (str(sharegpt_file), str(built)):
        assert main(["trace", "stats", source, "--json"]) == 0
        record = json.loads(capsys.readouterr().out)
        figures.append({k: v for k, v in record.items() if k != "file"})
    assert figures[0] == figures[1] and figures[0]["num_requests"] == len(read_trace(built))
    assert main(["trace", "stats", "mooncake-sample:requests=20", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_requests"] == 20
    # a raw source with a token trace's suffix (QuALITY is .jsonl) is built, not streamed as a trace
    assert main(["trace", "stats", str(quality_file), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_requests"] == len(load_trace(str(quality_file)))
    assert [trace_file_kind(p) for p in (quality_file, built, tmp_path / "missing.jsonl")] == \
        ["quality", TOKEN_TRACE, None]
