"""How far the ``vllm-align`` emulation is from vLLM's own counters, by model, trace, concurrency and policy.

Issue 22 item 2 asks the emulation to model concurrency: within 1 pp of ``marconi vllm replay``'s
counters (vLLM 0.32's own scheduler and block pool, no model) at concurrency 1, 16, 64 and 256, and
per request where possible. For each model, trace, concurrency and policy this runs the replay
(:func:`marconi.integrations.vllm.replay.run.run_replay`, the emulation off), then
:func:`~marconi.integrations.vllm.emulate.scheduler.emulate_closed_loop` on the same requests and
the pool vLLM built (its block count, block size and Mamba spec, prefill checkpoints included, read
from the worker's output), and prints vLLM's token hit rate, the emulated one, the error in pp, how
many requests' ``num_cached_tokens`` differ, and the preemptions on each side.

    .venv/bin/python benchmarks/vllm_emulation_error.py                       # the issue's grid (~10-15 min)
    .venv/bin/python benchmarks/vllm_emulation_error.py --models nemotron-h-8b --traces swe-sample \\
        --concurrency 16 --policies lru --num-requests 60 --out results/emulation_error.jsonl

A measurement, not a test: the numbers go in reports (the unit tests check the mechanisms,
vLLM-free). Needs the vLLM environment (``make vllm-env``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence


from marconi.core.model import ModelSpec
from marconi.integrations.common import bench as common
from marconi.integrations.vllm.arms import policy_arm
from marconi.integrations.vllm.emulate.engine import VllmAlignEngine
from marconi.integrations.vllm.layout import layout_for_spec
from marconi.integrations.vllm.emulate.scheduler import emulate_closed_loop
from marconi.integrations.vllm.policy import DEFAULT_ALPHA
from marconi.integrations.vllm.replay.run import ReplayConfig, model_dir, run_replay
from marconi.pool import scratch_dir

REPO = Path(__file__).resolve().parents[1]


def checkpoint_alignment(kv: dict[str, Any]) -> int | None:
    """The Mamba groups' prefill checkpoint alignment in vLLM's KV cache summary (None: none)."""
    return next((g["fields"].get("prefill_checkpoint_alignment") for g in kv["groups"]
                 if g["spec"] == "MambaSpec" and g["fields"].get("num_prefill_checkpoint_blocks")), None)


def emulate(spec: ModelSpec, requests: Sequence[Any], worker_out: dict[str, Any], label: str,
            config: ReplayConfig) -> tuple[list[int], float, int]:
    """The emulation of one replay: per-request hits (vLLM's ``num_cached_tokens``), the token hit
    rate, the preemptions; on exactly the pool the worker reports."""
    kv = worker_out["kv_cache"]
    layout = layout_for_spec(spec, num_blocks=kv["num_blocks"], block_size=kv["block_size"],
                             max_num_batched_tokens=config.max_num_batched_tokens,
                             prefill_checkpoint_alignment=checkpoint_alignment(kv))
    eviction, alpha = policy_arm(label, config.alpha)
    engine = VllmAlignEngine(layout, spec, eviction=eviction, alpha=DEFAULT_ALPHA if alpha is None else alpha)
    assert config.concurrency is not None
    result = emulate_closed_loop(engine, requests, concurrency=config.concurrency, max_num_seqs=config.max_num_seqs)
    return [r.hit_len for r in result.records], result.token_hit_rate, sum(result.num_preemptions)


def measure(vllm_python: str, model: str, trace: str, concurrency: int, policies: Sequence[str], capacity: str,
            num_requests: int | None, work: Path) -> list[dict[str, Any]]:
    """One replay per policy and its emulation: one row each."""
    config = ReplayConfig(vllm_python=vllm_python, model=model, trace=trace, policies=tuple(policies),
                          capacity=capacity, concurrency=concurrency, num_requests=num_requests)
    run_dir = work / f"{model}-{trace}-c{concurrency}"
    t0 = time.perf_counter()
    records = run_replay(config, work_dir=run_dir, emulate=False)
    replay_s = time.perf_counter() - t0
    spec = ModelSpec.from_hf_config(model_dir(model) / "config.json", name=model)
    requests = common.select_requests(trace, max_input_len=config.max_input_len, num_requests=num_requests,
                                      max_output_len=config.max_output_len).requests
    rows = []
    for label, rec in zip(policies, records):
        out = json.loads((run_dir / f"out-{common.file_label(label)}.json").read_text())
        t1 = time.perf_counter()
        hits, rate, preempted = emulate(spec, requests, out, label, config)
        vllm_hits = rec["per_request"]["num_cached_tokens"]
        differ = [i for i, (a, b) in enumerate(zip(vllm_hits, hits)) if a != b]
        rows.append({"model": model, "trace": trace, "capacity": capacity, "concurrency": concurrency, "policy": label,
                     "num_requests": len(requests), "num_blocks": rec["num_blocks"], "block_size": rec["block_size"],
                     "prefill_checkpoint": checkpoint_alignment(out["kv_cache"]),
                     "vllm_token_hit_rate": rec["token_hit_rate"], "emulated_token_hit_rate": rate,
                     "error_pp": 100 * (rate - rec["token_hit_rate"]), "requests_differ": len(differ),
                     "first_differ": differ[:10], "vllm_preemptions": rec["num_preemptions"],
                     "emulated_preemptions": preempted, "replay_s": replay_s / len(policies),
                     "emulate_s": time.perf_counter() - t1})
    return rows


def table(rows: Sequence[dict[str, Any]]) -> str:
    from marconi.report import fmt_pct, format_table

    shown = [{**r, "_err": f"{r['error_pp']:+.2f}", "_diff": f"{r['requests_differ']}/{r['num_requests']}",
              "_pre": f"{r['vllm_preemptions']}/{r['emulated_preemptions']}"} for r in rows]
    return format_table(shown, [
        ("model", "model", None), ("trace", "trace", None), ("C", "concurrency", None), ("policy", "policy", None),
        ("blocks", "num_blocks", None), ("vLLM token hit", "vllm_token_hit_rate", fmt_pct),
        ("emulated", "emulated_token_hit_rate", fmt_pct), ("error pp", "_err", None),
        ("requests differ", "_diff", None), ("preempt vLLM/emu", "_pre", None)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vllm-python", default=str(REPO / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--models", default="nemotron-h-8b,qwen3-next-80b-a3b")
    parser.add_argument("--traces", default="swe-sample,sharegpt,mooncake")
    parser.add_argument("--concurrency", default="1,16,64,256")
    parser.add_argument("--policies", default="lru,marconi")
    parser.add_argument("--capacity", default="0.05x", help="the pool, as marconi simulate's --capacity")
    parser.add_argument("--num-requests", type=int, default=200, help="the first N requests of each trace")
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--out", default=None, help="also write the rows as JSONL here")
    args = parser.parse_args(argv)
    if not Path(args.vllm_python).exists():
        parser.error(f"no vLLM environment at {args.vllm_python} (make vllm-env)")
    with scratch_dir("marconi-emulation-error-", args.work_dir) as work:   # removed at the end unless given
        policies = args.policies.split(",")
        rows: list[dict[str, Any]] = []
        started = time.perf_counter()
        for model in args.models.split(","):
            for trace in args.traces.split(","):
                for c in (int(x) for x in args.concurrency.split(",")):
                    new = measure(args.vllm_python, model, trace, c, policies, args.capacity, args.num_requests, work)
                    rows.extend(new)
                    for r in new:
                        print(f"{model} {trace} C={c} {r['policy']}: vLLM {100 * r['vllm_token_hit_rate']:.2f}% "
                              f"emulated {100 * r['emulated_token_hit_rate']:.2f}% ({r['error_pp']:+.2f} pp), "
                              f"{r['requests_differ']}/{r['num_requests']} requests differ "
                              f"[{time.perf_counter() - started:.0f} s]", file=sys.stderr, flush=True)
                    if args.out:
                        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(table(rows))
    worst = max(rows, key=lambda r: abs(r["error_pp"]))
    print(f"\nworst |error|: {abs(worst['error_pp']):.2f} pp ({worst['model']} {worst['trace']} "
          f"C={worst['concurrency']} {worst['policy']}); {sum(r['requests_differ'] for r in rows)} request records "
          f"differ of {sum(r['num_requests'] for r in rows)}; {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
