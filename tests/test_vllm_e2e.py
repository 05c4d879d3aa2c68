"""Marconi inside a real vLLM server: hits, evictions, exact outputs, stock behaviour untouched.

Four real vLLM 0.32 OpenAI-compatible servers (CPU, a tiny random-weight Qwen3-Next built here)
serve the same workload — a multi-turn conversation, sessions that crowd it out of a small block
pool, and three requests sharing a prefix — side by side: stock (plugin not loaded), the plugin in
``lru`` (observe-only) mode, the plugin's Marconi eviction with a fixed α, and with adaptive α
(``MARCONI_VLLM_ALPHA=adaptive``: the shadow of adaptive Marconi fed each finished request). The
test checks that

* hits and evictions happened with the plugin (vLLM's own counters and the plugin's);
* greedy outputs are identical with and without the plugin, turn after turn (each server's
  conversation continues from its own replies), so reuse inside vLLM stays exact;
* ``lru`` changes nothing: same cached tokens as stock, and its block-pool trace is event for
  event the emulation of stock vLLM;
* the ``vllm-align`` emulation reproduces every request's cached tokens of the live servers.

It needs the vLLM environment (``make vllm-env``). Under ``make test`` (``MARCONI_REQUIRE_VLLM=1``)
a missing environment fails the test; under a plain ``pytest`` it skips, saying why.
"""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from marconi.core.model import ModelSpec
from marconi.integrations.vllm.emulate.engine import VllmAlignEngine
from marconi.integrations.vllm.layout import layout_for_spec
from vllm_env import VLLM_PYTHON, require_vllm, build_tiny_model

pytestmark = pytest.mark.slow  # four real vLLM servers (~2 min): CI and `make test` only

REPO = Path(__file__).resolve().parents[1]
BLOCK, NUM_BLOCKS, MAX_MODEL_LEN = 384, 20, 2048
SERVERS = {"stock": {}, "lru": {"MARCONI_VLLM_POLICY": "lru"},
           "marconi": {"MARCONI_VLLM_POLICY": "marconi", "MARCONI_VLLM_ALPHA": "1.0"},
           "adaptive": {"MARCONI_VLLM_POLICY": "marconi", "MARCONI_VLLM_ALPHA": "adaptive"}}




def _vllm(code: str, env: dict[str, str] | None = None, timeout: int = 300) -> str:
    proc = subprocess.run([VLLM_PYTHON, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env={**{k: v for k, v in os.environ.items() if not k.startswith("MARCONI_VLLM_")},
                               **(env or {})})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


# ====================================================================================== workload
def _workload(rng: np.random.Generator) -> list[dict[str, Any]]:
    """Steps: ("conv", new tokens) continue the conversation with the server's last reply; ("one",
    prompt) is a stand-alone request.

    Between turns, three shorter sessions overflow the 20-block pool. Stock vLLM (LRU) evicts the
    conversation, the oldest; Marconi keeps its deep prefix (more FLOPs saved per byte) and evicts
    the short ones, so its turns hit where stock recomputes — and the outputs must not change.
    """
    tokens = lambda n: rng.integers(3, 32000, n).tolist()  # noqa: E731
    shared = tokens(800)
    steps: list[dict[str, Any]] = [{"kind": "conv", "new": tokens(1500)}]
    for turn in range(3):
        steps += [{"kind": "one", "prompt": tokens(700)} for _ in range(3)]
        steps.append({"kind": "conv", "new": tokens(120)})
    steps += [{"kind": "one", "prompt": shared + tokens(300)} for _ in range(3)]
    steps.append({"kind": "control"})     # the last turn's prompt with one token changed halfway
    return steps


def _serve(name: str, model_dir: Path, work: Path, steps: list[dict[str, Any]]) -> dict[str, Any]:
    import httpx

    from marconi.integrations.common.client import complete
    from marconi.integrations.vllm.server import ServerConfig, VllmServer

    env = dict(SERVERS[name])
    if env:
        env["MARCONI_VLLM_TRACE"] = str(work / f"blocks-{name}.jsonl")
    config = ServerConfig(python=VLLM_PYTHON, model_dir=str(model_dir), num_blocks=NUM_BLOCKS,
                          max_model_len=MAX_MODEL_LEN, block_size=BLOCK, plugin_env=env,
                          extra_args=("--enforce-eager",))
    prompts, outputs, logprobs, cached = [], [], [], []
    conversation: list[int] = []
    last_turn: list[int] = []
    with VllmServer(config, log_path=work / f"server-{name}.log", startup_timeout_s=900) as server, \
            httpx.Client() as client:
        for step in steps:
            if step["kind"] == "conv":
                conversation = conversation + step["new"]
                prompt = conversation
                last_turn = list(prompt)
            elif step["kind"] == "control":
                prompt = list(last_turn)
                prompt[len(prompt) // 2] = prompt[len(prompt) // 2] % 31000 + 3
            else:
                prompt = step["prompt"]
            result = complete(client, server.base_url, str(model_dir), prompt, 24, logprobs=5)
            if step["kind"] == "conv":
                conversation = conversation + result.output
            prompts.append(list(prompt))
            outputs.append(result.output)
            logprobs.append(result.top_logprobs)
            cached.append(result.cached_tokens)
        metrics = server.metrics()
    return {"prompts": prompts, "outputs": outputs, "logprobs": logprobs, "cached": cached, "metrics": metrics}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    require_vllm()
    work = tmp_path_factory.mktemp("vllm-e2e")
    model_dir = build_tiny_model(work / "model")
    steps = _workload(np.random.default_rng(7))
    with ThreadPoolExecutor(len(SERVERS)) as pool:       # the servers side by side: ~2 min, not 4
        futures = {name: pool.submit(_serve, name, model_dir, work, steps) for name in SERVERS}
        runs = {name: fut.result() for name, fut in futures.items()}
    runs["_model_dir"] = model_dir
    runs["_work"] = work
    return runs


def _emulate(model_dir: Path, run: dict[str, Any], eviction: str,
             trace: list[Any] | None = None, alpha: float | str = 1.0) -> list[int]:
    spec = ModelSpec.from_hf_config(model_dir, bytes_per_elem=2)
    layout = layout_for_spec(spec, num_blocks=NUM_BLOCKS, block_size=BLOCK, max_num_batched_tokens=2048)
    engine = VllmAlignEngine(layout, spec, eviction=eviction, alpha=alpha)
    engine.pool.trace = trace
    hits = [engine.run(np.asarray(p), np.asarray(o)).hit_len for p, o in zip(run["prompts"], run["outputs"])]
    engine.check_invariants()
    return hits


# ====================================================================================== tests
def test_hits_and_evictions_happen_with_the_plugin(served: dict[str, Any]) -> None:
    run = served["marconi"]
    m = run["metrics"]
    assert m["vllm:prefix_cache_hits_total"] > 0
    assert m['marconi:hit_tokens_total{kind="usable"}'] == m["vllm:prefix_cache_hits_total"]
    evicted = sum(v for k, v in m.items() if k.startswith("marconi:evicted_blocks_total"))
    assert evicted > 0, "the pool was meant to be contended"
    assert all(k.split('policy="')[1].startswith("marconi") for k in m if k.startswith("marconi:evicted_blocks"))
    conv_turns = [i for i, p in enumerate(run["prompts"]) if i and p[:1500] == run["prompts"][0][:1500]]
    assert len(conv_turns) == 3 and all(run["cached"][i] > 0 for i in conv_turns), "the conversation missed"
    assert sum(run["cached"]) == m["vllm:prefix_cache_hits_total"]


def test_greedy_outputs_are_identical_with_and_without_the_plugin(served: dict[str, Any]) -> None:
    """Tokens and their top-5 log-probabilities, bit for bit: a random model's greedy tokens barely
    depend on the prefix (an audit: a changed token, even a zeroed state, left them all alike), so the
    tokens alone could not show a wrong state. The control shows the log-probabilities do: the last
    turn's prompt with one token changed halfway gives other ones."""
    stock = served["stock"]
    assert any(c > 0 for c in stock["cached"])
    assert all(len(steps) == 24 and all(len(top) >= 5 for top in steps) for steps in stock["logprobs"])
    last_turn = max(i for i, p in enumerate(stock["prompts"][:-1]) if p[:1500] == stock["prompts"][0][:1500])
    assert stock["logprobs"][-1] != stock["logprobs"][last_turn]       # the control: the prompt is seen
    for name in ("lru", "marconi", "adaptive"):
        assert served[name]["prompts"] == stock["prompts"], f"{name}: the conversation diverged"
        assert served[name]["outputs"] == stock["outputs"], f"{name}: greedy outputs differ from stock vLLM"
        assert served[name]["logprobs"] == stock["logprobs"], f"{name}: log-probabilities differ from stock vLLM"
    # Marconi resumed the conversation where stock vLLM recomputed it: identical outputs compare
    # reuse against recomputation, not one cache's hits against the same hits.
    conv_turns = [i for i, p in enumerate(stock["prompts"]) if i and p[:1500] == stock["prompts"][0][:1500]]
    assert all(served["marconi"]["cached"][i] > stock["cached"][i] for i in conv_turns)


def test_lru_mode_leaves_stock_vllm_untouched(served: dict[str, Any]) -> None:
    stock, lru = served["stock"], served["lru"]
    assert lru["cached"] == stock["cached"]
    assert lru["metrics"]["vllm:prefix_cache_hits_total"] == stock["metrics"]["vllm:prefix_cache_hits_total"]
    # Block for block: the lru server's pool did exactly what the emulation of stock vLLM does.
    with open(served["_work"] / "blocks-lru.jsonl") as fh:
        real = [json.loads(line) for line in fh]
    assert real[0][0] == "config" and real[0][1]["block_size"] == BLOCK
    emulated: list[Any] = []
    _emulate(served["_model_dir"], lru, "lru", emulated)
    assert [e for e in real[1:]] == [list(e) for e in emulated]


def test_emulation_matches_the_live_servers_per_request(served: dict[str, Any]) -> None:
    for name, eviction in (("stock", "lru"), ("marconi", "marconi")):
        assert _emulate(served["_model_dir"], served[name], eviction) == served[name]["cached"], name
    # Adaptive α: the server's shadow and the emulation's see the same finished requests, in the
    # same order, so they pick the same rules at the same evictions — block event for block event.
    with open(served["_work"] / "blocks-adaptive.jsonl") as fh:
        real = [json.loads(line) for line in fh]
    emulated: list[Any] = []
    hits = _emulate(served["_model_dir"], served["adaptive"], "marconi", emulated, alpha="adaptive")
    assert hits == served["adaptive"]["cached"]
    assert real[1:] == [list(e) for e in emulated]
    assert sum(e[0] == "lookup" for e in real) == len(served["adaptive"]["prompts"])
    log = (served["_work"] / "server-adaptive.log").read_text()
    assert "the alpha source failed" not in log
    # The three requests sharing an 800-token prefix: the third resumes from the junction's state.
    assert served["stock"]["cached"][-2] >= 768          # [-1] is the control


def test_plugin_registration_patches_only_what_is_asked() -> None:
    """No policy: vLLM's scheduler and block pool are untouched; the Mamba-2 fix applies on CPU
    only, and ``MARCONI_VLLM_MAMBA2_CPU_FIX=off`` turns it off. One vLLM import for both."""
    require_vllm()
    out = _vllm(
        "import os\n"
        "import vllm.v1.core.sched.scheduler as s, vllm.v1.core.block_pool as bp\n"
        "from vllm.model_executor.layers.mamba import mamba_mixer2 as m\n"
        "from vllm.platforms import current_platform\n"
        "from marconi.integrations.vllm import plugin\n"
        "core = (s.Scheduler.__init__, bp.BlockPool.get_new_blocks, bp.BlockPool.free_blocks, bp.BlockPool.touch)\n"
        "spec_fn = m.MambaMixer2.get_kv_cache_spec\n"
        "plugin.register()\n"
        "print('core-untouched', core == (s.Scheduler.__init__, bp.BlockPool.get_new_blocks,\n"
        "      bp.BlockPool.free_blocks, bp.BlockPool.touch))\n"
        "print('cpu', current_platform.is_cpu(), 'fix', m.MambaMixer2.get_kv_cache_spec is not spec_fn)\n"
        "m.MambaMixer2.get_kv_cache_spec = spec_fn\n"
        "plugin.reset_registration()\n"
        "os.environ['MARCONI_VLLM_MAMBA2_CPU_FIX'] = 'off'\n"
        "plugin.register()\n"
        "print('off-fix', m.MambaMixer2.get_kv_cache_spec is not spec_fn)\n")
    lines = out.strip().splitlines()[-3:]
    assert lines == ["core-untouched True", "cpu True fix True", "off-fix False"]
