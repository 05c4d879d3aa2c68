"""The adaptive default ``marconi``: its rule family, exact rule semantics, determinism, switching."""

import numpy as np
import pytest

from marconi.choosers.family import DEFAULT_RULES, parse_rules, policy_for
from marconi.choosers.regret import RegretEviction
from marconi.core.cache import ManualClock, PrefixCache
from marconi.core.candidates import flop_efficiency, flop_efficiency_array
from marconi.core.eviction import EvictionRule, score_rules
from marconi.core.model import get_model
from marconi.core.registry import ConfigError
from marconi.sim import simulate_system
from marconi.sim.sweep import TIMING_FIELDS, expand_points, run_sweep
from marconi.sim.systems import SystemConfig, make_system
from marconi.workloads import Request, Trace, build_workload, chat_trace


@pytest.fixture(scope="module")
def chat():
    return chat_trace(num_sessions=40, turns=(3, 9), system_prompt_len=300, user_len=200, output_len=250, seed=11)


def fixed(rule: EvictionRule) -> SystemConfig:
    evi = (f"flop-aware:alpha={rule.alpha},efficiency={rule.efficiency},recency={rule.recency},"
           f"candidates={rule.candidates},touch={rule.touch},tails={rule.tails}")
    return SystemConfig(rule.label(), "marconi", evi)


def test_rule_labels_round_trip_and_bad_labels_say_what_to_write():
    for label in ("lru", "a0", "a0.5m", "a2m", "a1", "a1mi", "a2lp", "a0.5mlp", "a1p", "a1l"):
        assert EvictionRule.from_label(label).label() == label
    assert EvictionRule.from_label("lru") == EvictionRule(candidates="leaves", touch="path")
    assert EvictionRule.from_label("a0lp").label() == "lru"
    assert [r.label() for r in DEFAULT_RULES] == ["lru", "a0.5m", "a2m"]
    assert EvictionRule.from_label("a0.5mt").tails and EvictionRule.from_label("a0.5mt").label() == "a0.5mt"
    assert EvictionRule.from_label("lrut").label() == "lrut" and EvictionRule.from_label("lrut").is_lru
    for bad, message in (("b1", r"write lru\[t\] or a<alpha>"), ("a1x", "not a number"), ("a1mm", "repeated"),
                         ("a-1", "alpha must be >= 0")):
        with pytest.raises(ConfigError, match=message):
            EvictionRule.from_label(bad)
    with pytest.raises(ConfigError, match="twice"):
        parse_rules("lru/a1m/a1m")


def test_lru_rule_is_sglang_plus(chat):
    for capacity in (1e9, 3e9):
        a = simulate_system(chat, fixed(EvictionRule.from_label("lru")), "paper-7b", capacity)
        b = simulate_system(chat, "sglang+", "paper-7b", capacity)
        assert a.stats.evictions_leaf > 0
        assert a.reused_len.tolist() == b.reused_len.tolist()


@pytest.mark.parametrize("label", ["lru", "a0", "a0.5m", "a2m", "a1", "a1mi", "a1lp", "a0.5p"])
def test_a_one_rule_family_decides_exactly_as_that_rule(chat, label):
    # the live cache indexes every <= 1-child node and keeps both recency signals; masking and
    # normalising over the rule's own candidates must reproduce the fixed rule, request by request
    rule = EvictionRule.from_label(label)
    for capacity in (1e9, 2.5e9):
        adaptive = simulate_system(chat, f"marconi:rules={label}", "paper-7b", capacity)
        alone = simulate_system(chat, fixed(rule), "paper-7b", capacity)
        assert alone.stats.evictions_leaf + alone.stats.evictions_inner > 0
        assert adaptive.reused_len.tolist() == alone.reused_len.tolist()
        assert adaptive.rule_switches == []


def test_scoring_many_rules_at_once_equals_each_rule(chat):
    spec = get_model("paper-7b")
    cache = PrefixCache(spec, 2e9, "marconi", RegretEviction("lru/a1m"))
    for req in chat[:150]:
        cache.process(req.input_tokens, req.output_tokens)
    cands = cache.candidates
    n = len(cands)
    assert n > 5 and not cands.leaf[:n].all()
    eff = {v: flop_efficiency_array(spec, cands.depth[:n], cands.edge_len[:n], cands.has_ssm[:n], v)
           for v in ("total", "marginal")}
    rules = [EvictionRule.from_label(x) for x in ("lru", "a0", "a0.5m", "a2m", "a1", "a1mi", "a1lp", "a0.5p", "a1l")]
    scored = score_rules(rules, cands, eff)
    assert [s[0] for s in scored] == [r.choose(cands, eff[r.efficiency]) for r in rules]


@pytest.mark.parametrize("model", ["paper-7b", "nemotron-h-8b", "qwen3-next-80b-a3b"])
def test_vectorised_flop_efficiency_is_bit_for_bit_the_scalar_one(model):
    spec = get_model(model)
    rng = np.random.default_rng(0)
    depth = rng.integers(1, 40_000, size=500)
    edge = np.minimum(depth, rng.integers(1, 5_000, size=500))
    has_ssm = rng.random(500) < 0.8
    for variant in ("total", "marginal"):
        vec = flop_efficiency_array(spec, depth, edge, has_ssm, variant)
        assert vec.tolist() == [flop_efficiency(spec, int(d), int(e), bool(h), variant)
                                for d, e, h in zip(depth, edge, has_ssm)]


@pytest.mark.parametrize("system", ["marconi", "marconi:selector=regret"])
def test_the_adaptive_default_is_deterministic_with_any_number_of_workers(system):
    trace = build_workload("swe-sample")
    points = expand_points([system], ["0.05x", "0.15x"], ["paper-7b"])
    strip = (lambda recs: [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in recs])
    one = strip(run_sweep(trace, "swe-sample", points, workers=1))
    two = strip(run_sweep(trace, "swe-sample", points, workers=2))
    again = strip(run_sweep(trace, "swe-sample", points, workers=1))
    assert one == two == again
    assert one[0]["rule_switches"]            # it did choose, not sit on its first rule
    assert one[0]["tuning"] == "adaptive"


def _phases(first: Trace, second: Trace) -> Trace:
    offset = first.requests[-1].ts + 1.0 - second.requests[0].ts
    reqs = [Request(f"A{r.session_id}", r.turn_id, r.ts, r.input_tokens, r.output_tokens) for r in first]
    reqs += [Request(f"B{r.session_id}", r.turn_id, r.ts + offset, r.input_tokens, r.output_tokens) for r in second]
    return Trace(reqs, name="shift")


def _rules_in_force(switches, num_requests: int, first: str = "lru") -> list[str]:
    at = dict(switches)
    out, rule = [], first
    for i in range(num_requests):
        rule = at.get(i, rule)
        out.append(rule)
    return out


def test_the_choice_follows_a_workload_shift():
    # SWE-agent trajectories (FLOP-aware eviction wins big), then short chats where it loses to LRU
    swe = build_workload("swe-sample")
    chats = chat_trace(num_sessions=120, turns=(4, 10), user_len=600, output_len=400, sessions_per_second=2.0, seed=1)
    capacity = 4e9
    aggressive = "marconi:alpha=2,efficiency=marginal"
    assert (simulate_system(swe, aggressive, "paper-7b", capacity).stats.token_hit_rate
            > 1.5 * simulate_system(swe, "sglang+", "paper-7b", capacity).stats.token_hit_rate)
    assert (simulate_system(chats, aggressive, "paper-7b", capacity).stats.token_hit_rate
            < 0.85 * simulate_system(chats, "sglang+", "paper-7b", capacity).stats.token_hit_rate)
    result = simulate_system(_phases(swe, chats), "marconi:selector=regret", "paper-7b", capacity)
    rules = _rules_in_force(result.rule_switches, len(result.input_len))
    first, second = rules[:len(swe)], rules[len(swe):]
    share_before = first.count("a2m") / len(first)
    share_after = second.count("a2m") / len(second)
    assert share_before >= 0.2                  # it found the aggressive rule on the agent trajectories ...
    assert share_after <= share_before / 2      # ... and mostly left it once the chats came
    assert second[: len(second) // 4].count("a2m") == 0
    assert any(at >= len(swe) for at, _ in result.rule_switches)


def test_invariants_hold_while_the_rule_keeps_changing(chat):
    clock = ManualClock()
    policy = RegretEviction("lru/a0/a1m/a2lp/a1mi")
    cache = PrefixCache("paper-7b", 1.5e9, "marconi", policy, clock=clock)
    for i, req in enumerate(chat[:200]):
        clock.now = req.ts
        policy.current = i % len(policy.rules)       # force a different rule at every request
        cache.process(req.input_tokens, req.output_tokens)
        cache.check_invariants()
    assert cache.stats.evictions_inner > 0 and cache.stats.evictions_leaf > 0


def test_marconi_names_and_their_errors():
    assert make_system("marconi").eviction == "worlds:rules=default,objective=hit-rate"   # the default selector
    assert make_system("marconi:selector=regret").eviction == "regret:rules=default,objective=hit-rate"
    assert make_system("marconi:tuner=bootstrap").tuning is not None
    assert make_system("marconi:multiplier=15").tuning.multiplier == 15      # bootstrap-only: selects it
    old_name = make_system("marconi:recency=inverse-age,efficiency=marginal")  # a single-rule knob: the same
    assert old_name.tuning is not None and "efficiency=marginal,recency=inverse-age" in old_name.eviction
    assert make_system("marconi:rules=lru/a1m,decay=0.99").eviction == \
        "worlds:rules=lru/a1m,objective=hit-rate,decay=0.99"
    assert make_system("marconi:selector=regret,rules=lru/a1m,decay=0.99").eviction == \
        "regret:rules=lru/a1m,objective=hit-rate,decay=0.99"
    for name, message in (("marconi:alpha=1,tuner=adaptive", "nothing to tune"),
                          ("marconi:alpha=1,multiplier=5", "nothing to tune"),
                          ("marconi:rules=a1m,multiplier=5", "mix the bootstrap"),
                          ("marconi:tuner=adaptive,multiplier=5", "do not apply to tuner=adaptive"),
                          ("marconi:tuner=bootstrap,rules=a1m", "do not apply to tuner=bootstrap"),
                          ("marconi:tuner=adaptive,efficiency=marginal", "chooses the efficiency"),
                          ("marconi:rules=a1m,efficiency=marginal", "chooses the efficiency"),
                          ("marconi:tuner=greedy", "tuner must be"),
                          ("marconi:rules=a1q", "not a number"),
                          ("marconi:decay=0", "decay: must be a finite number > 0 and <= 1")):  # its Domain
        with pytest.raises(ConfigError, match=message):
            make_system(name).build("paper-7b", 1e9)


def test_an_adaptive_policy_serves_one_cache():
    policy = RegretEviction()
    PrefixCache("paper-7b", 1e9, "marconi", policy)
    with pytest.raises(ConfigError, match="one cache"):
        PrefixCache("paper-7b", 1e9, "marconi", policy)
    assert policy_for(EvictionRule.from_label("lru")).name == "lru"


def _adaptive_system(policy_kwargs: dict) -> SystemConfig:
    """A marconi system whose adaptive policy takes constructor options the registry does not name."""
    from marconi.core.eviction import EVICTION_POLICIES

    name = "adaptive-test-confidence"
    if name not in EVICTION_POLICIES.names():
        def factory(confidence: float = 0.0) -> RegretEviction:
            return RegretEviction(confidence=confidence)

        EVICTION_POLICIES.register(name, "test only")(factory)
    return SystemConfig("marconi", "marconi", f"{name}:confidence={policy_kwargs['confidence']}")


def test_confidence_is_a_burden_of_proof_for_leaving_the_first_rule(chat):
    capacity = 1e9
    free = simulate_system(chat, "marconi:selector=regret", "paper-7b", capacity)
    assert free.rule_switches                               # without it the selector leaves LRU here ...
    stuck = simulate_system(chat, _adaptive_system({"confidence": 1e9}), "paper-7b", capacity)
    assert stuck.rule_switches == []                        # ... with an absurd bound it never does,
    lru = simulate_system(chat, "sglang+", "paper-7b", capacity)
    assert stuck.reused_len.tolist() == lru.reused_len.tolist()  # and is exactly SGLang+
    bounded = simulate_system(chat, _adaptive_system({"confidence": 2.0}), "paper-7b", capacity)
    assert bounded.rule_switches                            # a real bound: it still leaves LRU, but only later,
    assert bounded.rule_switches[0][0] > free.rule_switches[0][0]    # once the lead stands out of the noise
    again = simulate_system(chat, _adaptive_system({"confidence": 2.0}), "paper-7b", capacity)
    assert again.reused_len.tolist() == bounded.reused_len.tolist() and again.rule_switches == bounded.rule_switches


def test_the_confidence_bound_reads_the_noise_of_the_regret_gap():
    policy = RegretEviction(confidence=2.0)
    policy.regret[:] = [10.0, 4.0, 9.0]      # rule 1 leads the first rule by 6 charged tokens
    noise = policy.noise
    noise.gap_sq[0, 1] = noise.gap_sq[1, 0] = 4.0    # one charge difference of 2 per request: se 2
    assert policy.lead_is_significant(1)     # 6 > 2 x 2
    noise.gap_sq[0, 1] = noise.gap_sq[1, 0] = 16.0   # se 4: a lead of 6 is within the noise
    assert not policy.lead_is_significant(1)
    noise.step[:] = [3.0, 0.0, 3.0]          # a request that charged rules 0 and 2, not rule 1
    noise.end_request()
    assert noise.gap_sq[0, 1] == pytest.approx(16.0 * 0.999**2 + 9.0) and noise.gap_sq[0, 2] == pytest.approx(0.0)
    assert not noise.step.any()
    with pytest.raises(ConfigError, match="confidence must be >= 0"):
        RegretEviction(confidence=-1)
