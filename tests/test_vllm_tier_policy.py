"""Marconi's policy for vLLM's CPU offload tier (marconi.integrations.vllm.tier), inside vLLM 0.32 and 0.33.

The checks live in ``tests/vllm_tier/cases.py`` (it imports vLLM, so it runs in the vLLM
environment as a subprocess: one process for all cases, each asserted here):

* the policy loads in a plain vLLM process from ``kv_connector_extra_config`` alone: vLLM's
  ``EngineCore`` (stub executor) builds the ``OffloadingConnector``, whose spec builds vLLM's own
  ``CPUOffloadingManager``, whose ``CachePolicyFactory`` loads the class by module path; the policy
  learns the groups (6 Mamba + 1 attention for Nemotron-H-8B), the 1,152-token chunk and the model;
* an attention-only model is refused through the same path, naming ``eviction_policy``;
* the tree's logic: a KV tail past the deepest state and a state without its KV are dead and go
  first; a state with two KV children and an inner KV chunk are no candidates; a running request's
  KV is not dead until it ends; a large α keeps the deep prefix LRU would drop; ``evict`` is atomic;
  its victim-by-victim update of the tree equals a pass from scratch after every removal;
* a randomised driver runs vLLM's manager with LRU and with Marconi on the same requests (shared
  prefixes, loads, delayed and failed stores), checks ref counts, chunk ids, free and evictable
  chunks after every step, and asserts Marconi's evictions differ from LRU's in every run.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from vllm_env import vllm_python

CASES = Path(__file__).resolve().parent / "vllm_tier" / "cases.py"


@pytest.fixture(scope="module", params=["0.32", "0.33"])
def results(request: pytest.FixtureRequest) -> dict[str, str]:
    python = vllm_python(request.param)     # 0.33 passes the storing request's context to insert
    proc = subprocess.run([python, str(CASES)], capture_output=True, text=True, timeout=900,
                          env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1",
                               **{k: v for k, v in os.environ.items() if not k.startswith("MARCONI_")}})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", [
    "loads_through_vllms_connector_from_extra_config_alone",
    "connector_refuses_a_model_without_states",
    "dead_kv_tail_goes_first",
    "state_without_its_kv_is_dead",
    "branch_point_state_kept_while_two_children_continue",
    "running_request_kv_is_not_dead_until_it_ends",
    "alpha_keeps_the_deep_prefix",
    "evict_is_atomic",
    "incremental_standing_equals_a_fresh_pass",
    "refusals_name_the_key",
    "load_cost_clips_worthless_hits",
    "randomised_driver_differs_from_lru",
    "reset_cache_makes_a_running_requests_scratch_stale",
    "connector_refuses_group_kinds_unlike_vllms",
    "a_store_retried_after_failing_for_room_learns_its_depth",
    "store_threshold_filter_equals_the_emulation",
])
def test_tier_policy(results: dict[str, str], case: str) -> None:
    assert case in results, f"case {case} did not run: {sorted(results)}"
    assert results[case] == "ok", results[case]
