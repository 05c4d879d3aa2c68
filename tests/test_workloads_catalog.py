"""The workload catalog: every name builds, says where it came from, falls back as documented and
says so, and typos list what is valid.

Without the shared data set (``MARCONI_SHARED_DATA=""``) every real-data entry must take its
documented stand-in and say so; with it (CI) it must use the real data and not claim a fallback.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from marconi.cli import main
from marconi.lab.reproduce import PROFILES, with_available_data
from marconi.lab.reproduce.traces import TraceFactory
from marconi.lab.sparse import study_workload
from marconi.core.registry import ConfigError
from marconi.workloads import (DataUnavailable, Provenance, build_swe_trace, build_workload, bundled_data_dir,
                               catalog_entries, chat_trace, doc_qa_trace, read_trace, workload_names,
                               write_trace)

REAL_DATA = ("swe", "swe-keepall", "sharegpt", "mooncake", "quality")   # entries with data=auto|shared|<stand-in>
STAND_IN = {"swe": "bundled", "swe-keepall": "bundled", "mooncake": "bundled", "sharegpt": "synthetic",
            "quality": "synthetic"}


def _tiny(name: str) -> str:
    """A spec of ``name`` small enough for a unit test (a few sessions / requests / documents)."""
    return {"mooncake": "mooncake:requests=20", "mooncake-sample": "mooncake-sample:requests=20",
            "quality": "quality:articles=2", "doc-qa-synthetic": "doc-qa-synthetic:docs=2,doc_len=500,questions=4",
            "shared-prompts-synthetic": "shared-prompts-synthetic:sessions=20,prompt_len=200",
            "prompt-tree-synthetic": "prompt-tree-synthetic:sessions=10,prompt_scale=0.1",
            "agent-synthetic": "agent-synthetic:sessions=2,max_input_len=8000",
            "chat-synthetic": "chat-synthetic:sessions=3",
            }.get(name, f"{name}:sessions=2")


@pytest.fixture
def lmsys_file(tmp_path):
    conv = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " * 5} for i in range(20)]
    path = tmp_path / "lmsys.jsonl"
    path.write_text("\n".join(json.dumps({"conversation_id": f"c{k}", "conversation": conv}) for k in range(3)) + "\n")
    return path


@pytest.fixture
def no_shared_data(monkeypatch):
    monkeypatch.setenv("MARCONI_SHARED_DATA", "")


def _build_every_name(lmsys_file):
    for name in workload_names():
        overrides = {"files": str(lmsys_file)} if name == "lmsys" else {}
        yield name, build_workload(_tiny(name), **overrides)


def _check_provenance(name, trace):
    p = Provenance.of(trace)
    assert p is not None, name
    assert trace.name == p.workload and p.workload.startswith(name)
    assert p.data and p.licence, name
    entry = next(e for e in catalog_entries() if e["name"] == name)
    assert set(p.params) == set(entry["params"]), name          # every parameter, defaults included
    assert len(trace) > 0 and [r.ts for r in trace] == sorted(r.ts for r in trace)
    return p


def test_every_name_builds_small_with_provenance_and_no_fallback_where_the_data_is(lmsys_file, shared_data):
    for name, trace in _build_every_name(lmsys_file):
        p = _check_provenance(name, trace)
        assert p.fallback is None and not p.describe().startswith("FALLBACK"), (name, p)
        if name in REAL_DATA:
            assert "under" in p.data or str(shared_data) in p.data, (name, p.data)   # the shared files


def test_every_name_builds_from_the_repository_alone_and_says_which_are_stand_ins(lmsys_file, no_shared_data):
    for name, trace in _build_every_name(lmsys_file):
        p = _check_provenance(name, trace)
        if name in REAL_DATA:
            assert p.fallback and p.fallback.endswith("is absent"), (name, p)
            assert p.describe().startswith(f"FALLBACK: {p.fallback}; ")
            assert "vendored" in p.data or "synthetic" in p.data, (name, p.data)
        else:
            assert p.fallback is None, (name, p)


@pytest.mark.parametrize("name", REAL_DATA)
def test_data_shared_refuses_clearly_without_the_data_and_an_explicit_stand_in_is_no_fallback(name, no_shared_data):
    with pytest.raises(DataUnavailable, match=f"README.*data={STAND_IN[name]}"):
        build_workload(f"{_tiny(name)},data=shared")
    stand_in = build_workload(f"{_tiny(name)},data={STAND_IN[name]}")
    assert Provenance.of(stand_in).fallback is None           # asked for: nothing replaced anything
    auto = build_workload(_tiny(name))
    assert all(a == b for a, b in zip(auto, stand_in)) and len(auto) == len(stand_in)


def test_lmsys_without_files_refuses_and_says_how(no_shared_data):
    with pytest.raises(DataUnavailable, match="lmsys:files=PATH"):
        build_workload("lmsys")


def test_unknown_names_and_parameters_list_the_valid_ones():
    with pytest.raises(ConfigError) as info:
        build_workload("swe-smaple")
    for name in ("swe-sample", "sharegpt", "mooncake-sample", "prompt-tree-synthetic", "agent-cpu-synthetic"):
        assert name in str(info.value)
    with pytest.raises(ConfigError, match="valid parameters: scale, seed, sessions, max_turns"):
        build_workload("swe-sample:sesions=3")
    with pytest.raises(ConfigError, match="not a valid int"):
        build_workload("swe-sample:sessions=three")
    with pytest.raises(ConfigError, match="choose one of auto, shared, bundled"):
        build_workload("swe:data=vendored")
    with pytest.raises(ConfigError, match="not both"):
        build_workload("chat-synthetic:sessions=3,scale=0.5")
    with pytest.raises(ConfigError, match="scale must be a number > 0"):
        build_workload("chat-synthetic:scale=0")


def test_scale_is_a_fraction_of_the_full_size_and_the_name_rebuilds_the_trace():
    assert build_workload("swe-sample:scale=0.5").num_sessions == 5             # of 10
    assert build_workload("chat-synthetic:scale=0.01").num_sessions == 2        # of 200
    assert build_workload("doc-qa-synthetic:scale=0.25,doc_len=300").num_sessions == 2   # of 8 documents
    trace = build_workload("agent-synthetic:scale=0.04", seed=3)                # an override joins the name
    assert trace.name == "agent-synthetic:scale=0.04,seed=3" and trace.num_sessions == 2
    again = build_workload(trace.name)
    assert len(again) == len(trace) and all(a == b for a, b in zip(again, trace))
    other = build_workload("agent-synthetic:scale=0.04,seed=4")
    assert not all(np.array_equal(a.input_tokens, b.input_tokens) for a, b in zip(other, trace))


def test_entries_are_the_builders_they_name():
    """The catalog adds names and provenance, never other data: each entry equals its builder's call."""
    sample = bundled_data_dir() / "swe" / "msa_gemini3pro_verified_first10.json"
    pairs = [
        (build_workload("swe-sample"), build_swe_trace([sample])),   # what the golden numbers replay
        (build_workload("swe-keepall:sessions=3,data=bundled,max_turns=9"),
         build_swe_trace([sample], num_sessions=3, keep_observations=None, max_turns=9)),
        (build_workload("sharegpt:sessions=7,data=synthetic"),       # the reproduction's fresh-clone stand-in
         chat_trace(num_sessions=7, turns=(2, 8), system_prompt_len=300, think_time_s=10.0, seed=0)),
        (build_workload("quality:articles=3,data=synthetic", seed=2),
         doc_qa_trace(num_docs=3, doc_len=7500, questions_per_doc=12, depth_fractions=(1.0,), question_len=75,
                      answer_len=18, instruction_len=33, seed=2)),
    ]
    for built, direct in pairs:
        assert len(built) == len(direct) > 0 and all(a == b for a, b in zip(built, direct)), built.name


def test_provenance_travels_with_the_trace_file(tmp_path, no_shared_data):
    trace = build_workload("sharegpt:sessions=2")
    for suffix in ("jsonl", "parquet"):
        path = tmp_path / f"t.{suffix}"
        write_trace(path, trace)
        back = read_trace(path)
        assert back.name == trace.name and Provenance.of(back) == Provenance.of(trace)
        assert Provenance.of(back).fallback == "../shared/data/sharegpt is absent"


def test_agent_cpu_is_the_engine_benchs_trace_shape():
    """What the engine bench's ``swe_like_trace`` made: agents sharing an 800-token system prompt, each call's
    input = the previous input + its output + a new observation, <= max_turns calls, inputs capped."""
    trace = build_workload("agent-cpu-synthetic:sessions=3,max_input_len=2500")
    sessions = trace.sessions()
    assert len(sessions) == 3 and max(r.input_len for r in trace) <= 2500
    firsts = [reqs[0].input_tokens for reqs in sessions.values()]
    assert all(np.array_equal(f[:800], firsts[0][:800]) for f in firsts)
    assert not np.array_equal(firsts[0][800:900], firsts[1][800:900])
    for reqs in sessions.values():
        assert 1 <= len(reqs) <= 8
        for a, b in zip(reqs, reqs[1:]):
            history = np.concatenate([a.input_tokens, a.output_tokens])
            assert b.input_len > history.size and np.array_equal(b.input_tokens[:history.size], history)
    assert [r.session_id for r in trace[:3]] != [0, 0, 0]      # concurrent agents interleave


def test_the_reproduction_on_a_fresh_clone_says_which_data_each_trace_is(no_shared_data):
    profile, note = with_available_data(PROFILES["tiny"])
    factory = TraceFactory(profile.source)
    sharegpt, swe, mooncake = (Provenance.of(factory.base(w)) for w in ("sharegpt", "swe", "mooncake"))
    assert sharegpt.data.startswith("a synthetic chat trace") and "synthetic chat trace" in note
    assert swe.data.startswith("the vendored 10-trajectory sample") and "vendored mini-swe-agent" in note
    assert mooncake.data.startswith("the vendored first 2,000 Mooncake") and "vendored first 2,000" in note
    assert {sharegpt.fallback, swe.fallback, mooncake.fallback} == {None}   # the profile asked for these


def test_the_sparse_study_skips_sharegpt_and_says_quality_is_a_stand_in(no_shared_data):
    assert study_workload("sharegpt", "tiny") is None
    quality = study_workload("quality", "tiny")
    assert quality.source == ("FALLBACK: ../shared/data/quality is absent; synthetic doc-qa "
                              "(4 documents x 12 questions, 7500 tokens each)")


def test_cli_lists_the_catalog_and_says_a_fallback(no_shared_data, capsys, tmp_path):
    assert main(["trace", "list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in workload_names()) and "licence: CC BY 4.0" in out
    assert main(["simulate", "--trace", "swe-smaple", "--quiet"]) == 2
    assert "neither a file nor a catalog workload (swe, swe-keepall, swe-sample" in capsys.readouterr().err
    assert main(["simulate", "--trace", "sharegpt:sessions=3", "--systems", "sglang+", "--capacity", "1TB",
                 "--workers", "1", "--quiet"]) == 0
    assert "trace sharegpt:sessions=3: FALLBACK: ../shared/data/sharegpt is absent" in capsys.readouterr().err


@pytest.mark.parametrize("spec, named", [
    ("swe-sample:max_input_len=1", "max_input_len=1"),
    ("agent-synthetic:sessions=2,max_input_len=1", "max_input_len=1"),
])
def test_a_filter_that_leaves_no_requests_is_a_config_error_naming_it(spec, named, capsys, tmp_path):
    """Issue 21: ``max_input_len=1`` left a 0-request trace, and the commands exited 0 on it."""
    with pytest.raises(ConfigError) as info:
        build_workload(spec)
    message = str(info.value)
    assert spec.split(":")[0] in message and "no requests" in message and named in message
    assert "raise max_input_len" in message
    out = tmp_path / "empty.jsonl"
    assert main(["trace", "build", "bundled", spec, "--out", str(out)]) == 2
    assert "no requests" in capsys.readouterr().err and not out.exists()


def test_the_chat_recipes_message_filter_is_a_parameter_and_named_when_it_leaves_none(tmp_path):
    """Held-out ShareGPT files of short conversations: the paper's >= 20-message filter left none, and
    the error said "loosen the parameters", though no parameter of the name could loosen it."""
    path = tmp_path / "short.json"
    path.write_text(json.dumps([{"id": f"c{k}", "conversations": [
        {"from": "human", "value": f"question {k} {i}"} if i % 2 == 0 else {"from": "gpt", "value": f"answer {i}"}
        for i in range(6)]} for k in range(4)]))
    with pytest.raises(ConfigError, match=r"min_rounds=10 keeps only conversations of at least 20 messages .*lower "
                                          r"min_rounds \(e\.g\. sharegpt:files=PATH,min_rounds=1\)"):
        build_workload(f"sharegpt:files={path}")
    trace = build_workload(f"sharegpt:files={path},min_rounds=3")
    assert trace.meta["num_sessions"] == 4 and len(trace) == 12           # 3 rounds each
    assert len(build_workload(f"sharegpt:files={path},min_rounds=2")) == 12   # 6 messages pass >= 4
    with pytest.raises(ConfigError, match="min_rounds must be >= 1, got 0"):
        build_workload(f"sharegpt:files={path},min_rounds=0")


def test_files_takes_a_path_with_a_colon_in_its_name_as_one_file(tmp_path):
    """Held-out files named by time (``mooncake_2025-01-01T10:00.jsonl``): files= split the name at its
    colon ("files= takes one trace file, got 2"), though --trace with the same path read it."""
    rows = [{"timestamp": 1000 * i, "input_length": 1024, "output_length": 4, "hash_ids": [0, i + 1]}
            for i in range(3)]
    timed = tmp_path / "mooncake_2025-01-01T10:00.jsonl"
    timed.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert len(build_workload(f"mooncake:files={timed}")) == 3
    other = tmp_path / "other.jsonl"
    other.write_text(timed.read_text())
    with pytest.raises(ConfigError, match="mooncake: files= takes one trace file, got 2"):
        build_workload(f"mooncake:files={other}{os.pathsep}{other}")     # a list that names no one file: split
