"""The sparse study's analytic view counts a checkpoint shared by many sequences once (as its
simulation counts a shared node once), beside each sequence's own count; and its report states
the density-slack rule in plain words."""

from __future__ import annotations

import numpy as np
import pytest

from marconi.core.model import get_model
from marconi.lab.sparse.oracle import analytic_records, prefix_ids
from marconi.lab.sparse.report import summary_markdown
from marconi.lab.sparse.workloads import Workload
from marconi.workloads import Request, Trace


def test_prefix_ids_name_the_prefix_not_the_sequence() -> None:
    a = np.arange(10, 30)
    b = np.concatenate([a[:12], [1, 2, 3]])
    ia, ib = prefix_ids(a, [12, 5, 20]), prefix_ids(b, [12, 15])
    assert ia[12] == ib[12] and ia[5] != ia[12] and ia[20] != ib[15]


def _doc_qa() -> Workload:
    """Four questions on one 40-token document: each earlier sequence is overlapped by the later
    questions to the document's end, so the DP with one checkpoint places it there on all three."""
    rng = np.random.default_rng(0)
    doc = rng.integers(100, 200, size=40)
    reqs = [Request(k, 0, float(k), np.concatenate([doc, rng.integers(3, 50, size=6)]), rng.integers(3, 50, size=2))
            for k in range(4)]
    return Workload("doc", Trace(reqs, name="doc"), "test")


def test_a_checkpoint_shared_by_sequences_counts_once() -> None:
    recs = analytic_records(_doc_qa(), [], get_model("paper-7b"), max_budget=1)
    dp = {r["budget"]: r for r in recs if r["cost"] == "tokens" and r["strategy"] == "sparse-dp"}
    assert dp[0]["checkpoints_per_seq"] == dp[0]["shared_checkpoints_per_seq"] == 1.0   # distinct last tokens
    assert dp[1]["checkpoints_per_seq"] == 2.0                      # each sequence: the document's end + its last token
    assert dp[1]["shared_checkpoints_per_seq"] == pytest.approx(4 / 3)   # the document's end is one state for all three
    assert dp[1]["cost_share"] < dp[0]["cost_share"]


def test_the_summary_states_the_density_slack_and_the_shared_count() -> None:
    base = {"kind": "analytic", "workload": "doc", "model": "paper-7b", "ssm_checkpoint_bytes": 1, "scale": "tiny",
            "budgets": [1], "trace_source": "test", "num_requests": 4, "num_sessions": 4, "input_tokens": 184}
    recs = [{**base, **r} for r in analytic_records(_doc_qa(), [], get_model("paper-7b"), max_budget=1)]
    text = summary_markdown(recs)
    assert "at most 1.02x the heuristic's checkpoints per sequence (2% more)" in text
    assert "under 1/1.02 of them" in text and "`shared once` counts distinct states" in text
    assert "| shared once |" in text
