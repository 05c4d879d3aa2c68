"""Issue 31 (hardening, round 3), the library and reader rows.

Each test names the issue row it covers. The mechanisms: every index the cache keeps is checked by
``PrefixCache.check_invariants`` and bounded by the tree; trace readers read bounded lines from
regular files only; the sparse-DP budget is clamped inside the DP; the cache's arguments and
snapshots are validated where they enter.
"""

from __future__ import annotations

import numpy as np
import pytest

from marconi.core.cache import InvariantError, PrefixCache
from marconi.core.model import get_model
from marconi.workloads.synthetic import chat_trace
from marks import slow

FAMILY = "worlds:rules=lru/a0.5m/a0.5mt/a2m"  # marconi:rules=lru/a0.5m/a0.5mt/a2m's eviction


# ============================================================================ bug 7: the dead-tail index


def _tight_cache(admission: str, states: int = 60, kv_tokens: int = 20_000) -> PrefixCache:
    spec = get_model("paper-7b")
    return PrefixCache(spec, states * spec.ssm_checkpoint_bytes + kv_tokens * spec.kv_bytes_per_token,
                       admission, FAMILY)


def _conversations(num_sessions: int) -> list:
    """Chats over one shared system prompt: each first turn branches off the prompt (a dead-tail
    candidate), each later turn continues it (so it must leave the index), and inner evictions merge
    continued leaves away (where the index leaked)."""
    return list(chat_trace(num_sessions=num_sessions, turns=(1, 6), user_len=30, output_len=30,
                           system_prompt_len=200))


def _every_cache(cache: PrefixCache) -> list[PrefixCache]:
    return [cache, *cache.chooser.worlds.values()]


def _run_checking_bounds(cache: PrefixCache, requests: list, check_every: int) -> int:
    """Replay ``requests``; every ``check_every`` requests, every cache (the live one and each
    rule's world) passes ``check_invariants`` and its dead-tail index holds no more entries than
    the tree has nodes. Returns the largest index seen."""
    largest = 0
    for i, req in enumerate(requests, start=1):
        cache.process(req.input_tokens, req.output_tokens)
        if i % check_every == 0 or i == len(requests):
            for c in _every_cache(cache):
                c.check_invariants()
                assert c.num_tail_leaves <= c.tree.num_nodes, (i, c.num_tail_leaves, c.tree.num_nodes)
                largest = max(largest, c.num_tail_leaves)
    return largest


def test_dead_tail_index_holds_only_leaves_of_the_tree():
    """Issue 31, bug 7: entries for nodes that gained a child or left the tree were pruned only when
    a margin existed (continuing chats never have one), so the index grew with the trace (old code:
    134 entries, 125 stale, against a tree of 84 nodes after these 1,062 requests)."""
    cache = _tight_cache("marconi")
    largest = _run_checking_bounds(cache, _conversations(300), check_every=50)
    assert largest > 0  # the trace does exercise the index


@slow
def test_dead_tail_index_stays_bounded_over_tens_of_thousands_of_requests():
    """Issue 31, bug 7 (the long run): ~17,500 requests through the tails family, and a shorter run
    with sparse-dp admission (its DP makes each request ~10x dearer), never hold more index entries
    than tree nodes; every index passes check_invariants along the way."""
    requests = _conversations(5000)
    assert len(requests) > 15_000
    cache = _tight_cache("marconi")
    largest = _run_checking_bounds(cache, requests, check_every=1000)
    assert 0 < largest <= max(c.tree.num_nodes for c in _every_cache(cache)) + 60
    sparse = _tight_cache("sparse-dp")
    _run_checking_bounds(sparse, _conversations(120), check_every=100)


def test_check_invariants_refuses_a_stale_dead_tail_entry():
    """Issue 31, bug 7 (the mechanism): check_invariants looks at the dead-tail index, so an entry
    for a node that left the tree (here removed behind the cache's back, as the old inner eviction
    left them) is an InvariantError naming the index."""
    cache = _tight_cache("marconi", kv_tokens=10**6)  # roomy: single-turn chats keep their branched leaf
    for req in _conversations(40):
        cache.process(req.input_tokens, req.output_tokens)
    cache.check_invariants()
    assert cache.tail_margin is None  # chats: no margin, no trim pass, so every branched leaf is indexed
    leaf = next(n for n in cache.tree.iter_nodes() if n.tail_base >= 0 and not n.children and not n.lock_ref)
    cache.tree.remove_leaf(leaf)
    with pytest.raises(InvariantError, match=r"dead-tail index entry \d+: the node is no longer in the tree"):
        cache.check_invariants()


def test_check_invariants_refuses_a_malformed_ghost():
    """Issue 31, bug 7 (the mechanism): the ghosts of evicted branched leaves are checked too."""
    cache = _tight_cache("marconi")
    for req in _conversations(40):
        cache.process(req.input_tokens, req.output_tokens)
    node = next(n for n in cache.tree.iter_nodes() if n.parent is not None)
    node.ghost = (np.zeros(0, dtype=np.int32), 3, node.node_id)
    with pytest.raises(InvariantError, match="ghost"):
        cache.check_invariants()
    node.ghost = (np.arange(4, dtype=np.int32), -1, node.node_id)
    with pytest.raises(InvariantError, match="negative tail base"):
        cache.check_invariants()
    node.ghost = None
    cache.check_invariants()


# ============================================================================ bug 4: the sparse-DP budget


def _dp_instance(num_candidates: int = 40):
    rng = np.random.default_rng(31)
    weights = rng.random(num_candidates * 5 + 1)
    return weights, np.arange(5, num_candidates * 5 + 1, 5)


@pytest.mark.parametrize("budget", [41, 10**5, 10**9, 10**18])
def test_a_huge_sparse_dp_budget_places_as_the_number_of_candidates(budget):
    """Issue 31, bug 4: a budget of 10**9 built a 10**9-entry list (MemoryError) and 10**5 took
    minutes; the DP now stops at the K candidates, so any budget past K gives budget K's placement."""
    from marconi.core.model import get_model
    from marconi.sparse.dp import flops_cost, place_checkpoints, place_checkpoints_reference

    weights, cands = _dp_instance()
    for cost in (None, flops_cost(get_model("paper-7b"))):
        kw = {} if cost is None else {"cost": cost}
        at_k = place_checkpoints(weights, cands, cands.size, **kw)
        huge = place_checkpoints(weights, cands, budget, curve=False, **kw)
        assert huge.positions == at_k.positions and huge.expected_cost == at_k.expected_cost
    ref = place_checkpoints_reference(weights, cands[:8], budget if budget < 2**20 else 8)
    assert ref.positions == place_checkpoints_reference(weights, cands[:8], 8).positions


def test_a_sparse_dp_curve_past_the_candidates_is_flat_and_a_huge_one_is_refused():
    """Issue 31, bug 4: the curve keeps its M + 1 entries (flat past K, as callers index it) up to a
    bound; past the bound curve=True is a ValueError naming max_checkpoints, not an OOM."""
    from marconi.sparse.dp import place_checkpoints

    weights, cands = _dp_instance(10)
    plan = place_checkpoints(weights, cands, 1000)
    assert len(plan.cost_by_budget) == 1001 and len(set(plan.cost_by_budget[10:])) == 1
    assert plan.positions_by_budget[1000] == plan.positions_by_budget[10] == plan.positions
    with pytest.raises(ValueError, match="max_checkpoints=1,000,000,000 with curve=True.*curve=False"):
        place_checkpoints(weights, cands, 10**9)
    for bad in (-1, 2.5, True, "4"):
        with pytest.raises(ValueError, match="max_checkpoints"):
            place_checkpoints(weights, cands, bad)


def test_sparse_dp_admission_with_a_huge_m_plans_like_m_equal_to_the_candidates():
    """Issue 31, bug 4 (``sparse-dp(m=...)``): the admission policy's budget goes through the same
    clamp, so a policy built in the library with m = 10**9 (the registry now bounds the name's m)
    runs and keeps what m = 1,000 (more than any request's candidates) keeps."""
    from marconi.sparse.admission import SparseDPAdmission
    from marconi.workloads.synthetic import doc_qa_trace

    trace = doc_qa_trace(num_docs=2, doc_len=60, questions_per_doc=4, seed=3)
    assert max(r.input_len for r in trace) < 1000
    spec = get_model("paper-7b")
    cap = 200 * spec.ssm_checkpoint_bytes + 5000 * spec.kv_bytes_per_token
    reused = []
    for m in (10**9, 1000):
        cache = PrefixCache(spec, cap, SparseDPAdmission(m=m, cost="tokens"), "lru")
        for req in trace:
            cache.process(req.input_tokens, req.output_tokens)
        cache.check_invariants()
        reused.append((cache.stats.checkpoints_admitted, cache.stats.kv_tokens_inserted))
    assert reused[0] == reused[1] and reused[0][0] > 0


# ============================================================================ bug 3: bounded reads


import gzip  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
from contextlib import contextmanager  # noqa: E402

from marconi.core.registry import ConfigError  # noqa: E402
from marconi.io import MAX_LINE_ENV, JsonError, iter_jsonl, iter_lines  # noqa: E402
from marconi.workloads import TraceFormatError, iter_requests, read_trace, validate_trace  # noqa: E402

GOOD_LINE = ('{"session_id": 1, "turn_id": 0, "ts": 0.0, "input_tokens": [1, 2, 3], '
             '"output_tokens": [4]}\n')


@contextmanager
def _no_hang(seconds: int = 30):
    """Fail (rather than hang the suite) if the body blocks, as reading a FIFO did."""
    def fail(*_):
        raise AssertionError(f"blocked for {seconds} s")
    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _gzip_bomb(path, size: int) -> None:
    """``size`` zero bytes (no newline), gzip-compressed: ~1,000x smaller on disk."""
    chunk = b"\0" * (1 << 20)
    with gzip.open(path, "wb") as fh:
        for _ in range(size // len(chunk)):
            fh.write(chunk)


def test_a_gzip_bomb_without_newlines_stops_at_the_line_limit(tmp_path, monkeypatch):
    """Issue 31, bug 3: a small gzip expanding to gigabytes without a newline was read whole (23 GB
    and the OOM killer). Now reading stops at the line limit, naming file, line and how to raise it.
    (8 MiB of zeros and a 1 MiB limit stand in for gigabytes and 64 MiB.)"""
    bomb = tmp_path / "bomb.jsonl.gz"
    _gzip_bomb(bomb, 8 << 20)
    assert bomb.stat().st_size < 100_000
    with pytest.raises(JsonError, match=rf"bomb\.jsonl\.gz:1: line longer than 1,048,576 bytes.*{MAX_LINE_ENV}"):
        list(iter_lines(bomb, max_line_bytes=1 << 20))
    with pytest.raises(JsonError, match=r"bomb\.jsonl\.gz:1: line longer"):
        list(iter_jsonl(bomb, max_line_bytes=1 << 20))
    monkeypatch.setenv(MAX_LINE_ENV, str(1 << 20))
    with pytest.raises(TraceFormatError, match=rf"bomb\.jsonl\.gz:1: .*line longer.*{MAX_LINE_ENV}=<bytes>"):
        read_trace(bomb)
    (problem,) = validate_trace(bomb)
    assert problem.line == 1 and "line longer than 1,048,576 bytes" in problem.message


def test_the_raw_source_sniff_reads_as_far_as_the_readers_line_limit(tmp_path, monkeypatch):
    """The sniff that names a raw file's recipe stopped at a fixed 64 MiB whatever
    ``$MARCONI_MAX_LINE_BYTES`` said, so a first record the raised limit reads stayed unknown; it
    follows the readers' limit now (a small limit stands in for 64 MiB)."""
    from marconi.workloads.raw import raw_source_of

    path = tmp_path / "chats.jsonl"
    line = '{"conversations": [{"from": "human", "value": "%s"}, {"from": "gpt", "value": "ok"}]}\n' % ("x" * 5000)
    path.write_text(line * 2)
    assert raw_source_of(path) == "sharegpt"
    monkeypatch.setenv(MAX_LINE_ENV, "1000")             # the record is longer: the reader would stop too
    assert raw_source_of(path) is None
    monkeypatch.setenv(MAX_LINE_ENV, str(1 << 16))
    assert raw_source_of(path) == "sharegpt"


def test_a_long_line_after_good_ones_names_its_own_line_and_a_raised_limit_reads_it(tmp_path, monkeypatch):
    """Issue 31, bug 3: the limit names the line it stops at; raising it (parameter or variable)
    reads a legitimate long line."""
    path = tmp_path / "t.jsonl"
    long_tokens = ", ".join(["7"] * 5000)
    path.write_text(GOOD_LINE * 2 + GOOD_LINE.replace("[1, 2, 3]", f"[{long_tokens}]"))
    with pytest.raises(JsonError, match=r"t\.jsonl:3: line longer than 10,000 bytes"):
        list(iter_lines(path, max_line_bytes=10_000))
    assert len(list(iter_lines(path, max_line_bytes=100_000))) == 3
    monkeypatch.setenv(MAX_LINE_ENV, "10000")
    with pytest.raises(TraceFormatError, match=r"t\.jsonl:3: .*line longer"):
        read_trace(path)
    monkeypatch.setenv(MAX_LINE_ENV, "100000")
    assert read_trace(path)[2].input_len == 5000
    for bad in ("0", "-5", "lots", "1e6"):
        monkeypatch.setenv(MAX_LINE_ENV, bad)
        with pytest.raises(ConfigError, match=MAX_LINE_ENV):
            list(iter_lines(path))
    with pytest.raises(ConfigError, match="max_line_bytes"):
        list(iter_lines(path, max_line_bytes=0))


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_a_symlink_to_dev_zero_is_refused_before_reading(tmp_path):
    """Issue 31, bug 3: a trace symlinked to /dev/zero filled memory with one endless line; a
    device is now refused before it is opened, by every reader."""
    link = tmp_path / "zero.jsonl"
    link.symlink_to("/dev/zero")
    with _no_hang():
        with pytest.raises(JsonError, match=r"zero\.jsonl: is a character device, not a regular file"):
            list(iter_lines(link))
        with pytest.raises(ValueError, match=r"zero\.jsonl is a character device, not a regular file"):
            read_trace(link)
        (problem,) = validate_trace(link)
        assert "character device" in problem.message
        gz = tmp_path / "zero.jsonl.gz"
        gz.symlink_to("/dev/zero")
        with pytest.raises(ValueError, match="character device"):
            list(iter_requests(gz))
        pq = tmp_path / "zero.parquet"
        pq.symlink_to("/dev/zero")
        with pytest.raises(ValueError, match="character device"):
            read_trace(pq)
        from marconi.io import read_json

        config = tmp_path / "config.json"  # a model's config.json, a SWE trajectory, a sidecar
        config.symlink_to("/dev/zero")
        with pytest.raises(JsonError, match=r"config\.json: is a character device"):
            read_json(config)


def test_a_fifo_given_as_a_trace_is_refused_not_waited_on(tmp_path, capsys):
    """Issue 31, unclear row: a FIFO given as a trace made ``trace validate`` block and
    ``simulate`` report invalid JSON for valid data. Both now say it is a FIFO, at once."""
    from marconi.cli import main

    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    with _no_hang():
        with pytest.raises(ValueError, match=r"pipe\.jsonl is a FIFO \(named pipe\), not a regular file.*save"):
            read_trace(fifo)
        with pytest.raises(JsonError, match="FIFO"):
            list(iter_jsonl(fifo))
        (problem,) = validate_trace(fifo)
        assert "FIFO" in problem.message
        assert main(["trace", "validate", str(fifo)]) != 0
        assert main(["simulate", "--trace", str(fifo), "--systems", "lru", "--capacity", "1GB",
                     "--quiet", "--workers", "1"]) != 0
    out = capsys.readouterr()
    text = out.out + out.err
    assert "FIFO" in text and "invalid JSON" not in text


def test_a_jsonl_file_holding_only_a_bom_is_empty_not_truncated(tmp_path):
    """Issue 31, unclear row: a file holding only a UTF-8 BOM was called "truncated". A leading BOM
    is dropped (Windows editors write one), so the file is what it is: empty."""
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf")
    assert list(iter_lines(path)) == [(1, b"")]
    (problem,) = validate_trace(path)
    assert "no requests" in problem.message and "looks truncated" not in problem.message
    assert len(read_trace(path)) == 0
    path.write_bytes(b"\xef\xbb\xbf" + GOOD_LINE.encode() * 2)
    assert len(read_trace(path)) == 2 and validate_trace(path) == []


def test_truncated_is_said_only_where_the_text_ran_out(tmp_path):
    """Issue 31, unclear row (the mechanism): "looks truncated" is a guess kept for a last line that
    stops mid-value; a last line with junk after a complete value is not called truncated."""
    path = tmp_path / "t.jsonl"
    path.write_text(GOOD_LINE + GOOD_LINE.rstrip("\n") + " x")
    with pytest.raises(TraceFormatError, match=r"t\.jsonl:2: invalid JSON") as info:
        read_trace(path)
    assert "looks truncated" not in str(info.value)
    path.write_text(GOOD_LINE + GOOD_LINE[:30])
    with pytest.raises(TraceFormatError, match="looks truncated"):
        read_trace(path)


def test_a_middle_line_cut_short_says_its_own_column_and_that_it_was_cut(tmp_path):
    """A line cut off in the middle of a file was reported at "column 1" (the decoder's position past
    the line's newline) with no hint; now the column where the value ran out, and "cut short"."""
    path = tmp_path / "t.jsonl"
    path.write_text(GOOD_LINE + GOOD_LINE[:30] + "\n" + GOOD_LINE)
    with pytest.raises(TraceFormatError, match=r"t\.jsonl:2: invalid JSON") as info:
        read_trace(path)
    assert "(column 31)" in str(info.value) and "the line looks cut short" in str(info.value)
    assert "looks truncated" not in str(info.value)


# ============================================================================ bug 9: Parquet nulls


def _parquet_with_a_null_id(path, null_row: int, num_rows: int = 200) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    inputs = [[1, 2, 3, 4] for _ in range(num_rows)]
    inputs[null_row] = [1, 2, None, 4]
    table = pa.table({"session_id": pa.array(range(num_rows), pa.int64()),
                      "turn_id": pa.array([0] * num_rows, pa.int64()),
                      "ts": pa.array([float(i) for i in range(num_rows)]),
                      "input_tokens": pa.array(inputs, pa.list_(pa.int32())),
                      "output_tokens": pa.array([[5]] * num_rows, pa.list_(pa.int32()))})
    pq.write_table(table, path)


@pytest.mark.parametrize("null_row", [0, 130, 199])
def test_a_null_inside_a_parquet_token_list_names_its_row_and_field(tmp_path, null_row):
    """Issue 31, bug 9: a null token id crashed ``trace validate`` with KeyError, and ``simulate``
    blamed the first row of the 128-row batch. Both now name the row, the field and the element."""
    path = tmp_path / "t.parquet"
    _parquet_with_a_null_id(path, null_row)
    (problem,) = validate_trace(path)
    assert (problem.row, problem.field) == (null_row, "input_tokens")
    assert "element 2 is null" in problem.message
    with pytest.raises(TraceFormatError, match=rf"row {null_row}.*input_tokens.*element 2 is null") as info:
        read_trace(path)
    assert info.value.problem.row == null_row
    assert len(read_trace(path, limit=null_row)) == null_row  # the rows before it read fine


# ============================================================================ unclear rows: PrefixCache arguments


@pytest.mark.parametrize("bad", [2.5, 2.0, float("nan"), "8", True, 0, -4])
def test_prefill_chunk_len_that_is_not_a_whole_number_ge_1_is_refused(bad):
    """Issue 31, unclear row: ``PrefixCache(prefill_chunk_len=2.5)`` truncated silently to 2."""
    with pytest.raises(ConfigError, match=r"prefill_chunk_len must be None or an integer >= 1"):
        PrefixCache("paper-7b", 1e12, prefill_chunk_len=bad)
    assert PrefixCache("paper-7b", 1e12, prefill_chunk_len=np.int64(32)).prefill_chunk_len == 32


@pytest.mark.parametrize("bad, error", [(2.7, TypeError), (float("nan"), TypeError), (float("inf"), TypeError),
                                        ("3", TypeError), (True, TypeError), (-1, ValueError)])
def test_max_hit_len_that_is_not_a_whole_number_ge_0_names_the_parameter(bad, error):
    """Issue 31, unclear row: ``begin(max_hit_len=2.7)`` truncated silently and ``nan`` gave a
    message naming no parameter. Nothing changes: no request is left in flight."""
    cache = PrefixCache("paper-7b", 1e12)
    with pytest.raises(error, match="max_hit_len"):
        cache.begin([1, 2, 3], max_hit_len=bad)
    assert cache.num_in_flight == 0 and cache.stats.num_requests == 0
    cache.check_invariants()
    assert cache.begin([1, 2, 3], max_hit_len=np.int64(2)).max_hit_len == 2


@pytest.mark.parametrize("states, kv, name", [([1, 2, 3], None, "states"), ("abc", None, "states"),
                                              (None, {0: 1}, "kv"), (None, 5, "kv")])
def test_finish_with_states_or_kv_of_the_wrong_kind_is_a_type_error_naming_it(states, kv, name):
    """Issue 31, unclear row: ``finish(h, out, states=[1, 2, 3])`` gave an AttributeError. It is a
    TypeError naming the argument and what it may be; the request ends as an abort (the contract
    for an invalid finish), and ``insert_prefill`` refuses it before anything changes."""
    cache = PrefixCache("paper-7b", 1e12)
    handle = cache.begin(list(range(1, 50)))
    with pytest.raises(TypeError, match=rf"{name} must be .*callable"):
        cache.insert_prefill(handle, states=states, kv=kv)
    assert cache.num_in_flight == 1
    with pytest.raises(TypeError, match=rf"{name} must be .*callable.*got"):
        cache.finish(handle, [7], states=states, kv=kv)
    assert cache.num_in_flight == 0 and cache.tree.num_nodes == 0
    cache.check_invariants()


# ============================================================================ unclear row: snapshots


def _snapshot_and_cache():
    from marconi.core.cache import ManualClock

    cache = PrefixCache("paper-7b", 1e12, "marconi", "lru", clock=ManualClock())
    for req in _conversations(6):
        cache.process(req.input_tokens, req.output_tokens)
    return cache.snapshot(), cache


def _restore(snap):
    from marconi.core.cache import ManualClock

    return PrefixCache.from_snapshot(snap, "paper-7b", 1e12, "marconi", "lru", clock=ManualClock())


def test_a_valid_snapshot_restores_as_before():
    snap, cache = _snapshot_and_cache()
    restored = _restore(snap)
    restored.check_invariants()
    assert restored.tree.num_nodes == cache.tree.num_nodes and restored.used_bytes == cache.used_bytes


@pytest.mark.parametrize("field, edit, fragment", [
    ("tokens", lambda s: s.tokens.__setitem__(1, np.array([5, -3, 7])), r"snapshot\.tokens\[1\].*-3.*negative"),
    ("tokens", lambda s: s.tokens.__setitem__(2, np.array([], dtype=np.int32)), r"snapshot\.tokens\[2\] is empty"),
    ("tokens", lambda s: s.tokens.__setitem__(1, np.array([1.5, 2.0])), r"snapshot\.tokens\[1\].*integer"),
    ("parent_index", lambda s: s.parent_index.__setitem__(1, 5), r"snapshot\.parent_index\[1\] = 5.*earlier"),
    ("parent_index", lambda s: s.parent_index.__setitem__(2, -2), r"snapshot\.parent_index\[2\] = -2"),
    ("parent_index", lambda s: s.parent_index.pop(), r"parallel lists differ in length"),
    ("ckpt_positions", lambda s: s.ckpt_positions.__setitem__(1, [10**9]), r"snapshot\.ckpt_positions\[1\]"),
    ("last_access", lambda s: s.last_access.__setitem__(0, float("nan")), r"snapshot\.last_access\[0\]"),
    ("access_seq", lambda s: s.access_seq.__setitem__(0, 1.5), r"snapshot\.access_seq\[0\]"),
    ("clock_value", lambda s: setattr(s, "clock_value", float("inf")), r"snapshot\.clock_value"),
])
def test_a_malformed_snapshot_is_refused_naming_the_field_and_index(field, edit, fragment):
    """Issue 31, unclear row: ``from_snapshot`` validated nothing: negative tokens passed (and
    passed check_invariants), a forward parent index gave IndexError. Every field is checked as
    the snapshot is restored, and the error names it with its index."""
    snap, _ = _snapshot_and_cache()
    assert len(snap.tokens) >= 3 and snap.parent_index[1] < 1
    edit(snap)
    with pytest.raises(ConfigError, match=fragment):
        _restore(snap)


def test_a_snapshot_whose_siblings_start_alike_is_refused():
    """Issue 31, unclear row (snapshots): two root children with the same first token would have
    replaced one another in the tree silently."""
    snap, _ = _snapshot_and_cache()
    roots = [i for i, p in enumerate(snap.parent_index) if p == -1]
    first = roots[0]
    snap.parent_index.append(-1)
    snap.tokens.append(np.array([*snap.tokens[first][:1], 99999], dtype=np.int32))
    for name in ("ckpt_positions", "last_access", "access_seq", "path_access", "path_seq"):
        getattr(snap, name).append([] if name == "ckpt_positions" else 0)
    with pytest.raises(ConfigError, match=rf"snapshot\.tokens\[{len(snap.tokens) - 1}\] starts like "
                                          rf"snapshot\.tokens\[{first}\]"):
        _restore(snap)


def test_check_invariants_refuses_negative_tokens():
    """Issue 31, unclear row (snapshots): a negative id in an edge passed check_invariants."""
    _, cache = _snapshot_and_cache()
    node = next(n for n in cache.tree.iter_nodes() if n.parent is not None and n.edge_len > 1)
    edge = node.tokens.copy()
    edge[-1] = -3
    node.tokens = edge
    with pytest.raises(InvariantError, match="non-negative int32"):
        cache.check_invariants()
