"""The CPU tier's GPU check (scripts/gpu_check.sh --tier, scripts/gpu_tier_check.py) as far as a CPU
allows: its steps, its verdict's logic, the connector config it hands vLLM, and its replay step
(T3) run for real against the verdict's reader. The generating steps need CUDA (the connector's
worker side) and run only where a GPU is lent."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_env import VLLM_PYTHON, require_vllm, vllm_python

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.sh"
CONFIG = REPO / "src" / "marconi" / "data" / "configs" / "nemotron-h-8b" / "config.json"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_tier_check", REPO / "scripts" / "gpu_tier_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(mode: str, outputs: list[list[int]], tier_hits: float = 0.0, logprob: float = -1.0,
         cached: list[int] | None = None, control: list[int] | None = None) -> dict:
    cached = cached if cached is not None else [0] + [64] * (len(outputs) - 1)
    rec = {"mode": mode, "gpu_hit_tokens": 100.0, "tier_hit_tokens": tier_hits,
           "outputs": [{"token_ids": o, "num_cached_tokens": c, "logprobs": [{str(t): logprob} for t in o]}
                       for o, c in zip(outputs, cached)]}
    if mode == "recompute":
        rec["control"] = {"token_ids": control or [9, 9], "num_cached_tokens": 0,
                          "logprobs": [{str(t): -2.0} for t in control or [9, 9]]}
    return rec


def test_dry_run_lists_the_tier_steps_only_with_tier():
    tier = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--tier"], capture_output=True, text=True, check=True).stdout
    for step in ("T1/recompute", "T1/gpu", "T1/tier", "T2 ", "T3 ", "T4 "):
        assert step in tier
    assert "P1 serve stock vs plugin" not in tier
    assert "--tier-policies marconi" in tier and "gpu_tier_check.py compare" in tier
    assert "--reference-blocks 400" in tier
    lines = tier.splitlines()           # each step's command is the line under its title, whole
    for mode in ("recompute", "gpu", "tier"):
        at = next(i for i, line in enumerate(lines) if line.startswith(f"== T1/{mode} "))
        assert lines[at + 1].split()[1:4] == [str(REPO / "scripts" / "gpu_tier_check.py"), "generate", "--mode"]
    pool = subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True, check=True).stdout
    assert "P1 serve stock vs plugin" in pool and "T1/" not in pool
    assert "the script ($SERVE):" in pool and "replay_concurrent" in pool      # what P1 runs, printed
    for args in (["--all"], ["--all", "--tier"], ["--tier", "--all"]):         # the order does not matter
        both = subprocess.run(["bash", str(SCRIPT), "--dry-run", *args], capture_output=True, text=True,
                              check=True).stdout
        assert "P1 serve stock vs plugin" in both and "T4 " in both, args
    bad = subprocess.run(["bash", str(SCRIPT), "--tiers"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--tier" in bad.stderr
    helped = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True, check=True).stdout
    assert "GPU_CHECK_PYTHON" in helped and "set -euo" not in helped and "DRY_RUN" not in helped


def test_dry_run_with_a_prepared_environment_installs_no_vllm():
    env = {**os.environ, "GPU_CHECK_PYTHON": "/opt/vllm/bin/python"}
    out = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--all"], capture_output=True, text=True, check=True,
                         env=env).stdout
    assert "vllm==0.33.0" not in out and "-m venv" not in out
    assert "--no-build-isolation" in out and "/opt/vllm/bin/python -m marconi vllm replay" in out


def test_without_vllm_or_the_package_index_the_check_stops_at_once(tmp_path):
    """Offline, with no vLLM in reach, the check says so before any step (not after pip's retries)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3, 81559 MiB'\n")
    (fake / "nvidia-smi").chmod(0o755)
    python = fake / "python3"          # a python whose pip cannot reach the index and which has no vLLM
    python.write_text("#!/bin/sh\nexit 1\n")
    python.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "PYTHON": str(python),
           "GPU_CHECK_DIR": str(tmp_path / "work")}
    out = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "package index is out of reach" in out.stderr and "GPU_CHECK_PYTHON" in out.stderr
    assert "== setup" not in out.stdout and not (tmp_path / "work").exists()
    out = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60,
                         env={**env, "GPU_CHECK_PYTHON": str(python)})
    assert out.returncode == 1 and "GPU_CHECK_PYTHON=" in out.stderr and "has no vLLM 0.33" in out.stderr


def test_verdict_holds_the_tier_to_the_gpu_pool_request_by_request():
    mod = _module()
    base = [[1, 2], [3, 4], [5, 6]]
    ok, lines = mod.compare(_run("recompute", base), _run("gpu", base), _run("tier", base, tier_hits=512))
    assert ok and lines[-1].startswith("PASS"), lines
    assert any("2 requests resumed at the same depth in both (128 tokens), 2 of them bit-for-bit alike" in line
               for line in lines), lines
    # the tier served nothing: the check proved nothing
    ok, lines = mod.compare(_run("recompute", base), _run("gpu", base), _run("tier", base, tier_hits=0))
    assert not ok and any("served no token" in line for line in lines)
    # the tier differs where it resumed at the GPU pool's depth: caught, even if the pool differs elsewhere
    ok, lines = mod.compare(_run("recompute", base), _run("gpu", [[1, 2], [3, 4], [5, 7]]),
                            _run("tier", [[1, 2], [3, 9], [5, 7]], 512))
    assert not ok and any(line.startswith("FAIL: requests 1 resumed at the same depth") for line in lines), lines
    # the same tokens but another log-probability: a different state, caught
    ok, lines = mod.compare(_run("recompute", base), _run("gpu", base), _run("tier", base, 512, logprob=-1.001))
    assert not ok and any("log-probability gap up to 0.001" in line for line in lines), lines
    # resumed at another depth than the pool's: reported, not judged
    ok, lines = mod.compare(_run("recompute", base), _run("gpu", base),
                            _run("tier", [[1, 2], [3, 4], [5, 8]], 512, cached=[0, 64, 32]))
    assert ok and any("at other depths (not judged): 2 (64 vs 32)" in line for line in lines), lines
    # no request with a hit resumed at the same depth: nothing judged, no pass
    ok, lines = mod.compare(_run("recompute", base), _run("gpu", base, cached=[0, 0, 0]), _run("tier", base, 512))
    assert not ok and any("nothing to judge" in line for line in lines)
    # the control: a changed prefix that changes nothing means the weights cannot show a wrong state
    ok, lines = mod.compare(_run("recompute", base, control=[5, 6]), _run("gpu", base), _run("tier", base, 512))
    assert ok                                       # same tokens, other log-probabilities: seen
    blind = _run("recompute", base)
    blind["control"] = dict(blind["outputs"][-1])
    ok, lines = mod.compare(blind, _run("gpu", base), _run("tier", base, 512))
    assert not ok and any("inconclusive" in line for line in lines)
    with pytest.raises(ValueError, match="2 outputs"):
        mod.compare(_run("recompute", base), _run("gpu", base[:2]), _run("tier", base, 1))


def test_control_prompt_changes_one_token_inside_the_prefix():
    mod = _module()
    ids = [7, 0, 5, 9]
    got = mod.control_prompt(ids)
    assert len(got) == len(ids) and got[-1] == ids[-1] and sum(a != b for a, b in zip(got, ids)) == 1
    assert mod.control_prompt([3, 4, 0, 2])[2] == 1 and ids == [7, 0, 5, 9]


def test_missing_results_name_the_file(tmp_path):
    mod = _module()
    with pytest.raises(SystemExit, match="outputs-recompute.json missing"):
        mod.main(["compare", "--work", str(tmp_path)])


_ENGINE_CONFIGS = """
import importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location('g', sys.argv[1]); m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
m.engine_environment()
from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs
from marconi.integrations.vllm.server import ServerConfig
model = sys.argv[2]
for mode in m.MODES:
    kw = m.engine_kwargs(mode, model, 40, 1 << 33)
    c = EngineArgs(**kw).create_engine_config()
    x = c.kv_transfer_config
    print(json.dumps({"mode": mode, "max_model_len": c.model_config.max_model_len,
                      "blocks": c.cache_config.num_gpu_blocks_override, "caching": c.cache_config.enable_prefix_caching,
                      "mamba": str(c.cache_config.mamba_cache_mode), "block_size": c.cache_config.block_size,
                      "connector": x.kv_connector if x else None,
                      "extra": x.kv_connector_extra_config if x else None}))
try:
    from vllm.entrypoints.common.cli_args import make_arg_parser          # vLLM 0.33
except ImportError:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser       # vLLM 0.32
from vllm.utils.argparse_utils import FlexibleArgumentParser
server = ServerConfig(python=sys.executable, model_dir=model, num_blocks=40, max_model_len=16384,
                      max_num_batched_tokens=8192, max_num_seqs=4, block_size=None, plugin_env={},
                      extra_args=("--load-format", "dummy", "--gpu-memory-utilization", "0.85",
                                  "--kv-transfer-config", json.dumps(m.tier_transfer_config(1 << 35))))
os.environ.update(server.environment())
argv = server.args(8000)
args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv[3:])      # past "python -m module"
c = AsyncEngineArgs.from_cli_args(args).create_engine_config()
print(json.dumps({"mode": "server", "max_model_len": c.model_config.max_model_len,
                  "connector": c.kv_transfer_config.kv_connector}))
"""


@pytest.mark.parametrize("series", ["0.32", "0.33"])
def test_every_engine_the_check_starts_is_one_vllm_builds(tmp_path, series):
    """vLLM's own EngineArgs build each T1 engine and the T2 server from the arguments the check
    gives them (with the config's 8,192 positions under a prompt and its output: vLLM 0.33 refuses
    that without the environment the check sets). The three T1 engines differ only in the pool and
    the tier: one block size, one Mamba cache mode, prefix caching on in all."""
    python = vllm_python(series)
    model = tmp_path / "nemotron-h-8b"
    model.mkdir()
    shutil.copy(CONFIG, model / "config.json")
    out = subprocess.run([python, "-c", _ENGINE_CONFIGS, str(REPO / "scripts" / "gpu_tier_check.py"), str(model)],
                         capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {r["mode"]: r for r in (json.loads(line) for line in out.stdout.splitlines() if line.startswith("{"))}
    assert set(rows) == {"recompute", "gpu", "tier", "server"}
    t1 = [rows[m] for m in ("recompute", "gpu", "tier")]
    assert [r["blocks"] for r in t1] == [400, 400, 40]
    assert all(r["caching"] and r["max_model_len"] == 8192 + 256 for r in t1)
    assert len({(r["mamba"], r["block_size"]) for r in t1}) == 1
    assert [r["connector"] for r in t1] == [None, None, "OffloadingConnector"]
    extra = rows["tier"]["extra"]
    assert (extra["eviction_policy"], extra["cache_policy_module_path"], extra["cpu_bytes_to_use"]) == \
        ("MarconiCachePolicy", "marconi.integrations.vllm.tier", 1 << 33)
    assert rows["server"] == {"mode": "server", "max_model_len": 16384, "connector": "OffloadingConnector"}


@pytest.mark.slow
def test_replay_step_runs_and_the_verdict_reads_it(tmp_path):
    """T3 as gpu_check.sh runs it (vLLM's scheduler and tier on CPU), then T4's reader beside a
    served record: the tier served tokens in the replay, and the summary shows both rows."""
    require_vllm()
    out = tmp_path / "replay.jsonl"
    proc = subprocess.run([sys.executable, "-m", "marconi", "vllm", "replay", "--vllm-python", VLLM_PYTHON,
                           "--trace", "swe-sample", "--model", "nemotron-h-8b", "--blocks", "40", "--concurrency",
                           "4", "--num-requests", "12", "--cpu-tier", "34359738368B", "--policies", "lru",
                           "--tier-policies", "marconi", "--no-emulation", "--out", str(out), "--plot", ""],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    mod = _module()
    predicted = mod._replay_record(out)
    assert predicted["tier_hit_tokens"] > 0
    served = {"queries": predicted["gpu_hit_tokens"] + predicted["tier_hit_tokens"] + predicted["recomputed_tokens"],
              "gpu_hit_tokens": predicted["gpu_hit_tokens"], "tier_hit_tokens": predicted["tier_hit_tokens"]}
    rows = mod.summarise(served, predicted)
    assert rows[0].split()[1:] == rows[1].split()[1:]      # the same counts read the same through both paths
    assert float(rows[1].split()[6].rstrip("%")) > 0        # the tier's share



def test_drawn_weights_keep_a_recurrent_state_that_decays_and_matters():
    """The check's random weights (drawn in place of vLLM's dummy ones): a Mamba-2 A negative in
    [-16, -1] (vLLM stores -exp(A_log)), a DeltaNet A_log its log, dt in [1e-3, 1e-1] through softplus,
    the skip D 0, norms 1, matrices fan-in scaled, and the same draw twice. (First drawn: every vector
    N(0, 0.02), so A took both signs, and a state that grows where it should decay.)"""
    import torch

    mod = _module()

    def model() -> torch.nn.Module:
        net = torch.nn.Module()
        net.mixer = torch.nn.Module()
        for leaf in ("A", "A_log", "D", "dt_bias"):
            setattr(net.mixer, leaf, torch.nn.Parameter(torch.ones(64)))
        net.norm = torch.nn.LayerNorm(32)
        net.proj = torch.nn.Linear(256, 32, bias=False)
        return net

    one, two = model(), model()
    assert mod.draw_weights(one) == mod.draw_weights(two) == 7
    m = one.mixer
    assert bool(((m.A >= -16) & (m.A <= -1)).all())
    assert bool(((m.A_log.exp() >= 1) & (m.A_log.exp() <= 16)).all()) and bool((m.D == 0).all())
    dt = torch.nn.functional.softplus(m.dt_bias)
    assert bool(((dt >= 1e-3 * 0.999) & (dt <= 1e-1 * 1.001)).all())
    assert bool((one.norm.weight == 1).all()) and abs(one.proj.weight.std().item() - 256 ** -0.5) < 0.005
    assert all(torch.equal(a, b) for a, b in zip(one.state_dict().values(), two.state_dict().values()))
