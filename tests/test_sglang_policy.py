"""The SGLang policy's arithmetic on stand-in nodes (no SGLang needed): savings measured from the
fallback state, so a tombstoned parent and competing shared prefixes are valued as SGLang serves them."""

from __future__ import annotations

import pytest

from marconi.core.candidates import flop_efficiency
from marconi.core.model import get_model
from marconi.core.registry import ConfigError
from marconi.integrations.sglang.policy import MarconiStrategy, parse_config

MAMBA = 1


class _Data:
    def __init__(self, value):
        self.value = value


class _Node:
    def __init__(self, parent, length, state, t):
        self.parent, self.key, self.children = parent, [0] * length, {}
        self.component_data = [_Data(object()), _Data(object() if state else None)]
        self.last_access_time = t
        if parent is not None:
            parent.children[len(parent.children)] = self


def _tree(parent_state: bool):
    root = _Node(None, 0, False, 0.0)
    a = _Node(root, 100, True, 1.0)
    b = _Node(a, 50, parent_state, 2.0)           # the branch point both prefixes share
    short = _Node(b, 10, True, 3.0)
    long = _Node(b, 200, True, 4.0)
    return root, a, b, short, long


def test_a_tombstoned_parent_sends_the_savings_back_to_the_fallback_state() -> None:
    spec = get_model("paper-7b")
    s = MarconiStrategy(spec, MAMBA, 0.5, "marginal")
    _, a, b, short, long = _tree(parent_state=False)
    assert s.fallback_depth(short) == s.fallback_depth(long) == 100      # b is a tombstone: a's state
    assert s.node_efficiency(short) == flop_efficiency(spec, 160, 60, True, "marginal")
    assert s.node_efficiency(long) == flop_efficiency(spec, 350, 250, True, "marginal")
    assert s.node_efficiency(b) == 0.0                                    # KVs without a state: no resume
    # Competing prefixes of different lengths under the tombstone: the longer saves more FLOPs.
    assert s.node_efficiency(long) > s.node_efficiency(short)
    # With the parent's state alive, the same nodes save only their own edges.
    _, a2, b2, short2, long2 = _tree(parent_state=True)
    assert s.fallback_depth(short2) == 150
    assert s.node_efficiency(short2) == flop_efficiency(spec, 160, 10, True, "marginal")
    assert s.node_efficiency(short2) < s.node_efficiency(short)


def test_the_mamba_pick_keeps_branch_points_and_is_lru_at_alpha_zero() -> None:
    spec = get_model("paper-7b")
    _, a, b, short, long = _tree(parent_state=True)
    order = [b, a, short, long]                                           # least recent first
    leaves = {short, long}.__contains__
    assert MarconiStrategy(spec, MAMBA, 0.0).pick_state(order, leaves) is b        # SGLang's LRU pick
    assert MarconiStrategy(spec, MAMBA, 1.0).pick_state(order, leaves) is not b    # a branch point stays
    s = MarconiStrategy(spec, MAMBA, 0.0)
    s.begin_full_walk([short, long])
    assert s.get_priority(short) < s.get_priority(long)                   # recency order, ties by time


def test_config_is_checked() -> None:
    assert parse_config('{"alpha": "adaptive"}')["alpha"] == "adaptive"
    assert parse_config({"alpha": 1})["alpha"] == 1.0
    for bad in ({"alpha": -1}, {"alpha": "x"}, {"beta": 1}, {"efficiency": "x"}, {"rules": "lru", "alpha": 1}):
        with pytest.raises(ConfigError):
            parse_config(bad)
