"""``marconi vllm frontier``: the arms (intervals rounded up to the block, deduplicated), the Pareto
frontier and the verdicts from records alone, and the command end to end through vLLM's replay
(two arms on a few doc-QA requests), then ``--from-records`` re-rendering without a replay."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from marconi.core.registry import ConfigError
from marconi.lab.frontier import (RECORD_FIELDS, Arm, FrontierConfig, pareto, plan_arms, report_markdown,
                                                verdict_lines)
from vllm_env import VLLM_PYTHON, require_vllm

REPO = Path(__file__).resolve().parents[1]


def test_intervals_are_rounded_up_to_the_block_and_deduplicated() -> None:
    arms = plan_arms(1152, [0, 2], [0, 512, 1024, 2048])
    assert [a.label for a in arms] == ["dp-0", "dp-2", "interval-0", "interval-1152", "interval-2304", "marconi"]
    assert [a.intervals_asked for a in arms if a.family == "interval"] == [(0,), (512, 1024), (2048,)]
    assert arms[-1] == Arm("marconi", "marconi", "marconi", "0")          # Marconi's admission: retention 0
    assert [a.label for a in plan_arms(1152, [1], [1152], families=("interval",))] == ["interval-1152"]
    for bad in (lambda: plan_arms(1152, [1, 1], [0]), lambda: plan_arms(1152, [-1], [0]),
                lambda: plan_arms(1152, [1], [0], families=("oracle",)), lambda: plan_arms(1152, [], [], ("dp",))):
        with pytest.raises(ConfigError):
            bad()


def _rec(arm: str, family: str, states: float, recomputed: float, **extra: object) -> dict:
    return {"arm": arm, "family": family, "states_per_request": states, "recomputed_fraction": recomputed,
            "token_hit_rate": 1 - recomputed, **extra}


def test_a_step_budget_under_vllms_max_num_seqs_names_the_flag_the_frontier_has() -> None:
    """The frontier has --max-num-batched-tokens but no --max-num-seqs: the replay's own check named both."""
    with pytest.raises(ConfigError, match=r"^--max-num-batched-tokens 100 must be >= vLLM's max_num_seqs \(256, the "
                                          r"replay's\): raise it$"):
        FrontierConfig(vllm_python="python", workloads=("swe-sample",), max_num_batched_tokens=100)
    FrontierConfig(vllm_python="python", workloads=("swe-sample",), max_num_batched_tokens=256)


def test_the_frontier_and_the_verdicts_follow_from_the_points() -> None:
    pts = [_rec("dp-0", "dp", 0.2, 0.21), _rec("dp-2", "dp", 0.2, 0.19), _rec("interval-0", "interval", 0.2, 0.21),
           _rec("interval-1152", "interval", 0.4, 0.17), _rec("interval-2304", "interval", 0.3, 0.20)]
    assert [p["arm"] for p in pareto(pts)] == ["dp-2", "interval-1152"]
    lines = verdict_lines(pts)
    assert lines[0].startswith("interval-0: DP beyond it — dp-2")
    assert lines[1].startswith("interval-1152: no DP point matches it at no more states")
    assert "no DP budget run reaches its hit rate" in lines[1]
    assert lines[2].startswith("interval-2304: DP beyond it — dp-2")
    assert verdict_lines([_rec("interval-0", "interval", 0.2, 0.2)]) == ["no DP point was run"]


def test_the_report_states_the_rounding_and_the_admission_definition() -> None:
    common = {"kind": "vllm-retention-frontier", "workload": "w", "pool_label": "80GB GPU", "num_blocks": 10,
              "num_requests": 4, "prompt_tokens": 100, "block_size": 1152, "vllm_version": "0.32.0", "model": "m",
              "concurrency": 8, "max_num_batched_tokens": 8192, "limit": 4, "trace_params": {"max_input_len": 16384},
              "states_source": "emulation", "recomputed_prefill_tokens": 20, "num_preemptions": 0}
    recs = [_rec("dp-1", "dp", 0.2, 0.2, budget=1, retention_interval=0, intervals_asked=[], **common),
            _rec("interval-1152", "interval", 0.4, 0.2, budget=None, retention_interval=1152,
                 intervals_asked=[512, 1024], **common)]
    text = report_markdown(recs)
    assert "512, 1024 → 1152" in text and "Marconi's admission alone" in text
    assert "| dp-1 |  | 0.200 | emulation | 80.00% | 20.00% | 20 | 0 | yes |" in text


def test_the_command_end_to_end_and_from_records(tmp_path: Path) -> None:
    """Two arms through vLLM's replay (the interval one rounded to the block vLLM reports), the
    records' fields and the PNG; then ``--from-records`` redraws with no vLLM at hand."""
    require_vllm()
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MARCONI_VLLM_")}
    cmd = [sys.executable, "-m", "marconi.cli", "vllm", "frontier", "--out", str(out), "--vllm-python", VLLM_PYTHON,
           "--traces", "doc-qa-synthetic", "--arms", "dp,interval", "--budgets", "2", "--intervals", "1024",
           "--limit", "12", "--max-input-len", "8192", "--work-dir", str(tmp_path / "work")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert [r["arm"] for r in records] == ["dp-2", "interval-1152"]
    for rec in records:
        assert set(RECORD_FIELDS + ("sim_states_per_request", "command", "command_wall_s")) <= set(rec)
        for field in ("states_per_request", "token_hit_rate", "recomputed_fraction", "sim_states_per_request"):
            assert rec[field] is not None, field
        assert rec["num_requests"] == 12 and rec["block_size"] == 1152
        assert rec["recomputed_prefill_tokens"] == round(rec["recomputed_fraction"] * rec["prompt_tokens"])
        assert 0 <= rec["token_hit_rate"] <= 1 and rec["states_per_request"] > 0
    assert records[0]["states_source"] == "vllm-plugin" and records[0]["retention_budget"] == 2
    assert records[0]["states_per_request"] == pytest.approx(records[0]["sim_states_per_request"])
    assert records[1]["states_source"] == "emulation" and records[1]["intervals_asked"] == [1024]
    assert (out / "frontier.png").stat().st_size > 10_000 and "1024 → 1152" in (out / "report.md").read_text()

    again = tmp_path / "again"
    redraw = [sys.executable, "-m", "marconi.cli", "vllm", "frontier", "--out", str(again), "--vllm-python",
              str(tmp_path / "no-such-python"), "--from-records", str(out / "records.jsonl")]
    proc = subprocess.run(redraw, capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (again / "report.md").read_text() == (out / "report.md").read_text()
    assert (again / "frontier.png").is_file()
    assert (again / "records.jsonl").read_text() == (out / "records.jsonl").read_text()


def test_traces_are_split_as_names_and_all_checked_before_any_replay(tmp_path: Path, capsys) -> None:
    """``--traces swe-sample:sessions=1,seed=1`` was split at every comma (``seed=1`` then failed as a
    trace after the first points had run), and a missing trace was found only when its turn came, the
    finished points lost. Now one name with its parameters, and every trace checked first."""
    from marconi.cli import main

    code = main(["vllm", "frontier", "--out", str(tmp_path / "o"), "--vllm-python", str(tmp_path / "no-python"),
                 "--traces", "swe-sample:sessions=1,seed=1,nope"])
    err = capsys.readouterr().err
    assert code == 2 and "--traces: trace 'nope' is neither a file nor a catalog workload" in err, err
    assert "seed=1'" not in err and not (tmp_path / "o").exists()


def test_the_report_says_when_the_pool_was_raised_to_vllms_floor() -> None:
    """A pool below vLLM's least was replayed at the least (records: kv_floor_applied) while the
    report's heading named only the pool asked: a 114x larger pool read as the tiny one."""
    common = {"kind": "vllm-retention-frontier", "workload": "w", "pool_label": "0.01x", "num_blocks": 25,
              "num_requests": 4, "prompt_tokens": 100, "block_size": 1152, "vllm_version": "0.32.0", "model": "m",
              "concurrency": 8, "max_num_batched_tokens": 8192, "limit": 4, "trace_params": {"max_input_len": 16384},
              "states_source": "emulation", "recomputed_prefill_tokens": 20, "num_preemptions": 0,
              "kv_floor_applied": True, "pool_bytes": 471_859_200}
    recs = [_rec("dp-1", "dp", 0.2, 0.2, budget=1, retention_interval=0, intervals_asked=[], **common)]
    text = report_markdown(recs)
    assert "NOTE: 0.01x is below vLLM's least pool" in text and "25 blocks (0.472 GB" in text
    assert "NOTE" not in report_markdown([{**recs[0], "kv_floor_applied": False}])
    from marconi.lab.frontier import floor_notes       # what the command prints on stderr

    (line,) = floor_notes(recs)
    assert line.startswith("w: NOTE: 0.01x is below vLLM's least pool") and line[len("w: "):] in text
    assert floor_notes([{**recs[0], "kv_floor_applied": False}]) == []


def test_points_whose_names_collide_replay_their_own_traces(tmp_path: Path) -> None:
    """Each point's work folder was named from its trace with / turned into _, so ``x/one.jsonl`` and
    ``x_one.jsonl`` shared one, and with --workers 2 one trace was replayed with the other's requests
    (51.20% reported where the trace alone reads 61.44%). Each point has its own folder now."""
    require_vllm()
    rows = {"x/one.jsonl": [list(range(1, 1201)), list(range(1, 1201))],
            "x_one.jsonl": [list(range(5000, 5600)), list(range(7000, 9400))]}
    for name, prompts in rows.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"session_id": i, "turn_id": 0, "ts": float(i), "input_tokens": p,
                                            "output_tokens": [3, 4]}) + "\n" for i, p in enumerate(prompts)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MARCONI_VLLM_")}
    traces = [str(tmp_path / name) for name in rows]      # absolute: their safe names collide all the same
    cmd = [sys.executable, "-m", "marconi.cli", "vllm", "frontier", "--out", str(tmp_path / "out"), "--vllm-python",
           VLLM_PYTHON, "--traces", ",".join(traces), "--arms", "marconi", "--workers", "2",
           "--work-dir", str(tmp_path / "work")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "out" / "records.jsonl").read_text().splitlines()]
    tokens = {r["workload"]: r["prompt_tokens"] for r in records}
    assert tokens == {traces[0]: 2400, traces[1]: 3000}, tokens
