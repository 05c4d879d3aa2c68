"""The rule choosers' contracts that a caller of the Python API relies on (audit V): a caller's
``set_rule`` before binding or mid-run, the tier chooser's fallback from an ARC world that does not
lead every tree world, the bootstrap tuner replaying the live rule, and the parameter checks."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

import marconi.choosers.bootstrap as bootstrap
from marconi.choosers.bootstrap import BootstrapTuner
from marconi.choosers.regret import RegretEviction
from marconi.choosers.worlds import WorldsChooser, WorldsEviction
from marconi.core.cache import ManualClock, PrefixCache
from marconi.core.chooser import follow
from marconi.core.eviction import EvictionRule, FlopAware
from marconi.core.model import get_model
from marconi.core.registry import ConfigError
from marconi.integrations.vllm.emulate.tier import ReqContext
from marconi.integrations.vllm.policy import ATTENTION, MAMBA
from marconi.integrations.vllm.shadow import PoolShadowAlpha
from marconi.integrations.vllm.tier_chooser import ARC_WORLD, AdaptiveTierPolicy, TierEvent, TierRuleChooser
from marconi.integrations.vllm.tier_settings import TierSettings
from marconi.sim import simulate
from marconi.workloads import chat_trace

NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def chat():
    return chat_trace(num_sessions=40, turns=(3, 9), system_prompt_len=300, user_len=200, output_len=250, seed=11)


def _serve(policy, requests, capacity: float = 1.5e9) -> PrefixCache:
    clock = ManualClock()
    cache = PrefixCache("paper-7b", capacity, "marconi", policy, clock=clock)
    simulate(requests, cache, clock=clock)
    return cache


# ---------------------------------------------------------------- worlds: set_rule before bind
def test_worlds_set_rule_before_bind_starts_the_chooser_on_that_rule(chat):
    policy = WorldsEviction("lru/a2m")
    policy.set_rule(EvictionRule.from_label("a2m"))
    cache = PrefixCache("paper-7b", 1.5e9, "marconi", policy, clock=ManualClock())
    chooser = policy.chooser
    assert chooser is not None
    assert chooser.rule.label() == "a2m" == cache.eviction.rule.label()
    assert {chooser.rules[k].label() for k in chooser.worlds} == {"lru"}   # the worlds are the other rules'
    assert chooser.switches == []                                           # the starting rule, not a switch


def test_worlds_set_rule_before_bind_runs_as_current(chat):
    moved = WorldsEviction("lru/a2m")
    moved.set_rule(EvictionRule.from_label("a2m"))
    a = _serve(moved, chat)
    b = _serve(WorldsEviction("lru/a2m", current=1), chat)
    assert a.chooser.tuning_record() == b.chooser.tuning_record()
    assert a.chooser.tuning_record()["rule_switches"]          # the chooser is not inert
    assert a.stats.reused_tokens == b.stats.reused_tokens
    assert a.chooser.rule == a.eviction.rule


# ---------------------------------------------------------------- tier chooser: ARC fallback
def _tier_settings(rules: str) -> TierSettings:
    family = tuple(EvictionRule.from_label(r) for r in rules.split("/"))
    return TierSettings((MAMBA, ATTENTION), get_model("nemotron-h-8b"), 1152, family[0], family=family)


def _end_with_scores(scores: list[float], rules: str = "lru/a2m") -> tuple[str | None, TierRuleChooser]:
    """A chooser (live: the first rule, with the ARC world) given ``scores``, then an empty request
    end (every world's value 0, decay 1): what ``observe`` returns."""
    chooser = TierRuleChooser(24, _tier_settings(rules), arc_world=True, decay=1.0)
    chooser.score = list(scores)
    return chooser.observe(TierEvent("on_request_finished", (), ReqContext(1))), chooser


def test_tier_arc_narrowly_best_falls_back_to_the_best_tree_world():
    # a2m leads the live lru tenfold; ARC a little above or below a2m: the tier moves to a2m either way
    for arc in (900_000.0, 1_000_001.0):
        out, chooser = _end_with_scores([100_000.0, 1_000_000.0, arc])
        assert out == "a2m" and chooser.label == "a2m" and chooser.switches == [(1, "a2m")]


def test_tier_arc_fallback_keeps_the_usual_margins():
    # ARC narrowly best, a2m clearly ahead of lru: a2m (the fallback)
    out, _ = _end_with_scores([100_000.0, 1_000_000.0, 1_000_001.0])
    assert out == "a2m"
    # ARC narrowly best, a2m only 1% ahead of the live lru: no switch (the fallback needs the usual lead)
    out, chooser = _end_with_scores([1_000_000.0, 1_010_000.0, 1_010_001.0])
    assert out is None and chooser.label == "lru"
    # ARC ahead of every tree world by the margins: ARC; once live, ARC is not left for a tree world behind it
    chooser = TierRuleChooser(24, _tier_settings("lru/a2m"), arc_world=True, decay=1.0)
    chooser.score = [100_000.0, 500_000.0, 1_000_000.0]
    assert chooser.observe(TierEvent("on_request_finished", (), ReqContext(1))) == ARC_WORLD
    assert chooser.rule is None
    chooser.score = [100_000.0, 1_000_000.0, 1_000_001.0]
    assert chooser.observe(TierEvent("on_request_finished", (), ReqContext(2))) is None
    assert chooser.label == ARC_WORLD


# ---------------------------------------------------------------- bootstrap: the live rule's replay
def _replay_as(job, alpha: float, **rule) -> int:
    clock = ManualClock()
    policy = FlopAware(alpha, job.efficiency, job.recency, **rule)
    cache = PrefixCache.from_snapshot(job.snapshot, job.spec, job.capacity_bytes, copy.deepcopy(job.admission),
                                      policy, clock=clock)
    for req in job.window:
        clock.now = req.ts
        cache.process(req.input_tokens, req.output_tokens)
    return cache.stats.reused_tokens


@pytest.fixture
def tuning_jobs(monkeypatch):
    """Every TuningJob the bootstrap tuner hands to ``evaluate_alphas`` (run in-process)."""
    jobs = []
    evaluate = bootstrap.evaluate_alphas

    def spy(job, grid, workers=None, mapper=None):
        jobs.append(job)
        return evaluate(job, grid, 1, mapper)

    monkeypatch.setattr(bootstrap, "evaluate_alphas", spy)
    return jobs


def test_bootstrap_replays_every_alpha_under_the_live_rules_settings(tuning_jobs):
    jobs = tuning_jobs
    requests = chat_trace(num_sessions=60, turns=(3, 9), system_prompt_len=300, user_len=200, output_len=250,
                          seed=11)
    live = FlopAware(0.0, "total", "linear", candidates="leaves", touch="path")
    clock = ManualClock()
    cache = PrefixCache("paper-7b", 1.2e9, "marconi", live, clock=clock)
    tuner = BootstrapTuner(live, multiplier=5, workers=1, grid=(0.0, 0.4, 1.2, 2.0))
    follow(cache, tuner)
    simulate(requests, cache, clock=clock)
    assert tuner.events and jobs
    job, event = jobs[0], tuner.events[0]
    assert (job.candidates, job.touch, job.tails) == ("leaves", "path", False)
    for result in event.results:
        assert result.reused_tokens == _replay_as(job, result.alpha, candidates="leaves", touch="path")


def test_bootstrap_carries_tails_into_the_job(tuning_jobs, chat):
    jobs = tuning_jobs
    live = FlopAware(0.0, tails=True)
    clock = ManualClock()
    cache = PrefixCache("paper-7b", 1.5e9, "marconi", live, clock=clock)
    tuner = BootstrapTuner(live, multiplier=2, workers=1, grid=(0.0, 1.0))
    follow(cache, tuner)
    simulate(chat, cache, clock=clock)
    assert jobs and jobs[0].tails is True
    assert [r.reused_tokens for r in tuner.events[0].results] == [
        _replay_as(jobs[0], a, tails=True) for a in (0.0, 1.0)]


# ---------------------------------------------------------------- regret: a caller's switch is recorded
def test_regret_records_a_callers_set_rule(chat):
    policy = RegretEviction(hysteresis=INF)      # the chooser never switches on its own
    clock = ManualClock()
    cache = PrefixCache("paper-7b", 1.5e9, "marconi", policy, clock=clock)
    half = len(chat) // 2
    simulate(chat[:half], cache, clock=clock)
    last = cache.stats.num_requests - 1
    cache.set_rule("a2m")
    cache.set_rule("a2m")                        # no change: nothing more recorded
    simulate(chat[half:], cache, clock=clock)
    assert cache.chooser.tuning_record() == {"rule_switches": [[last, "a2m"]]}
    assert cache.eviction.rule.label() == "a2m"
    # before binding, set_rule picks the rule the cache starts on: not a switch
    early = RegretEviction(hysteresis=INF)
    early.set_rule(EvictionRule.from_label("a2m"))
    assert _serve(early, chat[:20]).chooser.tuning_record() == {"rule_switches": []}
    assert early.rule.label() == "a2m"


# ---------------------------------------------------------------- parameter checks
@pytest.mark.parametrize("current", [3, 5, -1, True, 1.0, "1"])
def test_worlds_chooser_current_must_index_the_family(current):
    with pytest.raises(ConfigError, match="current"):
        WorldsChooser("lru/a0.5m/a2m", current=current)


def test_worlds_chooser_current_is_checked_at_both_ends_of_the_family():
    for bad in (-1, 3):
        with pytest.raises(ConfigError, match="current"):
            WorldsChooser("lru/a0.5m/a2m", current=bad)
    for k in range(3):
        assert WorldsChooser("lru/a0.5m/a2m", current=k).current == k
    assert WorldsChooser("lru/a0.5m/a2m", current=np.int64(2)).rule.label() == "a2m"


@pytest.mark.parametrize("kwargs, name", [
    ({"hysteresis": NAN}, "hysteresis"),
    ({"reach_weight": NAN}, "reach_weight"), ({"reach_weight": -1.0}, "reach_weight"),
    ({"reach_weight": INF}, "reach_weight"),
])
def test_regret_refuses_bad_parameters(kwargs, name):
    with pytest.raises(ConfigError, match=name):
        RegretEviction(**kwargs)


def test_regret_reach_weight_is_checked_against_its_documented_range():
    with pytest.raises(ConfigError, match="reach_weight"):
        RegretEviction(reach_weight=-1e-9)
    assert RegretEviction(hysteresis=INF, reach_weight=0.0).reach_weight == 0.0
    assert RegretEviction(reach_weight=2.5).reach_weight == 2.5


@pytest.mark.parametrize("kwargs, name", [
    ({"multiplier": NAN}, "multiplier"), ({"multiplier": INF}, "multiplier"),
    ({"drift": NAN}, "drift"), ({"drift": -1.0}, "drift"), ({"drift": INF}, "drift"),
    ({"retune_every": -3}, "retune_every"), ({"retune_every": 2.5}, "retune_every"),
    ({"retune_every": True}, "retune_every"),
    ({"workers": 0}, "workers"), ({"workers": -2}, "workers"), ({"workers": 1.5}, "workers"),
])
def test_bootstrap_refuses_bad_parameters(kwargs, name):
    with pytest.raises(ConfigError, match=name):
        BootstrapTuner(FlopAware(0.0), **kwargs)


def test_bootstrap_parameters_are_checked_at_the_edges_of_their_ranges():
    for kwargs in ({"multiplier": 0}, {"drift": -1e-9}, {"retune_every": -1}, {"workers": 0}):
        with pytest.raises(ConfigError, match=next(iter(kwargs))):
            BootstrapTuner(FlopAware(0.0), **kwargs)
    tuner = BootstrapTuner(FlopAware(0.0), multiplier=0.5, drift=0.0, retune_every=0, workers=None)
    assert (tuner.multiplier, tuner.drift, tuner.retune_every, tuner.workers) == (0.5, 0.0, 0, None)
    assert BootstrapTuner(FlopAware(0.0), retune_every=50, workers=1).workers == 1


@pytest.mark.parametrize("capacity", [-1, -4, 2.5, True, NAN, "10"])
def test_tier_chooser_capacity_must_be_a_whole_number_of_chunks(capacity):
    with pytest.raises(ConfigError, match="capacity"):
        TierRuleChooser(capacity, _tier_settings("lru/a2m"))


def test_tier_chooser_capacity_is_checked_at_zero_chunks():
    """vLLM builds a zero-capacity CPUOffloadingManager (its own test_manager's usage gauge does):
    an empty tier is a tier, and -1 is the first refused."""
    with pytest.raises(ConfigError, match="capacity"):
        TierRuleChooser(-1, _tier_settings("lru/a2m"))
    assert TierRuleChooser(0, _tier_settings("lru/a2m")).worlds[0].capacity == 0
    assert TierRuleChooser(1, _tier_settings("lru/a2m")).min_lead > 0
    assert TierRuleChooser(np.int64(24), _tier_settings("lru/a2m")).worlds[0].capacity == 24


@pytest.mark.parametrize("kwargs", [{"hysteresis": math.nan}, {"decay": math.nan}, {"decay": 0.0}, {"decay": True},
                                    {"hysteresis": -0.1}, {"hysteresis": "0.05"}])
def test_the_pool_shadow_refuses_bad_scoring_when_built_not_when_it_binds(kwargs) -> None:
    """vLLM's adaptive α source checks its regret chooser's decay and hysteresis when it is built
    (a NaN hysteresis was accepted there and never switched once the pool bound)."""
    with pytest.raises(ConfigError, match=f"adaptive {next(iter(kwargs))} must be"):
        PoolShadowAlpha(**kwargs)


def test_an_adaptive_tier_of_zero_chunks_builds_and_evicts_nothing():
    """vLLM's own tier tests build a CPUOffloadingManager of 0 chunks: the adaptive policy (its
    chooser included) must build, and evict nothing (vLLM's contract: None for more than it holds)."""
    policy = AdaptiveTierPolicy(0, _tier_settings("lru/a2m"))
    assert policy.chooser is not None and policy.evict(1, set()) is None and policy.evict(0, set()) == []


@pytest.mark.parametrize("build, who", [(lambda **kw: WorldsChooser(**kw), "worlds"),
                                        (lambda **kw: TierRuleChooser(8, _tier_settings("lru/a2m"), **kw),
                                         "tier chooser"),
                                        (lambda **kw: PoolShadowAlpha(**kw), "adaptive")])
@pytest.mark.parametrize("kwargs", [{"decay": True}, {"hysteresis": False}, {"decay": math.nan}, {"decay": 2.0},
                                    {"hysteresis": -1.0}])
def test_every_chooser_checks_its_scoring_by_one_contract(build, who, kwargs) -> None:
    """The worlds chooser took ``decay=True`` as 1 (its check compared a bool with numbers), as the tier
    chooser did: every chooser's decay and hysteresis are now checked by ``core.chooser.check_scoring``."""
    with pytest.raises(ConfigError, match=f"^{who} {next(iter(kwargs))} must be"):
        build(**kwargs)
