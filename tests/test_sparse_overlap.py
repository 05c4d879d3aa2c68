"""Overlap-depth estimator: cold start, convergence, drift, decay, fallbacks, binning."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marconi.core.model import PRESETS
from marconi.sparse import (
    TOKEN_COST,
    EstimatorConfig,
    GeometricSpread,
    OverlapEstimator,
    OverlapPrior,
    UniformSpread,
    bin_depths,
    binned_depth_weights,
    expected_cost,
    flops_cost,
    place_checkpoints,
)


def _tv(p: np.ndarray, q: np.ndarray) -> float:
    return 0.5 * float(np.abs(p - q).sum())


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# ================================================================================= prior
def test_prior_puts_end_mass_at_sequence_end_and_spreads_the_rest() -> None:
    prior = OverlapPrior(end_mass=0.3, spread=UniformSpread()).weights(9)
    assert prior.shape == (10,) and prior.sum() == pytest.approx(1.0)
    assert prior[9] == pytest.approx(0.3 + 0.07) and np.allclose(prior[:9], 0.07)


def test_geometric_spread_has_the_requested_mean_before_truncation() -> None:
    w = GeometricSpread(mean_frac=0.01).weights(100_000)
    assert w.sum() == pytest.approx(1.0) and np.all(np.diff(w) < 0)
    assert float(np.dot(np.arange(w.size), w)) == pytest.approx(1000.0, rel=1e-3)


def test_prior_of_empty_sequence_is_all_at_zero() -> None:
    for spread in (UniformSpread(), GeometricSpread()):
        assert OverlapPrior(0.5, spread).weights(0).tolist() == [1.0]


# ================================================================================= cold start, fallbacks
def test_cold_start_returns_the_prior() -> None:
    config = EstimatorConfig(prior=OverlapPrior(end_mass=0.8, spread=GeometricSpread(0.1)))
    est = OverlapEstimator(config)
    np.testing.assert_array_equal(est.depth_weights("any", 50), config.prior.weights(50))
    assert est.effective_observations("any") == 0.0


def test_unknown_key_gets_the_global_estimate() -> None:
    est = OverlapEstimator()
    for _ in range(50):
        est.observe("doc-a", 7)
    np.testing.assert_array_equal(est.depth_weights("new", 20), est.global_depth_weights(20))
    assert est.global_depth_weights(20)[7] == pytest.approx((50 + 4 * 0.5 / 21) / 54)


def test_key_estimate_blends_towards_global_by_observation_count() -> None:
    est = OverlapEstimator(EstimatorConfig(global_strength=10.0))
    for _ in range(1000):
        est.observe("pool", 3)
    est.observe("fresh", 9)
    fresh = est.depth_weights("fresh", 10)
    glob = est.global_depth_weights(10)
    np.testing.assert_allclose(fresh, (1.0 * np.eye(11)[9] + 10.0 * glob) / 11.0)
    for _ in range(10_000):
        est.observe("fresh", 9)
    assert est.depth_weights("fresh", 10)[9] > 0.99


def test_forget_drops_a_key_but_not_its_global_contribution() -> None:
    est = OverlapEstimator()
    est.observe("k", 2)
    est.forget("k")
    est.forget("never-seen")
    assert est.keys() == [] and est.global_depth_weights(4)[2] > 0.2
    est.check_invariants()


# ================================================================================= convergence and drift
def test_converges_to_the_empirical_distribution_on_stationary_input() -> None:
    rng = np.random.default_rng(0)
    truth = np.array([0.05, 0.0, 0.4, 0.05, 0.0, 0.0, 0.3, 0.0, 0.0, 0.0, 0.2])
    depths = rng.choice(truth.size, size=20_000, p=truth)
    est = OverlapEstimator()
    for d in depths:
        est.observe("doc", int(d))
    est.check_invariants()
    empirical = np.bincount(depths, minlength=truth.size) / depths.size
    got = est.depth_weights("doc", truth.size - 1)
    # Only the pseudo-counts (8 global + 4 prior) separate the estimate from the empirical law.
    assert _tv(got, empirical) <= 12 / 20_000 + 1e-12
    assert _tv(got, truth) < 0.02


def test_decayed_estimate_still_converges_on_stationary_input() -> None:
    rng = np.random.default_rng(1)
    truth = np.array([0.1, 0.2, 0.0, 0.3, 0.4])
    est = OverlapEstimator(EstimatorConfig(half_life_obs=2000))
    for d in rng.choice(truth.size, size=20_000, p=truth):
        est.observe("doc", int(d))
    assert _tv(est.depth_weights("doc", 4), truth) < 0.05


def test_follows_a_shift_with_decay_and_not_without() -> None:
    rng = np.random.default_rng(2)
    before, after = [2, 3, 4], [40, 41]
    decayed = OverlapEstimator(EstimatorConfig(half_life_obs=25, prior_strength=0.0, global_strength=0.0))
    shrunk = OverlapEstimator(EstimatorConfig(half_life_obs=25))
    frozen = OverlapEstimator()
    for est in (decayed, shrunk, frozen):
        for d in rng.choice(before, size=2000):
            est.observe("s", int(d))
        for d in rng.choice(after, size=300):
            est.observe("s", int(d))
    on_new = lambda est: float(est.depth_weights("s", 50)[after].sum())  # noqa: E731
    assert on_new(decayed) > 0.999                                  # old regime weighs 2**-12
    # With decay the effective count saturates near 1.44 * half-life (~36 here), so the default
    # pseudo-counts (8 global, 4 prior) keep a few percent on the fallbacks.
    assert on_new(shrunk) > 0.95
    assert on_new(frozen) < 0.15


def test_effective_count_follows_the_half_life() -> None:
    est = OverlapEstimator(EstimatorConfig(half_life_obs=10))
    for _ in range(30):
        est.observe("k", 1)
    want = sum(2.0 ** (-i / 10) for i in range(30))
    assert est.effective_observations("k") == pytest.approx(want)


def test_time_decay_uses_the_injected_clock() -> None:
    clock = FakeClock()
    est = OverlapEstimator(EstimatorConfig(half_life_s=10.0, global_strength=0.0, prior_strength=0.0), clock=clock)
    est.observe("k", 1)
    clock.now = 100.0
    assert est.effective_observations("k") == pytest.approx(2.0**-10)
    est.observe("k", 5)
    got = est.depth_weights("k", 5)
    assert got[1] == pytest.approx(2.0**-10 / (1 + 2.0**-10)) and got[5] == pytest.approx(1 / (1 + 2.0**-10))


def test_time_decay_requires_a_clock() -> None:
    with pytest.raises(ValueError, match="clock"):
        OverlapEstimator(EstimatorConfig(half_life_s=5.0))


def test_long_streams_rebase_without_overflow() -> None:
    est = OverlapEstimator(EstimatorConfig(half_life_obs=1.0, prior_strength=0.0, global_strength=0.0))
    for i in range(5000):
        est.observe("k", i % 7)
    est.check_invariants()
    got = est.depth_weights("k", 10)
    assert np.all(np.isfinite(got)) and got.sum() == pytest.approx(1.0)
    assert int(np.argmax(got)) == 4999 % 7                       # the latest observation dominates
    assert 0 < est.num_depths("k") <= 7


def test_depths_beyond_the_sequence_are_clipped_to_its_end() -> None:
    est = OverlapEstimator(EstimatorConfig(global_strength=0.0))
    est.observe("k", 500)
    assert est.depth_weights("k", 100)[100] == pytest.approx(1.0)


@pytest.mark.parametrize("kwargs", [{"half_life_obs": 0.0}, {"half_life_s": -1.0},
                                    {"prior_strength": -1.0}, {"global_strength": math.inf}])
def test_invalid_config_raises(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        EstimatorConfig(**kwargs)


def test_negative_depth_raises() -> None:
    with pytest.raises(ValueError, match="depth"):
        OverlapEstimator().observe("k", -1)


@settings(max_examples=100, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 60)), max_size=80),
       half_life=st.sampled_from([math.inf, 1.0, 7.5]), seq_len=st.integers(0, 40))
def test_estimates_are_distributions_after_any_observations(ops: list, half_life: float, seq_len: int) -> None:
    est = OverlapEstimator(EstimatorConfig(half_life_obs=half_life))
    for key, depth in ops:
        est.observe(key, depth)
        est.check_invariants()
    for key in "abcd":
        w = est.depth_weights(key, seq_len)
        assert w.shape == (seq_len + 1,) and np.all(w >= 0) and w.sum() == pytest.approx(1.0)


# ================================================================================= binning
def test_binning_counts_each_depth_in_its_candidate_interval() -> None:
    weights = np.array([1.0, 2, 3, 4, 5, 6, 7])                       # depths 0..6
    assert bin_depths(weights, [2, 5]).tolist() == [3.0, 12.0, 13.0]   # [0,2) [2,5) [5,6]
    assert bin_depths(weights, [6, 1]).tolist() == [1.0, 20.0, 7.0]    # a candidate at N
    assert bin_depths(weights, []).tolist() == [28.0]
    assert binned_depth_weights(weights, [2, 5]).tolist() == [3.0, 0, 12.0, 0, 0, 13.0, 0]


def test_candidate_weights_bin_the_estimate() -> None:
    est = OverlapEstimator()
    for d in (3, 3, 7, 10):
        est.observe("k", d)
    np.testing.assert_allclose(est.candidate_weights("k", 10, [4, 8]),
                               bin_depths(est.depth_weights("k", 10), [4, 8]))


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), use_flops=st.booleans())
def test_binned_weights_give_an_optimal_placement_for_potential_costs(seed: int, use_flops: bool) -> None:
    rng = np.random.default_rng(seed)
    seq_len = int(rng.integers(1, 120))
    weights = rng.random(seq_len + 1) * (rng.random(seq_len + 1) < 0.5)
    weights[int(rng.integers(0, seq_len + 1))] += 1.0
    candidates = np.sort(rng.choice(np.arange(1, seq_len + 1), int(rng.integers(0, min(seq_len, 20) + 1)),
                                    replace=False))
    budget = int(rng.integers(0, 6))
    cost = flops_cost(PRESETS["paper-7b"]) if use_flops else TOKEN_COST
    assert bin_depths(weights, candidates).sum() == pytest.approx(weights.sum())
    best = place_checkpoints(weights, candidates, budget, cost=cost).expected_cost
    from_bins = place_checkpoints(binned_depth_weights(weights, candidates), candidates, budget, cost=cost)
    assert expected_cost(weights, from_bins.positions, cost=cost) == pytest.approx(best, rel=1e-9, abs=1e-9)


def test_large_clock_values_do_not_overflow() -> None:
    clock = FakeClock()
    clock.now = 1e9                                              # e.g. a Unix-time trace
    est = OverlapEstimator(EstimatorConfig(half_life_s=1.0), clock=clock)
    for step in range(100):
        clock.now += 3.0
        est.observe("k", step % 5)
        est.check_invariants()
    assert est.effective_observations("k") == pytest.approx(sum(2.0 ** (-3 * i) for i in range(100)))
    assert np.all(np.isfinite(est.depth_weights("k", 8)))
