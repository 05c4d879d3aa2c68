"""``marconi vllm bench``: stock vLLM vs vLLM with the Marconi plugin, on a real server, on a real trace.

One server per policy (``lru``: stock, plugin not loaded; ``marconi[:alpha=X]``), all with the same
block pool, replays the trace as token ids (:mod:`marconi.integrations.common.bench`); hit rates are
vLLM's counters, TTFT/TPOT the client's. The ``vllm-align`` emulation then serves the same requests
with the outputs each server generated, and its hit rate and error go beside vLLM's. Every option
and output is checked, and the emulation run, before any server starts (docs/vllm.md, "The bench").
"""

from __future__ import annotations

import base64
import json
import sys
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import numpy as np

from marconi.core.model import ModelSpec
from marconi.core.registry import ConfigError
from marconi.integrations.common import bench as common
from marconi.integrations.common.bench import Progress, Selection, max_tokens, mean_or_none, percentile
from marconi.integrations.common.server import ServerProcess
from marconi.integrations.vllm.arms import policy_arm
from marconi.integrations.vllm.config import ADAPTIVE, PluginConfig, parse_alpha
from marconi.integrations.vllm.emulate.engine import VllmAlignEngine
from marconi.integrations.vllm.layout import layout_for_spec
from marconi.integrations.vllm.models import BLOCK_SIZES, NEEDS_MAMBA2_CPU_FIX, PRESETS
from marconi.integrations.vllm.policy import DEFAULT_ALPHA
from marconi.integrations.vllm.server import ServerConfig, VllmServer
from marconi.workloads.trace import Request

__all__ = ["BenchConfig", "BenchOutcome", "RunResult", "EmulatedRun", "select_requests", "run_bench", "emulate_run",
           "check_outputs", "alpha_changes", "bench_table", "plot_ttft_cdf", "write_fixture",
           "read_fixture", "encode_ids", "decode_ids"]


# ====================================================================================== config
@dataclass(frozen=True, slots=True)
class BenchConfig:
    """One bench invocation (every field echoed in the records)."""

    vllm_python: str
    model: str = "qwen3_next-tiny"
    trace: str = "swe-sample"                         # a catalog name or a trace file
    max_input_len: int = 8192
    num_requests: int | None = None
    max_output_len: int | None = None
    num_blocks: int = 150
    policies: tuple[str, ...] = ("lru", "marconi")   # "lru", "marconi" (α = alpha) or "marconi:alpha=X"
    alpha: float | str = DEFAULT_ALPHA                # a number or "adaptive"
    concurrency: int = 1
    max_num_batched_tokens: int = 2048
    prefix_match_unit: int | None = None
    retention_interval: int | None = 0
    work_dir: str = "results/vllm_bench_work"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.model not in PRESETS:
            raise ConfigError(f"unknown model preset {self.model!r}; presets: {', '.join(PRESETS)}")
        object.__setattr__(self, "alpha", parse_alpha(self.alpha, "--alpha"))
        if not self.policies:
            raise ConfigError("give at least one policy: lru, marconi or marconi:alpha=X")
        arms = [policy_arm(p, self.alpha) for p in self.policies]     # validates each
        if len(set(arms)) != len(arms):
            raise ConfigError(f"policies {list(self.policies)} name the same server twice")
        if self.concurrency < 1 or self.num_blocks < 2 or self.max_input_len < 2:
            raise ConfigError("concurrency must be >= 1, blocks >= 2, max input length >= 2")
        if self.num_requests is not None and self.num_requests < 1:
            raise ConfigError("num_requests must be >= 1")
        if self.max_output_len is not None and self.max_output_len < 1:
            raise ConfigError("max_output_len must be >= 1")
        if self.max_num_batched_tokens < 1:
            raise ConfigError(f"--max-num-batched-tokens {self.max_num_batched_tokens}: must be >= 1")
        block = self.block_size
        unit = self.prefix_match_unit
        if unit is not None and (unit < 1 or block % unit):
            raise ConfigError(f"--prefix-match-unit {unit}: must divide the block of {self.model} ({block} tokens), "
                              "e.g. 32, 64 or 128")
        retention = self.retention_interval
        if retention is not None and (retention < 0 or retention % block):
            raise ConfigError(f"--retention {retention}: must be 0, none or a multiple of the block of {self.model} "
                              f"({block} tokens), e.g. {2 * block}")

    @property
    def block_size(self) -> int:
        return BLOCK_SIZES[self.model]


def check_outputs(trace: str, *, out: str | None, plot: str | None, fixture: str | None) -> None:
    """Refuse, before anything runs, an output the bench could not write after its servers ran:
    a path that cannot be written or that names an input (the trace, its sidecar), two outputs on
    one file, a ``--plot`` without matplotlib.

    Raises:
        ConfigError: naming the option and the path.
        ModuleNotFoundError: matplotlib is missing and a plot is asked for.
    """
    from marconi.commandline import read_files
    from marconi.io import check_output

    inputs = read_files(traces=[trace])
    named = [(option, path) for option, path in (("--out", out), ("--plot", plot), ("--record-fixture", fixture))
             if path]
    for i, (option, path) in enumerate(named):
        for other_option, other in named[:i]:
            if Path(path).resolve() == Path(other).resolve():
                raise ConfigError(f"{option} {path} is also {other_option}: give each output its own file")
        check_output(path, inputs=inputs, option=option)
    if plot:
        import matplotlib  # noqa: F401  (a missing plotting extra is said now, not after the run)


def select_requests(config: BenchConfig, notice: Progress | None = None) -> Selection:
    """``(requests, indices, trace_info)``: the bench's trace (a catalog name or a trace file),
    inputs capped at ``max_input_len``, the first ``num_requests``, outputs capped at
    ``max_output_len`` (see :func:`marconi.integrations.common.bench.select_requests`)."""
    return common.select_requests(config.trace, max_input_len=config.max_input_len, num_requests=config.num_requests,
                                  max_output_len=config.max_output_len, notice=notice)


def max_model_len(requests: Sequence[Request], block_size: int) -> int:
    longest = max(r.input_len + max_tokens(r) for r in requests)
    return -(-longest // block_size) * block_size


# ====================================================================================== one run
@dataclass(slots=True)
class RunResult:
    policy: str
    plugin: str                             # "absent", "cpu-fix-only" or the plugin policy
    cached_tokens: list[int]
    outputs: list[list[int]]
    ttft_s: list[float]
    tpot_s: list[float | None]
    latency_s: list[float]
    metrics: dict[str, float]
    startup_s: float
    wall_s: float
    settings: dict[str, Any] = field(default_factory=dict)
    alpha_changes: list[list[Any]] | None = None      # from the plugin's block trace (see alpha_changes)


def _plugin_env(config: BenchConfig, label: str, trace_path: Path) -> tuple[dict[str, str], str]:
    policy, alpha = policy_arm(label, config.alpha)
    if policy == "marconi":
        return PluginConfig(policy="marconi", alpha=alpha, trace_path=str(trace_path)).to_env(), "marconi"
    if config.model in NEEDS_MAMBA2_CPU_FIX:          # stock eviction, but the model must run at all
        return {"MARCONI_VLLM_POLICY": "", "MARCONI_VLLM_MAMBA2_CPU_FIX": "auto"}, "cpu-fix-only"
    return {}, "absent"


def serve_runs(config: BenchConfig, model_dir: Path, requests: Sequence[Request],
               progress: Progress) -> list[RunResult]:
    """Start one server per policy, replay ``requests`` on each, read the counters, stop them
    (:func:`marconi.integrations.common.bench.serve_side_by_side`: paired at ``concurrency == 1``)."""
    work = Path(config.work_dir)
    servers: dict[str, ServerProcess] = {}
    plugins: dict[str, str] = {}
    traces: dict[str, Path] = {}
    for policy in config.policies:
        traces[policy] = work / f"blocks-{common.file_label(policy)}.jsonl"
        traces[policy].unlink(missing_ok=True)
        env, plugins[policy] = _plugin_env(config, policy, traces[policy])
        server_config = ServerConfig(python=config.vllm_python, model_dir=str(model_dir),
                                     num_blocks=config.num_blocks,
                                     max_model_len=max_model_len(requests, config.block_size),
                                     max_num_batched_tokens=config.max_num_batched_tokens,
                                     block_size=config.block_size, max_num_seqs=max(8, config.concurrency),
                                     prefix_match_unit=config.prefix_match_unit,
                                     retention_interval=config.retention_interval, plugin_env=env)
        servers[policy] = VllmServer(server_config, log_path=work / f"server-{common.file_label(policy)}.log")
    progress(f"starting {len(servers)} vLLM server(s) ({', '.join(f'{p}: {plugins[p]} plugin' for p in servers)}; "
             f"{config.num_blocks} blocks of {config.block_size} tokens)")
    served = common.serve_side_by_side(servers, str(model_dir), requests, concurrency=config.concurrency,
                                       progress=progress,
                                       on_up=lambda _, server: _check_block_size(server.metrics(), config.block_size))
    runs = []
    for policy, run in served.items():
        res = run.results
        runs.append(RunResult(policy, plugins[policy], [r.cached_tokens for r in res], [r.output for r in res],
                              [r.ttft_s for r in res], [r.tpot_s for r in res], [r.latency_s for r in res],
                              run.metrics, run.startup_s, run.wall_s, _settings(traces[policy]),
                              _trace_alpha_changes(traces[policy])))
    return runs


def alpha_changes(events: Any) -> list[list[Any]]:
    """``[[request, alpha, efficiency], ...]`` from a block trace's ``alpha`` events: the rule the
    α source switched to after request ``request`` (0-based, in admission order) finished."""
    out: list[list[Any]] = []
    num_lookups = 0
    for event in events:
        if event[0] == "lookup":
            num_lookups += 1
        elif event[0] == "alpha":
            out.append([num_lookups - 1, float(event[1]), event[2]])
    return out


def _trace_alpha_changes(trace_path: Path) -> list[list[Any]] | None:
    """The α changes in a server's block trace (None without a trace: the plugin was not on)."""
    if not trace_path.is_file():
        return None
    with trace_path.open() as fh:
        return alpha_changes(json.loads(line) for line in fh if line.startswith('["lookup"') or line.startswith('["alpha"'))


def _settings(trace_path: Path) -> dict[str, Any]:
    """The scheduler settings the plugin logged (first event of its block trace), if any."""
    if not trace_path.is_file():
        return {}
    with trace_path.open() as fh:
        first = fh.readline()
    event = json.loads(first) if first else None
    return event[1] if event and event[0] == "config" else {}


def _check_block_size(metrics: dict[str, float], expected: int) -> None:
    for key in metrics:
        if key.startswith("vllm:cache_config_info"):
            found = [p for p in key.split(",") if p.startswith("block_size=")]
            if found and found[0] != f'block_size="{expected}"':
                raise ConfigError(f"vLLM chose {found[0]} but the bench expects {expected}; update "
                                  "marconi.integrations.vllm.models.BLOCK_SIZES for this vLLM")


# ====================================================================================== emulation
class EmulatedRun(NamedTuple):
    hits: list[int]                      # per request, vLLM's num_cached_tokens as emulated
    evictions: dict[str, int]            # "<group kind>:<reason>" -> blocks
    alpha_changes: list[list[Any]]       # [[request, alpha, efficiency], ...] (adaptive α; else empty)


def emulate_run(spec: ModelSpec, config: BenchConfig, requests: Sequence[Request],
                outputs: Sequence[Sequence[int]], policy: str) -> EmulatedRun:
    """The ``vllm-align`` emulation of one bench server (``policy``: its label, as in
    ``config.policies``) on these prompts and outputs; a fresh α source, as a fresh server has."""
    layout = layout_for_spec(spec, num_blocks=config.num_blocks, block_size=config.block_size,
                             max_num_batched_tokens=config.max_num_batched_tokens,
                             prefix_match_unit=config.prefix_match_unit, retention_interval=config.retention_interval)
    eviction, alpha = policy_arm(policy, config.alpha)
    engine = VllmAlignEngine(layout, spec, eviction=eviction, alpha=DEFAULT_ALPHA if alpha is None else alpha)
    events: list[tuple[Any, ...]] = []
    engine.pool.trace = events
    hits = []
    for r, o in zip(requests, outputs):
        hits.append(engine.run(r.input_tokens, np.asarray(o, dtype=np.int32)).hit_len)
        if len(events) > 4096:        # keep only what alpha_changes reads
            events[:] = [e for e in events if e[0] in ("lookup", "alpha")]
    return EmulatedRun(hits, dict(engine.pool.stats.evictions), alpha_changes(events))


def make_record(config: BenchConfig, trace_info: dict[str, Any], spec: ModelSpec, requests: Sequence[Request],
                indices: Sequence[int], run: RunResult, sim: EmulatedRun, sim_trace_hits: Sequence[int]) -> dict[str, Any]:
    prompt_tokens = int(sum(r.input_len for r in requests))
    queries = run.metrics.get("vllm:prefix_cache_queries_total", 0.0)
    hits = run.metrics.get("vllm:prefix_cache_hits_total", 0.0)
    token_hit = hits / queries if queries else 0.0
    sim_hits = sim.hits
    sim_rate = sum(sim_hits) / prompt_tokens
    matches = sum(int(a == b) for a, b in zip(run.cached_tokens, sim_hits))
    policy, alpha = policy_arm(run.policy, config.alpha)
    marconi = {k.removeprefix("marconi:"): v for k, v in run.metrics.items() if k.startswith("marconi:")}
    return {
        "engine": "vllm", "policy": policy, "arm": run.policy, "plugin": run.plugin, "model": config.model,
        "alpha": alpha,
        **trace_info, "num_requests": len(requests), "prompt_tokens": prompt_tokens,
        "output_tokens": int(sum(len(o) for o in run.outputs)),
        "block_size": config.block_size, "num_blocks": config.num_blocks,
        "max_num_batched_tokens": config.max_num_batched_tokens, "concurrency": config.concurrency,
        "prefix_match_unit": config.prefix_match_unit or config.block_size,
        "retention_interval": config.retention_interval,
        "token_hit_rate": token_hit, "prefix_cache_queries": queries, "prefix_cache_hits": hits,
        "request_cached_tokens": int(sum(run.cached_tokens)),
        "ttft_p50_s": percentile(run.ttft_s, 50), "ttft_p90_s": percentile(run.ttft_s, 90),
        "ttft_p95_s": percentile(run.ttft_s, 95), "ttft_p99_s": percentile(run.ttft_s, 99),
        "ttft_mean_s": float(np.mean(run.ttft_s)), "tpot_p50_s": percentile(run.tpot_s, 50),
        "tpot_mean_s": mean_or_none(run.tpot_s),
        "sim_token_hit_rate": sim_rate, "emulation_error_pp": 100.0 * (sim_rate - token_hit),
        "emulation_requests_exact": matches, "sim_evictions": sim.evictions,
        "alpha_changes": run.alpha_changes, "sim_alpha_changes": sim.alpha_changes if alpha == ADAPTIVE else None,
        "sim_trace_token_hit_rate": sum(sim_trace_hits) / prompt_tokens,
        "marconi_counters": marconi, "server_settings": run.settings,
        "startup_s": run.startup_s, "wall_s": run.wall_s, "model_spec": spec.describe(),
        "per_request": {"index": list(indices), "prompt_len": [r.input_len for r in requests],
                        "cached_tokens": run.cached_tokens, "sim_cached_tokens": list(sim_hits),
                        "output_len": [len(o) for o in run.outputs], "ttft_s": [round(t, 6) for t in run.ttft_s],
                        "tpot_s": [None if t is None else round(t, 6) for t in run.tpot_s]},
    }


# ====================================================================================== the bench
def build_model(config: BenchConfig, progress: Progress) -> Path:
    """The preset's random-weight model, built in the vLLM environment (probed first: ConfigError
    naming ``--vllm-python`` unless it is one, :func:`marconi.integrations.common.probe.probe_python`).
    Creates ``work_dir`` only once the probe passed, so a refused run leaves no empty directory."""
    from marconi.integrations.common.probe import probe_python
    from marconi.pool import run_child

    probe_python(config.vllm_python, "vllm", option="--vllm-python", make_target="make vllm-env")
    Path(config.work_dir).mkdir(parents=True, exist_ok=True)   # once the probe passed: a refusal leaves nothing
    model_dir = Path(config.work_dir) / "models" / config.model
    progress(f"building {config.model} (random weights, seed {config.seed}) in {model_dir}")
    proc = run_child([config.vllm_python, "-m", "marconi.integrations.vllm.models", config.model, str(model_dir),
                      "--seed", str(config.seed)])
    if proc.returncode != 0:
        raise RuntimeError(f"building {config.model} failed:\n{proc.stderr[-3000:]}")
    return model_dir


@dataclass(slots=True)
class BenchOutcome:
    records: list[dict[str, Any]]        # one per policy (what --out holds)
    runs: list[RunResult]
    requests: list[Request]
    indices: list[int]                   # each request's position in the trace
    spec: ModelSpec


def run_bench(config: BenchConfig, progress: Progress | None = None) -> BenchOutcome:
    """Run every policy: records (one per policy), the raw runs, the requests and the model's spec.

    The trace is resolved first (a bad ``--trace`` fails before anything needs vLLM), then the
    vLLM environment's python is probed, before the first thing runs there (:func:`build_model`:
    ConfigError naming ``--vllm-python`` unless it runs and has vLLM and this project)."""
    say = progress or (lambda msg: print(msg, file=sys.stderr))
    requests, indices, trace_info = select_requests(config, notice=say)
    say(f"trace {trace_info['trace']}: {len(requests)} requests, {sum(r.input_len for r in requests):,} prompt "
        f"tokens, {sum(max_tokens(r) for r in requests):,} output tokens")
    model_dir = build_model(config, say)
    spec = ModelSpec.from_hf_config(model_dir, name=config.model, bytes_per_elem=2)
    # Needs no server, so it runs first: whatever the emulation refuses is refused before one starts.
    sim_trace_hits = {policy: _emulate_trace(spec, config, requests, policy) for policy in config.policies}
    records, runs = [], []
    for run in serve_runs(config, model_dir, requests, say):
        policy = run.policy
        sim = emulate_run(spec, config, requests, run.outputs, policy)
        rec = make_record(config, trace_info, spec, requests, indices, run, sim, sim_trace_hits[policy])
        say(f"[{policy}] vLLM token hit rate {100 * rec['token_hit_rate']:.2f}%, emulation "
            f"{100 * rec['sim_token_hit_rate']:.2f}% ({rec['emulation_error_pp']:+.2f} pp, "
            f"{rec['emulation_requests_exact']}/{len(requests)} requests exact), TTFT P50 "
            f"{1000 * rec['ttft_p50_s']:.0f} ms, {run.wall_s:.0f}s")
        records.append(rec)
        runs.append(run)
    return BenchOutcome(records, runs, requests, indices, spec)


def _emulate_trace(spec: ModelSpec, config: BenchConfig, requests: Sequence[Request], policy: str) -> list[int]:
    """The emulation's hits on the trace's own outputs (``sim_trace_token_hit_rate``); ConfigError
    naming ``--blocks`` where the pool cannot serve a request (vLLM would never schedule it)."""
    try:
        return emulate_run(spec, config, requests, [r.output_tokens for r in requests], policy).hits
    except ConfigError as exc:
        raise ConfigError(f"--blocks {config.num_blocks} cannot serve this trace ({policy}): {exc} — here: raise "
                          "--blocks or lower --max-input-len (no server was started)") from None


def bench_table(records: Sequence[dict[str, Any]]) -> str:
    from marconi.report import fmt_pct, fmt_seconds, format_table

    rows = []
    for rec in records:
        row = dict(rec)
        row["_err"] = f"{rec['emulation_error_pp']:+.2f}pp"
        row["_exact"] = f"{rec['emulation_requests_exact']}/{rec['num_requests']}"
        ev = rec.get("marconi_counters") or {}
        row["_evicted"] = int(sum(v for k, v in ev.items() if k.startswith("evicted_blocks"))) if ev else \
            int(sum(rec["sim_evictions"].values()))
        rows.append(row)
    return format_table(rows, [
        ("policy", "arm", None), ("plugin", "plugin", None), ("requests", "num_requests", None),
        ("vLLM token hit", "token_hit_rate", fmt_pct), ("emulated", "sim_token_hit_rate", fmt_pct), ("error", "_err", None),
        ("exact req", "_exact", None), ("evicted blocks", "_evicted", None),
        ("TTFT P50", "ttft_p50_s", fmt_seconds), ("TTFT P90", "ttft_p90_s", fmt_seconds), ("TTFT P95", "ttft_p95_s", fmt_seconds),
        ("TTFT P99", "ttft_p99_s", fmt_seconds), ("TPOT mean", "tpot_mean_s", fmt_seconds)])


def plot_ttft_cdf(records: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """One CDF of per-request TTFT per policy (PNG, written atomically)."""
    from marconi.report import plot_ttft_cdf as plot

    first = records[0]
    return plot(records, path, clock="client-side",
                title=f"vLLM {first['model']}, {first['num_requests']} requests, {first['num_blocks']} blocks")


# ====================================================================================== fixture
def encode_ids(ids: Sequence[int]) -> str:
    return base64.b64encode(zlib.compress(np.asarray(ids, dtype="<i4").tobytes(), 9)).decode("ascii")


def decode_ids(text: str) -> list[int]:
    return np.frombuffer(zlib.decompress(base64.b64decode(text)), dtype="<i4").tolist()


def write_fixture(path: str | Path, config: BenchConfig, outcome: BenchOutcome, command: str) -> Path:
    """The real server's per-request counts and outputs, for the emulation test (atomic write)."""
    from marconi.io import atomic_write

    requests, runs = outcome.requests, outcome.runs
    data = {
        "command": command, "config": {k: v for k, v in asdict(config).items() if k not in ("vllm_python", "work_dir")},
        "model_spec": {k: v for k, v in outcome.spec.to_dict().items() if k != "source"},
        "block_size": config.block_size, "requests": list(outcome.indices),
        "max_tokens": [max_tokens(r) for r in requests],
        "runs": [{"policy": run.policy, "plugin": run.plugin, "cached_tokens": run.cached_tokens,
                  "alpha_changes": run.alpha_changes,
                  "outputs": [encode_ids(o) for o in run.outputs],
                  "prefix_cache_queries": run.metrics.get("vllm:prefix_cache_queries_total"),
                  "prefix_cache_hits": run.metrics.get("vllm:prefix_cache_hits_total")} for run in runs],
    }
    with atomic_write(path, "w") as fh:
        json.dump(data, fh, indent=1)
        fh.write("\n")
    return Path(path)


def read_fixture(path: str | Path) -> dict[str, Any]:
    with open(path) as fh:
        data = json.load(fh)
    for run in data["runs"]:
        run["outputs"] = [decode_ids(o) for o in run["outputs"]]
    return data
