"""``marconi`` command line: models, systems, simulate, compare, demo, trace …, engine …, vllm …, sglang …,
and the lab's commands (experiment …, reproduce, engine bench, vllm bench, vllm frontier, sglang bench;
:mod:`marconi.lab.commands`).

Every sub-command is a function ``(args) -> exit code``; library code never prints, this does.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from marconi.commandline import load_trace, read_files
from marconi.pool import sigterm_raises, sigterm_received
from marconi.core.registry import ConfigError, split_name_list
from marconi.sim.backends import worker_count
from marconi.units import request_limit

__all__ = ["main", "guard_outputs", "build_parser", "PICTURE_SUFFIXES"]

#: Names that say "picture": a text output (``add_output`` without ``suffixes``) is refused under them.
PICTURE_SUFFIXES = (".png", ".jpg", ".jpeg", ".svg", ".pdf", ".gif", ".webp")


def guard_outputs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Before any command, every :func:`~marconi.options.add_output` option of the chosen sub-command goes
    through :func:`marconi.io.check_output` with every other named path as input, and an output written
    in one format only (its ``suffixes``: a plot's ``.png``) must be named so; first, two outputs may
    not be the same file, and an output of text (records, a trace) may not be named as a picture
    (:data:`PICTURE_SUFFIXES`: ``simulate --out R.png`` wrote JSONL under that name). A folder output
    (``dir``, ``workdir``) is never ``-`` (a stream), nor empty where the option always writes (it is
    required, or has a default): there an empty value would name the working directory, not mean
    "skip". ConfigError naming the option, the path and the fix."""
    from marconi.io import check_output, is_stream
    from marconi.options import chosen_actions, is_reread, output_kind, output_suffixes, values_of

    actions = chosen_actions(parser, args)
    for action in actions:          # before the empty values are dropped below as "skip"
        if output_kind(action) not in ("dir", "workdir"):
            continue
        flag = action.option_strings[-1] if action.option_strings else action.dest
        for value in values_of(getattr(args, action.dest, None)):
            if value == "-":
                raise ConfigError(f"{flag} -: {flag} is a folder, not a stream: give a folder's path")
            if value == "" and (action.required or action.default):
                raise ConfigError(f"{flag}: empty: give a folder (an empty path would be the working directory)")
    outputs = [(a, v) for a in actions if output_kind(a) for v in values_of(getattr(args, a.dest, None)) if v]
    if not outputs:
        return
    items = [item.strip() for a in actions if not output_kind(a)
             for v in values_of(getattr(args, a.dest, None)) for item in v.split(",") if item.strip()]
    inputs = read_files(traces=items, files=items)
    reread = [p for a in actions if is_reread(a) for p in values_of(getattr(args, a.dest, None)) if p]
    files: dict[str, str] = {}
    for action, path in outputs:        # two outputs in one file first: that says more than either's name
        flag = action.option_strings[-1] if action.option_strings else action.dest
        if output_kind(action) == "file" and not is_stream(path):  # /dev/null twice is fine
            real = os.path.realpath(path)
            if real in files:
                raise ConfigError(f"{flag} {path} is also {files[real]}: give each output its own file")
            files[real] = f"{flag} {path}"
    for action, path in outputs:
        flag, kind = action.option_strings[-1] if action.option_strings else action.dest, output_kind(action)
        if kind == "workdir":
            check_output(path, directory=True, option=flag)
            continue
        if kind == "file" and not output_suffixes(action) and not is_stream(path):
            picture = Path(path).suffix.lower()
            if picture in PICTURE_SUFFIXES:     # a text output (records, a trace) under a picture's name
                raise ConfigError(f"{flag} {path} names a {picture[1:].upper()} picture, but {flag} writes text "
                                  f"(JSONL): give it a .jsonl name (e.g. {Path(path).with_suffix('.jsonl')})")
        # a directory replaced as a whole may hold the records it is re-rendered from (read first)
        check_output(path, directory=kind == "dir", option=flag, suffixes=output_suffixes(action),
                     inputs=[i for i in inputs if not (kind == "dir" and i in reread)])


# --------------------------------------------------------------------------- models / systems
def _cmd_models(args: argparse.Namespace) -> int:
    from marconi.core.model import PRESETS
    from marconi.report import format_table
    from marconi.units import format_bytes

    rows = [{**s.describe(), "kv": format_bytes(s.kv_bytes_per_token), "ssm": format_bytes(s.ssm_checkpoint_bytes),
             "tokens_per_ckpt": (s.ssm_checkpoint_bytes / s.kv_bytes_per_token) if s.kv_bytes_per_token else None,
             "source": s.source} for s in PRESETS.values()]
    print(format_table(rows, [("model", "model", None), ("attn", "attn_layers", None), ("ssm", "ssm_layers", None),
                              ("mlp", "mlp_layers", None), ("D", "d_model", None), ("N", "ssm_state_dim", None),
                              ("KV bytes/token", "kv_bytes_per_token", lambda v: f"{v:,}"),
                              ("SSM bytes/checkpoint", "ssm_checkpoint_bytes", lambda v: f"{v:,}"),
                              ("ckpt = KV of n tokens", "tokens_per_ckpt", lambda v: f"{v:,.0f}"),
                              ("source", "source", None)]))
    return 0


def _cmd_systems(args: argparse.Namespace) -> int:
    from marconi.core.admission import ADMISSION_POLICIES
    from marconi.core.eviction import EVICTION_POLICIES
    from marconi.sim.systems import SYSTEMS

    for title, registry in (("systems", SYSTEMS), ("admission policies", ADMISSION_POLICIES),
                            ("eviction policies", EVICTION_POLICIES)):
        print(f"{title}:")
        for name, doc in registry.describe().items():
            domains = registry.domains_of(name)
            params = ", ".join(f"{k}={v}" + (f" in {domains[k].interval()}" if k in domains else "")
                               for k, v in registry.params_of(name).items())
            print(f"  {name:22s} {doc}" + (f"  [{params}]" if params else ""))
    return 0


# --------------------------------------------------------------------------- simulate / compare
_SIM_COLUMNS: list[tuple[str, str, Any]] = []


def _not_cached_notes(records: Sequence[dict[str, Any]]) -> list[str]:
    """A note per point where requests went uncached whole (``requests_not_cached``): an insertion is
    all or nothing, so a request larger than the cache leaves no prefix behind, and a hit rate can
    jump from 0 between two capacities."""
    return [f"note: {r['system']} at {r.get('capacity') or r.get('capacity_bytes')}: {r['requests_not_cached']:,} of "
            f"{r['num_requests']:,} requests did not fit the cache whole (after evicting everything else) and were "
            "not cached at all: an insertion is all or nothing; a larger --capacity holds them"
            for r in records if r.get("requests_not_cached")]


def _sim_table(records: Sequence[dict[str, Any]]) -> str:
    from marconi.report import fmt_pct as pct
    from marconi.report import fmt_seconds as fmt_s
    from marconi.report import format_table
    from marconi.units import format_bytes

    return format_table(records, [
        ("system", "system", None), ("model", "model", None), ("capacity", "capacity_bytes", format_bytes),
        ("requests", "num_requests", None), ("token hit", "token_hit_rate", pct),
        ("KV hit", "kv_hit_rate", pct), ("unusable", "unusable_rate", pct),
        ("hit P5", "hit_rate_p5", pct), ("hit P50", "hit_rate_p50", pct), ("hit P95", "hit_rate_p95", pct),
        ("FLOPs saved", "flops_saved_fraction", pct),
        ("TTFT P5", "ttft_p5_s", fmt_s), ("TTFT P50", "ttft_p50_s", fmt_s), ("TTFT P95", "ttft_p95_s", fmt_s),
        ("ckpt adm/evict/reuse", "_ckpts", None), ("alpha", "_alpha", None), ("req/s", "requests_per_s",
                                                                              lambda v: f"{v:,.0f}"),
    ])


def _decorate(rec: dict[str, Any]) -> dict[str, Any]:
    out = dict(rec)
    out["_ckpts"] = f"{rec['checkpoints_admitted']}/{rec['checkpoints_evicted']}/{rec['checkpoints_reused']}"
    alphas = rec.get("tuned_alphas") or []
    out["_alpha"] = ",".join(f"{a:g}" for _, a in alphas) if alphas else None
    return out


def _cmd_simulate(args: argparse.Namespace) -> int:
    importlib.import_module("tqdm")     # the bar's extra ([sim]): a missing one is said before the trace loads

    from marconi.io import check_output, check_records_file
    from marconi.sim.latency import make_latency
    from marconi.sim.sweep import PointsFailed, expand_points, run_sweep, write_records
    from marconi.workloads.trace import session_warnings

    # Everything that can be checked without the trace is checked before it loads (the backend:
    # is ray there?), and --out before the sweep runs: a result is never computed and then lost to
    # an unwritable or clobbering --out. A sweep with failed points never replaces --out: what
    # finished goes to the .partial file beside it (checked here too).
    points = expand_points(split_name_list(args.systems), [c.strip() for c in args.capacity.split(",")],
                           [m.strip() for m in args.model.split(",")], args.mode)
    try:
        make_latency(args.latency)
    except ConfigError as exc:
        raise ConfigError(f"--latency: {exc}") from None
    backend, workers = _backend(args)
    try:
        if args.out:
            inputs = read_files(traces=[args.trace], models=[args.model], files=[args.latency])
            check_output(args.out, inputs=inputs)
            check_output(_kept_at(args.out, failed=True), inputs=inputs, option=_partial_option("--out"))
            check_records_file(args.out, "system")
        started = time.perf_counter()
        trace = load_trace(args.trace, args.limit)
        if len(trace) == 0:
            raise ConfigError(f"trace {args.trace!r} has no requests" + (" (--limit)" if args.limit else "")
                              + ": nothing to simulate")
        for warning in session_warnings(trace, args.trace):
            if warning.field == "turn_id":  # repeated (session, turn) pairs; `trace validate` says more
                print(warning, file=sys.stderr)
        print(f"trace {args.trace}: {len(trace):,} requests, {trace.total_input_tokens:,} input tokens "
              f"(loaded in {time.perf_counter() - started:.1f}s); {len(points)} points on the {backend.name} "
              "backend", file=sys.stderr)
        failed: PointsFailed | None = None
        finished: list[dict[str, Any]] = []      # as they finish: what an interrupt keeps
        try:
            with _request_bar(len(points), len(trace), args.quiet) as on_record:
                records = run_sweep(trace, args.trace, points, latency=args.latency, mode=args.mode, workers=workers,
                                    per_request=not args.no_per_request, backend=backend,
                                    on_record=lambda r: (finished.append(r), on_record(r)))
        except PointsFailed as exc:  # the finished points are kept: shown, written beside --out, then the error
            failed, records = exc, exc.records
        except KeyboardInterrupt:    # Ctrl-C or SIGTERM: the points that finished go beside --out, not lost
            if args.out:
                _keep_interrupted(finished, len(points), args.out)
            raise
    finally:
        backend.close()
    if records:  # the table first: a full disk or a failed point must not lose the results
        print(_sim_table([_decorate(r) for r in records]))
        for note in _not_cached_notes(records):
            print(note, file=sys.stderr)
    if args.out and records:
        try:
            if failed is None:
                written, kept = write_records(records, args.out), 0
            else:
                written, kept = _write_partial(records, args.out)
        except KeyboardInterrupt:      # while writing: the records, all finished, go beside --out
            _keep_interrupted(records, len(records), args.out)
            raise
        print(f"wrote {len(records)} record{'s' if len(records) != 1 else ''} to {written}" + _earlier(kept)
              + _left_unchanged(failed, [("--out", args.out)]), file=sys.stderr)
        if failed is None:
            _drop_superseded(records, args.out)
    if failed is not None:
        raise failed
    return 0


@contextmanager
def _request_bar(points: int, requests: int, quiet: bool) -> Iterator[Callable[[Any], None]]:
    """A progress bar of a sweep in requests replayed over all its points (one point is a whole
    replay: minutes on a large trace, which a bar of points shows as nothing moving), redrawn twice
    a second from the workers' shared count (:func:`marconi.sim.sweep.counting_requests`), with the
    points finished beside it. Yields the sweep's ``on_record``; a point finished counts whole
    (points run where the count cannot reach, on ray, move the bar by point)."""
    import threading

    from tqdm import tqdm

    from marconi.sim.sweep import counting_requests

    total = points * requests
    bar = tqdm(total=total, unit="req", unit_scale=True, disable=quiet or None, file=sys.stderr,
               smoothing=0.1)   # None: drawn on a terminal only (not into a log file)
    finished = 0
    stop = threading.Event()
    with counting_requests() as replayed:
        def show() -> None:
            bar.n = min(total, max(replayed(), finished * requests))
            bar.set_postfix_str(f"{finished}/{points} points", refresh=False)
            bar.refresh()

        def on_record(_record: Any) -> None:
            nonlocal finished
            finished += 1
            show()

        def redraw() -> None:
            while not stop.wait(0.5):
                show()

        thread = threading.Thread(target=redraw, name="marconi-progress", daemon=True)
        if not quiet:
            thread.start()
        try:
            yield on_record
        finally:
            stop.set()
            if thread.is_alive():
                thread.join()
            bar.close()


def _drop_superseded(records: Sequence[dict[str, Any]], out: str | Path, *beside: str | Path) -> None:
    """After a run whose every point ran and was written to ``out``: the ``.partial`` files an earlier
    failed or interrupted run left beside ``out`` (and beside the ``beside`` outputs) are removed when
    every point they hold is one of ``records`` (they would otherwise stay, read as this run's); one
    that holds other points (another trace, system or capacity) is kept, and said so."""
    partial = _kept_at(out, True)
    if partial == Path(out) or not partial.is_file():
        return
    earlier = _partial_records(partial)
    ran = {_point_key(r) for r in records}
    if earlier is None or any(_point_key(r) not in ran for r in earlier):
        print(f"kept {partial}: it holds points of an earlier run that this one did not run", file=sys.stderr)
        return
    for path in (out, *beside):
        stale = _kept_at(path, True)
        if stale != Path(path) and stale.is_file():
            stale.unlink()
            print(f"removed {stale}, an earlier run's partial results: {path} has every point of it",
                  file=sys.stderr)


#: The fields that name a point of a sweep or a curve in its records (what a rerun of it repeats).
_POINT_FIELDS = ("trace", "model", "system", "capacity", "capacity_bytes", "fraction", "mode", "latency",
                 "num_requests")


def _point_key(record: dict[str, Any]) -> tuple[str, ...]:
    return tuple(repr(record.get(name)) for name in _POINT_FIELDS)


def _partial_records(path: Path) -> list[dict[str, Any]] | None:
    """The records in an earlier run's ``.partial`` file, or None where it does not read as records."""
    from marconi.io import read_jsonl

    try:
        rows = read_jsonl(path)
    except (OSError, ValueError):        # JsonError (a ValueError) names a bad line or a file not UTF-8
        return None
    return rows if all(isinstance(r, dict) and "system" in r for r in rows) else None


def _write_partial(records: Sequence[dict[str, Any]], out: str | Path) -> tuple[Path, int]:
    """Write ``records`` where a run whose points did not all run puts them (:func:`_kept_at`), keeping
    the points of an earlier run's ``.partial`` file there that these do not repeat (a second failed
    or interrupted run must not lose the first one's points). Returns the path and how many earlier
    points were kept. A stream is written through."""
    from marconi.io import is_stream
    from marconi.sim.sweep import write_records

    target = _kept_at(out, True)
    if is_stream(out) or not target.is_file():
        return write_records(records, target), 0
    ran = {_point_key(r) for r in records}
    earlier = [r for r in (_partial_records(target) or []) if _point_key(r) not in ran]
    return write_records([*earlier, *records], target), len(earlier)


def _earlier(kept: int) -> str:
    """What the ``wrote ...`` line adds where an earlier run's partial points were kept beside."""
    return f" (with {kept} point{'s' if kept != 1 else ''} of an earlier run kept there)" if kept else ""


def _partial_option(flag: str) -> str:
    """How a check names the file beside ``flag``'s that a run with failed points writes instead."""
    return f"{flag} (its .partial file, for a run with failed points)"


def _kept_at(path: str | Path, failed: bool) -> Path:
    """Where results meant for ``path`` are written: ``path``; after a run whose points did not all
    run, :func:`marconi.io.partial_path` beside it, so that a failed run never replaces an earlier
    good file (a stream such as ``/dev/stdout`` replaces nothing and is written through)."""
    from marconi.io import is_stream, partial_path

    return Path(path) if not failed or is_stream(path) else partial_path(path)


def _keep_interrupted(finished: list[dict[str, Any]], total: int, out: str | Path, *left: str | Path) -> None:
    """After an interrupt: the records of the points that ``finished`` (of ``total``) go where a run with
    failed points puts them (:func:`_write_partial`: beside ``out``, with an earlier partial run's other
    points kept), and ``out`` (and the ``left`` outputs beside it) stay as they were; nothing where
    none finished, or ``out`` is a stream."""
    from marconi.io import is_stream

    if not finished or is_stream(out):
        return
    kept, earlier = _write_partial(finished, out)
    unchanged = [str(p) for p in (out, *left)]
    print(f"interrupted after {len(finished)} of {total} points: they are in {kept}{_earlier(earlier)} "
          f"({' and '.join(unchanged)} left as {'it was' if len(unchanged) == 1 else 'they were'})", file=sys.stderr)


def _left_unchanged(failed: Any, outputs: Sequence[tuple[str, str | Path]]) -> str:
    """What the ``wrote ...`` line adds after a failed run: how many points are missing, and which
    outputs were left as they were."""
    if failed is None:
        return ""
    kept = [f"{flag} {path}" for flag, path in outputs if _kept_at(path, True) != Path(path)]
    return (f" (the points that finished; {len(failed.failures)} could not run)"
            + (f": {' and '.join(kept)} left unchanged" if kept else ""))


def _backend(args: argparse.Namespace) -> tuple[Any, int | None]:
    """The sweep backend of ``--backend/--address/--workers`` (made before the trace loads) and the
    worker count, capped to the CPUs with a notice."""
    from marconi.sim.backends import capped_workers, make_backend

    address = getattr(args, "address", None)
    workers, note = capped_workers(args.workers, address=address)
    if note:
        print(f"marconi {getattr(args, 'command', 'simulate')}: {note}", file=sys.stderr)
    return make_backend(getattr(args, "backend", "local"), workers=workers, address=address), workers


def _cmd_compare(args: argparse.Namespace) -> int:
    from marconi.io import check_output
    from marconi.report import fmt_pct as pct
    from marconi.report import fmt_seconds as fmt_s
    from marconi.report import fmt_times, format_table
    from marconi.sim.compare import gains, plot_records, repeated_points
    from marconi.sim.sweep import RESULT_FIELDS, RESULT_TYPES, read_records

    records = read_records(args.results, RESULT_FIELDS, kind="`marconi simulate --out` results", types=RESULT_TYPES)
    if not records:
        raise ConfigError(f"{args.results}: no records (expected what `marconi simulate --out` writes)")
    rows = gains(records)
    repeats = repeated_points(records)
    if repeats:
        print(f"marconi compare: NOTE: {repeats} record{'s' * (repeats != 1)} in {args.results} repeat a point "
              "(trace, model, capacity, mode, latency, system) of an earlier one: each gets its own row",
              file=sys.stderr)
    # mode and latency model set a point apart: shown where the records differ in them
    varies = [(name, key, None) for name, key in (("mode", "mode"), ("latency", "latency"))
              if len({r[key] for r in rows}) > 1]
    print(format_table(rows, [("trace", "trace", None), ("model", "model", None), ("capacity", "capacity", None),
                              *varies, ("system", "system", None), ("token hit", "token_hit_rate", pct),
                              ("vs vLLM+", "vs_vllm_x", fmt_times), ("vs SGLang+", "vs_sglang_pct", pct),
                              ("of oracle", "of_oracle", pct), ("of infinite", "of_infinite", pct),
                              ("hit P95", "hit_rate_p95", pct), ("TTFT P95", "ttft_p95_s", fmt_s),
                              ("P95 TTFT vs vanilla", "p95_ttft_vs_vanilla", pct)]))
    plots_dir = Path(args.plots) if args.plots else Path(args.results).with_suffix("").parent / (
        Path(args.results).stem + "_plots")
    check_output(plots_dir, directory=True, option="--plots")
    paths = plot_records(records, plots_dir)
    removed: list[Path] = []
    if not args.plots:   # the results' own folder: an earlier run's plots of other traces or capacities go
        from marconi.report import drop_stale_plots
        removed = drop_stale_plots(plots_dir, ("*_hit_rate.png", "*_requests.png"), paths)
    print(f"wrote {len(paths)} plot{'s' if len(paths) != 1 else ''} to {plots_dir}"
          + (f"; removed {len(removed)} an earlier compare wrote there that no record of these supports: "
             + ", ".join(p.name for p in removed) if removed else ""), file=sys.stderr)
    return 0


def _cmd_mrc(args: argparse.Namespace) -> int:
    """Miss-ratio curves: hit rate vs capacity per system, with oracle and infinite, JSONL + PNG."""
    importlib.import_module("tqdm")     # the bar's extra ([sim]): a missing one is said before the trace loads
    if len(split_name_list(args.model)) > 1:
        raise ConfigError(f"--model {args.model}: a miss-ratio curve is one model's; give one model "
                          "(several: marconi mrc once per model, or marconi simulate --model A,B)")

    from marconi.io import check_output, check_records_file, output_group
    from marconi.report import fmt_pct as pct
    from marconi.report import format_table
    from marconi.sim.mrc import DEFAULT_LO, capacity_fractions, mrc_points, plot_mrc, run_mrc
    from marconi.sim.sweep import PointsFailed, write_records
    from marconi.units import format_bytes

    out = Path(args.out)
    png = Path(args.plot) if args.plot else out.with_suffix(".png")
    if os.path.realpath(out) == os.path.realpath(png):
        raise ConfigError(f"--plot {png} is the --out file: give the plot another name (e.g. {out.with_suffix('.png')})")
    inputs = read_files(traces=[args.trace], models=[args.model])
    check_output(out, inputs=inputs)  # before the sweep, not after
    check_output(png, inputs=inputs, option="--plot")     # a --plot given was checked by the guard, its .png too
    check_output(_kept_at(out, failed=True), inputs=inputs, option=_partial_option("--out"))
    check_output(_kept_at(png, failed=True), inputs=inputs, option=_partial_option("--plot"))
    check_records_file(out, "system")
    systems = split_name_list(args.systems)
    lo = DEFAULT_LO if args.lo is None else args.lo    # not given: raised where the working set is small
    fractions = capacity_fractions(args.points, lo)
    if len(fractions) < args.points:
        print(f"marconi mrc: --points {args.points} from --lo {lo:g} gives only {len(fractions)} distinct "
              f"capacities (fractions of the working set, to 6 significant digits): running those "
              f"{len(fractions)}", file=sys.stderr)
    total = len(mrc_points(systems, model=args.model, points=args.points, lo=lo, ceilings=not args.no_ceilings))
    backend, workers = _backend(args)
    try:
        trace = load_trace(args.trace, args.limit)
        failed: PointsFailed | None = None
        finished: list[dict[str, Any]] = []      # as they finish: what an interrupt keeps
        try:
            with _request_bar(total, len(trace), args.quiet) as on_record:
                records = run_mrc(trace, args.trace, systems, model=args.model, points=args.points, lo=lo,
                                  ceilings=not args.no_ceilings, workers=workers, backend=backend,
                                  on_record=lambda r: (finished.append(r), on_record(r)), raise_lo=args.lo is None)
        except PointsFailed as exc:  # the curve of the capacities that ran is kept
            failed, records = exc, exc.records
        except KeyboardInterrupt:    # Ctrl-C or SIGTERM: the points that finished go beside --out, not lost
            _keep_interrupted(finished, total, out, png)
            raise
    finally:
        backend.close()
    if not records:
        raise failed or ConfigError("no point of the curve ran")
    smallest = min(r["fraction"] for r in records if r["system"] != "infinite")
    if args.lo is None and smallest > lo:
        print(f"marconi mrc: NOTE: the curve starts at {smallest:g}x of the working set, not {lo:g}x: below "
              f"that a system cannot run on this trace (no SSM checkpoint of {args.model} fits, or an emulated "
              "engine's least pool does not hold the longest request); --lo sets the start", file=sys.stderr)
    by_cap: dict[float, dict[str, Any]] = {}
    for r in records:
        if r["system"] != "infinite":
            row = by_cap.setdefault(r["fraction"], {"fraction": r["fraction"], "capacity": r["capacity_bytes"]})
            row[r["system"]] = r["token_hit_rate"]
    names = list(dict.fromkeys(r["system"] for r in records if r["system"] != "infinite"))
    print(format_table([by_cap[k] for k in sorted(by_cap)],
                       [("of working set", "fraction", lambda v: f"{v:.3g}x"), ("capacity", "capacity", format_bytes)]
                       + [(n, n, pct) for n in names]))
    ceiling = next((r["token_hit_rate"] for r in records if r["system"] == "infinite"), None)
    if ceiling is not None:
        print(f"infinite (unbounded capacity): {pct(ceiling)}")
    # after the table: a full disk must not lose the results
    try:
        with output_group():     # the records and their plot together, or neither
            written = write_records(records, _kept_at(out, failed is not None))
            plotted = plot_mrc(records, _kept_at(png, failed is not None))
    except KeyboardInterrupt:    # while writing: the curve's records, all finished, go beside --out
        _keep_interrupted(records, len(records), out, png)
        raise
    print(f"wrote {len(records)} records to {written} and the plot to {plotted}"
          + _left_unchanged(failed, [("--out", out), ("--plot", png)]), file=sys.stderr)
    if failed is None:
        _drop_superseded(records, out, png)
    if failed is not None:
        raise failed
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    """The systems on a bundled real trace at two capacities with the oracle and infinite ceilings, then
    its miss-ratio curve (of one model: ConfigError for several, before anything runs)."""
    from marconi.core.registry import ConfigError, split_name_list

    if len(split_name_list(args.model)) > 1:     # the curve is one model's: refused before the sweep writes
        raise ConfigError(f"--model {args.model}: the demo draws one model's miss-ratio curve; give one model "
                          "(several: marconi simulate --model A,B and marconi mrc --model A)")
    ns = argparse.Namespace(trace=args.trace, systems="vanilla,vllm+,sglang+,marconi,marconi:selector=regret,oracle,infinite",
                            capacity=args.capacity, model=args.model, out=args.out, latency="a100", mode="sequential",
                            workers=None, limit=None, no_per_request=False, quiet=False)
    code = _cmd_simulate(ns)
    mrc_out = Path(args.out).with_name(Path(args.out).stem + "_mrc.jsonl") if args.out else None
    if code == 0 and mrc_out is not None:
        # the records are this run's now: an earlier run's curve beside them would read as this trace's
        # if the curve below is interrupted
        for stale in (mrc_out, mrc_out.with_suffix(".png")):
            stale.unlink(missing_ok=True)
        code = _cmd_compare(argparse.Namespace(results=args.out, plots=None))
    if code == 0 and mrc_out is not None:
        code = _cmd_mrc(argparse.Namespace(trace=args.trace, systems="vllm+,sglang+,marconi,marconi:selector=regret",
                                           points=12, lo=None,
                                           model=args.model, out=str(mrc_out),
                                           plot=None, no_ceilings=False, workers=None, backend="local", address=None,
                                           limit=None, quiet=False))
    return code


# --------------------------------------------------------------------------- parser


# The library's command modules, each with ``register(subparsers)``, and the group name of those
# whose ``register`` returns its group's subparsers object; then the lab's commands, which add
# leaves to those groups (the library never imports the lab).
_LIBRARY_COMMANDS = (("marconi.workloads.commands", None), ("marconi.engine.commands", "engine"),
                     ("marconi.integrations.vllm.commands", "vllm"), ("marconi.integrations.sglang.commands", "sglang"))
_LAB_COMMANDS = "marconi.lab.commands"


def build_parser() -> argparse.ArgumentParser:
    """The ``marconi`` parser: every numeric option typed with its domain, every output marked
    (:mod:`marconi.options`)."""
    from marconi.core.registry import Domain
    from marconi.options import PLOT_SUFFIXES, CapacityList, NameList, Number, add_output

    systems, models = NameList("system"), NameList("model")

    parser = argparse.ArgumentParser(prog="marconi", description="Prefix caching for hybrid LLMs.")
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("models", help="list model presets with KV bytes per token and SSM bytes per checkpoint"
                   ).set_defaults(func=_cmd_models)
    sub.add_parser("systems", help="list caching systems and policies with their parameters"
                   ).set_defaults(func=_cmd_systems)

    sim = sub.add_parser("simulate", help="replay a trace through caching systems (a sweep)")
    sim.add_argument("--trace", required=True,
                     help="JSONL/Parquet trace or a catalog workload (marconi trace list)")
    sim.add_argument("--systems", default="vanilla,vllm+,sglang+,marconi", type=systems,
                     help="comma list, parameters on names: marconi:alpha=1.0,vllm+:block=16")
    sim.add_argument("--capacity", default="10GB", type=CapacityList(allow_zero=False),
                     help="comma list: 5GB,10GiB or fractions of the working set 0.1x,25%%")
    sim.add_argument("--model", default="paper-7b", type=models, help="comma list of presets or config.json paths")
    add_output(sim, "--out", help="write one JSONL record per point here (atomically); if some points cannot "
                                  "run, the finished ones go beside it (R.jsonl -> R.partial.jsonl) and --out "
                                  "is left unchanged")
    sim.add_argument("--mode", default="sequential", choices=["sequential", "event"])
    sim.add_argument("--latency", default="a100",
                     help="zero | a100 | h100 | a100:efficiency=0.4 | table:FILE.csv (columns tokens and ttft, its "
                          "unit from its name: ttft_ms, ttft (ms), ttft_us; a bare ttft is seconds)")
    sim.add_argument("--workers", type=worker_count, default=None,
                     help="parallel processes (default: one per core); with --backend ray and no --address, "
                          "the CPUs of the local Ray instance")
    sim.add_argument("--backend", default="local", choices=["local", "ray"],
                     help="local: a process pool on this machine; ray: every point is a Ray task")
    sim.add_argument("--address", default=None,
                     help="with --backend ray: join this Ray cluster (e.g. auto, ray://head:10001); "
                          "default: start a local Ray instance")
    sim.add_argument("--limit", type=request_limit, default=None, help="replay only the first N requests (N >= 1)")
    sim.add_argument("--no-per-request", action="store_true", help="omit per-request arrays from the records")
    sim.add_argument("--quiet", action="store_true", help="no progress bar")
    sim.set_defaults(func=_cmd_simulate)

    cmp_ = sub.add_parser("compare", help="relative gains and plots from simulate --out records")
    cmp_.add_argument("results")
    add_output(cmp_, "--plots", kind="dir", help="directory for PNG plots (default: <results>_plots/)")
    cmp_.set_defaults(func=_cmd_compare)

    from marconi.sim.mrc import DEFAULT_LO

    mrc = sub.add_parser("mrc", help="miss-ratio curves: hit rate vs capacity per system (how to size a cache)")
    mrc.add_argument("--trace", required=True, help="JSONL/Parquet trace or a bundled trace name")
    mrc.add_argument("--systems", default="vllm+,sglang+,marconi", type=systems,
                     help="comma list (oracle and infinite are added)")
    mrc.add_argument("--points", type=Number(Domain(2, 1000, integer=True)), default=12, help="capacities, geometric from --lo to the working set")
    mrc.add_argument("--lo", type=Number(Domain(0, 1, lo_open=True, hi_open=True)), default=None,
                     help=f"smallest capacity as a fraction of the working set (default {DEFAULT_LO:g}, raised to "
                          "the least that holds one SSM checkpoint where the working set is small)")
    mrc.add_argument("--model", default="paper-7b", type=models)
    add_output(mrc, "--out", default="results/mrc.jsonl",
               help="records (JSONL, written atomically; default: results/mrc.jsonl in the current "
                    "directory); if some points cannot run, the curve of those that "
                    "did goes beside --out and --plot (R.jsonl -> R.partial.jsonl, R.png -> R.partial.png) and "
                    "they are left unchanged")
    add_output(mrc, "--plot", default=None, suffixes=PLOT_SUFFIXES,
               help="PNG path (default: --out with .png)")
    mrc.add_argument("--no-ceilings", action="store_true", help="do not add oracle and infinite")
    mrc.add_argument("--workers", type=worker_count, default=None,
                     help="parallel processes (default: one per core, at most the CPUs)")
    mrc.add_argument("--backend", default="local", choices=["local", "ray"])
    mrc.add_argument("--address", default=None, help="with --backend ray: the cluster to join")
    mrc.add_argument("--limit", type=request_limit, default=None, help="replay only the first N requests (N >= 1)")
    mrc.add_argument("--quiet", action="store_true", help="no progress bar")
    mrc.set_defaults(func=_cmd_mrc)

    demo = sub.add_parser("demo", help="the main job: the systems on a bundled real trace, with the oracle and a "
                                       "miss-ratio curve")
    demo.add_argument("--trace", default="swe-sample", help="a catalog workload or a trace file (default: the "
                                                             "bundled SWE-agent sample)")
    demo.add_argument("--capacity", default="0.05x,0.15x", type=CapacityList(allow_zero=False),
                      help="cache sizes, comma-separated: bytes (10GB) or fractions of the working set (0.05x)")
    demo.add_argument("--model", default="paper-7b", type=models,
                      help="one model preset (`marconi models`) or config.json: the demo draws one model's curve")
    add_output(demo, "--out", default="results/demo.jsonl",
               help="the records (default: results/demo.jsonl in the current directory); plots in "
                    "<stem>_plots/, the miss-ratio curve in <stem>_mrc.jsonl/.png")
    demo.set_defaults(func=_cmd_demo)

    groups: dict[str, Any] = {}   # group name -> its subparsers object, for the lab's leaves
    for module, group in _LIBRARY_COMMANDS:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue
        added = mod.register(sub)
        if group is not None:
            groups[group] = added
    importlib.import_module(_LAB_COMMANDS).register(sub, groups)
    return parser


# Optional packages and the pyproject extra that installs each (the core needs numpy alone).
_EXTRA_OF = {"tqdm": "sim", "matplotlib": "sim", "pyarrow": "sim", "tokenizers": "sim", "torch": "engine",
             "transformers": "engine", "ray": "ray", "httpx": "vllm"}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; bad input is a one-line error and exit 2, never a traceback. SIGTERM (exit 143)
    and Ctrl-C (130) kill workers and leave no temp file."""
    for stream in (sys.stdout, sys.stderr):  # a file name that is not UTF-8 is shown escaped, never a crash
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    try:                                 # building the parser imports every floor: a second or so
        from marconi.options import fill_beside

        parser = build_parser()
        args = parser.parse_args(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    try:
        with sigterm_raises():
            fill_beside(parser, args)    # outputs named after --out (a run's plot beside its records)
            guard_outputs(parser, args)  # before any work: nothing computed is lost to --out
            return int(args.func(args) or 0)
    except ModuleNotFoundError as exc:
        extra = _EXTRA_OF.get((exc.name or "").split(".")[0])
        if extra is None:
            raise
        print(f"marconi {args.command}: error: this command needs {exc.name}, which comes with the [{extra}] extra: "
              f"pip install 'marconi[{extra}]' (the core, `marconi models` and the library need numpy alone)",
              file=sys.stderr)
        return 2
    except BrokenPipeError:    # `marconi systems | head`: the reader has gone, and wants nothing more
        try:                   # the interpreter's last flush of stdout must not fail on it again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 141             # what a shell reports for a writer ended by SIGPIPE
    except (ConfigError, ValueError, OSError) as exc:
        print(f"marconi {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (Terminated)
        if sigterm_received():
            print("terminated", file=sys.stderr)
            return 143
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
