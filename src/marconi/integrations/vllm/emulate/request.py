"""A request as vLLM's block manager sees it (``vllm/v1/request.py``): tokens, hashes, progress."""

from __future__ import annotations

import numpy as np

from marconi.integrations.vllm.layout import prefix_hashes

__all__ = ["RequestState"]


class RequestState:
    """A request as the block manager sees it: its tokens, hashes and progress."""

    __slots__ = ("rid", "tokens", "num_prompt_tokens", "num_tokens", "num_computed_tokens", "hashes", "unit",
                 "shared_prefix_boundary", "hit_len", "kv_only_len", "tier_hit_len")

    def __init__(self, rid: int, tokens: np.ndarray, num_prompt_tokens: int, unit: int) -> None:
        self.rid = rid
        self.tokens = tokens
        self.num_prompt_tokens = num_prompt_tokens
        self.num_tokens = num_prompt_tokens
        self.num_computed_tokens = 0
        self.unit = unit
        self.hashes = prefix_hashes(tokens[:num_prompt_tokens], unit)
        self.shared_prefix_boundary = 0
        self.hit_len = 0                 # set at admission, reported to the α source at the end
        self.kv_only_len = 0
        self.tier_hit_len = 0            # tokens loaded from the CPU tier at admission (sequential path)

    def hash_at(self, depth: int) -> bytes:
        """Hash of ``tokens[:depth]`` (``depth`` a positive multiple of the hash unit)."""
        i = depth // self.unit - 1
        if i >= len(self.hashes):
            self.hashes = prefix_hashes(self.tokens[:self.num_tokens], self.unit, self.hashes)
        return self.hashes[i]

    def append_output(self) -> None:
        self.num_tokens += 1
