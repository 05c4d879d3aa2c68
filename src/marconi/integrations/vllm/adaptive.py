"""Adaptive α for vLLM: Marconi's regret selector, run on a shadow of the block pool.

``marconi:selector=regret`` (:class:`marconi.selectors.regret.RegretEviction`) keeps re-choosing its
eviction rule among ``lru / a0.5m / a2m`` (SGLang+'s LRU; recency + 0.5 or 2 × the *marginal* FLOP
efficiency) by counterfactual eviction regret. :class:`AdaptiveAlpha` brings that choice into
vLLM's block pool. (The simulator's default ``marconi`` chooses among the same rules by exact
worlds, :mod:`marconi.selectors.worlds`; here that would mean three shadow replays per request instead of one,
and the live-server validation below was done for the regret selector.)

* a size-only shadow :class:`~marconi.core.cache.PrefixCache` — Marconi admission, adaptive eviction,
  the served model's :class:`~marconi.core.model.ModelSpec`, capacity = the pool's bytes as ``vllm-align``
  accounts them (``(num_blocks - 1) × block bytes``, vLLM's null block excluded) — is fed every
  finished request's prompt and output token ids, in finish order;
* its live rule is the block policy's: ``lru`` → α = 0 (recency only, among the block candidates),
  ``aXm`` → α = X with the marginal efficiency (``aX`` → the whole-prefix one).

Why a shadow and not the regret selector re-implemented over vLLM's blocks: the shadow runs the
selector that the project tests and measures (docs/adaptive.md), unchanged, through its public API;
it needs only the token ids, which vLLM's scheduler and the emulation both have at a request's end,
so the emulation reproduces the plugin's choices exactly; and it costs one size-only replay of each
request. What it gives up: the regret is measured on a radix cache of the same bytes, not on vLLM's
blocks (vLLM keeps states only at block boundaries, pads each state layer to a block, and its
candidates differ), so the rule that wins the shadow is a proxy for the rule that would win the
pool. The README's vLLM section measures how good a proxy it is.

Rules must map onto the block policy: recency-plus-α rules with the default recency, candidates and
touch (``aX``, ``aXm``), and ``lru``. Deterministic: the same finished requests in the same order
give the same rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from marconi.selectors.family import parse_rules
from marconi.selectors.regret import RegretEviction
from marconi.core.cache import PrefixCache
from marconi.core.eviction import EvictionRule
from marconi.core.registry import ConfigError
from marconi.integrations.vllm.config import ADAPTIVE
from marconi.integrations.vllm.policy import RequestObservation

if TYPE_CHECKING:
    from marconi.core.model import ModelSpec
    from marconi.integrations.vllm.policy import BlockEvictionState

__all__ = ["ADAPTIVE", "AdaptiveAlpha", "pool_capacity_bytes", "block_rule"]

def block_rule(rule: EvictionRule) -> tuple[float, str | None]:
    """``(alpha, efficiency)`` of the block policy that applies ``rule`` (efficiency None: irrelevant
    at α = 0). Raises ConfigError for rules the block policy cannot express."""
    if rule.is_lru:
        return 0.0, None
    if rule.recency != "linear" or rule.candidates != "single-child" or rule.touch != "hit":
        raise ConfigError(f"adaptive rule {rule.label()!r} has no counterpart in vLLM's block pool: use lru, "
                          "aX (whole-prefix efficiency) or aXm (marginal), e.g. lru/a0.5m/a2m")
    return rule.alpha, rule.efficiency if rule.alpha else None


def pool_capacity_bytes(spec: "ModelSpec", num_blocks: int, block_size: int) -> int:
    """Bytes of a vLLM pool of ``num_blocks`` blocks (null block excluded), as ``vllm-align`` counts
    them: one block holds ``block_size`` tokens of KVs of one KV cache group's layers. The inverse of
    ``vllm-align``'s capacity → blocks, so a simulated ``--capacity C`` gives the shadow ``C``."""
    from marconi.integrations.vllm.emulate import layout_for_spec

    layout = layout_for_spec(spec, num_blocks=num_blocks, block_size=block_size)
    return (num_blocks - 1) * layout.block_bytes


class AdaptiveAlpha:
    """An :class:`~marconi.integrations.vllm.policy.AlphaSource` following adaptive Marconi's live rule.

    Bound by the :class:`~marconi.integrations.vllm.policy.BlockEvictionState` it serves (which gives the model
    and the pool size); until the first request finishes it answers with the family's first rule
    (``lru``: α = 0). ``observe`` replays the finished request through the shadow cache.

    Args:
        rules: the family, as ``marconi:rules=`` (``"default"`` = ``lru/a0.5m/a2m``).
        decay, hysteresis: the selector's (see :class:`marconi.selectors.regret.RegretEviction`).
    """

    def __init__(self, rules: str | Sequence[EvictionRule] = "default", *, decay: float = 0.999,
                 hysteresis: float = 0.05) -> None:
        self.rules = parse_rules(rules)
        self._block_rules = [block_rule(r) for r in self.rules]    # validates every rule
        self.decay = decay
        self.hysteresis = hysteresis
        self.cache: PrefixCache | None = None
        self.policy: RegretEviction | None = None
        self.num_observed = 0

    def bind(self, state: "BlockEvictionState") -> None:
        """Build the shadow for ``state``'s model and pool (once)."""
        if self.cache is not None:
            raise ConfigError("an adaptive alpha source serves one block pool; build one per pool")
        capacity = pool_capacity_bytes(state.spec, state.num_blocks, state.block_size)
        policy = RegretEviction(self.rules, decay=self.decay, hysteresis=self.hysteresis)
        try:
            self.cache = PrefixCache(state.spec, capacity, "marconi", policy)
        except ConfigError as exc:
            raise ConfigError(f"adaptive alpha: the shadow of a {state.num_blocks}-block pool cannot be built: "
                              f"{exc}") from None
        self.policy = policy

    @property
    def rule(self) -> EvictionRule:
        """The live rule of the shadow (the family's first before any request)."""
        return self.rules[0] if self.policy is None else self.policy.rule

    def alpha(self) -> float:
        return self._block_rules[self._current()][0]

    def efficiency(self) -> str | None:
        return self._block_rules[self._current()][1]

    def _current(self) -> int:
        return 0 if self.policy is None else self.policy.current

    def observe(self, event: RequestObservation) -> None:
        """Replay the finished request through the shadow (Marconi admission and eviction); its
        selector charges the rules and may switch the live one."""
        if self.cache is None:
            raise ConfigError("adaptive alpha: observe before bind (give it to a BlockEvictionState)")
        self.cache.process(event.prompt_token_ids, event.output_token_ids)
        self.num_observed += 1

    def tuning_record(self) -> dict[str, Any]:
        """Every switch of the live rule: ``[[request index (0-based, finish order), label], ...]``."""
        switches = [] if self.policy is None else self.policy.switches
        return {"rule_switches": [[s.at_request, self.rules[s.rule].label()] for s in switches]}

    def __repr__(self) -> str:
        family = "/".join(r.label() for r in self.rules)
        return f"AdaptiveAlpha({family}, live={self.rule.label()}, decay={self.decay:g}, hysteresis={self.hysteresis:g})"
