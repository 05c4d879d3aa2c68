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

Every command that starts another program (the vLLM replay's worker, vLLM and SGLang benches,
their servers, the environment probes) does it through one helper, so every child dies with the
command (issue 31, bug 11: a SIGTERM to ``marconi vllm replay`` left its vLLM worker running):

* :func:`spawn` starts the child through a tiny launcher that asks Linux to SIGKILL it when the
  spawning thread dies (``PR_SET_PDEATHSIG``, kept across ``exec``; the launcher also exits if
  the parent is already gone), in a process group of its own (so stopping it stops whatever it
  forked, and Ctrl-C at a terminal reaches only the command, which decides). No ``preexec_fn``:
  the launcher is a separate ``exec``, safe with threads in the parent. :func:`stop` ends the
  group (SIGTERM, then SIGKILL after a grace period);
* :func:`child_process` is :func:`spawn` as a context manager: on any exit of the ``with`` body
  (an error, Ctrl-C, :class:`Terminated`) the child's group is stopped; :func:`run_child` is
  ``subprocess.run`` through it.
* :func:`scratch_dir` is a temporary folder that goes on success, on error and on interruption
  (bug 12: replay and frontier runs left ``/tmp/marconi-replay-*`` holding the whole trace), unless
  :data:`KEEP_SCRATCH_ENV` (``MARCONI_KEEP_SCRATCH=1``) asks to keep it for debugging.

``PR_SET_PDEATHSIG`` follows the *thread* that spawned: spawn from a thread that outlives the
child (the main thread, a pool worker's), never from a short-lived helper thread. Off Linux there
is no death signal: a ``kill -9`` of the command can leave a child behind.
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
    """Start ``args`` as a child that dies with this process (see the module docstring).

    The child is the leader of a new process group (``start_new_session``); the other arguments
    are :class:`subprocess.Popen`'s. ``proc.pid`` is the child's own pid (the launcher replaces itself
    with it). If the program cannot be executed the child exits with :data:`EXEC_FAILED` and says why on
    its stderr. Stop it with :func:`stop` (or use :func:`child_process`).
    """
    if not args:
        raise ValueError("spawn: no command")
    cmd = [sys.executable, "-I", "-S", "-c", _LAUNCHER, str(os.getpid()), *map(str, args)]
    return subprocess.Popen(cmd, env=None if env is None else dict(env), cwd=cwd, stdin=stdin, stdout=stdout,
                            stderr=stderr, text=text, start_new_session=True)


def stop(proc: subprocess.Popen[Any], grace_s: float = 10.0) -> int | None:
    """End ``proc``'s process group: SIGTERM, then SIGKILL after ``grace_s``; reap ``proc``.

    Idempotent. Processes the child forked into its group stop with it, even when the child has
    already exited. Returns ``proc``'s exit status (None if it could not be reaped).
    """
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
    """:func:`spawn` for the ``with`` body; on leaving it, however (an error, Ctrl-C, SIGTERM
    under :func:`sigterm_raises`), the child's group is stopped (:func:`stop`). A child the body
    waited for is only reaped; whatever it left in its group is killed."""
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
    """``subprocess.run(args, capture_output=True)`` through :func:`child_process`: the child dies
    with this process and is stopped on any exception here (``subprocess.TimeoutExpired`` after
    ``timeout_s``)."""
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
    """A working folder: ``given`` if the caller named one (created if missing, never removed:
    it is theirs), else a fresh temporary folder ``{prefix}XXXX`` that is removed when the block
    ends, on success, on error and on interruption, unless :func:`keep_scratch` (then it stays,
    for debugging, and the caller may say where)."""
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
