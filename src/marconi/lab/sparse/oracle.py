"""The analytic view: the DP's own problem on the empirical ("oracle") overlap distribution.

Each request's cached sequence ``S_i`` (input + output, ``T_i`` tokens) is overlapped by every
later request ``j`` to depth ``d_ij = min(LCP(S_j, S_i), len(input_j))``; ``P_i`` is the histogram
of those depths. Every strategy keeps the last token ``T_i`` for free; ``sparse-dp`` places M more
by :func:`~marconi.sparse.place_checkpoints` on ``P_i`` (its whole ``cost_by_budget`` curve), the
heuristics' positions come from their admission policies' ``final_plan`` (Marconi's branch point is
where ``S_i`` leaves the tree of earlier sequences), and are scored by
:func:`~marconi.sparse.expected_cost`. Costs are summed over all (sequence, later request) pairs
and reported per pair, in tokens and in FLOPs (the DP is solved for each).

Checkpoints are counted two ways: ``checkpoints_per_seq``, each sequence's own (what its budget
caps), and ``shared_checkpoints_per_seq``, distinct states over all sequences per sequence: a
checkpoint after ``p`` tokens of ``S_i`` is the state of the prefix ``S_i[:p]``, so one that
several sequences place at the same shared prefix (a document's end under its questions) is one
state, counted once, as the simulation counts a shared node once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from marconi.core.admission import AdmissionContext, MatchResult, make_admission
from marconi.lab.sparse.strategies import Strategy
from marconi.lab.sparse.workloads import Workload
from marconi.core.model import ModelSpec
from marconi.sparse import TOKEN_COST, PotentialCost, expected_cost, flops_cost, place_checkpoints
from marconi.workloads.trace import Trace

__all__ = ["analytic_records", "sequence_overlaps", "prefix_ids"]


class _SortedSequences:
    """LCPs of one sequence with all others from one lexicographic sort (``n - 1`` comparisons).

    In lexicographic order, ``LCP(a, c) = min`` of the adjacent LCPs between them, so one row of
    LCPs is two running minima outward from the sequence's rank.
    """

    def __init__(self, seqs: Sequence[np.ndarray]) -> None:
        # Big-endian bytes of non-negative int32 compare like the token sequences themselves.
        keys = [np.ascontiguousarray(s, dtype=">i4").tobytes() for s in seqs]
        self.order = np.array(sorted(range(len(seqs)), key=keys.__getitem__), dtype=np.int64)
        del keys
        self.rank = np.empty_like(self.order)
        self.rank[self.order] = np.arange(self.order.size)
        self.lengths = np.array([s.size for s in seqs], dtype=np.int64)
        self.adjacent = np.array([_lcp(seqs[a], seqs[b]) for a, b in zip(self.order[:-1], self.order[1:])],
                                 dtype=np.int64)

    def row(self, i: int) -> np.ndarray:
        """``(n,)`` LCP of sequence ``i`` with every sequence (itself: its length), by sequence index."""
        r = int(self.rank[i])
        left = np.minimum.accumulate(self.adjacent[:r][::-1])[::-1]      # sorted ranks 0..r-1
        right = np.minimum.accumulate(self.adjacent[r:])                 # sorted ranks r+1..n-1
        by_rank = np.concatenate([left, [self.lengths[i]], right])
        return by_rank[self.rank]


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.size, b.size)
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def sequence_overlaps(trace: Trace) -> Iterator[tuple[int, np.ndarray, int | None]]:
    """For each request ``i`` with later requests: ``(i, depths, branch_len)``.

    ``depths[j'] = min(LCP(S_j, S_i), len(input_j))`` for the later requests ``j`` (``S`` = input +
    output): how deep each overlaps ``S_i``. ``branch_len``: where ``S_i`` leaves the radix tree of the
    earlier sequences (Marconi's branch point), None when it only extends a path or shares nothing.
    """
    seqs = [np.concatenate([r.input_tokens, r.output_tokens]) for r in trace]
    input_lens = trace.input_lens()
    index = _SortedSequences(seqs)
    for i in range(len(seqs) - 1):
        lcp = index.row(i)
        depths = np.minimum(lcp[i + 1:], input_lens[i + 1:])
        earlier, earlier_lens = lcp[:i], index.lengths[:i]
        branch = int(earlier.max()) if i else 0
        continues = bool(np.any((earlier == branch) & (earlier_lens > branch))) if i else False
        yield i, depths, (branch if 0 < branch < seqs[i].size and continues else None)


def prefix_ids(seq: np.ndarray, positions: Iterable[int]) -> dict[int, int]:
    """``{p: id of the prefix seq[:p]}`` for each position (one pass over ``seq``): equal prefixes,
    of this or any other sequence, get equal ids (a 64-bit BLAKE2b digest of the tokens)."""
    h = hashlib.blake2b(digest_size=8)
    data = np.ascontiguousarray(seq, dtype=np.int32)
    out, done = {}, 0
    for p in sorted(set(positions)):
        h.update(data[done:p].tobytes())
        done = p
        out[p] = int.from_bytes(h.copy().digest(), "little")
    return out


@dataclass(slots=True)
class _Tally:
    """Sums over (sequence, later request) pairs for one analytic strategy and cost; ``ids``: the
    distinct checkpoint states it placed over all sequences (:func:`prefix_ids`)."""

    cost: float = 0.0
    dp_at_count: float = 0.0
    checkpoints: float = 0.0
    sequences: int = 0
    ids: set[int] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class _Heuristic:
    strategy: Strategy
    plan: Callable[[AdmissionContext, int], tuple[int, ...]]


def _heuristics(strategies: Sequence[Strategy]) -> list[_Heuristic]:
    out = []
    for s in strategies:
        if s.policy == "sparse-dp":
            continue
        policy = make_admission(s.admission)
        out.append(_Heuristic(s, lambda ctx, total, p=policy: tuple(p.final_plan(ctx, total).checkpoints)))
    return out


def analytic_records(workload: Workload, strategies: Sequence[Strategy], spec: ModelSpec,
                     max_budget: int) -> list[dict[str, Any]]:
    """The DP's frontier on each sequence's oracle ``P_i`` vs the heuristics' positions (module doc)."""
    costs: dict[str, PotentialCost] = {"tokens": TOKEN_COST, "flops": flops_cost(spec)}
    heuristics = _heuristics(strategies)
    dp = {c: [_Tally() for _ in range(max_budget + 1)] for c in costs}
    tallies = {(h.strategy.label, c): _Tally() for h in heuristics for c in costs}
    no_ckpt = dict.fromkeys(costs, 0.0)
    num_pairs = num_sequences = 0
    for i, depths, branch in sequence_overlaps(workload.trace):
        req = workload.trace[i]
        total_len = req.input_len + req.output_len
        seq = np.concatenate([req.input_tokens, req.output_tokens])
        weights = np.bincount(depths, minlength=total_len + 1).astype(np.float64)
        ctx = AdmissionContext(req.input_tokens, req.input_len, MatchResult(req.input_len, 0, 0), branch, spec, i)
        plans = [(h, sorted({p for p in h.plan(ctx, total_len) if 1 <= p <= total_len})) for h in heuristics]
        extra_needed = max([max_budget] + [len(pos) - (total_len in pos) for _, pos in plans])
        num_pairs += depths.size
        num_sequences += 1
        curves = {name: _dp_curve(weights, total_len, cost, extra_needed) for name, cost in costs.items()}
        ids = prefix_ids(seq, [p for _, pos in plans for p in pos]
                         + [p for _, placed in curves.values() for ps in placed[:max_budget + 1] for p in ps])
        for name, cost in costs.items():
            no_ckpt[name] += float(np.sum(cost.potential(depths.astype(np.float64))))
            curve, placed = curves[name]
            for m in range(max_budget + 1):
                t = dp[name][m]
                t.cost += curve[m]
                t.checkpoints += len(placed[m])
                t.sequences += 1
                t.ids.update(ids[p] for p in placed[m])
            for h, pos in plans:
                t = tallies[(h.strategy.label, name)]
                t.cost += expected_cost(weights, pos, cost=cost) * depths.size
                t.dp_at_count += curve[min(len(pos) - (total_len in pos), len(curve) - 1)]
                t.checkpoints += len(pos)
                t.sequences += 1
                t.ids.update(ids[p] for p in pos)
    base = {"kind": "analytic", **workload.describe(), "model": spec.name, "ssm_checkpoint_bytes": spec.ssm_checkpoint_bytes,
            "num_sequences": num_sequences, "num_pairs": num_pairs}
    records = []
    for name in costs:
        for m, t in enumerate(dp[name]):
            s = Strategy("sparse-dp", "sparse-dp", (("m", m), ("marconi", False)), budget=m)
            records.append(_analytic_record(base, s, name, t, num_pairs, no_ckpt[name], dp_at_count=t.cost))
        for h in heuristics:
            t = tallies[(h.strategy.label, name)]
            records.append(_analytic_record(base, h.strategy, name, t, num_pairs, no_ckpt[name], t.dp_at_count))
    return records


def _dp_curve(weights: np.ndarray, total_len: int, cost: PotentialCost,
              max_extra: int) -> tuple[np.ndarray, list[tuple[int, ...]]]:
    """Least total cost over this sequence's pairs with at most ``m`` checkpoints besides the free
    last token (``m = 0..max_extra``), and the positions it uses (the last token included)."""
    free = weights.copy()
    free[total_len] = 0.0                      # served by the last-token checkpoint every strategy keeps
    mass = float(free.sum())
    candidates = np.flatnonzero(free[1:total_len]) + 1
    if mass <= 0 or candidates.size == 0:
        return np.zeros(max_extra + 1), [(total_len,)] * (max_extra + 1)
    plc = place_checkpoints(free, candidates, min(max_extra, int(candidates.size)), cost=cost)
    curve = np.array(plc.cost_by_budget) * mass
    placed = [(*map(int, p), total_len) for p in plc.positions_by_budget]
    pad = max_extra + 1 - curve.size
    return np.pad(curve, (0, pad), mode="edge"), placed + [placed[-1]] * pad


def _analytic_record(base: dict[str, Any], strategy: Strategy, cost_name: str, t: _Tally, num_pairs: int,
                     no_ckpt: float, dp_at_count: float) -> dict[str, Any]:
    per_seq = t.checkpoints / max(1, t.sequences)
    return {**base, **strategy.describe(), "cost": cost_name,
            "shared_checkpoints_per_seq": len(t.ids) / max(1, t.sequences),
            "expected_cost_per_pair": t.cost / max(1, num_pairs),
            "cost_share": t.cost / no_ckpt if no_ckpt > 0 else 0.0,
            "dp_cost_per_pair_at_equal_count": dp_at_count / max(1, num_pairs),
            "dp_cost_share_at_equal_count": dp_at_count / no_ckpt if no_ckpt > 0 else 0.0,
            "checkpoints_per_seq": per_seq, "ssm_bytes_per_seq": per_seq * base["ssm_checkpoint_bytes"]}
