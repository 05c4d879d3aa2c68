"""The CPU tier's ``arc-tree`` order (marconi.integrations.vllm.tier_chooser.AdaptiveTierPolicy under
``marconi_rule: arc-tree``), without vLLM.

The tree's dead chunks go first (oldest first, judged again after each batch), then vLLM's ARC
victim from the ARC lists the policy keeps over its chunks, one at a time (a chunk ARC evicts may
leave deeper chunks dead: those go next). Every evict of the randomised driver of
``tests/test_vllm_tier_incremental.py`` is held to a reference built from the whole-tree judgement
(:class:`~marconi.integrations.vllm.tier_tree.TreeJudgement`) and a copy of the ARC lists; the
label is accepted where a fixed rule's is and refused in an adaptive family and outside the tier.
"""

from __future__ import annotations

import copy
from collections import Counter

import pytest

from marconi.core.eviction import rule_from_label
from marconi.core.registry import ConfigError
from marconi.integrations.vllm.emulate.engine import VllmAlignEngine
from marconi.integrations.vllm.emulate.scheduler import emulate_closed_loop
from marconi.integrations.vllm.emulate.tier import EmulatedTier, TierManager, make_policy
from marconi.integrations.vllm.layout import VllmLayout
from marconi.integrations.vllm.tier_chooser import AdaptiveTierPolicy
from marconi.integrations.vllm.tier_settings import ARC_TREE, ArcTreeOrder, TierSettings, parse_tier_rule
from marconi.integrations.vllm.tier_tree import ChunkTreePolicy, TreeJudgement
from test_vllm_emulate_concurrency import sessions
from test_vllm_tier_chooser import KINDS, SPEC, TPC, _frequency_rounds, _hot_held
from test_vllm_tier_emulation import BLOCK, QWEN_TINY
from test_vllm_tier_emulation import KINDS as TINY_KINDS
from test_vllm_tier_incremental import LAYOUTS, drive, held_to


def reference(policy: AdaptiveTierPolicy, n: int, protected: set) -> list[tuple[bytes, str]] | None:
    """The victims (key, reason) ``arc-tree`` takes, from scratch: every dead chunk by a fresh
    whole-tree judgement, oldest first, judged again after each batch; when none is left, the
    victim of a copy of the ARC lists (fed the dead chunks as retired). Changes nothing."""
    if n <= 0:
        return []
    avail = {k for k in policy.idle_keys() if k not in protected}
    if len(avail) < n:
        return None
    view = TreeJudgement(policy)
    arc = copy.deepcopy(policy.arc)
    chosen: list[tuple[bytes, str]] = []
    while len(chosen) < n:
        dead = sorted((k for k in avail if view.dead(k)), key=policy.recency)
        if dead:
            picks = [(k, "dead-" + policy.kind(k)) for k in dead[: n - len(chosen)]]
            for k, _ in picks:
                arc.retire(k)
        else:
            ((k, _),) = arc.evict(1, protected)
            picks = [(k, policy.kind(k))]
        for k, reason in picks:
            avail.discard(k)
            chosen.append((k, reason))
            view.remove(k)
    return chosen


def _arc_tree(kinds: tuple[str, ...], capacity: int, tpc: int | None) -> AdaptiveTierPolicy:
    rule, family = parse_tier_rule(ARC_TREE)
    return AdaptiveTierPolicy(capacity, TierSettings(kinds, SPEC, tpc, rule, family=family))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_arc_tree_takes_dead_chunks_then_arcs_victims(monkeypatch: pytest.MonkeyPatch, layout: str) -> None:
    """Every evict of the randomised driver (pending stores, failed stores, loads pinning chunks,
    protected chunks, open requests, clear) takes the reference's victims in its order and counts
    their reasons; both halves ran (dead chunks, and ARC's victims), and ARC's lists stay the tier's."""
    stats: Counter = Counter()
    # after each compared call: ARC's lists hold exactly the tier's chunks
    evict = held_to(AdaptiveTierPolicy.evict, reference, stats, after=lambda policy: policy.check_invariants())
    monkeypatch.setattr(AdaptiveTierPolicy, "evict", evict)
    kinds = LAYOUTS[layout]
    for seed, (capacity, tpc) in enumerate([(12 * len(kinds), TPC), (30 * len(kinds), None), (60 * len(kinds), TPC)]):
        policy = _arc_tree(kinds, capacity, tpc)
        assert policy.arc_tree and policy.chooser is None and policy.arc is not None
        drive(policy, kinds, 40 + seed, 260)
    assert stats["calls"] >= 50, stats
    assert stats["dead-kv"] + stats["dead-state"] > 0 and stats["kv"] + stats["state"] > 0, stats


def test_arc_tree_keeps_what_arc_keeps_and_differs_from_the_tree() -> None:
    """On the frequency sequence (hot documents between scans; no chunk is dead there) ``arc-tree``
    keeps the hot documents as ARC does, where the tree under ``lru`` loses them (both without
    second chance, which gives the tree a frequency signal of its own: tests/test_vllm_tier_chooser.py)."""
    fixed = {}
    for label in (ARC_TREE, "lru"):
        settings = TierSettings.from_extra_config({"marconi_rule": label, "marconi_second_chance": False},
                                                  group_kinds=KINDS, spec=SPEC, tokens_per_chunk=TPC)
        policy = AdaptiveTierPolicy(12, settings)
        mgr = TierManager(12, policy)
        _frequency_rounds(mgr, 8)
        fixed[label] = (policy, list(mgr.evicted))
    assert _hot_held(fixed[ARC_TREE][0]) and not _hot_held(fixed["lru"][0])
    assert fixed[ARC_TREE][1] != fixed["lru"][1]


def test_arc_tree_in_the_closed_loop_differs_from_arc_by_its_dead_chunks() -> None:
    """The emulation's closed loop (invariants checked each step) under ``arc-tree`` and under ARC:
    ``arc-tree`` evicts dead chunks too, so the victims part; every victim is counted."""
    layout = VllmLayout(block_size=BLOCK, num_blocks=24, group_kinds=TINY_KINDS, max_num_batched_tokens=2048,
                        block_bytes=1 << 20)
    runs = {}
    for name, rule in (("arc", None), ("marconi", ARC_TREE)):
        engine = VllmAlignEngine(layout, QWEN_TINY, eviction="lru", alpha=0.5)
        tier = EmulatedTier(layout, 40, name, QWEN_TINY, host_gbps=55, **({"rule": rule} if rule else {}))
        engine.attach_tier(tier)
        emulate_closed_loop(engine, sessions(3, num_sessions=6, turns=4), concurrency=4, check=True)
        runs[name] = (tier.manager.policy, list(tier.manager.evicted))
    policy, evicted = runs["marconi"]
    assert policy.arc_tree and evicted and runs["arc"][1]
    policy.check_invariants()
    counts = policy.eviction_counts
    assert sum(counts.values()) == len(evicted) and counts["dead-kv"] + counts["dead-state"] > 0
    assert evicted != runs["arc"][1]


def test_arc_tree_is_accepted_as_a_rule_and_refused_where_it_cannot_apply() -> None:
    rule, family = parse_tier_rule(" arc-tree ")
    assert isinstance(rule, ArcTreeOrder) and family == () and rule.label() == ARC_TREE
    extra = TierSettings.from_extra_config({"marconi_rule": ARC_TREE}, group_kinds=KINDS, spec=SPEC)
    env = TierSettings.from_env({"MARCONI_TIER_GROUP_KINDS": "mamba,attention", "MARCONI_TIER_MODEL": "nemotron-h-8b",
                                 "MARCONI_TIER_RULE": ARC_TREE})
    assert extra.rule == env.rule == rule and extra.family == env.family == ()
    emulated = make_policy("marconi", 8, group_kinds=KINDS, spec=SPEC, rule=ARC_TREE)
    assert type(emulated) is AdaptiveTierPolicy and emulated.arc_tree and emulated.chooser is None
    # a bare tree under it ranks as lru (dead chunks first): the order needs AdaptiveTierPolicy's ARC lists
    assert not AdaptiveTierPolicy(8, TierSettings(KINDS, SPEC, TPC, rule_from_label("lru"))).arc_tree
    assert isinstance(ChunkTreePolicy(8, extra), ChunkTreePolicy)
    with pytest.raises(ConfigError, match="arc-tree.*adaptive family"):
        TierSettings(KINDS, SPEC, TPC, rule, family=(rule, rule_from_label("a2m")))
    with pytest.raises(ConfigError, match="arc-tree.*adaptive family"):
        TierSettings(KINDS, SPEC, TPC, rule_from_label("lru"), family=(rule_from_label("lru"), rule))
    with pytest.raises(ConfigError):                # not a rule of the caches outside vLLM's tier
        rule_from_label(ARC_TREE)
    with pytest.raises(ConfigError, match="'arc-tree'"):   # the refusal of a bad label names it
        parse_tier_rule("arc-tre")
