"""The CPU tier's table at production shape (docs/vllm-tiers.md, "The table"), with the vLLM-free emulation.

    .venv/bin/python benchmarks/vllm_tier_table.py [--models nemotron-h-8b,qwen3-next-80b-a3b]
        [--traces swe:3000,sharegpt:1000,mooncake:1000] [--concurrency 16,64,256]
        [--tiers 0.25x,1x,64GB,256GB,1024GB] [--gpu-policies lru,marconi]
        [--tier-policies none,lru,arc,marconi,marconi:lru] [--workers 2] [--clock]
        [--out docs/data/vllm_tier_table.jsonl] [--resume]
    .venv/bin/python benchmarks/vllm_tier_table.py --report docs/data/vllm_tier_table.jsonl
    .venv/bin/python benchmarks/vllm_tier_table.py --import-replay R.jsonl --src-commit C   # replay records join

Every arm is the emulation the replay's tier records carry (``sim_*``; docs/vllm-tiers.md, "The
emulation"): vLLM 0.32's block pool, scheduler and ``OffloadingConnector`` scheduler side
(``vllm-align`` with :class:`~marconi.integrations.vllm.emulate.tier.EmulatedTier`), fed the
trace's first N requests (``swe:3000``: 3,000; inputs at most ``--max-input-len`` tokens, as the
replay selects them) in the replay's closed loop (``--concurrency C``), on the GPU pool vLLM builds
for an 80 GB H100 (:data:`PRODUCTION`, as the replay measured it: docs/vllm-at-scale.md). The tier
is a size (``256GB``, per replica) or a fraction of the trace's working set (``0.25x``), in chunks
as vLLM's ``CPUOffloadingSpec`` sizes it (bytes over the whole model's block bytes, every TP rank's
share together). GPU policies: ``lru`` (stock vLLM) and ``marconi`` (the pool plugin, α = 0.5).
Tier policies: ``none`` (GPU only), ``lru``, ``arc``, ``marconi`` (``ChunkTreePolicy`` under its
default rule, whatever :mod:`marconi.integrations.vllm.tier_tree` says at run time) and
``marconi:RULE`` (the same policy under a fixed rule, e.g. ``marconi:lru``, the tree by recency, or
``marconi:arc-tree``, the tree's dead chunks then ARC's order).
``--clock``: the replay's clock (its H100 step-time model and the 55 GB/s link), as the replay's
``sim_*`` fields run it; without it, a load lands by the end of its step (the simulator's rule).

Records (one per arm, the configuration echoed) are appended to ``--out`` as arms finish;
``--resume`` skips arms already there. ``--import-replay`` appends ``marconi vllm replay`` tier
records as this table's (``engine: vllm-replay``; a ``marconi`` tier arm under ``MARCONI_TIER_RULE``
is named ``marconi:RULE``), for arms where the replay was the cheaper run. ``--report`` prints the markdown tables and the summary
(tier gain over GPU-only; Marconi's margin over the better of LRU and ARC, worst / mean / best; the
plugin's gain with and without a tier); its last line is one JSON object of those numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import as_completed
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from marconi.core.model import ModelSpec  # noqa: E402
from marconi.integrations.common import bench as common  # noqa: E402
from marconi.integrations.vllm.emulate.engine import VllmAlignEngine  # noqa: E402
from marconi.integrations.vllm.emulate.scheduler import emulate_closed_loop  # noqa: E402
from marconi.integrations.vllm.emulate.tier import EmulatedTier, tier_num_chunks  # noqa: E402
from marconi.integrations.vllm.layout import layout_for_spec, prefill_checkpoint_alignment_for  # noqa: E402
from marconi.integrations.vllm.policy import DEFAULT_ALPHA  # noqa: E402
from marconi.integrations.vllm.replay.run import model_dir  # noqa: E402
from marconi.integrations.vllm.replay.tiers import DEFAULT_HOST_BANDWIDTH  # noqa: E402
from marconi.pool import worker_pool  # noqa: E402
from marconi.units import format_bytes, parse_capacity  # noqa: E402

#: The pool vLLM 0.32 builds with ``--gpu-memory 80GB`` (0.9 of the memory, less the weights and a
#: 4 GiB activation reserve), as the replay recorded it (docs/data/vllm_at_scale.jsonl): blocks,
#: tokens per block, tensor parallelism, bytes per weight, parameters (vLLM's count).
PRODUCTION: dict[str, dict[str, int]] = {
    "nemotron-h-8b": {"num_blocks": 2728, "block_size": 1152, "tp": 1, "weight_bytes": 2, "num_params": 8100852736},
    "qwen3-next-80b-a3b": {"num_blocks": 1968, "block_size": 1152, "tp": 2, "weight_bytes": 1,
                           "num_params": 0},   # filled from the records when present (the clock only)
}
MAX_NUM_BATCHED_TOKENS = 8192   # the replay's default
MAX_NUM_SEQS = 256              # the replay's default

_TRACES: dict[tuple[str, int, int], Any] = {}


def _requests(trace: str, num_requests: int, max_input_len: int) -> Any:
    key = (trace, num_requests, max_input_len)
    if key not in _TRACES:
        _TRACES[key] = common.select_requests(trace, max_input_len=max_input_len, num_requests=num_requests).requests
    return _TRACES[key]


def _num_params(model: str) -> int:
    known = PRODUCTION[model]["num_params"]
    if known:
        return known
    path = REPO / "docs" / "data" / "vllm_at_scale.jsonl"
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if rec["model"] == model and rec.get("num_params"):
            return int(rec["num_params"])
    raise SystemExit(f"no num_params for {model} in {path}")


def run_arm(task: tuple) -> dict[str, Any]:
    """One arm (GPU policy × tier policy) at one point: the closed loop's hit rates and the tier's counters."""
    model, trace, num_requests, max_input_len, concurrency, tier, gpu_policy, tier_arm, clock = task
    from marconi.integrations.vllm.tier_settings import DEFAULT_RULE
    from marconi.sim import working_set_bytes

    shape = PRODUCTION[model]
    spec = ModelSpec.from_hf_config(model_dir(model) / "config.json", name=model)
    requests = _requests(trace, num_requests, max_input_len)
    layout = layout_for_spec(spec, num_blocks=shape["num_blocks"], block_size=shape["block_size"],
                             max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
                             prefill_checkpoint_alignment=prefill_checkpoint_alignment_for(spec), retention_interval=0)
    ws = working_set_bytes(requests, spec)
    tier_bytes = parse_capacity(tier).resolve(ws) if tier_arm != "none" else 0
    chunks = tier_num_chunks(tier_bytes, layout.block_bytes) if tier_arm != "none" else 0
    engine = VllmAlignEngine(layout, spec, eviction=gpu_policy, alpha=DEFAULT_ALPHA)
    tier_policy, _, rule = tier_arm.partition(":")
    t = None
    if tier_arm != "none":
        kwargs: dict[str, Any] = {"host_gbps": DEFAULT_HOST_BANDWIDTH / 1e9}
        if rule:
            kwargs["rule"] = rule
        if clock:
            from marconi.integrations.vllm.replay.steptime import StepTimeModel

            timing = StepTimeModel.named(spec, "h100", _num_params(model) * shape["weight_bytes"], num_gpus=shape["tp"])
            kwargs.update(step_time=timing.step_s, host_bandwidth=DEFAULT_HOST_BANDWIDTH * shape["tp"])
        t = EmulatedTier(layout, chunks, tier_policy, spec, **kwargs)
        engine.attach_tier(t)
    t0 = time.perf_counter()
    loop = emulate_closed_loop(engine, requests, concurrency=concurrency, max_num_seqs=MAX_NUM_SEQS)
    counters = t.counters() if t is not None else {}
    chooser = getattr(t.manager.policy, "chooser", None) if t is not None else None
    if chooser is not None:     # the adaptive rule: its switches, the world live at the end, the worlds' scores
        counters.update(tier_rule_switches=[list(s) for s in chooser.switches], tier_rule_live=chooser.label,
                        tier_world_scores={w: round(s) for w, s in zip(chooser.labels, chooser.score)})
    return {"engine": "vllm-align", "model": model, "trace": trace, "num_requests": len(requests),
            "max_input_len": max_input_len, "prompt_tokens": int(sum(r.input_len for r in requests)),
            "working_set_bytes": int(ws), "num_blocks": layout.num_blocks, "block_size": layout.block_size,
            "chunk_bytes": int(layout.block_bytes), "concurrency": concurrency, "cpu_tier": tier,
            "cpu_tier_bytes": int(tier_bytes), "tier_num_chunks": chunks, "gpu_policy": gpu_policy,
            "tier_arm": tier_arm, "tier_policy": tier_policy,
            "tier_rule": (rule or DEFAULT_RULE) if tier_policy == "marconi" else None,
            "tier_rule_default": DEFAULT_RULE, "clock": clock,
            "token_hit_rate": loop.token_hit_rate, "gpu_hit_rate": loop.gpu_hit_rate,
            "tier_hit_rate": loop.tier_hit_rate, "num_preemptions": int(sum(loop.num_preemptions)),
            "num_steps": loop.num_steps, **counters, "num_requests_asked": num_requests,
            "wall_s": round(time.perf_counter() - t0, 2)}


def _key(rec: dict[str, Any]) -> tuple:
    return (rec["model"], rec["trace"], rec["num_requests_asked"], rec["concurrency"],
            rec["cpu_tier"] if rec["tier_arm"] != "none" else "", rec["gpu_policy"], rec["tier_arm"])


def _tasks(args: argparse.Namespace) -> list[tuple]:
    tasks = []
    for model in args.models:
        for spec in args.traces:
            # trace[:N]: a trailing whole number is the request count; a trace's own parameters
            # (``mooncake:files=PATH``, ``swe:seed=1``) keep their colons
            head, _, tail = spec.rpartition(":")
            trace, n = (head, tail) if head and tail.isdigit() else (spec, "")
            for c in args.concurrency:
                for gp in args.gpu_policies:
                    for arm in args.tier_policies:
                        for tier in ([""] if arm == "none" else args.tiers):
                            tasks.append((model, trace, int(n or args.num_requests), args.max_input_len, c, tier, gp,
                                          arm, args.clock))
    return tasks


def _task_key(task: tuple) -> tuple:
    model, trace, n, _, c, tier, gp, arm, _ = task
    return (model, trace, n, c, tier, gp, arm)


def run(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    if args.resume and out.is_file():
        done = {_key(json.loads(line)) for line in out.read_text().splitlines() if line.strip()}
    tasks = [t for t in _tasks(args) if _task_key(t) not in done]
    # longest first (SWE, high load) so two workers end together
    tasks.sort(key=lambda t: (-t[2], -t[4]))
    for t in {(t[1], t[2], t[3]) for t in tasks}:          # loaded once here; the forked workers inherit them
        _requests(*t)
    print(f"{len(tasks)} arms on {args.workers} workers", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    with worker_pool(args.workers) as pool, out.open("a") as fh:
        futures = [pool.submit(run_arm, t) for t in tasks]
        for i, fut in enumerate(as_completed(futures)):
            rec = fut.result()
            rec["run_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            rec["src_commit"] = args.src_commit
            fh.write(json.dumps(rec) + "\n")
            fh.flush()
            print(f"[{i + 1}/{len(tasks)} {time.perf_counter() - t0:.0f}s] {rec['model']} {rec['trace']} "
                  f"C={rec['concurrency']} {rec['cpu_tier'] or '-'} {rec['gpu_policy']}+{rec['tier_arm']}: "
                  f"{100 * rec['token_hit_rate']:.2f}% ({rec['wall_s']:.0f}s)", file=sys.stderr, flush=True)


def import_replay(paths: list[str], out: str, src_commit: str) -> int:
    """Append ``marconi vllm replay`` tier records (``--cpu-tier``, ``--concurrency``) to ``out`` as
    this table's records (``engine: vllm-replay``): the replay's hit counters stand where the
    emulation's would. Returns the number of records written."""
    n = 0
    with open(out, "a") as fh:
        for path in paths:
            for line in Path(path).read_text().splitlines():
                r = json.loads(line)
                if not r.get("tier_policy") or r.get("concurrency") is None:
                    continue
                rule = None
                if r["tier_policy"] == "marconi":
                    rule = os.environ.get("MARCONI_TIER_RULE") or "default"
                arm = r["tier_policy"] if rule in (None, "default") else f"marconi:{rule}"
                rec = {"engine": "vllm-replay", "model": r["model"], "trace": r["trace"].split(":")[0],
                       "num_requests": r["num_requests"], "num_requests_asked": r["num_requests"],
                       "prompt_tokens": r["prompt_tokens"], "num_blocks": r["num_blocks"],
                       "block_size": r["block_size"], "concurrency": r["concurrency"],
                       "cpu_tier": r["cpu_tier"] if r["tier_policy"] != "none" else "",
                       "cpu_tier_bytes": r["cpu_tier_bytes"], "tier_num_chunks": r["tier_num_chunks"],
                       "gpu_policy": r["policy"], "tier_arm": arm, "tier_policy": r["tier_policy"], "tier_rule": rule,
                       "clock": True, **{k: r[k] for k in ("token_hit_rate", "gpu_hit_rate", "tier_hit_rate",
                                                            "num_preemptions", "num_steps", "tier_hit_tokens",
                                                            "bytes_loaded", "bytes_stored", "num_loads", "num_stores",
                                                            "tier_evictions_kv", "tier_evictions_state", "wall_s",
                                                            "ttft_p95_s", "sim_token_hit_rate")},
                       "src_commit": src_commit, "replay_file": str(path)}
                fh.write(json.dumps(rec) + "\n")
                n += 1
    return n


def _tier_label(rec: dict[str, Any]) -> str:
    tier = rec["cpu_tier"]
    return tier if tier.upper().endswith("B") else f"{tier} = {format_bytes(rec['cpu_tier_bytes'])}"


def report(path: str) -> str:
    """The markdown tables and the summary (see the module docstring) from the records at ``path``."""
    recs = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    by: dict[tuple, dict[str, Any]] = {}
    for r in recs:                                  # the last record of an arm wins
        by[_key(r)] = r
    arms = sorted({r["tier_arm"] for r in recs} - {"none", "lru", "arc"})
    lines = ["| model | trace (requests) | C | CPU tier (chunks) | GPU policy | GPU only | tier lru | tier arc | "
             + " | ".join(f"tier {a}" for a in arms) + " | tier gain (pp) | "
             + " | ".join(f"{a} − max(lru, arc) (pp)" for a in arms) + " | tier evictions, lru |",
             "|" + "---|" * (10 + 2 * len(arms))]
    gains, plugin_alone, plugin_tier = [], [], []
    margins: dict[str, list[tuple[float, str]]] = {a: [] for a in arms}
    points = sorted({(k[0], k[1], k[2], k[3], k[4], k[5]) for k in by if k[6] != "none"},
                    key=lambda k: (k[0], k[1], k[3], _tier_sort(k[4]), k[5]))
    for model, trace, n, c, tier, gp in points:
        cell = {k[6]: v for k, v in by.items() if k[:4] == (model, trace, n, c) and k[5] == gp and (k[4] == tier or k[6] == "none")}
        base = cell.get("none")
        rates = {a: r["token_hit_rate"] for a, r in cell.items()}
        any_rec = next(r for a, r in cell.items() if a != "none")
        tiered = [rates[a] for a in rates if a != "none"]
        gain = None if base is None else 100 * (max(tiered) - base["token_hit_rate"])
        where = f"{model} {trace} C={c} {tier} GPU {gp}"
        if gain is not None:
            gains.append((gain, where))
        best = max([rates[a] for a in ("lru", "arc") if a in rates], default=None)
        row = [model, f"{trace} ({n})", str(c), f"{_tier_label(any_rec)} ({any_rec['tier_num_chunks']})", gp,
               _pct(rates.get("none")), _pct(rates.get("lru")), _pct(rates.get("arc"))]
        row += [_pct(rates.get(a)) for a in arms]
        row.append("–" if gain is None else f"{gain:+.2f}")
        for a in arms:
            if a in rates and best is not None:
                m = 100 * (rates[a] - best)
                margins[a].append((m, where))
                row.append(f"{m:+.2f}")
            else:
                row.append("–")
        lru_rec = cell.get("lru")
        row.append("–" if lru_rec is None else f"{lru_rec['tier_evictions_kv'] + lru_rec['tier_evictions_state']:,}")
        lines.append("| " + " | ".join(row) + " |")
        if gp == "marconi":
            stock = {k[6]: v for k, v in by.items() if k[:4] == (model, trace, n, c) and k[5] == "lru"
                     and (k[4] == tier or k[6] == "none")}
            for a, r in cell.items():
                if a in stock:
                    d = 100 * (r["token_hit_rate"] - stock[a]["token_hit_rate"])
                    if a == "none":
                        plugin_alone.append((d, f"{model} {trace} C={c}"))
                    else:
                        plugin_tier.append((d, f"{where} tier {a}"))
    summary: dict[str, Any] = {"points": len(points)}

    def stats(xs: list[tuple[float, str]]) -> dict[str, Any]:
        if not xs:
            return {}
        return {"n": len(xs), "mean_pp": round(float(np.mean([x for x, _ in xs])), 2),
                "worst_pp": round(min(xs)[0], 2), "worst_at": min(xs)[1],
                "best_pp": round(max(xs)[0], 2), "best_at": max(xs)[1],
                "below_-0.5pp": sum(x < -0.5 for x, _ in xs)}

    summary["tier_gain"] = stats(gains)
    summary["margins"] = {a: stats(ms) for a, ms in margins.items()}
    summary["plugin_gpu_only"] = stats(sorted(set(plugin_alone)))
    summary["plugin_with_tier"] = stats(plugin_tier)
    text = ["", f"tier gain over GPU only: {_fmt(summary['tier_gain'])}"]
    for a in arms:
        text.append(f"{a} − max(lru, arc): {_fmt(summary['margins'][a])}")
    text.append(f"plugin − stock, GPU only: {_fmt(summary['plugin_gpu_only'])}")
    text.append(f"plugin − stock, beside a tier: {_fmt(summary['plugin_with_tier'])}")
    return "\n".join(lines + text + [json.dumps(summary)])


def _tier_sort(tier: str) -> tuple:
    return (0, float(tier[:-1])) if tier.endswith("x") else (1, float(tier.upper().rstrip("B").rstrip("G")))


def _fmt(s: dict[str, Any]) -> str:
    if not s:
        return "–"
    return (f"mean {s['mean_pp']:+.2f} pp, worst {s['worst_pp']:+.2f} ({s['worst_at']}), best {s['best_pp']:+.2f} "
            f"({s['best_at']}), {s['below_-0.5pp']} of {s['n']} below −0.5 pp")


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.2f}%"


def _split(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=_split, default=["nemotron-h-8b", "qwen3-next-80b-a3b"])
    ap.add_argument("--traces", type=_split, default=["swe:3000", "sharegpt:1000", "mooncake:1000"],
                    help="trace[:requests], comma-separated (a trace's own parameters keep their colons: mooncake:files=PATH:500)")
    ap.add_argument("--num-requests", type=int, default=1000, help="for a trace given without :N")
    ap.add_argument("--max-input-len", type=int, default=32768)
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in _split(s)], default=[16, 64, 256])
    ap.add_argument("--tiers", type=_split, default=["0.25x", "1x", "64GB", "256GB", "1024GB"])
    ap.add_argument("--gpu-policies", type=_split, default=["lru", "marconi"])
    ap.add_argument("--tier-policies", type=_split, default=["none", "lru", "arc", "marconi:lru", "marconi"],
                    help="none, lru, arc, marconi (its default rule) or marconi:RULE (a fixed rule's label, "
                         "'arc-tree', or 'adaptive')")
    ap.add_argument("--clock", action="store_true", help="the replay's clock (step-time model and host link)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="docs/data/vllm_tier_table.jsonl")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--src-commit", default="", help="echoed in every record: the commit the code ran at")
    ap.add_argument("--report", default=None, metavar="JSONL", help="only print the tables from these records")
    ap.add_argument("--import-replay", default=None, metavar="JSONL[,JSONL]",
                    help="append these `marconi vllm replay` tier records to --out (the replay's counters) and stop")
    args = ap.parse_args(argv)
    if args.import_replay:
        print(f"{import_replay(_split(args.import_replay), args.out, args.src_commit)} records appended to {args.out}")
        return 0
    if args.report:
        print(report(args.report))
        return 0
    if args.workers > 2:
        print("note: more than 2 workers on a shared 2-core machine", file=sys.stderr)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    run(args)
    print(report(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
