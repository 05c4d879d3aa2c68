"""Cache payloads of the real engine: :class:`KVPayload` (a node's edge KVs,
``[1, H_kv, T, head_dim]`` per layer) and :class:`SSMPayload` (cloned conv ``[1, conv_dim, K]`` and
recurrent ``[1, H, P, N]`` states plus the ``[1, 1, D]`` hidden state); :func:`build_cache`
restores them; :class:`TensorPayloads` is the core's ``PayloadOps``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from marconi.engine.errors import EngineError

__all__ = [
    "KVPayload",
    "SSMPayload",
    "TensorPayloads",
    "build_cache",
    "capture_ssm",
    "concat_kv",
    "slice_kv",
]


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


@dataclass(frozen=True, slots=True, eq=False)
class KVPayload:
    """KVs of a run of tokens, one ``[1, H_kv, T, head_dim]`` key and value tensor per attention layer."""

    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]

    @property
    def num_tokens(self) -> int:
        return int(self.keys[0].shape[-2]) if self.keys else 0

    @property
    def nbytes(self) -> int:
        return sum(_nbytes(t) for t in self.keys) + sum(_nbytes(t) for t in self.values)


@dataclass(frozen=True, slots=True, eq=False)
class SSMPayload:
    """Every SSM layer's state after ``position`` tokens, and the final hidden state ``[1, 1, D]`` of
    position ``position - 1``."""

    conv: tuple[torch.Tensor, ...]
    recurrent: tuple[torch.Tensor | None, ...]
    position: int
    hidden: torch.Tensor

    @property
    def nbytes(self) -> int:
        return (sum(_nbytes(t) for t in self.conv) + sum(_nbytes(t) for t in self.recurrent)
                + _nbytes(self.hidden))


# ================================================================================ capture
def capture_ssm(cache: Any, layout: Any, position: int, hidden: torch.Tensor) -> SSMPayload:
    """Clone every SSM layer's conv + recurrent state of ``cache`` (holding ``position`` tokens) and
    ``hidden``."""
    if hidden.dim() != 3 or hidden.shape[:2] != (1, 1):
        raise EngineError(f"hidden state must be [1, 1, D] (one position), got {tuple(hidden.shape)}")
    conv, recurrent = [], []
    for i in layout.ssm_layers:
        layer = cache.layers[i]
        if not layer.has_previous_state[0]:
            raise EngineError(f"layer {i} has no state yet: run a prefill before capturing")
        conv.append(layer.conv_states[0].clone())
        rec = layer.recurrent_states[0] if layer.is_recurrent_states_initialized[0] else None
        recurrent.append(None if rec is None else rec.clone())
    return SSMPayload(tuple(conv), tuple(recurrent), position, hidden.clone())


def slice_kv(cache: Any, layout: Any, start: int, end: int) -> KVPayload:
    """Copy the KVs of tokens ``[start, end)`` of every attention layer of ``cache``."""
    keys, values = [], []
    for i in layout.attn_layers:
        layer = cache.layers[i]
        length = layer.get_seq_length()
        if not 0 <= start <= end <= length:
            raise EngineError(f"KV slice [{start}, {end}) outside layer {i}'s {length} cached tokens")
        keys.append(layer.keys[..., start:end, :].clone())
        values.append(layer.values[..., start:end, :].clone())
    return KVPayload(tuple(keys), tuple(values))


def concat_kv(parts: Sequence[KVPayload]) -> KVPayload:
    """One payload holding ``parts`` in order (along the token axis)."""
    if len(parts) == 1:
        return parts[0]
    num_layers = len(parts[0].keys)
    return KVPayload(tuple(torch.cat([p.keys[j] for p in parts], dim=-2) for j in range(num_layers)),
                     tuple(torch.cat([p.values[j] for p in parts], dim=-2) for j in range(num_layers)))


# ================================================================================ restore
def build_cache(model: Any, kv: Sequence[KVPayload], ssm: SSMPayload | None) -> Any:
    """A fresh ``DynamicCache`` holding ``kv`` (root to leaf) and ``ssm``, on new storage (decoding never
    writes into a payload). ``ssm`` must sit at the end of ``kv`` (with attention)."""
    cache = model.new_cache()
    layout = model.layout
    num_tokens = sum(p.num_tokens for p in kv)
    if ssm is None and num_tokens and layout.ssm_layers:
        raise EngineError(f"{num_tokens} KV tokens but no SSM state: a hybrid cannot resume from KVs alone")
    if ssm is not None and layout.attn_layers and ssm.position != num_tokens:
        raise EngineError(f"SSM state at position {ssm.position} but the KVs cover {num_tokens} tokens")
    if num_tokens:
        joined = concat_kv(list(kv))
        for j, i in enumerate(layout.attn_layers):
            cache.update(joined.keys[j], joined.values[j], i)
    if ssm is not None:
        for j, i in enumerate(layout.ssm_layers):
            conv = ssm.conv[j]
            cache.update_conv_state(conv, i, conv_kernel_size=conv.shape[-1])
            if ssm.recurrent[j] is not None:
                cache.update_recurrent_state(ssm.recurrent[j], i)
    return cache


# ================================================================================ PayloadOps
class TensorPayloads:
    """The core's ``PayloadOps`` for tensors: splits and joins copy, so each payload owns exactly its
    bytes; ``release`` only counts (the tree's references free the tensors)."""

    def __init__(self) -> None:
        self.num_splits = 0
        self.num_joins = 0
        self.num_released = 0
        self.released_bytes = 0

    def split_kv(self, kv: KVPayload, at: int) -> tuple[KVPayload, KVPayload]:
        if not 0 < at < kv.num_tokens:
            raise EngineError(f"split at {at} outside a KV payload of {kv.num_tokens} tokens")
        self.num_splits += 1
        first = KVPayload(tuple(k[..., :at, :].clone() for k in kv.keys),
                          tuple(v[..., :at, :].clone() for v in kv.values))
        rest = KVPayload(tuple(k[..., at:, :].clone() for k in kv.keys),
                         tuple(v[..., at:, :].clone() for v in kv.values))
        return first, rest

    def join_kv(self, first: KVPayload, second: KVPayload) -> KVPayload:
        self.num_joins += 1
        return concat_kv([first, second])

    def state_at(self, pos: int) -> None:
        """No state exists unless the engine captured it: a position it did not supply is unavailable."""
        return None

    def release(self, payload: Any) -> None:
        if not isinstance(payload, (KVPayload, SSMPayload)):
            raise EngineError(f"release of a non-tensor payload {type(payload).__name__}")
        self.num_released += 1
        self.released_bytes += payload.nbytes
