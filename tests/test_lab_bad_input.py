"""Bad input to the lab's commands (reproduce, experiment sparse/headroom, engine bench, vllm bench):
exit 2 with one line naming the flag (and the file:line), refused before any work, nothing left
behind. Every heavy step is replaced by one that fails the test, so a refusal that came after the
work cannot pass; no simulation, model load or server runs here."""

from __future__ import annotations

from pathlib import Path

import pytest

from marconi.cli import main
from marconi.core.registry import ConfigError
from marconi.workloads import build_workload
from marconi.workloads.trace import write_trace

from cli_run import run_cli


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """(exit code, stderr) of ``marconi ARGV`` (:func:`cli_run.run_cli`: no traceback, asserted)."""
    return run_cli(argv, capsys)[:2]


def _never(what: str):
    def fail(*args, **kwargs):
        pytest.fail(f"{what} ran before the bad input was refused")
    return fail


@pytest.fixture
def no_reproduction(monkeypatch: pytest.MonkeyPatch) -> None:
    from marconi.lab.reproduce import pipeline

    monkeypatch.setattr(pipeline, "run_reproduction", _never("the reproduction"))
    monkeypatch.setattr(pipeline, "rerender", _never("the re-render"))


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    write_trace(path, build_workload("swe-sample").head(3))
    return path


# ------------------------------------------------------------------ reproduce: the latency tables
@pytest.mark.parametrize("flag, content, where", [
    ("--engine-latency", None, "no such file"),
    ("--jamba-table", "tokens,ttft\nabc,1\n", "bad.csv:2:1: tokens is 'abc', not a number"),
    ("--engine-latency", "tokens,ttft\n100,1\n100,2\n", "bad.csv:3:1: tokens 100 does not increase"),
    ("--jamba-table", None, "no such file"),                                 # was accepted (exit 0)
    ("--jamba-table", "", "a directory"),
])
@pytest.mark.parametrize("report_only", [False, True])
def test_reproduce_reads_its_latency_tables_before_any_simulation(
        flag: str, content: str | None, where: str, report_only: bool, tmp_path: Path, no_reproduction: None,
        capsys: pytest.CaptureFixture[str]) -> None:
    table = tmp_path / "bad.csv"
    if content == "":
        table.mkdir()
    elif content is not None:
        table.write_text(content)
    argv = ["reproduce", "--profile", "tiny", "--out", str(tmp_path / "rout"), "--quiet", flag, str(table)]
    code, err = _run(argv + (["--report-only"] if report_only else []), capsys)
    assert code == 2, err
    assert f"{flag}" in err and where in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "rout").exists()


def test_only_the_default_jamba_table_may_be_missing(tmp_path: Path) -> None:
    from marconi.lab.reproduce.latency import latency_set

    lat = latency_set(None, None)   # the shared data set's table, present or not: never an error
    assert "Jamba table" in lat.notes and "A100 roofline" in lat.available()
    with pytest.raises(ConfigError, match=r"--jamba-table .*absent\.csv: no such file"):
        latency_set(tmp_path / "absent.csv", None)


# ------------------------------------------------------------------ conflicting profile flags
@pytest.mark.parametrize("argv, flags", [
    (["reproduce", "--quick", "--profile", "full"], ("--quick", "--profile")),
    (["reproduce", "--profile", "tiny", "--quick"], ("--quick", "--profile")),
    (["experiment", "sparse", "--tiny", "--quick"], ("--quick", "--tiny")),
])
def test_conflicting_profile_flags_are_refused_naming_both(
        argv: list[str], flags: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        no_reproduction: None, capsys: pytest.CaptureFixture[str]) -> None:
    from marconi.lab.sparse import command as sparse_command

    monkeypatch.setattr(sparse_command, "run_study", _never("the sparse study"))
    monkeypatch.setattr(sparse_command, "study_workload", _never("the sparse study's workloads"))
    code, err = _run(argv + ["--out", str(tmp_path / "out")], capsys)
    assert code == 2, err
    assert all(flag in err.splitlines()[-1] for flag in flags), err


# ------------------------------------------------------------------ messages name the flag
@pytest.mark.parametrize("argv, flag, value", [
    (["experiment", "sparse", "--tiny", "--capacities", "zz"], "--capacities", "'zz'"),
    (["experiment", "sparse", "--tiny", "--capacities", "large,zz"], "--capacities", "'zz'"),
    (["experiment", "sparse", "--tiny", "--model", "zz"], "--model", "'zz'"),
    (["experiment", "sparse", "--tiny", "--workloads", "zz"], "--workloads", "zz"),
    (["experiment", "sparse", "--tiny", "--budgets", "0"], "--budgets", "'0'"),
    (["experiment", "headroom", "--capacities", "zz"], "--capacities", "'zz'"),
    (["experiment", "headroom", "--default", "zz"], "--default", "'zz'"),
    (["experiment", "headroom", "--default", "marconi:alpha=x"], "--default marconi:alpha=x: alpha:", "'x'"),
    (["experiment", "headroom", "--model", "zz"], "--model", "'zz'"),
])
def test_experiment_option_errors_name_the_flag_before_any_work(
        argv: list[str], flag: str, value: str, tmp_path: Path, trace_file: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import marconi.commandline
    from marconi.lab.sparse import command as sparse_command

    monkeypatch.setattr(sparse_command, "run_study", _never("the sparse study"))
    monkeypatch.setattr(sparse_command, "study_workload", _never("the sparse study's workloads"))
    monkeypatch.setattr(marconi.commandline, "load_trace", _never("the headroom trace load"))
    extra = ["--traces", str(trace_file)] if argv[1] == "headroom" else []
    code, err = _run(argv + extra + ["--out", str(tmp_path / "out")], capsys)
    assert code == 2, err
    line = err.strip().splitlines()[-1]
    assert flag in line and value in line, err
    if flag.startswith("--default marconi"):
        assert line.count(argv[-1]) == 1, f"the system is named once: {line}"
    assert not (tmp_path / "out").exists()


def test_sparse_budgets_may_come_in_any_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--budgets 4,2 is the set {2, 4}, not a refusal of the order (the study wants them ascending)."""
    from marconi.lab.sparse import command as sparse_command

    seen = []

    def stop(name, scale, seed):
        seen.append(name)
        raise ConfigError("stopped before the study")
    monkeypatch.setattr(sparse_command, "study_workload", stop)
    assert main(["experiment", "sparse", "--tiny", "--budgets", "4,2", "--workloads", "swe",
                 "--out", str(tmp_path / "out")]) == 2
    assert seen == ["swe"]


@pytest.mark.parametrize("argv, flag", [
    (["--eviction", "zz"], "--eviction"),
    (["--eviction", "oracle"], "--eviction"),   # needs the whole trace: refused now, not in the replay
    (["--model", "zz"], "--model"),
])
def test_engine_bench_checks_eviction_and_model_before_the_trace_and_the_model_load(
        argv: list[str], flag: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")   # the engine's extra: the bench imports it before it names an unknown model
    import marconi.engine.models
    from marconi.lab import engine_bench

    monkeypatch.setattr(engine_bench, "trace_requests", _never("the trace load"))
    monkeypatch.setattr(marconi.engine.models, "load_model", _never("the model load"))
    code, err = _run(["engine", "bench", "--limit", "1", "--lengths", "", *argv], capsys)
    assert code == 2, err
    line = err.strip().splitlines()[-1]
    assert flag in line and argv[1] in line, err


@pytest.mark.parametrize("name, said", [("zz", "--model: unknown model 'zz': use a preset (bamba-tiny"),
                                        (" ", "--model: the model is empty (' '): use a preset (bamba-tiny")])
def test_engine_info_and_bench_word_a_model_they_cannot_find_alike(
        name: str, said: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    from marconi.lab import engine_bench

    monkeypatch.setattr(engine_bench, "trace_requests", _never("the trace load"))
    lines = []
    for argv in (["engine", "info", "--model", name], ["engine", "bench", "--limit", "1", "--lengths", "", "--model", name]):
        code, err = _run(argv, capsys)
        assert code == 2, err
        lines.append(err.strip().splitlines()[-1])
    assert said in lines[0], lines
    assert lines[0].split("error: ", 1)[1] == lines[1].split("error: ", 1)[1], lines


# ------------------------------------------------------------------ vllm bench
def test_vllm_bench_refused_python_leaves_no_work_dir(tmp_path: Path, trace_file: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)   # the default --work-dir and --out are relative: results/...
    missing = str(tmp_path / "no-vllm" / "python")
    code, err = _run(["vllm", "bench", "--vllm-python", missing, "--trace", trace_file.name,
                      "--num-requests", "1"], capsys)
    assert code == 2 and f"--vllm-python {missing}" in err, err
    assert not (tmp_path / "results").exists(), list((tmp_path / "results").rglob("*"))


@pytest.mark.parametrize("retention", ["17", "16"])
def test_vllm_bench_retention_hint_names_the_bench_models_blocks(
        retention: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from marconi.integrations.vllm.models import BLOCK_SIZES

    code, err = _run(["vllm", "bench", "--vllm-python", str(tmp_path / "absent"), "--retention", retention,
                      "--work-dir", str(tmp_path / "work"), "--out", str(tmp_path / "o.jsonl")], capsys)
    assert code == 2, err
    line = err.strip().splitlines()[-1]
    assert "--retention" in line and f"'{retention}'" in line, err
    assert all(f"{block} tokens for {name}" in line for name, block in BLOCK_SIZES.items()), err
    assert "nemotron-h-8b" not in line   # the replay's model, not one the bench runs
    assert not (tmp_path / "work").exists()
