"""The cache core: numpy and the standard library only — what a serving engine embeds.

* :mod:`~marconi.core.model` — ``ModelSpec``: a hybrid model's bytes per token / checkpoint and FLOPs.
* :mod:`~marconi.core.radix` — the radix tree over token ids (surgery only).
* :mod:`~marconi.core.candidates` — the eviction candidates as arrays, and FLOP efficiency.
* :mod:`~marconi.core.admission` — which SSM states to keep (``none``, ``every-block``, ``marconi``).
* :mod:`~marconi.core.eviction` — eviction rules and their one scoring function (``lru``, ``flop-aware``).
* :mod:`~marconi.core.cache` — ``PrefixCache``: the tree + policies + byte accounting + locks + stats.
* :mod:`~marconi.core.protocol` — ``ReplayCache``: the driver contract simulators and emulations meet.
* :mod:`~marconi.core.stats`, :mod:`~marconi.core.registry` — counters; named, parameterised policies.

Nothing here imports outside ``marconi.core``, numpy and the standard library (a test walks the
imports). The online selectors (``worlds``, ``regret``, ``oracle``) live above the core and join the
eviction registry through the ``marconi.eviction_policies`` entry points.
"""

from marconi.core.cache import CacheObserver, ManualClock, PayloadOps, PrefixCache, RequestHandle, TreeSnapshot
from marconi.core.model import ModelSpec, get_model, list_models
from marconi.core.protocol import ReplayCache
from marconi.core.registry import ConfigError

__all__ = ["PrefixCache", "RequestHandle", "CacheObserver", "ManualClock", "PayloadOps", "TreeSnapshot", "ModelSpec",
           "get_model", "list_models", "ReplayCache", "ConfigError"]
