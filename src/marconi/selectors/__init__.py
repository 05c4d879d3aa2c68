"""Choosing the eviction rule online, and the future-aware reference.

* :mod:`~marconi.selectors.worlds` — the default ``marconi``: each rule of a family runs in an exact
  size-only world of its own; the live cache follows the best one (``worlds``).
* :mod:`~marconi.selectors.regret` — ``marconi:selector=regret``: the rule with the least
  counterfactual regret, estimated from the live cache alone (``regret``).
* :mod:`~marconi.selectors.bootstrap` — the paper's tuner: α chosen once by replaying a window from
  a snapshot over a grid (``marconi:tuner=bootstrap``).
* :mod:`~marconi.selectors.oracle` — Belady-style eviction that reads the whole trace (``oracle``).
* :mod:`~marconi.selectors.family` — the rule family they share (``lru/a0.5m/a2m``).

Importing this package registers ``regret``, ``worlds`` and ``oracle`` in the eviction registry
(:data:`marconi.core.eviction.EVICTION_POLICIES` imports it through its ``marconi.eviction_policies``
entry point). Each selector holds
its cache's selector role (:meth:`marconi.core.cache.PrefixCache.attach_selector`).
"""

from marconi.selectors import oracle, regret, worlds  # noqa: F401  (each registers its eviction policy)
from marconi.selectors.family import DEFAULT_RULES, parse_rules, policy_for
from marconi.selectors.oracle import FutureIndex, OracleEviction
from marconi.selectors.regret import RegretEviction
from marconi.selectors.worlds import WorldsEviction

__all__ = ["WorldsEviction", "RegretEviction", "OracleEviction", "FutureIndex", "DEFAULT_RULES", "parse_rules",
           "policy_for"]
