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


#: Builds Marconi's tier policy as vLLM's connector does (``MarconiCachePolicy(capacity)`` under an
#: ``OffloadingSpec`` holding ``kv_connector_extra_config``) once per (environment, extra config) case,
#: the ``MARCONI_TIER*`` variables cleared between cases; prints one JSON list of answers.
_CONNECTOR_CASES = """\
import json, os, sys
from vllm.v1.kv_offload.base import OffloadingSpec
from marconi.core.registry import ConfigError
from marconi.integrations.vllm.tier import MarconiCachePolicy

class Spec(OffloadingSpec):        # what vLLM's factory has on the stack when it loads the policy
    get_manager = get_worker = lambda self, *a: None
    def __init__(self, extra):
        self.extra_config = extra; self.tokens_per_block = [16]; self.blocks_per_chunk = 1

def build(spec):                   # the spec in a caller's frame, where the policy looks for it
    return MarconiCachePolicy(8)

out = []
for env, extra in json.loads(sys.argv[1]):
    for k in [k for k in os.environ if k.startswith("MARCONI_TIER")]:
        del os.environ[k]
    os.environ.update(env)
    try:
        build(Spec(extra))
        out.append("accepted")
    except ConfigError as exc:
        out.append("ConfigError: " + str(exc))
    except Exception as exc:
        out.append(type(exc).__name__ + ": " + str(exc))
print(json.dumps(out))
"""


def connector_answers(cases: list[tuple[dict[str, str], dict]]) -> list[str]:
    """For each ``(environment, kv_connector_extra_config)`` case, what building the tier policy the
    way vLLM's connector does gave, in vLLM 0.32's environment (skipped or failed as
    :func:`vllm_python`): ``"accepted"``, ``"ConfigError: <message>"`` or ``"<Exception>: <message>"``.
    The ``MARCONI_*`` variables of this process are not passed on."""
    import json
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("MARCONI_")}
    proc = subprocess.run([vllm_python(), "-c", _CONNECTOR_CASES, json.dumps(cases)], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
