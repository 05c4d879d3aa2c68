"""The cache core a serving engine embeds: ``PrefixCache`` (:mod:`~marconi.core.cache`) with its cost
model, radix tree, admission and eviction policies, stats and registries.

Nothing here imports outside ``marconi.core``, numpy and the standard library (a test walks the
imports); upper floors join the registries through entry points (``docs/architecture.md``).
"""

from marconi.core.cache import CacheObserver, ManualClock, PayloadOps, PrefixCache, RequestHandle, TreeSnapshot
from marconi.core.chooser import RequestEvent, RuleChooser, follow
from marconi.core.model import ModelSpec, get_model, list_models
from marconi.core.protocol import ReplayCache
from marconi.core.registry import ConfigError

__all__ = ["PrefixCache", "RequestHandle", "CacheObserver", "ManualClock", "PayloadOps", "TreeSnapshot", "ModelSpec",
           "get_model", "list_models", "ReplayCache", "ConfigError", "RuleChooser", "RequestEvent", "follow"]
