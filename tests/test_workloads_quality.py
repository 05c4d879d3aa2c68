"""The QuALITY document-QA trace builder: a small file written here (always) and the shared data set (CI).

Expected values are computed independently from the source records with the ``tokenizers`` package.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from marconi.workloads import bundled_data_dir, shared_data_dir
from marconi.workloads.quality import (
    DEFAULT_INSTRUCTION,
    build_quality_trace,
    default_quality_files,
    load_quality_articles,
)

SHARED = shared_data_dir()
needs_quality = pytest.mark.skipif(SHARED is None or not (SHARED / "quality").is_dir(),
                                   reason="../shared/data/quality is absent (set MARCONI_SHARED_DATA)")

ARTICLES = [
    {"article_id": "a1", "title": "First", "article": "First\n\nThe quick brown fox jumps over the lazy dog. " * 20,
     "questions": [{"question": "What jumps?", "options": ["a fox", "a dog", "a cat", "nothing"], "gold_label": 1},
                   {"question": "What is lazy?", "options": ["the fox", "the dog", "the cat", "all"], "gold_label": 2}]},
    {"article_id": "a2", "title": "Second", "article": "Second\n\nA much shorter article about rain.",
     "questions": [{"question": "What is it about?", "options": ["snow", "rain", "sun", "wind"], "gold_label": 2},
                   {"question": "Is it short?", "options": ["yes", "no", "maybe", "unknown"], "gold_label": 1},
                   {"question": "Why rain?", "options": ["clouds", "sun", "wind", "fog"], "gold_label": 1}]},
    {"article_id": "a3", "title": "Third", "article": "Third\n\nAn article with a single question " * 5,
     "questions": [{"question": "How many questions?", "options": ["one", "two", "three", "four"], "gold_label": 1}]},
]


@pytest.fixture(scope="module")
def ref_tok() -> Tokenizer:
    return Tokenizer.from_file(str(bundled_data_dir() / "tokenizers" / "mistral-v1" / "tokenizer.json"))


@pytest.fixture()
def small_file(tmp_path: Path) -> Path:
    path = tmp_path / "quality_small.jsonl"
    path.write_text("\n".join(json.dumps(a) for a in ARTICLES) + "\n")
    return path


def _encode(tok: Tokenizer, text: str, bos: bool) -> list[int]:
    ids = tok.encode(text, add_special_tokens=False).ids
    return [tok.token_to_id("<s>"), *ids] if bos else ids


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.size, b.size)
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def test_small_file_layout_matches_independent_tokenization(small_file, ref_tok):
    trace = build_quality_trace([small_file], seed=3)
    assert len(trace) == sum(len(a["questions"]) for a in ARTICLES)
    assert trace.num_sessions == len(ARTICLES)
    assert trace.meta["questions_per_article"] == {a["article_id"]: len(a["questions"]) for a in ARTICLES}
    head = _encode(ref_tok, DEFAULT_INSTRUCTION, bos=True)
    assert trace.meta["instruction_len"] == len(head)
    by_id = {a["article_id"]: a for a in ARTICLES}
    for req, art_id in zip(trace, trace.meta["article_of_request"]):
        art = by_id[art_id]
        assert req.session_id == art_id
        q = art["questions"][req.turn_id]      # the n-th arrival of an article is its n-th question
        letters = "ABCD"
        options = "\n".join(f"({letters[i]}) {o}" for i, o in enumerate(q["options"]))
        expected = (head + _encode(ref_tok, "### Article\n" + art["article"].strip(), bos=False)
                    + _encode(ref_tok, f"### Question\n{q['question']}\n\n### Options\n{options}\n\n### Answer\n",
                              bos=False))
        assert req.input_tokens.tolist() == expected
        gold = q["options"][q["gold_label"] - 1]
        assert req.output_tokens.tolist() == _encode(ref_tok, f"({letters[q['gold_label'] - 1]}) {gold}", bos=False)


def test_prefix_sharing_structure(small_file):
    trace = build_quality_trace([small_file])
    instr = trace.meta["instruction_len"]
    prefix = trace.meta["prefix_len_of_article"]
    assert trace.meta["shared_len_of_request"] == [prefix[a] for a in trace.meta["article_of_request"]]
    reqs = list(zip(trace, trace.meta["article_of_request"]))
    for i, (ra, a) in enumerate(reqs):
        for rb, b in reqs[i + 1:]:
            depth = _lcp(ra.input_tokens, rb.input_tokens)
            if a == b:   # same article: instruction + article, then the questions diverge
                assert prefix[a] <= depth < min(ra.input_len, rb.input_len)
            else:        # other article: the instruction only (articles start differently)
                assert instr <= depth < min(prefix[a], prefix[b])
    assert len(set(prefix.values())) == len(prefix)   # articles of different lengths -> different depths


def test_arrivals_interleave_articles_and_are_seeded(small_file):
    a = build_quality_trace([small_file], seed=1)
    b = build_quality_trace([small_file], seed=1)
    c = build_quality_trace([small_file], seed=2)
    assert [r.ts for r in a] == [r.ts for r in b] and a.meta["article_of_request"] == b.meta["article_of_request"]
    assert [r.ts for r in a] != [r.ts for r in c]
    assert all(x.ts < y.ts for x, y in zip(a, list(a)[1:]))
    for trace in (a, c):   # within an article, questions arrive in file order
        turns: dict[str, list[int]] = {}
        for r in trace:
            turns.setdefault(r.session_id, []).append(r.turn_id)
        assert all(t == list(range(len(t))) for t in turns.values())


def test_answer_form_and_limits(small_file, ref_tok):
    trace = build_quality_trace([small_file], answer_form="letter", max_articles=2)
    assert trace.meta["num_articles"] == 2 and len(trace) == 5
    assert {ref_tok.decode(r.output_tokens.tolist()) for r in trace} <= {"(A)", "(B)", "(C)", "(D)"}


@pytest.mark.parametrize("mutate, message", [
    (lambda a: a[0]["questions"][0].update(gold_label=5), "gold_label"),
    (lambda a: a[1].update(article_id="a1"), "already read"),
    (lambda a: a[2].update(questions=[]), "non-empty"),
    (lambda a: a[0]["questions"][1].update(options="abcd"), "options"),
])
def test_malformed_records_are_errors(tmp_path, mutate, message):
    articles = json.loads(json.dumps(ARTICLES))
    mutate(articles)
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(json.dumps(a) for a in articles) + "\n")
    with pytest.raises(ValueError, match=message):
        build_quality_trace([path])


def test_bad_parameters_and_missing_files(small_file, tmp_path):
    with pytest.raises(ValueError, match="answer_form"):
        build_quality_trace([small_file], answer_form="essay")
    with pytest.raises(ValueError, match="requests_per_second"):
        build_quality_trace([small_file], requests_per_second=0)
    with pytest.raises(FileNotFoundError):
        build_quality_trace([tmp_path / "nope.jsonl"])


@pytest.mark.shared
@needs_quality
def test_shared_quality_counts_and_sharing():
    files = default_quality_files()
    records = [json.loads(line) for f in files for line in f.read_text().splitlines() if line.strip()]
    trace = build_quality_trace(files)
    assert trace.meta["num_articles"] == len(records) == len(load_quality_articles(files))
    assert len(trace) == sum(len(r["questions"]) for r in records)
    assert Counter(r.session_id for r in trace) == Counter({str(r["article_id"]): len(r["questions"]) for r in records})
    prefix = trace.meta["prefix_len_of_article"]
    instr = trace.meta["instruction_len"]
    by_article: dict[str, list] = {}
    for r in trace:
        by_article.setdefault(r.session_id, []).append(r)
    for art, reqs in by_article.items():
        assert all(_lcp(reqs[0].input_tokens, r.input_tokens) >= prefix[art] for r in reqs[1:])
    firsts = [reqs[0] for reqs in by_article.values()]
    for i, a in enumerate(firsts):
        for b in firsts[i + 1:]:
            assert instr <= _lcp(a.input_tokens, b.input_tokens) < min(prefix[a.session_id], prefix[b.session_id])
    # Interleaved: the first quarter of the trace already mixes questions of several articles.
    assert len({r.session_id for r in list(trace)[: len(trace) // 4]}) >= min(4, len(records))
    # Articles differ in length, so "same article" overlap depths differ across articles.
    assert len(set(prefix.values())) >= len(prefix) - 1
