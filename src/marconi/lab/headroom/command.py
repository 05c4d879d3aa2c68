"""``marconi experiment headroom``: the command line (options, progress bar, printing). The only module that prints."""

from __future__ import annotations

import argparse
import shlex
import sys
import time

from marconi.core.model import get_model
from marconi.core.registry import ConfigError, split_name_list
from marconi.lab.option_types import simulator_model
from marconi.units import parse_capacity, request_limit
from marconi.options import CapacityList, add_output, add_reread

__all__ = ["register"]

DESCRIPTION = ("``marconi experiment headroom``: replay the future-aware oracle and the default side by side and "
               "explain where the missing hits come from (records, plots and report.md).")
DEFAULT_TRACES = "swe-sample,sharegpt,mooncake"
DEFAULT_CAPACITIES = "0.02x,0.05x"


def _cmd_headroom(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from marconi.commandline import load_trace, read_files
    from marconi.lab.headroom.report import findings, points, write_outputs
    from marconi.lab.headroom.sessions import derive_sessions
    from marconi.lab.headroom.study import run_point
    from marconi.lab.headroom.variants import VARIANTS, default_system, future_of
    from marconi.io import check_output
    from marconi.sim.replay import working_set_bytes

    traces = split_name_list(args.traces)
    capacities = [c.strip() for c in args.capacities.split(",")]   # checked by argparse (CapacityList)
    spec = get_model(args.model)   # every option is checked before a trace loads
    default_system(args.default)
    if not traces or not capacities:
        raise ConfigError("--traces and --capacities each need at least one entry")
    check_output(args.out, directory=True, inputs=read_files(traces=traces, models=[args.model]))
    if args.from_records:
        return _cmd_render(args)
    started = time.perf_counter()
    loaded = []
    for name in traces:
        trace = load_trace(name, args.limit)
        if len(trace) == 0:
            raise ConfigError(f"trace {name!r} has no requests" + (" (--limit)" if args.limit else ""))
        loaded.append((name, trace))
        print(f"{name}: {len(trace):,} requests, {trace.total_input_tokens:,} input tokens", file=sys.stderr)
    total = sum(len(t) for _, t in loaded) * len(capacities) * len(VARIANTS)
    bar = tqdm(total=total, unit="req", disable=args.quiet or None, file=sys.stderr, desc="headroom")
    records, requests = [], []
    try:
        for name, trace in loaded:
            working_set = working_set_bytes(trace, spec)
            future, derived = future_of(trace), derive_sessions(trace)   # per trace, shared by its points
            for cap in capacities:
                capacity = parse_capacity(cap)
                key = {"trace": name, "capacity": cap, "working_set_bytes": working_set if capacity.fraction else None,
                       "limit": args.limit}
                recs, rows = run_point(trace, key, spec, capacity.resolve(working_set), args.default,
                                       future=future, derived=derived, progress=bar.update)
                records += recs
                requests += rows
    finally:
        bar.close()
    command = "marconi experiment headroom " + " ".join(shlex.quote(a) for a in sys.argv[3:]) \
        if sys.argv[1:3] == ["experiment", "headroom"] else None
    paths = write_outputs(records, args.out, requests=requests, command=command)
    print(f"wrote {len(records)} records, {len(requests)} request rows and {len(paths) - 3} plots with report.md "
          f"to {args.out} in {time.perf_counter() - started:.0f}s", file=sys.stderr)
    for p in points(records):
        print(f"\n{p['trace']} at {p['capacity']}:")
        for line in findings(records, p):
            print(f"  - {line}")
    return 0


# What every record of a run has (what the report reads).
RECORD_FIELDS = ("kind", "trace", "capacity", "model", "default")


def _cmd_render(args: argparse.Namespace) -> int:
    from marconi.lab.headroom.report import write_outputs
    from marconi.lab.render import render_records

    print(render_records(args.from_records, args.out, required=RECORD_FIELDS, kind="`marconi experiment headroom`",
                         write=lambda records, fresh, out: write_outputs(records, out, write_records=fresh)),
          file=sys.stderr)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("headroom", help="anatomy of the gap between the oracle and the default policy",
                              description=DESCRIPTION)
    add_output(p, "--out", kind="dir", required=True, help="directory for records.jsonl, requests.jsonl, plots/ and report.md")
    p.add_argument("--traces", default=DEFAULT_TRACES,
                   help=f"comma list of catalog names or trace files (default: {DEFAULT_TRACES})")
    p.add_argument("--capacities", default=DEFAULT_CAPACITIES, type=CapacityList(),
                   help=f"sizes or working-set fractions (default: {DEFAULT_CAPACITIES})")
    p.add_argument("--model", default="paper-7b", type=simulator_model,
                   help="a model preset (`marconi models`) or a Hugging Face config.json / model directory")
    p.add_argument("--default", default="marconi",
                   help="the online system compared with the oracle (default: marconi, the worlds chooser)")
    p.add_argument("--limit", type=request_limit, default=None, help="only the first N requests of each trace")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_reread(p, "--from-records", metavar="JSONL", help="only redraw the plots and report.md from an earlier run")
    p.set_defaults(func=_cmd_headroom)
