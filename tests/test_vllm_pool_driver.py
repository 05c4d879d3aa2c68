"""The randomised pool driver (``tests/vllm_peer/pool_driver.py``) on vLLM 0.32 and on 0.33.

Each run drives one real vLLM ``BlockPool`` with the plugin's hooks for 300 steps and checks ref
counts, the free queue, the hash map and the plugin's index after every step. In ``marconi`` mode
the plugin's victims must differ from LRU's (else nothing of its choice was exercised); in ``lru``
mode it must choose none. With ``--twin`` (lru mode) a stock pool beside it must stay the same pool
after every step. 0.32 is ``.venv-vllm`` (``make vllm-env``; a failure when missing under
``MARCONI_REQUIRE_VLLM=1``, as in ``tests/test_vllm_e2e.py``), 0.33 the overlay
``.venv-vllm033`` (``make vllm033-env``; skipped when missing).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from vllm_env import vllm_python

pytestmark = pytest.mark.slow  # eight vLLM subprocesses (~30 s each on 2 busy cores): CI and `make test` only

REPO = Path(__file__).resolve().parents[1]



@pytest.mark.parametrize("series", ["0.32", "0.33"])
@pytest.mark.parametrize("mode", ["lru", "marconi"])
def test_pool_driver(series: str, mode: str) -> None:
    python = vllm_python(series)
    proc = subprocess.run([python, str(REPO / "tests" / "vllm_peer" / "pool_driver.py"), "--mode", mode,
                           "--steps", "300", "--seed", "1"], capture_output=True, text=True, timeout=600,
                          env={k: v for k, v in os.environ.items() if not k.startswith("MARCONI_VLLM_")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert counts["vllm"].startswith(series)
    assert counts["steps"] == 300 and counts["admitted"] > 50 and counts["finished"] > 50
    if mode == "marconi":
        assert counts["victims"] > 50 and counts["victims_not_lru"] > counts["victims"] // 4, counts
    else:
        assert counts["victims"] == 0, counts


@pytest.mark.parametrize("series", ["0.32", "0.33"])
@pytest.mark.parametrize("scale", [1, 3])
def test_hooked_pool_stays_the_stock_pool_step_by_step(series: str, scale: int) -> None:
    """``--twin``: the hooks re-implement ``free_blocks``, ``touch``, ``cache_full_blocks`` and
    ``cache_partial_block`` (each series' own, the null block and a block mask included); in lru
    mode a stock pool driven beside the hooked one must be the same pool after every step. At
    ``--scale 3`` a block is three hash blocks: requests end inside blocks (partial entries), grow
    (deeper partial entries) and fill their last block (promotion)."""
    python = vllm_python(series)
    proc = subprocess.run([python, str(REPO / "tests" / "vllm_peer" / "pool_driver.py"), "--mode", "lru", "--twin",
                           "--scale", str(scale), "--steps", "300", "--seed", "2"], capture_output=True, text=True,
                          timeout=600, env={k: v for k, v in os.environ.items() if not k.startswith("MARCONI_VLLM_")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert counts["vllm"].startswith(series) and counts["twin"] is True
    assert counts["admitted"] > 50 and counts["finished"] > 50 and counts["hit_blocks"] > 100, counts
    if scale > 1:
        assert counts["partial"] > 30 and counts["promoted"] > 10, counts
