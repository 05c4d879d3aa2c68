"""vllm-align: vLLM 0.32's hybrid prefix cache emulated, checked against what real vLLM served.

The recorded fixtures come from the real server (``marconi vllm bench``; the command is stored in
each fixture: vLLM's defaults, ``--prefix-match-unit 64``, and stock vs fixed vs adaptive α): per
request, vLLM's own cached-token count and the tokens it generated. The emulation, fed the same
prompts and outputs, must reproduce every count exactly, for stock vLLM and for vLLM with the
Marconi plugin.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from marconi.core.model import ModelSpec
from marconi.core.protocol import ReplayCache
from marconi.core.registry import ConfigError
from marconi.sim.replay import simulate_system
from marconi.sim.systems import System, SystemConfig, make_system
from marconi.integrations.common.bench import max_tokens
from marconi.integrations.vllm.arms import policy_arm
from marconi.integrations.vllm.emulate.cache import VllmAlignCache
from marconi.integrations.vllm.emulate.engine import VllmAlignEngine
from marconi.integrations.vllm.layout import VllmLayout, layout_for_spec, prefix_hashes
from marconi.integrations.vllm.models import PRESETS
from marconi.integrations.vllm.policy import ATTENTION, MAMBA
from marconi.integrations.vllm.shadow import PoolShadowAlpha
from marconi.integrations.vllm.system import VllmAlignSystem
from marconi.lab.vllm_bench import BenchConfig, alpha_changes, emulate_run, read_fixture, select_requests

FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("vllm_*.json"))
# The tiny Qwen3-Next preset's config as vLLM serves it (3 gated-DeltaNet layers, 1 attention).
QWEN_TINY = ModelSpec.from_hf_config({"model_type": "qwen3_next", **PRESETS["qwen3_next-tiny"][1],
                                      "torch_dtype": "bfloat16"}, name="qwen3_next-tiny")
KINDS = (MAMBA, MAMBA, MAMBA, ATTENTION)


def _engine(num_blocks: int, eviction: str = "lru", alpha: float | str = 0.5, **layout: object) -> VllmAlignEngine:
    options = {"max_num_batched_tokens": 2048, **layout}
    return VllmAlignEngine(VllmLayout(block_size=384, num_blocks=num_blocks, group_kinds=KINDS, **options),
                           QWEN_TINY, eviction=eviction, alpha=alpha)


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
    marconi = make_system("vllm-align:eviction=marconi,alpha=adaptive,rules=lru/a1m,block=384,blocks=60")
    assert marconi.eviction == "marconi-blocks(alpha=adaptive,rules=lru/a1m)"
    source = marconi.build(QWEN_TINY, 0).engine.index.alpha_source
    assert isinstance(source, PoolShadowAlpha) and [r.label() for r in source.rules] == ["lru", "a1m"]
    assert marconi.build(QWEN_TINY, 0).engine.index.alpha_source is not source     # a fresh one per cache
    for bad in ("vllm-align:eviction=fifo", "vllm-align:retention=-1", "vllm-align:efficiency=x",
                "vllm-align:alpha=-1", "vllm-align:typo=1", "vllm-align:alpha_source=nocolon",
                "vllm-align:alpha=adaptiv", "vllm-align:eviction=marconi,alpha=adaptive,efficiency=marginal",
                "vllm-align:eviction=marconi,alpha=adaptive,alpha_source=m:f", "vllm-align:rules=lru/a1m",
                "vllm-align:eviction=marconi,alpha=adaptive,rules=lru/a1mi", "vllm-align:alpha=adaptive"):
        with pytest.raises(ConfigError):
            make_system(bad)


def test_vllm_align_implements_the_system_and_replay_cache_protocols() -> None:
    """vllm-align meets the simulator through its two typed seams: the system is a ``System`` of its
    own (not a ``SystemConfig`` with other meanings), its cache a ``ReplayCache``; records echo
    the same fields as when it subclassed ``SystemConfig``."""
    stock = make_system("vllm-align")
    assert isinstance(stock, System) and not isinstance(stock, SystemConfig)
    assert (stock.label, stock.unbounded, stock.needs_future) == ("vllm-align", False, False)
    assert stock.record_fields() == {"system": "vllm-align", "admission": "vllm-align(block=auto,retention=0,chunk=2048)",
                                     "eviction": "lru", "tuning": None}
    name = "vllm-align:eviction=marconi,alpha=1,block=384,blocks=60"
    plugin = make_system(name)
    assert plugin.record_fields() == {"system": name, "admission": "vllm-align(block=384,retention=0,chunk=2048)",
                                      "eviction": "marconi-blocks(alpha=1,efficiency=total)", "tuning": None}
    assert plugin.relabel("mine").record_fields()["system"] == "mine" and plugin.label == name
    cache = plugin.build(QWEN_TINY, 0)
    assert isinstance(cache, VllmAlignCache) and isinstance(cache, ReplayCache) and cache.chooser is None
    shadowed = make_system("vllm-align:eviction=marconi,alpha=adaptive,block=384,blocks=60")
    assert shadowed.record_fields()["eviction"] == "marconi-blocks(alpha=adaptive,rules=default)"
    assert isinstance(shadowed.build(QWEN_TINY, 0).chooser, PoolShadowAlpha)   # its switches reach the records
    with pytest.raises(ConfigError, match="no real payloads"):
        plugin.build(QWEN_TINY, 0, payloads=object())  # type: ignore[arg-type]
    from marconi.workloads import build_workload

    result = simulate_system(list(build_workload("swe-sample:max_input_len=8192"))[:5], plugin, QWEN_TINY, 0,
                             latency="zero")
    assert {k: result.system[k] for k in ("system", "admission", "eviction", "tuning")} == plugin.record_fields()


def test_adaptive_alpha_in_the_emulation_switches_and_stays_consistent() -> None:
    """``alpha=adaptive``: the shadow sees each request after its blocks are freed; its rule changes
    appear in the block trace (as the plugin writes them) and in the simulator's records; the pool's
    invariants hold throughout; the same requests give the same hits and switches."""
    from marconi.workloads import build_workload

    trace = list(build_workload("swe-sample:max_input_len=8192"))[:60]
    runs = []
    for _ in range(2):
        engine = _engine(100, "marconi", alpha="adaptive")
        engine.pool.trace = events = []
        hits = []
        for i, req in enumerate(trace):
            hits.append(engine.run(req.input_tokens, req.output_tokens).hit_len)
            if i % 10 == 0:
                engine.check_invariants()
        engine.check_invariants()
        changes = alpha_changes(events)
        assert [e for e in events if e[0] == "alpha"] == [("alpha", a, eff) for _, a, eff in changes]
        runs.append((hits, changes))
    assert runs[0] == runs[1]
    changes = runs[0][1]
    assert len(changes) >= 2 and {eff for _, _, eff in changes} == {"marginal", "total"}   # a0.5m/a2m and back to lru
    switches = engine.index.alpha_source.tuning_record()["rule_switches"]
    assert [c[0] for c in changes] == [at for at, _ in switches]    # request i's finish moved the rule
    result = simulate_system(trace, "vllm-align:block=384,blocks=100,eviction=marconi,alpha=adaptive", QWEN_TINY, 0,
                             latency="zero")
    assert result.record()["rule_switches"] == switches
    assert result.reused_len.tolist() == runs[0][0]


def test_simulate_runs_vllm_align_on_a_bundled_trace() -> None:
    """In sequential mode (``--mode event`` is refused for vllm-align: tests/test_sim.py)."""
    from marconi.workloads import build_workload

    trace = list(build_workload("swe-sample:max_input_len=8192"))[:25]
    stock = simulate_system(trace, "vllm-align:block=384,blocks=70", QWEN_TINY, 0, latency="zero")
    marconi = simulate_system(trace, "vllm-align:block=384,blocks=70,eviction=marconi", QWEN_TINY, 0, latency="zero")
    for result in (stock, marconi):
        rec = result.record()
        assert rec["num_requests"] == 25 and 0 < rec["token_hit_rate"] < 1
        assert rec["reused_tokens"] == int(result.reused_len.sum())
        assert np.all(result.reused_len % 384 == 0) and np.all(result.reused_len < result.input_len)
    assert stock.system["eviction"] == "lru" and marconi.system["eviction"].startswith("marconi-blocks")


def test_fixtures_are_there() -> None:
    """Stock vLLM, the plugin with a fixed alpha, and with adaptive alpha, each recorded on a real server."""
    assert {f.name for f in FIXTURES} >= {"vllm_swe40_blocks80.json", "vllm_swe40_blocks80_unit64.json",
                                          "vllm_swe_adaptive.json"}
    arms = set()
    for fixture in FIXTURES:
        data = read_fixture(fixture)
        arms |= {policy_arm(run["policy"], data["config"]["alpha"]) for run in data["runs"]}
    assert {("lru", None), ("marconi", 0.5), ("marconi", "adaptive")} <= arms


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.stem)
def test_emulation_reproduces_the_recorded_real_server_per_request(fixture: Path) -> None:
    """Every request's cached tokens as vLLM 0.32 reported them, stock and with the plugin."""
    data = read_fixture(fixture)
    cfg = data["config"]
    config = BenchConfig(vllm_python="unused", **{k: (tuple(v) if k == "policies" else v) for k, v in cfg.items()})
    requests, indices, _ = select_requests(config)
    assert indices == data["requests"] and [max_tokens(r) for r in requests] == data["max_tokens"]
    spec = ModelSpec(**data["model_spec"])
    for run in data["runs"]:
        sim = emulate_run(spec, config, requests, run["outputs"], run["policy"])
        assert sim.hits == run["cached_tokens"], f"{run['policy']}: emulation differs from the real server"
        assert sum(sim.hits) == run["prefix_cache_hits"]                 # vLLM's /metrics counter
        assert sum(r.input_len for r in requests) == run["prefix_cache_queries"]
        assert sum(sim.evictions.values()) > 0 and sum(sim.hits) > 0      # the pool was contended, hits happened
        if policy_arm(run["policy"], config.alpha)[1] == "adaptive":
            # The plugin's adaptive source switched rules inside the server (its block trace), after
            # the same requests as the emulation's.
            assert len(run["alpha_changes"]) >= 2 and sim.alpha_changes == run["alpha_changes"]


def test_bench_records_table_and_plot_from_a_recorded_run(tmp_path: Path) -> None:
    """What ``marconi vllm bench`` writes and prints after serving, fed a recorded real run: the
    record's vLLM and emulated rates, the comparison table and the TTFT CDF (the part of the bench
    a CI machine without a server would otherwise never execute)."""
    from marconi.lab.vllm_bench import RunResult, bench_table, make_record, plot_ttft_cdf

    data = read_fixture(next(f for f in FIXTURES if f.name == "vllm_swe_adaptive.json"))
    cfg = data["config"]
    config = BenchConfig(vllm_python="unused", **{k: (tuple(v) if k == "policies" else v) for k, v in cfg.items()})
    requests, indices, trace_info = select_requests(config)
    spec = ModelSpec(**data["model_spec"])
    records = []
    for i, run in enumerate(data["runs"]):
        n = len(requests)
        ttft = [0.1 * (i + 1) + 0.001 * k for k in range(n)]           # timings are not in fixtures
        result = RunResult(run["policy"], run["plugin"], run["cached_tokens"], run["outputs"], ttft, [0.003] * n,
                           ttft, {"vllm:prefix_cache_queries_total": run["prefix_cache_queries"],
                                  "vllm:prefix_cache_hits_total": run["prefix_cache_hits"]}, 1.0, 2.0,
                           alpha_changes=run["alpha_changes"])
        sim = emulate_run(spec, config, requests, run["outputs"], run["policy"])
        rec = make_record(config, trace_info, spec, requests, indices, result, sim, sim.hits)
        assert rec["engine"] == "vllm" and rec["policy"] in ("lru", "marconi") and rec["num_requests"] == n
        assert rec["token_hit_rate"] == run["prefix_cache_hits"] / run["prefix_cache_queries"] > 0
        assert rec["emulation_error_pp"] == 0.0 and rec["emulation_requests_exact"] == n
        assert rec["ttft_p50_s"] <= rec["ttft_p95_s"] <= rec["ttft_p99_s"]
        records.append(rec)
    table = bench_table(records).splitlines()
    assert table[0].split()[:2] == ["policy", "plugin"] and len(table) == 2 + len(records)
    for line, rec in zip(table[2:], records):
        assert line.startswith(rec["arm"]) and f"{100 * rec['token_hit_rate']:.1f}%" in line and "+0.00pp" in line
    png = plot_ttft_cdf(records, tmp_path / "sub" / "ttft.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in png.parent.iterdir()] == ["ttft.png"]                  # no temp file left
