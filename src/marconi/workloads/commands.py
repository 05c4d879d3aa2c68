"""The ``marconi trace`` command group: build, validate and summarise traces.

    marconi trace build {sharegpt,lmsys,swe,mooncake,quality,synthetic,bundled} ... --out FILE
    marconi trace build bundled NAME --out FILE   # a catalog workload: swe-sample, sharegpt:scale=0.5, ...
    marconi trace list                 # the catalog: names, parameters, data and licences
    marconi trace validate FILE        # every problem, exit 1 if any (FILE: what --trace takes)
    marconi trace stats FILE [--json]  # sessions, requests, tokens, input-length percentiles (FILE: what --trace takes)
"""

# register(subparsers) adds the group to an argparse subparsers object; every leaf parser sets ``func``
# to a handler ``(args) -> int`` (the exit code). Only the handlers print.

from __future__ import annotations

import argparse
import functools
import inspect
import json
import sys
from typing import Any, Callable

from marconi.commandline import load_trace       # the loader with its notices on stderr
from marconi.core.registry import Domain
from marconi.io import check_output
from marconi.options import COUNT, SEED, TOKENS, Number, add_output
from marconi.workloads.trace.formats import format_of
from marconi.workloads.trace.sidecar import sidecar_path
from marconi.units import request_limit

from .catalog import Provenance, build_workload, catalog_entries
from .messages import TEXT_FORMS
from .mooncake import build_mooncake_trace
from .quality import ANSWER_FORMS, build_quality_trace
from .sharegpt import PAIRINGS, build_lmsys_trace, build_sharegpt_trace
from .swe import GAP_MODES, build_swe_trace
from .synthetic import SYNTHETIC_KINDS, synthetic_trace
from .source import TOKEN_TRACE, shortfall, trace_file_kind
from .tokenizer import TokenizerError
from .trace import Trace, TraceFormatError, inspect_trace, trace_format, trace_stats, write_trace

__all__ = ["register"]


# ============================================================================ argument helpers


# Domains of the trace builders' numeric options (checked at parse time).
RATE = Domain(0, 10**6, lo_open=True)        # sessions or requests per second
FRACTION = Domain(0, 1)
SECONDS = Domain(0, 10**6)                  # 0: no gap (as the builders allow)
VOCAB = Domain(2, 1 << 31, integer=True)


class _CountOrAll(Number):
    """An integer >= 0, or ``all``/``off``/``none`` for None."""

    def __init__(self) -> None:
        super().__init__(Domain(0, 10**9, integer=True, words=("all", "off", "none")))

    def __call__(self, text: str) -> int | None:
        value = super().__call__(text)
        return None if isinstance(value, str) else value


_count_or_all = _CountOrAll()


def _out_path(text: str) -> str:
    try:
        trace_format(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _progress(desc: str, unit: str) -> Callable:
    from tqdm import tqdm

    return functools.partial(tqdm, desc=desc, unit=unit, file=sys.stderr, disable=None, leave=False)


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _int_range(text: str) -> int | tuple[int, int]:
    lo, sep, hi = text.partition(":")
    return (int(lo), int(hi)) if sep else int(lo)


def _coerce(text: str, default: Any) -> Any:
    """Parse a ``--set`` value by the type of the parameter's default; ValueError whose message says
    what the parameter takes (``"an integer"``) if ``text`` is not one."""
    if isinstance(default, bool):
        if text.lower() not in _TRUE + _FALSE:
            raise ValueError("true or false")
        return text.lower() in _TRUE
    if isinstance(default, int):
        parse, wanted = int, "an integer"
    elif isinstance(default, float):
        parse, wanted = float, "a number"
    elif isinstance(default, tuple) and len(default) == 2 and all(isinstance(x, int) for x in default):
        parse, wanted = _int_range, "N or LO:HI"
    elif isinstance(default, (tuple, list)):
        parse, wanted = (lambda t: tuple(float(x) for x in t.split(",") if x.strip())), "numbers separated by commas"
    else:
        return text
    try:
        return parse(text)
    except ValueError:
        raise ValueError(wanted) from None


def _synthetic_params(kind: str, items: list[str]) -> dict[str, Any]:
    signature = inspect.signature(SYNTHETIC_KINDS[kind]).parameters
    params: dict[str, Any] = {}
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or key not in signature:
            raise ValueError(f"--set {item!r}: expected key=value with key one of {', '.join(signature)}")
        try:
            params[key] = _coerce(value.strip(), signature[key].default)
        except ValueError as exc:
            again = " (one KEY=VALUE per --set: repeat --set for each parameter)" if "=" in value else ""
            raise ValueError(f"--set {item!r}: {key} takes {exc}, got {value.strip()!r}{again}") from None
        got = params[key]
        is_range = isinstance(got, tuple) and len(got) == 2 and all(isinstance(v, int) for v in got)
        if is_range and not 0 <= got[0] <= got[1]:
            raise ValueError(f"--set {item!r}: {key} takes a range lo:hi with 0 <= lo <= hi")
        if key.startswith("num_") and isinstance(got, int) and not isinstance(got, bool) and got < 1:
            raise ValueError(f"--set {item!r}: {key} must be at least 1")
    return params


# ============================================================================ handlers


def _check_out(args: argparse.Namespace, *inputs: Any) -> None:
    """Before building: ``--out`` must be writable and none of the files the build reads."""
    paths: list[str] = []
    for item in inputs:
        if item is None:
            continue
        paths.extend(str(x) for x in (item if isinstance(item, (list, tuple)) else [item]))
    check_output(args.out, inputs=paths)
    found = format_of(args.out)
    if found is not None and found[0].sidecar:  # written beside the trace: it must not be an input either
        check_output(sidecar_path(args.out), inputs=paths)


def _built_from(items: Any, source: str) -> str:
    """What a build read, for messages: its input files, or the default data of ``source``."""
    files = [str(x) for x in (items if isinstance(items, (list, tuple)) else [items]) if x is not None]
    return ", ".join(files) if files else f"the default {source} data"


def _write_and_report(trace: Trace, out: str, source: str) -> int:
    """Write ``trace`` to ``out`` and say what was written. ValueError naming ``source`` (what the trace
    was built from) when it has no requests: a trace nothing can replay is not written."""
    if len(trace) == 0:
        raise ValueError(f"{source}: no requests to write (the input holds none, or the options filtered out "
                         f"every one): nothing written to {out}")
    n = write_trace(out, trace)
    stats = trace.stats()
    print(f"wrote {n} requests ({stats.num_sessions} sessions, {stats.total_input_tokens} input + "
          f"{stats.total_output_tokens} output tokens) to {out}")
    provenance = Provenance.of(trace)
    if provenance is not None and provenance.fallback:  # a stand-in must never pass for the real data
        print(f"{trace.name}: {provenance.describe()}", file=sys.stderr)
    elif (short := shortfall(trace)) is not None:
        print(f"NOTE: {out}: {short}", file=sys.stderr)
    return 0


def _fail(exc: BaseException) -> int:
    print(f"error: {exc}", file=sys.stderr)
    return 2


def _chat_params(args: argparse.Namespace) -> dict[str, Any]:
    params = dict(num_sessions=args.sessions, min_rounds=args.min_rounds,
                  sessions_per_second=args.sessions_per_second, max_input_len=args.max_input_len,
                  words_per_min=args.words_per_min, text_form=args.text_form, add_bos=not args.no_bos,
                  pairing=args.pairing, tokenizer=args.tokenizer,
                  progress=_progress("sessions", "session"))
    if args.max_non_ascii is not None:
        params["max_non_ascii_frac"] = args.max_non_ascii
    return params


def cmd_build_sharegpt(args: argparse.Namespace) -> int:
    try:
        _check_out(args, args.files, args.tokenizer)
        trace = build_sharegpt_trace(args.files or None, **_chat_params(args))
        return _write_and_report(trace, args.out, _built_from(args.files, "ShareGPT"))
    except (OSError, ValueError, TokenizerError) as exc:
        return _fail(exc)


def cmd_build_lmsys(args: argparse.Namespace) -> int:
    try:
        _check_out(args, args.files, args.tokenizer)
        trace = build_lmsys_trace(args.files, **_chat_params(args))
        return _write_and_report(trace, args.out, _built_from(args.files, "LMSys"))
    except (OSError, ValueError, TokenizerError) as exc:
        return _fail(exc)


def cmd_build_swe(args: argparse.Namespace) -> int:
    try:
        _check_out(args, args.paths, args.tokenizer, args.shared_prefix)
        trace = build_swe_trace(
            args.paths or None, num_sessions=args.sessions, sessions_per_second=args.sessions_per_second,
            keep_observations=args.keep_observations, gaps=args.gaps, mean_gap_s=args.mean_gap,
            seed=args.seed, max_input_len=args.max_input_len, max_turns=args.max_turns,
            shared_prefix=args.shared_prefix, text_form=args.text_form, add_bos=not args.no_bos,
            tokenizer=args.tokenizer, progress=_progress("trajectories", "traj"))
        return _write_and_report(trace, args.out, _built_from(args.paths, "SWE"))
    except (OSError, ValueError, TokenizerError) as exc:
        return _fail(exc)


def cmd_build_mooncake(args: argparse.Namespace) -> int:
    try:
        _check_out(args, args.file)
        trace = build_mooncake_trace(
            args.file, limit=args.limit, block_size=args.block_size, vocab_size=args.vocab_size,
            output_vocab=args.output_vocab, seed=args.seed, max_input_len=args.max_input_len,
            progress=_progress("requests", "req"))
        return _write_and_report(trace, args.out, _built_from(args.file, "Mooncake"))
    except (OSError, ValueError) as exc:
        return _fail(exc)


def cmd_build_quality(args: argparse.Namespace) -> int:
    try:
        _check_out(args, args.files, args.tokenizer)
        trace = build_quality_trace(args.files or None, answer_form=args.answer_form,
                                    requests_per_second=args.requests_per_second, seed=args.seed,
                                    max_articles=args.max_articles, tokenizer=args.tokenizer)
        return _write_and_report(trace, args.out, _built_from(args.files, "QuALITY"))
    except (OSError, ValueError, TokenizerError) as exc:
        return _fail(exc)


def cmd_build_synthetic(args: argparse.Namespace) -> int:
    try:
        _check_out(args)
        params = _synthetic_params(args.kind, args.set or [])
        if args.seed is not None:
            params["seed"] = args.seed
        return _write_and_report(synthetic_trace(args.kind, **params), args.out, f"synthetic {args.kind}")
    except (OSError, ValueError) as exc:
        return _fail(exc)


def cmd_build_bundled(args: argparse.Namespace) -> int:
    try:
        _check_out(args)
        return _write_and_report(build_workload(args.name), args.out, f"workload {args.name!r}")
    except (OSError, ValueError) as exc:  # ConfigError (unknown name: lists the catalog) is a ValueError
        return _fail(exc)


def cmd_list(args: argparse.Namespace) -> int:
    entries = catalog_entries()
    if args.json:
        for entry in entries:
            print(json.dumps(entry))
        return 0
    print("workloads (marconi simulate --trace NAME, marconi trace build bundled NAME --out FILE;\n"
          "           parameters on the name: swe:scale=0.2,seed=1; data=auto|shared|<stand-in>):")
    for entry in entries:
        params = ", ".join(f"{k}={'' if v is None else v}" for k, v in entry["params"].items())
        print(f"  {entry['name']:26s} {entry['doc']}\n  {'':26s} licence: {entry['licence']}\n"
              f"  {'':26s} [{params}]")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .catalog import is_workload
    from .source import check_trace_name

    if not Path(args.file).exists():
        if is_workload(args.file):       # built by its recipe, checked as it is built: no file to validate
            print(f"{args.file}: a catalog workload, not a file: nothing to validate (`marconi trace stats "
                  f"{args.file}` describes it; `marconi trace build` writes it to a file)")
            return 0
        check_trace_name(args.file)      # ConfigError listing the catalog
    kind = trace_file_kind(args.file)
    if kind not in (None, TOKEN_TRACE):     # a recording, a Mooncake trace or a raw source: its reader checks it
        kind = "block-hash (Mooncake or Qwen-Bailian)" if kind == "mooncake" else kind
        try:
            trace = load_trace(args.file)
        except (OSError, ValueError, TraceFormatError) as exc:
            print(exc)
            print(f"{args.file}: 1 problem(s) (a {kind} file, checked by the reader `--trace` uses)", file=sys.stderr)
            return 1
        if not trace.requests:
            print(f"{args.file}: no requests in the file")
            print(f"{args.file}: 1 problem(s) (a {kind} file)", file=sys.stderr)
            return 1
        kind = trace.meta.get("layout", kind)      # a block-hash trace names its layout: Mooncake or Qwen-Bailian
        notes = list(trace.meta.get("warnings") or [])   # lines skipped, requests left out: said, as --trace says them
        for note in notes:
            print(f"warning: {note}")
        print(f"{args.file}: OK (a {kind} file, read by the reader `--trace` uses: {len(trace.requests)} requests"
              + (f"; {len(notes)} warning(s) above" if notes else "") + ")")
        return 0
    try:
        problems, warnings = inspect_trace(args.file)
    except (OSError, ValueError) as exc:
        return _fail(exc)
    for problem in problems[: args.max_show]:
        print(problem)
    if len(problems) > args.max_show:
        print(f"... and {len(problems) - args.max_show} more")
    for warning in warnings:
        print(warning)
    if problems:
        print(f"{args.file}: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"{args.file}: OK" + (f" ({len(warnings)} warning(s))" if warnings else ""))
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    try:
        if trace_file_kind(args.file) == TOKEN_TRACE:      # streamed: only lengths are kept
            stats = trace_stats(args.file)
        else:
            stats = load_trace(args.file).stats()
    except (OSError, ValueError, TraceFormatError) as exc:
        return _fail(exc)
    if stats.num_requests == 0:  # zeros would read as a trace measured; `trace validate` says the same
        return _fail(ValueError(f"{args.file}: no requests in the file"))
    record = {"file": args.file, **stats.as_dict()}
    if args.json:
        print(json.dumps(record))
        return 0
    print(f"{args.file}")
    print(f"  sessions            {stats.num_sessions}")
    print(f"  requests            {stats.num_requests}")
    print(f"  input tokens        {stats.total_input_tokens}")
    print(f"  output tokens       {stats.total_output_tokens}")
    print(f"  input length        min {stats.input_len_min}  p50 {stats.input_len_p50:.0f}  "
          f"p90 {stats.input_len_p90:.0f}  p99 {stats.input_len_p99:.0f}  max {stats.input_len_max}  "
          f"mean {stats.input_len_mean:.1f}")
    print(f"  output length       mean {stats.output_len_mean:.1f}  max {stats.output_len_max}")
    print(f"  turns per session   max {stats.max_turns_per_session}")
    print(f"  time span (s)       {stats.first_ts:.3f} .. {stats.last_ts:.3f} ({stats.duration_s:.3f})")
    return 0


# ============================================================================ parsers


def _add_out(p: argparse.ArgumentParser) -> None:
    add_output(p, "--out", required=True, type=_out_path,
                   help="output trace (.jsonl, .jsonl.gz or .parquet), written atomically")


def _add_tokenization(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer.json, its folder, or a name (default: vendored mistral-v1; "
                        "'llama2' = the paper's, from the shared data set)")
    p.add_argument("--text-form", choices=TEXT_FORMS, default="json",
                   help="text tokenized per message: json = json.dumps(message) (the paper), "
                        "content = the content string (default: %(default)s)")
    p.add_argument("--no-bos", action="store_true", help="do not prepend BOS to each message")


def _add_chat(p: argparse.ArgumentParser, files_nargs: str, non_ascii_default: str) -> None:
    p.add_argument("files", nargs=files_nargs,
                   help="record files (.json array, .jsonl, .parquet), read in order")
    p.add_argument("--sessions", type=_count_or_all, default=100,
                   help="first N qualifying sessions, or 'all' (default: %(default)s)")
    p.add_argument("--min-rounds", type=Number(Domain(0, 10**6, integer=True)), default=10,
                   help="qualify records with >= 2*N messages (default: %(default)s)")
    p.add_argument("--sessions-per-second", type=Number(RATE), default=1.0,
                   help="session k starts at k / rate (default: %(default)s)")
    p.add_argument("--max-input-len", type=Number(TOKENS), default=32768, help="default: %(default)s")
    p.add_argument("--words-per-min", type=Number(RATE), default=90.0,
                   help="typing speed for the gaps between turns (default: %(default)s)")
    p.add_argument("--pairing", choices=PAIRINGS, default="roles",
                   help="turns by roles (default) or messages 2t/2t+1 as the authors' script")
    p.add_argument("--max-non-ascii", type=Number(FRACTION), default=None,
                   help="drop sessions with more non-ASCII characters than this fraction "
                        f"({non_ascii_default})")
    _add_tokenization(p)
    _add_out(p)


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``trace`` command group to an argparse subparsers object; returns its parser."""
    trace = subparsers.add_parser("trace", help="build, validate and summarise request traces",
                                  description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = trace.add_subparsers(dest="trace_command", required=True, metavar="{build,list,validate,stats}")

    build = sub.add_parser("build", help="build a trace from real data or a generator")
    bsub = build.add_subparsers(dest="source", required=True)

    p = bsub.add_parser("sharegpt", help="ShareGPT (or OpenAI-format chats) by the paper's recipe")
    _add_chat(p, "*", "default: off; files default to the shared data set's filtered ShareGPT parts")
    p.set_defaults(func=cmd_build_sharegpt)

    p = bsub.add_parser("lmsys", help="LMSys-Chat-1M exports (bring your own files)")
    _add_chat(p, "+", "default: 0.5, the paper's filter")
    p.set_defaults(func=cmd_build_lmsys)

    p = bsub.add_parser("swe", help="SWE agent trajectories by the paper's recipe")
    p.add_argument("paths", nargs="*",
                   help="msa_*.json / .traj files or folders "
                        "(default: the shared data set, else the vendored sample)")
    p.add_argument("--sessions", type=_count_or_all, default=100,
                   help="first N trajectories by name, or 'all' (default: %(default)s)")
    p.add_argument("--sessions-per-second", type=Number(RATE), default=1.0, help="default: %(default)s")
    p.add_argument("--keep-observations", type=_count_or_all, default=5,
                   help="keep observations of the last N rounds; 'off' keeps all (default: %(default)s)")
    p.add_argument("--gaps", choices=GAP_MODES, default="poisson",
                   help="gaps between calls: Poisson or the real 'created' times (default: %(default)s)")
    p.add_argument("--mean-gap", type=Number(SECONDS), default=7.5, help="Poisson mean gap, s (default: %(default)s)")
    p.add_argument("--seed", type=Number(SEED), default=0)
    p.add_argument("--max-input-len", type=Number(TOKENS), default=32768, help="default: %(default)s")
    p.add_argument("--max-turns", type=Number(COUNT), default=50, help="default: %(default)s")
    p.add_argument("--shared-prefix", default=None,
                   help="prepend a shared system + demonstration prefix: 'sweagent-demo' or a .traj path")
    _add_tokenization(p)
    _add_out(p)
    p.set_defaults(func=cmd_build_swe)

    p = bsub.add_parser("mooncake", help="Mooncake block traces rebuilt as tokens")
    p.add_argument("file", nargs="?", default=None,
                   help="trace .jsonl (default: shared conversation trace, else the vendored sample)")
    p.add_argument("--limit", type=request_limit, default=None,
                   help="the N earliest requests only (N >= 1; the first N lines of a file in time order)")
    p.add_argument("--block-size", type=Number(TOKENS), default=None,
                   help="tokens per hash id (default: the trace's own: Mooncake 512, Qwen-Bailian 16)")
    p.add_argument("--vocab-size", type=Number(VOCAB), default=None,
                   help="token ids the rebuilt trace may use (default: 32000, raised where a block has more "
                        "distinct successors than that leaves ids for)")
    p.add_argument("--output-vocab", type=Number(Domain(1, 1 << 31, integer=True)), default=1024,
                   help="token ids reserved for outputs")
    p.add_argument("--seed", type=Number(SEED), default=0)
    p.add_argument("--max-input-len", type=Number(TOKENS), default=None, help="drop longer requests")
    _add_out(p)
    p.set_defaults(func=cmd_build_mooncake)

    p = bsub.add_parser("quality", help="QuALITY long-document QA: many questions per article")
    p.add_argument("files", nargs="*", help="QuALITY JSONL files (default: the shared data set)")
    p.add_argument("--answer-form", choices=ANSWER_FORMS, default="letter+text")
    p.add_argument("--requests-per-second", type=Number(RATE), default=0.5)
    p.add_argument("--max-articles", type=Number(COUNT), default=None)
    p.add_argument("--seed", type=Number(SEED), default=0)
    p.add_argument("--tokenizer", default=None, help="tokenizer.json, its folder, or a name (default: mistral-v1)")
    _add_out(p)
    p.set_defaults(func=cmd_build_quality)

    p = bsub.add_parser("synthetic", help="seeded synthetic workloads")
    p.add_argument("kind", choices=list(SYNTHETIC_KINDS))
    p.add_argument("--seed", type=Number(SEED), default=None)
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="generator parameter, e.g. num_sessions=500, turns=4:16, depth_fractions=0.5,1")
    _add_out(p)
    p.set_defaults(func=cmd_build_synthetic)

    p = bsub.add_parser("bundled", help="a workload from the catalog (marconi trace list): swe-sample, "
                                        "sharegpt:scale=0.5, ...")
    p.add_argument("name", help="a catalog name, parameters on the name (e.g. swe:sessions=20,seed=1)")
    _add_out(p)
    p.set_defaults(func=cmd_build_bundled)

    p = sub.add_parser("list", help="the workload catalog: names, parameters, data and licences")
    p.add_argument("--json", action="store_true", help="one JSON record per workload")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("validate", help="check a trace file and report every problem (exit 1 if any)")
    p.add_argument("file")
    p.add_argument("--max-show", type=Number(Domain(0, 10**9, integer=True)), default=100, help="print at most N problems")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("stats", help="sessions, requests, token totals, input-length percentiles")
    p.add_argument("file", help="a trace file, or anything --trace takes: a catalog name, a Mooncake or "
                                "recorded block-hash trace, a raw ShareGPT/OpenAI-chat/LMSys/SWE/QuALITY file")
    p.add_argument("--json", action="store_true", help="one JSON record instead of text")
    p.set_defaults(func=cmd_stats)
    return trace
