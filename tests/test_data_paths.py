"""Where data comes from: one way to find the shared data set, and a fresh clone (no ../shared) works."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from marconi.cli import main
from marconi.lab import reproduce
from marconi.lab.reproduce.traces import data_available

ROOT = Path(__file__).resolve().parents[1]


def test_the_shared_data_fixture_finds_data_exactly_as_the_package_does():
    """MARCONI_SHARED_DATA="" means "none" to the package; the fixture used to take it for the cwd."""
    env = {**os.environ, "MARCONI_SHARED_DATA": ""}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
         "tests/test_sim.py::test_jamba_table_is_fitted_with_a_line"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert "1 skipped" in result.stdout, result.stdout[-2000:]
    assert "shared data set was not found" in result.stdout


@pytest.mark.parametrize("name", ["quick", "full"])
def test_reproduce_falls_back_to_bundled_data_on_a_fresh_clone(name, monkeypatch):
    monkeypatch.setenv("MARCONI_SHARED_DATA", "")
    assert data_available(reproduce.PROFILES[name].source)  # the real-data profile alone would fail
    profile, note = reproduce.with_available_data(reproduce.PROFILES[name])
    assert data_available(profile.source) == []
    assert (profile.source.chat, profile.source.swe, profile.source.mooncake) == ("synthetic", "bundled", "bundled")
    assert profile.name == name and profile.ladder == reproduce.PROFILES[name].ladder  # same sweep, other data
    assert "was not found" in note and "bundled data" in note and "README" in note


def test_reproduce_keeps_the_real_data_where_it_is_there(monkeypatch, shared_data):
    monkeypatch.setenv("MARCONI_SHARED_DATA", str(shared_data))
    profile, note = reproduce.with_available_data(reproduce.PROFILES["quick"])
    assert profile == reproduce.PROFILES["quick"]
    assert note.startswith("data: chat: ShareGPT from the shared data set")


def test_reproduce_quick_cli_runs_on_bundled_data_and_says_so(monkeypatch, tmp_path, capsys):
    """The CLI path up to the simulation (the run itself on these sources is the `tiny` profile's test)."""
    monkeypatch.setenv("MARCONI_SHARED_DATA", "")
    seen = {}

    def fake_run(profile, out_dir, **kwargs):
        seen["profile"] = profile
        raise KeyboardInterrupt  # stop here: the 2-minute run is not this test's business

    from marconi.lab.reproduce import pipeline

    monkeypatch.setattr(pipeline, "run_reproduction", fake_run)
    assert main(["reproduce", "--quick", "--out", str(tmp_path / "report"), "--quiet"]) == 130
    err = capsys.readouterr().err
    assert "runs on the repository's bundled data" in err and "the 10 vendored mini-swe-agent trajectories" in err
    assert seen["profile"].name == "quick" and data_available(seen["profile"].source) == []


def test_the_original_mini_swe_agent_layout_is_found_as_the_readme_says(tmp_path, monkeypatch):
    """README: the trajectories may be the original repository's trajs/<id>/<id>.traj.json files."""
    import json

    from marconi.workloads import build_swe_trace, bundled_data_dir
    from marconi.workloads.swe import default_swe_paths

    sample = bundled_data_dir() / "swe" / "msa_gemini3pro_verified_first10.json"
    folder = tmp_path / "swe" / "mini-swe-agent-gemini3pro"
    for traj in json.loads(sample.read_text())[:3]:
        name = traj["instance_id"]
        (folder / "trajs" / name).mkdir(parents=True)
        (folder / "trajs" / name / f"{name}.traj.json").write_text(json.dumps(traj))
    monkeypatch.setenv("MARCONI_SHARED_DATA", str(tmp_path))
    assert default_swe_paths() == [folder]
    from_layout = build_swe_trace(None, num_sessions=3)
    from_sample = build_swe_trace([sample], num_sessions=3)
    assert len(from_layout) == len(from_sample) > 3
    assert all(a == b for a, b in zip(from_layout, from_sample))


def test_the_original_sharegpt_file_is_found_as_the_readme_says(tmp_path, monkeypatch):
    from marconi.workloads.sharegpt import default_sharegpt_files

    (tmp_path / "sharegpt").mkdir()
    original = tmp_path / "sharegpt" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    original.write_text("[]")
    monkeypatch.setenv("MARCONI_SHARED_DATA", str(tmp_path))
    assert default_sharegpt_files() == [original]
    part = tmp_path / "sharegpt" / "sharegpt_v3_ge10rounds_fileorder_part00.json"
    part.write_text("[]")
    assert default_sharegpt_files() == [part]  # the filtered parts win where both are there


def test_a_shared_data_variable_pointing_nowhere_is_named_in_the_fallback(tmp_path, monkeypatch, capsys):
    """MARCONI_SHARED_DATA=/nonexistent got a fallback that blamed ../shared/data, never looked at."""
    from marconi.cli import load_trace
    from marconi.workloads import Provenance

    missing = tmp_path / "nonexistent"
    monkeypatch.setenv("MARCONI_SHARED_DATA", str(missing))
    trace = load_trace("sharegpt:sessions=3")
    fallback = Provenance.of(trace).fallback
    assert fallback == f"MARCONI_SHARED_DATA={missing} is not a directory, so sharegpt is absent"
    assert f"FALLBACK: MARCONI_SHARED_DATA={missing} is not a directory" in capsys.readouterr().err
    profile, note = reproduce.with_available_data(reproduce.PROFILES["quick"])
    assert f"MARCONI_SHARED_DATA={missing}, which is not a directory" in note and "../shared/data" not in note
    assert any(f"MARCONI_SHARED_DATA={missing}" in p for p in data_available(reproduce.PROFILES["quick"].source))
    (tmp_path / "data").mkdir()  # a real directory without the data: the message names where it looked
    monkeypatch.setenv("MARCONI_SHARED_DATA", str(tmp_path / "data"))
    fallback = Provenance.of(load_trace("sharegpt:sessions=3")).fallback
    assert fallback == f"MARCONI_SHARED_DATA={tmp_path / 'data'}: {tmp_path / 'data' / 'sharegpt'} is absent"
