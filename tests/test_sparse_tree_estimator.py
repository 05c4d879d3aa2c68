"""The tree-keyed overlap estimator (issue 24 item 2) and the exact Lagrangian placement without a cap."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from marconi.core.admission import AdmissionContext, MatchResult
from marconi.core.cache import ManualClock, PrefixCache
from marconi.core.model import PRESETS
from marconi.sparse.admission import SparseDPAdmission
from marconi.sparse.dp import TOKEN_COST, expected_cost, flops_cost, place_checkpoints, place_checkpoints_lagrangian
from marconi.sparse.overlap import TreeEstimatorConfig, TreeOverlapEstimator, path_keys

SPEC = PRESETS["paper-7b"]


def seq(*parts: tuple[int, int]) -> np.ndarray:
    """Concatenated runs ``(seed, length)`` of random tokens: equal seeds spell equal prefixes."""
    return np.concatenate([np.random.default_rng(s).integers(0, 32000, n) for s, n in parts]).astype(np.int32)


# ================================================================================= keys
def test_keys_name_prefixes():
    a, b = seq((1, 300), (2, 50)), seq((1, 300), (3, 50))
    ka, kb = path_keys(a), path_keys(b)
    assert ka.size == 351 and ka[0] == 0
    assert np.array_equal(ka[:301], kb[:301])          # the shared 300 tokens: the same nodes
    assert not np.any(ka[301:] == kb[301:])             # past the divergence: other nodes


def test_documents_after_a_long_shared_instruction_are_separate_nodes_with_relative_depths():
    """The first estimator keyed by the first 128 tokens; a 300-token instruction merged every
    document. Here each document's node has its own histogram, in depths relative to it."""
    est = TreeOverlapEstimator()
    inst = (9, 300)
    doc_a, doc_b = seq(inst, (1, 1000)), seq(inst, (2, 3000))
    for doc, depth in ((doc_a, 300 + 1000), (doc_b, 300 + 3000)):
        keys = path_keys(doc)
        est.attach(keys, 300 + 200)                     # a question diverged 200 tokens into the document
        for _ in range(20):
            est.observe(keys, depth)                    # later ones read it to its end
    pa = est.node_weights(path_keys(doc_a), 500, 1000 - 200)
    pb = est.node_weights(path_keys(doc_b), 500, 3000 - 200)
    assert int(np.argmax(pa)) == 800 and int(np.argmax(pb)) == 2800     # relative to each node
    assert est.num_nodes == 2


def test_path_weights_compose_the_nodes_on_the_path():
    est = TreeOverlapEstimator(TreeEstimatorConfig(prior_strength=1e-9, node_strength=1e-9,
                                                   half_life_obs=float("inf")))
    s = seq((1, 100), (2, 100))
    keys = path_keys(s)
    est.attach(keys, 100)
    for hit in (50, 100, 100, 150):                     # root sees 50, 100, 100, 150; the node 0, 0, 50
        est.observe(keys, hit)
    w, territories = est.path_weights(keys, 200)
    assert territories == [(0, 100), (100, 201)]
    assert w[50] == pytest.approx(0.25, rel=1e-6)       # stops in the root's territory
    # 3/4 reach the node; it splits them 2/3 at +0, 1/3 at +50
    assert w[100] == pytest.approx(0.75 * 2 / 3, rel=1e-6) and w[150] == pytest.approx(0.75 / 3, rel=1e-6)
    assert w.sum() == pytest.approx(1.0)


def test_the_default_prior_has_no_mass_at_the_end():
    w = TreeOverlapEstimator().pooled_weights(100)
    assert np.allclose(w, 1 / 101)


# ================================================================================= forgetting
def test_count_decay_halves_per_half_life_of_the_nodes_observations():
    est = TreeOverlapEstimator(TreeEstimatorConfig(half_life_obs=4, prior_strength=1e-9, node_strength=1e-9))
    keys = path_keys(seq((1, 100)))
    est.observe(keys, 10)
    for _ in range(4):
        est.observe(keys, 20)
    w = est.node_weights(keys, 0, 100)
    # the old observation weighs 2**-1 against 2**0 + 2**-0.25 + 2**-0.5 + 2**-0.75
    newer = sum(2.0 ** -(k / 4) for k in range(4))
    assert w[10] / w[20] == pytest.approx(0.5 / newer, rel=1e-9)


def test_time_decay_reads_the_clock():
    clock = ManualClock()
    est = TreeOverlapEstimator(TreeEstimatorConfig(half_life_obs=float("inf"), half_life_s=10.0,
                                                   prior_strength=1e-9, node_strength=1e-9), clock=clock)
    keys = path_keys(seq((1, 100)))
    est.observe(keys, 10)
    clock.now = 30.0                                    # three half-lives later
    est.observe(keys, 20)
    w = est.node_weights(keys, 0, 100)
    assert w[10] / w[20] == pytest.approx(1 / 8, rel=1e-9)
    assert est.effective_observations(keys, 0) == pytest.approx(1 + 1 / 8)


def test_time_decay_without_a_clock_says_so():
    est = TreeOverlapEstimator(TreeEstimatorConfig(half_life_s=5.0))
    with pytest.raises(ValueError, match="clock"):
        est.observe(path_keys(seq((1, 10))), 3)


def test_the_policy_reads_the_caches_clock():
    clock = ManualClock()
    cache = PrefixCache(SPEC, 10**12, "sparse-dp:m=1,half_life_s=10,half_life=1e12", "lru", clock=clock)
    est = cache.admission.tree_estimator
    tokens = seq((1, 200))
    for t in (0.0, 10.0):
        clock.now = t
        cache.finish(cache.begin(tokens), ())
    assert est.effective_observations(path_keys(tokens), 0) == pytest.approx(1.5)   # 1 now + 1/2 from 10 s ago


# ================================================================================= memory
def test_the_node_cap_evicts_the_least_recently_touched():
    est = TreeOverlapEstimator(TreeEstimatorConfig(max_nodes=3))
    paths = [path_keys(seq((s, 50))) for s in range(5)]
    for keys in paths[:3]:
        est.attach(keys, 20)
    est.observe(paths[0], 30)                           # touches path 0's node
    est.attach(paths[3], 20)                            # evicts path 1's (the oldest untouched)
    assert est.num_nodes == 3 and est.num_evicted == 1
    assert [est.knows(k, 20) for k in paths[:4]] == [True, False, True, True]
    est.check_invariants()


def test_the_depth_cap_merges_the_lightest_into_its_shallower_neighbour():
    # a slow count decay only breaks the tie between the two single observations (300 is older)
    est = TreeOverlapEstimator(TreeEstimatorConfig(max_depths=4, prior_strength=1e-9, node_strength=1e-9,
                                                   half_life_obs=1e6))
    keys = path_keys(seq((1, 400)))
    for depth, times in ((300, 1), (100, 5), (200, 5), (400, 5)):
        for _ in range(times):
            est.observe(keys, depth)
    est.observe(keys, 350)                              # a fifth depth: 300 (the lightest) goes, into 200
    w = est.node_weights(keys, 0, 400)
    assert w[300] == pytest.approx(0.0, abs=1e-9) and w[350] == pytest.approx(1 / 17, rel=1e-4)
    assert w[200] == pytest.approx(6 / 17, rel=1e-4) and w[100] == pytest.approx(5 / 17, rel=1e-4)
    est.check_invariants()


def test_memory_stays_under_the_documented_bound_on_a_long_stream():
    config = TreeEstimatorConfig(max_nodes=16, max_depths=8)
    est = TreeOverlapEstimator(config)
    rng = np.random.default_rng(0)
    for i in range(400):
        keys = path_keys(seq((int(rng.integers(0, 40)), 300)))
        est.observe(keys, int(rng.integers(0, 301)))
        est.attach(keys, int(rng.integers(1, 301)))
    est.check_invariants()
    assert est.num_nodes == 16 and est.num_pairs <= config.max_pairs == 18 * 8


# ================================================================================= drift
def test_drift_is_the_total_variation_since_the_last_placement():
    est = TreeOverlapEstimator(TreeEstimatorConfig(half_life_obs=float("inf")))
    keys = path_keys(seq((1, 100)))
    assert est.drift(keys, 0) == 0.0                    # nothing observed
    est.observe(keys, 10)
    assert est.drift(keys, 0) == 1.0                    # never placed with its own data
    est.mark_placed(keys, 0)
    assert est.drift(keys, 0) == 0.0
    est.observe(keys, 90)                               # half the mass moved from 10 to 90
    assert est.drift(keys, 0) == pytest.approx(0.5)


def test_replacement_only_inside_a_drifted_stored_span():
    """A request resumed at 0 with KV to 400 recomputes (0, 400]: a stable node's span gets no new
    checkpoint there, a drifted one does (at no extra prefill: the request computes it anyway)."""
    shared = seq((1, 400))
    tokens = np.concatenate((shared, seq((2, 50))))

    def plan(drift: float) -> tuple[int, ...]:
        policy = SparseDPAdmission(m=2, marconi=False, drift=drift, half_life=1e9)
        keys = path_keys(tokens)
        for _ in range(10):                             # requests stopped 200 tokens in, then at 400
            policy.tree_estimator.observe(keys, 200)
        policy.tree_estimator.mark_placed(keys, 0)
        policy.tree_estimator.observe(keys, 400)
        ctx = AdmissionContext(tokens, 450, MatchResult(450, 400, 0), None, SPEC, 0)
        return tuple(policy.prefill_checkpoints(ctx))

    assert all(p >= 400 for p in plan(drift=1.0))       # never re-place: only the new part
    assert 200 in plan(drift=0.0)                       # re-placed where the requests now stop


# ================================================================================= exactness
def _tree_context(tokens, hit, resume, rid=0):
    return AdmissionContext(tokens, tokens.size, MatchResult(tokens.size, hit, resume), None, SPEC, rid)


@pytest.mark.parametrize("m", [1, 3])
def test_tree_placement_is_the_dp_optimum_over_every_position(m):
    policy = SparseDPAdmission(m=m, marconi=False, drift=0.0)
    twin = TreeOverlapEstimator(TreeEstimatorConfig(half_life_obs=512.0))
    rng = np.random.default_rng(3)
    for rid in range(12):
        tokens = seq((1, 200), (int(rng.integers(0, 3)), 300), (100 + rid, 40))
        hit = int(rng.integers(150, 480))
        keys = path_keys(tokens)
        twin.observe(keys, hit)
        twin.attach(keys, hit)
        weights, _ = twin.path_weights(keys, tokens.size)
        weights[:1] = 0.0
        placed = tuple(policy.prefill_checkpoints(_tree_context(tokens, hit, 0, rid)))
        best = place_checkpoints(weights, np.arange(1, tokens.size + 1), m, cost=policy.recompute_cost(SPEC, 0))
        cost = policy.recompute_cost(SPEC, 0)
        assert expected_cost(weights, placed, cost=cost) == pytest.approx(best.expected_cost, rel=1e-9)
        policy.end_request(rid)


def _brute_lagrangian(weights, candidates, lam, cost, ckpt_bytes):
    best = None
    for k in range(len(candidates) + 1):
        for combo in itertools.combinations(candidates, k):
            value = (expected_cost(weights, list(combo), cost=cost) if combo else
                     float(np.dot(weights / weights.sum(), cost(np.zeros(weights.size), np.arange(weights.size)))))
            value += lam * ckpt_bytes * k
            best = value if best is None else min(best, value)
    return best


@pytest.mark.parametrize("seed", range(40))
def test_lagrangian_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 14))
    weights = rng.random(n + 1) * (rng.random(n + 1) < 0.7)
    weights[-1] += 0.01
    candidates = np.sort(rng.choice(np.arange(1, n + 1), size=int(rng.integers(1, min(n, 8) + 1)), replace=False))
    cost = TOKEN_COST if seed % 2 else flops_cost(SPEC)
    scale = 1.0 if seed % 2 else SPEC.prefill_flops(1.0)
    lam = float(rng.choice([0.0, 0.05, 0.3, 2.0])) * scale
    got = place_checkpoints_lagrangian(weights, candidates, lam, cost=cost)
    assert got.objective == pytest.approx(_brute_lagrangian(weights, candidates, lam, cost, 1.0), rel=1e-9, abs=1e-12)


def test_lagrangian_admission_is_exact_beyond_the_old_cap():
    """The old policy capped the Lagrangian form at 256 candidates; it now solves over all 3000."""
    n = 3000
    policy = SparseDPAdmission(lam=2e-4 * SPEC.prefill_flops(1.0) / SPEC.ssm_checkpoint_bytes, marconi=False)
    tokens = seq((5, n))
    keys = path_keys(tokens)
    rng = np.random.default_rng(1)
    for hit in rng.integers(1, n + 1, size=400):        # a spread of depths: support far over 256
        policy.tree_estimator.observe(keys, int(hit))
    placed = policy.prefill_checkpoints(_tree_context(tokens, 0, 0))
    weights, _ = policy.tree_estimator.path_weights(keys, n)
    weights[:1] = 0.0
    cost = policy.recompute_cost(SPEC, 0)
    exact = place_checkpoints_lagrangian(weights, np.arange(1, n + 1), policy.lam, cost=cost,
                                         checkpoint_bytes=SPEC.ssm_checkpoint_bytes)
    assert np.flatnonzero(weights).size > 256
    got = expected_cost(weights, list(placed), cost=cost) + policy.lam * SPEC.ssm_checkpoint_bytes * len(placed)
    assert got == pytest.approx(exact.objective, rel=1e-9)
