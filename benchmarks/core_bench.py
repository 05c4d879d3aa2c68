"""Cache-core throughput: replay traces through each named system and print figures.

Not a test: a script that prints requests/s, tokens/s, peak memory and hit rates, measured side by
side in one run. Two workloads:

* ``synthetic``: a seeded multi-turn chat/agent mix (>= 10,000 requests, inputs up to 32k tokens);
* ``swe``: real SWE-agent trajectories built by the paper's recipe (from ../shared/data when present,
  else the vendored sample), optionally repeated with fresh session ids to reach a target size.

Each (workload, system) runs in its own forked process so its peak RSS is its own (the trace,
loaded before forking, is included and reported separately).

Then the cost of adaptation (issue 11: at most 2x): on a 5,000-request SWE-like trace, fixed-alpha
Marconi, the adaptive default, its exact-worlds selector (``selector=worlds``) and the paper's
bootstrap are replayed side by side in one process, interleaved, ``--repeats`` times each; the
table gives the fastest time of each and its ratio to fixed alpha.

    python benchmarks/core_bench.py                      # both workloads, default sizes
    python benchmarks/core_bench.py --workload synthetic --capacity 20GB,1TB
    python benchmarks/core_bench.py --workload none      # only the adaptation cost
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import sys
import time

import numpy as np

from marconi.report import fmt_pct as pct
from marconi.report import format_table
from marconi.sim import simulate_system
from marconi.units import format_bytes, parse_bytes
from marconi.workloads import Request, Trace, agent_trace, chat_trace, shared_data_dir

SYSTEMS = ["vanilla", "vllm+", "sglang+", "marconi:alpha=1", "marconi"]
#: fixed alpha, the default, issue 25's worlds with dead-tail cuts (one more rule), regret, bootstrap
ADAPTATION = ["marconi:alpha=1", "marconi", "marconi:rules=lru/a0.5m/a0.5mt/a2m", "marconi:selector=regret",
              "marconi:tuner=bootstrap"]


def synthetic_workload(seed: int = 0) -> Trace:
    chat = chat_trace(num_sessions=700, turns=(8, 24), user_len=250, output_len=350, system_prompt_len=1500,
                      sessions_per_second=1.0, max_input_len=32768, seed=seed)
    agent = agent_trace(num_sessions=60, calls=(30, 60), system_prompt_len=4000, sessions_per_second=0.2,
                        max_input_len=32768, seed=seed + 1)
    reqs = list(chat) + [Request(f"a{r.session_id}", r.turn_id, r.ts, r.input_tokens, r.output_tokens) for r in agent]
    return Trace.from_unsorted(reqs, name="synthetic-chat+agent")


def swe_workload(target_requests: int) -> Trace:
    from marconi.workloads import build_swe_trace, build_workload

    shared = shared_data_dir()
    if shared is not None:
        files = sorted((shared / "swe" / "mini-swe-agent-gemini3pro").glob("msa_*.json"))
        base = build_swe_trace(files, num_sessions=500, keep_observations=5, gaps="poisson", mean_gap_s=7.5)
    else:
        base = build_workload("swe-sample")
    reqs, copy = [], 0
    span = base.duration_s + 1.0
    while len(reqs) < target_requests:
        for r in base:
            reqs.append(Request(f"{copy}/{r.session_id}", r.turn_id, r.ts + copy * span, r.input_tokens,
                                r.output_tokens))
        copy += 1
    return Trace.from_unsorted(reqs[:target_requests], name=f"swe-{base.name}")


def _run(trace: Trace, system: str, capacity: int, queue: mp.Queue) -> None:
    res = simulate_system(trace, system, "paper-7b", capacity)  # tuning uses every core, as it would serving
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    queue.put({"system": system, "capacity_bytes": capacity, "requests": res.num_requests,
               "requests_per_s": res.num_requests / res.elapsed_s,
               "tokens_per_s": res.stats.input_tokens / res.elapsed_s,
               "token_hit_rate": res.stats.token_hit_rate, "peak_rss": peak_kib * 1024,
               "tuning_s": res.tuning_seconds,
               "alpha": (",".join(f"{a:g}" for _, a in res.tuned_alphas)
                         or (f"{len(res.rule_switches)} rule switches" if res.rule_switches else "-")),
               "elapsed_s": res.elapsed_s})


def bench(trace: Trace, capacities: list[int]) -> list[dict]:
    ctx = mp.get_context("fork")
    rows = []
    for capacity in capacities:
        for system in SYSTEMS:
            queue = ctx.Queue()
            proc = ctx.Process(target=_run, args=(trace, system, capacity, queue))
            proc.start()
            rows.append(queue.get())
            proc.join()
    return rows


def adaptation_cost(trace: Trace, capacities: list[int], repeats: int) -> list[dict]:
    """Fastest of ``repeats`` interleaved replays of each ADAPTATION system; ratios to the first."""
    rows = []
    for capacity in capacities:
        best: dict[str, float] = {}
        hit: dict[str, float] = {}
        for _ in range(repeats):
            for system in ADAPTATION:
                res = simulate_system(trace, system, "paper-7b", capacity)
                best[system] = min(best.get(system, float("inf")), res.elapsed_s)
                hit[system] = res.stats.token_hit_rate
        for system in ADAPTATION:
            rows.append({"system": system, "capacity_bytes": capacity, "seconds": best[system],
                         "ratio": best[system] / best[ADAPTATION[0]], "token_hit_rate": hit[system]})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=["synthetic", "swe", "all", "none"], default="all")
    parser.add_argument("--capacity", default="20GB,1TB")
    parser.add_argument("--swe-requests", type=int, default=15000)
    parser.add_argument("--adapt-requests", type=int, default=5000, help="SWE-like requests for the adaptation cost")
    parser.add_argument("--adapt-capacity", default="10GB,20GB,50GB")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    capacities = [parse_bytes(c) for c in args.capacity.split(",")]
    workloads = []
    if args.workload in ("synthetic", "all"):
        t0 = time.perf_counter()
        workloads.append((synthetic_workload(), time.perf_counter() - t0))
    if args.workload in ("swe", "all"):
        t0 = time.perf_counter()
        workloads.append((swe_workload(args.swe_requests), time.perf_counter() - t0))
    for trace, build_s in workloads:
        lens = trace.input_lens()
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(f"\n== {trace.name}: {len(trace):,} requests, {trace.total_input_tokens / 1e6:.1f}M input tokens, "
              f"input P50/P95/max {int(np.percentile(lens, 50))}/{int(np.percentile(lens, 95))}/{lens.max()} tokens; "
              f"built in {build_s:.1f}s; process RSS with the trace loaded {format_bytes(rss)}")
        t0 = time.perf_counter()
        rows = bench(trace, capacities)
        print(format_table(rows, [
            ("system", "system", None), ("capacity", "capacity_bytes", format_bytes), ("requests", "requests", None),
            ("req/s", "requests_per_s", lambda v: f"{v:,.0f}"), ("tokens/s", "tokens_per_s", lambda v: f"{v / 1e6:,.1f}M"),
            ("token hit", "token_hit_rate", pct), ("alpha", "alpha", None), ("tuning", "tuning_s", lambda v: f"{v:.2f}s"),
            ("peak RSS", "peak_rss", format_bytes)]))
        print(f"all {len(rows)} replays: {time.perf_counter() - t0:.1f}s wall")
    if args.adapt_requests > 0:
        trace = swe_workload(args.adapt_requests)
        print(f"\n== cost of adaptation: {trace.name}, {len(trace):,} requests, paper-7b, fastest of {args.repeats}")
        rows = adaptation_cost(trace, [parse_bytes(c) for c in args.adapt_capacity.split(",")], args.repeats)
        print(format_table(rows, [
            ("system", "system", None), ("capacity", "capacity_bytes", format_bytes),
            ("replay", "seconds", lambda v: f"{v:.2f}s"), ("x fixed alpha", "ratio", lambda v: f"{v:.2f}x"),
            ("token hit", "token_hit_rate", pct)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
