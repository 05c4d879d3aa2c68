"""The store under a prefix cache: the radix tree, its byte accounting (from the ModelSpec only) and
the eviction-candidate index, kept consistent by its surgery. Each operation either changes nothing
(a callback it needs first raised) or leaves all three consistent; opaque payloads
(:class:`PayloadOps`) are released after the change, so a raising ``release`` finds the store whole.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

from marconi.core.candidates import CandidateSet, flop_efficiency
from marconi.core.model import ModelSpec
from marconi.core.registry import ConfigError
from marconi.core.radix import Node, RadixTree
from marconi.core.stats import CacheStats
from marconi.core.tails import DeadTails

__all__ = ["TreeStore", "PayloadOps", "SizeOnly", "SIZE_ONLY", "SizeOnlyPayloads", "InvariantError", "require"]


class InvariantError(AssertionError):
    """``check_invariants`` found the cache's incremental bookkeeping inconsistent."""


def require(condition: bool, message: str) -> None:
    """Raise :class:`InvariantError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise InvariantError(message)


@runtime_checkable
class PayloadOps(Protocol):
    """How the store manipulates opaque payloads when the tree's shape changes. Runtime-checkable:
    ``isinstance(ops, PayloadOps)`` checks that the four methods are there (not their signatures)."""

    def split_kv(self, kv: Any, at: int) -> tuple[Any, Any]:
        """An edge's KV payload -> (its first ``at`` tokens, the rest)."""
        ...

    def join_kv(self, first: Any, second: Any) -> Any:
        """Concatenate two consecutive edges' KV payloads (a parent absorbed into its child)."""
        ...

    def release(self, payload: Any) -> None:
        """An evicted KV or SSM payload is no longer referenced by the cache."""
        ...

    def state_at(self, pos: int) -> Any:
        """The SSM payload to admit at ``pos`` when ``finish``/``insert_prefill`` were given no
        ``states``: a stand-in for payloads that are only sizes, None (unavailable) for real ones."""
        ...


class SizeOnly:
    """The payload of a simulated checkpoint: it has a size (from the ModelSpec), no content."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "SIZE_ONLY"


SIZE_ONLY = SizeOnly()


class SizeOnlyPayloads:
    """Simulation payloads: nothing is stored; sizes come from the ModelSpec. Every checkpoint the
    admission policy asks for is available (its payload is :data:`SIZE_ONLY`)."""

    def split_kv(self, kv: Any, at: int) -> tuple[Any, Any]:
        return None, None

    def join_kv(self, first: Any, second: Any) -> Any:
        return None

    def release(self, payload: Any) -> None:
        return None

    def state_at(self, pos: int) -> Any:
        return SIZE_ONLY


class TreeStore:
    """A radix tree with byte accounting, locks, both recency signals and the candidate index.
    ``capacity_bytes`` bounds ``used_bytes`` (the cache checks before it inserts); with
    ``inner_candidates`` one-child nodes holding a checkpoint are candidates too;
    ``efficiency_variant`` (``total``/``marginal``) is the FLOP efficiency nodes carry."""

    def __init__(self, spec: ModelSpec, capacity_bytes: int, page_size: int, payloads: PayloadOps, *,
                 inner_candidates: bool, efficiency_variant: str) -> None:
        self.spec = spec
        self.capacity_bytes = capacity_bytes
        self.payloads = payloads
        self.tree = RadixTree(page_size)
        self.inner_candidates = inner_candidates
        self.efficiency_variant = efficiency_variant
        # Every unlocked node an eviction may take: a leaf, or (with inner_candidates) a one-child
        # node holding a checkpoint. ``node.slot`` is set iff the node is in it, and its arrays
        # mirror the node's recency and FLOP efficiency (``check_store`` verifies).
        self.candidates = CandidateSet()
        self.stats = CacheStats()
        self.used_bytes = 0
        self.kv_bytes = 0
        self.ssm_bytes = 0
        self.locked_bytes = 0          # bytes of nodes on an in-flight request's path (never evicted)
        self._seq = 0                  # last hit-access order handed out (> every node's access_seq)
        self._path_seq = 0             # last path-access order handed out (> every node's path_seq)
        self._ckpt_bytes = spec.ssm_checkpoint_bytes
        self._kv_per_token = spec.kv_bytes_per_token
        self.dead_tails: DeadTails | None = None   # told when a leaf is continued or leaves the tree

    # ================================================================== surgery with accounting
    @property
    def free_bytes(self) -> int:
        """``capacity_bytes - used_bytes``. Internal (the store's), not part of the ``PrefixCache``
        contract; read it under ``cache.lock`` for a consistent value."""
        return self.capacity_bytes - self.used_bytes

    def _new_node(self, seq: np.ndarray, start: int, end: int, parent: Node,
                  kv: Callable[[int, int], Any] | None, now: float) -> Node:
        """Link a node for ``seq[start:end]`` under ``parent`` with its KV payload and bytes; ``kv`` is
        asked first, so a ``kv`` that raises leaves the tree as it was."""
        payload = kv(start, end) if kv is not None else None
        node = self.tree.new_node(seq[start:end].copy(), parent)
        node.kv = payload
        edge_bytes = (end - start) * self._kv_per_token
        self.used_bytes += edge_bytes
        self.kv_bytes += edge_bytes
        self.stats.kv_tokens_inserted += end - start
        node.last_access = node.path_access = now
        self._seq += 1
        node.access_seq = self._seq
        self._path_seq += 1
        node.path_seq = self._path_seq
        if self.dead_tails is not None:
            self.dead_tails.continued(parent)  # a continued sequence's tail is not dead
        self._sync_parent(parent)
        return node

    def _split(self, node: Node, at: int) -> Node:
        upper_kv, lower_kv = self.payloads.split_kv(node.kv, at)
        upper = self.tree.split(node, at)
        upper.kv, node.kv = upper_kv, lower_kv
        self._update_eff(upper)
        self._update_eff(node)
        self._sync_candidate(upper)
        return upper

    def _attach_ssm(self, node: Node, payload: Any, now: float) -> None:
        node.add_checkpoint(node.depth, payload)
        self._account_ssm(node, 1, now)

    def _account_ssm(self, node: Node, count: int, now: float) -> None:
        # A checkpoint admitted now is recent, even on a node split off an older edge (which
        # inherited that edge's recency): otherwise a fresh branch state looks stale to eviction.
        self._touch(node, now)
        added = count * self._ckpt_bytes
        self.used_bytes += added
        self.ssm_bytes += added
        if node.lock_ref:
            self.locked_bytes += added
        self.stats.checkpoints_admitted += count
        self._update_eff(node)
        self._sync_candidate(node)

    def _trim_run(self, node: Node, shortfall: int) -> None:
        """Evict a run leaf's last blocks, as many as free ``shortfall`` bytes, at once."""
        positions = node.ckpt_positions
        n = len(positions)

        def freed_by(blocks: int) -> int:  # bytes the last ``blocks`` blocks hold (grows with blocks)
            start = positions[n - blocks - 1] if blocks < n else node.parent_depth
            return (node.depth - start) * self._kv_per_token + blocks * self._ckpt_bytes

        lo, hi = 1, n  # the fewest blocks that free ``shortfall``: a binary search (runs are long)
        while lo < hi:
            mid = (lo + hi) // 2
            if freed_by(mid) >= shortfall:
                hi = mid
            else:
                lo = mid + 1
        blocks = lo
        if blocks == n:
            self._evict_leaf(node)
            return
        self.stats.evictions_leaf += blocks
        self._cut_leaf(node, node.depth - positions[n - blocks - 1])

    def _cut_leaf(self, node: Node, dropped_tokens: int) -> None:
        """Drop a leaf's last ``dropped_tokens`` (< its edge) tokens, their KVs and checkpoints."""
        kept_kv, dropped_kv = self.payloads.split_kv(node.kv, node.edge_len - dropped_tokens)  # before any change
        node.kv = kept_kv
        dropped_states = self.tree.trim_leaf(node, dropped_tokens)
        freed_kv = dropped_tokens * self._kv_per_token
        freed_ssm = len(dropped_states) * self._ckpt_bytes
        self.used_bytes -= freed_kv + freed_ssm
        self.kv_bytes -= freed_kv
        self.ssm_bytes -= freed_ssm
        st = self.stats
        st.checkpoints_evicted += len(dropped_states)
        st.kv_tokens_evicted += dropped_tokens
        st.bytes_evicted += freed_kv + freed_ssm
        self._update_eff(node)
        self._release_payloads((dropped_kv, *dropped_states))

    def _evict_leaf(self, node: Node) -> None:
        self.candidates.remove(node)
        if self.dead_tails is not None:
            self.dead_tails.leaf_removed(node)
        kv_freed = node.edge_len * self._kv_per_token
        n_ckpt = node.num_checkpoints
        ssm_freed = n_ckpt * self._ckpt_bytes
        self.used_bytes -= kv_freed + ssm_freed
        self.kv_bytes -= kv_freed
        self.ssm_bytes -= ssm_freed
        st = self.stats
        st.checkpoints_evicted += n_ckpt
        st.evictions_leaf += max(1, n_ckpt)  # a run's blocks count one each, as if one node per block
        st.kv_tokens_evicted += node.edge_len
        st.bytes_evicted += kv_freed + ssm_freed
        parent = node.parent
        self.tree.remove_leaf(node)
        assert parent is not None
        self._sync_parent(parent)
        self._release_payloads((node.kv, *node.ckpt_states))

    def _evict_inner(self, node: Node) -> None:
        """Drop a one-child node's checkpoint; its edge KVs are absorbed by its child."""
        assert node.num_checkpoints == 1, "runs exist only under leaf-only eviction"
        (child,) = node.children.values()
        joined = self.payloads.join_kv(node.kv, child.kv)  # before any change: if it raises, nothing did
        self.candidates.remove(node)
        child.kv = joined
        self.used_bytes -= self._ckpt_bytes
        self.ssm_bytes -= self._ckpt_bytes
        self.stats.checkpoints_evicted += 1
        self.stats.evictions_inner += 1
        self.stats.bytes_evicted += self._ckpt_bytes
        if self.dead_tails is not None:
            self.dead_tails.inner_removed(node)
        self.tree.merge_into_child(node)
        self._update_eff(child)
        self._release_payloads((node.end_state,))

    def _drop_locked_state(self, node: Node) -> None:
        """Drop the one checkpoint of a locked one-child node; the node stays (a boundary without a
        state, as a sibling's eviction leaves a branch node) and so do its KVs, which the lock
        protects: the walks and handles that hold it stay valid."""
        assert node.lock_ref and len(node.children) == 1 and node.num_checkpoints == 1
        (payload,) = node.ckpt_states
        node.ckpt_positions = []
        node.ckpt_states = []
        freed = self._ckpt_bytes
        self.used_bytes -= freed
        self.ssm_bytes -= freed
        self.locked_bytes -= freed
        st = self.stats
        st.checkpoints_evicted += 1
        st.evictions_inner += 1
        st.locked_states_dropped += 1
        st.bytes_evicted += freed
        self._update_eff(node)
        self._release_payloads((payload,))

    def _release_payloads(self, payloads: tuple[Any, ...]) -> None:
        """Release every one of ``payloads`` (after the surgery); the first error is re-raised after
        the others are released."""
        release = self.payloads.release
        error: Exception | None = None
        for payload in payloads:
            try:
                release(payload)
            except Exception as exc:
                if error is None:
                    error = exc
        if error is not None:
            raise error

    def _lock(self, node: Node) -> None:
        root = self.tree.root
        while node is not root:
            node.lock_ref += 1
            if node.lock_ref == 1:
                self.locked_bytes += self._node_bytes(node)
                if node.slot is not None:
                    self.candidates.remove(node)
            node = node.parent  # type: ignore[assignment]

    def _unlock(self, node: Node) -> None:
        root = self.tree.root
        while node is not root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.locked_bytes -= self._node_bytes(node)
                self._sync_candidate(node)
            node = node.parent  # type: ignore[assignment]

    def _node_bytes(self, node: Node) -> int:
        return node.edge_len * self._kv_per_token + node.num_checkpoints * self._ckpt_bytes

    def _touch(self, node: Node, now: float) -> None:
        """Both recency signals (a node created or given a checkpoint)."""
        self._path_seq += 1
        node.path_access = now
        node.path_seq = self._path_seq
        self._touch_hit(node, now)

    def _touch_hit(self, node: Node, now: float) -> None:
        node.last_access = now
        self._seq += 1
        node.access_seq = self._seq
        if node.slot is not None:
            self.candidates.refresh(node)

    def _touch_path(self, node: Node, now: float) -> None:
        node.path_access = now
        self._path_seq += 1
        node.path_seq = self._path_seq
        if node.slot is not None:
            self.candidates.refresh(node)

    def _update_eff(self, node: Node) -> None:
        node.flop_eff = flop_efficiency(self.spec, node.depth, node.edge_len, node.has_ssm,
                                        self.efficiency_variant)
        if node.slot is not None:
            self.candidates.refresh(node)

    def _is_candidate(self, node: Node) -> bool:
        if node.lock_ref or node.parent is None:
            return False
        n_children = len(node.children)
        if n_children == 0:
            return True
        # A one-child node is worth evicting only if it frees a checkpoint.
        return n_children == 1 and self.inner_candidates and node.has_ssm and self._ckpt_bytes > 0

    def _sync_candidate(self, node: Node) -> None:
        want = self._is_candidate(node)
        if want and node.slot is None:
            self.candidates.add(node)
        elif not want and node.slot is not None:
            self.candidates.remove(node)
        elif want:
            self.candidates.refresh(node)  # its children changed: a leaf became a one-child node or back

    def _sync_parent(self, parent: Node) -> None:
        if parent is not self.tree.root:
            self._sync_candidate(parent)

    def adopt_tree(self) -> None:
        """Account for a tree built with the tree's own surgery (``from_snapshot``): bytes, FLOP
        efficiency and the eviction candidates, from scratch; access counters continue after the
        largest. Only for a cache that has served nothing yet. Internal (the cache's own surgery):
        not part of the ``PrefixCache`` contract, and it does not take ``cache.lock``."""
        assert self.used_bytes == 0, "adopt_tree is for a fresh store"
        for node in self.tree.iter_nodes():
            self.used_bytes += self._node_bytes(node)
            self.kv_bytes += node.edge_len * self._kv_per_token
            self.ssm_bytes += node.num_checkpoints * self._ckpt_bytes
            self._seq = max(self._seq, node.access_seq)
            self._path_seq = max(self._path_seq, node.path_seq)
            self._update_eff(node)
            self._sync_candidate(node)
        if self.used_bytes > self.capacity_bytes:
            raise ConfigError(f"the tree holds {self.used_bytes:,} bytes, more than the capacity "
                              f"{self.capacity_bytes:,}")

    def reindex(self) -> None:
        """Recompute every node's FLOP efficiency and candidate membership for the current policy
        (after ``inner_candidates`` or ``efficiency_variant`` changed). Internal (``clone`` calls it):
        not part of the ``PrefixCache`` contract, and it does not take ``cache.lock``."""
        for node in self.tree.iter_nodes():
            self._update_eff(node)
            self._sync_candidate(node)

    def check_store(self, expected_locks: dict[int, int]) -> None:
        """Recompute the tree's shape, bytes, lock counts (``expected_locks``: node id -> in-flight
        users), FLOP efficiencies and the candidate index from scratch; InvariantError on a drift.
        Internal: callers use ``PrefixCache.check_invariants`` (locked, and it counts the locks)."""
        used = kv = ssm = locked = count = 0
        page = self.tree.page_size
        stack = [self.tree.root]
        while stack:
            parent = stack.pop()
            for key, node in parent.children.items():
                count += 1
                where = f"node {node.node_id} (depth {node.depth})"
                require(node.parent is parent, f"{where}: parent link broken")
                require(node.edge_len > 0 and node.edge_len % page == 0, f"{where}: bad edge length {node.edge_len}")
                require(self.tree.child_key(node.tokens, 0) == key, f"{where}: child key does not match its edge")
                require(node.tokens.dtype == np.int32 and node.tokens.ndim == 1 and int(node.tokens.min()) >= 0,
                        f"{where}: edge tokens must be non-negative int32 ids")
                require(node.depth == parent.depth + node.edge_len, f"{where}: depth != parent depth + edge length")
                nbytes = self._node_bytes(node)
                used += nbytes
                kv += node.edge_len * self._kv_per_token
                ssm += node.num_checkpoints * self._ckpt_bytes
                positions = node.ckpt_positions
                require(len(positions) == len(node.ckpt_states)
                        and all(node.parent_depth < a < b <= node.depth for a, b in zip(positions, positions[1:]))
                        and all(node.parent_depth < a <= node.depth for a in positions[:1]),
                        f"{where}: checkpoints {positions} not ascending inside the edge or without payloads")
                if len(positions) > 1:
                    require(node.has_ssm, f"{where}: a block run must end at its last checkpoint")
                    require(not self.inner_candidates, f"{where}: a run under inner-node eviction")
                require(node.lock_ref == expected_locks.get(node.node_id, 0),
                        f"{where}: lock_ref {node.lock_ref} != {expected_locks.get(node.node_id, 0)} in-flight users")
                if node.lock_ref:
                    locked += nbytes
                require((node.slot is not None) == self._is_candidate(node), f"{where}: candidate index out of sync")
                if node.slot is not None:
                    require(self.candidates.nodes[node.slot] is node, f"{where}: candidate slot points elsewhere")
                    stale = self.candidates.stale_columns(node)
                    require(not stale, f"{where}: stale candidate arrays {stale}")
                eff = flop_efficiency(self.spec, node.depth, node.edge_len, node.has_ssm, self.efficiency_variant)
                require(eff == node.flop_eff and eff >= 0, f"{where}: stale FLOP efficiency")
                stack.append(node)
        require(count == self.tree.num_nodes, f"node count {self.tree.num_nodes} != {count} in the tree")
        require(len(self.candidates) == sum(1 for n in self.tree.iter_nodes() if n.slot is not None),
                "candidate set holds nodes no longer in the tree")
        require((used, kv, ssm) == (self.used_bytes, self.kv_bytes, self.ssm_bytes),
                f"bytes drifted: recomputed used/kv/ssm {(used, kv, ssm)} vs {(self.used_bytes, self.kv_bytes, self.ssm_bytes)}")
        require(locked == self.locked_bytes, f"locked bytes {self.locked_bytes} != recomputed {locked}")
        require(self.used_bytes <= self.capacity_bytes, f"used {self.used_bytes} exceeds capacity {self.capacity_bytes}")
