"""Serve a list of token-id prompts through vLLM's in-process engine, one at a time or C in flight (vLLM env).

    .venv-vllm/bin/python -m marconi.integrations.vllm.offline requests.json out.json --model DIR --blocks 64 ...

``requests.json``: ``[{"prompt": [ids...], "max_tokens": n, "session": ...}, ...]``. With
``--concurrency`` (:func:`serve_closed_loop`) the engine is stepped and requests are submitted by the
replay's own :class:`~marconi.integrations.vllm.arrivals.Admitter`, so the replay can be
checked against it request by request. ``out.json``: per request the generated ids and
``num_cached_tokens``; the cache configuration; ``serve_s``; with the plugin, its figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

__all__ = ["main", "serve_offline", "serve_closed_loop"]


def _build_llm(*, model: str, num_blocks: int, max_model_len: int, max_num_batched_tokens: int,
               block_size: int | None = None, prefix_match_unit: int | None = None,
               retention_interval: int | None = 0, enable_prefix_caching: bool = True,
               max_num_seqs: int | None = None, enforce_eager: bool = False) -> Any:
    """vLLM's in-process ``LLM`` (engine core in this thread), one CPU thread, the given pool.
    ``enforce_eager`` skips torch.compile (about 20 s of start-up on CPU; scheduling is the same)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    for key, value in {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "KMP_BLOCKTIME": "0"}.items():
        os.environ.setdefault(key, value)
    from vllm import LLM

    kwargs: dict[str, Any] = {}
    if block_size is not None:
        kwargs["block_size"] = block_size
    if prefix_match_unit is not None:
        kwargs["prefix_match_unit"] = prefix_match_unit
    if retention_interval != 0:
        kwargs["prefix_cache_retention_interval"] = retention_interval
    if max_num_seqs is not None:
        kwargs["max_num_seqs"] = max_num_seqs
    if enforce_eager:
        kwargs["enforce_eager"] = True
    return LLM(model=model, skip_tokenizer_init=True, enable_prefix_caching=enable_prefix_caching,
               max_model_len=max_model_len, dtype="bfloat16", num_gpu_blocks_override=num_blocks,
               # the pool is num_gpu_blocks_override; the utilization only has to clear vLLM CPU worker's check that
               # utilization x node memory exceeds the process's RSS (~1 GB), which 0.1 of a 9.5 GiB node does not
               gpu_memory_utilization=0.5, max_num_batched_tokens=max_num_batched_tokens, **kwargs)


def serve_offline(requests: list[dict[str, Any]], *, model: str, num_blocks: int, max_model_len: int,
                  max_num_batched_tokens: int, block_size: int | None = None,
                  prefix_match_unit: int | None = None, retention_interval: int | None = 0,
                  enable_prefix_caching: bool = True, max_num_seqs: int | None = None) -> dict[str, Any]:
    """Each request through ``LLM.generate`` after the previous one finished; see the module docstring."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm = _build_llm(model=model, num_blocks=num_blocks, max_model_len=max_model_len,
                     max_num_batched_tokens=max_num_batched_tokens, block_size=block_size,
                     prefix_match_unit=prefix_match_unit, retention_interval=retention_interval,
                     enable_prefix_caching=enable_prefix_caching, max_num_seqs=max_num_seqs)
    results = []
    started = time.perf_counter()
    for item in requests:
        params = SamplingParams(max_tokens=int(item["max_tokens"]), ignore_eos=True, temperature=0.0)
        out = llm.generate([TokensPrompt(prompt_token_ids=list(item["prompt"]))], params, use_tqdm=False)[0]
        results.append({"output": list(out.outputs[0].token_ids), "num_cached_tokens": int(out.num_cached_tokens or 0)})
    return _summary(llm, results, num_blocks, time.perf_counter() - started)


def serve_closed_loop(requests: list[dict[str, Any]], *, concurrency: int, model: str, num_blocks: int,
                      max_model_len: int, max_num_batched_tokens: int, block_size: int | None = None,
                      max_num_seqs: int | None = None, prefix_match_unit: int | None = None,
                      retention_interval: int | None = 0, enable_prefix_caching: bool = True,
                      enforce_eager: bool = False) -> dict[str, Any]:
    """Up to ``concurrency`` requests in flight, each engine step a real forward pass, requests
    submitted between steps by the replay's admitter; see the module docstring."""
    from marconi.integrations.vllm.arrivals import Admitter

    llm = _build_llm(model=model, num_blocks=num_blocks, max_model_len=max_model_len,
                     max_num_batched_tokens=max_num_batched_tokens, block_size=block_size,
                     prefix_match_unit=prefix_match_unit, retention_interval=retention_interval,
                     enable_prefix_caching=enable_prefix_caching, max_num_seqs=max_num_seqs,
                     enforce_eager=enforce_eager)
    sessions = [r.get("session", f"request-{i}") for i, r in enumerate(requests)]
    admitter = Admitter(sessions, concurrency=concurrency)
    results: list[dict[str, Any] | None] = [None] * len(requests)
    started = time.perf_counter()
    num_steps = _drive(llm.llm_engine, requests, admitter, results)
    summary = _summary(llm, results, num_blocks, time.perf_counter() - started)
    summary.update(concurrency=concurrency, num_steps=num_steps)
    return summary


def _drive(engine: Any, requests: list[dict[str, Any]], admitter: Any, results: list[Any]) -> int:
    """Submit what ``admitter`` admits before each ``step()`` (the replay worker's boundary), step,
    report finishes, until every request is done; the number of steps."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    index: dict[str, int] = {}
    num_steps = 0
    while not admitter.finished:
        for i in admitter.admit():
            params = SamplingParams(max_tokens=int(requests[i]["max_tokens"]), ignore_eos=True, temperature=0.0,
                                    output_kind=RequestOutputKind.FINAL_ONLY)
            internal = engine.add_request(f"r{i}", TokensPrompt(prompt_token_ids=list(requests[i]["prompt"])), params)
            index[f"r{i}"] = index[internal] = i
        if not engine.has_unfinished_requests():
            raise RuntimeError("offline closed loop stalled: nothing in flight and nothing admitted")
        num_steps += 1
        for out in engine.step():
            if not out.finished:
                continue
            i = index[out.request_id]
            results[i] = {"output": list(out.outputs[0].token_ids),
                          "num_cached_tokens": int(out.num_cached_tokens or 0)}
            admitter.finish(i)
    return num_steps


def _summary(llm: Any, results: list[Any], num_blocks: int, serve_s: float) -> dict[str, Any]:
    """What both paths report: per-request results, the cache configuration, serving time, the plugin's figures."""
    vc = llm.llm_engine.vllm_config
    return {"results": results, "block_size": int(vc.cache_config.block_size), "num_blocks": int(num_blocks),
            "max_num_seqs": int(vc.scheduler_config.max_num_seqs),
            "async_scheduling": bool(vc.scheduler_config.async_scheduling),
            "serve_s": serve_s, "marconi": _plugin_figures(llm)}


def _plugin_figures(llm: Any) -> dict[str, Any] | None:
    """The plugin's own figures from the in-process scheduler (None: the plugin is not attached)."""
    core = getattr(getattr(llm.llm_engine, "engine_core", None), "engine_core", None)
    hooks = getattr(getattr(core, "scheduler", None), "_marconi", None)
    if hooks is None:
        return None
    return {"alpha_source": repr(hooks.state.alpha_source), "source_s": hooks.source_s,
            "num_finished": hooks.num_finished, "num_alpha_changes": hooks.num_alpha_changes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("requests")
    parser.add_argument("out")
    parser.add_argument("--model", required=True)
    parser.add_argument("--blocks", type=int, required=True)
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--prefix-match-unit", type=int, default=None)
    parser.add_argument("--retention", default="0", help="prefix_cache_retention_interval: 0, none or tokens")
    parser.add_argument("--no-prefix-caching", action="store_true")
    parser.add_argument("--concurrency", type=int, default=None,
                        help="drive the engine step by step with up to C requests in flight (the replay's closed loop)")
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--enforce-eager", action="store_true", help="no torch.compile (faster start-up)")
    args = parser.parse_args(argv)
    with open(args.requests) as fh:
        requests = json.load(fh)
    common = dict(model=args.model, num_blocks=args.blocks, max_model_len=args.max_model_len,
                  max_num_batched_tokens=args.max_num_batched_tokens, block_size=args.block_size,
                  prefix_match_unit=args.prefix_match_unit, max_num_seqs=args.max_num_seqs,
                  retention_interval=None if args.retention.lower() == "none" else int(args.retention),
                  enable_prefix_caching=not args.no_prefix_caching)
    if args.concurrency is not None:
        result = serve_closed_loop(requests, concurrency=args.concurrency, enforce_eager=args.enforce_eager, **common)
    else:
        result = serve_offline(requests, **common)
    with open(args.out, "w") as fh:
        json.dump(result, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
