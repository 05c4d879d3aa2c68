"""`marconi reproduce` end to end on the tiny profile (vendored + synthetic data), and its parts."""

import copy
import json
import math

import numpy as np
import pytest

from marconi.cli import build_parser
from marconi.lab.reproduce import PROFILES, choose_regimes, rerender, run_reproduction
from marconi.lab.reproduce.anatomy import window_bounds
from marconi.lab.reproduce.context import PAPER_MARCONI
from marconi.lab.reproduce.latency import engine_latency_from_file, latency_set
from marconi.lab.reproduce.report import FIGURES
from marconi.lab.reproduce.traces import (TraceFactory, WorkloadSource, concat_traces, continuation_stats,
                                                  retime_sessions, retime_swe, reuse_kinds)
from marconi.core.model import get_model
from marconi.sim import simulate_system
from marconi.sim.sweep import read_records
from marconi.choosers.bootstrap import BootstrapTuner
from marconi.workloads import Request, build_swe_trace, bundled_data_dir, chat_trace

pytestmark = pytest.mark.slow  # minutes of sweeps / processes: CI and `make test` only

FIGURE_KEYS = ("fig7", "fig8", "fig9", "fig10", "fig11", "fig12", "fig13", "headroom", "alpha", "admission", "anatomy")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    calls = []
    ctx = run_reproduction(PROFILES["tiny"], out, workers=2,
                           progress=lambda d, n: calls.append((d, n)) or (lambda k: None))
    return out, ctx, calls


def test_every_figure_has_records_plots_and_a_section(report):
    out, ctx, calls = report
    text = (out / "report.md").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert [d for d, _ in calls] == ["calibration", "figure points"]
    for key in FIGURE_KEYS:
        recs = read_records(out / f"{key}.jsonl")
        assert recs, key
        assert summary["figures"][key], key
    for png in ("fig7_hit_rate", "fig8_gain_vs_sglang", "fig9_p95_ttft_cdf", "fig10_length_bins_ttft",
                "fig11_gain_vs_capacity", "fig12_layers_state_dim", "fig13_arrival", "alpha_ablation",
                "admission_ablation"):
        assert (out / f"{png}.png").stat().st_size > 1000, png
        assert f"({png}.png)" in text
    for title in ("Fig. 7", "Fig. 8", "Fig. 9", "Fig. 10", "Fig. 11", "Fig. 12", "Fig. 13", "α tuning ablation",
                  "Admission × eviction ablation", "## Summary", "## Capacities"):
        assert title in text
    assert "engine (CPU, measured)" in text and "not available" in text  # no engine table was given
    assert len(read_records(out / "points.jsonl")) == len(ctx.records)
    assert not list(out.glob(".*.tmp"))  # atomic writes left no temp files


def test_records_are_in_range_and_echo_their_configuration(report):
    out, ctx, _ = report
    for rec in read_records(out / "points.jsonl"):
        for key in ("trace", "system", "capacity", "model", "workload", "capacity_bytes"):
            assert key in rec
        assert rec["capacity_bytes"] > 0
        assert 0.0 <= rec["token_hit_rate"] <= rec["kv_hit_rate"] <= 1.0
        assert 0.0 <= rec["flops_saved_fraction"] <= 1.0
        pr = rec.get("per_request")
        if pr is not None:
            reused, inputs = np.array(pr["reused_len"]), np.array(pr["input_len"])
            assert len(reused) == rec["num_requests"] and (reused <= inputs).all()
            assert reused.sum() / inputs.sum() == pytest.approx(rec["token_hit_rate"])
    for key, regimes in ctx.regimes.items():
        assert regimes["high"] <= regimes["moderate"] <= regimes["low"], key
        assert all(0.0 <= c <= 1.0 + 1e-9 for c in ctx.contention[key].values())


def test_summary_table_is_complete_and_computed_from_the_records(report):
    out, ctx, _ = report
    summary = json.loads((out / "summary.json").read_text())
    findings = summary["findings"]
    figures = {f["figure"].split(" (")[0] for f in findings}
    assert {"Fig. 7", "Fig. 8", "Fig. 9", "Fig. 10a", "Fig. 10b", "Fig. 11", "Fig. 12a", "Fig. 12b",
            "Fig. 13a", "Fig. 13b", "α ablation", "Admission ablation", "Lead obs. 1", "Lead obs. 2"} <= figures
    for f in findings:
        assert f["paper"].strip() and f["ours"].strip() and f["claim"].strip()
        assert f["holds"] in ("yes", "partly", "no", "n/a")
    table = (out / "summary.md").read_text().strip().splitlines()
    assert len(table) == 2 + len(findings)
    assert all(cell.strip() for row in table[2:] for cell in row.strip("|").split("|"))
    # fig. 7's ratio, recomputed from its own records
    fig7 = read_records(out / "fig7.jsonl")
    swe = {r["system"]: r["token_hit_rate"] for r in fig7 if r["trace"] == "swe"}
    assert summary["figures"]["fig7"]["swe"]["marconi_vs_vllm_x"] == pytest.approx(swe[PAPER_MARCONI] / swe["vllm+"])
    # fig. 8's P95 gain, recomputed from its own records
    fig8 = read_records(out / "fig8.jsonl")
    by_point = {}
    for r in fig8:
        if r["workload"] == "swe":
            by_point.setdefault((r["trace"], r["capacity"]), {})[r["system"]] = r["token_hit_rate"]
    gains = [p[PAPER_MARCONI] / p["sglang+"] - 1 for p in by_point.values() if p["sglang+"] > 0]
    assert summary["figures"]["fig8"]["swe"]["p95"] == pytest.approx(float(np.percentile(gains, 95)))
    # fig. 9 rows: every system's P95 TTFT relative to vanilla is finite and positive
    for row in read_records(out / "fig9.jsonl"):
        assert row["relative_to_vanilla"] > 0 and math.isfinite(row["relative_to_vanilla"])
        assert row["ttft_p95_s"] <= row["vanilla_ttft_p95_s"] + 1e-12
    # the headroom section: every system as a fraction of the oracle and infinite, from its records
    headroom = read_records(out / "headroom.jsonl")
    assert {"vllm+", "sglang+", PAPER_MARCONI, "marconi", "oracle", "infinite"} <= {r["system"] for r in headroom}
    for w, d in summary["figures"]["headroom"].items():
        rates = {r["system"]: r["token_hit_rate"] for r in headroom if r["trace"] == w}
        assert d["of_oracle"]["marconi"] == pytest.approx(rates["marconi"] / rates["oracle"])
        assert d["of_infinite"]["sglang+"] == pytest.approx(rates["sglang+"] / rates["infinite"])
    # the paper's numbers are printed beside ours
    text = (out / "report.md").read_text()
    assert "34.4" in text and "+219.7%" in text and "68.3%" in text


def test_each_figure_renders_from_its_records_alone(report, tmp_path):
    """compute(ctx) -> records is the only step that reads the context: plot, section, verdict and
    explain on a detached copy of the records give back the report's findings, text and PNGs."""
    out, ctx, _ = report
    summary = json.loads((out / "summary.json").read_text())
    text = (out / "report.md").read_text()
    assert [fig.KEY for fig in FIGURES] == list(FIGURE_KEYS)
    computed = copy.deepcopy({fig.KEY: fig.compute(ctx) for fig in FIGURES})
    findings, pngs = [], []
    for fig in FIGURES:
        records = computed[fig.KEY]
        assert records.key == fig.KEY and set(records.data) == set(summary["figures"][fig.KEY])
        assert len(records.rows) == len(read_records(out / f"{fig.KEY}.jsonl"))
        findings += [f.as_dict() for f in fig.verdict(records)]
        assert f"## {fig.TITLE}\n" in text and fig.section(records) in text
        why = fig.explain(records, computed)
        assert not why or f"**Why ours differ.** {why}\n" in text
        pngs += fig.plot(records, tmp_path)
    assert findings == summary["findings"]
    assert sorted(p.name for p in pngs) == sorted(p.name for p in out.glob("*.png"))
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)


def test_report_only_rerenders_the_same_summary(report, tmp_path):
    out, _, _ = report
    before = (out / "summary.md").read_text()
    ctx = rerender(PROFILES["tiny"], out)
    assert (out / "summary.md").read_text() == before
    assert len(ctx.records) == len(read_records(out / "points.jsonl"))


def test_cli_registers_reproduce():
    args = build_parser().parse_args(["reproduce", "--quick", "--backend", "ray", "--address", "auto", "--out", "r"])
    assert args.quick and args.backend == "ray" and args.address == "auto" and args.out == "r"
    assert build_parser().parse_args(["simulate", "--trace", "x", "--backend", "ray"]).backend == "ray"


# ----------------------------------------------------------------------------- parts
def test_retime_swe_equals_the_builder():
    paths = [bundled_data_dir() / "swe" / "msa_gemini3pro_verified_first10.json"]
    base = build_swe_trace(paths, max_turns=12)
    for sps, gap, seed in ((2.0, 5.0, 1), (0.5, 10.0, 3)):
        rebuilt = build_swe_trace(paths, max_turns=12, sessions_per_second=sps, mean_gap_s=gap, seed=seed)
        assert list(retime_swe(base, sessions_per_second=sps, mean_gap_s=gap, seed=seed)) == list(rebuilt)


def test_retime_sessions_and_concat():
    a = chat_trace(num_sessions=6, turns=(2, 3), seed=1)
    b = chat_trace(num_sessions=6, turns=(2, 3), sessions_per_second=4.0, seed=1)
    r = retime_sessions(a, 4.0)
    assert [x.ts for x in r] == pytest.approx([x.ts for x in b])
    both = concat_traces(a, b, gap_s=2.0)
    assert len(both) == len(a) + len(b) and both.meta["shift_at"] == len(a)
    assert both[len(a)].ts == pytest.approx(a[-1].ts + 2.0)
    assert {str(x.session_id)[:2] for x in both} == {"A:", "B:"}


def _req(sid, turn, ts, inp, out):
    return Request(sid, turn, ts, np.asarray(inp, dtype=np.int32), np.asarray(out, dtype=np.int32))


def test_continuations_and_reuse_kinds_on_a_hand_built_trace():
    h0, o0 = np.arange(100, 150), np.arange(500, 510)
    t1 = np.concatenate([h0, o0, np.arange(600, 620)])          # extends turn 0: a continuation
    t2 = np.concatenate([h0[:30], np.arange(700, 760)])          # drops part of the history: diverges at 30
    trace = [_req(0, 0, 0.0, h0, o0), _req(0, 1, 1.0, t1, [1, 2]), _req(0, 2, 2.0, t2, [3])]
    c = continuation_stats(trace, split_turn=2)
    assert (c["early_continuations"], c["early_turns"], c["late_continuations"], c["late_turns"]) == (1, 1, 0, 1)
    kinds = reuse_kinds(trace, [0, 60, 30])
    assert (kinds["hits_last_token"], kinds["tokens_last_token"]) == (1, 60)
    assert (kinds["hits_branch"], kinds["tokens_branch"]) == (1, 30)
    # the simulator agrees: SGLang+ reuses the last-token checkpoint (60), then nothing usable at 30
    # (no checkpoint there: the branch is only detected now)
    res = simulate_system(trace, "sglang+", "paper-7b", 10**12, latency="zero")
    assert res.reused_len.tolist() == [0, 60, 0]


def test_choose_regimes_are_distinct_and_ordered():
    contention = {0.01: 0.05, 0.02: 0.2, 0.05: 0.45, 0.1: 0.6, 0.2: 0.9, 0.4: 1.0}
    chosen = choose_regimes(contention, (("high", 0.25), ("moderate", 0.5), ("low", 0.85)))
    assert chosen == {"high": 0.02, "moderate": 0.05, "low": 0.2}
    flat = choose_regimes({0.1: 0.5}, (("high", 0.25), ("moderate", 0.5), ("low", 0.85)))
    assert flat == {"high": 0.1, "moderate": 0.1, "low": 0.1}


def test_window_bounds_match_the_tuner():
    trace = chat_trace(num_sessions=60, turns=(3, 8), system_prompt_len=300, seed=4)
    spec = get_model("paper-7b")
    for m in (5, 3):
        res = simulate_system(trace, f"marconi:multiplier={m}", spec, 2e9, latency="zero", tuning_workers=1)
        assert res.tuned_alphas, "capacity too large for a tuning to happen"
        at, _ = res.tuned_alphas[0]
        lo, hi = window_bounds(at, m)
        from marconi.sim.systems import make_system
        cache = make_system(f"marconi:multiplier={m}").build(spec, 2e9, tuning_workers=1)
        tuner = cache.chooser
        assert isinstance(tuner, BootstrapTuner)
        for r in trace:
            cache.process(r.input_tokens, r.output_tokens)
            if tuner.events:
                break
        assert (lo, hi) == (tuner.requests_before_first_eviction, tuner.events[0].at_request)
        assert hi - lo == tuner.events[0].window_size


def test_latency_models(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("prefill_tokens,ttft_ms\n100,10\n200,20\n400,40\n")
    lat = latency_set(csv, None)
    table = lat.models["Jamba table"]
    assert table.ttft_s(None, 300, 100) == pytest.approx(0.02)
    assert lat.models["engine (CPU, measured)"] is None and "not available" in lat.notes["engine (CPU, measured)"]
    bench = tmp_path / "bench.jsonl"
    rows = [{"kind": "ttft", "input_len": n, "hit_len": h, "ttft_full_s": 0.001 * n, "ttft_cached_s": 0.001 * (n - h)}
            for n, h in ((1000, 0), (2000, 500), (4000, 3000))] + [{"kind": "ttft_summary"}]
    bench.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    eng = engine_latency_from_file(bench)
    assert eng.slope_s_per_token == pytest.approx(0.001) and abs(eng.intercept_s) < 1e-9
    assert latency_set(csv, bench).preferred()[0] == "Jamba table"


def test_lmsys_files_join_the_workloads(tmp_path):
    conv = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " * 5} for i in range(20)]
    path = tmp_path / "lmsys.jsonl"
    path.write_text("\n".join(json.dumps({"conversation_id": f"c{k}", "conversation": conv}) for k in range(3)) + "\n")
    factory = TraceFactory(WorkloadSource(chat="synthetic", chat_sessions=3, lmsys_files=(str(path),)))
    assert factory.workloads()[0] == "lmsys"
    trace = factory.base("lmsys")
    assert trace.num_sessions == 3 and len(trace) == 30
    fast = factory.variant("lmsys", sessions_per_second=2.0)
    assert [r.ts for r in fast if r.turn_id == 0] == [0.0, 0.5, 1.0]


# ----------------------------------------------------------------------------- hardening (issue 21)
import shutil  # noqa: E402

from marconi.cli import main  # noqa: E402
from marconi.core.registry import ConfigError  # noqa: E402


def _tree(path):
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_an_interrupted_report_write_leaves_the_old_report_whole(report, tmp_path, monkeypatch):
    """Bug 10: the report's files were written one by one into --out; an interrupt mixed old and new."""
    out, _, _ = report
    copy_dir = tmp_path / "report"
    shutil.copytree(out, copy_dir)
    (copy_dir / "fig7.jsonl").write_text('{"marker": "the earlier report"}\n')  # a re-render rewrites it first
    before = _tree(copy_dir)
    from marconi.lab.reproduce import fig12

    def interrupted(records, directory):
        raise KeyboardInterrupt  # after figs. 7-11 were plotted and the JSONL files written
    monkeypatch.setattr(fig12, "plot", interrupted)
    with pytest.raises(KeyboardInterrupt):
        rerender(PROFILES["tiny"], copy_dir)
    assert _tree(copy_dir) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]  # no staging directory left


def test_report_only_names_a_points_file_whose_records_the_report_cannot_read(report, tmp_path, capsys):
    """Old: a KeyError traceback ('token_hit_rate') from deep inside the figures (audit)."""
    out, _, _ = report
    copy_dir = tmp_path / "report"
    shutil.copytree(out, copy_dir)
    points = copy_dir / "points.jsonl"
    records = [json.loads(line) for line in points.read_text().splitlines()]
    points.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "token_hit_rate"}) + "\n"
                              for r in records))
    before = _tree(copy_dir)
    assert main(["reproduce", "--profile", "tiny", "--report-only", "--out", str(copy_dir), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{points}: its records cannot be rendered (KeyError: field 'token_hit_rate' missing)" in err
    assert "Traceback" not in err and _tree(copy_dir) == before
    assert main(["reproduce", "--profile", "quick", "--report-only", "--out", str(copy_dir), "--quiet"]) == 2
    assert "pass --profile tiny" in capsys.readouterr().err


def _summary(tmp_path, summary, points=None):
    out = tmp_path / "report"
    out.mkdir()
    (out / "summary.json").write_text(json.dumps(summary))
    if points is not None:
        (out / "points.jsonl").write_text("".join(json.dumps(p) + "\n" for p in points))
    return out


@pytest.mark.parametrize("summary, message", [
    ([], "(a list, not an object)"), (None, "(null, not an object)"),
    ({"profile": "tiny"}, "no 'working_sets'"),
    ({"profile": "tiny", "working_sets": [[1, 2]], "regimes": {}, "contention": {}}, "'working_sets'"),
    ({"profile": "tiny", "working_sets": [], "regimes": [], "contention": {}}, "'regimes' is a list, not an object")])
def test_report_only_refuses_a_summary_that_is_not_a_reproduce_summary(tmp_path, summary, message):
    """Bug 18: --report-only took summary.json for a dict (an AttributeError traceback otherwise)."""
    out = _summary(tmp_path, summary, points=[])
    with pytest.raises(ConfigError) as info:
        rerender(PROFILES["tiny"], out)
    assert str(info.value).startswith(f"{out / 'summary.json'}: not a `marconi reproduce` summary")
    assert message in str(info.value) and "without --report-only" in str(info.value)


def test_report_only_refuses_a_truncated_points_file(tmp_path, capsys):
    """--report-only rewrote the report from 5 of 132 records with exit 0."""
    summary = {"profile": "tiny", "working_sets": [], "regimes": {}, "contention": {},
               "timings": {"num_points": 132.0}}
    rec = {"trace": "swe", "system": "sglang+", "capacity": "1x", "model": "paper-7b"}
    out = _summary(tmp_path, summary, points=[{**rec, "capacity": f"{i}x"} for i in range(5)])
    before = _tree(out)
    assert main(["reproduce", "--profile", "tiny", "--report-only", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{out / 'points.jsonl'}: 5 records, but" in err and "the run made 132" in err
    assert _tree(out) == before


def test_reproduce_over_an_existing_report_says_it_replaces_it(tmp_path, monkeypatch, capsys):
    from marconi.lab.reproduce import pipeline

    out = _summary(tmp_path, {"profile": "quick"})
    monkeypatch.setattr(pipeline, "run_reproduction", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    assert main(["reproduce", "--profile", "tiny", "--out", str(out), "--quiet"]) == 130
    assert f"the report already in {out} (profile quick) is replaced" in capsys.readouterr().err


def test_reproduce_refuses_a_folder_that_holds_something_else(tmp_path, monkeypatch, capsys):
    from marconi.lab.reproduce import pipeline

    monkeypatch.setattr(pipeline, "run_reproduction", lambda *a, **k: pytest.fail("ran before the check"))
    out = tmp_path / "results"
    out.mkdir()
    (out / "mine.jsonl").write_text("{}\n")
    assert main(["reproduce", "--profile", "tiny", "--out", str(out), "--quiet"]) == 2
    assert "holds no `marconi reproduce` report" in capsys.readouterr().err
    table = tmp_path / "report" / "ttft.csv"  # an input inside the directory the report replaces
    table.parent.mkdir()
    table.write_text("prefill_tokens,ttft_ms\n100,10\n200,20\n")
    assert main(["reproduce", "--profile", "tiny", "--out", str(table.parent), "--jamba-table", str(table),
                 "--quiet"]) == 2
    assert "is inside --out" in capsys.readouterr().err
    assert (out / "mine.jsonl").exists() and table.exists()


def test_reproduce_refuses_a_report_folder_holding_files_the_report_did_not_write(tmp_path, monkeypatch, capsys):
    """A user's notes beside an earlier report were deleted without a word when the report was
    replaced (audit): the check looked for summary.json only. The summary lists the report's files
    now, and anything else is refused by name; an older summary without the list is judged by kind."""
    from marconi.lab.reproduce import pipeline

    monkeypatch.setattr(pipeline, "run_reproduction", lambda *a, **k: pytest.fail("ran before the check"))
    out = _summary(tmp_path, {"profile": "quick", "files": ["summary.json", "report.md", "fig7.jsonl"]})
    (out / "fig7.jsonl").write_text("{}\n")
    (out / "mynotes.txt").write_text("mine")
    assert main(["reproduce", "--profile", "tiny", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "files it did not write (mynotes.txt)" in err and (out / "mynotes.txt").exists()
    (out / "summary.json").write_text(json.dumps({"profile": "quick"}))      # an older report: no list
    assert main(["reproduce", "--profile", "tiny", "--out", str(out), "--quiet"]) == 2
    assert "(mynotes.txt)" in capsys.readouterr().err
    for other in ('{"title": "x"}', "{not json"):       # another tool's summary, or a damaged one: not a report
        (out / "summary.json").write_text(other)     # (old: every .json/.md/.jsonl/.png was taken for its own)
        (out / "mynotes.txt").unlink(missing_ok=True)
        assert main(["reproduce", "--profile", "tiny", "--out", str(out), "--quiet"]) == 2
        assert "not a `marconi reproduce` report's" in capsys.readouterr().err and (out / "fig7.jsonl").exists()


def test_engine_latency_records_with_nan_are_refused(tmp_path):
    bench = tmp_path / "bench.jsonl"
    rows = [{"kind": "ttft", "input_len": 1000, "hit_len": 0, "ttft_full_s": 1.0, "ttft_cached_s": 1.0},
            {"kind": "ttft", "input_len": 2000, "hit_len": 500, "ttft_full_s": float("nan"), "ttft_cached_s": 1.5}]
    bench.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(ConfigError, match=r"bench\.jsonl:2: ttft_full_s is nan"):
        engine_latency_from_file(bench)
