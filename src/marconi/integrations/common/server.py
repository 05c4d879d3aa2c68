"""An engine's HTTP server as a child process: start, wait until healthy, read metrics, stop.

An engine supplies a :class:`Launch` (command line and environment); :class:`ServerProcess` does the
rest: a free port on 127.0.0.1, the log to a file, its own process session (stopping it stops all
it forked; it dies with the command, even after ``kill -9``), ``GET /health`` until 200,
``GET /metrics`` by :func:`parse_metrics`, and a fresh scratch folder per start, removed at stop:
``PROMETHEUS_MULTIPROC_DIR`` in it (so counters from the engine's other processes reach
``/metrics``), and ``TMPDIR`` too, so what the engine leaves in the temporary folder goes with it
(vLLM: a ZMQ socket per engine connection, a ``vllm_dist_*`` store per worker). Torch's compile
cache stays where it was (``TORCHINDUCTOR_CACHE_DIR``, unless already set), so servers still share it.
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Protocol, Self

__all__ = ["Launch", "ServerProcess", "ServerError", "parse_metrics", "free_port"]


class ServerError(RuntimeError):
    """The server did not start, or died; the message quotes the end of its log."""


class Launch(Protocol):
    """How to start one server: its command line on ``port``, and the environment it runs in
    (called at each start, so it may read ``os.environ`` then)."""

    def args(self, port: int) -> list[str]:
        ...

    def environment(self) -> Mapping[str, str]:
        ...


def _inductor_cache_dir(env: Mapping[str, str]) -> str:
    """Where torch's compile cache goes for a process started with ``env`` when
    ``TORCHINDUCTOR_CACHE_DIR`` is unset (torch's own default: ``torchinductor_<user>`` in the
    temporary folder ``env``'s ``TMPDIR`` names, else this process's)."""
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):          # no name for this uid: torch's fallback
        user = f"uid_{os.getuid()}"
    user = re.sub(r'[\\/:*?"<>|]', "_", user)
    return os.path.join(env.get("TMPDIR") or tempfile.gettempdir(), "torchinductor_" + user)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """A running server; as a context manager it is stopped, process group and all, on exit.
    ``log_path`` gets its stdout and stderr (overwritten); :meth:`start` waits up to
    ``startup_timeout_s`` for ``/health``; ``name`` is how errors name it (``"vLLM server"``).
    """

    def __init__(self, launch: Launch, *, log_path: str | Path, startup_timeout_s: float = 600.0,
                 name: str = "server") -> None:
        self.launch = launch
        self.log_path = Path(log_path)
        self.startup_timeout_s = startup_timeout_s
        self.name = name
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._scratch: str | None = None
        self._started = 0.0
        self.startup_s = 0.0

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        """Launch the server and wait until it is healthy (ServerError, with the log's end, if it
        exits first or the timeout passes; the process is stopped then)."""
        self.spawn()
        self.wait_healthy()

    def spawn(self) -> None:
        """Launch the server (:func:`marconi.pool.spawn`: it dies with this process). Call it from a
        thread that outlives the server (the death signal follows the spawning thread), then
        :meth:`wait_healthy`, which any thread may run."""
        from marconi.pool import spawn

        self._scratch = scratch = tempfile.mkdtemp(prefix="marconi-server-")
        env = dict(self.launch.environment())
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", _inductor_cache_dir(env))
        for var, sub in (("PROMETHEUS_MULTIPROC_DIR", "prom"), ("TMPDIR", "tmp")):
            env[var] = os.path.join(scratch, sub)
            os.mkdir(env[var])
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._started = time.perf_counter()
        try:
            with self.log_path.open("wb") as log:
                self._proc = spawn(self.launch.args(self.port), stdout=log, stderr=subprocess.STDOUT, env=env)
        except BaseException:
            self.stop()
            raise

    def wait_healthy(self) -> None:
        """Wait until the spawned server answers ``/health`` (see :meth:`start`)."""
        try:
            self._wait_healthy(self._started)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.perf_counter() - self._started

    def _wait_healthy(self, started: float) -> None:
        import httpx

        while True:
            if self._proc is not None and self._proc.poll() is not None:
                raise ServerError(f"{self.name} exited with code {self._proc.returncode} while starting; "
                                  f"log {self.log_path}:\n{self.log_tail()}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.perf_counter() - started > self.startup_timeout_s:
                raise ServerError(f"{self.name} not healthy after {self.startup_timeout_s:.0f} s; log "
                                  f"{self.log_path}:\n{self.log_tail()}")
            time.sleep(1.0)

    @property
    def pid(self) -> int | None:
        """The server process's pid (None before :meth:`spawn` and after :meth:`stop`)."""
        return None if self._proc is None else self._proc.pid

    def check_alive(self) -> None:
        """ServerError (with the log's end) if the server is not running."""
        if self._proc is None or self._proc.poll() is not None:
            raise ServerError(f"{self.name} died; log {self.log_path}:\n{self.log_tail()}")

    def log_tail(self, num_lines: int = 40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-num_lines:])

    def metrics(self) -> dict[str, float]:
        """The server's ``/metrics`` now (see :func:`parse_metrics`)."""
        import httpx

        return parse_metrics(httpx.get(self.base_url + "/metrics", timeout=30.0).text)

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after 60 s (:func:`marconi.pool.stop`); idempotent."""
        from marconi.pool import stop

        proc, self._proc = self._proc, None
        if proc is not None:
            stop(proc, grace_s=60.0)
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> ``{"name{labels}": value}``; labels kept verbatim except ``engine`` and
    ``model_name`` (dropped), samples with equal keys summed."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        if labels:
            kept = [p for p in re.findall(r'(\w+="[^"]*")', labels)
                    if not p.startswith(("engine=", "model_name="))]
            labels = "{" + ",".join(sorted(kept)) + "}" if kept else ""
        try:
            out[name + labels] = out.get(name + labels, 0.0) + float(value)
        except ValueError:
            continue
    return out
