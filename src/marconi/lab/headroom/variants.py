"""The replays the gap is decomposed over: the default, the oracle, and two steps between them.

The ``oracle`` system and the default ``marconi`` share Marconi's admission *policy*; they differ in
eviction only. So the literal cross (the oracle's eviction with the default's admission, and the
reverse) is the pair itself. What the oracle knows splits into two kinds of knowledge, and each
gets its own replay, so that the gap telescopes:

====================  ====================================  ========================================
variant               admission                             eviction
====================  ====================================  ========================================
``default``           marconi                               the default's (worlds)
``admission-states``  marconi, declining the states no      the default's
                      later request resumes from
                      (:class:`FutureFilteredAdmission`)
``admission``         the same, and the KV tails no later   the default's
                      input reaches
``dead``              the same                              the default's, but first any entry no
                                                            later request reuses
                                                            (:class:`DeadFirstEviction`)
``oracle``            marconi                               oracle (Belady-style)
====================  ====================================  ========================================

``admission-states - default`` and ``admission - admission-states`` are what knowing *what to keep*
is worth at insert time (states, then KVs); ``dead - admission`` what it is worth at eviction time
too (an entry dies after its last use, which admission cannot see); ``oracle - dead`` is the rest:
knowing *when* each live entry is next used (the order of evictions among entries that will be
reused). The parts sum to ``oracle - default`` exactly; a part may be negative (the oracle is a
strong reference, not a bound). ``oracle-filtered`` (the oracle with the filtered admission) is
reported beside them, outside the sum.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import numpy as np

from marconi.core.admission import AdmissionContext, AdmissionPolicy, BaseAdmission, FinalPlan, make_admission
from marconi.core.cache import ManualClock, PrefixCache
from marconi.core.eviction import EVICTION_POLICIES, EvictionBase, EvictionPolicy, Rule
from marconi.core.model import ModelSpec
from marconi.core.registry import ConfigError
from marconi.sim.oracle import NEVER, FutureIndex, OracleEviction
from marconi.sim.systems import SystemConfig, make_system

if TYPE_CHECKING:
    from marconi.core.candidates import CandidateSet
    from marconi.workloads.trace import Request

__all__ = ["VARIANTS", "DECOMPOSITION", "FutureFilteredAdmission", "DeadFirstEviction", "build_variant",
           "default_system"]

#: Every replay of a point, in the order they run.
VARIANTS = ("default", "admission-states", "admission", "dead", "oracle", "oracle-filtered")
#: (part, from variant, to variant): the telescoping sum ``oracle - default``.
DECOMPOSITION = (("admission_states", "default", "admission-states"), ("admission_kv", "admission-states", "admission"),
                 ("dead_entries", "admission", "dead"), ("ordering", "dead", "oracle"))


class FutureFilteredAdmission(BaseAdmission):
    """An admission policy that asks ``inner`` and then declines what no later request uses: a
    checkpoint at ``p`` unless a later input starts with ``tokens[:p]``, and (``trim_kv``) the KVs
    more than one token past the deepest point any later input reaches along the sequence (that
    one token keeps a later branch there detectable). Request ids must be arrival indices into the trace
    ``future`` was built from (true for a replay in order)."""

    name = "future-filtered"

    def __init__(self, inner: AdmissionPolicy | str, future: FutureIndex, *, trim_kv: bool = True) -> None:
        self.inner = make_admission(inner)
        self.future = future
        self.trim_kv = trim_kv
        self.page_size = self.inner.page_size
        self.caches = self.inner.caches
        self.tails = self.inner.tails

    def bind(self, cache: Any) -> None:
        self.inner.bind(cache)

    def end_request(self, request_id: int) -> None:
        self.inner.end_request(request_id)

    def __deepcopy__(self, memo: dict[int, Any]) -> "FutureFilteredAdmission":
        # Worlds and clones copy their admission policy; the index is read-only, so it is shared.
        return FutureFilteredAdmission(copy.deepcopy(self.inner, memo), self.future, trim_kv=self.trim_kv)

    def _reused(self, prefix: np.ndarray, now: int) -> bool:
        return FutureIndex.next_after(self.future.requests_through(prefix), now) != NEVER

    def _reach(self, tokens: np.ndarray, now: int) -> int:
        """The deepest position along ``tokens`` that a later input reaches (0: none)."""
        reach = 0
        for end, requests in self.future.segments(tokens, 0):
            if FutureIndex.next_after(requests, now) == NEVER:
                break
            reach = end
        return reach

    def prefill_checkpoints(self, ctx: AdmissionContext) -> Iterable[int]:
        return [p for p in self.inner.prefill_checkpoints(ctx) if self._reused(ctx.tokens[:p], ctx.request_id)]

    def final_plan(self, ctx: AdmissionContext, total_len: int) -> FinalPlan:
        plan = self.inner.final_plan(ctx, total_len)
        # One token past the deepest later reach: a later input that leaves the sequence there
        # must split an edge (or its branch point is never detected, so never checkpointed).
        insert_len = plan.insert_len
        if self.trim_kv:
            insert_len = min(insert_len, self._reach(ctx.tokens, ctx.request_id) + 1)
        kept = tuple(p for p in plan.checkpoints if p <= insert_len and self._reused(ctx.tokens[:p], ctx.request_id))
        return FinalPlan(insert_len, kept, plan.block)

    def describe(self) -> dict[str, object]:
        what = "states+kv" if self.trim_kv else "states"
        return {"admission": f"{self.name}({self.inner.describe().get('admission')};{what})"}


class DeadFirstEviction(EvictionBase):
    """Evicts first any candidate that no later request reuses (by the oracle's own accounting:
    :meth:`OracleEviction.keep_costs` is infinite), the largest first; otherwise asks ``inner``.
    Knows *what* is dead, not *when* the rest is next used."""

    name = "dead-first"

    def __init__(self, inner: EvictionPolicy, future: FutureIndex) -> None:
        self.inner = inner
        self.oracle = OracleEviction(future)
        self.evicts_inner_nodes = inner.evicts_inner_nodes
        self.efficiency_variant = inner.efficiency_variant

    def bind(self, cache: PrefixCache) -> None:
        self.inner.bind(cache)
        self.oracle.bind(cache)

    def set_rule(self, rule: Rule) -> None:
        """``inner``'s rule (its chooser's switches reach it through this policy)."""
        self.inner.set_rule(rule)

    def choose(self, candidates: "CandidateSet") -> int:
        costs, freed = self.oracle.keep_costs(candidates)
        dead = np.flatnonzero(np.isinf(costs))
        if dead.size == 0:
            return self.inner.choose(candidates)
        biggest = dead[freed[dead] == freed[dead].max()]
        return int(biggest[np.argmin(candidates.access_seq[biggest])])

    def describe(self) -> dict[str, Any]:
        return {"eviction": f"{self.name}({self.inner.describe().get('eviction')})"}


def default_system(name: str) -> SystemConfig:
    """The system whose gap to the oracle is studied (``marconi``, ``sglang+``, ``marconi:alpha=1``...):
    a :class:`SystemConfig` without the future and without a bootstrap tuner (its eviction must be
    a policy the steps can wrap).

    Raises:
        ConfigError: naming ``--default``, for an unknown system or parameter, or a system the study
            cannot compare.
    """
    try:
        system = make_system(name)
    except ConfigError as exc:   # an unknown system or parameter: say which option holds it
        said = str(exc)          # a parameter's error already begins with the name: do not say it twice
        raise ConfigError(f"--default {said}" if said.startswith(f"{name}:") else f"--default {name!r}: {said}") from None
    if not isinstance(system, SystemConfig) or system.needs_future or system.unbounded or system.tuning is not None:
        raise ConfigError(f"--default {name!r}: choose an online system with a fixed or adaptive eviction "
                          "(marconi, marconi:selector=regret, sglang+, marconi:alpha=1 ...), not a tuned, "
                          "unbounded or future-aware one")
    return system


def build_variant(variant: str, system: SystemConfig, spec: ModelSpec, capacity_bytes: float,
                  future: Callable[[], FutureIndex], clock: ManualClock) -> PrefixCache:
    """A fresh cache for ``variant`` of ``system`` (see the module docstring). ``future`` returns
    the index over the trace's inputs (built once, shared: the variants only read it)."""
    admission = system.admission
    if variant in ("admission-states", "admission", "dead", "oracle-filtered"):
        admission = FutureFilteredAdmission(system.admission, future(), trim_kv=variant != "admission-states")
    if variant in ("oracle", "oracle-filtered"):
        eviction: Any = OracleEviction(future())
    elif variant == "dead":
        eviction = DeadFirstEviction(EVICTION_POLICIES.create(system.eviction), future())
    elif variant in ("default", "admission-states", "admission"):
        eviction = EVICTION_POLICIES.create(system.eviction)
    else:
        raise ConfigError(f"unknown headroom variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    return PrefixCache(spec, capacity_bytes, admission, eviction, clock=clock)


def future_of(trace: Sequence["Request"]) -> FutureIndex:
    """The oracle's index over the trace's inputs, in arrival order."""
    return FutureIndex([np.asarray(r.input_tokens) for r in trace])
