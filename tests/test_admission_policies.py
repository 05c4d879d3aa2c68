"""Placement baselines and the sparse-dp admission policy inside the cache."""

import numpy as np
import pytest

from marconi.core.cache import PrefixCache
from marconi.core.registry import ConfigError
from marconi.sim import simulate_system
from marconi.sim.systems import make_system
from marconi.workloads import doc_qa_trace

from test_cache import SPEC, toks


def final_checkpoints(admission, input_len=100, output_len=10):
    cache = PrefixCache(SPEC, 10**9, admission, "lru")
    _, ins = cache.process(np.arange(input_len, dtype=np.int32), np.arange(1000, 1000 + output_len, dtype=np.int32))
    return ins.admitted


def test_baseline_placements():
    assert final_checkpoints("last-token") == (110,)
    assert final_checkpoints("uniform:m=4") == (25, 50, 75, 100, 110)
    assert final_checkpoints("every-block:block=32,paged=false") == (32, 64, 96, 110)
    assert final_checkpoints("every-block:block=32") == (32, 64, 96)     # vLLM+: whole blocks only
    # cold cache: the prior (mass everywhere) still gets its m checkpoints, inside the input...
    cold = final_checkpoints("sparse-dp:m=3")
    assert len(cold) == 4 and cold[-1] == 110 and all(0 < p <= 100 for p in cold[:-1])
    # ...unless only observed depths may hold checkpoints: nothing observed yet, nothing placed
    assert final_checkpoints("sparse-dp:m=3,candidates=observed") == (110,)


def test_sparse_dp_places_checkpoints_where_requests_diverge():
    """Questions on one document diverge right after it: the DP learns the depth and checkpoints it."""
    doc = toks((0, 800))
    cache = PrefixCache(SPEC, 10**9, "sparse-dp:m=1,marconi=false,cost=tokens", "lru")
    hits = []
    for q in range(12):
        question = toks((10_000 + 100 * q, 10_000 + 100 * q + 30))
        match, ins = cache.process(np.concatenate((doc, question)), toks((50_000 + q, 50_001 + q)))
        hits.append(match.usable_hit_len)
    # once the estimator has seen overlaps at 800, new sequences get a checkpoint there
    assert hits[-1] == 800
    assert any(n.depth == 800 and n.has_ssm for n in cache.tree.iter_nodes())


def test_sparse_dp_frontier_is_no_worse_than_uniform_on_document_qa():
    trace = doc_qa_trace(num_docs=4, doc_len=3000, questions_per_doc=20, depth_fractions=(0.3, 0.6, 1.0), seed=0)
    unusable = {}
    for name in ("custom:admission=uniform(m=2;)", "custom:admission=sparse-dp(m=2;marconi=false)"):
        res = simulate_system(trace, name, "paper-7b", 1e13, latency="zero")
        unusable[name] = (res.stats.unusable_tokens, res.stats.checkpoints_admitted)
    (u_uni, c_uni), (u_dp, c_dp) = unusable.values()
    assert u_dp < u_uni
    assert c_dp <= 3 * len(trace)     # at most m = 2 placed + the last token per request


def test_lagrangian_mode_trades_checkpoints_for_recompute():
    trace = doc_qa_trace(num_docs=3, doc_len=3000, questions_per_doc=16, seed=1)
    cheap = simulate_system(trace, "custom:admission=sparse-dp(lam=0.0;marconi=false)", "paper-7b", 1e13, latency="zero").stats
    dear = simulate_system(trace, "custom:admission=sparse-dp(lam=1e12;marconi=false)", "paper-7b", 1e13, latency="zero").stats
    assert dear.checkpoints_admitted == len(trace)       # a prohibitive price: only the last tokens
    assert cheap.checkpoints_admitted > dear.checkpoints_admitted
    assert cheap.unusable_tokens < dear.unusable_tokens


def test_bad_policy_parameters():
    with pytest.raises(ConfigError, match="no parameter 'n'; valid parameters: m"):
        make_system("custom:admission=uniform(n=3)")
    with pytest.raises(ConfigError, match="cost must be 'flops' or 'tokens'"):
        make_system("custom:admission=sparse-dp(cost=seconds)")
    with pytest.raises(ConfigError, match="unbalanced parentheses"):
        make_system("custom:admission=uniform(m=3")
