"""Issue 31, mechanism 1: one output guard for every command that writes.

Every output option is found from the parser itself (``build_parser()``), never from a list kept
by hand, and each must refuse, before its command does any work, an input of the command (spelled
relative, ``./x``, absolute or through a symlink), a directory where a file goes and an
unwritable place. "Before any work": every command's handler is replaced by one that fails the
test, so a refusal that came from the handler (after loading a trace, spawning vLLM or SGLang)
cannot pass. No test here needs vLLM or SGLang.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Iterator

import pytest

import marconi.cli
from marconi.cli import build_parser, guard_outputs, main
from marconi.core.registry import ConfigError
from marconi.options import chosen_actions, output_kind

TRACE_LINE = '{"session_id": "s", "turn_id": 0, "input_tokens": [1, 2, 3, 4], "output_tokens": [5, 6], "ts": 0.0}\n'
UNWRITABLE = "/proc/marconi-no-such-dir"   # cannot be created, not even by root

# Options a command cannot run without, other than the output under test (and its input).
REQUIRED: dict[str, list[str]] = {
    "vllm replay": ["--blocks", "100", "--concurrency", "1"],
    "trace build synthetic": ["chat"],
    "trace build bundled": ["swe-sample"],
    "experiment sparse": ["--out", "sparse-out"],
    "experiment headroom": ["--out", "headroom-out"],
    "vllm frontier": ["--out", "frontier-out"],
}
# Where each command takes an input file, in order of preference (positional dests included).
INPUT_OPTIONS = ("--trace", "--traces", "results", "files", "paths", "file", "--model", "--lmsys")
OUTPUT_LIKE = re.compile(r"^--(out|plot|plots|report|work-dir|record-fixture)(-.*)?$")


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield " ".join(path), parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from _leaves(sub, path + (name,))


def _outputs() -> list[tuple[str, str, str]]:
    """(command, flag, kind) of every output option of every leaf command, from the parser."""
    found = []
    for command, leaf in _leaves(build_parser()):
        for action in leaf._actions:
            if output_kind(action):
                found.append((command, action.option_strings[-1], output_kind(action)))
    return found


OUTPUTS = _outputs()


def _input_option(command: str) -> str | None:
    leaf = dict(_leaves(build_parser()))[command]
    names = {a.option_strings[-1] if a.option_strings else a.dest for a in leaf._actions}
    return next((o for o in INPUT_OPTIONS if o in names), None)


def _argv(command: str, flag: str, value: str, input_path: str | None) -> list[str]:
    argv = command.split() + [a for a in REQUIRED.get(command, []) if True]
    if "--out" == flag and "--out" in argv:   # the required --out is the one under test
        i = argv.index("--out")
        del argv[i:i + 2]
    option = _input_option(command)
    if input_path is not None and option is not None:
        argv += [input_path] if not option.startswith("--") else [option, input_path]
    return argv + [f"{flag}={value}"]


@pytest.fixture()
def no_work(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every command's handler replaced by one that records it ran (the test then fails)."""
    ran: list[str] = []
    parser = build_parser()

    def boom(args: argparse.Namespace) -> int:
        ran.append(args.command)
        return 0

    for _, leaf in _leaves(parser):
        leaf.set_defaults(func=boom)
    monkeypatch.setattr(marconi.cli, "build_parser", lambda: parser)
    return ran


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    try:
        code = main(argv)
    except SystemExit as exc:      # argparse's own refusal (a --out type such as trace build's suffix)
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, (argv, code, err)
    assert "Traceback" not in err, err
    return err


def test_the_walk_finds_the_outputs_of_every_writing_command() -> None:
    """The enumeration below is the parser's own: the commands the issue names are in it."""
    commands = {c for c, _, _ in OUTPUTS}
    assert {"simulate", "mrc", "compare", "demo", "vllm replay", "vllm bench", "vllm frontier", "sglang bench",
            "engine bench", "trace build swe", "experiment sparse", "experiment headroom", "reproduce"} <= commands
    assert ("vllm replay", "--plot", "file") in OUTPUTS and ("vllm frontier", "--out", "dir") in OUTPUTS


def test_every_output_like_option_is_marked_for_the_guard() -> None:
    """A new command cannot forget the guard: an option named like an output that is not declared
    with ``marconi.options.add_output`` fails here."""
    unmarked = []
    for command, leaf in _leaves(build_parser()):
        for action in leaf._actions:
            takes_a_path = action.nargs != 0          # not a switch such as --report-only
            if takes_a_path and any(OUTPUT_LIKE.match(o) for o in action.option_strings) and not output_kind(action):
                unmarked.append(f"{command} {action.option_strings[-1]}")
    assert not unmarked, "declare these with marconi.options.add_output: " + ", ".join(unmarked)


@pytest.mark.parametrize("command,flag,kind", OUTPUTS, ids=[f"{c} {f}" for c, f, _ in OUTPUTS])
def test_every_output_refuses_an_input_a_directory_and_an_unwritable_place_before_any_work(
        command: str, flag: str, kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], no_work: list[str]) -> None:
    """Issue 31 mechanism 1 (bugs 1 and 2 are two rows of it): for every output of every command."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.jsonl").write_text(TRACE_LINE)
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "t.jsonl")
    has_input = _input_option(command) is not None
    if has_input:
        # the input spelled four ways, as the output (a file output) or as the directory holding it
        spellings = ["t.jsonl", "./t.jsonl", str(tmp_path / "t.jsonl"), "link.jsonl"]
        if kind == "dir":
            spellings += [".", str(tmp_path)]
        for spelling in spellings:
            err = _refused(_argv(command, flag, spelling, "t.jsonl"), capsys)
            assert flag in err, (spelling, err)
    if kind == "file":
        (tmp_path / "dir.jsonl").mkdir()
        err = _refused(_argv(command, flag, "dir.jsonl", "t.jsonl" if has_input else None), capsys)
        assert "directory" in err and flag in err, err
    elif kind == "workdir":  # a scratch directory: a file there is refused
        err = _refused(_argv(command, flag, "t.jsonl", None), capsys)
        assert "not a directory" in err and flag in err, err
    err = _refused(_argv(command, flag, f"{UNWRITABLE}/x.jsonl", "t.jsonl" if has_input else None), capsys)
    assert flag in err and UNWRITABLE in err, err
    assert no_work == [], f"{command} ran its handler before refusing {flag}"
    assert (tmp_path / "t.jsonl").read_text() == TRACE_LINE


# ---------------------------------------------------------------- the rows, by name
def test_bug1_vllm_replay_out_equal_to_its_trace_is_refused_before_the_replay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], no_work: list[str]) -> None:
    """Issue 31 bug 1: ``vllm replay --out`` = ``--trace`` replaced the trace (exit 0); a directory
    or read-only ``--out`` failed only after the replay. Also ``vllm bench`` and ``vllm frontier``."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.jsonl").write_text(TRACE_LINE)
    (tmp_path / "d").mkdir()
    replay = ["vllm", "replay", "--trace", "t.jsonl", "--blocks", "100", "--concurrency", "1", "--plot", ""]
    for out in ("t.jsonl", "./t.jsonl", str(tmp_path / "t.jsonl"), "d", f"{UNWRITABLE}/o.jsonl"):
        assert "--out" in _refused(replay + ["--out", out], capsys)
    assert "--plot" in _refused(replay + ["--out", "o.jsonl", "--plot", "t.jsonl"], capsys)
    assert "give each output its own file" in _refused(replay + ["--out", "o.jsonl", "--plot", "./o.jsonl"], capsys)
    bench = ["vllm", "bench", "--trace", "t.jsonl", "--plot", ""]
    assert "also an input" in _refused(bench + ["--out", "./t.jsonl"], capsys)
    assert "also an input" in _refused(bench + ["--out", "o.jsonl", "--record-fixture", "t.jsonl"], capsys)
    frontier = ["vllm", "frontier", "--traces", "t.jsonl"]
    assert "inside --out" in _refused(frontier + ["--out", "."], capsys)
    assert "is inside --out t.jsonl" in _refused(frontier + ["--out", "t.jsonl"], capsys)   # the trace as --out
    (tmp_path / "other.jsonl").write_text(TRACE_LINE)
    assert "not a directory" in _refused(frontier + ["--out", "other.jsonl"], capsys)
    assert no_work == [] and (tmp_path / "t.jsonl").read_text() == TRACE_LINE


def test_bug2_sglang_bench_out_equal_to_its_trace_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], no_work: list[str]) -> None:
    """Issue 31 bug 2: ``sglang bench --out`` = its trace appended a record to the trace."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.jsonl").write_text(TRACE_LINE)
    for out in ("t.jsonl", "./t.jsonl", str(tmp_path / "t.jsonl")):
        assert "also an input" in _refused(["sglang", "bench", "--trace", "t.jsonl", "--out", out], capsys)
    assert no_work == [] and (tmp_path / "t.jsonl").read_text() == TRACE_LINE


def test_an_out_on_a_trace_sidecar_not_written_yet_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], no_work: list[str]) -> None:
    """Old: ``simulate --out t.jsonl.meta.json`` ran, and every later read of t.jsonl failed on its
    'sidecar' (audit); refused only where the sidecar existed already."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.jsonl").write_text(TRACE_LINE)
    assert "a trace's sidecar" in _refused(["simulate", "--trace", "t.jsonl", "--out", "t.jsonl.meta.json"], capsys)
    assert no_work == [] and not (tmp_path / "t.jsonl.meta.json").exists()


def test_a_rerender_may_read_the_records_inside_its_own_output_directory(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """``--from-records DIR/records.jsonl --out DIR`` is the re-render of a directory from its own
    records (read whole before anything is written): the guard lets it through."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fr").mkdir()
    (tmp_path / "fr" / "records.jsonl").write_text("{}\n")
    parser = build_parser()
    for argv in (["vllm", "frontier", "--out", "fr", "--from-records", "fr/records.jsonl"],
                 ["experiment", "sparse", "--out", "fr", "--from-records", "fr/records.jsonl"],
                 ["experiment", "headroom", "--out", "fr", "--from-records", "fr/records.jsonl"]):
        guard_outputs(parser, parser.parse_args(argv))   # no ConfigError


def test_streams_may_take_several_outputs(tmp_path: Path) -> None:
    """``/dev/null`` as both ``--out`` and ``--plot`` is a way to discard both, not one file twice."""
    parser = build_parser()
    args = parser.parse_args(["vllm", "replay", "--blocks", "100", "--concurrency", "1", "--out", "/dev/null",
                              "--plot", "/dev/null"])
    guard_outputs(parser, args)
    with pytest.raises(ConfigError, match="give each output its own file"):
        guard_outputs(parser, parser.parse_args(["mrc", "--trace", "swe-sample", "--out", str(tmp_path / "a"),
                                                 "--plot", str(tmp_path / "a")]))


def test_chosen_actions_are_those_of_the_leaf_command() -> None:
    parser = build_parser()
    flags = {a.option_strings[-1] for a in chosen_actions(parser, parser.parse_args(["sglang", "bench"]))
             if a.option_strings}
    assert "--sglang-python" in flags and "--vllm-python" not in flags
    assert os.path.basename(UNWRITABLE)


def test_a_plot_left_unset_goes_beside_out_and_is_guarded_like_a_named_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], no_work: list[str]) -> None:
    """``vllm replay`` and ``vllm bench`` wrote their plot to a fixed ``results/`` file whatever
    ``--out`` said, so two runs with their own ``--out`` overwrote one plot. Unset, ``--plot`` is now
    ``--out`` with ``.png``; ``''`` skips it; a stream ``--out`` gets no plot; the guard checks the
    derived path before any work, naming ``--plot``."""
    from marconi.options import fill_beside

    monkeypatch.chdir(tmp_path)
    parser = build_parser()
    base = {"vllm replay": ["vllm", "replay", "--blocks", "100", "--concurrency", "1"], "vllm bench": ["vllm", "bench"]}
    for command, argv in base.items():
        cases = [(["--out", "runs/a/R.jsonl"], "runs/a/R.png"), (["--out", "R"], "R.png"),
                 (["--out", "R.jsonl", "--plot", "p.png"], "p.png"), (["--out", "R.jsonl", "--plot", ""], ""),
                 (["--out", "/dev/null"], "")]
        for extra, plot in cases:
            args = parser.parse_args(argv + extra)
            fill_beside(parser, args)
            assert args.plot == plot, (command, extra, args.plot)
        assert parser.parse_args(argv).plot is None          # unset until filled
        (tmp_path / "R.png").mkdir()
        err = _refused(argv + ["--out", "R.jsonl"], capsys)
        assert "--plot" in err and "R.png" in err, err
        (tmp_path / "R.png").rmdir()
    assert no_work == []
