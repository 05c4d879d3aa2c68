"""Chat messages shared by the real-data builders: roles, the text a message is tokenized as, timing.
Each message is tokenized on its own, so turn *i*'s input is the concatenation of the arrays before it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

import numpy as np

from marconi.core.jsonfile import described

from .tokenizer import TextTokenizer

__all__ = [
    "Message",
    "TEXT_FORMS",
    "CALL_FIELDS",
    "content_text",
    "call_fields",
    "normalize_role",
    "encode_messages",
    "count_words",
    "Progress",
    "no_progress",
]

T = TypeVar("T")
Progress = Callable[[Iterable[T]], Iterable[T]]
"""A wrapper over a builder's main loop (e.g. ``functools.partial(tqdm, desc=...)``); the library
prints nothing itself."""

TEXT_FORMS = ("json", "content")
"""How a message becomes text: ``json`` = ``json.dumps`` of its source role and content fields, and its
tool calls where it has any (the paper's form: ShareGPT ``{"from": ..., "value": ...}``, LMSys/agents
``{"role": ..., "content": ...}``, ASCII-escaped as ``json.dumps`` does by default); ``content`` = the
content string alone, its tool calls (``json.dumps``) on a line after it."""

CALL_FIELDS = ("tool_calls", "function_call")
"""A message's fields, beside its role and content, that the model wrote as text and reads back in
every later call: an assistant's tool calls (OpenAI's ``tool_calls``, its older ``function_call``;
SWE-agent's function-calling runs keep the call there, their ``content`` holds only the thought).
A message whose content is empty or null and whose call is here is a whole turn of output."""

_ROLE_ALIASES = {
    "human": "user", "user": "user",
    "gpt": "assistant", "chatgpt": "assistant", "assistant": "assistant", "bard": "assistant",
    "bing": "assistant", "model": "assistant", "claude": "assistant",
    "function_call": "assistant",      # the model's call, in ShareGPT-style tool data (LLaMA-Factory's)
    "system": "system", "developer": "system",      # OpenAI's newer name for the system prompt
    "tool": "tool", "function": "tool", "ipython": "tool", "observation": "tool",
}


def no_progress(items: Iterable[T]) -> Iterable[T]:
    return items


def normalize_role(role: Any) -> str:
    """``"user"``, ``"assistant"``, ``"system"`` or ``"tool"``; ValueError for an unknown role."""
    key = str(role).strip().lower()
    if key not in _ROLE_ALIASES:
        raise ValueError(f"unknown message role {role!r} (known: {', '.join(sorted(_ROLE_ALIASES))})")
    return _ROLE_ALIASES[key]


def content_text(content: Any, where: str) -> str:
    """A message's ``content`` as text: a string as is, null as ``""``, OpenAI content parts (a list of
    ``{"type": "text", "text": ...}`` or strings) joined, other parts (images) skipped. ValueError
    naming ``where`` for anything else."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    raise ValueError(f"{where}: message content must be a string, got {described(content)}")


def call_fields(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The :data:`CALL_FIELDS` a source message carries (present, not null and not empty), as given."""
    return {k: obj[k] for k in CALL_FIELDS if obj.get(k) not in (None, "", [], {})}


def count_words(text: str) -> int:
    """Whitespace-separated words of ``text`` (``len(text.split())``)."""
    return len(text.split())


@dataclass(frozen=True, slots=True)
class Message:
    """One message; ``raw``: the source's role and content fields and its tool calls (:data:`CALL_FIELDS`),
    as given (the ``json`` text form); ``created``: the source's unix time, if any."""

    role: str
    content: str
    raw: Mapping[str, Any] = field(default_factory=dict)
    created: float | None = None

    def text(self, text_form: str) -> str:
        if text_form == "json":
            return json.dumps(dict(self.raw) if self.raw else {"role": self.role, "content": self.content})
        if text_form == "content":
            calls = [self.raw[k] for k in CALL_FIELDS if k in self.raw]
            return "\n".join([self.content, *map(json.dumps, calls)]) if calls else self.content
        raise ValueError(f"unknown text form {text_form!r} (choose from {', '.join(TEXT_FORMS)})")


def check_text_form(text_form: str) -> str:
    if text_form not in TEXT_FORMS:
        raise ValueError(f"unknown text form {text_form!r} (choose from {', '.join(TEXT_FORMS)})")
    return text_form


def encode_messages(tokenizer: TextTokenizer, messages: Sequence[Message], text_form: str = "json",
                    add_bos: bool = True) -> list[np.ndarray]:
    """Tokenize each message on its own; int32 arrays, one per message, in order."""
    return tokenizer.encode_batch([m.text(text_form) for m in messages], add_bos=add_bos)


def concat_with_offsets(arrays: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """One int32 buffer holding ``arrays`` back to back, and offsets ``[len(arrays) + 1]``."""
    lens = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    stream = np.concatenate(arrays).astype(np.int32, copy=False) if arrays else np.zeros(0, np.int32)
    return stream, offsets
