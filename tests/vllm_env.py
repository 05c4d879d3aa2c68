"""Where the tests find vLLM: one rule for every test that runs code in a vLLM environment.

``make test`` builds ``.venv-vllm`` (vLLM 0.32, CPU) and the 0.33 overlay (``make vllm033-env``) and
sets ``MARCONI_REQUIRE_VLLM=1``, so there a missing environment is a failure, never a quiet skip.
Elsewhere (a developer's ``pytest``) the cases of a missing environment skip, saying how to build it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = os.environ.get("MARCONI_VLLM_PYTHON") or str(REPO / ".venv-vllm" / "bin" / "python")
REQUIRED = os.environ.get("MARCONI_REQUIRE_VLLM") == "1"
PYTHONS = {"0.32": VLLM_PYTHON, "0.33": str(REPO / ".venv-vllm033" / "bin" / "python")}


def vllm_python(series: str = "0.32") -> str:
    """The python of the vLLM ``series`` environment, or skip (fail under MARCONI_REQUIRE_VLLM=1)."""
    python = PYTHONS[series]
    if not Path(python).is_file():
        message = f"no vLLM {series} environment at {python}"
        if REQUIRED:
            build = "make vllm-env" if series == "0.32" else "make vllm033-env"
            pytest.fail(message + f": run `{build}` (MARCONI_REQUIRE_VLLM=1 makes this a failure, not a skip)")
        pytest.skip(message + (": run `make vllm-env` (make test builds it)" if series == "0.32"
                               else ": run `make vllm033-env`"))
    return python


def require_vllm() -> None:
    """Skip (or, under MARCONI_REQUIRE_VLLM=1, fail) where the vLLM 0.32 environment is absent."""
    vllm_python("0.32")


def build_tiny_model(model_dir: Path) -> Path:
    """The bundled tiny Qwen3-Next (random weights) written to ``model_dir`` by vLLM's environment,
    as the real-server tests serve it; fails the test with the builder's stderr if it cannot."""
    import subprocess

    proc = subprocess.run([VLLM_PYTHON, "-m", "marconi.integrations.vllm.models", "qwen3_next-tiny", str(model_dir)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return model_dir
