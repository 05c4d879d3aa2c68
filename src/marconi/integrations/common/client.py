"""A streaming client for an OpenAI-compatible completions API: token ids in, token ids and timings out.

Each request is a streamed ``POST /v1/completions`` of token ids, ``max_tokens`` = the trace's output
length, ``ignore_eos``, greedy, ``return_token_ids`` (vLLM's extensions). TTFT is the client's, to
the first streamed token; TPOT the mean gap after it; cached tokens come from
``usage.prompt_tokens_details.cached_tokens``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

__all__ = ["CompletionResult", "complete", "ClientError"]


class ClientError(RuntimeError):
    """The server answered with an error or an unreadable stream."""


@dataclass(slots=True)
class CompletionResult:
    """One finished completion: what the server reported and what the client timed (seconds)."""

    prompt_len: int
    output: list[int]
    cached_tokens: int
    ttft_s: float
    tpot_s: float | None
    latency_s: float
    token_times_s: list[float] = field(default_factory=list, repr=False)
    #: per output token, its top log-probabilities as the server keys them (``token_id:N`` without a
    #: tokenizer); empty unless ``complete(..., logprobs=k)``
    top_logprobs: list[dict[str, float]] = field(default_factory=list, repr=False)


def complete(client: Any, base_url: str, model: str, prompt: Sequence[int], max_tokens: int, *,
             timeout_s: float = 1800.0, logprobs: int | None = None) -> CompletionResult:
    """Send one streaming completion and wait for it to finish. ``client``: an ``httpx.Client``;
    ``logprobs``: ask for each output token's top ``logprobs`` log-probabilities
    (``CompletionResult.top_logprobs``)."""
    body = {"model": model, "prompt": [int(t) for t in prompt], "max_tokens": int(max_tokens), "ignore_eos": True,
            "temperature": 0.0, "stream": True, "return_token_ids": True,
            "stream_options": {"include_usage": True}}
    if logprobs is not None:    # keyed by token id: a server without a tokenizer cannot name the tokens
        body.update(logprobs=int(logprobs), return_tokens_as_token_ids=True)
    top: list[dict[str, float]] = []
    output: list[int] = []
    times: list[float] = []
    usage: dict[str, Any] | None = None
    started = time.perf_counter()
    with client.stream("POST", base_url + "/v1/completions", json=body, timeout=timeout_s) as response:
        if response.status_code != 200:
            raise ClientError(f"completion failed with HTTP {response.status_code}: {response.read()[:500]!r}")
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise ClientError(f"server error mid-stream: {chunk['error']}")
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", ()):
                top.extend((choice.get("logprobs") or {}).get("top_logprobs") or ())
                ids = choice.get("token_ids") or ()
                if ids:
                    now = time.perf_counter() - started
                    times.extend([now] * len(ids))
                    output.extend(int(t) for t in ids)
    latency = time.perf_counter() - started
    if not output:
        raise ClientError("the stream carried no tokens (is the server new enough for return_token_ids?)")
    if usage is None:
        raise ClientError("the stream carried no usage record")
    details = usage.get("prompt_tokens_details") or {}
    tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
    return CompletionResult(int(usage.get("prompt_tokens", len(prompt))), output, int(details.get("cached_tokens") or 0),
                            times[0], tpot, latency, times, [dict(step or {}) for step in top])
