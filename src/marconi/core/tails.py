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

import numpy as np

from marconi.core.radix import Node, WalkResult, common_prefix_len
from marconi.core.registry import ConfigError

__all__ = ["TailReach", "TailPredictor", "DeadTails", "TAIL_MODES"]

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


class DeadTails:
    """The cache's dead-tail strategy: learn re-entries as requests begin, remember the leaves of
    branched sequences, and name the next tail to cut at eviction.

    Hooks (the only places the cache and its store call): :meth:`enter` when a request begins,
    :meth:`note` when its insertion created a leaf, :meth:`continued` / :meth:`leaf_removed` /
    :meth:`inner_removed` when the tree changes, :meth:`next_cut` before each eviction.

    Invariant (:meth:`check_invariants`): every remembered leaf is a leaf of the tree with
    ``tail_base >= 0``, keyed by its node id, so the index never outgrows the tree. A leaf leaves
    it when it gains a child (continued: not dead), leaves the tree, or is passed over by
    :meth:`next_cut`.
    """

    __slots__ = ("predictor", "leaves")

    def __init__(self) -> None:
        self.predictor = TailPredictor()
        self.leaves: "OrderedDict[int, Node]" = OrderedDict()   # oldest first

    @property
    def margin(self) -> int | None:
        return self.predictor.margin

    def enter(self, walk: WalkResult, tokens: np.ndarray, root: Node) -> tuple[int, bool]:
        """Learn how far this input re-enters a branched leaf, if its match ends in one (or in the
        ghost of one evicted); return where the input leaves its predecessor's sequence if it
        branches (else -1), and whether it left inside a leaf's edge.

        A match that runs to a leaf's end re-enters it wholly (a continuation: an infinite
        advance); one that ends inside a leaf's edge leaves that sequence there. An input that
        leaves at an inner node (a prompt several sequences already branch from) starts a sequence
        of its own: only its anchor's own evidence may cut it (lineage False).
        """
        input_len = len(tokens)
        matched = walk.matched_len
        node = walk.partial or (walk.path[-1] if walk.path else root)
        at_leaf_end = walk.partial is None and not node.children
        if node.tail_base >= 0:
            self.predictor.observe(node.tail_anchor, math.inf if at_leaf_end else max(0, matched - node.tail_base))
        elif walk.partial is None and node.ghost is not None and matched < input_len:
            edge, base, anchor = node.ghost
            into = common_prefix_len(edge, tokens[matched:])
            if into:
                self.predictor.observe(anchor, math.inf if into == len(edge) else max(0, matched + into - base))
                if into < len(edge):
                    return matched + into, True  # it left its predecessor there, not where the tree ends
        if matched == 0 or matched >= input_len or at_leaf_end:
            return -1, False
        return matched, walk.partial is not None and not walk.partial.children

    def note(self, leaf: Node, mark: tuple[int, bool]) -> None:
        """``leaf`` ends a sequence that branched at ``mark[0]`` (inside another sequence's leaf if
        ``mark[1]``); a base < 0 means it did not branch, and nothing is remembered."""
        base, lineage = mark
        if base >= 0:
            leaf.tail_base = base
            leaf.tail_anchor = leaf.parent.node_id  # type: ignore[union-attr]
            leaf.tail_lineage = lineage
            self.leaves[leaf.node_id] = leaf

    def continued(self, parent: Node) -> None:
        """``parent`` gained a child: its sequence continues, its tail is not dead."""
        self.leaves.pop(parent.node_id, None)

    def leaf_removed(self, node: Node) -> None:
        """A leaf left the tree: forget it, and leave its edge as a ghost on its parent so later
        re-entries into it are still measured."""
        if node.tail_base >= 0:
            self.leaves.pop(node.node_id, None)
            node.parent.ghost = (node.tokens, node.tail_base, node.tail_anchor)  # type: ignore[union-attr]

    def inner_removed(self, node: Node) -> None:
        """A one-child node merged into its child (it had gained a child, so none is due)."""
        self.leaves.pop(node.node_id, None)

    def next_cut(self, page_size: int) -> "tuple[Node, int] | None":
        """The oldest unlocked remembered leaf and the depth to cut it back to (its base plus its
        anchor's margin, or every re-entry's while the anchor has no evidence, rounded up to a
        page); None when there is no margin or no such leaf. Leaves passed over for good (whole
        re-entries, or already within their reach) are forgotten; locked ones wait."""
        margin = self.predictor.margin
        if margin is None:
            return None
        leaves = self.leaves
        for _ in range(len(leaves)):
            node_id, node = next(iter(leaves.items()))
            if node.lock_ref:
                leaves.move_to_end(node_id)
                continue
            del leaves[node_id]
            own = self.predictor.margin_for(node.tail_anchor, fallback=node.tail_lineage)
            if own is None:
                continue
            reach = -(-(node.tail_base + own) // page_size) * page_size
            if reach < node.depth:
                return node, reach
        return None

    def check_invariants(self, in_tree: "dict[int, Node]") -> None:
        """AssertionError unless every remembered leaf is in ``in_tree`` (node id -> node), has no
        children and has a base, every ghost is well formed, and the predictor holds its own."""
        self.predictor.check_invariants()
        for node_id, node in self.leaves.items():
            where = f"dead-tail index entry {node_id}"
            if in_tree.get(node_id) is not node:
                raise AssertionError(f"{where}: the node is no longer in the tree")
            if node.children:
                raise AssertionError(f"{where}: node {node_id} has children (it is no leaf)")
            if node.tail_base < 0:
                raise AssertionError(f"{where}: node {node_id} has no tail base")
        for node in in_tree.values():
            ghost = node.ghost
            if ghost is None:
                continue
            where = f"node {node.node_id}: ghost"
            if not (isinstance(ghost, tuple) and len(ghost) == 3):
                raise AssertionError(f"{where} is not (edge tokens, base, anchor)")
            edge, base, _anchor = ghost
            if not (isinstance(edge, np.ndarray) and edge.ndim == 1 and edge.size > 0):
                raise AssertionError(f"{where}: its edge is not a non-empty 1-D token array")
            if base < 0:
                raise AssertionError(f"{where}: negative tail base {base}")
