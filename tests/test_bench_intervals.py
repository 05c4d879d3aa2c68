"""The interval ``benchmarks/vllm_sched_overhead.py`` prints beside its round-by-round ratios (issue 33:
whether a step ratio is under its target in a run, on a noisy machine): the sign test's interval for
a median, from the rounds' order statistics."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "vllm_sched_overhead.py"
_spec = importlib.util.spec_from_file_location("vllm_sched_overhead", _PATH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)           # stdlib at import: vLLM is imported by the runs only


def test_the_interval_is_the_order_statistics_the_sign_test_gives():
    nine = [1.09, 1.05, 1.25, 1.07, 1.12, 1.08, 1.10, 1.07, 1.09]
    low, high, coverage = bench.median_interval(nine)
    assert (low, high) == (1.07, 1.12)                     # x_(2) and x_(8) of nine
    assert coverage == pytest.approx(1 - 2 * 10 / 512)     # P(Binomial(9, 1/2) <= 1) = 10/512 each side
    # under six rounds no pair reaches 95%: the widest, with what it covers
    assert bench.median_interval([3.0, 1.0, 2.0, 5.0, 4.0]) == (1.0, 5.0, pytest.approx(1 - 2 / 32))
    assert bench.median_interval([2.0]) == (2.0, 2.0, 0.0)
    with pytest.raises(ValueError, match="no values"):
        bench.median_interval([])


@pytest.mark.parametrize("rounds", [6, 9, 15])
def test_the_interval_holds_the_median_as_often_as_it_says(rounds):
    # a skewed, heavy-tailed ratio (a disturbed round reads far above the rest), as this machine gives
    rng = np.random.default_rng(rounds)
    true_median = 1.0 + np.log(2.0) * 0.05
    hits, trials = 0, 4000
    for _ in range(trials):
        low, high, coverage = bench.median_interval(list(1.0 + rng.exponential(0.05, rounds)))
        hits += low <= true_median <= high
    assert coverage >= 0.95
    assert hits / trials >= coverage - 0.015               # 4,000 trials: about ±0.007 of sampling noise
