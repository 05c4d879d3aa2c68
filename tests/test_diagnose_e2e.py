"""Issue 32 done-when: a real vLLM 0.32 CPU server records its traffic (``MARCONI_VLLM_RECORD``), and
``marconi vllm diagnose`` on that recording reproduces the server's per-request ``num_cached_tokens``.

The tiny random-weight Qwen3-Next (built here, as tests/test_vllm_e2e.py does) serves the first
turns of the bundled SWE trace's first sessions, once one request at a time and once four in
flight. At concurrency 1 every request's ``num_cached_tokens`` must come back exactly (from the
hash ids alone); at 4 in flight the agreement is reported (the server's real timing decides which
request looks up first, the diagnosis's closed loop may order two of them differently). In both,
the causes sum to the lost tokens, and the recording's ``num_cached_tokens`` equals what the client
was told (``usage.prompt_tokens_details.cached_tokens``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from marks import slow
from vllm_env import VLLM_PYTHON, require_vllm, build_tiny_model

pytestmark = slow           # two real vLLM servers

REPO = Path(__file__).resolve().parents[1]
BLOCK, NUM_BLOCKS, MAX_MODEL_LEN, MAX_TOKENS = 384, 48, 13312, 8


def _requests() -> list[Any]:
    from marconi.workloads import load_trace

    trace = load_trace("swe-sample")
    keep: dict[Any, int] = {}
    out = []
    for r in trace:
        if len(keep) >= 5 and r.session_id not in keep:
            continue
        keep.setdefault(r.session_id, 0)
        if keep[r.session_id] >= 4 or len(r.input_tokens) + MAX_TOKENS > MAX_MODEL_LEN:
            continue
        keep[r.session_id] += 1
        out.append(r)
    return out


def _serve(model_dir: Path, work: Path, name: str, concurrency: int, requests: list[Any]) -> tuple[Path, list[int]]:
    import httpx

    from marconi.integrations.common.client import complete
    from marconi.integrations.vllm.server import ServerConfig, VllmServer

    record = work / f"{name}.jsonl"
    config = ServerConfig(python=VLLM_PYTHON, model_dir=str(model_dir), num_blocks=NUM_BLOCKS,
                          max_model_len=MAX_MODEL_LEN, block_size=BLOCK, max_num_seqs=8,
                          plugin_env={"MARCONI_VLLM_RECORD": str(record)}, extra_args=("--enforce-eager",))
    with VllmServer(config, log_path=work / f"server-{name}.log", startup_timeout_s=900) as server, \
            httpx.Client() as client:
        def one(r: Any) -> int:
            return complete(client, server.base_url, str(model_dir), r.input_tokens.tolist(), MAX_TOKENS).cached_tokens

        if concurrency == 1:
            cached = [one(r) for r in requests]
        else:
            with ThreadPoolExecutor(concurrency) as pool:
                cached = list(pool.map(one, requests))
    return record, cached


def _diagnose(record: Path, model_dir: Path, out: Path, concurrency: int) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "marconi.cli", "vllm", "diagnose", "--trace", str(record),
                           "--model", str(model_dir), "--concurrency", str(concurrency), "--out", str(out)],
                          capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    return {"summary": recs[0], "levers": [r for r in recs if r["record"] == "lever"], "stdout": proc.stdout,
            "per_request": json.loads((out / "per_request.json").read_text())}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    require_vllm()
    work = tmp_path_factory.mktemp("diagnose-e2e")
    model_dir = build_tiny_model(work / "model")
    requests = _requests()
    out = {"_model_dir": model_dir, "_work": work, "_requests": requests}
    for name, c in (("c1", 1), ("c4", 4)):
        out[name] = _serve(model_dir, work, name, c, requests)
    return out


def test_diagnose_reproduces_the_server_one_request_at_a_time(served: dict[str, Any]) -> None:
    from marconi.workloads.recording import read_recording

    record, cached = served["c1"]
    rec = read_recording(record)
    assert [r.num_cached_tokens for r in rec.requests] == cached       # what the client was told
    assert sum(cached) > 0, "the SWE turns were meant to share prefixes"
    assert "salt" not in record.read_text()
    result = _diagnose(record, served["_model_dir"], served["_work"] / "R1", 1)
    s = result["summary"]
    print("\nconcurrency 1 fidelity:", json.dumps(s["fidelity"]))
    print(result["stdout"])
    assert s["fidelity"]["agree"] == s["fidelity"]["requests"] == len(cached)
    assert result["per_request"]["num_cached_tokens"] == sorted_by_arrival(rec, cached)
    assert sum(s["lost_tokens_by_cause"].values()) == s["lost_tokens"] > 0
    assert {r["lever"] for r in result["levers"]} >= {"stock", "marconi"}


def sorted_by_arrival(rec: Any, values: list[int]) -> list[int]:
    order = sorted(range(len(rec.requests)), key=lambda i: rec.requests[i].arrival)
    return [values[i] for i in order]


def test_diagnose_says_how_far_it_is_at_four_in_flight(served: dict[str, Any]) -> None:
    from marconi.workloads.recording import read_recording

    record, cached = served["c4"]
    rec = read_recording(record)
    assert sorted(r.num_cached_tokens for r in rec.requests) == sorted(cached)
    result = _diagnose(record, served["_model_dir"], served["_work"] / "R4", 4)
    s = result["summary"]
    print("\nconcurrency 4 fidelity:", json.dumps(s["fidelity"]))
    assert s["fidelity"]["requests"] == len(cached)
    assert 0.0 <= s["fidelity"]["agree_share"] <= 1.0
    assert sum(s["lost_tokens_by_cause"].values()) == s["lost_tokens"]
