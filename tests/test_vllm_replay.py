"""``marconi vllm replay``: the derived KV cache config is the engine's; the command runs end to end.

The vLLM tests need the vLLM environment (``make vllm-env``): under ``MARCONI_REQUIRE_VLLM=1`` a
missing environment fails them, under a plain ``pytest`` they skip, saying why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from marconi.core.model import PRESETS, ModelSpec
from marconi.core.registry import ConfigError
from marconi.integrations.vllm.replay.run import CONFIGS_DIR, ReplayConfig, model_dir
from marconi.integrations.vllm.replay.steptime import StepTimeModel
from vllm_env import VLLM_PYTHON, require_vllm, vllm_python

REPO = Path(__file__).resolve().parents[1]




def _vllm(code: str, env: dict[str, str] | None = None, timeout: int = 400) -> str:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MARCONI_VLLM_")}
    proc = subprocess.run([VLLM_PYTHON, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env={**base, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1", **(env or {})})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


# ====================================================================================== no vLLM needed
@pytest.mark.parametrize("name", ["nemotron-h-8b", "qwen3-next-80b-a3b", "falcon-h1-7b"])
def test_bundled_configs_carry_the_presets_cache_fields(name: str) -> None:
    spec = ModelSpec.from_hf_config(model_dir(name) / "config.json", name=name)
    preset = PRESETS[name]
    for field in ("num_attn_layers", "num_ssm_layers", "kv_bytes_per_token", "ssm_checkpoint_bytes"):
        assert getattr(spec, field) == getattr(preset, field), field


def test_step_time_grows_with_work_and_batches_decodes() -> None:
    spec = PRESETS["nemotron-h-8b"]
    model = StepTimeModel.named(spec, "h100", 16 * 10**9)
    one_decode = model.step_s([(1000, 1001)])
    assert model.step_s([]) == 0.0
    assert model.step_s([(0, 4096)]) > model.step_s([(0, 512)]) > 0
    # decode is memory-bound: 16 decodes cost far less than 16 single steps
    assert model.step_s([(1000, 1001)] * 16) < 2 * one_decode
    assert StepTimeModel.named(spec, "h200", 16 * 10**9).step_s([(1000, 1001)]) < one_decode


def test_replay_config_refuses_what_it_cannot_run() -> None:
    with pytest.raises(ConfigError, match="one of --blocks"):
        ReplayConfig(vllm_python="x", concurrency=4)
    with pytest.raises(ConfigError, match="concurrency"):
        ReplayConfig(vllm_python="x", num_blocks=100)
    with pytest.raises(ConfigError, match="GPU"):
        ReplayConfig(vllm_python="x", num_blocks=100, concurrency=4, gpu="tpu")
    with pytest.raises(ConfigError, match="model"):
        ReplayConfig(vllm_python="x", num_blocks=100, concurrency=4, model="no-such-model")
    assert {p.name for p in CONFIGS_DIR.iterdir() if p.is_dir()} >= {"nemotron-h-8b", "qwen3-next-80b-a3b"}


# ====================================================================================== vLLM
_REAL = """
import json, sys
from marconi.integrations.vllm.models import build_checkpoint
from marconi.integrations.vllm.replay.engine import kv_config_summary
from vllm import LLM
d = build_checkpoint({preset!r}, {out!r})
llm = LLM(model=str(d), skip_tokenizer_init=True, enable_prefix_caching=True, max_model_len=8192, dtype="bfloat16",
          num_gpu_blocks_override=64, gpu_memory_utilization=0.1, max_num_batched_tokens=2048, max_num_seqs=256,
          enforce_eager=True)
s = llm.llm_engine.engine_core.engine_core.scheduler
print("SUMMARY" + json.dumps(kv_config_summary(s.kv_cache_config, s.block_size)))
"""

_REPLAY = """
import json
from marconi.integrations.vllm.replay.engine import build_engine_core, kv_config_summary
core = build_engine_core({out!r}, num_blocks=64, max_model_len=8192, max_num_batched_tokens=2048, max_num_seqs=256)
s = core.scheduler
print("SUMMARY" + json.dumps(kv_config_summary(s.kv_cache_config, s.block_size)))
"""


def _summary(stdout: str) -> dict:
    return json.loads(next(line for line in stdout.splitlines() if line.startswith("SUMMARY"))[len("SUMMARY"):])


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["qwen3_next-tiny", "nemotron_h-tiny"])
def test_derived_kv_cache_config_equals_the_engines(preset: str, tmp_path: Path) -> None:
    """vLLM's in-process engine with the real (random-weight) model builds exactly the KV cache
    config the replay derives from the config alone: groups, layers, specs, block and page sizes."""
    require_vllm()
    out = str(tmp_path / preset)
    env = {"MARCONI_VLLM_MAMBA2_CPU_FIX": "auto"}     # both load the plugin's CPU fix, as the engine must
    real = _summary(_vllm(_REAL.format(preset=preset, out=out), env))
    derived = _summary(_vllm(_REPLAY.format(out=out), env))
    assert derived == real
    assert real["num_blocks"] == 64 and real["groups"]


@pytest.mark.slow
@pytest.mark.parametrize("series", ["0.32", "0.33"])
def test_replay_command_end_to_end(series: str, tmp_path: Path) -> None:
    """A small version of the issue's done-when command: records with every field, a table, a plot;
    on vLLM 0.32 and on the 0.33 overlay (its scheduler and block pool; skipped without it)."""
    python = vllm_python(series)
    out = tmp_path / "replay.jsonl"
    cmd = [sys.executable, "-m", "marconi.cli", "vllm", "replay", "--vllm-python", python, "--trace",
           "swe-sample", "--model", "nemotron-h-8b", "--capacity", "0.05x", "--concurrency", "4", "--num-requests",
           "8", "--max-output-len", "8", "--policies", "lru,marconi", "--out", str(out), "--plot",
           str(tmp_path / "ttft.png"), "--work-dir", str(tmp_path / "work")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MARCONI_VLLM_")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["policy"] for r in records] == ["lru", "marconi"]
    for rec in records:
        for field in ("engine", "vllm_version", "model", "gpu", "num_blocks", "block_size", "concurrency", "policy",
                      "token_hit_rate", "sim_token_hit_rate", "ttft_p50_s", "ttft_p95_s", "ttft_p99_s",
                      "tpot_mean_s", "throughput_tok_s", "num_preemptions", "sched_s_per_step"):
            assert field in rec and rec[field] is not None, field
        assert rec["engine"] == "vllm-replay" and rec["num_requests"] == 8
        assert rec["vllm_version"].startswith(series)
        assert 0 <= rec["token_hit_rate"] <= 1 and rec["ttft_p50_s"] > 0
    assert records[1]["plugin_evictions"] is not None and records[0]["plugin_evictions"] is None
    assert "vLLM token hit" in proc.stdout and (tmp_path / "ttft.png").is_file()


@pytest.mark.slow
def test_session_ids_1_and_quoted_1_are_two_sessions(tmp_path: Path) -> None:
    """A trace keeps session ids as given (int or str), so 1 and "1" are two sessions: at two in flight
    their requests run side by side, in vLLM and in the emulation, as with ids 1 and 2. (Old: the
    replay keyed sessions on ``str(id)``, so the second request waited for the first.)"""
    require_vllm()
    prompt = list(range(100, 1400))

    def trace(name: str, second: object) -> Path:
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"session_id": sid, "turn_id": 0, "ts": 0.0, "input_tokens": prompt,
                                            "output_tokens": list(range(10, 26))}) + "\n" for sid in (1, second)))
        return path

    records = {}
    for name, second in (("same_text", "1"), ("distinct", 2)):
        out = tmp_path / f"{name}.out.jsonl"
        proc = subprocess.run([sys.executable, "-m", "marconi.cli", "vllm", "replay", "--vllm-python", VLLM_PYTHON,
                               "--trace", str(trace(name, second)), "--model", "nemotron-h-8b", "--blocks", "40",
                               "--concurrency", "2", "--policies", "lru", "--out", str(out), "--plot", ""],
                              capture_output=True, text=True, timeout=600, cwd=REPO,
                              env={k: v for k, v in os.environ.items() if not k.startswith("MARCONI_VLLM_")})
        assert proc.returncode == 0, proc.stderr[-3000:]
        records[name] = json.loads(out.read_text().splitlines()[0])
    for field in ("ttft_p50_s", "ttft_p95_s", "throughput_tok_s", "token_hit_rate", "sim_token_hit_rate"):
        assert records["same_text"][field] == records["distinct"][field], field


def test_requests_a_server_of_the_config_would_refuse_or_change_are_noted() -> None:
    """The replay serves prompts past the config's positions (VLLM_ALLOW_LONG_MAX_MODEL_LEN=1) and ids
    past its vocabulary, where a server refuses them: said before the run, with the flag that leaves
    them out (an audit's 40k-token prompt on an 8,192-position config ran without a word)."""
    from marconi.integrations.vllm.replay.run import check_pool
    from marconi.workloads.trace import Request

    config = ReplayConfig(vllm_python="x", num_blocks=2000, concurrency=1)          # nemotron-h-8b: 8,192 positions
    short = Request(0, 0, 0.0, np.arange(10, 3000, dtype=np.int32), np.arange(5, 21, dtype=np.int32))
    assert check_pool(config, [short], None) == []
    long = Request(1, 0, 0.0, np.arange(10, 8190, dtype=np.int32), np.arange(5, 21, dtype=np.int32))
    notes = check_pool(config, [short, long], None)
    assert len(notes) == 1 and notes[0].startswith("1 of the 2 requests replayed are longer than nemotron-h-8b's "
                                                   "8,192 positions") and "--max-input-len 8,192" in notes[0]
    mute = Request(3, 0, 0.0, np.arange(10, 3000, dtype=np.int32), np.zeros(0, dtype=np.int32))
    assert check_pool(config, [short, mute], None) == [
        "1 of the 2 requests replayed have no output tokens: vLLM generates at least one (max_tokens >= 1), so each "
        "is replayed with one, counted in the throughput"]
    vocab = json.loads((model_dir("nemotron-h-8b") / "config.json").read_text())["vocab_size"]
    odd = Request(2, 0, 0.0, np.array([10, vocab + 5] * 700, dtype=np.int32), np.arange(5, 9, dtype=np.int32))
    notes = check_pool(config, [short, odd], None)
    assert notes == [f"token ids up to {vocab + 5:,} are outside nemotron-h-8b's vocabulary of {vocab:,} (vocab_size): "
                     "a server refuses such prompts; the replay's hits do not read the ids"]


_TWO_CORES = """
from marconi.integrations.vllm.replay.configs import model_dir
from marconi.integrations.vllm.replay.engine import build_engine_core
for _ in range(2):
    build_engine_core(str(model_dir("nemotron-h-8b")), num_blocks=64, max_model_len=8192)
"""


@pytest.mark.slow
def test_engine_cores_leave_nothing_in_the_temp_folder(tmp_path: Path) -> None:
    """The replay's engine core (the bench and the tests build it in their own processes, outside the
    replay command's scratch folder) leaves no gloo store behind: one ``marconi-replay-dist-*`` file
    per process stayed in /tmp before."""
    require_vllm()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    _vllm(_TWO_CORES, {"TMPDIR": str(tmp), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})
    assert sorted(p.name for p in tmp.iterdir()) == []
