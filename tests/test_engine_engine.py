"""The Engine through the cache core: same tokens as without a cache, same decisions as a simulation."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import torch

pytestmark = pytest.mark.usefixtures("one_torch_thread")

from marconi.cache import PrefixCache
from marconi.engine.engine import Engine
from marconi.engine.errors import TokenRangeError
from marconi.engine.models import load_model
from marconi.engine.states import KVPayload, SSMPayload




@functools.cache
def model_for(preset: str, dtype: str = "float32"):
    return load_model(preset, dtype=dtype)


def rand_tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 32000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def big_capacity(model) -> int:
    return 200 * model.spec.ssm_checkpoint_bytes + 20_000 * model.spec.kv_bytes_per_token


def check_payloads(engine: Engine) -> None:
    """Every node's tensors are exactly what the core's byte accounting says it holds."""
    cache = engine.cache
    cache.check_invariants()
    kv_bytes = ssm_bytes = 0
    for node in cache.tree.iter_nodes():
        assert isinstance(node.kv, KVPayload) and node.kv.num_tokens == node.edge_len
        kv_bytes += node.kv.nbytes
        if node.has_ssm:
            assert isinstance(node.ssm, SSMPayload) and node.ssm.position == node.depth
            ssm_bytes += node.ssm.nbytes
    assert (kv_bytes, ssm_bytes) == (cache.kv_bytes, cache.ssm_bytes)


# ================================================================================ same tokens
@pytest.mark.parametrize("preset,dtype", [("bamba-tiny", "float32"), ("qwen3_next-tiny", "float32"),
                                          ("nemotron_h-tiny", "float32"), ("zamba2-tiny", "float64")])
def test_multi_turn_conversation_same_tokens_with_and_without_cache(preset, dtype):
    model = model_for(preset, dtype)
    cached = Engine(model, big_capacity(model))
    plain = Engine(model, 0, admission="none")
    system = rand_tokens(48, seed=1)
    sessions = {s: list(system) for s in range(2)}
    for turn in range(3):
        for s in sessions:
            prompt = sessions[s] + rand_tokens(20 + 7 * s, seed=100 * turn + s)
            with_cache = cached.generate(prompt, 12)
            without = plain.generate(prompt, 12)
            assert with_cache.output_tokens == without.output_tokens, (turn, s)
            assert without.usable_hit_len == 0
            if turn > 0:  # resumes from the last-decoded-token checkpoint of its previous turn
                assert with_cache.usable_hit_len == len(sessions[s]) and with_cache.hit_fraction > 0.5
            sessions[s] = prompt + list(with_cache.output_tokens)
            check_payloads(cached)
    assert cached.cache.stats.checkpoints_reused >= 4
    # the shared system prompt became a branch checkpoint captured during a prefill
    assert cached.cache.stats.checkpoints_admitted > 6


def test_a_checkpoint_at_the_inputs_end_is_not_a_usable_hit_for_the_engine():
    """The engine needs the last input token's logits, so it resumes no deeper than len - 1: here
    the only checkpoint is at the very end, so (all or nothing) nothing is reused, and the core
    accounts exactly that."""
    model = model_for("bamba-tiny")
    cached = Engine(model, big_capacity(model))
    plain = Engine(model, 0, admission="none")
    first = cached.replay(rand_tokens(40, seed=2), rand_tokens(6, seed=3))
    assert first.admitted == (46,)
    again = rand_tokens(40, seed=2) + rand_tokens(6, seed=3)  # exactly input + output: a checkpoint at its end
    r = cached.generate(again, 8)
    assert r.kv_hit_len == len(again) and r.usable_hit_len == 0 and r.hit_fraction == 0.0
    assert cached.cache.stats.reused_tokens == 0
    assert r.output_tokens == plain.generate(again, 8).output_tokens
    # one token longer: the checkpoint at 46 is now usable
    longer = cached.generate(again + rand_tokens(1, seed=9), 4)
    assert longer.usable_hit_len == len(again)
    assert longer.output_tokens == plain.generate(again + rand_tokens(1, seed=9), 4).output_tokens
    check_payloads(cached)


# ================================================================================ same decisions
def _trace(num_sessions=3, turns=3):
    """Round-robin multi-turn sessions sharing a system prompt; outputs recorded (teacher-forced)."""
    system = rand_tokens(40, seed=7)
    history = {s: list(system) for s in range(num_sessions)}
    requests = []
    for turn in range(turns):
        for s in range(num_sessions):
            inp = history[s] + rand_tokens(15 + 5 * ((s + turn) % 3), seed=1000 + 10 * s + turn)
            out = rand_tokens(6 + 2 * s, seed=2000 + 10 * s + turn)
            requests.append((inp, out))
            history[s] = inp + out
    return requests


@pytest.mark.parametrize("preset,eviction", [("bamba-tiny", "lru"), ("qwen3_next-tiny", "flop-aware")])
def test_engine_decisions_equal_simulation(preset, eviction):
    model = model_for(preset)
    spec = model.spec
    capacity = 5 * spec.ssm_checkpoint_bytes + 260 * spec.kv_bytes_per_token
    engine = Engine(model, capacity, admission="marconi", eviction=eviction)
    sim = PrefixCache(spec, capacity, "marconi", eviction)
    for inp, out in _trace():
        r = engine.replay(inp, out)
        match, ins = sim.process(inp, out)
        assert (r.kv_hit_len, r.usable_hit_len) == (match.kv_hit_len, match.usable_hit_len)
        assert (r.cached, r.admitted) == (ins.cached, ins.admitted)
        assert r.output_tokens == tuple(out)
        check_payloads(engine)
    assert engine.cache.stats == sim.stats
    assert engine.cache.stats.evictions_leaf + engine.cache.stats.evictions_inner > 0  # eviction was exercised
    assert engine.cache.stats.checkpoints_unavailable == 0
    mine, theirs = engine.cache.snapshot(), sim.snapshot()
    assert mine.parent_index == theirs.parent_index and mine.has_ssm == theirs.has_ssm
    assert all(np.array_equal(a, b) for a, b in zip(mine.tokens, theirs.tokens))
    assert engine.payloads.num_released > 0


# ================================================================================ errors
def test_bad_tokens_are_refused_before_touching_the_cache():
    model = model_for("bamba-tiny")
    engine = Engine(model, big_capacity(model))
    for bad in ([1, 2, 32000], [-1, 5], [[1, 2]], [], [0.5, 1.0]):
        with pytest.raises(TokenRangeError):
            engine.generate(bad, 4)
    with pytest.raises(TokenRangeError, match="32001"):
        engine.replay([1, 2, 3], [4, 32001])
    assert engine.cache.stats.num_requests == 0 and engine.cache.num_in_flight == 0


def test_failure_mid_request_unlocks(monkeypatch):
    model = model_for("bamba-tiny")
    engine = Engine(model, big_capacity(model))
    engine.replay(rand_tokens(30, seed=9), rand_tokens(4, seed=10))

    def boom(*args, **kwargs):
        raise RuntimeError("decode failed")

    monkeypatch.setattr("marconi.engine.engine.decode_greedy", boom)
    with pytest.raises(RuntimeError, match="decode failed"):
        engine.generate(rand_tokens(30, seed=9) + rand_tokens(4, seed=10) + [5, 6], 4)
    assert engine.cache.num_in_flight == 0
    engine.cache.check_invariants()


def test_text_prompts_use_the_given_tokenizer():
    class Encoding:
        def __init__(self, ids):
            self.ids = ids

    class FakeTokenizer:
        def encode(self, text):
            return Encoding([min(ord(c), 31999) for c in text])

    model = model_for("bamba-tiny")
    engine = Engine(model, big_capacity(model), tokenizer=FakeTokenizer())
    r = engine.generate("hello hybrid world", 3)
    assert r.input_len == len("hello hybrid world") and r.output_len == 3


def test_capacity_below_one_checkpoint_is_a_config_error():
    model = model_for("bamba-tiny")
    with pytest.raises(ValueError, match="SSM checkpoint"):
        Engine(model, model.spec.ssm_checkpoint_bytes - 1)
    with pytest.raises(ValueError, match="unknown checkpointing 'nope'"):
        Engine(model, big_capacity(model), checkpointing="nope")


def test_replay_appended_makes_the_same_decisions_as_decoding():
    model = model_for("bamba-tiny")
    stepwise = Engine(model, big_capacity(model))
    appended = Engine(model, big_capacity(model))
    for inp, out in _trace(num_sessions=2, turns=2):
        a, b = stepwise.replay(inp, out), appended.replay_appended(inp, out)
        assert (a.usable_hit_len, a.admitted, a.output_tokens) == (b.usable_hit_len, b.admitted, b.output_tokens)
        assert a.greedy_tokens[0] == b.greedy_tokens[0]
    assert stepwise.cache.stats == appended.cache.stats
    check_payloads(appended)


def test_chunk_boundary_engine_offers_states_at_boundaries_only():
    model = model_for("bamba-tiny")  # scan chunk 16
    engine = Engine(model, big_capacity(model), checkpointing="chunk-boundary")
    system = rand_tokens(37, seed=20)  # a branch at 37: not a chunk boundary
    engine.replay(system + rand_tokens(10, seed=21), rand_tokens(4, seed=22))
    r = engine.replay(system + rand_tokens(12, seed=23), rand_tokens(4, seed=24))
    assert r.prefill_checkpoints == (37,) and r.captured == (32,)
    assert 37 not in r.admitted and r.admitted == (53,)  # the cache wanted 37; the last token is exact
    assert engine.cache.stats.checkpoints_unavailable == 1
    check_payloads(engine)


def test_ttft_repeats_report_the_fastest_identical_run():
    model = model_for("bamba-tiny")
    once = Engine(model, big_capacity(model))
    thrice = Engine(model, big_capacity(model), ttft_repeats=3)
    for inp, out in _trace(num_sessions=1, turns=2):
        a, b = once.replay_appended(inp, out), thrice.replay_appended(inp, out)
        assert (a.usable_hit_len, a.admitted, a.greedy_tokens) == (b.usable_hit_len, b.admitted, b.greedy_tokens)
        assert b.ttft_s >= b.lookup_s + b.restore_s + b.prefill_s - 1e-9 and b.ttft_cpu_s > 0
    assert once.cache.stats == thrice.cache.stats
    with pytest.raises(ValueError, match="ttft_repeats"):
        Engine(model, big_capacity(model), ttft_repeats=0)


def test_text_prompts_use_the_project_tokenizer_by_default():
    import marconi.workloads.tokenizer as tokenizer_mod
    expected = tokenizer_mod.load_tokenizer().encode("Prefix caching for hybrid models.")
    model = model_for("qwen3_next-tiny")
    r = Engine(model, big_capacity(model)).generate("Prefix caching for hybrid models.", 2)
    assert r.input_len == len(expected)
