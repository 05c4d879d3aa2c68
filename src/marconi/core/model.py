"""Cost model of a hybrid LLM: FLOPs a cache hit saves and bytes a cache entry holds.

One frozen :class:`ModelSpec` holds all the cache knows of the model, so the simulator and the real
engine account bytes identically. Formulas: the paper's Appendix A (``docs/cache-api.md``).
"""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path, PurePath
from typing import Any, Mapping

from marconi.core.jsonfile import JsonError, described, read_json

__all__ = ["ModelSpec", "PRESETS", "get_model", "list_models", "SpecError"]


class SpecError(ValueError):
    """A model specification (or a config it was built from) is invalid."""


# Plausibility bounds: far above any real model, low enough that every byte count and FLOP
# formula stays exact in float64 and int64 (a typo such as hidden_size 1e30 is an error here, not
# an OverflowError, or a loop over 10**12 layers, far from the config).
MAX_LAYERS = 1 << 16
MAX_SIZE = (1 << 31) - 1
MAX_BYTES = 1 << 53

_COUNT_FIELDS = ("num_attn_layers", "num_ssm_layers", "num_mlp_layers")
# >= 0 each; d_model and bytes_per_elem > 0, the None-able ones > 0 (heads, head dim) or >= 0 when given
_SIZE_FIELDS = ("d_model", "ssm_state_dim", "conv_kernel", "ssm_expand", "bytes_per_elem", "checkpoint_extra_bytes")
_OPTIONAL_FIELDS = ("num_kv_heads", "head_dim", "ssm_state_width", "conv_dim")


def _is_integer(value: Any) -> bool:
    """An int (not a bool), or an integral finite float (a JSON ``64.0``)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, numbers.Integral):
        return True
    return isinstance(value, float) and math.isfinite(value) and value.is_integer()


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Layer mix and dimensions of a hybrid model, with its FLOP and byte costs.

    An "SSM" layer is any recurrent mixer with a fixed-size state (Mamba-1/2, gated DeltaNet, short
    conv). ``d_model`` is ``D``, ``ssm_state_dim`` is ``N``; ``ssm_state_width`` (elements per unit of
    ``N``) and ``conv_dim`` default to the paper's ``D`` and ``expand·D + 2·N``; ``bytes_per_elem``
    is per cached element (2 for fp16/bf16); ``checkpoint_extra_bytes`` are kept beside each SSM
    checkpoint (0 for the presets, as in the paper).
    """

    name: str
    num_attn_layers: int
    num_ssm_layers: int
    num_mlp_layers: int
    d_model: int
    ssm_state_dim: int
    conv_kernel: int = 4
    ssm_expand: int = 2
    num_kv_heads: int | None = None
    head_dim: int | None = None
    bytes_per_elem: int = 2
    ssm_state_width: int | None = None
    conv_dim: int | None = None
    checkpoint_extra_bytes: int = 0
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for attr in (*_COUNT_FIELDS, *_SIZE_FIELDS, *_OPTIONAL_FIELDS):
            value = getattr(self, attr)
            if value is None and attr in _OPTIONAL_FIELDS:
                continue
            if not _is_integer(value):
                raise SpecError(f"{self.name}: {attr} must be an integer, got {value!r}")
            if value < 0:
                raise SpecError(f"{self.name}: {attr} must be >= 0, got {value}")
            limit = MAX_LAYERS if attr in _COUNT_FIELDS else MAX_SIZE
            if value > limit:
                raise SpecError(f"{self.name}: {attr} = {value} is implausibly large (at most {limit:,}); "
                                f"check the config")
        for attr in ("num_kv_heads", "head_dim"):
            if getattr(self, attr) == 0:
                raise SpecError(f"{self.name}: {attr} must be > 0 when given, got 0 (None: derive it)")
        if self.num_attn_layers + self.num_ssm_layers == 0:
            raise SpecError(f"{self.name}: a model needs at least one attention or SSM layer")
        for attr in ("d_model", "bytes_per_elem"):
            if getattr(self, attr) <= 0:
                raise SpecError(f"{self.name}: {attr} must be > 0, got {getattr(self, attr)}")
        if self.checkpoint_extra_bytes < 0:
            raise SpecError(f"{self.name}: checkpoint_extra_bytes must be >= 0, got {self.checkpoint_extra_bytes}")
        if self.num_ssm_layers and (self.ssm_state_dim <= 0 or self.conv_kernel < 0):
            raise SpecError(f"{self.name}: SSM layers need ssm_state_dim > 0 and conv_kernel >= 0")
        heads, hdim = self.kv_geometry
        if self.num_attn_layers and (heads <= 0 or hdim <= 0):
            raise SpecError(f"{self.name}: attention layers need num_kv_heads > 0 and head_dim > 0")
        for what, nbytes in (("KV bytes per token", self.kv_bytes_per_token),
                             ("SSM checkpoint bytes", self.ssm_checkpoint_bytes)):
            if nbytes > MAX_BYTES:
                raise SpecError(f"{self.name}: {what} = {nbytes:,} is implausibly large (at most 2**53); "
                                f"check the layer counts and dimensions")

    # ----------------------------------------------------------------------------- geometry
    @property
    def kv_geometry(self) -> tuple[int, int]:
        """(KV heads, head dim); without GQA info, one head of width ``D`` (K and V are ``L·D``)."""
        if self.num_kv_heads is None and self.head_dim is None:
            return 1, self.d_model
        if self.num_kv_heads is None or self.head_dim is None:
            raise SpecError(f"{self.name}: give both num_kv_heads and head_dim, or neither")
        return self.num_kv_heads, self.head_dim

    @property
    def has_recurrent_state(self) -> bool:
        """False for a pure transformer: then any KV prefix is reusable (no SSM checkpoint needed)."""
        return self.num_ssm_layers > 0

    # ----------------------------------------------------------------------------- bytes
    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V for one token, summed over all attention layers."""
        heads, hdim = self.kv_geometry
        return self.num_attn_layers * 2 * heads * hdim * self.bytes_per_elem

    @property
    def ssm_state_bytes_per_layer(self) -> int:
        width = self.d_model if self.ssm_state_width is None else self.ssm_state_width
        return width * self.ssm_state_dim * self.bytes_per_elem

    @property
    def conv_state_bytes_per_layer(self) -> int:
        conv_dim = (self.ssm_expand * self.d_model + 2 * self.ssm_state_dim
                    if self.conv_dim is None else self.conv_dim)
        return conv_dim * self.conv_kernel * self.bytes_per_elem

    @property
    def ssm_checkpoint_bytes(self) -> int:
        """Bytes of one SSM checkpoint: recurrent + conv state of every SSM layer (+ the extra
        bytes an engine keeps with it)."""
        if not self.num_ssm_layers:
            return 0
        return (self.num_ssm_layers * (self.ssm_state_bytes_per_layer + self.conv_state_bytes_per_layer)
                + self.checkpoint_extra_bytes)

    def kv_bytes(self, num_tokens: int) -> int:
        return num_tokens * self.kv_bytes_per_token

    # ----------------------------------------------------------------------------- FLOPs
    def attn_flops(self, length: int) -> float:
        """FLOPs of one attention layer prefilling ``length`` tokens from scratch."""
        d = self.d_model
        return 8.0 * length * d * d + 4.0 * length * length * d

    def mlp_flops(self, length: int) -> float:
        d = self.d_model
        return 16.0 * length * d * d

    def ssm_flops(self, length: int) -> float:
        d, n = self.d_model, self.ssm_state_dim
        return 12.0 * length * d * d + 16.0 * length * d * n + 10.0 * length * d

    def prefill_flops(self, length: int) -> float:
        """FLOPs to prefill a ``length``-token prefix through all layers (what a hit saves)."""
        return (self.num_attn_layers * self.attn_flops(length)
                + self.num_ssm_layers * self.ssm_flops(length)
                + self.num_mlp_layers * self.mlp_flops(length))

    def span_flops(self, start: int, end: int) -> float:
        """FLOPs to prefill tokens ``[start, end)`` given the first ``start`` are cached (attention:
        ``attn(end) - attn(start)``, since the new tokens attend to the whole prefix)."""
        span = end - start
        return (self.num_attn_layers * (self.attn_flops(end) - self.attn_flops(start))
                + self.num_ssm_layers * self.ssm_flops(span)
                + self.num_mlp_layers * self.mlp_flops(span))

    # ----------------------------------------------------------------------------- variants
    def with_changes(self, **changes: Any) -> "ModelSpec":
        """A copy with some fields changed (for sweeps over layer ratio or state size)."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> dict[str, Any]:
        """A flat summary for tables and result records."""
        return {
            "model": self.name,
            "attn_layers": self.num_attn_layers,
            "ssm_layers": self.num_ssm_layers,
            "mlp_layers": self.num_mlp_layers,
            "d_model": self.d_model,
            "ssm_state_dim": self.ssm_state_dim,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "ssm_checkpoint_bytes": self.ssm_checkpoint_bytes,
        }

    # ----------------------------------------------------------------------------- HF configs
    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any] | str | Path, *, name: str | None = None,
                       bytes_per_elem: int | None = None) -> "ModelSpec":
        """Build a spec from a Hugging Face ``config.json`` (a dict, a file, or a model directory;
        nothing is downloaded; ``model_type`` in ``HF_PARSERS``). A field left out or null takes the
        architecture's default. Raises SpecError, naming the file and field, for an unsupported
        ``model_type``, a missing field, a value of the wrong kind or range (0 included), or a
        ``num_attention_heads`` that ``num_key_value_heads`` does not divide."""
        cfg, path = _load_config(config)
        where = str(path) if path is not None else "config"
        model_type = cfg.get("model_type")
        if "text_config" in cfg and not _is_parsed(model_type):
            text = cfg["text_config"]
            if not isinstance(text, Mapping):
                raise SpecError(f"{where}: text_config must be a JSON object (the language model's config), "
                                f"got {described(text)}")
            cfg = dict(text)
            model_type = cfg.get("model_type")
        if not _is_parsed(model_type):
            raise SpecError(f"{where}: unsupported model_type {model_type!r} in config; supported: "
                            f"{', '.join(sorted(HF_PARSERS))}")
        fields = HF_PARSERS[model_type](_Fields(cfg, f"{where} of model_type {model_type!r}"))
        if bytes_per_elem is None:
            bytes_per_elem = _dtype_bytes(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16", where)
        try:
            return cls(name=name or str(cfg.get("_name_or_path") or model_type), bytes_per_elem=bytes_per_elem,
                       source=f"hf:{model_type}", **fields)
        except SpecError as exc:
            if path is None:
                raise
            raise SpecError(f"{path}: {exc}") from None


# ================================================================================= HF parsing
_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "float8_e4m3fn": 1}


def _dtype_bytes(dtype: Any, where: str = "config") -> int:
    key = str(dtype).removeprefix("torch.")
    if key not in _DTYPE_BYTES:
        raise SpecError(f"{where}: unknown dtype {dtype!r}; known: {', '.join(_DTYPE_BYTES)}")
    return _DTYPE_BYTES[key]


def _is_parsed(model_type: Any) -> bool:
    return isinstance(model_type, str) and model_type in HF_PARSERS


def _load_config(config: Mapping[str, Any] | str | Path) -> tuple[dict[str, Any], Path | None]:
    """The config as a dict, and the file it was read from (None for a mapping)."""
    if isinstance(config, Mapping):
        return dict(config), None
    if not isinstance(config, (str, PurePath)):
        raise SpecError(f"config must be a mapping (a parsed config.json), a config file or a model directory, "
                        f"got {type(config).__name__}")
    path = Path(config)
    try:
        if path.is_dir():
            path = path / "config.json"
        is_file = path.is_file()
    except (OSError, ValueError):  # a name too long for a path, a NUL byte
        is_file = False
    if not is_file:
        raise SpecError(f"no config.json at {path}: pass a model directory or a config file")
    try:
        cfg = read_json(path)
    except JsonError as exc:   # said as a model's config: the same file may be read as a trace elsewhere
        raise SpecError(f"{path} does not read as a Hugging Face config.json (one JSON object): {exc}") from None
    if not isinstance(cfg, dict):
        raise SpecError(f"{path}: expected a JSON object (a Hugging Face config.json), got {described(cfg)}")
    return cfg, path


_REQUIRED: Any = object()


class _Fields:
    """Typed reads of one config's fields, the parsers' only access to it: every bad value is a
    SpecError naming ``where``, the field, its value and what it must be. An absent or null field
    takes ``default``; without one it is required."""

    def __init__(self, cfg: Mapping[str, Any], where: str) -> None:
        self.cfg = cfg
        self.where = where

    def has(self, key: str) -> bool:
        """Whether ``key`` is given (present and not null)."""
        return self.cfg.get(key) is not None

    def get(self, key: str, default: Any = _REQUIRED) -> Any:
        value = self.cfg.get(key)
        if value is None:
            if default is _REQUIRED:
                null = " (it is null)" if key in self.cfg else ""
                raise SpecError(f"{self.where} lacks the field {key!r}{null}")
            return default
        return value

    def integer(self, key: str, default: Any = _REQUIRED, *, low: int = 1, high: int = MAX_SIZE) -> int:
        """An integer in ``[low, high]`` (default: a size or count >= 1)."""
        value = self.get(key, default)
        if not _is_integer(value):
            raise SpecError(f"{self.where}: {key} must be an integer, got {described(value)}")
        value = int(value)
        if value < low:
            raise SpecError(f"{self.where}: {key} must be >= {low}, got {value}")
        if value > high:
            raise SpecError(f"{self.where}: {key} = {value} is implausibly large (at most {high:,}); check the config")
        return value

    def layers(self, key: str = "num_hidden_layers") -> int:
        return self.integer(key, high=MAX_LAYERS)

    def items(self, key: str, default: Any = _REQUIRED) -> list[Any]:
        value = self.get(key, default)
        if not isinstance(value, (list, tuple)):
            raise SpecError(f"{self.where}: {key} must be a list, got {described(value)}")
        if len(value) > MAX_LAYERS:
            raise SpecError(f"{self.where}: {key} has {len(value):,} entries, implausibly many (at most "
                            f"{MAX_LAYERS:,} layers)")
        return list(value)

    def names(self, key: str, default: Any = _REQUIRED) -> list[str]:
        """A list of layer kinds (strings)."""
        items = self.items(key, default)
        bad = [item for item in items if not isinstance(item, str)]
        if bad:
            raise SpecError(f"{self.where}: {key} must list layer kinds as strings, got {described(bad[0])} "
                            "among them")
        return items

    def indices(self, key: str, num_layers: int) -> list[int]:
        """A list of distinct layer indices in ``[0, num_layers)`` (absent or null: none)."""
        items = self.items(key, [])
        for item in items:
            if not _is_integer(item) or not 0 <= item < num_layers:
                got = item if _is_integer(item) else described(item)
                raise SpecError(f"{self.where}: {key} must list layer indices in [0, {num_layers}) "
                                f"(num_hidden_layers = {num_layers}), got {got}")
        if len(set(items)) != len(items):
            raise SpecError(f"{self.where}: {key} lists a layer twice: {items}")
        return items

    def text(self, key: str) -> str:
        value = self.get(key)
        if not isinstance(value, str):
            raise SpecError(f"{self.where}: {key} must be a string, got {described(value)}")
        return value

    def head_dim(self, heads_key: str, heads: int, d_model: int, *, scale: int = 1) -> int:
        """``head_dim`` (or ``attention_head_dim``) if given, else ``scale·D // heads`` as
        transformers derives it (>= 1: more heads than ``scale·D`` channels is an error)."""
        for key in ("head_dim", "attention_head_dim"):
            if self.has(key):
                return self.integer(key)
        hdim = scale * d_model // heads
        if hdim < 1:
            raise SpecError(f"{self.where}: {heads_key} = {heads} exceeds the {scale * d_model} channels of "
                            f"hidden_size = {d_model}: the derived head_dim would be 0; give head_dim")
        return hdim

    def kv_heads(self, heads_key: str, heads: int) -> int:
        """``num_key_value_heads`` (absent or null: ``heads``, multi-head attention; 0 is an error),
        which must divide the ``heads`` query heads: grouped-query attention gives each KV head the
        same number of them."""
        kv = self.integer("num_key_value_heads", heads)
        if heads % kv:
            raise SpecError(f"{self.where}: {heads_key} = {heads} is not a multiple of num_key_value_heads = {kv}: "
                            f"grouped-query attention shares each KV head among an equal number of query heads; "
                            f"give a num_key_value_heads that divides {heads_key}")
        return kv


def _attn(f: _Fields, heads_key: str = "num_attention_heads") -> dict[str, int]:
    heads = f.integer(heads_key)
    return {"num_kv_heads": f.kv_heads(heads_key, heads),
            "head_dim": f.head_dim(heads_key, heads, f.integer("hidden_size"))}


def _mamba2(d_inner: int, n_groups: int, d_state: int, kernel: int) -> dict[str, int]:
    """Mamba-2 state: ``[heads, head_dim, N]`` = ``d_inner·N``; conv over x, B, C channels."""
    return {"ssm_state_dim": d_state, "ssm_state_width": d_inner,
            "conv_dim": d_inner + 2 * n_groups * d_state, "conv_kernel": kernel}


def _parse_bamba(f: _Fields) -> dict[str, Any]:
    layers = f.layers()
    attn = len(f.indices("attn_layer_indices", layers))
    d = f.integer("hidden_size")
    d_inner = f.integer("mamba_n_heads", 128) * f.integer("mamba_d_head", 64)
    return dict(num_attn_layers=attn, num_ssm_layers=layers - attn, num_mlp_layers=layers, d_model=d,
                ssm_expand=f.integer("mamba_expand", 2), **_attn(f),
                **_mamba2(d_inner, f.integer("mamba_n_groups", 1), f.integer("mamba_d_state", 128),
                          f.integer("mamba_d_conv", 4)))


def _parse_nemotron_h(f: _Fields) -> dict[str, Any]:
    if f.has("hybrid_override_pattern") or not f.has("layers_block_type"):
        pattern = f.text("hybrid_override_pattern")
    else:
        # transformers >= 5 spells the kinds linear_attention / full_attention.
        letters = {"mamba": "M", "linear_attention": "M", "attention": "*", "full_attention": "*",
                   "mlp": "-", "moe": "E"}
        kinds = f.names("layers_block_type")
        unknown = sorted({t for t in kinds if t not in letters})
        if unknown:
            raise SpecError(f"{f.where}: unknown layer kinds {unknown} in layers_block_type; known: "
                            f"{', '.join(letters)}")
        pattern = "".join(letters[t] for t in kinds)
    if len(pattern) > MAX_LAYERS:
        raise SpecError(f"{f.where}: hybrid_override_pattern has {len(pattern):,} layers, implausibly many")
    unknown_letters = sorted(set(pattern) - set("M*-E"))
    if unknown_letters:    # a layer the count below would drop: the model would come out too small
        raise SpecError(f"{f.where}: hybrid_override_pattern has unknown layer letters {unknown_letters}; known: "
                        "M (Mamba), * (attention), - (MLP), E (mixture of experts)")
    d = f.integer("hidden_size")
    d_inner = f.integer("mamba_num_heads") * f.integer("mamba_head_dim")
    return dict(num_attn_layers=pattern.count("*"), num_ssm_layers=pattern.count("M"),
                num_mlp_layers=pattern.count("-") + pattern.count("E"), d_model=d, **_attn(f),
                **_mamba2(d_inner, f.integer("n_groups", 1), f.integer("ssm_state_size"), f.integer("conv_kernel", 4)))


def _parse_falcon_h1(f: _Fields) -> dict[str, Any]:
    # Parallel hybrid: every layer has an attention branch, an SSM branch and an MLP.
    layers = f.layers()
    d = f.integer("hidden_size")
    d_inner = f.integer("mamba_d_ssm") if f.has("mamba_d_ssm") else f.integer("mamba_expand", 2) * d
    return dict(num_attn_layers=layers, num_ssm_layers=layers, num_mlp_layers=layers, d_model=d, **_attn(f),
                **_mamba2(d_inner, f.integer("mamba_n_groups", 1), f.integer("mamba_d_state", 256),
                          f.integer("mamba_d_conv", 4)))


def _parse_granitemoehybrid(f: _Fields) -> dict[str, Any]:
    types = f.names("layer_types")
    d = f.integer("hidden_size")
    d_inner = f.integer("mamba_n_heads", 128) * f.integer("mamba_d_head", 64)
    ssm = sum(1 for t in types if t in ("mamba", "linear_attention"))
    attn = sum(1 for t in types if t in ("attention", "full_attention"))
    return dict(num_attn_layers=attn, num_ssm_layers=ssm,
                num_mlp_layers=len(types), d_model=d, **_attn(f),
                **_mamba2(d_inner, f.integer("mamba_n_groups", 1), f.integer("mamba_d_state", 128),
                          f.integer("mamba_d_conv", 4)))


def _parse_zamba2(f: _Fields) -> dict[str, Any]:
    layers = f.layers()
    kinds = f.names("layers_block_type", [])
    hybrid = kinds.count("hybrid") if kinds else len(f.indices("hybrid_layer_ids", layers))
    d = f.integer("hidden_size")
    expand = f.integer("mamba_expand", 2)
    d_inner = expand * d
    heads = f.integer("num_attention_heads")
    # Zamba2's shared attention runs on concat(hidden, embeddings): head_dim = 2·D / heads.
    return dict(num_attn_layers=hybrid, num_ssm_layers=layers, num_mlp_layers=hybrid, d_model=d,
                num_kv_heads=f.kv_heads("num_attention_heads", heads),
                head_dim=f.head_dim("num_attention_heads", heads, d, scale=2), ssm_expand=expand,
                **_mamba2(d_inner, f.integer("mamba_ngroups", 1), f.integer("mamba_d_state", 64),
                          f.integer("mamba_d_conv", 4)))


def _parse_jamba(f: _Fields) -> dict[str, Any]:
    layers = f.layers()
    period, offset = f.integer("attn_layer_period", 8), f.integer("attn_layer_offset", 4, low=0)
    attn = sum(1 for i in range(layers) if i % period == offset)
    d = f.integer("hidden_size")
    expand = f.integer("mamba_expand", 2)
    # Mamba-1: state [expand·D, N], conv over the expand·D channels only.
    return dict(num_attn_layers=attn, num_ssm_layers=layers - attn, num_mlp_layers=layers, d_model=d,
                ssm_state_dim=f.integer("mamba_d_state", 16), ssm_expand=expand,
                ssm_state_width=expand * d, conv_dim=expand * d, conv_kernel=f.integer("mamba_d_conv", 4),
                **_attn(f))


def _gated_deltanet(f: _Fields, layers: int, attn: int) -> dict[str, Any]:
    """Gated DeltaNet state ``[v_heads, k_dim, v_dim]``; conv over q, k, v channels."""
    d = f.integer("hidden_size")
    k_heads, v_heads = f.integer("linear_num_key_heads"), f.integer("linear_num_value_heads")
    k_dim, v_dim = f.integer("linear_key_head_dim"), f.integer("linear_value_head_dim")
    return dict(num_attn_layers=attn, num_ssm_layers=layers - attn, num_mlp_layers=layers, d_model=d,
                ssm_state_dim=k_dim, ssm_state_width=v_heads * v_dim,
                conv_dim=2 * k_heads * k_dim + v_heads * v_dim, conv_kernel=f.integer("linear_conv_kernel_dim", 4),
                **_attn(f))


def _parse_qwen3_next(f: _Fields) -> dict[str, Any]:
    layers = f.layers()
    types = f.names("layer_types", [])
    if types:
        attn = sum(1 for t in types if t == "full_attention")
    else:
        interval = f.integer("full_attention_interval", 4)
        attn = sum(1 for i in range(layers) if (i + 1) % interval == 0)
    return _gated_deltanet(f, layers, attn)


def _parse_olmo_hybrid(f: _Fields) -> dict[str, Any]:
    types = f.names("layer_types")
    return _gated_deltanet(f, len(types), sum(1 for t in types if t == "full_attention"))


def _parse_lfm2(f: _Fields) -> dict[str, Any]:
    # LFM2: short-conv layers hold only a conv state [D, L_cache]; no N-dim recurrent state.
    types = f.names("layer_types")
    d = f.integer("hidden_size")
    return dict(num_attn_layers=types.count("full_attention"), num_ssm_layers=types.count("conv"),
                num_mlp_layers=len(types), d_model=d, ssm_state_dim=1, ssm_state_width=0, conv_dim=d,
                conv_kernel=f.integer("conv_L_cache", 3), **_attn(f))


HF_PARSERS = {
    "bamba": _parse_bamba,
    "nemotron_h": _parse_nemotron_h,
    "falcon_h1": _parse_falcon_h1,
    "granitemoehybrid": _parse_granitemoehybrid,
    "zamba2": _parse_zamba2,
    "jamba": _parse_jamba,
    "qwen3_next": _parse_qwen3_next,
    "olmo_hybrid": _parse_olmo_hybrid,
    "lfm2": _parse_lfm2,
}

# ================================================================================= presets
# Values below are the published config.json fields that matter for caching.
_PUBLISHED_CONFIGS: dict[str, dict[str, Any]] = {
    # AI21 Jamba-1.5-Mini (52B total / 12B active; Mamba-1, N=16).
    "jamba-1.5-mini": {"model_type": "jamba", "hidden_size": 4096, "num_hidden_layers": 32,
                       "attn_layer_period": 8, "attn_layer_offset": 4, "num_attention_heads": 32,
                       "num_key_value_heads": 8, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2,
                       "torch_dtype": "bfloat16"},
    # nvidia/Nemotron-H-8B-Base-8K: 24 Mamba-2, 4 attention, 24 MLP blocks.
    "nemotron-h-8b": {"model_type": "nemotron_h", "hidden_size": 4096, "num_attention_heads": 32,
                      "num_key_value_heads": 8, "head_dim": 128, "mamba_num_heads": 128, "mamba_head_dim": 64,
                      "n_groups": 8, "ssm_state_size": 128, "conv_kernel": 4, "torch_dtype": "bfloat16",
                      "hybrid_override_pattern": "M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M-M-M-M-M-"},
    # ibm-ai-platform/Bamba-9B: attention at layers 9, 18, 27 of 32.
    "bamba-9b": {"model_type": "bamba", "hidden_size": 4096, "num_hidden_layers": 32,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "attn_layer_indices": [9, 18, 27],
                 "mamba_n_heads": 128, "mamba_d_head": 64, "mamba_n_groups": 1, "mamba_d_state": 128,
                 "mamba_d_conv": 4, "mamba_expand": 2, "torch_dtype": "bfloat16"},
    # tiiuae/Falcon-H1-7B-Base: parallel attention + Mamba-2 in each of 44 layers.
    "falcon-h1-7b": {"model_type": "falcon_h1", "hidden_size": 3072, "num_hidden_layers": 44,
                     "num_attention_heads": 12, "num_key_value_heads": 2, "head_dim": 128,
                     "mamba_d_ssm": 3072, "mamba_n_heads": 24, "mamba_d_head": 128, "mamba_n_groups": 1,
                     "mamba_d_state": 256, "mamba_d_conv": 4, "torch_dtype": "bfloat16"},
    # Qwen/Qwen3-Next-80B-A3B: gated DeltaNet, one full-attention layer in four.
    "qwen3-next-80b-a3b": {"model_type": "qwen3_next", "hidden_size": 2048, "num_hidden_layers": 48,
                           "full_attention_interval": 4, "num_attention_heads": 16, "num_key_value_heads": 2,
                           "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
                           "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
                           "torch_dtype": "bfloat16"},
}

PRESETS: dict[str, ModelSpec] = {
    # The Marconi paper's 7B hybrid: {4, 24, 28} {attention, SSM, MLP} layers, D=4096, N=128, fp16.
    "paper-7b": ModelSpec(name="paper-7b", num_attn_layers=4, num_ssm_layers=24, num_mlp_layers=28,
                          d_model=4096, ssm_state_dim=128, conv_kernel=4, ssm_expand=2, num_kv_heads=32,
                          head_dim=128, bytes_per_elem=2, source="Marconi paper §5.1 / App. A"),
    **{name: ModelSpec.from_hf_config(cfg, name=name) for name, cfg in _PUBLISHED_CONFIGS.items()},
    # Same layer mix as paper-7b with attention only (the paper's 0:36 limit in Fig. 12a).
    "transformer-7b": ModelSpec(name="transformer-7b", num_attn_layers=32, num_ssm_layers=0, num_mlp_layers=32,
                                d_model=4096, ssm_state_dim=0, num_kv_heads=32, head_dim=128,
                                source="pure transformer reference"),
}


def list_models() -> list[ModelSpec]:
    return list(PRESETS.values())


def get_model(name_or_path: str | ModelSpec) -> ModelSpec:
    """A preset by name, or a spec built from a local HF ``config.json`` / model directory."""
    if isinstance(name_or_path, ModelSpec):
        return name_or_path
    if not isinstance(name_or_path, (str, PurePath)):
        hint = " (for a config dict, call ModelSpec.from_hf_config)" if isinstance(name_or_path, Mapping) else ""
        raise SpecError(f"model must be a ModelSpec, a preset name ({', '.join(PRESETS)}) or a path to a Hugging "
                        f"Face config.json / model directory, got {type(name_or_path).__name__}{hint}")
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    if isinstance(name_or_path, str) and not name_or_path.strip():
        raise SpecError(f"model name is empty: use one of {', '.join(PRESETS)} "
                        "or a path to a Hugging Face config.json / model directory")
    path = Path(name_or_path)
    try:
        exists = path.exists()
    except (OSError, ValueError):  # a name too long for a path, a NUL byte
        exists = False
    if exists:
        return ModelSpec.from_hf_config(path)
    name = str(name_or_path)
    shown = name if len(name) <= 80 else name[:77] + "..."
    if "/" in name or os.sep in name or name.endswith(".json"):     # meant as a path: say it is not there
        raise SpecError(f"model {shown!r}: no such file or directory (a path to a Hugging Face config.json / "
                        f"model directory), nor a preset: {', '.join(PRESETS)}")
    raise SpecError(f"unknown model {shown!r}: use one of {', '.join(PRESETS)} "
                    "or a path to a Hugging Face config.json / model directory")
