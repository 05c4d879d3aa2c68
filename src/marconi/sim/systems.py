"""Named caching systems (admission + eviction + α tuning) with parameters on the name:
``marconi:alpha=1.0``, ``custom:admission=every-block,eviction=flop-aware``. The table:
docs/simulator.md ("The named systems")."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import numpy as np

from marconi.core.admission import ADMISSION_POLICIES
from marconi.core.cache import PayloadOps, PrefixCache
from marconi.core.chooser import follow
from marconi.core.eviction import EVICTION_POLICIES, FlopAware
from marconi.core.model import ModelSpec, get_model
from marconi.core.protocol import ReplayCache
from marconi.core.registry import ConfigError, Domain, ParsedName, Registry, parse_name, split_name_list
from marconi.choosers.bootstrap import OBJECTIVES, BootstrapTuner

__all__ = ["SystemConfig", "TuningConfig", "SYSTEMS", "make_system", "parse_systems", "build_cache"]


@dataclass(frozen=True, slots=True)
class TuningConfig:
    """Bootstrap α tuning; validated here so a bad value fails when the system is named, not mid-run."""

    multiplier: float = 5
    objective: str = "hit-rate"
    retune_every: int = 0
    drift: float = 0.05
    tolerance: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.multiplier) and self.multiplier > 0):
            raise ConfigError(f"multiplier must be a finite number > 0, got {self.multiplier}")
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        if self.retune_every < 0:
            raise ConfigError(f"retune must be >= 0 (0: never), got {self.retune_every}")
        if not (math.isfinite(self.drift) and self.drift >= 0):
            raise ConfigError(f"drift must be a finite number >= 0, got {self.drift}")
        if not 0 <= self.tolerance < 1:
            raise ConfigError(f"tolerance must be in [0, 1), got {self.tolerance}")


@runtime_checkable
class System(Protocol):
    """A named caching system as the simulator, sweeps and reports use it: ``build`` returns a fresh
    :class:`~marconi.core.protocol.ReplayCache`, ``record_fields`` its echo in records, ``relabel``
    the name the user typed."""

    label: str
    unbounded: bool       # ignores the capacity (the ``infinite`` ceiling)
    needs_future: bool    # build() needs the whole trace as ``future`` (the ``oracle``)
    event_mode: bool      # its cache takes overlapping requests (``--mode event``): prefills land at insert_prefill

    def build(self, spec: ModelSpec | str, capacity_bytes: float, *, clock: Callable[[], float] | None = None,
              payloads: PayloadOps | None = None, tuning_workers: int | None = None,
              tuning_mapper: Callable[..., list[Any]] | None = None,
              future: Sequence[Any] | None = None) -> ReplayCache:
        ...

    def record_fields(self) -> dict[str, Any]:
        """``system`` (the label), ``admission``, ``eviction``, ``tuning``: the record's echo."""
        ...

    def relabel(self, label: str) -> "System":
        ...

    def least_capacity_bytes(self, spec: ModelSpec | str, requests: Sequence[Any]) -> int:
        """The least capacity (bytes) worth replaying ``requests`` through this system at: below it a
        bounded cache holds not one SSM checkpoint (nothing is cached), or an emulated engine cannot
        serve the longest request at all (a point fails); 0 where every capacity runs."""
        ...


@dataclass(frozen=True, slots=True)
class SystemConfig:
    """A caching system built on :class:`~marconi.core.cache.PrefixCache` (implements :class:`System`):
    what to build for a cache, and the label it is reported under."""

    label: str
    admission: str
    eviction: str
    tuning: TuningConfig | None = None
    unbounded: bool = False        # ignore the capacity (the ``infinite`` ceiling)
    needs_future: bool = False     # the eviction reads the whole trace (the ``oracle``)
    event_mode: bool = field(default=True, init=False)   # PrefixCache inserts a prefill at insert_prefill

    def __post_init__(self) -> None:
        # Build the policies once now, so every parameter is checked when the system is named
        # (before a trace loads or a sweep starts), by the code that would reject it later.
        ADMISSION_POLICIES.create(self.admission)
        if self.needs_future:  # the oracle's eviction is built from the trace in build()
            return
        eviction = EVICTION_POLICIES.create(self.eviction)
        if self.tuning is not None and not isinstance(eviction, FlopAware):
            raise ConfigError(f"{self.label}: alpha tuning needs the flop-aware eviction policy")

    def least_capacity_bytes(self, spec: ModelSpec | str, requests: Sequence[Any]) -> int:
        """One SSM checkpoint of ``spec`` for a bounded cache that caches (below it nothing is), else 0."""
        if self.unbounded or not ADMISSION_POLICIES.create(self.admission).caches:
            return 0
        return int(get_model(spec).ssm_checkpoint_bytes)

    def build(self, spec: ModelSpec | str, capacity_bytes: float, *, clock: Callable[[], float] | None = None,
              payloads: PayloadOps | None = None, tuning_workers: int | None = None,
              tuning_mapper: Callable[..., list[Any]] | None = None,
              future: Sequence[Any] | None = None) -> PrefixCache:
        """A fresh cache of this system. ``future``: the requests it will serve, in arrival order; required
        when ``needs_future`` (ConfigError otherwise)."""
        eviction: Any = self.eviction
        if self.needs_future:
            if future is None:
                raise ConfigError(f"{self.label} knows the future: it needs the whole trace, so it runs only in the "
                                  "simulator (marconi simulate / marconi.sim.simulate hand the trace over)")
            from marconi.sim.oracle import FutureIndex, OracleEviction

            eviction = OracleEviction(FutureIndex([np.asarray(r.input_tokens) for r in future]))
        if self.unbounded:
            capacity_bytes = UNBOUNDED_BYTES
        cache = PrefixCache(spec, capacity_bytes, self.admission, eviction, clock=clock, payloads=payloads)
        if self.tuning is not None:
            if not isinstance(cache.eviction, FlopAware):
                raise ConfigError(f"{self.label}: alpha tuning needs the flop-aware eviction policy")
            t = self.tuning
            tuner = BootstrapTuner(cache.eviction, multiplier=t.multiplier, objective=t.objective,
                                   workers=tuning_workers, retune_every=t.retune_every, drift=t.drift,
                                   tolerance=t.tolerance, mapper=tuning_mapper)
            follow(cache, tuner)
        return cache

    def record_fields(self) -> dict[str, Any]:
        tuning = (f"bootstrap:multiplier={self.tuning.multiplier}" if self.tuning is not None
                  else "adaptive" if self.eviction.startswith(("regret", "worlds")) else None)
        return {"system": self.label, "admission": self.admission, "eviction": self.eviction, "tuning": tuning}

    def relabel(self, label: str) -> "SystemConfig":
        return replace(self, label=label)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"system": self.label, "admission": self.admission, "eviction": self.eviction}
        if self.tuning is not None:
            out["tuning"] = f"bootstrap(multiplier={self.tuning.multiplier}, objective={self.tuning.objective})"
        elif self.eviction.startswith(("regret", "worlds")):
            out["tuning"] = "adaptive"
        return out


# vllm-align (the vLLM emulation) and sglang-unified (the SGLang emulation) register here through the
# marconi.systems entry points, imported the first time the registry is read; both build on this module.
SYSTEMS: Registry[System] = Registry("system", entry_points="marconi.systems")
UNBOUNDED_BYTES = 2**62
_BOOTSTRAP_ONLY = ("multiplier", "retune", "drift", "tolerance")
_ADAPTIVE_ONLY = ("rules", "decay", "hysteresis", "confidence", "selector")


def _alpha_or_auto(alpha: str) -> float | None:
    if alpha == "auto":
        return None
    try:
        value = float(alpha)
    except ValueError:
        raise ConfigError(f"alpha must be a number >= 0 or 'auto', got {alpha!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise ConfigError(f"alpha must be a finite number >= 0 or 'auto', got {alpha!r}")
    return value


def _flop_aware(alpha: str, efficiency: str, recency: str) -> str:
    fixed = _alpha_or_auto(alpha)
    return f"flop-aware:alpha={fixed or 0.0},efficiency={efficiency},recency={recency}"


@SYSTEMS.register("vanilla", "no prefix caching")
def _vanilla() -> SystemConfig:
    return SystemConfig("vanilla", "none", "lru")


@SYSTEMS.register("vllm+", "checkpoint every block, LRU (vLLM extended to hybrids)",
                  domains={"block": Domain(1, 1 << 24, integer=True)})
def _vllm(block: int = 32) -> SystemConfig:
    _check_block(block)
    return SystemConfig("vllm+", f"every-block:block={block}", "lru")


@SYSTEMS.register("sglang+", "judicious admission, LRU (SGLang extended to hybrids)")
def _sglang(tails: str = "keep") -> SystemConfig:
    return SystemConfig("sglang+", _marconi_admission(tails), "lru")


def _marconi_admission(tails: str) -> str:
    """Marconi's admission; ``tails=reach`` also trims predicted-dead tails first (``marconi.core.tails``)."""
    return "marconi" if tails == "keep" else f"marconi:tails={tails}"


@SYSTEMS.register("marconi", "judicious admission + FLOP-aware eviction whose rule a chooser picks online: "
                             "chooser=worlds (exact per-rule worlds, the default), =regret (counterfactual "
                             "regret) or =bootstrap (alpha tuned once, the paper); alpha=X: fixed. Aliases: "
                             "selector=worlds|regret, tuner=bootstrap, tuner=adaptive (worlds or regret)",
                  domains={"alpha": Domain(0, 1e6, words=("auto",)), "multiplier": Domain(0, 1e6, lo_open=True),
                           "retune": Domain(0, 10**9, integer=True), "drift": Domain(0, 1e6),
                           "tolerance": Domain(0, 1, hi_open=True), "decay": Domain(0, 1, lo_open=True),
                           "hysteresis": Domain(0, 1000), "confidence": Domain(0, 1000)})
def _marconi(alpha: str = "auto", tuner: str = "auto", objective: str = "hit-rate", efficiency: str = "auto",
             recency: str = "auto", multiplier: float | None = None, retune: int | None = None,
             drift: float | None = None, tolerance: float | None = None, rules: str | None = None,
             decay: float | None = None, hysteresis: float | None = None,
             confidence: float | None = None, selector: str | None = None, tails: str = "keep",
             chooser: str | None = None) -> SystemConfig:
    named = "chooser"  # the concept's name; selector=worlds|regret and tuner=bootstrap|adaptive are its aliases
    if selector is not None:
        if chooser is not None and chooser != selector:
            raise ConfigError(f"marconi: chooser={chooser} and selector={selector} (its alias) disagree")
        chooser, named = selector, "selector"
    if chooser == "bootstrap":
        if tuner not in ("auto", "bootstrap"):
            raise ConfigError(f"marconi: chooser=bootstrap and tuner={tuner} disagree")
        tuner, chooser = "bootstrap", None
    selector = chooser
    given = {k for k, v in locals().items() if v is not None and k in _BOOTSTRAP_ONLY + _ADAPTIVE_ONLY}
    admission = _marconi_admission(tails)
    fixed = _alpha_or_auto(alpha)
    tuner_named = tuner != "auto"
    efficiency = None if efficiency == "auto" else efficiency
    recency = None if recency == "auto" else recency
    if given & set(_BOOTSTRAP_ONLY) and given & set(_ADAPTIVE_ONLY):
        raise ConfigError(f"marconi: {', '.join(sorted(given))} mix the bootstrap tuner's parameters "
                          f"({', '.join(_BOOTSTRAP_ONLY)}) with the adaptive one's ({', '.join(_ADAPTIVE_ONLY)})")
    if tuner == "auto":  # a single-rule knob (efficiency, recency) or a bootstrap-only one: the bootstrap tuner
        single = efficiency is not None or recency is not None
        tuner = "bootstrap" if given & set(_BOOTSTRAP_ONLY) or (single and not given) else "adaptive"
    if tuner not in ("adaptive", "bootstrap"):
        raise ConfigError(f"marconi: tuner must be 'adaptive' or 'bootstrap', got {tuner!r}")
    if fixed is not None:
        if given or tuner_named:
            raise ConfigError(f"marconi: alpha={alpha} is fixed, so there is nothing to tune; drop "
                              f"{', '.join(sorted(given)) or 'tuner'} or write alpha=auto")
        return SystemConfig("marconi", admission, _flop_aware(alpha, efficiency or "total", recency or "linear"))
    wrong = given & set(_ADAPTIVE_ONLY if tuner == "bootstrap" else _BOOTSTRAP_ONLY)
    if wrong:
        raise ConfigError(f"marconi: {', '.join(sorted(wrong))} do not apply to tuner={tuner}")
    if tuner == "bootstrap":
        tuning = TuningConfig(5 if multiplier is None else multiplier, objective, retune or 0,
                              0.05 if drift is None else drift, tolerance or 0.0)
        return SystemConfig("marconi", admission, _flop_aware(alpha, efficiency or "total", recency or "linear"), tuning)
    if efficiency is not None or recency is not None:
        raise ConfigError("marconi: the adaptive tuner chooses the efficiency and recency itself (its rules); "
                          "name a family with rules=lru/a0/a1m/... or use tuner=bootstrap")
    if selector not in (None, "regret", "worlds"):
        raise ConfigError(f"marconi: {named} must be 'worlds' (default: exact per-rule worlds, one replay per "
                          f"rule), 'regret' (counterfactual regret, about 1.7x a fixed-alpha replay) or 'bootstrap', "
                          f"got {selector!r}")
    if selector is None and confidence is not None:
        selector = "regret"  # only the regret chooser has a confidence bound (names written before keep meaning)
    if selector == "worlds" and confidence is not None:
        raise ConfigError(f"marconi: confidence applies to {named}=regret only (worlds compare exact caches)")
    params = [f"rules={rules or 'default'}", f"objective={objective}"]
    params += [f"{k}={v}" for k, v in (("decay", decay), ("hysteresis", hysteresis), ("confidence", confidence))
               if v is not None]
    policy = "regret" if selector == "regret" else "worlds"
    return SystemConfig("marconi", admission, f"{policy}:" + ",".join(params))


@SYSTEMS.register("infinite", "the same admission with unbounded capacity: the hit-rate ceiling")
def _infinite(admission: str = "marconi") -> SystemConfig:
    _, adm = _policy_spec(admission)
    ADMISSION_POLICIES.create(adm)
    return SystemConfig("infinite", adm, "lru", unbounded=True)


@SYSTEMS.register("oracle", "future-aware Belady-style eviction (knows the trace; a strong reference, "
                            "not a proven bound)")
def _oracle(admission: str = "marconi") -> SystemConfig:
    _, adm = _policy_spec(admission)
    ADMISSION_POLICIES.create(adm)
    return SystemConfig("oracle", adm, "oracle", needs_future=True)


def _check_block(block: int) -> None:
    if block < 1:
        raise ConfigError(f"block must be >= 1 token, got {block}")


def _policy_spec(text: str) -> tuple[str, str]:
    """``"uniform(m=8;paged=false)"`` -> (``"uniform"``, ``"uniform:m=8,paged=false"``): parentheses and
    semicolons, since the system name's own parameters are comma-separated."""
    name, paren, rest = text.partition("(")
    if not paren:
        return name, name
    if not rest.endswith(")"):
        raise ConfigError(f"unbalanced parentheses in {text!r}: write name(k=v;k2=v2)")
    params = rest[:-1].replace(";", ",")
    return name, f"{name}:{params}" if params else name


@SYSTEMS.register("custom", "any admission policy with any eviction policy, e.g. "
                            "custom:admission=uniform(m=8),eviction=flop-aware(alpha=1)",
                  domains={"block": Domain(1, 1 << 24, integer=True), "alpha": Domain(0, 1e6, words=("auto",)),
                           "multiplier": Domain(0, 1e6, lo_open=True)})
def _custom(admission: str = "marconi", eviction: str = "lru", block: int = 32, alpha: str = "auto",
            multiplier: float = 5, objective: str = "hit-rate", efficiency: str = "total",
            recency: str = "linear") -> SystemConfig:
    _check_block(block)
    adm_name, adm = _policy_spec(admission)
    evi_name, evi = _policy_spec(eviction)
    if adm_name not in ADMISSION_POLICIES.names():
        raise ConfigError(f"custom: unknown admission {adm_name!r}; choose one of: {', '.join(ADMISSION_POLICIES.names())}")
    if evi_name not in EVICTION_POLICIES.names():
        raise ConfigError(f"custom: unknown eviction {evi_name!r}; choose one of: {', '.join(EVICTION_POLICIES.names())}")
    ADMISSION_POLICIES.create(adm)  # validate the policy's own parameters now
    if adm == "every-block":
        adm = f"every-block:block={block}"
    tuning = None
    if evi_name.startswith("flop-aware") and evi == evi_name:
        variant = "marginal" if evi_name == "flop-aware-marginal" else efficiency
        evi = _flop_aware(alpha, variant, recency)
        if _alpha_or_auto(alpha) is None:
            tuning = TuningConfig(multiplier, objective)
    else:
        EVICTION_POLICIES.create(evi)
    return SystemConfig(f"{admission}+{eviction}", adm, evi, tuning)


def make_system(text: str | System) -> System:
    """A system from its name with parameters; the label is the text as given."""
    if not isinstance(text, str):
        return text
    parsed: ParsedName = parse_name(text)
    try:
        config = SYSTEMS.create(parsed)
    except ConfigError as exc:  # name the system the user typed, unless the message already does
        if parsed.name not in SYSTEMS.names() or str(exc).startswith(("system ", f"{parsed}")):
            raise
        raise ConfigError(f"{parsed}: {exc}") from None
    label = str(parsed) if parsed.name != "custom" or not parsed.params else config.label
    return config.relabel(label)


def parse_systems(text: str) -> list[System]:
    """``"vanilla,vllm+,marconi:alpha=1,multiplier=5"`` -> configs (parameters may contain commas)."""
    return [make_system(item) for item in split_name_list(text)]


def build_cache(system: str | System, spec: ModelSpec | str, capacity_bytes: float, **kwargs: Any) -> ReplayCache:
    return make_system(system).build(spec, capacity_bytes, **kwargs)

