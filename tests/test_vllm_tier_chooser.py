"""The CPU tier's adaptive rule (marconi.integrations.vllm.tier_chooser), without vLLM.

Driven through the emulation's ``TierManager`` (vLLM 0.32's ``CPUOffloadingManager``: ref counts,
protected chunks, pending stores): the chooser moves to a world that clearly serves more hits; its
worlds never change what the live tier holds or evicts; a bad ``marconi_rule`` is refused by name.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from marconi.core.eviction import rule_from_label
from marconi.core.model import get_model
from marconi.core.registry import ConfigError
from marconi.integrations.vllm.emulate.engine import VllmAlignEngine
from marconi.integrations.vllm.emulate.scheduler import emulate_closed_loop
from marconi.integrations.vllm.emulate.tier import EmulatedTier, ReqContext, TierManager, make_policy
from marconi.integrations.vllm.layout import VllmLayout
from marconi.integrations.vllm.policy import ATTENTION, MAMBA
from marconi.integrations.vllm.tier_chooser import AdaptiveTierPolicy, TierRuleChooser
from marconi.integrations.vllm.tier_tree import (ADAPTIVE, DEFAULT_FAMILY, DEFAULT_RULE, ChunkTreePolicy, TierSettings,
                                                 make_offload_key, parse_tier_rule)
from test_vllm_emulate_concurrency import sessions
from test_vllm_tier_emulation import BLOCK, QWEN_TINY
from test_vllm_tier_emulation import KINDS as TINY_KINDS

SPEC = get_model("nemotron-h-8b")
KINDS = (MAMBA, ATTENTION)
TPC = 1152


def _request(mgr: TierManager, rid: int, name: str, depth: int) -> None:
    """One request over the chain ``name`` (``depth`` chunks): its KV chunks and the state at its end
    offered, stored, then the request's end."""
    ctx = ReqContext(rid)
    attn = []
    for i in range(1, depth + 1):
        key = make_offload_key(f"{name}:{i}".encode(), 1)
        ctx.set_offload_key_position(key, i * TPC)
        attn.append(key)
    state = make_offload_key(f"{name}:{depth}".encode(), 0)
    ctx.set_offload_key_position(state, depth * TPC)
    for keys in (attn, [state]):
        out = mgr.prepare_store(keys, ctx)
        if out:
            mgr.complete_store(out)
    mgr.on_request_finished(ctx)


def _adaptive(capacity: int, rules: str = "lru/a2", **chooser) -> AdaptiveTierPolicy:
    family = tuple(rule_from_label(r) for r in rules.split("/"))
    settings = TierSettings(KINDS, SPEC, TPC, family[0], family=family)
    policy = AdaptiveTierPolicy(capacity, settings)
    if chooser:
        policy.chooser = TierRuleChooser(capacity, settings, **chooser)
    return policy


def test_the_chooser_moves_to_the_world_that_serves_more_hits() -> None:
    """A deep document reused between bursts of one-chunk requests: by recency the bursts break it
    (its deepest KV chunk goes: lru's world serves nothing), by FLOPs per byte (a2) it stays; the
    live tier, started on lru, switches to a2 and then holds the whole document."""
    policy = _adaptive(12)
    mgr = TierManager(12, policy)
    assert policy.settings.rule.label() == "lru"
    rid = 0
    for round_ in range(12):
        _request(mgr, rid, "doc", 4)
        rid += 1
        for j in range(4):
            _request(mgr, rid, f"one-off:{round_}:{j}", 1)
            rid += 1
        mgr.check_invariants()
    chooser = policy.chooser
    assert chooser is not None
    lru, a2 = chooser.score
    assert a2 > 2 * lru                          # clearly more hits in a2's world
    assert policy.settings.rule.label() == "a2" and chooser.rule.label() == "a2"
    assert chooser.switches and chooser.switches[0][1] == "a2"
    assert chooser.tuning_record()["tier_rule"] == "a2"
    # live, under a2 now, keeps the document: its KV chunks and the state at its end
    held = policy.held_chunks()
    assert all(make_offload_key(f"doc:{i}".encode(), 1) in held for i in range(1, 5))
    assert make_offload_key(b"doc:4", 0) in held


def test_no_switch_without_a_clear_lead() -> None:
    """With an infinite hysteresis the live rule stays whatever the worlds score."""
    policy = _adaptive(10, hysteresis=math.inf)
    mgr = TierManager(10, policy)
    for r in range(20):
        _request(mgr, r, "doc" if r % 4 == 0 else f"x{r}", 4 if r % 4 == 0 else 1)
    assert policy.settings.rule.label() == "lru" and not policy.chooser.switches


def _loop(rules: str | None, **chooser) -> tuple[list, list[bytes], object]:
    """The emulation's closed loop (tests/test_vllm_tier_emulation.py's tiny hybrid, 40 tier chunks),
    the tier under the fixed rule ``lru`` (``rules`` None) or adaptive over ``rules``."""
    layout = VllmLayout(block_size=BLOCK, num_blocks=24, group_kinds=TINY_KINDS, max_num_batched_tokens=2048,
                        block_bytes=1 << 20)
    engine = VllmAlignEngine(layout, QWEN_TINY, eviction="lru", alpha=0.5)
    tier = EmulatedTier(layout, 40, "marconi", QWEN_TINY, rule="lru", host_gbps=55)
    if rules is not None:
        family = tuple(rule_from_label(r) for r in rules.split("/"))
        settings = replace(tier.manager.policy.settings, family=family)
        policy = tier.manager.policy = AdaptiveTierPolicy(40, settings)
        policy.chooser = TierRuleChooser(40, settings, **chooser)
    engine.attach_tier(tier)
    loop = emulate_closed_loop(engine, sessions(3, num_sessions=6, turns=4), concurrency=4, check=True)
    return [tuple(r) for r in loop.records], list(tier.manager.evicted), tier.manager.policy


def test_worlds_never_change_the_live_tier() -> None:
    """The same closed loop with the fixed rule and with the adaptive policy pinned to that rule:
    every request's hits and every eviction are the same (the worlds read the live tier's calls,
    never its chunks, ref counts or request scratch), while the worlds did run and evict."""
    fixed_records, fixed_evicted, fixed = _loop(None)
    assert type(fixed) is AdaptiveTierPolicy and fixed.chooser is None
    for rules in ("lru/a2m", "lru/a0.5m/a2m"):
        records, evicted, policy = _loop(rules, hysteresis=math.inf)
        assert records == fixed_records and evicted == fixed_evicted
        assert fixed_evicted                                    # the tier was contended
        assert 0 < policy.chooser.requests <= len(records) and all(w.died for w in policy.chooser.worlds)
        assert policy.chooser.score[0] > 0


def test_the_default_is_adaptive_and_bad_rules_are_refused_by_name() -> None:
    default = TierSettings.from_extra_config({}, group_kinds=KINDS, spec=SPEC, tokens_per_chunk=TPC)
    assert DEFAULT_RULE == ADAPTIVE
    assert [r.label() for r in default.family] == list(DEFAULT_FAMILY) and default.rule == default.family[0]
    assert type(AdaptiveTierPolicy(8, default).chooser) is TierRuleChooser
    fixed = TierSettings.from_extra_config({"marconi_rule": "a2m"}, group_kinds=KINDS, spec=SPEC)
    assert fixed.family == () and fixed.rule.label() == "a2m"
    assert AdaptiveTierPolicy(8, fixed).chooser is None
    for bad in ("adaptiv", "a1t", ""):
        with pytest.raises(ConfigError, match="kv_connector_extra_config 'marconi_rule'"):
            TierSettings.from_extra_config({"marconi_rule": bad}, group_kinds=KINDS, spec=SPEC)
    with pytest.raises(ConfigError, match="MARCONI_TIER_RULE"):
        TierSettings.from_env({"MARCONI_TIER_GROUP_KINDS": "mamba,attention", "MARCONI_TIER_MODEL": "nemotron-h-8b",
                               "MARCONI_TIER_RULE": "sometimes"})
    with pytest.raises(ConfigError, match="tier_rule"):
        make_policy("marconi", 8, group_kinds=KINDS, spec=SPEC, rule="often")
    assert parse_tier_rule("adaptive")[1] == default.family
    with pytest.raises(ConfigError, match="family"):
        TierSettings(KINDS, SPEC, TPC, rule_from_label("a1"), family=default.family)
    with pytest.raises(ConfigError, match="family"):
        TierRuleChooser(8, fixed)
    assert isinstance(ChunkTreePolicy(8, fixed), ChunkTreePolicy)
