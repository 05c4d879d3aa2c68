"""``tails=reach``: dead tails of branched sequences trimmed first (``marconi.core.tails``).

The hand-made traces are the two cases the mechanism must tell apart: an agent that drops old
observations (each call leaves the previous call's sequence early, so the tail past that point is
dead and its branch is what the next call reuses) and conversations that continue (every turn
re-enters the previous one wholly, so nothing may be trimmed).
"""

import math

import numpy as np
import pytest

from marconi.core.cache import ManualClock, PrefixCache
from marconi.core.registry import ConfigError
from marconi.core.tails import TailReach
from marconi.sim import simulate_system
from marconi.workloads import Request, chat_trace


def keep_k_agent(sessions: int = 6, calls: int = 14, keep: int = 3, obs_len: int = 160, act_len: int = 16,
                 placeholder_len: int = 4, system_len: int = 64, seed: int = 0) -> list[Request]:
    """Agent loops that keep only the last ``keep`` observations: call ``t`` sends the system prompt,
    the task and every (action, observation) pair so far, observations older than ``keep`` replaced
    by a short placeholder; its output is the next action. Sessions interleave round robin."""
    rng = np.random.default_rng(seed)
    vocab = 30_000
    system = rng.integers(0, vocab, system_len)
    out = []
    plans = [(rng.integers(0, vocab, 32), [rng.integers(0, vocab, act_len) for _ in range(calls)],
              [rng.integers(0, vocab, obs_len) for _ in range(calls)],
              [rng.integers(0, vocab, placeholder_len) for _ in range(calls)]) for _ in range(sessions)]
    ts = 0.0
    for t in range(calls):
        for s, (task, acts, obs, holes) in enumerate(plans):
            parts = [system, task]
            for i in range(t):
                parts += [acts[i], obs[i] if i >= t - keep else holes[i]]
            out.append(Request(s, t, ts, np.concatenate(parts), acts[t]))
            ts += 1.0
    return out


def _capacity(spec_name: str, states: int, kv_tokens: int) -> float:
    from marconi.core.model import get_model
    spec = get_model(spec_name)
    return states * spec.ssm_checkpoint_bytes + kv_tokens * spec.kv_bytes_per_token


def test_the_margin_covers_the_quantile_with_slack_and_waits_for_evidence():
    reach = TailReach(window=10, quantile=0.9, slack=1.5, min_observations=4)
    for advance in (10, 20, 30):
        reach.observe(advance)
    assert reach.margin is None  # three re-entries are not evidence yet
    reach.observe(40)
    assert reach.margin == math.ceil(40 * 1.5)  # 0.9 of 4 rounds up to the largest
    for _ in range(6):
        reach.observe(10)
    assert reach.margin == math.ceil(30 * 1.5)  # the 9th of 10 sorted
    reach.observe(10)  # the window forgets the first one (a 10)
    assert reach.margin == math.ceil(30 * 1.5)
    reach.observe(math.inf)
    reach.observe(math.inf)
    assert reach.margin is None  # more than a tenth ran to a leaf's end: trim nothing


@pytest.mark.parametrize("bad", [dict(window=0), dict(quantile=0), dict(slack=0.5), dict(min_observations=100)])
def test_bad_settings_are_config_errors(bad):
    with pytest.raises(ConfigError):
        TailReach(**bad)
    with pytest.raises(ConfigError, match="tails must be one of"):
        PrefixCache("paper-7b", 1e12, "marconi:tails=maybe", "lru")


def test_an_agent_that_drops_observations_keeps_the_branch_it_needs():
    """At a capacity where whole tails crowd out the sequences the next calls branch from, trimming
    the predicted-dead tails first finds (and reuses) branch states that plain Marconi admission loses."""
    trace = keep_k_agent()
    for plain, trimmed, kv, gain in (("marconi:alpha=0.5", "marconi:alpha=0.5,tails=reach", 6000, 1.5),
                                     ("sglang+", "sglang+:tails=reach", 10000, 1.0)):
        capacity = _capacity("paper-7b", 6, kv)
        a = simulate_system(trace, plain, "paper-7b", capacity).stats
        b = simulate_system(trace, trimmed, "paper-7b", capacity).stats
        assert a.tail_trims == 0 and b.tail_trims > 0 and a.evictions_leaf > 0
        assert b.reused_tokens > gain * a.reused_tokens, (plain, a.token_hit_rate, b.token_hit_rate)


def test_continuing_conversations_trim_nothing_and_decide_as_before():
    """Every turn re-enters its predecessor wholly: the margin never exists, so ``tails=reach``
    makes exactly the decisions of plain admission (a session that always returns keeps its state)."""
    trace = chat_trace(num_sessions=30, turns=(3, 8), system_prompt_len=200, user_len=120, output_len=150, seed=5)
    capacity = _capacity("paper-7b", 8, 4000)
    for system in ("sglang+", "marconi"):
        plain = simulate_system(trace, system, "paper-7b", capacity)
        trimmed = simulate_system(trace, f"{system}:tails=reach", "paper-7b", capacity)
        assert plain.stats.evictions_leaf > 0 and trimmed.stats.tail_trims == 0
        assert plain.reused_len.tolist() == trimmed.reused_len.tolist()


def test_trimming_keeps_the_stub_where_the_next_call_diverges():
    """The right entry is kept: after a trim, the branched leaf still spells the tokens up to its
    predicted reach (so the next call's branch is found), and its dead tail and state are gone."""
    trace = keep_k_agent(sessions=4, calls=10, seed=3)
    clock = ManualClock()
    cache = PrefixCache("paper-7b", _capacity("paper-7b", 3, 2500), "marconi:tails=reach", "lru", clock=clock)
    trimmed_leaf_found, widest = False, 0
    for req in trace:
        clock.now = req.ts
        before = cache.stats.tail_trims
        cache.process(req.input_tokens, req.output_tokens)  # re-entries are seen in begin, cuts made in finish
        cache.check_invariants()
        if cache.stats.tail_trims > before:
            margin = cache.tail_margin
            widest = max(widest, margin)
            stubs = [n for n in cache.tree.iter_nodes() if n.tail_base >= 0 and not n.children and not n.has_ssm]
            assert all(n.depth <= n.tail_base + widest for n in stubs)  # nothing past a reach survives a cut
            trimmed_leaf_found |= any(n.depth == n.tail_base + margin for n in stubs)  # cut exactly at the reach
    assert trimmed_leaf_found and cache.stats.tail_tokens_trimmed > 0
    assert cache.stats.reused_tokens > 0


def test_tails_are_deterministic_and_survive_a_clone():
    trace = keep_k_agent(sessions=4, calls=10, seed=3)
    capacity = _capacity("paper-7b", 5, 5000)
    first = simulate_system(trace, "marconi:tails=reach", "paper-7b", capacity)
    again = simulate_system(trace, "marconi:tails=reach", "paper-7b", capacity)
    assert first.reused_len.tolist() == again.reused_len.tolist() and first.stats == again.stats
    # a clone mid-trace continues exactly as the original (the worlds selector relies on it)
    clock = ManualClock()
    cache = PrefixCache("paper-7b", capacity, "marconi:tails=reach", "lru", clock=clock)
    half = len(trace) // 2
    for req in trace[:half]:
        clock.now = req.ts
        cache.process(req.input_tokens, req.output_tokens)
    twin = cache.clone("lru")
    twin.check_invariants()
    for req in trace[half:]:
        clock.now = req.ts
        a = cache.process(req.input_tokens, req.output_tokens)
        b = twin.process(req.input_tokens, req.output_tokens)
        assert a == b
    assert cache.stats.tail_trims > 0 and cache.stats == twin.stats


def test_an_empty_cache_cloned_into_a_tail_cutting_rule_decides_as_one_built_for_it():
    """A clone into a rule that tracks dead tails, from a cache that did not, starts tracking them
    (it used to keep ``dead_tails`` None and never cut one)."""
    trace = keep_k_agent(sessions=4, calls=10, seed=3)
    capacity = _capacity("paper-7b", 5, 5000)
    rule = "flop-aware:alpha=0.5,tails=true"
    clock = ManualClock()
    twin = PrefixCache("paper-7b", capacity, "marconi", "lru", clock=clock).clone(rule)
    fresh = PrefixCache("paper-7b", capacity, "marconi", rule, clock=clock)
    for req in trace:
        clock.now = req.ts
        assert twin.process(req.input_tokens, req.output_tokens) == fresh.process(req.input_tokens, req.output_tokens)
    assert fresh.stats.tail_trims > 0 and twin.stats == fresh.stats


def test_the_regret_selector_refuses_rules_that_cut_tails():
    """Its counterfactuals score victims, so a cutting rule would be judged without its cuts."""
    with pytest.raises(ConfigError, match="cannot judge dead-tail cuts"):
        PrefixCache("paper-7b", 1e12, "marconi", "regret:rules=lru/a0.5mt")


def test_a_session_that_returns_keeps_its_state_and_one_that_leaves_loses_its_tail():
    """One trace, two kinds of session: agents that leave each call's sequence early, and
    conversations over one shared system prompt that always come back for the whole of it.
    Cutting takes only the agents' tails: the conversations reuse as much as without cuts (their
    first turns hang from the prompt's node, whose own re-entries are whole: no margin there),
    and the agents reuse more."""
    agents = keep_k_agent(sessions=4, calls=10, seed=3)
    chats = chat_trace(num_sessions=6, turns=(4, 6), system_prompt_len=64, user_len=60, output_len=60, seed=9)
    trace = sorted([*agents, *chats], key=lambda r: r.ts)
    is_agent = {id(r) for r in agents}
    reused = {}
    for admission in ("marconi", "marconi:tails=reach"):
        clock = ManualClock()
        cache = PrefixCache("paper-7b", _capacity("paper-7b", 5, 5000), admission, "lru", clock=clock)
        got = {"agent": 0, "chat": 0}
        for req in trace:
            clock.now = req.ts
            match, _ = cache.process(req.input_tokens, req.output_tokens)
            got["agent" if id(req) in is_agent else "chat"] += match.usable_hit_len
        reused[admission] = got, cache.stats
    (plain, plain_stats), (cut, cut_stats) = reused["marconi"], reused["marconi:tails=reach"]
    assert plain_stats.evictions_leaf > 0 and cut_stats.tail_trims > 0
    assert cut["chat"] >= plain["chat"] and cut["agent"] > plain["agent"], (plain, cut)
