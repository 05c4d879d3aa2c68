"""Dead-tail prediction: how far later requests re-enter a sequence that left its predecessor early.

From recent re-entries into branched leaves (``matched - base`` tokens; a whole one is infinite) a
*margin* is predicted, and before any eviction the cache cuts the oldest such leaf back to ``base +
margin``, keeping the stub. Online, deterministic, O(1) per request. Why and how: ``docs/tails.md``.
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
    """Online margin: the ``quantile`` of the last ``window`` re-entries times ``slack``; None (cut
    nothing) before ``min_observations`` or when more than ``1 - quantile`` of them were whole."""

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
        """Record a re-entry ``advance`` tokens past a leaf's base (``math.inf``: a whole one)."""
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
        """AssertionError unless the window and the margin agree with ``window``."""
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
    """Re-entry margins per *anchor* (the node a branched leaf hangs from; one trace may mix agents
    with conversations), one over every re-entry as the fallback; at most ``max_anchors`` kept."""

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
        """AssertionError unless at most ``max_anchors`` anchors are kept and each estimate holds."""
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
    """The cache's dead-tail strategy, fed through its hooks; :meth:`next_cut` names the next tail to
    cut. Every remembered leaf is a leaf of the tree with ``tail_base >= 0`` (bounded by the tree)."""

    __slots__ = ("predictor", "leaves")

    def __init__(self) -> None:
        self.predictor = TailPredictor()
        self.leaves: "OrderedDict[int, Node]" = OrderedDict()   # oldest first

    @property
    def margin(self) -> int | None:
        return self.predictor.margin

    def enter(self, walk: WalkResult, tokens: np.ndarray, root: Node) -> tuple[int, bool]:
        """Learn how far this input re-enters a branched leaf (or an evicted one's ghost) if its match
        ends in one; return ``(base, lineage)``: where the input branches (-1: it does not) and
        whether it left inside a leaf's edge (False at an inner node: only the anchor's own evidence
        may cut it)."""
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
        """``(leaf, depth)``: the oldest unlocked remembered leaf and its base plus margin, rounded up
        to a page; None when there is none. Leaves passed over for good are forgotten."""
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
        """AssertionError unless the remembered leaves are leaves of ``in_tree`` (node id -> node)
        with a base, every ghost is well formed, and the predictor holds its own."""
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
