"""The cache core a serving engine embeds: ``PrefixCache`` (:mod:`~marconi.core.cache`) with its cost
model, radix tree, admission and eviction policies, stats and registries.

What an embedder names is exported here: the cache and its return types (``CachedPrefix``,
``InsertResult``, ``MatchResult``, ``CacheStats``), its payload contract and default (``PayloadOps``,
``SizeOnlyPayloads``, ``SIZE_ONLY``), the policies' contracts, and what writing an eviction rule needs
(``Rule``, ``CandidateTable``, ``Candidates``, ``Touch``, ``min_max``, ``register_rule_label``,
``RulePolicy``). Nothing here imports outside ``marconi.core``, numpy and the standard library (a
test walks the imports); upper floors join the registries through entry points
(``docs/architecture.md``).
"""

from marconi.core.admission import AdmissionPolicy, MatchResult
from marconi.core.cache import (SIZE_ONLY, CachedPrefix, CacheObserver, InsertResult, InvariantError, ManualClock,
                                PayloadOps, PrefixCache, RequestHandle, SizeOnlyPayloads, TreeSnapshot)
from marconi.core.candidates import CandidateSet, CandidateTable
from marconi.core.chooser import RequestEvent, RuleChooser, follow
from marconi.core.eviction import (Candidates, EvictionBase, EvictionPolicy, EvictionRule, Rule, RulePolicy, Touch,
                                   choose_victim, make_eviction, min_max, register_rule_label, rule_from_label)
from marconi.core.model import ModelSpec, get_model, list_models
from marconi.core.protocol import ReplayCache, ReplayHandle
from marconi.core.registry import ConfigError
from marconi.core.stats import CacheStats

__all__ = ["PrefixCache", "RequestHandle", "CacheObserver", "ManualClock", "PayloadOps", "TreeSnapshot", "ModelSpec",
           "get_model", "list_models", "ReplayCache", "ConfigError", "RuleChooser", "RequestEvent", "follow",
           # return types and payloads
           "CachedPrefix", "InsertResult", "MatchResult", "CacheStats", "ReplayHandle", "SizeOnlyPayloads",
           "SIZE_ONLY", "InvariantError",
           # policies and rules
           "AdmissionPolicy", "EvictionPolicy", "EvictionBase", "make_eviction", "Rule", "EvictionRule",
           "RulePolicy", "rule_from_label", "register_rule_label", "choose_victim", "CandidateSet",
           "CandidateTable", "Candidates", "Touch", "min_max"]
