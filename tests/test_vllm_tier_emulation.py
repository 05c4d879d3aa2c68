"""``vllm-align``'s CPU tier (marconi.integrations.vllm.emulate.tier): vLLM 0.32's offload tier without vLLM.

The policies and the manager are checked by hand-checkable cases; the connector's lookup on chunks
placed by hand; the closed loop on a synthetic multi-turn trace with the invariants checked after
every step. The slow case compares the emulation with vLLM's own connector in the replay (it needs
the vLLM environment, as ``tests/test_vllm_tiers.py``'s replay case does).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from marconi.core.model import ModelSpec, get_model
from marconi.core.registry import ConfigError
from marconi.integrations.vllm.emulate.engine import VllmAlignEngine
from marconi.integrations.vllm.emulate.request import RequestState
from marconi.integrations.vllm.emulate.scheduler import VllmAlignScheduler, emulate_admitted, emulate_closed_loop
from marconi.integrations.vllm.emulate.tier import (HIT, HIT_PENDING, ARCPolicy, EmulatedTier, LRUPolicy, ReqContext,
                                                    TierManager, make_policy, tier_num_chunks)
from marconi.integrations.vllm.layout import VllmLayout, layout_for_spec
from marconi.integrations.vllm.models import PRESETS
from marconi.integrations.vllm.policy import ATTENTION, MAMBA
from marconi.integrations.vllm.tier_tree import make_offload_key
from marks import slow
from test_vllm_emulate_concurrency import sessions
from vllm_env import vllm_python

QWEN_TINY = ModelSpec.from_hf_config({"model_type": "qwen3_next", **PRESETS["qwen3_next-tiny"][1],
                                      "torch_dtype": "bfloat16"}, name="qwen3_next-tiny")
KINDS = (MAMBA, MAMBA, MAMBA, ATTENTION)
BLOCK = 384


def _key(name: str, group: int = 0) -> bytes:
    return make_offload_key(name.encode(), group)


def _stored(mgr: TierManager, ctx: ReqContext, *names: str) -> list[bytes]:
    keys = [_key(n) for n in names]
    out = mgr.prepare_store(keys, ctx)
    assert out is not None
    mgr.complete_store(out)
    return out


def _held(mgr: TierManager) -> set[bytes]:
    return set(mgr.policy.held_chunks())


# ====================================================================================== policies, manager
def test_lru_evicts_the_oldest_skips_protected_and_refreshes_at_request_end() -> None:
    mgr, ctx = TierManager(3, LRUPolicy(3)), ReqContext(0)
    _stored(mgr, ctx, "a")
    _stored(mgr, ctx, "b")
    _stored(mgr, ctx, "c")
    assert mgr.num_free == 0
    _stored(mgr, ctx, "d")                                     # full: the oldest goes
    assert _held(mgr) == {_key("b"), _key("c"), _key("d")} and mgr.evicted == [_key("a")]
    out = mgr.prepare_store([_key("b"), _key("e")], ReqContext(1))   # b is offered, so protected
    assert out == [_key("e")] and mgr.evicted[-1] == _key("c")
    mgr.complete_store(out)
    # a request that reused d ends: d becomes the most recent, b the oldest
    reader = ReqContext(2)
    assert mgr.prepare_store([_key("d")], reader) == []        # held and ready: a reuse, nothing stored
    mgr.on_request_finished(reader)
    _stored(mgr, ReqContext(3), "f")
    assert mgr.evicted[-1] == _key("b")
    assert len(_held(mgr)) == 3
    mgr.check_invariants()


def test_manager_never_exceeds_capacity_and_cannot_evict_pending_or_loading_chunks() -> None:
    mgr, ctx = TierManager(2, LRUPolicy(2)), ReqContext(0)
    pending = mgr.prepare_store([_key("a"), _key("b")], ctx)
    assert pending == [_key("a"), _key("b")]
    assert mgr.prepare_store([_key("c")], ctx) is None         # both slots hold stores still in flight
    mgr.complete_store(pending)
    mgr.prepare_load([_key("a")], ReqContext(1))               # a is being read: pinned
    out = mgr.prepare_store([_key("c")], ctx)
    assert out == [_key("c")] and mgr.evicted == [_key("b")]   # not a, although a is older
    assert mgr.prepare_store([_key("d")], ctx) is None         # a pinned, c pending: nothing to evict
    mgr.complete_load([_key("a")])
    mgr.complete_store(out)
    assert len(_held(mgr)) == 2
    mgr.check_invariants()


def test_arc_promotes_reused_chunks_and_adapts_to_ghost_hits() -> None:
    policy = ARCPolicy(2)
    mgr = TierManager(2, policy)
    _stored(mgr, ReqContext(0), "a")
    _stored(mgr, ReqContext(1), "b")
    reader = ReqContext(2)
    assert mgr.prepare_store([_key("a")], reader) == []        # a reused ...
    mgr.on_request_finished(reader)
    assert list(policy.t2) == [_key("a")] and list(policy.t1) == [_key("b")]   # ... so frequent
    _stored(mgr, ReqContext(3), "c")                           # T1 at its target: T1's LRU goes, to ghost B1
    assert mgr.evicted == [_key("b")] and list(policy.b1) == [_key("b")]
    assert policy.target_t1_size == 0
    _stored(mgr, ReqContext(4), "b")                           # a B1 ghost comes back: recency wins more room
    assert policy.target_t1_size == 1
    mgr.check_invariants()


def test_policies_by_name_and_tier_size() -> None:
    assert isinstance(make_policy("lru", 4), LRUPolicy) and isinstance(make_policy("arc", 4), ARCPolicy)
    marconi = make_policy("marconi", 4, group_kinds=KINDS, spec=QWEN_TINY, tokens_per_chunk=BLOCK, host_gbps=55)
    assert marconi.settings.host_gbps == 55 and marconi.settings.tokens_per_chunk == BLOCK
    with pytest.raises(ConfigError, match="tier_policy"):
        make_policy("fifo", 4)
    # vLLM's arithmetic: bytes over the chunk rounded up to 4 KiB (Nemotron-H-8B: 3.66 GB -> 193 chunks)
    assert tier_num_chunks(3_660_996_608, 18_968_576) == 193
    assert tier_num_chunks(10_000, 4_097) == 1


# ====================================================================================== the connector's lookup
def _tier(num_chunks: int = 64, policy: str = "lru") -> tuple[EmulatedTier, RequestState]:
    layout = VllmLayout(block_size=BLOCK, num_blocks=64, group_kinds=KINDS)
    tier = EmulatedTier(layout, num_chunks, policy, QWEN_TINY)
    tokens = np.arange(4 * BLOCK + 10, dtype=np.int32)
    return tier, RequestState(0, tokens, len(tokens), BLOCK)


def _put(tier: EmulatedTier, req: RequestState, group: int, end: int) -> None:
    ctx = ReqContext(99)
    keys = tier.manager.prepare_store([make_offload_key(req.hash_at(end), group)], ctx)
    assert keys
    tier.manager.complete_store(keys)


def test_a_tier_hit_needs_the_kv_chunks_up_to_a_state_held_in_every_mamba_group() -> None:
    tier, req = _tier()
    attn, mamba = KINDS.index(ATTENTION), [g for g, k in enumerate(KINDS) if k == MAMBA]
    for end in (BLOCK, 2 * BLOCK, 3 * BLOCK):
        _put(tier, req, attn, end)
    assert tier.lookup(req, 0) == 0                       # KVs without any state: nothing to load
    for g in mamba:
        _put(tier, req, g, 2 * BLOCK)
    assert tier.lookup(req, 0) == 2 * BLOCK
    assert tier.lookup(req, BLOCK) == BLOCK               # past a GPU hit of one block: the rest
    for g in mamba[:2]:
        _put(tier, req, g, 3 * BLOCK)
    assert tier.lookup(req, 0) == 2 * BLOCK               # the deeper state is missing in one group
    _put(tier, req, mamba[2], 3 * BLOCK)
    assert tier.lookup(req, 0) == 3 * BLOCK
    _put(tier, req, mamba[0], 4 * BLOCK)                  # a state past the KVs held serves nothing more
    for g in mamba[1:]:
        _put(tier, req, g, 4 * BLOCK)
    assert tier.lookup(req, 0) == 3 * BLOCK
    gap, req2 = _tier()                                   # a missing first KV chunk: no hit at all
    for end in (2 * BLOCK, 3 * BLOCK):
        _put(gap, req2, attn, end)
    for g in mamba:
        _put(gap, req2, g, 3 * BLOCK)
    assert gap.lookup(req2, 0) == 0
    assert gap.lookup(req2, BLOCK) == 2 * BLOCK           # unless the GPU pool holds it


# ====================================================================================== the closed loop


def _engine(num_blocks: int = 24) -> VllmAlignEngine:
    layout = VllmLayout(block_size=BLOCK, num_blocks=num_blocks, group_kinds=KINDS, max_num_batched_tokens=2048,
                        block_bytes=1 << 20)
    return VllmAlignEngine(layout, QWEN_TINY, eviction="lru", alpha=0.5)


def _run(requests: list, num_chunks: int | None, policy: str = "lru", concurrency: int = 4):
    engine = _engine()
    if num_chunks is not None:
        engine.attach_tier(EmulatedTier(engine.layout, num_chunks, policy, QWEN_TINY, host_gbps=55))
    return engine, emulate_closed_loop(engine, requests, concurrency=concurrency, check=True)


@pytest.mark.parametrize("policy", ["lru", "arc", "marconi"])
def test_closed_loop_with_a_tier_serves_hits_the_pool_cannot(policy: str) -> None:
    requests = sessions(3, num_sessions=6, turns=4)
    _, gpu_only = _run(requests, None)
    engine, tiered = _run(requests, 40, policy)            # invariants (capacity, ref counts) every step
    tier = engine.tier
    assert tier is not None and tiered.tier_hits is not None
    assert sum(tiered.tier_hits) == tier.hit_tokens > 0
    assert tiered.token_hit_rate == pytest.approx(tiered.gpu_hit_rate + tiered.tier_hit_rate)
    assert tiered.token_hit_rate > gpu_only.token_hit_rate
    for rec, ext in zip(tiered.records, tiered.tier_hits):
        assert rec.hit_len + ext <= rec.input_len - 1       # at least one token is computed
        assert (rec.hit_len + ext) % BLOCK == 0             # hits end at a chunk boundary
    assert tier.bytes_loaded > 0 and tier.bytes_stored > 0
    assert tier.evictions["kv"] + tier.evictions["state"] > 0      # the tier was contended
    assert len(tier.manager.policy.held_chunks()) <= 40


def _step_s(spans: list) -> float:
    """A step-time stand-in: a fixed cost plus one per token computed (virtual seconds)."""
    return 0.01 + 1e-5 * sum(end - start for start, end in spans)


def _clocked(num_chunks: int | None, policy: str = "lru") -> VllmAlignEngine:
    """``_engine()`` with a CPU tier on the replay's clock (``_step_s``), or none."""
    engine = _engine()
    if num_chunks is not None:
        engine.attach_tier(EmulatedTier(engine.layout, num_chunks, policy, QWEN_TINY, host_gbps=55, step_time=_step_s,
                                        host_bandwidth=55e9))
    return engine


@pytest.mark.parametrize("num_chunks", [None, 40])
def test_the_open_loop_emulation_under_a_closed_loop_admitter_is_the_closed_loop(num_chunks) -> None:
    """``emulate_admitted`` drives the scheduler by the replay's own admitter; given the closed-loop
    one it serves exactly as ``emulate_closed_loop`` (records, tier hits, steps), with or without a tier."""
    from marconi.integrations.vllm.arrivals import make_admitter

    requests = sessions(3, num_sessions=6, turns=4)
    closed = emulate_closed_loop(_clocked(num_chunks), requests, concurrency=4, check=True)
    admitter = make_admitter([r.session_id for r in requests], "closed-loop", concurrency=4)
    admitted = emulate_admitted(_clocked(num_chunks), requests, admitter, _step_s, check=True)
    assert [tuple(r) for r in admitted.records] == [tuple(r) for r in closed.records]
    assert admitted.tier_hits == closed.tier_hits and admitted.num_steps == closed.num_steps
    assert admitted.token_hit_rate > 0


def test_poisson_arrivals_on_the_virtual_clock() -> None:
    """Open-loop arrivals: a request is admitted only once the virtual clock (the steps' modelled
    times) reaches its arrival, and a tier's clock is the loop's; slower arrivals leave the pool
    emptier (fewer requests in flight at once) than a burst. A tier without a clock is refused."""
    from marconi.integrations.vllm.arrivals import make_admitter

    requests = sessions(5, num_sessions=6, turns=3)
    runs = {}
    for rate in (0.5, 1000.0):
        engine = _clocked(40, "arc")
        admitter = make_admitter([r.session_id for r in requests], "poisson", rate=rate, seed=3)
        runs[rate] = (emulate_admitted(engine, requests, admitter, _step_s, check=True), engine.tier.now, admitter)
    slow_run, slow_end, slow_adm = runs[0.5]
    fast_run, fast_end, _ = runs[1000.0]
    assert slow_end >= max(slow_adm.times) > fast_end          # the clock waited for the last arrival
    assert sum(p for p in slow_run.num_preemptions) <= sum(p for p in fast_run.num_preemptions)
    assert slow_run.num_steps != fast_run.num_steps
    engine = _engine()
    engine.attach_tier(EmulatedTier(engine.layout, 40, "lru", QWEN_TINY, host_gbps=55))
    with pytest.raises(ConfigError, match="step_time"):
        emulate_admitted(engine, requests, make_admitter([r.session_id for r in requests], "poisson", rate=1.0),
                         _step_s)


def test_an_empty_tier_changes_nothing() -> None:
    requests = sessions(5, num_sessions=4, turns=3)
    _, gpu_only = _run(requests, None)
    _, empty = _run(requests, 0)
    assert [tuple(r) for r in empty.records] == [tuple(r) for r in gpu_only.records]
    assert sum(empty.tier_hits or [1]) == 0 and empty.num_steps == gpu_only.num_steps


# ====================================================================================== against vLLM
@slow
def test_emulated_tier_follows_vllms_connector_in_the_replay(tmp_path) -> None:
    """The replay's tier records carry the emulation on the same requests, pool, tier and closed
    loop, and it is exact: each request's GPU and tier hit (``sim_requests_differing`` 0), under
    each of vLLM's policies and Marconi's (docs/vllm-tiers.md, "Where they differed, and why")."""
    from marconi.integrations.vllm.replay.run import ReplayConfig, run_replay, tier_table

    python = vllm_python()
    config = ReplayConfig(vllm_python=python, trace="swe-sample", model="nemotron-h-8b", capacity="0.05x",
                          cpu_tier="0.5x", concurrency=8, num_requests=48, policies=("lru",),
                          tier_policies=("lru", "arc", "marconi"))
    records = run_replay(config, work_dir=tmp_path, show_bars=False)
    assert [r["tier_policy"] for r in records] == ["lru", "arc", "marconi"]
    for rec in records:
        assert rec["tier_hit_tokens"] > 0
        assert rec["sim_token_hit_rate"] == pytest.approx(rec["token_hit_rate"], abs=1e-12)
        assert rec["sim_tier_hit_rate"] == pytest.approx(rec["tier_hit_rate"], abs=1e-12)
        per = rec["per_request"]
        differing = sum((g, t) != (sg, st) for g, t, sg, st in zip(
            per["gpu_hit_tokens"], per["tier_hit_tokens"], per["sim_gpu_hit_tokens"], per["sim_tier_hit_tokens"]))
        assert rec["sim_requests_differing"] == differing == 0, rec["arm"]
    assert "requests differing" in tier_table(records) and f"0/{records[0]['num_requests']}" in tier_table(records)


@slow
def test_emulated_tier_follows_vllms_connector_under_poisson_arrivals(tmp_path) -> None:
    """Open-loop arrivals: the emulation takes the worker's admitter and step-time clock, and each
    request's GPU and tier hit equals vLLM's (``sim_requests_differing`` 0); before, open-loop tier
    records had no emulation at all."""
    from marconi.integrations.vllm.replay.run import ReplayConfig, run_replay

    config = ReplayConfig(vllm_python=vllm_python(), trace="swe-sample", model="nemotron-h-8b", capacity="0.05x",
                          cpu_tier="0.25x", rate=1.0, num_requests=48, policies=("lru",), tier_policies=("lru", "arc"))
    records = run_replay(config, work_dir=tmp_path, show_bars=False)
    for rec in records:
        assert rec["arrivals"] == "poisson" and rec["sim_models_concurrency"] is True
        assert rec["tier_hit_tokens"] > 0
        assert rec["sim_requests_differing"] == 0, rec["arm"]
        assert rec["sim_token_hit_rate"] == pytest.approx(rec["token_hit_rate"], abs=1e-12)


def test_the_simulator_system_takes_a_tier() -> None:
    """``vllm-align:cpu_tier=…,tier_policy=…``: the tier behind the simulator's cache contract, sized
    as vLLM sizes it, serving what a pool of a few blocks cannot; bad parameters name themselves."""
    from marconi.sim.systems import make_system

    requests = sessions(7, num_sessions=5, turns=3)
    hits = {}
    for name in ("vllm-align:blocks=30", "vllm-align:blocks=30,cpu_tier=2GB,tier_policy=arc"):
        cache = make_system(name).build("nemotron-h-8b", 0)
        hits[name] = sum(cache.process(r.input_tokens, r.output_tokens).usable_hit_len for r in requests)
        if "cpu_tier" in name:
            tier = cache.engine.tier
            assert tier is not None and tier.policy_name == "arc"
            assert tier.manager.num_chunks == tier_num_chunks(2 * 10**9, cache.layout.block_bytes)
            assert tier.hit_tokens > 0
            tier.manager.check_invariants()
    assert hits["vllm-align:blocks=30,cpu_tier=2GB,tier_policy=arc"] > hits["vllm-align:blocks=30"]
    for bad, word in (("vllm-align:tier_policy=arc", "cpu_tier"), ("vllm-align:cpu_tier=lots", "cpu_tier"),
                      ("vllm-align:cpu_tier=1GB,tier_policy=fifo", "tier_policy")):
        with pytest.raises(ConfigError, match=word):
            make_system(bad)


def test_the_simulator_system_lays_out_vllms_own_block_for_the_bundled_models() -> None:
    """``marconi simulate --systems vllm-align`` on a model the replay bundles uses the block vLLM
    builds for it (Nemotron-H's float32 SSM state doubles the page the bf16 spec derives: 1,152
    tokens, not 544), so a --capacity or cpu_tier= is the replay's number of blocks and chunks (an
    audit saw 49.0% where the replay of the same trace and pool read 46.1%); block= still wins, and a
    model vLLM's replay does not bundle keeps the derived block."""
    from marconi.integrations.vllm.replay.configs import VLLM_BLOCK_SIZES
    from marconi.sim.systems import make_system

    for model, block in VLLM_BLOCK_SIZES.items():
        layout = make_system("vllm-align").build(model, 5e9).layout
        assert layout.block_size == block, model
        assert make_system("vllm-align:block=544").build(model, 5e9).layout.block_size == 544
    tier = make_system("vllm-align:cpu_tier=2GB").build("nemotron-h-8b", 1e9)
    assert tier.engine.tier.manager.num_chunks == tier_num_chunks(2 * 10**9, tier.layout.block_bytes) == 105
    assert "paper-7b" not in VLLM_BLOCK_SIZES
    assert make_system("vllm-align").build("paper-7b", 5e9).layout.block_size == layout_for_spec(
        get_model("paper-7b"), num_blocks=2).block_size


def test_the_simulator_systems_tier_rule_reaches_the_tier_policy() -> None:
    """``tier_rule=`` is the rule of the emulated tier policy (the default without it: ``adaptive``,
    the rule chosen online, starting from ``lru``); it changes the tier's hits; a label the tier
    cannot apply, or one without tier_policy=marconi, is refused."""
    from marconi.integrations.vllm.tier_settings import DEFAULT_RULE
    from marconi.sim.systems import make_system

    requests = sessions(7, num_sessions=5, turns=3)
    # 544-token blocks, 33 chunks: contended; without cold insertion, whose stamps make lru and a2m tie
    # on these sessions
    base = "vllm-align:block=544,blocks=60,cpu_tier=300MB,tier_policy=marconi,tier_cold_insert=0"
    held: dict[str, int] = {}
    for name, label in ((base, DEFAULT_RULE), (base + ",tier_rule=lru", "lru"), (base + ",tier_rule=a2m", "a2m")):
        system = make_system(name)
        cache = system.build("nemotron-h-8b", 0)
        policy = cache.engine.tier.manager.policy
        assert (policy.chooser is not None) == (label == DEFAULT_RULE == "adaptive")
        assert policy.settings.rule.label() == (label if policy.chooser is None else "lru")
        for r in requests:
            cache.process(r.input_tokens, r.output_tokens)
        held[label] = cache.engine.tier.hit_tokens
    assert "tier_rule=a2m" in make_system(base + ",tier_rule=a2m").describe()["admission"]
    assert "tier_rule=adaptive" in make_system(base + ",tier_rule=adaptive").describe()["admission"]
    assert held["lru"] != held["a2m"]
    for bad, word in ((base + ",tier_rule=zz", "tier_rule"), (base + ",tier_rule=a1t", "tier_rule"),
                      ("vllm-align:cpu_tier=1GB,tier_policy=arc,tier_rule=lru", "tier_policy=marconi")):
        with pytest.raises(ConfigError, match=word):
            make_system(bad)


def test_store_threshold_holds_back_first_offers_in_the_loop_and_the_system() -> None:
    """vLLM's ``store_threshold`` in the emulation (checked call for call against vLLM's manager in
    ``tests/vllm_tier/cases.py``): a chunk offered once is not stored, so a session's second turn
    finds less in the tier; ``vllm-align:…,store_threshold=N`` reaches the tier; 1 is refused."""
    from marconi.sim.systems import make_system

    requests = sessions(3, num_sessions=6, turns=4)
    engine, plain = _run(requests, 40, "lru")
    filtered_engine, filtered = _run(requests, 40, "lru:store_threshold=2")
    assert filtered_engine.tier.manager.stores_skipped > 0 and engine.tier.manager.stores_skipped == 0
    assert filtered_engine.tier.bytes_stored < engine.tier.bytes_stored
    assert filtered_engine.tier.counters()["tier_stores_skipped"] == filtered_engine.tier.manager.stores_skipped
    assert sum(filtered.tier_hits or ()) != sum(plain.tier_hits or ())
    system = make_system("vllm-align:blocks=60,cpu_tier=2GB,tier_policy=arc,store_threshold=3")
    assert "store_threshold=3" in system.describe()["admission"]
    tier = system.build("nemotron-h-8b", 0).engine.tier
    assert tier.policy_name == "arc:store_threshold=3" and tier.manager.store_threshold == 3
    for bad, word in (("vllm-align:store_threshold=2", "cpu_tier"),
                      ("vllm-align:cpu_tier=1GB,store_threshold=1", "store_threshold must be")):
        with pytest.raises(ConfigError, match=word):
            make_system(bad)


def test_a_request_resumed_with_a_shorter_tier_hit_offers_its_chunks_again() -> None:
    """vLLM's ``update_state_after_alloc`` sets the next chunk to store to the loaded hit's end (it
    does not take the larger): a request preempted after offering chunk 3 (held back by the filter,
    offered once) and resumed with a tier hit of two chunks offers chunk 3 again, which the filter
    now stores. (The replay of issue 34: vLLM stored the re-offered chunk, the emulation did not.)"""
    tier, req = _tier(policy="lru:store_threshold=2")
    attn, mamba = KINDS.index(ATTENTION), [g for g, k in enumerate(KINDS) if k == MAMBA]
    other = ReqContext(99)
    held_keys = [make_offload_key(req.hash_at(e), attn) for e in (BLOCK, 2 * BLOCK)]
    held_keys += [make_offload_key(req.hash_at(2 * BLOCK), g) for g in mamba]
    for _ in range(2):                                  # offered twice: stored
        tier.manager.complete_store(tier.manager.prepare_store(held_keys, other) or [])
    third = make_offload_key(req.hash_at(3 * BLOCK), attn)
    tier.end_step([(req, 3 * BLOCK)])                   # computes 3 chunks: the third is offered once
    assert tier.manager.lookup(third) == 0 and tier.manager.counts[third] == 1
    assert tier.next_to_store(req) == 3
    tier.dropped(req)                                   # preempted; resumed: 2 chunks from the tier
    assert tier.lookup(req, 0) == 2 * BLOCK
    tier.load(req, 0, 2 * BLOCK, first=False)
    assert tier.next_to_store(req) == 2
    req.num_computed_tokens = 2 * BLOCK
    tier.end_step([(req, BLOCK)])                       # recomputes chunk 3: offered again, stored
    assert tier.manager.counts[third] == 2 and tier.manager.lookup(third) != 0


def test_with_a_clock_a_slow_link_holds_loads_for_several_steps() -> None:
    """The replay's clock (a step-time model and a host link): a load lands after its bytes cross the
    link, so on a slow link requests wait more steps for their loads; the invariants hold throughout."""
    requests = sessions(3, num_sessions=6, turns=4)
    steps = {}
    for bandwidth in (1e15, 1e8):
        engine = _engine()
        engine.attach_tier(EmulatedTier(engine.layout, 40, "lru", QWEN_TINY, step_time=lambda spans: 1e-3,
                                        host_bandwidth=bandwidth))
        loop = emulate_closed_loop(engine, requests, concurrency=4, check=True)
        assert sum(loop.tier_hits or ()) > 0
        steps[bandwidth] = loop.num_steps
    assert steps[1e8] > steps[1e15] + 10             # 1 MiB chunks at 100 MB/s: ~10 ms a chunk, 1 ms a step
    with pytest.raises(ConfigError, match="clock"):
        EmulatedTier(_engine().layout, 4, "lru", QWEN_TINY, step_time=lambda spans: 1e-3)


def test_a_load_past_a_gpu_hit_keeps_only_the_loads_state_in_each_mamba_group() -> None:
    """vLLM's ``allocate_new_computed_blocks``: what a Mamba group skips counts the tokens the tier
    loads past the GPU hit, so the group holds one block, the state at the load's end, and the hit's
    own state block stays in the pool. (The emulation took both, one block per Mamba group more than
    vLLM: at prompt-tree-synthetic on Qwen3-Next, pool 0.05x, tier 0.25x, a loaded request could then
    never fit its rest and the replay's emulation spun for good where vLLM went on.)"""
    engine = _engine(num_blocks=32)
    tier = EmulatedTier(engine.layout, 64, "lru", QWEN_TINY)
    engine.attach_tier(tier)
    attn, mamba = KINDS.index(ATTENTION), [g for g, k in enumerate(KINDS) if k == MAMBA]
    tokens = np.arange(1, 5 * BLOCK + 11, dtype=np.int32)
    # the GPU pool: a request on the first two blocks and one token more caches its state at 2 blocks
    first = SimpleNamespace(session_id=0, input_tokens=tokens[: 2 * BLOCK + 1], output_tokens=np.ones(1, np.int32))
    emulate_closed_loop(engine, [first], concurrency=1, check=True)
    req = RequestState(100, tokens, len(tokens), engine.layout.hash_block_size)
    engine.new_step_starts()                            # the next scheduling step
    hit_blocks, hit, _ = engine.get_computed_blocks(req)
    assert hit == 2 * BLOCK
    # the tier: the KV chunks and every Mamba group's state up to three blocks (the first request
    # stored its own chunks already)
    keys = [make_offload_key(req.hash_at(end), attn) for end in (BLOCK, 2 * BLOCK, 3 * BLOCK)]
    keys += [make_offload_key(req.hash_at(3 * BLOCK), g) for g in mamba]
    tier.manager.complete_store(tier.manager.prepare_store(keys, ReqContext(99)) or [])
    ext = tier.lookup(req, hit)
    assert ext == BLOCK
    hit_state = hit_blocks[mamba[0]][-1]
    assert engine.try_allocate_slots(req, 0, hit, hit_blocks, full_sequence_must_fit=True, delay_cache=True,
                                     num_external=ext)
    null = engine.pool.null
    for g in mamba:
        held = engine.managers[g].req_to_blocks[req.rid]
        assert len(held) == 3 and held[:2] == [null, null] and held[2] is not null
    assert hit_state not in engine.managers[mamba[0]].req_to_blocks[req.rid] and hit_state.ref_cnt == 0
    assert len([b for b in engine.managers[attn].req_to_blocks[req.rid] if b is not null]) == 3
    engine.check_invariants()


def test_a_loaded_request_that_cannot_go_on_alone_is_an_error_not_a_spin() -> None:
    """A step that schedules nothing, preempts nothing and has nothing in transit is the next step
    again: the emulation says so (naming the capacity) where it used to loop for good. The stall is
    made by hand: the pool's free blocks are taken while a request's load is in flight."""
    engine = _engine(num_blocks=32)
    tier = EmulatedTier(engine.layout, 64, "lru", QWEN_TINY)
    engine.attach_tier(tier)
    tokens = np.arange(1, 5 * BLOCK + 11, dtype=np.int32)
    first = SimpleNamespace(session_id=0, input_tokens=tokens[: 3 * BLOCK + 1], output_tokens=np.ones(1, np.int32))
    emulate_closed_loop(engine, [first], concurrency=1, check=True)      # stores 3 blocks' chunks in the tier
    engine = _engine(num_blocks=32)                                     # an empty GPU pool, the same tier
    engine.attach_tier(tier)
    sched = VllmAlignScheduler(engine)
    sched.add(tokens, np.ones(4, np.int32))
    sched.step()                                                        # admitted with a load from the tier
    assert len(sched.loading) == 1 and not sched.running
    engine.pool.get_new_blocks(engine.pool.num_free)                    # no room for the rest, and no one to free it
    with pytest.raises(ConfigError, match="loaded .* from the CPU tier and cannot fit the rest.*raise the capacity"):
        for _ in range(10):
            sched.step()


def test_a_preempted_requests_stores_in_transit_land_before_the_next_forward_pass() -> None:
    """vLLM's connector flushes a preempted request's store jobs (``jobs_to_flush``): its worker waits
    for them before the forward pass, so they land in that step, and the step's loads start after
    them. Without the wait a later lookup found the chunks still being written and skipped the
    request (Qwen3-Next, doc-QA, pool 0.05x, tier 0.25x: ARC emulated at 18.6% where vLLM gave 15.1%;
    with it the policy's every call equals vLLM's, step by step)."""
    layout = VllmLayout(block_size=BLOCK, num_blocks=64, group_kinds=KINDS, block_bytes=1 << 20)
    attn = KINDS.index(ATTENTION)
    tokens = np.arange(1, 4 * BLOCK + 10, dtype=np.int32)

    def stored_then(preempt: bool) -> tuple[int, float]:
        tier = EmulatedTier(layout, 64, "lru", QWEN_TINY, step_time=lambda spans: 1e-3, host_bandwidth=1e8)
        req, other = RequestState(0, tokens, len(tokens), BLOCK), RequestState(1, tokens + 7, len(tokens), BLOCK)
        tier.end_step([(req, 2 * BLOCK)])               # two attention chunks go out: ~21 ms on this link
        key = make_offload_key(req.hash_at(BLOCK), attn)
        assert tier.manager.lookup(key) == HIT_PENDING
        if preempt:
            tier.dropped(req)
        tier.end_step([(other, BLOCK)])                 # a 1 ms step of another request
        return tier.manager.lookup(key), tier.now

    state, now = stored_then(preempt=False)
    assert state == HIT_PENDING and now < 0.01
    state, now = stored_then(preempt=True)
    assert state == HIT and now > 0.02                  # the step waited for the stores, then ran


def test_a_request_whose_hit_chunks_another_request_is_loading_waits_for_that_load() -> None:
    """vLLM's connector delays a lookup whose hit chunks are being loaded for another request
    (``_chunks_being_loaded``): the request is skipped, and the next in line may go first. (Without
    it, at agent-synthetic on Nemotron-H-8B, pool 0.05x, tier 0.25x, ARC was emulated at 61.2%
    where vLLM gave 60.0%; with it the two agree request by request.)"""
    layout = VllmLayout(block_size=BLOCK, num_blocks=64, group_kinds=KINDS, block_bytes=1 << 20)
    tier = EmulatedTier(layout, 64, "lru", QWEN_TINY, step_time=lambda spans: 1e-3, host_bandwidth=1e8)
    attn, mamba = KINDS.index(ATTENTION), [g for g, k in enumerate(KINDS) if k == MAMBA]
    tokens = np.arange(1, 4 * BLOCK + 10, dtype=np.int32)
    first, second = RequestState(0, tokens, len(tokens), BLOCK), RequestState(1, tokens.copy(), len(tokens), BLOCK)
    for end in (BLOCK, 2 * BLOCK):
        _put(tier, first, attn, end)
    for g in mamba:
        _put(tier, first, g, 2 * BLOCK)
    assert tier.lookup(first, 0) == tier.lookup(second, 0) == 2 * BLOCK
    tier.load(first, 0, 2 * BLOCK, first=True)
    assert tier.lookup(second, 0) is None               # its chunks are in flight for the first request
    tier.end_step([])                                   # nothing runs: the clock goes to the load's end
    assert tier.landed(first) and tier.lookup(second, 0) == 2 * BLOCK


def test_a_finished_requests_store_in_transit_lands_before_its_blocks_are_reused() -> None:
    """vLLM's connector watches the GPU blocks a finished request's stores still read: a step that
    hands one of them to a request waits for the store first (``jobs_to_flush``). A running
    request's stores are watched only once it finishes; a step handing out other blocks waits for
    nothing."""
    layout = VllmLayout(block_size=BLOCK, num_blocks=64, group_kinds=KINDS, block_bytes=1 << 20)
    attn = KINDS.index(ATTENTION)
    tokens = np.arange(1, 4 * BLOCK + 10, dtype=np.int32)

    def reused(handed: set[int], finish: bool = True) -> int:
        tier = EmulatedTier(layout, 64, "lru", QWEN_TINY, step_time=lambda spans: 1e-3, host_bandwidth=1e8)
        out: set[int] = set()
        tier.bind(lambda req: [[0], [0], [0], [5, 6, 7]] if req.rid == 0 else [[0]] * 4,
                  lambda: (out.copy(), out.clear())[0])
        req, other = RequestState(0, tokens, len(tokens), BLOCK), RequestState(1, tokens + 7, len(tokens), BLOCK)
        tier.end_step([(req, 2 * BLOCK)])               # chunks 1 and 2 go out, read from blocks 5 and 6
        if finish:
            tier.finished(req)
        out.update(handed)
        tier.end_step([(other, BLOCK)])                 # a 1 ms step handing out `handed`
        return tier.manager.lookup(make_offload_key(req.hash_at(BLOCK), attn))

    assert reused({6}) == HIT                           # the store was waited for
    assert reused({9}) == HIT_PENDING                   # another block: no wait
    assert reused({6}, finish=False) == HIT_PENDING     # still running: not yet watched


def test_the_tier_tables_trace_takes_its_own_parameters_beside_a_request_count(tmp_path) -> None:
    """``--traces NAME[:N]``: a trailing whole number is the request count; a trace's own parameters
    keep their colons (``mooncake:files=PATH`` once failed with "invalid literal for int()")."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "benchmarks" / "vllm_tier_table.py"
    out = tmp_path / "t.jsonl"
    proc = subprocess.run([sys.executable, str(bench), "--models", "nemotron-h-8b", "--traces",
                           "chat-synthetic:seed=1:12,chat-synthetic:seed=2", "--num-requests", "5", "--concurrency", "4",
                           "--tier-policies", "none", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = sorted({(r["trace"], r["num_requests_asked"]) for r in map(json.loads, out.read_text().splitlines())})
    assert got == [("chat-synthetic:seed=1", 12), ("chat-synthetic:seed=2", 5)]


def test_the_tier_rules_bench_refuses_a_trace_it_cannot_build_in_one_line() -> None:
    """``vllm_tier_rules.py --traces lmsys`` (its files not given) or a misspelt name stopped with a
    traceback; it now says which --traces entry and why, as a usage error."""
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "benchmarks" / "vllm_tier_rules.py"
    for trace, said in (("lmsys", "--traces lmsys: lmsys: LMSys-Chat-1M cannot be redistributed"),
                        ("swe-sampel", "--traces swe-sampel: trace 'swe-sampel' is neither a file nor a catalog")):
        proc = subprocess.run([sys.executable, str(bench), "--traces", trace], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 2 and said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
