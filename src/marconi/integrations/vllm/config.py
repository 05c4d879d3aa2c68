"""The plugin's configuration: environment variables (``ENV_*``, docs/vllm.md "Using the plugin"), read once per process.

vLLM loads general plugins in every process before any option could reach them, hence the
environment. :meth:`PluginConfig.from_env` raises :class:`ConfigError` naming the variable and its
value; :meth:`PluginConfig.lenient_from_env` never stops stock vLLM (no policy set).

**An α source runs arbitrary code**: ``MARCONI_VLLM_ALPHA_SOURCE=module:factory`` (and
``vllm-align:alpha_source=``) imports ``module`` in every process that reads it, calls ``factory``
once per block pool and ``observe`` after every request. Name only modules you trust.
"""

from __future__ import annotations

import importlib
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping, TextIO

from marconi.core.registry import ConfigError, did_you_mean
from marconi.options import CHECKPOINT_BUDGET, MAX_COUNT
from marconi.integrations.common.alpha import AlphaSource, FixedAlpha
from marconi.integrations.vllm.policy import DEFAULT_ALPHA, EFFICIENCIES, POLICIES
from marconi.integrations.vllm.retention import DEFAULT_BUDGET, SPARSE_DP
from marconi.integrations.vllm.shadow import PoolShadowAlpha

__all__ = ["PluginConfig", "ENV_POLICY", "ENV_ALPHA", "ENV_ADAPTIVE_RULES", "ENV_ADAPTIVE_LAG", "ENV_ADAPTIVE_REPLAY",
           "ENV_ALPHA_SOURCE", "ENV_EFFICIENCY", "REPLAYS",
           "ENV_TRACE", "ENV_MAMBA2_CPU_FIX", "ENV_RETENTION", "ENV_RETENTION_BUDGET", "ADAPTIVE", "parse_alpha",
           "load_alpha_factory", "KNOWN_VARIABLES", "MAX_ADAPTIVE_LAG", "unknown_variables"]

ENV_POLICY = "MARCONI_VLLM_POLICY"
ENV_ALPHA = "MARCONI_VLLM_ALPHA"
ENV_ADAPTIVE_RULES = "MARCONI_VLLM_ADAPTIVE_RULES"
ENV_ADAPTIVE_LAG = "MARCONI_VLLM_ADAPTIVE_LAG"
ENV_ADAPTIVE_REPLAY = "MARCONI_VLLM_ADAPTIVE_REPLAY"
#: Where adaptive α's shadow replays finished requests: on the scheduler thread (``inline``, lag 0
#: only) or in a child process (``process``; at lag 0 the scheduler waits for it only when it next
#: reads the rule, at an eviction: the same rules as inline). Unset: :func:`default_replay`.
REPLAYS = ("inline", "process")
ENV_ALPHA_SOURCE = "MARCONI_VLLM_ALPHA_SOURCE"
ENV_EFFICIENCY = "MARCONI_VLLM_EFFICIENCY"
ENV_TRACE = "MARCONI_VLLM_TRACE"
ENV_MAMBA2_CPU_FIX = "MARCONI_VLLM_MAMBA2_CPU_FIX"
ENV_RETENTION = "MARCONI_VLLM_RETENTION"
ENV_RETENTION_BUDGET = "MARCONI_VLLM_RETENTION_BUDGET"
#: The value of ``MARCONI_VLLM_ALPHA`` / ``vllm-align:alpha=`` / ``--alpha`` that selects adaptive α.
ADAPTIVE = "adaptive"
DEFAULT_RULES = "default"
#: The largest ``MARCONI_VLLM_ADAPTIVE_LAG``: a lag past every trace's length (the project's count
#: bound, ``marconi.options.MAX_COUNT``) would never switch the rule, and keeps one entry per request.
MAX_ADAPTIVE_LAG = MAX_COUNT
#: Every ``MARCONI_VLLM_*`` name this project reads: the plugin's (``ENV_*`` here), the recording's
#: (``marconi.integrations.vllm.record``), and ``MARCONI_VLLM_PYTHON`` (the test suite's vLLM
#: interpreter, which ``make test`` exports into every server it starts). Any other
#: ``MARCONI_VLLM_*`` variable is a typo (:func:`unknown_variables`).
KNOWN_VARIABLES = (ENV_POLICY, ENV_ALPHA, ENV_ADAPTIVE_RULES, ENV_ADAPTIVE_LAG, ENV_ADAPTIVE_REPLAY, ENV_ALPHA_SOURCE,
                   ENV_EFFICIENCY, ENV_TRACE, ENV_MAMBA2_CPU_FIX, ENV_RETENTION, ENV_RETENTION_BUDGET,
                   "MARCONI_VLLM_RECORD", "MARCONI_VLLM_RECORD_MAX_BYTES", "MARCONI_VLLM_PYTHON")
_PREFIX = "MARCONI_VLLM"


def unknown_variables(env: Mapping[str, str]) -> list[str]:
    """One message per variable of ``env`` whose name starts ``MARCONI_VLLM`` (any case) that is
    not in :data:`KNOWN_VARIABLES`, naming it, the closest known name, and the known names; sorted.
    Such a variable is never read: ``MARCONI_VLLM_POLIC=marconi`` would otherwise run stock vLLM,
    and ``MARCONI_VLLM_ALPA=2`` the default α, without a word."""
    out = []
    for name in sorted(n for n in env if n.upper().startswith(_PREFIX) and n not in KNOWN_VARIABLES):
        hint = did_you_mean(name.upper(), KNOWN_VARIABLES)
        out.append(f"{name}: no such variable{hint}: rename or unset it (the plugin reads "
                   f"{', '.join(KNOWN_VARIABLES[:-1])})")
    return out


def default_replay(lag: int) -> str:
    """Where an unset ``MARCONI_VLLM_ADAPTIVE_REPLAY`` replays: ``process`` with a lag, and at lag 0
    wherever this process may run on two CPUs or more (its affinity: an engine core pinned to one
    CPU would share it with the child); else ``inline``. The rules are the same either way; the
    process takes the replay (~170 µs a request on the scheduler thread, docs/vllm-at-scale.md) off
    the scheduler thread, which keeps ~50 µs to send the request."""
    if lag:
        return "process"
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):        # no affinity on this platform: count the machine's CPUs
        cpus = os.cpu_count() or 1
    return "process" if cpus >= 2 else "inline"


def parse_alpha(raw: Any, where: str = ENV_ALPHA) -> float | str:
    """α as configured: a finite number >= 0, or ``"adaptive"``. ``where`` names the setting in errors."""
    if isinstance(raw, str):
        text = raw.strip().lower()
        if text == ADAPTIVE:
            return ADAPTIVE
        try:
            raw = float(text)
        except ValueError:
            raise ConfigError(f"{where}={raw!r}: write a number >= 0 or {ADAPTIVE}") from None
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw) or raw < 0:
        raise ConfigError(f"{where}={raw!r}: alpha must be a finite number >= 0 or {ADAPTIVE}")
    return float(raw)


def _check_factory_name(text: str, where: str) -> tuple[str, str]:
    module_name, sep, attr = text.partition(":")
    if not sep or not module_name.strip() or not attr.strip():
        raise ConfigError(f"{where}={text!r}: write module:factory (a module to import, a callable in it)")
    return module_name.strip(), attr.strip()


def load_alpha_factory(text: str, where: str = ENV_ALPHA_SOURCE) -> Callable[..., AlphaSource]:
    """The callable that ``module:factory`` names (importing ``module`` runs its code).

    Raises:
        ConfigError: not ``module:factory``, the module fails to import (whatever it raised), it has
            no such attribute, or the attribute is not callable.
    """
    module_name, attr = _check_factory_name(text, where)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module: any error on import is this setting's
        raise ConfigError(f"{where}={text!r}: cannot load it ({type(exc).__name__}: {exc})") from exc
    try:
        factory = getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"{where}={text!r}: cannot load it (module {module_name} has no {attr!r})") from None
    if not callable(factory):
        raise ConfigError(f"{where}={text!r}: {attr} is not callable (its type is {type(factory).__name__}); "
                          "name a function or class, called as factory(spec, config)")
    return factory


def _policy_from_env(env: Mapping[str, str]) -> str | None:
    return env.get(ENV_POLICY, "").strip().lower() or None


def _retention_from_env(env: Mapping[str, str]) -> tuple[str | None, int | None]:
    retention = env.get(ENV_RETENTION, "").strip().lower() or None
    raw = env.get(ENV_RETENTION_BUDGET, "").strip()
    if not raw:
        return retention, None
    try:
        return retention, CHECKPOINT_BUDGET.parse(raw)
    except ConfigError as exc:
        raise ConfigError(f"{ENV_RETENTION_BUDGET}={raw!r}: {exc}") from None


def _mamba2_cpu_fix_from_env(env: Mapping[str, str]) -> bool:
    fix = env.get(ENV_MAMBA2_CPU_FIX, "").strip().lower() or "auto"    # empty: unset, as every variable
    if fix not in ("auto", "off"):
        raise ConfigError(f"{ENV_MAMBA2_CPU_FIX}={fix!r}: choose auto or off")
    return fix == "auto"


@dataclass(frozen=True, slots=True)
class PluginConfig:
    """What the plugin does in this process. ``policy=None``: nothing (stock vLLM).

    ``alpha`` is a number or ``"adaptive"`` (then ``adaptive_rules`` is the family and the rules
    choose the efficiency; ``efficiency`` stays at its default). ``retention``: ``None`` (vLLM's
    own) or ``"sparse-dp"``, placing ``retention_budget`` boundaries per sequence (``None``: the
    default, 2). ``adaptive_replay``: one of :data:`REPLAYS`, or None (:func:`default_replay`)."""

    policy: str | None = None
    alpha: float | str = DEFAULT_ALPHA
    alpha_source: str | None = None
    efficiency: str = "total"
    trace_path: str | None = None
    mamba2_cpu_fix: bool = True
    adaptive_rules: str = DEFAULT_RULES
    adaptive_lag: int = 0
    adaptive_replay: str | None = None
    retention: str | None = None
    retention_budget: int | None = None

    def __post_init__(self) -> None:
        self._check_retention()
        if self.policy is not None and self.policy not in POLICIES:
            raise ConfigError(f"{ENV_POLICY}={self.policy!r}: choose one of {', '.join(POLICIES)} (or leave it "
                              "unset for stock vLLM)")
        object.__setattr__(self, "alpha", parse_alpha(self.alpha))
        if self.efficiency not in EFFICIENCIES:
            raise ConfigError(f"{ENV_EFFICIENCY}={self.efficiency!r}: choose one of {', '.join(EFFICIENCIES)}")
        if self.alpha_source is not None:
            _check_factory_name(self.alpha_source, ENV_ALPHA_SOURCE)
        if self.adaptive:
            if self.policy != "marconi":       # else it would silently serve stock eviction
                raise ConfigError(f"{ENV_ALPHA}={ADAPTIVE} picks Marconi's eviction rule online: set "
                                  f"{ENV_POLICY}=marconi (it is {self.policy or 'unset'})")
            if self.alpha_source is not None:
                raise ConfigError(f"{ENV_ALPHA}={ADAPTIVE} and {ENV_ALPHA_SOURCE}={self.alpha_source!r} both name "
                                  "the alpha source: keep one")
            if self.efficiency != "total":
                raise ConfigError(f"{ENV_ALPHA}={ADAPTIVE}: its rules choose the efficiency (lru/a0.5m/a2m: "
                                  f"marginal); unset {ENV_EFFICIENCY}")
            try:
                PoolShadowAlpha(self.adaptive_rules)     # every rule must map onto the block policy
            except ConfigError as exc:                   # at config read time, naming the variable
                raise ConfigError(f"{ENV_ADAPTIVE_RULES}={self.adaptive_rules!r}: {exc}") from None
        elif self.adaptive_rules != DEFAULT_RULES:
            raise ConfigError(f"{ENV_ADAPTIVE_RULES}={self.adaptive_rules!r} needs {ENV_ALPHA}={ADAPTIVE}")
        if (isinstance(self.adaptive_lag, bool) or not isinstance(self.adaptive_lag, int)
                or not 0 <= self.adaptive_lag <= MAX_ADAPTIVE_LAG):
            raise ConfigError(f"{ENV_ADAPTIVE_LAG}={self.adaptive_lag!r}: write a whole number of requests >= 0 "
                              f"and <= {MAX_ADAPTIVE_LAG:,}")
        if self.adaptive_lag and not self.adaptive:
            raise ConfigError(f"{ENV_ADAPTIVE_LAG}={self.adaptive_lag!r} needs {ENV_ALPHA}={ADAPTIVE}")
        if self.adaptive_replay is not None:
            if self.adaptive_replay not in REPLAYS:
                raise ConfigError(f"{ENV_ADAPTIVE_REPLAY}={self.adaptive_replay!r}: choose one of {', '.join(REPLAYS)} "
                                  "(or leave it unset)")
            if not self.adaptive:
                raise ConfigError(f"{ENV_ADAPTIVE_REPLAY}={self.adaptive_replay!r} needs {ENV_ALPHA}={ADAPTIVE}")
            if self.adaptive_replay == "inline" and self.adaptive_lag:
                raise ConfigError(f"{ENV_ADAPTIVE_REPLAY}=inline with {ENV_ADAPTIVE_LAG}={self.adaptive_lag}: a lag "
                                  f"replays in a process; unset {ENV_ADAPTIVE_REPLAY} or set the lag to 0")

    def _check_retention(self) -> None:
        if self.retention is None:
            if self.retention_budget is not None:
                raise ConfigError(f"{ENV_RETENTION_BUDGET}={self.retention_budget!r} needs {ENV_RETENTION}={SPARSE_DP}")
            return
        if self.retention != SPARSE_DP:
            raise ConfigError(f"{ENV_RETENTION}={self.retention!r}: choose {SPARSE_DP} (or leave it unset for vLLM's "
                              "own retention)")
        budget = self.retention_budget
        if isinstance(budget, bool) or budget is not None and (not isinstance(budget, int)
                                                              or not CHECKPOINT_BUDGET.admits(budget)):
            raise ConfigError(f"{ENV_RETENTION_BUDGET}={budget!r}: write {CHECKPOINT_BUDGET.describe()}")
        if self.policy is None:          # the plugin installs nothing without a policy
            raise ConfigError(f"{ENV_RETENTION}={SPARSE_DP} needs {ENV_POLICY} (lru keeps vLLM's own eviction)")

    @property
    def budget(self) -> int:
        """Boundaries placed per sequence under ``sparse-dp``."""
        return DEFAULT_BUDGET if self.retention_budget is None else self.retention_budget

    @property
    def adaptive(self) -> bool:
        return self.alpha == ADAPTIVE

    @property
    def replay(self) -> str | None:
        """Where adaptive α's shadow replays: ``adaptive_replay``, or :func:`default_replay` where it
        is unset; None without adaptive α."""
        if not self.adaptive:
            return None
        return self.adaptive_replay or default_replay(self.adaptive_lag)

    @property
    def replays_in_background(self) -> bool:
        """Whether adaptive α's shadow replays in a child process (:attr:`replay` is ``process``)."""
        return self.replay == "process"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "PluginConfig":
        """The configuration the environment (default ``os.environ``) gives; ConfigError naming the
        variable and its value for anything wrong, and, with ``MARCONI_VLLM_POLICY`` set, naming any
        ``MARCONI_VLLM_*`` variable no part of the plugin reads (:func:`unknown_variables`: a typo
        must not leave a setting at its default), or ``MARCONI_VLLM_RECORD_MAX_BYTES`` set without
        ``MARCONI_VLLM_RECORD`` (a cap on no recording)."""
        env = os.environ if env is None else env
        policy = _policy_from_env(env)
        unknown = unknown_variables(env)
        if unknown and policy is not None:
            raise ConfigError(unknown[0])
        if env.get("MARCONI_VLLM_RECORD_MAX_BYTES", "").strip() and not env.get("MARCONI_VLLM_RECORD", "").strip():
            raise ConfigError(f"MARCONI_VLLM_RECORD_MAX_BYTES={env['MARCONI_VLLM_RECORD_MAX_BYTES']!r} needs "
                              "MARCONI_VLLM_RECORD (a path to record to); unset it or set both")
        raw_alpha = env.get(ENV_ALPHA, "").strip()
        alpha = parse_alpha(raw_alpha) if raw_alpha else DEFAULT_ALPHA
        fix = _mamba2_cpu_fix_from_env(env)
        efficiency = env.get(ENV_EFFICIENCY, "").strip().lower()
        if alpha == ADAPTIVE and efficiency:
            raise ConfigError(f"{ENV_ALPHA}={ADAPTIVE}: its rules choose the efficiency (lru/a0.5m/a2m: marginal); "
                              f"unset {ENV_EFFICIENCY}={efficiency!r}")
        retention, budget = _retention_from_env(env)
        raw_lag = env.get(ENV_ADAPTIVE_LAG, "").strip()
        try:
            lag = int(raw_lag) if raw_lag else 0
        except ValueError:
            raise ConfigError(f"{ENV_ADAPTIVE_LAG}={raw_lag!r}: write a whole number of requests >= 0 "
                              f"and <= {MAX_ADAPTIVE_LAG:,}") from None
        replay = env.get(ENV_ADAPTIVE_REPLAY, "").strip().lower() or None
        return cls(policy=policy, alpha=alpha, alpha_source=env.get(ENV_ALPHA_SOURCE, "").strip() or None,
                   efficiency=efficiency or "total", trace_path=env.get(ENV_TRACE, "").strip() or None,
                   mamba2_cpu_fix=fix,
                   adaptive_rules=env.get(ENV_ADAPTIVE_RULES, "").strip() or DEFAULT_RULES,
                   adaptive_lag=lag, adaptive_replay=replay, retention=retention, retention_budget=budget)

    @classmethod
    def lenient_from_env(cls, env: Mapping[str, str] | None = None) -> tuple["PluginConfig", list[str]]:
        """:meth:`from_env`, except that with ``MARCONI_VLLM_POLICY`` unset it never raises: it
        returns the configuration and the problems it ignored (each a :meth:`from_env` message, and
        one per :func:`unknown_variables` name, so that ``MARCONI_VLLM_POLIC=marconi`` is named in
        the log rather than running stock vLLM without a word), a wrong
        ``MARCONI_VLLM_MAMBA2_CPU_FIX`` keeping ``auto``. Stock vLLM must never be stopped.

        Raises:
            ConfigError: a policy is set and :meth:`from_env` refuses the environment.
        """
        env = os.environ if env is None else env
        try:
            return cls.from_env(env), unknown_variables(env)
        except ConfigError as exc:
            if _policy_from_env(env) is not None:
                raise
            problems = [str(exc)]
            problems += unknown_variables(env)
        try:
            fix = _mamba2_cpu_fix_from_env(env)
        except ConfigError as exc:
            fix = True
            if str(exc) not in problems:
                problems.append(str(exc))
        return cls(mamba2_cpu_fix=fix), problems

    def check_runnable(self) -> None:
        """Check what :meth:`from_env` cannot: the trace can be appended to (created if missing) and
        the α source's factory loads (its module's code runs). Called at registration.

        Raises:
            ConfigError: naming the variable and its value.
        """
        if self.trace_path is not None:
            self.open_trace().close()
        if self.alpha_source is not None:
            load_alpha_factory(self.alpha_source)

    def open_trace(self) -> TextIO:
        """The block trace, opened for appending, line-buffered (ConfigError naming ``MARCONI_VLLM_TRACE``)."""
        if self.trace_path is None:
            raise ConfigError(f"{ENV_TRACE} is unset: there is no trace to open")
        try:
            return open(self.trace_path, "a", buffering=1)
        except OSError as exc:
            raise ConfigError(f"{ENV_TRACE}={self.trace_path!r}: cannot append to it ({exc.strerror or exc}); "
                              f"fix the path or unset {ENV_TRACE} (eviction does not need the trace)") from None

    def to_env(self) -> dict[str, str]:
        """The environment that reproduces this configuration (for launching a server)."""
        env = {ENV_POLICY: self.policy or "", ENV_ALPHA: str(self.alpha) if self.adaptive else repr(self.alpha),
               ENV_MAMBA2_CPU_FIX: "auto" if self.mamba2_cpu_fix else "off"}
        if self.adaptive:
            env[ENV_ADAPTIVE_RULES] = self.adaptive_rules
            if self.adaptive_lag:
                env[ENV_ADAPTIVE_LAG] = str(self.adaptive_lag)
            if self.adaptive_replay:
                env[ENV_ADAPTIVE_REPLAY] = self.adaptive_replay
        else:
            env[ENV_EFFICIENCY] = self.efficiency
        if self.alpha_source:
            env[ENV_ALPHA_SOURCE] = self.alpha_source
        if self.trace_path:
            env[ENV_TRACE] = self.trace_path
        if self.retention:
            env[ENV_RETENTION] = self.retention
            env[ENV_RETENTION_BUDGET] = str(self.budget)
        return env

    def make_alpha_source(self, spec: Any, where: str = ENV_ALPHA_SOURCE) -> AlphaSource:
        """A fresh α source as configured (sources keep state: one per pool): ``factory(spec, config)``
        if given (it runs arbitrary code), the shadow α source (``adaptive``), or a fixed α.

        Raises:
            ConfigError: the factory cannot be loaded, raises (whatever it raised, chained), or
                returns something that is not an α source; ``where`` names the setting (the
                simulator passes ``vllm-align: alpha_source``).
        """
        if self.adaptive:
            return PoolShadowAlpha(self.adaptive_rules, lag=self.adaptive_lag)
        if self.alpha_source is None:
            assert isinstance(self.alpha, float)
            return FixedAlpha(self.alpha)
        factory = load_alpha_factory(self.alpha_source, where)
        name = self.alpha_source.partition(":")[2].strip()
        try:
            source = factory(spec, self)
        except Exception as exc:  # the user's code: its failure is this setting's, said as such
            raise ConfigError(f"{where}={self.alpha_source!r}: {name}(spec, config) raised "
                              f"{type(exc).__name__}: {exc}") from exc
        missing = [m for m in ("alpha", "efficiency", "observe") if not callable(getattr(source, m, None))]
        if missing:
            raise ConfigError(f"{where}={self.alpha_source!r} returned {source!r}, which lacks "
                              f"{', '.join(missing)} (an alpha source has alpha(), efficiency() and observe(event))")
        return source
