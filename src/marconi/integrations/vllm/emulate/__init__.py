"""``vllm-align``: vLLM 0.32's hybrid prefix cache (Mamba ``align`` mode), emulated block by block.

vLLM caches a hybrid model in fixed-size blocks from one pool shared by all KV cache groups
(attention groups hold KVs, Mamba groups recurrent states). This package replays requests through a
model of that machinery — the block pool and its free queue, the per-group managers, the hybrid
coordinator's lookup, the scheduler's Mamba-aligned prefill split — so that its hit counts are
vLLM's own, token for token, for a trace served one request at a time. The modules follow vLLM's
own (``vllm/v1/core``), and functions are named after the ones they mirror. They build on the
layout (:class:`~marconi.integrations.vllm.layout.VllmLayout`: block size, KV cache groups, pool, as
vLLM derives them from the model, and the chained prefix hashes), which lives a floor below, in
:mod:`marconi.integrations.vllm.layout`, beside the block policy: the plugin needs it too.

* :mod:`.request` — a request as the block manager sees it (``vllm/v1/request.py``);
* :mod:`.block_pool` — ``block_pool.py``: blocks, the free queue, the hash map, eviction;
* :mod:`.managers` — ``single_type_kv_cache_manager.py``: the attention and Mamba group managers;
* :mod:`.engine` — ``kv_cache_manager.py``, ``kv_cache_coordinator.py`` and ``sched/scheduler.py``:
  :class:`~.engine.VllmAlignEngine`, lookup, prefill split, allocation, free;
* :mod:`.scheduler` — ``sched/scheduler.py``'s loop: requests in flight, the token budget,
  chunked prefill, recompute preemption (:func:`~.scheduler.emulate_closed_loop`, what
  ``marconi vllm replay --concurrency C`` compares with vLLM's counters);
* :mod:`.cache` — :class:`~.cache.VllmAlignCache`, the engine as a
  :class:`~marconi.core.protocol.ReplayCache` for the simulator (the ``vllm-align`` system).

Import from those modules; this package imports none of them.

What vLLM does, in short (defaults: ``prefix_cache_retention_interval=0``, no EAGLE, no connector):

* a lookup matches whole cached attention blocks from the start, then the deepest block-aligned
  Mamba state within them (capped at ``prompt_len - 1``); the hit is that state's depth;
* prefill is split so a chunk ends at the prompt's last block boundary ``(P-1)//B·B`` and at a
  detected shared-prefix junction (attention matched deeper than any state: Marconi-style
  admission), and at the token budget; a state block is kept (hashed) only at those boundaries
  (retention 0), at every block (retention ``None``), or every ``retention`` tokens;
* with in-pass prefill checkpoints (``VllmLayout.prefill_checkpoint_alignment``: vLLM's
  ``MambaMixer2`` — Nemotron-H, Falcon-H1, Bamba — on a GPU) the chunk that reaches the prompt's
  end is not split at ``(P-1)//B·B``: the backend writes that state into a checkpoint block the
  Mamba manager reserves in the same step (column ``cdiv(end, B) - 2``). Same cached states, one
  step less, and one more block per Mamba group, which the full-sequence admission gate counts:
  on a tight pool it decides which requests run together;
* a lookup is bounded by the request's hashes: a preempted request resumes from a state it cached
  past its prompt (at a junction) before it was preempted;
* attention blocks are hashed as they fill, prompt and output alike;
* a finished request frees its blocks tail first; cached ones queue for LRU eviction, the others
  are reused first. A hit takes its blocks out of the queue; released again, they are recent.

Eviction is vLLM's LRU (``eviction=lru``) or the Marconi plugin's (``eviction=marconi``): the same
:class:`~marconi.integrations.vllm.policy.BlockEvictionState` the plugin runs inside vLLM, with the same α source
(fixed, or the shadow α source: fed each finished request at the same point as in the plugin, after
its blocks are freed).

With ``prefix_match_unit`` finer than the block, hits may land inside a block: each prompt's last
hash boundary is registered as a partial entry (the prefill stops there so a state exists), and a
block shared with the cache at such a hit is copied on write — vLLM's partial-hash-hit paths.

Limits: the simulator's cache (:mod:`.cache`) serves requests one at a time (``begin`` runs the whole
prefill, ``finish`` the decode and the free); :mod:`.scheduler` runs them concurrently, step by
step. Not modelled: EAGLE (hence the shared-prefix checkpoint), KV connectors and sliding windows.
"""

