"""The sparse study's workloads: each a catalog entry (:mod:`marconi.workloads.catalog`) at the study's sizes.

``quality`` (QuALITY questions on real articles; the catalog's synthetic doc-qa of the same shape
where ``../shared/data/quality`` is absent), ``system-prompts`` (a base prompt extended by variants
to different depths), ``swe`` (mini-swe-agent trajectories; the vendored sample as fallback),
``sharegpt`` (shared data only: skipped where absent) and ``doc-qa`` (synthetic questions at
1/4..1 of a document). Which data each run used is the catalog's provenance, echoed in every record
as ``trace_source``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from marconi.core.registry import ConfigError
from marconi.workloads.catalog import DataUnavailable, Provenance, build_workload
from marconi.workloads.trace import Trace

__all__ = ["SCALES", "WORKLOADS", "Workload", "study_workload"]

SCALES = ("tiny", "quick", "full")

WORKLOADS: dict[str, dict[str, str]] = {
    "quality": {"tiny": "quality:articles=4", "quick": "quality", "full": "quality"},
    "system-prompts": {"tiny": "prompt-tree-synthetic:sessions=60,prompt_scale=0.125",
                       "quick": "prompt-tree-synthetic:sessions=240", "full": "prompt-tree-synthetic"},
    "swe": {"tiny": "swe:sessions=3", "quick": "swe:sessions=20", "full": "swe"},
    # research-use data that is never vendored: no stand-in, the study skips it where it is absent
    "sharegpt": {"tiny": "sharegpt:sessions=4,data=shared", "quick": "sharegpt:sessions=30,data=shared",
                 "full": "sharegpt:data=shared"},
    "doc-qa": {"tiny": "doc-qa-synthetic:docs=3,doc_len=1200,questions=40,instruction_len=64",
               "quick": "doc-qa-synthetic:docs=6,doc_len=6000,questions=24,instruction_len=64",
               "full": "doc-qa-synthetic:instruction_len=64"},
}
"""Study workload -> scale -> catalog spec (``marconi trace list`` describes each entry)."""


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


def study_workload(name: str, scale: str, seed: int = 0) -> Workload | None:
    """The study's workload ``name`` at ``scale``; None where its data is absent and it has no stand-in."""
    if name not in WORKLOADS:
        raise ConfigError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    if scale not in SCALES:
        raise ConfigError(f"scale must be one of {', '.join(SCALES)}, got {scale!r}")
    try:
        trace = build_workload(WORKLOADS[name][scale], seed=seed)
    except DataUnavailable:
        return None
    provenance = Provenance.of(trace)
    assert provenance is not None  # every catalog trace has one
    return Workload(name, trace, provenance.describe())
