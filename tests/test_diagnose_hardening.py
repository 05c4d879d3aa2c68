"""Audit W of ``marconi vllm diagnose``, its recording reader and recorder, and the output guard; each
test failed before its fix:

1. ``--out`` replaced a folder of someone else's files when their names were a report's (another
   command's ``records.jsonl``, a user's ``report.md``), or when its manifest was another writer's;
2. sidecar fields the diagnosis reads were not checked (tracebacks, errors naming no file or field);
3. an ``output_len`` or a pool too large to emulate ran the machine out of memory;
4. ``--out ''`` replaced the working directory and ``--out -`` made a folder named ``-``;
5. the headroom line called the infinite pool the ceiling while a lever passed it;
6. report.md's header said "GPU memory as recorded" for ``--blocks`` and left out the load, the
   subset kept and the step-time model;
7. a "Not run" line advised "raise the capacity", no flag of this command;
8. a line with ``finish`` before ``arrival`` was read, a gzip file without ``.gz`` was called "not
   JSON", and a recorder whose write failed left the sidecar saying ``truncated: false``.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from marconi.core.registry import ConfigError
from marconi.integrations.vllm.diagnose import DiagnoseConfig, diagnose, next_steps
from marconi.integrations.vllm.layout import prefix_hashes
from marconi.integrations.vllm.record import Recorder
from marconi.io import FOLDER_MANIFEST, check_replaceable
from marconi.workloads.recording import RecordingError, read_recording

from cli_run import run_cli

MODEL = "nemotron-h-8b"
UNIT = 544          # nemotron-h-8b's vllm-align block, as a CPU server has it
SETTINGS = {"block_size": UNIT, "num_blocks": 60, "max_num_batched_tokens": 8192, "retention_interval": 0}


def _record(path: Path, *, sessions: int = 3, settings: dict | None = None) -> str:
    """A recording as the plugin writes it: ``sessions`` sessions of three turns sharing a system prompt
    (hashes chained as vLLM's), one second apart; every recorded hit 0."""
    rng = np.random.default_rng(5)
    system = rng.integers(10, 30000, 2 * UNIT, dtype=np.int32)
    rec = Recorder.open(str(path), block_size=UNIT, model=MODEL, vllm_version="0.32.0", policy="lru",
                        settings=SETTINGS if settings is None else settings, max_num_seqs=256, env={})
    i = 0
    for _ in range(sessions):
        history = system
        for _ in range(3):
            prompt = np.concatenate((history, rng.integers(10, 30000, int(rng.integers(300, 900)), dtype=np.int32)))
            output = rng.integers(10, 30000, int(rng.integers(20, 80)), dtype=np.int32)
            seq = np.concatenate((prompt, output))
            fake = SimpleNamespace(request_id=str(i), block_hashes=prefix_hashes(seq, UNIT), arrival_time=1000.0 + i,
                                   num_prompt_tokens=len(prompt), num_output_tokens=len(output), num_preemptions=0,
                                   num_computed_tokens=len(seq))
            rec.admitted(fake, 0)
            rec.finished(fake)
            history = seq
            i += 1
    rec.close()
    return str(path)


def _edit_sidecar(path: str, **changes) -> Path:
    side = Path(path + ".meta.json")
    meta = json.loads(side.read_text())
    for key, value in changes.items():
        if key.startswith("settings_"):
            meta["settings"][key[len("settings_"):]] = value
        else:
            meta[key] = value
    side.write_text(json.dumps(meta))
    return side


def _edit_line(path: str, line: int, **changes) -> None:
    lines = Path(path).read_text().splitlines()
    row = json.loads(lines[line - 1])
    row.update(changes)
    lines[line - 1] = json.dumps(row)
    Path(path).write_text("\n".join(lines) + "\n")


# ----------------------------------------------------------------------------------- 1. the folder
def test_out_keeps_another_commands_records_and_a_users_report_md(tmp_path, capsys):
    """Finding 1: a folder with no manifest whose files merely have a report's names was replaced."""
    trace = _record(tmp_path / "rec.jsonl")
    sim = tmp_path / "results"
    sim.mkdir()
    sim_records = '{"trace": "t.jsonl", "capacity": "10GB", "system": "vllm+"}\n'
    (sim / "records.jsonl").write_text(sim_records)
    run = run_cli(["vllm", "diagnose", "--trace", trace, "--out", str(sim)], capsys)
    assert run.code == 2 and "holds no report of `marconi vllm diagnose`" in run.err, run.err
    assert (sim / "records.jsonl").read_text() == sim_records
    notes = tmp_path / "onlymd"
    notes.mkdir()
    (notes / "report.md").write_text("# my notes\n")
    run = run_cli(["vllm", "diagnose", "--trace", trace, "--out", str(notes)], capsys)
    assert run.code == 2 and "--out" in run.err and "report.md" in run.err, run.err
    assert (notes / "report.md").read_text() == "# my notes\n"


def test_a_folder_of_another_writers_manifest_is_never_an_earlier_report(tmp_path):
    """Finding 1: a manifest naming another writer was read as no manifest, so known names passed."""
    folder = tmp_path / "R"
    folder.mkdir()
    (folder / "records.jsonl").write_text('{"record": "summary"}\n')
    (folder / FOLDER_MANIFEST).write_text(json.dumps({"writer": "marconi experiment headroom",
                                                      "files": ["records.jsonl"]}))
    with pytest.raises(ConfigError, match="marconi experiment headroom"):
        check_replaceable(folder, "marconi vllm diagnose", known=("records.jsonl", "report.md"))
    # its own manifest: an earlier report, replaced
    (folder / FOLDER_MANIFEST).write_text(json.dumps({"writer": "marconi vllm diagnose",
                                                      "files": ["records.jsonl"]}))
    assert "replaced" in check_replaceable(folder, "marconi vllm diagnose", known=("records.jsonl",))


# ----------------------------------------------------------------------------------- 2. the sidecar
@pytest.mark.parametrize("changes,field", [
    ({"settings_num_blocks": "sixty"}, "settings.num_blocks"),
    ({"settings": "none"}, "settings"),
    ({"settings_retention_interval": "x"}, "settings.retention_interval"),
    ({"max_num_seqs": "many"}, "max_num_seqs"),
    ({"settings_max_num_batched_tokens": "x"}, "settings.max_num_batched_tokens"),
    ({"settings_long_prefill_token_threshold": "x"}, "settings.long_prefill_token_threshold"),
    ({"settings_num_blocks": -60}, "settings.num_blocks"),
    ({"settings_block_size": 0}, "settings.block_size"),
    ({"max_num_seqs": -3}, "max_num_seqs"),
    ({"settings_retention_interval": 100}, "settings.retention_interval"),
], ids=lambda v: str(v))
def test_a_sidecar_field_the_diagnosis_reads_is_checked_naming_file_and_field(tmp_path, changes, field):
    """Finding 2: tracebacks, or errors naming neither the sidecar nor the field."""
    trace = _record(tmp_path / "rec.jsonl")
    side = _edit_sidecar(trace, **changes)
    with pytest.raises(RecordingError) as info:
        read_recording(trace)
    assert f"{side}: field '{field}'" in str(info.value), str(info.value)


def test_the_command_names_the_sidecar_field_and_exits_2(tmp_path, capsys):
    trace = _record(tmp_path / "rec.jsonl")
    side = _edit_sidecar(trace, settings_num_blocks="sixty")
    run = run_cli(["vllm", "diagnose", "--trace", trace, "--concurrency", "1", "--out", str(tmp_path / "R")], capsys)
    assert run.code == 2 and f"{side}: field 'settings.num_blocks'" in run.err, run.err
    assert not (tmp_path / "R").exists()


def test_a_recording_without_a_pool_is_named_as_one(tmp_path, capsys):
    """Finding 2: "only a recording names its own pool", said of a recording."""
    trace = _record(tmp_path / "rec.jsonl", settings={"block_size": UNIT})
    run = run_cli(["vllm", "diagnose", "--trace", trace, "--concurrency", "1", "--out", str(tmp_path / "R")], capsys)
    assert run.code == 2 and "field 'settings.num_blocks'" in run.err and "--blocks" in run.err, run.err


# ----------------------------------------------------------------------------------- 3. memory
def test_an_output_len_beyond_any_context_is_refused_naming_the_line(tmp_path):
    trace = _record(tmp_path / "rec.jsonl")
    _edit_line(trace, 3, output_len=10**9)
    with pytest.raises(RecordingError, match=r"rec.jsonl:3: field 'output_len'"):
        read_recording(trace)


def test_a_pool_larger_than_the_machine_is_refused_before_any_run(tmp_path, monkeypatch):
    """Finding 3: ``--gpu-memory 1PB`` was killed by the OOM killer with no message. The machine's
    memory is made small here rather than the pool huge, so that the check is cheap to see."""
    trace = _record(tmp_path / "rec.jsonl")
    real = os.sysconf

    def small(name):
        return 4096 if name == "SC_PHYS_PAGES" else real(name)     # 16 MiB of 4 KiB pages

    monkeypatch.setattr(os, "sysconf", small)
    with pytest.raises(ConfigError, match=r"--blocks 100000.*give a smaller --blocks"):
        diagnose(DiagnoseConfig(trace=trace, model=MODEL, num_blocks=100_000, concurrency=1, capacity_points=(4.0,),
                                levers=()), show_bars=False)


# ----------------------------------------------------------------------------------- 4. the guard
def test_an_empty_or_dash_out_is_refused_naming_the_flag(tmp_path, capsys, monkeypatch):
    """Finding 4: ``--out ''`` was the working directory, ``--out -`` a folder named ``-``."""
    trace = _record(tmp_path / "rec.jsonl")
    work = tmp_path / "work"
    work.mkdir()
    (work / "keep.txt").write_text("mine")
    monkeypatch.chdir(work)
    run = run_cli(["vllm", "diagnose", "--trace", trace, "--concurrency", "1", "--out", ""], capsys)
    assert run.code == 2 and "--out: empty: give a folder" in run.err, run.err
    run = run_cli(["vllm", "diagnose", "--trace", trace, "--concurrency", "1", "--out", "-"], capsys)
    assert run.code == 2 and "--out -" in run.err and "not a stream" in run.err, run.err
    assert sorted(os.listdir(work)) == ["keep.txt"]


# ----------------------------------------------------------------------------------- 5. headroom
def test_the_headroom_line_names_a_lever_that_passes_the_infinite_pool():
    """Finding 5: 'Headroom: 0.0 pp to the infinite pool's 52.2%, the most a better policy could reach
    here' above a retention-interval lever at 53.0%."""
    lost = {"never_shared": 10, "kv_evicted": 0, "no_state_at_usable_depth": 0, "state_evicted_kv_stayed": 0,
            "in_flight": 0, "preempted": 0, "below_one_block": 0}
    result = {"summary": {"token_hit_rate": 0.522, "infinite_token_hit_rate": 0.522, "oracle_token_hit_rate": 0.646,
                          "lost_tokens": 10, "lost_tokens_by_cause": lost},
              "levers": [{"lever": "stock", "engine": "vllm-align", "token_hit_rate": 0.522,
                          "delta_token_hit_rate": 0.0},
                         {"lever": "retention-interval", "engine": "vllm-align", "token_hit_rate": 0.531,
                          "delta_token_hit_rate": 0.009}]}
    head = next_steps(result)[0]
    assert "the most a better policy could reach" not in head, head
    assert head.startswith("Headroom: 0.9 pp to the retention-interval lever's 53.1%, above the infinite pool's "
                           "52.2% (stock's ceiling"), head


# ----------------------------------------------------------------------------------- 6, 7. report.md
def test_report_header_says_how_it_was_replayed_and_not_run_names_real_flags(tmp_path, capsys):
    """Finding 6: the header said 'GPU memory as recorded' under --blocks, and nothing of the load,
    the subset or the step-time model. Finding 7: 'raise the capacity' in "Not run"."""
    trace = _record(tmp_path / "rec.jsonl")
    out = tmp_path / "R"
    run = run_cli(["vllm", "diagnose", "--trace", trace, "--blocks", "60", "--concurrency", "2",
                   "--num-requests", "6", "--out", str(out)], capsys)
    assert run.code == 0, run.err
    report = (out / "report.md").read_text()
    header = report.splitlines()[2]
    assert "GPU memory as recorded" not in header, header
    for part in ("6 requests", "first 6 to arrive of the 9 recorded", "--blocks 60",
                 "closed loop of 2 requests in flight (--concurrency 2)", "max_num_seqs 256 (as recorded)",
                 "h100 step-time model"):
        assert part in header, (part, header)
    assert "## Not run" in report and "raise the capacity" not in report, report
    assert "--gpu-memory (or --blocks)" in report.split("## Not run")[1]


# ----------------------------------------------------------------------------------- 8. the reader
def test_a_finish_before_its_arrival_is_refused(tmp_path):
    trace = _record(tmp_path / "rec.jsonl")
    _edit_line(trace, 2, finish=10.0)
    with pytest.raises(RecordingError, match=r"rec.jsonl:2: field 'finish'"):
        read_recording(trace)


def test_a_gzip_file_without_gz_is_said_to_be_gzip(tmp_path):
    trace = _record(tmp_path / "rec.jsonl")
    Path(trace).write_bytes(gzip.compress(Path(trace).read_bytes()))
    with pytest.raises(RecordingError) as info:
        read_recording(trace)
    said = str(info.value).replace(trace, "FILE")       # the test's folder is named after gzip too
    assert said.startswith("FILE: ") and "gzip" in said and ".gz" in said, said


def test_a_recorder_whose_write_fails_marks_the_sidecar_truncated(tmp_path):
    """Finding 8: a failing write stopped recording, but the sidecar still said truncated: false."""
    path = str(tmp_path / "rec.jsonl")
    rec = Recorder.open(path, block_size=UNIT, model=MODEL, vllm_version="0.32.0", policy="lru", settings=SETTINGS,
                        max_num_seqs=256, env={})
    seq = np.arange(10, 10 + 3 * UNIT, dtype=np.int32)
    good = SimpleNamespace(request_id="0", block_hashes=prefix_hashes(seq, UNIT), arrival_time=1.0,
                           num_prompt_tokens=len(seq) - 8, num_output_tokens=8, num_preemptions=0,
                           num_computed_tokens=len(seq))
    rec.finished(good)

    class FullDisk:
        request_id = "1"

        @property
        def block_hashes(self):
            raise OSError(28, "No space left on device")

    rec.finished(FullDisk())
    meta = json.loads(Path(path + ".meta.json").read_text())
    assert meta["truncated"] is True and "No space left" in meta.get("truncated_reason", ""), meta
    got = read_recording(path)
    assert len(got.requests) == 1 and any("truncated" in w and "No space left" in w for w in got.warnings)


def test_the_replay_block_warning_advises_model_only_where_the_recording_names_another():
    """With ``--vllm-python``, a replay at vLLM's own block size other than the recording's said
    "diagnose with the recording's own --model" even when --model already was the recording's."""
    from marconi.integrations.vllm.diagnose import replay_block_warning

    same = replay_block_warning(1152, 528, "nemotron-h-8b", {"model": "nemotron-h-8b"})
    assert "--model" not in same and "the recording is of this model" in same and "528 tokens (the recording's)" in same
    other = replay_block_warning(1152, 528, "nemotron-h-8b", {"model": "falcon-h1-7b"})
    assert other.endswith("diagnose with the recording's own --model for a like-for-like replay")
    hub = replay_block_warning(1152, 528, "nemotron-h-8b", {"model": "nvidia/Nemotron-H-8B-Base-8K"})
    assert "if nemotron-h-8b is the recorded nvidia/Nemotron-H-8B-Base-8K, its server set another" in hub
    assert hub.endswith("if not, diagnose with the recorded model's config as --model")   # a hub id: both cases
    assert replay_block_warning(1152, 528, "nemotron-h-8b", None).endswith("of another pool")
