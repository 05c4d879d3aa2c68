"""PrefixCache: a request's lifecycle (begin, finish, abort) and the eviction loop over the store
(:mod:`marconi.core.store`), with an admission and an eviction policy and, when a policy asks,
dead tails (:mod:`marconi.core.tails`). Time is injected (``clock``); every public method holds
``cache.lock``; a callback that raises leaves the cache consistent. Contract: ``docs/cache-api.md``."""

from __future__ import annotations

import copy
import functools
import math
import numbers
import threading
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, NamedTuple

import numpy as np

from marconi.core.admission import (AdmissionContext, AdmissionPolicy, EveryBlock, FinalPlan, MatchResult,
                                     make_admission)
from marconi.core.eviction import EvictionPolicy, make_eviction, rule_from_label
from marconi.core.model import ModelSpec, get_model
from marconi.core.radix import Node, RadixTree, WalkResult
from marconi.core.registry import ConfigError, brief_repr
from marconi.core.store import (SIZE_ONLY, InvariantError, PayloadOps, SizeOnly, SizeOnlyPayloads, TreeStore,
                                 require)
from marconi.core.tails import DeadTails

__all__ = ["PrefixCache", "RequestHandle", "CachedPrefix", "InsertResult", "PayloadOps", "SizeOnly", "SizeOnlyPayloads",
           "SIZE_ONLY", "CacheObserver", "TreeSnapshot", "InvariantError", "ManualClock", "as_tokens"]


class CacheObserver:
    """Hooks for components that watch the cache; default: nothing. Every request told ``on_begin``
    ends with one ``on_finish`` or ``on_abort``; an observer's error reaches the caller after every
    other observer was told (from ``on_finish``: after a complete finish, which it does not undo)."""

    def on_begin(self, cache: "PrefixCache", handle: "RequestHandle") -> None:
        pass

    def on_finish(self, cache: "PrefixCache", handle: "RequestHandle", output_tokens: np.ndarray) -> None:
        pass

    def on_prefill(self, cache: "PrefixCache", handle: "RequestHandle") -> None:
        """``insert_prefill`` admitted (or tried to admit) the request's prefill checkpoints."""

    def on_abort(self, cache: "PrefixCache", handle: "RequestHandle") -> None:
        """The request ended without finishing: an ``abort``, or a ``begin``/``finish`` that raised (a
        ``finish`` that raised part-way may have evicted and inserted part of its sequence)."""

    def on_first_eviction(self, cache: "PrefixCache") -> None:
        pass


@dataclass(slots=True)
class TreeSnapshot:
    """A cache's tree as picklable data: parallel lists, parents first. It holds the tree's shape,
    checkpoint positions, both recency signals and the clock (its time, ``clock_value``, and its kind,
    ``logical_clock``: True when the source ticked its own logical clock, False for a caller's clock).
    It holds no payloads (KVs, SSM states), stats, in-flight requests, observers, locks, admission
    or chooser state: :meth:`PrefixCache.from_snapshot` restores a size-only cache for replays."""

    page_size: int
    parent_index: list[int]            # index into these lists; -1 = child of the root
    tokens: list[np.ndarray]
    ckpt_positions: list[list[int]]    # the node's checkpoint positions (absolute)
    last_access: list[float]
    access_seq: list[int]
    path_access: list[float]
    path_seq: list[int]
    clock_value: float
    logical_clock: bool = False        # the source's clock: its own logical one (True) or a caller's


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
    prefilled: bool = False     # ``insert_prefill`` succeeded: ``finish`` admits only its final plan


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
    """A clock its owner sets (``clock.now = t``) or ticks; the cache's default logical clock."""

    __slots__ = ("now",)

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def tick(self) -> None:
        self.now += 1.0


def as_tokens(tokens: Any, what: str, *, allow_empty: bool = False) -> np.ndarray:
    """Token ids as a 1-D int32 array, sharing memory with ``tokens`` when possible. ValueError (naming
    ``what`` and the offending id) unless every id is an integer in ``[0, 2**31)``, the trace's range;
    ValueError for a NumPy masked array (reading it as an array would drop its mask)."""
    if isinstance(tokens, np.ma.MaskedArray):  # np.asarray keeps the masked ids' data: they would pass as tokens
        masked = int(np.ma.count_masked(tokens))
        shown = tokens[:30] if tokens.ndim == 1 else tokens  # brief_repr shows fewer than 30 ids anyway
        raise ValueError(f"{what} must be a 1-D sequence of token ids, got a NumPy masked array "
                         f"{brief_repr(shown.tolist())} ("
                         + (f"{masked} of {tokens.size} ids masked, shown as None" if masked else "none masked")
                         + "): masked arrays are not token lists; fill or compress them first "
                         "(.filled(token_id) or .compressed())")
    try:
        arr = np.asarray(tokens)
    except (ValueError, TypeError) as exc:  # ragged nesting, an object NumPy cannot hold
        raise ValueError(f"{what} must be a 1-D sequence of token ids, got {type(tokens).__name__} that NumPy "
                         f"cannot read as an array ({exc})") from None
    if arr.ndim != 1:
        got = f"shape {arr.shape}" if arr.ndim else f"{type(tokens).__name__} {brief_repr(tokens)}"
        raise ValueError(f"{what} must be a 1-D sequence of token ids, got {got}")
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
    """ConfigError unless ``capacity_bytes`` is a finite real number >= 0; text such as ``"1GB"`` is
    refused with a hint (the core takes numbers only)."""
    if isinstance(capacity_bytes, (str, bytes)):
        raise ConfigError(f"capacity_bytes must be a number of bytes, got the text {capacity_bytes!r}: pass bytes "
                          f"as a number (e.g. 1e9), or convert the text with marconi.units.parse_bytes")
    if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, numbers.Real):
        raise ConfigError(f"capacity_bytes must be a number of bytes, got {type(capacity_bytes).__name__} "
                          f"{capacity_bytes!r}")
    if not math.isfinite(capacity_bytes) or capacity_bytes < 0:
        raise ConfigError(f"capacity_bytes must be a finite number >= 0, got {capacity_bytes!r}")


_PAYLOAD_METHODS = ("split_kv", "join_kv", "release", "state_at")


def _check_clock_and_payloads(clock: Any, payloads: Any) -> None:
    """ConfigError unless ``clock`` is None or a callable and ``payloads`` None or a ``PayloadOps``."""
    if clock is not None and not callable(clock):
        raise ConfigError(f"clock must be None (a logical clock) or a callable returning the time as a number, "
                          f"got {type(clock).__name__} {brief_repr(clock)}")
    if payloads is not None:
        missing = [m for m in _PAYLOAD_METHODS if not callable(getattr(payloads, m, None))]
        if missing:
            raise ConfigError(f"payloads must be None (sizes only) or a PayloadOps with the methods "
                              f"{', '.join(_PAYLOAD_METHODS)}; {type(payloads).__name__} lacks {', '.join(missing)}")


def _read_clock(clock: Callable[[], Any], last: float) -> float:
    """``clock()``, a finite real number not below ``last`` (the previous read); ValueError otherwise
    (a NaN or text time would corrupt the recency every eviction ranks by, and a time that goes back
    would rank what it touches as older than what it touched before)."""
    now = clock()
    try:
        finite = not isinstance(now, bool) and math.isfinite(now)
    except TypeError:
        finite = False
    if not finite:
        raise ValueError(f"the cache's clock returned {type(now).__name__} {brief_repr(now)}: "
                         "it must return the time as a finite number")
    if now < last:
        raise ValueError(f"the cache's clock went backwards: it returned {now!r} after {last!r}; pass a "
                         "monotone clock (time.monotonic, not the wall clock time.time, which a clock "
                         "adjustment can move back)")
    return now


def _locked(method: Callable) -> Callable:
    """Run a public ``PrefixCache`` method under the cache's lock."""

    @functools.wraps(method)
    def locked(self: "PrefixCache", *args: Any, **kwargs: Any) -> Any:
        with self._mutex:
            return method(self, *args, **kwargs)

    return locked


def _own_tokens(tokens: Any, what: str) -> np.ndarray:
    """``as_tokens`` as a read-only array: a writable input (or a view of one) is copied, so a caller
    may reuse its buffer while the handle keeps the tokens; a read-only one is kept uncopied."""
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
        admission, eviction: a policy or registry name.
        clock: the current time (any monotone unit); default a logical request counter. A read that is not
            a finite number, or is below the previous read, raises ValueError where it is read.
        payloads: ``PayloadOps`` for real payloads; default sizes only (simulation).
        prefill_chunk_len: None: prefill states anywhere; ``C``: on the scan's chunk grid only.
    Raises ConfigError: a bad capacity or chunk length, an unknown policy, or a capacity below one
    SSM checkpoint while the policy caches anything."""

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
        _check_clock_and_payloads(clock, payloads)
        self._logical = ManualClock() if clock is None else None
        self.clock: Callable[[], float] = clock if clock is not None else self._logical  # type: ignore[assignment]
        self._last_time = -math.inf       # the caller's clock's previous read (it may not go back)
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
        """The re-entrant lock every public method holds (hold it for a consistent read)."""
        return self._mutex

    @_locked
    def add_observer(self, observer: CacheObserver) -> None:
        self._observers.append(observer)

    @property
    def chooser(self) -> Any:
        """The eviction policy's :class:`~marconi.core.chooser.RuleChooser`, or None."""
        return self.eviction.chooser

    @_locked
    def set_rule(self, rule: Any) -> None:
        """Evict by ``rule`` (a rule, or its label: ``"a0.5m"``) from now on; ConfigError, nothing
        changed, if the policy cannot apply it or ``rule`` is neither."""
        if isinstance(rule, str):
            rule = rule_from_label(rule)
        elif not callable(getattr(rule, "label", None)):
            raise ConfigError(f"set_rule takes an eviction rule or its label (e.g. 'a0.5m'), got {brief_repr(rule)}")
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
        """Dead tails: tokens past its base a branched leaf may be re-entered (None: nothing is cut)."""
        return None if self.dead_tails is None else self.dead_tails.margin

    @property
    def num_tail_leaves(self) -> int:
        """Dead tails: branched leaves whose tail may be cut first (each a leaf of the tree)."""
        return 0 if self.dead_tails is None else len(self.dead_tails.leaves)


    @property
    def num_in_flight(self) -> int:
        return len(self._in_flight)

    @_locked
    def describe(self) -> dict[str, Any]:
        """The cache's configuration as plain data: its admission's and eviction's ``describe()``,
        ``capacity_bytes`` and ``"model"`` (the spec's name). Holds ``cache.lock``."""
        return {**self.admission.describe(), **self.eviction.describe(), "capacity_bytes": self.capacity_bytes,
                "model": self.spec.name}

    @_locked
    def begin(self, input_tokens: Any, *, max_hit_len: int | None = None) -> RequestHandle:
        """Look up a request's input, lock the matched path until ``finish``/``abort``, plan its prefill
        checkpoints; refreshes recency, counts the lookup, ticks the logical clock; inserts and evicts
        nothing. ``max_hit_len``: resume no deeper (in tokens). A writable input is copied.
        Raises ValueError/TypeError for a bad input, ``max_hit_len`` or read of a caller's ``clock``
        before anything changes. If a callback raises, no request stays registered or locked
        (observers are told ``on_abort``)."""
        _check_max_hit_len(max_hit_len)
        tokens = _own_tokens(input_tokens, "input_tokens")
        now = self._now() if self._logical is None else 0.0   # a caller's clock: read and checked first
        limit = len(tokens) if max_hit_len is None else min(int(max_hit_len), len(tokens))
        walk = self._split_run_at_limit(self._split_run_at_match(self.tree.walk(tokens)), limit)
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
            now = self._now()
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
        """Payloads to restore, root first: the KVs covering ``[0, usable_hit_len)`` (the last split down
        for a pure transformer whose hit ends inside an edge) and the SSM payload there (None without a
        hit, or where no state was kept at exactly ``usable_hit_len``: a pure transformer's hit can end
        past its deepest state). Mutates nothing; valid while ``handle`` is in flight, else ValueError.
        A size-only cache (built without ``payloads``, a :meth:`clone`, a :meth:`from_snapshot` restore)
        holds no payloads: its KV entries are None and its state :data:`SIZE_ONLY`, placeholders with
        a length, not data to restore. An engine restores only from a cache built with ``payloads``."""
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
        ssm = None if hit is None or not hit.has_ssm or hit.depth != usable else hit.end_state
        return CachedPrefix(usable, kv, ssm)

    @_locked
    def finish(self, handle: RequestHandle, output_tokens: Any = (), *,
               states: Mapping[int, Any] | Callable[[int], Any] | None = None,
               kv: Callable[[int, int], Any] | None = None) -> InsertResult:
        """Insert input + output with the admission policy's checkpoints, evicting (never a locked node)
        until they fit; then unlock and tell the observers. ``states`` (position -> SSM payload) and
        ``kv(start, end)`` supply an engine's payloads (None in simulation); ``states`` is asked for
        :meth:`finish_checkpoints`' positions, and one not supplied is skipped. If nothing fits even
        after evicting everything unlocked, nothing is inserted (``stats.requests_not_cached``).
        ValueError for a finished or aborted handle (nothing changes); any other error before the
        insertion is whole ends the request as an abort, the cache consistent, and propagates. An
        observer's error in ``on_finish`` propagates after a complete finish (inserted, ended, every
        observer told ``on_finish``); its ``InsertResult`` is then lost."""
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
        """Dry run of ``finish(handle, output_tokens)``: the positions of input + output whose states it
        would ask ``states`` for, ascending, for the tree as it is now. Changes nothing. Asking at each
        decode step is sound for every built-in policy (``docs/cache-api.md``)."""
        self._check_active(handle)
        if not self.admission.caches:
            return ()
        output = as_tokens(output_tokens, "output_tokens", allow_empty=True)
        seq, walk, plan = self._final(handle, output)
        on_path, tail = self._wanted(handle, plan, walk, len(seq))
        return tuple(sorted(on_path + tail))

    @_locked
    def abort(self, handle: RequestHandle) -> None:
        """Unlock an in-flight request without inserting anything, then tell the observers."""
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

    def _split_run_at_limit(self, walk: WalkResult, limit: int) -> WalkResult:
        """A ``max_hit_len`` that ends inside a matched edge holding states inside it (a block run's):
        the edge is split at its deepest state at or before ``limit``, so the request resumes there,
        as it would with one node per block, not at the run's parent."""
        if limit >= walk.matched_len or not self.spec.has_recurrent_state:
            return walk
        nodes = walk.path if walk.partial is None else [*walk.path, walk.partial]
        for i, node in enumerate(nodes):
            if node.depth > limit:        # the first node ending past the limit: the limit lies in its edge
                positions = node.ckpt_positions
                j = bisect_right(positions, limit)
                if j == 0 or node.parent_depth >= limit:
                    return walk
                upper = self._split(node, positions[j - 1] - node.parent_depth)
                path = [*walk.path[:i], upper, *walk.path[i:]]
                return WalkResult(path, walk.matched_len, walk.partial)
        return walk

    def _hit_index(self, path: list[Node], limit: int) -> int:
        """Index in ``path`` of the node a request resumes from, at depth <= ``limit`` (-1: none): the
        deepest checkpoint with SSM layers, the deepest node for a pure transformer."""
        for i in range(len(path) - 1, -1, -1):
            if path[i].depth <= limit and (path[i].has_ssm or not self.spec.has_recurrent_state):
                return i
        return -1

    def _placed(self, positions: Iterable[int], floor: int, input_len: int, limit: int) -> set[int]:
        """Where the states for ``positions`` can be taken: those in ``(floor, limit]``, with
        positions inside the prefill moved to the state grid (see ``prefill_chunk_len``). On a
        paged tree a resume point off the page grid (a pure transformer's ``max_hit_len`` inside a
        page) puts every grid point inside the prefill off it too: none is kept there (a node must
        end on a page), only the input's end and decoded positions."""
        wanted = {int(p) for p in positions if floor < p <= limit}
        grid = self._state_grid
        if grid is not None:
            if floor % self.tree.page_size:
                return {p for p in wanted if p >= input_len}
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
        """Admit the prefill checkpoints when prefill completes, inserting the input up to the deepest
        one (:meth:`finish` admits the rest). Observers are told first; an error leaves the cache
        consistent and the request in flight."""
        self._check_active(handle)
        _check_suppliers(states, kv)  # before anything: the request stays in flight as it was
        self._notify("on_prefill", handle)
        if not self.admission.caches or not handle.prefill_checkpoints:
            handle.prefilled = True
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
        result = self._insert_sequence(handle, seq, plan, states, kv, walk)
        # only now: an insertion that raised admitted nothing, so finish must still admit the
        # prefill checkpoints with its own plan, as for a request finished without insert_prefill
        handle.prefilled = True
        return result

    def _final(self, handle: RequestHandle, output: np.ndarray) -> tuple[np.ndarray, WalkResult, FinalPlan]:
        """Input + output, its walk (from the handle's locked match) and the admission's final plan, with
        the prefill checkpoints planned at ``begin`` where no ``insert_prefill`` admitted them: a
        request finished without one (``process``, a sequential replay) keeps what its prefill
        computed, as one with it does. Without them an input ending inside a cached sequence whose
        continuation the output then repeats (a prompt asked again, answered alike) left no state at
        its branch point, and every repeat missed."""
        seq = np.concatenate((handle.tokens, output)) if output.size else handle.tokens
        walk = self.tree.walk(seq, start=handle.matched_node)
        ctx = AdmissionContext(seq, len(handle.tokens), handle.match, self._branch_len(len(seq), walk), self.spec,
                               handle.request_id)
        plan = self.admission.final_plan(ctx, len(seq))
        if handle.prefill_checkpoints and not handle.prefilled:
            extra = [p for p in handle.prefill_checkpoints if p not in plan.checkpoints
                     and not (plan.block and p % plan.block == 0 and p <= plan.insert_len)]
            if extra:
                plan = plan._replace(checkpoints=tuple(sorted((*plan.checkpoints, *extra))))
        return seq, walk, plan

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
        """Insert ``seq[:plan.insert_len]`` with the plan's checkpoints, evicting what must go, the walked
        path locked (ranges: ``docs/cache-api.md``, "Notes: PrefixCache"). ``mark``: from
        ``DeadTails.enter``. Callbacks run before their step changes the tree or after it is whole."""
        walk = walk if walk is not None else self.tree.walk(seq)
        # Positions are read before a run is split below: the split changes no answer of
        # ``holds_checkpoint_at`` at or above the match, and the dry run does not split.
        on_path, tail = self._wanted(handle, plan, walk, len(seq))
        to_admit = self._collect_states(states, on_path + tail)
        now = self._now()  # one time for every node and checkpoint this insertion creates
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
            if need > self.capacity_bytes - self.locked_bytes and not self._free_locked_states(need, walk):
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

    def _free_locked_states(self, need: int, walk: WalkResult) -> bool:
        """The last resort before a request goes uncached: drop states on its locked path that no
        in-flight request resumes from, least recently hit first, until ``need`` bytes fit beside the
        locked ones; False (nothing dropped) if even all of them would not make room.

        A lock keeps an in-flight request's path whole, and with it every state along the path. A
        session that keeps extending one sequence leaves a state at each turn's end on that path, so
        once they fill the cache every later turn was refused and the cache stopped learning (one
        2,000-turn session at 10 GB: 33.8% for SGLang+, Marconi and the oracle, 99.1% for vLLM+).
        The shallower states are stale for the request that extends them; an engine drops them too
        (SGLang locks only the state a request resumes from, vLLM's requests hold only their own).
        Only one-child nodes holding one state qualify: a branch node and a leaf stay whole. Block
        caching (``every-block``: vLLM+) keeps its states as they were, so that its block runs and
        one node per block still decide alike."""
        if isinstance(self.admission, EveryBlock):
            return False
        resumed = {id(h.hit_node) for h in self._in_flight.values() if h.hit_node is not None}
        stale = [n for n in walk.path if n.lock_ref and len(n.children) == 1 and n.num_checkpoints == 1
                 and id(n) not in resumed]
        if need > self.capacity_bytes - self.locked_bytes + len(stale) * self._ckpt_bytes:
            return False
        for node in sorted(stale, key=lambda n: (n.last_access, n.access_seq)):
            if need <= self.capacity_bytes - self.locked_bytes:
                break
            self._drop_locked_state(node)
        return True

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
        """Insert ``seq[matched_len:insert_len]`` as one run or a chain cut at checkpoints, node by node."""
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
        """Evict until ``need`` bytes are free; each eviction is whole before the next callback."""
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
        """Cut the tail ``DeadTails.next_cut`` names (KVs and states); False if none."""
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
        """Call ``event`` on every observer; the first error is re-raised once all were told."""
        error: Exception | None = None
        for observer in self._observers:
            try:
                getattr(observer, event)(self, *args)
            except Exception as exc:
                if error is None:
                    error = exc
        if error is not None:
            raise error

    def _now(self) -> float:
        """The cache's time: its logical clock's, or the caller's clock read and checked (:func:`_read_clock`:
        ValueError for a time that is not a finite number or is below the previous read)."""
        if self._logical is not None:
            return self.clock()
        self._last_time = _read_clock(self.clock, self._last_time)
        return self._last_time

    def _check_active(self, handle: RequestHandle) -> None:
        if not isinstance(handle, RequestHandle):
            raise TypeError(f"handle must be the RequestHandle this cache's begin() returned, got "
                            f"{type(handle).__name__} {brief_repr(handle)}")
        if not handle.active or self._in_flight.get(handle.request_id) is not handle:
            why = ("begun by another PrefixCache: finish or abort it there" if handle.active
                   else "finished or aborted")
            raise ValueError(f"request {handle.request_id} is not in flight in this cache ({why})")


    # ================================================================== copies (the cache owns them)
    @_locked
    def clone(self, eviction: EvictionPolicy | str) -> "PrefixCache":
        """A size-only copy evicting by ``eviction``, behaving exactly as this cache would under it: tree,
        recency, index, in-flight requests (same ids), stats and admission state; not payloads (every
        state reads :data:`SIZE_ONLY`, every KV None: not for serving), observers, the eviction policy
        or the lock. The clock is shared
        unless it is the logical one. A rule that tracks dead tails where this cache did not starts
        tracking them now. ConfigError where the tree holds block runs (``every-block`` with runs) and
        ``eviction`` evicts inner nodes: a run is one node, so such a rule could not evict its blocks."""
        eviction = make_eviction(eviction)
        if eviction.evicts_inner_nodes and not self.inner_candidates and any(
                len(node.ckpt_positions) > 1 for node in self.tree.iter_nodes()):
            raise ConfigError(f"cannot clone a cache holding block runs into {eviction.name!r}, which evicts inner "
                              "nodes: clone into a leaf-only rule, or build the cache with every-block:runs=false")
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
            twin.ckpt_states = [SIZE_ONLY] * len(node.ckpt_positions)
            memo[id(node)] = twin
            pairs.append((node, twin))
            stack.extend(node.children.values())
        for node, twin in pairs:
            twin.parent = None if node.parent is None else memo[id(node.parent)]
            twin.children = {key: memo[id(child)] for key, child in node.children.items()}
        twin_cache = copy.deepcopy(self, memo)
        if twin_cache.dead_tails is None and eviction.tracks_tails and twin_cache.admission.caches:
            twin_cache.dead_tails = DeadTails()
        eviction.bind(twin_cache)
        wanted = (eviction.evicts_inner_nodes, eviction.efficiency_variant)
        if wanted != (twin_cache.inner_candidates, twin_cache.efficiency_variant):
            twin_cache.inner_candidates, twin_cache.efficiency_variant = wanted
            twin_cache.reindex()
        return twin_cache

    @_locked
    def snapshot(self) -> TreeSnapshot:
        """The tree as plain data (shape, recency, checkpoint positions, the clock's time and kind);
        not payloads, stats, in-flight requests (their nodes are kept, unlocked), observers, locks,
        admission or chooser state. Its token arrays are read-only views of the tree's edges (no
        copy; writing to them raises). For replays of the tree (tuning), not to move a serving cache."""
        index: dict[int, int] = {}
        snap = TreeSnapshot(self.tree.page_size, [], [], [], [], [], [], [], float(self.clock()),
                            logical_clock=self._logical is not None)
        root = self.tree.root
        for node in self.tree.iter_nodes():
            index[node.node_id] = len(snap.tokens)
            parent = node.parent
            snap.parent_index.append(-1 if parent is root else index[parent.node_id])  # type: ignore[union-attr]
            edge = node.tokens.view()     # read-only: writing to a snapshot must not change this tree
            edge.flags.writeable = False
            snap.tokens.append(edge)
            snap.ckpt_positions.append(list(node.ckpt_positions))
            snap.last_access.append(node.last_access)
            snap.access_seq.append(node.access_seq)
            snap.path_access.append(node.path_access)
            snap.path_seq.append(node.path_seq)
        return snap

    @classmethod
    def from_snapshot(cls, snapshot: TreeSnapshot, spec: ModelSpec | str, capacity_bytes: float,
                      admission: AdmissionPolicy | str, eviction: EvictionPolicy | str, *,
                      clock: ManualClock | None = None) -> "PrefixCache":
        """A size-only cache holding ``snapshot``'s tree and recency: no payloads (states read
        :data:`SIZE_ONLY`, KVs None), fresh stats, no in-flight request, no observer.

        ``clock=None``: a snapshot of a cache on its logical clock (``snapshot.logical_clock``)
        restores that clock at ``snapshot.clock_value``, ticking as the source's would, so the
        restore decides request for request as the source would have; a snapshot of a cache on a
        caller's clock needs ``clock`` (ConfigError). ``clock``: a :class:`ManualClock`, set to
        ``snapshot.clock_value`` here, which the caller then sets or ticks (it is the cache's clock).
        ConfigError (naming field and index): another page size, a tree over ``capacity_bytes``, or
        a malformed snapshot."""
        cache = cls(spec, capacity_bytes, admission, eviction, clock=clock)
        if cache.tree.page_size != snapshot.page_size:
            raise ConfigError(f"snapshot has page size {snapshot.page_size}, admission policy "
                              f"{cache.admission.name!r} uses {cache.tree.page_size}")
        _check_snapshot_shape(snapshot)
        if clock is None and not snapshot.logical_clock:
            raise ConfigError(f"snapshot was taken of a cache on a caller's clock (time {snapshot.clock_value!r}; "
                              "logical_clock is False): pass clock=ManualClock() and set or tick it in that "
                              "clock's unit, or snapshot a cache on its logical clock")
        (cache._logical if clock is None else clock).now = snapshot.clock_value  # type: ignore[union-attr]
        nodes: list[Node] = []
        for i, raw in enumerate(snapshot.tokens):
            p = snapshot.parent_index[i]
            parent = cache.tree.root if p == -1 else nodes[p]
            try:
                tokens = as_tokens(raw, f"snapshot.tokens[{i}]", allow_empty=True)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            if tokens.size == 0:
                raise ConfigError(f"snapshot.tokens[{i}] is empty: every node below the root holds at least one token")
            if tokens.flags.writeable:      # a caller's buffer: the restored tree keeps its own copy
                tokens = tokens.copy()
                tokens.flags.writeable = False
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
        """Recompute bytes, lock counts, tree shape and every index (candidates, in-flight requests, dead
        tails) from scratch; InvariantError on a mismatch."""
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
    child (or is -1, the root), and times and orders are finite numbers, no time after the clock's."""
    sizes = {name: len(getattr(snapshot, name)) for name in _SNAPSHOT_LISTS}
    if len(set(sizes.values())) > 1:
        raise ConfigError(f"snapshot: its parallel lists differ in length ({sizes}); one entry per node")
    if not (isinstance(snapshot.clock_value, numbers.Real) and math.isfinite(snapshot.clock_value)):
        raise ConfigError(f"snapshot.clock_value must be a finite number, got {snapshot.clock_value!r}")
    if not isinstance(snapshot.logical_clock, bool):
        raise ConfigError(f"snapshot.logical_clock must be True (the source's logical clock) or False (a "
                          f"caller's), got {brief_repr(snapshot.logical_clock)}")
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
            if not whole and value > snapshot.clock_value:   # recency would run backwards after the restore
                raise ConfigError(f"snapshot.{name}[{i}] = {value!r} is later than snapshot.clock_value = "
                                  f"{snapshot.clock_value!r}: a node cannot have been used after the snapshot")


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
    if not isinstance(positions, (list, tuple, np.ndarray)):
        raise ConfigError(f"snapshot.ckpt_positions[{i}] = {brief_repr(positions)}: expected a list of positions "
                          "(ascending integers inside the node's edge)")
    ok = (all(_is_whole(pos) for pos in positions) and all(a < b for a, b in zip([low, *positions], positions))
          and all(pos <= high for pos in positions))
    if not ok:
        raise ConfigError(f"snapshot.ckpt_positions[{i}] = {list(positions)!r}: expected ascending integers in "
                          f"({low}, {high}], the node's edge")
