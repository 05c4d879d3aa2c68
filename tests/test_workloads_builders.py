"""Trace builders on real data: the vendored samples (always) and the shared data set (CI).

Expected values are computed here independently from the source files, with the ``tokenizers``
package used directly, and compared with what the builders produce.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from marconi.workloads import (build_chat_trace, build_lmsys_trace, build_mooncake_trace,
                               build_sharegpt_trace, build_swe_trace, bundled_data_dir, load_shared_prefix,
                               load_tokenizer, load_trace, shared_data_dir)
from marconi.workloads.messages import Message
from marconi.workloads.mooncake import read_mooncake_rows
from marconi.workloads.quality import load_quality_articles
from marconi.workloads.recording import read_recording
from marconi.workloads.sharegpt import chat_turns, read_chat_records
from marconi.workloads.swe import load_trajectories

DATA = bundled_data_dir()
MSA_SAMPLE = DATA / "swe" / "msa_gemini3pro_verified_first10.json"
PYDICOM = DATA / "swe" / "sweagent_gpt4_pydicom-1458.traj"
MOONCAKE_SAMPLE = DATA / "mooncake" / "conversation_trace_first2000.jsonl"
SHARED = shared_data_dir()
needs_shared = pytest.mark.skipif(SHARED is None, reason="../shared/data is absent (set MARCONI_SHARED_DATA)")


@pytest.fixture(scope="module")
def ref_tok() -> Tokenizer:
    return Tokenizer.from_file(str(DATA / "tokenizers" / "mistral-v1" / "tokenizer.json"))


def _encode(tok: Tokenizer, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in tok.encode_batch(texts)]  # the template prepends BOS


def _by_key(trace):
    return {(r.session_id, r.turn_id): r for r in trace}


# ============================================================================ SWE


def _oracle_swe(msg_tokens: list[list[int]], roles: list[str], keep: int | None, max_len: int,
                max_turns: int) -> list[tuple[list[int], list[int]]]:
    """The authors' algorithm: (user_t, llm_t) pairs, the user part of old pairs popped."""
    calls = [i for i, r in enumerate(roles) if r == "assistant"]
    users, llms, prev = [], [], 0
    for c in calls:
        users.append([t for m in msg_tokens[prev:c] for t in m])
        llms.append(msg_tokens[c])
        prev = c + 1
    history: list[list[list[int]]] = []
    out = []
    for t in range(len(calls)):
        inp = [tok for entry in history for part in entry for tok in part] + users[t]
        if len(inp) > max_len or t >= max_turns:
            break
        out.append((inp, llms[t]))
        if keep is not None and [len(e) for e in history].count(2) >= keep + 1:
            history[-keep].pop(0)
        history.append([users[t], llms[t]])
    return out


@pytest.fixture(scope="module")
def msa_sample(ref_tok):
    records = json.loads(MSA_SAMPLE.read_text())
    out = []
    for rec in sorted(records, key=lambda r: r["instance_id"]):
        msgs = rec["messages"]
        tokens = _encode(ref_tok, [json.dumps({"role": m["role"], "content": m["content"]}) for m in msgs])
        out.append((rec, [m["role"] for m in msgs], tokens))
    return out


@pytest.mark.parametrize("keep", [None, 1, 2, 5])
def test_swe_sample_matches_the_authors_algorithm(msa_sample, keep):
    trace = build_swe_trace([MSA_SAMPLE], keep_observations=keep, sessions_per_second=0.5, seed=7)
    got = _by_key(trace)
    assert trace.meta["source_ids"] == [rec["instance_id"] for rec, _, _ in msa_sample]
    expected_total = 0
    for k, (rec, roles, tokens) in enumerate(msa_sample):
        expected = _oracle_swe(tokens, roles, keep, 32768, 50)
        expected_total += len(expected)
        assert len(expected) > 0
        for j, (inp, out) in enumerate(expected):
            req = got[(k, j)]
            assert req.input_tokens.tolist() == inp
            assert req.output_tokens.tolist() == out
        assert (k, len(expected)) not in got
        first = got[(k, 0)]
        assert first.ts == pytest.approx(k / 0.5)
    assert len(trace) == expected_total
    if keep is None:  # without dropping, each input is exactly the messages before the call
        rec, roles, tokens = msa_sample[0]
        call = [i for i, r in enumerate(roles) if r == "assistant"][3]
        assert got[(0, 3)].input_tokens.tolist() == [t for m in tokens[:call] for t in m]


def test_swe_caps_and_gaps(msa_sample):
    trace = build_swe_trace([MSA_SAMPLE], max_turns=7, max_input_len=20000, gaps="poisson", mean_gap_s=5.0)
    sessions = trace.sessions()
    assert all(len(reqs) <= 7 for reqs in sessions.values())
    assert max(r.input_len for r in trace) <= 20000
    gaps = np.concatenate([np.diff([r.ts for r in reqs]) for reqs in sessions.values()])
    assert np.all(gaps >= 0) and np.allclose(gaps, np.round(gaps))  # Poisson counts of seconds
    assert 3.0 < gaps.mean() < 7.0
    same = build_swe_trace([MSA_SAMPLE], max_turns=7, max_input_len=20000, gaps="poisson", mean_gap_s=5.0)
    assert [r.ts for r in same] == [r.ts for r in trace]  # seeded

    real = build_swe_trace([MSA_SAMPLE], gaps="real", keep_observations=None, num_sessions=3)
    for k, (rec, roles, _) in enumerate(msa_sample[:3]):
        created = [m["created"] for m in rec["messages"] if m["role"] == "assistant"]
        reqs = real.sessions()[k]
        expected = [c - created[0] for c in created[:len(reqs)]]
        assert [r.ts - reqs[0].ts for r in reqs] == pytest.approx(expected)


def test_swe_shared_prefix(ref_tok):
    prefix = load_shared_prefix("sweagent-demo")
    assert [m.role for m in prefix] == ["system", "user"]
    history = json.loads(PYDICOM.read_text())["history"]
    assert [m.content for m in prefix] == [history[0]["content"], history[1]["content"]]
    content_len = sum(len(ids) for ids in _encode(ref_tok, [m.content for m in prefix]))
    assert 7500 < content_len < 8000  # the "~7.7k-token" system + demonstration prefix

    trace = build_swe_trace([MSA_SAMPLE], shared_prefix="sweagent-demo", num_sessions=4)
    prefix_tokens = [t for ids in _encode(ref_tok, [m.text("json") for m in prefix]) for t in ids]
    assert trace.meta["shared_prefix_len"] == len(prefix_tokens)
    for req in trace:
        assert req.input_tokens[:len(prefix_tokens)].tolist() == prefix_tokens
    assert trace.num_sessions == 4


def test_swe_agent_traj_file(ref_tok):
    trace = build_swe_trace([PYDICOM], keep_observations=None, text_form="content")
    history = json.loads(PYDICOM.read_text())["history"]
    tokens = _encode(ref_tok, [m["content"] for m in history])
    calls = [i for i, m in enumerate(history) if m["role"] == "assistant"]
    assert len(trace) == len(calls) == 12
    for j, call in enumerate(calls):
        assert trace[j].input_tokens.tolist() == [t for m in tokens[:call] for t in m]
        assert trace[j].output_tokens.tolist() == tokens[call]
    assert trace.meta["source_ids"] == ["sweagent_gpt4_pydicom-1458"]


def test_swe_bad_inputs(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        build_swe_trace([tmp_path / "nope.json"])
    (tmp_path / "bad.json").write_text('[{"instance_id": "x", "messages": [{"content": "hi"}]}]')
    with pytest.raises(ValueError, match="role"):
        build_swe_trace([tmp_path / "bad.json"])
    with pytest.raises(ValueError, match="created"):
        build_swe_trace([PYDICOM], gaps="real")
    with pytest.raises(FileNotFoundError, match="known names"):
        build_swe_trace([MSA_SAMPLE], shared_prefix="no-such-prefix")


@pytest.mark.shared
@needs_shared
def test_swe_shared_data_first_sessions_sorted_by_name(ref_tok):
    folder = SHARED / "swe" / "mini-swe-agent-gemini3pro"
    names = sorted(t["instance_id"] for f in sorted(folder.glob("msa_*_part*.json"))
                   for t in json.loads(f.read_text()))
    assert len(names) == 500
    trace = build_swe_trace(num_sessions=12, keep_observations=5)
    assert trace.meta["source_ids"] == names[:12]
    assert trace.num_sessions == 12 and max(r.input_len for r in trace) <= 32768


# ============================================================================ Mooncake


def test_mooncake_sample_blocks():
    rows = [json.loads(line) for line in MOONCAKE_SAMPLE.read_text().splitlines()]
    assert len(rows) == 2000
    trace = build_mooncake_trace(MOONCAKE_SAMPLE, limit=600)
    assert len(trace) == 600 and trace.num_sessions == 600
    blocks: dict[int, np.ndarray] = {}
    firsts: dict[tuple[int, int], int] = {}  # (parent id, first token) -> id
    out_tokens = set()
    in_tokens = set()
    for i, (row, req) in enumerate(zip(rows, trace)):
        assert (req.session_id, req.turn_id) == (i, 0)
        assert req.ts == row["timestamp"] / 1000.0
        assert req.input_len == row["input_length"] and req.output_len == row["output_length"]
        parent = -1
        for b, h in enumerate(row["hash_ids"]):
            blk = req.input_tokens[b * 512:(b + 1) * 512]
            ref = blocks.get(h)
            if ref is not None:  # equal ids -> equal blocks (a partial block is a prefix)
                n = min(ref.size, blk.size)
                assert np.array_equal(ref[:n], blk[:n])
            if ref is None or blk.size > ref.size:
                blocks[h] = blk
            # distinct siblings differ at their first token: matches end at block boundaries
            assert firsts.setdefault((parent, int(blk[0])), h) == h
            parent = h
        in_tokens.update(np.unique(req.input_tokens).tolist())
        out_tokens.update(np.unique(req.output_tokens).tolist())
    assert not in_tokens & out_tokens
    full = [b for b in blocks.values() if b.size >= 3]
    assert len({b[:3].tobytes() for b in full}) == len(full)  # distinct ids -> distinct blocks
    assert max(in_tokens | out_tokens) < 32000 and min(in_tokens | out_tokens) >= 3
    assert trace.meta["num_distinct_blocks"] == len({h for r in rows[:600] for h in r["hash_ids"]})


def test_mooncake_options_and_errors(tmp_path):
    trace = build_mooncake_trace(MOONCAKE_SAMPLE, limit=300, max_input_len=8000, seed=3)
    rows = [json.loads(line) for line in MOONCAKE_SAMPLE.read_text().splitlines()[:300]]
    kept = [i for i, r in enumerate(rows) if r["input_length"] <= 8000]
    assert [r.session_id for r in trace] == kept
    assert trace.meta["num_dropped"] == 300 - len(kept)
    again = build_mooncake_trace(MOONCAKE_SAMPLE, limit=300, max_input_len=8000, seed=3)
    assert all(a == b for a, b in zip(trace, again))

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 1500, "output_length": 5, "hash_ids": [1, 2]}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: input_length 1500 needs 3 blocks"):
        build_mooncake_trace(bad)
    bad.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5}\n')
    with pytest.raises(ValueError, match="hash_ids"):
        build_mooncake_trace(bad)
    # an id after a different parent (content-only hashes) names a different prefix: a block of its own
    unchained = tmp_path / "unchained.jsonl"
    unchained.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n'
                         '{"timestamp": 1, "input_length": 600, "output_length": 5, "hash_ids": [2, 1]}\n'
                         '{"timestamp": 2, "input_length": 600, "output_length": 5, "hash_ids": [2, 1]}\n')
    first, second, third = build_mooncake_trace(unchained)
    assert build_mooncake_trace(unchained).meta["num_rechained_blocks"] == 2
    assert not np.array_equal(first.input_tokens, second.input_tokens[512:522])  # block 1 after 2 is not 1
    assert np.array_equal(second.input_tokens, third.input_tokens)      # the same chain twice: equal


# ============================================================================ chat (ShareGPT / LMSys)


def _msgs(*roles: str) -> list[Message]:
    return [Message(role=r, content=f"{r} {i}") for i, r in enumerate(roles)]


def test_chat_turn_structure():
    # a leading assistant chunk and system messages are a history prefix of turn 0
    end, turns = chat_turns(_msgs("system", "assistant", "user", "assistant", "user", "assistant"))
    assert (end, turns) == (6, [(2, 3, 4), (4, 5, 6)])
    # consecutive users join one turn's input; consecutive replies one output; a system message
    # between turns goes with the next input; a trailing user message makes no request
    end, turns = chat_turns(_msgs("user", "user", "assistant", "assistant", "system", "user", "assistant",
                                  "user"))
    assert (end, turns) == (7, [(0, 2, 4), (4, 6, 7)])
    assert chat_turns(_msgs("assistant", "assistant")) == (0, [])
    # the authors' positional pairing ignores roles
    assert chat_turns(_msgs("assistant", "user", "assistant"), "positional") == (2, [(0, 1, 2)])


def _write_sharegpt(path: Path, records: list[dict]) -> Path:
    path.write_text(json.dumps(records))
    return path


def test_chat_builder_on_a_crafted_file(tmp_path, ref_tok):
    recs = [
        {"id": "short", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]},
        {"id": "lead", "conversations": [
            {"from": "gpt", "value": "earlier answer"}, {"from": "system", "value": "be nice"},
            {"from": "human", "value": "one two three"}, {"from": "gpt", "value": "ok"},
            {"from": "human", "value": "four five"}, {"from": "human", "value": "six"},
            {"from": "gpt", "value": "a"}, {"from": "chatgpt", "value": "b"}]},
    ]
    path = _write_sharegpt(tmp_path / "sg.json", recs)
    trace = build_chat_trace([path], min_rounds=2, sessions_per_second=2.0, words_per_min=60.0)
    assert trace.meta["source_ids"] == ["lead"] and len(trace) == 2
    msgs = recs[1]["conversations"]
    toks = _encode(ref_tok, [json.dumps(m) for m in msgs])
    flat = lambda ms: [t for m in ms for t in m]  # noqa: E731
    r0, r1 = trace[0], trace[1]
    assert r0.input_tokens.tolist() == flat(toks[:3]) and r0.output_tokens.tolist() == toks[3]
    assert r1.input_tokens.tolist() == flat(toks[:6]) and r1.output_tokens.tolist() == flat(toks[6:8])
    assert r0.ts == 0.0 and r1.ts == pytest.approx(3.0)  # "four five" + "six" at 1 word/s

    content = build_chat_trace([path], min_rounds=2, text_form="content", add_bos=False)
    assert content[0].input_tokens.tolist() == [
        t for m in msgs[:3] for t in ref_tok.encode(m["value"], add_special_tokens=False).ids]

    bad = _write_sharegpt(tmp_path / "bad.json",
                          [{"id": "x", "conversations": [{"from": "alien", "value": "?"}]}])
    with pytest.raises(ValueError, match=r"bad\.json: record 0: message 0: unknown message role 'alien'"):
        build_chat_trace([bad], min_rounds=0)
    with pytest.raises(FileNotFoundError):
        build_chat_trace([tmp_path / "missing.json"])


def test_lmsys_layout_jsonl_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    def conv(n, text):
        return [{"content": f"{text} {i}", "role": "user" if i % 2 == 0 else "assistant"}
                for i in range(2 * n)]

    recs = [{"conversation_id": "a", "turn": 3, "conversation": conv(3, "hello there")},
            {"conversation_id": "b", "turn": 1, "conversation": conv(1, "short")},
            {"conversation_id": "c", "turn": 3, "conversation": conv(3, "привет мир")},
            {"conversation_id": "d", "turn": 4, "conversation": conv(4, "more words here")}]
    jsonl = tmp_path / "lmsys.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    parquet = tmp_path / "lmsys.parquet"
    pq.write_table(pa.Table.from_pylist(recs), parquet)
    a = build_lmsys_trace([jsonl], min_rounds=3, num_sessions=None)
    b = build_lmsys_trace([parquet], min_rounds=3, num_sessions=None)
    assert a.meta["source_ids"] == ["a", "d"]  # "b" is too short, "c" fails the non-ASCII filter
    assert len(a) == 3 + 4 and all(x == y for x, y in zip(a, b))
    keep_all = build_lmsys_trace([jsonl], min_rounds=3, max_non_ascii_frac=None)
    assert keep_all.meta["source_ids"] == ["a", "c", "d"]
    # the JSON text form keeps the source's keys, in their order: {"content": ..., "role": ...}
    tok = load_tokenizer()
    first = json.dumps(recs[0]["conversation"][0])
    assert a[0].input_tokens.tolist() == tok.encode(first).tolist()


def _sharegpt_parts() -> list[Path]:
    return sorted((SHARED / "sharegpt").glob("sharegpt_v3_ge10rounds_fileorder_part*.json"))


@pytest.mark.shared
@needs_shared
def test_sharegpt_positional_matches_the_paper_recipe(ref_tok):
    records = [r for p in _sharegpt_parts() for r in json.loads(p.read_text())]
    chosen = [r for r in records if len(r["conversations"]) >= 20][:100]
    trace = build_sharegpt_trace(pairing="positional", sessions_per_second=1.0)
    assert trace.meta["source_ids"] == [r["id"] for r in chosen]
    got = _by_key(trace)
    n_expected = 0
    for k, rec in enumerate(chosen[:25]):
        msgs = rec["conversations"]
        toks = _encode(ref_tok, [json.dumps(m) for m in msgs])
        history: list[int] = []
        ts = float(k)
        for t in range(len(msgs) // 2):
            inp = history + toks[2 * t]
            if len(inp) > 32768:
                break
            if t > 0:
                ts += len(msgs[2 * t]["value"].split()) / 1.5
            req = got[(k, t)]
            assert req.input_tokens.tolist() == inp and req.output_tokens.tolist() == toks[2 * t + 1]
            assert req.ts == pytest.approx(ts)
            history = inp + toks[2 * t + 1]
            n_expected += 1
    assert n_expected == sum(1 for r in trace if r.session_id < 25)
    assert [r.ts for r in trace] == sorted(r.ts for r in trace)


@pytest.mark.shared
@needs_shared
def test_sharegpt_roles_handles_leading_assistant_chunks(ref_tok):
    trace = build_sharegpt_trace(num_sessions=40)
    records = [r for p in _sharegpt_parts() for r in json.loads(p.read_text())][:40]
    leading = [k for k, r in enumerate(records) if r["conversations"][0]["from"] == "gpt"]
    assert leading, "the sample should contain records that start with an assistant chunk"
    sessions = trace.sessions()
    for k in leading[:5]:
        msgs = records[k]["conversations"]
        first_user = next(i for i, m in enumerate(msgs) if m["from"] == "human")
        prefix = [t for ids in _encode(ref_tok, [json.dumps(m) for m in msgs[:first_user + 1]]) for t in ids]
        assert sessions[k][0].input_tokens.tolist() == prefix
    for reqs in sessions.values():  # each turn's input extends the previous turn's input + output
        for a, b in zip(reqs, reqs[1:]):
            prev = np.concatenate([a.input_tokens, a.output_tokens])
            assert np.array_equal(b.input_tokens[:prev.size], prev)


_REC_META = {"format": "marconi-vllm-recording", "block_size": 16, "salt_id": "s"}
_REC_ROW = {"arrival": 0, "finish": 1, "prompt_len": 1, "output_len": 1, "num_cached_tokens": 0,
            "num_preemptions": 0, "hash_ids": []}


def _read_recording(tmp_path, row, meta=_REC_META):
    path = tmp_path / "rec.jsonl"
    path.write_text(json.dumps({"recording": "s"}) + "\n" + json.dumps(row) + "\n")
    (tmp_path / "rec.jsonl.meta.json").write_text(json.dumps(meta))
    return read_recording(path)


def _lines(tmp_path, name, *objs):
    path = tmp_path / name
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return path


@pytest.mark.parametrize("read, message", [
    (lambda p: load_trajectories([_lines(p, "a.traj", {"messages": [{"role": "user", "content": 5}]})]),
     r"a\.traj: trajectory 'a' message 0: message content must be a string, got an integer \(5\)"),
    (lambda p: load_trajectories([_lines(p, "b.traj", [3])]), r"a trajectory must be an object, got an integer \(3\)"),
    (lambda p: load_trajectories([_lines(p, "c.traj", {"messages": {}})]), "messages must be a list, got an object"),
    (lambda p: load_trajectories([_lines(p, "d.traj", {"messages": [{"role": "user", "created": "noon"}]})]),
     r"'created' must be a unix time in seconds, got a string \('noon'\)"),
    (lambda p: list(read_chat_records([_lines(p, "a.json", {})])),
     r"a\.json: expected a JSON list of conversation records, got an object"),
    (lambda p: list(read_chat_records([_lines(p, "b.jsonl", [1])])),
     r"b\.jsonl:1: a record must be an object, got a list"),
    (lambda p: list(read_chat_records([_lines(p, "c.jsonl", {"conversations": "hi"})])),
     r"the conversation must be a list, got a string \('hi'\)"),
    (lambda p: list(read_chat_records([_lines(p, "d.jsonl", {"conversations": [{"from": "human", "value": 3.5}]})])),
     r"message 0: message content must be a string, got a number \(3\.5\)"),
    (lambda p: load_quality_articles([_lines(p, "q.jsonl", None)]),
     r"q\.jsonl:1: expected a JSON object per line, got null"),
    (lambda p: load_quality_articles([_lines(p, "q.jsonl", {"article_id": 1, "article": "t", "questions": [
        {"question": "q", "options": ["a", "b"], "gold_label": "1"}]})]),
     r"'gold_label' must be an integer in 1\.\.2, got a string \('1'\)"),
    (lambda p: read_mooncake_rows(_lines(p, "m.jsonl", [1])), r"m\.jsonl:1: expected a JSON object, got a list"),
    (lambda p: read_mooncake_rows(_lines(p, "m.jsonl", {"timestamp": 0, "input_length": 1.5})),
     r"field 'input_length': expected an integer, got a number \(1\.5\)"),
    (lambda p: read_mooncake_rows(_lines(p, "m.jsonl", {"timestamp": 0, "input_length": 1, "output_length": 1,
                                                        "hash_ids": [0, True]})),
     r"field 'hash_ids': expected a list of integers >= 0, element 1 is a bool \(True\)"),
    (lambda p: _read_recording(p, [1]), r"rec\.jsonl:2: expected a JSON object, got a list"),
    (lambda p: _read_recording(p, {**_REC_ROW, "arrival": "0"}),
     r"rec\.jsonl:2: field 'arrival': expected seconds >= 0, got a string \('0'\)"),
    (lambda p: _read_recording(p, {**_REC_ROW, "hash_ids": {}}),
     r"field 'hash_ids': expected a list of integers in \[0, 2\*\*63\), got an object"),
    (lambda p: _read_recording(p, _REC_ROW, [_REC_META]),
     r"rec\.jsonl\.meta\.json: expected a JSON object \(a recording's sidecar\), got a list"),
    (lambda p: _read_recording(p, _REC_ROW, {**_REC_META, "format": 3}),
     r"field 'format': expected 'marconi-vllm-recording', got an integer \(3\)"),
])
def test_readers_name_the_json_kind_they_got(tmp_path, read, message):
    """Every reader of decoded JSON says what it got in core.jsonfile's one wording."""
    with pytest.raises(ValueError, match=message):
        read(tmp_path)


# ============================================================================ Qwen-Bailian (block-hash)


def _bailian(path, rows):
    keys = ("chat_id", "parent_chat_id", "timestamp", "input_length", "output_length", "hash_ids")
    path.write_text("".join(json.dumps({**dict(zip(keys, r)), "type": "text", "turn": 1}) + "\n" for r in rows))
    return path


def _shared(a, b) -> int:
    n = min(len(a), len(b))
    return int(np.argmax(np.concatenate([a[:n] != b[:n], [True]])))


def test_a_bailian_trace_reads_in_seconds_16_token_blocks_and_chat_sessions(tmp_path):
    path = _bailian(tmp_path / "qwen_traceA_blksz_16.jsonl", [
        (159, -1, 61.114, 40, 13, [1089, 1090, 1091]),
        (170, -1, 61.5, 33, 5, [1089, 1090, 2000]),
        (160, 159, 62.5, 70, 8, [1089, 1090, 1092, 1093, 1094]),
        (161, 160, 70.0, 96, 8, [1089, 1090, 1092, 1093, 1094, 1095]),
        (300, 299, 75.0, 20, 8, [5, 1089]),            # parent not in the file; 1089 after 5: rechained
    ])
    trace = build_mooncake_trace(path)
    assert trace.meta["source"] == "bailian" and trace.meta["params"]["block_size"] == 16
    assert trace.meta["num_rechained_blocks"] == 1
    by_chat = dict(zip((159, 170, 160, 161, 300), trace))       # in time order, as the file
    assert [r.ts for r in trace] == [61.114, 61.5, 62.5, 70.0, 75.0]  # seconds, not milliseconds
    assert [(r.session_id, r.turn_id) for r in trace] == [(159, 0), (170, 0), (159, 1), (159, 2), (299, 0)]
    assert trace.num_sessions == 3
    assert _shared(by_chat[159].input_tokens, by_chat[170].input_tokens) == 32     # two 16-token blocks
    assert _shared(by_chat[159].input_tokens, by_chat[160].input_tokens) == 32
    assert _shared(by_chat[160].input_tokens, by_chat[161].input_tokens) == 70
    assert not np.array_equal(by_chat[300].input_tokens[16:], by_chat[159].input_tokens[:4])  # 1089 after 5
    assert trace.meta["layout"] == "Qwen-Bailian"
    with pytest.raises(ValueError, match=r"blksz_16\.jsonl:1: input_length 40 needs 2 \(or 1, its tail unhashed\) "
                                         r"blocks of 32"):
        build_mooncake_trace(path, block_size=32)      # a block size that is not the trace's: said where


def test_a_bailian_trace_may_leave_its_last_partial_block_unhashed_and_says_what_is_wrong(tmp_path):
    path = _bailian(tmp_path / "b.jsonl", [(1, -1, 0.0, 40, 4, [7, 8]), (2, -1, 0.5, 40, 4, [7, 8])])
    one, two = build_mooncake_trace(path)
    assert _shared(one.input_tokens, two.input_tokens) == 32      # the unhashed tails are not shared
    bad = _bailian(tmp_path / "bad.jsonl", [(1, -1, 0.0, 40, 4, [7])])
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: input_length 40 needs 3 \(or 2, its tail unhashed\) "
                                         r"blocks of 16 \(a Qwen-Bailian trace\), hash_ids has 1"):
        build_mooncake_trace(bad)
    _bailian(bad, [(1, -1, 0.0, 16, 4, [7]), (1, -1, 1.0, 16, 4, [7])])
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: field 'chat_id': 1 names an earlier request"):
        build_mooncake_trace(bad)
    _bailian(bad, [(1, 2, 0.0, 16, 4, [7]), (2, 1, 1.0, 16, 4, [7])])
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: field 'parent_chat_id': chat 1's parents come back"):
        build_mooncake_trace(bad)
    bad.write_text(json.dumps({"chat_id": 1, "parent_chat_id": -1, "timestamp": "61.1", "input_length": 16,
                               "output_length": 4, "hash_ids": [7]}) + "\n")
    with pytest.raises(ValueError, match=r"field 'timestamp': expected finite seconds >= 0"):
        build_mooncake_trace(bad)


def test_a_block_hash_trace_of_another_block_size_is_named_and_read_with_block_size(tmp_path):
    from marconi.workloads import build_workload

    path = tmp_path / "mc64.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 200, "output_length": 3, "hash_ids": [1, 2, 3, 4]}\n'
                    '{"timestamp": 5, "input_length": 130, "output_length": 3, "hash_ids": [1, 2, 5]}\n')
    with pytest.raises(ValueError, match=r"mc64\.jsonl:1: input_length 200 needs 1 blocks of 512 .* hash_ids has 4\. "
                                         r"If the trace hashes blocks of another size, blocks of 64 tokens fit "
                                         r"this line; give it: --trace mooncake:files=PATH,block_size=N"):
        build_mooncake_trace(path)
    first, second = build_workload(f"mooncake:files={path},block_size=64")
    assert _shared(first.input_tokens, second.input_tokens) == 128      # two 64-token blocks
    with pytest.raises(ValueError, match="block_size= is for a trace of your own"):
        build_workload("mooncake:block_size=64")
    with pytest.raises(ValueError, match="block_size must be an integer >= 1"):
        build_workload(f"mooncake:files={path},block_size=-1")


def test_64_bit_hash_ids_are_numbered_densely_and_keep_their_structure(tmp_path):
    big = [2**64 - 1, 2**63 + 5, 2**64 - 7]
    path = tmp_path / "big.jsonl"
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": 1000, "output_length": 2, "hash_ids": ids}) + "\n"
                            for t, ids in [(0, big[:2]), (1, [big[0], big[2]]), (2, [big[1], big[0]])]))
    one, two, three = build_mooncake_trace(path)
    assert _shared(one.input_tokens, two.input_tokens) == 512       # the first block shared, then a branch
    assert _shared(one.input_tokens, three.input_tokens) == 0
    assert not np.array_equal(three.input_tokens[512:522], one.input_tokens[:10])   # rechained, not block 0


def test_block_hash_lines_out_of_range_are_refused_with_file_line_and_field(tmp_path):
    bad = tmp_path / "bad.jsonl"
    cases = [('{"timestamp": 0, "input_length": 40, "output_length": 1000000000000, "hash_ids": [1]}',
              r"bad\.jsonl:1: field 'output_length': must be <= 100,000,000"),
             ('{"timestamp": 1' + "0" * 400 + ', "input_length": 40, "output_length": 1, "hash_ids": [1]}',
              r"bad\.jsonl:1: field 'timestamp': expected finite milliseconds >= 0"),
             ('{"timestamp": Infinity, "input_length": 40, "output_length": 1, "hash_ids": [1]}',
              r"bad\.jsonl:1: field 'timestamp': expected finite"),
             ('{"chat_id": 1, "parent_chat_id": -1, "timestamp": 1e306, "input_length": 40, "output_length": 1, '
              '"hash_ids": [1, 2, 3]}', r"bad\.jsonl:1: field 'timestamp': expected finite seconds"),
             ('{"chat_id": 1, "timestamp": 0.5, "input_length": 40, "output_length": 1, "hash_ids": [1, 2, 3]}',
              r"bad\.jsonl:1: field 'parent_chat_id': missing"),         # chat_id alone: a Bailian line
             ('{"timestamp": 0, "input_length": 40, "output_length": 1, "hash_ids": [1' + "1" * 5000 + ']}',
              r"bad\.jsonl:1: invalid JSON value"),
             ('{"input_length": 40, "output_length": 1, "hash_ids": [1]}', r"bad\.jsonl:1: field 'timestamp': missing"),
             ('{"timestamp": 0, "input_length": 40, "output_length": 1}', r"bad\.jsonl:1: field 'hash_ids': missing")]
    for line, message in cases:
        bad.write_text(line + "\n")
        with pytest.raises(ValueError, match=message):
            build_mooncake_trace(bad)
        with pytest.raises(ValueError, match=message):      # --trace FILE finds the block-hash reader too
            load_trace(str(bad))


def test_a_block_hash_trace_with_more_roots_than_the_vocabulary_grows_it(tmp_path):
    path = tmp_path / "wide.jsonl"
    path.write_text("".join(json.dumps({"timestamp": i, "input_length": 16, "output_length": 1, "hash_ids": [i]}) + "\n"
                            for i in range(31000)))
    trace = build_mooncake_trace(path, block_size=16)
    assert trace.meta["params"]["vocab_size"] > 32000 and trace.num_requests == 31000
    firsts = {int(r.input_tokens[0]) for r in trace}
    assert len(firsts) == 31000                                    # siblings still differ at their first token
    with pytest.raises(ValueError, match=r"wide\.jsonl:31000: a block there has 31000 distinct successors .* "
                                         r"raise vocab_size to at least 32027"):
        build_mooncake_trace(path, block_size=16, vocab_size=32000)
    assert build_mooncake_trace(MOONCAKE_SAMPLE, limit=50).meta["params"]["vocab_size"] == 32000


def test_bailian_turns_count_the_requests_kept_and_a_limit_short_of_the_file_is_noted(tmp_path):
    path = _bailian(tmp_path / "b.jsonl", [(1, -1, 0.0, 100, 2, [1] * 7), (2, 1, 1.0, 40, 2, [1, 2, 3]),
                                           (3, 2, 2.0, 48, 2, [1, 2, 3])])
    trace = build_mooncake_trace(path, max_input_len=60)
    assert [(r.session_id, r.turn_id) for r in trace] == [(1, 0), (1, 1)] and trace.meta["num_dropped"] == 1
    assert build_mooncake_trace(path, limit=2).meta["more_in_file"] is True
    assert build_mooncake_trace(path, limit=3).meta["more_in_file"] is False
    notes: list[str] = []
    load_trace(f"mooncake:files={path},requests=2", notice=notes.append)
    assert any("the first 2 requests of" in n and "which holds more" in n for n in notes), notes
    notes.clear()
    load_trace("mooncake-sample:requests=10", notice=notes.append)    # the entry's own size: nothing to say
    assert not notes


def test_a_limit_on_a_block_hash_file_out_of_time_order_keeps_its_earliest_arrivals(tmp_path):
    """Old: ``limit`` took an unsorted file's first lines, a sample spread over its whole span (and a
    Bailian turn whose parent came later). Now the earliest arrivals, as in a file in time order."""
    rows = [{"timestamp": 100 * i, "input_length": 1024, "output_length": 4, "hash_ids": [0, i + 1]}
            for i in range(12)]
    ordered = tmp_path / "ordered.jsonl"
    ordered.write_text("".join(json.dumps(r) + "\n" for r in rows))
    shuffled = tmp_path / "shuffled.jsonl"
    order = [5, 0, 11, 3, 8, 1, 10, 2, 7, 4, 9, 6]
    shuffled.write_text("".join(json.dumps(rows[i]) + "\n" for i in order))

    def key(trace):
        return [(r.ts, r.input_tokens.tolist()) for r in trace]

    first = build_mooncake_trace(ordered, limit=4)
    earliest = build_mooncake_trace(shuffled, limit=4)
    assert [r.ts for r in earliest] == [0.0, 0.1, 0.2, 0.3]
    assert key(earliest) == key(first) and earliest.meta["more_in_file"] is True
    assert key(build_mooncake_trace(shuffled)) == key(build_mooncake_trace(ordered, limit=12))
    assert [row.where.rsplit(":", 1)[1] for row in read_mooncake_rows(shuffled, limit=3)] == ["2", "6", "8"]
