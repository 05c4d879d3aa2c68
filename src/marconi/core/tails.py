"""Dead-tail prediction: how far later requests re-enter a sequence that left its predecessor early.

Why (``docs/headroom.md``): at tight capacities the largest share of the oracle's lead on agent and
multi-tenant traces is KVs that no later input reaches. An agent that drops old observations
(SWE keep-5) leaves the previous call's sequence early, at the first dropped observation; the KVs
past that point are never matched again, yet they fill the cache, and by the time the next call
diverges there the sequence is gone, so its branch point is never found and never checkpointed.

What the cache can see online: a request that *branched* (its input left the tree inside an edge
or at an inner node, at depth ``base``) created a leaf whose tail past ``base`` is its own. When a
later request walks into that leaf, it re-enters it by ``advance = matched - base`` tokens; a
request that runs to the leaf's end and beyond (a conversation continuing) re-enters it wholly.
:class:`TailReach` keeps the last ``window`` advances and predicts a *margin*: a later request is
expected to re-enter a branched leaf no deeper than ``base + margin``. The cache then trims, first,
before any rule evicts anything, the tail past that reach (its KVs and its last-token state) of the
least recently created such leaf, keeping the stub, so the branch is still found when the next
request diverges inside it.

The margin is the ``quantile`` of the window times ``slack``; a wholly re-entered leaf counts as an
infinite advance, so when more than ``1 - quantile`` of the recent re-entries ran to a leaf's end
(a trace of continuing conversations) there is no margin and nothing is trimmed. Trimming feeds
back: a trimmed stub that a request runs past is again an infinite advance, so a margin that was
too short stops trimming until untrimmed leaves show a longer reach.

Deterministic, O(1) per request (the window is sorted only when it changes: ``window`` entries).
Knows nothing of the future and of sessions: bases and advances are read off the radix walk.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from marconi.core.registry import ConfigError

__all__ = ["TailReach", "TailPredictor", "TAIL_MODES"]

#: Admission ``tails`` values: ``keep`` (every inserted KV stays until a rule evicts it) or ``reach``.
TAIL_MODES = ("keep", "reach")


@dataclass(slots=True)
class TailReach:
    """Online estimate of how far re-entries into a branched sequence reach (see the module docstring).

    Args:
        window: re-entries remembered (the last ones).
        quantile: the share of them the margin must cover.
        slack: the margin is the quantile times this (a re-entry slightly deeper than any seen is
            still found).
        min_observations: no margin (nothing trimmed) before this many re-entries were seen.
    """

    window: int = 64
    quantile: float = 0.5
    slack: float = 1.5
    min_observations: int = 8
    _advances: deque = field(default_factory=deque, repr=False)
    _margin: int | None = None
    observations: int = 0

    def __post_init__(self) -> None:
        if self.window < 1 or self.min_observations < 1 or self.min_observations > self.window:
            raise ConfigError(f"tail reach: need 1 <= min_observations <= window, got "
                              f"{self.min_observations} and {self.window}")
        if not 0 < self.quantile <= 1:
            raise ConfigError(f"tail reach: quantile must be in (0, 1], got {self.quantile}")
        if not (math.isfinite(self.slack) and self.slack >= 1):
            raise ConfigError(f"tail reach: slack must be a finite number >= 1, got {self.slack}")

    def observe(self, advance: float) -> None:
        """A later request re-entered a branched leaf (or the ghost of one evicted) by ``advance``
        tokens past its base (``math.inf``: it ran to the leaf's end, a continuation)."""
        if advance < 0:
            raise ValueError(f"a re-entry cannot advance {advance} tokens")
        self._advances.append(advance)
        if len(self._advances) > self.window:
            self._advances.popleft()
        self.observations += 1
        self._margin = self._estimate()

    def _estimate(self) -> int | None:
        n = len(self._advances)
        if n < self.min_observations:
            return None
        value = _quantile(self._advances, self.quantile)
        return None if math.isinf(value) else int(math.ceil(value * self.slack))

    @property
    def margin(self) -> int | None:
        """Tokens past its base a branched leaf is expected to be re-entered; None: trim nothing."""
        return self._margin

    def check_invariants(self) -> None:
        """AssertionError unless the window holds at most ``window`` re-entries and the margin is
        the one they give."""
        if len(self._advances) > self.window:
            raise AssertionError(f"tail reach: {len(self._advances)} re-entries kept, window is {self.window}")
        if self._margin != self._estimate():
            raise AssertionError(f"tail reach: stale margin {self._margin}, the window gives {self._estimate()}")


def _quantile(values: deque, q: float) -> float:
    """The smallest value with at least ``q`` of ``values`` at or below it."""
    ranked = sorted(values)
    return ranked[min(len(ranked) - 1, math.ceil(q * len(ranked)) - 1)]


@dataclass(slots=True)
class TailPredictor:
    """Re-entry margins per *anchor* (the node a branched leaf hangs from when it is created), with
    one over every re-entry as the fallback.

    Why per anchor: one trace may mix sessions that leave a sequence early (agents) with sessions
    that come back for all of it (conversations that branched off a shared system prompt). Their
    first turns all hang from the prompt's node, so that anchor soon has evidence of its own (its
    leaves are re-entered wholly: no margin, nothing cut), while an agent's leaves hang from anchors
    of their own, seen once, and take the margin of every re-entry. An anchor's estimate is used
    once it has ``min_observations`` re-entries; at most ``max_anchors`` are remembered (least
    recently observed forgotten first), so memory is bounded.
    """

    max_anchors: int = 4096
    overall: TailReach = field(default_factory=TailReach)
    _anchors: "OrderedDict[int, TailReach]" = field(default_factory=OrderedDict, repr=False)

    def observe(self, anchor: int, advance: float) -> None:
        """A re-entry of ``advance`` tokens into a leaf created under ``anchor`` (see :class:`TailReach`)."""
        self.overall.observe(advance)
        reach = self._anchors.get(anchor)
        if reach is None:
            reach = self._anchors[anchor] = TailReach(window=16, min_observations=4)
            if len(self._anchors) > self.max_anchors:
                self._anchors.popitem(last=False)
        else:
            self._anchors.move_to_end(anchor)
        reach.observe(advance)

    @property
    def margin(self) -> int | None:
        """The margin over every re-entry (None: no evidence yet, or mostly whole re-entries)."""
        return self.overall.margin

    @property
    def num_anchors(self) -> int:
        """Anchors with an estimate of their own (at most ``max_anchors``)."""
        return len(self._anchors)

    def check_invariants(self) -> None:
        """AssertionError unless at most ``max_anchors`` anchors are remembered and every estimate
        holds its own (:meth:`TailReach.check_invariants`)."""
        if len(self._anchors) > self.max_anchors:
            raise AssertionError(f"tail predictor: {len(self._anchors)} anchors kept, max_anchors is {self.max_anchors}")
        self.overall.check_invariants()
        for reach in self._anchors.values():
            reach.check_invariants()

    def margin_for(self, anchor: int, *, fallback: bool = True) -> int | None:
        """The margin for a leaf created under ``anchor``: the anchor's own once it has evidence,
        else (with ``fallback``) every re-entry's."""
        reach = self._anchors.get(anchor)
        if reach is not None and reach.observations >= reach.min_observations:
            return reach.margin
        return self.overall.margin if fallback else None
