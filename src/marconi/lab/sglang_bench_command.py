"""``marconi sglang bench``: the SGLang bench (:mod:`marconi.lab.sglang_bench`, run in the SGLang
environment, ``make sglang-env``) as a leaf of the library's ``sglang`` group.

The bench runs through SGLang's own ``UnifiedRadixCache``; records go to stdout and ``--out``, the
table (SGLang's hit rate beside the ``sglang-unified`` emulation's) to stdout.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from marconi.integrations.common.probe import default_env_python, python_command
from marconi.options import COUNT, CapacityList, NameList, Number, add_output

__all__ = ["register", "check_bench_options", "check_bench_inputs"]


def register(sglang: Any) -> None:
    """Add ``bench`` to the ``marconi sglang`` group's subparsers object (what
    :func:`marconi.integrations.sglang.commands.register` returns)."""
    bench = sglang.add_parser("bench", help="stock SGLang (lru) vs the Marconi plugin on SGLang's UnifiedRadixCache (CPU)")
    bench.add_argument("--sglang-python", default=default_env_python(".venv-sglang"), type=python_command,
                       help="python of the SGLang environment (`make sglang-env` builds .venv-sglang)")
    bench.add_argument("--trace", default="swe-sample", help="a trace file or a catalog name")
    bench.add_argument("--capacity", default="0.05x", type=CapacityList(allow_zero=False, single=True),
                       help="pool bytes (10GB) or a fraction of the working set (0.05x)")
    bench.add_argument("--model", default="paper-7b", help="model preset or HF config (the pools' bytes, Marconi's FLOPs)")
    bench.add_argument("--policies", default="lru,marconi", type=NameList("policy"),
                       help="comma list: lru (stock SGLang), marconi (the plugin's default: adaptive, exact worlds), "
                            "marconi:alpha=X (X a number, e.g. 0.5, the default before issue 31, or adaptive), "
                            "marconi:alpha=adaptive,selector=regret (the regret shadow)")
    bench.add_argument("--num-requests", type=Number(COUNT), default=None, help="replay only the first N requests")
    add_output(bench, "--out", default="results/sglang_bench.jsonl",
               help="JSONL records are appended here (default: %(default)s)")
    bench.set_defaults(func=_cmd_bench)


def check_bench_options(capacity: str, policies: str, model: str) -> None:
    """Every option the bench can check without the trace or SGLang; ConfigError naming the option.
    Nothing is written (``--out`` is the CLI output guard's)."""
    from marconi.core.registry import ConfigError, split_name_list
    from marconi.lab.sglang_bench import parse_policy
    from marconi.units import parse_capacity

    try:
        parse_capacity(capacity)
    except ConfigError as exc:
        raise ConfigError(f"--capacity: {exc}") from None
    names = split_name_list(policies)        # marconi:alpha=adaptive,selector=regret is one policy
    if not names:
        raise ConfigError("--policies: no policy given (lru, marconi, marconi:alpha=X)")
    for name in names:
        try:
            parse_policy(name, model)
        except ConfigError as exc:
            raise ConfigError(f"--policies: {exc}") from None


def check_bench_inputs(sglang_python: str, trace: str, model: str, num_requests: int | None) -> None:
    """What the SGLang side would otherwise fail on with a traceback, checked before it is spawned;
    ConfigError naming the option: ``--sglang-python`` (probed), ``--model``, ``--trace``,
    ``--num-requests``."""
    from marconi.core.model import get_model
    from marconi.core.registry import ConfigError
    from marconi.integrations.common.probe import probe_python
    from marconi.workloads import is_workload

    if num_requests is not None and num_requests < 1:
        raise ConfigError(f"--num-requests: must be >= 1, got {num_requests}")
    try:
        spec = get_model(model)
    except (ConfigError, ValueError, OSError) as exc:
        raise ConfigError(f"--model: {exc}") from None
    if not spec.has_recurrent_state:     # its Mamba pool would be sized for 0-byte states: ~10^9 slots a GB
        raise ConfigError(f"--model {model}: no recurrent state; this bench drives SGLang's hybrid (Mamba) radix "
                          "cache, and SGLang serves a pure transformer from its plain one: pick a hybrid model "
                          "(marconi models), or compare transformers with marconi simulate --systems sglang+")
    if not is_workload(trace) and not Path(trace).is_file():
        what = "is a directory" if Path(trace).is_dir() else "is neither a trace file nor a catalog name"
        raise ConfigError(f"--trace {trace!r}: {what} (`marconi trace list` lists the catalog)")
    probe_python(sglang_python, "sglang", option="--sglang-python", make_target="make sglang-env")


def _cmd_bench(args: Any) -> int:
    from marconi.core.registry import ConfigError, split_name_list

    try:
        check_bench_options(args.capacity, args.policies, args.model)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from marconi.io import check_records_file

    try:
        check_records_file(args.out, "policy")    # appended to: an earlier bench's records, never another file
        check_bench_inputs(args.sglang_python, args.trace, args.model, args.num_requests)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    policies = split_name_list(args.policies)
    # the records come back on the child's stdout and are appended here, once every policy has run:
    # a failed run writes nothing (no empty --out, no folder made for it)
    cmd = [str(args.sglang_python), "-W", "ignore", "-m", "marconi.lab.sglang_bench", "--trace", args.trace,
           "--capacity", args.capacity, "--model", args.model, "--policies", args.policies]
    if args.num_requests is not None:
        cmd += ["--num-requests", str(args.num_requests)]
    from marconi.pool import run_child

    proc = run_child(cmd)                  # dies with this command (issue 31, bug 11's mechanism)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        finished = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        if finished:                       # each record is one policy's whole result: kept, not lost
            _append_records(args.out, finished)
        if proc.returncode < 0:            # killed by a signal: it wrote nothing about it itself
            import signal

            try:
                name = signal.Signals(-proc.returncode).name
            except ValueError:
                name = f"signal {-proc.returncode}"
            print(f"error: the SGLang side ({args.sglang_python}) was killed by {name}"
                  f"{' (out of memory? lower --capacity or --num-requests)' if name == 'SIGKILL' else ''}",
                  file=sys.stderr)
            return 1
        return proc.returncode
    for line in proc.stderr.splitlines():   # the child's notes (a --capacity raised to the least pools)
        if line.startswith("NOTE:"):
            print(line, file=sys.stderr)
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if len(records) != len(policies):     # exit 0 without results is a failure, never an empty table (bug 10)
        said = (proc.stderr.strip().splitlines() or ["no output on stderr"])[-1][:300]
        print(f"error: the SGLang side ({args.sglang_python}) exited 0 with {len(records)} of {len(policies)} "
              f"records ({said}); check --sglang-python, or rebuild the environment with `make sglang-env`",
              file=sys.stderr)
        return 1
    _append_records(args.out, records)
    print(f"{'policy':<26} {'token hit rate':>14} {'sglang-unified':>14} {'requests':>9} {'kv tokens':>10} "
          f"{'mamba slots':>11}")
    for r in records:
        sim = r.get("sim_token_hit_rate")
        sim_text = f"{sim:.2%}" if sim is not None else "-"
        print(f"{r['policy']:<26} {r['token_hit_rate']:>14.2%} {sim_text:>14} {r['num_requests']:>9} "
              f"{r['kv_tokens']:>10} {r['mamba_slots']:>11}")
    return 0


def _append_records(out: str, records: list[dict[str, Any]]) -> None:
    """``records`` appended to the JSONL file ``out`` as one atomic replacement (the earlier lines kept
    as they were, the folder made if need be), or written through where ``out`` is a stream."""
    from marconi.io import atomic_write, is_stream

    earlier = "" if is_stream(out) or not Path(out).is_file() else Path(out).read_text(encoding="utf-8")
    if earlier and not earlier.endswith("\n"):
        earlier += "\n"
    with atomic_write(out, "w") as fh:
        fh.write(earlier + "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    print(f"appended {len(records)} record{'s' if len(records) != 1 else ''} to {out}", file=sys.stderr)
