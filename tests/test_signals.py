"""Signals: the CLI is spawned, signalled mid-work, and must leave no process and no temp file behind.

Linux only (the checks read /proc, and worker clean-up after ``kill -9`` relies on PR_SET_PDEATHSIG).
"""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; PR_SET_PDEATHSIG is Linux's"),
              pytest.mark.slow]  # spawns CLIs and waits for them: CI and `make test` only

# Sixty capacity points of the bundled Mooncake sample: the pool stays busy for many seconds.
LONG_SWEEP = ["simulate", "--trace", "mooncake-sample", "--systems", "marconi", "--no-per-request", "--quiet",
              "--capacity", ",".join(f"{0.01 + 0.005 * i:.3f}x" for i in range(60)), "--workers", "2"]


def _ppid_and_state(pid: int) -> tuple[int, str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "
    return int(fields[1]), fields[0]


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = _ppid_and_state(int(entry))
            if info is not None:
                children.setdefault(info[0], []).append(int(entry))
    out, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def _alive(pid: int) -> bool:
    info = _ppid_and_state(pid)
    return info is not None and info[1] != "Z"  # a zombie has exited (whoever reaps it)


def _spawn(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "marconi.cli", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_for(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def _assert_all_gone(pids: set[int], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    survivors = sorted(p for p in pids if _alive(p))
    for pid in survivors:  # don't leave them running after a failure
        os.kill(pid, signal.SIGKILL)
    assert not survivors, f"orphaned worker processes survived: {survivors}"


def _workers_of(proc: subprocess.Popen, n: int) -> set[int]:
    def ready():
        if proc.poll() is not None:
            raise AssertionError(f"the CLI exited early ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        pids = _descendants(proc.pid)
        return pids if len(pids) >= n else None
    return _wait_for(ready, 120, f"{n} worker processes")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_signal_during_a_worker_pool_sweep_leaves_no_worker_and_no_output(tmp_path, sig):
    out = tmp_path / "records.jsonl"
    proc = _spawn([*LONG_SWEEP, "--out", str(out)], tmp_path)
    workers = _workers_of(proc, 2)
    time.sleep(0.3)  # let them start on their points
    os.kill(proc.pid, sig)
    code = proc.wait(timeout=60)
    _assert_all_gone(workers | _descendants(proc.pid))
    assert code == (143 if sig == signal.SIGTERM else -signal.SIGKILL)
    if sig == signal.SIGTERM:
        assert "terminated" in proc.stderr.read()
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == []


def test_sigterm_during_a_ray_sweep_shuts_the_local_ray_instance_down(tmp_path):
    """ray.init replaces the driver's SIGTERM handler; the backend restores ours, so the CLI still
    tears down (ray.shutdown) and exits 143. (After kill -9, Ray's own fate-sharing stops raylet, GCS
    and the task workers at once; its dashboard and runtime-env agents notice within about a minute.)"""
    out = tmp_path / "records.jsonl"
    proc = _spawn([*LONG_SWEEP, "--backend", "ray", "--out", str(out)], tmp_path)

    def ray_workers():
        if proc.poll() is not None:
            raise AssertionError(f"the CLI exited early ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        pids = _descendants(proc.pid)
        tasks = [p for p in pids if b"ray::_ray_task" in _cmdline(p)]  # sweep points running
        return pids if len(tasks) >= 2 else None
    started = _wait_for(ray_workers, 180, "Ray task workers")
    time.sleep(0.5)
    everything = started | _descendants(proc.pid)
    os.kill(proc.pid, signal.SIGTERM)
    code = proc.wait(timeout=120)
    _assert_all_gone(everything, timeout_s=30)
    assert code == 143, proc.stderr.read()[-3000:]
    assert not out.exists()


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_sigterm_during_trace_build_leaves_no_temp_file(tmp_path):
    out = tmp_path / "mooncake.jsonl.gz"  # gzip makes the write phase last long enough to hit
    proc = _spawn(["trace", "build", "bundled", "mooncake-sample", "--out", str(out)], tmp_path)

    def temp_file():
        if proc.poll() is not None:
            raise AssertionError(f"trace build exited before writing: {proc.stderr.read()[-2000:]}")
        # the output's own temp file (.mooncake.jsonl.gz.XXXX.tmp), not the --out check's writability probe
        return [p for p in tmp_path.iterdir() if p.name.startswith(f".{out.name}.") and p.name.endswith(".tmp")]
    _wait_for(temp_file, 120, "the hidden temp file of the output")
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    assert list(tmp_path.iterdir()) == []


def test_worker_pool_workers_die_with_a_killed_parent(tmp_path):
    """The tuning grid and the sparse study use the same pool: its workers must not outlive kill -9."""
    script = textwrap.dedent("""
        import sys, time
        from marconi.pool import worker_pool
        with worker_pool(2) as pool:
            futures = [pool.submit(time.sleep, 600) for _ in range(4)]
            print("started", flush=True)
            time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout.readline().strip() == "started"
    workers = _workers_of(proc, 2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    _assert_all_gone(workers)


def test_worker_pool_kills_its_workers_when_the_body_raises():
    from marconi.pool import worker_pool

    with pytest.raises(KeyboardInterrupt):
        with worker_pool(2) as pool:
            futures = [pool.submit(time.sleep, 600) for _ in range(2)]
            workers = _wait_for(lambda: _descendants(os.getpid()) if len(_descendants(os.getpid())) >= 2 else None,
                                30, "2 workers")
            started = time.monotonic()
            raise KeyboardInterrupt  # as Ctrl-C or SIGTERM (Terminated) would, mid-sweep
    assert time.monotonic() - started < 30  # not waiting for the 600 s tasks
    _assert_all_gone(workers)
    assert all(f.cancelled() or f.done() for f in futures)
