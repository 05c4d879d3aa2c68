"""One replay run inside the vLLM environment: vLLM's scheduler, a stub model runner, a virtual clock.

    .venv-vllm/bin/python -m marconi.integrations.vllm.replay.worker requests.json out.json --model DIR ...

The plugin is configured by ``MARCONI_VLLM_*``, as in a server. ``requests.json``: ``{"requests":
[{"session", "prompt": [ids], "output": [ids], "ts": seconds}, ...]}``. Each step runs
``Scheduler.schedule()`` (timed), advances the clock by the
:class:`~marconi.integrations.vllm.replay.steptime.StepTimeModel`, and feeds each request the next
token of its trace output. ``out.json``: per request arrival, first-token and finish times, hits
(split by tier with a tier) and preemptions; vLLM's counters; scheduler seconds per step; the KV
cache configuration; the plugin's counters; ``tier``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

__all__ = ["replay", "main"]


def replay(core: Any, requests: list[dict[str, Any]], *, gpu: str, concurrency: int | None = None,
           rate: float | None = None, seed: int = 0, progress: Any = None, arrivals: str | None = None,
           time_scale: float = 1.0, tier: Any = None) -> dict[str, Any]:
    """Drive ``core.scheduler`` through ``requests``; ``out.json``'s content (module docstring).

    ``arrivals``: ``closed-loop`` (``concurrency``), ``poisson`` (``rate``, ``seed``) or ``trace``
    (``ts`` times ``time_scale``); None: closed loop with a concurrency, else Poisson. ``tier``: a
    :class:`~marconi.integrations.vllm.replay.offload.TierWorker` with a CPU tier; a step in which
    every request waits for its load moves the clock to the next transfer's completion.
    """
    from vllm import SamplingParams
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    from marconi.core.model import ModelSpec
    from marconi.integrations.vllm.arrivals import make_admitter
    from marconi.integrations.vllm.replay.steptime import StepTimeModel

    sched = core.scheduler
    vc = core.vllm_config
    spec = ModelSpec.from_hf_config(vc.model_config.hf_config.to_dict() | _pattern(vc), name="replay")
    executor = core.model_executor
    timing = StepTimeModel.named(spec, gpu, executor.num_params * executor.bytes_per_param,
                                 num_gpus=executor.tensor_parallel)

    n = len(requests)
    mode = arrivals or ("closed-loop" if concurrency is not None else "poisson")
    admitter = make_admitter([r["session"] for r in requests], mode, concurrency=concurrency, rate=rate,
                             ts=[float(r.get("ts", 0.0)) for r in requests], time_scale=time_scale, seed=seed)
    arrival_s = [0.0] * n
    first_s: list[float | None] = [None] * n
    finish_s = [0.0] * n
    live: dict[str, tuple[int, Any]] = {}         # vLLM request id -> (index, Request)
    cached = [0] * n
    preempt = [0] * n
    num_done = 0
    clock = 0.0
    queries = hits = 0
    tier_queries = tier_hits = 0
    local_cached = [0] * n                       # per request: vLLM's prefill_stats split by where hits came from
    external_cached = [0] * n
    sched_s: list[float] = []
    num_steps = 0
    num_idle_steps = 0

    def arrived_at(i: int) -> float:
        """When request ``i`` reached the server: its due time (open loop; now, in a closed loop,
        whose client sends when a slot frees), but not before its predecessor's answer, which its
        prompt holds. Submission waits for the next step boundary; TTFT counts that wait."""
        due = admitter.times[i] if admitter.times is not None else clock
        prev = admitter.prev_of[i]
        return min(clock, max(due, finish_s[prev]) if prev is not None else due)

    def submit(i: int) -> None:
        r = requests[i]
        params = SamplingParams(max_tokens=max(1, len(r["output"])), ignore_eos=True, temperature=0.0)
        arrival_s[i] = arrived_at(i)
        req = Request(f"r{i}", list(r["prompt"]), params, None, arrival_time=arrival_s[i],
                      block_hasher=core.request_block_hasher)
        live[req.request_id] = (i, req)
        sched.add_request(req)

    while num_done < n:
        for i in admitter.admit(clock):
            submit(i)
        if not live:                               # idle: jump to the next arrival
            due = admitter.next_arrival()
            if due is not None:
                clock = max(clock, due)
                continue
            raise RuntimeError("replay stalled: nothing in flight and nothing to admit")
        t0 = time.perf_counter()
        out = sched.schedule()
        sched_s.append(time.perf_counter() - t0)
        num_steps += 1
        spans, ids, sampled = [], [], []
        for rid, num in out.num_scheduled_tokens.items():
            i, req = live[rid]
            end = req.num_computed_tokens            # schedule() already advanced it
            spans.append((end - num, end))
            ids.append(rid)
            if end >= req.num_tokens:                # reached its last known token: one is sampled
                produced = len(req.output_token_ids)
                sampled.append([int(requests[i]["output"][produced])] if produced < len(requests[i]["output"])
                               else [0])
            else:
                sampled.append([])
        kv_output = None
        if tier is not None:
            clock = tier.before_forward(out, clock)
        clock += timing.step_s(spans)
        if tier is not None:
            if not spans:                        # all waiting on loads: to the next completion or arrival
                due = min((t for t in (tier.next_completion(), admitter.next_arrival()) if t is not None),
                          default=None)
                clock = clock if due is None else max(clock, due)
            kv_output = tier.after_forward(out, clock)
        num_idle_steps = 0 if spans else num_idle_steps + 1
        if num_idle_steps > 10_000:
            raise RuntimeError(f"replay stalled: {len(live)} requests in flight, none scheduled for 10,000 steps")
        runner = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)},
                                   sampled_token_ids=sampled, kv_connector_output=kv_output)
        outputs = sched.update_from_output(out, runner)
        for rid, tokens in zip(ids, sampled):
            i, _ = live[rid]
            if tokens and first_s[i] is None:
                first_s[i] = clock
        for eco in outputs.values():
            stats = eco.scheduler_stats
            if stats is not None and stats.prefix_cache_stats is not None:
                queries += stats.prefix_cache_stats.queries
                hits += stats.prefix_cache_stats.hits
            if stats is not None and stats.connector_prefix_cache_stats is not None:
                tier_queries += stats.connector_prefix_cache_stats.queries
                tier_hits += stats.connector_prefix_cache_stats.hits
            for o in eco.outputs:
                if o.prefill_stats is not None and o.request_id in live:      # vLLM's num_cached_tokens
                    k = live[o.request_id][0]
                    cached[k] = int(o.prefill_stats.num_cached_tokens)
                    local_cached[k] = int(o.prefill_stats.num_local_cached_tokens)
                    external_cached[k] = int(o.prefill_stats.num_external_cached_tokens)
                if o.finish_reason is not None and o.request_id in live:
                    i, req = live.pop(o.request_id)
                    admitter.finish(i)
                    num_done += 1
                    finish_s[i] = clock
                    preempt[i] = int(req.num_preemptions)
                    if progress is not None:
                        progress(num_done, n)
    hooks = getattr(sched, "_marconi", None)
    return {"arrival_s": arrival_s, "first_token_s": first_s, "finish_s": finish_s, "num_cached_tokens": cached,
            "num_preemptions": preempt, "prefix_cache_queries": queries, "prefix_cache_hits": hits,
            "num_steps": num_steps, "virtual_s": clock, "sched_s_total": sum(sched_s),
            "sched_s_per_step": sum(sched_s) / max(1, len(sched_s)), "scheduler": type(sched).__name__,
            "plugin_evictions": dict(hooks.num_evicted) if hooks is not None else None,
            "plugin_policy": hooks.policy if hooks is not None else None,
            "plugin_cached": dict(hooks.num_cached) if hooks is not None else None,
            "plugin_retention": None if hooks is None or hooks.retention is None else {
                **hooks.retention.planner.describe(), "num_planned": hooks.retention.planner.num_planned,
                "num_placed": hooks.retention.planner.num_placed},
            "num_params": core.model_executor.num_params, "arrivals": mode,
            "time_scale": time_scale if mode == "trace" else None,
            "num_local_cached_tokens": local_cached, "num_external_cached_tokens": external_cached,
            "tier": None if tier is None else {**tier.summary(), "connector_queries": tier_queries,
                                               "connector_hits": tier_hits}}


def _pattern(vc: Any) -> dict[str, Any]:
    """Nemotron-H keeps its layer pattern outside ``to_dict`` in some transformers versions."""
    hf = vc.model_config.hf_config
    pattern = getattr(hf, "hybrid_override_pattern", None)
    return {"hybrid_override_pattern": pattern} if pattern else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("requests")
    parser.add_argument("out")
    parser.add_argument("--model", required=True, help="a directory with the model's config.json")
    pool = parser.add_mutually_exclusive_group(required=True)
    pool.add_argument("--blocks", type=int, help="the pool (vLLM's num_gpu_blocks_override)")
    pool.add_argument("--kv-bytes", type=int, help="the KV budget in bytes: vLLM derives the blocks")
    pool.add_argument("--gpu-memory-bytes", type=int, help="the GPU's memory: see engine.available_kv_bytes")
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--tensor-parallel", type=int, default=1, help="GPUs per replica (memory and step time)")
    parser.add_argument("--weight-bytes", type=int, default=None, help="bytes per weight (default: the dtype's)")
    load = parser.add_mutually_exclusive_group(required=True)
    load.add_argument("--concurrency", type=int, default=None)
    load.add_argument("--rate", type=float, default=None)
    load.add_argument("--trace-times", type=float, default=None, metavar="SCALE",
                      help="each request at its trace ts (the first at 0) times SCALE")
    parser.add_argument("--max-model-len", type=int, default=32768)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--retention-interval", default="0",
                        help="vLLM's prefix_cache_retention_interval: 0 (default), none or tokens")
    parser.add_argument("--cpu-tier-bytes", type=int, default=None,
                        help="a CPU tier of this many bytes (vLLM's OffloadingConnector); unset: none")
    parser.add_argument("--tier-policy", default="lru", help="the tier's policy (replay.tiers.TIER_POLICIES)")
    parser.add_argument("--host-bandwidth", type=float, default=None, help="bytes/s per direction per GPU")
    parser.add_argument("--progress", action="store_true", help="print 'progress DONE TOTAL' lines on stdout")
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from marconi.integrations.vllm.replay.engine import build_engine_core, kv_config_summary
    from marconi.integrations.vllm.replay.tiers import DEFAULT_HOST_BANDWIDTH, extra_config

    with open(args.requests) as fh:
        requests = json.load(fh)["requests"]
    core = build_engine_core(args.model, num_blocks=args.blocks, available_bytes=args.kv_bytes,
                             gpu_memory_bytes=args.gpu_memory_bytes, tensor_parallel=args.tensor_parallel,
                             weight_bytes_per_param=args.weight_bytes, max_model_len=args.max_model_len, max_num_batched_tokens=args.max_num_batched_tokens,
                             max_num_seqs=args.max_num_seqs,
                             retention_interval=None if args.retention_interval.lower() == "none"
                             else int(args.retention_interval),
                             offload_extra_config=None if args.cpu_tier_bytes is None
                             else extra_config(args.tier_policy, args.cpu_tier_bytes,
                                               args.host_bandwidth or DEFAULT_HOST_BANDWIDTH))
    tier = None
    if args.cpu_tier_bytes is not None:
        from marconi.integrations.vllm.replay.offload import TierWorker

        tier = TierWorker(core, args.host_bandwidth or DEFAULT_HOST_BANDWIDTH, args.tensor_parallel)

    def progress(done: int, total: int) -> None:
        if args.progress:
            print(f"progress {done} {total}", flush=True)

    started = time.perf_counter()
    arrivals = ("trace" if args.trace_times is not None else "poisson" if args.rate is not None
                else "closed-loop")
    result = replay(core, requests, gpu=args.gpu, concurrency=args.concurrency, rate=args.rate, seed=args.seed,
                    progress=progress, arrivals=arrivals,
                    time_scale=args.trace_times if args.trace_times is not None else 1.0, tier=tier)
    import vllm

    result.update(wall_s=time.perf_counter() - started, vllm_version=str(vllm.__version__),
                  kv_cache=kv_config_summary(core.scheduler.kv_cache_config, core.scheduler.block_size),
                  kv_bytes=core.model_executor.determine_available_memory()[0],
                  kv_bytes_requested=getattr(core.model_executor, "requested_bytes", None),
                  kv_floor_applied=bool(getattr(core.model_executor, "floor_applied", False)))
    with open(args.out, "w") as fh:
        json.dump(result, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
