"""Issue 32: MARCONI_VLLM_RECORD recordings, their reader, and ``marconi vllm diagnose`` (no vLLM needed)."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import numpy as np
import pytest

from marconi.core.model import ModelSpec
from marconi.core.registry import ConfigError
from marconi.integrations.vllm.diagnose import (CAUSES, DiagnoseConfig, attribute, diagnose, run_emulated,
                                               next_steps, write_report)
from marconi.integrations.vllm.layout import layout_for_spec, prefix_hashes
from marconi.integrations.vllm.record import ENV_RECORD, Recorder, check_record_path
from marconi.integrations.vllm.replay.run import model_dir
from marconi.integrations.vllm.replay.steptime import StepTimeModel
from marconi.workloads import load_trace
from marconi.workloads.recording import RecordingError, build_recording_trace, read_recording
from marconi.workloads.trace import Request

MODEL = "nemotron-h-8b"


def _spec() -> ModelSpec:
    return ModelSpec.from_hf_config(model_dir(MODEL) / "config.json", name=MODEL)


def _sessions(seed: int = 0, sessions: int = 4, turns: int = 3, unit: int = 544) -> list[Request]:
    """Multi-turn sessions: each turn's prompt is the previous prompt + output + a new message,
    all sessions sharing a 2-block system prompt."""
    rng = np.random.default_rng(seed)
    system = rng.integers(10, 30000, 2 * unit, dtype=np.int32)
    out, ts = [], 0.0
    for s in range(sessions):
        history = system
        for t in range(turns):
            prompt = np.concatenate((history, rng.integers(10, 30000, int(rng.integers(300, 900)), dtype=np.int32)))
            output = rng.integers(10, 30000, int(rng.integers(20, 80)), dtype=np.int32)
            out.append(Request(s, t, ts, prompt, output))
            history = np.concatenate((prompt, output))
            ts += 1.0
    return out


class _FakeRequest(SimpleNamespace):
    pass


def _record(path: str, requests: list[Request], hits: list[int], unit: int, **meta) -> None:
    """Write a recording as the plugin would, from token sequences (hashes chained as vLLM's)."""
    settings = {"block_size": meta.pop("scheduler_block", unit), "num_blocks": meta.pop("num_blocks", 60), "max_num_batched_tokens": 8192,
                "retention_interval": 0}
    rec = Recorder.open(path, block_size=unit, model=MODEL, vllm_version=meta.pop("vllm_version", "0.32.0"),
                        policy="lru", settings=settings, max_num_seqs=meta.pop("max_num_seqs", 256), env={})
    for i, (r, h) in enumerate(zip(requests, hits)):
        seq = np.concatenate((r.input_tokens, r.output_tokens))
        fake = _FakeRequest(request_id=str(i), block_hashes=prefix_hashes(seq, unit), arrival_time=1000.0 + r.ts,
                            num_prompt_tokens=len(r.input_tokens), num_output_tokens=len(r.output_tokens),
                            num_preemptions=0)
        rec.admitted(fake, h)
        rec.finished(fake)
    rec.close()


# ------------------------------------------------------------------------------ recorder and reader
def test_recording_holds_no_tokens_and_keeps_the_chain_equalities(tmp_path):
    reqs = _sessions(sessions=2, turns=2)
    path = str(tmp_path / "rec.jsonl")
    _record(path, reqs, [0] * len(reqs), 544)
    text = open(path).read()
    meta = json.loads(open(path + ".meta.json").read())
    assert meta["salt"] not in text and len(bytes.fromhex(meta["salt"])) == 32
    for tok in reqs[0].input_tokens[:20]:
        assert f",{int(tok)}," not in text          # not a token list
    rec = read_recording(path)
    assert [r.prompt_len for r in rec.requests] == [len(r.input_tokens) for r in reqs]
    # the shared system prompt: the same first two ids in every request; turn 2 extends turn 1's sequence
    assert len({r.hash_ids[:2] for r in rec.requests}) == 1
    first, second = rec.requests[0], rec.requests[1]
    assert second.hash_ids[:len(first.hash_ids)] == first.hash_ids
    # a second recording of the same traffic cannot be joined to the first
    other = str(tmp_path / "rec2.jsonl")
    _record(other, reqs, [0] * len(reqs), 544)
    assert not set(read_recording(other).requests[0].hash_ids) & set(first.hash_ids)


def test_record_path_refused_at_start_naming_the_variable(tmp_path):
    existing = tmp_path / "r.jsonl"
    existing.write_text("x\n")
    with pytest.raises(ConfigError, match=ENV_RECORD + ".*already exists"):
        check_record_path(str(existing), {})
    with pytest.raises(ConfigError, match=ENV_RECORD + ".*does not exist"):
        check_record_path(str(tmp_path / "nope" / "r.jsonl"), {})
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        with pytest.raises(ConfigError, match=ENV_RECORD + ".*cannot create"):
            check_record_path(str(locked / "r.jsonl"), {})


def test_recorder_stops_at_its_size_cap_and_says_so(tmp_path):
    reqs = _sessions(sessions=1, turns=3)
    path = str(tmp_path / "r.jsonl")
    rec = Recorder.open(path, block_size=544, model=MODEL, vllm_version="0.32.0", policy="lru", settings={},
                        env={"MARCONI_VLLM_RECORD_MAX_BYTES": "400"})
    for i, r in enumerate(reqs):
        seq = np.concatenate((r.input_tokens, r.output_tokens))
        rec.finished(_FakeRequest(request_id=str(i), block_hashes=prefix_hashes(seq, 544), arrival_time=1.0 + i,
                                  num_prompt_tokens=len(r.input_tokens), num_output_tokens=len(r.output_tokens),
                                  num_preemptions=0))
    assert rec.truncated and 0 < rec.num_written < len(reqs)
    got = read_recording(path)
    assert any("truncated" in w for w in got.warnings)


def test_bad_recordings_name_line_and_field(tmp_path):
    reqs = _sessions(sessions=2, turns=2)
    path = str(tmp_path / "r.jsonl")
    _record(path, reqs, [0] * len(reqs), 544)
    lines = open(path).read().splitlines()

    def variant(name: str, body: list[str], meta: str | None = None) -> str:
        p = tmp_path / name
        p.write_text("\n".join(body) + ("\n" if body else ""))
        (tmp_path / (name + ".meta.json")).write_text(meta or open(path + ".meta.json").read())
        return str(p)

    # truncated: a last line cut short is a warning naming it, the rest reads
    cut = variant("cut.jsonl", lines[:-1] + [lines[-1][:40]])
    got = read_recording(cut)
    assert len(got.requests) == len(reqs) - 1 and f"cut.jsonl:{len(lines)}" in got.warnings[0]
    # salt mismatch: the header's fingerprint is not the sidecar's
    meta = json.loads(open(path + ".meta.json").read())
    meta["salt_id"] = "0" * 16
    with pytest.raises(RecordingError, match=r"mm\.jsonl:1: field 'recording': salt mismatch"):
        read_recording(variant("mm.jsonl", lines, json.dumps(meta)))
    # contradicting chains: request 2's second id follows another parent
    row = json.loads(lines[2])
    row["hash_ids"][1] = json.loads(lines[1])["hash_ids"][0]
    with pytest.raises(RecordingError, match=r"bad\.jsonl:3: field 'hash_ids': hash chains contradict"):
        read_recording(variant("bad.jsonl", lines[:2] + [json.dumps(row)]))
    # a block size that is not the recording's: the chain does not fit the lengths
    meta = json.loads(open(path + ".meta.json").read())
    meta["block_size"] = 16
    with pytest.raises(RecordingError, match=r"bs\.jsonl:2: field 'hash_ids'.*block_size"):
        read_recording(variant("bs.jsonl", lines, json.dumps(meta)))
    # empty, header only, a field of the wrong type
    with pytest.raises(RecordingError, match="empty"):
        read_recording(variant("empty.jsonl", []))
    with pytest.raises(RecordingError, match="no request"):
        read_recording(variant("header.jsonl", lines[:1]))
    row = json.loads(lines[1])
    row["num_cached_tokens"] = "12"
    with pytest.raises(RecordingError, match=r"type\.jsonl:2: field 'num_cached_tokens'"):
        read_recording(variant("type.jsonl", lines[:1] + [json.dumps(row)]))
    # no sidecar: known for a recording by its header line, and the missing sidecar named (not "no trace")
    lone = tmp_path / "lone.jsonl"
    lone.write_text(open(path).read())
    with pytest.raises(RecordingError, match=r"lone\.jsonl\.meta\.json: missing.*copy it along"):
        read_recording(lone)
    with pytest.raises(RecordingError, match=r"lone\.jsonl\.meta\.json: missing"):
        load_trace(str(lone))


def test_a_recording_as_an_operator_keeps_it_gzipped_or_joined_to_itself(tmp_path, capsys):
    """Gzipped (its sidecar left under the plain name, as gzip leaves it) it reads as the plain file;
    lines repeated exactly (a copy joined to the file) are named in a warning, which `trace validate`
    prints as `--trace` would."""
    import gzip

    from marconi.cli import main

    reqs = _sessions(seed=3, sessions=2, turns=2)
    path = str(tmp_path / "rec.jsonl")
    _record(path, reqs, [0] * len(reqs), 544)
    with open(path, "rb") as src, gzip.open(str(tmp_path / "rec.jsonl.gz"), "wb") as dst:
        dst.write(src.read())
    plain, packed = read_recording(path), read_recording(str(tmp_path / "rec.jsonl.gz"))
    assert [r.hash_ids for r in packed.requests] == [r.hash_ids for r in plain.requests] and not packed.warnings
    assert len(load_trace(str(tmp_path / "rec.jsonl.gz")).requests) == len(reqs)
    (tmp_path / "cut.jsonl.gz").write_bytes((tmp_path / "rec.jsonl.gz").read_bytes()[:-30])
    (tmp_path / "cut.jsonl.meta.json").write_text(open(path + ".meta.json").read())
    with pytest.raises(RecordingError, match=r"cut\.jsonl\.gz: not a whole gzip stream"):
        read_recording(str(tmp_path / "cut.jsonl.gz"))
    lines = open(path).read().splitlines()
    joined = tmp_path / "joined.jsonl"
    joined.write_text("\n".join(lines + lines[1:3]) + "\n")
    (tmp_path / "joined.jsonl.meta.json").write_text(open(path + ".meta.json").read())
    n = len(lines)
    got = read_recording(str(joined))
    assert len(got.requests) == len(reqs) + 2
    assert any(f"lines {n + 1} repeats 2, {n + 2} repeats 3" in w for w in got.warnings), got.warnings
    assert main(["trace", "validate", str(joined)]) == 0
    out = capsys.readouterr().out
    assert f"{n + 1} repeats 2" in out and "1 warning(s) above" in out


def test_a_request_the_pool_cannot_hold_is_named_by_its_line_and_this_commands_flags(tmp_path, capsys):
    from marconi.cli import main

    reqs = _sessions(seed=4, sessions=1, turns=3)
    path = str(tmp_path / "rec.jsonl")
    _record(path, reqs, [0] * len(reqs), 544, num_blocks=8)      # the server's pool, as recorded: 8 blocks
    out = tmp_path / "R"
    assert main(["vllm", "diagnose", "--trace", path, "--model", MODEL, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "does not fit the pool" in err and "--gpu-memory (or --blocks)" in err, err
    assert "raise the capacity" not in err and "rec.jsonl:2)" in err, err
    assert not out.exists()


# ------------------------------------------------------------------------------ cause accounting
def test_attribute_unit_cases_sum_exactly():
    u = 100
    # nothing shared: all lost in blocks is never_shared, the tail below one block
    assert attribute(450, 0, 0, u, 0, 0, 0, 0) == {**dict.fromkeys(CAUSES, 0), "never_shared": 400,
                                                   "below_one_block": 50}
    # seen to 400, KV resident to 300 with a state once at 200, computed to 400: evicted KV 300-400
    got = attribute(450, 100, 300, u, 400, 400, 200, 0)
    assert got["state_evicted_kv_stayed"] == 100 and got["no_state_at_usable_depth"] == 100
    assert got["kv_evicted"] == 100 and got["never_shared"] == 0 and got["below_one_block"] == 50
    # computed to 300 (the first 100 by a request since preempted), seen to 400: the rest in flight
    got = attribute(450, 0, 0, u, 400, 300, 0, 100)
    assert got["preempted"] == 100 and got["kv_evicted"] == 200 and got["in_flight"] == 100
    # a prompt of exactly one block: vLLM keeps its last token, so the whole block is below one block
    assert attribute(100, 0, 0, u, 100, 100, 0, 0)["below_one_block"] == 100
    rng = np.random.default_rng(1)
    for _ in range(2000):
        P = int(rng.integers(1, 3000))
        h = int(rng.integers(0, P)) // u * u
        args = [int(x) for x in rng.integers(0, 3500, 5)]
        got = attribute(P, h, args[0], u, *args[1:])
        assert sum(got.values()) == P - h and min(got.values()) >= 0


def test_causes_sum_to_the_lost_tokens_on_every_request_under_pressure():
    spec = _spec()
    reqs = _sessions(seed=3, sessions=6, turns=3)
    layout = layout_for_spec(spec, num_blocks=40)
    timing = StepTimeModel.named(spec, "h100", 16 * 10**9)
    run = run_emulated(reqs, spec, layout, timing, concurrency=4, attribute_causes=True)
    lost = run.prompt - run.hit
    assert (run.causes.sum(axis=1) == lost).all() and (run.causes >= 0).all()
    by = run.lost_by_cause()
    assert sum(by.values()) == int(lost.sum())
    # a small pool under 4 in flight loses shared tokens to more than "never shared"
    assert by["kv_evicted"] + by["in_flight"] + by["no_state_at_usable_depth"] + by["state_evicted_kv_stayed"] > 0
    assert by["never_shared"] > 0 and by["below_one_block"] > 0


# ------------------------------------------------------------------------------ diagnose end to end
def test_diagnose_reproduces_a_recording_made_by_the_same_engine(tmp_path):
    """Record what the emulation served at concurrency 1, rebuild tokens from the hash ids alone,
    and diagnose: every request's num_cached_tokens comes back."""
    spec = _spec()
    reqs = _sessions(seed=5, sessions=3, turns=3)
    layout = layout_for_spec(spec, num_blocks=60)
    timing = StepTimeModel.named(spec, "h100", 16 * 10**9)
    first = run_emulated(reqs, spec, layout, timing, concurrency=1)
    assert first.hit.sum() > 0
    path = str(tmp_path / "rec.jsonl")
    _record(path, reqs, first.hit.tolist(), layout.hash_block_size, num_blocks=60)
    result = diagnose(DiagnoseConfig(trace=path, model=MODEL, concurrency=1, capacity_points=(2.0,),
                                     levers=("marconi", "gpu-memory-2x")), show_bars=False)
    s = result["summary"]
    assert s["fidelity"]["agree"] == len(reqs) and s["fidelity"]["agree_share"] == 1.0
    assert s["warnings"] == []
    assert sum(s["lost_tokens_by_cause"].values()) == s["lost_tokens"] == s["prompt_tokens"] - s["hit_tokens"]
    assert set(s["lost_tokens_by_cause"]) == set(CAUSES)
    for key in ("token_hit_rate", "infinite_token_hit_rate", "oracle_token_hit_rate"):
        assert 0.0 <= s[key] <= 1.0
    assert s["infinite_token_hit_rate"] >= s["token_hit_rate"]
    levers = {r["lever"]: r for r in result["levers"]}
    assert {"stock", "marconi", "gpu-memory-2x"} <= set(levers)
    assert all(r["ttft_p95_s"] > 0 for r in levers.values())
    paths = write_report(result, tmp_path / "R")
    assert all(p.is_file() for p in paths)
    recs = [json.loads(x) for x in (tmp_path / "R" / "records.jsonl").read_text().splitlines()]
    assert recs[0]["record"] == "summary" and sum(recs[0]["lost_tokens_by_cause"].values()) == recs[0]["lost_tokens"]
    assert "waterfall.png" in (tmp_path / "R" / "report.md").read_text()
    assert write_report(result, tmp_path / "R") == paths       # its own earlier report: replaced
    report = (tmp_path / "R" / "report.md").read_text()
    steps = next_steps(result)
    assert "## What to do next" in report and all(line in report for line in steps)
    top = max(CAUSES, key=lambda c: s["lost_tokens_by_cause"][c])
    assert any(f"Most lost tokens: {top}" in line for line in steps)
    best = max((r["delta_token_hit_rate"], r["lever"]) for r in result["levers"] if r["lever"] != "stock")
    assert any(best[1] in line for line in steps) == (best[0] > 0.005)
    assert "does not reproduce" not in report           # every request reproduced: no list
    # a recording whose counts the run does not reproduce: the first that differ, by file and line
    wrong = str(tmp_path / "wrong.jsonl")
    _record(wrong, reqs, [h + 1 for h in first.hit.tolist()], layout.hash_block_size, num_blocks=60)
    other = diagnose(DiagnoseConfig(trace=wrong, model=MODEL, concurrency=1, capacity_points=(), levers=()),
                     show_bars=False)
    firsts = other["summary"]["fidelity"]["first_disagreements"]
    assert [d["where"] for d in firsts] == [f"{wrong}:{i + 2}" for i in range(len(firsts))] and firsts
    write_report(other, tmp_path / "W")
    assert f"| 0 | {wrong}:2 |" in (tmp_path / "W" / "report.md").read_text()
    (tmp_path / "R" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"files it did not write \(notes.txt\)"):
        write_report(result, tmp_path / "R")
    assert (tmp_path / "R" / "notes.txt").read_text() == "mine" and all(p.is_file() for p in paths)


def test_the_command_refuses_a_folder_of_someone_elses_files_before_the_run(tmp_path, capsys, monkeypatch):
    """``--out .`` deleted the working directory's files and folders (audit): the report replaces its
    folder whole, so a folder holding anything but an earlier report of this command is refused, before
    the replay; a folder of the report's own files (written before the manifest) is still replaced."""
    from marconi.cli import main
    from marconi.integrations.vllm import diagnose as module

    monkeypatch.setattr(module, "diagnose", lambda *a, **k: pytest.fail("ran before the check"))
    out = tmp_path / "work"
    (out / "sub").mkdir(parents=True)
    (out / "thesis.txt").write_text("mine")
    monkeypatch.chdir(out)
    for target in (".", str(out)):
        assert main(["vllm", "diagnose", "--trace", "mooncake-sample", "--out", target]) == 2
        err = capsys.readouterr().err
        assert "holds no report of `marconi vllm diagnose` (it holds sub, thesis.txt)" in err, err
    assert (out / "thesis.txt").read_text() == "mine" and (out / "sub").is_dir()
    old = tmp_path / "old"
    old.mkdir()
    for name in module.REPORT_FILES:
        (old / name).write_text("")
    monkeypatch.setattr(module, "diagnose", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    assert main(["vllm", "diagnose", "--trace", "mooncake-sample", "--out", str(old)]) == 130
    assert f"the report already in {old} is replaced" in capsys.readouterr().err


def test_diagnose_warns_naming_the_differing_field(tmp_path):
    spec = _spec()
    reqs = _sessions(seed=6, sessions=2, turns=2)
    layout = layout_for_spec(spec, num_blocks=60)
    path = str(tmp_path / "rec.jsonl")
    _record(path, reqs, [0] * len(reqs), layout.hash_block_size, num_blocks=60, vllm_version="0.40.1",
            max_num_seqs=8)
    notes: list[str] = []
    result = diagnose(DiagnoseConfig(trace=path, model=MODEL, concurrency=1, max_num_seqs=16, capacity_points=(),
                                     levers=()), notice=notes.append, show_bars=False)
    text = "\n".join(result["warnings"])
    assert "field 'vllm_version'" in text and "field 'max_num_seqs'" in text
    assert any("field 'vllm_version'" in n for n in notes)


def test_a_model_whose_unit_the_recording_does_not_divide_is_refused(tmp_path):
    reqs = _sessions(seed=7, sessions=1, turns=2, unit=500)
    path = str(tmp_path / "rec.jsonl")
    _record(path, reqs, [0] * len(reqs), 500, num_blocks=60, scheduler_block=544)   # the model's block: 544
    with pytest.raises(ConfigError, match=r"meta\.json: field 'block_size'"):
        diagnose(DiagnoseConfig(trace=path, model=MODEL, concurrency=1, capacity_points=(), levers=()),
                 show_bars=False)


def test_a_mooncake_file_given_by_path_is_read_as_mooncake(tmp_path):
    src = model_dir(MODEL).parent.parent / "mooncake" / "conversation_trace_first2000.jsonl"
    path = tmp_path / "mc.jsonl"
    path.write_text("".join(open(src).readlines()[:5]))
    trace = load_trace(str(path))
    assert trace.meta["source"] == "mooncake" and len(trace) == 5
    rec_trace = build_recording_trace  # the recording reader is separate (a sidecar names it)
    assert rec_trace is not None


def test_the_command_names_a_bad_recording_and_writes_nothing(tmp_path, capsys):
    from marconi.cli import main

    reqs = _sessions(seed=8, sessions=1, turns=2)
    path = str(tmp_path / "rec.jsonl")
    _record(path, reqs, [0] * len(reqs), 544)
    meta = json.loads(open(path + ".meta.json").read())
    meta["salt_id"] = "f" * 16
    open(path + ".meta.json", "w").write(json.dumps(meta))
    out = tmp_path / "R"
    rc = main(["vllm", "diagnose", "--trace", path, "--model", MODEL, "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "rec.jsonl:1: field 'recording': salt mismatch" in err
    assert not out.exists()


def test_plugin_registration_refuses_an_existing_record_path_naming_the_variable(tmp_path, monkeypatch):
    """Checked in every vLLM process before vLLM is imported, even with no policy set."""
    from marconi.integrations.vllm import plugin

    existing = tmp_path / "rec.jsonl"
    existing.write_text("{}\n")
    monkeypatch.delenv("MARCONI_VLLM_POLICY", raising=False)
    monkeypatch.setenv(ENV_RECORD, str(existing))
    plugin.reset_registration()
    try:
        with pytest.raises(ConfigError, match=ENV_RECORD + ".*already exists"):
            plugin.register()
    finally:
        plugin.reset_registration()
    assert existing.read_text() == "{}\n"


def test_a_bailian_trace_is_diagnosed_and_a_block_size_that_does_not_divide_is_named_by_its_layout(tmp_path):
    path = tmp_path / "qwen_traceA_blksz_16.jsonl"
    rows = [(1, -1, 0.0, 700, 20, list(range(44))), (2, 1, 5.0, 1216, 20, list(range(44)) + list(range(100, 132))),
            (3, -1, 6.0, 640, 20, list(range(40)))]
    keys = ("chat_id", "parent_chat_id", "timestamp", "input_length", "output_length", "hash_ids")
    path.write_text("".join(json.dumps(dict(zip(keys, r))) + "\n" for r in rows))
    result = diagnose(DiagnoseConfig(trace=str(path), model=MODEL, num_blocks=60, concurrency=1, capacity_points=(),
                                     levers=()), show_bars=False)
    assert not any("block_size" in w for w in result["warnings"])            # 16 divides every vLLM block
    unit = 100                                                                 # divides no vLLM block
    odd = tmp_path / "odd.jsonl"
    odd.write_text("".join(json.dumps(dict(zip(keys, (c, p, t, n, o, ids[: -(-n // unit)])))) + "\n"
                           for c, p, t, n, o, ids in rows))
    result = diagnose(DiagnoseConfig(trace=f"mooncake:files={odd},block_size={unit}", model=MODEL, num_blocks=60,
                                     concurrency=1, capacity_points=(), levers=()), show_bars=False)
    assert any("Qwen-Bailian's 100-token hash blocks do not divide" in w for w in result["warnings"]), result


def test_a_request_aborted_while_it_waited_is_left_out_of_the_replay(tmp_path):
    """Old: a request the client gave up on while it was queued was recorded like any other (prompt,
    no output, no hit) and replayed as served: the replay computed and cached a prompt the server
    never had, and the next request 'hit' it (recorded 23.8%, replayed 55.5% on an audit's
    recording)."""
    reqs = _sessions(sessions=1, turns=3)
    path = str(tmp_path / "rec.jsonl")
    rec = Recorder.open(path, block_size=544, model=MODEL, vllm_version="0.32.0", policy="lru",
                        settings={"block_size": 544, "num_blocks": 60, "max_num_batched_tokens": 8192}, env={})
    for i, r in enumerate(reqs):
        served = i != 1                     # the second is aborted while it waits: vLLM computed nothing
        seq = np.concatenate((r.input_tokens, r.output_tokens if served else r.output_tokens[:0]))
        fake = _FakeRequest(request_id=str(i), block_hashes=prefix_hashes(seq, 544), arrival_time=1000.0 + r.ts,
                            num_prompt_tokens=len(r.input_tokens),
                            num_output_tokens=len(r.output_tokens) if served else 0, num_preemptions=0,
                            num_computed_tokens=len(seq) - 1 if served else 0)
        if served:
            rec.admitted(fake, 0)
        rec.finished(fake)
    rec.close()
    lines = [json.loads(line) for line in open(path).read().splitlines()[1:]]
    assert [line["num_computed_tokens"] == 0 for line in lines] == [False, True, False]
    got = read_recording(path)
    assert [r.prompt_len for r in got.requests] == [len(reqs[0].input_tokens), len(reqs[2].input_tokens)]
    assert any("1 request(s) left out" in w and "num_computed_tokens" in w for w in got.warnings)
    # a recording made before the field: every line is kept
    old = tmp_path / "old.jsonl"
    text = open(path).read().splitlines()
    old.write_text("\n".join([text[0], *(json.dumps({k: v for k, v in json.loads(t).items()
                                                      if k != "num_computed_tokens"}) for t in text[1:])]) + "\n")
    (tmp_path / "old.jsonl.meta.json").write_text(open(path + ".meta.json").read())
    assert len(read_recording(str(old)).requests) == 3


def test_a_capacity_point_the_pool_cannot_serve_is_listed_as_not_run(tmp_path):
    """A capacity point (or lever) that cannot run is said, kept in the summary's ``skipped`` and in
    report.md's "Not run" section, and the points that ran are drawn without it."""
    path = tmp_path / "qwen_traceA_blksz_16.jsonl"
    rows = [(1, -1, 0.0, 700, 20, list(range(44))), (2, 1, 5.0, 1216, 20, list(range(44)) + list(range(100, 132)))]
    keys = ("chat_id", "parent_chat_id", "timestamp", "input_length", "output_length", "hash_ids")
    path.write_text("".join(json.dumps(dict(zip(keys, r))) + "\n" for r in rows))
    said: list[str] = []
    result = diagnose(DiagnoseConfig(trace=str(path), model=MODEL, num_blocks=60, concurrency=1,
                                     capacity_points=(0.01, 2.0), levers=()), notice=said.append, show_bars=False)
    skipped = result["summary"]["skipped"]
    assert len(skipped) == 1 and skipped[0].startswith("capacity x0.01: skipped ("), skipped
    assert skipped[0] in said
    assert [r["scale"] for r in result["capacity"]] == [1.0, 2.0]
    write_report(result, tmp_path / "R")
    report = (tmp_path / "R" / "report.md").read_text()
    assert "## Not run" in report and f"- {skipped[0]}" in report


def test_headroom_never_calls_an_oracle_above_the_infinite_pool_reachable_by_a_policy():
    """The oracle counts hits the simulator's way (whole prompts, tails under one block), so on repeated
    prompts it can pass the infinite vLLM pool (an audit: oracle 98.0% beside infinite 76.0%, read as
    '22 pp a better policy alone could reach'). Then the infinite pool is the ceiling named."""
    lost = dict.fromkeys(CAUSES, 0)
    lost["below_one_block"] = 10

    def result(oracle):
        return {"summary": {"token_hit_rate": 0.50, "infinite_token_hit_rate": 0.76, "oracle_token_hit_rate": oracle,
                            "lost_tokens": 10, "lost_tokens_by_cause": lost}, "levers": []}

    above = next_steps(result(0.98))[0]
    assert above.startswith("Headroom: 26.0 pp to the infinite pool's 76.0%, the most a better policy could reach")
    assert "98.0%" in above and "block grid cannot serve" in above and "48.0 pp" not in above
    below = next_steps(result(0.60))[0]
    assert "10.0 pp to the oracle at this pool (60.0%): what a better policy alone could reach" in below
    assert next_steps(result(None))[0] == "Headroom: 26.0 pp to the infinite pool's 76.0%."
