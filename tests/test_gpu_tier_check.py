"""The CPU tier's GPU check (scripts/gpu_check.sh --tier, scripts/gpu_tier_check.py) as far as a CPU
allows: its steps, its verdict's logic, the connector config it hands vLLM, and its replay step
(T3) run for real against the verdict's reader. The generating steps need CUDA (the connector's
worker side) and run only where a GPU is lent."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_env import VLLM_PYTHON, require_vllm

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.sh"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_tier_check", REPO / "scripts" / "gpu_tier_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(mode: str, outputs: list[list[int]], tier_hits: float = 0.0, logprob: float = -1.0) -> dict:
    return {"mode": mode, "outputs": [{"token_ids": o, "logprobs": [{str(t): logprob} for t in o]} for o in outputs],
            "gpu_hit_tokens": 100.0, "tier_hit_tokens": tier_hits}


def test_dry_run_lists_the_tier_steps_only_with_tier():
    tier = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--tier"], capture_output=True, text=True, check=True).stdout
    for step in ("T1/recompute", "T1/gpu", "T1/tier", "T2 ", "T3 ", "T4 "):
        assert step in tier
    assert "4/5 serve stock vs plugin" not in tier
    assert "--tier-policies marconi" in tier and "gpu_tier_check.py compare" in tier
    pool = subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True, check=True).stdout
    assert "4/5 serve stock vs plugin" in pool and "T1/" not in pool
    both = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--all"], capture_output=True, text=True, check=True).stdout
    assert "4/5 serve stock vs plugin" in both and "T4 " in both
    bad = subprocess.run(["bash", str(SCRIPT), "--tiers"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--tier" in bad.stderr


def test_verdict_passes_only_when_the_tier_served_and_adds_no_difference():
    mod = _module()
    base = [[1, 2], [3, 4], [5, 6]]
    ok, lines = mod.compare(_run("recompute", base), _run("gpu", base), _run("tier", base, tier_hits=512))
    assert ok and lines[-1].startswith("PASS")
    # the tier served nothing: the check proved nothing
    ok, lines = mod.compare(_run("recompute", base), _run("gpu", base), _run("tier", base, tier_hits=0))
    assert not ok and any("served no token" in line for line in lines)
    # the tier differs where the GPU pool alone does not
    ok, lines = mod.compare(_run("recompute", base), _run("gpu", base), _run("tier", [[1, 2], [3, 9], [5, 6]], 512))
    assert not ok and any("differs on 1 requests" in line for line in lines)
    # as many differences as the pool's own (the arithmetic of a resumed prefill): pass
    ok, _ = mod.compare(_run("recompute", base), _run("gpu", [[1, 2], [3, 4], [5, 7]]),
                        _run("tier", [[1, 2], [3, 9], [5, 6]], 512))
    assert ok
    # the same tokens but another log-probability: a different state, caught
    ok, lines = mod.compare(_run("recompute", base), _run("gpu", base), _run("tier", base, 512, logprob=-1.001))
    assert not ok and any("largest log-probability gap 0.001" in line for line in lines)
    with pytest.raises(ValueError, match="2 outputs"):
        mod.compare(_run("recompute", base), _run("gpu", base[:2]), _run("tier", base, 1))


def test_missing_results_name_the_file(tmp_path):
    mod = _module()
    with pytest.raises(SystemExit, match="outputs-recompute.json missing"):
        mod.main(["compare", "--work", str(tmp_path)])


def test_tier_engine_config_is_vllms_connector_with_marconis_policy():
    require_vllm()
    code = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('g', sys.argv[1]); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
            "from vllm.config import KVTransferConfig; kw = m.engine_kwargs('tier', 'model', 40, 1 << 33); "
            "c = kw['kv_transfer_config']; assert isinstance(c, KVTransferConfig), type(c); "
            "x = c.kv_connector_extra_config; "
            "print(c.kv_connector, x['eviction_policy'], x['cache_policy_module_path'], x['cpu_bytes_to_use'], "
            "kw['num_gpu_blocks_override'], kw['enable_prefix_caching'], "
            "m.engine_kwargs('recompute', 'model', 40, 1)['enable_prefix_caching'])")
    out = subprocess.run([VLLM_PYTHON, "-c", code, str(REPO / "scripts" / "gpu_tier_check.py")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["OffloadingConnector", "MarconiCachePolicy", "marconi.integrations.vllm.tier",
                                  str(1 << 33), "40", "True", "False"]


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

