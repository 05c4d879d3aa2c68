"""Start and stop a real vLLM OpenAI-compatible server (in the vLLM environment) from the main one.

The server is ``python -m vllm.entrypoints.openai.api_server`` (vLLM 0.32's ``vllm`` console
script fails without package metadata named ``vllm``), bound to 127.0.0.1, with prefix caching,
token-id prompts (``--skip-tokenizer-init``), per-request cached-token counts
(``--enable-prompt-tokens-details``) and a fixed block pool (``--num-gpu-blocks-override``) so the
capacity is the same for every run. CPU timings are only stable with one OpenMP thread and no
binding, so those variables are set. ``PROMETHEUS_MULTIPROC_DIR`` gets a fresh directory, so the
engine core's Marconi counters reach ``/metrics``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

__all__ = ["ServerConfig", "VllmServer", "ServerError", "parse_metrics", "free_port", "CPU_TIMING_ENV"]

# CPU timings were stable only with these (measured on this project's 2-core machines).
CPU_TIMING_ENV = {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "KMP_BLOCKTIME": "0"}


class ServerError(RuntimeError):
    """The server did not start, or died; the message quotes the end of its log."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """One server launch. ``plugin_env``: the ``MARCONI_VLLM_*`` variables (empty: stock vLLM,
    with the plugin not even loaded, via ``VLLM_PLUGINS=''``)."""

    python: str
    model_dir: str
    num_blocks: int
    max_model_len: int = 8192
    max_num_batched_tokens: int = 2048
    block_size: int | None = None
    prefix_match_unit: int | None = None
    retention_interval: int | None = 0
    max_num_seqs: int = 8
    plugin_env: Mapping[str, str] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()

    def args(self, port: int) -> list[str]:
        args = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model_dir,
                "--host", "127.0.0.1", "--port", str(port), "--skip-tokenizer-init", "--enable-prefix-caching",
                "--enable-prompt-tokens-details", "--dtype", "bfloat16", "--max-model-len", str(self.max_model_len),
                "--max-num-batched-tokens", str(self.max_num_batched_tokens), "--max-num-seqs", str(self.max_num_seqs),
                "--num-gpu-blocks-override", str(self.num_blocks), "--gpu-memory-utilization", "0.1",
                "--disable-uvicorn-access-log"]
        if self.block_size is not None:
            args += ["--block-size", str(self.block_size)]
        if self.prefix_match_unit is not None:
            args += ["--prefix-match-unit", str(self.prefix_match_unit)]
        if self.retention_interval != 0:
            args += ["--prefix-cache-retention-interval",
                     "None" if self.retention_interval is None else str(self.retention_interval)]
        return args + list(self.extra_args)


class VllmServer:
    """A running server; use as a context manager (stopped, process group and all, on exit)."""

    def __init__(self, config: ServerConfig, *, log_path: str | Path, startup_timeout_s: float = 600.0) -> None:
        self.config = config
        self.log_path = Path(log_path)
        self.startup_timeout_s = startup_timeout_s
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._prom_dir: str | None = None
        self.startup_s = 0.0

    def __enter__(self) -> "VllmServer":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        if not Path(self.config.python).is_file():
            raise ServerError(f"no vLLM python at {self.config.python}: run `make vllm-env` (or pass --vllm-python)")
        self._prom_dir = tempfile.mkdtemp(prefix="marconi-prom-")
        env = {k: v for k, v in os.environ.items() if not k.startswith("MARCONI_VLLM_")}
        env.update(CPU_TIMING_ENV)
        env["PROMETHEUS_MULTIPROC_DIR"] = self._prom_dir
        env.update(self.config.plugin_env)
        if not self.config.plugin_env:
            env["VLLM_PLUGINS"] = ""          # stock: vLLM loads no general plugin at all
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        started = time.perf_counter()
        self._proc = subprocess.Popen(self.config.args(self.port), stdout=log, stderr=subprocess.STDOUT, env=env,
                                      start_new_session=True)
        log.close()
        try:
            self._wait_healthy(started)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.perf_counter() - started

    def _wait_healthy(self, started: float) -> None:
        import httpx

        while True:
            if self._proc is not None and self._proc.poll() is not None:
                raise ServerError(f"vLLM server exited with code {self._proc.returncode} while starting; "
                                  f"log {self.log_path}:\n{self.log_tail()}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.perf_counter() - started > self.startup_timeout_s:
                raise ServerError(f"vLLM server not healthy after {self.startup_timeout_s:.0f} s; log "
                                  f"{self.log_path}:\n{self.log_tail()}")
            time.sleep(1.0)

    def check_alive(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            raise ServerError(f"vLLM server died; log {self.log_path}:\n{self.log_tail()}")

    def log_tail(self, num_lines: int = 40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-num_lines:])

    def metrics(self) -> dict[str, float]:
        import httpx

        return parse_metrics(httpx.get(self.base_url + "/metrics", timeout=30.0).text)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=60)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=30)
        if self._prom_dir is not None:
            shutil.rmtree(self._prom_dir, ignore_errors=True)
            self._prom_dir = None


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
