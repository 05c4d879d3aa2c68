"""Adaptive α with its shadow replayed in a child process at lag 0 (``MARCONI_VLLM_ADAPTIVE_REPLAY=process``)
makes the inline replay's choices inside vLLM's own scheduler: the same hits, evictions by reason and
rule switches (issue 33: the replay leaves the scheduler thread, the choices stay exact)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from vllm_env import REPO, vllm_python

SCRIPT = """
import json, os, sys
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
import numpy as np
from marconi.integrations.vllm.config import PluginConfig
from marconi.integrations.vllm.plugin import attach_hooks
from marconi.integrations.vllm.replay.engine import build_engine_core
from marconi.integrations.vllm.replay.run import model_dir
from marconi.integrations.vllm.replay.worker import replay

num_blocks, tokens = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(0)
requests, history = [], [[] for _ in range(16)]
per_turn = tokens // (16 * 10)
for turn in range(4):
    for s in range(16):
        prompt = history[s] + rng.integers(1, 32000, size=per_turn).tolist()
        output = rng.integers(1, 32000, size=8).tolist()
        requests.append({"session": s, "prompt": prompt, "output": output})
        history[s] = prompt + output
out = {}
for place in ("inline", "process"):
    core = build_engine_core(str(model_dir("nemotron-h-8b")), num_blocks=num_blocks, max_model_len=1 << 16,
                             max_num_batched_tokens=8192, max_num_seqs=256)
    hooks = attach_hooks(core.scheduler, PluginConfig(policy="marconi", alpha="adaptive", mamba2_cpu_fix=False,
                                                      adaptive_replay=place))
    core.scheduler._marconi = hooks          # where the replay reads the plugin's counters
    source = hooks.state.alpha_source
    assert source.settles_lazily == (place == "process")
    result = replay(core, requests, gpu="h100", concurrency=8, rate=None)
    out[place] = {"hits": result["prefix_cache_hits"], "evictions": result["plugin_evictions"],
                  "switches": source.tuning_record()["rule_switches"], "alpha_changes": hooks.num_alpha_changes}
    source.close()
# unset, the place is default_replay's: a process wherever this process may use two CPUs
from marconi.integrations.vllm.config import default_replay
core = build_engine_core(str(model_dir("nemotron-h-8b")), num_blocks=num_blocks, max_model_len=1 << 16,
                         max_num_batched_tokens=8192, max_num_seqs=256)
source = attach_hooks(core.scheduler, PluginConfig(policy="marconi", alpha="adaptive",
                                                   mamba2_cpu_fix=False)).state.alpha_source
out["unset"] = {"lazy": source.settles_lazily, "pid": source.replay_pid is not None, "default": default_replay(0)}
source.close()
print(json.dumps(out))
"""


def test_the_process_replay_makes_the_inline_choices_in_vllms_scheduler(tmp_path: Path) -> None:
    python = vllm_python("0.32")
    script = tmp_path / "check.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([python, str(script), "200", "600000"], capture_output=True, text=True, timeout=600,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    inline, process = got["inline"], got["process"]
    assert len(inline["switches"]) >= 2, "the shadow never switched: the trace is not contended enough"
    assert sum(inline["evictions"].values()) > 0 and inline["hits"] > 0
    assert process == inline
    # an operator who leaves MARCONI_VLLM_ADAPTIVE_REPLAY unset gets default_replay's place: on two
    # CPUs or more (CI's machines) the child process, read lazily, whose choices are the ones above
    unset = got["unset"]
    assert unset["lazy"] == unset["pid"] == (unset["default"] == "process")
