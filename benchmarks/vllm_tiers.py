"""What a CPU tier gives a hybrid model inside vLLM, and what Marconi's tier policy adds: docs/vllm-tiers.md.

    .venv/bin/python benchmarks/vllm_tiers.py [--models nemotron-h-8b] [--traces swe,sharegpt,mooncake]
        [--concurrency 16,64] [--tiers 0.1x,0.5x] [--tier-policies lru,arc,marconi] [--policies lru]
        [--gpu-memory 80GB] [--num-requests 500] [--out results/vllm_tiers.jsonl] [--resume]
    .venv/bin/python benchmarks/vllm_tiers.py --report results/vllm_tiers.jsonl [--plot PNG]

Every point is ``marconi vllm replay --cpu-tier T --tier-policies none,lru,arc,marconi``: vLLM 0.32's
own scheduler, block pool and ``OffloadingConnector`` (scheduler role as a server builds it, the
worker role with a timed PCIe Gen5 x16 link, 55 GB/s per direction), the H100 step-time model, the
GPU pool by vLLM's arithmetic for an 80 GB GPU (``--gpu-memory``). The GPU-only arm (``none``) runs
once per (trace, load); each tier size runs every tier policy. Records are appended per point as
they complete (``--resume`` skips points already in ``--out``).

``--report`` prints the markdown table of docs/vllm-tiers.md: per point the GPU-only hit rate,
each tier policy's, the tier's gain (the best tier policy over GPU-only) and Marconi's margin over
the better of LRU and ARC, in points, with the worst and the mean.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from marconi.integrations.vllm.replay.run import ReplayConfig, load_label, run_replay  # noqa: E402

SHAPES = {"nemotron-h-8b": (1, None), "qwen3-next-80b-a3b": (2, 1)}   # TP, bytes per weight


def _points(args: argparse.Namespace) -> list[tuple[str, ReplayConfig]]:
    out = []
    for model in args.models:
        tp, weight_bytes = SHAPES[model]
        for trace in args.traces:
            for c in args.concurrency:
                for k, tier in enumerate(args.tiers):
                    policies = ((("none",) if k == 0 else ()) + tuple(args.tier_policies))
                    config = ReplayConfig(vllm_python=args.vllm_python, model=model, trace=trace,
                                          policies=tuple(args.policies), gpu_memory=args.gpu_memory,
                                          tensor_parallel=tp, weight_bytes=weight_bytes, concurrency=c,
                                          max_input_len=args.max_input_len, num_requests=args.num_requests,
                                          cpu_tier=tier, tier_policies=policies)
                    out.append((f"{model}|{trace}|{c}|{tier}", config))
    return out


def run(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    if args.resume and out.is_file():
        done = {json.loads(line)["point"] for line in out.read_text().splitlines() if line.strip()}
    points = _points(args)
    for i, (key, config) in enumerate(points):
        if key in done:
            continue
        started = time.perf_counter()
        records = run_replay(config, emulate=not args.no_emulation, show_bars=False)
        with out.open("a") as fh:
            for rec in records:
                rec = {k: v for k, v in rec.items() if k != "per_request"}
                fh.write(json.dumps({**rec, "point": key}) + "\n")
        print(f"[{i + 1}/{len(points)}] {key}: {time.perf_counter() - started:.0f}s "
              + ", ".join(f"{r['arm']} {100 * r['token_hit_rate']:.2f}%" for r in records), file=sys.stderr, flush=True)


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.2f}%"


def report(path: str) -> str:
    """The markdown table (see the module docstring) from the records at ``path``."""
    from marconi.units import format_bytes

    recs = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    gpu_only = {(r["model"], r["trace"], load_label(r), r["policy"]): r for r in recs if r["tier_policy"] == "none"}
    rows, gains, margins = [], [], []
    keys = list(dict.fromkeys((r["model"], r["trace"], load_label(r), r["policy"], r["cpu_tier"], r["cpu_tier_bytes"])
                              for r in recs if r["tier_policy"] != "none"))
    for model, trace, load, policy, tier, tier_bytes in keys:
        by = {r["tier_policy"]: r for r in recs if (r["model"], r["trace"], load_label(r), r["policy"], r["cpu_tier"])
              == (model, trace, load, policy, tier) and r["tier_policy"] != "none"}
        base = gpu_only.get((model, trace, load, policy))
        best = max(r["token_hit_rate"] for r in by.values())
        gain = None if base is None else 100 * (best - base["token_hit_rate"])
        baseline = [by[p]["token_hit_rate"] for p in ("lru", "arc") if p in by]
        margin = (100 * (by["marconi"]["token_hit_rate"] - max(baseline))
                  if "marconi" in by and baseline else None)
        if gain is not None:
            gains.append(gain)
        if margin is not None:
            margins.append(margin)
        nblk = next(iter(by.values()))["num_blocks"]
        ttft = " / ".join(f"{1000 * r['ttft_p95_s']:.0f}" for r in ([base] if base else []) +
                          [by[p] for p in ("lru", "arc", "marconi") if p in by])
        shown = tier if tier.upper() == format_bytes(tier_bytes).upper() else f"{tier} = {format_bytes(tier_bytes)}"
        rows.append(f"| {model} | {policy} | {trace.split(':')[0]} | {nblk} | {load} | {shown} | "
                    f"{_pct(base['token_hit_rate']) if base else '–'} | "
                    + " | ".join(_pct(by[p]["token_hit_rate"]) if p in by else "–" for p in ("lru", "arc", "marconi"))
                    + f" | {'–' if gain is None else f'{gain:+.2f}'} | {'–' if margin is None else f'{margin:+.2f}'}"
                    f" | {ttft} |")
    head = ("| model | GPU policy | trace | GPU blocks | load | CPU tier | GPU only | tier lru | tier arc | tier marconi | "
            "tier gain (pp) | marconi − max(lru, arc) (pp) | TTFT P95 ms GPU only / lru / arc / marconi |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    summary = []
    if gains:
        summary.append(f"tier gain: mean {sum(gains) / len(gains):+.2f} pp, min {min(gains):+.2f}, max {max(gains):+.2f}")
    if margins:
        summary.append(f"marconi − max(lru, arc): mean {sum(margins) / len(margins):+.2f} pp, "
                       f"worst {min(margins):+.2f}, best {max(margins):+.2f} over {len(margins)} points")
    return "\n".join([head, *rows, "", *summary])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vllm-python", default=str(REPO / ".venv-vllm" / "bin" / "python"))
    p.add_argument("--models", type=lambda s: s.split(","), default=["nemotron-h-8b"])
    p.add_argument("--traces", type=lambda s: s.split(","), default=["swe", "sharegpt", "mooncake"])
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[16, 64])
    p.add_argument("--tiers", type=lambda s: s.split(","), default=["0.1x", "0.5x"])
    p.add_argument("--tier-policies", type=lambda s: s.split(","), default=["lru", "arc", "marconi"])
    p.add_argument("--policies", type=lambda s: s.split(","), default=["lru"])
    p.add_argument("--gpu-memory", default="80GB")
    p.add_argument("--num-requests", type=int, default=500)
    p.add_argument("--max-input-len", type=int, default=32768)
    p.add_argument("--no-emulation", action="store_true")
    p.add_argument("--out", default="results/vllm_tiers.jsonl")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--report", default=None, metavar="JSONL", help="only print the table from these records")
    args = p.parse_args()
    if args.report:
        print(report(args.report))
        return 0
    run(args)
    print(report(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
