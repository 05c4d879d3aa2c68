"""The workload catalog: every named trace, ``(scale, seed) -> Trace`` with provenance.

``build_workload("swe:sessions=20,data=bundled", seed=1)``; ``marconi trace list`` prints it.
Every entry takes ``scale`` and ``seed``, data-backed ones ``data`` (``auto``, ``shared``, a
stand-in) and ``files`` (your own files in the same source format, read by the same recipe:
``sharegpt:files=my_export.json``); ``meta["provenance"]`` says which data was used. See docs/data.md.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

from marconi.core.registry import ConfigError, ParsedName, Registry, parse_name

from .mooncake import build_mooncake_trace
from .paths import bundled_data_dir, shared_data_absent, shared_data_dir, shared_data_where
from .quality import build_quality_trace, default_quality_files, load_quality_articles
from .sharegpt import build_lmsys_trace, build_sharegpt_trace, default_sharegpt_files
from .swe import build_swe_trace, default_swe_paths
from .synthetic import agent_trace, chat_trace, doc_qa_trace, prompt_tree_trace, shared_prompts_trace
from .trace import Trace

__all__ = ["WORKLOADS", "Provenance", "DataUnavailable", "build_workload", "workload_names", "is_workload",
           "catalog_entries"]

SWE_SAMPLE = Path("swe") / "msa_gemini3pro_verified_first10.json"
MOONCAKE_SAMPLE = Path("mooncake") / "conversation_trace_first2000.jsonl"
MOONCAKE_SHARED = Path("mooncake") / "conversation_trace.jsonl"

LICENCE_SWE = "MIT (mini-swe-agent trajectories; SWE-agent for the shared prefix)"
LICENCE_SHAREGPT = "none stated: research use only, do not redistribute"
LICENCE_LMSYS = "LMSYS-Chat-1M licence: no redistribution"
LICENCE_MOONCAKE = "Apache-2.0"
LICENCE_QUALITY = "CC BY 4.0"
LICENCE_SYNTHETIC = "none needed: generated here from a seed"
LICENCE_GIVEN = "the given files' own"


class DataUnavailable(FileNotFoundError):
    """The named data is absent and the spec asked for it alone (``data=shared``, or LMSys without
    files); the message says how to get it or a stand-in."""


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where a catalog trace came from; stored as ``trace.meta["provenance"]`` (a plain dict).

    ``workload`` rebuilds the trace; ``params``: every parameter, defaults included; ``fallback``: None
    for the named data, else why a stand-in (then ``data``) replaced it.
    """

    workload: str
    data: str
    licence: str
    params: dict[str, Any] = field(default_factory=dict)
    fallback: str | None = None

    def describe(self) -> str:
        """One line: the data, led by ``FALLBACK: <why>;`` when it is a stand-in."""
        return f"FALLBACK: {self.fallback}; {self.data}" if self.fallback else self.data

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, trace: Trace) -> "Provenance | None":
        """The provenance of a catalog trace (also after a round trip through a file); None otherwise."""
        raw = trace.meta.get("provenance")
        if not isinstance(raw, dict):
            return None
        return cls(**{k: raw[k] for k in ("workload", "data", "licence", "params", "fallback") if k in raw})


class _Built(NamedTuple):
    """What an entry's builder returns: the trace and its data, in words."""

    trace: Trace
    data: str
    licence: str
    fallback: str | None = None


WORKLOADS: Registry[tuple[_Built, dict[str, Any]]] = Registry("workload")
"""The catalog: names -> builders ``(*, scale, seed, ...) -> _Built`` (use :func:`build_workload`)."""

_LICENCES: dict[str, str] = {}


def _entry(name: str, licence: str) -> Callable[[Callable[..., _Built]], Callable[..., _Built]]:
    """Register a builder; the registered factory also returns its call's parameters (defaults filled)."""
    def decorator(fn: Callable[..., _Built]) -> Callable[..., _Built]:
        signature = inspect.signature(fn)

        @functools.wraps(fn)  # the registry reads the parameters through __wrapped__
        def factory(**kwargs: Any) -> tuple[_Built, dict[str, Any]]:
            bound = signature.bind(**kwargs)
            bound.apply_defaults()
            return fn(**bound.arguments), dict(bound.arguments)

        summary = " ".join((inspect.getdoc(fn) or "").split("\n\n")[0].split())  # the first paragraph
        WORKLOADS.register(name, summary)(factory)
        _LICENCES[name] = licence
        return fn
    return decorator


# ============================================================================ helpers
def _count(full: int, scale: float, given: int | None, what: str) -> int:
    """The entry's count: ``given`` if set, else ``round(full * scale)`` (at least 1)."""
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ConfigError(f"scale must be a number > 0, got {scale!r}")
    if given is None:
        return max(1, round(full * scale))
    if given < 1:
        raise ConfigError(f"{what} must be >= 1, got {given}")
    if scale != 1.0:
        raise ConfigError(f"give {what}={given} or scale={scale:g}, not both")
    return given


def _min_rounds(value: int) -> int:
    """The chat recipes' filter: conversations of at least ``2 * value`` messages. ConfigError below 1."""
    if value < 1:
        raise ConfigError(f"min_rounds must be >= 1, got {value}")
    return value


def _choice(data: str, choices: Sequence[str]) -> str:
    if data not in choices:
        raise ConfigError(f"data={data!r}: choose one of {', '.join(choices)}")
    return data


def _absent(what: str, stand_in: str) -> DataUnavailable:
    return DataUnavailable(f"{what} is not in the shared data set (looked at {shared_data_where()}): "
                           f"get it as the README's Data section says, or use data={stand_in} for the stand-in")


def _files(files: str | Sequence[str | os.PathLike]) -> list[str]:
    """``files`` as a list: a sequence, or one string of paths separated by ``os.pathsep`` (a string
    that names an existing file or folder as a whole is that one path: a time in a file name, as in
    ``trace_2025-01-01T10:00.jsonl``, is not a separator)."""
    if isinstance(files, (str, os.PathLike)):
        text = os.fspath(files)
        if os.pathsep in text and os.path.exists(text):
            return [text]
        return [p for p in text.split(os.pathsep) if p.strip()]
    return [os.fspath(p) for p in files]


def _given(files: str, data: str) -> list[str]:
    """The paths of ``files=`` (none when empty); ConfigError when ``data=`` names data as well."""
    paths = _files(files)
    if paths and data != "auto":
        raise ConfigError(f"give files= or data={data}, not both: files= replaces the data")
    return paths


def _where_given(paths: Sequence[str]) -> str:
    return paths[0] if len(paths) == 1 else f"{len(paths)} files under {Path(paths[0]).parent}"


# ============================================================================ SWE agent
def _swe(scale: float, seed: int, sessions: int | None, full: int, max_turns: int, keep: int | None,
         data: str, shared_prefix: str, tokenizer: str | None, max_input_len: int = 32768,
         files: str = "") -> _Built:
    n = _count(full, scale, sessions, "sessions")
    _choice(data, ("auto", "shared", "bundled"))
    given = _given(files, data)
    if given:
        trace = build_swe_trace(given, num_sessions=n, max_turns=max_turns, keep_observations=keep, seed=seed,
                                shared_prefix=shared_prefix or None, tokenizer=tokenizer or None,
                                max_input_len=max_input_len)
        text = f"agent trajectories from {_where_given(given)}, first {trace.meta['num_sessions']} sessions, paper recipe"
        text += ", every observation kept" if keep is None else ""
        text += f", shared prefix {shared_prefix}" if shared_prefix else ""
        return _Built(trace, text, LICENCE_GIVEN)
    paths = [bundled_data_dir() / SWE_SAMPLE] if data == "bundled" else default_swe_paths()
    vendored = paths[0].is_relative_to(bundled_data_dir())
    if vendored and data == "shared":
        raise _absent("swe/mini-swe-agent-gemini3pro", "bundled")
    trace = build_swe_trace(paths, num_sessions=n, max_turns=max_turns, keep_observations=keep, seed=seed,
                            shared_prefix=shared_prefix or None, tokenizer=tokenizer or None,
                            max_input_len=max_input_len)
    where = "the vendored 10-trajectory sample" if vendored else f"mini-swe-agent trajectories under {paths[0].parent}"
    text = f"{where}, first {trace.meta['num_sessions']} sessions, paper recipe"
    text += ", every observation kept" if keep is None else ""
    text += f", shared prefix {shared_prefix}" if shared_prefix else ""
    text += f", inputs <= {max_input_len} tokens" if max_input_len != 32768 else ""
    fallback = shared_data_absent("swe") if vendored and data == "auto" else None
    return _Built(trace, text, LICENCE_SWE, fallback)


@_entry("swe", LICENCE_SWE)
def _swe_keep5(*, scale: float = 1.0, seed: int = 0, sessions: int | None = None, max_turns: int = 50,
               data: str = "auto", shared_prefix: str = "", tokenizer: str = "",
               max_input_len: int = 32768, files: str = "") -> _Built:
    """SWE-bench agent trajectories (mini-swe-agent, gemini-3-pro), paper recipe: last 5 observations kept, Poisson
    gaps (mean 7.5 s); 100 sessions; stand-in: the 10 vendored ones; files=PATH[:PATH...] for your own
    (mini-swe-agent arrays or SWE-agent .traj files, or folders of them)"""
    return _swe(scale, seed, sessions, 100, max_turns, 5, data, shared_prefix, tokenizer, max_input_len, files)


@_entry("swe-keepall", LICENCE_SWE)
def _swe_keepall(*, scale: float = 1.0, seed: int = 0, sessions: int | None = None, max_turns: int = 50,
                 data: str = "auto", shared_prefix: str = "", tokenizer: str = "",
                 max_input_len: int = 32768, files: str = "") -> _Built:
    """swe keeping every observation in the history (each turn extends the previous one)"""
    return _swe(scale, seed, sessions, 100, max_turns, None, data, shared_prefix, tokenizer, max_input_len, files)


@_entry("swe-sample", LICENCE_SWE)
def _swe_sample(*, scale: float = 1.0, seed: int = 0, sessions: int | None = None, max_turns: int = 50,
                shared_prefix: str = "", tokenizer: str = "",
                max_input_len: int = 32768) -> _Built:
    """the 10 vendored mini-swe-agent trajectories by the paper's SWE recipe (the demo's trace, the golden
    numbers')"""
    return _swe(scale, seed, sessions, 10, max_turns, 5, "bundled", shared_prefix, tokenizer, max_input_len)


@_entry("swe-sample-shared-prefix", LICENCE_SWE)
def _swe_sample_prefix(*, scale: float = 1.0, seed: int = 0, sessions: int | None = None, max_turns: int = 50,
                       shared_prefix: str = "sweagent-demo", tokenizer: str = "",
                       max_input_len: int = 32768) -> _Built:
    """swe-sample after the ~7.7k-token SWE-agent system + demonstration prefix shared by every session"""
    return _swe(scale, seed, sessions, 10, max_turns, 5, "bundled", shared_prefix, tokenizer, max_input_len)


# ============================================================================ chat
@_entry("sharegpt", LICENCE_SHAREGPT)
def _sharegpt(*, scale: float = 1.0, seed: int = 0, sessions: int | None = None, data: str = "auto",
              tokenizer: str = "", files: str = "", min_rounds: int = 10) -> _Built:
    """ShareGPT V3 conversations with >= 20 messages (min_rounds=10), paper recipe; 100 sessions; stand-in:
    synthetic chat of 2-8 turns; files=PATH[:PATH...] for your own (.json arrays, .jsonl or .parquet of
    ShareGPT records)"""
    n = _count(100, scale, sessions, "sessions")
    _choice(data, ("auto", "shared", "synthetic"))
    rounds = _min_rounds(min_rounds)
    given = _given(files, data)
    if given:
        trace = build_sharegpt_trace(given, num_sessions=n, tokenizer=tokenizer or None, min_rounds=rounds)
        return _Built(trace, f"ShareGPT-format records from {_where_given(given)} (>= {2 * rounds} messages), "
                             f"first {trace.meta['num_sessions']} sessions, paper recipe", LICENCE_GIVEN)
    files = [] if data == "synthetic" else default_sharegpt_files()
    if files:
        trace = build_sharegpt_trace(files, num_sessions=n, tokenizer=tokenizer or None, min_rounds=rounds)
        return _Built(trace, f"ShareGPT V3 (>= {2 * rounds} messages) under {files[0].parent}, "
                             f"first {trace.meta['num_sessions']} sessions, paper recipe", LICENCE_SHAREGPT)
    if data == "shared":
        raise _absent("sharegpt (ShareGPT V3, never vendored: research use only)", "synthetic")
    # The stand-in the reproduction has always used on a fresh clone: shorter sessions than ShareGPT's
    # >= 10 rounds, behind one shared system prompt, so chat-style reuse is still there to cache.
    trace = chat_trace(num_sessions=n, turns=(2, 8), system_prompt_len=300, think_time_s=10.0, seed=seed)
    text = (f"a synthetic chat trace: {n} sessions of 2-8 turns after a shared 300-token system prompt, "
            "10 s think time")
    return _Built(trace, text, LICENCE_SYNTHETIC, shared_data_absent("sharegpt") if data == "auto" else None)


@_entry("lmsys", LICENCE_LMSYS)
def _lmsys(*, scale: float = 1.0, seed: int = 0, sessions: int | None = None, files: str = "",
           tokenizer: str = "", min_rounds: int = 10) -> _Built:
    """LMSys-Chat-1M conversations with >= 10 turns (min_rounds=10), paper recipe (non-ASCII filter); 100
    sessions; files=PATH[:PATH...] of your export"""
    n = _count(100, scale, sessions, "sessions")
    rounds = _min_rounds(min_rounds)
    paths = _files(files)
    if not paths:
        raise DataUnavailable("lmsys: LMSys-Chat-1M cannot be redistributed and has no stand-in; give your "
                              f"export's files: lmsys:files=PATH[{os.pathsep}PATH...] (README: Data)")
    trace = build_lmsys_trace(paths, num_sessions=n, tokenizer=tokenizer or None, min_rounds=rounds)
    text = (f"LMSys-Chat-1M: {len(paths)} file(s) under {Path(paths[0]).parent}, "
            f"first {trace.meta['num_sessions']} sessions, paper recipe")
    return _Built(trace, text, LICENCE_LMSYS)


# ============================================================================ Mooncake
def _mooncake(scale: float, seed: int, requests: int | None, data: str, files: str = "",
              block_size: int = 0) -> _Built:
    n = _count(2000, scale, requests, "requests")
    _choice(data, ("auto", "shared", "bundled"))
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 0:
        raise ConfigError(f"mooncake: block_size must be an integer >= 1 (0: the trace's own), got {block_size!r}")
    given = _given(files, data)
    if len(given) > 1:
        raise ConfigError(f"mooncake: files= takes one trace file, got {len(given)}")
    if block_size and not given:
        raise ConfigError("mooncake: block_size= is for a trace of your own (files=PATH): Mooncake's own "
                          "traces hash blocks of 512 tokens")
    if given:
        trace = build_mooncake_trace(given[0], limit=n, seed=seed, block_size=block_size or None)
        return _Built(trace, f"{trace.meta['layout']}-format requests from {given[0]}: first {len(trace)} "
                             f"requests, {trace.meta['params']['block_size']}-token blocks rebuilt as tokens",
                      LICENCE_GIVEN)
    shared = shared_data_dir()
    path = shared / MOONCAKE_SHARED if shared is not None and data != "bundled" else None
    if path is None or not path.is_file():
        if data == "shared":
            raise _absent(str(MOONCAKE_SHARED), "bundled")
        path = bundled_data_dir() / MOONCAKE_SAMPLE
    vendored = path.is_relative_to(bundled_data_dir())
    trace = build_mooncake_trace(path, limit=n, seed=seed)
    trace.meta["more_in_file"] = False          # the entry's own size, as documented: no shortfall
    where = "the vendored first 2,000 Mooncake conversation requests" if vendored else \
        f"the Mooncake FAST'25 conversation trace {path}"
    text = f"{where}: first {len(trace)} requests, 512-token blocks rebuilt as tokens"
    fallback = shared_data_absent("mooncake") if vendored and data == "auto" else None
    return _Built(trace, text, LICENCE_MOONCAKE, fallback)


@_entry("mooncake", LICENCE_MOONCAKE)
def _mooncake_entry(*, scale: float = 1.0, seed: int = 0, requests: int | None = None,
                    data: str = "auto", files: str = "", block_size: int = 0) -> _Built:
    """Mooncake (FAST'25) conversation requests, hash blocks rebuilt as 512-token blocks; 2,000 requests; stand-in:
    the vendored first 2,000; files=PATH for another block-hash trace (Mooncake's toolagent_trace.jsonl, a
    Qwen-Bailian trace), block_size=N if it hashes blocks of another size than its layout's (512 / 16)"""
    return _mooncake(scale, seed, requests, data, files, block_size)


@_entry("mooncake-sample", LICENCE_MOONCAKE)
def _mooncake_sample(*, scale: float = 1.0, seed: int = 0, requests: int | None = None) -> _Built:
    """the vendored first 2,000 Mooncake conversation requests, as mooncake"""
    return _mooncake(scale, seed, requests, "bundled")


# ============================================================================ QuALITY
# The stand-in has the shape of the shared QuALITY files: 16 articles of about 7.5k tokens, about
# 12 questions each, after a 33-token instruction; every question reads the whole document.
_QUALITY_SHAPE = {"doc_len": 7500, "questions_per_doc": 12, "question_len": 75, "answer_len": 18,
                  "instruction_len": 33}


@_entry("quality", LICENCE_QUALITY)
def _quality(*, scale: float = 1.0, seed: int = 0, articles: int | None = None, data: str = "auto",
             tokenizer: str = "", files: str = "") -> _Built:
    """QuALITY multiple-choice questions on long articles (many per article); every article; stand-in: synthetic
    doc-qa of the same shape; files=PATH[:PATH...] for your own QuALITY .jsonl files"""
    _choice(data, ("auto", "shared", "synthetic"))
    given = _given(files, data)
    files = given or ([] if data == "synthetic" else default_quality_files())
    if files:
        if articles is not None or scale != 1.0:  # else every article
            total = len(load_quality_articles(files)) if articles is None else articles
            articles = _count(total, scale, articles, "articles")
        trace = build_quality_trace(files, seed=seed, max_articles=articles, tokenizer=tokenizer or None)
        text = (f"QuALITY: {_where_given([os.fspath(f) for f in files])} "
                f"({trace.meta['num_articles']} articles, {len(trace)} questions)")
        return _Built(trace, text, LICENCE_GIVEN if given else LICENCE_QUALITY)
    if data == "shared":
        raise _absent("quality (QuALITY)", "synthetic")
    docs = _count(16, scale, articles, "articles")
    trace = doc_qa_trace(num_docs=docs, depth_fractions=(1.0,), seed=seed, **_QUALITY_SHAPE)
    text = (f"synthetic doc-qa ({docs} documents x {_QUALITY_SHAPE['questions_per_doc']} questions, "
            f"{_QUALITY_SHAPE['doc_len']} tokens each)")
    return _Built(trace, text, LICENCE_SYNTHETIC, shared_data_absent("quality") if data == "auto" else None)


# ============================================================================ synthetic
@_entry("chat-synthetic", LICENCE_SYNTHETIC)
def _chat(*, scale: float = 1.0, seed: int = 0, sessions: int | None = None, system_prompt_len: int = 0,
          max_input_len: int = 32768) -> _Built:
    """synthetic multi-turn chat: 4-16 turns per session; 200 sessions"""
    n = _count(200, scale, sessions, "sessions")
    trace = chat_trace(num_sessions=n, system_prompt_len=system_prompt_len, max_input_len=max_input_len, seed=seed)
    return _Built(trace, f"synthetic chat: {n} sessions of 4-16 turns"
                         + (f" after a shared {system_prompt_len}-token system prompt" if system_prompt_len else ""),
                  LICENCE_SYNTHETIC)


@_entry("agent-synthetic", LICENCE_SYNTHETIC)
def _agent(*, scale: float = 1.0, seed: int = 0, sessions: int | None = None, system_prompt_len: int = 4000,
           max_input_len: int = 32768) -> _Built:
    """synthetic agent loops: 20-60 calls of growing history after a shared system prompt; 50 sessions"""
    n = _count(50, scale, sessions, "sessions")
    trace = agent_trace(num_sessions=n, system_prompt_len=system_prompt_len, max_input_len=max_input_len, seed=seed)
    return _Built(trace, f"synthetic agent loops: {n} sessions of 20-60 calls after a shared "
                         f"{system_prompt_len}-token system prompt", LICENCE_SYNTHETIC)


@_entry("agent-cpu-synthetic", LICENCE_SYNTHETIC)
def _agent_cpu(*, scale: float = 1.0, seed: int = 0, sessions: int | None = None, max_turns: int = 8,
               max_input_len: int = 3500) -> _Built:
    """small synthetic agent loops sized for the CPU engine (the engine bench's): an 800-token shared system
    prompt, <= 8 calls, inputs <= 3,500 tokens; 4 sessions"""
    n = _count(4, scale, sessions, "sessions")
    # Each call's input is the previous input + its output (the action) + a new observation, as an
    # agent's; sessions start 1 s apart so their calls interleave.
    trace = agent_trace(num_sessions=n, calls=(max_turns, max_turns), system_prompt_len=800, task_len=300.0,
                        action_len=44.0, observation_len=300.0, sessions_per_second=1.0, mean_gap_s=2.0,
                        max_input_len=max_input_len, seed=seed)
    return _Built(trace, f"synthetic agent loops for the CPU engine: {n} sessions of <= {max_turns} calls, "
                         f"inputs <= {max_input_len} tokens after an 800-token shared system prompt", LICENCE_SYNTHETIC)


@_entry("shared-prompts-synthetic", LICENCE_SYNTHETIC)
def _shared_prompts(*, scale: float = 1.0, seed: int = 0, sessions: int | None = None, prompts: int = 8,
                    prompt_len: int = 3000) -> _Built:
    """synthetic users over a few shared system prompts (Zipf-skewed), 1-4 turns each; 1,000 sessions"""
    n = _count(1000, scale, sessions, "sessions")
    trace = shared_prompts_trace(num_prompts=prompts, prompt_len=prompt_len, num_sessions=n, seed=seed)
    return _Built(trace, f"synthetic shared prompts: {n} user sessions over {prompts} system prompts of "
                         f"{prompt_len} tokens", LICENCE_SYNTHETIC)


@_entry("doc-qa-synthetic", LICENCE_SYNTHETIC)
def _doc_qa(*, scale: float = 1.0, seed: int = 0, docs: int | None = None, doc_len: int = 8000, questions: int = 32,
            instruction_len: int = 0) -> _Built:
    """synthetic questions on long documents, each after 1/4, 1/2, 3/4 or all of its document; 8 documents"""
    n = _count(8, scale, docs, "docs")
    trace = doc_qa_trace(num_docs=n, doc_len=doc_len, questions_per_doc=questions, instruction_len=instruction_len,
                         seed=seed)
    return _Built(trace, f"synthetic doc-qa: {n} documents x {questions} questions, {doc_len} tokens, "
                         "questions after 1/4, 1/2, 3/4 or all of the document", LICENCE_SYNTHETIC)


@_entry("prompt-tree-synthetic", LICENCE_SYNTHETIC)
def _prompt_tree(*, scale: float = 1.0, seed: int = 0, sessions: int | None = None,
                 prompt_scale: float = 1.0) -> _Built:
    """synthetic system prompts shared to different depths (a base, variants, sub-variants), 1-3 turns per user;
    600 sessions"""
    n = _count(600, scale, sessions, "sessions")
    if not (math.isfinite(prompt_scale) and prompt_scale > 0):
        raise ConfigError(f"prompt_scale must be a number > 0, got {prompt_scale!r}")

    def shrink(length: int) -> int:  # prompt lengths x prompt_scale, rounded down
        return int(length * prompt_scale)

    trace = prompt_tree_trace(num_sessions=n, base_len=shrink(1000),
                              variant_lens=tuple(shrink(x) for x in (230, 710, 1490, 2950)),
                              sub_variant_lens=tuple(shrink(x) for x in (430, 1870)), seed=seed)
    depths = trace.meta["prompt_depths"]
    return _Built(trace, f"synthetic prompt tree: a {trace.meta['params']['base_len']}-token base prompt extended by "
                         f"{len(depths)} variants and sub-variants to depths {min(depths)}..{max(depths)}, "
                         f"{n} user sessions of 1-3 turns", LICENCE_SYNTHETIC)


# ============================================================================ public API
def workload_names() -> list[str]:
    return WORKLOADS.names()


def is_workload(text: str) -> bool:
    """Whether ``text`` names a catalog entry (with or without parameters), not a file."""
    return text.partition(":")[0].strip() in WORKLOADS.names()


def _text(value: Any) -> str:
    """A parameter value as it is written on a name."""
    if isinstance(value, (list, tuple)):
        return os.pathsep.join(map(os.fspath, value))
    if isinstance(value, float):
        return f"{value:g}"
    return os.fspath(value) if isinstance(value, os.PathLike) else str(value)


class NoRequests(ConfigError):
    """A catalog workload whose data and parameters leave no request (the message says which
    parameter dropped them all, and what to change)."""


_FILTERS = {"max_input_len": "drops every request whose input is longer than {value} tokens; raise max_input_len",
            "max_turns": "keeps only the first {value} turns of each session; raise max_turns"}
"""Parameters that drop requests, and what to say when one dropped them all."""


def _no_requests(name: str, entry: str, params: dict[str, Any], data: str, meta: dict[str, Any]) -> str:
    """Why ``name`` built no requests and what to change: an input without records or calls first
    (``meta["records"]``, where the builder counts them), then the filters set off their default."""
    records = meta.get("records") if isinstance(meta.get("records"), dict) else {}
    said = f"workload {name!r} has no requests ({data}): "
    if records.get("records_read") == 0:
        where = " (a folder is searched for .json and .traj files)" if meta.get("source") == "swe" else ""
        return said + "the input holds no records" + where
    if records.get("without_calls") and records["without_calls"] == meta.get("num_sessions"):
        return said + (f"none of the {records['without_calls']} trajectories kept has an assistant message after "
                       "its first message, and each of those is a call")
    if records.get("without_turns") and records["without_turns"] == meta.get("num_sessions"):
        return said + (f"none of the {records['without_turns']} conversations kept has a user message answered "
                       "by an assistant message, and each of those is a turn")
    defaults = WORKLOADS.params_of(entry)
    causes = [f"{key}={params[key]} " + text.format(value=params[key]) + f" (default {defaults[key]})"
              for key, text in _FILTERS.items() if key in params and params[key] != defaults.get(key)]
    if not causes and "min_rounds" in params:      # the chat recipes' filter, at its default or not
        causes = [f"min_rounds={params['min_rounds']} keeps only conversations of at least "
                  f"{2 * params['min_rounds']} messages (the paper's filter); lower min_rounds (e.g. "
                  f"{entry}:files=PATH,min_rounds=1) or give files with longer conversations"]
    if not causes:
        causes = ["its data and parameters leave none; check the data files or loosen the parameters "
                  "(`marconi trace list` shows them)"]
    return f"workload {name!r} has no requests ({data}): " + "; ".join(causes)


def build_workload(spec: str | ParsedName, **overrides: Any) -> Trace:
    """Build ``"name"`` or ``"name:key=value,..."``; ``overrides`` default the entry's parameters (others
    ignored). Raises ConfigError for an unknown name or parameter, a bad value, or no request left
    (naming the filter); DataUnavailable for ``data=shared`` without the data or LMSys without
    files; OSError or ValueError for bad data files."""
    parsed = spec if isinstance(spec, ParsedName) else parse_name(spec)
    built, params = WORKLOADS.create(parsed, **overrides)
    applied = {k: v for k, v in overrides.items()
               if k in params and k not in parsed.params and v is not None and v != "" and v != ()}
    name = str(ParsedName(parsed.name, {**parsed.params, **{k: _text(v) for k, v in applied.items()}}))
    if len(built.trace) == 0:
        raise NoRequests(_no_requests(name, parsed.name, params, built.data, built.trace.meta or {}))
    trace = built.trace
    trace.name = name
    trace.meta["provenance"] = Provenance(name, built.data, built.licence, params, built.fallback).as_dict()
    return trace


def catalog_entries() -> list[dict[str, Any]]:
    """The catalog for listings: name, one-line description, licence, parameters with defaults."""
    docs = WORKLOADS.describe()
    return [{"name": name, "doc": docs[name], "licence": _LICENCES[name], "params": WORKLOADS.params_of(name)}
            for name in WORKLOADS.names()]
