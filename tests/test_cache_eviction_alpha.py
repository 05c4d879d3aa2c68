"""α must be finite and >= 0 wherever it is accepted (issue 21, bug 7).

An infinite α passed ``not alpha >= 0``; inside a rule family it then killed the sweep at the first
eviction (``inf * 0 = nan`` utilities leave no victim). Every way of giving α refuses it up front.
"""

import math

import numpy as np
import pytest

from marconi.core.cache import PrefixCache
from marconi.core.eviction import EvictionRule, FlopAware, make_eviction
from marconi.core.registry import ConfigError
from marconi.choosers.bootstrap import BootstrapTuner
from marconi.choosers.family import parse_rules

BAD = [math.inf, -math.inf, math.nan, -1.0, "x", None, True]


@pytest.mark.parametrize("alpha", BAD)
def test_an_eviction_rule_refuses_a_non_finite_or_negative_alpha(alpha):
    with pytest.raises(ConfigError, match="alpha must be >= 0 and finite"):
        EvictionRule(alpha)


@pytest.mark.parametrize("alpha", BAD)
def test_flop_aware_refuses_it_at_construction_and_when_set(alpha):
    with pytest.raises(ConfigError, match="alpha must be >= 0 and finite"):
        FlopAware(alpha=alpha)
    policy = FlopAware(alpha=1.0)
    with pytest.raises(ConfigError, match="alpha must be >= 0 and finite"):
        policy.alpha = alpha            # the tuner sets it: refused now, not at the next eviction
    assert policy.alpha == 1.0


@pytest.mark.parametrize("label", ["ainf", "a-inf", "anan", "ainfinitym", "a1e999"])
def test_a_rule_label_with_an_infinite_alpha_is_refused_naming_the_label(label):
    with pytest.raises(ConfigError, match=f"rule '{label}': alpha must be >= 0 and finite"):
        EvictionRule.from_label(label)
    with pytest.raises(ConfigError, match=f"rule '{label}'"):
        parse_rules(f"lru/{label}")


def test_a_family_with_an_infinite_alpha_is_refused_before_the_sweep():
    for policy in ("worlds:rules=lru/ainf", "regret:rules=a1m/ainf"):
        with pytest.raises(ConfigError, match="rule 'ainf'"):
            make_eviction(policy)


def test_the_bootstrap_grid_refuses_an_infinite_alpha():
    with pytest.raises(ConfigError, match="bootstrap alpha grid: alpha must be >= 0 and finite"):
        BootstrapTuner(FlopAware(), grid=(0.0, 1.0, math.inf))


def test_finite_alphas_still_work():
    assert FlopAware(alpha="1.5").alpha == 1.5          # text that is a number, as before
    assert EvictionRule(np.float64(2.0)).label() == "a2"
    assert EvictionRule.from_label("a1e3m").alpha == 1000.0
    cache = PrefixCache("paper-7b", 5e9, "marconi", FlopAware(alpha=1e6))
    for i in range(4):
        cache.process(np.arange(i * 10_000, i * 10_000 + 8000), ())
    cache.check_invariants()
