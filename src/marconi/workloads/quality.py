"""Document-QA traces from QuALITY (shared data set only, CC BY 4.0): one request per question,
instruction + article + question tokenized separately so an article's questions share its tokens
exactly; session = article. Layout: docs/data.md ("QuALITY")."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from marconi.core.jsonfile import described
from marconi.io import iter_jsonl

from .paths import shared_data_dir
from .tokenizer import TextTokenizer, load_tokenizer
from .trace import Request, Trace

__all__ = [
    "ANSWER_FORMS",
    "DEFAULT_INSTRUCTION",
    "OPTION_LETTERS",
    "QualityArticle",
    "QualityQuestion",
    "build_quality_trace",
    "default_quality_files",
    "load_quality_articles",
]

DEFAULT_INSTRUCTION = ("You will read an article and answer a multiple-choice question about it. "
                       "Reply with the letter of the correct option followed by the option's text.")
ANSWER_FORMS = ("letter+text", "letter")
OPTION_LETTERS = "ABCDEFGH"


@dataclass(frozen=True, slots=True)
class QualityQuestion:
    """A multiple-choice question; ``gold_label`` is 1-based into ``options``."""

    question: str
    options: tuple[str, ...]
    gold_label: int

    def prompt_text(self) -> str:
        options = "\n".join(f"({OPTION_LETTERS[i]}) {opt}" for i, opt in enumerate(self.options))
        return f"### Question\n{self.question}\n\n### Options\n{options}\n\n### Answer\n"

    def answer_text(self, answer_form: str) -> str:
        letter = f"({OPTION_LETTERS[self.gold_label - 1]})"
        return letter if answer_form == "letter" else f"{letter} {self.options[self.gold_label - 1]}"


@dataclass(frozen=True, slots=True)
class QualityArticle:
    article_id: str
    title: str
    text: str
    questions: tuple[QualityQuestion, ...]
    source: str


def _question(obj: Any, where: str) -> QualityQuestion:
    if not isinstance(obj, dict) or not isinstance(obj.get("question"), str):
        raise ValueError(f"{where}: a question needs a 'question' string")
    options = obj.get("options")
    if not isinstance(options, list) or not options or len(options) > len(OPTION_LETTERS) \
            or not all(isinstance(o, str) for o in options):
        raise ValueError(f"{where}: 'options' must be a list of 1..{len(OPTION_LETTERS)} strings")
    gold = obj.get("gold_label")
    if isinstance(gold, bool) or not isinstance(gold, int) or not 1 <= gold <= len(options):
        raise ValueError(f"{where}: 'gold_label' must be an integer in 1..{len(options)}, got {described(gold)}")
    return QualityQuestion(obj["question"], tuple(options), gold)


def _article(obj: Any, where: str) -> QualityArticle:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object per line, got {described(obj)}")
    for key in ("article_id", "article"):
        if not isinstance(obj.get(key), (str, int)) or isinstance(obj.get(key), bool):
            raise ValueError(f"{where}: missing or invalid {key!r}")
    questions = obj.get("questions")
    if not isinstance(questions, list) or not questions:
        got = "an empty list" if questions == [] else described(questions)
        raise ValueError(f"{where}: 'questions' must be a non-empty list, got {got}")
    parsed = tuple(_question(q, f"{where} question {i}") for i, q in enumerate(questions))
    return QualityArticle(str(obj["article_id"]), str(obj.get("title", "")), str(obj["article"]).strip(),
                          parsed, where.split(":")[0])


def load_quality_articles(paths: Sequence[str | os.PathLike]) -> list[QualityArticle]:
    """Articles of the JSONL files in order; FileNotFoundError, or ValueError for a malformed record or a
    repeated ``article_id``."""
    out: list[QualityArticle] = []
    seen: dict[str, str] = {}
    for path in map(Path, paths):
        for where, obj in iter_jsonl(path):
            art = _article(obj, where)
            if art.article_id in seen:
                raise ValueError(f"{where}: article_id {art.article_id!r} already read at {seen[art.article_id]}")
            seen[art.article_id] = where
            out.append(art)
    return out


def default_quality_files() -> list[Path]:
    """The shared data set's QuALITY files (sorted by name), or [] where it is absent."""
    shared = shared_data_dir()
    if shared is None:
        return []
    return sorted((shared / "quality").glob("*.jsonl"))


def build_quality_trace(paths: Sequence[str | os.PathLike] | None = None, *,
                        instruction: str = DEFAULT_INSTRUCTION, answer_form: str = "letter+text",
                        requests_per_second: float = 0.5, seed: int = 0, max_articles: int | None = None,
                        add_bos: bool = True, tokenizer: TextTokenizer | str | os.PathLike | None = None) -> Trace:
    """Build a QuALITY trace (``paths`` default to :func:`default_quality_files`; ``max_articles`` keeps
    the first). ``meta``: ``article_of_request``, ``shared_len_of_request``, ``prefix_len_of_article``,
    ``questions_per_article``, ``instruction_len``. FileNotFoundError or ValueError for bad input."""
    if answer_form not in ANSWER_FORMS:
        raise ValueError(f"unknown answer_form {answer_form!r} (choose from {', '.join(ANSWER_FORMS)})")
    if not requests_per_second > 0:
        raise ValueError(f"requests_per_second must be > 0, got {requests_per_second}")
    if max_articles is not None and max_articles < 1:
        raise ValueError(f"max_articles must be >= 1 or None, got {max_articles}")
    files = [Path(p) for p in paths] if paths else default_quality_files()
    if not files:
        raise FileNotFoundError("no QuALITY files given and the shared data set is absent "
                                "(set MARCONI_SHARED_DATA or pass the files)")
    articles = load_quality_articles(files)[:max_articles]
    tok = tokenizer if isinstance(tokenizer, TextTokenizer) else load_tokenizer(tokenizer)

    head = tok.encode(instruction, add_bos=add_bos)
    bodies = tok.encode_batch([f"### Article\n{a.text}" for a in articles], add_bos=False)
    prefixes = [np.concatenate([head, body]) for body in bodies]
    questions = [q for a in articles for q in a.questions]
    q_tokens = iter(tok.encode_batch([q.prompt_text() for q in questions], add_bos=False))
    a_tokens = iter(tok.encode_batch([q.answer_text(answer_form) for q in questions], add_bos=False))
    per_article = [[(next(q_tokens), next(a_tokens)) for _ in a.questions] for a in articles]

    rng = np.random.default_rng([seed, 51])
    article_of_arrival = rng.permutation(np.repeat(np.arange(len(articles)), [len(a.questions) for a in articles]))
    arrival_ts = np.cumsum(rng.exponential(1.0 / requests_per_second, size=article_of_arrival.size))
    requests: list[Request] = []
    article_of_request: list[str] = []
    shared_len_of_request: list[int] = []
    next_q = [0] * len(articles)
    for ts, k in zip(arrival_ts.tolist(), article_of_arrival.tolist()):
        q = next_q[k]
        next_q[k] += 1
        question, answer = per_article[k][q]
        requests.append(Request(articles[k].article_id, q, ts, np.concatenate([prefixes[k], question]), answer))
        article_of_request.append(articles[k].article_id)
        shared_len_of_request.append(int(prefixes[k].size))

    params = {"instruction": instruction, "answer_form": answer_form, "requests_per_second": requests_per_second,
              "seed": seed, "max_articles": max_articles, "add_bos": add_bos}
    meta = {"source": "quality", "recipe": "document-qa", "params": params, "files": [str(f) for f in files],
            "tokenizer": tok.name, "num_articles": len(articles), "article_ids": [a.article_id for a in articles],
            "questions_per_article": {a.article_id: len(a.questions) for a in articles},
            "instruction_len": int(head.size),
            "prefix_len_of_article": {a.article_id: int(p.size) for a, p in zip(articles, prefixes)},
            "article_of_request": article_of_request, "shared_len_of_request": shared_len_of_request}
    name = f"quality-a{len(articles)}-q{len(requests)}-seed{seed}"
    # Arrival times strictly increase, so trace order is arrival order and the meta lists align with it.
    return Trace(requests, name=name, meta=meta)
