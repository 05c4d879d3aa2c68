"""Where an engine's eviction gets α: the α-source contract, a fixed α, and what a source observes.

An engine integration ranks its cached blocks (or nodes) by Marconi's utility, ``recency + α ·
FLOP efficiency``; α, and which efficiency variant, come from an :class:`AlphaSource` read at
every eviction. A source sees each finished request (:class:`RequestObservation`) through the
same hook in a live engine and in its emulation, so both make the same choices. Nothing here
knows an engine: the vLLM plugin and its emulation use it, and so will the next integration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import numpy as np

from marconi.core.eviction import EvictionRule, Rule
from marconi.core.registry import ConfigError

__all__ = ["AlphaSource", "FixedAlpha", "FixedRule", "RequestObservation"]


@dataclass(frozen=True, slots=True, eq=False)
class RequestObservation:
    """One finished request as the cache served it: what an α source may learn from.

    Built when the request's blocks are freed (vLLM's ``Scheduler._free_request``; the emulation's
    ``complete``), so the outputs are complete. Token ids are the request's own sequences (lists in
    vLLM, arrays in the emulation); a source must not keep them beyond ``observe``.
    """

    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    hit_len: int            # tokens reused (vLLM's num_cached_tokens)
    kv_only_len: int        # tokens whose KVs were cached beyond the hit, without a state to resume from
    # Optional, where the engine has them for free: chained prefix keys, ``prefix_keys[i]`` naming the
    # first ``(i + 1) * key_tokens`` tokens of prompt + output (vLLM's block hashes). Two equal keys
    # must name equal tokens. A source may use them to avoid re-reading tokens it has seen (the
    # shadow's replay process: only the tokens past the deepest known key cross the pipe).
    prefix_keys: Sequence[Any] = ()
    key_tokens: int = 0

    @property
    def input_len(self) -> int:
        return len(self.prompt_token_ids)


class AlphaSource(Protocol):
    """Where α (and the efficiency variant) come from, read at every eviction; ``observe`` sees
    every finished request. An adaptive source is a rule chooser
    (:class:`~marconi.core.chooser.RuleChooser` fed :class:`RequestObservation` s): ``observe``
    returns the new rule when its choice changes (else None), and it reports ``tuning_record()``.

    ``efficiency()`` returns ``"total"``, ``"marginal"`` or None (the pool's configured variant).
    A fixed α ignores the observations; an adaptive source updates from them. Implementations must
    be cheap and deterministic: they run on the engine's scheduler thread, and an emulation
    reproduces their choices only if the same observations give the same answers. A source that
    needs the pool (its size, the model) may define ``bind(state)``, called once by the eviction
    state it serves (vLLM: :class:`~marconi.integrations.vllm.policy.BlockEvictionState`). A source
    may also name its live rule whole (a ``rule`` attribute or property: any
    :class:`~marconi.core.eviction.Rule`): an engine then applies that rule exactly, by its fast path
    when the path serves it (and ``alpha()``/``efficiency()`` are the rule's), else by its generic path.
    A source may also keep ``rule_version``, an int that changes whenever ``alpha()``,
    ``efficiency()`` or ``rule`` could answer differently: an engine then reads them only when it
    changes (vLLM's eviction does, once per allocation; a source without it is read every time).
    """

    def alpha(self) -> float:
        ...

    def efficiency(self) -> str | None:
        ...

    def observe(self, event: RequestObservation) -> Any:
        """Learn from one finished request; an adaptive source returns its new rule on a switch."""
        ...


class FixedAlpha:
    """α fixed by configuration (the efficiency is the pool's). ``value`` may be set (a bench turns
    one pool's α between phases); each set moves ``rule_version``."""

    def __init__(self, value: float) -> None:
        self.rule_version = 0
        self.value = value

    @property
    def value(self) -> float:
        return self._value

    @value.setter
    def value(self, value: float) -> None:
        if not np.isfinite(value) or value < 0:
            raise ConfigError(f"alpha must be a finite number >= 0, got {value}")
        self._value = float(value)
        self.rule_version += 1

    def alpha(self) -> float:
        return self._value

    def efficiency(self) -> str | None:
        return None

    def observe(self, event: RequestObservation) -> None:
        return None

    def __repr__(self) -> str:
        return f"FixedAlpha({self.value})"


class FixedRule:
    """A rule of any kind (:class:`~marconi.core.eviction.Rule`) fixed by configuration: ``rule`` names
    it; ``alpha()``/``efficiency()`` are a FLOP-aware rule's (α = 0 and None for any other rule, whose
    decisions are the engine's generic path's). Raises ConfigError for what lacks the Rule contract."""

    def __init__(self, rule: Rule) -> None:
        if not isinstance(rule, Rule):
            raise ConfigError(f"{rule!r} lacks the Rule contract (label, candidates, touch, tails, scores)")
        self.rule = rule

    def alpha(self) -> float:
        return float(self.rule.alpha) if isinstance(self.rule, EvictionRule) else 0.0

    def efficiency(self) -> str | None:
        rule = self.rule
        return rule.efficiency.value if isinstance(rule, EvictionRule) and rule.alpha else None

    def observe(self, event: RequestObservation) -> None:
        return None

    def __repr__(self) -> str:
        return f"FixedRule({self.rule.label()})"
