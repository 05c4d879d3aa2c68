"""Radix tree over token ids: the structure of the prefix cache, and nothing else.

Each :class:`Node` owns the edge from its parent: its tokens (int32), an opaque KV payload, and the
SSM checkpoints on it (parallel lists of positions and payloads). With ``page_size > 1`` children
are keyed by their first page and matches round down to whole pages, as in vLLM's block hashing.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any, Iterator, NamedTuple

import numpy as np

__all__ = ["Node", "RadixTree", "WalkResult", "common_prefix_len"]


class Node:
    """One radix-tree node; see the module docstring for what it owns."""

    __slots__ = ("node_id", "tokens", "parent", "children", "depth", "kv", "ckpt_positions", "ckpt_states",
                 "last_access", "access_seq", "path_access", "path_seq", "lock_ref", "slot", "flop_eff",
                 "tail_base", "tail_anchor", "tail_lineage", "ghost")

    def __init__(self, node_id: int, tokens: np.ndarray, parent: "Node | None", depth: int) -> None:
        self.node_id = node_id
        self.tokens = tokens          # the edge from the parent; never empty, a whole number of pages
        self.parent = parent          # None only for the root (and a node removed from the tree)
        self.children: dict[Any, Node] = {}   # keyed by RadixTree.child_key of the child's edge
        self.depth = depth            # prefix length at the edge's end == parent.depth + len(tokens)
        self.kv: Any = None           # opaque KV payload of the edge tokens
        # Checkpoints on this edge: absolute positions, ascending, each in (parent_depth, depth], and
        # their opaque payloads (same length). More than one only for block runs (leaf-only eviction),
        # and then the edge ends at the last one.
        self.ckpt_positions: list[int] = []
        self.ckpt_states: list[Any] = []
        # Two recency signals, so any eviction policy (and a policy that switches between them)
        # can score with either: a "hit" access refreshes only the node a request resumed from
        # (Marconi, paper §4.3), a "path" access every node on the matched path up to it (SGLang).
        # Creating a node or admitting its checkpoint refreshes both.
        self.last_access = 0.0        # clock value of the last hit access
        self.access_seq = 0           # strictly increasing hit-access order (tie-breaker)
        self.path_access = 0.0        # clock value of the last path access
        self.path_seq = 0             # strictly increasing path-access order
        self.lock_ref = 0             # in-flight requests whose matched path includes this node
        self.slot: int | None = None  # index in the eviction candidate set, iff a candidate
        self.flop_eff = 0.0           # FLOP efficiency, recomputed on every structural change
        # Where the request that created this leaf left the tree (it branched there), or -1: the
        # tail past it is the sequence's own (``marconi.core.tails``). Only the lower part of a
        # split keeps it (the tail is below the split).
        self.tail_base = -1
        self.tail_anchor = -1         # the node id this branched leaf was created under (its estimate's key)
        self.tail_lineage = False     # its creator left another sequence partway (else an inner node)
        # The edge tokens, tail base and anchor of the last branched leaf evicted from under this
        # node, or None: a later re-entry into it is still measurable (``marconi.core.tails``).
        self.ghost: tuple[np.ndarray, int, int] | None = None

    @property
    def edge_len(self) -> int:
        return len(self.tokens)

    @property
    def parent_depth(self) -> int:
        return self.depth - len(self.tokens)

    @property
    def has_ssm(self) -> bool:
        """Whether a checkpoint sits at the node's end (a request can resume at ``depth``)."""
        positions = self.ckpt_positions
        return bool(positions) and positions[-1] == self.depth

    @property
    def num_checkpoints(self) -> int:
        return len(self.ckpt_positions)

    @property
    def end_state(self) -> Any:
        """The payload of the checkpoint at the node's end (``has_ssm`` must hold)."""
        return self.ckpt_states[-1]

    def holds_checkpoint_at(self, pos: int) -> bool:
        """Whether this node keeps the state at absolute position ``pos`` (inside or at its end)."""
        positions = self.ckpt_positions
        i = bisect_right(positions, pos)
        return i > 0 and positions[i - 1] == pos

    def add_checkpoint(self, pos: int, payload: Any) -> None:
        """Hold the state at ``pos`` (in ``(parent_depth, depth]``, not held yet)."""
        i = bisect_right(self.ckpt_positions, pos)
        self.ckpt_positions.insert(i, pos)
        self.ckpt_states.insert(i, payload)

    def __repr__(self) -> str:
        return (f"Node(id={self.node_id}, depth={self.depth}, edge={len(self.tokens)}, ssm={self.has_ssm}, "
                f"children={len(self.children)}, lock={self.lock_ref})")


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two int arrays (vectorised)."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


class WalkResult(NamedTuple):
    """Where a token sequence leaves the tree: ``path`` (fully matched nodes, root excluded),
    ``matched_len`` (page-rounded) and ``partial`` (the child whose edge matched partly, or None)."""

    path: list[Node]
    matched_len: int
    partial: Node | None


class RadixTree:
    """Token-id radix tree with optional page-granular matching."""

    def __init__(self, page_size: int = 1) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self._next_id = 1
        self.root = Node(0, np.empty(0, dtype=np.int32), None, 0)
        self.num_nodes = 0  # excluding the root

    # ------------------------------------------------------------------ keys and walking
    def child_key(self, tokens: np.ndarray, start: int) -> Any:
        """Key of the child edge starting at ``tokens[start]``: a token, or a whole page's bytes."""
        if self.page_size == 1:
            return int(tokens[start])
        return tokens[start:start + self.page_size].tobytes()

    def walk(self, tokens: np.ndarray, start: Node | None = None) -> WalkResult:
        """Follow ``tokens`` as far as the tree holds them, read-only; from ``start`` (a node known to
        spell ``tokens[:start.depth]``) instead of the root if given."""
        page = self.page_size
        usable_len = len(tokens) - len(tokens) % page
        node, depth, path = self.root, 0, []
        if start is not None and start is not self.root:
            node, depth = start, start.depth
            while start is not self.root:
                path.append(start)
                start = start.parent  # type: ignore[assignment]
            path.reverse()
        while depth < usable_len:
            child = node.children.get(self.child_key(tokens, depth))
            if child is None:
                break
            edge = child.tokens
            n = len(edge)
            # bytes equality is ~5x faster than np.array_equal for these short int32 slices
            if depth + n <= usable_len and (page > 1 and n == page
                                            or edge.tobytes() == tokens[depth:depth + n].tobytes()):
                path.append(child)
                depth += n
                node = child
                continue
            common = common_prefix_len(edge, tokens[depth:usable_len])
            common -= common % page
            return WalkResult(path, depth + common, child if common > 0 else None)
        return WalkResult(path, depth, None)

    def iter_nodes(self) -> Iterator[Node]:
        """All nodes except the root, parents before children."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    # ------------------------------------------------------------------ surgery
    def new_node(self, tokens: np.ndarray, parent: Node) -> Node:
        """Create a child of ``parent`` owning ``tokens`` (no payloads yet) and link it in."""
        node = Node(self._next_id, tokens, parent, parent.depth + len(tokens))
        self._next_id += 1
        parent.children[self.child_key(tokens, 0)] = node
        self.num_nodes += 1
        return node

    def split(self, node: Node, at: int) -> Node:
        """Split ``node``'s edge after ``at`` tokens; returns the new upper node, which inherits
        ``node``'s lock count and recency and the checkpoints at or above ``at``. ``node`` stays the
        lower part (handles stay valid). Splitting the KV payload is the caller's job."""
        if not 0 < at < len(node.tokens):
            raise ValueError(f"split point {at} outside edge of length {len(node.tokens)}")
        if at % self.page_size:
            raise ValueError(f"split point {at} is not a multiple of the page size {self.page_size}")
        parent = node.parent
        assert parent is not None
        upper = Node(self._next_id, node.tokens[:at], parent, node.depth - len(node.tokens) + at)
        self._next_id += 1
        upper.lock_ref = node.lock_ref
        upper.last_access = node.last_access
        upper.access_seq = node.access_seq
        upper.path_access = node.path_access
        upper.path_seq = node.path_seq
        k = bisect_right(node.ckpt_positions, upper.depth)  # checkpoints at or above the split go up
        if k:
            upper.ckpt_positions, node.ckpt_positions = node.ckpt_positions[:k], node.ckpt_positions[k:]
            upper.ckpt_states, node.ckpt_states = node.ckpt_states[:k], node.ckpt_states[k:]
        parent.children[self.child_key(node.tokens, 0)] = upper
        node.tokens = node.tokens[at:]
        node.parent = upper
        upper.children[self.child_key(node.tokens, 0)] = node
        self.num_nodes += 1
        return upper

    def trim_leaf(self, node: Node, num_tokens: int) -> list[Any]:
        """Drop the last ``num_tokens`` tokens of a leaf's edge and the checkpoints on them (block
        caching evicts a run's tail); returns the dropped checkpoints' payloads."""
        assert not node.children and 0 < num_tokens < len(node.tokens)
        node.tokens = node.tokens[: len(node.tokens) - num_tokens]
        node.depth -= num_tokens
        k = bisect_right(node.ckpt_positions, node.depth)
        dropped = node.ckpt_states[k:]
        del node.ckpt_positions[k:], node.ckpt_states[k:]
        return dropped

    def remove_leaf(self, node: Node) -> None:
        assert not node.children and node.parent is not None
        del node.parent.children[self.child_key(node.tokens, 0)]
        node.parent = None
        self.num_nodes -= 1

    def merge_into_child(self, node: Node) -> Node:
        """Remove a one-child node, prepending its edge tokens to the child's; returns the child. Its
        checkpoints go with it; releasing them and joining the KV payloads (first) are the caller's."""
        assert len(node.children) == 1 and node.parent is not None
        (child,) = node.children.values()
        key = self.child_key(node.tokens, 0)
        child.tokens = np.concatenate((node.tokens, child.tokens))
        child.parent = node.parent
        node.parent.children[key] = child
        node.parent = None
        node.children = {}
        self.num_nodes -= 1
        return child
