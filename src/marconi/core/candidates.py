"""The eviction candidates as parallel numpy arrays (a victim in a few vectorised operations, no tree
walk), and their FLOP efficiency (paper §4.2: FLOPs a hit saves ÷ bytes held), read by a rule
through a :class:`CandidateTable`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Hashable, Mapping, Sequence

import numpy as np

if TYPE_CHECKING:
    from marconi.core.model import ModelSpec
    from marconi.core.radix import Node

__all__ = ["CandidateSet", "CandidateTable", "LazyEfficiency", "flop_efficiency", "flop_efficiency_array"]


class CandidateSet:
    """Evictable nodes as parallel arrays (:attr:`COLUMNS`: both recency signals, the policy's FLOP
    efficiency, and shape); O(1) add/remove by swap-remove."""

    COLUMNS: tuple[tuple[str, Any], ...] = (
        ("last_access", np.float64), ("access_seq", np.int64), ("path_access", np.float64),
        ("path_seq", np.int64), ("flop_eff", np.float64), ("depth", np.int64), ("edge_len", np.int64),
        ("has_ssm", np.bool_), ("leaf", np.bool_))

    def __init__(self, capacity: int = 64) -> None:
        self.nodes: list[Node] = []
        for name, dtype in self.COLUMNS:
            setattr(self, name, np.zeros(capacity, dtype=dtype))

    def __len__(self) -> int:
        return len(self.nodes)

    @classmethod
    def of(cls, keys: Sequence[Hashable], **columns: Any) -> "CandidateSet":
        """A read-only set over an engine's ``keys`` (in ``nodes``) filled from ``columns`` (name -> one
        value per key; others 0/False). ValueError for an unknown column or one of another length."""
        n = len(keys)
        out = cls(max(n, 1))
        unknown = set(columns) - {name for name, _ in cls.COLUMNS}
        if unknown:
            raise ValueError(f"unknown candidate columns {sorted(unknown)}")
        for name, values in columns.items():
            array = np.asarray(values)
            if array.shape != (n,):
                raise ValueError(f"candidate column {name!r}: {array.shape[0] if array.ndim else 0} values "
                                 f"for {n} candidates")
            getattr(out, name)[:n] = array
        out.nodes = list(keys)  # type: ignore[arg-type]
        return out

    def _grow(self) -> None:
        size = 2 * len(self.last_access)
        for name, _ in self.COLUMNS:
            old = getattr(self, name)
            new = np.zeros(size, dtype=old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)

    def _write(self, i: int, node: "Node") -> None:
        self.last_access[i] = node.last_access
        self.access_seq[i] = node.access_seq
        self.path_access[i] = node.path_access
        self.path_seq[i] = node.path_seq
        self.flop_eff[i] = node.flop_eff
        self.depth[i] = node.depth
        self.edge_len[i] = len(node.tokens)
        self.has_ssm[i] = node.has_ssm
        self.leaf[i] = not node.children

    def add(self, node: "Node") -> None:
        i = len(self.nodes)
        if i == len(self.last_access):
            self._grow()
        self.nodes.append(node)
        node.slot = i
        self._write(i, node)

    def remove(self, node: "Node") -> None:
        i = node.slot
        assert i is not None and self.nodes[i] is node
        last = len(self.nodes) - 1
        moved = self.nodes[last]
        if i != last:
            self.nodes[i] = moved
            moved.slot = i
            for name, _ in self.COLUMNS:
                column = getattr(self, name)
                column[i] = column[last]
        self.nodes.pop()
        node.slot = None

    def refresh(self, node: "Node") -> None:
        """Copy a candidate's recency, efficiency and shape into the arrays after they changed."""
        i = node.slot
        if i is not None:
            self._write(i, node)

    def stale_columns(self, node: "Node") -> list[str]:
        """Columns whose stored value differs from the node's (for ``check_invariants``)."""
        i = node.slot
        assert i is not None
        fresh = CandidateSet(1)
        fresh._write(0, node)
        return [name for name, _ in self.COLUMNS if getattr(fresh, name)[0] != getattr(self, name)[i]]


def flop_efficiency(spec: "ModelSpec", depth: int, edge_len: int, has_ssm: bool, variant: str) -> float:
    """FLOPs saved per byte held (>= 0) by a node ending at ``depth`` whose edge is ``edge_len``
    tokens; bytes = its SSM checkpoint (if any) + its whole prefix's KVs. ``variant``: ``"total"``
    (the whole prefix's FLOPs, the paper's) or ``"marginal"`` (the edge's only)."""
    held = spec.kv_bytes(depth) + (spec.ssm_checkpoint_bytes if has_ssm else 0)
    if held == 0:
        return 0.0
    if variant == "total":
        saved = spec.prefill_flops(depth)
    else:
        saved = spec.span_flops(depth - edge_len, depth)
    return saved / held


def flop_efficiency_array(spec: "ModelSpec", depth: np.ndarray, edge_len: np.ndarray, has_ssm: np.ndarray,
                          variant: str) -> np.ndarray:
    """:func:`flop_efficiency` of many nodes at once, bit for bit (the ModelSpec's formulas run
    elementwise in the same order; integers stay exact below 2**53)."""
    depth_f = depth.astype(np.float64)
    held = (depth * spec.kv_bytes_per_token + np.where(has_ssm, spec.ssm_checkpoint_bytes, 0)).astype(np.float64)
    if variant == "total":
        saved = spec.prefill_flops(depth_f)  # type: ignore[arg-type]
    else:
        saved = spec.span_flops((depth - edge_len).astype(np.float64), depth_f)  # type: ignore[arg-type]
    out = np.zeros_like(held)
    np.divide(saved, held, out=out, where=held > 0)
    return out


class LazyEfficiency(dict):
    """FLOP efficiency per variant of a set's first ``n`` candidates: those given, others computed from
    the shape columns on first use (by ``spec`` or ``compute``; KeyError naming the variant without)."""

    def __init__(self, given: Mapping[str, np.ndarray], *, spec: "ModelSpec | None" = None,
                 cands: CandidateSet | None = None, compute: Callable[[str], np.ndarray] | None = None) -> None:
        super().__init__(given)
        self._spec, self._cands, self._compute = spec, cands, compute

    def __missing__(self, variant: str) -> np.ndarray:
        if self._compute is not None:
            value = np.asarray(self._compute(variant), dtype=np.float64)
        elif self._spec is not None and self._cands is not None:
            c, n = self._cands, len(self._cands)
            value = flop_efficiency_array(self._spec, c.depth[:n], c.edge_len[:n], c.has_ssm[:n], variant)
        else:
            raise KeyError(variant)
        self[variant] = value
        return value


class CandidateTable:
    """The candidates one victim is chosen among (the first ``len(cands)`` rows), read-only:
    ``recency(touch)``, ``efficiency[variant]`` (computed on first use), ``leaf`` and shape."""

    __slots__ = ("cands", "efficiency")

    def __init__(self, cands: CandidateSet, efficiency: Mapping[str, np.ndarray]) -> None:
        self.cands = cands
        self.efficiency = efficiency

    def __len__(self) -> int:
        return len(self.cands)

    def recency(self, touch: str) -> tuple[np.ndarray, np.ndarray]:
        """``(last access time, access order)`` per candidate under ``touch`` (``hit`` or ``path``)."""
        c, n = self.cands, len(self.cands)
        if touch == "hit":
            return c.last_access[:n], c.access_seq[:n]
        if touch == "path":
            return c.path_access[:n], c.path_seq[:n]
        raise ValueError(f"touch must be hit or path, got {touch!r}")

    @property
    def leaf(self) -> np.ndarray:
        return self.cands.leaf[: len(self.cands)]

    @property
    def depth(self) -> np.ndarray:
        return self.cands.depth[: len(self.cands)]

    @property
    def edge_len(self) -> np.ndarray:
        return self.cands.edge_len[: len(self.cands)]

    @property
    def has_ssm(self) -> np.ndarray:
        return self.cands.has_ssm[: len(self.cands)]
