"""The CPU-tier policy's settings: the rules it takes (a fixed rule, ``adaptive``, ``arc-tree``), the
``kv_connector_extra_config`` keys and ``MARCONI_TIER_*`` variables that give them, and the checks that
refuse what the policy cannot serve, naming the key or variable a value came from.

:class:`TierSettings` is what :class:`~marconi.integrations.vllm.tier_tree.ChunkTreePolicy` needs
beyond its capacity; :mod:`marconi.integrations.vllm.tier` reads it from vLLM's connector and the
``vllm-align`` emulation from the replay's flags. Imports nothing from vLLM. Semantics and defaults:
``docs/vllm-tiers.md``.
"""

from __future__ import annotations

import logging
import math
import numbers
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from marconi.core.candidates import CandidateTable
from marconi.core.eviction import Candidates, EvictionRule, Rule, Touch, check_cuts_tails, rule_from_label
from marconi.core.model import ModelSpec, get_model
from marconi.core.registry import ConfigError, did_you_mean
from marconi.integrations.vllm.policy import ATTENTION, MAMBA

__all__ = ["TierSettings", "ArcTreeOrder", "check_group_kinds", "parse_tier_rule", "parse_switch", "switches_from_env",
           "ADAPTIVE", "ARC_TREE", "DEFAULT_FAMILY", "DEFAULT_RULE", "DEFAULT_HOST_GBPS", "DEFAULT_GPU_TFLOPS",
           "ENV_COLD_INSERT", "ENV_SECOND_CHANCE", "ENV_GROUP_KINDS", "ENV_MODEL", "ENV_RULE", "SWITCHES",
           "MIN_HOST_GBPS", "MAX_HOST_GBPS"]

logger = logging.getLogger("marconi.integrations.vllm")

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
#: ``marconi_host_gbps``'s range: 1 byte/s to 1 EB/s, what the replay's ``--host-bandwidth`` takes
#: (``replay.tiers.parse_bandwidth``), which it passes on as this key
MIN_HOST_GBPS, MAX_HOST_GBPS = 1e-9, 1e9
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
#: every ``MARCONI_TIER_*`` variable the policy reads; any other is refused where the environment is read
_VARIABLES = tuple(var for var in _SOURCES.values() if var is not None)
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
    (GB/s per direction, :data:`MIN_HOST_GBPS` to :data:`MAX_HOST_GBPS`) and ``gpu_tflops``
    (effective prefill TFLOP/s; their ratio, FLOPs per byte loaded, finite and > 0), ``family``: empty for a
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
        if not MIN_HOST_GBPS <= self.host_gbps <= MAX_HOST_GBPS:
            raise ConfigError(f"marconi_host_gbps: GB/s per direction, from {MIN_HOST_GBPS:g} to {MAX_HOST_GBPS:g} "
                              f"(1 byte/s to 1 EB/s, as the replay's --host-bandwidth), got {self.host_gbps!r}")
        ratio = self.load_flops_per_byte
        if not (math.isfinite(ratio) and ratio > 0):    # each finite, but their ratio is past a float's range
            raise ConfigError(f"marconi_gpu_tflops={self.gpu_tflops!r} over marconi_host_gbps={self.host_gbps!r} "
                              f"is {ratio!r} FLOPs per byte loaded: give both in real units (TFLOP/s, GB/s)")
        tpc = self.tokens_per_chunk
        if tpc is not None and (isinstance(tpc, bool) or not isinstance(tpc, numbers.Integral) or tpc <= 0):
            raise ConfigError(f"tokens_per_chunk must be a positive whole number, got {tpc!r}")

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

        A variable that is set but not read (its key, or vLLM, gives the setting) and says otherwise
        is named in a warning on the ``marconi.integrations.vllm`` logger, with the value used.

        Raises:
            ConfigError: an unknown ``marconi_*`` key (any case, ``-`` or ``_``, with or without the
                underscore: ``marconi-rule``, ``marconirule``, `` marconi_rule``), an unknown
                ``MARCONI_TIER_*`` variable (where ``env`` is read), a value of the wrong type or out
                of range, a missing group list or model; naming the key (``kv_connector_extra_config
                'marconi_rule'``) or the variable (``MARCONI_TIER_RULE``) the value came from.
        """
        odd = [k for k in extra if not isinstance(k, str)]
        if odd:                          # JSON gives none; a Python caller's dict may
            raise ConfigError(f"kv_connector_extra_config: keys are strings, got {odd!r}")
        _refuse_unknown_keys(extra)
        if env is not None:
            _refuse_unknown_variables(env)
        skip = ((() if group_kinds is None else ("marconi_group_kinds",))
                + (() if spec is None else ("marconi_model",)))
        given = _given(extra, env, skip=skip)
        vllm_spec = spec
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
            settings = cls(kinds, spec, tokens_per_chunk, rule, family=family, **switches, **numbers)
        except ConfigError as exc:
            if "marconi_rule" not in str(exc) and "adaptive rule" in str(exc):
                raise ConfigError(f"{rule_where}: {exc}") from None
            raise
        if env is not None:          # once the settings stand: a refusal says more than a warning
            _warn_shadowed(extra, env, skip, group_kinds, vllm_spec)
        return settings

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


def _refuse_unknown_keys(extra: Mapping[str, Any]) -> None:
    """ConfigError naming every key of ``extra`` that reads as this policy's (``marconi`` first, in
    any case, spacing or separator: vLLM's own keys never start so) but is none of :data:`_KEYS`; such
    a key would be ignored and its setting left at the default."""
    def ours(key: str) -> bool:
        return key.strip().lower().replace("-", "_").replace(" ", "_").startswith("marconi")

    unknown = sorted(k for k in extra if ours(k) and k not in _KEYS)
    if unknown:
        fixed = unknown[0].strip().lower().replace("-", "_").replace(" ", "_")
        hint = did_you_mean(fixed, _KEYS, quote=True)
        raise ConfigError(f"kv_connector_extra_config: unknown key(s) {unknown}{hint}; known: {list(_KEYS)}")


def _refuse_unknown_variables(env: Mapping[str, str]) -> None:
    """ConfigError naming a ``MARCONI_TIER*`` variable (any case) of ``env`` that is none of
    :data:`_VARIABLES`: never read, it would leave its setting at the default without a word
    (``MARCONI_TIER_RUL=a2m``; ``MARCONI_TIER_HOST_GBPS``, a key with no variable)."""
    unknown = sorted(n for n in env if n.upper().startswith("MARCONI_TIER") and n not in _VARIABLES)
    if unknown:
        hint = did_you_mean(unknown[0].upper(), _VARIABLES)
        raise ConfigError(f"{unknown[0]}: no such variable{hint}: rename or unset it (MarconiCachePolicy reads "
                          f"{', '.join(_VARIABLES)}; marconi_host_gbps and marconi_gpu_tflops are "
                          "kv_connector_extra_config keys only)")


def _warn_shadowed(extra: Mapping[str, Any], env: Mapping[str, str], skip: Sequence[str],
                   group_kinds: Sequence[str] | None, spec: ModelSpec | None) -> None:
    """Warn, naming both, for each ``MARCONI_TIER_*`` variable set to a value other than the one a
    key of ``extra`` (or vLLM, for ``skip``'s keys) gives instead: the key wins, as documented, but
    the operator who set the variable is told it is not in effect."""
    for key, var in _SOURCES.items():
        if var is None or not env.get(var, "").strip():
            continue
        text = env[var]
        if key in extra:
            if not _same_setting(key, extra[key], text):
                logger.warning("marconi: %s=%r is not in effect: kv_connector_extra_config %r=%r outranks it "
                               "(unset the variable or make them agree)", var, text, key, extra[key])
        elif key in skip:
            used: Any = list(group_kinds or ()) if key == "marconi_group_kinds" else spec
            if not _same_setting(key, used, text):
                what = used if key == "marconi_group_kinds" else getattr(spec, "name", spec)
                logger.warning("marconi: %s=%r is not in effect: what vLLM gives (%s %s) outranks it (unset the "
                               "variable, or set kv_connector_extra_config %r)", var, text,
                               "KV cache groups" if key == "marconi_group_kinds" else "model", what, key)


def _same_setting(key: str, value: Any, text: str) -> bool:
    """Whether ``value`` (a key's, or vLLM's) and a variable's ``text`` give the same setting: each
    parsed as the setting is where it parses (a ModelSpec ``value`` compared with the model ``text``
    names), else compared as text."""
    parse: dict[str, Any] = {"marconi_rule": lambda v, w: v.strip() if isinstance(v, str) else v,
                             "marconi_group_kinds": _group_kinds_value,
                             "marconi_model": lambda v, w: v if isinstance(v, ModelSpec) else _model_value(v, w),
                             **{k: parse_switch for _, k, _ in SWITCHES}}
    try:
        return parse[key](value, key) == parse[key](text, key)
    except Exception:  # a comparison for a warning: any value that does not parse is compared as text
        return str(value).strip() == text.strip()


def _given(extra: Mapping[str, Any], env: Mapping[str, str] | None,
           skip: Sequence[str] = ()) -> dict[str, tuple[Any, str]]:
    """Per :data:`_SOURCES` key the value given and the name it was given by: ``extra``'s key
    (``kv_connector_extra_config 'marconi_rule'``), else a non-empty variable of ``env``
    (``MARCONI_TIER_RULE``; blank counts as unset, as for the plugin's variables), unless the key is in
    ``skip`` (vLLM gives it); absent keys are left out."""
    given: dict[str, tuple[Any, str]] = {}
    for key, var in _SOURCES.items():
        if key in extra:
            given[key] = (extra[key], f"kv_connector_extra_config {key!r}")
        elif env is not None and var is not None and key not in skip and env.get(var, "").strip():
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
        try:
            value = float(raw)
        except OverflowError:          # an int past a float's range (JSON reads 1e400 written out as an int)
            pass
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
