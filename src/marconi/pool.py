"""Worker processes and child programs that never outlive the command, and SIGTERM as an exception:
:func:`worker_pool` (forked workers killed with the parent or on any exception),
:func:`sigterm_raises` (SIGTERM raises :class:`Terminated`), :func:`spawn` / :func:`child_process` /
:func:`run_child` / :func:`stop` (a child in its own process group with a parent-death signal),
:func:`scratch_dir` (removed on any exit). Linux only for the death signal; docs/architecture.md.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

__all__ = ["worker_pool", "sigterm_raises", "sigterm_received", "terminated", "Terminated", "spawn", "stop",
           "child_process", "run_child", "scratch_dir", "keep_scratch", "KEEP_SCRATCH_ENV", "EXEC_FAILED"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class Terminated(KeyboardInterrupt):
    """Raised in the main thread on SIGTERM; a KeyboardInterrupt, so ``except Exception`` does not
    swallow it. Ray may turn it into a plain KeyboardInterrupt: test :func:`sigterm_received`."""


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
    """A fork-based ``ProcessPoolExecutor`` whose workers die with this process and inherit module
    globals set before the first ``submit``; on any exception the workers are killed."""
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
    """Within the block, the first SIGTERM raises :class:`Terminated` in the main thread (no-op in other
    threads); later ones are ignored. The previous handler is restored on exit."""
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


# ====================================================================================== children
#: The launcher's exit status when the program itself could not be started (the shell's 127).
EXEC_FAILED = 127

# Runs as ``python -I -S -c _LAUNCHER PARENT_PID PROGRAM ARGS...``: the death signal survives exec.
_LAUNCHER = """\
import os, signal, sys
parent = int(sys.argv[1])
if sys.platform.startswith("linux"):
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
if os.getppid() != parent:
    os._exit(1)
signal.signal(signal.SIGINT, signal.SIG_DFL)
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as exc:
    os.write(2, ("marconi: cannot run %s: %s\\n" % (sys.argv[2], exc.strerror or exc)).encode())
    os._exit(127)
"""


def spawn(args: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
          stdin: Any = None, stdout: Any = None, stderr: Any = None, text: bool = False) -> subprocess.Popen[Any]:
    """Start ``args`` (other arguments as :class:`subprocess.Popen`) as a child that dies with this
    process, leading a new process group; ``proc.pid`` is the program's. A program that cannot run
    exits with :data:`EXEC_FAILED`, saying why on stderr. Stop it with :func:`stop`."""
    if not args:
        raise ValueError("spawn: no command")
    cmd = [sys.executable, "-I", "-S", "-c", _LAUNCHER, str(os.getpid()), *map(str, args)]
    return subprocess.Popen(cmd, env=None if env is None else dict(env), cwd=cwd, stdin=stdin, stdout=stdout,
                            stderr=stderr, text=text, start_new_session=True)


def stop(proc: subprocess.Popen[Any], grace_s: float = 10.0) -> int | None:
    """End ``proc``'s process group (SIGTERM, then SIGKILL after ``grace_s``) and reap ``proc``;
    idempotent. Returns its exit status (None if it could not be reaped)."""
    if proc.poll() is None:
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                return None
    _signal_group(proc.pid, signal.SIGKILL)     # what the child left in its group
    return proc.returncode


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


@contextmanager
def child_process(args: Sequence[str], *, grace_s: float = 10.0, **popen: Any) -> Iterator[subprocess.Popen[Any]]:
    """:func:`spawn` for the ``with`` body; on leaving it however (error, Ctrl-C, :class:`Terminated`)
    the child's group is stopped."""
    proc = spawn(args, **popen)
    try:
        yield proc
    finally:
        stop(proc, grace_s)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def run_child(args: Sequence[str], *, timeout_s: float | None = None, env: Mapping[str, str] | None = None,
              cwd: str | Path | None = None, text: bool = True) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run(args, capture_output=True)`` through :func:`child_process`
    (``subprocess.TimeoutExpired`` after ``timeout_s``)."""
    with child_process(args, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=text) as proc:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop(proc, grace_s=2.0)
            raise
    return subprocess.CompletedProcess(list(args), proc.returncode, out, err)


# ====================================================================================== scratch folders
#: Set to 1 to keep the folders :func:`scratch_dir` makes (a failed run's requests, logs, results).
KEEP_SCRATCH_ENV = "MARCONI_KEEP_SCRATCH"


def keep_scratch(env: Mapping[str, str] | None = None) -> bool:
    """Whether :data:`KEEP_SCRATCH_ENV` asks to keep scratch folders (``1``, ``true``, ``yes``)."""
    value = (os.environ if env is None else env).get(KEEP_SCRATCH_ENV, "").strip().lower()
    return value in ("1", "true", "yes")


@contextmanager
def scratch_dir(prefix: str, given: str | Path | None = None) -> Iterator[Path]:
    """``given`` (created if missing, never removed), else a fresh ``{prefix}XXXX`` temporary folder
    removed when the block ends in any way, unless :func:`keep_scratch`."""
    if given is not None and str(given) != "":
        path = Path(given)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        if not keep_scratch():
            shutil.rmtree(path, ignore_errors=True)
