"""What a serving engine embedding ``PrefixCache`` relies on (audit Y): a snapshot restores a cache
that decides as the source would, the adaptive default is reachable by name, rule labels fail as
ConfigErrors, the exported contracts are importable from ``marconi.core`` and runtime-checkable,
and the public calls hold the lock."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import pytest

import marconi.core as core
from marconi.core.cache import ManualClock, PrefixCache
from marconi.core.candidates import CandidateTable
from marconi.core.eviction import (Candidates, Touch, min_max, register_rule_label, rule_from_label,
                                   unregister_rule_label)
from marconi.core.registry import ConfigError
from marconi.core.store import PayloadOps, SizeOnlyPayloads
from marconi.workloads import agent_trace

SPEC, CAPACITY, EVICTION = "paper-7b", 2.0e9, "flop-aware:alpha=1.0"


@pytest.fixture(scope="module")
def requests():
    """The audit's trace: 26 agent calls on 4 sessions sharing a system prompt."""
    return list(agent_trace(num_sessions=4, calls=(5, 7), system_prompt_len=400, seed=3))


def _replay(cache, requests):
    """Per request: (usable hit, KV hit, admitted positions, inserted tokens)."""
    out = []
    for r in requests:
        handle = cache.begin(r.input_tokens)
        result = cache.finish(handle, r.output_tokens)
        out.append((handle.match.usable_hit_len, handle.match.kv_hit_len, result.admitted, result.inserted_tokens))
    return out


def _warm(requests, eviction=EVICTION):
    base = PrefixCache(SPEC, CAPACITY, "marconi", eviction)
    for r in requests[:14]:
        base.process(r.input_tokens, r.output_tokens)
    return base


# ---------------------------------------------------------------- finding 1: snapshot fidelity
def test_a_restored_logical_clock_cache_decides_as_the_original(requests):
    """A snapshot of a cache on its logical clock, restored with ``clock=None``, keeps a logical clock
    ticking from the snapshot's time: a FLOP-aware rule (which reads times) then decides request for
    request as the original would (the audit found 4 of 26 differing with a frozen clock)."""
    base = _warm(requests)
    snap = base.snapshot()
    restored = PrefixCache.from_snapshot(snap, SPEC, CAPACITY, "marconi", EVICTION)
    original = base.clone(EVICTION)
    assert _replay(restored, requests) == _replay(original, requests)
    assert restored.keeps_logical_clock and restored.clock() == original.clock()
    assert snap.logical_clock is True
    restored.check_invariants()


def test_an_explicit_clock_still_restores_and_a_callers_clock_needs_one(requests):
    """An explicit ``ManualClock`` is set to the snapshot's time and left to the caller (who may
    tick it like the logical clock: the same decisions). A snapshot of a cache on a caller's clock
    records it, and restoring it without a clock is a ConfigError that says to pass one."""
    base = _warm(requests)
    snap = base.snapshot()
    clock = ManualClock()
    restored = PrefixCache.from_snapshot(snap, SPEC, CAPACITY, "marconi", EVICTION, clock=clock)
    assert clock.now == snap.clock_value and not restored.keeps_logical_clock
    hits = []
    for r in requests:
        clock.tick()
        handle = restored.begin(r.input_tokens)
        clock.tick()
        result = restored.finish(handle, r.output_tokens)
        hits.append((handle.match.usable_hit_len, handle.match.kv_hit_len, result.admitted, result.inserted_tokens))
    assert hits == _replay(base.clone(EVICTION), requests)

    timed = ManualClock(5.0)
    theirs = PrefixCache(SPEC, CAPACITY, "marconi", EVICTION, clock=timed)
    theirs.process(requests[0].input_tokens, requests[0].output_tokens)
    their_snap = theirs.snapshot()
    assert their_snap.logical_clock is False
    with pytest.raises(ConfigError, match="caller's clock.*pass clock=ManualClock"):
        PrefixCache.from_snapshot(their_snap, SPEC, CAPACITY, "marconi", EVICTION)
    PrefixCache.from_snapshot(their_snap, SPEC, CAPACITY, "marconi", EVICTION, clock=ManualClock()).check_invariants()


def test_a_snapshot_with_a_malformed_clock_kind_is_refused(requests):
    base = _warm(requests)
    snap = base.snapshot()
    snap.logical_clock = "yes"
    with pytest.raises(ConfigError, match="snapshot.logical_clock"):
        PrefixCache.from_snapshot(snap, SPEC, CAPACITY, "marconi", EVICTION)


# ---------------------------------------------------------------- finding 3: the adaptive default
def test_eviction_marconi_points_to_worlds():
    """``eviction="marconi"`` is refused, and the error names the eviction the default system uses."""
    with pytest.raises(ConfigError, match="unknown eviction policy 'marconi'.*eviction='worlds'"):
        PrefixCache(SPEC, CAPACITY, "marconi", "marconi")
    with pytest.raises(ConfigError, match="eviction='worlds'"):
        PrefixCache(SPEC, CAPACITY, "marconi", "marconi:alpha=1")
    cache = PrefixCache(SPEC, CAPACITY, admission="marconi", eviction="worlds")
    assert cache.describe()["eviction"] == "worlds" and cache.chooser is not None


# ---------------------------------------------------------------- finding 6: rule labels
@dataclass(frozen=True)
class _Deep:
    weight: float = 1.0
    candidates: Candidates = Candidates.SINGLE_CHILD
    touch: Touch = Touch.HIT
    tails: bool = False

    def label(self) -> str:
        return f"deep{self.weight:g}"

    def scores(self, table: CandidateTable) -> np.ndarray:
        time, _ = table.recency(self.touch)
        return min_max(time) + self.weight * (1.0 - min_max(table.depth.astype(np.float64)))


@pytest.fixture()
def careless_parser():
    """The parser architecture.md once showed: ``float('')`` raises on the label ``deep``."""
    register_rule_label("deep-test", lambda text: _Deep(float(text[4:])) if text.startswith("deep") else None)
    yield
    unregister_rule_label("deep-test")


def test_a_parser_error_becomes_a_config_error_naming_the_label(careless_parser):
    assert rule_from_label("deep2") == _Deep(2.0)
    with pytest.raises(ConfigError, match=r"rule 'deep': label parser 'deep-test' raised ValueError.*lru\[t\]") as info:
        rule_from_label("deep")
    assert isinstance(info.value.__cause__, ValueError)
    cache = PrefixCache(SPEC, CAPACITY, "marconi", EVICTION)
    with pytest.raises(ConfigError, match="rule 'deepx'"):
        cache.set_rule("deepx")


def test_a_label_that_is_not_a_string_is_a_config_error():
    with pytest.raises(ConfigError, match="a rule label is a string.*a<alpha>"):
        rule_from_label(5)


# ---------------------------------------------------------------- findings 8, 10: exports
def test_payload_ops_is_runtime_checkable():
    assert isinstance(SizeOnlyPayloads(), PayloadOps)
    assert not isinstance(object(), PayloadOps)


def test_the_names_an_embedder_needs_are_exported_by_marconi_core():
    needed = {"CachedPrefix", "InsertResult", "MatchResult", "CacheStats", "ReplayHandle", "SIZE_ONLY",
              "SizeOnlyPayloads", "Rule", "register_rule_label", "CandidateTable", "EvictionPolicy",
              "AdmissionPolicy", "Candidates", "Touch", "min_max", "RulePolicy", "EvictionBase"}
    assert needed <= set(core.__all__)
    assert all(hasattr(core, name) for name in core.__all__)
    cache = PrefixCache(SPEC, CAPACITY)
    handle = cache.begin([1, 2, 3, 4])
    assert isinstance(handle.match, core.MatchResult)
    assert isinstance(cache.cached_prefix(handle), core.CachedPrefix)
    assert isinstance(cache.finish(handle, [5]), core.InsertResult)
    assert isinstance(cache.stats, core.CacheStats)
    assert isinstance(_Deep(), core.Rule)


# ---------------------------------------------------------------- finding 9: describe holds the lock
def test_describe_holds_the_cache_lock():
    cache = PrefixCache(SPEC, CAPACITY)
    got: list[dict] = []
    with cache.lock:
        worker = threading.Thread(target=lambda: got.append(cache.describe()))
        worker.start()
        worker.join(0.3)
        assert worker.is_alive() and not got       # waits for the lock this thread holds
    worker.join(5)
    assert got and got[0]["eviction"] == "lru"
