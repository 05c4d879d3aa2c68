"""The shadow α source: Marconi's regret chooser, run on a size-only shadow of an engine's cache.

``marconi:chooser=regret`` (:class:`marconi.choosers.regret.RegretEviction`) keeps re-choosing its
eviction rule among a family (by default ``lru / a0.5m / a2m``: SGLang+'s LRU; recency + 0.5 or 2 ×
the *marginal* FLOP efficiency) by counterfactual eviction regret. :class:`ShadowAlpha` brings that
choice into an engine's own eviction, which ranks its blocks by ``recency + α · efficiency``:

* a size-only shadow :class:`~marconi.core.cache.PrefixCache` — Marconi admission, the regret
  chooser's eviction, the served model's :class:`~marconi.core.model.ModelSpec`, the capacity the
  engine's pool holds (the engine computes it: :meth:`ShadowAlpha.start`) — is fed every finished
  request's prompt and output token ids, in finish order;
* its live rule is translated into the engine's terms by ``rule_map`` (an ``EvictionRule`` ->
  ``(alpha, efficiency)``; vLLM's: :func:`marconi.integrations.vllm.policy.block_rule`), which
  rejects the rules the engine's eviction cannot express.

Why a shadow and not the chooser re-implemented over an engine's blocks: the shadow runs the
chooser that the project tests and measures (docs/adaptive.md), unchanged, through its public API;
it needs only the token ids, which an engine's scheduler and its emulation both have at a request's
end, so the emulation reproduces the live engine's choices exactly; and it costs one size-only
replay of each request. What it gives up: the regret is measured on a radix cache of the same
bytes, not on the engine's blocks (vLLM keeps states only at block boundaries, pads each state
layer to a block, and its candidates differ), so the rule that wins the shadow is a proxy for the
rule that would win the pool. docs/vllm.md measures how good a proxy it is for vLLM.

(The simulator's default ``marconi`` chooses among the same rules by exact worlds,
:mod:`marconi.choosers.worlds`; here that would mean one shadow replay per rule per request
instead of one, and the live-server validation was done for the regret chooser.)

Deterministic: the same finished requests in the same order give the same rules. Engine-agnostic:
nothing here knows a block, a pool or an engine.

**Lag** (``lag=L``, default 0). The replay costs the engine's scheduler thread a few hundred µs per
finished request (docs/vllm-at-scale.md, "What the plugin costs the scheduler"). With ``L >= 1`` the
rule in force after the n-th finished request is the shadow's rule after request ``n - L`` (the
family's first while ``n <= L``): a switch takes effect ``L`` requests later than it would at lag 0,
and nothing else changes. That is deterministic, so an engine may replay on a worker thread
(:meth:`ShadowAlpha.run_in_background`) and its emulation inline, and both apply the same rules at
the same requests; the scheduler thread only queues the request and waits on the worker only when
it is more than ``L`` requests behind. The worker is a child process
(:class:`~marconi.integrations.common.shadow_process.ShadowProcess`: the replay leaves the GIL too,
and the scheduler thread pays only for serialising the token ids), or a thread where no process can
be started.

**Lag 0 in the background** (``run_in_background`` at lag 0). The rule in force after the n-th
finished request is the shadow's after request n, as inline; but nothing reads it until the engine
next evicts. So :meth:`observe` only sends the request, and the next read of the rule (``alpha()``,
``efficiency()``, ``rule``, ``rule_version``) waits for the worker's answers to every request sent
(:attr:`ShadowAlpha.settles_lazily`). The choices are the inline replay's, exactly; the replay runs
beside the scheduler's own work between a finish and the next eviction, and the scheduler thread
waits (without CPU) only for what is left of it then.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any, Callable, Sequence

from marconi.core.cache import PrefixCache
from marconi.core.eviction import EvictionRule
from marconi.core.model import ModelSpec
from marconi.core.registry import ConfigError
from marconi.integrations.common.alpha import RequestObservation
from marconi.integrations.common.prefix_delta import PrefixTokens
from marconi.choosers.family import parse_rules
from marconi.choosers.regret import RegretEviction

logger = logging.getLogger(__name__)

__all__ = ["ShadowAlpha", "RuleMap"]

#: An engine's translation of a simulator rule into its eviction's ``(alpha, efficiency)``
#: (efficiency None: the engine's configured variant); raises ConfigError for rules it cannot apply.
RuleMap = Callable[[EvictionRule], tuple[float, str | None]]


class ShadowAlpha:
    """An :class:`~marconi.integrations.common.alpha.AlphaSource` and rule chooser following the
    regret chooser's live rule on a size-only shadow cache.

    Until :meth:`start` builds the shadow (and until the first request finishes) it answers with
    the family's first rule. :meth:`observe` replays a finished request through the shadow.

    Args:
        rules: the family, as ``marconi:rules=`` (``"default"`` = ``lru/a0.5m/a2m``).
        rule_map: the engine's translation of a rule (every rule of the family is checked now).
        decay, hysteresis: the regret chooser's (see :class:`marconi.choosers.regret.RegretEviction`).
        tokens: how an in-process replay (inline, or on a thread) turns an engine's token lists into
            arrays, converting only what it has not seen where the engine names its prefixes
            (default: a new :class:`~marconi.integrations.common.prefix_delta.PrefixTokens`).

    Raises:
        ConfigError: an unknown rule, a rule that cuts dead tails (``a0.5mt``: neither the regret
            chooser nor an engine's ranking can follow it), one ``rule_map`` rejects, or a ``decay``
            or ``hysteresis`` the regret chooser would refuse (checked here, not when a pool binds).
    """

    #: In the background at lag 0, the most observed requests left unread before :meth:`observe`
    #: reads their rules itself: an engine that does not evict for a long time must still take the
    #: child's answers, or their pipe fills, the child stops reading, and then the engine's writes stop.
    max_unsettled = 1024

    def __init__(self, rules: str | Sequence[EvictionRule] = "default", *, rule_map: RuleMap,
                 decay: float = 0.999, hysteresis: float = 0.05, lag: int = 0,
                 tokens: PrefixTokens | None = None) -> None:
        if isinstance(lag, bool) or not isinstance(lag, int) or lag < 0:
            raise ConfigError(f"shadow alpha: lag must be a whole number of requests >= 0, got {lag!r}")
        self.rules = parse_rules(rules)
        cutting = [r.label() for r in self.rules if r.tails]
        if cutting:        # refused here, when the setting is read, not when a pool binds (issue 31)
            raise ConfigError(f"rules {', '.join(cutting)} cut dead tails, which this adaptive alpha cannot follow: its "
                              "regret chooser scores victims, not cuts, and an engine's eviction only ranks blocks; "
                              "use lru, aX and aXm rules (e.g. lru/a0.5m/a2m)")
        self._mapped = [rule_map(r) for r in self.rules]    # validates every rule
        RegretEviction.check_scoring(decay, hysteresis)     # here, not first when a pool binds
        self.decay = decay
        self.hysteresis = hysteresis
        self.cache: PrefixCache | None = None
        self.chooser: RegretEviction | None = None    # the regret chooser running in the shadow
        self.num_observed = 0
        self._version = 0                # moves with each switch of the rule in force (rule_version)
        self.lag = lag
        self._live = 0                   # with a lag: the index of the rule in force
        # With a lag: the shadow's rule index after each replayed request, from request number
        # _first_kept on (entries older than the rule in force are dropped as it advances).
        self._rule_after: deque[int] = deque([0])
        self._first_kept = 0
        self._worker: Any = None        # a ShadowProcess or a _ShadowWorker (thread), once in the background
        self._started_with: tuple[ModelSpec, float] | None = None
        self._failed: RuntimeError | None = None    # lag 0 in the background: the replay's failure
        self._delta = tokens if tokens is not None else PrefixTokens()

    def start(self, spec: ModelSpec, capacity_bytes: float) -> None:
        """Build the shadow: ``spec``'s model, ``capacity_bytes`` (what the engine's pool holds).

        Raises:
            ConfigError: already started (a source serves one pool: build one per pool), or no
                cache of that capacity can be built (the message says why).
        """
        if self.cache is not None:
            raise ConfigError("a shadow alpha source serves one pool; build one per pool")
        chooser = RegretEviction(self.rules, decay=self.decay, hysteresis=self.hysteresis)
        self.cache = PrefixCache(spec, capacity_bytes, "marconi", chooser)
        self.chooser = chooser
        self._started_with = (spec, capacity_bytes)

    @property
    def started(self) -> bool:
        return self.cache is not None

    @property
    def rule(self) -> EvictionRule:
        """The rule in force (the family's first before any request; with a lag, the shadow's rule
        ``lag`` requests ago)."""
        return self.rules[self._current()]

    def alpha(self) -> float:
        return self._mapped[self._current()][0]

    def efficiency(self) -> str | None:
        return self._mapped[self._current()][1]

    @property
    def rule_version(self) -> int:
        """Moves with each switch of the rule in force (the AlphaSource's optional attribute); when
        the source :attr:`settles_lazily`, reading it first waits for the replay's answers."""
        if self.settles_lazily:
            self._settle()
        return self._version

    @property
    def settles_lazily(self) -> bool:
        """Whether the rule is read back from the background replay only when asked (lag 0 in the
        background): then :meth:`observe` returns None and the next read of the rule waits."""
        return self._worker is not None and not self.lag

    @property
    def unsettled(self) -> int:
        """Observed requests whose rule has not been read back yet: nonzero only when the source
        :attr:`settles_lazily`, between an :meth:`observe` and the next read of the rule."""
        return self.num_observed - self._first_kept if self.settles_lazily else 0

    def _current(self) -> int:
        if self.lag:
            return self._live
        if self._worker is not None:          # lag 0 in the background (settles_lazily)
            self._settle()
            return self._live
        return 0 if self.chooser is None else self.chooser.current

    def _settle(self) -> None:
        """In the background at lag 0: wait for the rule after every observed request and make it the
        rule in force, the inline replay's exactly. If the replay has failed the rule in force stays
        and nothing is raised here: an engine reads the rule inside its eviction, which must not
        fail; :meth:`observe` raises it (RuntimeError)."""
        due = self.num_observed
        if self._first_kept >= due or self._failed is not None:
            return
        try:
            self._worker.wait_for(due + 1 - self._first_kept)
        except RuntimeError as exc:
            self._failed = exc
            return
        before = self._live
        self._advance(due)
        if self._live != before:
            self._version += 1

    def _advance(self, due: int) -> None:
        """Put in force the shadow's rule after request ``due`` (already replayed), dropping the older."""
        rules = self._rule_after
        while self._first_kept < due:
            rules.popleft()
            self._first_kept += 1
        self._live = rules[0]

    def observe(self, event: RequestObservation) -> EvictionRule | None:
        """Replay the finished request through the shadow (Marconi admission and eviction); its
        regret chooser charges the rules and may switch the live one. Returns the rule in force from
        now if it changed, else None (the rule chooser's contract; always None when the source
        :attr:`settles_lazily`: the change is known when the rule is next read). ConfigError before
        :meth:`start`; RuntimeError if a background replay failed."""
        if self.settles_lazily:                 # the rule is read (and a switch known) when next asked
            self._observe(event)
            return None
        before = self._current()
        self._observe(event)
        after = self._current()
        if after == before:
            return None
        self._version += 1
        return self.rules[after]

    def _observe(self, event: RequestObservation) -> None:
        if self.cache is None:
            raise ConfigError("shadow alpha: observe before start (the engine builds the shadow for its pool)")
        if not self.lag and self._worker is None:
            self.cache.process(*self._tokens(event))
            self.num_observed += 1
            return
        if self.settles_lazily:
            if self._failed is None:
                self.num_observed += 1
                try:
                    self._worker.submit(event)
                except RuntimeError as exc:
                    self._failed = exc
                if self.num_observed - self._first_kept >= self.max_unsettled:
                    self._settle()      # read the answers before the child's pipe to us fills and stops it
            if self._failed is not None:        # every observe from now says so; the rule in force stays
                raise RuntimeError(str(self._failed)) from self._failed
            return
        self.num_observed += 1
        if self._worker is not None:
            self._worker.submit(event)
        else:
            self._replay(event)
        due = self.num_observed - self.lag        # the rule in force from now: the shadow's after `due` requests
        if due > 0:
            if self._worker is not None:
                self._worker.wait_for(due + 1 - self._first_kept)
            self._advance(due)

    def _replay(self, event: RequestObservation) -> None:
        """One request through the shadow (the worker thread's, in the background), and the rule after it."""
        assert self.cache is not None and self.chooser is not None
        self.cache.process(*self._tokens(event))
        self._rule_after.append(self.chooser.current)

    def _tokens(self, event: RequestObservation) -> tuple[Any, Any]:
        """The request's prompt and output for an in-process replay: with prefix keys, only the tokens
        past the deepest prefix seen are converted from the engine's lists (the same tokens: see
        :class:`~marconi.integrations.common.prefix_delta.PrefixTokens`)."""
        return self._delta.arrays(event.prompt_token_ids, event.output_token_ids, event.prefix_keys, event.key_tokens)

    def run_in_background(self, *, process: bool = True) -> None:
        """Replay in the background from now on (same rules, see the module docstring): in a child
        process (``process=True``; where none can start, logged, on a thread with a lag and inline at
        lag 0), or on a thread. With a lag the scheduler thread queues each request and waits only
        when the worker is more than ``lag`` requests behind; at lag 0 it waits when it next reads
        the rule (:attr:`settles_lazily`). A worker's failure is raised by the next :meth:`observe`
        or read of the rule (RuntimeError).

        Raises:
            ConfigError: not started, or requests already observed (the worker's shadow starts empty).
        """
        if self.cache is None or self._started_with is None:
            raise ConfigError("shadow alpha: run_in_background before start")
        if self._worker is not None:
            return
        if self.num_observed and (process or not self.lag):
            raise ConfigError("shadow alpha: move the replay to the background before the first request, not after")
        if process:
            from marconi.integrations.common.shadow_process import ShadowProcess

            try:
                # requests go to the child in batches of up to lag / 2: fewer wake-ups, and the child
                # still has half the lag to replay a batch before its rules are due
                # at lag 0 the scheduler thread waits for every answer anyway: it reads them itself
                # when it settles, and no reader thread takes the GIL from it in between
                self._worker = ShadowProcess(self.rules, self.decay, self.hysteresis, *self._started_with,
                                             self._rule_after, batch=max(1, self.lag // 2),
                                             reader_thread=bool(self.lag))
                return
            except (OSError, RuntimeError) as exc:     # no process, or a child that failed to build its shadow
                if not self.lag:    # a thread would only share the GIL, and each read would wait for it
                    logger.warning("marconi: the shadow's replay process cannot start (%s); replaying inline", exc)
                    return
                logger.warning("marconi: the shadow's replay process cannot start (%s); replaying on a thread", exc)
        self._worker = _ShadowWorker(self._replay, self._rule_after)

    def drain(self) -> None:
        """Wait until the worker has replayed every observed request (a no-op without one)."""
        if self._worker is not None:
            self._worker.wait_for(self.num_observed + 1 - self._first_kept)

    def tuning_record(self) -> dict[str, Any]:
        """The regret chooser's record: every switch of the live rule, ``rule_switches`` =
        ``[[request index (0-based, finish order), label], ...]``."""
        self.drain()
        if isinstance(self._worker, _ShadowWorker) or self._worker is None:
            return {"rule_switches": []} if self.chooser is None else self.chooser.tuning_record()
        return self._worker.tuning_record()

    @property
    def replay_pid(self) -> int | None:
        """The background replay process's id (None inline or on a thread): for an operator's logs."""
        return None if self._worker is None or isinstance(self._worker, _ShadowWorker) else self._worker.pid

    def close(self) -> None:
        """End a background replay process (a no-op otherwise; it also ends with this source)."""
        if self._worker is not None and not isinstance(self._worker, _ShadowWorker):
            self._worker.close()

    def __repr__(self) -> str:
        family = "/".join(r.label() for r in self.rules)
        lag = f", lag={self.lag}" if self.lag else ""
        pid = self.replay_pid
        where = "" if self._worker is None else f", replays in process {pid}" if pid else ", replays on a thread"
        return (f"{type(self).__name__}({family}, live={self.rule.label()}, decay={self.decay:g}, "
                f"hysteresis={self.hysteresis:g}{lag}{where})")


class _ShadowWorker:
    """A daemon thread replaying queued requests through ``replay`` (which appends to ``rules``)."""

    def __init__(self, replay: Callable[[RequestObservation], None], rules: deque[int]) -> None:
        self._replay = replay
        self._rules = rules
        self._queue: deque[RequestObservation] = deque()
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="marconi-shadow-alpha", daemon=True)
        self._thread.start()

    def submit(self, event: RequestObservation) -> None:
        with self._cond:
            self._queue.append(event)
            self._cond.notify_all()

    def wait_for(self, num_rules: int) -> None:
        """Block until ``rules`` holds ``num_rules`` entries; re-raise the worker's failure."""
        with self._cond:
            while len(self._rules) < num_rules and self._error is None:
                self._cond.wait()
            if self._error is not None:
                raise RuntimeError("shadow alpha: the background replay failed") from self._error

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                event = self._queue.popleft()
            try:
                self._replay(event)
            except BaseException as exc:   # reported to the scheduler thread by its next wait
                with self._cond:
                    self._error = exc
                    self._cond.notify_all()
                return
            with self._cond:
                self._cond.notify_all()
