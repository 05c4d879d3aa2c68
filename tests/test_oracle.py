"""The future-aware ``oracle`` and the ``infinite`` ceiling: hand-made traces with known answers."""

import numpy as np
import pytest

from marconi.choosers.family import DEFAULT_RULES
from marconi.core.model import ModelSpec
from marconi.sim.oracle import NEVER, FutureIndex
from marconi.core.registry import ConfigError
from marconi.sim import simulate_system
from marconi.sim.systems import SystemConfig, make_system
from marconi.workloads import Request, Trace, chat_trace

# 10 bytes of KV per token, 100 bytes per SSM checkpoint (as in test_cache.py).
SPEC = ModelSpec("tiny", num_attn_layers=1, num_ssm_layers=1, num_mlp_layers=1, d_model=5, ssm_state_dim=1,
                 conv_kernel=0, num_kv_heads=1, head_dim=5, bytes_per_elem=1, ssm_state_width=100)
ONLINE = ["sglang+", "marconi", "marconi:tuner=bootstrap"] + [f"marconi:alpha={a}" for a in (0, 0.5, 1, 2)] + \
    ["marconi:alpha=1,efficiency=marginal"]


def toks(*ranges):
    return np.concatenate([np.arange(a, b, dtype=np.int32) for a, b in ranges] or [np.empty(0, np.int32)])


def trace_of(*pairs):
    return Trace([Request(i, 0, float(i), inp, out) for i, (inp, out) in enumerate(pairs)], name="hand-made")


def rule_systems():
    """Every rule of the adaptive family as a fixed system, plus the named online systems."""
    out = list(ONLINE)
    for rule in DEFAULT_RULES:
        evi = f"flop-aware:alpha={rule.alpha},efficiency={rule.efficiency},recency={rule.recency}," \
              f"candidates={rule.candidates},touch={rule.touch}"
        out.append(SystemConfig(rule.label(), "marconi", evi))
    return out


def reused(trace, system, capacity):
    return simulate_system(trace, system, SPEC, capacity, latency="zero").stats.reused_tokens


def test_future_index_lists_the_requests_through_every_prefix():
    inputs = [toks((0, 10)), toks((0, 5), (50, 60)), toks((0, 10), (70, 75)), toks((100, 110))]
    index = FutureIndex(inputs)
    assert index.requests_through(toks((0, 5))).tolist() == [0, 1, 2]
    assert index.requests_through(toks((0, 7))).tolist() == [0, 2]
    assert index.requests_through(toks((0, 10))).tolist() == [0, 2]
    assert index.requests_through(toks((0, 10), (70, 71))).tolist() == [2]
    assert index.requests_through(toks((0, 11))) is None           # no input continues that way
    assert index.requests_through(toks((0, 10), (70, 76))) is None  # longer than any input
    assert FutureIndex.next_after(index.requests_through(toks((0, 5))), 0) == 1
    assert FutureIndex.next_after(index.requests_through(toks((0, 5))), 2) == NEVER
    # segments past position 3 of the prefix 0..10 (+70..75): who shares each stretch
    segs = index.segments(toks((0, 10), (70, 75)), 3)
    assert [(end, reqs.tolist()) for end, reqs in segs] == [(5, [0, 1, 2]), (10, [0, 2]), (15, [2])]


def test_oracle_keeps_the_sequence_that_comes_back():
    # A, B fill the cache (350 bytes each: 25 tokens + a checkpoint); C forces an eviction; A continues.
    a_in, a_out = toks((0, 20)), toks((100, 105))
    trace = trace_of((a_in, a_out), (toks((1000, 1020)), toks((1100, 1105))), (toks((2000, 2020)), toks((2100, 2105))),
                     (np.concatenate([a_in, a_out, toks((200, 210))]), toks((300, 305))))
    assert reused(trace, "oracle", 700) == 25          # B (never used again) goes, A's turn resumes at 25
    for system in rule_systems():                      # recency (and equal FLOP efficiency) evict A
        assert reused(trace, system, 700) == 0, system


def test_oracle_keeps_kvs_that_let_a_later_branch_point_be_checkpointed():
    # S1 = P + X1 (350 bytes) and an unrelated, longer D1 (500) fill the cache; D2 forces an eviction
    # and every online rule drops S1 (older, and less FLOP-efficient). The oracle keeps it: S2 = P + X2
    # then finds P's KVs, so P's end is checkpointed, and S3 = P + X3 resumes there.
    p = (0, 20)
    trace = trace_of((toks(p, (100, 105)), toks()), (toks((500, 540)), toks()), (toks((600, 640)), toks()),
                     (toks(p, (200, 205)), toks()), (toks(p, (300, 305)), toks()))
    assert reused(trace, "oracle", 850) == 20
    for system in rule_systems():
        assert reused(trace, system, 850) == 0, system


@pytest.mark.parametrize("capacity", [2e9, 5e9])
def test_oracle_is_at_least_as_good_as_the_online_rules_on_a_chat_trace(capacity):
    trace = chat_trace(num_sessions=30, turns=(3, 8), system_prompt_len=300, user_len=150, output_len=200, seed=3)
    best_online = max(simulate_system(trace, s, "paper-7b", capacity).stats.reused_tokens for s in rule_systems())
    ceiling = simulate_system(trace, "infinite", "paper-7b", capacity).stats.reused_tokens
    oracle = simulate_system(trace, "oracle", "paper-7b", capacity).stats.reused_tokens
    assert best_online <= oracle <= ceiling


def test_infinite_is_the_same_admission_without_evictions():
    trace = chat_trace(num_sessions=20, turns=(2, 6), seed=4)
    inf = simulate_system(trace, "infinite", "paper-7b", 1e9)
    big = simulate_system(trace, "sglang+", "paper-7b", 2**50)
    assert inf.stats.reused_tokens == big.stats.reused_tokens and inf.stats.checkpoints_evicted == 0
    assert inf.capacity_bytes == int(1e9)             # reported at the capacity it was asked for
    every_block = simulate_system(trace, "infinite:admission=every-block(block=16)", "paper-7b", 1e9)
    assert every_block.stats.reused_tokens == simulate_system(trace, "vllm+:block=16", "paper-7b", 2**50).stats.reused_tokens


def test_the_oracle_needs_the_trace():
    with pytest.raises(ConfigError, match="needs the whole trace"):
        make_system("oracle").build("paper-7b", 1e9)
    with pytest.raises(ConfigError, match="needs the whole trace"):
        make_system("custom:eviction=oracle")


def test_oracle_runs_in_event_mode_and_from_an_iterator():
    trace = chat_trace(num_sessions=10, turns=(2, 5), seed=6)
    seq = simulate_system(iter(trace), "oracle", "paper-7b", 1e9)
    event = simulate_system(trace, "oracle", "paper-7b", 1e9, mode="event")
    assert seq.num_requests == event.num_requests == len(trace)
