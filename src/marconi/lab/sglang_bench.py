"""``python -m marconi.lab.sglang_bench``: a trace through SGLang's own radix cache, per policy.

Runs in the SGLang environment (``marconi sglang bench`` spawns it there): a fresh :class:`~marconi.integrations.sglang.replay.RadixReplay` per
policy, same pools; one JSONL record per policy with SGLang's hit rate and the ``sglang-unified``
emulation's (``sim_token_hit_rate``, ``sim_requests_differing``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Sequence

from marconi.core.registry import ConfigError, split_name_list
from marconi.integrations.sglang.emulate import PoolExhausted

__all__ = ["main", "parse_policy", "run_policy", "emulate_policy"]


def parse_policy(text: str, model: str) -> tuple[str, dict[str, Any] | None]:
    """``lru`` | ``marconi`` (the plugin's default: adaptive, exact worlds) | ``marconi:alpha=X`` (X a
    number or adaptive) with ``efficiency=``, ``selector=`` (worlds, regret), ``rules=`` (a family,
    e.g. a2m/a0.5m/lru) -> SGLang's policy and config (checked by the plugin's own parser)."""
    from marconi.integrations.sglang.policy import config_from_words

    name, _, params = text.strip().partition(":")
    if name == "lru" and not params:
        return "lru", None
    if name != "marconi":
        raise ConfigError(f"unknown policy {text!r}: use lru, marconi or marconi:alpha=X (X a number or adaptive)")
    words: dict[str, str] = {}
    for item in filter(None, params.split(",")):
        key, _, value = item.partition("=")
        if key in words:
            raise ConfigError(f"policy {text!r}: {key} given twice")
        words[key] = value
    return "marconi", config_from_words(words, f"policy {text!r}", model)


def run_policy(trace: Sequence[Any], policy: str, kv_tokens: int, mamba_slots: int, model: str,
               check_every: int = 0) -> dict[str, Any]:
    from marconi.integrations.sglang.replay import RadixReplay

    name, config = parse_policy(policy, model)
    replay = RadixReplay(kv_tokens, mamba_slots, policy=name, policy_config=config)
    start = time.perf_counter()
    real: list[tuple[int, int]] = []
    for i, req in enumerate(trace):
        real.append(replay.serve(req.input_tokens, req.output_tokens))
        if check_every and (i + 1) % check_every == 0:
            replay.sanity_check()
    replay.sanity_check()
    seconds = time.perf_counter() - start
    counters = dict(getattr(replay.strategy, "counters", {}))
    sim = emulate_policy(trace, policy, kv_tokens, mamba_slots, model)
    differ = sum(1 for a, b in zip(real, sim["per_request"]) if a != b)
    return {"engine": "sglang", "sglang_version": _version(), "policy": policy,
            "token_hit_rate": replay.token_hit_rate, "sim_token_hit_rate": sim["token_hit_rate"],
            "sim_requests_differing": differ, "sim_seconds": sim["seconds"],
            "num_requests": replay.num_requests, "input_tokens": replay.input_tokens,
            "hit_tokens": replay.hit_tokens, "kv_only_tokens": replay.kv_only_tokens,
            "kv_tokens": kv_tokens, "mamba_slots": mamba_slots, "model": model,
            "counters": counters, "seconds": round(seconds, 3)}


def emulate_policy(trace: Sequence[Any], policy: str, kv_tokens: int, mamba_slots: int, model: str) -> dict[str, Any]:
    """The same requests through ``sglang-unified`` (:mod:`marconi.integrations.sglang.emulate`, no SGLang)
    with the same pools and policy: ``token_hit_rate``, ``per_request`` ``(hit, kv_only)`` tokens, seconds."""
    from marconi.core.model import get_model
    from marconi.integrations.sglang.emulate import emulator_for

    name, config = parse_policy(policy, model)
    emulator = emulator_for(get_model(model), kv_tokens, mamba_slots, policy=name, policy_config=config)
    start = time.perf_counter()
    rows, hit, total = [], 0, 0
    for req in trace:
        m = emulator.serve(req.input_tokens, req.output_tokens)
        rows.append((m.hit_len, max(0, m.kv_hit_len - m.hit_len)))
        hit += m.hit_len
        total += m.input_len
    emulator.check_invariants()
    return {"token_hit_rate": hit / total if total else 0.0, "per_request": rows,
            "seconds": round(time.perf_counter() - start, 3)}


def _version() -> str:
    import sglang

    return str(sglang.__version__)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m marconi.lab.sglang_bench")
    ap.add_argument("--trace", default="swe-sample")
    ap.add_argument("--capacity", default="0.05x")
    ap.add_argument("--model", default="paper-7b")
    ap.add_argument("--policies", default="lru,marconi")
    ap.add_argument("--num-requests", type=int, default=None)
    ap.add_argument("--out", default=None, help="append the JSONL records here (also printed)")
    args = ap.parse_args(argv)
    if args.num_requests is not None and args.num_requests < 1:
        ap.error(f"--num-requests must be >= 1, got {args.num_requests}")
    try:
        return _bench(args)
    except (ConfigError, ValueError, PoolExhausted) as exc:   # a bad option, trace or a pool too small:
        print(f"error: {exc}", file=sys.stderr)                # one line, not a traceback
        return 2
    except ModuleNotFoundError as exc:     # a Parquet trace: SGLang's environment has no pyarrow
        print(f"error: --trace {args.trace}: reading it needs {exc.name}, which the SGLang environment lacks: "
              f"give it as JSONL, or install {exc.name} into that environment (its pip install {exc.name})",
              file=sys.stderr)
        return 2


def _bench(args: argparse.Namespace) -> int:
    from marconi.core.model import get_model
    from marconi.integrations.sglang.replay import pool_sizes
    from marconi.sim.replay import working_set_bytes
    from marconi.units import parse_capacity
    from marconi.workloads.source import load_trace

    policies = split_name_list(args.policies)      # marconi:alpha=adaptive,selector=regret is one policy
    for p in policies:
        parse_policy(p, args.model)
    capacity = parse_capacity(args.capacity)
    trace = list(load_trace(args.trace, args.num_requests))
    if not trace:
        raise ConfigError(f"trace {args.trace!r} has no requests: nothing to replay")
    spec = get_model(args.model)
    budget = capacity.resolve(working_set_bytes(trace, spec))
    longest = max(len(r.input_tokens) + len(r.output_tokens) for r in trace)
    kv_tokens, mamba_slots = pool_sizes(spec, budget, longest)
    pools = kv_tokens * spec.kv_bytes_per_token + mamba_slots * spec.ssm_checkpoint_bytes
    if pools > budget * 1.01:     # raised to the least SGLang runs with: said, not silently
        print(f"NOTE: --capacity {args.capacity} ({budget:,} bytes) is below the least pools SGLang can replay "
              f"this trace with: raised to {kv_tokens:,} KV tokens (the longest request) and {mamba_slots} Mamba "
              f"slots ({pools:,} bytes)", file=sys.stderr)
    out = open(args.out, "a") if args.out else None
    try:
        for policy in policies:
            record = run_policy(trace, policy, kv_tokens, mamba_slots, args.model)
            record.update(trace=args.trace, capacity=args.capacity, capacity_bytes=budget)
            line = json.dumps(record, sort_keys=True)
            print(line, flush=True)
            if out is not None:
                out.write(line + "\n")
    finally:
        if out is not None:
            out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
