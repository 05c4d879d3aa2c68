"""``marconi vllm bench``: the real-server bench (:mod:`marconi.lab.vllm_bench`) as a leaf of the
library's ``vllm`` group.

    marconi vllm bench [--vllm-python .venv-vllm/bin/python] [--model qwen3_next-tiny] [--trace swe-sample]
                       [--policies lru,marconi] [--blocks 150] [--out results/vllm_bench.jsonl] ...

Only the handler prints (progress to stderr, the table to stdout).
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from typing import Any

from marconi.core.registry import Domain
from marconi.integrations.common.probe import default_env_python, python_command
from marconi.integrations.vllm.commands import ALPHA, CONCURRENCY, POOL_BLOCKS
from marconi.options import COUNT, MAX_TOKENS, PLOT_SUFFIXES, TOKENS, NameList, Number, add_output

__all__ = ["register"]


def _retention_domain(block_sizes: dict[str, int]) -> Domain:
    """``--retention`` of the bench: 0, none or tokens. At parse time a multiple of the presets' blocks'
    common divisor (``block_sizes``: preset -> tokens, each named in the hint); the exact multiple,
    of ``--model``'s block, is :class:`~marconi.lab.vllm_bench.BenchConfig`'s check."""
    return Domain(0, MAX_TOKENS, integer=True, multiple_of=math.gcd(*block_sizes.values()), words=("none",),
                  hint=f"vLLM needs a multiple of --model's block: {_blocks(block_sizes)}")


def _blocks(block_sizes: dict[str, int]) -> str:
    return ", ".join(f"{block} tokens for {name}" for name, block in sorted(block_sizes.items()))


def register(vllm: Any) -> None:
    """Add ``bench`` to the ``marconi vllm`` group's subparsers object (what
    :func:`marconi.integrations.vllm.commands.register` returns)."""
    from marconi.integrations.vllm.models import BLOCK_SIZES, PRESETS
    from marconi.integrations.vllm.policy import DEFAULT_ALPHA

    bench = vllm.add_parser("bench", help="stock vLLM vs vLLM + the Marconi plugin on a real server and a trace; "
                                          "hit rates from vLLM's counters, TTFT from a streaming client")
    bench.add_argument("--vllm-python", default=default_env_python(".venv-vllm"), type=python_command,
                       help="python of the vLLM environment (`make vllm-env` builds .venv-vllm)")
    bench.add_argument("--model", default="qwen3_next-tiny", choices=sorted(PRESETS),
                       help="tiny random-weight preset, built at run time")
    bench.add_argument("--trace", default="swe-sample",
                       help="a trace file (JSONL/Parquet) or a catalog name (`marconi trace list`), as simulate takes it")
    bench.add_argument("--max-input-len", type=Number(TOKENS), default=8192,
                       help="input cap in tokens (a catalog trace is built with it; in a trace file a session ends "
                            "before its first longer input)")
    bench.add_argument("--num-requests", type=Number(COUNT), default=None, help="replay only the first N requests")
    bench.add_argument("--max-output-len", type=Number(TOKENS), default=None,
                       help="cap each request's max_tokens (>= 1)")
    bench.add_argument("--blocks", type=Number(POOL_BLOCKS), default=150,
                       help="vLLM's block pool (--num-gpu-blocks-override)")
    bench.add_argument("--policies", default="lru,marconi", type=NameList("policy"),
                       help="comma list, one server each: lru (stock vLLM), marconi (the plugin, alpha from --alpha), "
                            "marconi:alpha=X (X a number or adaptive), e.g. lru,marconi,marconi:alpha=adaptive")
    bench.add_argument("--alpha", default=str(DEFAULT_ALPHA), type=Number(ALPHA, text=True),
                       help="the plugin's alpha for plain 'marconi': a number >= 0, or adaptive (adaptive Marconi's "
                            "live rule picks alpha and efficiency online); default %(default)s")
    bench.add_argument("--concurrency", type=Number(CONCURRENCY), default=1,
                       help="requests in flight (1: one at a time, which the emulation models exactly)")
    bench.add_argument("--max-num-batched-tokens", type=Number(TOKENS), default=2048)
    bench.add_argument("--prefix-match-unit", type=Number(TOKENS), default=None,
                       help="vLLM's hash granularity (default: the block); finer lets hits land inside a block")
    bench.add_argument("--retention", default="0", type=Number(_retention_domain(BLOCK_SIZES), text=True),
                       help="vLLM's prefix_cache_retention_interval: 0 (default), none (every block) or tokens, "
                            f"a multiple of --model's block ({_blocks(BLOCK_SIZES)})")
    add_output(bench, "--work-dir", kind="workdir", default="results/vllm_bench_work", help="model, server logs, block traces")
    add_output(bench, "--out", default="results/vllm_bench.jsonl",
               help="JSONL records (written atomically; default: %(default)s)")
    add_output(bench, "--plot", beside=("out", ".png"), suffixes=PLOT_SUFFIXES,
               help="TTFT CDF PNG (default: beside --out, R.jsonl -> R.png; '' to skip)")
    add_output(bench, "--record-fixture", default=None,
                       help="also write per-request counts and outputs here (the emulation test's fixture)")
    bench.set_defaults(func=_cmd_bench)


def _cmd_bench(args: argparse.Namespace) -> int:
    from marconi.integrations.vllm.arms import parse_policies, parse_retention
    from marconi.lab.vllm_bench import (BenchConfig, bench_table, check_outputs, plot_ttft_cdf, run_bench,
                                        write_fixture)
    from marconi.sim.sweep import write_records

    # Every option is checked before the trace loads and any server starts.
    check_outputs(args.trace, out=args.out, plot=args.plot, fixture=args.record_fixture)
    config = BenchConfig(vllm_python=args.vllm_python, model=args.model, trace=args.trace,
                         max_input_len=args.max_input_len, num_requests=args.num_requests,
                         max_output_len=args.max_output_len, num_blocks=args.blocks,
                         policies=parse_policies(args.policies), alpha=args.alpha,
                         concurrency=args.concurrency, max_num_batched_tokens=args.max_num_batched_tokens,
                         prefix_match_unit=args.prefix_match_unit,
                         retention_interval=parse_retention(args.retention),
                         work_dir=args.work_dir)
    outcome = run_bench(config)
    records = outcome.records
    write_records(records, args.out)
    print(f"wrote {len(records)} records to {args.out}", file=sys.stderr)
    if args.plot:
        print(f"wrote {plot_ttft_cdf(records, args.plot)}", file=sys.stderr)
    if args.record_fixture:
        command = "marconi vllm bench " + " ".join(shlex.quote(a) for a in sys.argv[3:])
        print(f"wrote {write_fixture(args.record_fixture, config, outcome, command)}", file=sys.stderr)
    print(bench_table(records))
    return 0
