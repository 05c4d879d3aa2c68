"""The CPU tier's GPU check (issue 34, item 6), the Python half of ``scripts/gpu_check.sh --tier``.

On one NVIDIA GPU with vLLM 0.33 (the bundled Nemotron-H-8B config, ``--load-format dummy`` with the
weights :func:`scaled_dummy_weights` draws), it answers two questions about vLLM's
``OffloadingConnector`` under Marconi's tier policy:

1. **Are reloaded states exact?** ``generate`` runs the first requests of the SWE sample one at a
   time, in trace order, twice over (:data:`PASSES`), greedy, in three modes of one engine
   configuration (prefix caching on, vLLM's ``align`` Mamba cache, the same block size):
   ``recompute`` (every request skips reading the cache:
   ``SamplingParams(skip_reading_prefix_cache=True)``), ``gpu`` (a GPU pool of ``--reference-blocks``,
   large enough that nothing is evicted) and ``tier`` (a small pool of ``--blocks`` plus a CPU tier
   under ``MarconiCachePolicy``, so prefixes the pool evicted come back from host memory).
   ``compare`` holds the tier to the GPU pool: a request resumed at the same depth in both runs did
   the same arithmetic on the same state, so its output tokens and top log-probabilities must be
   bit-for-bit the same; any difference fails. Requests resumed at other depths, and every run
   against the recomputed outputs, are reported (a resumed prefill's kernels may round otherwise
   than a whole one's). It fails too where the tier served no token, where no request with a hit
   could be compared, or where the control shows the outputs blind to the prefix: ``recompute``
   also runs the last prompt with one token changed halfway through, and its log-probabilities must
   differ from the original's (a check whose outputs cannot see a changed prefix could not see a
   wrong state either; under vLLM's own dummy weights they cannot: :func:`scaled_dummy_weights`).
2. **Does the replay predict the tier's hits?** ``serve`` replays the same requests through a vLLM
   server with the tier and prints vLLM's own counters (``prefix_cache_hits`` for the GPU pool,
   ``external_prefix_cache_hits`` for the tier); ``gpu_check.sh`` then runs ``marconi vllm replay``
   on the same pool, tier and concurrency and :func:`summarise` sets the two side by side.

Each mode runs in its own process (a vLLM engine does not give its GPU memory back). Every output
is a JSON file under the work folder. Exit status: 0 pass, 1 a check failed, 2 bad arguments.
``MARCONI_VLLM_*`` variables are dropped (the GPU policy is stock's), and
``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1`` lets a prompt and its output exceed the bundled config's 8,192
positions, as the replay allows it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

MODES = ("recompute", "gpu", "tier")
#: engine environment: vLLM refuses a max_model_len past the config's positions without the first (the
#: replay sets it too); the second keeps the engine in this process (with the ``uni`` executor: the model
#: too), so the weights :func:`scaled_dummy_weights` draws are the ones vLLM loads
ENGINE_ENV = {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
#: the standard deviation of the redrawn vectors other than norms' scales (:func:`redraw_weights`)
VECTOR_STD = 0.02
#: the ``gpu`` and ``recompute`` modes' pool: the 12 requests' ~100 blocks with room to spare, so nothing is evicted
REFERENCE_BLOCKS = 400
#: passes over the prompts: a prompt's second pass resumes at its own last kept state, a depth both
#: the GPU pool and the tier reach (the first pass hits only where sessions share a state vLLM kept,
#: which vLLM's chunking decides), and by then the small pool has evicted it, so the tier serves it
PASSES = 2
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


def engine_kwargs(mode: str, model: str, blocks: int, cpu_bytes: int, block_size: int | None = None,
                  reference_blocks: int = REFERENCE_BLOCKS) -> dict[str, Any]:
    """``vllm.LLM`` arguments for ``mode``: one request at a time, greedy-ready, no tokenizer; one
    configuration for all three modes but the pool (``blocks`` for ``tier``, ``reference_blocks``
    otherwise) and the tier."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    kwargs: dict[str, Any] = dict(model=model, load_format="dummy", skip_tokenizer_init=True, max_model_len=MAX_MODEL_LEN,
                                  max_num_seqs=1, gpu_memory_utilization=0.85, disable_log_stats=False,
                                  enable_prefix_caching=True, distributed_executor_backend="uni",
                                  num_gpu_blocks_override=blocks if mode == "tier" else reference_blocks)
    if block_size is not None:
        kwargs["block_size"] = block_size
    if mode == "tier":
        from vllm.config import KVTransferConfig

        kwargs["kv_transfer_config"] = KVTransferConfig(**tier_transfer_config(cpu_bytes))
    return kwargs


def engine_environment() -> None:
    """This process's environment for an engine: :data:`ENGINE_ENV` set, ``MARCONI_VLLM_*`` dropped
    (call before vLLM is imported)."""
    for key in [k for k in os.environ if k.startswith("MARCONI_VLLM_")]:
        del os.environ[key]
    os.environ.update(ENGINE_ENV)


def draw_weights(model: Any) -> int:
    """Draw every floating-point tensor of ``model``'s state in place, each from a generator seeded by
    its name (the same weights in every run on one kind of device): a matrix (or kernel) normal with
    standard deviation ``1/sqrt(its last dimension)`` (LeCun's: each projection keeps its inputs'
    scale), a norm's scale 1, any other vector normal with :data:`VECTOR_STD`; and a recurrent
    mixer's own vectors as Mamba-2 draws them (the engine's presets too, ``marconi.engine.models``):
    A in -U[1, 16] (vLLM's Mamba-2 ``A`` holds -exp(A_log); a gated DeltaNet's ``A_log`` its log),
    ``dt_bias`` the inverse softplus of logU[1e-3, 1e-1], and the skip ``D`` 0, so the state decays
    and the mixer's output is its read-out. Returns how many tensors were drawn."""
    import math
    import zlib

    import torch

    count = 0
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if not tensor.is_floating_point():
                continue
            gen = torch.Generator(device=tensor.device).manual_seed(zlib.crc32(name.encode()))
            leaf = name.rsplit(".", 1)[-1]
            if leaf in ("A", "A_log"):
                a = torch.empty(tensor.shape, device=tensor.device).uniform_(1.0, 16.0, generator=gen)
                tensor.copy_(-a if leaf == "A" else a.log())
            elif leaf == "dt_bias":
                dt = torch.empty(tensor.shape, device=tensor.device).uniform_(
                    math.log(1e-3), math.log(1e-1), generator=gen).exp()
                tensor.copy_(dt + torch.log(-torch.expm1(-dt)))          # inverse softplus
            elif leaf == "D":
                tensor.zero_()
            elif tensor.dim() < 2 and "norm" in name:
                tensor.fill_(1.0)
            else:
                tensor.normal_(0.0, tensor.shape[-1] ** -0.5 if tensor.dim() >= 2 else VECTOR_STD, generator=gen)
            count += 1
    return count


def scaled_dummy_weights() -> None:
    """Make vLLM's ``--load-format dummy`` draw :func:`draw_weights`'s weights (in this process: the
    engine runs here, :data:`ENGINE_ENV`), before vLLM processes the loaded weights as it always does.

    Why: vLLM's own dummy weights are uniform in ±1e-3, and under those the outputs do not see the
    prompt: on vLLM's CPU build (the tiny Qwen3-Next) the last prompt with a token changed halfway
    gave the same output tokens and top-5 log-probabilities bit for bit, so a wrong state could not
    have shown either. Weights drawn again after loading do not help on CPU, where vLLM has packed
    the matrices by then."""
    from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader

    def load_weights(self: Any, model: Any, model_config: Any) -> None:
        if not draw_weights(model):
            raise SystemExit("gpu_tier_check: the engine's model has no weights to draw")

    DummyModelLoader.load_weights = load_weights


def control_prompt(ids: Sequence[int]) -> list[int]:
    """``ids`` with the token halfway through changed (one id lower, or 1 for id 0: inside any
    vocabulary): the prefix differs, the length and the last token do not."""
    out = list(ids)
    at = len(out) // 2
    out[at] = out[at] - 1 if out[at] > 0 else 1
    return out


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
             out: Path, block_size: int | None = None, reference_blocks: int = REFERENCE_BLOCKS,
             passes: int = PASSES) -> dict[str, Any]:
    """Greedy outputs of each prompt, one request at a time in trace order, ``passes`` times over
    (``recompute``: then the control prompt); writes ``out`` (JSON)."""
    engine_environment()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    scaled_dummy_weights()
    llm = LLM(**engine_kwargs(mode, model, blocks, cpu_bytes, block_size, reference_blocks))
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=TOP_LOGPROBS,
                            skip_reading_prefix_cache=mode == "recompute")

    def run(ids: list[int]) -> dict[str, Any]:
        result = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0]
        completion = result.outputs[0]
        steps = completion.logprobs or ()
        return {"prompt_len": len(ids), "num_cached_tokens": result.num_cached_tokens,
                "token_ids": list(completion.token_ids),
                "logprobs": [{str(t): float(lp.logprob) for t, lp in step.items()} for step in steps]}

    inputs = prompts(num_requests)
    outputs = [run(ids) for _ in range(passes) for ids in inputs]
    control = run(control_prompt(inputs[-1])) if mode == "recompute" and inputs else None
    counters = _counters(llm)
    record = {"mode": mode, "blocks": blocks if mode == "tier" else reference_blocks,
              "cpu_tier_bytes": cpu_bytes if mode == "tier" else 0, "outputs": outputs, "control": control,
              "gpu_hit_tokens": counters.get("vllm:prefix_cache_hits", 0.0),
              "tier_hit_tokens": counters.get("vllm:external_prefix_cache_hits", 0.0)}
    _write_json(out, record)
    return record


def _max_logprob_gap(a: dict[str, Any], b: dict[str, Any]) -> float:
    gaps = [abs(x[t] - y[t]) for x, y in zip(a.get("logprobs", []), b.get("logprobs", [])) for t in x if t in y]
    return max(gaps, default=0.0)


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two outputs are bit-for-bit alike: their tokens and their top log-probabilities."""
    return (a["token_ids"], a.get("logprobs", [])) == (b["token_ids"], b.get("logprobs", []))


def compare(recompute: dict[str, Any], gpu: dict[str, Any], tier: dict[str, Any]) -> tuple[bool, list[str]]:
    """Whether the tier's reloads pass (see the module's docstring), and the lines that say why.

    A request resumed at the same depth (``num_cached_tokens``) from the tier run and from the GPU
    pool must give bit-for-bit the same output tokens and top log-probabilities. Raises ValueError
    when the runs did not serve the same requests."""
    base = recompute["outputs"]
    for run in (gpu, tier):
        if len(run["outputs"]) != len(base):
            raise ValueError(f"{run['mode']}: {len(run['outputs'])} outputs, recompute has {len(base)}")
    lines = []
    for run in (gpu, tier):        # against recomputing: reported, not judged
        got = run["outputs"]
        bad = [i for i, (a, b) in enumerate(zip(base, got)) if not _same(a, b)]
        gap = max((_max_logprob_gap(a, b) for a, b in zip(base, got)), default=0.0)
        lines.append(f"{run['mode']:>9s}: {len(base) - len(bad)}/{len(base)} requests bit-for-bit the recomputed "
                     f"outputs{' (differ: ' + ', '.join(map(str, bad)) + ')' if bad else ''}, largest log-probability "
                     f"gap {gap:.3g}; hits: GPU {run['gpu_hit_tokens']:.0f}, tier {run['tier_hit_tokens']:.0f} tokens")
    pairs = list(zip(gpu["outputs"], tier["outputs"]))
    depth = [(a.get("num_cached_tokens"), b.get("num_cached_tokens")) for a, b in pairs]
    compared = [i for i, (g, t) in enumerate(depth) if g is not None and g == t and t > 0]
    other = [i for i, (g, t) in enumerate(depth) if g != t]
    wrong = [i for i in compared if not _same(*pairs[i])]
    elsewhere = ", ".join(f"{i} ({depth[i][0]} vs {depth[i][1]})" for i in other)
    lines.append(f"tier vs GPU pool: {len(compared)} requests resumed at the same depth in both "
                 f"({sum(depth[i][1] for i in compared)} tokens), {len(compared) - len(wrong)} of them bit-for-bit "
                 f"alike" + (f"; at other depths (not judged): {elsewhere}" if other else ""))
    ok = True
    if tier["tier_hit_tokens"] <= 0:
        ok = False
        lines.append("FAIL: the tier served no token, so nothing was reloaded: lower NUM_BLOCKS_TIER")
    if not compared:
        ok = False
        lines.append("FAIL: no request with a hit resumed at the same depth in both runs: nothing to judge")
    if wrong:
        ok = False
        gap = max(_max_logprob_gap(*pairs[i]) for i in wrong)
        lines.append(f"FAIL: requests {', '.join(map(str, wrong))} resumed at the same depth from the tier and from "
                     f"the GPU pool give other outputs (log-probability gap up to {gap:.3g}): a reloaded chunk is not "
                     "the one stored")
    control = recompute.get("control")
    if control is None:
        ok = False
        lines.append("FAIL: the recompute run has no control output: rerun its step")
    elif base and _same(control, base[-1]):
        ok = False
        lines.append("FAIL: inconclusive: the last prompt with a token changed halfway gives the same outputs, so "
                     "these weights cannot show a wrong state")
    if ok:
        lines.append("PASS: every request resumed from the tier gives what the same resume from the GPU pool gives, "
                     "bit for bit, and the outputs see a changed prefix")
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
    sub.choices["generate"].add_argument("--reference-blocks", type=int, default=REFERENCE_BLOCKS,
                                         help="the recompute and gpu modes' pool (large: nothing evicted)")
    sub.choices["generate"].add_argument("--passes", type=int, default=PASSES, help="passes over the prompts")
    sub.choices["serve"].add_argument("--concurrency", type=int, default=4)
    c = sub.add_parser("compare")
    c.add_argument("--work", type=Path, required=True)
    c.add_argument("--replay", type=Path, default=None, help="the replay's records (JSONL) to set beside the served hits")
    args = p.parse_args(argv)
    if args.cmd == "generate":
        args.work.mkdir(parents=True, exist_ok=True)
        rec = generate(args.mode, args.model, args.blocks, args.cpu_tier_bytes, args.num_requests, args.max_tokens,
                       args.work / f"outputs-{args.mode}.json", args.block_size, args.reference_blocks, args.passes)
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
