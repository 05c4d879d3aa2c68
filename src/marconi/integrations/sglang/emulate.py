"""``sglang-unified``: SGLang 0.5.23's hybrid radix cache (``UnifiedRadixCache``, FULL + MAMBA), emulated.

Pure Python + numpy, no SGLang import: :class:`UnifiedRadixEmulator` follows SGLang's tree, match,
insert, eviction and lock rules (``srt/mem_cache/``) and the scheduler's request life, and under
``marconi`` runs the plugin's own :class:`~marconi.integrations.sglang.policy.MarconiStrategy` on its
nodes. The rules, what is not modelled, the agreement with the real cache: docs/sglang.md.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from marconi.core.model import ModelSpec

__all__ = ["UnifiedRadixEmulator", "EmuNode", "ServeResult", "PoolExhausted", "BUFFERS", "FULL", "MAMBA", "emulator_for",
           "EmulatedWorld", "world_maker"]

BUFFERS = ("no_buffer", "extra_buffer")
FULL, MAMBA = 0, 1          # indices into ``EmuNode.component_data`` (the strategy reads MAMBA's ``value``)
_TRACK_SLOTS = 2            # extra_buffer: the request's ping-pong track slots (mamba_ping_pong_track_buffer)


class PoolExhausted(RuntimeError):
    """A request the pools cannot hold after evicting everything unlocked."""


class _ComponentData:
    """One component's data on a node: ``value`` (None: absent) and ``lock_ref``, as SGLang's."""

    __slots__ = ("value", "lock_ref")

    def __init__(self, value: Any = None) -> None:
        self.value = value
        self.lock_ref = 0


class EmuNode:
    """A radix-tree node: ``key`` (its edge's tokens), FULL data (the KV, always present here) and
    MAMBA data (``True`` where a state is kept at its end), ``last_access_time`` (SGLang's clock)."""

    __slots__ = ("key", "parent", "children", "component_data", "last_access_time", "creation_time", "id")

    def __init__(self, key: np.ndarray, parent: "EmuNode | None", node_id: int, now: float) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[Any, EmuNode] = {}
        self.component_data = (_ComponentData(True), _ComponentData())
        self.last_access_time = now
        self.creation_time = now + 1.0
        self.id = node_id

    @property
    def has_state(self) -> bool:
        return self.component_data[MAMBA].value is not None

    def __lt__(self, other: "EmuNode") -> bool:      # SGLang's heap tie-break (UnifiedTreeNode.__lt__)
        return self.last_access_time < other.last_access_time

    def __repr__(self) -> str:
        return f"EmuNode(id={self.id}, len={len(self.key)}, state={self.has_state})"


class _InsertResult:
    __slots__ = ("node", "mamba_exist", "prefix_len")

    def __init__(self, node: EmuNode, mamba_exist: bool, prefix_len: int) -> None:
        self.node, self.mamba_exist, self.prefix_len = node, mamba_exist, prefix_len


@dataclass(slots=True)
class ServeResult:
    """One request's lookup as SGLang's ``match_prefix`` reports it (tokens)."""

    input_len: int
    hit_len: int            # device_prefix_len: KV with a Mamba state at its end
    kv_hit_len: int         # full_kv_hit_length: every KV matched


@dataclass(slots=True, eq=False)
class _Request:
    """A request between admission and finish: its prompt, its lock, what it holds privately."""

    prompt: np.ndarray
    match: ServeResult
    node: EmuNode                     # the locked node
    protected_len: int                # cache_protected_len: the tokens the tree owns for it
    private_kv: int                   # KV slots allocated and not yet handed to the tree
    slots: int                        # Mamba slots it holds (working + track buffers)
    track_len: int | None = None      # extra_buffer: mamba_last_track_seqlen
    prefilled: bool = False
    counters: dict[str, int] = field(default_factory=dict)


class UnifiedRadixEmulator:
    """SGLang's hybrid radix cache with ``kv_tokens`` KV slots and ``mamba_slots`` Mamba slots.

    Args:
        strategy: None for SGLang's LRU, or a :class:`~marconi.integrations.sglang.policy.MarconiStrategy`
            built with ``mamba_index=MAMBA``.
        buffer: ``no_buffer`` (page size 1) or ``extra_buffer`` (modelled from SGLang's code only).
        chunk_size, track_interval: ``mamba_cache_chunk_size``, ``mamba_track_interval``.

    Raises :class:`PoolExhausted` when a request cannot be served after evicting everything unlocked.
    """

    def __init__(self, kv_tokens: int, mamba_slots: int, *, strategy: Any = None, buffer: str = "no_buffer",
                 page_size: int = 1, chunk_size: int = 64, track_interval: int = 256) -> None:
        if buffer not in BUFFERS:
            raise ValueError(f"buffer must be one of {BUFFERS}, got {buffer!r}")
        if buffer == "no_buffer" and page_size != 1:
            raise ValueError("no_buffer needs page size 1 (SGLang's MambaComponent asserts it)")
        if kv_tokens < 1 or mamba_slots < 1 or page_size < 1 or chunk_size < 1 or track_interval < 1:
            raise ValueError("kv_tokens, mamba_slots, page_size, chunk_size and track_interval must be >= 1")
        self.kv_tokens, self.mamba_slots = int(kv_tokens), int(mamba_slots)
        self.strategy = strategy
        self.buffer, self.page_size = buffer, int(page_size)
        self.grid = math.lcm(int(chunk_size), self.page_size)              # mamba_checkpoint_grid
        self.track_grid = math.lcm(self.grid, int(track_interval))         # mamba_track_grid
        self._time = 0.0
        self._next_id = 1
        self.root = EmuNode(np.empty(0, dtype=np.int64), None, 0, self._tick())
        self._tick()
        self._leaves: set[EmuNode] = set()                         # childless nodes (not the root)
        self._mamba_lru: OrderedDict[EmuNode, None] = OrderedDict()  # least recent first
        self.kv_free = self.kv_tokens
        self.mamba_free = self.mamba_slots
        self.tree_kv = 0
        self.tree_states = 0
        self.counters: dict[str, int] = {"evicted:kv-leaf": 0, "evicted:state-leaf": 0,
                                         "evicted:state-tombstone": 0, "states_kept": 0}

    # ------------------------------------------------------------------------------ clock
    def _tick(self) -> float:
        """SGLang's ``get_and_increase_time_counter``."""
        now = self._time
        self._time += 1.0
        return now

    def _new_node(self, key: np.ndarray, parent: EmuNode) -> EmuNode:
        node = EmuNode(key, parent, self._next_id, self._tick())
        self._tick()                                   # creation_time
        self._next_id += 1
        return node

    # ------------------------------------------------------------------------------ keys
    def _child_key(self, key: np.ndarray, offset: int = 0) -> Any:
        if self.page_size == 1:
            return int(key[offset])
        return tuple(int(t) for t in key[offset:offset + self.page_size])

    def _match_len(self, edge: np.ndarray, key: np.ndarray, offset: int) -> int:
        """Common prefix of ``edge`` and ``key[offset:]``, in whole pages."""
        n = min(len(edge), len(key) - offset)
        diff = np.flatnonzero(edge[:n] != key[offset:offset + n])
        common = int(diff[0]) if len(diff) else n
        return common // self.page_size * self.page_size

    def _aligned(self, n: int) -> int:
        return n // self.page_size * self.page_size

    # ------------------------------------------------------------------------------ structure
    def _split(self, child: EmuNode, split_len: int) -> EmuNode:
        """``_split_node``: a new parent holding ``child.key[:split_len]``, with no state (a tombstone);
        it inherits the child's FULL lock (the child's path is locked through it)."""
        parent = child.parent
        assert parent is not None
        new = self._new_node(child.key[:split_len], parent)
        new.component_data[FULL].lock_ref = child.component_data[FULL].lock_ref
        child.key = child.key[split_len:]
        child.parent = new
        new.children[self._child_key(child.key)] = child
        parent.children[self._child_key(new.key)] = new
        child.last_access_time = self._tick()
        return new

    def _add_leaf(self, parent: EmuNode, key: np.ndarray) -> EmuNode:
        node = self._new_node(key, parent)
        parent.children[self._child_key(key)] = node
        self._leaves.discard(parent)
        self._leaves.add(node)
        self.tree_kv += len(key)
        return node

    def _is_evictable_leaf(self, node: EmuNode) -> bool:
        """``_is_device_leaf``: childless, not the root, no component locked."""
        return (node in self._leaves and node.component_data[FULL].lock_ref == 0
                and node.component_data[MAMBA].lock_ref == 0)

    def _set_state(self, node: EmuNode) -> None:
        node.component_data[MAMBA].value = True
        self._mamba_lru[node] = None                   # insert_mru
        self.tree_states += 1
        self.counters["states_kept"] += 1

    def _drop_state(self, node: EmuNode) -> None:
        node.component_data[MAMBA].value = None
        self._mamba_lru.pop(node, None)
        self.tree_states -= 1
        self.mamba_free += 1

    def _delete_leaf(self, node: EmuNode) -> None:
        """``_delete_unbacked_device_leaf``: frees the leaf's KV and its state; the parent keeps its KV
        (no ancestor is deleted: without HiCache every node holds KV)."""
        if node.has_state:
            self._drop_state(node)
        parent = node.parent
        assert parent is not None
        del parent.children[self._child_key(node.key)]
        self._leaves.discard(node)
        if not parent.children and parent is not self.root:
            self._leaves.add(parent)
        self.tree_kv -= len(node.key)
        self.kv_free += len(node.key)

    # ------------------------------------------------------------------------------ locks
    def lock(self, node: EmuNode) -> None:
        """FULL: the whole path up to the root; MAMBA: the node alone (tombstones counted too)."""
        if node is self.root:
            return
        node.component_data[MAMBA].lock_ref += 1
        x: EmuNode | None = node
        while x is not None and x is not self.root:
            x.component_data[FULL].lock_ref += 1
            x = x.parent

    def unlock(self, node: EmuNode) -> None:
        if node is self.root:
            return
        assert node.component_data[MAMBA].lock_ref > 0
        node.component_data[MAMBA].lock_ref -= 1
        x: EmuNode | None = node
        while x is not None and x is not self.root:
            assert x.component_data[FULL].lock_ref > 0
            x.component_data[FULL].lock_ref -= 1
            x = x.parent

    # ------------------------------------------------------------------------------ match
    def match(self, tokens: np.ndarray, limit: int) -> tuple[ServeResult, EmuNode]:
        """``match_prefix`` of ``tokens[:limit]``: the result and the hit node (root when none)."""
        key = tokens[:self._aligned(min(limit, len(tokens)))]
        node, offset, kv_hit = self.root, 0, 0
        best, best_len = self.root, 0
        while offset < len(key):
            child = node.children.get(self._child_key(key, offset))
            if child is None:
                break
            n = self._match_len(child.key, key, offset)
            kv_hit += n
            if n < len(child.key):
                if n > 0:
                    self._split(child, n)                # the new parent has no state: never the best
                break
            node = child
            offset += n
            if node.has_state:
                best, best_len = node, offset
        if best.has_state:
            self._mamba_lru.move_to_end(best)            # refresh_lru(MATCH_END): the used state only
        now = self._tick()
        x: EmuNode | None = best
        while x is not None:
            x.last_access_time = now
            now -= 0.00001
            x = x.parent
        return ServeResult(len(tokens), best_len, kv_hit), best

    # ------------------------------------------------------------------------------ insert
    def insert(self, key: np.ndarray, prev_prefix_len: int) -> _InsertResult:
        """Insert ``key`` with a Mamba state at its end; frees the caller's duplicate KV at positions
        ``>= prev_prefix_len`` that the tree already holds. ``mamba_exist``: the end node had a state
        (the caller frees its slot)."""
        key = key[:self._aligned(len(key))]
        self.root.last_access_time = self._tick()
        if len(key) == 0:
            return _InsertResult(self.root, True, 0)
        node, offset = self.root, 0
        while offset < len(key):
            child = node.children.get(self._child_key(key, offset))
            if child is None:
                break
            child.last_access_time = self._tick()        # _touch_node
            n = self._match_len(child.key, key, offset)
            if n < len(child.key):
                child = self._split(child, n)
            dup_start = max(0, prev_prefix_len - offset)
            if dup_start < n:                            # FreeDeviceKV: the request's copy of cached KV
                self.kv_free += n - dup_start
            node = child
            offset += n
        if offset < len(key):
            node = self._add_leaf(node, key[offset:])
            self._set_state(node)
            return _InsertResult(node, False, offset)
        if not node.has_state:
            self._set_state(node)
            node.last_access_time = self._tick()
            return _InsertResult(node, False, offset)
        self._mamba_lru.move_to_end(node)
        node.last_access_time = self._tick()
        return _InsertResult(node, True, offset)

    # ------------------------------------------------------------------------------ eviction
    def _evict_kv(self, target_free: int) -> None:
        """The FULL walk: leaves by priority until ``kv_free >= target_free``."""
        leaves = [n for n in self._leaves if self._is_evictable_leaf(n)]
        strategy = self.strategy
        if strategy is not None:
            strategy.begin_full_walk(leaves)
        priority: Callable[[EmuNode], Any] = (strategy.get_priority if strategy is not None
                                              else (lambda n: n.last_access_time))
        heap = [(priority(n), n) for n in leaves]
        heapq.heapify(heap)
        while self.kv_free < target_free and heap:
            _, x = heapq.heappop(heap)
            if not self._is_evictable_leaf(x):
                continue
            parent = x.parent
            self._delete_leaf(x)
            self.counters["evicted:kv-leaf"] += 1
            if parent is not None and self._is_evictable_leaf(parent):
                heapq.heappush(heap, (priority(parent), parent))

    def _lru_order(self) -> Iterator[EmuNode]:
        return (n for n in self._mamba_lru if n.component_data[MAMBA].lock_ref == 0)

    def _evict_state(self) -> bool:
        """The MAMBA walk, one step: the least recent unlocked state (or Marconi's pick); a leaf is
        deleted whole, an inner node tombstoned. False when no state is unlocked."""
        if self.strategy is not None:
            x = self.strategy.pick_state(list(self._lru_order()), self._is_evictable_leaf)
        else:
            x = next(self._lru_order(), None)
        if x is None:
            return False
        if self._is_evictable_leaf(x):
            self._delete_leaf(x)
            self.counters["evicted:state-leaf"] += 1
        else:
            self._drop_state(x)
            self.counters["evicted:state-tombstone"] += 1
        return True

    def _alloc_kv(self, n: int) -> None:
        if n <= 0:
            return
        if self.kv_free < n:
            self._evict_kv(n)
        if self.kv_free < n:
            raise PoolExhausted(f"SGLang's KV pool ({self.kv_tokens} tokens) cannot hold a {n}-token allocation "
                                "after evicting everything unlocked (a request and its locked prefix must fit): "
                                "raise the capacity or set kv_tokens=")
        self.kv_free -= n

    def _alloc_states(self, n: int) -> None:
        for _ in range(n):
            if self.mamba_free < 1 and not self._evict_state():
                raise PoolExhausted(f"SGLang's Mamba pool ({self.mamba_slots} slots) has no free state after eviction")
            self.mamba_free -= 1

    # ------------------------------------------------------------------------------ a request
    def admit(self, prompt: Sequence[int] | np.ndarray) -> _Request:
        """Admission (``match_kv_cache``): match capped at ``len(prompt) - 1``, lock, allocate the
        request's Mamba slot(s), then the prompt's uncached KV."""
        tokens = np.asarray(prompt, dtype=np.int64)
        match, node = self.match(tokens, max(len(tokens) - 1, 0))
        self.lock(node)
        slots = 1 + (_TRACK_SLOTS if self.buffer == "extra_buffer" else 0)
        self._alloc_states(slots)
        self._alloc_kv(len(tokens) - match.hit_len)
        return _Request(tokens, match, node, match.hit_len, len(tokens) - match.hit_len, slots)

    def _checkpoint(self, req: _Request, key: np.ndarray, *, finished: bool) -> None:
        """``checkpoint_into_tree``: insert ``key`` (with a state), then move the lock to its node."""
        if not finished:
            self._alloc_states(1)                        # the copy (no_buffer) / the donated track slot's stand-in
        protected = req.protected_len
        result = self.insert(key, protected)
        taken = len(key) - result.prefix_len             # the new leaf's KV, the request's until now
        freed_dup = max(0, result.prefix_len - protected)
        req.private_kv -= taken + freed_dup
        if finished:
            req.slots -= 1                               # the request's own slot goes to the tree
        if result.mamba_exist:
            self.mamba_free += 1                         # the offered state is not kept
        self.unlock(req.node)
        self.lock(result.node)
        req.node = result.node
        req.protected_len = len(key)

    def prefill_done(self, req: _Request) -> None:
        """End of prefill (``checkpoint_kv_cache(up_to=len(prompt))``); idempotent."""
        if req.prefilled:
            return
        req.prefilled = True
        prompt = req.prompt
        if self.buffer == "no_buffer":
            self._checkpoint(req, prompt, finished=False)
            return
        extend = len(prompt) - req.match.hit_len
        if extend < self.grid:                           # no tracked state: nothing is inserted
            return
        track = req.match.hit_len + extend // self.grid * self.grid
        branching = req.match.kv_hit_len // self.grid * self.grid
        if req.match.hit_len < branching < track and (branching - req.match.hit_len) % self.grid == 0:
            track = branching                            # mamba_branching_seqlen inside this extend
        self._checkpoint(req, prompt[:track], finished=False)

    def complete(self, req: _Request, output: Sequence[int] | np.ndarray) -> None:
        """Decode and finish (``release_kv_cache(checkpoint=True)``); frees what the tree did not take."""
        self.prefill_done(req)
        out = np.asarray(output, dtype=np.int64)
        seq = np.concatenate([req.prompt, out])
        committed = len(req.prompt) + max(len(out) - 1, 0)       # the last sampled token is never fed back
        decode = committed - len(req.prompt)
        self._alloc_kv(decode)
        req.private_kv += decode
        if self.buffer == "no_buffer":
            end = committed
        else:
            crossed = committed // self.track_grid * self.track_grid
            end = crossed if crossed > len(req.prompt) else 0   # no decode boundary: nothing is donated
        if end > req.protected_len:
            self._checkpoint(req, seq[:end], finished=True)
        self.mamba_free += req.slots
        req.slots = 0
        self.kv_free += req.private_kv                   # KV past what the tree keyed
        req.private_kv = 0
        self.unlock(req.node)
        if self.strategy is not None and hasattr(self.strategy, "observe"):   # the plugin's checkpoint hook
            m = req.match
            self.strategy.observe(req.prompt.tolist(), out.tolist(), m.hit_len, max(0, m.kv_hit_len - m.hit_len))

    def serve(self, prompt: Sequence[int], output: Sequence[int]) -> ServeResult:
        """One request, start to finish (the bench's order)."""
        req = self.admit(prompt)
        self.complete(req, output)
        return req.match

    def clone(self, strategy: Any = None) -> "UnifiedRadixEmulator":
        """An independent copy of the tree, the pools, the clock and the counters, under ``strategy``
        (None: SGLang's LRU). Node keys are shared (never written in place). Take it between requests:
        locks are copied, the requests holding them are not."""
        new = object.__new__(UnifiedRadixEmulator)
        new.__dict__.update(self.__dict__)
        new.strategy = strategy
        new.counters = dict(self.counters)
        copies: dict[EmuNode, EmuNode] = {}
        stack: list[tuple[EmuNode, EmuNode | None]] = [(self.root, None)]
        while stack:
            node, parent = stack.pop()
            twin = EmuNode(node.key, parent, node.id, node.last_access_time)
            twin.creation_time = node.creation_time
            for mine, theirs in zip(twin.component_data, node.component_data):
                mine.value, mine.lock_ref = theirs.value, theirs.lock_ref
            if parent is not None:
                parent.children[self._child_key(node.key)] = twin
            copies[node] = twin
            stack.extend((child, twin) for child in node.children.values())
        new.root = copies[self.root]
        new._leaves = {copies[n] for n in self._leaves}
        new._mamba_lru = OrderedDict((copies[n], None) for n in self._mamba_lru)
        return new

    # ------------------------------------------------------------------------------ checks
    def nodes(self) -> Iterator[EmuNode]:
        stack = [self.root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def check_invariants(self, in_flight: Sequence[_Request] = ()) -> None:
        """Recompute KV and state counts, leaves, the Mamba LRU and lock counts from the tree."""
        kv = states = 0
        full_locks: dict[int, int] = {}
        mamba_locks: dict[int, int] = {}
        for req in in_flight:
            x: EmuNode | None = req.node
            if x is not self.root:
                mamba_locks[x.id] = mamba_locks.get(x.id, 0) + 1
            while x is not None and x is not self.root:
                full_locks[x.id] = full_locks.get(x.id, 0) + 1
                x = x.parent
        for node in self.nodes():
            if node is self.root:
                continue
            kv += len(node.key)
            states += node.has_state
            if len(node.key) == 0 or len(node.key) % self.page_size:
                raise AssertionError(f"{node}: edge of {len(node.key)} tokens (page {self.page_size})")
            if (node in self._leaves) != (not node.children):
                raise AssertionError(f"{node}: leaf set out of date")
            if node.has_state != (node in self._mamba_lru):
                raise AssertionError(f"{node}: Mamba LRU out of date")
            if node.component_data[FULL].lock_ref != full_locks.get(node.id, 0):
                raise AssertionError(f"{node}: FULL lock {node.component_data[FULL].lock_ref}, "
                                     f"expected {full_locks.get(node.id, 0)}")
            if node.component_data[MAMBA].lock_ref != mamba_locks.get(node.id, 0):
                raise AssertionError(f"{node}: MAMBA lock out of date")
            for k, child in node.children.items():
                if child.parent is not node or self._child_key(child.key) != k:
                    raise AssertionError(f"{child}: wrong parent or child key")
        private_kv = sum(r.private_kv for r in in_flight)
        slots = sum(r.slots for r in in_flight)
        if kv != self.tree_kv or kv + private_kv + self.kv_free != self.kv_tokens:
            raise AssertionError(f"KV: tree {kv} (counted {self.tree_kv}) + requests {private_kv} + free "
                                 f"{self.kv_free} != pool {self.kv_tokens}")
        if states != self.tree_states or states + slots + self.mamba_free != self.mamba_slots:
            raise AssertionError(f"Mamba: tree {states} (counted {self.tree_states}) + requests {slots} + free "
                                 f"{self.mamba_free} != pool {self.mamba_slots}")


def emulator_for(spec: ModelSpec, kv_tokens: int, mamba_slots: int, *, policy: str = "lru",
                 policy_config: dict[str, Any] | None = None, **options: Any) -> UnifiedRadixEmulator:
    """An emulator under SGLang's ``lru`` or the plugin's ``marconi`` (``policy_config`` as the plugin's
    ``--radix-eviction-policy-config``; its ``model`` defaults to ``spec``), the adaptive source
    started on the pools as the plugin starts it (the worlds on emulators with these ``options``)."""
    strategy = None
    if policy == "marconi":
        from marconi.integrations.sglang.policy import MarconiStrategy

        config = dict(policy_config or {})
        model = config.pop("model", None) or spec
        strategy = MarconiStrategy.from_config(config, mamba_index=MAMBA, default_model=model)
        strategy.start_shadow(kv_tokens, mamba_slots, world_maker(strategy.spec, kv_tokens, mamba_slots, **options))
    elif policy != "lru":
        raise ValueError(f"policy must be lru or marconi, got {policy!r}")
    return UnifiedRadixEmulator(kv_tokens, mamba_slots, strategy=strategy, **options)


class EmulatedWorld:
    """One rule's copy of SGLang's cache (a :class:`~marconi.integrations.common.worlds_alpha.World`):
    this emulator under a fixed ``(alpha, efficiency)`` of the plugin's strategy (SGLang's LRU at α = 0)."""

    def __init__(self, emulator: UnifiedRadixEmulator, spec: ModelSpec) -> None:
        self.emulator = emulator
        self.spec = spec

    def strategy(self, alpha: float, efficiency: str | None) -> Any:
        if alpha == 0:
            return None                  # the plugin at α = 0 is SGLang's LRU, victim for victim (tested)
        from marconi.integrations.sglang.policy import MarconiStrategy

        return MarconiStrategy(self.spec, MAMBA, alpha, efficiency or "total")

    def serve(self, prompt: Sequence[int], output: Sequence[int]) -> int:
        return self.emulator.serve(prompt, output).hit_len

    def clone(self, alpha: float, efficiency: str | None) -> "EmulatedWorld":
        return EmulatedWorld(self.emulator.clone(self.strategy(alpha, efficiency)), self.spec)

    def follow(self, alpha: float, efficiency: str | None) -> None:
        self.emulator.strategy = self.strategy(alpha, efficiency)


def world_maker(spec: ModelSpec, kv_tokens: int, mamba_slots: int,
                **options: Any) -> Callable[[float, "str | None"], EmulatedWorld]:
    """What the exact-worlds α source builds its worlds with: empty emulators of these pools and
    ``options`` (buffer, page size, ...), one per rule."""
    def make(alpha: float, efficiency: str | None) -> EmulatedWorld:
        world = EmulatedWorld(UnifiedRadixEmulator(kv_tokens, mamba_slots, **options), spec)
        world.follow(alpha, efficiency)
        return world
    return make
