"""Where the tests find SGLang: one rule for every test that runs code in the SGLang environment.

``make test`` builds ``.venv-sglang`` (SGLang 0.5.23, CPU) and sets ``MARCONI_REQUIRE_SGLANG=1``, so
there a missing environment is a failure, never a quiet skip; elsewhere those tests skip, saying how to
build it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SGLANG_PYTHON = os.environ.get("MARCONI_SGLANG_PYTHON") or str(REPO / ".venv-sglang" / "bin" / "python")
REQUIRED = os.environ.get("MARCONI_REQUIRE_SGLANG") == "1"


def sglang_python() -> str:
    """The SGLang environment's python, or skip (fail under MARCONI_REQUIRE_SGLANG=1)."""
    if not Path(SGLANG_PYTHON).is_file():
        message = f"no SGLang environment at {SGLANG_PYTHON}"
        if REQUIRED:
            pytest.fail(message + ": run `make sglang-env` (MARCONI_REQUIRE_SGLANG=1 makes this a failure, not a skip)")
        pytest.skip(message + ": run `make sglang-env` (make test builds it)")
    return SGLANG_PYTHON


def run_in_sglang(script: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``script`` in the SGLang environment (repo root as cwd); fails the test on a non-zero exit."""
    proc = subprocess.run([sglang_python(), "-W", "ignore", "-c", script], capture_output=True, text=True,
                          cwd=REPO, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc
