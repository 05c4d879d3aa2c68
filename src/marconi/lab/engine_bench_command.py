"""``marconi engine bench``: the engine bench (:mod:`marconi.lab.engine_bench`) as a leaf of the
library's ``engine`` group.

    marconi engine bench [--model bamba-bench] [--trace swe-sample|synthetic|FILE] [--max-input 4000]
                         [--sessions 8] [--limit 24] [--capacity 2GB] [--lengths 1024,2048,4096] [--clock cpu|wall] [--out FILE.jsonl]

Only the handler prints; torch and transformers are imported when it runs. It checks every option
(``--eviction`` at parse time; ``--out``, ``--lengths``, ``--capacity``, ``--model``) and cuts the trace
before the model loads, so a typo never costs a replay; a run with no cache hit to measure exits 1 after its table.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from marconi.core.registry import ConfigError, Domain
from marconi.lab.option_types import eviction_policy
from marconi.options import COUNT, TOKENS, Number, add_output
from marconi.units import request_limit

__all__ = ["register", "parse_lengths"]

REPEATS = Domain(1, 1000, integer=True)


def register(engine: Any) -> None:
    """Add ``bench`` to the ``marconi engine`` group's subparsers object (what
    :func:`marconi.engine.commands.register` returns)."""
    bench = engine.add_parser("bench", help="measured TTFT with vs without the cache, save/restore and "
                                            "checkpointing overheads (CPU, one thread)")
    bench.add_argument("--model", default="bamba-bench", help="preset name or local checkpoint directory")
    bench.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    bench.add_argument("--trace", default="swe-sample",
                       help="bundled trace name, JSONL/Parquet file, or 'synthetic' (SWE-like, generated)")
    bench.add_argument("--max-input", type=Number(TOKENS), default=4000, help="skip requests with longer inputs (CPU budget)")
    bench.add_argument("--sessions", type=Number(COUNT), default=8, help="at most this many sessions")
    bench.add_argument("--limit", type=request_limit, default=24, help="at most this many requests (>= 1)")
    bench.add_argument("--capacity", default="2GB", help="cache capacity (e.g. 512MB, 2GB)")
    bench.add_argument("--eviction", default="lru", type=eviction_policy,
                       help="the cache's eviction policy (`marconi systems` lists them), e.g. lru, flop-aware")
    bench.add_argument("--lengths", default="1024,2048,4096",
                       help="prefill lengths for the checkpointing overhead ('' to skip)")
    bench.add_argument("--repeats", type=Number(REPEATS), default=1,
                       help="time each restore + prefill this many times, keep the fastest (TTFT replay)")
    bench.add_argument("--ckpt-repeats", type=Number(REPEATS), default=2, help="same, for the checkpointing runs")
    bench.add_argument("--clock", default="cpu", choices=["cpu", "wall"],
                       help="cpu: thread CPU time (robust on a shared machine); wall: elapsed time")
    bench.add_argument("--threads", type=Number(Domain(1, 1024, integer=True)), default=1, help="torch intra-op threads")
    add_output(bench, "--out", help="also write every record as JSONL here")
    bench.set_defaults(func=_cmd_bench)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:8.1f}"


def parse_lengths(text: str) -> list[int]:
    """``--lengths``: a comma list of prefill lengths in tokens ('' for none).

    Raises:
        ConfigError: naming ``--lengths``, for an item that is not a whole number, below 2 or above
            :data:`marconi.options.TOKENS`' bound (checked before any prefill allocates it).
    """
    out = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        try:
            out.append(int(item))
        except ValueError:
            raise ConfigError(f"--lengths: {item!r} is not a whole number of tokens (e.g. 1024,2048,4096, "
                              "or '' to skip the checkpointing runs)") from None
        if out[-1] < 2:  # a checkpoint goes strictly inside the prefill
            raise ConfigError(f"--lengths: every length must be >= 2 tokens, got {out[-1]}")
        if out[-1] > TOKENS.hi:  # a prefill of 10^12 tokens would allocate its inputs before failing
            raise ConfigError(f"--lengths: every length must be <= {TOKENS.hi:,.0f} tokens, got {out[-1]:,}")
    return out


def _cmd_bench(args: argparse.Namespace) -> int:
    from marconi.commandline import read_files
    from marconi.io import check_output, check_records_file
    from marconi.units import parse_bytes

    # Every option is checked, and the trace cut, before the model loads and minutes of replay begin.
    lengths = parse_lengths(args.lengths)
    try:
        capacity_bytes = parse_bytes(args.capacity)
    except ConfigError as exc:
        raise ConfigError(f"--capacity: {exc}") from None
    if args.out:
        check_output(args.out, inputs=read_files(traces=[args.trace], models=[args.model]))
        check_records_file(args.out, "kind")             # its own earlier records only: never a trace or notes

    import torch

    from marconi.engine.models import TokenRangeError, describe, is_model_source, load_model, unknown_model
    from marconi.lab import engine_bench as bench

    if not is_model_source(args.model):            # load_model's two sources, before the trace
        raise ConfigError(f"--model: {unknown_model(args.model)}")

    source = (f"agent-cpu-synthetic:sessions={args.sessions},max_input_len={args.max_input}"
              if args.trace == "synthetic" else args.trace)
    requests = bench.trace_requests(source, max_input_len=args.max_input, max_sessions=args.sessions,
                                    limit=args.limit)
    if not requests:
        raise ConfigError(f"no request of trace {args.trace} has an input within --max-input {args.max_input} and an "
                          "output to decode (each session stops at its first longer input or empty output): raise "
                          "--max-input, or give a trace whose requests have outputs")
    torch.set_num_threads(args.threads)
    model = load_model(args.model, dtype=args.dtype)
    meta = {k: v for k, v in describe(model).items()}
    print(f"model {model.name}: {model.num_parameters / 1e6:.1f}M parameters, {meta['dtype']}, "
          f"scan chunk {model.chunk_size}, KV {model.spec.kv_bytes_per_token} B/token, "
          f"checkpoint {model.spec.ssm_checkpoint_bytes} B; torch threads {torch.get_num_threads()}")
    print(f"trace {args.trace}: {len(requests)} requests with inputs <= {args.max_input} tokens\n")

    for i, req in enumerate(requests):   # the model's own check, before the replay: it failed mid-replay
        try:
            for ids in (req.input_tokens, req.output_tokens):
                if len(ids):
                    model.check_tokens(ids)
        except TokenRangeError as exc:
            raise ConfigError(f"--trace {args.trace}: request {i + 1} (session {req.session_id}, turn {req.turn_id}): "
                              f"{exc}") from None     # the model's words say what to do
    from tqdm import tqdm

    with tqdm(total=len(requests), desc="TTFT with and without the cache", unit="req", file=sys.stderr,
              disable=None) as bar:       # None: drawn on a terminal only
        records = bench.replay_ttft(model, requests, capacity_bytes=capacity_bytes, eviction=args.eviction,
                                    clock=args.clock, repeats=args.repeats, on_request=lambda _: bar.update())
    print(f"TTFT on the {args.clock} clock; restore / capture / save columns are wall-clock")
    print("  sess turn  input    hit      h  TTFT cached  TTFT full   ideal(ms)  measured/ideal  restore  capture"
          "   save(ms)")
    for r in records:
        ratio = f"{r.ratio:14.3f}" if r.h > 0 else f"{'(miss)':>14s}"
        print(f"  {r.session:4d} {r.turn:4d} {r.input_len:6d} {r.hit_len:6d} {r.h:6.3f} {_ms(r.ttft_cached_s)}ms"
              f" {_ms(r.ttft_full_s)}ms {_ms(r.ideal_s)}  {ratio} {_ms(r.restore_s)} {_ms(r.capture_s)} "
              f"{_ms(r.save_s)}")
    summary = bench.summarize_ttft(records)
    print()
    for key, value in summary.items():
        print(f"  {key:38s} {value:.4g}" if isinstance(value, float) else f"  {key:38s} {value}")

    ckpt = []
    if lengths:
        ckpt = bench.checkpoint_overhead(model, lengths, repeats=args.ckpt_repeats, clock=args.clock)
        print("\n  checkpoint placement: one checkpoint requested at p inside a prefill of L tokens")
        print("      L      p  mode            state at  prefill(ms)  overhead  max|dlogit|  bitwise")
        for c in ckpt:
            at = "-" if c.captured_at is None else str(c.captured_at)
            print(f"  {c.length:5d} {c.requested:6d}  {c.mode:15s} {at:>8s} {_ms(c.prefill_s)}    {c.overhead_pct:+6.2f}%"
                  f"   {c.max_abs_diff:9.2e}  {'yes' if c.bitwise else 'no'}")
    if args.out:
        from marconi.io import atomic_write

        config = {"model": model.name, "dtype": meta["dtype"], "trace": args.trace, "capacity": args.capacity,
                  "eviction": args.eviction, "threads": torch.get_num_threads(), "clock": args.clock,
                  "repeats": args.repeats}
        with atomic_write(args.out, "w") as fh:
            for r in records:
                fh.write(json.dumps({"kind": "ttft", **config, **r.to_record()}) + "\n")
            # an undefined ratio (NaN: no hit to take it over) is null: NaN is not JSON
            defined = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in summary.items()}
            fh.write(json.dumps({"kind": "ttft_summary", **config, **defined}, allow_nan=False) + "\n")
            for c in ckpt:
                fh.write(json.dumps({"kind": "checkpointing", **config, **c.to_record()}) + "\n")
        print(f"\nrecords written to {args.out}")
    if not any(r.h > 0 for r in records):  # the table's ratios are NaN: nothing was measured
        print(f"marconi engine bench: no request hit the cache ({len(records)} requests, --capacity {args.capacity}), "
              "so there is no cached TTFT to compare: use a multi-turn trace, more --sessions or --limit, or a "
              "larger --capacity", file=sys.stderr)
        return 1
    return 0
