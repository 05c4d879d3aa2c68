"""Seeded synthetic traces for tests and sweeps: chat, agent loops, shared system prompts, document QA.

Deterministic: session *k* draws from ``np.random.default_rng([seed, kind, k])``, so adding
sessions does not change earlier ones; a session's requests are views of one buffer. Tokens are
uniform in ``[3, vocab_size)`` (fresh segments are independent draws). A mean length is
geometric (support >= 1); a pair ``(lo, hi)`` is a uniform inclusive range. Times are seconds.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence

import numpy as np

from .trace import Request, Trace

__all__ = ["chat_trace", "agent_trace", "shared_prompts_trace", "doc_qa_trace", "synthetic_trace",
           "SYNTHETIC_KINDS"]

_FIRST_TOKEN = 3
IntRange = int | tuple[int, int]


def _rng(seed: int, kind: int, k: int) -> np.random.Generator:
    return np.random.default_rng([seed, kind, k])


def _range_draw(rng: np.random.Generator, value: IntRange, size: int | None = None) -> Any:
    lo, hi = (value, value) if isinstance(value, (int, np.integer)) else value
    if lo < 0 or hi < lo:
        raise ValueError(f"bad range {value!r}: need 0 <= lo <= hi")
    return rng.integers(lo, hi + 1, size=size)


def _geometric(rng: np.random.Generator, mean: float, size: int) -> np.ndarray:
    if mean < 1:
        raise ValueError(f"a mean length must be >= 1, got {mean}")
    return rng.geometric(1.0 / mean, size=size).astype(np.int64)


def _tokens(rng: np.random.Generator, n: int, vocab_size: int) -> np.ndarray:
    if vocab_size <= _FIRST_TOKEN + 1:
        raise ValueError(f"vocab_size must be > {_FIRST_TOKEN + 1}, got {vocab_size}")
    return rng.integers(_FIRST_TOKEN, vocab_size, size=n, dtype=np.int32)


def _growing_session(session_id: int, start_ts: float, prefix: np.ndarray, in_lens: np.ndarray,
                     out_lens: np.ndarray, gaps: np.ndarray, rng: np.random.Generator,
                     vocab_size: int, max_input_len: int) -> list[Request]:
    """Requests of a session whose history grows: input t = prefix + (in, out) * t + in_t.

    ``gaps[t]`` is the time before turn t (``gaps[0]`` is ignored). All requests view one buffer.
    """
    n = in_lens.size
    seg = np.empty(2 * n, dtype=np.int64)
    seg[0::2], seg[1::2] = in_lens, out_lens
    ends = prefix.size + np.cumsum(seg)  # ends[2t] = end of input t, ends[2t+1] = end of output t
    fits = int(np.searchsorted(ends[0::2], max_input_len, side="right"))  # inputs <= max_input_len
    if fits == 0:
        return []
    body = _tokens(rng, int(ends[2 * fits - 1]) - prefix.size, vocab_size)
    stream = np.concatenate([prefix, body])
    ts = start_ts + np.concatenate([[0.0], np.cumsum(gaps[1:fits])])
    return [Request(session_id, t, float(ts[t]), stream[:ends[2 * t]], stream[ends[2 * t]:ends[2 * t + 1]])
            for t in range(fits)]


def _trace(kind: str, requests: list[Request], params: dict[str, Any]) -> Trace:
    meta = {"source": "synthetic", "kind": kind, "params": params}
    return Trace.from_unsorted(requests, name=f"synthetic-{kind}-seed{params.get('seed', 0)}", meta=meta)


def chat_trace(num_sessions: int = 200, turns: IntRange = (4, 16), user_len: float = 150.0,
               output_len: float = 300.0, system_prompt_len: int = 0, sessions_per_second: float = 1.0,
               think_time_s: float = 20.0, max_input_len: int = 32768, vocab_size: int = 32000,
               seed: int = 0) -> Trace:
    """Multi-turn chat: each turn adds a user message and a reply to the session's history.

    A ``system_prompt_len``-token system prompt (one, shared by all sessions) opens every session.
    Session *k* starts at ``k / sessions_per_second``; gaps between turns are exponential with mean
    ``think_time_s``. Sessions stop before an input would exceed ``max_input_len``.
    """
    params = dict(locals())
    system = _tokens(_rng(seed, 10, 0), system_prompt_len, vocab_size)
    requests: list[Request] = []
    for k in range(num_sessions):
        rng = _rng(seed, 1, k)
        n = int(_range_draw(rng, turns))
        if n == 0:
            continue
        in_lens, out_lens = _geometric(rng, user_len, n), _geometric(rng, output_len, n)
        gaps = rng.exponential(think_time_s, size=n)
        requests += _growing_session(k, k / sessions_per_second, system, in_lens, out_lens, gaps, rng,
                                     vocab_size, max_input_len)
    return _trace("chat", requests, params)


def agent_trace(num_sessions: int = 50, calls: IntRange = (20, 60), system_prompt_len: int = 4000,
                task_len: float = 1500.0, action_len: float = 200.0, observation_len: float = 1200.0,
                sessions_per_second: float = 0.2, mean_gap_s: float = 7.5, max_input_len: int = 32768,
                vocab_size: int = 32000, seed: int = 0) -> Trace:
    """Agent loops: long growing histories of (observation, action) rounds.

    Every session starts with one shared ``system_prompt_len``-token system prompt and its own task
    (mean ``task_len``); call t's input is everything so far plus the newest observation (call 0:
    the task), its output the action. Gaps between calls are exponential with mean ``mean_gap_s``.
    """
    params = dict(locals())
    system = _tokens(_rng(seed, 20, 0), system_prompt_len, vocab_size)
    requests: list[Request] = []
    for k in range(num_sessions):
        rng = _rng(seed, 2, k)
        n = int(_range_draw(rng, calls))
        if n == 0:
            continue
        in_lens = _geometric(rng, observation_len, n)
        in_lens[0] = _geometric(rng, task_len, 1)[0]
        out_lens = _geometric(rng, action_len, n)
        gaps = rng.exponential(mean_gap_s, size=n)
        requests += _growing_session(k, k / sessions_per_second, system, in_lens, out_lens, gaps, rng,
                                     vocab_size, max_input_len)
    return _trace("agent", requests, params)


def shared_prompts_trace(num_prompts: int = 8, prompt_len: int = 3000, num_sessions: int = 1000,
                         prompt_skew: float = 1.0, turns: IntRange = (1, 4), user_len: float = 100.0,
                         output_len: float = 200.0, sessions_per_second: float = 5.0,
                         think_time_s: float = 20.0, max_input_len: int = 32768,
                         vocab_size: int = 32000, seed: int = 0) -> Trace:
    """Several system prompts, many users: each session opens with one of ``num_prompts`` prompts.

    Prompt *p* (0-based) is chosen with probability proportional to ``1 / (p + 1) ** prompt_skew``
    (0: uniform). ``meta["prompt_of_session"]`` lists each session's prompt.
    """
    params = dict(locals())
    if num_prompts <= 0:
        raise ValueError("num_prompts must be > 0")
    prompts = [_tokens(_rng(seed, 30, p), prompt_len, vocab_size) for p in range(num_prompts)]
    weights = 1.0 / np.arange(1, num_prompts + 1, dtype=np.float64) ** prompt_skew
    weights /= weights.sum()
    requests: list[Request] = []
    prompt_of_session: list[int] = []
    for k in range(num_sessions):
        rng = _rng(seed, 3, k)
        p = int(rng.choice(num_prompts, p=weights))
        prompt_of_session.append(p)
        n = int(_range_draw(rng, turns))
        if n == 0:
            continue
        in_lens, out_lens = _geometric(rng, user_len, n), _geometric(rng, output_len, n)
        gaps = rng.exponential(think_time_s, size=n)
        requests += _growing_session(k, k / sessions_per_second, prompts[p], in_lens, out_lens, gaps, rng,
                                     vocab_size, max_input_len)
    trace = _trace("shared-prompts", requests, params)
    trace.meta["prompt_of_session"] = prompt_of_session
    return trace


def doc_qa_trace(num_docs: int = 8, doc_len: int = 8000, questions_per_doc: int = 32,
                 question_len: float = 60.0, answer_len: float = 100.0,
                 depth_fractions: Sequence[float] = (0.25, 0.5, 0.75, 1.0), instruction_len: int = 0,
                 requests_per_second: float = 2.0, vocab_size: int = 32000, seed: int = 0) -> Trace:
    """Questions on long documents, diverging from them at different depths.

    Question *q* on document *d*: a shared instruction, the first ``round(f * doc_len)`` tokens of *d*
    (*f* from ``depth_fractions``), a fresh question; a fresh answer. A document is a session;
    arrivals are Poisson at ``requests_per_second`` in a seeded interleaving.
    ``meta["depth_of_request"]``: each request's document depth, in trace order.
    """
    params = dict(locals())
    params["depth_fractions"] = list(depth_fractions)
    fractions = np.asarray(depth_fractions, dtype=np.float64)
    if fractions.size == 0 or (fractions < 0).any() or (fractions > 1).any():
        raise ValueError("depth_fractions must be a non-empty list of numbers in [0, 1]")
    instruction = _tokens(_rng(seed, 40, 0), instruction_len, vocab_size)
    order_rng = _rng(seed, 41, 0)
    total = num_docs * questions_per_doc
    doc_of_arrival = order_rng.permutation(np.repeat(np.arange(num_docs), questions_per_doc))
    arrival_ts = np.cumsum(order_rng.exponential(1.0 / requests_per_second, size=total)) if total else []
    docs = []
    questions: list[list[tuple[int, np.ndarray, np.ndarray]]] = []
    for d in range(num_docs):
        rng = _rng(seed, 4, d)
        docs.append(np.concatenate([instruction, _tokens(rng, doc_len, vocab_size)]))
        depths = np.rint(rng.choice(fractions, size=questions_per_doc) * doc_len).astype(np.int64)
        q_lens = _geometric(rng, question_len, questions_per_doc)
        a_lens = _geometric(rng, answer_len, questions_per_doc)
        fresh = _tokens(rng, int(q_lens.sum() + a_lens.sum()), vocab_size)
        cuts = np.cumsum(np.stack([q_lens, a_lens], axis=1).reshape(-1))
        parts = np.split(fresh, cuts[:-1])
        questions.append([(int(depths[q]), parts[2 * q], parts[2 * q + 1]) for q in range(questions_per_doc)])
    requests: list[Request] = []
    depth_of_request: list[int] = []
    next_q = [0] * num_docs
    for ts, d in zip(arrival_ts, doc_of_arrival.tolist()):
        q = next_q[d]
        next_q[d] += 1
        depth, question, answer = questions[d][q]
        inputs = np.concatenate([docs[d][:instruction_len + depth], question])
        requests.append(Request(d, q, float(ts), inputs, answer))
        depth_of_request.append(depth)
    trace = _trace("doc-qa", requests, params)
    trace.meta["depth_of_request"] = depth_of_request
    return trace


def prompt_tree_trace(num_sessions: int = 600, base_len: int = 1000,
                      variant_lens: Sequence[int] = (230, 710, 1490, 2950), sub_variant_lens: Sequence[int] = (430, 1870),
                      prompt_skew: float = 0.8, turns: tuple[int, int] = (1, 3), user_len: float = 120.0,
                      output_len: float = 200.0, sessions_per_second: float = 2.0, think_time_s: float = 20.0,
                      vocab_size: int = 32000, seed: int = 0) -> Trace:
    """System prompts shared to different depths: a base, variants extending it, sub-variants of each.

    A session picks a (sub-)variant with probability ``∝ 1 / rank ** prompt_skew`` over a seeded
    shuffle, then has ``turns`` turns (prompt + history + a fresh message). Sessions start at
    ``k / sessions_per_second``, turns after exponential think times. ``meta``: ``prompt_depths``,
    ``prompt_of_session``.
    """
    params = dict(locals())
    rng = np.random.default_rng([seed, 61])

    def tokens(n: int) -> np.ndarray:
        return rng.integers(3, vocab_size, size=n, dtype=np.int32)

    base = tokens(base_len)
    prompts: list[np.ndarray] = []
    for v_len in variant_lens:
        variant = np.concatenate([base, tokens(v_len)])
        prompts.append(variant)
        prompts.extend(np.concatenate([variant, tokens(s_len)]) for s_len in sub_variant_lens)
    weights = 1.0 / np.arange(1, len(prompts) + 1) ** prompt_skew
    rank_of_prompt = rng.permutation(len(prompts))
    prob = weights[rank_of_prompt] / weights.sum()
    requests: list[Request] = []
    prompt_of_session: list[int] = []
    for k in range(num_sessions):
        srng = np.random.default_rng([seed, 62, k])
        p = int(srng.choice(len(prompts), p=prob))
        prompt_of_session.append(p)
        history, ts = prompts[p], k / sessions_per_second
        for t in range(int(srng.integers(turns[0], turns[1] + 1))):
            user = srng.integers(3, vocab_size, size=int(srng.geometric(1 / user_len)), dtype=np.int32)
            answer = srng.integers(3, vocab_size, size=int(srng.geometric(1 / output_len)), dtype=np.int32)
            inputs = np.concatenate([history, user])
            requests.append(Request(k, t, ts, inputs, answer))
            history = np.concatenate([inputs, answer])
            ts += float(srng.exponential(think_time_s))
    meta = {"source": "synthetic", "kind": "prompt-tree", "params": params,
            "prompt_depths": [int(p.size) for p in prompts], "prompt_of_session": prompt_of_session}
    return Trace.from_unsorted(requests, name=f"synthetic-prompt-tree-seed{seed}", meta=meta)


SYNTHETIC_KINDS: dict[str, Callable[..., Trace]] = {
    "chat": chat_trace,
    "agent": agent_trace,
    "shared-prompts": shared_prompts_trace,
    "doc-qa": doc_qa_trace,
    "prompt-tree": prompt_tree_trace,
}


def synthetic_trace(kind: str, **params: Any) -> Trace:
    """Build a synthetic trace by kind name; unknown kinds or parameters are errors listing the valid ones."""
    if kind not in SYNTHETIC_KINDS:
        raise ValueError(f"unknown synthetic kind {kind!r} (choose from {', '.join(SYNTHETIC_KINDS)})")
    fn = SYNTHETIC_KINDS[kind]
    valid = inspect.signature(fn).parameters
    unknown = sorted(set(params) - set(valid))
    if unknown:
        raise ValueError(f"synthetic {kind}: unknown parameter(s) {', '.join(unknown)} "
                         f"(valid: {', '.join(valid)})")
    return fn(**params)
