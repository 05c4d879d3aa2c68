"""``marconi vllm frontier``: the frontier study (:mod:`marconi.lab.frontier`) as a leaf of the
library's ``vllm`` group.

    marconi vllm frontier --out DIR [--traces quality,shared-prompts-synthetic,swe-sample,doc-qa-synthetic]
                          [--model nemotron-h-8b] [--budgets 0,1,2,4] [--intervals 0,512,1024,2048]
                          [--gpu-memory 80GB | --capacity 0.3x] [--limit 256] [--from-records JSONL]

Only the handler prints (progress to stderr, the report to stdout).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from marconi.commandline import comma_list
from marconi.core.registry import ConfigError, Domain, split_name_list
from marconi.integrations.common.probe import default_env_python, python_command
from marconi.integrations.vllm.commands import CONCURRENCY
from marconi.lab.frontier import DEFAULT_BUDGETS, DEFAULT_INTERVALS, DEFAULT_WORKLOADS
from marconi.options import (CHECKPOINT_BUDGET, COUNT, MAX_TOKENS, TOKENS, CapacityList, NameList, Number, NumberList,
                             add_output, add_reread)
from marconi.sim.backends import worker_count

__all__ = ["register"]

INTERVAL = Domain(0, MAX_TOKENS, integer=True)


def register(vllm: Any) -> None:
    """Add ``frontier`` to the ``marconi vllm`` group's subparsers object (what
    :func:`marconi.integrations.vllm.commands.register` returns)."""
    p = vllm.add_parser("frontier", help="the Pareto frontier of Mamba states kept per request vs prefill recomputed, "
                                         "through vLLM's replay: DP placement, vLLM's intervals, Marconi admission")
    add_output(p, "--out", kind="dir", required=True, help="directory for records.jsonl, frontier.png and report.md")
    p.add_argument("--vllm-python", default=default_env_python(".venv-vllm"), type=python_command,
                   help="python of the vLLM environment")
    p.add_argument("--traces", default=",".join(DEFAULT_WORKLOADS), type=NameList("trace"), help="comma list of catalog names or trace files")
    p.add_argument("--model", default="nemotron-h-8b", help="a bundled config or a directory with a config.json")
    p.add_argument("--budgets", default=DEFAULT_BUDGETS, type=NumberList(CHECKPOINT_BUDGET), help="DP budgets M (sparse-dp arms)")
    p.add_argument("--intervals", default=DEFAULT_INTERVALS, type=NumberList(INTERVAL),
                   help="vLLM retention intervals in tokens, each rounded up to a multiple of the model's block")
    pool = p.add_mutually_exclusive_group()
    pool.add_argument("--gpu-memory", default=None, type=CapacityList(allow_zero=False), help="pools as a GPU's memory (default 80GB); a comma list")
    pool.add_argument("--capacity", default=None, type=CapacityList(allow_zero=False), help="pools as KV budgets (0.3x, 10GB); a comma list")
    p.add_argument("--arms", default="dp,interval,marconi",
                   help="arm families: dp (one per budget), interval (one per rounded interval), marconi "
                        "(Marconi's admission alone: the plugin's marconi policy, retention 0)")
    p.add_argument("--concurrency", type=Number(CONCURRENCY), default=8, help="requests in flight (closed loop)")
    p.add_argument("--limit", type=Number(COUNT), default=256, help="the first N requests of each trace")
    p.add_argument("--max-input-len", type=Number(TOKENS), default=16384, help="input cap in tokens")
    p.add_argument("--max-num-batched-tokens", type=Number(TOKENS), default=8192,
                   help="vLLM's token budget of one scheduler step (>= 1)")
    p.add_argument("--gpu", default="h100", help="step-time model's GPU (latencies only)")
    p.add_argument("--workers", type=worker_count, default=1, help="points run at once (default 1)")
    add_output(p, "--work-dir", kind="workdir", default=None, help="the replays' requests and logs (default: a temp dir)")
    add_reread(p, "--from-records", metavar="JSONL", help="only redraw the plot and report from earlier records")
    p.set_defaults(func=_cmd_frontier)


def _cmd_frontier(args: argparse.Namespace) -> int:
    import time

    from marconi.io import check_output
    from marconi.lab.frontier import RECORD_FIELDS, FrontierConfig, floor_notes, run_frontier, write_outputs
    from marconi.lab.render import render_records

    check_output(args.out, directory=True)           # before the replays run, not after
    if args.from_records:
        print(render_records(args.from_records, args.out, required=RECORD_FIELDS, kind="`marconi vllm frontier`",
                             write=lambda recs, jsonl, out: write_outputs(recs, out, write_jsonl=jsonl)),
              file=sys.stderr)
        return 0
    from tqdm import tqdm

    pools = ([{"capacity": c} for c in comma_list(args.capacity, "--capacity", str) or ()]
             or [{"gpu_memory": g} for g in comma_list(args.gpu_memory or "80GB", "--gpu-memory", str) or ()])
    from marconi.workloads.source import check_trace_name

    # a catalog name's parameters have commas of their own (swe:sessions=20,seed=1): split as NameList reads
    workloads = tuple(split_name_list(args.traces))
    for workload in workloads:           # every trace named before the first replay, not after the first points
        try:
            check_trace_name(workload)
        except ConfigError as exc:
            raise ConfigError(f"--traces: {exc}") from None
    config = FrontierConfig(vllm_python=args.vllm_python, workloads=workloads,
                            model=args.model, budgets=tuple(comma_list(args.budgets, "--budgets", int) or ()),
                            intervals=tuple(comma_list(args.intervals, "--intervals", int) or ()), pools=tuple(pools),
                            concurrency=args.concurrency, limit=args.limit, max_input_len=args.max_input_len,
                            max_num_batched_tokens=args.max_num_batched_tokens, gpu=args.gpu,
                            families=tuple(comma_list(args.arms, "--arms", str) or ()))
    started = time.perf_counter()
    work = args.work_dir          # None: a temporary folder, removed at the end (marconi.pool.scratch_dir)
    with tqdm(desc="frontier", unit="point", file=sys.stderr, disable=None) as bar:   # a terminal only
        records = run_frontier(config, work_dir=work, workers=args.workers, on_point=lambda _: bar.update(1))
    wall_s = time.perf_counter() - started
    command = "marconi vllm frontier " + " ".join(shlex.quote(a) for a in sys.argv[3:])
    records = [{**r, "command": command, "command_wall_s": wall_s} for r in records]
    paths = write_outputs(records, args.out)
    for line in floor_notes(records):
        print(line, file=sys.stderr)
    print(f"wrote {len(records)} records and {len(paths) - 1} files under {args.out} in {wall_s:.0f}s "
          f"(work in {work or 'a temporary folder, removed'})", file=sys.stderr)
    print((Path(args.out) / "report.md").read_text())
    return 0
