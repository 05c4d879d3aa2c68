"""What every engine integration shares; nothing here imports or names an engine.

* :mod:`.alpha` — the α-source contract an engine's FLOP-aware eviction reads, a fixed α, and
  what a source observes of a finished request;
* :mod:`.shadow_alpha` — the shadow α source: the regret selector on a size-only shadow cache,
  its live rule translated by the engine (``alpha=adaptive``);
* :mod:`.server` — an OpenAI-compatible server as a child process: start, health, metrics, stop;
* :mod:`.client` — a streaming completions client: token ids in, token ids and timings out;
* :mod:`.bench` — the bench's engine-free half: which trace requests to replay, replaying them on
  servers side by side (paired, request by request) or one server at a time, percentiles.

Import from those modules; this package imports none of them (the client and the server need
``httpx``, the ``[vllm]`` extra, only when they run).
"""
