"""Admission policies: which SSM checkpoints enter the cache, and how much of a sequence is kept.
The cache decides what exists, what is created and whether it fits; any admission pairs with any
eviction policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, NamedTuple, Protocol

import numpy as np

from marconi.core.registry import ConfigError, Domain, Registry
from marconi.core.tails import TAIL_MODES

if TYPE_CHECKING:
    from marconi.core.model import ModelSpec

__all__ = ["BaseAdmission", "MatchResult", "AdmissionContext", "FinalPlan", "AdmissionPolicy", "ADMISSION_POLICIES",
           "make_admission", "NoAdmission", "MarconiAdmission", "EveryBlock", "LastToken", "Uniform"]


class MatchResult(NamedTuple):
    """What a lookup found: ``kv_hit_len`` (longest prefix with cached KVs), ``usable_hit_len`` (the
    deepest SSM checkpoint on it, where the request resumes) and ``unusable_len`` (the difference)."""

    input_len: int
    kv_hit_len: int
    usable_hit_len: int

    @property
    def unusable_len(self) -> int:
        return self.kv_hit_len - self.usable_hit_len


@dataclass(frozen=True, slots=True)
class AdmissionContext:
    """What an admission policy may look at. ``branch_len``: the depth at which inserting the input
    (input + output at ``final_plan``) would create a new branch node, or None."""

    tokens: np.ndarray
    input_len: int
    match: MatchResult
    branch_len: int | None
    spec: "ModelSpec"
    request_id: int = -1   # the same at prefill and final time: stateful policies key plans by it


class FinalPlan(NamedTuple):
    insert_len: int                 # tokens of input + output to keep in the tree
    checkpoints: tuple[int, ...]    # positions (<= insert_len) that should hold an SSM checkpoint
    block: int = 0                  # > 0: also a checkpoint at every multiple of ``block`` tokens


class AdmissionPolicy(Protocol):
    """What the cache asks of an admission policy. ``final_plan`` must not change the policy: the
    cache also calls it for dry runs (``PrefixCache.finish_checkpoints``)."""

    name: str
    page_size: int    # KV matching granularity (1 = token-level radix tree)
    caches: bool      # False: nothing is ever inserted (vanilla)
    tails: str        # one of TAIL_MODES: "reach" asks the cache to cut predicted-dead tails first

    def bind(self, cache: Any) -> None:
        """Called once by the cache that holds the policy, at its construction (a policy may read
        the cache's clock)."""
        ...

    def end_request(self, request_id: int) -> None:
        """The request finished or aborted (a policy keeping per-request plans drops them)."""
        ...

    def prefill_checkpoints(self, ctx: AdmissionContext) -> Iterable[int]:
        ...

    def final_plan(self, ctx: AdmissionContext, total_len: int) -> FinalPlan:
        ...

    def describe(self) -> dict[str, object]:
        ...


class BaseAdmission:
    """The capabilities of :class:`AdmissionPolicy` a stateless policy does without: it keeps every
    KV to the eviction rule (``tails = "keep"``), needs no cache and keeps nothing per request."""

    tails = "keep"

    def bind(self, cache: Any) -> None:
        return None

    def end_request(self, request_id: int) -> None:
        return None


class NoAdmission(BaseAdmission):
    """Vanilla inference: no prefix caching at all."""

    name = "none"
    page_size = 1
    caches = False

    def prefill_checkpoints(self, ctx: AdmissionContext) -> Iterable[int]:
        return ()

    def final_plan(self, ctx: AdmissionContext, total_len: int) -> FinalPlan:
        return FinalPlan(0, ())

    def describe(self) -> dict[str, object]:
        return {"admission": self.name}


class MarconiAdmission(BaseAdmission):
    """Judicious admission (paper §4.1): the branch point found by speculative insertion and the last
    decoded token; all of input + output is inserted. A request admits at most three: the branch
    point of its input (planned at ``begin``, captured in prefill), the branch point of input +
    output (where its output leaves a cached sequence, planned at ``finish``), and the last token.
    ``tails="reach"`` also cuts predicted-dead tails first at eviction (:mod:`marconi.core.tails`);
    ``"keep"`` (default) is the paper's behaviour."""

    name = "marconi"
    page_size = 1
    caches = True

    def __init__(self, tails: str = "keep") -> None:
        if tails not in TAIL_MODES:
            raise ConfigError(f"marconi admission: tails must be one of {', '.join(TAIL_MODES)}, got {tails!r}")
        self.tails = tails

    def prefill_checkpoints(self, ctx: AdmissionContext) -> Iterable[int]:
        if ctx.branch_len is not None and ctx.match.usable_hit_len < ctx.branch_len <= ctx.input_len:
            return (ctx.branch_len,)
        return ()

    def final_plan(self, ctx: AdmissionContext, total_len: int) -> FinalPlan:
        if ctx.branch_len is not None and 0 < ctx.branch_len < total_len:
            return FinalPlan(total_len, (ctx.branch_len, total_len))
        return FinalPlan(total_len, (total_len,))

    def describe(self) -> dict[str, object]:
        return {"admission": self.name} if self.tails == "keep" else {"admission": self.name, "tails": self.tails}


class EveryBlock(BaseAdmission):
    """Fine-grained checkpointing (vLLM+): a checkpoint at every ``block``-token boundary.
    ``paged=True``: only whole blocks are cached and matched (page size = block; a partial last block
    is dropped); ``paged=False``: token-level matching, plus a checkpoint at the last token."""

    name = "every-block"
    caches = True

    def __init__(self, block: int = 32, runs: bool = True, paged: bool = True) -> None:
        if block < 1:
            raise ConfigError(f"every-block: block must be >= 1 token, got {block}")
        self.block = block
        self.paged = paged
        self.page_size = block if paged else 1
        self.runs = runs and paged

    def prefill_checkpoints(self, ctx: AdmissionContext) -> Iterable[int]:
        first = ctx.match.usable_hit_len // self.block + 1
        return range(first * self.block, ctx.input_len + 1, self.block)

    def final_plan(self, ctx: AdmissionContext, total_len: int) -> FinalPlan:
        b = self.block
        if not self.paged:
            return FinalPlan(total_len, (*range(b, total_len + 1, b), total_len))
        insert_len = total_len - total_len % b
        if self.runs:  # the cache may keep consecutive blocks as one run node (same decisions, faster)
            return FinalPlan(insert_len, (), block=b)
        return FinalPlan(insert_len, tuple(range(b, insert_len + 1, b)))

    def describe(self) -> dict[str, object]:
        return {"admission": self.name, "block": self.block, "paged": self.paged}


class LastToken(BaseAdmission):
    """Only the state after the last decoded token (conversation continuation), no branch points."""

    name = "last-token"
    page_size = 1
    caches = True

    def prefill_checkpoints(self, ctx: AdmissionContext) -> Iterable[int]:
        return ()

    def final_plan(self, ctx: AdmissionContext, total_len: int) -> FinalPlan:
        return FinalPlan(total_len, (total_len,))

    def describe(self) -> dict[str, object]:
        return {"admission": self.name}


class Uniform(BaseAdmission):
    """``m`` checkpoints evenly spaced over the input (at i·L/m), plus the last decoded token."""

    name = "uniform"
    page_size = 1
    caches = True

    def __init__(self, m: int = 4) -> None:
        if m < 0:
            raise ConfigError(f"uniform: m must be >= 0, got {m}")
        self.m = m

    def _positions(self, input_len: int) -> tuple[int, ...]:
        return tuple(sorted({max(1, round(i * input_len / self.m)) for i in range(1, self.m + 1)})) if self.m else ()

    def prefill_checkpoints(self, ctx: AdmissionContext) -> Iterable[int]:
        return self._positions(ctx.input_len)

    def final_plan(self, ctx: AdmissionContext, total_len: int) -> FinalPlan:
        return FinalPlan(total_len, (*self._positions(ctx.input_len), total_len))

    def describe(self) -> dict[str, object]:
        return {"admission": self.name, "m": self.m}


# sparse-dp (the second paper's placement) registers here through the marconi.admission_policies
# entry points, imported the first time the registry is read, so this module never imports it.
ADMISSION_POLICIES: Registry[AdmissionPolicy] = Registry("admission policy", entry_points="marconi.admission_policies")


@ADMISSION_POLICIES.register("none", "vanilla: cache nothing")
def _none() -> AdmissionPolicy:
    return NoAdmission()


@ADMISSION_POLICIES.register("marconi", "branch points (speculative insertion) + last decoded token; "
                                        "tails=reach: trim predicted-dead tails of branched sequences first")
def _marconi(tails: str = "keep") -> AdmissionPolicy:
    return MarconiAdmission(tails)


@ADMISSION_POLICIES.register("every-block", "a checkpoint at every block boundary (vLLM+)",
                             domains={"block": Domain(1, 1 << 24, integer=True)})
def _every_block(block: int = 32, runs: bool = True, paged: bool = True) -> AdmissionPolicy:
    return EveryBlock(block, runs, paged)


@ADMISSION_POLICIES.register("last-token", "only the state after the last decoded token")
def _last_token() -> AdmissionPolicy:
    return LastToken()


@ADMISSION_POLICIES.register("uniform", "m checkpoints evenly spaced over the input + the last token",
                             domains={"m": Domain(0, 1024, integer=True)})
def _uniform(m: int = 4) -> AdmissionPolicy:
    return Uniform(m)


_ADMISSION_MEMBERS = ("name", "page_size", "caches", "tails", "bind", "end_request", "prefill_checkpoints",
                      "final_plan", "describe")


def make_admission(spec: "str | AdmissionPolicy") -> AdmissionPolicy:
    """The registry's policy ``spec`` names, or ``spec`` itself; ConfigError for an object lacking the
    :class:`AdmissionPolicy` contract (inherit :class:`BaseAdmission` for ``tails``, ``bind`` and
    ``end_request``)."""
    if isinstance(spec, str):
        return ADMISSION_POLICIES.create(spec)
    missing = [m for m in _ADMISSION_MEMBERS if not hasattr(spec, m)]
    if missing:
        raise ConfigError(f"admission must be a policy name ({', '.join(ADMISSION_POLICIES.names())}) or an "
                          f"AdmissionPolicy; {type(spec).__name__} {spec!r} lacks {', '.join(missing)} "
                          "(inherit marconi.core.admission.BaseAdmission for the defaults)")
    return spec

