"""The victim index picks exactly the scan's victims (marconi.integrations.vllm.victim_index).

Differential tests: :func:`~marconi.integrations.vllm.policy.reference_victim` is the O(pool) scan the
plugin used before the index; after every event, in every mode (α fixed, α = 0, adaptive α, both
efficiency variants, the no-candidate fallback), ``next_victim`` must return the same block. First
on the index alone against a brute-force argmin (Hypothesis, with exact float ties), then on random
pool event sequences, then through the ``vllm-align`` emulation on the bundled SWE trace.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marconi.core.eviction import argmin_ties_by_order, min_max
from marconi.core.model import ModelSpec, get_model
from marconi.integrations.common.alpha import FixedAlpha, RequestObservation
from marconi.integrations.vllm.emulate.engine import VllmAlignEngine
from marconi.integrations.vllm.layout import VllmLayout
from marconi.integrations.vllm.models import PRESETS
from marconi.integrations.vllm.policy import (ATTENTION, EFFICIENCIES, MAMBA, BlockEvictionState, Victim,
                                             reference_victim)
from marconi.integrations.vllm.victim_index import CANDIDATES, OTHERS, VictimIndex

SPEC = get_model("paper-7b")
B = 16
KINDS = (MAMBA, MAMBA, ATTENTION)
ALPHAS = (0.0, 0.25, 0.5, 1.0, 3.0, 1e-9)


# --------------------------------------------------------------------------- the index alone
def brute_force(members: dict[int, tuple[int, tuple[float, ...], int]], alpha: float, variant: int) -> int | None:
    """The scan's arithmetic over the members (block -> (set, effs, seq)): candidates, else the others,
    in block id order (the scan's ``flatnonzero``)."""
    if not members:
        return None
    pool = sorted(b for b, (tier, _, _) in members.items() if tier == CANDIDATES) or sorted(members)
    seq = np.array([members[b][2] for b in pool], dtype=np.int64)
    scores = min_max(seq.astype(np.float64))
    if alpha:
        scores = scores + alpha * min_max(np.array([members[b][1][variant] for b in pool]))
    return pool[argmin_ties_by_order(scores, seq)]


# Few efficiencies, on a grid: many levels tie exactly, and scores tie exactly (0.5 + 0.5·0 == 0 + 0.5·1).
EFFS = [(0.0, 0.0), (1.0, 3.0), (2.0, 2.0), (3.0, 1.0), (1.5, 0.0), (0.5, 0.5)]
index_op = st.one_of(
    st.tuples(st.just("place"), st.integers(0, 11), st.sampled_from([CANDIDATES, OTHERS]),
              st.integers(0, len(EFFS) - 1), st.booleans()),
    st.tuples(st.just("discard"), st.integers(0, 11)),
    st.tuples(st.just("clear")),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(index_op, min_size=1, max_size=80), shared=st.booleans())
def test_the_index_is_the_brute_force_argmin_after_every_operation(ops: list[tuple], shared: bool) -> None:
    """``shared``: release numbers drawn from 1..4, so members share them (the pool never does, but
    the ties then fall to the block id, as in the scan)."""
    index = VictimIndex(12, 2)
    members: dict[int, tuple[int, tuple[float, ...], int]] = {}
    seq = 0
    for op in ops:
        if op[0] == "place":
            _, block, tier, eff, renew = op
            if renew or block not in members:      # a release draws a new number; a re-rank keeps it
                seq += 1
                new_seq = seq % 4 + 1 if shared else seq
            else:
                new_seq = members[block][2]
            members[block] = (tier, EFFS[eff], new_seq)
            index.place(block, tier, EFFS[eff], new_seq)
        elif op[0] == "discard":
            members.pop(op[1], None)
            index.discard(op[1])
        else:
            members.clear()
            index.clear()
        assert len(index) == len(members)
        for alpha in ALPHAS:
            for variant in (0, 1):
                assert index.victim(alpha, variant) == brute_force(members, alpha, variant), (alpha, variant)
    index.check_invariants(members)


def test_heaps_stay_bounded_under_churn() -> None:
    """Lazy deletion never lets a heap grow without bound: members that come and go are swept."""
    index = VictimIndex(64, 2)
    rng = np.random.default_rng(3)
    seq = 0
    for step in range(20_000):
        block = int(rng.integers(0, 64))
        if rng.random() < 0.5:
            seq += 1
            index.place(block, int(rng.integers(0, 2)), EFFS[int(rng.integers(0, len(EFFS)))], seq)
        else:
            index.discard(block)
    index.check_invariants()
    assert index.heap_sizes() < 2_000            # of about 30,000 entries pushed


# --------------------------------------------------------------------------- the pool's state
class Switching:
    """An α source that jumps between rules (α and variant) at every finished request."""

    RULES = ((0.0, None), (0.5, "marginal"), (2.0, "marginal"), (0.5, "total"), (1.0, None))

    def __init__(self) -> None:
        self.i = 0

    def alpha(self) -> float:
        return self.RULES[self.i][0]

    def efficiency(self) -> str | None:
        return self.RULES[self.i][1]

    def observe(self, event: RequestObservation) -> None:
        self.i = (self.i + len(event.output_token_ids)) % len(self.RULES)


class Events:
    """Random vLLM-like pool events on a BlockEvictionState, with the scan checked after each one."""

    def __init__(self, state: BlockEvictionState, rng: np.random.Generator, num_blocks: int) -> None:
        self.state, self.rng, self.num_blocks = state, rng, num_blocks
        self.keys: dict[int, list[tuple[str, int]]] = {}     # block -> its (prefix, group)s
        self.free: set[int] = set()
        self.in_use: set[int] = set()
        self.victims = self.fallbacks = self.not_oldest = self.levels = 0

    def prefix(self, family: int, depth: int) -> str:
        return f"f{family}:{depth}"

    def cache(self) -> None:
        """Cache a prefix as vLLM does for a running request (its blocks are in use): usually every
        group (the attention block and the states at its end), sometimes one group only; at a
        block-aligned depth or, as a partial entry, inside a block, sometimes as a second key on a
        block already cached. Shared families and foreign parents make branches and duplicates."""
        depth = int(self.rng.integers(1, 13)) * B
        if self.rng.random() < 0.15:
            depth -= int(self.rng.integers(1, B))              # a partial entry
        family = int(self.rng.integers(0, 4))
        pdepth = (depth - 1) // B * B
        parent_family = int(self.rng.integers(0, 4)) if self.rng.random() < 0.3 else family
        parent = self.prefix(parent_family, pdepth) if pdepth else None
        prefix = self.prefix(family, depth)
        groups = range(len(KINDS)) if self.rng.random() < 0.6 else [int(self.rng.integers(0, len(KINDS)))]
        for group in groups:
            spare = [b for b in range(1, self.num_blocks) if b not in self.keys and b not in self.free]
            if self.rng.random() < 0.1 and self.in_use:
                spare = sorted(self.in_use)                      # a second key on a cached block
            if not spare:
                return
            block = int(self.rng.choice(spare))
            if (prefix, group) in self.keys.get(block, ()):
                continue
            self.state.cached(block, prefix, group, depth, parent)
            self.keys.setdefault(block, []).append((prefix, group))
            self.in_use.add(block)

    def release(self) -> None:
        if self.in_use:
            block = int(self.rng.choice(sorted(self.in_use)))
            self.in_use.discard(block)
            self.free.add(block)
            self.state.released(block)

    def hit(self) -> None:
        if self.free:
            block = int(self.rng.choice(sorted(self.free)))
            self.free.discard(block)
            self.in_use.add(block)
            self.state.taken(block)

    def evict(self) -> None:
        victim = self.state.next_victim()
        if victim is None:
            return
        self.victims += 1
        pool = np.flatnonzero(self.state.free_cached & self.state.candidate)
        if pool.size == 0:
            self.fallbacks += 1
            pool = np.flatnonzero(self.state.free_cached)
        self.levels = max(self.levels, np.unique(self.state.flop_eff[pool]).size)
        self.not_oldest += victim.block_id != pool[np.argmin(self.state.release_seq[pool])]
        self.state.taken(victim.block_id)
        self.free.discard(victim.block_id)
        for prefix, group in self.keys.pop(victim.block_id, []):
            self.state.uncached(victim.block_id, prefix, group)

    def rekey(self) -> None:
        """A block loses one hash without being evicted (vLLM re-keys partial entries)."""
        if self.keys:
            block = int(self.rng.choice(sorted(self.keys)))
            prefix, group = self.keys[block].pop()
            if not self.keys[block]:
                del self.keys[block]
            self.state.uncached(block, prefix, group)

    def step(self) -> None:
        op = self.rng.choice(["cache", "release", "hit", "evict", "rekey", "finish"],
                             p=[0.25, 0.35, 0.08, 0.25, 0.05, 0.02])
        if op == "finish":
            self.state.finished(RequestObservation([1], [0] * int(self.rng.integers(1, 4)), 0, 0))
        else:
            getattr(self, op)()


MODES = [("alpha 0.5, total", FixedAlpha(0.5), "total"), ("alpha 0", FixedAlpha(0.0), "total"),
         ("alpha 2, marginal", FixedAlpha(2.0), "marginal"), ("alpha 0.5, marginal", FixedAlpha(0.5), "marginal"),
         ("adaptive (switching)", Switching(), "total")]


@pytest.mark.parametrize("name, source, efficiency", MODES, ids=[m[0] for m in MODES])
@pytest.mark.parametrize("seed", range(4))
def test_next_victim_is_the_scans_after_every_event(name: str, source: object, efficiency: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    num_blocks = 120
    if isinstance(source, Switching):
        source = Switching()
    state = BlockEvictionState(SPEC, KINDS, num_blocks, B, source, efficiency)
    events = Events(state, rng, num_blocks)
    for step in range(700):
        events.step()
        if step == 350 and seed % 2:
            state.clear()                                   # vLLM's reset_prefix_cache, mid-run
            events.keys.clear()
            events.free.clear()
            events.in_use.clear()
        assert state.next_victim() == reference_victim(state), step
        assert state.num_free_cached == int(state.free_cached.sum())
        if step % 50 == 0:
            state.check_invariants([(b, p, g) for b, keys in events.keys.items() for p, g in keys])
    state.check_invariants([(b, p, g) for b, keys in events.keys.items() for p, g in keys])
    # The sequence exercised what it must: many victims, the fallback, several levels, and (α > 0)
    # choices other than the oldest block; at α = 0 the oldest always.
    assert events.victims > 100 and events.fallbacks > 0 and events.levels >= 5
    if name == "alpha 0":
        assert events.not_oldest == 0
    else:
        assert events.not_oldest > 0, "the efficiency term never mattered: the test does not exercise it"


def test_the_no_candidate_fallback_scores_every_free_cached_block() -> None:
    """A state block whose prefix has two children is no candidate, but holds a usable state
    (valued); the inner attention block is no candidate either. With both children in use, no
    free block is a candidate: the fallback ranks all free cached blocks by the same score, so at a
    high α the recent, worthless attention block goes before the older state blocks."""
    for alpha, expected in ((0.0, "state"), (3.0, "kv-inner")):
        state = BlockEvictionState(SPEC, KINDS, 16, B, FixedAlpha(alpha))
        for block, group in ((1, 0), (2, 1), (3, 2)):
            state.cached(block, "p:16", group, 16, None)
        state.cached(4, "a:32", 2, 32, "p:16")          # two children, both in use (never released)
        state.cached(5, "b:32", 2, 32, "p:16")
        for block in (1, 2, 3):                          # the states first: they are the older
            state.released(block)
        assert not state.candidate[[1, 2, 3]].any() and state.flop_eff[1] > 0 == state.flop_eff[3]
        victim = state.next_victim()
        assert victim == reference_victim(state)
        assert victim.reason == expected, (alpha, victim)
        assert isinstance(victim, Victim) and victim.block_id == (1 if alpha == 0 else 3)


def test_the_variant_switch_needs_no_rebuild() -> None:
    """The index keeps both efficiencies of every level: the rule may switch at any eviction."""
    source = Switching()
    state = BlockEvictionState(SPEC, KINDS, 200, B, source)
    events = Events(state, np.random.default_rng(11), 200)
    for _ in range(200):
        events.step()
    for i in range(len(Switching.RULES)):
        source.i = i
        assert state.next_victim() == reference_victim(state)
    assert set(EFFICIENCIES) == {"total", "marginal"}


# --------------------------------------------------------------------------- through the emulation
QWEN_TINY = ModelSpec.from_hf_config({"model_type": "qwen3_next", **PRESETS["qwen3_next-tiny"][1],
                                      "torch_dtype": "bfloat16"}, name="qwen3_next-tiny")


@pytest.mark.parametrize("alpha, efficiency", [(0.5, "total"), (0.0, "total"), (2.0, "marginal"),
                                               ("adaptive", "total")])
def test_the_emulation_on_the_swe_trace_evicts_the_scans_victims(alpha: float | str, efficiency: str) -> None:
    """``vllm-align`` with the plugin's policy on the bundled SWE trace, 100 blocks of 384 tokens:
    every victim the pool asks for is the scan's."""
    from marconi.workloads import build_workload

    layout = VllmLayout(block_size=384, num_blocks=100, group_kinds=(MAMBA, MAMBA, MAMBA, ATTENTION),
                        max_num_batched_tokens=2048)
    engine = VllmAlignEngine(layout, QWEN_TINY, eviction="marconi", alpha=alpha, efficiency=efficiency)
    state = engine.index
    picked = []
    next_victim = state.next_victim

    def checked() -> Victim | None:
        victim = next_victim()
        assert victim == reference_victim(state)
        picked.append(victim)
        return victim

    state.next_victim = checked                      # the pool asks the state, as the plugin's hooks do
    rules = set()
    for req in list(build_workload("swe-sample:max_input_len=8192"))[:60]:
        engine.run(req.input_tokens, req.output_tokens)
        rules.add((state.alpha_source.alpha(), state.alpha_source.efficiency()))
    engine.check_invariants()
    assert len(picked) > 200
    if alpha == "adaptive":
        assert len(rules) >= 2, "the shadow never switched rules"
