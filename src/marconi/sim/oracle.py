"""A future-aware reference eviction (``oracle``): Belady's rule, adapted to a radix tree of SSM checkpoints.

Knowing every request to come, it evicts the candidate maximising (requests until its next
*usable* reuse) × (bytes its eviction frees) ÷ (tokens that reuse saves); one never reused goes
first, the largest first. Next uses come from a :class:`FutureIndex` of the whole trace. A strong
reference, not a proven bound: sizes vary and tree entries depend on each other, so an online
policy can beat it (``docs/adaptive.md``, "The oracle")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from marconi.core.cache import CacheObserver, RequestHandle
from marconi.core.eviction import EvictionBase
from marconi.core.radix import Node, RadixTree

if TYPE_CHECKING:
    from marconi.core.cache import PrefixCache
    from marconi.core.candidates import CandidateSet

__all__ = ["FutureIndex", "OracleEviction", "NEVER"]

NEVER = np.iinfo(np.int64).max   # "not used again"


class FutureIndex:
    """For any token prefix, the indices (in arrival order) of the requests whose input contains it: a
    radix tree over every input, split at every input's end, each node listing the inputs through it."""

    def __init__(self, inputs: Sequence[np.ndarray]) -> None:
        self.tree = RadixTree(1)
        through: dict[int, list[int]] = {}
        for i, tokens in enumerate(inputs):
            tokens = np.asarray(tokens, dtype=np.int32)
            walk = self.tree.walk(tokens)
            path = list(walk.path)
            if walk.partial is not None:
                upper = self.tree.split(walk.partial, walk.matched_len - walk.partial.parent_depth)
                through[upper.node_id] = list(through[walk.partial.node_id])  # all of them pass the split
                path.append(upper)
            if walk.matched_len < len(tokens):
                parent = path[-1] if path else self.tree.root
                path.append(self.tree.new_node(tokens[walk.matched_len:].copy(), parent))
            for node in path:
                through.setdefault(node.node_id, []).append(i)
        self._through = {k: np.asarray(v, dtype=np.int64) for k, v in through.items()}
        self.num_requests = len(inputs)

    def requests_through(self, prefix: np.ndarray) -> np.ndarray | None:
        """Sorted indices of the requests whose input starts with ``prefix`` (None: no such request)."""
        if len(prefix) == 0:
            return np.arange(self.num_requests, dtype=np.int64)
        walk = self.tree.walk(prefix)
        if walk.matched_len < len(prefix):
            return None
        node = walk.partial if walk.partial is not None else walk.path[-1]
        return self._through[node.node_id]

    def segments(self, prefix: np.ndarray, start: int) -> list[tuple[int, np.ndarray]]:
        """Along ``prefix`` past position ``start``: ``(end, requests)`` per stretch that the same
        requests' inputs share, shallowest first; ``end`` is clipped to ``len(prefix)``. The requests
        of a later stretch are a subset of an earlier one's. Empty if no input goes past ``start``."""
        walk = self.tree.walk(prefix)
        nodes = [*walk.path, *((walk.partial,) if walk.partial is not None else ())]
        return [(min(node.depth, walk.matched_len), self._through[node.node_id]) for node in nodes
                if node.depth > start and node.parent_depth < walk.matched_len]

    @staticmethod
    def next_after(requests: np.ndarray | None, now: int) -> int:
        """The first index in ``requests`` greater than ``now`` (``NEVER`` if none)."""
        if requests is None:
            return NEVER
        k = int(np.searchsorted(requests, now, side="right"))
        return int(requests[k]) if k < len(requests) else NEVER


def _first_not_in(requests: np.ndarray, excluded: np.ndarray | None, now: int) -> int:
    """The first index > ``now`` in ``requests`` that ``excluded`` does not hold."""
    start = int(np.searchsorted(requests, now, side="right"))
    if excluded is None or len(excluded) == 0:
        return int(requests[start]) if start < len(requests) else NEVER
    chunk = 16
    while start < len(requests):
        part = requests[start:start + chunk]
        pos = np.searchsorted(excluded, part)
        pos[pos == len(excluded)] = len(excluded) - 1
        outside = np.flatnonzero(excluded[pos] != part)
        if outside.size:
            return int(part[outside[0]])
        start += chunk
        chunk *= 4
    return NEVER


class _Now(CacheObserver):
    """Tracks the index of the latest request the cache has begun (request ids are arrival order)."""

    def __init__(self) -> None:
        self.index = -1

    def on_begin(self, cache: "PrefixCache", handle: RequestHandle) -> None:
        self.index = handle.request_id


class OracleEviction(EvictionBase):
    """Future-aware eviction over nodes with at most one child. The cache's request ids must be the
    trace's indices in arrival order (a replay driver beginning every request once, in order).
    ValueError if bound to a second cache."""

    name = "oracle"
    evicts_inner_nodes = True
    efficiency_variant = "total"

    def __init__(self, future: FutureIndex) -> None:
        self.future = future
        self._now = _Now()
        self._kv_per_token = 0
        self._ckpt_bytes = 0
        self._through: dict[int, tuple[int, np.ndarray | None]] = {}  # node id -> (depth, requests through it)
        self._segments: dict[int, tuple[int, int, list[tuple[int, np.ndarray]]]] = {}  # leaves: along their edge
        # node id -> (shape, next use, tokens its reuse saves (0: never reused), bytes freed): a keep
        # cost is (next use - now) x freed / saved while ``now`` is before the next use and the node's
        # shape (what the cost reads of the tree) is unchanged: computed once, not at every eviction
        self._costs: dict[int, tuple[tuple, int, int, int]] = {}
        self._bound = False

    def bind(self, cache: "PrefixCache") -> None:
        if self._bound:
            raise ValueError("an oracle eviction policy serves one cache; build one per cache")
        self._bound = True
        self._kv_per_token = cache.spec.kv_bytes_per_token
        self._ckpt_bytes = cache.spec.ssm_checkpoint_bytes
        cache.add_observer(self._now)

    # ---------------------------------------------------------------- future of a node
    @staticmethod
    def _prefix(node: Node) -> np.ndarray:
        parts = []
        walker: Node | None = node
        while walker is not None and walker.parent is not None:
            parts.append(walker.tokens)
            walker = walker.parent
        return np.concatenate(parts[::-1]) if len(parts) > 1 else parts[0]

    def _requests(self, node: Node) -> np.ndarray | None:
        cached = self._through.get(node.node_id)
        if cached is not None and cached[0] == node.depth:
            return cached[1]
        found = self.future.requests_through(self._prefix(node))
        self._through[node.node_id] = (node.depth, found)
        return found

    def _edge_segments(self, node: Node) -> list[tuple[int, np.ndarray]]:
        cached = self._segments.get(node.node_id)
        if cached is not None and cached[:2] == (node.depth, node.parent_depth):
            return cached[2]
        found = self.future.segments(self._prefix(node), node.parent_depth)
        self._segments[node.node_id] = (node.depth, node.parent_depth, found)
        return found

    @staticmethod
    def _checkpoint_below(node: Node) -> Node | None:
        """The nearest node holding a checkpoint down a single-child chain (None if it branches first)."""
        child = node
        while len(child.children) == 1:
            (child,) = child.children.values()
            if child.has_ssm:
                return child
        return None

    @staticmethod
    def _fallback_depth(node: Node) -> int:
        parent = node.parent
        while parent is not None and parent.parent is not None and not parent.has_ssm:
            parent = parent.parent
        return 0 if parent is None or parent.parent is None else parent.depth

    def _keep_cost(self, node: Node, now: int) -> tuple[float, int]:
        """(requests to next usable reuse × bytes freed ÷ tokens saved, bytes freed); inf if never reused."""
        below = self._checkpoint_below(node) if node.children else None
        fallback = self._fallback_depth(node)
        shape = (node.depth, node.parent_depth, node.num_checkpoints, node.has_ssm, len(node.children),
                 fallback, None if below is None else (below.node_id, below.depth))
        known = self._costs.get(node.node_id)
        if known is None or known[0] != shape or known[1] <= now:
            nxt, saved, freed = (self._inner_use(node, below, fallback, now) if node.children
                                 else self._leaf_use(node, fallback, now))
            known = self._costs[node.node_id] = (shape, nxt, saved, freed)
        _, nxt, saved, freed = known
        return (float("inf") if not saved else (nxt - now) * freed / saved), freed

    # The uses below: (next use, tokens it saves or 0 for never reused, bytes freed); they hold until
    # that next use (the future is fixed, so the first use after ``now`` stays the first). ``fallback``:
    # the depth a request resumes from without the node (:meth:`_fallback_depth`).
    def _inner_use(self, node: Node, below: Node | None, fallback: int, now: int) -> tuple[int, int, int]:
        through = self._requests(node)
        freed = self._ckpt_bytes
        excluded = None if below is None else self._requests(below)
        nxt = NEVER if through is None else _first_not_in(through, excluded, now)
        if nxt == NEVER or not node.has_ssm:
            return NEVER, 0, freed
        return nxt, max(1, node.depth - fallback), freed

    def _leaf_use(self, node: Node, fallback: int, now: int) -> tuple[int, int, int]:
        """A leaf's: its next use is the next request entering its edge (resuming from its checkpoint,
        or finding its KVs where it branches off); the tokens up to there stay reusable."""
        freed = node.edge_len * self._kv_per_token + node.num_checkpoints * self._ckpt_bytes
        segments = self._edge_segments(node)
        if not segments:
            return NEVER, 0, freed
        nxt = FutureIndex.next_after(segments[0][1], now)
        if nxt == NEVER:
            return NEVER, 0, freed
        reach = segments[0][0]
        for end, requests in segments[1:]:
            k = int(np.searchsorted(requests, nxt))
            if k == len(requests) or requests[k] != nxt:
                break
            reach = end
        if reach == node.depth and not node.has_ssm:
            return nxt, 0, freed
        return nxt, max(1, reach - fallback), freed

    def keep_costs(self, candidates: "CandidateSet") -> tuple[np.ndarray, np.ndarray]:
        """Per candidate, now: (the cost of keeping it, ``inf`` if never reused; the bytes its eviction
        frees). What :meth:`choose` ranks; public for studies of the never-reused candidates."""
        now = self._now.index
        n = len(candidates)
        costs = np.empty(n)
        freed = np.empty(n)
        for i, node in enumerate(candidates.nodes):
            costs[i], freed[i] = self._keep_cost(node, now)
        return costs, freed

    def choose(self, candidates: "CandidateSet") -> int:
        costs, freed = self.keep_costs(candidates)
        worst = costs.max()
        ties = np.flatnonzero(costs == worst)
        if ties.size == 1:
            return int(ties[0])
        biggest = ties[freed[ties] == freed[ties].max()]
        return int(biggest[np.argmin(candidates.access_seq[biggest])])

    def describe(self) -> dict[str, Any]:
        return {"eviction": self.name}
