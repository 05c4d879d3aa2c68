"""The rule chooser: what picks the eviction rule online, and how a driver feeds it.

A cache holds one rule and applies it (:meth:`~marconi.core.cache.PrefixCache.set_rule`). A
:class:`RuleChooser` watches the requests a driver serves and says when the rule should change:
``observe(event)`` returns the new rule on a switch, else None; ``rule`` is the rule in force;
``tuning_record()`` is what records echo. The exact worlds (``marconi``), counterfactual regret
(``marconi:chooser=regret``), the paper's bootstrap (``marconi:tuner=bootstrap``) and the engines'
shadows (``alpha=adaptive``) are rule choosers (``docs/architecture.md``, "Choosing the rule online").

Two event shapes, because drivers see two things: a driver that owns a
:class:`~marconi.core.cache.PrefixCache` feeds each step of a request (:class:`RequestEvent`:
begin, prefill, finish, abort, with the cache's handle), which a chooser needs to mirror the cache
exactly; an engine plugin sees only finished requests and feeds its integration's observation of
one (``RequestObservation``).

:func:`follow` is the one adapter from a cache's observer hooks to a chooser's feed: the policies
that come with their chooser (``worlds``, ``regret``) call it when bound, the simulator's systems for
the bootstrap tuner, so every driver of such a cache (the simulator's replay, the engine) feeds it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol, TypeVar, runtime_checkable

from marconi.core.cache import CacheObserver
from marconi.core.registry import ConfigError

if TYPE_CHECKING:
    import numpy as np

    from marconi.core.cache import PrefixCache, RequestHandle
    from marconi.core.eviction import Rule

__all__ = ["RequestEvent", "RuleChooser", "Step", "follow"]

#: A request's steps in the cache, in order (``first-eviction``: the cache evicts for the first time).
Step = Literal["begin", "prefill", "finish", "abort", "first-eviction"]

E = TypeVar("E", contravariant=True)


class RequestEvent(NamedTuple):
    """One step of a request in ``cache``: ``begin`` (after the lookup), ``prefill`` (its prefill
    checkpoints admitted), ``finish`` (inserted; ``output`` the output tokens), ``abort``, or the
    cache's ``first-eviction`` (``handle`` None)."""

    step: Step
    cache: "PrefixCache"
    handle: "RequestHandle | None"
    output: "np.ndarray | None" = None


@runtime_checkable
class RuleChooser(Protocol[E]):
    """Chooses a cache's eviction rule online from the requests its driver feeds.

    ``rule``: the rule to apply now. ``observe(event)``: learn from one event; returns the new rule
    when the choice changes (the driver then applies it), else None. Deterministic: the same events
    give the same choices. ``tuning_record()``: fields a result record echoes (what was chosen, when).
    """

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
    """Feed ``chooser`` every step of every request ``cache`` serves from now on, and apply each rule
    it returns with ``cache.set_rule``; ``chooser`` becomes the cache's eviction policy's ``chooser``
    (what records ask for its ``tuning_record()``).

    Raises ConfigError if another chooser sets this cache's rule already: two would each report
    choices the other overrode.
    """
    policy = cache.eviction
    if policy.chooser is not None and policy.chooser is not chooser:
        raise ConfigError(f"this cache's rule is already chosen online by {type(policy.chooser).__name__}; "
                          "one rule chooser per cache")
    policy.chooser = chooser
    cache.add_observer(_Feed(chooser))
