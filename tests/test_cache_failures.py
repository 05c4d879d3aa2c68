"""PrefixCache stays consistent when a callback raises (issue 21: bugs 1 and 11, and the promise
that any callback — ``kv``, ``states``, observers, ``PayloadOps``, the policies, the clock — may fail
without corrupting the cache).

The payloads here are real objects that remember what they hold: a KV payload the tokens of its
edge, a state payload the prefix it is the state after. So besides ``check_invariants`` (bytes,
locks, shape, candidate index), every test checks that each node's payloads are exactly its own
and were never released — a split, join or eviction interrupted half-way would break that.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marconi.core.admission import BaseAdmission, make_admission
from marconi.core.cache import CacheObserver, InvariantError, PrefixCache
from marconi.core.eviction import EvictionBase, make_eviction
from marconi.core.model import ModelSpec
from marconi.core.registry import ConfigError

# 10 bytes of KV per token, 100 bytes per SSM checkpoint: capacities of a few hundred bytes evict often.
SPEC = ModelSpec("tiny", num_attn_layers=1, num_ssm_layers=1, num_mlp_layers=1, d_model=5, ssm_state_dim=1,
                 conv_kernel=0, num_kv_heads=1, head_dim=5, bytes_per_elem=1, ssm_state_width=100)
STEMS = [np.array(s, dtype=np.int32) for s in ([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 9, 9], [4, 4, 4, 4, 4, 4])]


class Boom(Exception):
    """An injected callback failure."""


class Faults:
    """Whether the next callback raises: a drawn schedule, one entry per callback call (then none)."""

    def __init__(self, schedule: Iterable[bool] = ()) -> None:
        self.schedule = list(schedule)
        self.calls = 0
        self.on = True

    def maybe(self, where: str) -> None:
        i, self.calls = self.calls, self.calls + 1
        if self.on and i < len(self.schedule) and self.schedule[i]:
            raise Boom(where)


class KV:
    """A KV payload: the edge tokens it holds."""

    __slots__ = ("tokens", "released")

    def __init__(self, tokens: tuple[int, ...]) -> None:
        self.tokens, self.released = tokens, False


class State:
    """An SSM payload: the prefix it is the state after."""

    __slots__ = ("prefix", "released")

    def __init__(self, prefix: tuple[int, ...]) -> None:
        self.prefix, self.released = prefix, False


class Payloads:
    """``PayloadOps`` over :class:`KV` / :class:`State` that fails where ``faults`` says and logs
    misuse (a payload released twice, or a released one still used) instead of raising it, so the
    cache cannot mistake the test's complaint for an injected failure."""

    def __init__(self, faults: Faults) -> None:
        self.faults = faults
        self.misuse: list[str] = []
        self.sequence: np.ndarray = np.empty(0, dtype=np.int32)  # what state_at's positions index

    def split_kv(self, kv: KV, at: int) -> tuple[KV, KV]:
        self.faults.maybe("split_kv")
        if kv.released:
            self.misuse.append("split of a released KV")
        return KV(kv.tokens[:at]), KV(kv.tokens[at:])

    def join_kv(self, first: KV, second: KV) -> KV:
        self.faults.maybe("join_kv")
        if first.released or second.released:
            self.misuse.append("join of a released KV")
        return KV(first.tokens + second.tokens)

    def release(self, payload: Any) -> None:
        if payload.released:
            self.misuse.append(f"{type(payload).__name__} released twice")
        payload.released = True
        self.faults.maybe("release")  # released, then reported as failed: the cache must not retry it

    def state_at(self, pos: int) -> State:
        self.faults.maybe("state_at")
        return State(tuple(self.sequence[:pos].tolist()))


class Watcher(CacheObserver):
    """An observer that fails where ``faults`` says, after recording what it was told."""

    def __init__(self, faults: Faults) -> None:
        self.faults = faults
        self.begun: set[int] = set()
        self.ended: dict[int, int] = {}

    def on_begin(self, cache: PrefixCache, handle: Any) -> None:
        self.begun.add(handle.request_id)
        self.faults.maybe("on_begin")

    def _end(self, handle: Any, event: str) -> None:
        self.ended[handle.request_id] = self.ended.get(handle.request_id, 0) + 1
        self.faults.maybe(event)

    def on_finish(self, cache: PrefixCache, handle: Any, output_tokens: np.ndarray) -> None:
        self._end(handle, "on_finish")

    def on_abort(self, cache: PrefixCache, handle: Any) -> None:
        self._end(handle, "on_abort")

    def on_prefill(self, cache: PrefixCache, handle: Any) -> None:
        self.faults.maybe("on_prefill")

    def on_first_eviction(self, cache: PrefixCache) -> None:
        self.faults.maybe("on_first_eviction")


class FaultyEviction(EvictionBase):
    """An eviction policy whose ``choose`` may fail (delegates to a registry policy)."""

    def __init__(self, inner: str, faults: Faults) -> None:
        self.inner, self.faults = make_eviction(inner), faults
        self.name = self.inner.name
        self.evicts_inner_nodes = self.inner.evicts_inner_nodes
        self.efficiency_variant = self.inner.efficiency_variant

    def choose(self, candidates: Any) -> int:
        self.faults.maybe("choose")
        return self.inner.choose(candidates)

    def describe(self) -> dict[str, object]:
        return self.inner.describe()


class FaultyAdmission(BaseAdmission):
    """An admission policy whose plans may fail (delegates to a registry policy)."""

    def __init__(self, inner: str, faults: Faults) -> None:
        self.inner, self.faults = make_admission(inner), faults
        self.name, self.page_size, self.caches = self.inner.name, self.inner.page_size, self.inner.caches

    def prefill_checkpoints(self, ctx: Any) -> Iterable[int]:
        self.faults.maybe("prefill_checkpoints")
        return self.inner.prefill_checkpoints(ctx)

    def final_plan(self, ctx: Any, total_len: int) -> Any:
        self.faults.maybe("final_plan")
        return self.inner.final_plan(ctx, total_len)

    def describe(self) -> dict[str, object]:
        return self.inner.describe()


class Clock:
    """A clock that may fail; ticks once per read so recency keeps moving."""

    def __init__(self, faults: Faults) -> None:
        self.faults, self.now = faults, 0.0

    def __call__(self) -> float:
        self.faults.maybe("clock")
        self.now += 1.0
        return self.now


def check_payloads(cache: PrefixCache, payloads: Payloads) -> None:
    """Every node's KV holds exactly its edge, every state is the one after its position, and
    nothing the tree holds was released."""
    assert not payloads.misuse, payloads.misuse
    for node in cache.tree.iter_nodes():
        assert isinstance(node.kv, KV) and not node.kv.released, f"node {node.node_id}: KV missing or released"
        assert node.kv.tokens == tuple(node.tokens.tolist()), f"node {node.node_id}: KV of another edge"
        path: list[int] = []
        up = node
        while up is not cache.tree.root:
            path[:0] = up.tokens.tolist()
            up = up.parent
        for pos, state in zip(node.ckpt_positions, node.ckpt_states):
            assert isinstance(state, State) and not state.released, f"node {node.node_id}: state missing or released"
            assert state.prefix == tuple(path[:pos]), f"node {node.node_id}: state at {pos} is of another prefix"


def kv_of(sequence: np.ndarray, faults: Faults):
    def kv(start: int, end: int) -> KV:
        faults.maybe("kv")
        return KV(tuple(sequence[start:end].tolist()))
    return kv


def states_of(sequence: np.ndarray, faults: Faults, unavailable: bool):
    def states(pos: int) -> State | None:
        faults.maybe("states")
        return None if unavailable and pos % 3 == 0 else State(tuple(sequence[:pos].tolist()))
    return states


def build_tokens(stem_index: int, tail: list[int]) -> np.ndarray:
    stem = STEMS[stem_index] if stem_index < len(STEMS) else np.empty(0, dtype=np.int32)
    tokens = np.concatenate((stem, np.array(tail, dtype=np.int32)))
    return tokens if tokens.size else np.array([0], dtype=np.int32)


class Harness:
    """A cache whose every callback may fail, and the requests in flight in it."""

    def __init__(self, capacity: int, admission: str, eviction: str, schedule: Iterable[bool]) -> None:
        self.faults = Faults(schedule)
        self.payloads = Payloads(self.faults)
        self.watcher = Watcher(self.faults)
        self.cache = PrefixCache(SPEC, capacity, FaultyAdmission(admission, self.faults),
                                 FaultyEviction(eviction, self.faults), clock=Clock(self.faults),
                                 payloads=self.payloads)
        self.cache.add_observer(self.watcher)
        self.in_flight: list[tuple[Any, np.ndarray]] = []

    def begin(self, tokens: np.ndarray, output: np.ndarray) -> None:
        before = self.cache.num_in_flight
        try:
            handle = self.cache.begin(tokens)
        except Boom:
            assert self.cache.num_in_flight == before, "a begin that raised left a request in flight"
            return
        self.in_flight.append((handle, output))

    def finish(self, index: int, supply: str) -> None:
        handle, output = self.in_flight.pop(index % len(self.in_flight))
        sequence = np.concatenate((handle.tokens, output))
        self.payloads.sequence = sequence
        states = None if supply == "state_at" else states_of(sequence, self.faults, supply == "some-missing")
        try:
            self.cache.finish(handle, output, states=states, kv=kv_of(sequence, self.faults))
        except Boom:
            pass
        assert not handle.active, "finish promises the handle is finished even if it raises"

    def prefill(self, index: int) -> None:
        handle, _ = self.in_flight[index % len(self.in_flight)]
        self.payloads.sequence = handle.tokens
        try:
            self.cache.insert_prefill(handle, kv=kv_of(handle.tokens, self.faults))
        except Boom:
            pass
        assert handle.active, "insert_prefill never ends the request"

    def abort(self, index: int) -> None:
        handle, _ = self.in_flight.pop(index % len(self.in_flight))
        try:
            self.cache.abort(handle)
        except Boom:
            pass
        assert not handle.active

    def check(self) -> None:
        self.cache.check_invariants()
        check_payloads(self.cache, self.payloads)


request = st.tuples(st.integers(0, len(STEMS)), st.lists(st.integers(0, 6), max_size=16),
                    st.lists(st.integers(0, 6), max_size=6))
operation = st.one_of(
    st.tuples(st.just("begin"), request),
    st.tuples(st.just("finish"), st.tuples(st.integers(0, 7), st.sampled_from(["state_at", "states",
                                                                               "some-missing"]))),
    st.tuples(st.just("prefill"), st.integers(0, 7)),
    st.tuples(st.just("abort"), st.integers(0, 7)),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(operation, min_size=1, max_size=30),
       schedule=st.lists(st.sampled_from([False, False, False, True]), max_size=150),
       capacity=st.integers(150, 700),
       admission=st.sampled_from(["marconi", "every-block:block=2", "every-block:block=3,runs=false", "uniform:m=2"]),
       eviction=st.sampled_from(["lru", "flop-aware:alpha=0", "flop-aware:alpha=1.5"]))
def test_the_cache_stays_consistent_and_keeps_serving_when_any_callback_raises(ops, schedule, capacity,
                                                                               admission, eviction):
    h = Harness(capacity, admission, eviction, schedule)
    for kind, arg in ops:
        if kind == "begin":
            stem, tail, out = arg
            h.begin(build_tokens(stem, tail), np.array(out, dtype=np.int32))
        elif h.in_flight:
            if kind == "finish":
                h.finish(*arg)
            elif kind == "prefill":
                h.prefill(arg)
            else:
                h.abort(arg)
        h.check()
    # No more failures: what is in flight finishes, and the cache serves on (under eviction pressure).
    h.faults.on = False
    while h.in_flight:
        h.finish(0, "states")
        h.check()
    for i in range(12):
        h.begin(build_tokens(i % (len(STEMS) + 1), [i % 7, (3 * i) % 7, 5]), np.array([i % 7, 1], dtype=np.int32))
        h.finish(0, "state_at")
        h.check()
    assert h.cache.num_in_flight == 0 and h.cache.locked_bytes == 0
    # every request the observer saw begin ended exactly once (finish or abort), whatever raised
    assert h.watcher.ended == {rid: 1 for rid in h.watcher.begun}


def test_a_kv_callback_that_raises_does_not_corrupt_the_cache():
    """Bug 1: ``_new_node`` linked the node before calling ``kv``; one simulated MemoryError left
    the candidate index out of sync and later evictions found no candidate."""
    cache = PrefixCache(SPEC, 600, "marconi", "lru")
    calls = {"n": 0}

    def kv(start: int, end: int) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise MemoryError("simulated allocator failure")

    rng = np.random.default_rng(0)
    failed = 0
    for i in range(200):
        tokens = np.concatenate((STEMS[i % 3], rng.integers(0, 6, size=int(rng.integers(1, 12)))))
        handle = cache.begin(tokens)
        try:
            cache.finish(handle, rng.integers(0, 6, size=2), kv=kv)
        except MemoryError:
            failed += 1
            assert not handle.active and cache.num_in_flight == 0
        cache.check_invariants()
    assert failed == 1 and cache.stats.evictions_leaf > 0


def test_a_raising_kv_inserts_nothing_of_its_node():
    cache = PrefixCache(SPEC, 10_000, "marconi", "lru")

    def kv(start: int, end: int) -> None:
        raise MemoryError("no room")

    handle = cache.begin([1, 2, 3])
    with pytest.raises(MemoryError):
        cache.finish(handle, [4], kv=kv)
    cache.check_invariants()
    assert cache.tree.num_nodes == 0 and cache.used_bytes == 0 and cache.stats.kv_tokens_inserted == 0
    assert cache.process([1, 2, 3], [4])[1].cached  # and it serves on


def test_finish_with_bad_output_releases_the_request():
    """Bug 11: the output was converted outside ``finish``'s ``try``: a bad output left the handle
    in flight and its path locked, against the promise that the handle is finished even if finish
    raises. Now it is released (as an abort: the observers are told so) and the error is clear."""
    cache = PrefixCache(SPEC, 10_000, "marconi", "lru")
    watcher = Watcher(Faults())
    cache.add_observer(watcher)
    cache.process([1, 2, 3, 4], [5])
    for bad, message in (([1.5], "integer token ids"), ([-3], "token id -3 at index 0 is negative"),
                         ([[1, 2]], "1-D sequence"), ([2**40], "does not fit in int32")):
        handle = cache.begin([1, 2, 3, 4, 5, 6])
        assert cache.locked_bytes > 0
        with pytest.raises(ValueError, match=message):
            cache.finish(handle, bad)
        assert not handle.active and cache.num_in_flight == 0 and cache.locked_bytes == 0
        assert watcher.ended[handle.request_id] == 1
        cache.check_invariants()
        with pytest.raises(ValueError, match="not in flight"):
            cache.finish(handle, [7])


def test_an_observer_that_raises_on_begin_leaves_nothing_locked():
    cache = PrefixCache(SPEC, 10_000, "marconi", "lru")
    faults = Faults()
    first, second = Watcher(faults), Watcher(Faults())
    cache.add_observer(first)
    cache.add_observer(second)
    cache.process([1, 2, 3], [4])
    faults.schedule, faults.calls = [True], 0   # the first observer's next call raises
    with pytest.raises(Boom):
        cache.begin([1, 2, 3, 4, 9])
    assert cache.num_in_flight == 0 and cache.locked_bytes == 0
    # both observers were told the request began, and that it ended
    assert second.begun == first.begun and second.ended == first.ended == {rid: 1 for rid in first.begun}
    cache.check_invariants()


def test_token_ids_must_be_non_negative():
    cache = PrefixCache(SPEC, 10_000, "marconi", "lru")
    with pytest.raises(ValueError, match=r"input_tokens: token id -1 at index 0 is negative; token ids are >= 0"):
        cache.begin([-1, 2])
    with pytest.raises(ValueError, match="token id -7 at index 2 is negative"):
        cache.begin(np.array([3, 4, -7, -1], dtype=np.int64))
    assert cache.num_in_flight == 0 and cache.stats.num_requests == 0
    handle = cache.begin(np.array([1, 2**31 - 1], dtype=np.uint64))   # unsigned ids that fit are fine
    assert handle.tokens.dtype == np.int32 and handle.tokens[-1] == 2**31 - 1
    cache.abort(handle)


@pytest.mark.parametrize("capacity, message", [
    ("1GB", r"got the text '1GB': pass bytes as a number \(e\.g\. 1e9\), or convert the text with "
            r"marconi\.units\.parse_bytes"),
    (b"10", "got the text"),
    (None, "must be a number of bytes, got NoneType"),
    (True, "must be a number of bytes, got bool"),
    ([1000], "must be a number of bytes, got list"),
    (float("nan"), "finite number >= 0"),
    (float("inf"), "finite number >= 0"),
    (-5, "finite number >= 0"),
])
def test_a_capacity_that_is_not_a_number_of_bytes_is_a_config_error(capacity, message):
    with pytest.raises(ConfigError, match=message):
        PrefixCache(SPEC, capacity, "marconi", "lru")


def test_numpy_capacities_are_numbers():
    assert PrefixCache(SPEC, np.int64(1000)).capacity_bytes == 1000
    assert PrefixCache(SPEC, np.float32(1e3)).capacity_bytes == 1000


def test_a_raising_release_still_evicts_consistently():
    """``release`` is called after the surgery: the evicted node is gone even if it raises, and the
    insertion that needed the room is abandoned cleanly (the handle released, the tree whole)."""
    faults = Faults()
    payloads = Payloads(faults)
    cache = PrefixCache(SPEC, 300, "marconi", "lru", payloads=payloads)
    for tokens in ([1, 2, 3, 4], [5, 6, 7, 8]):
        seq = np.array(tokens + [9], dtype=np.int32)
        payloads.sequence = seq
        cache.finish(cache.begin(tokens), [9], kv=kv_of(seq, faults))
    assert cache.used_bytes == 300                      # full: the next insertion must evict
    seq = np.array([7] * 9, dtype=np.int32)
    payloads.sequence = seq
    handle = cache.begin(seq[:-1])
    faults.schedule, faults.calls = [True] * 50, 0      # every payload callback raises from now on
    with pytest.raises(Boom, match="release"):
        cache.finish(handle, seq[-1:], kv=kv_of(seq, Faults()), states=states_of(seq, Faults(), False))
    assert not handle.active and cache.stats.evictions_leaf == 1 and cache.tree.num_nodes == 1
    cache.check_invariants()
    check_payloads(cache, payloads)
