"""Serve a list of token-id prompts through vLLM's in-process engine, one at a time (vLLM env).

A quicker sibling of the real server for checks that need vLLM's scheduler and block pool but no
HTTP: the same engine core (``LLM`` with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``), the same plugin
(loaded by vLLM from its entry point, configured by ``MARCONI_VLLM_*``). Run inside the vLLM
environment::

    .venv-vllm/bin/python -m marconi.integrations.vllm.offline requests.json out.json --model DIR --blocks 64

``requests.json``: ``[{"prompt": [ids...], "max_tokens": n}, ...]``. ``out.json``: per request the
generated ids and vLLM's ``num_cached_tokens``, plus the engine's cache configuration, the wall time
of serving them (``serve_s``, after start-up) and, with the plugin on, its own figures (``marconi``:
time spent in the α source on the scheduler thread, requests it saw, α changes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

__all__ = ["main", "serve_offline"]


def serve_offline(requests: list[dict[str, Any]], *, model: str, num_blocks: int, max_model_len: int,
                  max_num_batched_tokens: int, block_size: int | None = None,
                  prefix_match_unit: int | None = None, retention_interval: int | None = 0,
                  enable_prefix_caching: bool = True) -> dict[str, Any]:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    for key, value in {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "KMP_BLOCKTIME": "0"}.items():
        os.environ.setdefault(key, value)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs: dict[str, Any] = {}
    if block_size is not None:
        kwargs["block_size"] = block_size
    if prefix_match_unit is not None:
        kwargs["prefix_match_unit"] = prefix_match_unit
    if retention_interval != 0:
        kwargs["prefix_cache_retention_interval"] = retention_interval
    llm = LLM(model=model, skip_tokenizer_init=True, enable_prefix_caching=enable_prefix_caching,
              max_model_len=max_model_len, dtype="bfloat16", num_gpu_blocks_override=num_blocks,
              gpu_memory_utilization=0.1, max_num_batched_tokens=max_num_batched_tokens, **kwargs)
    results = []
    started = time.perf_counter()
    for item in requests:
        params = SamplingParams(max_tokens=int(item["max_tokens"]), ignore_eos=True, temperature=0.0)
        out = llm.generate([TokensPrompt(prompt_token_ids=list(item["prompt"]))], params, use_tqdm=False)[0]
        results.append({"output": list(out.outputs[0].token_ids), "num_cached_tokens": int(out.num_cached_tokens or 0)})
    serve_s = time.perf_counter() - started
    cache = llm.llm_engine.vllm_config.cache_config
    return {"results": results, "block_size": int(cache.block_size), "num_blocks": int(num_blocks),
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
    args = parser.parse_args(argv)
    with open(args.requests) as fh:
        requests = json.load(fh)
    result = serve_offline(requests, model=args.model, num_blocks=args.blocks, max_model_len=args.max_model_len,
                           max_num_batched_tokens=args.max_num_batched_tokens, block_size=args.block_size,
                           prefix_match_unit=args.prefix_match_unit,
                           retention_interval=None if args.retention.lower() == "none" else int(args.retention),
                           enable_prefix_caching=not args.no_prefix_caching)
    with open(args.out, "w") as fh:
        json.dump(result, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
