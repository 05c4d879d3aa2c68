"""What the engine tests compare between a cached and an uncached run, beyond the greedy tokens."""

from __future__ import annotations

from typing import Any

#: how far a resumed prefill's first logits may be from a whole one's, by model dtype (float64: rounding alone)
LOGIT_TOLERANCE = {"float32": 1e-4, "float64": 1e-9}


def logits_apart(a: Any, b: Any) -> float:
    """How far two :class:`~marconi.engine.engine.EngineResult`'s first top logits are (inf where they
    name other tokens): a random model's greedy tokens barely move under a wrong state, these do."""
    if [i for i, _ in a.first_top_logits] != [i for i, _ in b.first_top_logits]:
        return float("inf")
    return max(abs(x - y) for (_, x), (_, y) in zip(a.first_top_logits, b.first_top_logits))


def tolerance(model: Any) -> float:
    """:data:`LOGIT_TOLERANCE` for ``model``'s dtype."""
    return LOGIT_TOLERANCE[str(model.dtype).removeprefix("torch.")]
