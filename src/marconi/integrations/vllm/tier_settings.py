"""The CPU-tier policy's settings: the rules it takes (a fixed rule, ``adaptive``, ``arc-tree``), the
``kv_connector_extra_config`` keys and ``MARCONI_TIER_*`` variables that give them, and the checks that
refuse what the policy cannot serve, naming the key or variable a value came from.

:class:`TierSettings` is what :class:`~marconi.integrations.vllm.tier_tree.ChunkTreePolicy` needs
beyond its capacity; :mod:`marconi.integrations.vllm.tier` reads it from vLLM's connector and the
``vllm-align`` emulation from the replay's flags. Imports nothing from vLLM. Semantics and defaults:
``docs/vllm-tiers.md``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from marconi.core.candidates import CandidateTable
from marconi.core.eviction import Candidates, EvictionRule, Rule, Touch, check_cuts_tails, rule_from_label
from marconi.core.model import ModelSpec, get_model
from marconi.core.registry import ConfigError
from marconi.integrations.vllm.policy import ATTENTION, MAMBA

__all__ = ["TierSettings", "ArcTreeOrder", "check_group_kinds", "parse_tier_rule", "parse_switch", "switches_from_env", "ADAPTIVE", "ARC_TREE", "DEFAULT_FAMILY", "DEFAULT_RULE", "DEFAULT_HOST_GBPS", "DEFAULT_GPU_TFLOPS", "ENV_COLD_INSERT", "ENV_SECOND_CHANCE", "ENV_GROUP_KINDS", "ENV_MODEL", "ENV_RULE", "SWITCHES"]

#: ``marconi_rule`` naming the online choice over :data:`DEFAULT_FAMILY` (``tier_chooser``)
ADAPTIVE = "adaptive"
#: the family the adaptive tier chooses from: the project's default family (``choosers.family``),
#: its first rule (the tree by recency alone) live until another world leads
DEFAULT_FAMILY = ("lru", "a0.5m", "a2m")
#: ``marconi_rule`` naming the live order "tree then ARC" (:class:`ArcTreeOrder`)
ARC_TREE = "arc-tree"
#: the configured default: the online choice (docs/vllm-tiers.md, "Choosing the default rule")
DEFAULT_RULE = ADAPTIVE
DEFAULT_HOST_GBPS = 64.0
DEFAULT_GPU_TFLOPS = 400.0
ENV_GROUP_KINDS = "MARCONI_TIER_GROUP_KINDS"
ENV_MODEL = "MARCONI_TIER_MODEL"
ENV_RULE = "MARCONI_TIER_RULE"
ENV_COLD_INSERT = "MARCONI_TIER_COLD_INSERT"
ENV_SECOND_CHANCE = "MARCONI_TIER_SECOND_CHANCE"
#: the policy's on/off parts, each as (``TierSettings`` field, ``kv_connector_extra_config`` key,
#: environment variable); all on by default
SWITCHES = (("cold_insert", "marconi_cold_insert", ENV_COLD_INSERT),
            ("second_chance", "marconi_second_chance", ENV_SECOND_CHANCE))
#: every setting's ``kv_connector_extra_config`` key and the environment variable that may give it
#: instead (None: none): the one table :meth:`TierSettings.from_extra_config` reads both through, so a
#: value is checked, and refused, under the name it was given by
_SOURCES: dict[str, str | None] = {"marconi_rule": ENV_RULE, "marconi_model": ENV_MODEL,
                                   "marconi_group_kinds": ENV_GROUP_KINDS, "marconi_host_gbps": None,
                                   "marconi_gpu_tflops": None, **{key: var for _, key, var in SWITCHES}}
_KEYS = tuple(_SOURCES)
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True, slots=True)
class ArcTreeOrder:
    """``marconi_rule: arc-tree``: the tier's live order "tree then ARC". The tree's dead chunks
    (those no hit can use) go first, oldest first, as under every rule; when none is left, the victim
    is ARC's (vLLM's ``ARCCachePolicy``, kept over the live chunks by
    :class:`~marconi.integrations.vllm.tier_chooser.AdaptiveTierPolicy`), one at a time, so a KV
    chunk ARC evicts that leaves deeper chunks dead has them evicted next. Not a utility rule: a
    :class:`~marconi.integrations.vllm.tier_tree.ChunkTreePolicy` alone ranks its other chunks as ``lru`` (its :meth:`scores`); only
    ``AdaptiveTierPolicy`` applies the order, and an adaptive family cannot hold it (each world is a
    bare tree): :class:`TierSettings` refuses it there."""

    candidates: Candidates = Candidates.LEAVES
    touch: Touch = Touch.PATH
    tails: bool = False

    def label(self) -> str:
        return ARC_TREE

    def scores(self, table: CandidateTable) -> np.ndarray:
        """The :class:`~marconi.core.eviction.Rule` contract: ``lru``'s scores (the bare tree's order)."""
        return EvictionRule.from_label("lru").scores(table)


@dataclass(frozen=True, slots=True)
class TierSettings:
    """What the policy needs beyond its capacity: ``group_kinds`` (``"attention"``/``"mamba"`` per KV
    cache group, vLLM's order), ``spec``, ``tokens_per_chunk`` (None: parents learned per request),
    ``rule`` (any that cuts no dead tails; the rule in force first), the load cost's ``host_gbps``
    (GB/s per direction) and ``gpu_tflops`` (effective prefill TFLOP/s), ``family``: empty for a
    fixed rule, else the rules an adaptive tier chooses from online (``rule`` among them), and
    ``cold_insert`` (``marconi_cold_insert``): whether a request's own tail enters at the old end of
    the recency order when the branch point it hangs from has lately had its branches go unused
    (:class:`~marconi.integrations.vllm.tier_tree.ChunkTreePolicy`, "Cold insertion"), and ``second_chance``
    (``marconi_second_chance``): whether a node with evidence of reuse (a branch point, or the
    state a tier hit ended at) chosen as victim is refreshed once instead (:class:`~marconi.integrations.vllm.tier_tree.ChunkTreePolicy`,
    "Second chance")."""

    group_kinds: tuple[str, ...]
    spec: ModelSpec
    tokens_per_chunk: int | None = None
    rule: Rule = field(default_factory=lambda: EvictionRule.from_label(DEFAULT_FAMILY[0]))
    host_gbps: float = DEFAULT_HOST_GBPS
    gpu_tflops: float = DEFAULT_GPU_TFLOPS
    family: tuple[Rule, ...] = ()
    cold_insert: bool = True
    second_chance: bool = True

    def __post_init__(self) -> None:
        check_group_kinds(self.group_kinds)
        check_cuts_tails(self.rule, "marconi_rule: vLLM's offload tier", False)
        for rule in self.family:
            check_cuts_tails(rule, "marconi_rule: vLLM's offload tier", False)
            if isinstance(rule, ArcTreeOrder):
                raise ConfigError(f"marconi_rule: {ARC_TREE!r} is a live order, not a rule an adaptive family can "
                                  "hold (its worlds are bare trees): use it alone")
        if self.family and self.rule not in self.family:
            raise ConfigError(f"marconi_rule: the adaptive tier starts with a rule of its family, not {self.rule.label()!r}")
        for name in ("host_gbps", "gpu_tflops"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ConfigError(f"marconi_{name}: a positive number, got {value!r}")
        if self.tokens_per_chunk is not None and self.tokens_per_chunk <= 0:
            raise ConfigError(f"tokens_per_chunk must be positive, got {self.tokens_per_chunk}")

    @property
    def alpha(self) -> float:
        """A FLOP-aware rule's α (0 for any other rule)."""
        return float(self.rule.alpha) if isinstance(self.rule, EvictionRule) else 0.0

    @property
    def efficiency(self) -> str:
        """The efficiency variant the tier keeps per depth: a FLOP-aware rule's at α > 0, else total."""
        rule = self.rule
        return rule.efficiency.value if isinstance(rule, EvictionRule) and rule.alpha else "total"

    @property
    def load_flops_per_byte(self) -> float:
        """FLOPs the GPU does while one byte crosses the host link (the efficiency a load costs)."""
        return self.gpu_tflops * 1e12 / (self.host_gbps * 1e9)

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any], *, group_kinds: Sequence[str] | None = None,
                          spec: ModelSpec | None = None, tokens_per_chunk: int | None = None,
                          env: Mapping[str, str] | None = None) -> "TierSettings":
        """Settings from ``kv_connector_extra_config`` (``extra``). vLLM's groups and model
        (``group_kinds``, ``spec``) are the defaults for ``marconi_group_kinds`` and ``marconi_model``;
        ``env`` (``MARCONI_TIER_*``; None: not read) gives what neither does: a key outranks vLLM's
        value, which outranks the variable. Each value is checked where it was given (an empty
        variable is unset).

        Raises:
            ConfigError: an unknown ``marconi_*`` key, a value of the wrong type or out of range, a
                missing group list or model; naming the key (``kv_connector_extra_config
                'marconi_rule'``) or the variable (``MARCONI_TIER_RULE``) the value came from.
        """
        odd = [k for k in extra if not isinstance(k, str)]
        if odd:                          # JSON gives none; a Python caller's dict may
            raise ConfigError(f"kv_connector_extra_config: keys are strings, got {odd!r}")
        # any case: vLLM's keys are lower case, so 'Marconi_rule' is this policy's key mistyped, not vLLM's
        unknown = sorted(k for k in extra if str(k).lower().startswith("marconi_") and k not in _KEYS)
        if unknown:
            raise ConfigError(f"kv_connector_extra_config: unknown key(s) {unknown}; known: {list(_KEYS)}")
        given = _given(extra, env, skip=(() if group_kinds is None else ("marconi_group_kinds",))
                       + (() if spec is None else ("marconi_model",)))
        if "marconi_group_kinds" in given:
            kinds = _group_kinds_value(*given["marconi_group_kinds"])
        elif group_kinds is not None:
            kinds = tuple(group_kinds)
        else:
            raise ConfigError("MarconiCachePolicy cannot tell which KV cache groups hold states: set "
                              "kv_connector_extra_config 'marconi_group_kinds' (e.g. ['attention', 'mamba'])"
                              + (f" or {ENV_GROUP_KINDS}" if env is not None else ""))
        if "marconi_model" in given:
            spec = _model_value(*given["marconi_model"])
        if spec is None:
            raise ConfigError("MarconiCachePolicy needs the model's FLOPs and bytes: set kv_connector_extra_config "
                              "'marconi_model' (a preset such as nemotron-h-8b, or a config.json path)"
                              + (f" or {ENV_MODEL}" if env is not None else ""))
        raw_rule, rule_where = given.get("marconi_rule", (DEFAULT_RULE, "marconi_rule"))
        rule, family = _rule_value(raw_rule, rule_where)
        numbers = {name: _positive(given[f"marconi_{name}"][0], given[f"marconi_{name}"][1])
                   for name in ("host_gbps", "gpu_tflops") if f"marconi_{name}" in given}
        switches = {name: parse_switch(*given[key]) for name, key, _ in SWITCHES if key in given}
        try:
            return cls(kinds, spec, tokens_per_chunk, rule, family=family, **switches, **numbers)
        except ConfigError as exc:
            if "marconi_rule" not in str(exc) and "adaptive rule" in str(exc):
                raise ConfigError(f"{rule_where}: {exc}") from None
            raise

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "TierSettings":
        """Settings for a policy built outside vLLM's connector (``MARCONI_TIER_*``): as
        :meth:`from_extra_config` with no key set, so every refusal names the variable."""
        if not env.get(ENV_GROUP_KINDS):
            raise ConfigError("MarconiCachePolicy was built outside vLLM's OffloadingConnector and cannot learn the "
                              f"KV cache groups: build it through kv_connector_extra_config, or set {ENV_GROUP_KINDS} "
                              "(e.g. attention,mamba) and " + ENV_MODEL)
        if not env.get(ENV_MODEL):
            raise ConfigError(f"MarconiCachePolicy: set {ENV_MODEL} (a preset such as nemotron-h-8b)")
        return cls.from_extra_config({}, env=env)


def _given(extra: Mapping[str, Any], env: Mapping[str, str] | None,
           skip: Sequence[str] = ()) -> dict[str, tuple[Any, str]]:
    """Per :data:`_SOURCES` key the value given and the name it was given by: ``extra``'s key
    (``kv_connector_extra_config 'marconi_rule'``), else a non-empty variable of ``env``
    (``MARCONI_TIER_RULE``), unless the key is in ``skip`` (vLLM gives it); absent keys are left out."""
    given: dict[str, tuple[Any, str]] = {}
    for key, var in _SOURCES.items():
        if key in extra:
            given[key] = (extra[key], f"kv_connector_extra_config {key!r}")
        elif env is not None and var is not None and key not in skip and env.get(var):
            given[key] = (env[var], var)
    return given


def _group_kinds_value(raw: Any, where: str) -> tuple[str, ...]:
    """``marconi_group_kinds`` as given (a list of kinds, or one comma-separated string) as a checked
    tuple; ConfigError naming ``where`` for another type or a kind that is not attention or Mamba."""
    if isinstance(raw, str):
        kinds = tuple(k.strip() for k in raw.split(",") if k.strip())
    elif isinstance(raw, (list, tuple)) and all(isinstance(k, str) for k in raw):
        kinds = tuple(raw)
    else:
        raise ConfigError(f"{where}: a list naming each KV cache group {ATTENTION!r} or {MAMBA!r} in vLLM's order "
                          f"(e.g. ['attention', 'mamba'] or 'attention,mamba'), got {raw!r}")
    check_group_kinds(kinds, where)
    return kinds


def _model_value(raw: Any, where: str) -> ModelSpec:
    """``marconi_model`` as given: a preset's name or a config.json path; ConfigError naming ``where``."""
    if not isinstance(raw, str) or not raw.strip():
        raise ConfigError(f"{where}: a model preset's name (such as nemotron-h-8b) or a config.json path, got {raw!r}")
    try:
        return get_model(raw.strip())
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _rule_value(raw: Any, where: str) -> tuple[Rule, tuple[Rule, ...]]:
    """``marconi_rule`` as given: :func:`parse_tier_rule` of a label; ConfigError naming ``where``."""
    if not isinstance(raw, str):
        raise ConfigError(f"{where}: a rule's label ({ADAPTIVE!r}, {ARC_TREE!r}, 'lru', 'a1m', ...), got {raw!r}")
    return parse_tier_rule(raw, where)


def _positive(raw: Any, where: str) -> float:
    """A positive finite number (an int, a float, or its text; never a bool), as a float;
    ConfigError naming ``where`` otherwise."""
    value = None
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        value = float(raw)
    elif isinstance(raw, str):
        try:
            value = float(raw)
        except ValueError:
            pass
    if value is None or not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{where}: a positive number, got {raw!r}")
    return value


def parse_switch(value: Any, key: str) -> bool:
    """``value`` as a switch: a bool, or one of true/false, 1/0, yes/no, on/off; ConfigError naming ``key``."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"{key}: true or false, got {value!r}")


def switches_from_env(env: Mapping[str, str] = os.environ) -> dict[str, bool]:
    """The :data:`SWITCHES` the environment sets (``MARCONI_TIER_COLD_INSERT``, …), by
    ``TierSettings`` field; ConfigError naming the variable for a value that is not a switch."""
    return {name: parse_switch(env[var], var) for name, _, var in SWITCHES if env.get(var)}


def parse_tier_rule(label: str, key: str = "marconi_rule") -> tuple[Rule, tuple[Rule, ...]]:
    """``label`` as the tier's rule: ``"adaptive"`` -> (the family's first rule, :data:`DEFAULT_FAMILY`);
    ``"arc-tree"`` -> (:class:`ArcTreeOrder`, ()); any fixed rule's label -> (that rule, ()).
    ConfigError naming ``key`` for a label no rule has or a rule the tier cannot apply: one cutting
    dead tails, or one other than ``lru`` with leaf candidates (``l``) or path touch (``p``), which
    the tier would ignore (it ranks its own candidates, the chunks no kept state needs, and vLLM's
    manager touches every chunk of a hit) and so run another rule than the label says."""
    text = label.strip()
    try:
        if text == ARC_TREE:
            return ArcTreeOrder(), ()
        if text == ADAPTIVE:
            family = tuple(rule_from_label(r) for r in DEFAULT_FAMILY)
            return family[0], family
        rule = rule_from_label(text)
        check_cuts_tails(rule, "vLLM's offload tier", False)
        if isinstance(rule, EvictionRule) and not rule.is_lru and (rule.candidates != Candidates.SINGLE_CHILD
                                                                   or rule.touch != Touch.HIT):
            raise ConfigError(f"rule {rule.label()!r} asks for leaf candidates (l) or path touch (p), which vLLM's "
                              "offload tier cannot apply: it ranks its own candidates (the chunks no kept state "
                              "needs) and vLLM touches every chunk of a hit; drop the l and p")
        return rule, ()
    except ConfigError as exc:
        raise ConfigError(f"{key}: {ADAPTIVE!r}, {ARC_TREE!r} or one rule's label ({exc})") from None

def check_group_kinds(kinds: Sequence[str], where: str | None = None) -> None:
    """ConfigError unless ``kinds`` (a list or tuple) are attention and Mamba groups, both present (a
    hybrid model). ``where``: the key or variable the user gave them by, named in the refusal (None:
    vLLM's own groups, or a direct construction; then ``marconi_group_kinds``)."""
    name = where or "marconi_group_kinds"
    if not isinstance(kinds, (list, tuple)) or not all(isinstance(k, str) for k in kinds):
        raise ConfigError(f"{name}: a list naming each KV cache group {ATTENTION!r} or {MAMBA!r}, got {kinds!r}")
    bad = [k for k in kinds if k not in (ATTENTION, MAMBA)]
    if bad:
        raise ConfigError(f"{name}: each group is {ATTENTION!r} or {MAMBA!r}, got {list(kinds)}")
    if MAMBA not in kinds or ATTENTION not in kinds:
        told = f"{where} gives {list(kinds)}: fix it, or" if where else f"this one has {list(kinds)}:"
        raise ConfigError(f"MarconiCachePolicy serves hybrid models (attention and Mamba KV cache groups); {told} "
                          "set kv_connector_extra_config 'eviction_policy' to 'lru' or 'arc'")
