"""The shadow α source's lag (issue 33): a rule switch takes effect ``lag`` requests later, nothing else
changes, and a worker thread's or a child process's replay gives exactly the inline replay's rules at
every request."""

from __future__ import annotations

import os
import signal
import struct

import pytest

from marconi.core.model import ModelSpec
from marconi.core.registry import ConfigError
from marconi.integrations.common.alpha import RequestObservation
from marconi.integrations.vllm.config import ENV_ADAPTIVE_LAG, ENV_ADAPTIVE_REPLAY, PluginConfig, default_replay
from marconi.integrations.vllm.models import PRESETS
from marconi.integrations.vllm.policy import ATTENTION, MAMBA, BlockEvictionState
from marconi.integrations.vllm.shadow import PoolShadowAlpha

LAG = 3


def _spec() -> ModelSpec:
    return ModelSpec.from_hf_config({"model_type": "qwen3_next", **PRESETS["qwen3_next-tiny"][1],
                                     "torch_dtype": "bfloat16"}, name="qwen3_next-tiny")


def _rules_in_force(lag: int, background: str | None, requests: list) -> tuple[list[tuple[float, str | None]], dict]:
    """``(alpha, efficiency)`` in force after each finished request, and the shadow's tuning record;
    ``background``: None (inline), ``"thread"`` or ``"process"``."""
    source = PoolShadowAlpha(lag=lag)
    BlockEvictionState(_spec(), (MAMBA, MAMBA, MAMBA, ATTENTION), 100, 384, source)
    if background:
        source.run_in_background(process=background == "process")
    seen = []
    try:
        for req in requests:
            version = source.rule_version
            source.observe(RequestObservation(req.input_tokens, req.output_tokens, 0, 0))
            seen.append((source.alpha(), source.efficiency()))
            # the version moves exactly when the rule in force does (an engine re-reads it then)
            assert (source.rule_version != version) == (len(seen) > 1 and seen[-1] != seen[-2] or
                                                        len(seen) == 1 and seen[0] != (0.0, None))
        return seen, source.tuning_record()
    finally:
        source.close()


def test_lag_delays_each_switch_by_lag_requests_and_the_workers_agree() -> None:
    from marconi.workloads import build_workload

    requests = list(build_workload("swe-sample:max_input_len=8192"))[:60]
    now, record = _rules_in_force(0, None, requests)
    assert len(set(now)) >= 2, "the shadow never switched: the test trace is not contended enough"
    lagged, lagged_record = _rules_in_force(LAG, None, requests)
    first = (0.0, None)                                   # lru, the family's first, until request LAG + 1
    assert lagged == [first] * LAG + now[:-LAG]
    assert lagged_record == record                        # the shadow itself saw the same requests
    threaded, threaded_record = _rules_in_force(LAG, "thread", requests)
    assert threaded == lagged and threaded_record == record
    forked, forked_record = _rules_in_force(LAG, "process", requests)
    assert forked == lagged and forked_record == record
    # lag 0 in the background: every read of the rule waits for the replay, so the rules are inline's
    for background in ("thread", "process"):
        assert _rules_in_force(0, background, requests) == (now, record)


def test_at_lag_0_in_the_background_the_pool_reads_the_rule_when_it_evicts() -> None:
    """The pool's ``finished`` does not wait for a lazily settling source; its evictions apply the
    inline rule at once, and each switch is reported at the first finish after an eviction read it."""
    from marconi.workloads import build_workload

    requests = list(build_workload("swe-sample:max_input_len=8192"))[:60]
    kinds = (MAMBA, MAMBA, MAMBA, ATTENTION)
    inline, lazy = PoolShadowAlpha(), PoolShadowAlpha()
    inline_state = BlockEvictionState(_spec(), kinds, 100, 384, inline)
    lazy_state = BlockEvictionState(_spec(), kinds, 100, 384, lazy)
    assert not inline.settles_lazily
    lazy.run_in_background()
    assert lazy.settles_lazily and lazy.unsettled == 0
    inline_reports, lazy_reports = [], []
    try:
        for i, req in enumerate(requests):
            event = RequestObservation(req.input_tokens, req.output_tokens, 0, 0)
            inline_reports.append(inline_state.finished(event))
            lazy_reports.append(lazy_state.finished(event))
            assert lazy.unsettled == 1 + i % 2
            if i % 2:                            # an eviction between these finishes reads the rule
                assert lazy_state.evict(0) == [] and lazy.unsettled == 0
                assert (lazy.alpha(), lazy.efficiency()) == (inline.alpha(), inline.efficiency())
    finally:
        lazy.close()
    switched = [(i, r) for i, r in enumerate(inline_reports) if r is not None]
    assert len(switched) >= 2, "the shadow never switched: the test trace is not contended enough"
    # read at the eviction after odd finishes, reported at the next finish (nothing lost, none twice)
    expected = {}
    for i, rule in switched:
        expected[i + 2 - i % 2] = rule       # the odd finish at or after i, then the finish after it
    assert {i: r for i, r in enumerate(lazy_reports) if r is not None} == {
        i: r for i, r in expected.items() if i < len(requests)}


@pytest.mark.parametrize("lag", [0, LAG])
def test_a_failed_replay_process_is_reported_and_the_rule_in_force_stays(lag: int) -> None:
    from marconi.workloads import build_workload

    requests = list(build_workload("swe-sample:max_input_len=8192"))[:LAG + 2]
    source = PoolShadowAlpha(lag=lag)
    state = BlockEvictionState(_spec(), (MAMBA, ATTENTION), 100, 384, source)
    source.run_in_background()
    source.observe(RequestObservation(requests[0].input_tokens, requests[0].output_tokens, 0, 0))
    source.drain()
    assert source.replay_pid is not None
    os.kill(source.replay_pid, signal.SIGKILL)     # the child dies (as an out-of-memory kill would)
    with pytest.raises(RuntimeError, match="replay process"):
        for req in requests[1:]:
            source.observe(RequestObservation(req.input_tokens, req.output_tokens, 0, 0))
            # the engine reads the rule at its next eviction: at lag 0 that read meets the failure,
            # keeps the rule in force without raising, and the next observe raises
            assert source.alpha() == 0.0
    assert source.alpha() == 0.0                 # lru, the rule in force before it died
    # the pool's eviction reads the rule without raising (an engine's allocation must not fail)
    assert state.evict(0) == [] and source.rule_version == 0
    with pytest.raises(RuntimeError, match="replay process"):          # and every observe says so
        source.observe(RequestObservation(requests[0].input_tokens, requests[0].output_tokens, 0, 0))
    source.close()


def test_lag_is_configured_and_checked() -> None:
    assert PluginConfig.from_env({"MARCONI_VLLM_POLICY": "marconi", "MARCONI_VLLM_ALPHA": "adaptive",
                                  ENV_ADAPTIVE_LAG: "4"}).adaptive_lag == 4
    config = PluginConfig(policy="marconi", alpha="adaptive", adaptive_lag=4)
    assert PluginConfig.from_env(config.to_env()) == config
    assert config.make_alpha_source(_spec()).lag == 4
    with pytest.raises(ConfigError, match=ENV_ADAPTIVE_LAG):
        PluginConfig.from_env({"MARCONI_VLLM_POLICY": "marconi", "MARCONI_VLLM_ALPHA": "adaptive",
                               ENV_ADAPTIVE_LAG: "-1"})
    with pytest.raises(ConfigError, match=ENV_ADAPTIVE_LAG):
        PluginConfig.from_env({"MARCONI_VLLM_POLICY": "marconi", ENV_ADAPTIVE_LAG: "2"})     # α fixed: no shadow
    with pytest.raises(ConfigError, match="before the first request"):
        source = PoolShadowAlpha()
        BlockEvictionState(_spec(), (MAMBA, ATTENTION), 100, 384, source)
        source.observe(RequestObservation([1, 2, 3], [4], 0, 0))
        source.run_in_background(process=False)


@pytest.mark.timeout(120)
def test_at_lag_0_a_process_replay_never_read_does_not_stall_the_engine() -> None:
    """Thousands of finished requests and no eviction to read the rule: more answers than the child's
    pipe holds, and more requests than the engine's; observe reads the answers itself in time."""
    source = PoolShadowAlpha()
    BlockEvictionState(_spec(), (MAMBA, ATTENTION), 100, 384, source)
    source.run_in_background()
    try:
        for i in range(30_000):
            source.observe(RequestObservation([1 + i % 5, 2, 3, 4], [5], 0, 0))
            assert source.unsettled <= source.max_unsettled
        assert source.alpha() == 0.0 and source.unsettled == 0
    finally:
        source.close()


@pytest.mark.parametrize("lag", [0, LAG])
def test_where_no_process_starts_lag_0_stays_inline_and_a_lag_takes_a_thread(lag: int, monkeypatch) -> None:
    import marconi.integrations.common.shadow_process as shadow_process

    def cannot_start(*args, **kwargs):
        raise OSError("no processes here")

    monkeypatch.setattr(shadow_process, "ShadowProcess", cannot_start)
    source = PoolShadowAlpha(lag=lag)
    BlockEvictionState(_spec(), (MAMBA, ATTENTION), 100, 384, source)
    source.run_in_background()
    assert source.settles_lazily is False and source.replay_pid is None
    assert source.observe(RequestObservation([1, 2, 3], [4], 0, 0)) is None and source.num_observed == 1
    assert (source.alpha(), source.efficiency()) == (0.0, None)
    source.close()


def test_the_replay_place_is_configured_and_checked() -> None:
    adaptive = {"MARCONI_VLLM_POLICY": "marconi", "MARCONI_VLLM_ALPHA": "adaptive"}
    config = PluginConfig.from_env({**adaptive, ENV_ADAPTIVE_REPLAY: "process"})
    assert config.adaptive_replay == "process" and config.replays_in_background
    assert PluginConfig.from_env(config.to_env()) == config
    assert PluginConfig.from_env({**adaptive, ENV_ADAPTIVE_LAG: "2"}).replays_in_background
    inline = PluginConfig.from_env({**adaptive, ENV_ADAPTIVE_REPLAY: "inline"})
    assert inline.replay == "inline" and not inline.replays_in_background
    assert PluginConfig.from_env({"MARCONI_VLLM_POLICY": "marconi", "MARCONI_VLLM_ALPHA": "0.5"}).replay is None
    assert PluginConfig.from_env(adaptive).replay == default_replay(0)
    for env, match in (({**adaptive, ENV_ADAPTIVE_REPLAY: "gpu"}, "choose one of inline, process"),
                       ({"MARCONI_VLLM_POLICY": "marconi", ENV_ADAPTIVE_REPLAY: "process"}, "needs MARCONI_VLLM_ALPHA"),
                       ({**adaptive, ENV_ADAPTIVE_REPLAY: "inline", ENV_ADAPTIVE_LAG: "4"},
                        "a lag replays in a process")):
        with pytest.raises(ConfigError, match=match) as err:
            PluginConfig.from_env(env)
        assert ENV_ADAPTIVE_REPLAY in str(err.value)


def test_an_unset_replay_place_goes_to_a_process_where_a_second_cpu_runs_it(monkeypatch) -> None:
    """Unset, the replay leaves the scheduler thread wherever the engine's process may use two CPUs;
    pinned to one, the child would take the scheduler's own CPU, so it stays inline."""
    adaptive = PluginConfig(policy="marconi", alpha="adaptive")
    for cpus, place in (({0}, "inline"), ({0, 1}, "process"), ({3, 7, 9}, "process")):
        monkeypatch.setattr(os, "sched_getaffinity", lambda _pid, cpus=cpus: cpus, raising=False)
        assert default_replay(0) == place and adaptive.replay == place
        assert adaptive.replays_in_background == (place == "process")
        assert default_replay(3) == "process"                # a lag always replays in a process
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert default_replay(0) == "inline"
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert default_replay(0) == "process"


def _chained_keys(tokens: list[int], block: int) -> list[bytes]:
    """vLLM-like block hashes: key i names tokens[:(i + 1) * block] (a sha256 chain)."""
    import hashlib

    keys, parent = [], b""
    for i in range(len(tokens) // block):
        parent = hashlib.sha256(parent + repr(tokens[i * block:(i + 1) * block]).encode()).digest()
        keys.append(parent)
    return keys


@pytest.mark.parametrize("kept_tokens", [1 << 22, 48, 7])
def test_the_child_rebuilds_every_request_from_the_known_prefixes(kept_tokens: int) -> None:
    import random

    from marconi.integrations.common.prefix_delta import PrefixDecoder, PrefixEncoder

    rng = random.Random(kept_tokens)
    encoder, decoder = PrefixEncoder(kept_tokens), PrefixDecoder(kept_tokens)
    histories: list[list[int]] = [[]]
    for _ in range(300):
        base = rng.choice(histories)
        cut = rng.randrange(len(base) + 1) if rng.random() < 0.3 else len(base)      # branch or go on
        prompt = base[:cut] + [rng.randrange(50) for _ in range(rng.randrange(1, 12))]
        output = [rng.randrange(50) for _ in range(rng.randrange(0, 6))]
        block = 4 if rng.random() < 0.9 else 3                   # an engine changing its block size
        keys = _chained_keys(prompt + output, block)[:rng.choice([None, 1, 99])]    # keys may stop short
        frame = encoder.encode(prompt, output, keys, block)
        got_prompt, got_output = decoder.decode(frame)
        assert got_prompt.tolist() == prompt and got_output.tolist() == output
        histories.append(prompt + output)
    # no keys: every token is sent, as int32 bytes (the wire's and the inline arrays' form)
    assert encoder.encode([1, 2], [3], [], 0)[-2:] == (struct.pack("2i", 1, 2), struct.pack("i", 3))
    assert encoder.encode([1, 1 << 40], [3], [], 0)[-2:][0] == [1, 1 << 40]     # not int32: the ids, for the reader's error
    # A conversation, each turn its history plus 10 new tokens: past the first turn, only what the
    # child lacks is sent (the new tokens, the last output and the partial block before them).
    history: list[int] = []
    for turn in range(20):
        prompt, output = history + [rng.randrange(50) for _ in range(10)], [rng.randrange(50) for _ in range(3)]
        frame = encoder.encode(prompt, output, _chained_keys(prompt + output, 4), 4)
        got_prompt, got_output = decoder.decode(frame)
        assert got_prompt.tolist() == prompt and got_output.tolist() == output
        if turn and kept_tokens >= 4 * 13:
            assert (len(frame[-2]) + len(frame[-1])) // 4 <= 10 + 3 + 3, (turn, frame[-2:])     # int32 bytes
        history = prompt + output


def test_the_process_with_prefix_keys_makes_the_inline_choices() -> None:
    from collections import deque

    from marconi.integrations.common.shadow_process import ShadowProcess
    from marconi.workloads import build_workload

    requests = list(build_workload("swe-sample:max_input_len=8192"))[:60]
    inline = PoolShadowAlpha()
    BlockEvictionState(_spec(), (MAMBA, MAMBA, MAMBA, ATTENTION), 100, 384, inline)
    expected = []
    for req in requests:
        inline.observe(RequestObservation(req.input_tokens, req.output_tokens, 0, 0))
        expected.append(inline.chooser.current)
    assert len(set(expected)) >= 2
    got: deque[int] = deque()
    worker = ShadowProcess(inline.rules, inline.decay, inline.hysteresis, _spec(), inline.cache.capacity_bytes, got,
                           kept_tokens=4096, batch=3)
    try:
        for req in requests:
            prompt, output = list(map(int, req.input_tokens)), list(map(int, req.output_tokens))
            worker.submit(RequestObservation(prompt, output, 0, 0, _chained_keys(prompt + output, 64), 64))
        worker.wait_for(len(requests))
        assert list(got) == expected
        assert worker.tuning_record() == inline.tuning_record()
    finally:
        worker.close()


@pytest.mark.parametrize("lag", [0, LAG])
def test_the_inline_replay_with_prefix_keys_makes_the_same_choices(lag: int) -> None:
    """An inline replay fed the engine's lists and block hashes (it converts only the tokens past the
    deepest prefix seen), or the lists alone (converted whole), makes the choices of one fed whole
    arrays, request by request."""
    from marconi.integrations.common.prefix_delta import PrefixTokens
    from marconi.workloads import build_workload

    requests = list(build_workload("swe-sample:max_input_len=8192"))[:60]
    # a small bound: prefixes are forgotten along the way; keys of any size take the delta
    plain, keyed = PoolShadowAlpha(lag=lag), PoolShadowAlpha(lag=lag, tokens=PrefixTokens(4096, min_key_tokens=1))
    lists = PoolShadowAlpha(lag=lag)
    for source in (plain, keyed, lists):
        BlockEvictionState(_spec(), (MAMBA, MAMBA, MAMBA, ATTENTION), 100, 384, source)
    rules = []
    for req in requests:
        plain.observe(RequestObservation(req.input_tokens, req.output_tokens, 0, 0))
        prompt, output = list(map(int, req.input_tokens)), list(map(int, req.output_tokens))
        keyed.observe(RequestObservation(prompt, output, 0, 0, _chained_keys(prompt + output, 64), 64))
        lists.observe(RequestObservation(prompt, output, 0, 0))
        for other in (keyed, lists):
            assert other.alpha() == plain.alpha() and other.efficiency() == plain.efficiency()
        rules.append(plain.chooser.current)
    assert len(set(rules)) >= 2, "the shadow never switched: the test trace is not contended enough"
    for other in (keyed, lists):
        assert other.tuning_record() == plain.tuning_record()
        assert other.cache.stats.to_dict() == plain.cache.stats.to_dict()


def test_prefix_tokens_are_the_requests_and_a_failure_starts_over() -> None:
    import numpy as np

    from marconi.integrations.common.prefix_delta import PrefixTokens

    delta = PrefixTokens(min_key_tokens=1)
    history = list(range(1, 21))
    for turn in range(4):
        prompt, output = history + [7, 8, 9], [turn]
        got = delta.arrays(prompt, output, _chained_keys(prompt + output, 4), 4)
        assert got[0].dtype == np.int32 and got[0].tolist() == prompt and got[1].tolist() == output
        history = prompt + output
    array = np.arange(5)
    assert delta.arrays(array, [1], _chained_keys([0, 1, 2, 3, 4, 1], 4), 4)[0] is array    # arrays pass through
    whole = delta.arrays([1, 2], [3], [], 0)                              # without keys: converted whole
    assert [a.dtype for a in whole] == [np.int32, np.int32] and [a.tolist() for a in whole] == [[1, 2], [3]]
    short = list(range(300))                           # keys under 256 tokens (the default): converted whole
    assert PrefixTokens().arrays(short, [], _chained_keys(short, 4), 4)[0].tolist() == short
    for wrong in ([1, 1 << 31], [1, 2.5]):            # ids an array cannot hold: passed on, for the reader's error
        assert delta.arrays(wrong, [], [], 0) == (wrong, [])
    for tail in ([1, 2, 3, 4, 2.5], (1, 2, 3, 4, 2.5)):   # a non-integer id in the delta's tail: raised, never truncated
        with pytest.raises(TypeError):
            PrefixTokens(min_key_tokens=1).arrays(tail, [], _chained_keys([1, 2, 3, 4, 5], 4), 4)
    bad = history + [1 << 31]                                                             # outside int32
    with pytest.raises(OverflowError):
        delta.arrays(bad, [], _chained_keys(bad, 4), 4)
    prompt = history + [5]               # the halves started over: the next request is read whole, and exact
    got = delta.arrays(prompt, [2], _chained_keys(prompt + [2], 4), 4)
    assert got[0].tolist() == prompt and got[1].tolist() == [2]
