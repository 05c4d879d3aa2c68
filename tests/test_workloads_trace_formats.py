"""Trace formats join one table (issue 20): each format module registers its reader, writer, meta
reader and suffixes, and nothing in ``files.py`` names a format."""

from __future__ import annotations

import ast
import io
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, Mapping

import numpy as np
import pytest

import marconi.workloads.trace.files as files
from marconi.workloads import Request, Trace, read_trace, read_trace_meta, validate_trace, write_trace
from marconi.workloads.trace import TraceFormat, register_format, trace_format
from marconi.workloads.trace.formats import format_named, format_names, format_of, unregister_format
from marconi.workloads.trace.schema import Record, check_record
from marconi.workloads.trace.sidecar import read_sidecar


def test_the_shipped_formats_are_registered_with_their_suffixes():
    assert format_names() == ["jsonl", "jsonl.gz", "parquet"]
    assert [format_named(n).suffixes for n in format_names()] == [(".jsonl",), (".jsonl.gz",), (".parquet",)]
    assert [format_named(n).sidecar for n in format_names()] == [True, True, False]
    assert format_named("parquet").position == "row" and format_named("jsonl").position == "line"
    assert trace_format("A.JSONL.GZ") == "jsonl.gz" and trace_format("x.jsonl") == "jsonl"
    with pytest.raises(ValueError, match=r"x\.csv: unknown trace format \(use \.jsonl, \.jsonl\.gz or \.parquet\)"):
        trace_format("x.csv")


def test_files_py_names_no_format():
    """The if/elif chains on format names are gone: no format name or suffix is a literal there."""
    tree = ast.parse(Path(files.__file__).read_text(encoding="utf-8"))
    names = {n for fmt in format_names() for n in (fmt, *format_named(fmt).suffixes)}
    literals = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    assert not literals & names


def test_registering_a_clashing_format_is_refused():
    def nothing(*args: Any) -> Any:
        raise AssertionError("never called")

    with pytest.raises(ValueError, match="registered twice"):
        register_format(TraceFormat("jsonl", (".other",), nothing, nothing, nothing))
    with pytest.raises(ValueError, match="'.jsonl' is already 'jsonl'"):
        register_format(TraceFormat("mine", (".jsonl",), nothing, nothing, nothing))
    with pytest.raises(ValueError, match="lower-case"):
        TraceFormat("mine", ("TSV",), nothing, nothing, nothing)


# ============================================================================ a new format is one module


def _tsv_records(path: Path) -> Iterator[Record]:
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        sid, turn, ts, inputs, outputs = line.split("\t")
        tokens = {"input_tokens": np.array(inputs.split(), dtype=np.int32),
                  "output_tokens": np.array(outputs.split(), dtype=np.int32)}
        yield (lineno, *check_record({"session_id": int(sid), "turn_id": int(turn), "ts": float(ts)}, tokens))


def _tsv_write(fh: IO[bytes], requests: Iterable[Request], name: str, meta: Mapping[str, Any]) -> int:
    text = io.TextIOWrapper(fh, encoding="utf-8")
    n = 0
    for r in requests:
        text.write(f"{r.session_id}\t{r.turn_id}\t{r.ts!r}\t{' '.join(map(str, r.input_tokens.tolist()))}\t"
                   f"{' '.join(map(str, r.output_tokens.tolist()))}\n")
        n += 1
    text.detach()
    return n


@pytest.fixture
def tsv_format():
    fmt = register_format(TraceFormat("tokens-tsv", (".tokens.tsv",), _tsv_records, _tsv_write, read_sidecar,
                                      sidecar=True))
    yield fmt
    unregister_format(fmt.name)


def test_a_registered_format_reads_writes_and_validates_like_the_shipped_ones(tmp_path, tsv_format):
    reqs = [Request(0, 0, 0.0, [1, 2, 3], [4]), Request(0, 1, 1.5, [1, 2, 3, 4, 5], [])]
    path = tmp_path / "t.tokens.tsv"
    assert format_of(path) == (tsv_format, ".tokens.tsv")
    assert write_trace(path, Trace(reqs, name="toy", meta={"k": 1})) == 2
    back = read_trace(path)
    assert list(back) == reqs and read_trace_meta(path) == ("toy", {"k": 1})
    assert Path(f"{path}.meta.json").exists()  # the sidecar, written as a pair with the trace
    assert validate_trace(path) == []
    path.write_text("0\t0\t0.0\t\t1\n", encoding="utf-8")
    (problem,) = validate_trace(path)
    assert (problem.line, problem.field) == (1, "input_tokens") and "empty" in problem.message
    with pytest.raises(ValueError, match=r"use \.jsonl, \.jsonl\.gz, \.parquet or \.tokens\.tsv"):
        trace_format("x.csv")
