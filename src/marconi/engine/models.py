"""Load a transformers hybrid LLM (random-weight preset or local checkpoint) as a :class:`HybridModel`
whose :class:`~marconi.core.model.ModelSpec` is checked against its real cache tensors
(:class:`SpecMismatchError`). Mamba-2, gated-DeltaNet and LFM2 hybrids; others refused. Preset
initialisation and caveats: docs/engine.md."""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from marconi.engine.errors import (
    EngineError,
    SpecMismatchError,
    TokenRangeError,
    UnsupportedModelError,
)
from marconi.engine.precision import float64_scans
from marconi.core.jsonfile import JsonError, described, read_json
from marconi.core.model import ModelSpec, SpecError

__all__ = [
    "ARCHITECTURES",
    "PRESETS",
    "Architecture",
    "CacheLayout",
    "Forward",
    "HybridModel",
    "build_model",
    "list_presets",
    "load_model",
    "measure_cache_bytes",
    "preset_config",
]


# ================================================================================ architectures
@dataclass(frozen=True, slots=True)
class Architecture:
    """What the engine needs to know about one transformers ``model_type``.

    ``chunk_size_attr`` / ``default_chunk_size``: where the scan's chunk length comes from (both None
    without a chunked scan). ``logits_post``: what ``*ForCausalLM`` does to ``lm_head``'s output, so
    logits can be recomputed from a kept hidden state (checked bitwise at load).
    """

    model_type: str
    mixer: str
    chunk_size_attr: str | None = None
    default_chunk_size: int | None = None
    logits_post: Callable[[Any, torch.Tensor], torch.Tensor] | None = None

    def chunk_size(self, config: Any) -> int | None:
        if self.chunk_size_attr is not None:
            return int(getattr(config, self.chunk_size_attr))
        return self.default_chunk_size


def _float_logits(module: Any, logits: torch.Tensor) -> torch.Tensor:
    return logits.float()                                   # NemotronHForCausalLM


def _lm_head_multiplier(module: Any, logits: torch.Tensor) -> torch.Tensor:
    return logits * module.model.lm_head_multiplier         # FalconH1ForCausalLM


def _logits_scaling(module: Any, logits: torch.Tensor) -> torch.Tensor:
    return logits / module.config.logits_scaling            # GraniteMoeHybridForCausalLM


ARCHITECTURES: dict[str, Architecture] = {a.model_type: a for a in (
    Architecture("bamba", "mamba2", "mamba_chunk_size"),
    Architecture("nemotron_h", "mamba2", "chunk_size", logits_post=_float_logits),
    Architecture("falcon_h1", "mamba2", "mamba_chunk_size", logits_post=_lm_head_multiplier),
    Architecture("zamba2", "mamba2", "chunk_size"),
    Architecture("granitemoehybrid", "mamba2", "mamba_chunk_size", logits_post=_logits_scaling),
    Architecture("qwen3_next", "gated-deltanet", default_chunk_size=64),
    Architecture("olmo_hybrid", "gated-deltanet", default_chunk_size=64),
    Architecture("lfm2", "short-conv"),
)}

_MAMBA1 = {"jamba": "Jamba", "zamba": "Zamba (v1)", "mamba": "Mamba", "falcon_mamba": "FalconMamba"}


def _architecture(model_type: Any) -> Architecture:
    if not isinstance(model_type, str):  # (a list would not even hash)
        raise UnsupportedModelError(f"model_type must be a string naming the architecture, got "
                                    f"{described(model_type)}; the engine serves {', '.join(sorted(ARCHITECTURES))}")
    if model_type in _MAMBA1:
        raise UnsupportedModelError(
            f"{_MAMBA1[model_type]} ({model_type!r}) uses Mamba-1 layers: transformers' torch scan restarts "
            "from a zero state on every multi-token forward, so a prefill cannot resume from a cached "
            "state and prefix reuse would not be exact. Supported: " + ", ".join(sorted(ARCHITECTURES)))
    arch = ARCHITECTURES.get(model_type)
    if arch is None:
        raise UnsupportedModelError(f"unsupported model_type {model_type!r}; the engine serves "
                                    f"{', '.join(sorted(ARCHITECTURES))}")
    return arch


# ================================================================================ presets
_V = 32000  # Mistral-v1 / Llama-2 vocabulary: the project tokenizer's ids fit as they are
# initializer_range = 1/sqrt(D): O(1) activations in every projection (transformers' 0.02 default
# leaves a tiny random model's SSM states ~1e-5, too small to matter in an exactness test).
_TINY_ATTN = dict(vocab_size=_V, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, tie_word_embeddings=False, initializer_range=64 ** -0.5)
# Nemotron-H and Zamba2 clamp dt >= time_step_min in their chunked scan but not in their 1-token
# decode step (transformers 5.24), so the same token gives different states by path when the
# clamp bites; time_step_min = 1e-9 (not 0: their init takes its log) makes it a no-op.
_NO_DT_CLAMP = dict(time_step_min=1e-9)
_TINY_MAMBA = dict(mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16, mamba_n_groups=1, mamba_d_conv=4)

PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    # Tiny configs for tests (~2-4M parameters, most of them the 32k embedding / LM head).
    "bamba-tiny": ("bamba", {**_TINY_ATTN, **_TINY_MAMBA, "num_hidden_layers": 4, "attn_layer_indices": [1],
                             "mamba_chunk_size": 16}),
    "nemotron_h-tiny": ("nemotron_h", {**_TINY_ATTN, "head_dim": 16, "hybrid_override_pattern": "M*M-M-",
                                       "mamba_num_heads": 8, "mamba_head_dim": 16, "ssm_state_size": 16,
                                       "n_groups": 2, "conv_kernel": 4, "chunk_size": 16, **_NO_DT_CLAMP}),
    "falcon_h1-tiny": ("falcon_h1", {**_TINY_ATTN, **_TINY_MAMBA, "head_dim": 16, "num_hidden_layers": 2,
                                     "mamba_d_ssm": 128, "mamba_chunk_size": 16}),
    "zamba2-tiny": ("zamba2", {**_TINY_ATTN, "num_hidden_layers": 4, "num_key_value_heads": 4,
                               "layers_block_type": ["mamba", "hybrid", "mamba", "mamba"], "n_mamba_heads": 8,
                               "mamba_d_state": 16, "mamba_ngroups": 1, "chunk_size": 16, **_NO_DT_CLAMP}),
    "granitemoehybrid-tiny": ("granitemoehybrid", {**_TINY_ATTN, **_TINY_MAMBA, "num_hidden_layers": 4,
                                                   "layer_types": ["mamba", "attention", "mamba", "mamba"],
                                                   "num_local_experts": 0, "shared_intermediate_size": 128,
                                                   "mamba_chunk_size": 16}),
    "qwen3_next-tiny": ("qwen3_next", {**_TINY_ATTN, "head_dim": 16, "num_hidden_layers": 4,
                                       "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                                       "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                                       "num_experts": 0, "mlp_only_layers": [0, 1, 2, 3]}),
    "olmo_hybrid-tiny": ("olmo_hybrid", {**_TINY_ATTN, "num_hidden_layers": 4, "linear_key_head_dim": 16,
                                         "linear_value_head_dim": 16, "linear_num_key_heads": 2,
                                         "linear_num_value_heads": 4, "pad_token_id": 0, "eos_token_id": 2}),
    "lfm2-tiny": ("lfm2", {**_TINY_ATTN, "num_hidden_layers": 4, "full_attn_idxs": [1]}),
    # Benchmark model: a 79M-parameter Bamba (12 layers, attention at 3 and 9; D=512, N=64). Scan
    # chunk 128 (Nemotron-H's; Bamba-9B uses 256): the torch SSD scan pads every forward to whole
    # chunks, and on a CPU 128 is the faster setting for both short and long prefills.
    "bamba-bench": ("bamba", {"vocab_size": _V, "hidden_size": 512, "intermediate_size": 1536,
                              "num_hidden_layers": 12, "attn_layer_indices": [3, 9], "num_attention_heads": 8,
                              "num_key_value_heads": 4, "mamba_n_heads": 16, "mamba_d_head": 64,
                              "mamba_d_state": 64, "mamba_n_groups": 1, "mamba_d_conv": 4,
                              "mamba_chunk_size": 128, "tie_word_embeddings": False,
                              "initializer_range": 512 ** -0.5}),
}


def list_presets() -> list[str]:
    return list(PRESETS)


def preset_config(name: str) -> Any:
    """The transformers config of a preset (no weights)."""
    from transformers import AutoConfig

    if name not in PRESETS:
        raise EngineError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    model_type, kwargs = PRESETS[name]
    return AutoConfig.for_model(model_type, **kwargs)


# ================================================================================ cache layout
@dataclass(frozen=True, slots=True)
class CacheLayout:
    """``DynamicCache`` layers holding KVs (``attn_layers``) and recurrent states (``ssm_layers``),
    ascending; a layer may be in both (parallel hybrids)."""

    attn_layers: tuple[int, ...]
    ssm_layers: tuple[int, ...]
    num_layers: int

    @classmethod
    def from_config(cls, config: Any) -> CacheLayout:
        from transformers import DynamicCache
        from transformers.cache_utils import (
            CacheLayerMixin,
            DynamicSlidingWindowLayer,
            LinearAttentionCacheLayerMixin,
        )

        layers = DynamicCache(config=config).layers
        attn, ssm = [], []
        for i, layer in enumerate(layers):
            if isinstance(layer, DynamicSlidingWindowLayer):
                raise UnsupportedModelError(f"layer {i} uses sliding-window attention: its KVs cannot be "
                                            "sliced to an arbitrary prefix; not supported")
            if isinstance(layer, CacheLayerMixin):
                attn.append(i)
            if isinstance(layer, LinearAttentionCacheLayerMixin):
                if layer.number_of_states != 1:
                    raise UnsupportedModelError(f"layer {i} keeps {layer.number_of_states} recurrent states; "
                                                "only one per layer is supported")
                ssm.append(i)
        if not attn and not ssm:
            raise UnsupportedModelError("the model's cache has no attention and no recurrent layer")
        return cls(tuple(attn), tuple(ssm), len(layers))


# ================================================================================ the model
class Forward(NamedTuple):
    """``logits`` ``[k, vocab]`` of the last ``k`` positions; ``hidden`` ``[1, 1, D]``, the last
    position's final hidden state (a view: clone to keep)."""

    logits: torch.Tensor
    hidden: torch.Tensor


@dataclass(eq=False)
class HybridModel:
    """A loaded hybrid LLM (build with :func:`load_model`): ``module`` (eval, no grad), ``config``,
    ``arch``, ``dtype`` (float32/64), ``layout``, ``spec`` (checked), ``chunk_size`` (None: no
    chunked scan)."""

    name: str
    module: Any
    config: Any
    arch: Architecture
    dtype: torch.dtype
    layout: CacheLayout = field(init=False)
    spec: ModelSpec = field(init=False)
    chunk_size: int | None = field(init=False)

    def __post_init__(self) -> None:
        self.layout = CacheLayout.from_config(self.config)
        self.chunk_size = self.arch.chunk_size(self.config)
        head = self.module.get_output_embeddings()
        if head is None:
            raise UnsupportedModelError(f"{self.name} has no output embeddings (LM head)")
        # The LM head's input is the last position's final hidden state: a hook hands it to
        # ``forward_full`` (per thread, so concurrent requests never see each other's).
        self._head = head
        self._seen = threading.local()
        hook = head.register_forward_hook(self._remember_head_input)
        try:
            self.spec = spec_from_config(self.config, name=self.name, dtype=self.dtype)
            check_spec(self, self.spec)
            check_head(self)
        except BaseException:
            hook.remove()
            raise

    def _remember_head_input(self, module: Any, args: tuple[Any, ...], output: Any) -> None:
        self._seen.head_input = args[0]

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.module.parameters())

    def new_cache(self) -> Any:
        """An empty ``DynamicCache`` laid out for this model."""
        from transformers import DynamicCache

        return DynamicCache(config=self.config)

    def check_tokens(self, token_ids: Any) -> torch.Tensor:
        """Validate ids and return them as a 1-D int64 tensor; raises :class:`TokenRangeError`."""
        ids = _as_id_tensor(token_ids)
        if ids.dim() != 1:
            raise TokenRangeError(f"token ids must be a 1-D sequence of integers, got shape {tuple(ids.shape)}")
        if ids.numel() == 0:
            raise TokenRangeError("no token ids: a request needs at least one token")
        if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.is_complex():
            raise TokenRangeError(f"token ids must be integers, got {str(ids.dtype).removeprefix('torch.')} "
                                  f"values such as {ids.flatten()[0].item()!r}")
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.vocab_size:
            bad = lo if lo < 0 else hi
            raise TokenRangeError(f"token id {bad} is outside the vocabulary [0, {self.vocab_size}) of "
                                  f"{self.name}; ids are never folded — use a tokenizer whose ids fit")
        return ids.to(torch.int64)

    def forward(self, cache: Any, token_ids: torch.Tensor, start: int, *, keep_logits: int = 1) -> torch.Tensor:
        """Run ``token_ids`` at positions ``start..`` through the model, extending ``cache`` in place.

        ``cache`` must hold exactly ``start`` tokens (checked with attention). Returns float logits
        ``[k, vocab]`` of the last ``k = keep_logits`` positions (0: all). A 1-token call takes the decode
        path, longer calls the chunked scan.
        """
        return self.forward_full(cache, token_ids, start, keep_logits=keep_logits).logits

    def forward_full(self, cache: Any, token_ids: torch.Tensor, start: int, *, keep_logits: int = 1) -> Forward:
        """:meth:`forward`, also returning the last position's final hidden state (see :class:`Forward`)."""
        if self.layout.attn_layers and cache.get_seq_length() != start:
            raise EngineError(f"cache holds {cache.get_seq_length()} tokens but the forward starts at {start}")
        ids = token_ids.reshape(1, -1)
        positions = torch.arange(start, start + ids.shape[1]).unsqueeze(0)
        self._seen.head_input = None
        with torch.no_grad(), float64_scans(self.arch.model_type):
            out = self.module(input_ids=ids, cache=cache, use_cache=True, position_ids=positions,
                              logits_to_keep=keep_logits)
        seen, self._seen.head_input = self._seen.head_input, None
        if seen is None:
            raise EngineError(f"{self.name}: the forward did not call its LM head")
        return Forward(out.logits[0], seen[:, -1:, :])

    def logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits ``[1, vocab]`` from a hidden state kept by :meth:`forward_full`: bitwise that forward's
        own one-row logits (:func:`check_head` proves it at load)."""
        with torch.no_grad():
            logits = self._head(hidden)
            if self.arch.logits_post is not None:
                logits = self.arch.logits_post(self.module, logits)
        return logits[0]


# ================================================================================ spec
def _spec_config_dict(config: Any) -> dict[str, Any]:
    """``config.to_dict()``, with Nemotron-H's derived layer pattern kept if the dict lacks it."""
    cfg = config.to_dict()
    if cfg.get("model_type") == "nemotron_h" and getattr(config, "hybrid_override_pattern", None):
        cfg["hybrid_override_pattern"] = config.hybrid_override_pattern
    return cfg


def spec_from_config(config: Any, *, name: str, dtype: torch.dtype) -> ModelSpec:
    """The byte model: the architecture's states plus the final hidden state kept per checkpoint."""
    bytes_per_elem = torch.finfo(dtype).bits // 8
    try:
        spec = ModelSpec.from_hf_config(_spec_config_dict(config), name=name, bytes_per_elem=bytes_per_elem)
    except SpecError as exc:
        raise EngineError(f"cannot build a ModelSpec for {name}: {exc}") from None
    return spec.with_changes(checkpoint_extra_bytes=int(config.hidden_size) * bytes_per_elem)


class CacheBytes(NamedTuple):
    """Bytes measured on a model's real cache tensors."""

    kv_bytes_per_token: int      # keys + values of one token, all attention layers
    ssm_checkpoint_bytes: int    # conv + recurrent state, all recurrent layers
    num_kv_layers: int
    num_ssm_layers: int


def measure_cache_bytes(model: HybridModel, num_tokens: int = 3) -> CacheBytes:
    """Prefill ``num_tokens`` and measure real bytes: KV per token over attention layers, and per
    checkpoint the conv + recurrent states of every recurrent layer plus the final hidden state."""
    from marconi.engine.states import capture_ssm, slice_kv

    cache = model.new_cache()
    with _quiet_transformers():
        fwd = model.forward_full(cache, torch.arange(num_tokens) % model.vocab_size, 0)
        kv = slice_kv(cache, model.layout, 0, num_tokens) if model.layout.attn_layers else None
        ssm = capture_ssm(cache, model.layout, num_tokens, fwd.hidden) if model.layout.ssm_layers else None
        # One decode step too: transformers prints one-time notices on each path's first use.
        model.forward(cache, torch.tensor([1]), num_tokens)
    kv_bytes = kv.nbytes // num_tokens if kv is not None else 0
    return CacheBytes(kv_bytes, ssm.nbytes if ssm is not None else 0, len(model.layout.attn_layers),
                      len(model.layout.ssm_layers))


def check_spec(model: HybridModel, spec: ModelSpec) -> None:
    """Raise :class:`SpecMismatchError` unless ``spec`` accounts ``model``'s cache tensors exactly."""
    real = measure_cache_bytes(model)
    problems = []
    if spec.kv_bytes_per_token != real.kv_bytes_per_token:
        problems.append(f"KV bytes per token: spec {spec.kv_bytes_per_token}, model's cache "
                        f"{real.kv_bytes_per_token}")
    if spec.ssm_checkpoint_bytes != real.ssm_checkpoint_bytes:
        problems.append(f"SSM checkpoint bytes (conv + recurrent, all layers): spec {spec.ssm_checkpoint_bytes}, "
                        f"model's cache {real.ssm_checkpoint_bytes}")
    if spec.num_attn_layers != real.num_kv_layers:
        problems.append(f"attention layers: spec {spec.num_attn_layers}, cache layers with KVs {real.num_kv_layers}")
    if spec.num_ssm_layers != real.num_ssm_layers:
        problems.append(f"SSM layers: spec {spec.num_ssm_layers}, cache layers with a state {real.num_ssm_layers}")
    if problems:
        raise SpecMismatchError(f"spec {spec.name!r} disagrees with {model.name}'s real cache tensors: "
                                + "; ".join(problems))


def check_head(model: HybridModel) -> None:
    """Raise :class:`SpecMismatchError` unless logits recomputed from a kept hidden state are bitwise the
    forward's own (a whole-prompt hit decodes from them)."""
    cache = model.new_cache()
    with _quiet_transformers():
        fwd = model.forward_full(cache, torch.arange(5) * 7 % model.vocab_size, 0)
    again = model.logits_from_hidden(fwd.hidden.clone())
    if again.dtype != fwd.logits.dtype or not torch.equal(again, fwd.logits):
        raise SpecMismatchError(f"{model.name}: logits recomputed from the final hidden state differ from the "
                                f"forward's ({model.arch.model_type}'s LM head post-processing changed?)")


# torch implements no min/max for these (a numpy uint64 id array became one of them and crashed).
_WIDE_UNSIGNED = tuple(getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name))


def _as_id_tensor(token_ids: Any) -> torch.Tensor:
    """``torch.as_tensor`` with a clear error for non-ids; unsigned ids become int64 (>= 2**63 refused)."""
    if isinstance(token_ids, (str, bytes)):
        raise TokenRangeError(f"token ids must be a sequence of integers, got text {token_ids[:40]!r}; "
                              "tokenize it first (Engine.generate tokenizes a str prompt)")
    if isinstance(token_ids, torch.Tensor) and token_ids.dtype in _WIDE_UNSIGNED:
        token_ids = token_ids.numpy()
    if isinstance(token_ids, np.ndarray):
        if token_ids.dtype.kind == "u":
            if token_ids.size and token_ids.max() > np.iinfo(np.int64).max:
                raise TokenRangeError(f"token id {int(token_ids.max())} fits no vocabulary (ids are < 2**63); ids "
                                      "are never folded — use a tokenizer whose ids fit")
            token_ids = token_ids.astype(np.int64)  # a copy, writable
        elif not token_ids.flags.writeable:
            token_ids = token_ids.copy()  # trace arrays are read-only views; torch wants to own writable memory
    try:
        return torch.as_tensor(token_ids)
    except (TypeError, ValueError, RuntimeError) as exc:
        sample = list(token_ids[:3]) if isinstance(token_ids, (list, tuple)) else type(token_ids).__name__
        raise TokenRangeError(f"token ids must be a 1-D sequence of integers, got {sample!r}... ({exc})") from None


# ================================================================================ loading
_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _as_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in _DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype.removeprefix("torch.") in _DTYPES:
        return _DTYPES[dtype.removeprefix("torch.")]
    raise EngineError(f"dtype must be one of {', '.join(_DTYPES)} (CPU engine), got {dtype!r}")


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Silence transformers' one-time notices (e.g. 'falling back to the PyTorch implementation')."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def _mamba2_style_init(module: Any, generator: torch.Generator) -> None:
    """Mamba-2 initialisation of every mixer's ``A_log`` / ``dt_bias``: A ~ U[1,16], dt ~ logU[1e-3,1e-1];
    and its skip ``D`` set to 0, so the mixer's output is the state's read-out.

    Why ``D = 0``: transformers initialises ``D`` to 1, and in a random model that skip term swamps
    ``C·h``: zeroing every recurrent state at position 50 of 200 moved the float64 logits by 1e-3 to
    3.5e-2 (of ~0.8) and the greedy token at 0 to 3 of 150 positions (bamba, nemotron_h, zamba2,
    granitemoehybrid), so a token-level reuse test could not see a wrong state. With ``D = 0``:
    0.18 to 1.1, and 14 to 134 of 150 tokens (an audit, 2026-12-06)."""
    for sub in module.modules():
        a_log, dt_bias = getattr(sub, "A_log", None), getattr(sub, "dt_bias", None)
        if not isinstance(a_log, torch.nn.Parameter) or not isinstance(dt_bias, torch.nn.Parameter):
            continue
        if a_log.shape != dt_bias.shape:
            continue
        with torch.no_grad():
            a = torch.empty(a_log.shape, dtype=torch.float64).uniform_(1.0, 16.0, generator=generator)
            log_dt = torch.empty(dt_bias.shape, dtype=torch.float64).uniform_(
                math.log(1e-3), math.log(1e-1), generator=generator)
            dt = log_dt.exp()
            a_log.copy_(a.log())
            dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
            skip = getattr(sub, "D", None)
            if isinstance(skip, torch.nn.Parameter):
                skip.zero_()


def build_model(config: Any, *, dtype: str | torch.dtype = "float32", seed: int = 0,
                name: str | None = None) -> HybridModel:
    """A random-weight model from a transformers config, seeded (global RNG state untouched)."""
    from transformers import AutoModelForCausalLM

    arch = _architecture(getattr(config, "model_type", None))
    torch_dtype = _as_dtype(dtype)
    with torch.random.fork_rng(devices=[]), _quiet_transformers():
        torch.manual_seed(seed)
        module = AutoModelForCausalLM.from_config(config)
        generator = torch.Generator().manual_seed(seed + 1)
        _mamba2_style_init(module, generator)
        head = module.get_output_embeddings()
        if head is not None and head.weight is not module.get_input_embeddings().weight:
            with torch.no_grad():  # transformers' default scale: logits O(1) on an O(1) body
                head.weight.normal_(0.0, 0.02, generator=generator)
    module = module.to(torch_dtype).eval()
    return HybridModel(name or f"{arch.model_type}-random", module, module.config, arch, torch_dtype)


def load_checkpoint(path: str | Path, *, dtype: str | torch.dtype = "float32") -> HybridModel:
    """A local checkpoint directory (nothing downloaded). EngineError naming the file and the fix for a
    bad ``config.json``, corrupt or mis-shaped weights, or none; UnsupportedModelError otherwise."""
    from transformers import AutoConfig, AutoModelForCausalLM

    directory = Path(path)
    if not directory.is_dir():
        raise EngineError(f"{directory} is not a directory: pass a preset name or a checkpoint directory")
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise EngineError(f"{directory} has no config.json: a checkpoint directory needs config.json + weights")
    _architecture(_config_model_type(_read_config_json(config_file), config_file))
    torch_dtype = _as_dtype(dtype)
    _check_weight_files(directory)
    with _quiet_transformers():
        try:
            config = AutoConfig.from_pretrained(directory, local_files_only=True)
        except Exception as exc:  # transformers' own validation: a null or mistyped field ...
            raise EngineError(f"{config_file}: transformers cannot build a config from it ({_brief(exc)}); "
                              "fix the field it names") from exc
        try:
            module = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True, dtype=torch_dtype)
        except OSError as exc:
            raise EngineError(f"cannot load weights from {directory}: {exc}") from None
        except Exception as exc:  # size mismatches (RuntimeError), a weights file broken past its header ...
            mismatches = _shape_mismatches(directory, config)
            if mismatches:
                raise EngineError(f"cannot load weights from {directory}: their shapes disagree with "
                                  f"{config_file.name}: " + "; ".join(mismatches)) from None
            raise EngineError(f"cannot load weights from {directory}: {_brief(exc)}") from exc
    arch = _architecture(config.model_type)
    return HybridModel(str(directory), module.eval(), module.config, arch, torch_dtype)


def _brief(exc: BaseException) -> str:
    """An exception as one line for a message: its type and the first line of its text."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _read_config_json(config_file: Path) -> dict[str, Any]:
    """``config.json`` as a dict; EngineError naming the file if it is not a readable JSON object."""
    try:
        raw = read_json(config_file)
    except JsonError as exc:
        raise EngineError(f"{exc.where}: not valid JSON ({exc.reason})") from None
    if not isinstance(raw, dict):
        raise EngineError(f"{config_file}: expected a JSON object (a Hugging Face config.json), "
                          f"got {described(raw)}")
    return raw


def _config_model_type(raw: Mapping[str, Any], config_file: Path) -> Any:
    """The config's ``model_type``, or its ``text_config``'s (a multimodal wrapper's)."""
    model_type = raw.get("model_type")
    if not model_type and "text_config" in raw:
        text = raw["text_config"]
        if not isinstance(text, Mapping):
            raise EngineError(f"{config_file}: text_config must be a JSON object (the language model's config), "
                              f"got {described(text)}")
        model_type = text.get("model_type")
    return model_type


def _check_weight_files(directory: Path) -> None:
    """EngineError naming the first empty or unreadable ``*.safetensors`` file (a cut-short copy)."""
    from safetensors import SafetensorError, safe_open

    for weights in sorted(directory.glob("*.safetensors")):
        if weights.stat().st_size == 0:
            raise EngineError(f"{weights}: the weights file is empty (a copy or download cut short?); copy it again")
        try:
            with safe_open(weights, framework="pt") as handle:
                handle.keys()
        except (SafetensorError, OSError) as exc:
            raise EngineError(f"{weights}: not a readable safetensors file ({exc}); the copy or download is "
                              "incomplete or corrupt: copy it again") from None


def _shape_mismatches(directory: Path, config: Any, limit: int = 3) -> list[str]:
    """Up to ``limit`` tensors whose file shape differs from ``config``'s, described for a message."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            expected = {k: tuple(v.shape) for k, v in AutoModelForCausalLM.from_config(config).state_dict().items()}
        found: list[str] = []
        for weights in sorted(directory.glob("*.safetensors")):
            with safe_open(weights, framework="pt") as handle:
                for key in handle.keys():
                    shape, want = tuple(handle.get_slice(key).get_shape()), expected.get(key)
                    if want is None or want == shape:
                        continue
                    text = f"{key} is {shape} in {weights.name} but {want} by the config"
                    vocab = getattr(config, "vocab_size", None)
                    if ("embed" in key or "lm_head" in key) and shape and want and shape[0] != want[0] == vocab:
                        text += (f" (vocab_size is {vocab}; the checkpoint's vocabulary has {shape[0]} ids: "
                                 f"fix vocab_size)")
                    found.append(text)
                    if len(found) >= limit:
                        return found
        return found
    except Exception:  # only a diagnosis: the caller reports the loader's own error instead
        return []


def load_model(name_or_path: str | Path, *, dtype: str | torch.dtype = "float32", seed: int = 0) -> HybridModel:
    """A preset (random weights, ``seed``) or a local checkpoint directory, in ``dtype``. EngineError for
    an empty name (``Path("")`` would be the current directory), an unknown name, or a bad checkpoint."""
    if not is_model_source(name_or_path):
        raise EngineError(unknown_model(name_or_path))
    if isinstance(name_or_path, str) and name_or_path in PRESETS:
        return build_model(preset_config(name_or_path), dtype=dtype, seed=seed, name=name_or_path)
    return load_checkpoint(Path(name_or_path), dtype=dtype)


def is_model_source(name_or_path: str | Path) -> bool:
    """Whether :func:`load_model` would find ``name_or_path``: a preset's name or an existing path
    (what it loads from there is checked when it loads). False for an empty name (``Path("")``
    would be the current directory)."""
    if isinstance(name_or_path, str):
        if not name_or_path.strip():
            return False
        if name_or_path in PRESETS:
            return True
    return Path(name_or_path).exists()


def unknown_model(name_or_path: str | Path) -> str:
    """The one wording for a model :func:`is_model_source` does not find (commands prefix their flag)."""
    what = (f"the model is empty ({name_or_path!r})" if isinstance(name_or_path, str) and not name_or_path.strip()
            else f"unknown model {str(name_or_path)!r}")
    return f"{what}: use a preset ({', '.join(PRESETS)}) or a local checkpoint directory"


def describe(model: HybridModel) -> Mapping[str, Any]:
    """A flat summary for tables (no tensors)."""
    return {"model": model.name, "model_type": model.arch.model_type, "mixer": model.arch.mixer,
            "dtype": str(model.dtype).removeprefix("torch."), "parameters": model.num_parameters,
            "chunk_size": model.chunk_size, **model.spec.describe()}
