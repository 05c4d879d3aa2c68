"""Does Marconi still win inside vLLM at production shape? The table of docs/vllm-at-scale.md.

    .venv/bin/python benchmarks/vllm_at_scale.py [--models nemotron-h-8b,qwen3-next-80b-a3b]
        [--traces swe,sharegpt,mooncake] [--concurrency 16,64,256] [--num-requests 1000] [--workers 2]
        [--out results/vllm_at_scale.jsonl]
    .venv/bin/python benchmarks/vllm_at_scale.py --report results/vllm_at_scale.jsonl [--plot PNG]

Every point is ``marconi vllm replay`` (vLLM 0.32's own scheduler and block pool, the plugin
loaded as vLLM loads it, no model, the H100 step-time model): policies stock (``lru``), α = 0.5
and the plugin's default (``marconi:alpha=adaptive``). Two pools per model on 80 GB H100s:

* comfortable: ``--gpu-memory 80GB`` by vLLM's arithmetic (0.9 of the memory, less the weights
  and a 4 GiB activation reserve). Nemotron-H-8B on one GPU in bf16; Qwen3-Next-80B-A3B does not
  fit one 80 GB GPU, so it is its FP8 checkpoint on two (TP = 2, which divides all its heads);
* tight: a 16 GB KV budget (``--capacity 16GB``): the same GPU shared with other work.

Each (model, trace) group is appended to ``--out`` as it completes, so an interrupted run keeps
what it finished (``--resume`` skips groups already there). ``--report`` prints the markdown
tables (hit rate, TTFT P50/P95, throughput, preemptions) and each point's verdict: the default's
(α = 0.5) and adaptive α's hit rate minus stock's, in points, with the worst and the mean.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from marconi.integrations.vllm.replay.run import ReplayConfig, load_label  # noqa: E402
from marconi.integrations.vllm.replay.sweep import run_sweep, sweep_configs  # noqa: E402

POLICIES = ("lru", "marconi:alpha=0.5", "marconi:alpha=adaptive")
#: model -> (the comfortable pool's options, the tight pool's)
POOLS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "nemotron-h-8b": ({"gpu_memory": "80GB"}, {"capacity": "16GB"}),
    "qwen3-next-80b-a3b": ({"gpu_memory": "80GB"}, {"capacity": "16GB"}),
}
#: per model: tensor parallelism and bytes per weight under --gpu-memory
SHAPES = {"nemotron-h-8b": (1, None), "qwen3-next-80b-a3b": (2, 1)}


def _configs(args: argparse.Namespace, model: str, trace: str) -> list[ReplayConfig]:
    tp, weight_bytes = SHAPES[model]
    base = ReplayConfig(vllm_python=args.vllm_python, model=model, trace=trace, policies=POLICIES, num_blocks=1,
                        concurrency=1, gpu="h100", tensor_parallel=tp, max_input_len=args.max_input_len,
                        num_requests=args.num_requests)
    loads = [{"concurrency": c} for c in args.concurrency]
    out = []
    for pool in POOLS[model]:
        for config in sweep_configs(base, pools=[pool], loads=loads):
            if config.gpu_memory is not None and weight_bytes is not None:
                config = dataclasses.replace(config, weight_bytes=weight_bytes)
            out.append(config)
    return out


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    if args.resume and out.exists():
        done = {(r["model"], r["trace_name"]) for r in map(json.loads, out.read_text().splitlines())}
    for model in args.models:
        for trace in args.traces:
            if (model, trace) in done:
                print(f"skip {model} {trace}: already in {out}", file=sys.stderr)
                continue
            configs = _configs(args, model, trace)
            started = time.perf_counter()
            print(f"{model} on {trace}: {len(configs)} points x {len(POLICIES)} policies", file=sys.stderr,
                  flush=True)
            records = run_sweep(configs, work_dir=Path(args.work_dir) / f"{model}-{trace}", workers=args.workers,
                                emulate=False,
                                on_point=lambda recs: print(f"  {recs[0]['num_blocks']} blocks "
                                                            f"{load_label(recs[0])}: " + ", ".join(
                                                                f"{r['arm']} {100 * r['token_hit_rate']:.2f}%"
                                                                for r in recs), file=sys.stderr, flush=True))
            with out.open("a") as fh:
                for rec in records:
                    rec.pop("per_request", None)
                    fh.write(json.dumps({**rec, "trace_name": trace}) + "\n")
            print(f"  done in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    return report(out)


def _pool_name(rec: dict[str, Any]) -> str:
    return "comfortable" if rec.get("gpu_memory") else "tight"


def report(path: Path) -> int:
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    groups: dict[tuple, dict[str, dict[str, Any]]] = defaultdict(dict)
    for rec in records:
        key = (rec["model"], rec["trace_name"], _pool_name(rec), rec["num_blocks"], rec["concurrency"])
        groups[key][rec["arm"]] = rec
    print("| model | trace | pool (blocks) | C | stock hit | α=0.5 (default) | adaptive | Δ default | Δ adaptive | "
          "TTFT P50 stock / default | TTFT P95 stock / default | tok/s stock / default | preemptions s / d / a |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    deltas: dict[str, list[float]] = {"default (α=0.5)": [], "adaptive": []}
    for key in sorted(groups, key=lambda k: (k[0], k[1], k[2] != "tight", k[4])):
        arms = groups[key]
        stock, fixed, adaptive = (arms.get(p) for p in POLICIES)
        if stock is None or adaptive is None or fixed is None:
            continue
        d_fixed = 100 * (fixed["token_hit_rate"] - stock["token_hit_rate"])
        d_adaptive = 100 * (adaptive["token_hit_rate"] - stock["token_hit_rate"])
        deltas["default (α=0.5)"].append(d_fixed)
        deltas["adaptive"].append(d_adaptive)
        model, trace, pool, blocks, conc = key

        def ms(rec: dict[str, Any], field: str) -> str:
            return f"{1000 * rec[field]:.0f}"

        print(f"| {model} | {trace} | {pool} ({blocks}) | {conc} | {100 * stock['token_hit_rate']:.2f}% | "
              f"{100 * fixed['token_hit_rate']:.2f}% | {100 * adaptive['token_hit_rate']:.2f}% | {d_fixed:+.2f} | "
              f"{d_adaptive:+.2f} | {ms(stock, 'ttft_p50_s')} / {ms(fixed, 'ttft_p50_s')} ms | "
              f"{ms(stock, 'ttft_p95_s')} / {ms(fixed, 'ttft_p95_s')} ms | "
              f"{stock['throughput_tok_s']:.0f} / {fixed['throughput_tok_s']:.0f} | "
              f"{stock['num_preemptions']} / {fixed['num_preemptions']} / {adaptive['num_preemptions']} |")
    print()
    for name, ds in deltas.items():
        if ds:
            print(f"{name} minus stock over {len(ds)} points: worst {min(ds):+.2f} pp, mean {sum(ds) / len(ds):+.2f}, "
                  f"best {max(ds):+.2f}; ahead at {sum(d > 0.005 for d in ds)}, behind at {sum(d < -0.005 for d in ds)}")
    return 0


def plot(path: Path, out: Path) -> Path:
    """Hit rate against requests in flight: a panel per (model, trace), a colour per policy, solid
    for the comfortable pool and dashed for the tight one (PNG, written atomically)."""
    from marconi.report import pyplot, save_figure

    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    models = list(dict.fromkeys(r["model"] for r in records))
    traces = list(dict.fromkeys(r["trace_name"] for r in records))
    fig, axes = pyplot().subplots(len(models), len(traces), figsize=(4 * len(traces), 3.2 * len(models)),
                                  squeeze=False)
    colours = dict(zip(POLICIES, ("tab:gray", "tab:blue", "tab:orange")))
    for i, model in enumerate(models):
        for j, trace in enumerate(traces):
            ax = axes[i][j]
            for pool, style in (("comfortable", "-"), ("tight", "--")):
                for arm in POLICIES:
                    pts = sorted((r["concurrency"], 100 * r["token_hit_rate"]) for r in records
                                 if r["model"] == model and r["trace_name"] == trace and r["arm"] == arm
                                 and _pool_name(r) == pool)
                    if pts:
                        ax.plot(*zip(*pts), style, marker="o", color=colours[arm], label=f"{arm}, {pool}")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{model} · {trace}", fontsize=9)
            ax.set_xlabel("requests in flight")
            ax.grid(alpha=0.3)
        axes[i][0].set_ylabel("vLLM token hit rate (%)")
    axes[0][-1].legend(fontsize=6)
    fig.tight_layout()
    return save_figure(fig, out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vllm-python", default=str(REPO / ".venv-vllm/bin/python"))
    parser.add_argument("--models", type=lambda s: s.split(","), default=list(POOLS))
    parser.add_argument("--traces", type=lambda s: s.split(","), default=["swe", "sharegpt", "mooncake"])
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[16, 64, 256])
    parser.add_argument("--num-requests", type=int, default=1000, help="the first N requests of each trace")
    parser.add_argument("--max-input-len", type=int, default=32768)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--work-dir", default=str(REPO / "results/vllm_at_scale_work"))
    parser.add_argument("--out", default=str(REPO / "results/vllm_at_scale.jsonl"))
    parser.add_argument("--resume", action="store_true", help="skip (model, trace) groups already in --out")
    parser.add_argument("--report", default=None, metavar="JSONL", help="only print the tables of a finished run")
    parser.add_argument("--plot", default=None, metavar="PNG", help="with --report: also draw the hit rates")
    args = parser.parse_args(argv)
    if args.report:
        if args.plot:
            print(f"wrote {plot(Path(args.report), Path(args.plot))}", file=sys.stderr)
        return report(Path(args.report))
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
