"""The driver contract: what a trace replay needs of a cache, as a type.

The simulator's replay, the bootstrap tuner's window replays, the selectors' worlds and every
emulated engine (the vLLM emulation, ``vllm-align``) meet here: a replay hands each request to
``begin``, optionally reports the end of its prefill with ``insert_prefill``, and closes it with
``finish``; it reads ``stats`` at the end. :class:`~marconi.core.cache.PrefixCache` implements it;
so does any engine emulation that wants to be swept beside it. The protocol is structural (no
base class to inherit), checked by ``isinstance`` at run time where a caller wants a clear error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from marconi.core.admission import MatchResult
    from marconi.core.cache import Selector
    from marconi.core.model import ModelSpec
    from marconi.core.stats import CacheStats

__all__ = ["ReplayCache", "ReplayHandle"]


class ReplayHandle(Protocol):
    """One request between ``begin`` and ``finish``: what a replay reads of it."""

    request_id: int
    match: "MatchResult"   # the lookup's result: input length, KV hit, usable (resumable) hit


@runtime_checkable
class ReplayCache(Protocol):
    """A cache a trace can be replayed through.

    Contract (every implementation): ``begin`` looks the input up and accounts the lookup in
    ``stats``; ``insert_prefill`` may cache what the prefill computed (a no-op where the engine
    caches as it computes); ``finish`` caches input + output and ends the request. Capacity is in
    bytes and is never exceeded. Decisions are deterministic: the same trace gives the same stats.
    """

    spec: "ModelSpec"
    capacity_bytes: int
    stats: "CacheStats"

    @property
    def selector(self) -> "Selector | None":
        """The component choosing the cache's policy online (its choices go into records), or None."""
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
