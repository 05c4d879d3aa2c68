"""Text -> token ids with the ``tokenizers`` package and a ``tokenizer.json``.

Default: the vendored Mistral-7B v0.1 tokenizer (Apache-2.0, 32k vocab). Others by path or by a
folder name under ``tokenizers/`` of the vendored or shared data (``llama2``, the paper's, only
from the shared data set).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .paths import bundled_data_dir, shared_data_dir

__all__ = ["TextTokenizer", "TokenizerError", "load_tokenizer", "resolve_tokenizer_path", "DEFAULT_TOKENIZER"]

DEFAULT_TOKENIZER = "mistral-v1"
_BOS_CANDIDATES = ("<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>")


class TokenizerError(ValueError):
    """A tokenizer could not be found or loaded; the message names the path tried."""


@dataclass(frozen=True, slots=True, eq=False)
class TextTokenizer:
    """A loaded tokenizer; ``encode`` returns int32 ids, BOS first when asked.

    Attributes:
        vocab_size: number of ids including added tokens.
        bos_id: the beginning-of-sequence id, or None.
    """

    name: str
    path: Path
    vocab_size: int
    bos_id: int | None
    _tok: Any

    def _with_bos(self, ids: list[int], add_bos: bool) -> np.ndarray:
        if add_bos:
            if self.bos_id is None:
                raise TokenizerError(f"{self.path}: this tokenizer has no BOS token; use add_bos=False")
            return np.array([self.bos_id, *ids], dtype=np.int32)
        return np.array(ids, dtype=np.int32)

    def encode(self, text: str, add_bos: bool = True) -> np.ndarray:
        """Token ids of ``text`` (int32 ``[n]``), with BOS first when ``add_bos``."""
        return self._with_bos(self._tok.encode(text, add_special_tokens=False).ids, add_bos)

    def encode_batch(self, texts: Sequence[str], add_bos: bool = True) -> list[np.ndarray]:
        """``encode`` of each text, tokenized in parallel by the Rust library."""
        if not texts:
            return []
        encode = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
        return [self._with_bos(e.ids, add_bos) for e in encode(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int] | np.ndarray, skip_special_tokens: bool = False) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)


def resolve_tokenizer_path(spec: str | os.PathLike | None = None) -> Path:
    """The ``tokenizer.json`` for a name, a file or a directory (None: the default); TokenizerError
    naming every place tried otherwise."""
    if spec is None:
        spec = DEFAULT_TOKENIZER
    text = os.fspath(spec)
    candidates: list[Path] = []
    path = Path(text).expanduser()
    candidates.append(path / "tokenizer.json" if path.is_dir() else path)
    if os.sep not in text and "/" not in text and not text.endswith(".json"):
        candidates.append(bundled_data_dir() / "tokenizers" / text / "tokenizer.json")
        shared = shared_data_dir()
        if shared is not None:
            candidates.append(shared / "tokenizers" / text / "tokenizer.json")
    for cand in candidates:
        if cand.is_file():
            return cand.resolve()
    tried = ", ".join(str(c) for c in candidates)
    raise TokenizerError(f"tokenizer not found: {text!r} (tried {tried})")


@functools.lru_cache(maxsize=8)
def _load(path: Path) -> TextTokenizer:
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust side raises a bare Exception on bad JSON
        raise TokenizerError(f"{path}: not a loadable tokenizer.json ({exc})") from exc
    bos_id = next((tok.token_to_id(t) for t in _BOS_CANDIDATES if tok.token_to_id(t) is not None), None)
    name = path.parent.name if path.name == "tokenizer.json" else path.stem
    return TextTokenizer(name=name, path=path, vocab_size=tok.get_vocab_size(with_added_tokens=True),
                         bos_id=bos_id, _tok=tok)


def load_tokenizer(path: str | os.PathLike | None = None) -> TextTokenizer:
    """Load (and cache) a tokenizer: None for the default, a name, a ``tokenizer.json`` or its folder.

    Raises:
        TokenizerError: not found (the message names the path) or not a valid tokenizer file.
    """
    return _load(resolve_tokenizer_path(path))
