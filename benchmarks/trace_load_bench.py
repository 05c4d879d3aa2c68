"""Trace I/O throughput: write and read a large synthetic trace as JSONL and Parquet.

Prints requests/s, tokens/s and peak RSS for full reads and streamed reads, each in a fresh
process (so peaks do not mix). Not a test.

    python benchmarks/trace_load_bench.py --requests 15000
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import sys
import tempfile
import time
from pathlib import Path

from marconi.report import format_table
from marconi.units import format_bytes
from marconi.workloads import agent_trace, iter_requests, read_trace, write_trace


def _read(path: str, streamed: bool, queue: mp.Queue) -> None:
    t0 = time.perf_counter()
    n = tokens = 0
    if streamed:
        for r in iter_requests(path):
            n += 1
            tokens += r.input_len + r.output_len
    else:
        trace = read_trace(path)
        n, tokens = len(trace), trace.total_input_tokens + trace.total_output_tokens
    dt = time.perf_counter() - t0
    queue.put({"file": Path(path).suffix, "mode": "streamed" if streamed else "read_trace", "requests": n,
               "seconds": dt, "requests_per_s": n / dt, "tokens_per_s": tokens / dt,
               "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=15000)
    args = parser.parse_args()
    sessions = max(1, args.requests // 15)  # sessions end early at the 32k cap: generate enough, then cut
    trace = agent_trace(num_sessions=sessions, calls=(30, 60), seed=0).head(args.requests)
    print(f"{len(trace):,} requests, {trace.total_input_tokens / 1e6:.1f}M input tokens")
    ctx = mp.get_context("spawn")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for suffix in (".jsonl", ".parquet"):
            path = str(Path(tmp) / f"trace{suffix}")
            t0 = time.perf_counter()
            write_trace(path, trace)
            print(f"wrote {suffix} in {time.perf_counter() - t0:.1f}s ({format_bytes(Path(path).stat().st_size)})")
            for streamed in (False, True):
                queue = ctx.Queue()
                proc = ctx.Process(target=_read, args=(path, streamed, queue))
                proc.start()
                rows.append(queue.get())
                proc.join()
    print(format_table(rows, [("file", "file", None), ("mode", "mode", None), ("requests", "requests", None),
                              ("seconds", "seconds", lambda v: f"{v:.2f}"),
                              ("req/s", "requests_per_s", lambda v: f"{v:,.0f}"),
                              ("tokens/s", "tokens_per_s", lambda v: f"{v / 1e6:.1f}M"),
                              ("peak RSS", "peak_rss", format_bytes)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
