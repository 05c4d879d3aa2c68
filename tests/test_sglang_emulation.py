"""``sglang-unified``: the emulation of SGLang 0.5.23's hybrid radix cache, alone and against the real one.

The unit tests need no SGLang: they replay the hand-made trace of tests/test_sglang_driver.py, whose
answers SGLang's own cache gave, and check the rules the emulation takes from SGLang's code (split
pools, tombstones, the Mamba walk, locks, KV conservation, extra_buffer's checkpoint positions). The
agreement test runs the bench's driver on SGLang's real ``UnifiedRadixCache`` and the emulation on the
same requests and pools, and compares them request by request (it needs ``.venv-sglang``; under
``MARCONI_REQUIRE_SGLANG=1`` a missing environment fails).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from marconi.core.model import get_model
from marconi.core.registry import ConfigError
from marconi.integrations.sglang.emulate import UnifiedRadixEmulator, emulator_for
from marconi.sim.replay import simulate_system
from marconi.sim.systems import SYSTEMS, make_system
from marconi.workloads.trace.schema import Request
from marks import slow
from sglang_env import run_in_sglang

A = list(range(1, 101))
OUT = list(range(1000, 1010))


def _serve(emu: UnifiedRadixEmulator, prompt: list[int], output: list[int]) -> tuple[int, int]:
    m = emu.serve(prompt, output)
    emu.check_invariants()
    return m.hit_len, m.kv_hit_len - m.hit_len


def test_hand_made_trace_gives_sglangs_answers() -> None:
    """The trace of tests/test_sglang_driver.py, with the hits and state counts SGLang's real cache gave."""
    emu = UnifiedRadixEmulator(1000, 8)
    rows = [_serve(emu, A, OUT)]                                           # cold: states at 100 and 109
    states = [emu.tree_states]
    for prompt, output in ((A[:50] + list(range(2000, 2050)), [7]),        # shares 50 KVs, no state there
                           (A + list(range(3000, 3020)), [8]),            # the prefill state at 100
                           (A + OUT + [5], [9]),                          # the finish state at 109
                           (A, OUT)):                                     # capped at 99: nothing at or below
        rows.append(_serve(emu, prompt, output))
        states.append(emu.tree_states)
    assert rows == [(0, 0), (0, 50), (100, 0), (109, 0), (0, 99)]
    assert states == [2, 3, 4, 5, 5]
    assert emu.kv_free + emu.tree_kv == 1000


def test_a_pool_that_must_evict_conserves_kv() -> None:
    emu = UnifiedRadixEmulator(130, 8)
    for k in range(6):
        _serve(emu, [10000 * (k + 1) + i for i in range(60)], [1, 2, 3])
    assert emu.counters["evicted:kv-leaf"] > 0
    assert emu.kv_free + emu.tree_kv == 130


def test_mamba_pressure_tombstones_an_inner_state_and_its_kv_then_matches_nothing() -> None:
    """Two slots per request (its own + the prefill copy) on a 3-slot pool: the Mamba walk takes the
    least recent state; an inner node keeps its KV without a state, so a request that ends there
    finds its KV but resumes from nothing (the branch-point problem)."""
    emu = UnifiedRadixEmulator(10_000, 3)
    _serve(emu, A, [])                         # state at 100 (the prefill copy); the request's slot freed
    assert _serve(emu, A + list(range(200, 250)), []) == (100, 0)   # state at 150: the one at 100 is inner
    _serve(emu, list(range(7000, 7050)), [])   # needs 2 slots, 1 free: the least recent state (100) goes
    assert emu.counters["evicted:state-tombstone"] == 1 and emu.counters["evicted:state-leaf"] == 0
    assert _serve(emu, A + [7], [1]) == (0, 100)


def test_locked_state_is_not_a_victim() -> None:
    emu = UnifiedRadixEmulator(10_000, 2)
    _serve(emu, A, [])
    req = emu.admit(A + [5])                   # locks the state at 100 (its hit) and takes the last slot
    assert req.match.hit_len == 100
    with pytest.raises(RuntimeError, match="Mamba pool"):
        emu.prefill_done(req)                  # the copy needs a slot; the only state is locked


def test_extra_buffer_keeps_states_on_the_grid_only() -> None:
    """extra_buffer (modelled from SGLang's scheduler code): the prefill's state at the last multiple of
    the grid inside the extend, decode states at multiples of lcm(grid, track_interval); the finish keys
    only up to the last such state."""
    emu = UnifiedRadixEmulator(10_000, 8, buffer="extra_buffer", chunk_size=64, track_interval=128)
    prompt = list(range(1, 301))               # 300 tokens: prefill state at 256
    output = list(range(5000, 5100))           # committed 399: decode crossed 384
    assert _serve(emu, prompt, output) == (0, 0)
    assert _serve(emu, prompt + output[:90], [1]) == (384, 0)
    assert _serve(emu, prompt[:280] + [9], [1]) == (256, 24)


def test_marconi_strategy_runs_on_the_emulated_nodes() -> None:
    spec = get_model("paper-7b")
    emu = emulator_for(spec, 400, 4, policy="marconi", policy_config={"alpha": 1.0})
    rng = np.random.default_rng(0)
    base = list(range(1, 61))
    for _ in range(40):
        n = int(rng.integers(5, 60))
        _serve(emu, base[:n] + rng.integers(100, 10_000, size=int(rng.integers(1, 80))).tolist(), [1, 2])
    assert emu.counters["evicted:kv-leaf"] + emu.counters["evicted:state-leaf"] > 0


def test_the_system_is_registered_and_checks_its_options() -> None:
    assert "sglang-unified" in SYSTEMS.names()
    system = make_system("sglang-unified:eviction=marconi(alpha=0.5),kv_tokens=5000,mamba_slots=10")
    assert system.record_fields()["eviction"] == "marconi-radix(alpha=0.5,efficiency=total)"
    assert make_system("sglang-unified:eviction=marconi,alpha=adaptive").record_fields()["eviction"].startswith(
        "marconi-radix(alpha=adaptive")
    for bad in ("sglang-unified:buffer=some_buffer", "sglang-unified:page=16",
                "sglang-unified:eviction=lfu", "sglang-unified:alpha=1",
                "sglang-unified:eviction=marconi(alpha=1),alpha=2", "sglang-unified:eviction=marconi(alpha=-1)",
                "sglang-unified:mamba_slots=1"):
        with pytest.raises(ConfigError):
            make_system(bad)


@pytest.mark.parametrize("mode", ["sequential", "event"])
def test_the_simulator_replays_through_it(mode: str) -> None:
    rng = np.random.default_rng(1)
    trace, histories = [], {}
    for i in range(60):                        # 8 multi-turn sessions: a turn extends the last prompt + reply
        s = int(rng.integers(0, 8))
        prompt = histories.get(s, []) + rng.integers(1, 30_000, size=int(rng.integers(10, 60))).tolist()
        output = rng.integers(1, 30_000, size=int(rng.integers(2, 20))).tolist()
        trace.append(Request(s, 0, float(i), prompt, output))
        histories[s] = prompt + output
    spec = get_model("paper-7b")
    capacity = 3000 * spec.kv_bytes_per_token + 6 * spec.ssm_checkpoint_bytes
    result = simulate_system(trace, "sglang-unified", spec, capacity, mode=mode)
    assert result.num_requests == 60 and 0 < result.stats.token_hit_rate < 1
    if mode == "sequential":                       # the same as driving the emulator by hand
        kv, slots = make_system("sglang-unified").pools(spec, capacity)
        emu = UnifiedRadixEmulator(kv, slots)
        hits = [emu.serve(r.input_tokens, r.output_tokens).hit_len for r in trace]
        assert result.reused_len.tolist() == hits


def test_a_request_the_pool_cannot_hold_makes_the_point_infeasible() -> None:
    """As for vllm-align: ConfigError (a sweep reports the point and keeps the others)."""
    spec = get_model("paper-7b")
    cache = make_system("sglang-unified:kv_tokens=100,mamba_slots=4").build(spec, 1.0)
    cache.process(list(range(1, 90)), [1, 2])
    cache.check_invariants()
    with pytest.raises(ConfigError, match="sglang-unified: SGLang's KV pool"):
        cache.process(list(range(1, 200)), [1, 2])


_AGREEMENT = r"""
import json
from marconi.core.model import get_model
from marconi.lab.sglang_bench import run_policy
from marconi.integrations.sglang.replay import pool_sizes
from marconi.sim.replay import working_set_bytes
from marconi.units import parse_capacity
from marconi.workloads.source import load_trace

out = []
for name, n, capacity, policies in (("swe-sample", None, "0.05x", ("lru", "marconi:alpha=0.5")),
                                    ("sharegpt", 500, "0.05x", ("lru", "marconi:alpha=0.5", "marconi:alpha=adaptive"))):
    trace = list(load_trace(name, n))
    spec = get_model("paper-7b")
    budget = parse_capacity(capacity).resolve(working_set_bytes(trace, spec))
    kv, slots = pool_sizes(spec, budget, max(len(r.input_tokens) + len(r.output_tokens) for r in trace))
    for policy in policies:
        r = run_policy(trace, policy, kv, slots, "paper-7b")
        out.append({k: r[k] for k in ("policy", "token_hit_rate", "sim_token_hit_rate", "sim_requests_differing",
                                      "num_requests", "counters")} | {"trace": name})

# Randomised multi-turn replays on small pools: branches, repeats, tombstones, both walks under pressure.
import numpy as np
from marconi.lab.sglang_bench import parse_policy
from marconi.integrations.sglang.emulate import emulator_for
from marconi.integrations.sglang.replay import RadixReplay
spec = get_model("paper-7b")
for seed in (0, 1):
    rng = np.random.default_rng(seed)
    kv, slots = int(rng.integers(1500, 3000)), int(rng.integers(4, 10))
    heads = [rng.integers(1, 50000, size=int(rng.integers(20, 200))).tolist() for _ in range(3)]
    history, reqs = {}, []
    for i in range(150):
        s = int(rng.integers(0, 12))
        if s not in history or rng.random() < 0.15:
            base = heads[int(rng.integers(0, 3))][: int(rng.integers(5, 200))]
        else:
            h = history[s]
            base = h[: int(rng.integers(len(h) // 2, len(h) + 1))] if rng.random() < 0.3 else h
        prompt = (base + rng.integers(1, 50000, size=int(rng.integers(1, 60))).tolist())[: kv // 2]
        output = rng.integers(1, 50000, size=int(rng.integers(0, 30))).tolist()
        reqs.append((prompt, output))
        history[s] = prompt + output
    for policy in ("lru", "marconi:alpha=2,efficiency=marginal"):
        name, config = parse_policy(policy, "paper-7b")
        real = RadixReplay(kv, slots, policy=name, policy_config=config)
        emu = emulator_for(spec, kv, slots, policy=name, policy_config=config)
        differ = 0
        for prompt, output in reqs:
            m = emu.serve(prompt, output)
            differ += real.serve(prompt, output) != (m.hit_len, m.kv_hit_len - m.hit_len)
        real.sanity_check()
        emu.check_invariants()
        c = dict(getattr(real.strategy, "counters", {}))
        out.append({"trace": f"random-{seed}", "policy": policy, "sim_requests_differing": differ,
                    "token_hit_rate": real.token_hit_rate, "num_requests": len(reqs), "counters": c,
                    "sim_token_hit_rate": real.token_hit_rate if not differ else None,
                    "sim_counters": {k: v for k, v in emu.counters.items() if k in c},
                    "free": [int(real.allocator.available_size()), emu.kv_free,
                             int(real.req_pool.mamba_allocator.available_size()), emu.mamba_free]})
print(json.dumps(out))
"""


@slow
def test_emulation_matches_sglangs_real_cache_request_by_request() -> None:
    rows = json.loads(run_in_sglang(_AGREEMENT, timeout=600).stdout.strip().splitlines()[-1])
    assert len(rows) == 9
    for r in rows:
        assert r["sim_requests_differing"] == 0, r
        assert abs(r["token_hit_rate"] - r["sim_token_hit_rate"]) < 1e-12, r
    for r in rows[5:]:                                   # the random replays: the same victims, the same free slots
        if r["policy"] != "lru":
            assert r["counters"] == r["sim_counters"] | {k: v for k, v in r["counters"].items()
                                                         if k.startswith("hit_tokens")}, r
        assert r["free"][0] == r["free"][1] and r["free"][2] == r["free"][3], r
    assert any(r["counters"].get("evicted:state-tombstone") for r in rows)   # the Mamba walk was exercised
