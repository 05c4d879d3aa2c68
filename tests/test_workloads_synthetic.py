"""Synthetic generators: determinism, structure, limits and speed."""

from __future__ import annotations


import numpy as np
import pytest

from marconi.workloads import (agent_trace, chat_trace, doc_qa_trace, shared_prompts_trace,
                               synthetic_trace)
from marconi.workloads.synthetic import SYNTHETIC_KINDS


def _same(a, b) -> bool:
    return len(a) == len(b) and all(x == y for x, y in zip(a, b))


@pytest.mark.parametrize("kind", list(SYNTHETIC_KINDS))
def test_seeded_and_deterministic(kind):
    a = synthetic_trace(kind, seed=5)
    b = synthetic_trace(kind, seed=5)
    c = synthetic_trace(kind, seed=6)
    assert _same(a, b) and not _same(a, c)
    assert a.meta["source"] == "synthetic" and a.meta["kind"] == kind and a.meta["params"]["seed"] == 5
    assert [r.ts for r in a] == sorted(r.ts for r in a)
    tokens = np.concatenate([r.input_tokens for r in a])
    assert tokens.min() >= 3 and tokens.max() < 32000


def test_adding_sessions_keeps_earlier_ones():
    small = chat_trace(num_sessions=5, seed=1)
    big = chat_trace(num_sessions=12, seed=1)
    assert _same(small, [r for r in big if r.session_id < 5])


@pytest.mark.parametrize("make", [chat_trace, agent_trace, shared_prompts_trace])
def test_growing_histories(make):
    trace = make(seed=2)
    for reqs in trace.sessions().values():
        assert [r.turn_id for r in reqs] == list(range(len(reqs)))
        for a, b in zip(reqs, reqs[1:]):
            prev = np.concatenate([a.input_tokens, a.output_tokens])
            assert b.input_len > prev.size and np.array_equal(b.input_tokens[:prev.size], prev)
            assert b.ts >= a.ts
    assert max(r.input_len for r in trace) <= 32768


def test_chat_limits_and_timing():
    trace = chat_trace(num_sessions=40, turns=(30, 30), user_len=800, output_len=800, max_input_len=8000,
                       sessions_per_second=4.0, system_prompt_len=100)
    assert max(r.input_len for r in trace) <= 8000
    firsts = [reqs[0] for reqs in trace.sessions().values()]
    assert [r.ts for r in firsts] == pytest.approx([r.session_id / 4.0 for r in firsts])
    system = firsts[0].input_tokens[:100]
    assert all(np.array_equal(r.input_tokens[:100], system) for r in trace)
    with pytest.raises(ValueError, match="range"):
        chat_trace(turns=(5, 2))


def test_agent_shares_the_system_prompt_and_reaches_long_inputs():
    trace = agent_trace(num_sessions=20, system_prompt_len=4000, seed=4)
    system = trace[0].input_tokens[:4000]
    assert all(np.array_equal(r.input_tokens[:4000], system) for r in trace)
    tasks = {reqs[0].input_tokens[4000:4010].tobytes() for reqs in trace.sessions().values()}
    assert len(tasks) == 20  # each session has its own task
    assert max(r.input_len for r in trace) > 25000


def test_shared_prompts():
    trace = shared_prompts_trace(num_prompts=3, prompt_len=500, num_sessions=300, prompt_skew=1.0, seed=9)
    prompt_of = trace.meta["prompt_of_session"]
    counts = np.bincount(prompt_of, minlength=3)
    assert counts[0] > counts[1] > counts[2] > 0  # Zipf-skewed popularity
    heads: dict[int, bytes] = {}
    for r in trace:
        head = r.input_tokens[:500].tobytes()
        assert heads.setdefault(prompt_of[r.session_id], head) == head
    assert len(set(heads.values())) == 3


def test_doc_qa_depths():
    trace = doc_qa_trace(num_docs=3, doc_len=2000, questions_per_doc=40, depth_fractions=(0.25, 1.0),
                         instruction_len=50, seed=3)
    assert len(trace) == 120 and trace.num_sessions == 3
    depths = trace.meta["depth_of_request"]
    assert set(depths) == {500, 2000}
    docs: dict[int, np.ndarray] = {}
    for r, depth in zip(trace, depths):
        if depth == 2000:
            docs.setdefault(r.session_id, r.input_tokens[:2050])
    instruction = trace[0].input_tokens[:50]
    for r, depth in zip(trace, depths):
        assert np.array_equal(r.input_tokens[:50], instruction)
        assert np.array_equal(r.input_tokens[:50 + depth], docs[r.session_id][:50 + depth])
        assert r.input_len > 50 + depth
    by_doc = trace.sessions()
    assert all([r.turn_id for r in reqs] == list(range(40)) for reqs in by_doc.values())


def test_unknown_kind_or_parameter():
    with pytest.raises(ValueError, match="choose from"):
        synthetic_trace("nope")
    with pytest.raises(ValueError, match="num_sessions"):
        synthetic_trace("chat", sessions=3)


def test_ten_thousand_long_requests():
    # (generation speed is printed by benchmarks/core_bench.py; unit tests do not time things)
    trace = agent_trace(num_sessions=500, calls=(20, 60), seed=0)
    assert len(trace) >= 10_000 and max(r.input_len for r in trace) > 30_000
