"""What a reproduction is and what it knows: :class:`ReproProfile` (its size) and :class:`ReproContext`.

The pipeline fills a context (traces, working sets, calibration, sweep records, latency models);
every figure's ``compute`` reads it and returns the records its plot and verdict need. The
profiles live here, beside the context that holds one, because the figures read their axes
(regimes, ladder, grids) through ``ctx.profile``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Sequence

from marconi.lab.reproduce.latency import LatencySet
from marconi.lab.reproduce.traces import WorkloadSource
from marconi.core.model import ModelSpec
from marconi.choosers.bootstrap import DEFAULT_ALPHA_GRID
from marconi.workloads import Trace

__all__ = ["ReproProfile", "PROFILES", "TraceInfo", "ReproContext", "frac_label", "base_key", "variant_key",
           "MAIN_WORKLOADS", "MAIN_SYSTEMS", "MAIN_ROLES", "PAPER_MARCONI", "HEADROOM_SYSTEMS", "tuned_system"]

# The workloads of figs. 7-10 and 13, in report order (those present in a run).
MAIN_WORKLOADS = ("lmsys", "sharegpt", "swe", "swe-keepall", "mooncake")
# The paper's three systems, in the order of every sweep, table and plot.
# The paper's Marconi is the bootstrap-tuned one: figs. 7-13 reproduce it. The project's default
# (``marconi``: the adaptive rule) is measured beside it, with the ceilings, in the headroom section.
PAPER_MARCONI = "marconi:tuner=bootstrap"
MAIN_SYSTEMS = ("vllm+", "sglang+", PAPER_MARCONI)
MAIN_ROLES = dict(zip(("vllm+", "sglang+", "marconi"), MAIN_SYSTEMS))   # figure role -> system name
HEADROOM_SYSTEMS = ("marconi", "oracle", "infinite")


def tuned_system(multiplier: float) -> str:
    """The system name of a bootstrap-tuned Marconi run with this window multiplier (5 is the default)."""
    return PAPER_MARCONI if multiplier == 5 else f"{PAPER_MARCONI},multiplier={multiplier:g}"


# ============================================================================ profiles
@dataclass(frozen=True, slots=True)
class ReproProfile:
    """How big a reproduction is: data sources, sweep axes, grids.

    ``regimes`` are (name, target contention); ``ladder`` the capacity fractions (of the working
    set) swept for fig. 11 and used to place the regimes.
    """

    name: str
    source: WorkloadSource
    model: str = "paper-7b"
    ladder: tuple[float, ...] = (0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3, 0.4, 0.6, 0.8)
    regimes: tuple[tuple[str, float], ...] = (("high", 0.25), ("moderate", 0.5), ("low", 0.85))
    arrival_rates: tuple[float, ...] = (0.5, 1.0, 2.0)
    seeds: tuple[int, ...] = (0, 1, 2)
    gaps: tuple[float, ...] = (5.0, 7.5, 10.0)
    layer_mixes: tuple[tuple[int, int], ...] = ((12, 24), (7, 28), (4, 32), (36, 0))
    state_dims: tuple[int, ...] = (16, 32, 64, 128)
    alpha_grid: tuple[float, ...] = DEFAULT_ALPHA_GRID
    fixed_alphas: tuple[float, ...] = (0.0, 1.0, 2.0)
    multipliers: tuple[float, ...] = (5, 15)
    admissions: tuple[str, ...] = ("none", "marconi", "every-block", "last-token", "uniform", "sparse-dp")
    evictions: tuple[str, ...] = ("lru", "flop-aware")
    ablation_workloads: tuple[str, ...] = ("sharegpt", "swe")
    shifts: tuple[tuple[str, str], ...] = (("swe-keepall", "swe"), ("sharegpt", "swe"))
    fig11_workloads: tuple[str, ...] = ("swe", "swe-keepall", "sharegpt")
    alpha_scan_workloads: tuple[str, ...] = ("swe", "swe-keepall")

    def with_lmsys(self, files: Sequence[str]) -> "ReproProfile":
        return replace(self, source=replace(self.source, lmsys_files=tuple(files)))


PROFILES: dict[str, ReproProfile] = {
    "full": ReproProfile("full", WorkloadSource()),
    "quick": ReproProfile(
        "quick", WorkloadSource(chat_sessions=60, swe_sessions=40, mooncake_limit=1000),
        ladder=(0.01, 0.015, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3, 0.4, 0.6), seeds=(0, 1),
        state_dims=(16, 32, 64, 128), shifts=(("swe-keepall", "swe"), ("sharegpt", "swe"))),
    # CI: vendored SWE / Mooncake samples and a synthetic chat trace; needs nothing outside the repo.
    "tiny": ReproProfile(
        "tiny", WorkloadSource(chat="synthetic", chat_sessions=24, swe="bundled", swe_sessions=10, swe_max_turns=14,
                               mooncake="bundled", mooncake_limit=200),
        ladder=(0.02, 0.05, 0.1, 0.3), arrival_rates=(1.0, 2.0), seeds=(0,), gaps=(5.0, 7.5),
        state_dims=(16, 128), alpha_grid=(0.0, 1.0, 2.0), multipliers=(5,), ablation_workloads=("sharegpt",),
        shifts=(("swe-keepall", "swe"),), fig11_workloads=("swe",), alpha_scan_workloads=("swe",)),
}


# ============================================================================ context
def with_available_data(profile: ReproProfile) -> tuple[ReproProfile, str]:
    """The profile on the data this machine has, and a line saying which that is.

    A fresh clone has no ``../shared/data``: then the real-data workloads fall back to the
    repository's own samples (:meth:`WorkloadSource.bundled`) instead of failing, and the line says so.
    """
    from marconi.workloads import shared_data_dir
    from marconi.workloads.paths import shared_data_where

    if profile.source.needs_shared_data() and shared_data_dir() is None:
        profile = replace(profile, source=profile.source.bundled())
        return profile, (f"the shared data set was not found (looked at {shared_data_where()}), so this "
                         f"runs on the repository's bundled data: {profile.source.describe()}. For the real "
                         "traces, get the data sets as the README's Data section says")
    return profile, f"data: {profile.source.describe()}"


@dataclass(slots=True)
class TraceInfo:
    key: str
    workload: str              # base workload, or "shift"
    kind: str                  # base | variant | shift
    sessions_per_second: float | None = None
    seed: int | None = None
    mean_gap_s: float | None = None
    ws_key: str = ""           # whose working set resolves this trace's fractions

    def tags(self) -> tuple[tuple[str, Any], ...]:
        out: list[tuple[str, Any]] = [("workload", self.workload), ("variant", self.kind)]
        for name in ("sessions_per_second", "seed", "mean_gap_s"):
            value = getattr(self, name)
            if value is not None:
                out.append((f"trace_{name}", value))
        return tuple(out)


@dataclass(slots=True)
class ReproContext:
    """Everything the figures read: traces, working sets, calibration, records, latency models.

    ``latency`` is set by the report writer (it depends on the tables passed to the report, not
    on the sweep); figs. 9 and 10 apply it to per-request hits.
    """

    profile: ReproProfile
    model: ModelSpec
    traces: dict[str, Trace] = field(default_factory=dict)
    info: dict[str, TraceInfo] = field(default_factory=dict)
    ws: dict[tuple[str, str], int] = field(default_factory=dict)      # (trace key, model name) -> bytes
    regimes: dict[str, dict[str, float]] = field(default_factory=dict)  # calibrated key -> regime -> fraction
    contention: dict[str, dict[float, float]] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    specs: dict[str, ModelSpec] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    backend: str = "local"
    latency: LatencySet | None = None
    _index: dict[tuple[str, str, str, str], dict[str, Any]] = field(default_factory=dict)

    def add_records(self, records: Iterable[dict[str, Any]]) -> None:
        for rec in records:
            self.records.append(rec)
            self._index[(rec["trace"], rec["system"], rec["capacity"], rec["model"])] = rec

    def find(self, trace: str, system: str, capacity: str, model: str | None = None) -> dict[str, Any] | None:
        return self._index.get((trace, system, capacity, model or self.model.name))

    def regime_capacity(self, key: str, regime: str) -> str:
        info = self.info[key]
        calibrated = key if key in self.regimes else info.ws_key
        return frac_label(self.regimes[calibrated][regime])

    def main_keys(self, workload: str) -> list[str]:
        return [k for k, i in self.info.items() if i.workload == workload and i.kind in ("base", "variant")]

    def main_workloads(self) -> list[str]:
        """The workloads of figs. 7-10 present in this run, in report order."""
        return [w for w in MAIN_WORKLOADS if w in self.traces]

    def alpha_keys(self) -> list[str]:
        """Traces of the α ablation: the workload shifts, then the whole-trace α scans."""
        return [k for k, i in self.info.items() if i.kind == "shift"] + \
            [w for w in self.profile.alpha_scan_workloads if w in self.traces]


def frac_label(fraction: float) -> str:
    return f"{fraction:g}x"


def base_key(workload: str) -> str:
    return workload


def variant_key(workload: str, sps: float, seed: int, gap: float | None) -> str:
    if sps == 1.0 and seed == 0 and (gap is None or gap == 7.5):
        return base_key(workload)
    return f"{workload}|sps={sps:g}|seed={seed}" + ("" if gap is None else f"|gap={gap:g}")
