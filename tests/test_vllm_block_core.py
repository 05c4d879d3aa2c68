"""The compiled block core makes the Python core's choices (marconi.integrations.vllm.blockcore).

The same random pool event streams (tests/test_vllm_victim_index.py's ``Events``) drive one
``BlockEvictionState`` per core in lockstep; after every event both must name the same victim, and
every 25 events the same rows and keys, and pass ``check_invariants`` (rows
re-derived from the block sets). ``MARCONI_BLOCK_CORE=python`` skips nothing here: the compiled
core must be built wherever this suite runs (setup.py builds it with the editable install).
"""

from __future__ import annotations

import numpy as np
import pytest

from marconi.integrations.vllm.blockcore import BLOCK_CORE_ENV, PyBlockCore, compiled_core, new_core
from marconi.core.eviction import EvictionRule
from marconi.integrations.common.alpha import FixedRule
from marconi.integrations.vllm.policy import REASONS, BlockEvictionState
from test_vllm_victim_index import B, KINDS, MODES, SPEC, Events, Switching


class Twin:
    """Forwards every event to two states (one per core)."""

    def __init__(self, a: BlockEvictionState, b: BlockEvictionState) -> None:
        self.a, self.b = a, b

    def __getattr__(self, name: str):
        first, second = getattr(self.a, name), getattr(self.b, name)
        if not callable(first):
            return first
        def both(*args):
            got = first(*args)
            assert second(*args) == got, name
            return got
        return both


def test_the_compiled_core_is_built() -> None:
    assert compiled_core() is not None, "marconi.integrations.vllm._blockcore is not built: `pip install -e .` needs gcc"


@pytest.mark.parametrize("name, source, efficiency", MODES, ids=[m[0] for m in MODES])
@pytest.mark.parametrize("seed", range(3))
def test_both_cores_choose_alike_after_every_event(name: str, source: object, efficiency: str, seed: int,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    states = []
    for core in ("c", "python"):
        monkeypatch.setenv(BLOCK_CORE_ENV, core)
        states.append(BlockEvictionState(SPEC, KINDS, 120, B, Switching() if isinstance(source, Switching) else source,
                                         efficiency))
    assert [s.core for s in states] == ["c", "python"]
    twin = Twin(*states)
    events = Events(twin, np.random.default_rng(seed), 120)
    for step in range(600):
        if isinstance(source, Switching):
            states[1].alpha_source.i = states[0].alpha_source.i
        events.step()
        assert states[0].next_victim() == states[1].next_victim(), step
        if step % 25 == 0:
            for view in ("free_cached", "release_seq", "candidate"):
                assert np.array_equal(getattr(states[0], view), getattr(states[1], view)), (view, step)
            for variant in ("total", "marginal"):
                assert np.array_equal(states[0].flop_eff_of(variant), states[1].flop_eff_of(variant)), step
            assert list(states[0].reason) == list(states[1].reason), step
            assert [states[0].keys_of(b) for b in range(120)] == [states[1].keys_of(b) for b in range(120)], step
            for s in states:
                s.check_invariants([(b, p, g) for b, keys in events.keys.items() for p, g in keys])
    assert events.victims > 50


def test_the_choice_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BLOCK_CORE_ENV, "python")
    assert isinstance(new_core((False, True), 4, 2, lambda d: (1.0, 1.0)), PyBlockCore)
    monkeypatch.setenv(BLOCK_CORE_ENV, "fast")
    with pytest.raises(Exception, match="MARCONI_BLOCK_CORE='fast'"):
        new_core((False, True), 4, 2, lambda d: (1.0, 1.0))


class _Batched(Events):
    """Events whose evictions go through ``BlockEvictionState.evict`` (1-4 victims a call) on one
    state while its twin evicts the old way (``next_victim``, ``taken``, then ``uncached`` per key in
    the events' own order, not the core's); the other events reach both."""

    def __init__(self, batched: BlockEvictionState, looped: BlockEvictionState, rng: np.random.Generator) -> None:
        super().__init__(Twin(batched, looped), rng, 120)
        self.batched, self.looped = batched, looped

    def evict(self) -> None:
        count = int(self.rng.integers(1, 5))
        got = self.batched.evict(count)
        expected = []
        for _ in range(count):
            victim = self.looped.next_victim()
            if victim is None:
                break
            expected.append(victim)
            self.looped.taken(victim.block_id)
            for prefix, group in self.keys.pop(victim.block_id, []):
                self.looped.uncached(victim.block_id, prefix, group)
            self.free.discard(victim.block_id)
        assert [(b, REASONS[r]) for b, r in got] == [tuple(v) for v in expected]
        self.victims += len(got)


class VersionedSwitching(Switching):
    """:class:`Switching` keeping a ``rule_version`` (an ``AlphaSource`` may): ``evict`` then reads
    its rule only when the version moves, and must still follow every switch."""

    def __init__(self) -> None:
        super().__init__()
        self.rule_version = 0

    def observe(self, event: object) -> None:
        before = self.i
        super().observe(event)
        self.rule_version += self.i != before


@pytest.mark.parametrize("core", ["c", "python"])
@pytest.mark.parametrize("name, source, efficiency", MODES + [
    ("inverse-age recency (the scan)", FixedRule(EvictionRule(0.5, recency="inverse-age")), "total"),
    ("adaptive (switching, versioned)", VersionedSwitching(), "total")],
    ids=[m[0] for m in MODES] + ["inverse-age (scan)", "adaptive (versioned)"])
@pytest.mark.parametrize("seed", range(2))
def test_evict_makes_the_choices_of_one_victim_at_a_time(core: str, name: str, source: object, efficiency: str,
                                                         seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BLOCK_CORE_ENV, core)
    twins = [BlockEvictionState(SPEC, KINDS, 120, B, type(source)() if isinstance(source, Switching) else source,
                                efficiency) for _ in range(2)]
    events = _Batched(*twins, np.random.default_rng(seed))
    for step in range(500):
        if isinstance(source, Switching):
            twins[1].alpha_source.i = twins[0].alpha_source.i
        events.step()
        if step % 25 == 0:
            assert list(twins[0].reason) == list(twins[1].reason), step
            assert np.array_equal(twins[0].free_cached, twins[1].free_cached), step
            for s in twins:
                s.check_invariants([(b, p, g) for b, keys in events.keys.items() for p, g in keys])
    assert events.victims > 50
    assert twins[0].evict(0) == []


class _Churn(Events):
    """Events over ever new prefixes (each name lives for 10 events, then a new generation
    takes its family), rebuilt as equal but new string objects at every use: the compiled core's
    prefix table then holds thousands of freed prefixes, which it must neither answer for nor keep
    (it drops them in a rebuild once they outnumber the live ones by 1,024)."""

    def __init__(self, state: object, rng: np.random.Generator, num_blocks: int) -> None:
        super().__init__(state, rng, num_blocks)
        self.events = 0

    def prefix(self, family: int, depth: int) -> str:
        return "".join(("g", str(self.events // 10), "f", str(family), ":", str(depth)))

    def step(self) -> None:
        self.events += 1
        super().step()


@pytest.mark.parametrize("seed", range(2))
def test_both_cores_agree_through_thousands_of_freed_prefixes(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    states = []
    for core in ("c", "python"):
        monkeypatch.setenv(BLOCK_CORE_ENV, core)
        states.append(BlockEvictionState(SPEC, KINDS, 120, B, MODES[0][1], MODES[0][2]))
    events = _Churn(Twin(*states), np.random.default_rng(seed), 120)
    names = set()
    for step in range(16000):
        events.step()
        names.update(p for keys in events.keys.values() for p, _ in keys)
        assert states[0].next_victim() == states[1].next_victim(), step
        if step % 500 == 0:
            assert list(states[0].reason) == list(states[1].reason), step
            assert [states[0].keys_of(b) for b in range(120)] == [states[1].keys_of(b) for b in range(120)], step
            for s in states:
                s.check_invariants([(b, p, g) for b, keys in events.keys.items() for p, g in keys])
    assert len(names) > 2500 and events.victims > 500          # enough for two rebuilds or more
