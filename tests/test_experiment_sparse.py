"""``marconi experiment sparse`` end to end on a tiny synthetic configuration, and its parts.

The run goes through the CLI entry with the shared data set switched off (``MARCONI_SHARED_DATA=``),
so it is the same everywhere: ``quality`` takes its synthetic fallback and ``sharegpt`` is skipped.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from marconi.cli import main
from marconi.lab.sparse import (
    StudyConfig,
    Workload,
    block_sizes,
    findings,
    prompt_tree_trace,
    sequence_overlaps,
    study_workload,
    verdict,
)
from marconi.sim import simulate_system
from marconi.workloads import Request, Trace

pytestmark = pytest.mark.slow  # minutes of sweeps / processes: CI and `make test` only

WORKLOADS = ("doc-qa", "system-prompts", "quality")
BUDGETS = (1, 2, 4)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, list[dict]]:
    out = tmp_path_factory.mktemp("sparse")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MARCONI_SHARED_DATA", "")
        code = main(["experiment", "sparse", "--out", str(out), "--tiny", "--workloads", ",".join(WORKLOADS) + ",sharegpt",
                     "--budgets", ",".join(map(str, BUDGETS)), "--workers", "2", "--quiet"])
    assert code == 0
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    return out, records


def _sim(records, workload):
    return [r for r in records if r["kind"] == "simulation" and r["workload"] == workload]


def _analytic(records, workload, cost):
    return [r for r in records if r["kind"] == "analytic" and r["workload"] == workload and r["cost"] == cost]


def test_every_workload_strategy_and_budget_is_present(run):
    _, records = run
    assert {r["workload"] for r in records} == set(WORKLOADS)   # sharegpt: no data, no fallback -> skipped
    config = StudyConfig.for_run(tiny=True, budgets=BUDGETS)
    for w in WORKLOADS:
        sims = _sim(records, w)
        keys = {(r["strategy"], r["budget"], r["block"], r["break_even_tokens"]) for r in sims}
        trace = study_workload(w, "tiny").trace if w != "quality" else None
        for family in ("sparse-dp", "uniform", "sparse-dp+marconi"):
            assert {m for s, m, _, _ in keys if s == family} == set(BUDGETS), (w, family)
        assert {t for s, _, _, t in keys if s == "sparse-dp-lam"} == set(config.lam_tokens)
        blocks = {k for s, _, k, _ in keys if s == "every-block"}
        assert len(blocks) >= 2
        if trace is not None:
            assert blocks == set(block_sizes(trace, max(BUDGETS)))
        assert ("last-token", None, None, None) in keys and ("marconi", None, None, None) in keys
        assert len(sims) == len(keys)                            # one record per point
        for cost in ("tokens", "flops"):
            dp = {r["budget"] for r in _analytic(records, w, cost) if r["strategy"] == "sparse-dp"}
            assert dp == set(range(max(BUDGETS) + 1))
            assert {r["strategy"] for r in _analytic(records, w, cost)} == \
                {"sparse-dp", "uniform", "every-block", "last-token", "marconi"}


def test_records_echo_configuration_and_numbers_are_in_range(run):
    _, records = run
    for r in records:
        for key in ("workload", "trace", "trace_source", "strategy", "admission", "system", "model", "scale", "seed"):
            assert r[key] not in (None, ""), key
        assert r["budgets"] == list(BUDGETS)
    for r in (r for r in records if r["kind"] == "simulation"):
        assert r["capacity"] == "large" and r["num_cached_sequences"] == r["num_requests"]
        assert 0 <= r["token_hit_rate"] <= r["kv_hit_rate"] <= 1
        assert r["recomputed_tokens"] == r["kv_hit_tokens"] - r["reused_tokens"] >= 0
        assert 0 <= r["recomputed_flops"] <= r["input_flops"]
        assert r["recomputed_flops_fraction"] == pytest.approx(r["recomputed_flops"] / r["input_flops"])
        assert (r["recomputed_flops"] == 0) == (r["recomputed_tokens"] == 0)
        assert r["ssm_bytes_per_seq"] == pytest.approx(r["checkpoints_per_seq"] * r["ssm_checkpoint_bytes"])
        assert r["checkpoints_per_seq"] > 0.5                   # (almost) every sequence adds its last token
        if r["strategy"] in ("sparse-dp", "uniform"):
            assert r["checkpoints_per_seq"] <= r["budget"] + 1
        if r["strategy"] == "sparse-dp+marconi":
            assert r["checkpoints_per_seq"] <= r["budget"] + 2
        if r["strategy"] == "last-token":
            assert r["checkpoints_per_seq"] <= 1
    for r in (r for r in records if r["kind"] == "analytic"):
        assert 0 <= r["cost_share"] <= 1 + 1e-9 and r["expected_cost_per_pair"] >= 0
        assert r["num_pairs"] == r["num_sequences"] * (r["num_sequences"] + 1) // 2   # every later request


def test_dp_recomputes_no_more_than_uniform_on_document_qa(run):
    _, records = run
    for w in ("doc-qa", "quality"):
        sims = _sim(records, w)
        dp = {r["budget"]: r for r in sims if r["strategy"] == "sparse-dp"}
        uni = {r["budget"]: r for r in sims if r["strategy"] == "uniform"}
        for m in BUDGETS:
            assert dp[m]["recomputed_flops"] <= uni[m]["recomputed_flops"], (w, m)
            assert dp[m]["recomputed_tokens"] <= uni[m]["recomputed_tokens"], (w, m)
            assert dp[m]["token_hit_rate"] >= uni[m]["token_hit_rate"], (w, m)


def test_analytic_dp_frontier_is_below_every_heuristic(run):
    _, records = run
    for w in WORKLOADS:
        for cost in ("tokens", "flops"):
            recs = _analytic(records, w, cost)
            dp = {r["budget"]: r["expected_cost_per_pair"] for r in recs if r["strategy"] == "sparse-dp"}
            curve = [dp[m] for m in sorted(dp)]
            assert all(b <= a * (1 + 1e-9) for a, b in zip(curve, curve[1:]))   # more budget never costs more
            assert curve[-1] < curve[0]
            for h in (r for r in recs if r["strategy"] != "sparse-dp"):
                assert h["dp_cost_per_pair_at_equal_count"] <= h["expected_cost_per_pair"] * (1 + 1e-9) + 1e-9, h["label"]
                if h["strategy"] == "uniform":   # uniform(M) holds at most M positions besides the last token
                    assert dp[h["budget"]] <= h["expected_cost_per_pair"] * (1 + 1e-9) + 1e-9
            last = next(r for r in recs if r["strategy"] == "last-token")
            assert dp[0] == pytest.approx(last["expected_cost_per_pair"])   # M = 0 is the last token alone


def test_outputs_summary_and_plots(run):
    out, records = run
    summary = (out / "summary.md").read_text()
    for w in WORKLOADS:
        assert f"## {w} — simulation" in summary and f"## {w} — analytic" in summary
        png = out / "plots" / f"{w}_large_simulation.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (out / "plots" / f"{w}_analytic.png").stat().st_size > 1000
        for line in findings(records, w):
            assert line in summary
    assert "sharegpt: skipped" in summary and "FALLBACK" in summary
    for m in BUDGETS:
        assert f"| sparse-dp M={m} |" in summary and f"| uniform M={m} |" in summary
    # The table quotes the records: the DP's M=1 token hit rate on doc-qa appears as printed.
    dp1 = next(r for r in _sim(records, "doc-qa") if r["strategy"] == "sparse-dp" and r["budget"] == 1)
    row = next(line for line in summary.splitlines() if line.startswith("| sparse-dp M=1 |"))
    assert f"{100 * dp1['token_hit_rate']:.2f}%" in row
    assert not list(out.rglob("*.tmp"))


def test_outputs_can_be_redrawn_from_records(run, tmp_path):
    out, _ = run
    assert main(["experiment", "sparse", "--out", str(tmp_path), "--from-records", str(out / "records.jsonl")]) == 0
    before = (out / "summary.md").read_text()
    after = (tmp_path / "summary.md").read_text()
    # The same tables and findings; only the run's notes (skipped / fallback workloads) are not in the records.
    assert after[after.index("## Workloads"):] == before[before.index("## Workloads"):]
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == sorted(p.name for p in (out / "plots").iterdir())
    assert (tmp_path / "records.jsonl").read_text() == (out / "records.jsonl").read_text()


def test_a_record_matches_a_direct_simulation(run):
    _, records = run
    rec = next(r for r in _sim(records, "doc-qa") if r["strategy"] == "sparse-dp" and r["budget"] == 2)
    trace = study_workload("doc-qa", "tiny").trace
    result = simulate_system(trace, rec["system"], rec["model"], rec["capacity_bytes"], latency="zero")
    assert result.stats.unusable_tokens == rec["recomputed_tokens"]
    assert result.stats.checkpoints_admitted == rec["checkpoints_admitted"]


def test_sequence_overlaps_matches_pairwise_lcp():
    rng = np.random.default_rng(0)
    stem = rng.integers(3, 50, size=30)
    reqs = []
    for i in range(12):   # shared stems of random depth, some full repeats (continuations)
        cut = int(rng.integers(0, 31))
        inp = np.concatenate([stem[:cut], rng.integers(3, 6, size=int(rng.integers(1, 6)))])
        if i and rng.random() < 0.3:
            prev = reqs[-1]
            inp = np.concatenate([prev.input_tokens, prev.output_tokens, [7]])
        reqs.append(Request(0, i, float(i), inp, rng.integers(3, 6, size=int(rng.integers(0, 3)))))
    trace = Trace(reqs)
    seqs = [np.concatenate([r.input_tokens, r.output_tokens]) for r in reqs]

    def lcp(a, b):
        n = min(a.size, b.size)
        d = np.flatnonzero(a[:n] != b[:n])
        return int(d[0]) if d.size else n

    got = {i: (d.tolist(), b) for i, d, b in sequence_overlaps(trace)}
    assert set(got) == set(range(len(reqs) - 1))
    for i in got:
        want = [min(lcp(seqs[j], seqs[i]), reqs[j].input_len) for j in range(i + 1, len(reqs))]
        assert got[i][0] == want
        earlier = [lcp(seqs[i], seqs[k]) for k in range(i)]
        depth = max(earlier, default=0)
        branches = any(e == depth and seqs[k].size > depth for k, e in enumerate(earlier))
        assert got[i][1] == (depth if 0 < depth < seqs[i].size and branches else None)


def test_verdict_classifies_points():
    def point(strategy, ckpt, frac, **kw):
        return {"kind": "simulation", "workload": "w", "capacity": "large", "strategy": strategy,
                "checkpoints_per_seq": ckpt, "recomputed_flops_fraction": frac, "budget": kw.get("budget"),
                "block": kw.get("block"), "label": f"{strategy} {kw}"}
    recs = [point("sparse-dp", 2.0, 0.05, budget=1), point("sparse-dp", 3.0, 0.01, budget=2),
            point("uniform", 2.0, 0.40, budget=1), point("uniform", 3.0, 0.20, budget=2),
            point("every-block", 4.0, 0.0101, block=64), point("every-block", 2.5, 0.30, block=256),
            point("marconi", 1.5, 0.015)]
    v = verdict(recs, "w")
    assert [s for _, s, _ in v.block] == ["tie-fewer", "better"]   # sorted by K
    assert v.dominates and not v.worse
    assert v.marconi_enough and v.marconi_gap == pytest.approx(0.005)
    assert v.marconi_beats_dp_at_density            # no DP point is as sparse as Marconi's 1.5
    recs.append(point("every-block", 1.2, 0.02, block=1024))       # denser DP points only: block wins here
    v = verdict(recs, "w")
    assert not v.dominates and v.worse == ("every-block {'block': 1024}",)


def test_prompt_tree_depths_and_config_errors():
    trace = prompt_tree_trace(num_sessions=30, base_len=50, variant_lens=(10, 30), sub_variant_lens=(7,), seed=1)
    assert sorted(trace.meta["prompt_depths"]) == [60, 67, 80, 87]
    for r in trace:
        depth = trace.meta["prompt_depths"][trace.meta["prompt_of_session"][r.session_id]]
        assert r.input_len > depth
    with pytest.raises(ValueError, match="unknown workload"):
        StudyConfig(workloads=("nope",))
    with pytest.raises(ValueError, match="budgets"):
        StudyConfig(budgets=(4, 2))
    assert isinstance(study_workload("doc-qa", "tiny"), Workload)
