"""The driver contract: what a trace replay needs of a cache, as a structural type.

Every replay drives :class:`~marconi.core.cache.PrefixCache` and every engine emulation through it,
so any of them can be swept beside the others.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from marconi.core.admission import MatchResult
    from marconi.core.chooser import RuleChooser
    from marconi.core.model import ModelSpec
    from marconi.core.stats import CacheStats

__all__ = ["ReplayCache", "ReplayHandle"]


class ReplayHandle(Protocol):
    """One request between ``begin`` and ``finish``: what a replay reads of it."""

    request_id: int
    match: "MatchResult"   # the lookup's result: input length, KV hit, usable (resumable) hit


@runtime_checkable
class ReplayCache(Protocol):
    """A cache a trace can be replayed through: ``begin`` looks the input up and counts the lookup;
    ``insert_prefill`` may cache what the prefill computed; ``finish`` caches input + output and
    ends the request. Capacity (bytes) is never exceeded; the same trace gives the same stats."""

    spec: "ModelSpec"
    capacity_bytes: int
    stats: "CacheStats"

    @property
    def chooser(self) -> "RuleChooser | None":
        """The rule chooser setting the cache's rule online (its ``tuning_record()`` goes into
        records), or None."""
        ...

    def begin(self, input_tokens: Any, *, max_hit_len: int | None = None) -> ReplayHandle:
        ...

    def insert_prefill(self, handle: Any) -> Any:
        ...

    def finish(self, handle: Any, output_tokens: Any = ()) -> Any:
        ...

    def describe(self) -> dict[str, Any]:
        """The cache's configuration, echoed into every result record."""
        ...

    def check_invariants(self) -> None:
        """Recompute the cache's bookkeeping from scratch; raise if it drifted."""
        ...
