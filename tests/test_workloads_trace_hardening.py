"""Trace files against hostile-but-plausible input (issue 21): token lists that only look like JSON,
a sidecar written half, a malformed sidecar, a compressed file under a plain name.

Each test names the case it guards; each failed before its fix.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marconi.workloads import (Request, Trace, TraceFormatError, iter_requests, read_trace, read_trace_meta,
                               validate_trace, write_trace)
from marconi.workloads.commands import register
from marconi.workloads.trace.jsonl import parse_token_list
from marconi.workloads.trace.schema import check_record

INT32_MAX = 2**31 - 1


def _requests(n: int) -> list[Request]:
    rng = np.random.default_rng(n)
    return [Request(i % 3, i // 3, float(i), rng.integers(0, 32000, 4 + i), rng.integers(0, 32000, 2))
            for i in range(n)]


def _run_cli(*argv: str) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="marconi")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    return args.func(args)


# ============================================================================ token lists vs json.loads

_JSON_WS = st.text(alphabet=" \t\r", max_size=3)
_ODD_WS = st.sampled_from(["\x0b", "\x0c", "\u00a0", "\u2003", "\x1c"])  # whitespace to Python, not to JSON


@st.composite
def _valid_element(draw) -> str:
    return str(draw(st.integers(-(2**31), INT32_MAX)))


@st.composite
def _bad_element(draw) -> str:
    """One element text that json.loads refuses, or parses to something that is not a token id."""
    n = draw(st.integers(0, 99999))
    return draw(st.sampled_from([
        "-", "+", "+1", f"0{n}", f"00{n}", f"-0{n}", f"{n}.", f"{n}.5", f"{n}.0", f"{n}e2", f"{n}E+1", ".5",
        f"0x{n}", f"{n} {n}", "", " ", f"[{n}]", f"[{n}, [{n}]]", "[]", f'"{n}"', "true", "null", "NaN",
        "Infinity", "-Infinity", str(2**31), str(2**63), str(2**70), "-0", "\u0661", f"{n}\u0662", "1_000",
        f"{n}-", f"--{n}", "- 1", "{}",
    ]))


@st.composite
def _token_list(draw) -> str:
    """``[a, b, ...]`` with random JSON whitespace; often one or two mutations that break it."""
    elements = draw(st.lists(_valid_element(), min_size=0, max_size=8))
    for _ in range(draw(st.integers(0, 2))):
        bad = draw(_bad_element())
        elements.insert(draw(st.integers(0, len(elements))), bad)
    parts = []
    for i, element in enumerate(elements):
        ws = draw(_ODD_WS) if draw(st.integers(0, 20)) == 0 else draw(_JSON_WS)
        parts.append(("," if i else "") + draw(_JSON_WS) + element + ws)
    body = "".join(parts)
    if draw(st.booleans()) and draw(st.integers(0, 5)) == 0:
        body += "," + draw(_JSON_WS)  # trailing comma
    opening, closing = "[", "]"
    if draw(st.integers(0, 15)) == 0:
        opening = ""
    if draw(st.integers(0, 15)) == 0:
        closing = ""
    return opening + draw(_JSON_WS) + body + closing


def _line(input_list: str, key_ws: str = " ") -> str:
    return ('{"session_id": 0, "turn_id": 0, "ts": 0.0, "input_tokens"' + key_ws + ":" + key_ws
            + input_list + ', "output_tokens": [7, 8]}')


def _expected(line: str) -> list[int] | None:
    """The tokens json.loads reads from ``line``, or None where the schema must reject the line."""
    try:
        tokens = json.loads(line)["input_tokens"]
    except (ValueError, RecursionError):
        return None
    ok = (isinstance(tokens, list) and tokens
          and all(type(t) is int and 0 <= t <= INT32_MAX for t in tokens))
    return tokens if ok else None


@pytest.fixture(scope="module")
def property_file(tmp_path_factory) -> Path:
    """One file the property tests rewrite per example (module-scoped: Hypothesis reruns the body)."""
    return tmp_path_factory.mktemp("token-lists") / "t.jsonl"


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_token_list(), st.one_of(st.just(" "), _JSON_WS, _ODD_WS))
def test_jsonl_rejects_malformed_token_lists_like_json_loads(property_file, input_list, key_ws):
    """The reader (fast path or not) accepts exactly the lines json.loads + the schema accept, with
    json.loads's tokens; everything else is a problem of that line (issue 21, bug 2)."""
    line = _line(input_list, key_ws)
    property_file.write_text(line + "\n", encoding="utf-8")
    expected = _expected(line)
    problems = validate_trace(property_file)
    if expected is None:
        assert problems and problems[0].line == 1, (line, problems)
        with pytest.raises(TraceFormatError):
            list(iter_requests(property_file))
    else:
        assert problems == [], (line, problems)
        (request,) = list(iter_requests(property_file))
        assert request.input_tokens.tolist() == expected
        assert request.output_tokens.tolist() == [7, 8]


_PADDING = ", ".join(str(i % 977) for i in range(300))  # long enough that the NumPy path parses it


@st.composite
def _long_token_list_body(draw) -> str:
    """A body of 300+ ids (the vectorised path) with random separators and mutations anywhere."""
    elements = draw(st.lists(st.one_of(_valid_element(), _bad_element()), min_size=0, max_size=6))
    seps = st.sampled_from([", ", ",", ", ", ", ", " ,", ",  ", ",\t", "\t,", " , ", ",,", ""])
    middle = "".join(draw(seps) + e for e in elements)
    where = draw(st.sampled_from(["before", "after", "both"]))
    compact = draw(st.booleans())
    padding = _PADDING.replace(", ", ",") if compact else _PADDING
    return {"before": middle.lstrip(", \t") + draw(seps) + padding,
            "after": padding + middle,
            "both": padding + middle + draw(seps) + padding}[where]


def _json_ids(body: str) -> list[int] | None:
    try:
        values = json.loads("[" + body + "]")
    except ValueError:
        return None
    ok = all(type(v) is int and 0 <= v <= INT32_MAX for v in values)
    return values if ok else None


@settings(max_examples=400, deadline=None)
@given(_long_token_list_body())
def test_long_token_lists_parse_exactly_like_json_loads_or_fall_back(property_file, body):
    """The NumPy path of the token-list parser gives json.loads's ids, or None (the line then goes
    to json); never other ids."""
    got = parse_token_list(body)
    if got is not None:
        assert got.dtype == np.int32 and got.tolist() == _json_ids(body), body
    property_file.write_text(_line("[" + body + "]") + "\n", encoding="utf-8")
    expected = _expected(_line("[" + body + "]"))
    if expected is None:
        assert validate_trace(property_file)
    else:
        (request,) = list(iter_requests(property_file))
        assert request.input_tokens.tolist() == expected


def test_writer_forms_take_the_numpy_path():
    """Performance contract: what write_jsonl and json.dumps write is parsed without json."""
    ids = list(range(0, 2**31 - 1, 2**31 // 40000))
    for sep in (", ", ","):
        body = sep.join(map(str, ids))
        got = parse_token_list(body)
        assert got is not None and got.tolist() == ids


@pytest.mark.parametrize("line", [
    # the key nested, the top-level one escaped: json.loads reads input_tokens = 0
    '{"x": {"input_tokens": [5]}, "input\\u005ftokens": 0, "output_tokens": [1], "session_id": 0, '
    '"turn_id": 0, "ts": 0}',
    # the key's quote escaped inside another key
    '{"a\\"input_tokens": [9], "output_tokens": [1], "session_id": 0, "turn_id": 0, "ts": 0}',
    '{"a\\"input_tokens": [9], "input_tokens": [1], "output_tokens": [1], "session_id": 0, "turn_id": 0, "ts": 0}',
    # the key as a string value, then as a key
    '{"session_id": "input_tokens", "input_tokens": [3], "output_tokens": [], "turn_id": 0, "ts": 0}',
    # twice at the top level: json keeps the last
    '{"input_tokens": [1], "input_tokens": [2, 3], "output_tokens": [], "session_id": 0, "turn_id": 0, "ts": 0}',
    # non-JSON whitespace around the colon
    '{"input_tokens"\u00a0: [1], "output_tokens": [], "session_id": 0, "turn_id": 0, "ts": 0}',
    '{"input_tokens":\x0b[1], "output_tokens": [], "session_id": 0, "turn_id": 0, "ts": 0}',
])
def test_odd_lines_read_exactly_as_json_loads_reads_them(tmp_path, line):
    path = tmp_path / "t.jsonl"
    path.write_text(line + "\n", encoding="utf-8")
    try:
        obj = json.loads(line)
    except ValueError:
        assert validate_trace(path)
        return
    fields, problems = check_record(obj)
    got = validate_trace(path)
    assert [(p.field, p.message) for p in got] == problems
    if not problems:
        (request,) = list(iter_requests(path))
        assert request.input_tokens.tolist() == fields["input_tokens"].tolist()


@pytest.mark.parametrize("input_list", [
    "[1, 2, ]",      # trailing comma with a space: np.fromstring read a 0
    "[1, -, 2]",     # lone minus: read as 0
    "[01, 2]",       # leading zero: read as 1
    "[ -]",
    "[1, 2,\t]",
    "[1, 2",         # missing closing bracket
    "1, 2]",         # missing opening bracket
])
def test_trace_validate_names_file_line_and_field_of_a_malformed_token_list(tmp_path, capsys, input_list):
    path = tmp_path / "t.jsonl"
    good = _line("[1, 2]")
    path.write_text(good + "\n" + _line(input_list) + "\n", encoding="utf-8")
    problems = validate_trace(path)
    assert [(p.line, p.field) for p in problems] == [(2, "input_tokens")], problems
    assert "invalid JSON" in problems[0].message
    with pytest.raises(TraceFormatError) as info:
        list(iter_requests(path))
    assert str(info.value).startswith(f"{path}:2: field 'input_tokens': invalid JSON")
    assert _run_cli("trace", "validate", str(path)) == 1
    assert f"{path}:2: field 'input_tokens': invalid JSON" in capsys.readouterr().out


def test_valid_lists_with_unusual_spacing_still_read_exactly(tmp_path):
    path = tmp_path / "t.jsonl"
    lists = ["[0]", "[ 0 , 1 ,2147483647 ]", "[\t3,\r4]", "[-0, 5]", "[1]"]
    path.write_text("".join(_line(x) + "\n" for x in lists), encoding="utf-8")
    assert [r.input_tokens.tolist() for r in read_trace(path)] == [
        [0], [0, 1, INT32_MAX], [3, 4], [0, 5], [1]]


# ============================================================================ the sidecar is written with its trace


def _pair(path: Path) -> tuple[bytes, bytes]:
    return path.read_bytes(), Path(f"{path}.meta.json").read_bytes()


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_failed_sidecar_write_leaves_the_old_trace_and_sidecar_pair(tmp_path, monkeypatch, suffix):
    """Issue 21, bug 8: the new trace was committed before its sidecar, so a failed sidecar write
    left the new trace beside the old sidecar."""
    path = tmp_path / f"t{suffix}"
    write_trace(path, Trace(_requests(3), name="old", meta={"v": 1}))
    before = _pair(path)

    real_replace = os.replace

    def failing_replace(src, dst):
        if os.fspath(dst).endswith(".meta.json"):
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space left"):
        write_trace(path, Trace(_requests(5), name="new", meta={"v": 2}))
    monkeypatch.setattr(os, "replace", real_replace)
    assert _pair(path) == before
    assert read_trace_meta(path) == ("old", {"v": 1}) and len(read_trace(path)) == 3
    assert _leftovers(tmp_path) == []


def test_sidecar_path_that_cannot_be_written_leaves_the_old_trace(tmp_path):
    path = tmp_path / "t.jsonl"
    write_trace(path, Trace(_requests(3)))
    old = path.read_bytes()
    os.remove(f"{path}.meta.json")
    os.mkdir(f"{path}.meta.json")  # the sidecar's place is taken: its write fails
    with pytest.raises(ValueError, match="is a directory"):
        write_trace(path, Trace(_requests(5)))
    assert path.read_bytes() == old
    assert _leftovers(tmp_path) == []


def test_failed_trace_commit_after_the_sidecar_rolls_the_sidecar_back(tmp_path, monkeypatch):
    path = tmp_path / "t.jsonl"
    write_trace(path, Trace(_requests(3), name="old", meta={"v": 1}))
    before = _pair(path)
    real_replace = os.replace

    def failing_replace(src, dst):
        if os.fspath(dst) == os.fspath(path):
            raise OSError(5, "Input/output error")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="Input/output"):
        write_trace(path, Trace(_requests(5), name="new", meta={"v": 2}))
    monkeypatch.setattr(os, "replace", real_replace)
    assert _pair(path) == before
    assert _leftovers(tmp_path) == []

    fresh = tmp_path / "fresh.jsonl"  # no pair before: none after
    monkeypatch.setattr(os, "replace", lambda src, dst: (_ for _ in ()).throw(OSError(5, "Input/output error"))
                        if os.fspath(dst) == os.fspath(fresh) else real_replace(src, dst))
    with pytest.raises(OSError):
        write_trace(fresh, Trace(_requests(2)))
    monkeypatch.setattr(os, "replace", real_replace)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl", "t.jsonl.meta.json"]


# ============================================================================ a malformed sidecar


@pytest.mark.parametrize("text, fragment", [
    ("[]", "expected a JSON object, got a list"),
    ("null", "expected a JSON object, got null"),
    ('{"meta": [1, 2]}', "field 'meta': expected a JSON object (or null), got a list"),
    ('{"name": 5}', "field 'name': expected a string (or null), got an integer (5)"),
    ('{"num_requests": "x"}', "field 'num_requests': expected an integer >= 0, got a string ('x')"),
    ("{", "invalid JSON"),
])
def test_malformed_sidecar_is_an_error_naming_the_sidecar_and_fails_validate(tmp_path, capsys, text, fragment):
    """Issue 21, bug 9: ``[]``/``null`` gave an AttributeError traceback, ``{"meta": [1, 2]}`` a
    TypeError naming no file, and ``trace validate`` said OK."""
    path = tmp_path / "t.jsonl"
    write_trace(path, Trace(_requests(2)))
    sidecar = Path(f"{path}.meta.json")
    sidecar.write_text(text, encoding="utf-8")
    for read in (read_trace_meta, read_trace):
        with pytest.raises(TraceFormatError) as info:
            read(path)
        assert str(info.value).startswith(str(sidecar)) and fragment in str(info.value)
    problems = validate_trace(path)
    assert len(problems) == 1 and problems[0].path == str(sidecar) and fragment in str(problems[0])
    assert _run_cli("trace", "validate", str(path)) == 1
    assert str(sidecar) in capsys.readouterr().out


def test_malformed_parquet_metadata_names_the_file_and_fails_validate(tmp_path):
    import pyarrow.parquet as pq

    path = tmp_path / "t.parquet"
    write_trace(path, Trace(_requests(2)))
    table = pq.read_table(path)
    for stored, fragment in ((b"[]", "expected a JSON object, got a list"), (b"{", "is not valid JSON")):
        pq.write_table(table.replace_schema_metadata({b"marconi.trace": stored}), path)
        with pytest.raises(TraceFormatError) as info:
            read_trace(path)
        assert str(info.value).startswith(f"{path}: ") and fragment in str(info.value)
        (problem,) = validate_trace(path)
        assert problem.path == str(path) and fragment in problem.message


def test_sidecar_that_is_not_utf8_names_the_sidecar(tmp_path):
    path = tmp_path / "t.jsonl"
    write_trace(path, Trace(_requests(2)))
    Path(f"{path}.meta.json").write_bytes(b'{"name": "\xff"}')
    with pytest.raises(TraceFormatError, match=r"t\.jsonl\.meta\.json:1: not UTF-8"):
        read_trace_meta(path)


def test_sidecar_counting_other_requests_is_a_validate_warning(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    write_trace(path, Trace(_requests(4)))
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:2]))  # cut by hand, sidecar kept
    assert validate_trace(path) == []
    assert _run_cli("trace", "validate", str(path)) == 0
    out = capsys.readouterr().out
    assert "sidecar says 4 requests but the file has 2" in out and "warning" in out


# ============================================================================ a compressed file under a plain name


@pytest.mark.parametrize("magic, looks, advice", [
    (None, "looks gzip-compressed", "rename it to t.jsonl.gz"),
    (b"\x28\xb5\x2f\xfd\x04\x00", "looks zstd-compressed", "zstd -d"),
    (b"PAR1\x15\x04", "looks like a Parquet file", "rename it to t.parquet"),
])
def test_compressed_file_named_jsonl_says_it_looks_compressed(tmp_path, magic, looks, advice):
    path = tmp_path / "t.jsonl"
    line = _line("[1, 2]") + "\n"
    path.write_bytes(gzip.compress(line.encode()) if magic is None else magic + b"\x00" * 64)
    problems = validate_trace(path)
    assert len(problems) == 1 and problems[0].line == 1, problems
    message = str(problems[0])
    assert looks in message and advice in message and "not UTF-8" not in message
    with pytest.raises(TraceFormatError, match=looks):
        read_trace(path)


def test_plain_text_named_jsonl_gz_says_it_is_not_compressed(tmp_path):
    path = tmp_path / "t.jsonl.gz"
    path.write_text(_line("[1, 2]") + "\n", encoding="utf-8")
    (problem,) = validate_trace(path)
    assert "not gzip-compressed" in problem.message and "rename it to t.jsonl" in problem.message
