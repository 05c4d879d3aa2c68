"""What vLLM 0.32's block manager looks like for one model: block size, KV cache groups, pool; prefix hashes.

:func:`layout_for_spec` derives vLLM's :class:`VllmLayout` for a :class:`~marconi.core.model.ModelSpec`,
:func:`pool_capacity_bytes` inverts it, :func:`prefix_hashes` chains block hashes as vLLM does.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from marconi.core.model import ModelSpec
from marconi.core.registry import ConfigError
from marconi.integrations.vllm.policy import ATTENTION, MAMBA

__all__ = ["VllmLayout", "layout_for_spec", "vllm_lists_mamba_first", "pool_capacity_bytes", "prefix_hashes", "cdiv",
           "prefill_checkpoint_alignment_for", "MAMBA2_MODEL_TYPES", "checkpoint_position", "is_checkpoint_valid"]

# HF ``model_type``s whose vLLM 0.32 model builds its SSM layers from ``MambaMixer2``, which asks for
# in-pass prefill checkpoints (``num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1``).
MAMBA2_MODEL_TYPES = frozenset({"nemotron_h", "falcon_h1", "bamba", "zamba2", "granitemoehybrid", "mamba2"})


def prefill_checkpoint_alignment_for(spec: ModelSpec) -> int | None:
    """vLLM 0.32's Mamba ``prefill_checkpoint_alignment`` for ``spec`` on a GPU (from its HF
    ``model_type``): 1 for ``MambaMixer2`` models, ``None`` (no internal checkpoints) otherwise."""
    source = spec.source or ""
    return 1 if source.startswith("hf:") and source[3:] in MAMBA2_MODEL_TYPES else None


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive ``b``, in integers (vLLM's ``cdiv``)."""
    return -(-a // b)


def checkpoint_position(num_tokens: int, align: int) -> int:
    """vLLM's ``get_mamba_prefill_checkpoint_position`` (no EAGLE): the last ``align``-aligned
    position below ``num_tokens`` (one token is left to recompute on a resend)."""
    return max((num_tokens - 1) // align * align, 0)


def is_checkpoint_valid(start: int, end: int, position: int, unit: int, block_size: int, alignment: int | None) -> bool:
    """vLLM's ``is_mamba_prefill_checkpoint_valid``: can the backend export the state at
    ``position`` from inside one forward over ``[start, end)`` (into column ``cdiv(end, B) - 2``)?"""
    if alignment is None:
        return False
    return (start % unit == 0 and cdiv(end, block_size) - 2 > (start - 1) // block_size
            and start + unit <= position and start < position < end and (position - start) % alignment == 0)


@dataclass(frozen=True, slots=True)
class VllmLayout:
    """What vLLM's block manager looks like for one served model and configuration (vLLM's names;
    ConfigError for a value vLLM would refuse).

    Attributes:
        block_size: tokens per block (attention and Mamba blocks alike in align mode).
        num_blocks: blocks in the pool *including* vLLM's null block.
        group_kinds: ``"attention"``/``"mamba"`` per KV cache group, in vLLM's group order.
        block_bytes: bytes of one block across the layers of a group.
        retention_interval: ``prefix_cache_retention_interval`` (0: replay boundary and junctions
            only; ``None``: every block; ``k``: also every ``k`` tokens).
        prefix_match_unit: vLLM's hash granularity (``None``: the block).
        prefill_checkpoint_alignment: the backend exports the prompt's boundary state from inside
            the pass, into a reserved block (``None``: no internal checkpoints).
    """

    block_size: int
    num_blocks: int
    group_kinds: tuple[str, ...]
    block_bytes: int = 0
    max_num_batched_tokens: int = 2048
    long_prefill_token_threshold: int = 0
    retention_interval: int | None = 0
    prefix_match_unit: int | None = None
    shared_prefix_checkpoint: bool = False                 # enable_mamba_shared_prefix_checkpoint: inert without EAGLE
    prefill_checkpoint_alignment: int | None = None

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ConfigError(f"vllm-align: block size must be > 0, got {self.block_size}")
        if self.num_blocks < 2:
            raise ConfigError(f"vllm-align: the pool needs at least 2 blocks (one is vLLM's null block), "
                              f"got {self.num_blocks}; raise the capacity")
        kinds = set(self.group_kinds)
        if not kinds <= {ATTENTION, MAMBA} or ATTENTION not in kinds:
            raise ConfigError(f"vllm-align: groups must include an attention group and only "
                              f"attention/mamba groups, got {self.group_kinds}")
        if self.max_num_batched_tokens <= 0 or self.long_prefill_token_threshold < 0:
            raise ConfigError("vllm-align: max_num_batched_tokens must be > 0 and long_prefill_token_threshold >= 0")
        if self.retention_interval is not None and (self.retention_interval < 0
                                                    or self.retention_interval % self.block_size):
            raise ConfigError(f"vllm-align: retention interval must be >= 0 and a multiple of the block size "
                              f"{self.block_size} (as vLLM requires), got {self.retention_interval}")
        unit = self.prefix_match_unit
        if unit is not None and (unit <= 0 or self.block_size % unit):
            raise ConfigError(f"vllm-align: prefix_match_unit must divide the block size {self.block_size} "
                              f"(as vLLM requires), got {unit}")
        if self.prefill_checkpoint_alignment is not None and self.prefill_checkpoint_alignment <= 0:
            raise ConfigError(f"vllm-align: prefill_checkpoint_alignment must be > 0 or None, "
                              f"got {self.prefill_checkpoint_alignment}")

    @property
    def hash_block_size(self) -> int:
        return self.prefix_match_unit or self.block_size

    @property
    def has_mamba(self) -> bool:
        return MAMBA in self.group_kinds

    def describe(self) -> dict[str, Any]:
        return {"block_size": self.block_size, "num_blocks": self.num_blocks,
                "groups": ",".join("A" if k == ATTENTION else "M" for k in self.group_kinds),
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "retention_interval": self.retention_interval, "prefix_match_unit": self.hash_block_size,
                "shared_prefix_checkpoint": self.shared_prefix_checkpoint,
                "prefill_checkpoint_alignment": self.prefill_checkpoint_alignment}


def vllm_lists_mamba_first(spec: ModelSpec) -> bool:
    """Whether vLLM 0.32 lists ``spec``'s Mamba groups before its attention groups. vLLM groups the
    layers in the order the model registers them (``_get_kv_cache_groups_uniform_page_size``), so the
    kind of the first cached layer comes first. Every sequential hybrid preset starts with an SSM
    layer (Nemotron-H's pattern, Qwen3-Next's three linear layers before each full one, Jamba's
    attention at offset 4). A parallel hybrid, whose every layer has an attention, an SSM and an MLP
    branch (Falcon-H1), registers the attention branch first (vLLM's ``FalconH1ParallelHybrid``
    builds ``self_attn`` before ``mamba``). A replay takes the order from vLLM's own run instead."""
    parallel = spec.num_attn_layers == spec.num_ssm_layers == spec.num_mlp_layers > 0
    return not parallel


def layout_for_spec(spec: ModelSpec, *, capacity_bytes: float | None = None, num_blocks: int | None = None,
                    block_size: int | None = None, kernel_alignment: int = 16, mamba_first: bool | None = None,
                    **options: Any) -> VllmLayout:
    """The layout vLLM 0.32 would build for ``spec`` (a hybrid with attention and SSM layers): the
    block is the smallest multiple of ``kernel_alignment`` whose one-layer KV page holds a Mamba
    layer's state; groups have equal layer counts (the smaller count, or the larger within 1.5x).
    The pool is ``num_blocks``, or ``capacity_bytes`` over the block bytes plus the null block.
    ``mamba_first``: Mamba groups first; None (the default): the order vLLM 0.32 builds for ``spec``
    (:func:`vllm_lists_mamba_first`). Raises ConfigError without an attention layer or a size.
    """
    if spec.num_attn_layers == 0:
        raise ConfigError(f"vllm-align: {spec.name} has no attention layer; vLLM's hybrid cache needs one")
    kv_per_token_layer = spec.kv_bytes_per_token // spec.num_attn_layers
    state_per_layer = spec.ssm_state_bytes_per_layer + spec.conv_state_bytes_per_layer if spec.num_ssm_layers else 0
    if block_size is None:
        if state_per_layer:
            block_size = kernel_alignment * cdiv(state_per_layer, kernel_alignment * kv_per_token_layer)
        else:
            block_size = 16
    n_attn, n_ssm = spec.num_attn_layers, spec.num_ssm_layers
    counts = [n for n in (n_attn, n_ssm) if n]
    group_size = min(counts)
    if max(counts) < 1.5 * group_size:
        group_size = max(counts)
    attn_groups = [ATTENTION] * cdiv(n_attn, group_size)
    mamba_groups = [MAMBA] * (cdiv(n_ssm, group_size) if n_ssm else 0)
    if mamba_first is None:
        mamba_first = vllm_lists_mamba_first(spec)
    kinds = tuple(mamba_groups + attn_groups) if mamba_first else tuple(attn_groups + mamba_groups)
    block_bytes = block_size * kv_per_token_layer * group_size
    if num_blocks is None:
        if capacity_bytes is None:
            raise ConfigError("vllm-align: give a capacity or a number of blocks")
        num_blocks = int(capacity_bytes // block_bytes) + 1
    return VllmLayout(block_size=block_size, num_blocks=num_blocks, group_kinds=kinds, block_bytes=block_bytes,
                      **options)


def pool_capacity_bytes(spec: ModelSpec, num_blocks: int, block_size: int) -> int:
    """Bytes of a vLLM pool of ``num_blocks`` blocks (null block excluded), as ``vllm-align`` counts
    them: one block holds ``block_size`` tokens of KVs of one KV cache group's layers. The inverse of
    :func:`layout_for_spec`'s capacity -> blocks, so a simulated ``--capacity C`` gives a shadow ``C``."""
    layout = layout_for_spec(spec, num_blocks=num_blocks, block_size=block_size)
    return (num_blocks - 1) * layout.block_bytes


_ROOT = b"marconi-vllm-align"


def prefix_hashes(tokens: np.ndarray, unit: int, start: Sequence[bytes] = ()) -> list[bytes]:
    """Chained hashes of every full ``unit``-token prefix of ``tokens`` (vLLM's ``block_hashes``).

    ``start``: hashes already computed for a prefix of ``tokens`` (extended, not recomputed).
    Hash ``i`` identifies ``tokens[:(i+1)*unit]``; equal prefixes get equal hashes.
    """
    out = list(start)
    parent = out[-1] if out else _ROOT
    data = np.ascontiguousarray(tokens, dtype=np.int32)
    for i in range(len(out), len(data) // unit):
        parent = hashlib.blake2b(parent + data[i * unit:(i + 1) * unit].tobytes(), digest_size=16).digest()
        out.append(parent)
    return out
