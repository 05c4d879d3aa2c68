"""The rule chooser: what picks a cache's eviction rule online, and how a driver feeds it. A driver
owning a cache feeds :class:`RequestEvent` s through :func:`follow`, which applies each switch; an
engine plugin feeds its own observations (``docs/architecture.md``, "Choosing the rule online")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol, TypeVar, runtime_checkable

from marconi.core.cache import CacheObserver
from marconi.core.registry import ConfigError

if TYPE_CHECKING:
    import numpy as np

    from marconi.core.cache import PrefixCache, RequestHandle
    from marconi.core.eviction import Rule

__all__ = ["RequestEvent", "RuleChooser", "Step", "check_scoring", "follow"]

#: A request's steps in the cache, in order (``first-eviction``: the cache evicts for the first time).
Step = Literal["begin", "prefill", "finish", "abort", "first-eviction"]

E = TypeVar("E", contravariant=True)


def check_scoring(decay: float, hysteresis: float, who: str) -> None:
    """The contract of a chooser's decayed scores: ConfigError, naming ``who`` (``adaptive``,
    ``worlds``, ``tier chooser``) and the parameter, unless ``decay`` is a number in (0, 1] and
    ``hysteresis`` one >= 0. NaN and bools are refused (``True`` would run as 1)."""
    for name, value in (("decay", decay), ("hysteresis", hysteresis)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{who} {name} must be a number, got {value!r}")
    if not 0 < decay <= 1:
        raise ConfigError(f"{who} decay must be in (0, 1], got {decay}")
    if not hysteresis >= 0:
        raise ConfigError(f"{who} hysteresis must be >= 0, got {hysteresis}")


class RequestEvent(NamedTuple):
    """One step of a request in ``cache`` (:data:`Step`; ``output``: on ``finish``, the output tokens;
    ``handle``: None on ``first-eviction``)."""

    step: Step
    cache: "PrefixCache"
    handle: "RequestHandle | None"
    output: "np.ndarray | None" = None


@runtime_checkable
class RuleChooser(Protocol[E]):
    """Chooses a cache's eviction rule online. ``rule``: the rule in force. ``observe(event)``: the new
    rule when the choice changes, else None; deterministic. ``tuning_record()``: record fields."""

    @property
    def rule(self) -> "Rule":
        ...

    def observe(self, event: E) -> "Rule | None":
        ...

    def tuning_record(self) -> dict[str, Any]:
        ...


class _Feed(CacheObserver):
    """Turns a cache's observer hooks into :class:`RequestEvent` s for ``chooser``; applies its switches."""

    __slots__ = ("chooser",)

    def __init__(self, chooser: RuleChooser[RequestEvent]) -> None:
        self.chooser = chooser

    def _feed(self, event: RequestEvent) -> None:
        rule = self.chooser.observe(event)
        if rule is not None:
            event.cache.set_rule(rule)

    def on_begin(self, cache: "PrefixCache", handle: "RequestHandle") -> None:
        self._feed(RequestEvent("begin", cache, handle))

    def on_prefill(self, cache: "PrefixCache", handle: "RequestHandle") -> None:
        self._feed(RequestEvent("prefill", cache, handle))

    def on_finish(self, cache: "PrefixCache", handle: "RequestHandle", output_tokens: "np.ndarray") -> None:
        self._feed(RequestEvent("finish", cache, handle, output_tokens))

    def on_abort(self, cache: "PrefixCache", handle: "RequestHandle") -> None:
        self._feed(RequestEvent("abort", cache, handle))

    def on_first_eviction(self, cache: "PrefixCache") -> None:
        self._feed(RequestEvent("first-eviction", cache, None))


def follow(cache: "PrefixCache", chooser: RuleChooser[RequestEvent]) -> None:
    """Feed ``chooser`` every step of every request ``cache`` serves from now on, applying each rule it
    returns; it becomes the eviction policy's ``chooser``. ConfigError if another chooser already
    sets this cache's rule (one chooser per cache)."""
    policy = cache.eviction
    if policy.chooser is not None and policy.chooser is not chooser:
        raise ConfigError(f"this cache's rule is already chosen online by {type(policy.chooser).__name__}; "
                          "one rule chooser per cache")
    policy.chooser = chooser
    cache.add_observer(_Feed(chooser))
