"""``marconi experiment headroom``: the decomposition adds up, the replays are the simulator's,
the steps know only what they claim to know, and entry kinds and sessions are read correctly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from marconi.cli import main
from marconi.core.cache import ManualClock
from marconi.core.model import get_model
from marconi.lab.headroom import (DECOMPOSITION, DIMENSIONS, VARIANTS, anatomy, breakdown_rows, build_variant,
                                          derive_sessions, replay, run_point, trace_sessions)
from marconi.lab.headroom.sessions import PrefixHasher
from marconi.lab.headroom.variants import default_system, future_of
from marconi.sim.oracle import NEVER, FutureIndex
from marconi.sim.replay import simulate_system, working_set_bytes
from marconi.workloads import build_workload
from marconi.workloads.trace import Request, Trace

MODEL = "paper-7b"


@pytest.fixture(scope="module")
def swe() -> Trace:
    return build_workload("swe-sample").head(150)


@pytest.fixture(scope="module")
def point(swe: Trace) -> tuple[list[dict], list[dict], int]:
    capacity = int(0.05 * working_set_bytes(swe, MODEL))
    records, rows = run_point(swe, {"trace": "swe-sample", "capacity": "0.05x"}, MODEL, capacity)
    return records, rows, capacity


def _req(session: int, turn: int, ts: float, tokens, output=()) -> Request:
    return Request(session, turn, ts, np.asarray(tokens, dtype=np.int32), np.asarray(output, dtype=np.int32))


# ---------------------------------------------------------------------------- the decomposition adds up
def test_the_parts_sum_to_the_gap(point) -> None:
    records, _, _ = point
    p = records[0]
    reused = p["reused_tokens"]
    assert p["gap_tokens"] == reused["oracle"] - reused["default"] == p["gained_tokens"] - p["lost_tokens"]
    assert p["gap_tokens"] > 0, "at 0.05x the oracle should be ahead on this trace (else the test checks nothing)"
    parts = p["decomposition_pp"]
    assert set(parts) == {name for name, _, _ in DECOMPOSITION}
    assert sum(parts.values()) == pytest.approx(p["gap_pp"], abs=1e-9)
    assert p["gap_pp"] == pytest.approx(100 * (p["hit_rate"]["oracle"] - p["hit_rate"]["default"]), abs=1e-9)


@pytest.mark.parametrize("dimension", [d for d, _ in DIMENSIONS])
def test_every_breakdown_sums_to_the_gap(point, dimension: str) -> None:
    records, _, _ = point
    p = records[0]
    rows = [r for r in records if r["kind"] == "breakdown" and r["dimension"] == dimension]
    assert rows
    assert sum(r["net_tokens"] for r in rows) == p["gap_tokens"]
    assert sum(r["gained_tokens"] for r in rows) == p["gained_tokens"]
    assert sum(r["lost_tokens"] for r in rows) == p["lost_tokens"]
    assert sum(r["requests_gained"] for r in rows) == p["requests_gained"]
    assert sum(r["requests_lost"] for r in rows) == p["requests_lost"]
    assert sum(r["requests"] for r in rows) == p["num_requests"]
    assert sum(r["net_share"] for r in rows) == pytest.approx(1.0)
    assert len({r["bucket"] for r in rows}) == len(rows), "a bucket listed twice"


def test_request_rows_are_the_requests_that_differ(point) -> None:
    records, rows, _ = point
    p = records[0]
    assert len(rows) == p["requests_gained"] + p["requests_lost"]
    assert sum(r["oracle_reused"] - r["default_reused"] for r in rows) == p["gap_tokens"]
    for r in rows:
        assert r["oracle_entry"]["depth"] == r["oracle_reused"] and r["default_entry"]["depth"] == r["default_reused"]
        assert r["oracle_kv_hit"] >= r["oracle_reused"] and r["default_kv_hit"] >= r["default_reused"]
        assert r["oracle_entry"]["kind"] in ("last-token", "branch", "none")


# ---------------------------------------------------------------------------- the replays are the simulator's
def test_default_and_oracle_replays_match_the_simulator(swe: Trace, point) -> None:
    records, _, capacity = point
    p = records[0]
    for variant, system in (("default", "marconi"), ("oracle", "oracle")):
        sim = simulate_system(swe, system, MODEL, capacity)
        assert p["reused_tokens"][variant] == sim.stats.reused_tokens, variant
        assert p["hit_rate"][variant] == pytest.approx(sim.stats.token_hit_rate)


def test_with_room_for_everything_every_variant_is_the_infinite_cache(swe: Trace) -> None:
    """The filtered admission declines only what no later request uses, and dead-first evicts only
    such entries: with no pressure none of it may cost a hit."""
    trace = swe.head(60)
    infinite = simulate_system(trace, "infinite", MODEL, 1).stats.reused_tokens
    records, rows = run_point(trace, {"trace": "t", "capacity": "big"}, MODEL, 2 ** 50)
    assert set(records[0]["reused_tokens"].values()) == {infinite}
    assert rows == [] and records[0]["gap_tokens"] == 0


def test_the_filtered_admission_admits_only_states_a_later_request_resumes_from(swe: Trace) -> None:
    trace = swe.head(80)
    spec, future = get_model(MODEL), future_of(trace)
    capacity = 0.05 * working_set_bytes(trace, spec)
    runs = {}
    for variant in ("default", "admission"):
        clock = ManualClock()
        cache = build_variant(variant, default_system("marconi"), spec, capacity, lambda: future, clock)
        runs[variant] = replay(trace, cache, clock, variant)
    declined = 0
    for i, req in enumerate(trace):
        seq = np.concatenate((req.input_tokens, req.output_tokens))
        for p in runs["admission"].admitted[i]:
            assert FutureIndex.next_after(future.requests_through(seq[:p]), i) != NEVER, (i, p)
        declined += sum(FutureIndex.next_after(future.requests_through(seq[:p]), i) == NEVER
                        for p in runs["default"].admitted[i])
    assert declined > 0, "the default admitted no dead state here: the check above checked nothing"


# ---------------------------------------------------------------------------- kinds and sessions
def test_entry_kinds_last_token_and_branch() -> None:
    system = list(range(1000, 1400))
    trace = [
        _req(0, 0, 0.0, system + [1, 2, 3], [4, 5]),
        _req(0, 1, 1.0, system + [1, 2, 3, 4, 5, 6, 7], [8]),   # resumes at the end of request 0: last-token
        _req(1, 0, 2.0, system + [9, 9, 9], [7]),                # leaves request 0's path: a branch at len(system)
        _req(2, 0, 3.0, system + [5, 5], [1]),                   # resumes from that branch state
    ]
    spec = get_model(MODEL)
    clock = ManualClock()
    cache = build_variant("default", default_system("marconi"), spec, 2 ** 40, lambda: future_of(trace), clock)
    run = replay(trace, cache, clock, "default")
    assert run.usable.tolist() == [0, 405, 0, 400]
    a = anatomy(trace, run, run, spec)
    assert a.o_kind.tolist() == ["none", "last-token", "none", "branch"]
    assert a.net_tokens == 0 and all(r["net_tokens"] == 0 for r in breakdown_rows(a, "entry_kind"))


def test_sessions_from_the_trace_and_from_the_tokens() -> None:
    a_sys, b_sys = list(range(100, 400)), list(range(500, 800))
    trace = [
        _req("a", 0, 0.0, a_sys + [1], [2]),
        _req("b", 0, 5.0, b_sys + [1], [3]),
        _req("a", 1, 7.0, a_sys + [1, 2, 4], [5]),
        _req("b", 1, 20.0, b_sys + [1, 3, 6], [7]),
        _req("c", 0, 30.0, list(range(900, 1200)), [1]),
    ]
    t = trace_sessions(trace)
    assert t.session.tolist() == [0, 1, 0, 1, 2] and t.turn.tolist() == [0, 0, 1, 1, 0]
    assert np.isnan(t.since_last_s[[0, 1, 4]]).all() and t.since_last_s[[2, 3]].tolist() == [7.0, 15.0]
    d = derive_sessions(trace)
    assert d.predecessor.tolist() == [-1, -1, 0, 1, -1]
    assert d.turn.tolist() == [0, 0, 1, 1, 0]
    assert len(set(d.session[[0, 2]])) == 1 and len(set(d.session.tolist())) == 3
    assert d.shared_len.tolist()[2:4] == [302, 302]


def test_prefix_hashes_are_positional() -> None:
    h = PrefixHasher()
    a, b = np.array([5, 6, 7, 8]), np.array([5, 6, 9])
    ha, hb = h.hashes(a), h.hashes(b)
    assert ha[:2].tolist() == hb[:2].tolist() and ha[2] != hb[2]
    assert len(set(h.hashes(np.arange(5000)).tolist())) == 5000


def test_variants_are_the_documented_ones() -> None:
    assert VARIANTS[0] == "default" and "oracle" in VARIANTS
    chain = [(lo, hi) for _, lo, hi in DECOMPOSITION]
    assert chain[0][0] == "default" and chain[-1][1] == "oracle"
    assert all(a[1] == b[0] for a, b in zip(chain, chain[1:])), "the steps must telescope"


# ---------------------------------------------------------------------------- the command
def test_the_command_writes_records_plots_and_report(tmp_path) -> None:
    out = tmp_path / "hr"
    assert main(["experiment", "headroom", "--out", str(out), "--traces", "swe-sample", "--limit", "60",
                 "--capacities", "0.05x", "--quiet"]) == 0
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert sum(r["kind"] == "point" for r in records) == 1
    assert (out / "plots" / "decomposition.png").stat().st_size > 0
    assert (out / "plots" / "swe-sample_0.05x_anatomy.png").exists()
    report = (out / "report.md").read_text()
    assert "## swe-sample 0.05x" in report and "next-use order" in report
    again = tmp_path / "again"
    assert main(["experiment", "headroom", "--out", str(again), "--from-records", str(out / "records.jsonl")]) == 0
    assert (again / "report.md").read_text() == report   # the report is a function of the records alone
    assert (again / "plots" / "decomposition.png").exists()
    broken = tmp_path / "broken.jsonl"        # every record's common fields, a point's own field gone
    broken.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "sessions"}) + "\n" for r in records))
    assert main(["experiment", "headroom", "--out", str(again), "--from-records", str(broken)]) == 2
    assert (again / "report.md").read_text() == report        # old: records and plots rewritten, then a KeyError
    fresh = tmp_path / "fresh"
    assert main(["experiment", "headroom", "--out", str(fresh), "--from-records", str(broken)]) == 2
    assert not fresh.exists() and not list(tmp_path.glob(".fresh.*"))


def test_the_command_refuses_a_future_aware_default(tmp_path, capsys) -> None:
    assert main(["experiment", "headroom", "--out", str(tmp_path / "x"), "--default", "oracle"]) == 2
    assert "future-aware" in capsys.readouterr().err


def test_traces_whose_safe_names_collide_get_their_own_plots(point) -> None:
    """The anatomy plot was named from the trace with unsafe characters turned into _, so traces
    x/one.jsonl and x_one.jsonl shared one plot and the first section showed the second's (audit)."""
    from marconi.lab.headroom.report import report_markdown

    records = point[0]
    renamed = [{**r, "trace": name} for name in ("x/one.jsonl", "x_one.jsonl") for r in records]
    links = [line for line in report_markdown(renamed).splitlines() if line.startswith("![anatomy]")]
    assert len(links) == 2 and len(set(links)) == 2, links
    assert "![anatomy](plots/swe-sample_0.05x_anatomy.png)" in report_markdown(records)   # a safe name stays
