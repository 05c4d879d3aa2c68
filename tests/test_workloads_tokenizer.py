"""The tokenizer wrapper and data locations."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from marconi.workloads import TokenizerError, bundled_data_dir, load_tokenizer, shared_data_dir

VENDORED = bundled_data_dir() / "tokenizers" / "mistral-v1" / "tokenizer.json"
SHARED = shared_data_dir()
needs_shared = pytest.mark.skipif(SHARED is None, reason="../shared/data is absent (set MARCONI_SHARED_DATA)")


def test_default_is_the_vendored_mistral_v1():
    tok = load_tokenizer()
    assert tok.name == "mistral-v1" and tok.vocab_size == 32000 and tok.bos_id == 1
    assert tok.path == VENDORED.resolve()
    for extra in ("LICENSE", "SOURCE.md"):
        assert (VENDORED.parent / extra).is_file()


def test_encode_matches_the_tokenizers_package():
    tok = load_tokenizer()
    ref = Tokenizer.from_file(str(VENDORED))
    texts = ["Hello world", '{"from": "human", "value": "calculate the interest"}', "",
             "  multiple   spaces\n"]
    for text in texts:
        ids = tok.encode(text)
        assert ids.dtype == np.int32
        assert ids.tolist() == ref.encode(text).ids  # the template adds BOS the same way
        assert tok.encode(text, add_bos=False).tolist() == ref.encode(text, add_special_tokens=False).ids
    batch = tok.encode_batch(texts)
    assert [b.tolist() for b in batch] == [tok.encode(t).tolist() for t in texts]
    assert tok.decode(tok.encode("Hello world", add_bos=False)) == "Hello world"


def test_load_by_folder_and_by_file():
    assert load_tokenizer(VENDORED.parent).path == load_tokenizer(str(VENDORED)).path


def test_unknown_tokenizer_names_the_path(tmp_path):
    missing = tmp_path / "nowhere" / "tokenizer.json"
    with pytest.raises(TokenizerError, match=str(missing)):
        load_tokenizer(missing)
    with pytest.raises(TokenizerError, match="no-such-tokenizer"):
        load_tokenizer("no-such-tokenizer")


def test_invalid_tokenizer_file(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not a tokenizer")
    with pytest.raises(TokenizerError, match=str(bad)):
        load_tokenizer(tmp_path)


def test_llama2_is_not_vendored():
    assert not (bundled_data_dir() / "tokenizers" / "llama2").exists()


def test_vendored_data_stays_small():
    total = sum(p.stat().st_size for p in bundled_data_dir().rglob("*") if p.is_file())
    assert total < 6 * 1024 * 1024


@pytest.mark.shared
@needs_shared
def test_llama2_by_name_from_the_shared_data():
    tok = load_tokenizer("llama2")
    assert tok.vocab_size == 32000 and tok.bos_id == 1
    assert tok.path == (SHARED / "tokenizers" / "llama2" / "tokenizer.json").resolve()
    assert tok.encode("Hello world")[0] == 1


def test_shared_data_dir_env_override(tmp_path, monkeypatch):
    monkeypatch.setenv("MARCONI_SHARED_DATA", str(tmp_path))
    assert shared_data_dir() == tmp_path.resolve()
    monkeypatch.setenv("MARCONI_SHARED_DATA", str(tmp_path / "missing"))
    assert shared_data_dir() is None
    monkeypatch.setenv("MARCONI_SHARED_DATA", "")
    assert shared_data_dir() is None
    monkeypatch.delenv("MARCONI_SHARED_DATA")
    found = shared_data_dir()
    expected = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
    assert found == (expected.resolve() if expected.is_dir() else None)
