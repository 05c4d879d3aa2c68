"""Real engine: transformers hybrid LLMs served through the cache core with exact prefix reuse.

Modules, one concept each:

* :mod:`~marconi.engine.models` — load a supported hybrid (random-weight preset or local
  checkpoint), its cache layout, and a ``ModelSpec`` checked against its real cache tensors;
* :mod:`~marconi.engine.precision` — a scoped patch keeping float64 scans in float64;
* :mod:`~marconi.engine.states` — KV / SSM payloads, capture and restore, ``TensorPayloads``;
* :mod:`~marconi.engine.prefill` — prefill with checkpoints (segmented / chunk-boundary), decode;
* :mod:`~marconi.engine.engine` — :class:`Engine`: one request at a time through ``PrefixCache``;
* :mod:`~marconi.engine.commands` — the ``engine`` CLI command group (``register(subparsers)``).

The engine's bench (measured TTFT with / without the cache, checkpointing overheads) is in the lab:
:mod:`marconi.lab.engine_bench`, ``marconi engine bench``.

torch and transformers are imported lazily by the CLI, so ``marconi`` works without them.
"""

from marconi.engine.errors import (
    EngineError,
    SpecMismatchError,
    TokenRangeError,
    UnsupportedModelError,
)

__all__ = ["EngineError", "SpecMismatchError", "TokenRangeError", "UnsupportedModelError"]
