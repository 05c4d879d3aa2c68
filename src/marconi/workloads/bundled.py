"""Ready traces built from the vendored samples (``marconi/data``), so demos and tests need nothing else.

=========================== ===========================================================================
name                        trace
=========================== ===========================================================================
``swe-sample``              10 mini-swe-agent trajectories, the paper's SWE recipe (5 observations
                            kept, Poisson gaps of mean 7.5 s, 32k / 50-call caps, 1 session/s)
``swe-sample-shared-prefix`` the same with the SWE-agent system + demonstration prefix (``sweagent-demo``)
``mooncake-sample``         the first 2,000 Mooncake conversation requests rebuilt as 512-token blocks
``chat-synthetic``          200 synthetic chat sessions (4-16 turns)
``agent-synthetic``         50 synthetic agent sessions with a shared 4k-token system prompt
``shared-prompts-synthetic`` 1,000 users over 8 shared system prompts
``doc-qa-synthetic``        8 documents x 32 questions diverging at 4 depths
=========================== ===========================================================================

Builder parameters can be overridden: ``bundled_trace("mooncake-sample", limit=200)``.
"""

from __future__ import annotations

from typing import Any, Callable

from .mooncake import build_mooncake_trace
from .paths import bundled_data_dir
from .swe import build_swe_trace
from .synthetic import agent_trace, chat_trace, doc_qa_trace, shared_prompts_trace
from .trace import Trace

__all__ = ["bundled_trace", "list_bundled", "BUNDLED_TRACES"]


def _swe_sample(**params: Any) -> Trace:
    return build_swe_trace([bundled_data_dir() / "swe" / "msa_gemini3pro_verified_first10.json"], **params)


def _swe_sample_prefix(**params: Any) -> Trace:
    params.setdefault("shared_prefix", "sweagent-demo")
    return _swe_sample(**params)


def _mooncake_sample(**params: Any) -> Trace:
    return build_mooncake_trace(bundled_data_dir() / "mooncake" / "conversation_trace_first2000.jsonl",
                                **params)


BUNDLED_TRACES: dict[str, Callable[..., Trace]] = {
    "swe-sample": _swe_sample,
    "swe-sample-shared-prefix": _swe_sample_prefix,
    "mooncake-sample": _mooncake_sample,
    "chat-synthetic": chat_trace,
    "agent-synthetic": agent_trace,
    "shared-prompts-synthetic": shared_prompts_trace,
    "doc-qa-synthetic": doc_qa_trace,
}


def list_bundled() -> list[str]:
    return list(BUNDLED_TRACES)


def bundled_trace(name: str, **params: Any) -> Trace:
    """Build a named ready trace (seconds); ``params`` override the builder's defaults.

    Raises:
        KeyError: unknown name (the message lists the known ones).
    """
    if name not in BUNDLED_TRACES:
        raise KeyError(f"unknown bundled trace {name!r} (known: {', '.join(BUNDLED_TRACES)})")
    trace = BUNDLED_TRACES[name](**params)
    trace.name = name if not params else f"{name}:" + ",".join(f"{k}={v}" for k, v in params.items())
    trace.meta["bundled"] = name
    return trace
