"""vLLM 0.32's CPU offload tier, emulated: the ``OffloadingConnector``'s scheduler side and its
``CPUOffloadingManager`` with the ``lru``, ``arc`` or Marconi cache policy, without vLLM.

Mirrors ``vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py`` and
``vllm/v1/kv_offload/cpu/{manager.py,policies/}`` at vLLM's defaults (one GPU block per chunk,
``offload_prompt_only``, no ``store_threshold`` unless a tier arm names one, Mamba groups in
``align`` mode):

* **Lookup** (``_lookup_complete_chunks``), on a GPU-pool miss: from the GPU hit onward, the
  attention groups' longest run of held chunks, then each Mamba group's deepest held chunk at or
  below it (a one-chunk window), repeated until the groups agree; capped at ``num_tokens - 1``
  rounded down to a chunk.
* **Stores**, at the end of each scheduling step (``build_connector_meta``): first every Mamba
  state the GPU pool cached in the step at a chunk boundary inside the prompt (vLLM's boundary
  hand-offs, one ``prepare_store`` per state), then each scheduled request's attention chunks
  computed so far inside the prompt, then the previous step's finished requests (their
  ``on_request_finished``).
* **Loads**: the attention chunks past the GPU hit and each Mamba group's chunk at the hit's end;
  the next chunk to offer becomes the hit's end (so a request resumed after a preemption with a
  shorter hit than it had offered before offers those chunks again, as vLLM's does).

Transfers: without a clock, a load lands by the end of the step that issued it (the request runs
from the next step) and a store by the end of the step after (vLLM's worker starts stores a step
late). With a step-time model and a host link (``step_time``, ``host_bandwidth``: the replay's), a
transfer takes its bytes over the link as the replay's ``TimedHostLink`` models it (one FIFO link
per direction, loads from the step's start, stores from its end), the clock advancing by each
step's modelled time, so a load can span several short steps. Either way a lookup that finds a
chunk still being written makes the request wait, as vLLM's does. Docs: ``docs/vllm-tiers.md``,
"The emulation".
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from typing import Any, Callable, Iterable, Sequence

from marconi.core.model import ModelSpec
from marconi.core.registry import ConfigError
from marconi.integrations.vllm.layout import VllmLayout, cdiv
from marconi.integrations.vllm.policy import ATTENTION, MAMBA
from marconi.integrations.vllm.tier_arc import ARCPolicy, order_request_keys
from marconi.integrations.vllm.tier_chooser import AdaptiveTierPolicy
from marconi.integrations.vllm.tier_settings import DEFAULT_GPU_TFLOPS, DEFAULT_RULE, TierSettings, parse_tier_rule
from marconi.integrations.vllm.tier_tree import get_offload_group_idx, make_offload_key

__all__ = ["TIER_POLICIES", "STORE_THRESHOLD", "parse_tier_arm", "Chunk", "ReqContext", "LRUPolicy", "ARCPolicy", "make_policy", "TierManager",
           "EmulatedTier", "tier_num_chunks"]

TIER_POLICIES = ("lru", "arc", "marconi")
#: The one option a tier arm's label may carry: vLLM's ``store_threshold`` (``lru:store_threshold=2``).
STORE_THRESHOLD = "store_threshold"
#: vLLM's default ``max_tracker_size``: how many offered keys the store-threshold filter counts.
MAX_TRACKER_SIZE = 64_000
MISS, HIT, HIT_PENDING = 0, 1, 2
#: vLLM's ``SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT``: a chunk's host bytes are rounded up to it.
_CHUNK_ALIGNMENT = 4096


def tier_num_chunks(cpu_bytes: int, chunk_bytes: int, where: str = "vllm-align: cpu_tier",
                    no_tier: str = "cpu_tier=0 for no tier", *, zero_is_no_tier: bool = True) -> int:
    """Chunks a tier of ``cpu_bytes`` holds (``CPUOffloadingSpec``: bytes over the chunk size
    ``chunk_bytes`` rounded up to 4 KiB); 0 for ``cpu_bytes`` 0 (no tier), unless
    ``zero_is_no_tier`` is False (a fraction of a working set that rounds to 0 bytes still asked
    for a tier).

    Raises:
        ConfigError: a ``cpu_bytes`` that holds no chunk (vLLM would run a tier of none), naming
            ``where`` (the option that gave the size), the chunk's size and ``no_tier`` (how to ask
            for no tier instead).
    """
    if chunk_bytes <= 0:
        raise ConfigError(f"vllm-align: a tier chunk needs a positive size, got {chunk_bytes} bytes")
    aligned = -(-chunk_bytes // _CHUNK_ALIGNMENT) * _CHUNK_ALIGNMENT
    num_chunks = int(cpu_bytes) // aligned
    if num_chunks == 0 and (cpu_bytes > 0 or not zero_is_no_tier):
        raise ConfigError(f"{where}: a tier of {int(cpu_bytes):,} byte{'s' if cpu_bytes != 1 else ''} holds no chunk "
                          f"(one chunk, a block of every KV cache group, is {aligned:,} bytes for this model): give "
                          f"at least {aligned:,} bytes, or {no_tier}")
    return num_chunks


class Chunk:
    """vLLM's ``ChunkStatus``: ``ref_cnt`` is -1 while its store is pending, else the loads reading it."""

    __slots__ = ("ref_cnt", "chunk_id")

    def __init__(self, chunk_id: int) -> None:
        self.ref_cnt = -1
        self.chunk_id = chunk_id

    @property
    def is_ready(self) -> bool:
        return self.ref_cnt >= 0


class ReqContext:
    """vLLM's ``ReqContext``: per-request scratch by type, and each key's end position in tokens."""

    __slots__ = ("req_id", "_state", "_positions")

    def __init__(self, req_id: int) -> None:
        self.req_id = req_id
        self._state: dict[type, Any] = {}
        self._positions: dict[bytes, int] = {}

    def set_state(self, val: Any) -> None:
        self._state[type(val)] = val

    def get_state(self, cls: type) -> Any:
        return self._state.get(cls)

    def set_offload_key_position(self, key: bytes, end_token: int) -> None:
        self._positions[key] = end_token

    def get_offload_key_position(self, key: bytes) -> int | None:
        return self._positions.get(key)


class LRUPolicy:
    """vLLM's ``LRUCachePolicy``: a rank per chunk, new on insert and (head most recent) when a
    request that used it finishes; ``evict`` takes the lowest ranks among the evictable."""

    def __init__(self, cache_capacity: int) -> None:
        self.cache_capacity = cache_capacity
        self.chunks: dict[bytes, Chunk] = {}
        self._ranks: dict[bytes, int] = {}
        self._evictable: set[bytes] = set()
        self._next_rank = 0

    def get(self, key: bytes) -> Chunk | None:
        return self.chunks.get(key)

    def insert(self, key: bytes, chunk: Chunk) -> None:
        self.chunks[key] = chunk
        self._next_rank += 1
        self._ranks[key] = self._next_rank
        if chunk.ref_cnt == 0:
            self._evictable.add(key)

    def remove(self, key: bytes) -> None:
        del self.chunks[key]
        self._ranks.pop(key, None)
        self._evictable.discard(key)

    def _update_recency(self, keys: Iterable[bytes]) -> None:
        for key in keys:
            if key in self.chunks:
                self._next_rank += 1
                self._ranks[key] = self._next_rank

    def touch(self, keys: Iterable[bytes], ctx: ReqContext) -> None:
        self._update_recency(reversed(list(keys)))

    def on_store_miss(self, keys: Iterable[bytes], ctx: ReqContext) -> None:
        self.touch(keys, ctx)             # vLLM's default: a no-op for keys not yet held

    def on_request_finished(self, key_groups: Sequence[Sequence[bytes]], insertion_only: set[bytes],
                            reused: set[bytes], ctx: ReqContext) -> None:
        self._update_recency(reversed(order_request_keys(key_groups, ctx)))

    def evict(self, n: int, protected: set[bytes]) -> list[tuple[bytes, Chunk]] | None:
        if n == 0:
            return []
        pool = [k for k in self._evictable if k not in protected]
        if len(pool) < n:
            return None
        out = []
        for key in heapq.nsmallest(n, pool, key=self._ranks.__getitem__):
            chunk = self.chunks.pop(key)
            assert chunk.ref_cnt == 0
            del self._ranks[key]
            self._evictable.remove(key)
            out.append((key, chunk))
        return out

    def mark_evictable(self, key: bytes) -> None:
        self._evictable.add(key)

    def held_chunks(self) -> dict[bytes, Chunk]:
        return dict(self.chunks)

    def mark_non_evictable(self, key: bytes) -> None:
        self._evictable.discard(key)


def make_policy(name: str, capacity: int, *, group_kinds: Sequence[str] = (), spec: ModelSpec | None = None,
                tokens_per_chunk: int | None = None, host_gbps: float | None = None,
                rule: str = DEFAULT_RULE, cold_insert: bool = True, second_chance: bool = True) -> Any:
    """A tier policy by name: ``lru``, ``arc``, or ``marconi`` (:class:`AdaptiveTierPolicy`, the
    object vLLM's ``MarconiCachePolicy`` runs, under ``rule``, a fixed rule's label or ``adaptive``,
    and the load cost of ``host_gbps``; needs ``group_kinds`` and ``spec``). ConfigError for another
    name or rule."""
    if name == "lru":
        return LRUPolicy(capacity)
    if name == "arc":
        return ARCPolicy(capacity)
    if name == "marconi":
        if spec is None:
            raise ConfigError("vllm-align: tier_policy=marconi needs the model")
        live, family = parse_tier_rule(rule, "vllm-align: tier_rule")
        settings = TierSettings(tuple(group_kinds), spec, tokens_per_chunk, live,
                                **({"host_gbps": host_gbps} if host_gbps is not None else {}),
                                gpu_tflops=DEFAULT_GPU_TFLOPS, family=family, cold_insert=cold_insert,
                                second_chance=second_chance)
        return AdaptiveTierPolicy(capacity, settings)
    raise ConfigError(f"vllm-align: tier_policy must be one of {', '.join(TIER_POLICIES)}, got {name!r}")


def parse_tier_arm(label: str, flag: str = "--tier-policies") -> tuple[str, int]:
    """A tier arm's label as (policy, store threshold): ``lru`` -> ``("lru", 0)``, ``arc:store_threshold=2``
    -> ``("arc", 2)``. The threshold is vLLM's ``store_threshold`` (``kv_connector_extra_config``): a
    chunk is stored only once it has been offered that many times, 0 being no filter. ConfigError,
    naming ``flag``, for an unknown policy or option, a threshold that is not an integer, or one
    below 2 (vLLM treats 0 and 1 as no filter: the label would repeat the bare policy)."""
    name, sep, option = str(label).strip().partition(":")
    if name not in TIER_POLICIES:
        raise ConfigError(f"{flag}: unknown tier policy {name!r} in {label!r}; known: {', '.join(TIER_POLICIES)}")
    if not sep:
        return name, 0
    key, eq, value = option.partition("=")
    if key.strip() != STORE_THRESHOLD or not eq:
        raise ConfigError(f"{flag}: {label!r}: the only option of a tier policy is {STORE_THRESHOLD}=N "
                          f"(e.g. {name}:{STORE_THRESHOLD}=2)")
    try:
        threshold = int(value.strip())
    except ValueError:
        raise ConfigError(f"{flag}: {label!r}: {STORE_THRESHOLD} must be an integer, got {value.strip()!r}") from None
    if threshold < 2:
        raise ConfigError(f"{flag}: {label!r}: {STORE_THRESHOLD} must be >= 2 (vLLM reads 0 and 1 as no "
                          f"filter; write {name!r} for that)")
    return name, threshold


class _Access:
    """``_RequestCacheAccess``: the keys one request saw, per group in order, inserted and reused."""

    __slots__ = ("key_groups", "seen", "inserted", "reused", "store_misses", "finished")

    def __init__(self) -> None:
        self.key_groups: dict[int, list[bytes]] = {}
        self.seen: set[bytes] = set()
        self.inserted: set[bytes] = set()
        self.reused: set[bytes] = set()
        self.store_misses: set[bytes] = set()
        self.finished = False


class TierManager:
    """vLLM's ``CPUOffloadingManager``: ``num_chunks`` slots, ref counts, a policy, and with
    ``store_threshold`` >= 2 its frequency filter (a key is stored only once offered that many
    times, counted over the last ``max_tracker_size`` keys offered, as vLLM counts them).
    ``prepare_store`` returns the keys it will store (evicting as needed), or None when it cannot
    free enough chunks (nothing changed); ``evicted`` collects every key it evicted;
    ``stores_skipped`` counts the keys the filter held back."""

    def __init__(self, num_chunks: int, policy: Any, store_threshold: int = 0,
                 max_tracker_size: int = MAX_TRACKER_SIZE) -> None:
        self.num_chunks = num_chunks
        self.policy = policy
        self._num_allocated = 0
        self._free: list[int] = []
        self.num_evictable = 0
        self.evicted: list[bytes] = []
        self.store_threshold = store_threshold
        self.max_tracker_size = max_tracker_size
        self.counts: OrderedDict[bytes, int] | None = OrderedDict() if store_threshold >= 2 else None
        self.stores_skipped = 0

    def _record_accesses(self, keys: Sequence[bytes]) -> None:
        """vLLM's ``_record_accesses``: count an offer; a new key ages out the least recently
        offered one not in this offer once the tracker is full."""
        counts = self.counts
        assert counts is not None
        protected: set[bytes] = set()
        for key in keys:
            if key in counts:
                counts.move_to_end(key)
                counts[key] += 1
                protected.add(key)
        num_unprotected = len(counts) - len(protected)
        for key in keys:
            if key in counts:
                continue
            if len(counts) >= self.max_tracker_size:
                if num_unprotected == 0:
                    continue
                counts.popitem(last=False)
                num_unprotected -= 1
            counts[key] = 1

    def _access(self, ctx: ReqContext) -> _Access:
        state = ctx.get_state(_Access)
        if state is None:
            state = _Access()
            ctx.set_state(state)
        return state

    def _record(self, keys: Iterable[bytes], ctx: ReqContext, reused: Iterable[bytes] = ()) -> None:
        state = self._access(ctx)
        for key in keys:
            if key in state.seen:
                continue
            state.key_groups.setdefault(get_offload_group_idx(key), []).append(key)
            state.seen.add(key)
        state.reused.update(k for k in reused if k not in state.inserted)

    @property
    def num_free(self) -> int:
        return len(self._free) + self.num_chunks - self._num_allocated

    def lookup(self, key: bytes) -> int:
        chunk = self.policy.get(key)
        if chunk is None:
            return MISS
        return HIT if chunk.is_ready else HIT_PENDING

    def prepare_load(self, keys: Sequence[bytes], ctx: ReqContext) -> None:
        for key in keys:
            chunk = self.policy.get(key)
            assert chunk is not None and chunk.is_ready, "a load of a chunk not held or not ready"
            if chunk.ref_cnt == 0:
                self.policy.mark_non_evictable(key)
                self.num_evictable -= 1
            chunk.ref_cnt += 1
        self._record(keys, ctx, reused=keys)

    def complete_load(self, keys: Iterable[bytes]) -> None:
        for key in keys:
            chunk = self.policy.get(key)
            assert chunk is not None and chunk.ref_cnt > 0
            chunk.ref_cnt -= 1
            if chunk.ref_cnt == 0:
                self.num_evictable += 1
                self.policy.mark_evictable(key)

    def prepare_store(self, keys: Sequence[bytes], ctx: ReqContext) -> list[bytes] | None:
        if self.counts is not None:
            self._record_accesses(keys)
        to_store, ready = [], []
        for key in keys:
            chunk = self.policy.get(key)
            if chunk is None:
                to_store.append(key)
            elif chunk.is_ready:
                ready.append(key)
        if self.counts is not None:
            counts, offered = self.counts, len(to_store)
            to_store = [k for k in to_store if counts.get(k, 0) >= self.store_threshold]
            self.stores_skipped += offered - len(to_store)
        state = self._access(ctx)
        misses = [k for k in to_store if k not in state.store_misses]
        if misses:
            self.policy.on_store_miss(misses, ctx)
            state.store_misses.update(misses)
        recorded = set(to_store) | set(ready)
        self._record([k for k in keys if k in recorded], ctx, reused=ready)
        if not to_store:
            return []
        need = len(to_store) - self.num_free
        if need > 0:
            if need > self.num_evictable:
                return None
            evicted = self.policy.evict(need, set(keys))
            if evicted is None:
                return None
            self.num_evictable -= len(evicted)
            for key, chunk in evicted:
                self._free.append(chunk.chunk_id)
                self.evicted.append(key)
        for key in to_store:
            if self._num_allocated < self.num_chunks:
                chunk = Chunk(self._num_allocated)
                self._num_allocated += 1
            else:
                chunk = Chunk(self._free.pop())
            self.policy.insert(key, chunk)
        state.inserted.update(to_store)
        return to_store

    def complete_store(self, keys: Iterable[bytes]) -> None:
        for key in keys:
            chunk = self.policy.get(key)
            if chunk is not None and not chunk.is_ready:
                chunk.ref_cnt = 0
                self.num_evictable += 1
                self.policy.mark_evictable(key)

    def on_request_finished(self, ctx: ReqContext) -> None:
        state = ctx.get_state(_Access)
        if state is None or state.finished:
            return
        state.finished = True
        groups = []
        for gid in sorted(state.key_groups):
            keys = state.key_groups[gid]
            positions = {k: p for k in keys if (p := ctx.get_offload_key_position(k)) is not None}
            if len(positions) == len(keys):
                keys = sorted(keys, key=positions.__getitem__)
            groups.append(tuple(keys))
        self.policy.on_request_finished(tuple(groups), state.inserted - state.reused, state.reused, ctx)

    def check_invariants(self) -> None:
        """Free + held chunks = allocated; the evictable count matches the held idle chunks."""
        held = self.policy.held_chunks()
        assert len(held) + len(self._free) == self._num_allocated <= self.num_chunks, "tier chunks leaked"
        assert len({c.chunk_id for c in held.values()} | set(self._free)) == self._num_allocated, "chunk id reused"
        assert sum(c.ref_cnt == 0 for c in held.values()) == self.num_evictable, "evictable count drifted"


class _TierRequest:
    __slots__ = ("ctx", "next_stored", "keys_made", "block_ids")

    def __init__(self, rid: int) -> None:
        self.ctx = ReqContext(rid)
        self.next_stored = 0            # the next attention chunk to offer (``next_stored_chunk_idx``)
        self.keys_made: set[tuple[int, int]] = set()
        self.block_ids: list[list[int]] = []    # its GPU blocks per group when it finished (before they went back)


class _Watch:
    """The GPU blocks a store job in transit reads, which vLLM's connector watches: a block handed
    to a request while a watching job is in transit makes the step wait for the job
    (``jobs_to_flush``). A Mamba state's job watches its block at once; an attention job only
    once its request has finished (``deferred`` until then)."""

    __slots__ = ("active", "deferred")

    def __init__(self, active: Iterable[int] = (), deferred: Iterable[int] = ()) -> None:
        self.active = set(active)
        self.deferred = set(deferred)


class EmulatedTier:
    """The connector's scheduler side over a :class:`TierManager` (see the module docstring).

    The scheduler calls :meth:`lookup` after the GPU pool's lookup, :meth:`load` once the request's
    blocks are allocated, :meth:`on_cache` (through the block pool) for each block it caches,
    :meth:`dropped` when a request's blocks are freed by preemption, :meth:`finished` when a
    request ends, and :meth:`end_step` at the end of each scheduling step.

    Counters: ``hit_tokens`` (loaded tokens at first admissions), ``bytes_loaded``,
    ``bytes_stored``, ``num_loads``, ``num_stores`` (store jobs), ``evictions`` by kind.
    """

    def __init__(self, layout: VllmLayout, num_chunks: int, policy: str, spec: ModelSpec | None = None, *,
                 host_gbps: float | None = None, rule: str = DEFAULT_RULE, cold_insert: bool = True,
                 second_chance: bool = True,
                 step_time: Callable[[Sequence[tuple[int, int]]], float] | None = None,
                 host_bandwidth: float | None = None) -> None:
        """``policy``: a tier arm's label (:func:`parse_tier_arm`: ``lru``, ``arc``, ``marconi``, each
        optionally ``:store_threshold=N``); ``host_gbps``: the link Marconi's policy prices a load at;
        ``rule``, ``cold_insert`` and ``second_chance``: Marconi's ``marconi_rule``,
        ``marconi_cold_insert`` and ``marconi_second_chance``;
        ``step_time`` (seconds for a step computing the given ``(start, end)`` spans) and ``host_bandwidth`` (bytes/s per
        direction): the clock (both or neither)."""
        if (step_time is None) != (host_bandwidth is None) or (host_bandwidth is not None and host_bandwidth <= 0):
            raise ConfigError("vllm-align: the tier's clock needs a step-time model and a positive host bandwidth")
        if num_chunks < 0:
            raise ConfigError(f"vllm-align: the tier needs >= 0 chunks, got {num_chunks}")
        self.layout = layout
        self.c = layout.block_size
        self.kinds = layout.group_kinds
        self.attn = [g for g, k in enumerate(self.kinds) if k == ATTENTION]
        self.mamba = [g for g, k in enumerate(self.kinds) if k == MAMBA]
        self.policy_name = policy
        name, threshold = parse_tier_arm(policy, "vllm-align: tier_policy")
        self.manager = TierManager(num_chunks, make_policy(name, num_chunks, group_kinds=self.kinds, spec=spec,
                                                           tokens_per_chunk=self.c, host_gbps=host_gbps, rule=rule,
                                                           cold_insert=cold_insert, second_chance=second_chance),
                                   store_threshold=threshold)
        self.chunk_bytes = layout.block_bytes
        self._reqs: dict[int, _TierRequest] = {}
        self._handoffs: list[tuple[Any, int, int, int]] = []      # (request, group, depth, block id)
        self._finished: list[Any] = []
        self._pending_stores: list[bytes] = []
        self._stores_in_flight: list[bytes] = []
        self._store_jobs: list[tuple[list[bytes], int, _Watch]] = []   # this step's store jobs
        self._pending_loads: list[bytes] = []
        self.hit_tokens = 0
        self.bytes_loaded = 0
        self.bytes_stored = 0
        self.num_loads = 0
        self.num_stores = 0
        self.evictions = {"kv": 0, "state": 0}
        self.step_time = step_time
        self.bandwidth = host_bandwidth
        self.now = 0.0                                  # virtual seconds (with a clock)
        #: when the next request arrives (open-loop arrivals; set by the loop before each step, None
        #: in a closed loop): a step in which every request waits for a load moves the clock to the
        #: earlier of the next transfer's completion and the next arrival, as the replay's worker does
        self.next_arrival: float | None = None
        self._link_free = {"load": 0.0, "store": 0.0}
        # (done, kind, keys, request id, the blocks a store reads: None for a load)
        self._timed: list[tuple[float, str, list[bytes], int, _Watch | None]] = []
        # bound by the engine (bind): a request's block ids per group, and the blocks handed out
        # since the last step; unbound (a tier alone), no store job watches a block
        self._blocks_of: Callable[[Any], list[list[int]]] | None = None
        self._take_handed_out: Callable[[], set[int]] | None = None
        self._loading: set[int] = set()                # requests whose load has not landed
        self._step_loads: list[tuple[list[bytes], int]] = []   # with a clock: this step's loads, not yet started
        self._being_loaded: set[bytes] = set()          # keys of the loads in flight (vLLM's _chunks_being_loaded)
        self._preempted: set[int] = set()              # requests preempted in this step

    # --------------------------------------------------------------- keys
    def _req(self, req: Any) -> _TierRequest:
        st = self._reqs.get(req.rid)
        if st is None:
            st = self._reqs[req.rid] = _TierRequest(req.rid)
        return st

    def next_to_store(self, req: Any) -> int:
        """The index of ``req``'s next attention chunk to offer (vLLM's ``next_stored_chunk_idx``)."""
        return self._req(req).next_stored

    def _key(self, req: Any, st: _TierRequest, gid: int, end: int) -> bytes:
        key = make_offload_key(req.hash_at(end), gid)
        st.ctx.set_offload_key_position(key, end)
        return key

    # --------------------------------------------------------------- lookup and load
    def lookup(self, req: Any, local: int) -> int | None:
        """``_lookup_complete_chunks``: tokens past the GPU hit ``local`` the tier can load (0: none;
        None: a hit chunk is still being stored, or another request is loading one, and the request
        waits)."""
        c, mgr = self.c, self.manager
        st = self._req(req)
        num_keys = req.num_tokens // c
        max_hit = req.num_tokens
        if self.mamba:
            max_hit = (max_hit - 1) // c * c
        num_hit, defer = 0, False
        groups: Sequence[int] = self.attn + self.mamba
        while groups:
            looked_up_window = False
            todo, groups = groups, ()
            for gid in todo:
                max_hit = min(max_hit, num_keys * c)
                if max_hit - local < c:
                    return 0
                num_chunks = min(cdiv(max_hit, c), num_keys)
                start = local // c
                keys = [self._key(req, st, gid, (i + 1) * c) for i in range(start, num_chunks)]
                found: int | None
                if gid in self.attn:            # a prefix of held chunks
                    found, pending = 0, False
                    for key in keys:
                        r = mgr.lookup(key)
                        if r == MISS:
                            break
                        pending |= r == HIT_PENDING
                        found += 1
                    found = None if pending else found
                else:                            # the deepest held chunk (a one-chunk window)
                    found = 0
                    for idx in range(len(keys) - 1, -1, -1):
                        r = mgr.lookup(keys[idx])
                        if r != MISS:
                            found = None if r == HIT_PENDING else idx + 1
                            break
                if found == 0:
                    return 0
                if found is None:
                    defer = True
                else:
                    max_hit = min(max_hit, c * (start + found))
                new = max_hit - local
                if new < c:
                    return 0
                if new < num_hit:
                    if defer:
                        defer = False
                        groups = self.attn + self.mamba
                    elif looked_up_window and not groups:
                        groups = self.mamba
                looked_up_window |= gid in self.mamba
                num_hit = new
        if defer:
            return None
        if self._being_loaded:          # a hit chunk another request is loading: this one waits for it
            first, last = local // c, cdiv(local + num_hit, c)
            for gid in self.attn + self.mamba:
                window = range(first, last) if gid in self.attn else range(max(first, last - 1), last)
                if any(self._key(req, st, gid, (i + 1) * c) in self._being_loaded for i in window):
                    return None
        return num_hit

    def load(self, req: Any, local: int, ext: int, first: bool) -> None:
        """``update_state_after_alloc``: load the tier's chunks for ``local .. local + ext``
        (``first``: the request's first admission, counted in :attr:`hit_tokens`)."""
        if ext <= 0:
            return
        c, st = self.c, self._req(req)
        end = local + ext
        keys = []                       # in group order, as vLLM lists them
        for g in range(len(self.kinds)):
            ends = [(i + 1) * c for i in range(local // c, cdiv(end, c))] if g in self.attn else [end]
            keys += [self._key(req, st, g, e) for e in ends]
        self.manager.prepare_load(keys, st.ctx)
        self._being_loaded.update(keys)
        # vLLM assigns (``update_state_after_alloc``, chunk-level policy): a request resumed after a
        # preemption with a shorter tier hit than it had offered before offers those chunks again
        st.next_stored = cdiv(end, c)
        if self.step_time is not None:
            self._step_loads.append((keys, req.rid))     # they start with the forward pass (end_step)
            self._loading.add(req.rid)
        else:
            self._pending_loads.extend(keys)
        self.num_loads += 1
        self.bytes_loaded += len(keys) * self.chunk_bytes
        if first:
            self.hit_tokens += ext

    @property
    def busy(self) -> bool:
        """Whether a transfer is still to land (a load, or a store a lookup may wait for): a step
        that schedules nothing then still moves the run on."""
        return bool(self._timed or self._loading or self._pending_loads or self._pending_stores
                    or self._stores_in_flight)

    def landed(self, req: Any) -> bool:
        """Whether ``req``'s load has landed (always, without a clock, by the step after it)."""
        return req.rid not in self._loading

    def _submit(self, kind: str, keys: list[bytes], rid: int, watch: _Watch | None = None) -> None:
        assert self.bandwidth is not None
        done = max(self.now, self._link_free[kind]) + len(keys) * self.chunk_bytes / self.bandwidth
        self._link_free[kind] = done
        self._timed.append((done, kind, keys, rid, watch))

    def _land(self) -> None:
        """Complete the transfers done by :attr:`now`."""
        still = []
        for job in self._timed:
            done, kind, keys, rid, _ = job
            if done > self.now:
                still.append(job)
            elif kind == "load":
                self.manager.complete_load(keys)
                self._being_loaded.difference_update(keys)
                self._loading.discard(rid)
            else:
                self.manager.complete_store(keys)
        self._timed = still

    # --------------------------------------------------------------- stores
    def bind(self, blocks_of: Callable[[Any], list[list[int]]], take_handed_out: Callable[[], set[int]]) -> None:
        """The engine's side (``VllmAlignEngine.attach_tier``): ``blocks_of(req)``, a request's GPU
        block ids per group (0: none), and ``take_handed_out()``, the blocks allocated or taken as
        hits since its last call. With both, a store in transit whose blocks are handed out again
        makes the step wait for it, as vLLM's worker does."""
        self._blocks_of, self._take_handed_out = blocks_of, take_handed_out

    def on_cache(self, req: Any, group_id: int, depth: int, block_id: int = 0) -> None:
        """The GPU pool cached ``req``'s block ``block_id`` of ``group_id`` ending at ``depth``: a
        Mamba state at a chunk boundary is handed to the connector at the step's end."""
        if group_id in self.mamba and depth % self.c == 0:
            self._handoffs.append((req, group_id, depth, block_id))

    def dropped(self, req: Any) -> None:
        """``req`` was preempted: its blocks went back to the pool before the step's end, so its
        hand-offs are void, and (with a clock) this step waits for its stores still in transit
        before the forward pass, as vLLM's worker flushes a preempted request's store jobs."""
        self._handoffs = [h for h in self._handoffs if h[0] is not req]
        self._preempted.add(req.rid)

    def finished(self, req: Any) -> None:
        """``req`` finished in this step (called before its blocks go back to the pool); the next
        step's end offers its rest and ends its access. Its stores in transit now watch the blocks
        they read (vLLM's deferred fences)."""
        self._finished.append(req)
        if self._blocks_of is not None:        # what its last stores will read (vLLM keeps the ids)
            self._req(req).block_ids = self._blocks_of(req)
        for job in self._timed:
            watch = job[4]
            if job[3] == req.rid and watch is not None and watch.deferred:
                watch.active |= watch.deferred
                watch.deferred = set()

    def _store(self, keys: list[bytes], ctx: ReqContext, watch: Iterable[int] = (),
               deferred: Iterable[int] = ()) -> list[bytes] | None:
        before = len(self.manager.evicted)
        stored = self.manager.prepare_store(keys, ctx)
        for key in self.manager.evicted[before:]:
            self.evictions["kv" if self.kinds[get_offload_group_idx(key)] == ATTENTION else "state"] += 1
        if stored:
            self._pending_stores.extend(stored)
            self._store_jobs.append((stored, ctx.req_id, _Watch(watch, deferred)))
            self.num_stores += 1
            self.bytes_stored += len(stored) * self.chunk_bytes
        return stored

    def end_step(self, scheduled: Sequence[tuple[Any, int]]) -> None:
        """``build_connector_meta`` for a step that scheduled ``scheduled`` (request, tokens), then
        the transfers that land: this step's loads and the previous step's stores."""
        c = self.c
        by_req: dict[int, list[tuple[Any, int, int]]] = {}
        for h in self._handoffs:
            by_req.setdefault(h[0].rid, []).append(h)
        self._handoffs = []
        for entries in by_req.values():
            for req, gid, depth, block_id in sorted(entries, key=lambda e: self.mamba.index(e[1])):
                if depth > min(req.num_tokens, req.num_prompt_tokens):
                    continue
                st = self._req(req)
                self._store([self._key(req, st, gid, depth)], st.ctx, watch=(block_id,) if block_id else ())
        finished = self._finished
        self._finished = []
        blocks_of = self._blocks_of
        for req, after, done in [(r, r.num_computed_tokens + n, False) for r, n in scheduled] + [
                (r, max(r.num_prompt_tokens, r.num_tokens - 1), True) for r in finished]:
            st = self._req(req)
            n = min(after, req.num_tokens, req.num_prompt_tokens) // c
            if n <= st.next_stored:
                continue
            keys = [self._key(req, st, g, (i + 1) * c) for g in self.attn for i in range(st.next_stored, n)]
            ids = st.block_ids if done or blocks_of is None else blocks_of(req)
            src = {ids[g][i] for g in self.attn if g < len(ids) for i in range(st.next_stored, min(n, len(ids[g])))
                   if ids[g][i]}
            # a finished request's job watches its blocks at once, a running one's once it finishes
            if self._store(keys, st.ctx, watch=src if done else (), deferred=() if done else src) is not None:
                st.next_stored = n
        for req in finished:
            st = self._reqs.pop(req.rid, None)
            if st is not None:
                self.manager.on_request_finished(st.ctx)
        preempted, self._preempted = self._preempted, set()
        handed_out = self._take_handed_out() if self._take_handed_out is not None else set()
        if self.step_time is not None:
            # vLLM's worker before the forward pass: it waits for the stores still in transit of a
            # request preempted in this step, and for those reading a block handed out in this step
            # (the connector's jobs_to_flush), then starts this step's loads
            flushed = [t[0] for t in self._timed if t[1] == "store" and (
                t[3] in preempted or (t[4] is not None and not t[4].active.isdisjoint(handed_out)))]
            if flushed:
                self.now = max(self.now, max(flushed))
            for keys, rid in self._step_loads:
                self._submit("load", keys, rid)
            self._step_loads = []
            # the forward pass, then this step's stores go out
            spans = [(r.num_computed_tokens, r.num_computed_tokens + n) for r, n in scheduled]
            self.now += self.step_time(spans)
            if not spans:                      # everyone waits on a load: to the next completion or arrival
                due = [t[0] for t in self._timed]
                if self.next_arrival is not None:
                    due.append(self.next_arrival)
                if due:
                    self.now = max(self.now, min(due))
            for job, rid, watch in self._store_jobs:
                self._submit("store", job, rid, watch)
            self._pending_stores, self._store_jobs = [], []
            self._land()
            return
        self._store_jobs = []
        self.manager.complete_store(self._stores_in_flight)
        self._stores_in_flight, self._pending_stores = self._pending_stores, []
        self.manager.complete_load(self._pending_loads)
        self._being_loaded.difference_update(self._pending_loads)
        self._pending_loads = []

    def counters(self) -> dict[str, Any]:
        """The tier's counters, named as the replay's records name them."""
        return {"tier_hit_tokens": self.hit_tokens, "bytes_loaded": self.bytes_loaded,
                "bytes_stored": self.bytes_stored, "num_loads": self.num_loads, "num_stores": self.num_stores,
                "tier_evictions_kv": self.evictions["kv"], "tier_evictions_state": self.evictions["state"],
                "tier_num_chunks": self.manager.num_chunks, "tier_stores_skipped": self.manager.stores_skipped}
