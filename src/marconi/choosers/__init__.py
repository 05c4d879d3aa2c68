"""Rule choosers: what picks the eviction rule online (:class:`marconi.core.chooser.RuleChooser`).

* :mod:`~marconi.choosers.worlds` — the default ``marconi``: each rule of a family runs in an exact
  size-only world of its own; the live cache follows the best one (``worlds``).
* :mod:`~marconi.choosers.regret` — ``marconi:chooser=regret``: the rule with the least
  counterfactual regret, estimated from the live cache alone (``regret``).
* :mod:`~marconi.choosers.bootstrap` — the paper's tuner: α chosen once by replaying a window from
  a snapshot over a grid (``marconi:tuner=bootstrap``).
* :mod:`~marconi.choosers.family` — the rule family they share (``lru/a0.5m/a2m``) and the live
  cache's policy applying one rule of it (:class:`~marconi.choosers.family.FamilyPolicy`).

Importing this package registers ``regret`` and ``worlds`` in the eviction registry
(:data:`marconi.core.eviction.EVICTION_POLICIES` imports it through its ``marconi.eviction_policies``
entry point).
"""

from marconi.choosers import regret, worlds  # noqa: F401  (each registers its eviction policy)
from marconi.choosers.family import DEFAULT_RULES, FamilyPolicy, parse_rules, policy_for
from marconi.choosers.regret import RegretEviction
from marconi.choosers.worlds import WorldsChooser, WorldsEviction

__all__ = ["WorldsChooser", "WorldsEviction", "RegretEviction", "FamilyPolicy", "DEFAULT_RULES", "parse_rules",
           "policy_for"]
