"""Where sweep points run: :class:`LocalBackend` (a forked :func:`marconi.pool.worker_pool` inheriting
the shared traces) or :class:`RayBackend` (each shared object ``ray.put`` once, one task per item).
Results come back in item order, identical whichever backend ran them."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import threading
from concurrent.futures import as_completed
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from marconi.pool import terminated, worker_pool
from marconi.core.registry import ConfigError
from marconi.choosers.bootstrap import default_workers
from marconi.workloads.trace import Request, Trace

__all__ = ["Backend", "LocalBackend", "RayBackend", "make_backend", "BACKENDS", "PackedTrace", "pack_trace",
           "ray_tuning_mapper", "available_cpus", "worker_count", "capped_workers", "RAY_CONNECT_TIMEOUT_S"]

BACKENDS = ("local", "ray")
RAY_CONNECT_TIMEOUT_S = 5.0  # how long a Ray cluster's address may take to accept a TCP connection

Shared = Mapping[str, Any]
TaskFn = Callable[[Shared, Any], Any]


class Backend(Protocol):
    name: str

    def map(self, fn: TaskFn, items: Sequence[Any], *, shared: Shared | None = None,
            on_result: Callable[[Any], None] | None = None,
            needs: Callable[[Any], Sequence[str]] | None = None) -> list[Any]:
        """``[fn(shared, item) for item in items]`` in parallel (``fn`` module-level); ``needs(item)`` may
        name the shared keys an item reads."""
        ...

    def tuning_mapper(self) -> Callable[[Callable[[float], Any], Sequence[float]], list[Any]] | None:
        """A map for the bootstrap α grid search inside a point, or None (tune in the point's process)."""
        ...

    @property
    def parallelism(self) -> int:
        """Items that can run at once (decides whether a point may tune in parallel)."""
        ...

    def close(self) -> None:
        ...


# ============================================================================ workers
def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the platform has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def worker_count(text: str) -> int:
    """argparse type of every ``--workers``: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def capped_workers(workers: int | None, *, address: str | None = None) -> tuple[int | None, str | None]:
    """(``workers`` for a backend, a line for the user where it was changed): capped at the CPUs this
    process may use (points are CPU-bound); unused with a Ray ``address``.

    Raises:
        ConfigError: ``workers`` < 1.
    """
    if workers is None:
        return None, None
    if workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")
    if address is not None:
        return None, f"--workers {workers} is not used with --address: the cluster's CPUs run the points"
    cpus = available_cpus()
    if workers > cpus:
        return cpus, f"--workers {workers} is more than the {cpus} CPUs this process may use: running {cpus}"
    return workers, None


# ============================================================================ local
_LOCAL_SHARED: Shared = {}


def _local_call(fn: TaskFn, item: Any) -> Any:
    return fn(_LOCAL_SHARED, item)


class LocalBackend:
    """A fork-based process pool on this machine (``workers=1``: in-process, no pool)."""

    name = "local"

    def __init__(self, workers: int | None = None) -> None:
        if workers is not None and int(workers) < 1:
            raise ConfigError(f"workers must be >= 1, got {workers}")
        self.workers = default_workers() if workers is None else int(workers)

    @property
    def parallelism(self) -> int:
        return self.workers

    def map(self, fn: TaskFn, items: Sequence[Any], *, shared: Shared | None = None,
            on_result: Callable[[Any], None] | None = None,
            needs: Callable[[Any], Sequence[str]] | None = None) -> list[Any]:
        global _LOCAL_SHARED
        shared = dict(shared or {})
        workers = min(self.workers, len(items))
        results: list[Any] = [None] * len(items)
        if workers <= 1:
            for i, item in enumerate(items):
                results[i] = fn(shared, item)
                if on_result is not None:
                    on_result(results[i])
            return results
        previous, _LOCAL_SHARED = _LOCAL_SHARED, shared  # inherited by the forked workers
        try:
            with worker_pool(workers) as pool:  # workers die with this process, on any error too
                futures = {pool.submit(_local_call, fn, item): i for i, item in enumerate(items)}
                for future in as_completed(futures):
                    results[futures[future]] = future.result()
                    if on_result is not None:
                        on_result(results[futures[future]])
        finally:
            _LOCAL_SHARED = previous
        return results

    def tuning_mapper(self) -> None:
        return None

    def close(self) -> None:
        return None


# ============================================================================ trace packing
@dataclass(frozen=True, slots=True)
class PackedTrace:
    """A :class:`Trace` as one int32 buffer plus per-request (offset, length) columns; token arrays that
    are views of one buffer are stored once. :meth:`unpack` rebuilds equal, read-only requests."""

    name: str
    meta: dict[str, Any]
    session_ids: list[Any]
    turn_ids: np.ndarray       # int64 [n]
    ts: np.ndarray             # float64 [n]
    tokens: np.ndarray         # int32 [total]
    input_span: np.ndarray     # int64 [n, 2]: offset, length into tokens
    output_span: np.ndarray    # int64 [n, 2]

    def unpack(self) -> Trace:
        toks = self.tokens
        if toks.flags.writeable:
            toks = toks.view()
            toks.flags.writeable = False
        reqs = [Request(sid, int(turn), float(ts), toks[i0:i0 + n0], toks[o0:o0 + n1])
                for sid, turn, ts, (i0, n0), (o0, n1) in zip(self.session_ids, self.turn_ids.tolist(),
                                                            self.ts.tolist(), self.input_span.tolist(),
                                                            self.output_span.tolist())]
        return Trace(reqs, name=self.name, meta=dict(self.meta))


class _BufferPool:
    """Assigns each token array a span in one concatenated buffer, sharing owners between views."""

    def __init__(self) -> None:
        self.chunks: list[np.ndarray] = []
        self.size = 0
        self.owner_offset: dict[int, tuple[int, np.ndarray]] = {}  # id(owner) -> (offset, owner)

    def span(self, arr: np.ndarray) -> tuple[int, int]:
        owner = arr.base if isinstance(arr.base, np.ndarray) else None
        if (owner is not None and owner.dtype == np.int32 and owner.ndim == 1 and owner.flags.c_contiguous
                and arr.flags.c_contiguous):
            start = (arr.__array_interface__["data"][0] - owner.__array_interface__["data"][0]) // 4
            if 0 <= start and start + arr.size <= owner.size:
                key = id(owner)
                if key not in self.owner_offset:
                    self.owner_offset[key] = (self.size, owner)
                    self._append(owner)
                return self.owner_offset[key][0] + int(start), int(arr.size)
        offset = self.size
        self._append(arr)
        return offset, int(arr.size)

    def _append(self, arr: np.ndarray) -> None:
        self.chunks.append(np.ascontiguousarray(arr, dtype=np.int32))
        self.size += int(arr.size)

    def buffer(self) -> np.ndarray:
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, dtype=np.int32)


def pack_trace(trace: Trace | Sequence[Request]) -> PackedTrace:
    reqs = list(trace)
    pool = _BufferPool()
    ins = np.array([pool.span(r.input_tokens) for r in reqs], dtype=np.int64).reshape(-1, 2)
    outs = np.array([pool.span(r.output_tokens) for r in reqs], dtype=np.int64).reshape(-1, 2)
    name = getattr(trace, "name", "")
    meta = dict(getattr(trace, "meta", {}) or {})
    return PackedTrace(name, meta, [r.session_id for r in reqs], np.array([r.turn_id for r in reqs], dtype=np.int64),
                       np.array([r.ts for r in reqs], dtype=np.float64), pool.buffer(), ins, outs)


def _pack(obj: Any) -> Any:
    return pack_trace(obj) if isinstance(obj, Trace) else obj


def _unpack(obj: Any) -> Any:
    return obj.unpack() if isinstance(obj, PackedTrace) else obj


# ============================================================================ Ray
def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:  # ray is a declared dependency (extra "ray"); say how to get it
        raise ConfigError("the ray backend needs the 'ray' package: pip install 'marconi[ray]'") from exc
    return ray


_RAY_FUNCS: dict[str, Any] = {}


def _ray_remote(name: str, fn: Callable[..., Any]) -> Any:
    """The Ray remote wrapper of a module-level function (created after ``ray`` is imported)."""
    if name not in _RAY_FUNCS:
        ray = _import_ray()
        _RAY_FUNCS[name] = ray.remote(fn)
    return _RAY_FUNCS[name]


def _ray_endpoint(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``host:port`` / ``ray://host:port`` / ``[::1]:port``; None for ``auto`` and the like."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def check_ray_address(address: str, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """Fail fast (a bounded TCP connect) where nothing accepts a connection at ``address``:
    ``ray.init`` would retry for ever.

    Raises:
        ConfigError: refused, timed out or unresolvable; the message says what to do.
    """
    endpoint = _ray_endpoint(address)
    if endpoint is None:
        return
    try:
        with socket.create_connection(endpoint, timeout=timeout_s):
            pass
    except OSError as exc:
        reason = f"no answer within {timeout_s:g} s" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise ConfigError(f"cannot reach a Ray cluster at {address} ({reason}): start one there with "
                          f"`ray start --head --port {endpoint[1]}`, or correct --address") from None


def _ray_task(fn: TaskFn, keys: tuple[str, ...], item: Any, *values: Any) -> Any:
    # Top-level ObjectRef arguments arrive resolved (zero-copy numpy buffers from the object store).
    return fn({k: _unpack(v) for k, v in zip(keys, values)}, item)


def _ray_apply(fn: Callable[[Any], Any], arg: Any) -> Any:
    return fn(arg)


def ray_tuning_mapper(fn: Callable[[float], Any], grid: Sequence[float]) -> list[Any]:
    """Map the bootstrap α replays over Ray tasks (``fn`` put once), in grid order; works in a driver or
    inside a Ray task."""
    ray = _import_ray()
    fn_ref = ray.put(fn)
    apply = _ray_remote("apply", _ray_apply)
    return list(ray.get([apply.remote(fn_ref, a) for a in grid]))


class RayBackend:
    """Every item is one Ray task; shared objects go to the object store once per backend.

    ``address``: a cluster to join (probed first; its nodes need ``marconi``), None for a local
    instance (``num_cpus``; shut down by :meth:`close`); ``tune_on_ray``: nested tasks for a point's α
    grid; ``init_kwargs``: for ``ray.init``. ConfigError without ``ray`` or for ``num_cpus`` < 1.
    """

    name = "ray"

    def __init__(self, address: str | None = None, *, num_cpus: int | None = None, tune_on_ray: bool = True,
                 **init_kwargs: Any) -> None:
        _import_ray()  # a missing ray is said now, not after the trace has loaded
        if num_cpus is not None and int(num_cpus) < 1:
            raise ConfigError(f"num_cpus must be >= 1, got {num_cpus}")
        self.address = address
        self.num_cpus = num_cpus
        self.tune_on_ray = tune_on_ray
        self.init_kwargs = init_kwargs
        self._started = False
        # id(shared object) -> (the object, its ObjectRef): each object is put once per backend, however
        # many maps use it (the object is kept alive so its id cannot be reused while cached)
        self._refs: dict[int, tuple[Any, Any]] = {}

    def _ensure(self) -> Any:
        ray = _import_ray()
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.ERROR,
                                      "log_to_driver": False, **self.init_kwargs}
            if self.address is None:
                kwargs.setdefault("num_cpus", self.num_cpus)
            if self.address is not None:
                check_ray_address(self.address)  # bounded: ray.init would wait for ever
            in_main = threading.current_thread() is threading.main_thread()
            sigterm = signal.getsignal(signal.SIGTERM) if in_main else None
            self._started = True  # before init: close() must stop whatever a cut-short init started
            try:
                ray.init(address=self.address, **kwargs)
            except SystemExit as exc:  # ray.init's own SIGTERM handler exits; report it as ours
                if exc.code != signal.SIGTERM:
                    raise
                raise terminated() from None
            finally:
                if in_main and sigterm is not None:
                    # ray.init replaces the driver's SIGTERM handler with sys.exit; keep ours (the
                    # CLI's raises Terminated), so SIGTERM tears down through the same finally blocks.
                    signal.signal(signal.SIGTERM, sigterm)
        return ray

    @property
    def parallelism(self) -> int:
        ray = self._ensure()
        return max(1, int(ray.cluster_resources().get("CPU", 1)))

    def map(self, fn: TaskFn, items: Sequence[Any], *, shared: Shared | None = None,
            on_result: Callable[[Any], None] | None = None,
            needs: Callable[[Any], Sequence[str]] | None = None) -> list[Any]:
        ray = self._ensure()
        shared = dict(shared or {})
        item_keys = [tuple(needs(item)) if needs is not None else tuple(shared) for item in items]
        used = dict.fromkeys(k for keys in item_keys for k in keys)
        refs = {k: self._put(ray, shared[k]) for k in used}
        task = _ray_remote("task", _ray_task)
        pending = {task.remote(fn, keys, item, *(refs[k] for k in keys)): i
                   for i, (item, keys) in enumerate(zip(items, item_keys))}
        results: list[Any] = [None] * len(items)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                i = pending.pop(ref)
                results[i] = ray.get(ref)
                if on_result is not None:
                    on_result(results[i])
        return results

    def _put(self, ray: Any, obj: Any) -> Any:
        cached = self._refs.get(id(obj))
        if cached is None or cached[0] is not obj:
            cached = (obj, ray.put(_pack(obj)))
            self._refs[id(obj)] = cached
        return cached[1]

    @property
    def num_objects_put(self) -> int:
        """Shared objects this backend has put in the object store (each once)."""
        return len(self._refs)

    def tuning_mapper(self) -> Callable[[Callable[[float], Any], Sequence[float]], list[Any]] | None:
        return ray_tuning_mapper if self.tune_on_ray else None

    def close(self) -> None:
        self._refs.clear()
        if self._started:
            _import_ray().shutdown()
            self._started = False
            _RAY_FUNCS.clear()

    def __enter__(self) -> "RayBackend":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def make_backend(name: str | Backend | None = "local", *, workers: int | None = None,
                 address: str | None = None) -> Backend:
    """``"local"`` (process pool of ``workers``) or ``"ray"`` (joining ``address`` if given)."""
    if name is None or name == "local":
        if address is not None:
            raise ConfigError("--address only applies to the ray backend")
        return LocalBackend(workers)
    if name == "ray":
        return RayBackend(address, num_cpus=workers if address is None else None)
    if isinstance(name, str):
        raise ConfigError(f"unknown backend {name!r}; choose one of: {', '.join(BACKENDS)}")
    return name
