"""Trace schema, JSONL/Parquet I/O, validation and atomic writes."""

from __future__ import annotations

import gzip
import json
import os
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from marconi.workloads import (Request, Trace, TraceFormatError, chat_trace, iter_requests, read_trace,
                               read_trace_meta, trace_stats, validate_trace, write_trace)


def _requests(n: int = 30, str_ids: bool = False) -> list[Request]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        sid = f"s{i % 4}" if str_ids else i % 4
        out.append(Request(sid, i // 4, 0.5 * i, rng.integers(0, 32000, 5 + i),
                           rng.integers(0, 32000, i % 3)))
    return out


def _line(**fields) -> str:
    rec = {"session_id": 0, "turn_id": 0, "ts": 0.0, "input_tokens": [1, 2, 3], "output_tokens": [4]}
    rec.update(fields)
    return json.dumps({k: v for k, v in rec.items() if v is not _DROP})


_DROP = object()


def _write_lines(path: Path, lines: list[str], final_newline: bool = True) -> Path:
    path.write_text("\n".join(lines) + ("\n" if final_newline else ""), encoding="utf-8")
    return path


# ============================================================================ in-memory schema


def test_request_converts_to_readonly_int32_and_reports_lengths():
    src = np.array([5, 6, 7], dtype=np.int64)
    req = Request(3, 1, 2, src, [9])
    assert req.input_tokens.dtype == np.int32 and req.output_tokens.dtype == np.int32
    assert (req.input_len, req.output_len, req.ts) == (3, 1, 2.0)
    assert isinstance(req.ts, float)
    with pytest.raises(ValueError):
        req.input_tokens[0] = 1
    src32 = np.arange(1, 4, dtype=np.int32)
    Request(0, 0, 0.0, src32, [])
    src32[0] = 7  # the caller's own array stays writable
    assert src32[0] == 7


@pytest.mark.parametrize("kwargs, match", [
    (dict(input_tokens=[]), "must not be empty"),
    (dict(input_tokens=[1, -2]), r"\[0, "),
    (dict(input_tokens=[1, 2**31]), r"\[0, "),
    (dict(input_tokens=[1.5]), "integers"),
    (dict(input_tokens=[[1, 2]]), "1-D"),
    (dict(turn_id=-1), "turn_id"),
    (dict(ts=float("nan")), "ts"),
    (dict(ts=-1.0), "ts"),
    (dict(session_id=1.5), "session_id"),
    (dict(session_id=True), "session_id"),
])
def test_request_rejects_bad_fields(kwargs, match):
    fields = dict(session_id=0, turn_id=0, ts=0.0, input_tokens=[1], output_tokens=[])
    fields.update(kwargs)
    with pytest.raises(ValueError, match=match):
        Request(**fields)


def test_trace_requires_arrival_order_and_from_unsorted_is_stable():
    a = Request(0, 0, 1.0, [1], [])
    b = Request(1, 0, 0.5, [2], [])
    c = Request(2, 0, 1.0, [3], [])
    with pytest.raises(ValueError, match="earlier"):
        Trace([a, b])
    trace = Trace.from_unsorted([a, b, c], name="t", meta={"k": 1})
    assert [r.session_id for r in trace] == [1, 0, 2]
    assert trace.num_sessions == 3 and trace.total_input_tokens == 3 and trace.duration_s == 0.5


def test_trace_summaries():
    reqs = _requests(30)
    trace = Trace(reqs, name="x")
    assert len(trace) == 30 and trace[0] == reqs[0]
    assert trace.session_ids == [0, 1, 2, 3]
    assert trace.total_input_tokens == sum(5 + i for i in range(30))
    assert trace.total_output_tokens == sum(i % 3 for i in range(30))
    s = trace.stats()
    assert s.num_requests == 30 and s.num_sessions == 4 and s.max_turns_per_session == 8
    assert s.input_len_min == 5 and s.input_len_max == 34
    assert s.input_len_p50 == pytest.approx(np.percentile(np.arange(5, 35), 50))
    assert [len(v) for v in trace.sessions().values()] == [8, 8, 7, 7]
    assert np.array_equal(trace.input_lens(), np.arange(5, 35))


# ============================================================================ round trips


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".parquet"])
@pytest.mark.parametrize("str_ids", [False, True])
def test_round_trip(tmp_path, suffix, str_ids):
    trace = Trace(_requests(30, str_ids), name="demo", meta={"source": "test", "params": {"a": 1}})
    path = tmp_path / f"t{suffix}"
    assert write_trace(path, trace) == 30
    back = read_trace(path)
    assert back.name == "demo" and back.meta == trace.meta
    assert len(back) == len(trace)
    for x, y in zip(back, trace):
        assert x == y and type(x.session_id) is type(y.session_id)
    assert validate_trace(path) == []
    assert oct(path.stat().st_mode & 0o777) != oct(0o600)  # not mkstemp's private mode


def test_jsonl_parquet_conversion_both_ways(tmp_path):
    trace = chat_trace(num_sessions=20, seed=3)
    write_trace(tmp_path / "a.jsonl", trace)
    write_trace(tmp_path / "b.parquet", read_trace(tmp_path / "a.jsonl"))
    write_trace(tmp_path / "c.jsonl", read_trace(tmp_path / "b.parquet"))
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "c.jsonl").read_bytes()
    assert all(x == y for x, y in zip(read_trace(tmp_path / "b.parquet"), trace))


def test_reads_the_authors_format(tmp_path):
    # the authors' script writes json.dump(dict) lines: this key order, num_* present, int ts allowed
    lines = [json.dumps({"session_id": 0, "turn_id": 0, "ts": 0, "num_input_tokens": 3,
                         "num_output_tokens": 2, "input_tokens": [1, 415, 2936], "output_tokens": [1, 733]}),
             json.dumps({"session_id": 1, "turn_id": 0, "ts": 0.5,
                         "input_tokens": [1, 415], "output_tokens": [], "extra": "ignored"})]
    path = _write_lines(tmp_path / "paper.jsonl", lines)
    trace = read_trace(path)
    assert [r.input_tokens.tolist() for r in trace] == [[1, 415, 2936], [1, 415]]
    assert trace[0].output_tokens.tolist() == [1, 733] and trace[1].output_len == 0
    assert trace.name == "paper" and trace.meta == {}


def test_odd_but_valid_json_takes_the_slow_path(tmp_path):
    lines = ['{"input_tokens":[ 1 ,2\t,3 ],"output_tokens":[],"session_id":"a","turn_id":0,"ts":1e0}',
             '{"session_id": 0, "turn_id": 1, "ts": 2, "input_tokens": [7], "output_tokens": [8], '
             '"nested": {"input_tokens": [1]}}']
    trace = read_trace(_write_lines(tmp_path / "odd.jsonl", lines))
    assert trace[0].input_tokens.tolist() == [1, 2, 3] and trace[0].session_id == "a"
    assert trace[1].input_tokens.tolist() == [7]


def test_write_jsonl_matches_json_dumps_of_records(tmp_path):
    trace = Trace(_requests(5))
    write_trace(tmp_path / "a.jsonl", trace)
    lines = (tmp_path / "a.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [r.to_record() for r in trace]
    sidecar = json.loads((tmp_path / "a.jsonl.meta.json").read_text())
    assert sidecar["num_requests"] == 5


def test_limit_and_stats_from_file(tmp_path):
    trace = Trace(_requests(30))
    write_trace(tmp_path / "a.parquet", trace)
    assert len(read_trace(tmp_path / "a.parquet", limit=7)) == 7
    assert trace_stats(tmp_path / "a.parquet") == trace.stats()


# ============================================================================ bad input


def test_error_message_names_file_line_and_field(tmp_path):
    lines = [_line(ts=float(i)) for i in range(16)]
    lines.append(_line(ts=16.0, input_tokens=[1, 2, 3, "x"]))
    path = _write_lines(tmp_path / "trace.jsonl", lines)
    with pytest.raises(TraceFormatError) as info:
        read_trace(path)
    assert str(info.value) == f"{path}:17: field 'input_tokens': element 3 is not an integer ('x')"
    assert info.value.line == 17 and info.value.field == "input_tokens"


@pytest.mark.parametrize("line, field, fragment", [
    (_line(input_tokens=[1, 2.5]), "input_tokens", "element 1 is not an integer (2.5)"),
    (_line(input_tokens=[1, True]), "input_tokens", "element 1 is not an integer (True)"),
    (_line(input_tokens=[[1], [2]]), "input_tokens", "element 0 is not an integer ([1])"),
    (_line(input_tokens=[[1], [2, 3]]), "input_tokens", "element 0 is not an integer ([1])"),
    (_line(input_tokens=[1, 2**70]), "input_tokens", "element 1 (1180591620717411303424) does not fit"),
    (_line(output_tokens=[3, -1]), "output_tokens", "element 1 is negative (-1)"),
    (_line(input_tokens=[2**31]), "input_tokens", "does not fit int32"),
    (_line(input_tokens=[]), "input_tokens", "empty"),
    (_line(input_tokens="1,2"), "input_tokens", "expected a list of integers, got a string ('1,2')"),
    (_line(input_tokens=_DROP), "input_tokens", "missing"),
    (_line(session_id=_DROP), "session_id", "missing"),
    (_line(session_id=[1]), "session_id", "expected an integer or a string, got a list"),
    (_line(turn_id="0"), "turn_id", "expected an integer, got a string ('0')"),
    (_line(ts="0"), "ts", "expected a number of seconds, got a string ('0')"),
    (_line(num_input_tokens=4), "num_input_tokens", "says 4 but input_tokens has 3"),
    (_line(num_output_tokens=0), "num_output_tokens", "says 0 but output_tokens has 1"),
    ("[1, 2, 3]", None, "expected a JSON object, got a list"),
    ('{"session_id": 0, "turn_id": 0, "ts": 0.0, "input_tokens": [1, 2,, 3], "output_tokens": []}',
     "input_tokens", "invalid JSON"),  # a syntax error inside a token list names the list
    ('{"session_id": 0, "turn_id": 0, "ts": 0.0 "input_tokens": [1], "output_tokens": []}',
     None, "invalid JSON"),
])
def test_each_kind_of_bad_line(tmp_path, line, field, fragment):
    path = _write_lines(tmp_path / "t.jsonl", [_line(), line])
    with pytest.raises(TraceFormatError) as info:
        list(iter_requests(path))
    assert info.value.line == 2 and info.value.field == field
    assert fragment in str(info.value)


def test_truncated_file(tmp_path):
    good = [_line(ts=float(i)) for i in range(3)]
    text = "\n".join(good) + "\n" + _line(ts=3.0)[:25]
    path = tmp_path / "cut.jsonl"
    path.write_text(text)
    with pytest.raises(TraceFormatError, match=r"cut\.jsonl:4: invalid JSON.*truncated"):
        read_trace(path)
    assert len(read_trace(path, limit=3)) == 3  # the good part streams fine


def test_decreasing_timestamps(tmp_path):
    path = _write_lines(tmp_path / "t.jsonl", [_line(ts=1.0), _line(ts=2.0), _line(ts=1.5)])
    with pytest.raises(TraceFormatError, match=r"t\.jsonl:3: field 'ts': timestamp 1\.5 is earlier"):
        read_trace(path)


def test_validate_reports_every_problem(tmp_path):
    lines = [
        _line(ts=0.0),
        _line(ts=1.0, input_tokens=[1, "x"], turn_id=_DROP),   # 2 problems
        _line(ts=2.0),
        _line(ts=1.0),                                           # decreasing
        "not json",
        _line(ts=3.0, input_tokens=[], num_input_tokens=2),     # 2 problems
        _line(ts=4.0, output_tokens=[-5]),
    ]
    path = _write_lines(tmp_path / "bad.jsonl", lines)
    problems = validate_trace(path)
    assert [(p.line, p.field) for p in problems] == [
        (2, "turn_id"), (2, "input_tokens"), (4, "ts"), (5, None),
        (6, "input_tokens"), (6, "num_input_tokens"), (7, "output_tokens")]
    assert all(str(p).startswith(f"{path}:{p.line}: ") for p in problems)


def test_validate_missing_and_empty_files(tmp_path):
    assert "not found" in validate_trace(tmp_path / "none.jsonl")[0].message
    (tmp_path / "empty.jsonl").write_text("")
    assert "no requests" in validate_trace(tmp_path / "empty.jsonl")[0].message
    with pytest.raises(FileNotFoundError, match="none.jsonl"):
        read_trace(tmp_path / "none.jsonl")
    with pytest.raises(ValueError, match="unknown trace format"):
        read_trace(tmp_path / "x.csv")


def test_corrupt_gzip(tmp_path):
    path = tmp_path / "t.jsonl.gz"
    data = gzip.compress(("\n".join(_line(ts=float(i)) for i in range(50)) + "\n").encode())
    path.write_bytes(data[: len(data) // 2])
    problems = validate_trace(path)
    assert problems and problems[-1].field is None


def test_parquet_problems_name_the_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({
        "session_id": pa.array([0, 1, 2, 3], pa.int64()),
        "turn_id": pa.array([0, 0, 0, 0], pa.int64()),
        "ts": pa.array([0.0, 2.0, 1.0, 3.0]),
        "input_tokens": pa.array([[1], [2, -3], [4], [2**40]], pa.list_(pa.int64())),
        "output_tokens": pa.array([[], [], [], []], pa.list_(pa.int64())),
    })
    path = tmp_path / "bad.parquet"
    pq.write_table(table, path)
    problems = validate_trace(path)
    assert [(p.row, p.field) for p in problems] == [(1, "input_tokens"), (2, "ts"), (3, "input_tokens")]
    assert str(problems[0]).startswith(f"{path}:row 1: field 'input_tokens': element 1 (-3) is negative")
    with pytest.raises(TraceFormatError, match="row 1"):
        read_trace(path)
    pq.write_table(table.set_column(3, "input_tokens", pa.array(["a", "b", "c", "d"])), tmp_path / "s.parquet")
    problems = validate_trace(tmp_path / "s.parquet")
    assert [(p.field, p.message) for p in problems] == [
        ("input_tokens", "expected a list<int> column, got string")]
    pq.write_table(table.drop(["ts"]), tmp_path / "nots.parquet")
    problems = validate_trace(tmp_path / "nots.parquet")
    assert [(p.field, p.message) for p in problems] == [("ts", "missing column")]


# ============================================================================ atomic writes


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".parquet"])
def test_failed_write_leaves_nothing(tmp_path, suffix):
    reqs = _requests(10)

    def exploding():
        yield from reqs[:6]
        raise RuntimeError("boom")

    path = tmp_path / f"out{suffix}"
    with pytest.raises(RuntimeError, match="boom"):
        write_trace(path, exploding())
    assert list(tmp_path.iterdir()) == []

    # an existing trace survives a failed overwrite untouched
    write_trace(path, Trace(reqs[:3]))
    before = path.read_bytes()
    with pytest.raises(ValueError, match="arrival order"):
        write_trace(path, [reqs[5], reqs[1]])
    assert path.read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_parquet_rejects_mixed_session_id_types(tmp_path):
    reqs = [Request(0, 0, 0.0, [1], []), Request("a", 0, 1.0, [1], [])]
    with pytest.raises(ValueError, match="one type"):
        write_trace(tmp_path / "m.parquet", reqs)
    assert list(tmp_path.iterdir()) == []
    write_trace(tmp_path / "m.jsonl", reqs)  # JSONL keeps both as given
    assert [r.session_id for r in read_trace(tmp_path / "m.jsonl")] == [0, "a"]


# ============================================================================ streaming and speed


@pytest.fixture(scope="module")
def big_trace_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("big")
    trace = chat_trace(num_sessions=300, turns=(10, 20), user_len=200, output_len=330, seed=1)
    write_trace(d / "big.jsonl", trace)
    write_trace(d / "big.parquet", trace)
    return trace, d / "big.jsonl", d / "big.parquet"


def test_first_request_is_cheap(big_trace_files):
    trace, jsonl, parquet = big_trace_files
    assert jsonl.stat().st_size > 50_000_000
    tracemalloc.start()
    first = next(iter_requests(jsonl))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert first == trace[0]
    assert peak < 2_000_000  # one line, not the 50+ MB file

    import pyarrow as pa
    base = pa.total_allocated_bytes()
    it = iter_requests(parquet)
    assert next(it) == trace[0]
    assert pa.total_allocated_bytes() - base < 16_000_000  # one small batch, not the whole file
    it.close()


def test_large_trace_round_trips(big_trace_files):
    """Speed is measured by benchmarks/trace_load_bench.py, not asserted here (machines are noisy)."""
    trace, jsonl, parquet = big_trace_files
    for path in (jsonl, parquet):
        back = read_trace(path)
        assert len(back) == len(trace) and back[0] == trace[0] and back[-1] == trace[-1]
        assert back.total_input_tokens == trace.total_input_tokens


def test_read_trace_meta_without_sidecar(tmp_path):
    path = _write_lines(tmp_path / "x.jsonl.gz", [])
    path.write_bytes(gzip.compress(_line().encode() + b"\n"))
    assert read_trace_meta(path) == ("x", {})
    assert len(read_trace(path)) == 1
    os.remove(path)
