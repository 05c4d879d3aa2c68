"""Rule choosers (:class:`marconi.core.chooser.RuleChooser`): ``worlds`` (the default), ``regret``,
the paper's ``bootstrap`` tuner, and their rule ``family``. Importing this package registers
``regret`` and ``worlds`` in the eviction registry."""

from marconi.choosers import regret, worlds  # noqa: F401  (each registers its eviction policy)
from marconi.choosers.family import DEFAULT_RULES, FamilyPolicy, parse_rules, policy_for
from marconi.choosers.regret import RegretEviction
from marconi.choosers.worlds import WorldsChooser, WorldsEviction

__all__ = ["WorldsChooser", "WorldsEviction", "RegretEviction", "FamilyPolicy", "DEFAULT_RULES", "parse_rules",
           "policy_for"]
