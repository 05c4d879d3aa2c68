"""The sparse study's workloads: ``(scale, seed) -> Workload`` builders, with their fallbacks said so.

``quality`` (QuALITY questions on real articles; synthetic doc-qa of the same shape where
``../shared/data/quality`` is absent), ``system-prompts`` (:func:`prompt_tree_trace`: a base prompt
extended by variants to different depths), ``swe`` (mini-swe-agent trajectories; the vendored
sample as fallback), ``sharegpt`` (shared data only: None where absent) and ``doc-qa`` (synthetic
questions at 1/4..1 of a document).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from marconi.registry import ConfigError
from marconi.workloads.synthetic import prompt_tree_trace
from marconi.workloads.trace import Trace

__all__ = ["SCALES", "WORKLOADS", "Workload", "build_workload"]

SCALES = ("tiny", "quick", "full")


@dataclass(frozen=True, slots=True)
class Workload:
    """A trace to study and what it was built from (``source`` says so when a fallback was used)."""

    name: str
    trace: Trace
    source: str

    def describe(self) -> dict[str, Any]:
        lens = self.trace.input_lens()
        return {"workload": self.name, "trace": self.trace.name, "trace_source": self.source,
                "num_requests": len(self.trace), "num_sessions": self.trace.num_sessions,
                "input_tokens": int(lens.sum()), "median_input_len": float(np.median(lens)) if lens.size else 0.0}


def _quality(scale: str, seed: int) -> Workload:
    from marconi.workloads.quality import build_quality_trace, default_quality_files
    from marconi.workloads.synthetic import doc_qa_trace

    files = default_quality_files()
    if files:
        trace = build_quality_trace(files, seed=seed, max_articles=4 if scale == "tiny" else None)
        return Workload("quality", trace, f"QuALITY: {len(files)} files under {files[0].parent} "
                                          f"({trace.meta['num_articles']} articles, {len(trace)} questions)")
    # The same shape as the QuALITY sample (16 articles of ~7.5k tokens, ~12 questions each, a
    # 33-token instruction), questions asked after the whole document.
    docs, doc_len, per_doc = (4, 1500, 6) if scale == "tiny" else (16, 7500, 12)
    trace = doc_qa_trace(num_docs=docs, doc_len=doc_len, questions_per_doc=per_doc, depth_fractions=(1.0,),
                         question_len=75, answer_len=18, instruction_len=33, seed=seed)
    return Workload("quality", trace, "FALLBACK: ../shared/data/quality is absent; synthetic doc-qa "
                                      f"({docs} documents x {per_doc} questions, {doc_len} tokens each)")


def _doc_qa(scale: str, seed: int) -> Workload:
    from marconi.workloads.synthetic import doc_qa_trace

    docs, doc_len, per_doc = {"tiny": (3, 1200, 40), "quick": (6, 6000, 24), "full": (8, 8000, 32)}[scale]
    trace = doc_qa_trace(num_docs=docs, doc_len=doc_len, questions_per_doc=per_doc, instruction_len=64, seed=seed)
    return Workload("doc-qa", trace, f"synthetic doc-qa: {docs} documents x {per_doc} questions, {doc_len} tokens, "
                                     "questions after 1/4, 1/2, 3/4 or all of the document")


def _system_prompts(scale: str, seed: int) -> Workload:
    shrink, sessions = {"tiny": (8, 60), "quick": (1, 240), "full": (1, 600)}[scale]
    trace = prompt_tree_trace(num_sessions=sessions, base_len=1000 // shrink,
                              variant_lens=tuple(n // shrink for n in (230, 710, 1490, 2950)),
                              sub_variant_lens=tuple(n // shrink for n in (430, 1870)), seed=seed)
    depths = trace.meta["prompt_depths"]
    return Workload("system-prompts", trace, f"synthetic prompt tree: a {trace.meta['params']['base_len']}-token base "
                                             f"prompt extended by {len(depths)} variants and sub-variants to depths "
                                             f"{min(depths)}..{max(depths)}, {sessions} user sessions of 1-3 turns")


def _swe(scale: str, seed: int) -> Workload:
    from marconi.workloads import build_swe_trace, bundled_data_dir
    from marconi.workloads.swe import default_swe_paths

    paths = default_swe_paths()
    sessions = {"tiny": 3, "quick": 20, "full": 100}[scale]
    trace = build_swe_trace(paths, num_sessions=sessions, seed=seed)
    vendored = paths and paths[0].is_relative_to(bundled_data_dir())
    note = "FALLBACK: ../shared/data/swe is absent; the vendored 10-trajectory sample" if vendored else \
        f"mini-swe-agent trajectories under {paths[0].parent}"
    return Workload("swe", trace, f"{note}, first {trace.meta['num_sessions']} sessions, paper recipe")


def _sharegpt(scale: str, seed: int) -> Workload | None:
    from marconi.workloads.sharegpt import build_sharegpt_trace, default_sharegpt_files

    files = default_sharegpt_files()
    if not files:
        return None  # research-use data that is never vendored: no fallback
    sessions = {"tiny": 4, "quick": 30, "full": 100}[scale]
    trace = build_sharegpt_trace(files, num_sessions=sessions)
    return Workload("sharegpt", trace, f"ShareGPT V3 (>= 20 messages) under {files[0].parent}, "
                                       f"first {trace.meta['num_sessions']} sessions, paper recipe")


WORKLOADS: dict[str, Callable[[str, int], Workload | None]] = {
    "quality": _quality,
    "system-prompts": _system_prompts,
    "swe": _swe,
    "sharegpt": _sharegpt,
    "doc-qa": _doc_qa,
}
"""Workload builders ``(scale, seed) -> Workload`` (None: the data is absent and there is no fallback)."""


def build_workload(name: str, scale: str, seed: int = 0) -> Workload | None:
    if name not in WORKLOADS:
        raise ConfigError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    return WORKLOADS[name](scale, seed)
