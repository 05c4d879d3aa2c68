"""``marconi experiment sparse``: the command line (options, progress bar, printing). The only module that prints."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

from marconi.lab.option_types import simulator_model
from marconi.lab.sparse.report import findings, write_outputs
from marconi.lab.sparse.study import DEFAULT_WORKLOADS, LARGE, StudyConfig, plan_tasks, run_study
from marconi.lab.sparse.workloads import WORKLOADS, study_workload
from marconi.core.registry import ConfigError
from marconi.io import check_output
from marconi.options import (CHECKPOINT_BUDGET, SEED, CapacityList, NameList, Number, NumberList,
                             add_output, add_reread)
from marconi.sim.backends import worker_count
from marconi.workloads.paths import shared_data_where

__all__ = ["register"]

DESCRIPTION = "``marconi experiment sparse``: exact checkpoint placement (the DP) against placement heuristics."


def _cmd_sparse(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    check_output(args.out, directory=True)  # before the study runs, not after
    if args.from_records:
        return _cmd_render(args)
    if args.drift:
        return _cmd_drift(args)

    config = StudyConfig.for_run(
        quick=args.quick, tiny=args.tiny, model=args.model, seed=args.seed, workers=args.workers,
        workloads=args.workloads, budgets=tuple(sorted(args.budgets)) if args.budgets else None,
        capacities=args.capacities)
    started = time.perf_counter()
    workloads, notes = [], []
    for name in config.workloads:
        w = study_workload(name, config.scale, config.seed)
        if w is None:
            notes.append(f"{name}: skipped — its data is absent ({shared_data_where()}) and it has no fallback")
        else:
            workloads.append(w)
            if w.source.startswith("FALLBACK"):
                notes.append(f"{name}: {w.source}")
        print(f"{name}: " + (f"{len(w.trace):,} requests, {w.trace.total_input_tokens:,} input tokens — {w.source}"
                             if w else "skipped (data absent)"), file=sys.stderr)
    if not workloads:
        raise ConfigError("no workload could be built")
    tasks = plan_tasks(config, workloads)
    print(f"{len(tasks)} tasks (simulation points + one analytic frontier per workload), "
          f"built in {time.perf_counter() - started:.1f}s", file=sys.stderr)
    bar = tqdm(total=len(tasks), unit="point", disable=args.quiet or None, file=sys.stderr, desc="sparse")
    records = run_study(config, workloads, on_done=lambda task: bar.update(1))
    bar.close()
    paths = write_outputs(records, args.out, notes)
    print(f"wrote {len(records)} records, {len(paths) - 2} plots and the summary to {args.out} "
          f"in {time.perf_counter() - started:.0f}s", file=sys.stderr)
    for w in workloads:
        print(f"\n{w.name}:")
        for line in findings(records, w.name, config.capacities[0]):
            print(f"  - {line}")
    return 0


def _cmd_drift(args: argparse.Namespace) -> int:
    from marconi.core.model import get_model
    from marconi.lab.sparse.drift import drift_records, drift_trace, plot_drift
    from marconi.io import output_group, write_jsonl

    trace = drift_trace(seed=args.seed)
    records = drift_records(trace, get_model(args.model))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with output_group():      # the records and their plot together, or neither
        write_jsonl(out / "drift.jsonl", records)
        plot_drift(records, str(out / "drift.png"))
    print(f"{trace.name}: {len(trace)} requests, shift at request {trace.meta['shift_index']}")
    for r in records:
        if r["scope"] == "phase":
            print(f"  {r['label']:30s} phase {r['phase'] + 1}: {100 * r['recomputed_flops_fraction']:.2f}% "
                  f"of prefill FLOPs recomputed, {r['checkpoints_per_seq']:.2f} checkpoints per request")
    print(f"wrote {out / 'drift.jsonl'} and {out / 'drift.png'}", file=sys.stderr)
    return 0


# What every record of a study has (what the plots and the summary read).
RECORD_FIELDS = ("kind", "workload", "strategy", "label", "budget", "block", "break_even_tokens")


def _cmd_render(args: argparse.Namespace) -> int:
    from marconi.lab.render import render_records

    print(render_records(args.from_records, args.out, required=RECORD_FIELDS, kind="`marconi experiment sparse`",
                         write=lambda records, fresh, out: write_outputs(records, out, write_jsonl=fresh)),
          file=sys.stderr)
    return 0


def _workloads(text: str) -> tuple[str, ...]:
    """argparse ``type=`` of ``--workloads``: a comma list of the study's workloads, each once."""
    names = NameList("workload")(text)
    items = tuple(w.strip() for w in names.split(","))
    unknown = [w for w in items if w not in WORKLOADS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown workload{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                                         f"choose from {', '.join(WORKLOADS)}")
    return items


def _capacities(text: str) -> tuple[str, ...]:
    """argparse ``type=`` of ``--capacities``: 'large' (unbounded) and/or sizes or working-set fractions."""
    items = [c.strip() for c in str(text).split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(f"expected a comma list of {LARGE}, sizes (10GB) or fractions of the "
                                         f"working set (0.05x), got {text!r}")
    if items.count(LARGE) > 1:
        raise argparse.ArgumentTypeError(f"{LARGE!r} given twice: give each capacity once")
    sized = [c for c in items if c != LARGE]
    if sized:
        CapacityList(allow_zero=False)(",".join(sized))   # ArgumentTypeError naming the item: not a size, 0, twice
    return tuple(items)


# The sparse DP places at least one state per sequence (CHECKPOINT_BUDGET also admits 0, "none").
_BUDGET = replace(CHECKPOINT_BUDGET, lo=1)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("sparse", help="sparse prefix caching: DP checkpoint placement vs heuristics",
                              description=DESCRIPTION)
    add_output(p, "--out", kind="dir", required=True, help="directory for records.jsonl, plots/ and summary.md")
    size = p.add_mutually_exclusive_group()   # one says which size runs: both are refused, never resolved
    size.add_argument("--quick", action="store_true", help="M in {1,2,4,8}, smaller traces (a few minutes)")
    size.add_argument("--tiny", action="store_true", help="smallest traces, M in {1,2,4,8} (a smoke test)")
    p.add_argument("--workloads", type=_workloads,
                   help=f"comma list from {', '.join(WORKLOADS)} (default: {','.join(DEFAULT_WORKLOADS)})")
    p.add_argument("--budgets", type=NumberList(_BUDGET), help="comma list of M (default 1..16; --quick/--tiny: 1,2,4,8)")
    p.add_argument("--capacities", type=_capacities,
                   help="'large' (unbounded) and/or sizes or working-set fractions, e.g. large,0.25x")
    p.add_argument("--model", default="paper-7b", type=simulator_model,
                   help="a model preset (`marconi models`) or a Hugging Face config.json / model directory")
    p.add_argument("--seed", type=Number(SEED), default=0)
    p.add_argument("--workers", type=worker_count, default=None, help="parallel processes (default: one per core)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--drift", action="store_true",
                   help="only the estimator's drift study (doc-QA whose question depths shift halfway)")
    add_reread(p, "--from-records", metavar="JSONL", help="only redraw plots and summary from an earlier run's records")
    p.set_defaults(func=_cmd_sparse)
