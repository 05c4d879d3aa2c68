"""The overlap estimator on a drift trace: QuALITY-style documents whose question depths shift halfway.

:func:`drift_trace` joins two :func:`~marconi.workloads.synthetic.doc_qa_trace` phases over the same
documents (same seed, so the same instruction and document tokens): in the first, questions
diverge from their document at the ``before`` fractions of it, in the second at the ``after``
fractions. :func:`drift_records` replays it through each system at an unbounded capacity and
reports, per window of requests, the share of prefill FLOPs recomputed (KV found, no state deep
enough), so the plot shows how fast each estimator recovers after the shift::

    marconi experiment sparse --drift --out results/sparse-drift
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from marconi.core.model import ModelSpec
from marconi.sparse import flops_cost
from marconi.workloads.synthetic import doc_qa_trace
from marconi.workloads.trace import Request, Trace

__all__ = ["DRIFT_SYSTEMS", "drift_records", "drift_trace", "plot_drift"]

LARGE_CAPACITY_BYTES = 2 ** 60

DRIFT_SYSTEMS: dict[str, str] = {
    "prefix (first estimator)": "custom:admission=sparse-dp(m=2;marconi=false;estimator=prefix),eviction=lru",
    "tree": "custom:admission=sparse-dp(m=2;marconi=false),eviction=lru",
    "tree, re-place on any drift": "custom:admission=sparse-dp(m=2;marconi=false;drift=0),eviction=lru",
    "tree, never re-place": "custom:admission=sparse-dp(m=2;marconi=false;drift=1),eviction=lru",
    "tree, time decay 60 s": "custom:admission=sparse-dp(m=2;marconi=false;half_life_s=60),eviction=lru",
    "marconi": "custom:admission=marconi,eviction=lru",
}
"""Label -> system of the drift study (every sparse-dp point at M = 2 without Marconi's branch point)."""


def drift_trace(num_docs: int = 6, doc_len: int = 6000, questions_per_phase: int = 24,
                before: Sequence[float] = (0.75, 1.0), after: Sequence[float] = (0.25, 0.5),
                instruction_len: int = 64, seed: int = 0) -> Trace:
    """Two doc-QA phases on the same documents; phase 2 starts after phase 1's last arrival.

    ``meta["phase_of_request"]`` is 0 or 1 per request (trace order); ``meta["shift_index"]`` the
    first request of phase 2. Phase-2 turns continue phase 1's numbering per document.
    """
    common = dict(num_docs=num_docs, doc_len=doc_len, questions_per_doc=questions_per_phase,
                  instruction_len=instruction_len, question_len=75.0, answer_len=18.0, seed=seed)
    first = doc_qa_trace(depth_fractions=before, **common)
    second = doc_qa_trace(depth_fractions=after, **common)
    offset = first.requests[-1].ts if len(first) else 0.0
    requests = list(first.requests) + [Request(r.session_id, r.turn_id + questions_per_phase, r.ts + offset,
                                               r.input_tokens, r.output_tokens) for r in second.requests]
    meta = {"source": "synthetic", "kind": "doc-qa-drift",
            "params": {**common, "before": list(before), "after": list(after)},
            "phase_of_request": [0] * len(first) + [1] * len(second), "shift_index": len(first)}
    return Trace(requests, name=f"synthetic-doc-qa-drift-seed{seed}", meta=meta)


def drift_records(trace: Trace, spec: ModelSpec, systems: dict[str, str] | None = None,
                  window: int = 24) -> list[dict[str, Any]]:
    """One record per (system, window of ``window`` requests) and one per (system, phase)."""
    from marconi.sim import simulate_system

    potential = flops_cost(spec).potential
    phase = np.asarray(trace.meta["phase_of_request"])
    input_flops = potential(trace.input_lens().astype(np.float64))
    records = []
    for label, system in (systems or DRIFT_SYSTEMS).items():
        result = simulate_system(trace, system, spec, LARGE_CAPACITY_BYTES, latency="zero")
        recomputed = (potential(result.kv_hit_len.astype(np.float64))
                      - potential(result.reused_len.astype(np.float64)))
        st = result.stats
        echo = {"kind": "drift", "label": label, "system": system, "model": spec.name, "trace": trace.name,
                "shift_index": trace.meta["shift_index"], "checkpoints_admitted": st.checkpoints_admitted,
                "checkpoints_per_seq": st.checkpoints_admitted / max(1, st.num_requests)}
        for start in range(0, len(trace), window):
            sl = slice(start, min(start + window, len(trace)))
            records.append({**echo, "scope": "window", "first_request": start,
                            "phase": int(phase[sl].max()),
                            "recomputed_flops_fraction": float(recomputed[sl].sum() / input_flops[sl].sum())})
        for p in (0, 1):
            mask = phase == p
            records.append({**echo, "scope": "phase", "phase": p, "first_request": int(np.argmax(mask)),
                            "recomputed_flops_fraction": float(recomputed[mask].sum() / input_flops[mask].sum())})
    return records


def plot_drift(records: list[dict[str, Any]], path: str) -> None:
    """Recomputed-FLOPs share per window, one line per system, the shift marked."""
    from marconi.report import pyplot, save_figure

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(8, 4.5))
    labels = list(dict.fromkeys(r["label"] for r in records))
    for label in labels:
        rows = [r for r in records if r["label"] == label and r["scope"] == "window"]
        ax.plot([r["first_request"] for r in rows], [100 * r["recomputed_flops_fraction"] for r in rows],
                marker="o", ms=3, label=label)
    shift = next((r["shift_index"] for r in records), None)
    if shift is not None:
        ax.axvline(shift, color="grey", ls="--", lw=1)
        ax.text(shift, ax.get_ylim()[1] * 0.95, " depths shift", color="grey", va="top")
    ax.set_xlabel("request (window start)")
    ax.set_ylabel("prefill FLOPs recomputed (%)")
    ax.set_title("sparse-dp (M=2) on a drift trace: questions move from 3/4..1 to 1/4..1/2 of the document")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)    # atomic: a cut-short PNG is never left
