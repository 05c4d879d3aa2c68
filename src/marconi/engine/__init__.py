"""Real engine: transformers hybrid LLMs served through the cache core with exact prefix reuse.

``models`` (load + checked spec), ``precision`` (float64 scans), ``states`` (payloads),
``prefill`` (checkpointed prefill, decode), ``engine`` (:class:`Engine`), ``commands`` (CLI).
torch and transformers are imported lazily, so ``marconi`` works without them.
"""

from marconi.engine.errors import (
    EngineError,
    SpecMismatchError,
    TokenRangeError,
    UnsupportedModelError,
)

__all__ = ["EngineError", "SpecMismatchError", "TokenRangeError", "UnsupportedModelError"]
