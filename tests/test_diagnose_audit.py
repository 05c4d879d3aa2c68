"""An audit of ``marconi vllm diagnose`` (five bugs), each pinned by a test that failed before its fix:

1. a closed loop's TTFT counted from the start of the run, not from when the request got a slot;
2. the pool of ``--gpu-memory`` was one block over the replay's (and Falcon-H1 had no vLLM block), and
   a memory that left under two blocks failed naming no flag;
3. ``--num-requests N`` on a recording kept the first N lines (first to finish), not the first N to arrive;
4. the recording's own model was ignored (no ``--model``: the default; a wrong one: no warning);
5. ``--cpu-tiers`` without ``--vllm-python`` was dropped without a word.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from marconi.core.model import ModelSpec
from marconi.core.registry import ConfigError
from marconi.integrations.vllm.diagnose import DiagnoseConfig, diagnose, run_emulated
from marconi.integrations.vllm.layout import layout_for_spec, prefix_hashes
from marconi.integrations.vllm.record import Recorder
from marconi.integrations.vllm.replay.configs import CONFIGS_DIR, VLLM_BLOCK_SIZES, model_dir
from marconi.integrations.vllm.replay.steptime import StepTimeModel
from marconi.workloads import load_trace
from marconi.workloads.recording import read_recording
from marconi.workloads.trace import Request, Trace

from cli_run import run_cli
from marks import slow
from vllm_env import VLLM_PYTHON, require_vllm

MODEL = "nemotron-h-8b"
NEMOTRON_KINDS = ["mamba"] * 6 + ["attention"]
UNIT = 544          # nemotron-h-8b's vllm-align block (16-token alignment), as a CPU server would have it


def _spec(model: str = MODEL) -> ModelSpec:
    return ModelSpec.from_hf_config(model_dir(model) / "config.json", name=model)


def _distinct(num: int, seed: int = 0) -> list[Request]:
    """``num`` requests that share no prefix, one second apart, each its own session."""
    rng = np.random.default_rng(seed)
    return [Request(i, 0, float(i), rng.integers(10, 30000, int(rng.integers(900, 3000)), dtype=np.int32),
                    rng.integers(10, 30000, 16, dtype=np.int32)) for i in range(num)]


def _record(path: Path, requests: list[Request], *, finish_order: list[int] | None = None, model: str = MODEL,
            policy: str = "lru", kinds: list[str] | None = None) -> str:
    """A recording as the plugin writes it (hashes chained as vLLM's, every hit 0), its lines in
    ``finish_order`` (default: arrival order), its sidecar naming ``model``, ``policy`` and ``kinds``."""
    settings = {"block_size": UNIT, "num_blocks": 200, "max_num_batched_tokens": 8192, "retention_interval": 0,
                "group_kinds": kinds or NEMOTRON_KINDS, "mamba_cache_mode": "align"}
    rec = Recorder.open(str(path), block_size=UNIT, model=model, vllm_version="0.32.0", policy=policy,
                        settings=settings, max_num_seqs=256, env={})
    for i in finish_order if finish_order is not None else range(len(requests)):
        r = requests[i]
        seq = np.concatenate((r.input_tokens, r.output_tokens))
        fake = SimpleNamespace(request_id=str(i), block_hashes=prefix_hashes(seq, UNIT), arrival_time=1000.0 + r.ts,
                               num_prompt_tokens=len(r.input_tokens), num_output_tokens=len(r.output_tokens),
                               num_preemptions=0)
        rec.admitted(fake, 0)
        rec.finished(fake)
    rec.close()
    return str(path)


def _diagnose_cli(argv: list[str], out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[dict, str]:
    code, err, _ = run_cli(["vllm", "diagnose", *argv, "--concurrency", "1", "--out", str(out)], capsys)
    assert code == 0, err
    return json.loads((out / "records.jsonl").read_text().splitlines()[0]), err


# ------------------------------------------------------------------------------------- 1. closed-loop TTFT
def test_closed_loop_ttft_counts_from_when_a_slot_let_the_request_in() -> None:
    """One request at a time and no shared prefix: a request's TTFT is its own prefill, the same as
    when it runs alone (the replay's closed loop: first token minus submission). It used to be the
    time since the run began, climbing with every request before it."""
    spec = _spec()
    layout = layout_for_spec(spec, num_blocks=400)
    timing = StepTimeModel.named(spec, "h100", 16 * 10**9)
    requests = _distinct(6)
    together = run_emulated(requests, spec, layout, timing, concurrency=1).ttft_s
    alone = [run_emulated([r], spec, layout, timing, concurrency=1).ttft_s[0] for r in requests]
    assert np.all(together > 0)
    np.testing.assert_allclose(together, alone, rtol=1e-9)


@slow       # two replays through vLLM's scheduler (~20 s)
def test_closed_loop_ttft_is_the_replays(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two in flight, no shared prefix: the emulated stock run's TTFTs are those `marconi vllm replay`
    measures through vLLM's own scheduler on the same virtual clock."""
    require_vllm()
    trace = tmp_path / "distinct.jsonl"
    trace.write_text("".join(json.dumps({"session_id": r.session_id, "turn_id": 0, "ts": r.ts,
                                         "input_tokens": r.input_tokens.tolist(),
                                         "output_tokens": r.output_tokens.tolist()}) + "\n" for r in _distinct(6)))
    code, err, _ = run_cli(["vllm", "diagnose", "--trace", str(trace), "--model", MODEL, "--blocks", "200",
                            "--concurrency", "2", "--vllm-python", VLLM_PYTHON, "--cpu-tiers", "",
                            "--out", str(tmp_path / "R")], capsys)
    assert code == 0, err
    records = list(map(json.loads, (tmp_path / "R" / "records.jsonl").read_text().splitlines()))
    levers = {r["lever"]: r for r in records if r["record"] == "lever"}
    for key in ("ttft_p50_s", "ttft_p95_s"):
        assert levers["stock"][key] == pytest.approx(levers["replay:lru"][key], rel=1e-9), key
    # the headline is the engine the lost tokens are of; the replay's rate and block stand beside it
    (summary,) = [r for r in records if r["record"] == "summary"]
    assert summary["token_hit_rate"] == levers["stock"]["token_hit_rate"]
    assert summary["token_hit_rate"] == pytest.approx(1 - summary["lost_tokens"] / summary["prompt_tokens"])
    assert summary["replay_token_hit_rate"] == levers["replay:lru"]["token_hit_rate"]
    assert summary["replay_block_size"] == summary["block_size"]
    assert not any("vllm-replay ran at" in w for w in summary["warnings"]), summary["warnings"]


# ------------------------------------------------------------------------------------- 2. the pool's blocks
#: vLLM 0.32's num_gpu_blocks for --gpu-memory, as `marconi vllm replay`'s engine core builds it
#: (build_engine_core(gpu_memory_bytes=..., tensor_parallel=...), vLLM's own parameter count):
#: (model, --gpu-memory, --tensor-parallel) -> blocks. test_pool_blocks_equal_the_replays_engine checks
#: them against vLLM.
VLLM_POOLS = {("nemotron-h-8b", "40GB", 1): 821, ("nemotron-h-8b", "80GB", 1): 2728,
              ("nemotron-h-8b", "80GB", 2): 6315, ("falcon-h1-7b", "40GB", 1): 114,
              ("falcon-h1-7b", "80GB", 1): 364, ("qwen3-next-80b-a3b", "141GB", 2): 3032,
              ("qwen3-next-80b-a3b", "192GB", 1): 323}

def _pools() -> list:
    return [pytest.param(*key, blocks) for key, blocks in VLLM_POOLS.items()]


def _diagnosed_pool(model: str, gpu_memory: str, tensor_parallel: int) -> tuple[int, int]:
    trace = Trace([Request(0, 0, 0.0, np.arange(1, 600, dtype=np.int32), np.arange(1, 5, dtype=np.int32))],
                  name="one", meta={})
    s = diagnose(DiagnoseConfig(trace="one", model=model, gpu_memory=gpu_memory, tensor_parallel=tensor_parallel,
                                levers=(), capacity_points=()), trace=trace, show_bars=False)["summary"]
    return s["num_blocks"], s["block_size"]


def test_every_bundled_model_has_a_pinned_pool() -> None:
    assert {model for model, _, _ in VLLM_POOLS} == set(VLLM_BLOCK_SIZES) == {
        p.parent.name for p in CONFIGS_DIR.glob("*/config.json")}


@pytest.mark.parametrize("model,gpu_memory,tensor_parallel,blocks", _pools())
def test_gpu_memory_gives_the_replays_pool(model: str, gpu_memory: str, tensor_parallel: int, blocks: int) -> None:
    """The pool of --gpu-memory is vLLM's num_gpu_blocks (null block included) at vLLM's block for the
    model, as `vllm replay --gpu-memory` builds it. It used to be one block more (the null block
    added again), and Falcon-H1's block was the emulation's 1,568 tokens instead of vLLM's 3,200."""
    assert _diagnosed_pool(model, gpu_memory, tensor_parallel) == (blocks, VLLM_BLOCK_SIZES[model])


def test_a_gpu_memory_that_leaves_no_pool_is_refused_naming_the_flag() -> None:
    """22.78 GB holds nemotron-h-8b's weights and reserve with 5 MB to spare, under one 18.9 MB block."""
    with pytest.raises(ConfigError, match=r"^--gpu-memory 22.78GB: leaves 5,327,232 bytes .* larger --gpu-memory"):
        _diagnosed_pool(MODEL, "22.78GB", 1)


_ENGINE_POOLS = """
import json, sys
from marconi.integrations.vllm.replay.configs import model_dir
from marconi.integrations.vllm.replay.engine import build_engine_core
from marconi.units import parse_bytes
out = []
for model, memory, tp in json.loads(sys.argv[1]):
    core = build_engine_core(str(model_dir(model)), gpu_memory_bytes=parse_bytes(memory), tensor_parallel=tp)
    out.append(int(core.scheduler.kv_cache_manager.block_pool.num_gpu_blocks))
    core.shutdown()
print("POOLS" + json.dumps(out))
"""


@slow       # one vLLM import and seven engine cores (~25 s)
def test_pool_blocks_equal_the_replays_engine() -> None:
    """VLLM_POOLS are what the replay's own engine core (vLLM 0.32) builds for each --gpu-memory."""
    require_vllm()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MARCONI_VLLM_")}
    proc = subprocess.run([VLLM_PYTHON, "-c", _ENGINE_POOLS, json.dumps([list(k) for k in VLLM_POOLS])],
                          capture_output=True, text=True, timeout=600, env={**env, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("POOLS"))
    assert json.loads(line[len("POOLS"):]) == list(VLLM_POOLS.values())


# ------------------------------------------------------------------------------------- 3. --num-requests
def test_num_requests_keeps_the_first_to_arrive_not_the_first_to_finish(tmp_path: Path) -> None:
    """Lines are written as requests finish: here the last to arrive finished first. The first N
    by arrival are kept (the replay's selection too), not the file's first N lines."""
    requests = _distinct(5)
    path = _record(tmp_path / "rec.jsonl", requests, finish_order=[4, 3, 2, 1, 0])
    kept = read_recording(path, limit=2)
    assert sorted(r.arrival for r in kept.requests) == [1000.0, 1001.0]
    trace = load_trace(path, 2)
    assert [len(r.input_tokens) for r in trace] == [len(r.input_tokens) for r in requests[:2]]
    # a cut last line is still skipped with a warning, whatever the limit
    with open(path, "a") as fh:
        fh.write('{"arrival": 999.0, "finish"')
    kept = read_recording(path, limit=2)
    assert sorted(r.arrival for r in kept.requests) == [1000.0, 1001.0]
    assert any("the last line is cut short" in w for w in kept.warnings)


# ------------------------------------------------------------------------------------- 4. the recorded model
@pytest.fixture
def model_copy(tmp_path: Path) -> str:
    """nemotron-h-8b's config in a directory of its own (absolute): what a server's sidecar names."""
    d = tmp_path / "served-model"
    d.mkdir()
    shutil.copy(model_dir(MODEL) / "config.json", d / "config.json")
    return str(d)


def test_without_model_the_recordings_own_model_is_used(tmp_path: Path, model_copy: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = _record(tmp_path / "rec.jsonl", _distinct(3), model=model_copy)
    summary, err = _diagnose_cli(["--trace", path], tmp_path / "R", capsys)
    assert summary["model"] == model_copy and summary["warnings"] == []
    assert f"note: --model not given: diagnosing on {model_copy}" in err


def test_a_model_other_than_the_recordings_is_warned_naming_the_flag(tmp_path: Path, model_copy: str,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """qwen3-next-80b-a3b has 3 Mamba groups to the recording's 6: the hits cannot be this model's."""
    path = _record(tmp_path / "rec.jsonl", _distinct(3), model=model_copy)
    summary, err = _diagnose_cli(["--trace", path, "--model", "qwen3-next-80b-a3b"], tmp_path / "R", capsys)
    text = "\n".join(summary["warnings"])
    assert "field 'settings.group_kinds'" in text and "field 'model'" in text
    assert f"give --model {model_copy}" in text
    assert "warning: " in err and "field 'settings.group_kinds'" in err
    assert "field 'settings.group_kinds'" in (tmp_path / "R" / "report.md").read_text()


def test_a_hub_id_in_the_sidecar_is_named_and_the_default_used(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = _record(tmp_path / "rec.jsonl", _distinct(3), model="nvidia/Nemotron-H-8B-Base-8K")
    summary, err = _diagnose_cli(["--trace", path], tmp_path / "R", capsys)
    assert summary["model"] == MODEL and summary["warnings"] == []       # same groups: nothing contradicts it
    assert "'nvidia/Nemotron-H-8B-Base-8K'" in err and "give --model" in err


def test_a_recording_made_under_the_marconi_policy_is_warned(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = _record(tmp_path / "rec.jsonl", _distinct(3), policy="marconi")
    summary, _ = _diagnose_cli(["--trace", path, "--model", MODEL], tmp_path / "R", capsys)
    assert any("field 'policy': recorded under MARCONI_VLLM_POLICY=marconi" in w for w in summary["warnings"])


# ------------------------------------------------------------------------------------- 5. --cpu-tiers
def test_cpu_tiers_without_vllm_python_is_noted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _record(tmp_path / "rec.jsonl", _distinct(3))
    _, err = _diagnose_cli(["--trace", path, "--cpu-tiers", "256GB"], tmp_path / "R", capsys)
    assert "note: --cpu-tiers 256GB: not run" in err and "--vllm-python" in err
    _, err = _diagnose_cli(["--trace", path], tmp_path / "R2", capsys)           # the default: nothing to say
    assert "--cpu-tiers" not in err


def test_a_state_the_request_computes_itself_is_not_counted_as_evicted() -> None:
    """Old: a request's lost tokens were attributed after its own step ran, so the state at a block
    boundary it computed itself in that step counted as 'ever cached', and the tokens between its
    hit and that state read as state_evicted_kv_stayed, though nothing was ever evicted (4,608
    tokens on the first 30 SWE requests at 80 GB, where stock equals the infinite pool)."""
    result = diagnose(DiagnoseConfig(trace="swe-sample", model=MODEL, gpu_memory="80GB", num_requests=30,
                                     levers=(), capacity_points=()), show_bars=False)
    lost = result["summary"]["lost_tokens_by_cause"]
    assert lost["state_evicted_kv_stayed"] == 0 and lost["kv_evicted"] == 0
    assert lost["no_state_at_usable_depth"] == 4_608
