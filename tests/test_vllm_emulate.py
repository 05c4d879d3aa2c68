"""vllm-align: vLLM 0.32's hybrid prefix cache emulated, checked against what real vLLM served.

The recorded fixtures come from the real server (``marconi vllm bench``; the command is stored in
each fixture; one with vLLM's defaults, one with ``--prefix-match-unit 64``): per request, vLLM's own cached-token count and the tokens it generated. The
emulation, fed the same prompts and outputs, must reproduce every count exactly, for stock vLLM
and for vLLM with the Marconi plugin.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from marconi.model import ModelSpec
from marconi.registry import ConfigError
from marconi.sim.replay import simulate_system
from marconi.systems import make_system
from marconi.vllm.bench import BenchConfig, emulate_run, max_tokens, read_fixture, select_requests
from marconi.vllm.emulate import VllmAlignEngine, VllmLayout, layout_for_spec, prefix_hashes
from marconi.vllm.models import PRESETS
from marconi.vllm.policy import ATTENTION, MAMBA
from marconi.vllm.system import VllmAlignSystem

FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("vllm_*.json"))
# The tiny Qwen3-Next preset's config as vLLM serves it (3 gated-DeltaNet layers, 1 attention).
QWEN_TINY = ModelSpec.from_hf_config({"model_type": "qwen3_next", **PRESETS["qwen3_next-tiny"][1],
                                      "torch_dtype": "bfloat16"}, name="qwen3_next-tiny")
KINDS = (MAMBA, MAMBA, MAMBA, ATTENTION)


def _engine(num_blocks: int, eviction: str = "lru", **layout: object) -> VllmAlignEngine:
    options = {"max_num_batched_tokens": 2048, **layout}
    return VllmAlignEngine(VllmLayout(block_size=384, num_blocks=num_blocks, group_kinds=KINDS, **options),
                           QWEN_TINY, eviction=eviction)


def test_layout_follows_vllm_grouping() -> None:
    layout = layout_for_spec(QWEN_TINY, num_blocks=100, block_size=384)
    assert layout.group_kinds == KINDS                          # one layer per group, Mamba layers first
    derived = layout_for_spec(QWEN_TINY, num_blocks=100)       # attention page >= Mamba page, 16-aligned
    kv_layer = QWEN_TINY.kv_bytes_per_token // QWEN_TINY.num_attn_layers
    state_layer = QWEN_TINY.ssm_state_bytes_per_layer + QWEN_TINY.conv_state_bytes_per_layer
    assert derived.block_size % 16 == 0 and derived.block_size * kv_layer >= state_layer > (derived.block_size - 16) * kv_layer
    paper = layout_for_spec(ModelSpec.from_hf_config({"model_type": "nemotron_h", "hidden_size": 64, "num_attention_heads": 4,
                                                      "num_key_value_heads": 2, "head_dim": 16, "mamba_num_heads": 8,
                                                      "mamba_head_dim": 16, "ssm_state_size": 16,
                                                      "hybrid_override_pattern": "M*M*MMMM"}), num_blocks=10)
    assert paper.group_kinds == (MAMBA, MAMBA, MAMBA, ATTENTION)   # 2 attn / 6 SSM: 2 layers per group
    by_bytes = layout_for_spec(QWEN_TINY, capacity_bytes=10 * layout.block_bytes, block_size=384)
    assert by_bytes.num_blocks == 11                            # + vLLM's null block
    with pytest.raises(ConfigError, match="multiple of the block"):
        VllmLayout(block_size=384, num_blocks=10, group_kinds=KINDS, retention_interval=100)
    with pytest.raises(ConfigError, match="divide the block size"):
        VllmLayout(block_size=384, num_blocks=10, group_kinds=KINDS, prefix_match_unit=100)


@pytest.mark.parametrize("unit, expected", [(None, [0, 768, 1152, 768]), (64, [0, 960, 1152, 960])])
def test_hits_land_on_the_previous_prompts_replay_boundary(unit: int | None, expected: list[int]) -> None:
    """What vLLM 0.32 served for this sequence (in-process engine, 100 blocks of 384): hits at the
    previous prompt's last block boundary, or with ``prefix_match_unit=64`` at its last 64-token
    boundary inside the block (a partial entry, the shared block copied on write)."""
    rng = np.random.default_rng(0)
    engine = _engine(100, prefix_match_unit=unit)
    a = rng.integers(0, 32000, 1000)
    out_a = rng.integers(0, 32000, 8)
    b = np.concatenate([a, rng.integers(0, 32000, 200)])
    c = np.concatenate([a, out_a, rng.integers(0, 32000, 200)])
    hits = [engine.run(a, out_a).hit_len, engine.run(b, out_a).hit_len, engine.run(b, out_a).hit_len,
            engine.run(c, out_a).hit_len]
    assert hits == expected
    engine.check_invariants()
    assert engine.queries == 1000 + 1200 + 1200 + 1208 and engine.hits == sum(hits)


def test_shared_prefix_junction_gets_a_state() -> None:
    """Marconi-style admission in vLLM: a prefix two requests share keeps its state for a third."""
    rng = np.random.default_rng(1)
    engine = _engine(200)
    shared = rng.integers(0, 32000, 1536)
    reqs = [np.concatenate([shared, rng.integers(0, 32000, 900)]) for _ in range(3)]
    out = rng.integers(0, 32000, 4)
    first = engine.run(reqs[0], out)
    second = engine.run(reqs[1], out)          # KVs match 1536 tokens, no state there: a junction
    third = engine.run(reqs[2], out)
    assert (first.hit_len, second.hit_len, second.kv_hit_len) == (0, 0, 1536)
    assert third.hit_len == 1536
    engine.check_invariants()


@pytest.mark.parametrize("eviction, unit", [("lru", None), ("marconi", None), ("lru", 64), ("marconi", 32)])
def test_invariants_hold_on_a_contended_pool(eviction: str, unit: int | None) -> None:
    rng = np.random.default_rng(2)
    engine = _engine(40, eviction, prefix_match_unit=unit)
    sessions = [list(rng.integers(0, 32000, int(rng.integers(300, 1500)))) for _ in range(6)]
    for step in range(40):
        k = int(rng.integers(0, len(sessions)))
        out = rng.integers(0, 32000, int(rng.integers(1, 500)))
        prompt = np.asarray(sessions[k], dtype=np.int32)
        rec = engine.run(prompt, out)
        assert 0 <= rec.hit_len <= rec.kv_hit_len <= len(prompt) - 1 and rec.hit_len % (unit or 384) == 0
        engine.check_invariants()
        sessions[k] = sessions[k] + list(out) + list(rng.integers(0, 32000, int(rng.integers(50, 400))))
        if len(sessions[k]) > 5000:
            sessions[k] = list(rng.integers(0, 32000, 400))
    assert engine.pool.stats.num_evicted > 0


def test_a_request_that_cannot_fit_says_so() -> None:
    engine = _engine(6)
    with pytest.raises(ConfigError, match="raise the capacity"):
        engine.run(np.arange(3000) % 32000, np.arange(4))


def test_prefix_hashes_chain_and_extend() -> None:
    tokens = np.arange(100, dtype=np.int32)
    full = prefix_hashes(tokens, 10)
    assert len(full) == 10 and len(set(full)) == 10
    assert prefix_hashes(tokens, 10, full[:4]) == full
    other = tokens.copy()
    other[5] = 7
    assert prefix_hashes(other, 10)[0] != full[0] and prefix_hashes(other, 10)[1] != full[1]


def test_vllm_align_is_a_system_name() -> None:
    system = make_system("vllm-align:eviction=marconi,alpha=0.5,block=384,blocks=60,retention=none")
    assert isinstance(system, VllmAlignSystem)
    assert system.label == "vllm-align:eviction=marconi,alpha=0.5,block=384,blocks=60,retention=none"
    cache = system.build(QWEN_TINY, 0)
    assert cache.layout.num_blocks == 60 and cache.layout.retention_interval is None
    assert cache.engine.eviction == "marconi" and cache.engine.index.alpha_source.alpha() == 0.5
    adaptive = make_system("vllm-align:eviction=marconi,block=384,blocks=60,"
                           "alpha_source=test_vllm_policy:_CountingSource").build(QWEN_TINY, 0)
    adaptive.process(np.arange(900) % 32000, np.arange(4))
    assert adaptive.engine.index.alpha_source.alpha() == 1.0       # it observed the one request
    for bad in ("vllm-align:eviction=fifo", "vllm-align:retention=-1", "vllm-align:efficiency=x",
                "vllm-align:alpha=-1", "vllm-align:typo=1", "vllm-align:alpha_source=nocolon"):
        with pytest.raises(ConfigError):
            make_system(bad)


@pytest.mark.parametrize("mode", ["sequential", "event"])
def test_simulate_runs_vllm_align_on_a_bundled_trace(mode: str) -> None:
    from marconi.workloads import build_workload

    trace = list(build_workload("swe-sample:max_input_len=8192"))[:25]
    stock = simulate_system(trace, "vllm-align:block=384,blocks=70", QWEN_TINY, 0, mode=mode, latency="zero")
    marconi = simulate_system(trace, "vllm-align:block=384,blocks=70,eviction=marconi", QWEN_TINY, 0, mode=mode,
                       latency="zero")
    for result in (stock, marconi):
        rec = result.record()
        assert rec["num_requests"] == 25 and 0 < rec["token_hit_rate"] < 1
        assert rec["reused_tokens"] == int(result.reused_len.sum())
        assert np.all(result.reused_len % 384 == 0) and np.all(result.reused_len < result.input_len)
    assert stock.system["eviction"] == "lru" and marconi.system["eviction"].startswith("marconi-blocks")


def test_fixtures_are_there() -> None:
    assert {f.name for f in FIXTURES} >= {"vllm_swe40_blocks80.json", "vllm_swe40_blocks80_unit64.json"}


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.stem)
def test_emulation_reproduces_the_recorded_real_server_per_request(fixture: Path) -> None:
    """Every request's cached tokens as vLLM 0.32 reported them, stock and with the plugin."""
    data = read_fixture(fixture)
    cfg = data["config"]
    config = BenchConfig(vllm_python="unused", **{k: (tuple(v) if k == "policies" else v) for k, v in cfg.items()})
    requests, indices, _ = select_requests(config)
    assert indices == data["requests"] and [max_tokens(r) for r in requests] == data["max_tokens"]
    spec = ModelSpec(**data["model_spec"])
    assert {run["policy"] for run in data["runs"]} == {"lru", "marconi"}
    for run in data["runs"]:
        hits, evictions = emulate_run(spec, config, requests, run["outputs"], run["policy"])
        assert hits == run["cached_tokens"], f"{run['policy']}: emulation differs from the real server"
        assert sum(hits) == run["prefix_cache_hits"]                 # vLLM's /metrics counter
        assert sum(r.input_len for r in requests) == run["prefix_cache_queries"]
        assert sum(evictions.values()) > 0 and sum(hits) > 0          # the pool was contended, hits happened
