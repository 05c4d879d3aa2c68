"""A real vLLM OpenAI-compatible server (in the vLLM environment), started from the main one.

:class:`ServerConfig` is vLLM's launch (``vllm.entrypoints.openai.api_server`` on 127.0.0.1, prefix
caching, token-id prompts, per-request cached-token counts, a fixed block pool, one OpenMP thread);
:class:`~marconi.integrations.common.server.ServerProcess` runs it. It inherits no ``MARCONI_VLLM_*``
variable but :attr:`ServerConfig.plugin_env`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from marconi.integrations.common.server import ServerError, ServerProcess

__all__ = ["ServerConfig", "VllmServer", "CPU_TIMING_ENV"]

# CPU timings were stable only with these (measured on this project's 2-core machines).
CPU_TIMING_ENV = {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "KMP_BLOCKTIME": "0"}


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """One server launch (a :class:`~marconi.integrations.common.server.Launch`). ``plugin_env``: the
    ``MARCONI_VLLM_*`` variables (empty: stock vLLM, with the plugin not even loaded, via
    ``VLLM_PLUGINS=''``)."""

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

    def environment(self) -> dict[str, str]:
        """This process's environment without its ``MARCONI_VLLM_*`` variables, plus the CPU timing
        settings, ``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1`` (as the replay sets it: a trace's prompt and
        output may pass a config's positions, 8,192 in the bundled Nemotron-H-8B's, which vLLM
        0.33 refuses without it) and ``plugin_env``."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("MARCONI_VLLM_")}
        env.update(CPU_TIMING_ENV)
        env["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"
        env.update(self.plugin_env)
        if not self.plugin_env:
            env["VLLM_PLUGINS"] = ""          # stock: vLLM loads no general plugin at all
        return env


class VllmServer(ServerProcess):
    """A running vLLM server; use as a context manager (see
    :class:`~marconi.integrations.common.server.ServerProcess`)."""

    def __init__(self, config: ServerConfig, *, log_path: str | Path, startup_timeout_s: float = 600.0) -> None:
        super().__init__(config, log_path=log_path, startup_timeout_s=startup_timeout_s, name="vLLM server")
        self.config = config

    def spawn(self) -> None:
        """ServerError at once if the vLLM environment's python is missing; else as the base class
        (:meth:`start` and :func:`~marconi.integrations.common.bench.serve_side_by_side` both spawn here)."""
        if not Path(self.config.python).is_file():
            raise ServerError(f"no vLLM python at {self.config.python}: run `make vllm-env` (or pass --vllm-python)")
        super().spawn()
