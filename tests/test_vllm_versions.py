"""The plugin's supported vLLM versions: an explicit list, refused whole outside it, verified per series.

* :func:`supported_vllm` accepts the 0.32 and 0.33 series only;
* on any other version :func:`register` logs one line and installs nothing (no hook, no CPU fix);
* in each vLLM environment present (0.32: ``.venv-vllm``; 0.33: the ``.venv-vllm033`` overlay),
  every method the hooks wrap has the signature the hooks call it with, and the methods whose
  code the hooks re-implement or rely on line by line (``get_new_blocks``' tail, the eviction
  and hash-map internals, ``cache_full_blocks`` less its KV events) are the same code in 0.33 as
  in 0.32. ``free_blocks`` and ``touch`` differ between the two (0.33 skips the null block), so
  the hooks re-implement each series' own, checked against a stock pool per series by the pool
  driver's ``--twin`` run (``tests/test_vllm_pool_driver.py``). A new series joins
  ``SUPPORTED_VLLM`` only when both pass on it;
* a pool lacking a method the hooks' own code calls is refused when the hooks are built.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import types

import pytest

from pathlib import Path

from marconi.integrations.vllm import plugin
from vllm_env import vllm_python

REPO = Path(__file__).resolve().parents[1]


WRAPPED = ("free_blocks", "touch", "cache_full_blocks", "cache_partial_block", "reset_prefix_cache", "unpin_blocks",
           "get_num_free_blocks")
SAME_CODE = ("get_new_blocks", "_maybe_evict_cached_block", "_insert_block_hash", "_remove_cached_block_hashes",
             "move_block_hashes", "_notify_reuse")
# Re-implemented but for their trailing ``if self.enable_kv_cache_events:`` block (the hooks call
# vLLM's own method where events are on): compared without it.
SAME_CODE_BUT_EVENTS = ("cache_full_blocks",)
PROBE = f"""
import ast, inspect, json, textwrap, vllm
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.sched.scheduler import Scheduler
out = {{"version": vllm.__version__, "signatures": {{}}, "code": {{}}}}
for owner, names in ((BlockPool, {WRAPPED + SAME_CODE!r}), (KVCacheManager, ("record_prefix_cache_stats", "allocate_slots")),
                     (Scheduler, ("_free_request",))):
    for name in names:
        f = getattr(owner, name)
        out["signatures"][owner.__name__ + "." + name] = str(inspect.signature(f))
for name in {SAME_CODE!r}:
    out["code"][name] = ast.dump(ast.parse(textwrap.dedent(inspect.getsource(getattr(BlockPool, name)))))
for name in {SAME_CODE_BUT_EVENTS!r}:
    tree = ast.parse(textwrap.dedent(inspect.getsource(getattr(BlockPool, name))))
    body = tree.body[0].body
    last = body[-1]
    assert isinstance(last, ast.If) and "enable_kv_cache_events" in ast.unparse(last.test), ast.unparse(last.test)
    tree.body[0].body = body[:-1]
    out["code"][name] = ast.dump(tree)
print(json.dumps(out))
"""


@pytest.mark.parametrize("version, ok", [("0.32.0", True), ("0.32.1rc1", True), ("0.32.0+cpu", True), ("0.33.0", True),
                                         ("0.33.2.dev4+g1a2b", True), ("0.34.0", False), ("0.3.2", False),
                                         ("0.31.9", False), ("1.0.0", False), ("0.330.0", False)])
def test_supported_versions(version: str, ok: bool) -> None:
    assert plugin.supported_vllm(version) is ok


@pytest.mark.parametrize("policy", ["marconi", None])
def test_unknown_version_installs_nothing(policy: str | None, monkeypatch: pytest.MonkeyPatch,
                                          caplog: pytest.LogCaptureFixture) -> None:
    installed = []
    monkeypatch.setattr(plugin, "_install_scheduler_hook", lambda config: installed.append("hooks"))
    monkeypatch.setattr(plugin, "_install_mamba2_cpu_fix", lambda: installed.append("cpu fix"))
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.34.0"))
    for name in [k for k in os.environ if k.startswith("MARCONI_VLLM_")]:
        monkeypatch.delenv(name)
    if policy:
        monkeypatch.setenv("MARCONI_VLLM_POLICY", policy)
    plugin.reset_registration()
    try:
        with caplog.at_level(logging.WARNING, logger="marconi.integrations.vllm"):
            plugin.register()
    finally:
        plugin.reset_registration()
    assert installed == []
    [record] = [r for r in caplog.records if "not a supported version" in r.getMessage()]
    assert record.levelno == (logging.ERROR if policy else logging.WARNING)
    assert "0.34.0" in record.getMessage() and "0.32.x, 0.33.x" in record.getMessage()
    assert "runs stock" in record.getMessage()


def _probe(series: str) -> dict:
    proc = subprocess.run([vllm_python(series), "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_hooked_methods_match_across_series() -> None:
    old = _probe("0.32")
    assert plugin.supported_vllm(old["version"])
    new = _probe("0.33")
    assert new["version"].startswith("0.33") and plugin.supported_vllm(new["version"])
    assert new["signatures"] == old["signatures"]
    changed = [name for name in SAME_CODE + SAME_CODE_BUT_EVENTS if new["code"][name] != old["code"][name]]
    assert not changed, f"vLLM 0.33 changed {changed}: re-verify the hooks before supporting it"


READS_PROBE = """
import json
from types import SimpleNamespace
from vllm.v1.core.block_pool import BlockPool
from marconi.core.model import get_model
from marconi.integrations.vllm.config import PluginConfig
from marconi.integrations.vllm.plugin import PoolHooks
from marconi.integrations.vllm.policy import ATTENTION
del BlockPool._get_partial_block_hash            # a vLLM whose pool lacks what the hooks call
pool = BlockPool(num_gpu_blocks=8, enable_caching=True, hash_block_size=16)
kv = SimpleNamespace(block_pool=pool, record_prefix_cache_stats=None, allocate_slots=None)
try:
    PoolHooks.for_pool(kv, (ATTENTION,), get_model("paper-7b"), 16, PluginConfig(policy="marconi"))
except AttributeError as exc:
    print(json.dumps(str(exc)))
"""


@pytest.mark.slow  # one vLLM import (~15 s)
def test_a_pool_without_what_the_hooks_call_is_refused_at_attach() -> None:
    """The hooks' own code calls vLLM private pool methods (``_get_partial_block_hash`` in
    ``cache_partial_block``): a vLLM without one is refused when the hooks are built, naming it,
    not mid-run at the first partial block."""
    proc = subprocess.run([vllm_python("0.32"), "-c", READS_PROBE], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    message = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "'_get_partial_block_hash'" in message and "0.32.x, 0.33.x" in message, message
