"""The rule chooser contract: a chooser is fed the requests, the cache holds one rule and applies it."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import marconi.core.cache as cache_module
from marconi.choosers.bootstrap import BootstrapTuner
from marconi.choosers.family import FamilyPolicy
from marconi.choosers.regret import RegretEviction
from marconi.choosers.worlds import WorldsChooser, WorldsEviction
from marconi.core.cache import PrefixCache
from marconi.core.chooser import RequestEvent, RuleChooser, follow
from marconi.core.eviction import LRU, EvictionRule, FlopAware, make_eviction
from marconi.core.registry import ConfigError
from marconi.integrations.common.shadow_alpha import ShadowAlpha
from marconi.integrations.common.worlds_alpha import WorldsAlpha
from marconi.integrations.vllm.policy import block_rule
from marconi.sim import simulate, simulate_system
from marconi.sim.systems import make_system
from marconi.workloads.synthetic import chat_trace

A2M = EvictionRule.from_label("a2m")
LRU_RULE = EvictionRule.from_label("lru")


class SwitchAt:
    """A chooser that switches its family's live rule to ``rule`` when request ``at`` begins."""

    def __init__(self, at: int, rule: EvictionRule, first: EvictionRule) -> None:
        self.at, self.target, self.rule = at, rule, first
        self.steps: list[str] = []

    def observe(self, event: RequestEvent) -> EvictionRule | None:
        self.steps.append(event.step)
        if event.step == "begin" and event.handle is not None and event.handle.request_id == self.at:
            self.rule = self.target
            return self.target
        return None

    def tuning_record(self) -> dict:
        return {"rule_switches": [[self.at, self.target.label()]]}


def test_the_choosers_meet_the_contract():
    for chooser in (WorldsChooser(), RegretEviction(), BootstrapTuner(FlopAware()), SwitchAt(1, A2M, LRU_RULE),
                    ShadowAlpha(rule_map=block_rule), WorldsAlpha("lru/a2m", rule_map=block_rule)):
        assert isinstance(chooser, RuleChooser), chooser
    assert not isinstance(LRU(), RuleChooser)


def test_a_driver_fed_chooser_sets_the_rule_the_cache_applies():
    trace = chat_trace(num_sessions=30, turns=(3, 6), system_prompt_len=300, seed=3)
    policy = FamilyPolicy("lru/a2m")
    cache = PrefixCache("paper-7b", 1.5e9, "marconi", policy)
    chooser = SwitchAt(5, A2M, LRU_RULE)
    follow(cache, chooser)
    result = simulate(trace, cache, latency="zero")
    assert cache.chooser is chooser and policy.rule == A2M
    assert result.record()["rule_switches"] == [[5, "a2m"]]              # the record asks the chooser
    assert chooser.steps.count("begin") == chooser.steps.count("finish") == len(trace)
    assert "first-eviction" in chooser.steps                              # the trace is contended
    # a family held at a2m from request 5 on decides as a2m would from there: from the start, the same
    # cache under a2m alone differs (the contents before 5 were LRU's), so compare with a replay that
    # switches the same way by hand
    by_hand = PrefixCache("paper-7b", 1.5e9, "marconi", FamilyPolicy("lru/a2m"))
    for i, req in enumerate(trace):
        handle = by_hand.begin(req.input_tokens)
        if i == 5:
            by_hand.set_rule(A2M)
        by_hand.finish(handle, req.output_tokens)
    assert by_hand.stats == cache.stats
    with pytest.raises(ConfigError, match="one rule chooser per cache"):
        follow(cache, SwitchAt(1, A2M, LRU_RULE))


def test_a_policy_refuses_a_rule_it_cannot_apply():
    with pytest.raises(ConfigError, match="one fixed rule"):
        PrefixCache("paper-7b", 1e9, "marconi", "lru").set_rule(A2M)
    flop = PrefixCache("paper-7b", 1e9, "marconi", "flop-aware:alpha=1")
    flop.set_rule(EvictionRule(0.3))                                       # alpha only: applied
    assert flop.eviction.alpha == 0.3
    with pytest.raises(ConfigError, match="alpha only"):
        flop.set_rule(A2M)                                                 # marginal efficiency: refused
    with pytest.raises(ConfigError, match="not of the family"):
        PrefixCache("paper-7b", 1e9, "marconi", FamilyPolicy("lru/a2m")).set_rule(EvictionRule(1.0))


def test_an_eviction_policy_without_the_contract_is_refused():
    class Bare:
        name, evicts_inner_nodes, efficiency_variant = "bare", False, "total"

        def choose(self, candidates):
            return 0

        def describe(self):
            return {"eviction": "bare"}

    with pytest.raises(ConfigError, match="EvictionBase"):
        make_eviction(Bare())


def test_the_cache_probes_no_capability():
    """Capabilities are declared (EvictionPolicy, EvictionBase), so the cache never asks getattr of a policy."""
    source = inspect.getsource(cache_module)
    assert "getattr(self.eviction" not in source and "getattr(eviction" not in source
    assert not hasattr(PrefixCache, "attach_selector") and not hasattr(PrefixCache, "selector")


def test_a_clone_leaves_the_chooser_behind():
    policy = WorldsEviction("lru/a2m")
    cache = PrefixCache("paper-7b", 1e12, "marconi", policy)
    cache.process(np.arange(64))
    twin = cache.clone("lru")
    assert cache.chooser is policy.chooser and twin.chooser is None
    twin.process(np.arange(64))                                             # its requests reach no world
    assert policy.chooser.worlds[1].stats.num_requests == 1


def test_the_chooser_name_and_its_aliases_build_the_same_systems():
    assert make_system("marconi:chooser=worlds").eviction == make_system("marconi").eviction
    assert make_system("marconi:chooser=regret").eviction == make_system("marconi:selector=regret").eviction
    same = lambda a, b: make_system(a).relabel("x") == make_system(b).relabel("x")  # noqa: E731
    assert same("marconi:chooser=bootstrap", "marconi:tuner=bootstrap")
    assert same("marconi:chooser=regret,confidence=2", "marconi:selector=regret,confidence=2")
    for name, message in (("marconi:chooser=regret,selector=worlds", "disagree"),
                          ("marconi:chooser=bootstrap,tuner=adaptive", "disagree"),
                          ("marconi:chooser=bandit", "chooser must be 'worlds'"),
                          ("marconi:chooser=worlds,confidence=2", "confidence applies to chooser=regret")):
        with pytest.raises(ConfigError, match=message):
            make_system(name)
    trace = chat_trace(num_sessions=20, turns=(2, 5), system_prompt_len=200, seed=5)
    one = simulate_system(trace, "marconi:chooser=regret", "paper-7b", 1e9, latency="zero")
    two = simulate_system(trace, "marconi:selector=regret", "paper-7b", 1e9, latency="zero")
    assert one.reused_len.tolist() == two.reused_len.tolist() and one.rule_switches == two.rule_switches


def test_the_sglang_config_names_the_chooser_and_keeps_selector_as_its_alias():
    from marconi.integrations.sglang.policy import parse_config

    assert parse_config({"alpha": "adaptive", "chooser": "regret"}) == parse_config({"alpha": "adaptive",
                                                                                       "selector": "regret"})
    assert parse_config({"chooser": "worlds"})["selector"] == "worlds"
    with pytest.raises(ConfigError, match="disagree"):
        parse_config({"alpha": "adaptive", "chooser": "regret", "selector": "worlds"})
    with pytest.raises(ConfigError, match="must be one of"):
        parse_config({"alpha": "adaptive", "chooser": "bandit"})
