"""A rule written once works everywhere (issue 30): a new eviction rule, defined and registered in
this file only, runs through the simulator, the real engine, the vLLM emulation and the SGLang one,
and its decisions are the ones its ``scores`` asks for in each.

The rule, ``deep<w>``: evict deep prefixes first — normalised recency + w · (1 − normalised depth),
ties to the least recently used. Nothing in the FLOP-aware family scores depth this way, so its
hits differ from ``lru`` and from every rule of the default family on the bundled SWE sample.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from marconi.core.cache import ManualClock, PrefixCache
from marconi.core.candidates import CandidateTable
from marconi.core.eviction import (Candidates, EvictionRule, RulePolicy, Touch, min_max, register_rule_label,
                                   rule_from_label, unregister_rule_label)
from marconi.core.model import get_model
from marconi.core.registry import ConfigError
from marconi.integrations.common.alpha import FixedRule
from marconi.integrations.sglang.emulate import MAMBA, UnifiedRadixEmulator
from marconi.integrations.sglang.policy import MarconiStrategy
from marconi.integrations.vllm.policy import ATTENTION, BlockEvictionState
from marconi.choosers.family import DEFAULT_RULES, parse_rules, policy_for
from marconi.sim.replay import simulate, simulate_system, working_set_bytes
from marconi.sim.systems import make_system
from marconi.workloads import build_workload


# ====================================================================================== the rule, once
@dataclass(frozen=True)
class DeepFirst:
    """Evict deep prefixes first: ``min_max(recency) + weight · (1 − min_max(depth))``."""

    weight: float = 1.0
    candidates: Candidates = Candidates.SINGLE_CHILD
    touch: Touch = Touch.HIT
    tails: bool = False

    def label(self) -> str:
        return f"deep{self.weight:g}{'t' if self.tails else ''}"

    def scores(self, table: CandidateTable) -> np.ndarray:
        time, _ = table.recency(self.touch)
        return min_max(time) + self.weight * (1.0 - min_max(table.depth.astype(np.float64)))


def _parse(text: str) -> DeepFirst | None:
    if not text.startswith("deep"):
        return None
    body = text[4:]
    tails = body.endswith("t")
    return DeepFirst(float(body[:-1] if tails else body), tails=tails)


@pytest.fixture(autouse=True)
def deep_label():
    register_rule_label("deep", _parse)
    yield
    unregister_rule_label("deep")


def deep_source(spec, config):
    """The vLLM emulation's alpha-source factory (``alpha_source=test_add_a_rule:deep_source``)."""
    return FixedRule(rule_from_label("deep1"))


# ====================================================================================== helpers
def _brute(times, depths, orders, weight: float = 1.0) -> int:
    """The rule's victim by plain Python, from the engine's own rows (not the candidate table)."""
    def norm(values):
        lo, hi = min(values), max(values)
        return [0.0] * len(values) if hi <= lo else [(v - lo) / (hi - lo) for v in values]

    scores = [r + weight * (1.0 - d) for r, d in zip(norm([float(t) for t in times]), norm([float(d) for d in depths]))]
    return min(range(len(scores)), key=lambda i: (scores[i], orders[i]))


class _Checked(RulePolicy):
    """The generic cache policy, each victim checked against :func:`_brute` over the radix nodes."""

    checked = 0

    def choose(self, candidates):
        got = super().choose(candidates)
        nodes = candidates.nodes
        assert got == _brute([n.last_access for n in nodes], [n.depth for n in nodes], [n.access_seq for n in nodes])
        self.checked += 1
        return got


@pytest.fixture(scope="module")
def trace():
    return list(build_workload("swe-sample:max_input_len=8192"))[:60]


SPEC = get_model("paper-7b")


# ====================================================================================== the label
def test_the_label_is_accepted_wherever_rules_are_parsed():
    rule = rule_from_label("deep0.5")
    assert rule == DeepFirst(0.5) and rule.label() == "deep0.5"
    assert parse_rules("lru/deep1/a2m") == (EvictionRule.from_label("lru"), DeepFirst(1.0), EvictionRule(2.0, "marginal"))
    assert isinstance(policy_for(rule), RulePolicy)
    unregister_rule_label("deep")
    try:
        with pytest.raises(ConfigError, match="write lru"):
            rule_from_label("deep1")
    finally:
        register_rule_label("deep", _parse)
    with pytest.raises(ConfigError, match="registered already"):
        register_rule_label("deep", _parse)
    with pytest.raises(ConfigError, match="FLOP-aware family only"):
        PrefixCache(SPEC, 1e9, "marconi", "regret:rules=lru/deep1")


def test_an_engine_that_cannot_cut_tails_refuses_a_cutting_rule_the_same_way():
    for build in (lambda r: BlockEvictionState(SPEC, (ATTENTION, "mamba"), 8, 16, FixedRule(r)),
                  lambda r: MarconiStrategy(SPEC, MAMBA, r)):
        with pytest.raises(ConfigError, match="cannot cut dead tails: rule 'deep1t'"):
            build(rule_from_label("deep1t"))
        build(rule_from_label("deep1"))              # the same rule without the cut is served


# ====================================================================================== (a) the simulator
def test_simulator_applies_the_rule(trace):
    capacity = 0.25 * working_set_bytes(trace, SPEC)

    def replay(policy):                             # at the trace's arrival times, as simulate_system does
        clock = ManualClock()
        return simulate(trace, PrefixCache(SPEC, capacity, "marconi", policy, clock=clock), clock=clock)

    policy = _Checked(rule_from_label("deep1"))
    mine = replay(policy)
    assert policy.checked > 10
    theirs = {r.label(): int(replay(policy_for(r)).reused_len.sum()) for r in DEFAULT_RULES}
    assert int(mine.reused_len.sum()) not in theirs.values(), theirs
    # In a family, by label: the exact-worlds selector runs the new rule's world next to lru's.
    family = simulate_system(trace, "marconi:rules=deep1/lru", SPEC, capacity)
    assert family.stats.reused_tokens > 0
    assert int(simulate_system(trace, "marconi:rules=deep1/lru,hysteresis=1000", SPEC, capacity).reused_len.sum()) \
        == int(mine.reused_len.sum())               # never switching: the new rule's own decisions


# ====================================================================================== (b) the engine
@pytest.mark.usefixtures("one_torch_thread")
def test_engine_applies_the_rule():
    """The real engine (tensors, bamba-tiny) makes the size-only simulation's decisions under the
    new rule, each victim checked, and they are not LRU's nor Marconi's default rule's."""
    pytest.importorskip("torch")
    from test_engine_engine import _assert_same_decisions, _trace, model_for

    from marconi.engine.engine import Engine

    model = model_for("bamba-tiny")
    spec = model.spec
    capacity = 6 * spec.ssm_checkpoint_bytes + 200 * spec.kv_bytes_per_token   # small: it evicts
    requests = _trace(num_sessions=6, turns=3)
    policy = _Checked(rule_from_label("deep1"))
    engine = Engine(model, capacity, admission="marconi", eviction=policy)
    _assert_same_decisions(engine, PrefixCache(spec, capacity, "marconi", _Checked(rule_from_label("deep1"))),
                           requests)
    assert policy.checked > 10
    for other in ("lru", "flop-aware"):
        sim = PrefixCache(spec, capacity, "marconi", other)
        for inp, out in requests:
            sim.process(inp, out)
        assert engine.cache.stats.reused_tokens != sim.stats.reused_tokens, other


# ====================================================================================== (c) vLLM
def test_vllm_emulation_applies_the_rule(trace):
    capacity = 0.25 * working_set_bytes(trace, SPEC)
    system = "vllm-align:eviction=marconi,alpha_source=test_add_a_rule:deep_source"
    checked = []
    cache = make_system(system).build(SPEC, capacity)
    state = cache.engine.index
    assert state.generic_rule() == DeepFirst(1.0)

    def brute() -> int:
        free = [b for b in range(state.num_blocks) if state.free_cached[b]]
        cand = [b for b in free if state.candidate[b]] or free
        depth = [max(state.prefix_info(p)[0] for p, _ in state.keys_of(b)) for b in cand]
        seq = [int(state.release_seq[b]) for b in cand]
        return cand[_brute(seq, depth, seq)]

    next_victim = state.next_victim

    def checked_victim():
        got = next_victim()
        if got is not None and len(checked) < 40:   # a brute-force scan is slow: the first victims
            assert got.block_id == brute(), len(checked)
            checked.append(got.block_id)
        return got

    state.next_victim = checked_victim
    mine = int(simulate(trace, cache).reused_len.sum())
    assert len(checked) == 40
    assert state.describe()["rule"] == "deep1"
    others = {text: int(simulate_system(trace, text, SPEC, capacity).reused_len.sum())
              for text in ("vllm-align", "vllm-align:eviction=marconi,alpha=0.5,efficiency=marginal",
                           "vllm-align:eviction=marconi,alpha=2,efficiency=marginal")}
    assert mine not in others.values(), (mine, others)
    assert int(simulate_system(trace, system, SPEC, capacity).reused_len.sum()) == mine   # through the driver


# ====================================================================================== (d) SGLang
def test_sglang_emulation_applies_the_rule(trace):
    kv_tokens, slots = 30_000, 10
    strategy = MarconiStrategy(SPEC, MAMBA, rule_from_label("deep1"))
    picks = []
    pick_state = strategy.pick_state

    def checked_pick(lru_order, is_leaf):
        got = pick_state(lru_order, is_leaf)
        if got is not None:
            pool = [i for i, x in enumerate(lru_order) if is_leaf(x) or len(x.children) < 2] or list(range(len(lru_order)))
            depth = [strategy.depth(lru_order[i]) for i in pool]
            assert got is lru_order[pool[_brute(pool, depth, pool)]]
            picks.append(got)
        return got

    strategy.pick_state = checked_pick
    emu = UnifiedRadixEmulator(kv_tokens, slots, strategy=strategy)
    mine = sum(emu.serve(r.input_tokens, r.output_tokens).hit_len for r in trace)
    emu.check_invariants()
    assert picks and emu.counters["evicted:kv-leaf"] > 0
    others, walks = {}, []
    for name, make in (("lru", lambda: None), ("a0.5m", lambda: MarconiStrategy(SPEC, MAMBA, 0.5, "marginal")),
                       ("a2m", lambda: _fast_equals_generic(MarconiStrategy(SPEC, MAMBA, 2.0, "marginal"), walks))):
        other = UnifiedRadixEmulator(kv_tokens, slots, strategy=make())
        others[name] = sum(other.serve(r.input_tokens, r.output_tokens).hit_len for r in trace)
    assert mine not in others.values(), (mine, others)
    assert walks, "no FULL walk compared"


def _fast_equals_generic(strategy: MarconiStrategy, log: list[int]) -> MarconiStrategy:
    """``strategy`` (a FLOP-aware rule on its fast path), checked at every FULL walk: its priorities
    of the walk's leaves equal the core's scores of the same rule over the generic path's table."""
    rule = EvictionRule(strategy.alpha, strategy.variant)
    begin = strategy.begin_full_walk

    def checked(leaves):
        leaves = list(leaves)
        begin(leaves)
        if len(leaves) > 1:
            table = strategy.table(leaves, [n.last_access_time for n in leaves], [True] * len(leaves))
            assert [strategy.get_priority(n)[0] for n in leaves] == rule.scores(table).tolist()
            log.append(len(leaves))

    strategy.begin_full_walk = checked
    return strategy


def test_sglang_worlds_choose_the_rule_by_label(trace):
    """In the SGLang plugin's adaptive family (``rules`` of its config, exact worlds): the new rule's
    world runs beside lru's, the live cache switches to it, and the live cache's hits are its
    mirror world's, request for request (the live strategy applies the rule by the generic path)."""
    from marconi.integrations.sglang.emulate import emulator_for
    from test_sglang_default import serve_beside_the_mirror

    live = emulator_for(SPEC, 30_000, 10, policy="marconi", policy_config={"rules": "lru/deep1"})
    source = serve_beside_the_mirror(live, trace)
    assert [label for _, label in source.tuning_record()["rule_switches"]][:1] == ["deep1"]
    assert live.strategy.generic_rule() == DeepFirst(1.0) and source.alpha() == 0.0
    live.check_invariants()
    with pytest.raises(ConfigError, match="cut dead tails"):
        emulator_for(SPEC, 30_000, 10, policy="marconi", policy_config={"rules": "lru/deep1t"})
    with pytest.raises(ConfigError, match="no counterpart"):
        emulator_for(SPEC, 30_000, 10, policy="marconi", policy_config={"rules": "lru/deep1", "selector": "regret"})
