"""The ``marconi vllm`` command group (``replay``, ``diagnose``; wired into ``marconi.cli`` by ``register``;
the lab adds ``bench`` and ``frontier``, :mod:`marconi.lab.commands`).

Options are argparse's (``marconi vllm <command> --help``; docs/vllm.md). Only the handlers print:
progress to stderr, tables to stdout.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

from marconi.commandline import comma_list
from marconi.integrations.common.probe import default_env_python, python_command
from marconi.core.registry import ConfigError, Domain
from marconi.options import (CHECKPOINT_BUDGET, COUNT, MAX_BLOCKS, MAX_TOKENS, PLOT_SUFFIXES, TOKENS, CapacityList,
                             NameList, Number, NumberList, add_output)
from marconi.sim.backends import worker_count

__all__ = ["register", "CONCURRENCY", "POOL_BLOCKS", "ALPHA", "RETENTION", "replay_axes", "setting_error"]

# The domains of the vLLM commands' numeric options, checked at parse time (issue 31: each of these
# used to fail inside the worker with vLLM's or pydantic's text, or not at all).
POOL_BLOCKS = Domain(2, MAX_BLOCKS, integer=True, hint="one block is vLLM's null block")
CONCURRENCY = Domain(1, 65536, integer=True)
RATE = Domain(0, 10**6, lo_open=True, hint="requests per virtual second")
TIME_SCALE = Domain(0, 10**6, lo_open=True, hint="1: the trace's own times; 0.5: twice as fast")
ALPHA = Domain(0, 10**6, words=("adaptive",))
# vLLM's prefix_cache_retention_interval: >= 0 (pydantic's ge=0 in vllm/config/cache.py) and a
# multiple of the scheduler's block (_validate_prefix_cache_retention_interval in
# vllm/v1/core/kv_cache_coordinator.py); None (`none`) is dense. The block is vLLM's choice for the
# model (nemotron-h-8b: 1,152 tokens on vLLM 0.32) and is always a multiple of the attention
# kernel's 16 tokens, so that much is checked here. RETENTION is public, for any command serving
# any model: its hint names no model's block; only the replay's own domain names its default model's.
_RETENTION_HINT = ("vLLM needs a multiple of the model's block (vLLM's choice for the model, recorded as "
                   "block_size); `vllm frontier --intervals` rounds up for you")
_REPLAY_RETENTION_HINT = ("vLLM needs a multiple of the model's block, which the replay records as block_size "
                          "(1152 for its default model, nemotron-h-8b, on vLLM 0.32); `vllm frontier --intervals` "
                          "rounds up for you")
RETENTION = Domain(0, MAX_TOKENS, integer=True, multiple_of=16, words=("none",), hint=_RETENTION_HINT)
RETENTION_OR_SPARSE = Domain(0, MAX_TOKENS, integer=True, multiple_of=16, words=("none", "sparse-dp"),
                             hint=_REPLAY_RETENTION_HINT)
_policy_list = NameList("policy")


def register(subparsers: Any) -> Any:
    """Add the ``vllm`` group to an argparse subparsers object (each leaf sets ``func``); return the
    group's own subparsers object, where the lab adds its ``vllm`` leaves (:mod:`marconi.lab.commands`)."""
    group = subparsers.add_parser("vllm", help="Marconi inside vLLM: a real-server benchmark of the plugin")
    sub = group.add_subparsers(dest="vllm_command", required=True)
    _register_replay(sub)
    from marconi.integrations.vllm.diagnose import register_command as _register_diagnose   # issue 32
    _register_diagnose(sub)
    return sub


def _host_bandwidth(text: str) -> float:
    """argparse ``type=`` of ``--host-bandwidth`` (:func:`~marconi.integrations.vllm.replay.tiers.parse_bandwidth`),
    checked at parse time as the size options are; argparse's message names the flag."""
    from marconi.integrations.vllm.replay.tiers import BANDWIDTH_FLAG, parse_bandwidth

    try:
        return parse_bandwidth(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{BANDWIDTH_FLAG}: ")) from None


def _register_replay(sub: Any) -> None:
    from marconi.integrations.vllm.policy import DEFAULT_ALPHA

    replay = sub.add_parser("replay", help="a trace through vLLM's own scheduler and block pool (plugin loaded as "
                                           "vLLM loads it), no model: a stub runner and a GPU step-time model")
    # --vllm-python / --sglang-python everywhere: typed by python_command, so the program the probe checks
    # is the one every caller spawns (a bare name that is a file here is that file, not PATH's)
    replay.add_argument("--vllm-python", default=default_env_python(".venv-vllm"), type=python_command,
                        help="python of the vLLM environment")
    replay.add_argument("--model", default="nemotron-h-8b",
                        help="a bundled config (nemotron-h-8b, qwen3-next-80b-a3b, falcon-h1-7b) or a directory "
                             "with a config.json; no weights are read")
    replay.add_argument("--trace", default="swe-sample", help="a trace file or a catalog name, as simulate takes it")
    pool = replay.add_mutually_exclusive_group(required=True)
    pool.add_argument("--blocks", default=None, type=NumberList(POOL_BLOCKS),
                      help="the block pool (vLLM's num_gpu_blocks_override); a comma list sweeps")
    pool.add_argument("--capacity", default=None, type=CapacityList(allow_zero=False),
                      help="KV budget: a fraction of the trace's working set (0.05x) or a size (10GB), as simulate; "
                           "a comma list sweeps")
    pool.add_argument("--gpu-memory", default=None, type=CapacityList(allow_zero=False),
                      help="the GPU's memory (80GB): 0.9 of it, less weights and a 4 GiB activation reserve; "
                           "a comma list sweeps")
    replay.add_argument("--gpu", default="h100", help="step-time model's GPU: h100, h200 or a100")
    replay.add_argument("--tensor-parallel", type=Number(Domain(1, 1024, integer=True)), default=1,
                        help="GPUs per replica: --gpu-memory is per GPU (weights split over them) and the step "
                             "time divides over them; TP must divide the model's KV and recurrent heads")
    replay.add_argument("--weight-bytes", type=Number(Domain(1, 8, integer=True)), default=None,
                        help="bytes per weight in --gpu-memory's arithmetic (default: bf16's 2; 1 for FP8)")
    load = replay.add_mutually_exclusive_group(required=True)
    load.add_argument("--concurrency", default=None, type=NumberList(CONCURRENCY), help="closed loop: requests in flight; a comma list sweeps")
    load.add_argument("--rate", default=None, type=NumberList(RATE), help="Poisson arrivals per (virtual) second; a comma list sweeps")
    load.add_argument("--trace-times", type=Number(TIME_SCALE), nargs="?", const=1.0, default=None, metavar="SCALE",
                      help="each request at its trace timestamp (the first at 0), times SCALE (default 1; "
                           "0.5: twice as fast); a turn still waits for its predecessor")
    replay.add_argument("--policies", default="lru,marconi", type=_policy_list,
                        help="comma list, one engine each: lru (stock), marconi, marconi:alpha=X (X a number or adaptive)")
    replay.add_argument("--alpha", default=str(DEFAULT_ALPHA), type=Number(ALPHA, text=True), help="alpha for plain 'marconi' (default %(default)s)")
    replay.add_argument("--max-input-len", type=Number(TOKENS), default=8192, help="input cap in tokens (as bench)")
    replay.add_argument("--num-requests", type=Number(COUNT), default=None, help="replay only the first N requests")
    replay.add_argument("--max-output-len", type=Number(TOKENS), default=None, help="cap each request's output (>= 1)")
    replay.add_argument("--max-num-batched-tokens", type=Number(TOKENS), default=8192,
                        help="vLLM's token budget of one scheduler step (>= 1)")
    replay.add_argument("--max-num-seqs", type=Number(CONCURRENCY), default=256,
                        help="vLLM's cap on requests in one step (>= 1)")
    replay.add_argument("--retention", default="0", type=Number(RETENTION_OR_SPARSE, text=True),
                        help="vLLM's prefix_cache_retention_interval (0, none, tokens) or sparse-dp: the plugin "
                             "places the states (MARCONI_VLLM_RETENTION; lru then means the plugin observing)")
    replay.add_argument("--retention-budget", type=Number(CHECKPOINT_BUDGET), default=None,
                        help="with --retention sparse-dp: states placed per sequence (default 2)")
    replay.add_argument("--cpu-tier", default=None, type=CapacityList(allow_zero=False, single=True),
                        help="a CPU tier beside the GPU pool (vLLM's OffloadingConnector): one size (256GB) or "
                             "fraction of the trace's working set (0.5x); run once per tier size")
    replay.add_argument("--tier-policies", default=None,
                        help="with --cpu-tier: comma list of the tier's policies, one engine per GPU policy each: "
                             "lru, arc, marconi, none (GPU only, for the tier's gain); a policy may carry vLLM's "
                             "store filter, e.g. lru:store_threshold=2 (stored once offered twice); default lru")
    replay.add_argument("--host-bandwidth", default=None, type=_host_bandwidth,
                        help="with --cpu-tier: host link per GPU and direction (55GB/s, the default: PCIe Gen5 x16)")
    replay.add_argument("--no-emulation", action="store_true", help="skip the vllm-align emulation")
    replay.add_argument("--backend", default="local", choices=["local", "ray"],
                        help="a sweep's points: local processes, or one Ray task each (nodes need both "
                             "environments at the same paths)")
    replay.add_argument("--workers", type=worker_count, default=1,
                        help="sweep points run at once (default 1: more share the cores and slow "
                             "schedule()/step, never the hit rates or the virtual clock)")
    replay.add_argument("--address", default=None, help="with --backend ray: the cluster to join")
    add_output(replay, "--work-dir", kind="workdir", default=None,
               help="requests, worker logs and results (default: a temp dir)")
    add_output(replay, "--out", default="results/vllm_replay.jsonl",
               help="JSONL records (written atomically; default: %(default)s, the plot beside it)")
    add_output(replay, "--plot", beside=("out", ".png"), suffixes=PLOT_SUFFIXES,
               help="the plot PNG: TTFT CDF, the sweep's or the tiers' (default: beside --out, R.jsonl -> R.png; "
                    "'' to skip)")
    replay.set_defaults(func=_cmd_replay)


# vLLM's refusal of a retention interval that is not a multiple of the block it chose for the model
# (vllm/v1/core/kv_cache_coordinator.py, _validate_prefix_cache_retention_interval). The block is
# known only once vLLM has built its config, in the worker: the parse-time check covers what can be
# known before (>= 0, a multiple of 16), this names the option when the worker finds the rest.
_VLLM_RETENTION_REFUSAL = re.compile(r"prefix_cache_retention_interval \((\d+)\) must be non-negative and a "
                                     r"multiple of scheduler_block_size \((\d+)\)")


# vLLM's refusal of a pool that cannot hold one max_model_len request (vllm/v1/core/kv_cache_utils.py,
# _check_enough_kv_cache_memory). The host refuses --blocks under it for a bundled model
# (replay.run.check_pool); a model directory's block only vLLM knows, so this names the option when
# the worker finds it. Only --blocks gets here: the worker raises a smaller KV budget to vLLM's floor.
_VLLM_POOL_REFUSAL = re.compile(r"To serve at least one request with the model's max seq len \((\d+)\), "
                                r"\(([\d.]+) GiB KV cache is needed, which is larger than the available KV cache "
                                r"memory \(([\d.]+) GiB\)")


# The worker's own refusal of --gpu-memory (replay.gpu_memory.available_kv_bytes by vLLM's parameter
# count): the host checks a bundled model before the worker starts; for a model directory, whose
# parameters only vLLM counts, the worker's message already names the flags.
# (The last match: the exception's own line, after any traceback line quoting the source.)
_GPU_MEMORY_REFUSAL = re.compile(r"--gpu-memory \d\S* per GPU: .*$", re.MULTILINE)


def setting_error(exc: BaseException) -> ConfigError | None:
    """A worker failure that is an option's fault, as a ConfigError naming the option (else None)."""
    text = str(exc)
    found = _VLLM_RETENTION_REFUSAL.search(text)
    if found is not None:
        interval, block = int(found[1]), int(found[2])
        return ConfigError(f"--retention {interval}: vLLM's block for this model is {block} tokens and the "
                           f"interval must be a multiple of it: give {block}, {2 * block}, ..., or 0 or none")
    found = _VLLM_POOL_REFUSAL.search(text)
    if found is not None:
        return ConfigError(f"--blocks: vLLM's pool holds {found[3]} GiB of KV cache less its null block, under the "
                           f"{found[2]} GiB one {int(found[1]):,}-token request needs: give more --blocks or lower "
                           "--max-input-len")
    memory = _GPU_MEMORY_REFUSAL.findall(text)
    return ConfigError(memory[-1]) if memory else None


def replay_axes(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pool sizes and the loads the command asks for (one each: one point; more: a sweep)."""
    pools = [{field: v} for field, flag, kind in (("num_blocks", "--blocks", int), ("capacity", "--capacity", str),
                                                  ("gpu_memory", "--gpu-memory", str))
             for v in comma_list(getattr(args, field if field != "num_blocks" else "blocks"), flag, kind) or ()]
    loads = [{field: v} for field, flag, kind in (("concurrency", "--concurrency", int), ("rate", "--rate", float))
             for v in comma_list(getattr(args, field), flag, kind) or ()]
    if args.trace_times is not None:
        loads.append({"time_scale": args.trace_times})
    return pools, loads


def _cmd_replay(args: argparse.Namespace) -> int:
    from marconi.sim.sweep import write_records
    from marconi.integrations.vllm.replay.run import (ReplayConfig, parse_policies, plot_sweep, plot_ttft_cdf,
                                                      replay_table, run_replay)
    from marconi.integrations.vllm.replay.sweep import run_sweep, sweep_configs

    pools, loads = replay_axes(args)
    # The base is the first point, every option in it (--weight-bytes with --gpu-memory), so each
    # point is checked whole on construction, before anything runs (a GPU too small for the weights too).
    base = ReplayConfig(vllm_python=args.vllm_python, model=args.model, trace=args.trace,
                        policies=parse_policies(args.policies), alpha=args.alpha,
                        **(pools[0] if pools else {}), **(loads[0] if loads else {}),
                        gpu=args.gpu, tensor_parallel=args.tensor_parallel, weight_bytes=args.weight_bytes,
                        max_input_len=args.max_input_len,
                        num_requests=args.num_requests, max_output_len=args.max_output_len,
                        max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
                        retention=args.retention, retention_budget=args.retention_budget,
                        **_tier_options(args))
    configs = sweep_configs(base, pools=pools, loads=loads)
    if len(configs) == 1:
        try:
            records = run_replay(configs[0], work_dir=args.work_dir, emulate=not args.no_emulation,
                                 progress=lambda m: print(m, file=sys.stderr))
        except RuntimeError as exc:
            raise setting_error(exc) or exc
    else:
        from tqdm import tqdm

        work = args.work_dir      # None: a temporary folder, removed at the end (marconi.pool.scratch_dir)
        print(f"{len(configs)} points ({len(pools)} pools x {len(loads)} loads) x {len(base.policies)} policies on "
              f"the {args.backend} backend; work in {work or 'a temporary folder'}", file=sys.stderr)
        with tqdm(total=len(configs), desc="sweep", unit="point", disable=None) as bar:   # a terminal only
            backend: Any = args.backend
            if args.backend == "ray" or args.address is not None:
                from marconi.sim.backends import make_backend

                backend = make_backend(args.backend, workers=args.workers, address=args.address)
            records = run_sweep(configs, work_dir=work, backend=backend, workers=args.workers,
                                emulate=not args.no_emulation, on_point=lambda _: bar.update(1),
                                notice=lambda note: bar.write(f"NOTE: {note}", file=sys.stderr))
            if not isinstance(backend, str):
                backend.close()
    _check_tier_chunks(records, args.model)
    write_records(records, args.out)
    print(f"wrote {len(records)} records to {args.out}", file=sys.stderr)
    if base.cpu_tier is not None:                  # two tiers: hits split by tier, bytes moved
        from marconi.integrations.vllm.replay.run import plot_tiers, tier_table

        if args.plot:
            print(f"wrote {plot_tiers(records, args.plot)}", file=sys.stderr)
        print(tier_table(records))
        return 0
    if args.plot:
        plotted = plot_ttft_cdf(records, args.plot) if len(configs) == 1 else plot_sweep(records, args.plot)
        print(f"wrote {plotted}", file=sys.stderr)
    print(replay_table(records))
    return 0


def _check_tier_chunks(records: list[dict[str, Any]], model: str) -> None:
    """Refuse a ``--cpu-tier`` that held no chunk, as ``vllm-align``'s ``cpu_tier`` is refused
    (:func:`~marconi.integrations.vllm.emulate.tier.tier_num_chunks`): vLLM sizes its tier only once it
    has chosen the model's block, in the worker, so a positive size under one chunk shows as a record
    with a tier of 0 chunks. ConfigError naming ``--cpu-tier`` and the chunk's size (by the
    emulation's layout at vLLM's block), before any record is written."""
    from marconi.core.model import ModelSpec
    from marconi.integrations.vllm.emulate.tier import tier_num_chunks
    from marconi.integrations.vllm.layout import layout_for_spec
    from marconi.integrations.vllm.replay.configs import model_dir

    for rec in records:
        cpu_bytes = int(rec.get("cpu_tier_bytes") or 0)
        if not cpu_bytes or rec.get("tier_num_chunks"):
            continue
        where = f"--cpu-tier {rec['cpu_tier']}"
        spec = ModelSpec.from_hf_config(model_dir(model) / "config.json", name=model)
        layout = layout_for_spec(spec, num_blocks=rec["num_blocks"], block_size=rec["block_size"])
        tier_num_chunks(cpu_bytes, layout.block_bytes, where, "drop --cpu-tier for no tier")   # names the chunk
        raise ConfigError(f"{where}: vLLM sized a tier of {cpu_bytes:,} bytes at no chunk (one chunk is a "
                          f"{rec['block_size']}-token block of every KV cache group): give a larger size")


def _tier_options(args: argparse.Namespace) -> dict[str, Any]:
    """``--cpu-tier``, ``--tier-policies`` and ``--host-bandwidth`` as ReplayConfig fields (which
    checks that they agree); ``--tier-policies`` defaults to ``lru`` when a tier is given."""
    from marconi.integrations.vllm.replay.tiers import parse_tier_policies

    policies = (parse_tier_policies(args.tier_policies) if args.tier_policies is not None
                else ("lru",) if args.cpu_tier is not None else ())
    return {"cpu_tier": args.cpu_tier, "tier_policies": policies, "host_bandwidth": args.host_bandwidth}

