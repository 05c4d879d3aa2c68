"""The Engine through the cache core: same tokens as without a cache, same decisions as a simulation."""

from __future__ import annotations

import functools
import sys
import threading

import numpy as np
import pytest

import torch

pytestmark = pytest.mark.usefixtures("one_torch_thread")

from marconi.core.cache import PrefixCache
from marconi.engine.engine import Engine
from marconi.engine.errors import EngineError, TokenRangeError
from marconi.engine.models import load_model
from marconi.engine.states import KVPayload, SSMPayload
from engine_checks import logits_apart, tolerance
from marks import slow_but_first




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
        # one state per checkpoint position (a block run holds several), taken at that position
        assert all(isinstance(p, SSMPayload) for p in node.ckpt_states)
        assert [p.position for p in node.ckpt_states] == node.ckpt_positions
        ssm_bytes += sum(p.nbytes for p in node.ckpt_states)
    assert (kv_bytes, ssm_bytes) == (cache.kv_bytes, cache.ssm_bytes)


# ================================================================================ same tokens
@pytest.mark.parametrize("preset,dtype", slow_but_first([("bamba-tiny", "float32"), ("qwen3_next-tiny", "float32"),
                                                          ("nemotron_h-tiny", "float32"), ("zamba2-tiny", "float64")]))
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
            assert logits_apart(with_cache, without) <= tolerance(model), (turn, s)
            assert without.usable_hit_len == 0
            if turn > 0:  # resumes from the last-decoded-token checkpoint of its previous turn
                assert with_cache.usable_hit_len == len(sessions[s]) and with_cache.hit_fraction > 0.5
            sessions[s] = prompt + list(with_cache.output_tokens)
            check_payloads(cached)
    assert cached.cache.stats.checkpoints_reused >= 4
    # the shared system prompt became a branch checkpoint captured during a prefill
    assert cached.cache.stats.checkpoints_admitted > 6


@pytest.mark.parametrize("preset,scale", [("bamba-tiny", 0.0), ("nemotron_h-tiny", 0.0), ("bamba-tiny", 1.01),
                                          ("qwen3_next-tiny", 1.01)])
def test_the_multi_turn_check_sees_a_wrong_recurrent_state(preset, scale, monkeypatch):
    """The controls of the test above: with every restored recurrent state zeroed, the same conversation
    gives other tokens than an uncached run; scaled by 1.01, its first logits move past the tolerance
    (the tokens alone miss that). So that test can fail on a wrong state. (An audit found it could not
    on the Mamba-2 presets: their skip term D = 1 swamped the state, and models.py now sets D = 0; the
    logits are compared since then too.)"""
    import marconi.engine.engine as engine_module
    from marconi.engine.states import build_cache

    def wrong(model, kv, ssm):
        if ssm is not None:
            ssm = SSMPayload(ssm.conv, tuple(None if r is None else r * scale for r in ssm.recurrent),
                             ssm.position, ssm.hidden)
        return build_cache(model, kv, ssm)

    monkeypatch.setattr(engine_module, "build_cache", wrong)
    model = model_for(preset)
    cached = Engine(model, big_capacity(model))
    plain = Engine(model, 0, admission="none")
    system = rand_tokens(48, seed=1)
    history, differing, resumed = list(system), 0, 0
    for turn in range(3):
        prompt = history + rand_tokens(20, seed=100 * turn)
        with_cache, without = cached.generate(prompt, 12), plain.generate(prompt, 12)
        resumed += with_cache.usable_hit_len > 0
        if scale == 0.0:
            differing += with_cache.output_tokens != without.output_tokens
        else:
            differing += logits_apart(with_cache, without) > tolerance(model)
        history = prompt + list(without.output_tokens)
    assert resumed == 2 and differing >= 1


def test_a_prompt_equal_to_a_cached_sequence_is_a_free_hit():
    """The checkpoint at a cached sequence's end keeps its last position's final hidden state, so
    a prompt equal to that sequence computes nothing before its first token: the whole input is
    reused (the core's default accounting), and the tokens are those of an uncached run."""
    model = model_for("bamba-tiny")
    cached = Engine(model, big_capacity(model))
    plain = Engine(model, 0, admission="none")
    first = cached.replay(rand_tokens(40, seed=2), rand_tokens(6, seed=3))
    assert first.admitted == (46,)
    again = rand_tokens(40, seed=2) + rand_tokens(6, seed=3)  # exactly input + output: a checkpoint at its end
    r = cached.generate(again, 8)
    assert r.kv_hit_len == r.usable_hit_len == len(again) and r.hit_fraction == 1.0
    assert r.num_prefill_calls == 0 and r.prefill_s < r.ttft_s
    assert cached.cache.stats.reused_tokens == len(again)
    uncached = plain.generate(again, 8)
    assert r.output_tokens == uncached.output_tokens and logits_apart(r, uncached) <= tolerance(model)
    # the simulator counts the same reuse for the same requests
    sim = PrefixCache(model.spec, big_capacity(model), "marconi", "lru")
    sim.process(rand_tokens(40, seed=2), rand_tokens(6, seed=3))
    match, _ = sim.process(again, r.output_tokens)
    assert match.usable_hit_len == len(again)
    assert cached.cache.stats == sim.stats
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


def _hostile_trace():
    """A trace that asks for states everywhere an engine can be caught out: multi-turn sessions
    on a shared system prompt, a prompt re-sent with an output that leaves the first one's after
    a few tokens (a branch point inside decoded output), a prompt that ends where a cached
    sequence branches (a branch at the input's end), a prompt equal to a cached sequence (a
    whole-prompt hit), and outputs long enough to cross block boundaries."""
    requests = _trace(num_sessions=2, turns=2)
    inp, out = requests[0]
    requests.append((inp, out[:3] + rand_tokens(9, seed=3001)))            # same prompt, output forks at +3
    requests.append((inp, out[:3] + rand_tokens(5, seed=3002)))            # ... and again at the new node
    requests.append((inp + out[:3], rand_tokens(7, seed=3003)))           # input ends on that branch node
    requests.append((requests[1][0] + requests[1][1], rand_tokens(20, seed=3004)))  # a whole cached sequence
    requests.append((rand_tokens(40, seed=7) + rand_tokens(30, seed=3005), rand_tokens(26, seed=3006)))
    return requests


ADMISSIONS = ["marconi", "none", "every-block:block=8", "every-block:block=8,paged=false", "last-token", "uniform:m=3",
              "sparse-dp:m=2,key_tokens=16"]


def _assert_same_decisions(engine: Engine, sim: PrefixCache, requests, *, generate: int = 0,
                           appended: bool = False) -> None:
    replay = engine.replay_appended if appended else engine.replay
    for i, (inp, out) in enumerate(requests):
        r = engine.generate(inp, generate) if generate else replay(inp, out)
        match, ins = sim.process(inp, r.output_tokens)
        assert (r.kv_hit_len, r.usable_hit_len) == (match.kv_hit_len, match.usable_hit_len), i
        assert (r.cached, r.admitted) == (ins.cached, ins.admitted), i
        assert generate or r.output_tokens == tuple(out)
        assert set(r.admitted) <= set(r.captured), i
        check_payloads(engine)
    assert engine.cache.stats == sim.stats
    assert engine.cache.stats.checkpoints_unavailable == 0
    mine, theirs = engine.cache.snapshot(), sim.snapshot()
    assert mine.parent_index == theirs.parent_index and mine.ckpt_positions == theirs.ckpt_positions
    assert all(np.array_equal(a, b) for a, b in zip(mine.tokens, theirs.tokens))


@pytest.mark.parametrize("checkpointing", slow_but_first(["segmented", "chunk-boundary"]))
@pytest.mark.parametrize("admission", slow_but_first(ADMISSIONS))
def test_engine_decisions_equal_simulation(admission, checkpointing):
    """The engine supplies every state the cache asks for (inside outputs too) and makes exactly
    the decisions of a size-only simulation told the same checkpoint placement, under eviction."""
    model = model_for("bamba-tiny")  # scan chunk 16
    spec = model.spec
    num_states = 16 if admission.startswith("every-block") else 6  # small: every configuration evicts
    capacity = num_states * spec.ssm_checkpoint_bytes + 300 * spec.kv_bytes_per_token
    engine = Engine(model, capacity, admission=admission, eviction="lru", checkpointing=checkpointing)
    sim = PrefixCache(spec, capacity, admission, "lru",
                      prefill_chunk_len=model.chunk_size if checkpointing == "chunk-boundary" else None)
    # The checkpointing mode changes only the prefill; the output is decoded token by token under
    # segmented and appended with one forward cut at the wanted positions under chunk-boundary,
    # so both ways of taking states inside an output are checked (and the matrix stays quick).
    _assert_same_decisions(engine, sim, _hostile_trace(), appended=checkpointing == "chunk-boundary")
    stats = engine.cache.stats
    if admission != "none":
        assert stats.checkpoints_admitted > 0 and stats.evictions_leaf > 0 and engine.payloads.num_released > 0
        assert stats.reused_tokens > 0


def test_engine_decisions_equal_simulation_flop_aware_deltanet():
    model = model_for("qwen3_next-tiny")  # gated DeltaNet, scan chunk 64
    spec = model.spec
    capacity = 5 * spec.ssm_checkpoint_bytes + 260 * spec.kv_bytes_per_token
    engine = Engine(model, capacity, admission="marconi", eviction="flop-aware")
    _assert_same_decisions(engine, PrefixCache(spec, capacity, "marconi", "flop-aware"), _hostile_trace())
    assert engine.cache.stats.evictions_leaf + engine.cache.stats.evictions_inner > 0


def test_the_default_marconi_eviction_serves_the_engine_exactly():
    """The default ``marconi`` eviction (exact worlds, cloned size-only while the live cache holds
    tensors) under eviction pressure in the real engine: the tokens of an uncached run, and the
    decisions of a size-only simulation with the same policy, request for request."""
    model = model_for("bamba-tiny")
    spec = model.spec
    capacity = 5 * spec.ssm_checkpoint_bytes + 260 * spec.kv_bytes_per_token  # small: it evicts
    engine = Engine(model, capacity, admission="marconi", eviction="worlds")
    plain = Engine(model, 0, admission="none")
    sim = PrefixCache(spec, capacity, "marconi", "worlds")
    system = rand_tokens(40, seed=7)
    history = {s: list(system) for s in range(3)}
    for turn in range(3):
        for s in history:
            prompt = history[s] + rand_tokens(12 + 4 * s, seed=500 + 10 * s + turn)
            r, uncached = engine.generate(prompt, 8), plain.generate(prompt, 8)
            assert r.output_tokens == uncached.output_tokens, (turn, s)
            assert logits_apart(r, uncached) <= tolerance(model), (turn, s)
            match, ins = sim.process(prompt, r.output_tokens)
            assert (r.usable_hit_len, r.cached, r.admitted) == (match.usable_hit_len, ins.cached, ins.admitted)
            history[s] = prompt + list(r.output_tokens)
            check_payloads(engine)
    stats = engine.cache.stats
    assert stats == sim.stats and stats.reused_tokens > 0
    assert stats.evictions_leaf + stats.evictions_inner > 0
    policy = engine.cache.eviction
    assert policy.chooser.switches  # it switched: a world was cloned from a live cache holding tensors ...
    assert all(w.payloads is not engine.payloads and w.kv_bytes <= capacity for w in policy.chooser.worlds.values())
    assert all(n.kv is None for w in policy.chooser.worlds.values() for n in w.tree.iter_nodes())  # ... without them


@pytest.mark.parametrize("admission", slow_but_first(["marconi", "every-block:block=8", "sparse-dp:m=2,key_tokens=16"]))
def test_greedy_engine_finds_the_states_it_needs_while_decoding(admission):
    """Generation does not know its output up front: a branch point where the output leaves a
    cached sequence, and block boundaries, are found step by step — still identical decisions."""
    model = model_for("bamba-tiny")
    prompt = rand_tokens(37, seed=40)
    greedy = Engine(model, 0, admission="none").generate(prompt, 12).output_tokens
    engine = Engine(model, big_capacity(model), admission=admission)
    sim = PrefixCache(model.spec, big_capacity(model), admission, "lru")
    # a cached sequence sharing the prompt and the first 3 generated tokens, then different
    _assert_same_decisions(engine, sim, [(prompt, list(greedy[:3]) + rand_tokens(6, seed=41))])
    r = engine.generate(prompt, 12)
    assert r.output_tokens == greedy
    match, ins = sim.process(prompt, r.output_tokens)
    assert (r.usable_hit_len, r.admitted) == (match.usable_hit_len, ins.admitted)
    if admission != "every-block:block=8":
        assert 37 + 3 in r.admitted  # Marconi's branch point, 3 tokens into the output
    else:
        assert r.admitted == (48,)  # the block boundary inside this output (40: cached by the first)
    _assert_same_decisions(engine, sim, [(prompt + rand_tokens(5, seed=42), None)], generate=6)


# ================================================================================ threads
def _tree_states(engine: Engine) -> dict[int, list[torch.Tensor]]:
    return {n.depth: [*n.end_state.conv, *n.end_state.recurrent] for n in engine.cache.tree.iter_nodes() if n.has_ssm}


def _run_threads(target, args_list) -> None:
    errors = []

    def run(*args):
        try:
            target(*args)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        threads = [threading.Thread(target=run, args=args) for args in args_list]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(before)
    assert not errors, errors[0]


def test_concurrent_float64_requests_stay_bitwise_exact():
    """Requests served in parallel threads (one shared model) store bit-for-bit the states they
    store alone. Before the float64 scan patch was reference-counted, one thread's exit restored
    upstream's float32 scans under another's forward (checkpoints off by ~1e-9)."""
    model = model_for("bamba-tiny", "float64")
    sessions = [[(rand_tokens(50 + 9 * i, seed=60 + i), rand_tokens(5, seed=70 + i))] for i in range(4)]
    for i, turns in enumerate(sessions):
        inp, out = turns[0]
        turns.append((inp + out + rand_tokens(20, seed=80 + i), rand_tokens(4, seed=90 + i)))

    def serve(engine: Engine, turns) -> None:
        for inp, out in turns:
            engine.replay(inp, out)

    alone = []
    for turns in sessions:
        engine = Engine(model, big_capacity(model))
        serve(engine, turns)
        alone.append(_tree_states(engine))
    together = [Engine(model, big_capacity(model)) for _ in sessions]
    _run_threads(serve, list(zip(together, sessions)))
    for engine, expected in zip(together, alone):
        got = _tree_states(engine)
        assert sorted(got) == sorted(expected)
        for depth, tensors in got.items():
            assert all(a.dtype == torch.float64 and torch.equal(a, b) for a, b in zip(tensors, expected[depth])), depth


def test_one_engine_serves_threads_safely():
    """Threads sharing one Engine (one cache): the core serialises its calls, every request gets
    the tokens an uncached engine gives, and the cache's invariants and payloads hold after."""
    model = model_for("bamba-tiny")
    system = rand_tokens(40, seed=50)
    prompts = [system + rand_tokens(10 + i, seed=51 + i) for i in range(6)]
    expected = [Engine(model, 0, admission="none").generate(p, 5).output_tokens for p in prompts]
    engine = Engine(model, big_capacity(model))
    engine.generate(prompts[0], 5)
    engine.generate(prompts[1], 5)  # the shared system prompt is now a branch checkpoint at 40
    got: dict[int, tuple[int, ...]] = {}
    hits: list[int] = []

    def serve(i: int) -> None:
        for _ in range(2):
            r = engine.generate(prompts[i], 5)
            got[i] = r.output_tokens
            hits.append(r.usable_hit_len)

    _run_threads(serve, [(i,) for i in range(len(prompts))])
    assert [got[i] for i in range(len(prompts))] == expected
    assert engine.cache.num_in_flight == 0 and engine.cache.stats.num_requests == 14
    assert len(hits) == 12 and min(hits) >= 40
    check_payloads(engine)


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


@pytest.mark.parametrize("bad,message", [
    ([], "no token ids: a request needs at least one token"),
    (np.array([], dtype=np.int64), "no token ids"),
    (torch.tensor([]), "no token ids"),
    ([0.5, 1.0], "token ids must be integers, got float32 values such as 0.5"),
    (["1", "2"], r"token ids must be a 1-D sequence of integers, got \['1', '2'\]"),
    (np.array(["a", "b"]), "token ids must be a 1-D sequence of integers"),
    ([1, None], "token ids must be a 1-D sequence of integers"),
    ([[1, 2], [3]], "token ids must be a 1-D sequence of integers"),
    ([[1, 2]], r"1-D sequence of integers, got shape \(1, 2\)"),
    ([True, False], "token ids must be integers, got bool"),
])
def test_bad_token_ids_get_clear_messages(bad, message):
    """Empty input used to say "got float32", and strings raised a raw torch error."""
    model = model_for("bamba-tiny")
    engine = Engine(model, big_capacity(model))
    with pytest.raises(TokenRangeError, match=message):
        engine.replay(bad, [1])
    with pytest.raises(TokenRangeError, match=message):
        engine.replay([1, 2], bad)
    assert engine.cache.stats.num_requests == 0


def test_text_where_ids_are_expected_says_so():
    model = model_for("bamba-tiny")
    engine = Engine(model, big_capacity(model))
    with pytest.raises(TokenRangeError, match="got text 'hello'; tokenize it first"):
        model.check_tokens("hello")
    with pytest.raises(EngineError, match="output_tokens must be token ids, got text"):
        engine.replay([1, 2], "world")
    with pytest.raises(EngineError, match="max_new_tokens must be >= 1"):
        engine.generate([1, 2], 0)
    assert engine.cache.stats.num_requests == 0


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


def test_chunk_boundary_engine_takes_prefill_states_on_the_chunk_grid():
    model = model_for("bamba-tiny")  # scan chunk 16
    engine = Engine(model, big_capacity(model), checkpointing="chunk-boundary")
    system = rand_tokens(37, seed=20)  # a branch at 37: not a chunk boundary
    engine.replay(system + rand_tokens(10, seed=21), rand_tokens(4, seed=22))
    r = engine.replay(system + rand_tokens(12, seed=23), rand_tokens(4, seed=24))
    assert r.prefill_checkpoints == (32,)  # the core placed the branch on the grid
    assert r.captured == r.admitted == (32, 53) and r.num_prefill_calls == 2
    assert engine.cache.stats.checkpoints_unavailable == 0
    third = engine.replay(system + rand_tokens(5, seed=25), rand_tokens(2, seed=26))
    assert third.usable_hit_len == 32  # resumes at the boundary and recomputes 5 shared tokens
    check_payloads(engine)


class _FakeTime:
    """Stands in for the ``time`` module inside the engine: the clock moves only when a wrapped
    prefill runs, by a scripted amount per call."""

    def __init__(self, durations):
        self.now = 0.0
        self.durations = list(durations)

    def perf_counter(self):
        return self.now

    thread_time = perf_counter


def test_ttft_repeats_report_the_fastest_identical_run(monkeypatch):
    import marconi.engine.engine as engine_mod

    model = model_for("bamba-tiny")
    fake = _FakeTime([5.0, 2.0, 7.0, 3.0])
    real_prefill = engine_mod.prefill

    def scripted_prefill(*args, **kwargs):
        fake.now += fake.durations.pop(0)
        return real_prefill(*args, **kwargs)

    monkeypatch.setattr(engine_mod, "time", fake)
    monkeypatch.setattr(engine_mod, "prefill", scripted_prefill)
    once = Engine(model, big_capacity(model))
    thrice = Engine(model, big_capacity(model), ttft_repeats=3)
    inp, out = _trace(num_sessions=1, turns=1)[0]
    b = thrice.replay_appended(inp, out)            # prefill runs take 5, 2 and 7
    assert (b.prefill_s, b.restore_s, b.lookup_s) == (2.0, 0.0, 0.0)
    assert b.ttft_s == 2.0 and b.ttft_cpu_s == 2.0
    a = once.replay_appended(inp, out)              # one run of 3
    assert (a.prefill_s, a.ttft_s) == (3.0, 3.0)
    assert (a.usable_hit_len, a.admitted, a.greedy_tokens) == (b.usable_hit_len, b.admitted, b.greedy_tokens)
    assert once.cache.stats == thrice.cache.stats
    with pytest.raises(ValueError, match="ttft_repeats"):
        Engine(model, big_capacity(model), ttft_repeats=0)


def test_text_prompts_use_the_project_tokenizer_by_default():
    import marconi.workloads.tokenizer as tokenizer_mod
    expected = tokenizer_mod.load_tokenizer().encode("Prefix caching for hybrid models.")
    model = model_for("qwen3_next-tiny")
    r = Engine(model, big_capacity(model)).generate("Prefix caching for hybrid models.", 2)
    assert r.input_len == len(expected)


def test_dead_tail_cuts_serve_the_engine_exactly():
    """``tails=reach`` in the real engine (issue 25): an agent that drops old observations gets its
    predicted-dead tails cut (tensors split, the tail's KVs and state released) and still generates
    the tokens of an uncached run, with the decisions of a size-only simulation, request for request."""
    model = model_for("bamba-tiny")
    spec = model.spec
    capacity = 4 * spec.ssm_checkpoint_bytes + 300 * spec.kv_bytes_per_token  # tight: it cuts and evicts
    engine = Engine(model, capacity, admission="marconi:tails=reach", eviction="lru")
    plain = Engine(model, 0, admission="none")
    sim = PrefixCache(spec, capacity, "marconi:tails=reach", "lru")
    system = rand_tokens(24, seed=3)
    calls, keep = 8, 2
    obs = {(s, t): rand_tokens(40, seed=900 + 10 * s + t) for s in range(3) for t in range(calls)}
    hole = {(s, t): rand_tokens(2, seed=700 + 10 * s + t) for s in range(3) for t in range(calls)}
    acts: dict[tuple[int, int], list[int]] = {}
    for t in range(calls):
        for s in range(3):
            prompt = list(system) + rand_tokens(6, seed=50 + s)
            for i in range(t):  # (action, observation) pairs so far, old observations elided
                prompt += acts[(s, i)] + (obs[(s, i)] if i >= t - keep else hole[(s, i)])
            r, uncached = engine.generate(prompt, 4), plain.generate(prompt, 4)
            assert r.output_tokens == uncached.output_tokens and logits_apart(r, uncached) <= tolerance(model), (t, s)
            match, ins = sim.process(prompt, r.output_tokens)
            assert (r.usable_hit_len, r.cached, r.admitted) == (match.usable_hit_len, ins.cached, ins.admitted)
            acts[(s, t)] = list(r.output_tokens)
            check_payloads(engine)
    stats = engine.cache.stats
    assert stats == sim.stats and stats.reused_tokens > 0
    assert stats.tail_trims > 0 and stats.tail_tokens_trimmed > 0
