"""Worker processes that never outlive the command that started them, and SIGTERM as an exception.

Three places fork worker pools (sweep points, the bootstrap α grid, the sparse study). A plain
``ProcessPoolExecutor`` leaks its workers when the parent dies: after ``kill -9`` they wait on their
task queue forever, and on an exception its ``__exit__`` *waits* for every queued task. So:

* :func:`worker_pool` forks workers that ask Linux to SIGKILL them when their parent dies
  (``prctl(PR_SET_PDEATHSIG)``; they also exit if the parent is already gone), ignore SIGINT (the
  parent handles Ctrl-C) and take SIGTERM's default action; on any exception in the ``with`` body
  (Ctrl-C, SIGTERM, a failed task) the queued tasks are cancelled and the workers killed.
* :func:`sigterm_raises` makes SIGTERM raise :class:`Terminated` in the main thread, so ``finally``
  blocks run: pools are torn down, Ray is shut down and :func:`marconi.io.atomic_write` removes
  its temp file. The CLI wraps every command in it.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any, Callable, Iterator

__all__ = ["worker_pool", "sigterm_raises", "sigterm_received", "terminated", "Terminated"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class Terminated(KeyboardInterrupt):
    """Raised in the main thread on SIGTERM.

    A KeyboardInterrupt, so whatever handles Ctrl-C handles it too (``except Exception`` does not
    swallow it; Ray's blocking calls turn it into a plain KeyboardInterrupt, so test
    :func:`sigterm_received` rather than the type to tell the two apart).
    """


_received = threading.Event()


def terminated() -> Terminated:
    """A :class:`Terminated` to raise where SIGTERM was seen by another handler (Ray's, during init)."""
    _received.set()
    return Terminated()


def sigterm_received() -> bool:
    """Whether SIGTERM arrived inside a :func:`sigterm_raises` block (reset when a block starts)."""
    return _received.is_set()


def _die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no prctl: the parent's teardown still kills us
            pass
    if os.getppid() != parent_pid:  # the parent died between fork and prctl
        os._exit(1)


def _init_worker(parent_pid: int, initializer: Callable[..., None] | None, initargs: tuple[Any, ...]) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the parent's "raise Terminated" handler
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C reaches the whole group; the parent decides
    _die_with_parent(parent_pid)
    if initializer is not None:
        initializer(*initargs)


def _kill_workers(pool: ProcessPoolExecutor) -> None:
    # ``_processes`` is private, but it is the only handle on the workers; a pool that never started
    # any has none (or None).
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in processes:
        if proc.is_alive():
            proc.kill()
    for proc in processes:
        proc.join(timeout=10)


@contextmanager
def worker_pool(max_workers: int, *, initializer: Callable[..., None] | None = None,
                initargs: tuple[Any, ...] = ()) -> Iterator[ProcessPoolExecutor]:
    """A fork-based ``ProcessPoolExecutor`` whose workers die with this process (see the module doc).

    Workers inherit the parent's memory (module globals set before the first ``submit``), so large
    read-only objects travel without a copy. On normal exit the pool is shut down after its work;
    on any exception the workers are killed at once and the exception propagates.
    """
    pool = ProcessPoolExecutor(max_workers=max_workers, mp_context=multiprocessing.get_context("fork"),
                               initializer=_init_worker, initargs=(os.getpid(), initializer, initargs))
    try:
        yield pool
    except BaseException:
        _kill_workers(pool)
        raise
    pool.shutdown(wait=True)


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` in the main thread (elsewhere: no-op).

    The first SIGTERM raises; later ones are ignored so the clean-up it starts runs undisturbed.
    The previous handler is restored on exit (library callers keep theirs).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise terminated()

    _received.clear()
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
