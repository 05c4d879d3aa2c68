"""Miss-ratio curves (`marconi mrc`) and the oracle/infinite columns of `marconi compare`."""

import json

import pytest

from marconi.cli import main
from marconi.core.registry import ConfigError
from marconi.sim.compare import gains, repeated_points
from marconi.sim.mrc import capacity_fractions, run_mrc
from marconi.sim.systems import make_system
from marconi.workloads import build_workload


def test_capacity_fractions_are_geometric_up_to_the_working_set():
    fr = capacity_fractions(5, lo=0.01)
    assert fr[0] == 0.01 and fr[-1] == 1.0 and fr == sorted(fr)
    assert fr[2] == pytest.approx(0.1)
    with pytest.raises(ConfigError, match="at least 2"):
        capacity_fractions(1)
    with pytest.raises(ConfigError, match="fraction in"):
        capacity_fractions(4, lo=1.5)


def test_a_curve_has_every_system_at_every_capacity_and_the_ceilings():
    trace = build_workload("swe-sample").head(120)
    records = run_mrc(trace, "swe-sample", ["sglang+", "marconi"], points=4, lo=0.02, workers=1)
    by = {}
    for r in records:
        by.setdefault(r["system"], []).append(r)
    assert set(by) == {"sglang+", "marconi", "oracle", "infinite"}
    assert len(by["infinite"]) == 1 and all(len(by[s]) == 4 for s in ("sglang+", "marconi", "oracle"))
    ceiling = by["infinite"][0]["token_hit_rate"]
    for system in ("sglang+", "marconi", "oracle"):
        curve = sorted(by[system], key=lambda r: r["fraction"])
        assert all(r["token_hit_rate"] <= ceiling + 1e-12 for r in curve)
        assert curve[-1]["token_hit_rate"] == pytest.approx(ceiling)  # the whole working set evicts nothing
    for small, big in zip(sorted(by["sglang+"], key=lambda r: r["fraction"]), sorted(by["oracle"], key=lambda r: r["fraction"])):
        assert big["capacity_bytes"] == small["capacity_bytes"]


def test_mrc_command_writes_records_and_a_plot(tmp_path, capsys):
    out = tmp_path / "mrc.jsonl"
    code = main(["mrc", "--trace", "swe-sample", "--limit", "80", "--systems", "sglang+", "--points", "3",
                 "--lo", "0.05", "--workers", "1", "--out", str(out), "--quiet"])
    assert code == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["system"] for r in records} == {"sglang+", "oracle", "infinite"}
    assert (tmp_path / "mrc.png").stat().st_size > 1000
    table = capsys.readouterr().out
    assert "of working set" in table and "oracle" in table and "infinite (unbounded capacity)" in table
    assert main(["mrc", "--trace", "swe-sample", "--systems", "nope", "--out", str(tmp_path / "x.jsonl"),
                 "--quiet"]) == 2
    assert "unknown system 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "x.jsonl").exists()


def test_compare_gives_each_system_as_a_fraction_of_oracle_and_infinite():
    base = {"trace": "t", "model": "m", "mode": "sequential", "capacity_bytes": 10, "capacity": "10B"}
    records = [{**base, "system": "sglang+", "token_hit_rate": 0.2}, {**base, "system": "oracle", "token_hit_rate": 0.4},
               {**base, "system": "marconi", "token_hit_rate": 0.3},
               {**base, "capacity_bytes": 20, "capacity": "20B", "system": "sglang+", "token_hit_rate": 0.3},
               {**base, "capacity_bytes": 99, "capacity": "1x", "system": "infinite", "token_hit_rate": 0.5}]
    rows = {(r["capacity"], r["system"]): r for r in gains(records)}
    assert rows[("10B", "marconi")]["of_oracle"] == pytest.approx(0.75)
    assert rows[("10B", "marconi")]["of_infinite"] == pytest.approx(0.6)
    assert rows[("20B", "sglang+")]["of_infinite"] == pytest.approx(0.6)   # one infinite run serves every capacity
    assert "of_oracle" not in rows[("20B", "sglang+")]
    assert ("1x", "infinite") in rows and len(rows) == 5


def test_compare_keeps_modes_and_latency_models_apart_and_notes_repeated_points(tmp_path, capsys):
    """Old: an h100 marconi row was compared with a100 baselines, an event-mode row sat beside a
    sequential one with nothing to tell them apart, and two runs' files concatenated gave every row
    twice without a word."""
    base = {"trace": "t", "model": "m", "mode": "sequential", "latency": "roofline-a100", "capacity_bytes": 10,
            "capacity": "10B", "num_requests": 5}
    records = [{**base, "system": "sglang+", "token_hit_rate": 0.2}, {**base, "system": "marconi", "token_hit_rate": 0.3},
               {**base, "latency": "roofline-h100", "system": "marconi", "token_hit_rate": 0.3},
               {**base, "mode": "event", "system": "marconi", "token_hit_rate": 0.25}]
    rows = gains(records)
    assert [r.get("vs_sglang_pct") for r in rows] == [0.0, pytest.approx(0.5), None, None]
    assert repeated_points(records) == 0 and repeated_points(records + records[:2]) == 2
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records + records[:1]))
    assert main(["compare", str(path), "--plots", str(tmp_path / "plots")]) == 0
    out, err = capsys.readouterr()
    assert "1 record in" in err and "repeat a point" in err
    header = out.splitlines()[0].split()
    assert "mode" in header and "latency" in header


# ----------------------------------------------------------------------------- hardening (issue 21)
def test_capacity_fractions_run_each_distinct_capacity_once():
    """--points 5000 --lo 0.9999 ran 5,000 simulations over 101 distinct capacities."""
    fr = capacity_fractions(5000, lo=0.9999)
    assert len(fr) == len(set(fr)) == 101 and fr[0] == 0.9999 and fr[-1] == 1.0
    assert capacity_fractions(12, lo=0.005) == sorted(set(capacity_fractions(12, lo=0.005)))
    assert len(capacity_fractions(12, lo=0.005)) == 12  # the usual curve is untouched


def test_mrc_says_how_many_distinct_capacities_it_runs(tmp_path, capsys):
    out = tmp_path / "m.jsonl"
    assert main(["mrc", "--trace", "swe-sample", "--limit", "10", "--systems", "sglang+", "--no-ceilings",
                 "--points", "300", "--lo", "0.9999", "--workers", "1", "--out", str(out), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "--points 300 from --lo 0.9999 gives only 101 distinct capacities" in err
    assert len(out.read_text().splitlines()) == 101


def test_mrc_with_too_small_a_lo_says_raise_lo_not_the_capacity(tmp_path, capsys):
    """mrc has no --capacity: its advice must name --lo, and come before the sweep."""
    out = tmp_path / "m.jsonl"
    assert main(["mrc", "--trace", "swe-sample", "--limit", "40", "--systems", "sglang+", "--points", "3",
                 "--lo", "0.00001", "--workers", "1", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--lo 1e-05 makes the smallest capacity" in err and "raise --lo to at least 0.0" in err
    assert "raise the capacity" not in err and not out.exists()


def test_mrc_points_that_cannot_run_are_reported_in_lo_terms_and_the_curve_kept(tmp_path, capsys, monkeypatch):
    from marconi.integrations.vllm.system import VllmAlignSystem

    out = tmp_path / "m.jsonl"
    args = ["mrc", "--trace", "swe-sample", "--limit", "20", "--systems", "vllm-align", "--no-ceilings",
            "--points", "2", "--lo", "0.01", "--workers", "1", "--out", str(out), "--quiet"]
    # a --lo under a system's known floor is refused before any point runs, nothing written
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "less than what vllm-align needs" in err and "raise --lo to at least 0.1" in err, err
    assert not out.exists() and not (tmp_path / "m.partial.jsonl").exists()
    # a point that fails as it runs (here: the floor hidden) is said in --lo terms, the rest kept
    monkeypatch.setattr(VllmAlignSystem, "least_capacity_bytes", lambda self, spec, requests: 0)
    code = main(args)
    assert code == 2
    err = capsys.readouterr().err
    assert "1 of 2 points could not run, at 0.01x of the working set" in err
    assert "raise --lo above 0.01" in err and "raise the capacity" not in err
    # the curve of the points that ran goes beside --out and --plot, never over them
    partial = tmp_path / "m.partial.jsonl"
    assert [json.loads(line)["fraction"] for line in partial.read_text().splitlines()] == [1.0]
    assert (tmp_path / "m.partial.png").stat().st_size > 0
    assert not out.exists() and not (tmp_path / "m.png").exists()
    assert f"--out {out} and --plot {tmp_path / 'm.png'} left unchanged" in err


def test_mrc_without_lo_starts_where_a_small_trace_first_holds_a_checkpoint(tmp_path, capsys):
    """Old: the default --lo 0.005 was refused on any trace whose working set holds fewer than ~200
    checkpoints, so `marconi mrc --trace small.jsonl` failed with its default settings."""
    out = tmp_path / "m.jsonl"
    assert main(["mrc", "--trace", "swe-sample", "--limit", "40", "--systems", "sglang+", "--points", "3",
                 "--workers", "1", "--out", str(out), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "NOTE: the curve starts at" in err and "not 0.005x" in err
    fractions = sorted({json.loads(line)["fraction"] for line in out.read_text().splitlines()})
    assert len(fractions) == 3 and 0.005 < fractions[0] < 1 and fractions[-1] == 1.0


def test_each_system_knows_its_least_capacity_and_runs_there_not_below():
    """System.least_capacity_bytes: one SSM checkpoint for a bounded PrefixCache, vLLM's least pool for
    the longest request for vllm-align, the KV pool that holds it for sglang-unified; each runs at
    its floor and fails 3% below it."""
    from marconi.sim import simulate_system
    from marconi.workloads import build_workload

    trace = list(build_workload("swe-sample"))[:12]
    for name in ("vllm-align", "sglang-unified", "sglang+"):
        least = make_system(name).least_capacity_bytes("nemotron-h-8b", trace)
        assert least > 0, name
        assert simulate_system(trace, name, "nemotron-h-8b", least).stats.num_requests == 12
        with pytest.raises(ConfigError):
            simulate_system(trace, name, "nemotron-h-8b", least * 0.97)
    assert make_system("infinite").least_capacity_bytes("nemotron-h-8b", trace) == 0
    assert make_system("vllm-align:blocks=60").least_capacity_bytes("nemotron-h-8b", trace) == 0


def test_mrc_without_lo_starts_where_every_emulated_engine_can_serve_the_longest_request(tmp_path, capsys):
    """Old: `marconi mrc --systems sglang+,vllm-align` (or sglang-unified) failed at its default first
    point, the emulators' least pool being more than one checkpoint; the curve now starts at the
    least fraction every system runs at, and says so."""
    out = tmp_path / "m.jsonl"
    assert main(["mrc", "--trace", "swe-sample", "--limit", "30", "--systems", "sglang+,vllm-align,sglang-unified",
                 "--model", "nemotron-h-8b", "--points", "3", "--workers", "1", "--no-ceilings", "--out", str(out),
                 "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "NOTE: the curve starts at" in err and "least pool" in err
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["system"] for r in records} == {"sglang+", "vllm-align", "sglang-unified"} and len(records) == 9
