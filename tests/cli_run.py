"""The ``marconi`` command line as the bad-input tests drive it, in this process."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from marconi.cli import main


class CliRun(NamedTuple):
    code: int      # the exit code: main()'s return, or argparse's SystemExit
    err: str
    out: str


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> CliRun:
    """Run ``marconi ARGV``; its exit code (argparse's refusals exit through SystemExit), stderr and
    stdout. Bad input must never reach the user as a traceback: asserted here for every run."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err, captured.err
    return CliRun(int(code or 0), captured.err, captured.out)
