"""The tier tree's incremental ``evict`` (marconi.integrations.vllm.tier_tree) against the whole-tree
judgement it replaced, without vLLM.

Every ``ChunkTreePolicy.evict`` call (the live tier's and, under ``adaptive``, every world's) first
asks :func:`~marconi.integrations.vllm.tier_tree.reference_victims` (a fresh ``TreeJudgement`` and
candidate table per call, the code ``evict`` ran before its index) what it would take, then runs
the incremental ``evict`` and asserts the same victims, in the same order, with the same reasons
counted. A randomised driver feeds the policy as vLLM's ``CPUOffloadingManager`` does: store misses
and inserts over a shared-prefix tree (hybrid chains: every attention group per chunk, every Mamba
group where a state is stored), stores that complete late or fail (``remove``), loads that pin
chunks (ref counts), touches, requests that stay open across steps and end later, direct evicts
with held chunks protected, rule switches and ``clear``; over several seeds, group layouts (Nemotron-H's
6 Mamba + 1 attention group, one of each, two attention groups), chunk sizes (known, or learned per
request) and rules (``lru``, α > 0 in both efficiencies and both recencies, ``adaptive``, and
one outside the FLOP-aware family).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, replace

import numpy as np
import pytest

from marconi.core.candidates import CandidateTable
from marconi.core.eviction import Candidates, Touch, min_max, rule_from_label
from marconi.core.model import get_model
from marconi.integrations.vllm.emulate.tier import ReqContext
from marconi.integrations.vllm.policy import ATTENTION, MAMBA
from marconi.integrations.vllm.tier_chooser import AdaptiveTierPolicy
from marconi.integrations.vllm.tier_settings import TierSettings, parse_tier_rule
from marconi.integrations.vllm.tier_tree import ChunkTreePolicy, reference_victims, make_offload_key

SPEC = get_model("nemotron-h-8b")
TPC = 1152
LAYOUTS = {
    "nemotron": (MAMBA,) * 6 + (ATTENTION,),
    "attn-mamba": (ATTENTION, MAMBA),
    "two-attn": (ATTENTION, MAMBA, ATTENTION),
}


@dataclass(frozen=True)
class DeepFirst:
    """A rule outside the FLOP-aware family (the index ranks it by its own scores over the whole
    set): deep chunks first, ``min_max(recency) + (1 - min_max(depth))``."""

    candidates: Candidates = Candidates.SINGLE_CHILD
    touch: Touch = Touch.HIT
    tails: bool = False

    def label(self) -> str:
        return "deep-first"

    def scores(self, table: CandidateTable) -> np.ndarray:
        time, _ = table.recency(self.touch)
        return min_max(time) + (1.0 - min_max(table.depth.astype(np.float64)))


class Chunk:
    __slots__ = ("ref_cnt",)

    def __init__(self) -> None:
        self.ref_cnt = -1


def held_to(live, reference, stats: Counter, *, after=None):
    """An ``evict`` that runs ``live`` and asserts it took ``reference``'s victims (key, reason),
    in order, and counted their reasons; ``after(policy)`` runs on each compared call. Counts the
    calls and reasons in ``stats``."""

    def evict(self, n: int, protected: set) -> list | None:
        want = reference(self, n, protected)
        before = dict(self.eviction_counts)
        got = live(self, n, protected)
        if want is None:
            assert got is None, "the reference found too few evictable chunks, the index did not"
            stats["refused"] += 1
            return got
        assert got is not None and [k for k, _ in got] == [k for k, _ in want], (n, want, got)
        counted = Counter({r: c - before[r] for r, c in self.eviction_counts.items() if c != before[r]})
        assert counted == Counter(r for _, r in want)
        stats["calls"] += 1
        stats.update(r for _, r in want)
        if after is not None:
            after(self)
        return got

    return evict


@pytest.fixture
def checked(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Every ChunkTreePolicy.evict held to the reference; counts what was compared."""
    stats: Counter = Counter()
    monkeypatch.setattr(ChunkTreePolicy, "evict", held_to(ChunkTreePolicy.evict, reference_victims, stats))
    return stats


def _policy(kinds: tuple[str, ...], label: str, capacity: int, tpc: int | None) -> ChunkTreePolicy:
    rule, family = (DeepFirst(), ()) if label == "deep-first" else parse_tier_rule(label)
    settings = TierSettings(kinds, SPEC, tpc, rule, family=family)
    return AdaptiveTierPolicy(capacity, settings) if family else ChunkTreePolicy(capacity, settings)


class _Request:
    def __init__(self, rid: int, chain: list[bytes], states: set[int], kinds: tuple[str, ...]) -> None:
        self.ctx = ReqContext(rid)
        self.keys: dict[int, list[bytes]] = {}
        for i, h in enumerate(chain, start=1):
            groups = [g for g, k in enumerate(kinds) if k == ATTENTION or i in states]
            self.keys[i] = [make_offload_key(h, g) for g in groups]
            for key in self.keys[i]:
                self.ctx.set_offload_key_position(key, i * TPC)
        self.stored_to = 0
        self.inserted: set[bytes] = set()
        self.reused: set[bytes] = set()


def drive(policy: ChunkTreePolicy, kinds: tuple[str, ...], seed: int, steps: int, switch: bool = False) -> None:
    """Feed ``policy`` as vLLM's manager would (see the module docstring); ``switch``: set a random
    fixed rule now and then (the index changes its heaps between α = 0 and α > 0)."""
    rng = random.Random(seed)
    cap = policy.cache_capacity
    roots = [[f"s{seed}t{t}-{i}".encode() for i in range(1, 13)] for t in range(5)]
    running: list[_Request] = []
    pending: list[tuple[int, list[bytes], str]] = []     # (due step, keys, "store"/"fail"/"load")

    def store(req: _Request, upto: int, step: int) -> None:
        offer = [k for i in range(req.stored_to + 1, upto + 1) for k in req.keys[i]]
        req.stored_to = max(req.stored_to, upto)
        misses = [k for k in offer if policy.get(k) is None]
        req.reused.update(k for k in offer if policy.get(k) is not None)
        if not misses:
            return
        policy.on_store_miss(misses, req.ctx)
        need = len(misses) - (cap - policy.num_held())
        if need > 0 and policy.evict(need, set(offer)) is None:
            return
        for k in misses:
            policy.insert(k, Chunk())
        req.inserted.update(misses)
        pending.append((step + rng.randint(0, 3), misses, "fail" if rng.random() < 0.05 else "store"))

    def finish(req: _Request) -> None:
        groups: dict[int, list[bytes]] = {}
        for i in sorted(req.keys):
            for k in req.keys[i]:
                groups.setdefault(int.from_bytes(k[-4:], "big"), []).append(k)
        policy.on_request_finished(tuple(tuple(v) for _, v in sorted(groups.items())), req.inserted - req.reused,
                                   req.reused, req.ctx)

    for step in range(steps):
        for due, keys, kind in [p for p in pending if p[0] <= step]:
            pending.remove((due, keys, kind))
            for k in keys:
                chunk = policy.get(k)
                if chunk is None:
                    continue
                if kind == "fail" and chunk.ref_cnt == -1:
                    policy.remove(k)
                elif kind == "store" and chunk.ref_cnt == -1:
                    chunk.ref_cnt = 0
                    policy.mark_evictable(k)
                elif kind == "load":
                    chunk.ref_cnt -= 1
                    if chunk.ref_cnt == 0:
                        policy.mark_evictable(k)
        roll = rng.random()
        if running and roll < 0.3:                         # a running request stores on, or ends
            req = rng.choice(running)
            if req.stored_to < len(req.keys) and rng.random() < 0.6:
                store(req, rng.randint(req.stored_to + 1, len(req.keys)), step)
            else:
                running.remove(req)
                finish(req)
        elif roll < 0.85 or not running:                    # a new request: lookup, load, first store
            base = rng.choice(roots)
            chain = base[: rng.randint(1, len(base))] + [f"s{seed}q{step}-{i}".encode() for i in range(rng.randint(0, 4))]
            states = {len(chain)} | {i for i in range(1, len(chain)) if rng.random() < 0.25}
            req = _Request(step, chain, states, kinds)
            hit = 0
            for d in range(1, len(chain) + 1):
                if not all((c := policy.get(k)) is not None and c.ref_cnt >= 0 for k in req.keys[d]
                           if kinds[int.from_bytes(k[-4:], "big")] == ATTENTION):
                    break
                if len(req.keys[d]) == len(kinds) and all((c := policy.get(k)) is not None and c.ref_cnt >= 0
                                                           for k in req.keys[d]):
                    hit = d
            if hit:
                load = [k for i in range(1, hit + 1) for k in req.keys[i]
                        if kinds[int.from_bytes(k[-4:], "big")] == ATTENTION or i == hit]
                policy.touch(load, req.ctx)
                for k in load:
                    chunk = policy.get(k)
                    if chunk.ref_cnt == 0:
                        policy.mark_non_evictable(k)
                    chunk.ref_cnt += 1
                pending.append((step + rng.randint(0, 2), load, "load"))
                req.reused.update(load)
                req.stored_to = hit
            store(req, rng.randint(req.stored_to, len(chain)), step)
            if rng.random() < 0.6:
                finish(req)
            else:
                running.append(req)
        elif roll < 0.95:                                   # an evict with held chunks protected
            held = list(policy.held_chunks())
            protected = set(rng.sample(held, min(len(held), rng.randint(0, 12))))
            policy.evict(rng.randint(1, 6), protected)
        elif roll < 0.99 and switch:
            policy.set_rule(rule_from_label(rng.choice(["lru", "a0.5m", "a2", "a1i", "a0"])))
        elif roll >= 0.998:
            policy.clear()
            pending.clear()
            running.clear()
        if step % 7 == 0:
            policy.check_invariants()
    policy.check_invariants()


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("label", ["lru", "a0.5m", "a2m", "a1", "a0.5i", "adaptive", "deep-first"])
def test_incremental_evict_takes_thereference_victims(checked: Counter, layout: str, label: str) -> None:
    kinds = LAYOUTS[layout]
    for seed, (capacity, tpc) in enumerate([(12 * len(kinds), TPC), (30 * len(kinds), None), (60 * len(kinds), TPC)]):
        drive(_policy(kinds, label, capacity, tpc), kinds, seed, 260)
    assert checked["calls"] >= 50, checked
    # both halves of the rule ran: dead chunks first, and the rule's pick among the rest
    assert checked["dead-kv"] + checked["dead-state"] > 0 and checked["kv"] + checked["state"] > 0, checked


def test_rule_switches_keep_thereference_victims(checked: Counter) -> None:
    for seed in range(3):
        drive(_policy(LAYOUTS["nemotron"], "lru", 200, TPC), LAYOUTS["nemotron"], 100 + seed, 300, switch=True)
    assert checked["calls"] >= 50, checked


def test_the_rules_take_different_victims(checked: Counter, monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison would pass vacuously if every rule took what LRU takes: on the same workload
    a large α evicts otherwise than ``lru`` (the drivers' runs are identical until they part)."""
    victims: dict[str, list] = {}
    compared = ChunkTreePolicy.evict

    def record(self: ChunkTreePolicy, n: int, protected: set) -> list | None:
        out = compared(self, n, protected)
        victims[label].extend(k for k, _ in out or ())
        return out

    monkeypatch.setattr(ChunkTreePolicy, "evict", record)
    kinds = LAYOUTS["attn-mamba"]
    for label in ("lru", "a2m"):
        victims[label] = []
        drive(_policy(kinds, label, 80, TPC), kinds, 5, 300)
    assert victims["lru"] and victims["a2m"] and victims["lru"] != victims["a2m"]
    assert checked["calls"] > 0


def _store_idle(policy: ChunkTreePolicy, req: _Request) -> list:
    """Store every chunk of ``req`` as landed and idle (ref count 0); returns its keys in depth order."""
    keys = [k for i in sorted(req.keys) for k in req.keys[i]]
    policy.on_store_miss(keys, req.ctx)
    for k in keys:
        chunk = Chunk()
        chunk.ref_cnt = 0
        policy.insert(k, chunk)
    return keys


def test_stale_heap_entries_stay_bounded() -> None:
    """Touching the same chunks over and over leaves lazy entries behind; the index compacts them."""
    kinds = LAYOUTS["attn-mamba"]
    policy = _policy(kinds, "a0.5m", 100, TPC)
    req = _Request(0, [f"c{i}".encode() for i in range(1, 21)], set(range(1, 21)), kinds)
    keys = _store_idle(policy, req)
    for _ in range(500):
        policy.touch(keys, req.ctx)
        policy.check_invariants()               # indexes the touched chunks (2 entries each at α > 0)
    # without compaction 500 x 40 x 2 entries; with it at most live + 2 x (2 x live + 256)
    assert policy.index_entries() <= 2 * len(keys) + 2 * (2 * len(keys) + 256), policy.index_entries()


def test_a_rule_switch_rebuilds_the_index() -> None:
    """set_rule between α = 0 and α > 0 rebuilds the index: the next evict still takes a victim."""
    kinds = LAYOUTS["attn-mamba"]
    policy = _policy(kinds, "lru", 10, TPC)
    req = _Request(0, [b"x1", b"x2"], {2}, kinds)
    keys = _store_idle(policy, req)
    policy.set_rule(rule_from_label("a1m"))
    assert policy.settings == replace(policy.settings, rule=rule_from_label("a1m"))
    out = policy.evict(1, set())
    assert out is not None and len(out) == 1
    policy.check_invariants()
