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
    "has_tool_blocks",
    "preamble",
    "listed_messages",
    "safe_text",
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
    "bing": "assistant", "model": "assistant", "claude": "assistant", "ai": "assistant",
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
    """A message's ``content`` as text: a string as is, null as ``""``, a list of content parts joined.
    A part is a string, a text part (OpenAI's ``{"type": "text", "text": ...}``, its Assistants API's
    ``"text": {"value": ...}``), a tool call or result written as blocks (Anthropic's ``tool_use``:
    ``json.dumps`` of its name and input; ``tool_result``: its own content, read the same way), or
    anything else: an image or a file, which the model does not read as text here, skipped.
    ValueError naming ``where`` for content that is none of these."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_part_text(part, where) for part in content)
    raise ValueError(f"{where}: message content must be a string, got {described(content)}")


def _part_text(part: Any, where: str) -> str:
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        return ""
    text = part.get("text")
    if isinstance(text, dict):          # OpenAI's Assistants API: {"type": "text", "text": {"value": ...}}
        text = text.get("value")
    if isinstance(text, str):
        return text
    kind = part.get("type")
    if kind == "tool_use":
        return json.dumps({"name": part.get("name"), "input": part.get("input")})
    if kind == "tool_result":
        return content_text(part.get("content"), where)
    return ""


def has_tool_blocks(content: Any) -> bool:
    """Whether content parts hold a tool call or result written as blocks (``tool_use``, ``tool_result``)."""
    return isinstance(content, list) and any(isinstance(p, dict) and p.get("type") in ("tool_use", "tool_result")
                                             for p in content)


def safe_text(text: str) -> str:
    """``text`` with any lone surrogate (a ``\\ud800`` escape JSON allows, which no tokenizer encodes)
    replaced by ``?``."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


def call_fields(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The :data:`CALL_FIELDS` a source message carries (present, not null and not empty), as given."""
    return {k: obj[k] for k in CALL_FIELDS if obj.get(k) not in (None, "", [], {})}


def listed_messages(record: Mapping[str, Any], fields: Sequence[str]) -> tuple[str, Any] | None:
    """``(field, value)`` for the first of ``fields`` that ``record`` holds, a JSON string there that
    encodes a list read as that list (SWE-smith's trajectories store their messages so); None where
    it holds none of them."""
    for key in fields:
        if key in record:
            value = record[key]
            if isinstance(value, str) and value.lstrip().startswith("["):
                try:
                    decoded = json.loads(value)
                except (ValueError, RecursionError):
                    return key, value
                if isinstance(decoded, list):
                    return key, decoded
            return key, value
    return None


def preamble(record: Mapping[str, Any]) -> tuple[Message, ...]:
    """What a record states beside its message list that a chat template renders ahead of the
    conversation, as system messages, the prompt first: a top-level system prompt (``system``, a
    string: LLaMA-Factory's ShareGPT format) and tool definitions (``tools``: OpenAI's list, or
    LLaMA-Factory's JSON string). Both are every call's shared prefix, which is what a prefix cache
    reuses."""
    out = []
    system = record.get("system")
    if isinstance(system, str) and system:
        out.append(Message("system", system, {"role": "system", "content": system}))
    tools = record.get("tools")
    if tools not in (None, "", [], {}):
        out.append(Message("system", tools if isinstance(tools, str) else json.dumps(tools),
                           {"role": "system", "tools": tools}))
    return tuple(out)


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
    """Tokenize each message on its own; int32 arrays, one per message, in order (lone surrogates read
    as ``?``: :func:`safe_text`)."""
    return tokenizer.encode_batch([safe_text(m.text(text_form)) for m in messages], add_bos=add_bos)


def concat_with_offsets(arrays: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """One int32 buffer holding ``arrays`` back to back, and offsets ``[len(arrays) + 1]``."""
    lens = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    stream = np.concatenate(arrays).astype(np.int32, copy=False) if arrays else np.zeros(0, np.int32)
    return stream, offsets
