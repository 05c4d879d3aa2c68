"""vLLM's least pool: the blocks it needs before it starts, for one request of ``max_model_len`` tokens.

One arithmetic, every caller, each before any vLLM process starts: ``marconi vllm replay`` refuses a
``--blocks`` under it and notes a ``--capacity`` its worker raises to it
(:func:`~marconi.integrations.vllm.replay.run.check_pool`, at vLLM's block for a bundled model);
``marconi vllm diagnose`` refuses a ``--blocks`` under it on the layout it emulates. Imports
nothing from vLLM.

vLLM 0.32 (``get_kv_cache_configs``) refuses a pool whose blocks, less its null block, cannot hold
one ``max_model_len`` request: ``cdiv(max_model_len, block)`` blocks in each attention group and, in
the align mode prefix caching runs Mamba in, ``2 + num_prefill_checkpoint_blocks`` in each Mamba
group (1 checkpoint block for ``MambaMixer2`` models, none for GDN; no speculative decoding here).
A KV budget (``--capacity``, ``--gpu-memory``) under it the replay's worker raises to it instead
(``StubExecutor.determine_available_memory``, the records' ``kv_floor_applied``). For nemotron-h-8b
(6 Mamba groups, 1 attention group, 1,152-token blocks) and a 7,214-token request that is 7 + 6 x 3
+ 1 = 26 blocks, as vLLM's own floor gives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Sequence

from marconi.core.registry import ConfigError
from marconi.integrations.vllm.replay.configs import VLLM_BLOCK_SIZES, model_dir

if TYPE_CHECKING:
    from marconi.integrations.vllm.layout import VllmLayout

__all__ = ["MIN_MAX_MODEL_LEN", "MinimumPool", "replay_max_model_len", "minimum_pool", "layout_minimum_pool",
           "check_pool_blocks", "capacity_floor_note"]

#: The least ``max_model_len`` the replay gives vLLM, whatever the requests' lengths.
MIN_MAX_MODEL_LEN = 2048

#: Blocks a Mamba group holds per request in vLLM's align mode, before prefill checkpoint blocks.
_MAMBA_BLOCKS_PER_REQUEST = 2


class MinimumPool(NamedTuple):
    """vLLM's least pool for one model and ``max_model_len`` (tokens)."""

    num_blocks: int          # null block included: the least num_gpu_blocks vLLM starts with
    block_bytes: int         # bytes of one block of the pool (one block of one KV cache group's layers)
    max_model_len: int

    @property
    def pool_bytes(self) -> int:
        """The least KV budget, in bytes, that the worker leaves as it is."""
        return self.num_blocks * self.block_bytes


def replay_max_model_len(requests: Sequence[Any]) -> int:
    """vLLM's ``max_model_len`` for a replay of ``requests`` (each with ``input_tokens`` and
    ``output_tokens``): its longest sequence, input and output (at least one output token), and
    at least :data:`MIN_MAX_MODEL_LEN`."""
    longest = max((len(r.input_tokens) + max(1, len(r.output_tokens)) for r in requests), default=0)
    return max(longest, MIN_MAX_MODEL_LEN)


def layout_minimum_pool(layout: VllmLayout, max_model_len: int) -> MinimumPool:
    """vLLM's least pool for a model laid out as ``layout`` (its groups, block and Mamba prefill
    checkpoints; its ``num_blocks`` is not read) serving one ``max_model_len``-token request: the
    module docstring's arithmetic."""
    from marconi.integrations.vllm.layout import cdiv
    from marconi.integrations.vllm.policy import MAMBA

    num_mamba = layout.group_kinds.count(MAMBA)
    mamba_blocks = _MAMBA_BLOCKS_PER_REQUEST + (1 if layout.prefill_checkpoint_alignment is not None else 0)
    per_request = ((len(layout.group_kinds) - num_mamba) * cdiv(max_model_len, layout.block_size)
                   + num_mamba * mamba_blocks)
    return MinimumPool(per_request + 1, layout.block_bytes, max_model_len)


def minimum_pool(model: str, max_model_len: int) -> MinimumPool | None:
    """vLLM's least pool for ``model`` (:func:`layout_minimum_pool` on the ``vllm-align`` layout at
    vLLM's block, :data:`~marconi.integrations.vllm.replay.configs.VLLM_BLOCK_SIZES`, with the Mamba
    prefill checkpoints vLLM gives the model); None for a model whose block only vLLM knows (a
    model directory)."""
    from marconi.core.model import ModelSpec
    from marconi.integrations.vllm.layout import layout_for_spec, prefill_checkpoint_alignment_for

    block = VLLM_BLOCK_SIZES.get(model)
    if block is None:
        return None
    spec = ModelSpec.from_hf_config(model_dir(model) / "config.json", name=model)
    layout = layout_for_spec(spec, num_blocks=2, block_size=block,
                             prefill_checkpoint_alignment=prefill_checkpoint_alignment_for(spec))
    return layout_minimum_pool(layout, max_model_len)


def check_pool_blocks(num_blocks: int, least: MinimumPool | None, *, flag: str = "--blocks",
                      shorter: str | None = None) -> None:
    """Refuse a pool of ``num_blocks`` blocks (null block included) under ``least``, the least pool
    vLLM starts with (:func:`minimum_pool`, :func:`layout_minimum_pool`); None (only vLLM knows the
    model's block) passes.

    Raises:
        ConfigError: naming ``flag``, the least and the request's length; ``shorter``: the option
            that shortens the longest request, named too where its ``max_model_len`` is above
            :data:`MIN_MAX_MODEL_LEN` (None: the command has none).
    """
    if least is None or num_blocks >= least.num_blocks:
        return
    fix = f" or lower {shorter}" if shorter and least.max_model_len > MIN_MAX_MODEL_LEN else ""
    raise ConfigError(f"{flag} {num_blocks} is below vLLM's minimum of {least.num_blocks} blocks for one "
                      f"{least.max_model_len:,}-token request: give {flag} >= {least.num_blocks}{fix}")


def capacity_floor_note(capacity: str, kv_bytes: int, model: str, max_model_len: int, *,
                        flag: str = "--capacity") -> str | None:
    """The note for a KV budget of ``kv_bytes`` (``flag capacity``, resolved) that the replay's worker
    raises to vLLM's least pool (:func:`minimum_pool`), or None where it does not (the budget holds
    the least pool, or only vLLM knows the model's block). Every such point replays the same pool, so
    the note says so; its records carry ``kv_floor_applied``."""
    from marconi.units import format_bytes

    least = minimum_pool(model, max_model_len)
    if least is None or kv_bytes >= least.pool_bytes:
        return None
    return (f"{flag} {capacity} ({format_bytes(kv_bytes)}) raised to vLLM's minimum pool of {least.num_blocks} "
            f"blocks ({format_bytes(least.pool_bytes)}) for one {max_model_len:,}-token request: every point "
            f"under it replays that pool (records: kv_floor_applied)")
