"""The CPU tier's GPU check (issue 34, item 6), the Python half of ``scripts/gpu_check.sh --tier``.

On one NVIDIA GPU with vLLM 0.33 (random weights, ``--load-format dummy``, the bundled Nemotron-H-8B
config), it answers two questions about vLLM's ``OffloadingConnector`` under Marconi's tier policy:

1. **Are reloaded states exact?** ``generate`` runs the first requests of the SWE sample one at a
   time, in trace order, greedy, in three modes: ``recompute`` (no prefix caching), ``gpu`` (prefix
   caching in a small GPU pool, no tier) and ``tier`` (the same pool plus a CPU tier under
   ``MarconiCachePolicy``, so prefixes the pool evicted come back from host memory). ``compare``
   counts requests whose output tokens and top log-probabilities are bit-for-bit the recomputed
   ones (on vLLM's CPU build a GPU-pool hit is: 12 of 12 requests); the tier passes if it differs on
   no more requests than the GPU pool alone (what the arithmetic of a resumed prefill allows) and
   served at least one token from the tier (else the check proved nothing).
2. **Does the replay predict the tier's hits?** ``serve`` replays the same requests through a vLLM
   server with the tier and prints vLLM's own counters (``prefix_cache_hits`` for the GPU pool,
   ``external_prefix_cache_hits`` for the tier); ``gpu_check.sh`` then runs ``marconi vllm replay``
   on the same pool, tier and concurrency and :func:`summarise` sets the two side by side.

Each mode runs in its own process (a vLLM engine does not give its GPU memory back). Every output
is a JSON file under the work folder. Exit status: 0 pass, 1 a check failed, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

MODES = ("recompute", "gpu", "tier")
MAX_INPUT_LEN = 8192
MAX_MODEL_LEN = MAX_INPUT_LEN + 256     # a prompt and its outputs
#: log-probabilities kept per output token: random weights often repeat one token, so the tokens
#: alone would prove little; the top log-probabilities move with any change in the state
TOP_LOGPROBS = 5


def tier_transfer_config(cpu_bytes: int) -> dict[str, Any]:
    """vLLM's ``--kv-transfer-config`` for a CPU tier of ``cpu_bytes`` under Marconi's policy (the
    replay's own :func:`~marconi.integrations.vllm.replay.tiers.extra_config`, so both run one config)."""
    from marconi.integrations.vllm.replay.tiers import extra_config

    return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": extra_config("marconi", cpu_bytes)}


def engine_kwargs(mode: str, model: str, blocks: int, cpu_bytes: int, block_size: int | None = None) -> dict[str, Any]:
    """``vllm.LLM`` arguments for ``mode``: one request at a time, greedy-ready, no tokenizer."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    kwargs: dict[str, Any] = dict(model=model, load_format="dummy", skip_tokenizer_init=True, max_model_len=MAX_MODEL_LEN,
                                  max_num_seqs=1, gpu_memory_utilization=0.85, disable_log_stats=False,
                                  enable_prefix_caching=mode != "recompute")
    if block_size is not None:
        kwargs["block_size"] = block_size
    if mode != "recompute":
        kwargs["num_gpu_blocks_override"] = blocks
    if mode == "tier":
        from vllm.config import KVTransferConfig

        kwargs["kv_transfer_config"] = KVTransferConfig(**tier_transfer_config(cpu_bytes))
    return kwargs


def prompts(num_requests: int) -> list[list[int]]:
    """The first ``num_requests`` SWE-sample inputs (up to :data:`MAX_INPUT_LEN` tokens), as token ids."""
    from marconi.integrations.common.bench import select_requests

    reqs = select_requests("swe-sample", max_input_len=MAX_INPUT_LEN, num_requests=num_requests).requests
    return [[int(t) for t in r.input_tokens] for r in reqs]


def _counters(llm: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for metric in llm.get_metrics():
        value = getattr(metric, "value", None)
        if isinstance(value, (int, float)):
            out[metric.name] = out.get(metric.name, 0.0) + float(value)
    return out


def generate(mode: str, model: str, blocks: int, cpu_bytes: int, num_requests: int, max_tokens: int,
             out: Path, block_size: int | None = None) -> dict[str, Any]:
    """Greedy outputs of each prompt, one request at a time in trace order; writes ``out`` (JSON)."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(**engine_kwargs(mode, model, blocks, cpu_bytes, block_size))
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=TOP_LOGPROBS)
    outputs = []
    for ids in prompts(num_requests):
        result = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0]
        completion = result.outputs[0]
        outputs.append({"prompt_len": len(ids), "num_cached_tokens": result.num_cached_tokens,
                        "token_ids": list(completion.token_ids),
                        "logprobs": [{str(t): float(lp.logprob) for t, lp in step.items()}
                                     for step in completion.logprobs or ()]})
    counters = _counters(llm)
    record = {"mode": mode, "blocks": blocks, "cpu_tier_bytes": cpu_bytes if mode == "tier" else 0,
              "outputs": outputs,
              "gpu_hit_tokens": counters.get("vllm:prefix_cache_hits", 0.0),
              "tier_hit_tokens": counters.get("vllm:external_prefix_cache_hits", 0.0)}
    _write_json(out, record)
    return record


def _answer(output: dict[str, Any]) -> tuple[list[int], list[dict[str, float]]]:
    return output["token_ids"], output.get("logprobs", [])


def _max_logprob_gap(a: dict[str, Any], b: dict[str, Any]) -> float:
    gaps = [abs(x[t] - y[t]) for x, y in zip(a.get("logprobs", []), b.get("logprobs", [])) for t in x if t in y]
    return max(gaps, default=0.0)


def compare(recompute: dict[str, Any], gpu: dict[str, Any], tier: dict[str, Any]) -> tuple[bool, list[str]]:
    """Whether the tier's outputs pass against the recomputed ones (see the module's docstring), and
    the lines that say why. A request matches when its output tokens *and* their top log-probabilities
    are bit-for-bit the recomputed ones. Raises ValueError when the runs did not serve the same requests."""
    base = recompute["outputs"]
    lines, differ = [], {}
    for run in (gpu, tier):
        got = run["outputs"]
        if len(got) != len(base):
            raise ValueError(f"{run['mode']}: {len(got)} outputs, recompute has {len(base)}")
        bad = [i for i, (a, b) in enumerate(zip(base, got)) if _answer(a) != _answer(b)]
        gap = max((_max_logprob_gap(a, b) for a, b in zip(base, got)), default=0.0)
        differ[run["mode"]] = bad
        lines.append(f"{run['mode']:>9s}: {len(base) - len(bad)}/{len(base)} requests bit-for-bit the recomputed "
                     f"outputs{' (differ: ' + ', '.join(map(str, bad)) + ')' if bad else ''}, largest log-probability "
                     f"gap {gap:.3g}; hits: GPU {run['gpu_hit_tokens']:.0f}, tier {run['tier_hit_tokens']:.0f} tokens")
    ok = True
    if tier["tier_hit_tokens"] <= 0:
        ok = False
        lines.append("FAIL: the tier served no token, so nothing was reloaded: lower NUM_BLOCKS_TIER")
    if len(differ["tier"]) > len(differ["gpu"]):
        ok = False
        lines.append(f"FAIL: the tier differs on {len(differ['tier'])} requests, the GPU pool alone on "
                     f"{len(differ['gpu'])}: a reloaded state is not what recomputing gives")
    if ok:
        lines.append("PASS: reloaded states give the recomputed outputs as far as the GPU pool's own do")
    return ok, lines


def summarise(served: dict[str, Any], predicted: dict[str, Any]) -> list[str]:
    """Served against predicted hits by tier, as shares of the tokens looked up (vLLM's
    ``prefix_cache_queries``; the replay's ``gpu + tier + recomputed`` tokens)."""
    rows = []
    queries = {"served": float(served["queries"]),
               "replay": float(predicted["gpu_hit_tokens"] + predicted["tier_hit_tokens"] + predicted["recomputed_tokens"])}
    for name, rec in (("served", served), ("replay", predicted)):
        prompt = queries[name] or 1.0
        rows.append(f"{name:>7s}: GPU pool {rec['gpu_hit_tokens'] / prompt:7.2%}  CPU tier "
                    f"{rec['tier_hit_tokens'] / prompt:7.2%}  total {(rec['gpu_hit_tokens'] + rec['tier_hit_tokens']) / prompt:7.2%}")
    return rows


def serve(model: str, blocks: int, cpu_bytes: int, num_requests: int, concurrency: int, work: Path) -> dict[str, Any]:
    """The requests through a vLLM server with the tier (stock GPU policy); vLLM's counters."""
    from marconi.integrations.common.bench import replay_concurrent, select_requests
    from marconi.integrations.vllm.server import ServerConfig, VllmServer

    requests = select_requests("swe-sample", max_input_len=MAX_INPUT_LEN, num_requests=num_requests).requests
    config = ServerConfig(python=sys.executable, model_dir=model, num_blocks=blocks, max_model_len=16384,
                          max_num_batched_tokens=8192, max_num_seqs=concurrency, block_size=None, plugin_env={},
                          extra_args=("--load-format", "dummy", "--gpu-memory-utilization", "0.85",
                                      "--kv-transfer-config", json.dumps(tier_transfer_config(cpu_bytes))))
    with VllmServer(config, log_path=str(work / "tier-server.log")) as server:
        replay_concurrent(server, model, requests, concurrency, "tier", lambda line: print("  ", line))
        metrics = server.metrics()
    record = {"blocks": blocks, "cpu_tier_bytes": cpu_bytes, "num_requests": len(requests),
              "queries": metrics.get("vllm:prefix_cache_queries_total", 0.0),
              "gpu_hit_tokens": metrics.get("vllm:prefix_cache_hits_total", 0.0),
              "tier_hit_tokens": metrics.get("vllm:external_prefix_cache_hits_total", 0.0)}
    _write_json(work / "tier-served.json", record)
    return record


def _write_json(path: Path, record: dict[str, Any]) -> None:
    from marconi.io import write_text

    write_text(path, json.dumps(record) + "\n")        # atomic: nothing half-written if the run dies


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        raise SystemExit(f"gpu_tier_check: {path} missing: run its step first") from None


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(_read(path))


def _replay_record(path: Path) -> dict[str, Any]:
    """The replay's record for Marconi's tier policy (JSONL from ``marconi vllm replay``)."""
    rows = [json.loads(line) for line in _read(path).splitlines() if line.strip()]
    tier_rows = [r for r in rows if r.get("tier_policy") == "marconi"]
    if not tier_rows:
        raise SystemExit(f"gpu_tier_check: {path} has no record with tier_policy 'marconi'")
    return tier_rows[0]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpu_tier_check.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("generate", "serve"):
        s = sub.add_parser(name)
        s.add_argument("--model", required=True, help="model directory (config.json only)")
        s.add_argument("--blocks", type=int, required=True, help="GPU pool blocks (num_gpu_blocks_override)")
        s.add_argument("--cpu-tier-bytes", type=int, required=True, help="the CPU tier, bytes")
        s.add_argument("--num-requests", type=int, default=12)
        s.add_argument("--work", type=Path, required=True, help="folder for the JSON results")
    sub.choices["generate"].add_argument("--mode", choices=MODES, required=True)
    sub.choices["generate"].add_argument("--max-tokens", type=int, default=16)
    sub.choices["generate"].add_argument("--block-size", type=int, default=None,
                                         help="tokens per block (default: vLLM's choice for the model)")
    sub.choices["serve"].add_argument("--concurrency", type=int, default=4)
    c = sub.add_parser("compare")
    c.add_argument("--work", type=Path, required=True)
    c.add_argument("--replay", type=Path, default=None, help="the replay's records (JSONL) to set beside the served hits")
    args = p.parse_args(argv)
    if args.cmd == "generate":
        args.work.mkdir(parents=True, exist_ok=True)
        rec = generate(args.mode, args.model, args.blocks, args.cpu_tier_bytes, args.num_requests, args.max_tokens,
                       args.work / f"outputs-{args.mode}.json", args.block_size)
        print(f"{args.mode}: {len(rec['outputs'])} requests; hits GPU {rec['gpu_hit_tokens']:.0f}, "
              f"tier {rec['tier_hit_tokens']:.0f} tokens")
        return 0
    if args.cmd == "serve":
        args.work.mkdir(parents=True, exist_ok=True)
        print(json.dumps(serve(args.model, args.blocks, args.cpu_tier_bytes, args.num_requests, args.concurrency,
                               args.work)))
        return 0
    runs = [_read_json(args.work / f"outputs-{m}.json") for m in MODES]
    ok, lines = compare(*runs)
    print("\n".join(lines))
    if args.replay is not None:
        print("\n".join(summarise(_read_json(args.work / "tier-served.json"), _replay_record(args.replay))))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
