"""The vLLM general plugin: Marconi's eviction inside vLLM's block pool, counters, a CPU fix.

vLLM calls :func:`register` (entry point ``vllm.general_plugins: marconi``) in every process; it
reads :class:`~marconi.integrations.vllm.config.PluginConfig` and wraps ``Scheduler.__init__`` so
that each scheduler's ``BlockPool`` gets instance hooks (:class:`PoolHooks`): observed under
``MARCONI_VLLM_POLICY=lru``, evicting by Marconi's utility under ``marconi``, untouched when unset
or with prefix caching off. Optional :class:`RetentionHooks` (sparse retention) and the Mamba-2 CPU
checkpoint fix are installed here too.

Contract: never half-patched, never silently stock. A set policy with a setting that cannot run
stops vLLM (ConfigError at registration, :class:`PluginSettingError` from the engine core); an
unset policy never stops it. A vLLM outside :data:`SUPPORTED_VLLM` or whose internals do not fit
runs stock with one logged line; the hooks are installed whole or not at all. This is the only
module that touches vLLM's private attributes (each place marked ``vLLM private``). Settings,
counters and the fixes: ``docs/vllm.md``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import Any

from marconi.core.registry import ConfigError
from marconi.integrations.common.alpha import RequestObservation
from marconi.integrations.common.shadow_alpha import ShadowAlpha
from marconi.integrations.vllm.config import ENV_POLICY, ENV_RETENTION, PluginConfig
from marconi.integrations.vllm.policy import MAMBA, REASONS, BlockEvictionState, group_kinds
from marconi.integrations.vllm.retention import RetentionPlanner

__all__ = ["register", "reset_registration", "attach_hooks", "PoolHooks", "RetentionHooks", "PluginSettingError",
           "SUPPORTED_VLLM", "supported_vllm", "model_spec"]

logger = logging.getLogger("marconi.integrations.vllm")
# The vLLM release series the hooks were verified against: tests/test_vllm_versions.py compares the
# hooked methods' code per series (0.33's differ from 0.32's only where the hooks delegate). Add a
# series only after that comparison; any other version runs stock (see register).
SUPPORTED_VLLM = ("0.32", "0.33")
_SUPPORTED_TEXT = ", ".join(f"{series}.x" for series in SUPPORTED_VLLM)


# The series whose BlockPool.free_blocks and touch still count the null block's references (0.33
# skips it: "never pooled; its ref_cnt is not maintained"); the hooks re-implement both methods.
_NULL_BLOCK_COUNTED = ("0.32",)


def vllm_series(version: str) -> str:
    """``"0.33"`` for ``0.33.1rc1``, ``"0.32"`` for ``0.32.0+cpu``: the release series of a version."""
    return ".".join(version.split("+")[0].split(".")[:2])


def supported_vllm(version: str) -> bool:
    """Whether vLLM ``version`` belongs to a series of :data:`SUPPORTED_VLLM` (``0.33.0``,
    ``0.33.1rc1``, ``0.32.0+cpu``: yes; ``0.34.0``, ``0.3.2``, ``1.0.0``: no)."""
    return vllm_series(version) in SUPPORTED_VLLM

_REGISTERED = False
# The longest get_new_blocks leaves evictions uncounted in Prometheus while no request finishes
# (each finished request flushes them; ``PoolHooks.num_evicted`` always does), in seconds.
_FLUSH_S = 1.0


class PluginSettingError(ConfigError):
    """A plugin setting that cannot run in the engine core (an α-source factory that fails, a trace
    that cannot be opened): it stops vLLM rather than let it serve stock eviction in its place."""


def register() -> None:
    """Entry point (``vllm.general_plugins``): read the configuration and install the hooks. Raises
    ConfigError when ``MARCONI_VLLM_POLICY`` is set and a setting is wrong or cannot run here (a
    trace that cannot be appended to, an α source that does not load); with no policy, only warns."""
    global _REGISTERED
    if _REGISTERED:
        return
    _REGISTERED = True
    config, ignored = PluginConfig.lenient_from_env()
    config = _with_recording(config)     # MARCONI_VLLM_RECORD (marconi.integrations.vllm.record)
    for problem in ignored:
        logger.warning("marconi: %s — ignored: %s is unset, so the plugin changes nothing (stock vLLM; the "
                       "Mamba-2 CPU fix stays %s)", problem, ENV_POLICY, "auto" if config.mamba2_cpu_fix else "off")
    if config.policy is not None:
        config.check_runnable()          # before anything is patched, in every process vLLM starts
    if config.policy is None and not config.mamba2_cpu_fix:
        return
    import vllm

    version = str(vllm.__version__)
    if not supported_vllm(version):     # refuse whole: no hook, no CPU fix (an error when a policy was asked)
        (logger.error if config.policy is not None else logger.warning)(
            "marconi: vLLM %s is not a supported version (%s): the plugin installs nothing and vLLM runs "
            "stock (MARCONI_VLLM_POLICY=%s is NOT in effect)", version, _SUPPORTED_TEXT, config.policy)
        return
    if config.mamba2_cpu_fix:
        _install_mamba2_cpu_fix()
    if config.policy is None:
        return
    _install_scheduler_hook(config)


def reset_registration() -> None:
    """Forget that :func:`register` ran in this process, so the next call reads the environment
    again (the tests register twice in one process; hooks already installed stay installed)."""
    global _REGISTERED
    _REGISTERED = False


def _with_recording(config: PluginConfig) -> PluginConfig:
    """``MARCONI_VLLM_RECORD`` checked in every process (ConfigError naming it); with no policy set
    the plugin observes as ``lru`` does (stock decisions), so that the recorder can be hooked."""
    from marconi.integrations.vllm import record

    path = record.record_path_from_env()
    if path is None:
        return config
    record.check_record_path(path)
    return config if config.policy is not None else dataclasses.replace(config, policy="lru")


def _open_recorder(scheduler: Any, hooks: "PoolHooks") -> Any:
    from marconi.integrations.vllm import record

    path = record.record_path_from_env()
    if path is None:
        return None
    import vllm

    try:
        return record.Recorder.open(path, block_size=hooks.hash_block_size,
                                    model=str(scheduler.vllm_config.model_config.model),
                                    vllm_version=str(vllm.__version__),
                                    policy=hooks.policy, settings=hooks.settings,
                                    max_num_seqs=int(scheduler.scheduler_config.max_num_seqs))
    except ConfigError as exc:
        raise PluginSettingError(str(exc)) from None


# ====================================================================================== CPU fix
def _install_mamba2_cpu_fix() -> None:
    try:
        from vllm.model_executor.layers.mamba import mamba_mixer2
        from vllm.platforms import current_platform
    except ImportError:
        return
    if not current_platform.is_cpu():
        return
    cls = mamba_mixer2.MambaMixer2
    original = cls.get_kv_cache_spec
    if getattr(original, "_marconi_fix", False):
        return

    def get_kv_cache_spec(self: Any, vllm_config: Any) -> Any:
        spec = original(self, vllm_config)
        if getattr(spec, "num_prefill_checkpoint_blocks", 0) > 0:
            spec = dataclasses.replace(spec, num_prefill_checkpoint_blocks=0, prefill_checkpoint_alignment=None)
        return spec

    get_kv_cache_spec._marconi_fix = True  # type: ignore[attr-defined]
    cls.get_kv_cache_spec = get_kv_cache_spec
    logger.info("marconi: Mamba-2 CPU checkpoint fix on (no in-pass prefill checkpoints on CPU)")


# ====================================================================================== scheduler hook
def _install_scheduler_hook(config: PluginConfig) -> None:
    from vllm.v1.core.sched import scheduler as sched_module

    cls = sched_module.Scheduler
    original = cls.__init__
    if getattr(original, "_marconi_hook", False):
        return

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        hooks = attach_hooks(self, config)
        if hooks is not None:
            self._marconi = hooks      # our hooks, kept alive on vLLM's scheduler

    __init__._marconi_hook = True  # type: ignore[attr-defined]
    cls.__init__ = __init__


def attach_hooks(scheduler: Any, config: PluginConfig) -> "PoolHooks | None":
    """What ``Scheduler.__init__`` runs after vLLM's own: the hooks on its block pool, or None where
    this vLLM does not fit them (logged; stock). PluginSettingError where the configuration cannot
    run (the trace, the α source)."""
    try:
        return PoolHooks.attach(scheduler, config)
    except PluginSettingError:
        raise
    except Exception:  # a vLLM the hooks do not fit: never take the server down, run stock and say why
        logger.exception("marconi: could not attach to the scheduler; vLLM runs with its own eviction "
                         "(%s=%s is NOT in effect)", ENV_POLICY, config.policy)
        return None


def scheduler_settings(scheduler: Any, kinds: list[str]) -> dict[str, Any]:
    """What the emulation needs to know about this scheduler (the ``config`` trace event)."""
    sc = scheduler.scheduler_config
    cc = scheduler.cache_config
    return {"scheduler": type(scheduler).__name__, "block_size": int(cc.block_size),
            "hash_block_size": int(scheduler.kv_cache_manager.block_pool.hash_block_size),
            "num_blocks": int(scheduler.kv_cache_manager.block_pool.num_gpu_blocks), "group_kinds": kinds,
            "max_num_scheduled_tokens": int(scheduler.max_num_scheduled_tokens),
            "max_num_batched_tokens": int(sc.max_num_batched_tokens),
            "long_prefill_token_threshold": int(sc.long_prefill_token_threshold or 0),
            "retention_interval": cc.prefix_cache_retention_interval, "mamba_cache_mode": cc.mamba_cache_mode,
            "async_scheduling": bool(getattr(sc, "async_scheduling", False)),
            "mamba_aligned_split": bool(getattr(scheduler, "need_mamba_block_aligned_split", False)),
            "mamba_partial_cache_hit": bool(getattr(scheduler, "mamba_partial_cache_hit", False)),
            "mamba_prefill_checkpoint_blocks": bool(getattr(scheduler, "mamba_has_prefill_checkpoint_blocks", False))}


def model_spec(vllm_config: Any) -> Any:
    """The :class:`~marconi.core.model.ModelSpec` of the model a vLLM config serves (HF config, layer
    pattern, dtype's bytes: 2 unless float32/float64). SpecError for what ``from_hf_config`` cannot read."""
    from marconi.core.model import ModelSpec

    hf = vllm_config.model_config.hf_config
    cfg = hf.to_dict()
    if cfg.get("model_type") == "nemotron_h" and getattr(hf, "hybrid_override_pattern", None):
        cfg["hybrid_override_pattern"] = hf.hybrid_override_pattern
    dtype = str(vllm_config.model_config.dtype).removeprefix("torch.")
    return ModelSpec.from_hf_config(cfg, name=str(vllm_config.model_config.model), bytes_per_elem=
                                    {"float32": 4, "float64": 8}.get(dtype, 2))


# The BlockPool methods the hooks replace (the _-prefixed ones vLLM private).
_POOL_HOOKED = ("get_new_blocks", "free_blocks", "touch", "_insert_block_hash", "_remove_cached_block_hashes",
                "_maybe_evict_cached_block", "cache_full_blocks", "cache_partial_block", "move_block_hashes",
                "reset_prefix_cache", "unpin_blocks")
# What the hooks' own code reads or calls on a BlockPool besides (vLLM private where _-prefixed).
_POOL_READ = ("free_block_queue", "cached_block_hash_to_block", "cached_block_hashes_by_block", "blocks",
              "enable_caching", "enable_kv_cache_events", "metrics_collector", "_get_partial_block_hash",
              "_emit_block_removed_events", "_reuse_watchers", "_notify_reuse")


def _open_trace(config: PluginConfig) -> Any:
    if config.trace_path is None:
        return None
    try:
        return config.open_trace()
    except ConfigError as exc:
        raise PluginSettingError(str(exc)) from None


def first_plain_blocks(queue: Any, want: int, num_plain: int, num_free: int) -> list[Any]:
    """The first ``want`` blocks without a hash in vLLM's free queue, in queue order (what a scan from
    the head finds), without walking the queue end to end when they lie near its tail.

    The queue holds ``num_free`` blocks, ``num_plain`` of them without a hash. Freed blocks join the
    tail, so the plain ones (a request's partial last blocks) are mostly there, behind every cached
    block: a scan from the head alone walked the whole queue per call (about 530 blocks a call on the
    bench's eviction-heavy trace, most of the plugin's cost per step). Here a scan runs from each end,
    a block at a time: it stops when the forward scan has ``want``, or when the two together have
    found all ``num_plain`` (then the first ``want`` of them are known), or have visited all
    ``num_free``. The two never visit a block twice: they meet only once every block is visited.
    """
    head, tail = queue.fake_free_list_head, queue.fake_free_list_tail
    front: list[Any] = []
    back: list[Any] = []        # found from the tail, last first
    forward, backward = head.next_free_block, tail.prev_free_block
    visited = 0
    while visited < num_free:
        if forward.block_hash is None:
            front.append(forward)
            if len(front) == want:
                return front
        forward = forward.next_free_block
        visited += 1
        if len(front) + len(back) == num_plain or visited == num_free:
            break
        if backward.block_hash is None:
            back.append(backward)
        backward = backward.prev_free_block
        visited += 1
        if len(front) + len(back) == num_plain:
            break
    back.reverse()
    return (front + back)[:want]


class _Counters:
    """Prometheus counters (created once per process, lazily: only the engine core counts)."""

    _instance: "_Counters | None" = None

    def __init__(self) -> None:
        from prometheus_client import Counter

        self.evicted = Counter("marconi:evicted_blocks", "Cached blocks evicted from vLLM's block pool",
                               ["policy", "group", "reason"])
        self.hit_tokens = Counter("marconi:hit_tokens", "Prompt tokens matched in the prefix cache: usable "
                                  "(resumed from a state) or kv_only (KVs without a state)", ["kind"])
        self.alpha_changes = Counter("marconi:alpha_changes", "Times the alpha source changed the eviction rule, "
                                     "by the rule it changed to", ["alpha", "efficiency"])

    @classmethod
    def get(cls) -> "_Counters":
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance


class PoolHooks:
    """Instance hooks on one vLLM ``BlockPool`` that keep a :class:`BlockEvictionState` in step."""

    def __init__(self, pool: Any, kv_manager: Any, state: BlockEvictionState, config: PluginConfig,
                 hash_block_size: int, trace: Any = None) -> None:
        self.pool = pool
        self.kv_manager = kv_manager
        self.state = state
        self.config = config
        self.policy = config.policy or "lru"
        self.hash_block_size = hash_block_size
        self.block_size = state.block_size
        self.group_kinds = state.group_kinds
        self.counters = _Counters.get()
        # What _insert_block_hash reads while vLLM's cache_full_blocks / cache_partial_block /
        # move_block_hashes runs: the request being cached, the moved hashes' (depth, parent). Plain
        # attributes: a BlockPool is driven by its scheduler's one thread (vLLM's pool has no lock).
        self._request: Any = None
        self._moved: dict[Any, tuple[int, Any]] | None = None
        self._trace = trace              # the open block trace (MARCONI_VLLM_TRACE), or None
        self.settings: dict[str, Any] = {}
        self._num_evicted: dict[str, int] = {}  # "group:reason" -> blocks evicted (read through num_evicted)
        self.num_cached: dict[str, int] = {}     # group kind -> block hashes inserted (states kept, for mamba)
        # Evictions counted per (group id, reason) since the last flush into Prometheus (a labelled
        # counter's inc costs about 2 µs, as much as vLLM's whole eviction of a block: they are added
        # at every finished request, and from get_new_blocks at most once per _FLUSH_S seconds, see
        # _flush_evicted).
        self._evicted_pending: dict[tuple[int, int], int] = {}
        self._flush_due = 0.0            # time.monotonic() after which get_new_blocks flushes
        self._told = -1                  # the reason id of the victim get_new_blocks evicts now (its keys dropped)
        self._evicted_labels: dict[tuple[int, int], tuple[Any, str]] = {}   # -> (labelled counter, name)
        self._hit_counters: tuple[Any, Any] | None = None   # hit_tokens' usable and kv_only, labelled once
        self._admitted: dict[str, tuple[int, int]] = {}     # request id -> (hit, kv-only) tokens at admission
        self._observe_failed = False
        self.num_finished = 0            # requests shown to the α source
        self.num_alpha_changes = 0
        self.source_s = 0.0              # scheduler-thread time spent in the α source's observe
        self.retention: RetentionHooks | None = None     # MARCONI_VLLM_RETENTION's hooks, if set
        self.recorder: Any = None        # MARCONI_VLLM_RECORD's Recorder, if set

    # --------------------------------------------------------------- attach
    @classmethod
    def attach(cls, scheduler: Any, config: PluginConfig) -> "PoolHooks":
        """The hooks on ``scheduler``'s block pool, installed whole; on any error nothing of vLLM's
        has changed. PluginSettingError where the configuration cannot run, anything else where
        this vLLM does not fit the hooks."""
        trace = _open_trace(config)      # first: a setting that cannot run is refused as such
        try:
            kinds = group_kinds(scheduler.kv_cache_config, "marconi's block pool hooks",
                                f"vLLM runs with its own eviction (unset {ENV_POLICY} for this model)")
            spec = model_spec(scheduler.vllm_config)
            hooks = cls.for_pool(scheduler.kv_cache_manager, kinds, spec, int(scheduler.cache_config.block_size),
                                 config, trace=trace)
            if config.retention is not None:     # checked whole before anything is installed
                hooks.retention = RetentionHooks.for_scheduler(scheduler, kinds, spec, config)
            hooks.settings = scheduler_settings(scheduler, kinds)
            if hooks.retention is not None:
                hooks.settings["marconi_retention"] = hooks.retention.planner.describe()
            hooks._emit("config", hooks.settings)
            hooks.recorder = _open_recorder(scheduler, hooks)
            hooks.install(scheduler)
            if hooks.retention is not None:
                hooks.retention.install()
        except BaseException:
            if trace is not None:
                trace.close()
            raise
        pool = hooks.pool
        logger.info("marconi: %s eviction on a %d-block pool, groups %s, block %d tokens, alpha source %r%s",
                    hooks.policy, pool.num_gpu_blocks, ",".join(kinds), hooks.block_size, hooks.state.alpha_source,
                    "" if pool.enable_caching else "; prefix caching is off: nothing to evict, vLLM allocates as stock")
        return hooks

    @classmethod
    def for_pool(cls, kv_manager: Any, kinds: tuple[str, ...] | list[str], spec: Any, block_size: int,
                 config: PluginConfig, *, trace: Any = None) -> "PoolHooks":
        """Hooks for ``kv_manager``'s block pool, built but not installed (nothing of vLLM's changes):
        the attribute check, the eviction state and the α source. ``trace``: the open block trace
        (:meth:`attach` opens it), or None for none.

        AttributeError where this vLLM lacks what the hooks replace; PluginSettingError where the α
        source cannot be made or bound to this pool.
        """
        import vllm
        from vllm.v1.core.kv_cache_utils import (get_block_hash, get_group_id, make_block_hash_with_group_id,
                                                 resolve_block_hashes)

        pool = kv_manager.block_pool
        # vLLM private: the _-prefixed names are BlockPool internals the hooks replace (vLLM 0.32, 0.33).
        for owner, obj, names in (("BlockPool", pool, _POOL_HOOKED + _POOL_READ),
                                  ("KVCacheManager", kv_manager, ("record_prefix_cache_stats", "allocate_slots"))):
            for name in names:
                if not hasattr(obj, name):
                    raise AttributeError(f"vLLM's {owner} has no {name!r}: this vLLM is not {_SUPPORTED_TEXT}")
        try:     # the source binds to the pool in the state: a pool too small for its shadow says so here
            source = config.make_alpha_source(spec)
            state = BlockEvictionState(spec, kinds, pool.num_gpu_blocks, block_size, source, config.efficiency)
        except ConfigError as exc:
            raise PluginSettingError(str(exc)) from exc
        if isinstance(source, ShadowAlpha) and config.replays_in_background:
            source.run_in_background()   # off the scheduler thread (at lag 0 it waits only when it reads the rule)
        hooks = cls(pool, kv_manager, state, config, int(pool.hash_block_size), trace=trace)
        hooks._hash_parts = (get_block_hash, get_group_id)
        hooks._key_parts = (resolve_block_hashes, make_block_hash_with_group_id)
        hooks._skip_null = vllm_series(vllm.__version__) not in _NULL_BLOCK_COUNTED
        return hooks

    def install(self, scheduler: Any) -> None:
        """Replace the pool's and KV cache manager's methods, and ``scheduler._free_request``, with
        the hooks. Checked first, so that either every replacement is made or none."""
        if not hasattr(scheduler, "_free_request"):            # vLLM private
            raise AttributeError(f"vLLM's Scheduler has no '_free_request': this vLLM is not {_SUPPORTED_TEXT}")
        self._install()
        self._install_finish_hook(scheduler)

    def _install(self) -> None:
        pool = self.pool
        self._orig = {name: getattr(pool, name) for name in _POOL_HOOKED}
        if self.policy == "marconi" and pool.enable_caching:
            pool.get_new_blocks = self.get_new_blocks
        else:  # lru, or no prefix caching (no cached block, so no eviction choice): vLLM's own allocation
            pool.get_new_blocks = self.get_new_blocks_observed
        pool.free_blocks = self.free_blocks
        pool.touch = self.touch
        # vLLM private: the hash-map and eviction internals every cache or evict path goes through.
        pool._insert_block_hash = self._insert_block_hash
        pool._remove_cached_block_hashes = self._remove_cached_block_hashes
        pool._maybe_evict_cached_block = self._maybe_evict_cached_block
        pool.cache_full_blocks = self.cache_full_blocks
        pool.cache_partial_block = self.cache_partial_block
        pool.move_block_hashes = self.move_block_hashes
        pool.reset_prefix_cache = self.reset_prefix_cache
        pool.unpin_blocks = self.unpin_blocks
        record = self.kv_manager.record_prefix_cache_stats

        def record_prefix_cache_stats(request: Any, num_hits: int) -> None:
            record(request, num_hits)
            self.on_admitted(request, num_hits)

        self.kv_manager.record_prefix_cache_stats = record_prefix_cache_stats
        if self._trace is None:      # the wrapper below only writes the trace's "slots" event
            return
        allocate = self.kv_manager.allocate_slots

        def allocate_slots(request: Any, num_new_tokens: int, num_new_computed_tokens: int = 0,
                           *args: Any, **kwargs: Any) -> Any:
            self._emit("slots", int(request.num_computed_tokens), int(num_new_computed_tokens), int(num_new_tokens),
                       int(kwargs.get("num_lookahead_tokens", 0)))
            return allocate(request, num_new_tokens, num_new_computed_tokens, *args, **kwargs)

        self.kv_manager.allocate_slots = allocate_slots

    def _install_finish_hook(self, scheduler: Any) -> None:
        """``Scheduler._free_request`` (finished or aborted, not preempted): show the request to the
        α source once its blocks are back in the pool, as the emulation's ``complete`` does."""
        free_request = scheduler._free_request          # vLLM private: the one place every request ends

        def _free_request(request: Any, *args: Any, **kwargs: Any) -> Any:
            result = free_request(request, *args, **kwargs)
            self.on_finished(request)
            return result

        scheduler._free_request = _free_request

    # --------------------------------------------------------------- trace
    def _emit(self, *event: Any) -> None:
        """Write one trace event (the hot paths test ``self._trace`` first, saving the call)."""
        if self._trace is not None:
            self._trace.write(json.dumps(event) + "\n")

    # --------------------------------------------------------------- allocation
    def get_new_blocks(self, num_blocks: int) -> list[Any]:
        """``BlockPool.get_new_blocks`` with Marconi's choice among cached free blocks: vLLM's own
        steps in its order, less the calls that do nothing."""
        pool = self.pool
        num_free = pool.get_num_free_blocks()
        if num_blocks > num_free:
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        queue = pool.free_block_queue
        state = self.state
        picked: list[Any] = []
        num_plain_free = num_free - state.num_free_cached
        want = min(num_blocks, num_plain_free)
        if want > 0:
            picked = first_plain_blocks(queue, want, num_plain_free, num_free)
            for block in picked:
                queue.remove(block)
        num_plain = len(picked)
        if num_plain < num_blocks:
            # The state picks every victim and drops its keys in one call (each picked once the one
            # before is gone: its parent may become the next leaf); vLLM's side follows per block.
            victims = state.evict(num_blocks - num_plain)
            blocks = pool.blocks
            evict = pool._maybe_evict_cached_block       # vLLM private (hooked: counts the eviction)
            trace = self._trace
            remove, append = queue.remove, picked.append
            for block_id, reason in victims:
                if trace is not None:
                    self._emit("victim", block_id, REASONS[reason])
                block = blocks[block_id]
                remove(block)
                self._told = reason                      # the hook: the state dropped its keys already
                evict(block)
                append(block)
            if len(victims) < num_blocks - num_plain:
                raise RuntimeError("marconi: free blocks remain but none is cached or uncached")
        # From here on, vLLM's own get_new_blocks (the same in 0.32 and 0.33), private parts included.
        if pool._reuse_watchers:
            pool._notify_reuse(picked)
        metrics = pool.metrics_collector
        by_block = pool.cached_block_hashes_by_block          # vLLM's extra (partial) hashes per block
        for i, block in enumerate(picked):
            if i < num_plain:                                 # a victim's hashes are gone already
                if block.block_id in by_block:                # (a plain block's own hash is None: picked so)
                    pool._maybe_evict_cached_block(block)
                elif metrics:                                 # what _maybe_evict_cached_block does for it
                    metrics.on_block_evicted(block)
            assert block.ref_cnt == 0
            block.ref_cnt += 1
            if metrics:
                metrics.on_block_allocated(block)
        if self._evicted_pending and time.monotonic() >= self._flush_due:
            self._flush_evicted()
        if self._trace is not None:
            self._emit("alloc", [b.block_id for b in picked])
        return picked

    def get_new_blocks_observed(self, num_blocks: int) -> list[Any]:
        """vLLM's own ``get_new_blocks`` (LRU: the free queue's head), with the index told which
        cached blocks left the queue. With prefix caching on it is vLLM's code less the eviction
        calls that do nothing (a block without a hash gets only the metrics call they would make),
        as in :meth:`get_new_blocks`; off, vLLM's own method."""
        pool = self.pool
        if not pool.enable_caching:
            blocks = self._orig["get_new_blocks"](num_blocks)
        else:
            # vLLM's own get_new_blocks (the same in 0.32 and 0.33), private parts included.
            if num_blocks > pool.get_num_free_blocks():
                raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
            blocks = pool.free_block_queue.popleft_n(num_blocks)
            if pool._reuse_watchers:
                pool._notify_reuse(blocks)
            metrics = pool.metrics_collector
            by_block = pool.cached_block_hashes_by_block
            taken = self.state.taken
            for block in blocks:
                if block.block_hash is not None or block.block_id in by_block:
                    pool._maybe_evict_cached_block(block)     # vLLM private (hooked: counts the eviction)
                    taken(block.block_id)
                elif metrics:                                 # what _maybe_evict_cached_block does for it
                    metrics.on_block_evicted(block)
                assert block.ref_cnt == 0
                block.ref_cnt += 1
                if metrics:
                    metrics.on_block_allocated(block)
        if self._evicted_pending and time.monotonic() >= self._flush_due:
            self._flush_evicted()
        if self._trace is not None:
            self._emit("alloc", [b.block_id for b in blocks])
        return blocks

    def _maybe_evict_cached_block(self, block: Any) -> bool:
        """vLLM's own ``_maybe_evict_cached_block`` and ``_remove_cached_block_hashes`` in one frame
        (the same code in 0.32 and 0.33: ``tests/test_vllm_versions.py``), the eviction counted (by
        the state's verdict) and the state told of each hash removed; or, for the victim of
        :meth:`get_new_blocks` (``_told``: its verdict's ``REASONS`` id, reset here), counted by that
        verdict, the state having dropped its keys already (:meth:`BlockEvictionState.evict`). True
        if a hash was removed."""
        reason = self._told
        if reason >= 0:
            self._told = -1
        pool = self.pool
        key = block.block_hash
        block_id = block.block_id
        if key is not None:
            gid = self._hash_parts[1](key)
            count = (gid, self.state.reason[block_id] if reason < 0 else reason)
            pending = self._evicted_pending
            pending[count] = pending.get(count, 0) + 1
            if self._trace is not None:
                self._emit("evict", block_id, gid, block.block_hash_num_tokens)
        metrics = pool.metrics_collector
        if metrics:
            metrics.on_block_evicted(block)
        extra = pool.cached_block_hashes_by_block.pop(block_id, ())
        if key is None and not extra:
            return False             # the block doesn't have a hash: eviction is not needed
        removed = self._unmap(block, key, extra, gid if key is not None else -1, reason < 0)
        if not removed:
            return False
        pool._emit_block_removed_events(removed)
        return True

    def _flush_evicted(self) -> None:
        """Add the evictions counted since the last flush to ``num_evicted`` and the Prometheus
        counters (one labelled ``inc`` per label set, not per block)."""
        pending, self._evicted_pending = self._evicted_pending, {}
        self._flush_due = time.monotonic() + _FLUSH_S
        for key, num in pending.items():
            labelled = self._evicted_labels.get(key)
            if labelled is None:           # labels() costs a lock and a dict lookup: once per label set
                gid, reason_id = key
                group = self.group_kinds[gid] if gid < len(self.group_kinds) else "other"
                reason = REASONS[reason_id]
                labelled = self._evicted_labels[key] = (self.counters.evicted.labels(self.policy, group, reason),
                                                        f"{group}:{reason}")
            labelled[0].inc(num)
            self._num_evicted[labelled[1]] = self._num_evicted.get(labelled[1], 0) + num

    @property
    def num_evicted(self) -> dict[str, int]:
        """Blocks evicted so far, by ``"group:reason"`` (counted up to now: pending counts are flushed)."""
        if self._evicted_pending:
            self._flush_evicted()
        return self._num_evicted

    def touch(self, blocks: Any) -> None:
        """vLLM's own ``touch`` (0.32's or 0.33's: they differ on the null block), each cached block
        that leaves the free queue reported to the state in the same loop. A pool that writes the
        block trace runs vLLM's method and reports after it (:meth:`_touch_traced`)."""
        if self._trace is not None:
            return self._touch_traced(blocks)
        pool = self.pool
        remove = pool.free_block_queue.remove
        metrics = pool.metrics_collector
        taken = self.state.taken
        skip_null = self._skip_null
        for block in blocks:
            if block.is_null and skip_null:
                continue
            if block.ref_cnt == 0 and not block.is_null:
                remove(block)
                taken(block.block_id)
            block.ref_cnt += 1
            if metrics:
                metrics.on_block_accessed(block)

    def _touch_traced(self, blocks: Any) -> None:
        blocks = list(blocks)
        leaving = [b.block_id for b in blocks if b.ref_cnt == 0 and not b.is_null]
        self._orig["touch"](blocks)
        if leaving:
            taken = self.state.taken
            for block_id in leaving:
                taken(block_id)
            self._emit("touch", leaving)

    def free_blocks(self, ordered_blocks: Any) -> None:
        """vLLM's own ``free_blocks`` (0.32's or 0.33's: they differ on the null block), each cached
        block that joins the free queue reported to the state (``released``) in the same loop: one
        frame and one pass per call where the wrapper took two. Without prefix caching, or with the
        block trace, vLLM's method runs and the report follows it (:meth:`_free_blocks_traced`).
        ``tests/vllm_peer/pool_driver.py --twin`` checks both series against a stock pool."""
        pool = self.pool
        if self._trace is not None or not pool.enable_caching:
            return self._free_blocks_traced(ordered_blocks)
        first: list[Any] = []
        last: list[Any] = []
        other: dict[Any, list[Any]] | None = None
        release = self.state.released
        skip_null = self._skip_null
        for block in ordered_blocks:
            if skip_null and block.is_null:
                continue
            owner = block.pool
            if owner is not None and owner is not pool:
                if other is None:
                    other = {}
                other.setdefault(owner, []).append(block)
                continue
            block.ref_cnt -= 1
            if block.ref_cnt == 0 and not block.is_null:
                if block.block_hash is None:
                    first.append(block)
                else:
                    last.append(block)
                    release(block.block_id)
        queue = pool.free_block_queue
        queue.prepend_n(first)
        queue.append_n(last)
        if other:
            for owner, blocks in other.items():
                owner.free_blocks(blocks)

    def _free_blocks_traced(self, ordered_blocks: Any) -> None:
        blocks = list(ordered_blocks)
        self._orig["free_blocks"](blocks)
        pool = self.pool
        release = self.state.released if pool.enable_caching else None
        released: list[int] | None = [] if self._trace is not None else None
        for block in blocks:
            if block.ref_cnt or block.is_null or (block.pool is not None and block.pool is not pool):
                continue
            if released is not None:
                released.append(block.block_id)
            if release is not None and block.block_hash is not None:
                release(block.block_id)
        if released:
            self._emit("free", released)

    def unpin_blocks(self, blocks: Any, on_reuse: Any) -> None:
        """KV connectors release blocks to the queue's tail this way: cached ones are candidates."""
        blocks = list(blocks)
        self._orig["unpin_blocks"](blocks, on_reuse)
        released = [b.block_id for b in blocks if b.ref_cnt == 0 and not b.is_null]
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null and block.block_hash is not None:
                self.state.released(block.block_id)
        if released:
            self._emit("free", released)

    # --------------------------------------------------------------- hashes
    def cache_full_blocks(self, request: Any, blocks: list[Any], num_cached_blocks: int, num_full_blocks: int,
                          block_size: int, kv_cache_group_id: int, block_mask: list[bool] | None = None) -> None:
        """vLLM's own ``cache_full_blocks`` less its KV events, with its per-block
        ``_insert_block_hash`` (the same code in 0.32 and 0.33: ``tests/test_vllm_versions.py``) and
        the state's ``cached`` report inlined: one frame a call, not three a block. The block's
        prefix and group are the arguments' own, not parsed back out of the key. Where vLLM
        publishes KV events, or the block trace is written, vLLM's method runs and calls the
        :meth:`_insert_block_hash` hook per block. ``tests/vllm_peer/pool_driver.py --twin`` checks
        it against a stock pool."""
        pool = self.pool
        if pool.enable_kv_cache_events or self._trace is not None:
            self._through_vllm("cache_full_blocks", request, blocks, num_cached_blocks, num_full_blocks, block_size,
                               kv_cache_group_id, block_mask)
            return
        if num_cached_blocks >= num_full_blocks:
            return
        new_full_blocks = blocks[num_cached_blocks:num_full_blocks]
        assert block_mask is None or len(block_mask) == len(new_full_blocks)
        resolve, make_key = self._key_parts
        new_block_hashes = resolve(request.block_hashes, self.hash_block_size, block_size)[num_cached_blocks:]
        hash_map = pool.cached_block_hash_to_block
        cached = self.state.cached
        parents = request.block_hashes                 # the parent as _insert_block_hash finds it
        hash_block_size, own_block_size = self.hash_block_size, self.block_size
        gid = kv_cache_group_id
        num = 0
        for i, blk in enumerate(new_full_blocks):
            if blk.is_null or (block_mask is not None and not block_mask[i]):
                continue
            block_hash = new_block_hashes[i]
            num_tokens = (num_cached_blocks + i + 1) * block_size
            key = make_key(block_hash, gid)
            if blk.block_hash is not None:   # vLLM: only a partial block promoted to full has one
                assert blk.block_hash_num_tokens is not None and blk.block_hash_num_tokens < num_tokens
                pool._emit_block_removed_events(self._remove_cached_block_hashes(blk))
            # vLLM's _insert_block_hash from here (its ``block_hash == key`` test: the hash is reset above)
            block_id = blk.block_id
            if hash_map.contain(key, block_id):
                continue
            if blk.block_hash is None:
                blk.set_block_hash(key, num_tokens=num_tokens)
            else:
                pool.cached_block_hashes_by_block.setdefault(block_id, set()).add(key)
            hash_map.insert(key, blk)
            pdepth = (num_tokens - 1) // own_block_size * own_block_size        # parent_depth(), inlined
            cached(block_id, block_hash, gid, num_tokens, parents[pdepth // hash_block_size - 1] if pdepth else None)
            num += 1
        if num:
            kind = self.group_kinds[gid] if gid < len(self.group_kinds) else "other"
            self.num_cached[kind] = self.num_cached.get(kind, 0) + num

    def cache_partial_block(self, request: Any, block: Any, num_tokens: int, kv_cache_group_id: int, block_size: int,
                            replace_existing_hashes: bool = False) -> Any:
        """vLLM's own ``cache_partial_block`` less its KV events (the same code in 0.32 and 0.33:
        ``tests/test_vllm_versions.py``), the insertion and the state's report in one more frame
        (:meth:`_insert_key`) where vLLM's method and the parsing hook took four. Where vLLM
        publishes KV events, or the block trace is written, vLLM's method runs and calls the
        :meth:`_insert_block_hash` hook. Returns the key, or None for the null block."""
        pool = self.pool
        if pool.enable_kv_cache_events or self._trace is not None:
            return self._through_vllm("cache_partial_block", request, block, num_tokens, kv_cache_group_id,
                                      block_size, replace_existing_hashes)
        if block.is_null:
            return None
        hash_block_size = self.hash_block_size
        assert block_size % hash_block_size == 0
        block_hash = pool._get_partial_block_hash(request, num_tokens)       # vLLM private
        depth = num_tokens // hash_block_size * hash_block_size
        key = self._key_parts[1](block_hash, kv_cache_group_id)
        if replace_existing_hashes:
            pool._emit_block_removed_events(self._remove_cached_block_hashes(block))
        elif (block.block_hash is not None and block.block_hash != key
              and block.block_hash_num_tokens is not None and block.block_hash_num_tokens < depth
              and not pool.cached_block_hash_to_block.contain(key, block.block_id)):
            pool._emit_block_removed_events(self._remove_cached_block_hashes(block))
        self._insert_key(key, block, depth, block_hash, kv_cache_group_id, request)
        return key

    def _through_vllm(self, name: str, request: Any, *args: Any) -> Any:
        """vLLM's own caching method ``name`` for ``request`` (with its KV events), the request set
        aside for the :meth:`_insert_block_hash` hook it calls per block."""
        self._request = request
        try:
            return self._orig[name](request, *args)
        finally:
            self._request = None

    def move_block_hashes(self, src_block: Any, dst_block: Any) -> None:
        """Keep each moved hash's depth and parent: the index re-registers them on ``dst_block``."""
        known = {}
        for key in [src_block.block_hash, *self.pool.cached_block_hashes_by_block.get(src_block.block_id, ())]:
            if key is None:
                continue
            prefix = self._hash_parts[0](key)
            try:
                known[prefix] = self.state.prefix_info(prefix)
            except KeyError:
                pass
        self._moved = known
        try:
            self._orig["move_block_hashes"](src_block, dst_block)
        finally:
            self._moved = None

    def _insert_block_hash(self, key: Any, block: Any, num_tokens: int | None) -> None:
        """vLLM's own ``_insert_block_hash`` (the same code in 0.32 and 0.33:
        ``tests/test_vllm_versions.py``), then the state told of the new hash: what vLLM's own
        ``cache_full_blocks`` / ``cache_partial_block`` (KV events on, or the block trace written)
        and ``move_block_hashes`` call, the key parsed into its prefix and group."""
        parts = self._hash_parts
        prefix = parts[0](key)
        moved = self._moved
        if moved and prefix in moved:
            self._insert_key(key, block, num_tokens, prefix, parts[1](key), None, moved[prefix])
        else:
            if self._request is None or num_tokens is None:
                raise RuntimeError("marconi: a block was cached outside cache_full_blocks/cache_partial_block")
            self._insert_key(key, block, num_tokens, prefix, parts[1](key), self._request)

    def _insert_key(self, key: Any, block: Any, num_tokens: int | None, prefix: Any, gid: int, request: Any,
                    moved: tuple[int, Any] | None = None) -> None:
        """vLLM's ``_insert_block_hash`` for ``key`` (``prefix`` in group ``gid``), then the state's
        ``cached`` report: at ``num_tokens`` with its parent read from ``request``'s block hashes,
        or, for a moved hash, at its known ``(depth, parent)``."""
        pool = self.pool
        current = block.block_hash
        if current == key:
            return
        block_id = block.block_id
        hash_map = pool.cached_block_hash_to_block
        if hash_map.contain(key, block_id):
            return
        if current is None:
            block.set_block_hash(key, num_tokens=num_tokens)
        else:
            pool.cached_block_hashes_by_block.setdefault(block_id, set()).add(key)
        hash_map.insert(key, block)
        if moved is not None:
            depth, parent = moved
        else:
            depth = num_tokens
            pdepth = (num_tokens - 1) // self.block_size * self.block_size        # parent_depth(), inlined
            parent = request.block_hashes[pdepth // self.hash_block_size - 1] if pdepth else None
        self.state.cached(block_id, prefix, gid, depth, parent)
        kind = self.group_kinds[gid] if gid < len(self.group_kinds) else "other"
        num_cached = self.num_cached
        num_cached[kind] = num_cached.get(kind, 0) + 1
        if self._trace is not None:
            self._emit("cache", block_id, gid, depth)

    def _remove_cached_block_hashes(self, block: Any) -> list[Any]:
        """vLLM's own ``_remove_cached_block_hashes`` (the same code in 0.32 and 0.33), the state
        told of each hash removed: the hashes removed from the hash map."""
        key = block.block_hash
        extra = self.pool.cached_block_hashes_by_block.pop(block.block_id, ())
        if key is None and not extra:
            return []
        return self._unmap(block, key, extra)

    def _unmap(self, block: Any, key: Any, extra: Any, key_gid: int = -1, tell: bool = True) -> list[Any]:
        """The tail of vLLM's ``_remove_cached_block_hashes`` for ``block``'s hashes (``key``, its
        own or None, and ``extra``, those ``cached_block_hashes_by_block`` held, already popped):
        each popped from the hash map, the block's hash reset; with ``tell``, the state told of each
        removed (without: it dropped them already). ``key_gid``: ``key``'s group id when the caller
        parsed it already, else -1."""
        block_id = block.block_id
        pop = self.pool.cached_block_hash_to_block.pop
        block_hash, group_id = self._hash_parts
        uncached = self.state.uncached
        trace = self._trace
        if not extra:                # one hash, the block's own: the common case
            if pop(key, block_id) is None:
                block.reset_hash()
                return []
            block.reset_hash()
            if tell or trace is not None:
                gid = key_gid if key_gid >= 0 else group_id(key)
                if tell:
                    uncached(block_id, block_hash(key), gid)
                if trace is not None:
                    self._emit("uncache", block_id, gid)
            return [key]
        keys = [key, *extra] if key is not None else list(extra)
        removed = [k for k in keys if pop(k, block_id) is not None]
        block.reset_hash()
        if tell or trace is not None:
            for k in removed:
                gid = group_id(k)
                if tell:
                    uncached(block_id, block_hash(k), gid)
                if trace is not None:
                    self._emit("uncache", block_id, gid)
        return removed

    def reset_prefix_cache(self) -> bool:
        done = self._orig["reset_prefix_cache"]()
        if done:
            self.state.clear()
            self._emit("reset")
        return done

    # --------------------------------------------------------------- requests
    def on_admitted(self, request: Any, num_hits: int) -> None:
        """A request passed admission with ``num_hits`` cached tokens (vLLM's own count)."""
        boundary = int(getattr(request, "shared_prefix_boundary", 0) or 0)
        kv_only = max(0, boundary - num_hits)
        if self._hit_counters is None:     # labels() once: it costs a lock and a lookup per call
            self._hit_counters = (self.counters.hit_tokens.labels("usable"), self.counters.hit_tokens.labels("kv_only"))
        self._hit_counters[0].inc(num_hits)
        if kv_only:
            self._hit_counters[1].inc(kv_only)
        self._admitted[request.request_id] = (int(num_hits), kv_only)
        if self.recorder is not None:
            self.recorder.admitted(request, num_hits)
        self._emit("lookup", int(request.num_prompt_tokens), int(num_hits), kv_only)

    def on_finished(self, request: Any) -> None:
        """A request finished and freed its blocks: its token ids go to the α source. A failing
        source never takes the server down: it is logged once and the last rule stays."""
        hit, kv_only = self._admitted.pop(request.request_id, (0, 0))
        if self.recorder is not None:
            self.recorder.finished(request)
        if self._evicted_pending:          # evictions outside get_new_blocks (a reset, a connector) count by now
            self._flush_evicted()
        if self.retention is not None:
            self.retention.planner.finish(request.request_id)
        if self._observe_failed or request.prompt_token_ids is None:   # prompt embeddings: no ids to learn from
            return
        started = time.perf_counter()
        event = RequestObservation(request.prompt_token_ids, list(request.output_token_ids), hit, kv_only,
                                   request.block_hashes, self.hash_block_size)
        try:
            changed = self.state.finished(event)
        except Exception:
            self._observe_failed = True
            logger.exception("marconi: the alpha source failed; it keeps its last rule from now on")
            return
        finally:
            self.source_s += time.perf_counter() - started
        self.num_finished += 1
        if changed is not None:
            self.num_alpha_changes += 1
            self.counters.alpha_changes.labels(f"{changed[0]:g}", changed[1]).inc()
            self._emit("alpha", *changed)
            logger.info("marconi: alpha source %r now alpha=%g, efficiency=%s", self.state.alpha_source, *changed)


class RetentionHooks:
    """``MARCONI_VLLM_RETENTION=sparse-dp`` on one scheduler: the planner's boundaries become chunk
    stops and retained Mamba states. Built by :meth:`for_scheduler` (checks only), installed by
    :meth:`install` (assignments only); :class:`PoolHooks`' finish hook drops a request's plan."""

    def __init__(self, scheduler: Any, mamba_managers: list[Any], planner: RetentionPlanner) -> None:
        self.scheduler = scheduler
        self.mamba_managers = mamba_managers
        self.planner = planner
        self.block_size = planner.block_size
        self.hash_block_size = int(scheduler.kv_cache_manager.block_pool.hash_block_size)

    @classmethod
    def for_scheduler(cls, scheduler: Any, kinds: list[str], spec: Any, config: PluginConfig) -> "RetentionHooks":
        """The hooks for ``scheduler``, not installed. PluginSettingError unless Mamba ``align`` mode with
        retention interval 0; AttributeError where this vLLM lacks what the hooks wrap."""
        cc = scheduler.cache_config
        if MAMBA not in kinds or not getattr(scheduler, "need_mamba_block_aligned_split", False):
            raise PluginSettingError(f"{ENV_RETENTION}={config.retention}: needs a hybrid model in Mamba align mode "
                                     f"(mamba_cache_mode={cc.mamba_cache_mode!r}, groups {','.join(kinds)}); "
                                     f"unset {ENV_RETENTION} or serve with --mamba-cache-mode align")
        if cc.prefix_cache_retention_interval != 0:
            raise PluginSettingError(f"{ENV_RETENTION}={config.retention}: needs --prefix-cache-retention-interval 0 "
                                     f"(vLLM's default), got {cc.prefix_cache_retention_interval!r}: the plugin "
                                     "places the states the interval would")
        if not hasattr(scheduler, "_mamba_block_aligned_split"):          # vLLM private
            raise AttributeError(f"vLLM's Scheduler has no '_mamba_block_aligned_split': this vLLM is not "
                                 f"{_SUPPORTED_TEXT}")
        managers = list(scheduler.kv_cache_manager.coordinator.single_type_managers)
        mamba = [m for m, kind in zip(managers, kinds) if kind == MAMBA]
        if not all(callable(getattr(m, "cache_blocks", None)) for m in mamba):
            raise AttributeError(f"vLLM's MambaManager has no 'cache_blocks': this vLLM is not {_SUPPORTED_TEXT}")
        planner = RetentionPlanner.for_model(spec, block_size=int(cc.block_size), budget=config.budget)
        return cls(scheduler, mamba, planner)

    def install(self) -> None:
        split = self.scheduler._mamba_block_aligned_split          # vLLM private: where align mode ends a chunk

        def _mamba_block_aligned_split(request: Any, num_new_tokens: int, num_new_local_computed_tokens: int = 0,
                                       num_external_computed_tokens: int = 0) -> int:
            num = split(request, num_new_tokens, num_new_local_computed_tokens, num_external_computed_tokens)
            start = request.num_computed_tokens + num_new_local_computed_tokens + num_external_computed_tokens
            if request.request_id not in self.planner:
                self.plan(request, start)
            return self.planner.stop(request.request_id, start, num)

        self.scheduler._mamba_block_aligned_split = _mamba_block_aligned_split
        for manager in self.mamba_managers:
            self._wrap_cache_blocks(manager)
        logger.info("marconi: sparse-dp retention on (%d boundaries a sequence beyond vLLM's, block %d tokens)",
                    self.planner.budget, self.block_size)

    def _wrap_cache_blocks(self, manager: Any) -> None:
        cache_blocks = manager.cache_blocks

        def wrapped(request: Any, num_tokens: int, retention_interval: int | None = None, *,
                    replay_boundaries: Any) -> None:
            extra = self.planner.positions(request.request_id)
            boundaries = (*replay_boundaries, *extra) if extra else replay_boundaries
            cache_blocks(request, num_tokens, retention_interval, replay_boundaries=boundaries)

        manager.cache_blocks = wrapped

    def plan(self, request: Any, start: int) -> tuple[int, ...]:
        """The request's plan (made at its first call): its prompt's block hashes, one per block."""
        n = int(request.num_prompt_tokens)
        step = max(1, self.block_size // self.hash_block_size)
        hashes = request.block_hashes
        keys = [hashes[(i + 1) * step - 1] for i in range(min(n // self.block_size, len(hashes) // step))]
        return self.planner.plan(request.request_id, keys, num_prompt_tokens=n, resume=int(start),
                                 junction=int(request.shared_prefix_boundary or 0))
