"""``marconi reproduce``: the command line (options, progress bars, printing). The only module that prints.

``--out`` is replaced as a whole once the new report is complete (the earlier report stays whole
until then, and an interrupted run leaves it as it was). So the command says, before it starts,
that an earlier report there will be replaced, and refuses a non-empty directory that holds
anything but a report (its files would be lost), or one that holds an input of the run. The
latency tables (``--jamba-table``, ``--engine-latency``) are read before any simulation too, and
``--quick`` with ``--profile`` is refused (one of them says which profile runs).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from marconi.lab.reproduce.context import PROFILES, with_available_data
from marconi.io import check_output
from marconi.options import add_output
from marconi.sim.backends import capped_workers, worker_count

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "reproduce", help="reproduce the Marconi paper's evaluation (figs. 7-13 + ablations) into one report",
        description="Runs every figure's sweep on real traces and writes report.md, PNG figures and the "
                    "JSONL records behind each figure.")
    size = p.add_mutually_exclusive_group()   # one says which profile runs: both are refused, never resolved
    size.add_argument("--quick", action="store_true", help="smaller traces and fewer points (minutes on 2 cores)")
    size.add_argument("--profile", choices=sorted(PROFILES), default=None,
                      help="full (default) | quick (= --quick) | tiny (CI smoke test: vendored and synthetic data)")
    add_output(p, "--out", kind="dir", default="report",
                   help="output directory (default: report/), replaced as a whole once the new report is complete: "
                        "an earlier report there is replaced (said first); a directory holding anything else "
                        "is refused")
    p.add_argument("--backend", default="local", choices=["local", "ray"],
                   help="local: a process pool on this machine; ray: every point is a Ray task")
    p.add_argument("--address", default=None, help="with --backend ray: join this Ray cluster (default: start one)")
    p.add_argument("--workers", type=worker_count, default=None,
                   help="parallel processes / local Ray CPUs (default: all cores; at most the CPUs)")
    p.add_argument("--lmsys", action="append", default=[], metavar="FILE",
                   help="an LMSys-Chat-1M export (JSON/JSONL/Parquet); repeat for several parts")
    p.add_argument("--tokenizer", default=None, help="tokenizer name or tokenizer.json (default: mistral-v1; "
                                                    "llama2 from ../shared/data for the paper's)")
    p.add_argument("--jamba-table", default=None,
                   help="measured Jamba TTFT CSV (default: ../shared/data/latency/jamba-1.5-mini_4xA100_ttft.csv)")
    p.add_argument("--engine-latency", default=None,
                   help="the engine's measured TTFT: a CSV (tokens, ttft) or `marconi engine bench --out` JSONL")
    p.add_argument("--report-only", action="store_true",
                   help="rewrite report.md and the figures from an earlier run's records in --out (no simulation)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_cmd_reproduce)


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from marconi.lab.reproduce.latency import latency_set
    from marconi.lab.reproduce.pipeline import rerender, run_reproduction

    name = args.profile or ("quick" if args.quick else "full")
    profile = PROFILES[name]
    if args.lmsys:
        profile = profile.with_lmsys(args.lmsys)
    if args.tokenizer:
        profile = replace(profile, source=replace(profile.source, tokenizer=args.tokenizer))
    profile, data_note = with_available_data(profile)
    bars: list[Any] = []

    def progress(desc: str, total: int) -> Callable[[int], None]:
        if bars:
            bars[-1].close()
        bar = tqdm(total=total, desc=desc, unit="point", disable=args.quiet, file=sys.stderr, smoothing=0.05,
                   mininterval=0.5 if sys.stderr.isatty() else 10.0)
        bars.append(bar)
        return bar.update

    started = time.perf_counter()
    # before minutes of simulation, not after: the directory is writable and holds no input of the run
    inputs = [p for p in (args.jamba_table, args.engine_latency, *args.lmsys) if p]
    check_output(args.out, directory=True, inputs=inputs)
    latency_set(args.jamba_table, args.engine_latency)   # the tables the report reads, parsed now (flag, file:line)
    if args.report_only:
        ctx = rerender(profile, args.out, jamba_table=args.jamba_table, engine_latency=args.engine_latency)
        print(f"rewrote {Path(args.out) / 'report.md'} from {len(ctx.records)} records", file=sys.stderr)
        print((Path(args.out) / "summary.md").read_text())
        return 0
    earlier = _earlier_report(Path(args.out))
    workers, note = capped_workers(args.workers, address=args.address)
    print(f"marconi reproduce: profile {name}, backend {args.backend}, writing {args.out}/\n{data_note}"
          + "".join(f"\n{line}" for line in (earlier, note) if line), file=sys.stderr)
    try:
        ctx = run_reproduction(profile, args.out, backend=args.backend, workers=workers, address=args.address,
                               jamba_table=args.jamba_table, engine_latency=args.engine_latency, progress=progress)
    finally:
        for bar in bars:
            bar.close()
    elapsed = time.perf_counter() - started
    summary = Path(args.out) / "summary.md"
    print(f"{len(ctx.records)} simulations in {elapsed:.0f}s; report: {Path(args.out) / 'report.md'}", file=sys.stderr)
    if summary.is_file():
        print(summary.read_text())
    return 0


def _earlier_report(out: Path) -> str | None:
    """What happens to what is in ``out`` already: a line to show, or None (new or empty).

    Raises:
        ConfigError: ``out`` holds files but no report (a ``summary.json`` without a profile is
            none), or a report and files it did not write (its
            summary's ``files``; an older report without that list: anything but its JSONL, PNG, Markdown
            and JSON files): they would be lost with the directory.
    """
    from marconi.core.jsonfile import read_json
    from marconi.core.registry import ConfigError
    from marconi.io import refuse_foreign_files

    if not out.is_dir() or not any(out.iterdir()):
        return None
    if not (out / "summary.json").is_file():
        raise ConfigError(f"--out {out} is not empty and holds no `marconi reproduce` report (no summary.json): "
                          "the report replaces the whole directory, so its files would be lost; choose a new or "
                          "empty directory")
    try:
        summary = read_json(out / "summary.json")
    except ValueError:
        summary = None
    if not (isinstance(summary, dict) and isinstance(summary.get("profile"), str)):
        # a damaged summary, or another tool's: nothing says which files are a report's
        raise ConfigError(f"--out {out} holds a summary.json that is not a `marconi reproduce` report's (no "
                          "profile): the report replaces the whole directory, so its files would be lost; "
                          "choose a new or empty directory")
    listed = summary.get("files")
    if isinstance(listed, list):
        extra = sorted(p.name for p in out.iterdir() if p.name not in listed)
    else:
        extra = sorted(p.name for p in out.iterdir() if p.is_dir() or p.suffix not in (".jsonl", ".png", ".md", ".json"))
    refuse_foreign_files(out, extra, noun="directory")
    profile = summary.get("profile")
    return (f"the report already in {out}" + (f" (profile {profile})" if isinstance(profile, str) else "")
            + " is replaced once this run completes; until then it stays as it is")
