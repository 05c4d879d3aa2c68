"""What the plugin costs vLLM's scheduler per step at 10^4 .. 10^6 blocks: stock vs plugin, interleaved.

Runs in the vLLM environment. For each pool size and round, one subprocess per configuration (in a
rotating order, so a shared machine's background load falls on all alike) builds the replay's engine
core (:func:`marconi.integrations.vllm.replay.engine.build_engine_core`: vLLM's own ``Scheduler``,
``KVCacheManager`` and ``BlockPool``, no model) and drives it with
:func:`marconi.integrations.vllm.replay.worker.replay` through one synthetic multi-turn trace:

* ``stock`` — the plugin unset (``MARCONI_VLLM_POLICY=''``): vLLM's LRU;
* ``marconi`` — the plugin's eviction, α = 0.5;
* ``adaptive`` — ``MARCONI_VLLM_ALPHA=adaptive`` as an operator sets it: the shadow replays where
  ``MARCONI_VLLM_ADAPTIVE_REPLAY`` unset puts it (``config.default_replay``: in a child process
  wherever the process may use two CPUs, as here; see ``adaptive-process``);
* ``adaptive-inline`` — the same with ``MARCONI_VLLM_ADAPTIVE_REPLAY=inline``: the shadow replays on
  the scheduler thread (the default before 2026-12-06);
* ``adaptive-lag`` — the same with ``MARCONI_VLLM_ADAPTIVE_LAG=--lag`` (the replay runs in a child
  process; the scheduler thread pays for sending it the tokens it lacks; the child's CPU time is
  added to the "process CPU" column);
* ``adaptive-process`` — ``adaptive`` (lag 0, the same choices) with
  ``MARCONI_VLLM_ADAPTIVE_REPLAY=process`` set explicitly: the child replays each request while the
  scheduler goes on, and the scheduler waits for it (blocked, not on the CPU) when it next evicts;
* ``lru`` (diagnostic) — ``MARCONI_VLLM_POLICY=lru``: the plugin keeps its state but vLLM picks the
  victims, so its evictions are stock's and the difference is bookkeeping alone;
* ``hooks-only`` (diagnostic, ``--in-process`` only) — ``lru`` with the state's event methods
  stubbed out: what the plugin's hooks cost vLLM without the state behind them.

The trace must make the pool evict, and filling 10^6 blocks with distinct tokens would take hours
of scheduling on a CPU; so all but ``--free-region`` blocks of the pool are first taken out of the
free queue and held (``BlockPool.get_new_blocks``, through the plugin's hooks where it is loaded), and
the trace has about ``--fill`` times that region's tokens. The pool's arrays, hash map and the
plugin's per-block state stay pool-sized; the free queue (and the plugin's victim index) hold the
region. ``--free-region 0``: the whole pool is free; the trace then scales with the whole pool, and a
request longer than ``--max-model-len`` is refused before the run (at 10^4 blocks of 1,152 tokens the
default ``--fill 2`` makes 4th turns of 288,000 tokens; ``--sessions 128`` keeps them under 73,000, while a
``--fill`` below 1 would not evict at all).

Prints per pool size and configuration: the scheduler thread's CPU time per step (``thread_time``) —
``Scheduler.schedule`` plus ``Scheduler.update_from_output`` (where finished requests free their
blocks and the adaptive shadow is fed) — and ``schedule`` alone, medians over rounds, their ratios to
stock, the evicted blocks (counted in every configuration by a wrapper on
``BlockPool._maybe_evict_cached_block``, the same in all), and the extra scheduler time per evicted
block against stock; "min vs min" is the ratio of each configuration's least-disturbed round (the work
is deterministic, so on a shared machine the minimum is the steadier estimate); "process CPU" counts
every thread, and the shadow's replay process (what adaptive-lag moves off the scheduler thread); "α source
µs/request" is the wall time the plugin's α source takes per finished request on the scheduler thread
(the inline shadow's replay, or the send to its process; a few µs with α fixed: the event built and
handed over). "interval" brackets the median of the round-by-round ratios: a distribution-free
interval from their order statistics (:func:`median_interval`, the sign test's), at 95% or more where
there are at least 6 rounds, its coverage printed beside it; a target line above its upper end is
met in this run with that confidence, one inside it is not settled by it. The last line is one JSON object, ``{"blocks": N, "step_ratio": x,
"step_ratio_adaptive": y, ...}``: the whole-step ratios at the largest pool size asked, each with its
interval as ``<key>_interval`` (with ``--trace``
also ``"trace"`` and ``"evicted_per_step"``, stock's evicted blocks per step). Not a test; numbers for
reports::

    .venv-vllm/bin/python benchmarks/vllm_sched_overhead.py --blocks 10000,100000,1000000 --rounds 3

``--callgrind`` counts instead of timing (:mod:`callgrind_count`, beside this file): every configuration in
one process under valgrind's callgrind, the same two calls' user-space instructions and simulated cache
misses per step, the same in every run whatever the machine's load; its last line is ``{"blocks": N,
"counted": "callgrind", "step_ratio_instructions": x, "step_ratio_cycles_est": y, ...}`` (``make
bench-vllm-count``). The kernel (system calls, page faults) and other processes are outside that count.

``--trace NAME`` (a catalog name or a trace file, as ``marconi vllm replay --trace`` takes it)
replaces the synthetic trace with that workload's first ``--num-requests`` requests, inputs capped at
``--max-input-len``, selected by the replay's own
:func:`marconi.integrations.common.bench.select_requests` and fed as the replay feeds them (prompt
and output token ids, a session's turns in order). The whole pool is then free, as in production
(``--free-region``, ``--fill``, ``--sessions``, ``--turns``, ``--output-len``, ``--vocab`` do not
apply). The production table's SWE point (docs/vllm-at-scale.md: Nemotron-H-8B, one H100 80 GB)::

    .venv-vllm/bin/python benchmarks/vllm_sched_overhead.py --in-process --trace swe --num-requests 1000 \
        --max-input-len 32768 --blocks 2728 --concurrency 64 --rounds 3
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

CONFIGS = ("stock", "marconi", "adaptive", "adaptive-inline", "adaptive-lag", "lru", "hooks-only")
#: Every configuration a name in --configs may give (CONFIGS is the default list).
KNOWN = CONFIGS + ("adaptive-process",)


def run_in_process(args: argparse.Namespace, n: int, configs: list[str], common: list[str],
                   tmp: Path) -> dict[str, list[dict[str, Any]]]:
    """``--in-process``: one process runs this project's configurations on ``n`` blocks, another (with
    ``--baseline-src`` on its path) stock and the ``@base`` ones; their runs by configuration name."""
    groups = [(None, [c for c in configs if not c.endswith("@base")])]
    based = [c.removesuffix("@base") for c in configs if c.endswith("@base")]
    if based:
        groups.append((os.path.abspath(args.baseline_src), ["stock", *based]))
    lib = None
    if args.callgrind:
        import callgrind_count          # beside this file (run as a script, its folder is on the path)

        lib = callgrind_count.build_lib(tmp)
    runs: dict[str, list[dict[str, Any]]] = {}
    for src, names in groups:
        tag = f"{n}-{'base' if src else 'this'}"
        out = tmp / f"{tag}.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith("MARCONI_VLLM_")}
        env.update(MARCONI_VLLM_POLICY="", MARCONI_VLLM_MAMBA2_CPU_FIX="off", VLLM_ENABLE_V1_MULTIPROCESSING="0",
                   OMP_NUM_THREADS="1", VLLM_ALLOW_LONG_MAX_MODEL_LEN="1")
        if src:
            env["PYTHONPATH"] = src
        prefix, counted = [], []
        if args.callgrind:
            dumps = tmp / f"{tag}-callgrind"
            dumps.mkdir()
            prefix = callgrind_count.command(dumps)
            counted = ["--callgrind-lib", str(lib)]
            env["PYTHONHASHSEED"] = "0"           # the same dict layouts, so the same counts, in every run
        proc = subprocess.run([*prefix, sys.executable, __file__, "--inproc-child", "--num-blocks", str(n),
                               "--out", str(out), "--configs", ",".join(names), "--rounds", str(args.rounds),
                               "--lag", str(args.lag), *counted, *common],
                              env=env, stderr=None, stdout=subprocess.DEVNULL, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{','.join(names)} at {n} blocks failed (exit {proc.returncode})")
        counts = callgrind_count.read_dumps(dumps) if args.callgrind else None
        for name, got in json.loads(out.read_text()).items():
            if counts is not None:
                for r, run in enumerate(got):
                    run["counted"] = counts[count_name(name, r)]
            runs[f"{name}@base" if src else name] = got
    return runs


def count_name(config: str, round_index: int) -> str:
    """The name a configuration's round is counted under (``--callgrind``)."""
    return f"{config}#{round_index}"


def plugin_config(name: str, lag: int = 8) -> Any:
    """The plugin's configuration for one configuration name (None: stock), the Mamba2 CPU fix off;
    ``lag``: ``adaptive-lag``'s. Both ways of running a configuration (a child process, in-process)
    build it here."""
    from marconi.integrations.vllm.config import PluginConfig

    if name == "stock":
        return None
    if name in ("lru", "hooks-only"):
        return PluginConfig(policy="lru", mamba2_cpu_fix=False)
    placed = ({"adaptive_lag": lag} if name == "adaptive-lag"
              else {"adaptive_replay": "process"} if name == "adaptive-process"
              else {"adaptive_replay": "inline"} if name == "adaptive-inline" else {})
    return PluginConfig(policy="marconi", alpha="adaptive" if name.startswith("adaptive") else 0.5,
                        mamba2_cpu_fix=False, **placed)


def config_env(name: str, lag: int = 8) -> dict[str, str]:
    """``MARCONI_VLLM_*`` for one configuration (the plugin reads them when the engine core starts)."""
    config = plugin_config(name, lag)
    return {"MARCONI_VLLM_POLICY": "", "MARCONI_VLLM_MAMBA2_CPU_FIX": "off"} if config is None else config.to_env()


def synthetic_trace(num_tokens: int, *, sessions: int, turns: int, output_len: int, vocab: int,
                    seed: int) -> list[dict[str, Any]]:
    """Multi-turn sessions of random tokens, about ``num_tokens`` prompt tokens in all: each turn's
    prompt is the previous prompt, its output and new tokens (so turns hit their session's prefix),
    and every session is distinct (so the pool fills and evicts)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    per_turn = max(16, num_tokens // max(1, sessions * turns * (turns + 1) // 2))
    history: list[list[int]] = [[] for _ in range(sessions)]
    requests = []
    for turn in range(turns):
        for s in range(sessions):
            prompt = history[s] + rng.integers(1, vocab, size=per_turn).tolist()
            output = rng.integers(1, vocab, size=output_len).tolist()
            requests.append({"session": s, "prompt": prompt, "output": output})
            history[s] = prompt + output
    return requests


@lru_cache(maxsize=1)
def trace_requests(trace: str, max_input_len: int, num_requests: int | None) -> tuple[dict[str, Any], ...]:
    """The first ``num_requests`` requests of ``trace`` (inputs at most ``max_input_len`` tokens) as
    the replay hands them to its worker (``replay.run._replay_in``'s ``requests.json``): selected by
    :func:`~marconi.integrations.common.bench.select_requests`, token ids as lists. Cached: in-process,
    every configuration and round replays the same requests without reloading the trace."""
    from marconi.integrations.common import bench as common

    sel = common.select_requests(trace, max_input_len=max_input_len, num_requests=num_requests)
    return tuple({"session": str(r.session_id), "prompt": r.input_tokens.tolist(), "output": r.output_tokens.tolist(),
                  "ts": float(r.ts)} for r in sel.requests)


def child(args: argparse.Namespace) -> int:
    """One configuration on one pool size (the plugin as vLLM loads it, from the environment)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    Path(args.out).write_text(json.dumps(run_config(args)))
    return 0


def in_process(args: argparse.Namespace) -> int:
    """Every configuration of ``--configs`` on one pool size in this one process, rounds interleaved
    (rotating order): vLLM is imported once, so a round costs an engine core's build and the replay,
    not a process start, and every configuration runs on the same heap and the same minutes of a
    shared machine. The hooks are attached to each stock-built scheduler as ``Scheduler.__init__``'s
    wrapper attaches them (:func:`~marconi.integrations.vllm.plugin.attach_hooks`); stock gets none.
    Then the heap is frozen, as vLLM's engine core freezes it after start-up with the plugin's state
    in it (unfrozen, its pool-sized lists would be walked by every full collection)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import gc

    from marconi.integrations.vllm.config import PluginConfig
    from marconi.integrations.vllm.plugin import attach_hooks

    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
    counter = None
    if args.callgrind_lib:
        import callgrind_count

        counter = callgrind_count.Counter(args.callgrind_lib)

    def attach_for(name: str) -> Any:
        config: PluginConfig | None = plugin_config(name, args.lag)

        def attach(scheduler: Any) -> None:
            if config is not None:
                scheduler._marconi = attach_hooks(scheduler, config)
                if name == "hooks-only":          # the hooks run, the state behind them does nothing
                    for event in ("cached", "uncached", "released", "taken"):
                        setattr(scheduler._marconi.state, event, lambda *_: None)
            # vLLM's EngineCore freezes the heap once its scheduler (the plugin's state included:
            # the hooks attach in Scheduler.__init__) is built; the hooks attached here after that
            # freeze, so freeze again, as vLLM would have (its freeze_gc_heap), for every config.
            for generation in (0, 1, 2):
                gc.collect(generation)
            gc.freeze()
        return attach

    if counter is not None:
        # The process's first run pays one-time work (first calls, caches filling: ~2% more
        # instructions than a later run of the same configuration), which would be counted against
        # whichever configuration came first: one uncounted run of the first takes it.
        run_config(args, attach_for(configs[0]))
        gc.unfreeze()
        gc.collect()
    for r in range(args.rounds):
        for name in configs[r % len(configs):] + configs[:r % len(configs)]:
            runs[name].append(run_config(args, attach_for(name), counter=counter, count_as=count_name(name, r)))
            gc.unfreeze()                 # what this round built may go now (vLLM's shutdown does the same)
            gc.collect()
            got = runs[name][-1]
            took = "counted" if counter else f"{1e3 * got['step_s_per_step']:.3f} ms CPU/step"
            print(f"{args.num_blocks:,} blocks, round {r + 1}, {name}: {took}, {got['evicted']:,} evicted",
                  file=sys.stderr, flush=True)
    Path(args.out).write_text(json.dumps(runs))
    return 0


def replay_cpu_s(scheduler: Any, close: bool = False) -> float:
    """CPU seconds of the lagged shadow's replay process so far (0 without one; Linux /proc), after
    it has replayed every request sent; ``close``: then end it."""
    source = getattr(getattr(getattr(scheduler, "_marconi", None), "state", None), "alpha_source", None)
    pid = getattr(source, "replay_pid", None)
    if pid is None:
        return 0.0
    source.drain()
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    used = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")       # utime + stime
    if close:
        source.close()
    return used


#: The last line's key for each configuration's step ratio.
LAST_LINE_KEYS = (("step_ratio", "marconi"), ("step_ratio_adaptive", "adaptive"),
                  ("step_ratio_adaptive_inline", "adaptive-inline"), ("step_ratio_adaptive_lag", "adaptive-lag"),
                  ("step_ratio_adaptive_process", "adaptive-process"), ("step_ratio_base", "marconi@base"),
                  ("step_ratio_adaptive_base", "adaptive@base"), ("step_ratio_lru", "lru"),
                  ("step_ratio_hooks_only", "hooks-only"))


def count_rows(runs: dict[str, list[dict[str, Any]]], reference: str) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """``--callgrind``'s table rows for one pool size, and its ratios: per configuration, the counts per
    scheduler step (medians over rounds) and, against ``reference``'s (``stock@base`` for ``@base``
    configurations where it ran), the ratio of instructions and of estimated cycles per step, and of
    estimated cycles over the whole run (the configurations may take different numbers of steps).
    ``{name: (instructions ratio, cycles ratio)}`` beside the rows."""
    import callgrind_count

    def summary(got: list[dict[str, Any]]) -> dict[str, float]:
        cycles = [callgrind_count.cycles_est(run["counted"]) for run in got]
        per_step = lambda count: statistics.median(  # noqa: E731
            count(run["counted"]) / max(1, run["num_steps"]) for run in got)
        return {"ir": per_step(lambda c: c["Ir"]), "cyc": per_step(callgrind_count.cycles_est),
                "cyc_run": statistics.median(cycles),
                "l1": per_step(callgrind_count.l1_misses), "ll": per_step(callgrind_count.ll_misses),
                # the rounds' spread: deterministic counts read alike in every round
                "spread": max(cycles) / max(1, min(cycles)) - 1.0}
    summaries = {name: summary(got) for name, got in runs.items()}
    rows, ratios = [], {}
    for name in runs:
        ref = "stock@base" if name.endswith("@base") and "stock@base" in runs else reference
        me, base = summaries[name], summaries[ref]
        ratios[name] = (me["ir"] / base["ir"], me["cyc"] / base["cyc"])
        first = runs[name][0]
        rows.append({"config": name, "steps": f"{first['num_steps']}", "evicted": f"{first['evicted']:,}",
                     "ir": f"{me['ir'] / 1e6:.3f} M", "ir_ratio": f"{ratios[name][0]:.3f}×",
                     "cyc": f"{me['cyc'] / 1e6:.3f} M", "cyc_ratio": f"{ratios[name][1]:.3f}×",
                     "cyc_run": f"{me['cyc_run'] / base['cyc_run']:.3f}×",
                     "l1": f"{me['l1'] / 1e3:.1f} k", "ll": f"{me['ll'] / 1e3:.2f} k",
                     "spread": f"{100 * me['spread']:.2f}%"})
    return rows, ratios


def print_counts(counted: dict[int, dict[str, list[dict[str, Any]]]], configs: list[str], args: Any) -> int:
    """``--callgrind``'s report: a table per pool size, then the last line, ``{"blocks": N,
    "counted": "callgrind", "<key>_instructions": x, "<key>_cycles_est": y, ...}`` with the keys of
    the timed line (``step_ratio``, ``step_ratio_adaptive``, ...) at the largest pool size asked."""
    from marconi.report import format_table

    print(f"Counted under valgrind's callgrind (benchmarks/callgrind_count.py): schedule + update_from_output of the "
          f"scheduler thread, user space only, per step (medians of {args.rounds} rounds); est. cycles = Ir + "
          f"10·L1 misses + 100·LL misses, a model; against {configs[0]}")
    line: dict[str, Any] = {"blocks": max(counted), "counted": "callgrind"}
    for n, runs in counted.items():
        rows, ratios = count_rows(runs, configs[0])
        print(f"{n:,} blocks")
        print(format_table(rows, [("config", "config", None), ("steps", "steps", None), ("evicted", "evicted", None),
                                  ("instructions/step", "ir", None), (f"vs {configs[0]}", "ir_ratio", None),
                                  ("est. cycles/step", "cyc", None), (f"vs {configs[0]}", "cyc_ratio", None),
                                  ("est. cycles, whole run", "cyc_run", None), ("L1 misses/step", "l1", None),
                                  ("LL misses/step", "ll", None),
                                  ("rounds' spread", "spread", None)]))
        if n == line["blocks"]:
            for key, name in LAST_LINE_KEYS:
                if name in ratios:
                    line[f"{key}_instructions"], line[f"{key}_cycles_est"] = (round(x, 4) for x in ratios[name])
    print(json.dumps(line))
    return 0


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """``(low, high, coverage)``: order statistics ``x_(j) <= x_(n+1-j)`` of ``values`` that hold
    their population median with probability ``coverage`` whatever the distribution (the sign
    test's interval: ``coverage = 1 - 2 P(Binomial(n, 1/2) < j)``), the narrowest with ``coverage
    >= level``, else (under 6 values at 95%) the widest, ``min`` to ``max``. Assumes the values
    independent (interleaved rounds). ValueError for no values."""
    xs = sorted(values)
    n = len(xs)
    if not n:
        raise ValueError("median_interval: no values")
    below = 0.0                                   # P(Binomial(n, 1/2) < j), j = 1 first
    best = (xs[0], xs[-1], 1.0 - 2.0 * 0.5 ** n)
    for j in range(1, (n + 1) // 2 + 1):
        below += math.comb(n, j - 1) * 0.5 ** n
        coverage = 1.0 - 2.0 * below
        if coverage < level:
            break
        best = (xs[j - 1], xs[n - j], coverage)
    return best


def source_us(runs: list[dict[str, Any]]) -> str:
    """The α source's wall time per finished request on the scheduler thread (its observe: the inline
    shadow's replay, or the send to its process), the median over rounds; "–" where none observed."""
    per = [1e6 * x["source_s"] / x["num_finished"] for x in runs if x.get("num_finished")]
    return f"{statistics.median(per):.0f}" if per else "–"


def run_config(args: argparse.Namespace, attach: Any = None, counter: Any = None,
               count_as: str = "run") -> dict[str, Any]:
    """Build an engine core (``attach(scheduler)`` first, if given), replay the trace, return the
    per-step scheduler times and what was evicted. ``counter`` (a :class:`callgrind_count.Counter`,
    under valgrind): the timed calls are also counted, the replay's counts dumped as ``count_as``."""
    from marconi.integrations.vllm.replay.engine import build_engine_core
    from marconi.integrations.vllm.replay.run import model_dir
    from marconi.integrations.vllm.replay.worker import replay

    core = build_engine_core(str(model_dir(args.model)), num_blocks=args.num_blocks, max_model_len=args.max_model_len,
                             max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs)
    if attach is not None:
        attach(core.scheduler)
    pool = core.scheduler.kv_cache_manager.block_pool
    block_size = int(core.scheduler.block_size)
    # a real trace runs on the whole pool (production's); the synthetic one cycles through a region
    region = args.free_region if args.free_region and not args.trace else pool.get_num_free_blocks()
    held = pool.get_new_blocks(max(0, pool.get_num_free_blocks() - region))     # out of the queue, for good
    # The held list is this bench's scaffolding (a server's running requests hold their blocks in many
    # small old lists): left young, the first collection of the run walks its 10^6 items (~18 ms in
    # every configuration, inside a timed call or not as it falls), so it is frozen with the rest.
    gc.freeze()
    evicted = [0]
    evict = pool._maybe_evict_cached_block          # vLLM private (the plugin's hook where it is loaded)

    def counting(block: Any) -> bool:
        done = evict(block)
        evicted[0] += bool(done)
        return done

    pool._maybe_evict_cached_block = counting
    # The scheduler thread's work per step is schedule() and update_from_output() (which frees finished
    # requests' blocks and, with adaptive α, feeds the shadow): both are timed, in the thread's CPU time
    # (thread_time: what a shared machine's other processes inflate least; the replay's own wall time
    # of schedule() is kept beside it).
    sched = core.scheduler
    cpu_s = {"schedule": 0.0, "update_from_output": 0.0}

    def timed(name: str) -> None:
        method = getattr(sched, name)

        def wrapper(*a: Any, **k: Any) -> Any:
            t0 = time.thread_time()
            try:
                return method(*a, **k)
            finally:
                cpu_s[name] += time.thread_time() - t0

        def counted(*a: Any, **k: Any) -> Any:
            counter.toggle()
            try:
                return method(*a, **k)
            finally:
                counter.toggle()

        setattr(sched, name, wrapper if counter is None else counted)

    timed("schedule")
    timed("update_from_output")
    if args.trace:
        requests = list(trace_requests(args.trace, args.max_input_len, args.num_requests))
    else:
        requests = synthetic_trace(int(args.fill * region * block_size), sessions=args.sessions, turns=args.turns,
                                   output_len=args.output_len, vocab=args.vocab, seed=args.seed)
    longest = max((len(r["prompt"]) + len(r["output"]) for r in requests), default=0)
    if longest > args.max_model_len:       # vLLM would refuse the request mid-run (or wait on it for good)
        raise SystemExit(f"a request of {longest:,} tokens exceeds --max-model-len {args.max_model_len:,}: "
                         + ("lower --max-input-len" if args.trace else
                            f"the synthetic trace scales with the free region ({region:,} blocks of {block_size}); "
                            "lower --fill, raise --sessions, or set --free-region (or raise --max-model-len)"))
    process_t0 = time.process_time()
    replay_t0 = replay_cpu_s(core.scheduler)          # the replay process's start-up is not the trace's
    if counter is not None:
        counter.begin()
    result = replay(core, requests, gpu="h100", concurrency=args.concurrency, rate=None)
    if counter is not None:
        counter.end(count_as)
    process_cpu_s = time.process_time() - process_t0
    hooks = getattr(core.scheduler, "_marconi", None)
    process_cpu_s += replay_cpu_s(core.scheduler, close=True) - replay_t0
    out = {"sched_s_per_step": result["sched_s_per_step"], "sched_s_total": result["sched_s_total"],
           "process_cpu_s": process_cpu_s, "sched_cpu_s": cpu_s["schedule"], "update_cpu_s": cpu_s["update_from_output"],
           "step_s_per_step": (cpu_s["schedule"] + cpu_s["update_from_output"]) / max(1, result["num_steps"]),
           "num_steps": result["num_steps"], "evicted": evicted[0], "held": len(held), "region": region,
           "block_size": block_size, "num_blocks": int(pool.num_gpu_blocks),
           "prompt_tokens": sum(len(r["prompt"]) for r in requests), "hits": result["prefix_cache_hits"],
           "policy": hooks.policy if hooks is not None else "stock",
           # the α source's share of update_from_output: wall time in its observe per finished request
           # (PoolHooks.source_s: the inline shadow's replay, or a process's send)
           "source_s": hooks.source_s if hooks is not None else 0.0,
           "num_finished": hooks.num_finished if hooks is not None else 0,
           "plugin_evictions": result["plugin_evictions"]}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", default="10000,100000,1000000", help="pool sizes, comma-separated")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="nemotron-h-8b", help="a bundled config or a directory with config.json")
    parser.add_argument("--free-region", type=int, default=500,
                        help="free blocks the trace cycles through (the rest are held); 0: the whole pool")
    parser.add_argument("--fill", type=float, default=2.0, help="trace prompt tokens / the region's tokens")
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--output-len", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--trace", help="a workload (catalog name or trace file, as `marconi vllm replay --trace`) "
                        "instead of the synthetic trace; the whole pool is free")
    parser.add_argument("--num-requests", type=int, default=1000, help="with --trace: its first N requests "
                        "(0: all); 1000, the production table's")
    parser.add_argument("--max-input-len", type=int, default=32768,
                        help="with --trace: a session ends before its first longer input (the production table's cap)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-model-len", type=int, default=1 << 17)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lag", type=int, default=8, help="MARCONI_VLLM_ADAPTIVE_LAG of adaptive-lag (requests)")
    parser.add_argument("--baseline-src", help="a src/ directory of another version of the project (e.g. from git "
                        "archive): configurations named NAME@base run the plugin from it, interleaved with the rest")
    parser.add_argument("--in-process", action="store_true",
                        help="one process per pool size (and per --baseline-src) runs every configuration, rounds "
                             "interleaved: no process start per round (steadier on a loaded machine)")
    parser.add_argument("--callgrind", action="store_true",
                        help="count instead of timing: every configuration in one process under valgrind's callgrind, "
                             "the timed calls' instructions and simulated cache misses "
                             "(deterministic; about 50x slower; needs valgrind and a C compiler; implies --in-process; "
                             "see benchmarks/callgrind_count.py)")
    parser.add_argument("--callgrind-lib", help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--inproc-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--num-blocks", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.num_requests is not None and args.num_requests < 0:
        parser.error(f"--num-requests must be >= 0 (0: the whole trace), got {args.num_requests}")
    if args.max_input_len < 1:
        parser.error(f"--max-input-len must be >= 1, got {args.max_input_len}")
    if args.num_requests == 0:
        args.num_requests = None
    if args.child:
        return child(args)
    if args.inproc_child:
        return in_process(args)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if not configs or any(c.removesuffix("@base") not in KNOWN for c in configs):
        parser.error(f"--configs: choose from {', '.join(KNOWN)} (NAME@base: with --baseline-src)")
    if any(c.endswith("@base") for c in configs) and not args.baseline_src:
        parser.error("--configs NAME@base needs --baseline-src")
    args.in_process = args.in_process or args.callgrind
    if "hooks-only" in configs and not args.in_process:
        parser.error("--configs hooks-only needs --in-process (it stubs the state inside the process)")
    common = ["--model", args.model, "--free-region", str(args.free_region), "--fill", str(args.fill),
              "--sessions", str(args.sessions), "--turns", str(args.turns), "--output-len", str(args.output_len),
              "--vocab", str(args.vocab), "--concurrency", str(args.concurrency),
              "--max-model-len", str(args.max_model_len), "--max-num-batched-tokens", str(args.max_num_batched_tokens),
              "--max-num-seqs", str(args.max_num_seqs), "--seed", str(args.seed),
              "--max-input-len", str(args.max_input_len), "--num-requests", str(args.num_requests or 0)]
    if args.trace:
        common += ["--trace", args.trace]
    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    rows = []
    ratios: dict[tuple[int, str], float] = {}
    evicted_per_step: dict[tuple[int, str], float] = {}
    intervals: dict[tuple[int, str], tuple[float, float, float]] = {}
    counted: dict[int, dict[str, list[dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(x) for x in args.blocks.split(",")):
            runs: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
            if args.in_process:
                runs = run_in_process(args, n, configs, common, Path(tmp))
            if args.callgrind:
                counted[n] = runs
                continue
            for r in range(0 if args.in_process else args.rounds):
                for name in configs[r % len(configs):] + configs[:r % len(configs)]:
                    out = Path(tmp) / f"{n}-{name}-{r}.json"
                    env = {k: v for k, v in os.environ.items() if not k.startswith("MARCONI_VLLM_")}
                    if name.endswith("@base"):
                        env["PYTHONPATH"] = os.path.abspath(args.baseline_src)
                    env.update(config_env(name.removesuffix("@base"), args.lag), VLLM_ENABLE_V1_MULTIPROCESSING="0", OMP_NUM_THREADS="1",
                               VLLM_ALLOW_LONG_MAX_MODEL_LEN="1")
                    proc = subprocess.run([sys.executable, __file__, "--child", "--num-blocks", str(n), "--out", str(out),
                                           *common], env=env, capture_output=True, text=True)
                    if proc.returncode != 0:
                        raise SystemExit(f"{name} at {n} blocks failed:\n{proc.stderr[-3000:]}")
                    runs[name].append(json.loads(out.read_text()))
                    got = runs[name][-1]
                    say(f"{n:,} blocks, round {r + 1}, {name}: {1e3 * got['step_s_per_step']:.3f} ms CPU/step "
                        f"({1e3 * got['sched_s_per_step']:.3f} ms wall in schedule) over "
                        f"{got['num_steps']} steps, {got['evicted']:,} evicted")
            sched_cpu = lambda x: x["sched_cpu_s"] / x["num_steps"]  # noqa: E731
            for name in runs:
                # against the stock run of the same process (in-process: the baseline's own stock)
                ref = "stock@base" if name.endswith("@base") and "stock@base" in runs else configs[0]
                base = statistics.median(map(sched_cpu, runs[ref]))
                base_step = statistics.median(x["step_s_per_step"] for x in runs[ref])
                base_total = statistics.median(x["sched_cpu_s"] + x["update_cpu_s"] for x in runs[ref])
                per_step = statistics.median(map(sched_cpu, runs[name]))
                step = statistics.median(x["step_s_per_step"] for x in runs[name])
                total = statistics.median(x["sched_cpu_s"] + x["update_cpu_s"] for x in runs[name])
                evicted = statistics.median(x["evicted"] for x in runs[name])
                first = runs[name][0]
                ratios[(n, name)] = step / base_step
                paired = [a["step_s_per_step"] / b["step_s_per_step"] for a, b in zip(runs[name], runs[ref])]
                intervals[(n, name)] = low, high, coverage = median_interval(paired)
                evicted_per_step[(n, name)] = statistics.median(x["evicted"] / max(1, x["num_steps"]) for x in runs[name])
                process = statistics.median(x["process_cpu_s"] for x in runs[name])
                base_process = statistics.median(x["process_cpu_s"] for x in runs[ref])
                rows.append({"blocks": f"{n:,}", "config": name, "region": f"{first['region']:,}",
                             "block": first["block_size"], "steps": first["num_steps"], "evicted": f"{evicted:,.0f}",
                             "per_step": f"{evicted_per_step[(n, name)]:.2f}",
                             "ms_sched": f"{1e3 * per_step:.3f}", "ratio_sched": f"{per_step / base:.3f}×",
                             # wall time in schedule(): what a wait for the replay process costs the
                             # step although it is not CPU (the replay's own clock, these rounds' medians)
                             "ratio_wall": f"{statistics.median(x['sched_s_per_step'] for x in runs[name]) / statistics.median(x['sched_s_per_step'] for x in runs[ref]):.3f}×",
                             "ms_step": f"{1e3 * step:.3f}", "ratio": f"{step / base_step:.3f}×",
                             "min_ratio": f"{min(x['step_s_per_step'] for x in runs[name]) / min(x['step_s_per_step'] for x in runs[ref]):.3f}×",
                             # each round's run against the same round's reference (its neighbour in time)
                             "paired": f"{statistics.median(paired):.3f}×",
                             "interval": f"{low:.3f}–{high:.3f}× ({100 * coverage:.0f}%)",
                             "process": f"{process / base_process:.3f}×",
                             "source": source_us(runs[name]),
                             "per_victim": "–" if name == ref or not evicted
                             else f"{1e6 * (total - base_total) / evicted:+.1f} µs"})
    if args.callgrind:
        return print_counts(counted, configs, args)
    from marconi.report import format_table

    workload = (f"{args.trace} (first {args.num_requests or 'all'} requests, inputs <= {args.max_input_len} tokens)"
                if args.trace else "the synthetic trace")
    print(f"{workload}, {args.concurrency} in flight. "
          f"Scheduler-thread CPU time per step (schedule + update_from_output; schedule alone beside it), medians of "
          f"{args.rounds} rounds (configurations interleaved); ratio and extra time per evicted block against "
          f"{configs[0]} (round by round: the median of each round's ratio to the same round's {configs[0]})")
    print(format_table(rows, [("pool (blocks)", "blocks", None), ("config", "config", None),
                              ("free region", "region", None), ("block", "block", None), ("steps", "steps", None),
                              ("evicted", "evicted", None), ("evicted/step", "per_step", None),
                              ("ms/step", "ms_step", None),
                              (f"vs {configs[0]}", "ratio", None), ("min vs min", "min_ratio", None),
                              ("round by round", "paired", None), ("interval", "interval", None),
                              ("schedule ms/step", "ms_sched", None),
                              (f"schedule vs {configs[0]}", "ratio_sched", None),
                              (f"schedule wall vs {configs[0]}", "ratio_wall", None),
                              ("extra per evicted block", "per_victim", None),
                              ("process CPU vs stock", "process", None),
                              ("α source µs/request", "source", None)]))
    # The line a script reads (the last): the step ratios at the largest pool size asked.
    largest = max(n for n, _ in ratios)
    line: dict[str, Any] = {"blocks": largest}
    if args.trace:
        line["trace"] = args.trace
        line["evicted_per_step"] = round(evicted_per_step[(largest, configs[0])], 4)
    for key, name in LAST_LINE_KEYS:
        if (largest, name) in ratios:
            line[key] = round(ratios[(largest, name)], 4)
            line[key + "_interval"] = [round(x, 4) for x in intervals[(largest, name)][:2]]
    print(json.dumps(line))
    return 0

if __name__ == "__main__":
    sys.exit(main())
