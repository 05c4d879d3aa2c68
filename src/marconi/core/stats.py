"""CacheStats: what a prefix cache counts over its lifetime (hits, admissions, evictions, bytes),
shared by ``PrefixCache`` and the engine emulations so every one counts a lookup the same way."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from marconi.core.admission import MatchResult
    from marconi.core.model import ModelSpec

__all__ = ["CacheStats"]


@dataclass(slots=True)
class CacheStats:
    """Lifetime counters (``*_tokens`` tokens, ``*_flops`` prefill FLOPs, ``*_bytes`` bytes, the rest
    events); token hit rate = reused / input tokens, as in the paper."""

    num_requests: int = 0
    num_hits: int = 0                  # requests that resumed from a cached prefix
    input_tokens: int = 0
    kv_hit_tokens: int = 0             # longest cached KV prefix, summed
    reused_tokens: int = 0             # usable hits (prefill skipped), summed
    unusable_tokens: int = 0           # KV found but no checkpoint to resume from
    input_flops: float = 0.0           # prefill FLOPs of all inputs without a cache
    flops_saved: float = 0.0
    checkpoints_admitted: int = 0
    checkpoints_evicted: int = 0
    checkpoints_reused: int = 0
    checkpoints_unavailable: int = 0   # requested but no state was supplied (engine)
    kv_tokens_inserted: int = 0
    kv_tokens_evicted: int = 0
    evictions_leaf: int = 0            # a leaf: frees its KVs and its checkpoint
    evictions_inner: int = 0           # a one-child node: frees its checkpoint, KVs go to the child
    bytes_evicted: int = 0
    requests_not_cached: int = 0       # their states could not fit even after evicting all unlocked
    locked_states_dropped: int = 0     # of evictions_inner: a state on an in-flight path no request resumes
                                       # from, dropped so that a request fits (PrefixCache.finish)
    tail_trims: int = 0                # tails=reach: branched leaves cut back to their predicted reach
    tail_tokens_trimmed: int = 0       # KV tokens those cuts dropped
    peak_bytes: int = 0
    peak_kv_bytes: int = 0
    peak_ssm_bytes: int = 0

    @property
    def token_hit_rate(self) -> float:
        return self.reused_tokens / self.input_tokens if self.input_tokens else 0.0

    @property
    def flops_saved_fraction(self) -> float:
        return self.flops_saved / self.input_flops if self.input_flops else 0.0

    def record_lookup(self, match: "MatchResult", spec: "ModelSpec", *, from_checkpoint: bool) -> None:
        """Count one request's lookup; ``from_checkpoint``: the usable hit resumes from a stored SSM
        checkpoint (False for a pure transformer, which resumes from KVs alone)."""
        self.num_requests += 1
        self.input_tokens += match.input_len
        self.kv_hit_tokens += match.kv_hit_len
        self.reused_tokens += match.usable_hit_len
        self.unusable_tokens += match.unusable_len
        self.input_flops += spec.prefill_flops(match.input_len)
        if match.usable_hit_len:
            self.num_hits += 1
            self.flops_saved += spec.prefill_flops(match.usable_hit_len)
            if from_checkpoint:
                self.checkpoints_reused += 1

    def note_usage(self, used_bytes: int, kv_bytes: int, ssm_bytes: int) -> None:
        """Raise the peaks to the current byte usage."""
        if used_bytes > self.peak_bytes:
            self.peak_bytes = used_bytes
        if kv_bytes > self.peak_kv_bytes:
            self.peak_kv_bytes = kv_bytes
        if ssm_bytes > self.peak_ssm_bytes:
            self.peak_ssm_bytes = ssm_bytes

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["token_hit_rate"] = self.token_hit_rate
        out["flops_saved_fraction"] = self.flops_saved_fraction
        return out
