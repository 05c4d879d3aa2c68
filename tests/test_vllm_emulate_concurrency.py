"""vllm-align with requests in flight: the scheduler loop (:mod:`marconi.integrations.vllm.emulate.scheduler`).

Invariants of vLLM's loop as the emulation runs it: blocks held by running requests are never
evicted; a request never resumes from what another has not computed yet; preemption frees and
re-queues; concurrency 1 is exactly the one-at-a-time engine; the same input gives the same run.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from marconi.core.model import ModelSpec
from marconi.core.registry import ConfigError
from marconi.integrations.common.bench import select_requests
from marconi.integrations.vllm.emulate.engine import VllmAlignEngine
from marconi.integrations.vllm.layout import VllmLayout, layout_for_spec
from marconi.integrations.vllm.emulate.scheduler import VllmAlignScheduler, emulate_closed_loop
from marconi.integrations.vllm.models import PRESETS
from marconi.integrations.vllm.policy import ATTENTION, MAMBA
from marconi.integrations.vllm.replay.run import model_dir

QWEN_TINY = ModelSpec.from_hf_config({"model_type": "qwen3_next", **PRESETS["qwen3_next-tiny"][1],
                                      "torch_dtype": "bfloat16"}, name="qwen3_next-tiny")
KINDS = (MAMBA, MAMBA, MAMBA, ATTENTION)


def _engine(num_blocks: int, eviction: str = "lru", **layout: object) -> VllmAlignEngine:
    options = {"max_num_batched_tokens": 2048, **layout}
    return VllmAlignEngine(VllmLayout(block_size=384, num_blocks=num_blocks, group_kinds=KINDS, **options),
                           QWEN_TINY, eviction=eviction, alpha=0.5)


def sessions(seed: int, num_sessions: int, turns: int) -> list[SimpleNamespace]:
    """Multi-turn sessions interleaved: each turn's prompt is the previous prompt + output + a new turn."""
    rng = np.random.default_rng(seed)
    shared = rng.integers(0, 32000, 700)                # a common system prompt
    history = [np.concatenate([shared, rng.integers(0, 32000, int(rng.integers(100, 900)))])
               for _ in range(num_sessions)]
    out = []
    for t in range(turns):
        for s in range(num_sessions):
            outputs = rng.integers(0, 32000, int(rng.integers(1, 300)))
            out.append(SimpleNamespace(session_id=s, input_tokens=history[s].astype(np.int32),
                                       output_tokens=outputs.astype(np.int32), input_len=len(history[s])))
            history[s] = np.concatenate([history[s], outputs, rng.integers(0, 32000, int(rng.integers(50, 500)))])
    return out


@pytest.fixture(scope="module")
def swe() -> tuple[ModelSpec, list]:
    spec = ModelSpec.from_hf_config(model_dir("nemotron-h-8b") / "config.json", name="nemotron-h-8b")
    return spec, select_requests("swe-sample", max_input_len=8192, num_requests=40).requests


@pytest.mark.parametrize("eviction", ["lru", "marconi"])
def test_concurrency_one_is_the_sequential_engine_on_the_bundled_trace(swe: tuple, eviction: str) -> None:
    spec, requests = swe
    layout = layout_for_spec(spec, num_blocks=60, block_size=1152, max_num_batched_tokens=8192)
    sequential = VllmAlignEngine(layout, spec, eviction=eviction)
    expected = [sequential.run(r.input_tokens, np.asarray(r.output_tokens, dtype=np.int32)) for r in requests]
    looped = VllmAlignEngine(layout, spec, eviction=eviction)
    result = emulate_closed_loop(looped, requests, concurrency=1)
    assert result.records == expected
    assert (result.queries, result.hits) == (sequential.queries, sequential.hits)
    assert looped.pool.stats == sequential.pool.stats and sequential.pool.stats.num_evicted > 0
    assert sum(result.num_preemptions) == 0


@pytest.mark.parametrize("eviction", ["lru", "marconi"])
def test_blocks_held_in_flight_are_never_evicted_and_preemption_recomputes(eviction: str) -> None:
    engine = _engine(28, eviction, max_num_batched_tokens=1024)
    pool = engine.pool

    class EvictionGuard(list):              # the pool's event trace, checking each eviction as it happens
        def append(self, event):
            if event[0] == "evict":         # a victim is free, and no running request holds it
                block = pool.blocks[event[1]]
                assert block.ref_cnt == 0
                held = {b.block_id for m in engine.managers for blocks in m.req_to_blocks.values() for b in blocks}
                assert block.block_id not in held
            super().append(event)

    pool.trace = EvictionGuard()
    requests = sessions(3, 6, 4)
    result = emulate_closed_loop(engine, requests, concurrency=6, check=True)
    assert sum(result.num_preemptions) > 0 and pool.stats.num_evicted > 0
    assert any(event[0] == "evict" for event in pool.trace)   # the guard saw them
    assert result.queries == sum(r.input_len for r in requests)      # first admissions only
    for rec, req in zip(result.records, requests):
        assert rec.input_len == req.input_len and 0 <= rec.hit_len <= rec.kv_hit_len < rec.input_len


def test_preemption_frees_the_last_running_request_and_requeues_it_first() -> None:
    engine = _engine(20, max_num_batched_tokens=4096)     # each fits alone, not both to the end
    sched = VllmAlignScheduler(engine)
    rng = np.random.default_rng(5)
    a = sched.add(rng.integers(0, 32000, 1500), rng.integers(0, 32000, 1500))
    b = sched.add(rng.integers(0, 32000, 1500), rng.integers(0, 32000, 1500))
    sched.step()
    assert sched.running == [a, b]
    while not sched.num_preemptions:
        sched.step()
        sched.check_invariants()
    assert sched.running == [a] and list(sched.waiting) == [b] and b.num_preemptions == 1
    assert b.state.num_computed_tokens == 0
    assert all(b.state.rid not in m.req_to_blocks for m in engine.managers)      # its blocks went back
    while sched.has_requests:
        sched.step()
        sched.check_invariants()
    assert a.finished and b.finished and b.num_output_tokens == b.max_tokens
    assert engine.queries == 3000                                                 # b counted once


def test_a_request_never_resumes_from_what_another_has_not_computed() -> None:
    """B shares A's prompt; A's prefill runs 384 tokens a step. B may only resume from a state A
    computed in an earlier step (never from one cached in the step B is admitted in)."""
    engine = _engine(60, max_num_batched_tokens=1152, long_prefill_token_threshold=384, retention_interval=None)
    sched = VllmAlignScheduler(engine)
    rng = np.random.default_rng(7)
    prompt = rng.integers(0, 32000, 2000)
    a = sched.add(prompt, rng.integers(0, 32000, 4))
    b = sched.add(np.concatenate([prompt, rng.integers(0, 32000, 500)]), rng.integers(0, 32000, 4))
    while b.record is None:
        computed_before = a.state.num_computed_tokens
        sched.step()
        sched.check_invariants()
    assert 0 < b.record.hit_len <= computed_before
    while sched.has_requests:
        sched.step()


def test_a_state_resumed_at_a_prompts_last_boundary_is_recached_and_a_sibling_waits_a_step() -> None:
    """vLLM's hybrid coordinator caches a block-aligned prefix (``get_num_cacheable_tokens``): a
    request resuming from the state at its prompt's last block boundary registers that state again
    in the step it is admitted, and a sibling that would resume from the same state waits a step
    (``cached_blocks_this_step``). (The emulation cached the unaligned count and admitted both in one
    step; at agent-synthetic on Nemotron-H-8B that moved one admission a step early.)"""
    engine = _engine(60)
    sched = VllmAlignScheduler(engine)
    rng = np.random.default_rng(3)
    prefix = rng.integers(0, 32000, 2 * 384)
    first = sched.add(np.concatenate([prefix, rng.integers(0, 32000, 10)]), rng.integers(0, 32000, 1))
    while sched.has_requests:               # caches the state at 768, its prompt's last boundary
        sched.step()
    assert first.record is not None
    b1 = sched.add(np.concatenate([prefix, rng.integers(0, 32000, 20)]), rng.integers(0, 32000, 4))
    b2 = sched.add(np.concatenate([prefix, rng.integers(0, 32000, 30)]), rng.integers(0, 32000, 4))
    sched.step()
    assert b1.record is not None and b1.record.hit_len == 768
    assert b2.record is None                # the state at 768 was registered again in this step
    sched.step()
    assert b2.record is not None and b2.record.hit_len == 768
    while sched.has_requests:
        sched.step()
        sched.check_invariants()


def test_the_loop_is_deterministic_and_keeps_a_sessions_turns_in_order() -> None:
    requests = sessions(11, 5, 3)
    runs = [emulate_closed_loop(_engine(40, "marconi"), requests, concurrency=4) for _ in range(2)]
    assert runs[0] == runs[1]
    wide = emulate_closed_loop(_engine(200), requests, concurrency=16)
    # A later turn reuses its own session's history (admitted only after the previous turn finished).
    assert all(rec.hit_len > 0 for rec in wide.records[5:])


def test_a_request_that_cannot_fit_says_so() -> None:
    with pytest.raises(ConfigError, match="raise the capacity"):
        emulate_closed_loop(_engine(6), [SimpleNamespace(session_id=0, input_tokens=np.arange(3000) % 32000,
                                                         output_tokens=np.arange(4))], concurrency=2)
    with pytest.raises(ConfigError):
        emulate_closed_loop(_engine(6), [], concurrency=0)
    engine = _engine(14)                    # fits its prompt, not its outputs: preempted alone
    with pytest.raises(ConfigError, match="even alone"):
        emulate_closed_loop(engine, [SimpleNamespace(session_id=0, input_tokens=np.arange(1500) % 32000,
                                                     output_tokens=np.arange(2500))], concurrency=1)
