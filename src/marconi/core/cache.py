"""PrefixCache: a request's lifecycle (begin, finish, abort) and the eviction loop, over the
store (:mod:`marconi.core.store`: tree, bytes, candidates, surgery) with an admission and an
eviction policy, and dead tails (:mod:`marconi.core.tails`) when a policy asks.

This is the one cache shared by the simulator, the rule choosers' worlds and the real engine. A request
goes through it in three steps (see ``docs/cache-api.md``)::

    handle = cache.begin(input_tokens)      # match, lock the matched path, speculative insertion
    ...                                     # (engine) restore cache.cached_prefix(handle), prefill
                                            # the rest capturing handle.prefill_checkpoints, decode
    cache.finish(handle, output_tokens)     # admit checkpoints, evict if needed, insert, unlock

Byte accounting is the store's, from the :class:`~marconi.core.model.ModelSpec`. Payloads (sizes
in simulation, tensors in the engine) are opaque; the engine supplies a :class:`PayloadOps` to
split and join KV payloads when edges split and merge.

Time is injected: ``clock()`` is read for recency; without one, a logical clock ticks once per
request (like the Marconi authors' simulator). Nothing here reads the wall clock.

Threads: every public method holds the cache's re-entrant lock (``cache.lock``) while it runs, so
requests may be begun, finished and aborted from any number of threads. A method's callbacks
(``states``, ``kv``, observers, ``PayloadOps``) run under that lock. Reading ``stats`` or the tree
while other threads work is not atomic: hold ``cache.lock`` for a consistent view.

Failures: any callback may raise (an allocator out of memory, a buggy observer). Each is called
before the step that needs it changes the tree, or after the step is whole, so the cache stays
consistent (``check_invariants`` holds) and keeps serving; what becomes of the request is stated
by each method (``finish`` always ends it, as an abort).
"""

from __future__ import annotations

import copy
import functools
import math
import numbers
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, NamedTuple

import numpy as np

from marconi.core.admission import AdmissionContext, AdmissionPolicy, FinalPlan, MatchResult, make_admission
from marconi.core.eviction import EvictionPolicy, make_eviction
from marconi.core.model import ModelSpec, get_model
from marconi.core.radix import Node, RadixTree, WalkResult
from marconi.core.registry import ConfigError
from marconi.core.store import (SIZE_ONLY, InvariantError, PayloadOps, SizeOnly, SizeOnlyPayloads, TreeStore,
                                 require)
from marconi.core.tails import DeadTails

__all__ = ["PrefixCache", "RequestHandle", "CachedPrefix", "InsertResult", "PayloadOps", "SizeOnly", "SizeOnlyPayloads",
           "SIZE_ONLY", "CacheObserver", "TreeSnapshot", "InvariantError", "ManualClock", "as_tokens"]


class CacheObserver:
    """Hooks for components that watch the cache (a rule chooser's feed,
    :func:`marconi.core.chooser.follow`). Default: do nothing.

    Every request an observer is told ``on_begin`` of ends with exactly one ``on_finish`` or
    ``on_abort``, also when the cache or another observer raises. An observer that raises is
    reported to the cache's caller after every other observer was told of the same event; the
    cache's own state is consistent by then (see :meth:`PrefixCache.begin` and
    :meth:`PrefixCache.finish` for what becomes of the request).
    """

    def on_begin(self, cache: "PrefixCache", handle: "RequestHandle") -> None:
        pass

    def on_finish(self, cache: "PrefixCache", handle: "RequestHandle", output_tokens: np.ndarray) -> None:
        pass

    def on_prefill(self, cache: "PrefixCache", handle: "RequestHandle") -> None:
        """``insert_prefill`` admitted (or tried to admit) the request's prefill checkpoints."""

    def on_abort(self, cache: "PrefixCache", handle: "RequestHandle") -> None:
        """The request ended without finishing: unlocked, nothing inserted by ``finish`` — an
        ``abort``, or a ``begin``/``finish`` that raised (a ``finish`` that raised part-way may
        have evicted, and inserted part of its sequence)."""

    def on_first_eviction(self, cache: "PrefixCache") -> None:
        pass


@dataclass(slots=True)
class TreeSnapshot:
    """A cache's tree without payloads or locks, as plain data a worker process can be sent.

    Parallel lists, one entry per node, parents before children. Taken by
    :meth:`PrefixCache.snapshot`, restored by :meth:`PrefixCache.from_snapshot`.
    """

    page_size: int
    parent_index: list[int]            # index into these lists; -1 = child of the root
    tokens: list[np.ndarray]
    ckpt_positions: list[list[int]]    # the node's checkpoint positions (absolute)
    last_access: list[float]
    access_seq: list[int]
    path_access: list[float]
    path_seq: list[int]
    clock_value: float


@dataclass(slots=True, eq=False)
class RequestHandle:
    """An in-flight request between ``begin`` and ``finish``; its matched path stays locked."""

    request_id: int
    tokens: np.ndarray
    match: MatchResult
    prefill_checkpoints: tuple[int, ...]
    branch_len: int | None
    hit_node: Node | None
    lock_node: Node | None
    matched_node: Node | None   # deepest fully matched node: it spells tokens[:depth] while locked
    begin_time: float
    active: bool = True
    max_hit_len: int | None = None  # as passed to ``begin`` (a shadow of this cache replays it alike)
    tail_base: int = -1         # dead tails: where the input left its predecessor, if it branched (else -1)
    tail_lineage: bool = False  # ... inside another sequence's leaf (else at an inner node)


class CachedPrefix(NamedTuple):
    """Payloads to restore for a hit: KVs covering ``[0, length)`` in order, and the SSM state."""

    length: int
    kv: list[Any]
    ssm: Any


class InsertResult(NamedTuple):
    cached: bool                       # False if nothing could be inserted (no room, or vanilla)
    inserted_tokens: int               # new KV tokens added to the tree
    admitted: tuple[int, ...]          # positions that received a new checkpoint


class ManualClock:
    """A clock its owner sets (``clock.now = trace_time``) or ticks: the simulator's and the
    tuner's clock, and the cache's default logical clock (one tick per request event)."""

    __slots__ = ("now",)

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def tick(self) -> None:
        self.now += 1.0


def as_tokens(tokens: Any, what: str, *, allow_empty: bool = False) -> np.ndarray:
    """Validate and convert token ids to a 1-D int32 array (without copying when possible: the
    result may share memory with ``tokens``).

    Token ids are integers in ``[0, 2**31)``: the trace schema's range (a negative id is no token
    of any vocabulary, and int32 is what the tree stores). Raises ValueError naming ``what`` and
    the offending id otherwise.
    """
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"{what} must be a 1-D sequence of token ids, got shape {arr.shape}")
    if arr.size == 0:
        if allow_empty:
            return np.empty(0, dtype=np.int32)
        raise ValueError(f"{what} is empty: a request needs at least one input token")
    kind = arr.dtype.kind  # 'i' signed, 'u' unsigned integers (a dtype.kind test is ~10x np.issubdtype's cost)
    if kind != "i" and kind != "u":
        raise ValueError(f"{what} must hold integer token ids, got dtype {arr.dtype}")
    if kind == "i":
        if arr.min() < 0:
            at = int(np.argmax(arr < 0))
            raise ValueError(f"{what}: token id {int(arr[at])} at index {at} is negative; token ids are >= 0")
    if arr.dtype != np.int32:
        highest = arr.max()
        if highest > np.iinfo(np.int32).max:
            raise ValueError(f"{what}: token id {int(highest)} does not fit in int32 (ids must be < 2**31)")
        arr = arr.astype(np.int32)
    return arr



def _is_whole(value: Any) -> bool:
    """An integer (Python's or NumPy's), not a bool: what a count of tokens may be."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_max_hit_len(max_hit_len: Any) -> None:
    """TypeError unless ``max_hit_len`` is None or an integer; ValueError if it is negative."""
    if max_hit_len is None:
        return
    if not _is_whole(max_hit_len):
        raise TypeError(f"max_hit_len must be None or an integer >= 0 (tokens), got "
                        f"{type(max_hit_len).__name__} {max_hit_len!r}")
    if max_hit_len < 0:
        raise ValueError(f"max_hit_len must be >= 0 (tokens; 0: resume from nothing), got {max_hit_len}")


def _check_suppliers(states: Any, kv: Any) -> None:
    """TypeError unless ``states`` is None, a mapping or a callable, and ``kv`` None or a callable."""
    if not (states is None or callable(states) or isinstance(states, Mapping)):
        raise TypeError(f"states must be a mapping {{position: payload}}, a callable position -> payload, "
                        f"or None, got {type(states).__name__}")
    if not (kv is None or callable(kv)):
        raise TypeError(f"kv must be a callable (start, end) -> KV payload, or None, got {type(kv).__name__}")


def _check_capacity(capacity_bytes: Any) -> None:
    """Raise ConfigError unless ``capacity_bytes`` is a finite real number >= 0 (bytes).

    Text such as ``"1GB"`` is refused with a hint rather than parsed: the core takes numbers only
    (parsing units is the CLI's and ``marconi.units``' job).
    """
    if isinstance(capacity_bytes, (str, bytes)):
        raise ConfigError(f"capacity_bytes must be a number of bytes, got the text {capacity_bytes!r}: pass bytes "
                          f"as a number (e.g. 1e9), or convert the text with marconi.units.parse_bytes")
    if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, numbers.Real):
        raise ConfigError(f"capacity_bytes must be a number of bytes, got {type(capacity_bytes).__name__} "
                          f"{capacity_bytes!r}")
    if not math.isfinite(capacity_bytes) or capacity_bytes < 0:
        raise ConfigError(f"capacity_bytes must be a finite number >= 0, got {capacity_bytes!r}")


def _locked(method: Callable) -> Callable:
    """Run a public ``PrefixCache`` method under the cache's lock (see the module docstring)."""

    @functools.wraps(method)
    def locked(self: "PrefixCache", *args: Any, **kwargs: Any) -> Any:
        with self._mutex:
            return method(self, *args, **kwargs)

    return locked


def _own_tokens(tokens: Any, what: str) -> np.ndarray:
    """``as_tokens`` as a read-only array the caller cannot change: a handle keeps its request's
    tokens until ``finish``, and a caller reusing its buffer in between must not change them.

    A writable array of the caller's (or a view of one, e.g. of a torch tensor) is copied; one
    ``as_tokens`` just made is kept. An array that is already read-only is kept without a copy:
    read-only is the caller's promise that it will not change (``Trace`` token arrays are, and
    copying each one would cost the simulator ~6 us per request).
    """
    arr = as_tokens(tokens, what)
    if arr.flags.writeable:
        if arr is tokens or arr.base is not None:
            arr = arr.copy()
        arr.flags.writeable = False
    return arr


class PrefixCache(TreeStore):
    """A byte-bounded radix prefix cache for hybrid models.

    Args:
        spec: the model's cost model (a ``ModelSpec`` or preset name).
        capacity_bytes: total bytes for KVs + SSM checkpoints; never exceeded.
        admission: an admission policy or registry name (``none``, ``marconi``, ``every-block:block=32``).
        eviction: an eviction policy or registry name (``lru``, ``flop-aware:alpha=1``).
        clock: returns the current time (any monotone unit); default a logical request counter.
        payloads: ``PayloadOps`` for real payloads; default sizes only (simulation).
        prefill_chunk_len: where an engine can take a state inside a prefill. None (default):
            anywhere (segmented prefill). ``C``: only on the scan's chunk grid (chunk-boundary
            checkpointing) — a prefill resumed at ``u`` yields states at ``u + j*C`` (on a paged
            tree, also page-aligned), so a checkpoint wanted at ``p`` with ``u < p < len(input)``
            is taken at the last such boundary ``<= p``, or not at all if there is none. States at
            the input's end and in the decoded output are exact either way. A simulation given
            the engine's value makes the engine's decisions.

    Raises:
        ConfigError: negative capacity, unknown policy, or a capacity that cannot hold even one
            SSM checkpoint of this model while the policy caches anything.
    """

    def __init__(self, spec: ModelSpec | str, capacity_bytes: float, admission: AdmissionPolicy | str = "marconi",
                 eviction: EvictionPolicy | str = "lru", *, clock: Callable[[], float] | None = None,
                 payloads: PayloadOps | None = None, prefill_chunk_len: int | None = None) -> None:
        self.spec = get_model(spec)
        self.admission = make_admission(admission)
        self.eviction = make_eviction(eviction)
        _check_capacity(capacity_bytes)
        if prefill_chunk_len is not None and not (_is_whole(prefill_chunk_len) and prefill_chunk_len >= 1):
            raise ConfigError(f"prefill_chunk_len must be None or an integer >= 1 (tokens), got "
                              f"{type(prefill_chunk_len).__name__} {prefill_chunk_len!r}")
        self.capacity_bytes = int(capacity_bytes)
        if self.admission.caches and self.capacity_bytes < self.spec.ssm_checkpoint_bytes:
            raise ConfigError(
                f"capacity {self.capacity_bytes:,} bytes is smaller than one SSM checkpoint of {self.spec.name} "
                f"({self.spec.ssm_checkpoint_bytes:,} bytes): nothing could ever be cached; raise the capacity")
        self._logical = ManualClock() if clock is None else None
        self.clock: Callable[[], float] = clock if clock is not None else self._logical  # type: ignore[assignment]
        TreeStore.__init__(self, self.spec, self.capacity_bytes, self.admission.page_size,
                           payloads if payloads is not None else SizeOnlyPayloads(),
                           inner_candidates=self.eviction.evicts_inner_nodes,
                           efficiency_variant=self.eviction.efficiency_variant)
        self._next_request_id = 0
        # Requests between begin and finish/abort; each holds one lock on every node from its
        # lock_node up to the root, so node.lock_ref == the number of them whose path passes there.
        self._in_flight: dict[int, RequestHandle] = {}
        self._observers: list[CacheObserver] = []
        self._evicted_once = False
        self.prefill_chunk_len = None if prefill_chunk_len is None else int(prefill_chunk_len)
        # states inside a prefill lie on this grid (counted from the resume point), or anywhere (None)
        self._state_grid = (None if self.prefill_chunk_len is None
                            else math.lcm(self.prefill_chunk_len, self.tree.page_size))
        self.admission.bind(self)
        # Dead tails (``marconi.core.tails``), tracked when the admission (tails=reach) or the
        # eviction (a rule with tails, or a family with one) asks; cut when ``_trims_tails()``.
        self._admission_trims = self.admission.tails == "reach"
        tracks = self._admission_trims or self.eviction.tracks_tails
        self.dead_tails = DeadTails() if tracks and self.admission.caches else None
        self._mutex = threading.RLock()
        self.eviction.bind(self)

    # ================================================================== public API
    @property
    def lock(self) -> threading.RLock:
        """The lock every public method holds; hold it to read ``stats`` or the tree consistently
        while other threads use the cache, or to make several calls atomic."""
        return self._mutex

    @_locked
    def add_observer(self, observer: CacheObserver) -> None:
        self._observers.append(observer)

    @property
    def chooser(self) -> Any:
        """The :class:`~marconi.core.chooser.RuleChooser` setting this cache's rule online (its eviction
        policy's ``chooser``), or None; records echo its ``tuning_record()``."""
        return self.eviction.chooser

    @_locked
    def set_rule(self, rule: Any) -> None:
        """Evict by ``rule`` (a :class:`~marconi.core.eviction.Rule`) from now on, through the eviction
        policy's ``set_rule``: ConfigError, and nothing changes, if the policy cannot apply it."""
        self.eviction.set_rule(rule)

    @_locked
    def in_flight(self, request_id: int) -> RequestHandle:
        """The handle of the in-flight request ``request_id`` (KeyError if it is not in flight)."""
        return self._in_flight[request_id]

    @property
    def keeps_logical_clock(self) -> bool:
        """True when the cache ticks its own logical clock (no ``clock`` was given)."""
        return self._logical is not None

    @property
    def tail_margin(self) -> int | None:
        """Dead tails (``marconi.core.tails``): tokens past its base a branched leaf is predicted to
        be re-entered, or None (not tracked, or no margin yet: nothing is cut)."""
        return None if self.dead_tails is None else self.dead_tails.margin

    @property
    def num_tail_leaves(self) -> int:
        """Dead tails (``marconi.core.tails``): branched leaves whose tail may be cut first. Each is a
        leaf of the tree (``check_invariants`` verifies), so this never exceeds the tree's size."""
        return 0 if self.dead_tails is None else len(self.dead_tails.leaves)


    @property
    def num_in_flight(self) -> int:
        return len(self._in_flight)

    def describe(self) -> dict[str, Any]:
        return {**self.admission.describe(), **self.eviction.describe(), "capacity_bytes": self.capacity_bytes,
                "model": self.spec.name}

    @_locked
    def begin(self, input_tokens: Any, *, max_hit_len: int | None = None) -> RequestHandle:
        """Look up a request's input, lock what it matched, and plan its prefill checkpoints.

        Mutates: splits a block run at the match (so the hit is a node boundary); locks every node
        from the deepest (partly) matched one up to the root until ``finish``/``abort``; refreshes
        recency (the hit node, and the path's path-recency); counts the lookup in ``stats``;
        ticks the logical clock. Nothing is inserted or evicted.

        ``max_hit_len``: resume no deeper than this. An engine that cannot produce the first
        output token's logits from a checkpoint alone passes ``len(input) - 1`` (it must compute
        at least the last input token, and, all or nothing, it can only resume from a checkpoint
        at or before that). The default, no limit, is the paper's accounting (a whole-input hit
        counts as fully reused); an engine that keeps each checkpoint's last hidden state uses it.

        A writable input array is copied: the caller may reuse or change it at once (a
        read-only one is kept as it is). Returns a handle to pass to :meth:`cached_prefix` and
        :meth:`finish` (or :meth:`abort`). Raises ValueError for an empty, negative or non-integer
        input, and TypeError (ValueError) for a ``max_hit_len`` that is not an integer (is
        negative), before anything changes.

        Callbacks: ``PayloadOps.split_kv`` (the run split), the admission policy and the clock run
        before the request is registered: if one raises, no request exists and nothing is locked
        (a run split already done stays, a consistent tree). The observers run last; if one
        raises, the request is released again (every observer is then told ``on_abort``) and the
        error propagates: the caller, who gets no handle, leaves nothing locked.
        """
        _check_max_hit_len(max_hit_len)
        tokens = _own_tokens(input_tokens, "input_tokens")
        limit = len(tokens) if max_hit_len is None else min(int(max_hit_len), len(tokens))
        walk = self._split_run_at_match(self.tree.walk(tokens))
        hit_index = self._hit_index(walk.path, limit)
        hit_node = walk.path[hit_index] if hit_index >= 0 else None
        if self.spec.has_recurrent_state:
            usable = hit_node.depth if hit_node is not None else 0
        else:
            usable = min(walk.matched_len, limit)
        match = MatchResult(len(tokens), walk.matched_len, usable)
        tails = self.dead_tails
        tail_base, tail_lineage = tails.enter(walk, tokens, self.tree.root) if tails is not None else (-1, False)
        branch_len = self._branch_len(len(tokens), walk)
        ctx = AdmissionContext(tokens, len(tokens), match, branch_len, self.spec, self._next_request_id)
        prefill = tuple(sorted(self._placed(self.admission.prefill_checkpoints(ctx), usable, len(tokens),
                                            len(tokens))))
        if self._logical is not None:
            self._logical.tick()
        now = self.clock()
        # From here to the observers nothing calls out: the request is registered as a whole.
        lock_node = walk.partial or (walk.path[-1] if walk.path else None)
        if lock_node is not None:
            self._lock(lock_node)
        for node in walk.path[: hit_index + 1]:  # the path signal: every node up to the hit
            self._touch_path(node, now)
        if hit_node is not None:                   # the hit signal: the resumed-from node only
            self._touch_hit(hit_node, now)
        matched_node = walk.path[-1] if walk.path else None
        handle = RequestHandle(self._next_request_id, tokens, match, prefill, branch_len, hit_node, lock_node,
                               matched_node, now, max_hit_len=max_hit_len, tail_base=tail_base,
                               tail_lineage=tail_lineage)
        self._next_request_id += 1
        self._in_flight[handle.request_id] = handle
        self.stats.record_lookup(match, self.spec, from_checkpoint=hit_node is not None and hit_node.has_ssm)
        if self._observers:
            try:
                self._notify("on_begin", handle)
            except Exception:
                self._end(handle, "on_abort")  # the caller gets no handle: nothing may stay locked for it
                raise
        return handle

    @_locked
    def cached_prefix(self, handle: RequestHandle) -> CachedPrefix:
        """Payloads of the usable prefix, root first: what an engine restores before its prefill.

        Returns the KV payloads covering ``[0, usable_hit_len)`` in tree order (the last one split
        down for a pure transformer whose hit ends inside an edge) and the SSM payload at
        ``usable_hit_len`` (None without a hit). Mutates nothing. Valid only while ``handle`` is in
        flight: its path is locked, so the payloads cannot be evicted or re-split meanwhile.
        Raises ValueError for a finished or aborted handle.
        """
        self._check_active(handle)
        usable = handle.match.usable_hit_len
        if usable == 0:
            return CachedPrefix(0, [], None)
        nodes: list[Node] = []
        node = handle.hit_node
        if not self.spec.has_recurrent_state:
            node = handle.lock_node
        while node is not None and node is not self.tree.root:
            nodes.append(node)
            node = node.parent
        nodes.reverse()
        while nodes and nodes[-1].parent_depth >= usable:  # transformer: the hit ends before this edge
            nodes.pop()
        kv = [n.kv for n in nodes]
        if nodes and nodes[-1].depth > usable:  # pure transformer: usable ends inside the last edge
            keep = usable - nodes[-1].parent_depth
            kv[-1] = self.payloads.split_kv(nodes[-1].kv, keep)[0]
        hit = handle.hit_node
        ssm = None if hit is None or not hit.has_ssm else hit.end_state
        return CachedPrefix(usable, kv, ssm)

    @_locked
    def finish(self, handle: RequestHandle, output_tokens: Any = (), *,
               states: Mapping[int, Any] | Callable[[int], Any] | None = None,
               kv: Callable[[int, int], Any] | None = None) -> InsertResult:
        """Insert input + output with the checkpoints the admission policy asks for, then unlock.

        Mutates: evicts (by the eviction policy, never a locked node) until the new KVs and
        checkpoints fit, splits edges at new checkpoint positions, adds the new tokens as nodes,
        attaches checkpoints; unlocks the request's path; ticks the logical clock; tells the
        observers (a rule chooser's feed). The handle is finished afterwards, even if this raises.

        ``states`` supplies SSM payloads by position and ``kv(start, end)`` KV payloads of
        ``(input + output)[start:end]`` (engine); in simulation leave both None. ``states`` is
        asked for exactly the positions :meth:`finish_checkpoints` returns for the same output
        (and the tree as it is now). A checkpoint whose state is not supplied is skipped (counted
        in ``stats.checkpoints_unavailable``). If the new states cannot fit even after evicting
        everything unlocked, nothing is inserted and ``stats.requests_not_cached`` grows.

        Errors: for a finished or aborted handle, ValueError and nothing changes. Anything else
        that raises — invalid ``output_tokens`` (ValueError), ``states`` or ``kv`` of the wrong
        kind (TypeError naming which), ``states``, ``kv``, a
        ``PayloadOps`` method, the admission or eviction policy — ends the request as an abort:
        the cache stays consistent (what was evicted or inserted before the error stays, as
        whole nodes with their bytes accounted; a node is linked only once its payload exists),
        the path is unlocked, the handle is finished, every observer is told ``on_abort`` (not
        ``on_finish``), and the error propagates. An observer raising from ``on_finish`` is
        reported after every observer was told; the request is finished by then.
        """
        self._check_active(handle)
        try:
            output = as_tokens(output_tokens, "output_tokens", allow_empty=True)
            _check_suppliers(states, kv)
            if not self.admission.caches:
                result = InsertResult(False, 0, ())
            else:
                if self._logical is not None:
                    self._logical.tick()
                seq, walk, plan = self._final(handle, output)
                result = self._insert_sequence(handle, seq, plan, states, kv, walk,
                                               mark=(handle.tail_base, handle.tail_lineage))
        except BaseException:
            self._end(handle, "on_abort")
            raise
        self._end(handle, "on_finish", output)
        return result

    @_locked
    def finish_checkpoints(self, handle: RequestHandle, output_tokens: Any = ()) -> tuple[int, ...]:
        """Dry run of ``finish(handle, output_tokens)``: the positions of input + output whose
        states it would ask ``states`` for, ascending. Changes nothing.

        The answer holds for the tree as it is now (whether the states then fit does not change
        it). In a batch-1 engine nothing else touches the tree between ``begin`` and ``finish``,
        so an engine that knows its output (teacher forcing) learns every position to capture
        before it starts. A generating engine can ask at each decode step, with the tokens so far
        plus the one about to be fed: if the current depth ``d`` is in the answer, ``finish`` will
        want the state at ``d`` for any output that continues this way. That holds for every
        built-in policy — a position below the end is decided by the tokens up to it (a branch
        point where the walk leaves the tree, a block boundary, a position inside the input) —
        and the last position is asked once the output is complete.
        """
        self._check_active(handle)
        if not self.admission.caches:
            return ()
        output = as_tokens(output_tokens, "output_tokens", allow_empty=True)
        seq, walk, plan = self._final(handle, output)
        on_path, tail = self._wanted(handle, plan, walk, len(seq))
        return tuple(sorted(on_path + tail))

    @_locked
    def abort(self, handle: RequestHandle) -> None:
        """Unlock an in-flight request without inserting anything; then tell the observers (an
        observer's error is raised after every observer was told, the request already aborted)."""
        self._check_active(handle)
        self._end(handle, "on_abort")

    @_locked
    def process(self, input_tokens: Any, output_tokens: Any = (), *,
                max_hit_len: int | None = None) -> tuple[MatchResult, InsertResult]:
        """``begin`` + ``finish`` with nothing in between: the strict sequential order of a replay."""
        handle = self.begin(input_tokens, max_hit_len=max_hit_len)
        return handle.match, self.finish(handle, output_tokens)

    # ================================================================== matching helpers
    def _split_run_at_match(self, walk: WalkResult) -> WalkResult:
        """A match ending inside an edge at one of its checkpoints (a block run's) is split there,
        so the hit is a node boundary and only the part actually used gets its recency refreshed."""
        run = walk.partial
        if run is None or not run.holds_checkpoint_at(walk.matched_len):
            return walk
        upper = self._split(run, walk.matched_len - run.parent_depth)
        return WalkResult([*walk.path, upper], walk.matched_len, None)

    def _hit_index(self, path: list[Node], limit: int) -> int:
        """Index in ``path`` of the node a request resumes from, at depth <= ``limit`` (-1: none).

        With SSM layers that is the deepest node holding a checkpoint; for a pure transformer,
        the deepest node (the hit may continue into the next edge's KVs).
        """
        for i in range(len(path) - 1, -1, -1):
            if path[i].depth <= limit and (path[i].has_ssm or not self.spec.has_recurrent_state):
                return i
        return -1

    def _placed(self, positions: Iterable[int], floor: int, input_len: int, limit: int) -> set[int]:
        """Where the states for ``positions`` can be taken: those in ``(floor, limit]``, with
        positions inside the prefill moved to the state grid (see ``prefill_chunk_len``)."""
        wanted = {int(p) for p in positions if floor < p <= limit}
        grid = self._state_grid
        if grid is not None:
            wanted = {p if p >= input_len else floor + (p - floor) // grid * grid for p in wanted}
            wanted.discard(floor)  # no boundary after the resume point
        return wanted


    def _branch_len(self, length: int, walk: WalkResult) -> int | None:
        """Speculative insertion: where inserting ``length`` tokens would create a new branch node."""
        if walk.partial is not None:
            return walk.matched_len
        if walk.path and walk.matched_len < length:
            last = walk.path[-1]
            if last.children and not last.has_ssm:
                return walk.matched_len
        return None

    # ================================================================== insertion
    @_locked
    def insert_prefill(self, handle: RequestHandle, *,
                       states: Mapping[int, Any] | Callable[[int], Any] | None = None,
                       kv: Callable[[int, int], Any] | None = None) -> InsertResult:
        """Admit the prefill checkpoints as soon as prefill completes (before decode ends).

        Inserts the input up to its deepest prefill checkpoint, so concurrent requests can reuse a
        branch point while this request is still decoding. Optional: :meth:`finish` admits whatever
        is still missing. A no-op when there are no prefill checkpoints.

        The observers are told first; if one raises, the error propagates (after every observer
        was told) before the cache changes. If a callback raises during the insertion (``states``,
        ``kv``, ``PayloadOps``), the cache stays consistent with what was done before the error,
        and the request stays in flight: finish or abort it.
        """
        self._check_active(handle)
        _check_suppliers(states, kv)  # before anything: the request stays in flight as it was
        self._notify("on_prefill", handle)
        if not self.admission.caches or not handle.prefill_checkpoints:
            return InsertResult(False, 0, ())
        if self._logical is not None:
            self._logical.tick()
        end = max(handle.prefill_checkpoints)
        seq = handle.tokens[:end]
        plan = FinalPlan(end, handle.prefill_checkpoints)
        page = self.tree.page_size
        first = handle.prefill_checkpoints[0]
        if page > 1 and handle.prefill_checkpoints == tuple(range(first, end + 1, page)):
            plan = FinalPlan(end, (), block=page)  # every block: let the cache keep them as one run
        walk = self.tree.walk(seq, start=handle.matched_node if handle.matched_node and
                              handle.matched_node.depth <= end else None)
        return self._insert_sequence(handle, seq, plan, states, kv, walk)

    def _final(self, handle: RequestHandle, output: np.ndarray) -> tuple[np.ndarray, WalkResult, FinalPlan]:
        """Input + output, its walk (from the handle's locked match) and the admission's final plan."""
        seq = np.concatenate((handle.tokens, output)) if output.size else handle.tokens
        walk = self.tree.walk(seq, start=handle.matched_node)
        ctx = AdmissionContext(seq, len(handle.tokens), handle.match, self._branch_len(len(seq), walk), self.spec,
                               handle.request_id)
        return seq, walk, self.admission.final_plan(ctx, len(seq))

    def _wanted(self, handle: RequestHandle, plan: FinalPlan, walk: WalkResult,
                seq_len: int) -> tuple[list[int], list[int]]:
        """Positions whose states a plan needs, ascending: (on the walked path without a
        checkpoint yet, past the walk). Pure: ``finish_checkpoints`` and ``finish`` share it."""
        insert_len = min(plan.insert_len, seq_len)
        # Only states the request actually computes can be admitted: positions past its resume point.
        floor = handle.match.usable_hit_len
        input_len = len(handle.tokens)
        wanted = self._placed(plan.checkpoints, floor, input_len, insert_len)
        if plan.block:
            first = (floor // plan.block + 1) * plan.block
            boundaries = range(first, insert_len + 1, plan.block)  # in (floor, insert_len] already
            wanted.update(boundaries if self._state_grid is None
                          else self._placed(boundaries, floor, input_len, insert_len))
        matched = walk.matched_len
        walked = (*walk.path, walk.partial) if walk.partial is not None else tuple(walk.path)
        on_path = sorted(p for p in wanted if p <= matched and not any(n.holds_checkpoint_at(p) for n in walked))
        return on_path, sorted(p for p in wanted if p > matched)

    def _insert_sequence(self, handle: RequestHandle, seq: np.ndarray, plan: FinalPlan,
                         states: Mapping[int, Any] | Callable[[int], Any] | None,
                         kv: Callable[[int, int], Any] | None, walk: WalkResult | None = None, *,
                         mark: tuple[int, bool] = (-1, False)) -> InsertResult:
        """Insert ``seq[:plan.insert_len]`` with the plan's checkpoints, evicting what must go.

        Token ranges of ``seq`` (input + output)::

            0            floor            matched                insert_len         len(seq)
            |-- reused ---|--- in the tree ---|---- new nodes -------|-- not kept --|
                          ^ usable_hit_len    ^ walk.matched_len

        * ``[0, floor)``: the request resumed here and computed nothing; no state of it can be
          admitted (all or nothing: the engine never had them);
        * ``[floor, matched)``: already in the tree; checkpoints wanted here are attached to the
          walked nodes (an edge is split where a position falls inside it);
        * ``[matched, insert_len)``: new KVs, one node per checkpoint-to-checkpoint span (or one
          block run);
        * ``[insert_len, len)``: beyond what the admission keeps (vLLM+'s partial last block).

        ``mark``: (base, lineage) from ``DeadTails.enter`` (base >= 0: the request branched there;
        the new leaf's tail may be cut first at eviction).

        The walked path stays locked while evicting, so the request's own prefix survives.

        Callbacks and consistency: ``states`` and the clock are asked before anything changes.
        Later ones (``PayloadOps`` in a split, an eviction or a join; ``kv`` for each new node; the
        eviction policy; ``on_first_eviction``) are each called before the step that needs them
        changes the tree, or after it is complete (``release``), so if one raises, the tree,
        bytes, locks and candidate index are consistent with the steps done so far and the error
        propagates (the caller decides what becomes of the request).
        """
        walk = walk if walk is not None else self.tree.walk(seq)
        # Positions are read before a run is split below: the split changes no answer of
        # ``holds_checkpoint_at`` at or above the match, and the dry run does not split.
        on_path, tail = self._wanted(handle, plan, walk, len(seq))
        to_admit = self._collect_states(states, on_path + tail)
        now = self.clock()  # one time for every node and checkpoint this insertion creates
        walk = self._split_run_at_match(walk)  # lock only what this sequence shares, not the run's rest
        insert_len = min(plan.insert_len, len(seq))
        matched = walk.matched_len
        new_tokens = max(0, insert_len - matched)
        need = new_tokens * self._kv_per_token + len(to_admit) * self._ckpt_bytes
        if need == 0:
            return InsertResult(True, 0, ())
        guard = walk.partial or (walk.path[-1] if walk.path else None)
        if guard is not None:
            self._lock(guard)
        try:
            if need > self.capacity_bytes - self.locked_bytes:
                self.stats.requests_not_cached += 1
                return InsertResult(False, 0, ())
            self._evict_until(need)
            admitted = self._attach_on_path(walk, to_admit, now)
            if new_tokens:
                admitted += self._add_tail(seq, walk, insert_len, to_admit, plan.block, kv, now, mark)
        finally:
            if guard is not None:
                self._unlock(guard)
            self.stats.note_usage(self.used_bytes, self.kv_bytes, self.ssm_bytes)
        return InsertResult(True, new_tokens, tuple(sorted(admitted)))

    def _collect_states(self, states: Mapping[int, Any] | Callable[[int], Any] | None,
                        positions: list[int]) -> dict[int, Any]:
        """Payloads for the positions whose state is available: from ``states`` (a mapping or a
        callable; None: the payload ops' own ``state_at``, every one of them in simulation)."""
        supply = self.payloads.state_at if states is None else states if callable(states) else states.get
        out = {pos: supply(pos) for pos in positions}
        if None in out.values():
            missing = [pos for pos, payload in out.items() if payload is None]
            self.stats.checkpoints_unavailable += len(missing)
            for pos in missing:
                del out[pos]
        return out

    def _attach_on_path(self, walk: WalkResult, to_admit: dict[int, Any], now: float) -> list[int]:
        """Admit checkpoints at positions the tree already holds (splitting edges where needed)."""
        admitted = []
        for pos in sorted(p for p in to_admit if p <= walk.matched_len):
            self._attach_ssm(self._node_ending_at(walk, pos), to_admit[pos], now)
            admitted.append(pos)
        return admitted

    def _node_ending_at(self, walk: WalkResult, pos: int) -> Node:
        """The walked node whose edge ends at ``pos``, splitting the edge that contains it if needed."""
        for node in (*walk.path, *((walk.partial,) if walk.partial is not None else ())):
            if node.depth == pos:
                return node
            if node.parent_depth < pos < node.depth:
                return self._split(node, pos - node.parent_depth)
        raise AssertionError(f"no walked edge contains position {pos}")

    def _add_tail(self, seq: np.ndarray, walk: WalkResult, insert_len: int, to_admit: dict[int, Any], block: int,
                  kv: Callable[[int, int], Any] | None, now: float,
                  mark: tuple[int, bool] = (-1, False)) -> list[int]:
        """Insert ``seq[matched_len:insert_len]`` as new nodes: one run, or a chain cut at checkpoints.

        Each node is complete (payloads, bytes, candidate index) before the next ``kv`` call, so a
        ``kv`` that raises leaves the chain inserted so far, consistent."""
        start = walk.matched_len
        if walk.partial is not None:
            # The partial edge may already have been split at ``start`` to hold a checkpoint.
            offset = start - walk.partial.parent_depth
            parent = self._split(walk.partial, offset) if offset else walk.partial.parent
        else:
            parent = walk.path[-1] if walk.path else self.tree.root
        assert parent is not None
        tail = sorted(p for p in to_admit if p > start)
        if (block and not self.eviction.evicts_inner_nodes and start % block == 0
                and tail == list(range(start + block, insert_len + 1, block))):
            # Block caching under leaf-only eviction: one node holding a checkpoint per block.
            node = self._new_node(seq, start, insert_len, parent, kv, now)
            node.ckpt_positions = tail
            node.ckpt_states = [to_admit[p] for p in tail]
            self._account_ssm(node, len(tail), now)
            if self.dead_tails is not None:
                self.dead_tails.note(node, mark)
            return tail
        admitted = []
        for end in sorted(set(tail) | {insert_len}):
            node = self._new_node(seq, start, end, parent, kv, now)
            if end in to_admit:
                self._attach_ssm(node, to_admit[end], now)
                admitted.append(end)
            else:
                self._update_eff(node)
                self._sync_candidate(node)
            parent, start = node, end
        if self.dead_tails is not None:
            self.dead_tails.note(node, mark)
        return admitted



    # ================================================================== tree surgery with accounting



    def _evict_until(self, need: int) -> None:
        """Evict until ``need`` bytes are free. Each eviction is whole before the next callback
        (``on_first_eviction``, the policy's ``choose``, ``PayloadOps``), so one that raises stops
        the loop with the cache consistent."""
        while self.capacity_bytes - self.used_bytes < need:
            if not self._evicted_once:
                self._evicted_once = True  # first: an observer that raises here is not told again next time
                self._notify("on_first_eviction")
            if self.dead_tails is not None and self._trims_tails() and self._trim_dead_tail():
                continue  # a predicted-dead tail goes before any victim
            if not len(self.candidates):
                raise InvariantError("eviction found no candidate although the feasibility check passed")
            victim = self.candidates.nodes[self.eviction.choose(self.candidates)]
            if victim.children:
                self._evict_inner(victim)
            elif victim.num_checkpoints > 1:
                self._trim_run(victim, need - (self.capacity_bytes - self.used_bytes))
            else:
                self._evict_leaf(victim)



    def _trims_tails(self) -> bool:
        """Cut dead tails now? (A family's live rule may change whether it cuts.)"""
        return self._admission_trims or self.eviction.trims_tails

    def _trim_dead_tail(self) -> bool:
        """Cut the tail :meth:`DeadTails.next_cut` names, dropping its KVs and states; False if it
        names none."""
        cut = self.dead_tails.next_cut(self.tree.page_size)  # type: ignore[union-attr]
        if cut is None:
            return False
        node, reach = cut
        self.stats.tail_trims += 1
        if reach <= node.parent_depth:
            self.stats.tail_tokens_trimmed += node.edge_len
            self._evict_leaf(node)
        else:
            self.stats.tail_tokens_trimmed += node.depth - reach
            self._cut_leaf(node, node.depth - reach)
        return True

    def _release(self, handle: RequestHandle) -> None:
        if handle.lock_node is not None:
            self._unlock(handle.lock_node)
        handle.active = False
        del self._in_flight[handle.request_id]
        self.admission.end_request(handle.request_id)

    def _end(self, handle: RequestHandle, event: str, *args: Any) -> None:
        """Release ``handle`` and tell the observers ``event`` (``on_finish``/``on_abort``) — they
        are told even if the admission policy's ``end_request`` raises (its error comes first)."""
        try:
            self._release(handle)
        finally:
            self._notify(event, handle, *args)

    def _notify(self, event: str, *args: Any) -> None:
        """Call ``event`` on every observer; an observer's error is re-raised once all were told,
        so one failing observer never leaves another (a rule chooser's worlds) a step behind."""
        error: Exception | None = None
        for observer in self._observers:
            try:
                getattr(observer, event)(self, *args)
            except Exception as exc:
                if error is None:
                    error = exc
        if error is not None:
            raise error

    def _check_active(self, handle: RequestHandle) -> None:
        if not handle.active or self._in_flight.get(handle.request_id) is not handle:
            raise ValueError(f"request {handle.request_id} is not in flight in this cache (finished or aborted)")









    # ================================================================== copies (the cache owns them)
    @_locked
    def clone(self, eviction: EvictionPolicy | str) -> "PrefixCache":
        """A size-only copy of this cache that evicts by ``eviction``: it then behaves exactly as this
        cache would under that policy.

        Copied: the tree, both recency signals, the candidate index, the in-flight requests (their
        handles are :meth:`in_flight` in the copy, under the same ids), stats and the admission
        policy's state. Not copied: payloads (the copy holds sizes only), observers, the eviction
        policy and its chooser, and the lock (the copy has its own). The clock is shared unless this cache keeps its
        own logical one. The tree is copied iteratively (a deep chain of nodes would overflow a
        recursive copy). Where ``eviction`` takes other candidates or keeps another FLOP efficiency
        than this cache's policy, the copy's index is rebuilt for it.
        """
        eviction = make_eviction(eviction)
        memo: dict[int, Any] = {id(self.eviction): eviction, id(self._observers): [], id(self.spec): self.spec,
                     id(self._mutex): threading.RLock(), id(self.payloads): SizeOnlyPayloads()}
        if self._logical is None:
            memo[id(self.clock)] = self.clock
        pairs: list[tuple[Node, Node]] = []
        stack = [self.tree.root]
        while stack:
            node = stack.pop()
            twin = Node.__new__(Node)
            for slot in Node.__slots__:
                setattr(twin, slot, getattr(node, slot))
            twin.kv = None
            twin.ckpt_positions = list(node.ckpt_positions)
            twin.ckpt_states = [None] * len(node.ckpt_positions)
            memo[id(node)] = twin
            pairs.append((node, twin))
            stack.extend(node.children.values())
        for node, twin in pairs:
            twin.parent = None if node.parent is None else memo[id(node.parent)]
            twin.children = {key: memo[id(child)] for key, child in node.children.items()}
        twin_cache = copy.deepcopy(self, memo)
        eviction.bind(twin_cache)
        wanted = (eviction.evicts_inner_nodes, eviction.efficiency_variant)
        if wanted != (twin_cache.inner_candidates, twin_cache.efficiency_variant):
            twin_cache.inner_candidates, twin_cache.efficiency_variant = wanted
            twin_cache.reindex()
        return twin_cache

    @_locked
    def snapshot(self) -> TreeSnapshot:
        """The tree as it is now, as plain data (shape, recency, checkpoint positions; no payloads,
        no locks): what the bootstrap tuner replays its α grid from, in worker processes."""
        index: dict[int, int] = {}
        snap = TreeSnapshot(self.tree.page_size, [], [], [], [], [], [], [], float(self.clock()))
        root = self.tree.root
        for node in self.tree.iter_nodes():
            index[node.node_id] = len(snap.tokens)
            parent = node.parent
            snap.parent_index.append(-1 if parent is root else index[parent.node_id])  # type: ignore[union-attr]
            snap.tokens.append(node.tokens)
            snap.ckpt_positions.append(list(node.ckpt_positions))
            snap.last_access.append(node.last_access)
            snap.access_seq.append(node.access_seq)
            snap.path_access.append(node.path_access)
            snap.path_seq.append(node.path_seq)
        return snap

    @classmethod
    def from_snapshot(cls, snapshot: TreeSnapshot, spec: ModelSpec | str, capacity_bytes: float,
                      admission: AdmissionPolicy | str, eviction: EvictionPolicy | str, *,
                      clock: ManualClock) -> "PrefixCache":
        """A size-only cache holding ``snapshot``'s tree, ``clock`` set to the snapshot's time.

        Access counters continue after the snapshot's largest. The snapshot is validated as it
        is restored (it may come from another process): every error names the field and index.

        Raises:
            ConfigError: the admission policy matches at another page size; the tree does not fit
                ``capacity_bytes``; or the snapshot is malformed -- lists of different lengths, a
                parent index that is not an earlier node (or -1), an edge that is empty, not a
                whole number of pages, or holds ids outside ``[0, 2**31)``, two siblings whose
                edges start alike, checkpoints not ascending inside their edge, a non-finite time.
        """
        cache = cls(spec, capacity_bytes, admission, eviction, clock=clock)
        if cache.tree.page_size != snapshot.page_size:
            raise ConfigError(f"snapshot has page size {snapshot.page_size}, admission policy "
                              f"{cache.admission.name!r} uses {cache.tree.page_size}")
        _check_snapshot_shape(snapshot)
        clock.now = snapshot.clock_value
        nodes: list[Node] = []
        for i, raw in enumerate(snapshot.tokens):
            p = snapshot.parent_index[i]
            parent = cache.tree.root if p == -1 else nodes[p]
            try:
                tokens = as_tokens(raw, f"snapshot.tokens[{i}]")
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            _check_snapshot_node(cache.tree, snapshot, i, tokens, parent, nodes)
            node = cache.tree.new_node(tokens, parent)
            node.ckpt_positions = list(snapshot.ckpt_positions[i])
            node.ckpt_states = [SIZE_ONLY] * len(node.ckpt_positions)
            node.last_access, node.access_seq = snapshot.last_access[i], snapshot.access_seq[i]
            node.path_access, node.path_seq = snapshot.path_access[i], snapshot.path_seq[i]
            nodes.append(node)
        cache.adopt_tree()
        try:
            cache.check_invariants()  # what the fields alone cannot show (a block run under inner-node eviction)
        except InvariantError as exc:
            raise ConfigError(f"snapshot: {exc}") from None
        return cache



    # ================================================================== invariants
    @_locked
    def check_invariants(self) -> None:
        """Recompute bytes, lock counts, tree shape and every index the cache keeps from scratch: the
        candidate index, the in-flight requests, and the dead-tail index, ghosts and anchors
        (``marconi.core.tails``), each bounded by the tree (or, for anchors, by ``max_anchors``)."""
        expected_locks: dict[int, int] = {}
        for request_id, handle in self._in_flight.items():
            require(handle.active and handle.request_id == request_id,
                     f"in-flight request {request_id}: handle {handle.request_id} is finished or filed elsewhere")
            node = handle.lock_node
            while node is not None and node is not self.tree.root:
                expected_locks[node.node_id] = expected_locks.get(node.node_id, 0) + 1
                node = node.parent
        in_tree = {node.node_id: node for node in self.tree.iter_nodes()}
        if self.dead_tails is None:
            require(all(node.ghost is None for node in in_tree.values()), "a ghost kept while tails are not tracked")
        else:
            try:
                self.dead_tails.check_invariants(in_tree)
            except AssertionError as exc:
                raise InvariantError(str(exc)) from None
        self.check_store(expected_locks)




_SNAPSHOT_LISTS = ("parent_index", "tokens", "ckpt_positions", "last_access", "access_seq", "path_access", "path_seq")


def _check_snapshot_shape(snapshot: TreeSnapshot) -> None:
    """ConfigError unless the parallel lists have one entry per node, each parent comes before its
    child (or is -1, the root), and times and orders are finite numbers."""
    sizes = {name: len(getattr(snapshot, name)) for name in _SNAPSHOT_LISTS}
    if len(set(sizes.values())) > 1:
        raise ConfigError(f"snapshot: its parallel lists differ in length ({sizes}); one entry per node")
    if not (isinstance(snapshot.clock_value, numbers.Real) and math.isfinite(snapshot.clock_value)):
        raise ConfigError(f"snapshot.clock_value must be a finite number, got {snapshot.clock_value!r}")
    for i, p in enumerate(snapshot.parent_index):
        if not _is_whole(p) or not -1 <= p < i:
            raise ConfigError(f"snapshot.parent_index[{i}] = {p!r}: a parent is an earlier node's index "
                              f"(0..{i - 1}) or -1 (the root); parents come before their children")
    for name in ("last_access", "path_access", "access_seq", "path_seq"):
        for i, value in enumerate(getattr(snapshot, name)):
            whole = name.endswith("_seq")
            if not ((_is_whole(value) and value >= 0) if whole
                    else isinstance(value, numbers.Real) and math.isfinite(value)):
                raise ConfigError(f"snapshot.{name}[{i}] = {value!r}: expected "
                                  f"{'an integer >= 0' if whole else 'a finite number'}")


def _check_snapshot_node(tree: RadixTree, snapshot: TreeSnapshot, i: int, tokens: np.ndarray, parent: Node,
                         restored: list[Node]) -> None:
    """ConfigError unless node ``i``'s edge fits the tree (whole pages, no sibling starting alike)
    and its checkpoints are ascending inside the edge."""
    if len(tokens) % tree.page_size:
        raise ConfigError(f"snapshot.tokens[{i}]: {len(tokens)} tokens, not a whole number of pages of "
                          f"{tree.page_size}")
    key = tree.child_key(tokens, 0)
    if key in parent.children:
        raise ConfigError(f"snapshot.tokens[{i}] starts like snapshot.tokens[{restored.index(parent.children[key])}], "
                          "a sibling's edge: a radix tree's siblings differ in their first page")
    low, high = parent.depth, parent.depth + len(tokens)
    positions = snapshot.ckpt_positions[i]
    ok = (all(_is_whole(pos) for pos in positions) and all(a < b for a, b in zip([low, *positions], positions))
          and all(pos <= high for pos in positions))
    if not ok:
        raise ConfigError(f"snapshot.ckpt_positions[{i}] = {list(positions)!r}: expected ascending integers in "
                          f"({low}, {high}], the node's edge")
