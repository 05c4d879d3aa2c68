"""``marconi vllm replay --cpu-tier``: vLLM's OffloadingConnector in the replay, hits split by tier.

The replay test needs the vLLM environment (``make vllm-env``), as ``tests/test_vllm_replay.py``'s do:
under ``MARCONI_REQUIRE_VLLM=1`` a missing environment fails it, under a plain ``pytest`` it skips.
"""

from __future__ import annotations

import pytest

from marconi.core.registry import ConfigError
from marconi.integrations.vllm.replay.run import ReplayConfig, run_replay, tier_table
from marconi.integrations.vllm.replay.tiers import (DEFAULT_HOST_BANDWIDTH, MARCONI_POLICY_MODULE, extra_config,
                                                    parse_bandwidth, parse_tier_policies)
from marks import slow
from vllm_env import vllm_python

#: The fields every two-tier record carries (the issue's done-when list, and what the table reads).
TIER_FIELDS = ("tier_policy", "cpu_tier_bytes", "token_hit_rate", "gpu_hit_tokens", "tier_hit_tokens",
               "recomputed_tokens", "bytes_loaded", "bytes_stored", "ttft_p50_s", "ttft_p95_s", "ttft_p99_s",
               "tier_evictions_kv", "tier_evictions_state", "throughput_tok_s", "sim_token_hit_rate")


# ====================================================================================== no vLLM needed
def test_tier_options_parse_and_refuse_clearly() -> None:
    assert parse_tier_policies("lru, arc,marconi,none") == ("lru", "arc", "marconi", "none")
    with pytest.raises(ConfigError, match="unknown tier policy 'fifo'"):
        parse_tier_policies("lru,fifo")
    with pytest.raises(ConfigError, match="twice"):
        parse_tier_policies("lru,lru")
    assert parse_bandwidth("55GB/s") == parse_bandwidth("55GB") == 55e9
    with pytest.raises(ConfigError, match="--host-bandwidth"):
        parse_bandwidth("0GB/s")
    # the tier is configured as a server configures it: kv_connector_extra_config alone
    assert extra_config("arc", 8 * 2**30) == {"cpu_bytes_to_use": 8 * 2**30, "eviction_policy": "arc"}
    marconi = extra_config("marconi", 10**9, 32e9)
    assert marconi["cache_policy_module_path"] == MARCONI_POLICY_MODULE
    assert marconi["marconi_host_gbps"] == 32.0
    with pytest.raises(ConfigError, match="--cpu-tier"):
        extra_config("lru", 0)
    # vLLM's frequency filter on stores, the baseline admission Marconi's policy is measured against
    assert parse_tier_policies("lru,lru:store_threshold=2,marconi:store_threshold=3") == (
        "lru", "lru:store_threshold=2", "marconi:store_threshold=3")
    assert extra_config("lru:store_threshold=2", 10**9) == {"cpu_bytes_to_use": 10**9, "eviction_policy": "lru",
                                                             "store_threshold": 2}
    assert "store_threshold" not in extra_config("lru", 10**9)
    for bad, words in (("lru:store_threshold=1", "must be >= 2"), ("lru:store_threshold=two", "an integer"),
                       ("lru:threshold=2", "only option"), ("fifo:store_threshold=2", "unknown tier policy 'fifo'")):
        with pytest.raises(ConfigError, match=words):
            parse_tier_policies(f"none,{bad}")


def test_the_emulation_takes_vllms_group_order_from_the_run() -> None:
    """vLLM 0.32 lists Falcon-H1's attention group first (its attention layers register first), the
    layout's default puts Mamba groups first. The order decides which group's keys a tier policy
    ranks first and the order blocks go back to the pool, so the emulation follows the run's: at
    doc-QA on Falcon-H1-7B (pool 0.1x, tier 0.25x) it read 24.0% against vLLM's 18.0% before."""
    from marconi.core.model import ModelSpec
    from marconi.integrations.vllm.replay.run import emulation_engine, model_dir

    spec = ModelSpec.from_hf_config(model_dir("falcon-h1-7b") / "config.json", name="falcon-h1-7b")
    config = ReplayConfig(vllm_python="x", model="falcon-h1-7b", capacity="0.1x", concurrency=4)
    for order in (("FullAttentionSpec", "MambaSpec"), ("MambaSpec", "FullAttentionSpec")):
        result = {"kv_cache": {"num_blocks": 7, "block_size": 3200,
                               "groups": [{"spec": name, "fields": {}} for name in order]}}
        engine = emulation_engine(spec, result, "lru", config)
        assert engine.layout.group_kinds == tuple("mamba" if n == "MambaSpec" else "attention" for n in order)


def test_replay_config_refuses_tier_options_that_disagree() -> None:
    base = dict(vllm_python="x", capacity="0.05x", concurrency=4)
    with pytest.raises(ConfigError, match="give --cpu-tier"):
        ReplayConfig(**base, tier_policies=("lru",))
    with pytest.raises(ConfigError, match="--tier-policies"):
        ReplayConfig(**base, cpu_tier="0.5x")
    with pytest.raises(ConfigError, match="unknown tier policy"):
        ReplayConfig(**base, cpu_tier="0.5x", tier_policies=("mru",))
    with pytest.raises(ConfigError, match="cpu-tier"):
        ReplayConfig(**base, cpu_tier="lots", tier_policies=("lru",))
    ok = ReplayConfig(**base, cpu_tier="256GB", tier_policies=("none", "lru"))
    assert ok.tier_arms == ("none", "lru")
    assert ReplayConfig(**base).tier_arms == (None,)


# ====================================================================================== vLLM
@slow
def test_two_tier_replay_splits_hits_by_tier_and_waits_for_loads(tmp_path) -> None:
    """A GPU pool far too small for the trace's reuse, a CPU tier half its working set: vLLM's
    connector serves most hits from the tier, every prompt token is a GPU hit, a tier hit or
    recomputed (vLLM's counters, summed and per request), and a slower host link makes requests
    wait longer for their loads and their first tokens (the asynchronous load path is modelled)."""
    python = vllm_python()
    base = dict(vllm_python=python, trace="swe-sample", model="nemotron-h-8b", capacity="0.05x", cpu_tier="0.5x",
                concurrency=8, num_requests=48, policies=("lru",))
    fast = run_replay(ReplayConfig(**base, tier_policies=("none", "lru")), work_dir=tmp_path / "fast",
                      emulate=False, show_bars=False)
    slow_link = run_replay(ReplayConfig(**base, tier_policies=("lru",), host_bandwidth=1e9),
                           work_dir=tmp_path / "slow", emulate=False, show_bars=False)
    gpu_only, tiered = fast
    assert [r["arm"] for r in fast] == ["lru+none", "lru+lru"]
    for rec in (*fast, *slow_link):
        for field in TIER_FIELDS:
            assert field in rec, field
        assert rec["gpu_hit_tokens"] + rec["tier_hit_tokens"] + rec["recomputed_tokens"] == rec["prompt_tokens"]
        assert rec["recomputed_tokens"] >= 0
        assert sum(rec["per_request"]["gpu_hit_tokens"]) == rec["gpu_hit_tokens"]
        assert sum(rec["per_request"]["tier_hit_tokens"]) == rec["tier_hit_tokens"]
        per = rec["per_request"]      # per request: vLLM's own cached count is the GPU hit plus the tier's
        assert [g + t for g, t in zip(per["gpu_hit_tokens"], per["tier_hit_tokens"])] == per["num_cached_tokens"]
        assert rec["token_hit_rate"] == pytest.approx(
            (rec["gpu_hit_tokens"] + rec["tier_hit_tokens"]) / rec["prompt_tokens"])
    # GPU only: no connector, nothing moved
    assert gpu_only["tier_policy"] == "none" and gpu_only["cpu_tier_bytes"] == 0
    assert gpu_only["tier_hit_tokens"] == 0 and gpu_only["bytes_loaded"] == gpu_only["bytes_stored"] == 0
    # the tier: hits beyond the GPU pool's, loaded over the link, and a store for each stored chunk
    assert tiered["cpu_tier_bytes"] > 0 and tiered["tier_num_chunks"] > 0
    assert tiered["tier_hit_tokens"] > tiered["gpu_hit_tokens"]
    assert tiered["token_hit_rate"] > gpu_only["token_hit_rate"] + 0.2
    assert tiered["bytes_loaded"] > 0 and tiered["bytes_stored"] > 0
    assert tiered["load_wait_mean_s"] > 0
    # a link 55x slower: each load waits longer, so first tokens come later
    (slow_rec,) = slow_link
    assert tiered["host_bandwidth_bytes_s"] == DEFAULT_HOST_BANDWIDTH
    assert slow_rec["load_wait_mean_s"] > 10 * tiered["load_wait_mean_s"]
    assert slow_rec["ttft_p50_s"] > tiered["ttft_p50_s"]
    assert "tier hit" in tier_table([*fast, *slow_link])


_LINK = """
from vllm.v1.kv_offload.base import GPULoadStoreSpec
from marconi.integrations.vllm.replay.offload import TimedHostLink

link = TimedHostLink([100, 300], bandwidth_bytes_s=1000.0, num_gpus=2)   # 2,000 bytes/s in all
spec = lambda a, b: GPULoadStoreSpec(list(range(a + b)), group_sizes=[a, b], block_indices=[0, 0])
link.now = 1.0
link.submit_load(1, None, spec(2, 1))        # 2*100 + 1*300 = 500 bytes: 0.25 s
link.submit_load(2, None, spec(0, 2))        # 600 bytes, queued behind job 1: done at 1.55
link.submit_store(3, spec(4, 0), None)       # 400 bytes on the other direction: done at 1.2
assert (link.bytes_loaded, link.bytes_stored) == (1100, 400)
assert abs(link.ready_at({1, 2}) - 1.55) < 1e-9 and abs(link.next_completion() - 1.2) < 1e-9
link.now = 1.3
assert sorted(r.job_id for r in link.get_finished()) == [1, 3]
assert link.get_finished() == []             # each job once
link.now = 2.0
(r,) = link.get_finished()
assert r.job_id == 2 and r.transfer_size == 600 and abs(r.transfer_time - 0.55) < 1e-9
assert link.next_completion() is None
assert [round(w, 9) for w in link.load_wait_s] == [0.25, 0.55]
print("OK")
"""


@slow
def test_the_host_link_queues_each_direction_and_reports_each_job_once() -> None:
    """The timed link: a job completes bytes / (bandwidth x GPUs) after its direction's link is
    free (loads and stores do not wait for each other), is reported once, with its size."""
    import os
    import subprocess

    python = vllm_python()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MARCONI_VLLM_")}
    proc = subprocess.run([python, "-c", _LINK], capture_output=True, text=True, timeout=300,
                          env={**env, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


_FINISH_ORDER = """
from types import SimpleNamespace
from marconi.integrations.vllm.replay.offload import TierWorker

seen = []
ids = [f"r{i}" for i in (7, 3, 12, 0, 9, 21, 5, 14)]      # finished in this order
assert list(set(ids)) != ids, "precondition: a plain set would iterate them in another order"
connector = SimpleNamespace(build_connector_meta=lambda out: seen.append(list(out.finished_req_ids)) or "meta")
sched = SimpleNamespace(_free_request=lambda request: ("freed", request.request_id),
                        connector=SimpleNamespace(connector_scheduler=connector))
TierWorker._signal_finished_in_order(sched)
for rid in ids:
    assert sched._free_request(SimpleNamespace(request_id=rid)) == ("freed", rid)
out = SimpleNamespace(finished_req_ids=set(ids))
assert sched.connector.connector_scheduler.build_connector_meta(out) == "meta"
assert seen[-1] == ids, seen
assert out.finished_req_ids == set(ids)                  # still the same ids, as a set
# the next step: one request freed, plus an id the scheduler ended another way (sorted after)
sched._free_request(SimpleNamespace(request_id="r2"))
sched.connector.connector_scheduler.build_connector_meta(SimpleNamespace(finished_req_ids={"r40", "r2"}))
assert seen[-1] == ["r2", "r40"], seen
print("OK")
"""


@slow
def test_the_connector_hears_of_finished_requests_in_the_order_they_finished() -> None:
    """vLLM's connector signals a step's finished requests to the tier's manager by iterating a set
    of id strings, whose order follows the process's hash seed, so the tier's recency (LRU ranks,
    ARC's lists) varied from run to run and the emulation, which ends them in the order they
    finished, could not follow it (quality on Qwen3-Next, pool 0.1x, tier 0.25x: one request's tier
    hit of 60). The replay hands the connector the ids in the order the scheduler freed them."""
    import os
    import subprocess

    python = vllm_python()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MARCONI_VLLM_")}
    for seed in ("0", "1"):
        proc = subprocess.run([python, "-c", _FINISH_ORDER], capture_output=True, text=True, timeout=300,
                              env={**env, "PYTHONHASHSEED": seed, "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                                   "OMP_NUM_THREADS": "1"})
        assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


def test_the_layout_defaults_to_the_group_order_vllm_builds_for_the_model() -> None:
    """Without the run, the layout lists groups as vLLM 0.32 does: the first registered layer's kind
    first (Falcon-H1's parallel layers register attention first; the sequential presets start with
    an SSM layer). ``vllm-align``'s ``attn_first=1`` still forces attention first."""
    from marconi.core.model import get_model
    from marconi.integrations.vllm.layout import layout_for_spec
    from marconi.integrations.vllm.system import VllmAlignSystem
    from marconi.sim.systems import make_system

    first = {name: layout_for_spec(get_model(name), num_blocks=10).group_kinds[0]
             for name in ("falcon-h1-7b", "nemotron-h-8b", "qwen3-next-80b-a3b", "jamba-1.5-mini", "bamba-9b")}
    assert first == {"falcon-h1-7b": "attention", "nemotron-h-8b": "mamba", "qwen3-next-80b-a3b": "mamba",
                     "jamba-1.5-mini": "mamba", "bamba-9b": "mamba"}
    assert layout_for_spec(get_model("falcon-h1-7b"), num_blocks=10, mamba_first=True).group_kinds[0] == "mamba"
    for text, kind in (("vllm-align:blocks=10", "mamba"), ("vllm-align:blocks=10,attn_first=1", "attention")):
        system = make_system(text)
        assert isinstance(system, VllmAlignSystem)
        layout = layout_for_spec(get_model("nemotron-h-8b"), num_blocks=10, **dict(system.layout_options))
        assert layout.group_kinds[0] == kind, text


def test_group_kinds_reads_vllms_specs_by_class_and_names_the_fix() -> None:
    """One reading of vLLM's KV cache groups for the pool plugin and the tier policy: a subclass of
    vLLM's ``MambaSpec`` or ``FullAttentionSpec`` is its kind; any other group is refused with the
    caller's name and fix."""
    from types import SimpleNamespace

    from marconi.integrations.vllm.policy import group_kinds

    class FullAttentionSpec: ...
    class MLAAttentionSpec(FullAttentionSpec): ...
    class MambaSpec: ...
    class SlidingWindowSpec: ...

    def config(*specs: type) -> SimpleNamespace:
        return SimpleNamespace(kv_cache_groups=[SimpleNamespace(kv_cache_spec=s()) for s in specs])

    assert group_kinds(config(MambaSpec, MLAAttentionSpec, FullAttentionSpec), "x", "y") == ["mamba", "attention",
                                                                                             "attention"]
    with pytest.raises(ConfigError, match=r"^MarconiCachePolicy: KV cache group 1 is SlidingWindowSpec .*: do this$"):
        group_kinds(config(MambaSpec, SlidingWindowSpec), "MarconiCachePolicy", "do this")
