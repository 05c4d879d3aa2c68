"""Measured TTFT of the real engine with and without the prefix cache (a benchmark, not a test).

Same as ``marconi engine bench``; run from the repository root:

    .venv/bin/python benchmarks/engine_bench.py                       # bamba-bench on swe-sample
    .venv/bin/python benchmarks/engine_bench.py --trace synthetic --max-input 4000 --out results/engine_bench.jsonl

Prints per-request TTFT with and without the cache, the cached fraction h, measured / ideal
((1 - h) x full-prefill TTFT), the save/restore overhead, and the cost of taking a checkpoint at a
chunk boundary vs exactly (segmented) vs an unsplit prefill. One torch thread by default.
A full run takes about 5 minutes on one CPU core.
"""

from __future__ import annotations

import argparse
import sys

from marconi.engine.commands import register
from marconi.lab.engine_bench_command import register as register_bench


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="engine_bench")
    sub = parser.add_subparsers(dest="command", required=True)
    register_bench(register(sub))
    args = parser.parse_args(["engine", "bench", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
