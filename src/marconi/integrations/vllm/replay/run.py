"""``marconi vllm replay``: the trace through vLLM's own scheduler and block pool, no model, a virtual clock.

The project-environment side: select the requests, size the pool, launch
:mod:`~marconi.integrations.vllm.replay.worker` in the vLLM environment once per policy (``lru``:
stock vLLM; ``marconi[:alpha=X]``: the plugin) and per tier policy with ``cpu_tier``, run the
``vllm-align`` emulation on the same requests and pool, and make one record per run. Loads,
retention and the tier's record fields: docs/vllm.md ("The replay", "Sparse retention") and
docs/vllm-tiers.md.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from marconi.core.model import ModelSpec
from marconi.core.registry import ConfigError
from marconi.integrations.common import bench as common
from marconi.integrations.common.bench import mean_or_none, percentile
from marconi.integrations.common.probe import probe_python
from marconi.integrations.vllm.arms import parse_policies, parse_retention, policy_arm
from marconi.integrations.vllm.config import PluginConfig
from marconi.integrations.vllm.policy import ATTENTION, DEFAULT_ALPHA, MAMBA
from marconi.integrations.vllm.replay.configs import CONFIGS_DIR, VLLM_BLOCK_SIZES, model_dir
from marconi.integrations.vllm.replay.gpu_memory import BUNDLED_NUM_PARAMS, available_kv_bytes, parse_gpu_memory
from marconi.integrations.vllm.replay.pool_floor import (capacity_floor_note, check_pool_blocks, minimum_pool,
                                                          replay_max_model_len)
from marconi.integrations.vllm.replay.tiers import NO_TIER
from marconi.integrations.vllm.retention import DEFAULT_BUDGET, SPARSE_DP
from marconi.pool import KEEP_SCRATCH_ENV, child_process, scratch_dir
from marconi.units import parse_capacity

__all__ = ["ReplayConfig", "CONFIGS_DIR", "model_dir", "check_tensor_parallel", "check_step_budget", "check_pool",
           "DEFAULT_MAX_NUM_SEQS",
           "policy_env", "run_replay", "select_replay_requests", "replay_working_set", "needs_working_set",
           "replay_table", "load_label",
           "emulation_engine", "plot_ttft_cdf", "plot_sweep", "parse_policies"]


#: vLLM's ``max_num_seqs`` in a replay that does not set it (``--max-num-seqs``), as vLLM's own default.
DEFAULT_MAX_NUM_SEQS = 256


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """One replay invocation (echoed in every record). Exactly one of ``num_blocks``, ``capacity``,
    ``gpu_memory``; one of ``concurrency``, ``rate``, ``time_scale`` (trace timestamps)."""

    vllm_python: str
    model: str = "nemotron-h-8b"
    trace: str = "swe-sample"
    policies: tuple[str, ...] = ("lru", "marconi")
    alpha: float | str = DEFAULT_ALPHA
    num_blocks: int | None = None
    capacity: str | None = None
    gpu_memory: str | None = None
    gpu: str = "h100"
    tensor_parallel: int = 1               # GPUs per replica: the --gpu-memory arithmetic and the step time
    weight_bytes: int | None = None        # bytes per weight in --gpu-memory (None: the dtype's; 1: FP8)
    concurrency: int | None = None
    rate: float | None = None
    time_scale: float | None = None
    max_input_len: int = 8192
    num_requests: int | None = None
    max_output_len: int | None = None
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    seed: int = 0
    retention: str = "0"                   # vLLM's interval (0, none, tokens) or sparse-dp (the plugin's)
    retention_budget: int | None = None    # with sparse-dp: MARCONI_VLLM_RETENTION_BUDGET (None: its default)
    cpu_tier: str | None = None            # a CPU tier (vLLM's OffloadingConnector): bytes (256GB) or 0.5x
    tier_policies: tuple[str, ...] = ()    # with cpu_tier: lru, arc, marconi, none (GPU only); one engine each
    host_bandwidth: float | None = None    # bytes/s per direction per GPU (None: tiers.DEFAULT_HOST_BANDWIDTH)

    def __post_init__(self) -> None:
        from marconi.integrations.vllm.replay.steptime import GPUS

        if self.retention.strip().lower() != SPARSE_DP:
            parse_retention(self.retention)
            if self.retention_budget is not None:
                raise ConfigError(f"--retention-budget needs --retention {SPARSE_DP}")
        elif self.retention_budget is not None and self.retention_budget < 0:
            raise ConfigError(f"--retention-budget must be >= 0, got {self.retention_budget}")

        if sum(x is not None for x in (self.num_blocks, self.capacity, self.gpu_memory)) != 1:
            raise ConfigError("give one of --blocks, --capacity, --gpu-memory")
        if sum(x is not None for x in (self.concurrency, self.rate, self.time_scale)) != 1:
            raise ConfigError("give one of --concurrency C (a closed loop), --rate R (Poisson arrivals), "
                              "--trace-times [SCALE] (the trace's timestamps)")
        if self.concurrency is not None and self.concurrency < 1 or self.rate is not None and not self.rate > 0:
            raise ConfigError("concurrency must be >= 1 and rate > 0")
        if self.time_scale is not None and not self.time_scale >= 0:
            raise ConfigError(f"the trace-times scale must be >= 0, got {self.time_scale}")
        if self.gpu not in GPUS:
            raise ConfigError(f"unknown GPU {self.gpu!r}; known: {', '.join(GPUS)}")
        if self.tensor_parallel < 1 or self.weight_bytes is not None and self.weight_bytes < 1:
            raise ConfigError("--tensor-parallel and --weight-bytes must be >= 1")
        if self.weight_bytes is not None and self.gpu_memory is None:
            raise ConfigError("--weight-bytes sizes the weights in --gpu-memory's arithmetic: give --gpu-memory")
        check_step_budget(self.max_num_batched_tokens, self.max_num_seqs)
        if not self.policies:
            raise ConfigError("give at least one policy")
        for p in self.policies:
            policy_arm(p, self.alpha)
        if self.capacity is not None:
            parse_capacity(self.capacity)
        _check_tier(self)
        check_tensor_parallel(model_dir(self.model), self.tensor_parallel)
        if self.gpu_memory is not None:
            _check_gpu_memory(self)

    @property
    def tier_arms(self) -> tuple[str | None, ...]:
        """The tier policies each GPU policy runs with (``(None,)``: no tier at all)."""
        return self.tier_policies if self.cpu_tier is not None else (None,)

    @property
    def sparse_budget(self) -> int | None:
        """``MARCONI_VLLM_RETENTION=sparse-dp``'s budget, or None when vLLM's interval decides."""
        if self.retention.strip().lower() != SPARSE_DP:
            return None
        return DEFAULT_BUDGET if self.retention_budget is None else self.retention_budget

    @property
    def retention_interval(self) -> int | None:
        """vLLM's ``prefix_cache_retention_interval`` (0 under sparse-dp)."""
        return 0 if self.sparse_budget is not None else parse_retention(self.retention)

    @property
    def arrivals(self) -> str:
        """The load's mode, as :mod:`~marconi.integrations.vllm.arrivals` names it."""
        return "closed-loop" if self.concurrency is not None else "poisson" if self.rate is not None else "trace"

    def load_args(self) -> list[str]:
        """The worker's load option."""
        if self.concurrency is not None:
            return ["--concurrency", str(self.concurrency)]
        if self.rate is not None:
            return ["--rate", str(self.rate)]
        return ["--trace-times", str(self.time_scale)]


#: The config.json head counts vLLM splits over tensor-parallel ranks (KV, Mamba-2, GDN).
_SHARDED_HEADS = ("num_attention_heads", "num_key_value_heads", "mamba_num_heads", "n_groups", "mamba_n_groups",
                  "linear_num_key_heads", "linear_num_value_heads")


def check_tensor_parallel(mdir: Path, tensor_parallel: int) -> None:
    """Refuse a TP the replay and the diagnosis cannot stand for: where it does not divide a layer's
    heads, vLLM replicates them on each rank, so a rank's pages (and the hybrid block size) are not
    ``1/TP`` of the whole model's that both derive. ConfigError naming ``--tensor-parallel`` and
    the TPs that would do (``mdir``: a directory with the model's config.json)."""
    if tensor_parallel == 1:
        return
    hf = json.loads((mdir / "config.json").read_text())
    heads = {key: hf[key] for key in _SHARDED_HEADS if isinstance(hf.get(key), int) and hf[key] > 0}
    for key, value in heads.items():
        if value % tensor_parallel:
            common = math.gcd(*heads.values())
            fits = [str(tp) for tp in range(1, common + 1) if common % tp == 0]
            either = f"{', '.join(fits[:-1])} or {fits[-1]}" if len(fits) > 1 else fits[0]
            raise ConfigError(f"--tensor-parallel {tensor_parallel} does not divide {key}={value} of {mdir.name}: "
                              "vLLM would replicate those heads and its block size would differ from the "
                              f"1/TP split derived here; give --tensor-parallel {either} (each divides every "
                              "head count)")


def check_step_budget(max_num_batched_tokens: int, max_num_seqs: int, *, budget_source: str | None = None,
                      seqs_flag: bool = True) -> None:
    """vLLM's rule for one scheduler step, which it checks when it builds its config (``SchedulerConfig``:
    pydantic's error, in the worker): the token budget holds a token of every request in the step,
    ``max_num_batched_tokens >= max_num_seqs``.

    Raises:
        ConfigError: naming ``--max-num-batched-tokens`` and ``--max-num-seqs``; ``budget_source``:
            where the budget came from, in a command without ``--max-num-batched-tokens`` (then
            only ``--max-num-seqs`` is named); ``seqs_flag`` False: a command without
            ``--max-num-seqs`` (then only ``--max-num-batched-tokens`` is named).
    """
    if max_num_batched_tokens >= max_num_seqs:
        return
    if not seqs_flag:
        raise ConfigError(f"--max-num-batched-tokens {max_num_batched_tokens} must be >= vLLM's max_num_seqs "
                          f"({max_num_seqs}, the replay's): raise it")
    if budget_source is None:
        raise ConfigError(f"--max-num-batched-tokens {max_num_batched_tokens} must be >= --max-num-seqs "
                          f"({max_num_seqs}): raise it or lower --max-num-seqs")
    raise ConfigError(f"--max-num-seqs {max_num_seqs} must be <= vLLM's max_num_batched_tokens "
                      f"({max_num_batched_tokens}, {budget_source}): give --max-num-seqs {max_num_batched_tokens} "
                      "or less")


def check_pool(config: ReplayConfig, requests: Sequence[Any], working_set: int | None) -> list[str]:
    """What the host checks of ``config`` and its ``requests`` (the ones it replays) before any worker;
    ``working_set``: what a ``--capacity``/``--cpu-tier`` fraction is of (None where neither is one).
    A ``--cpu-tier`` fraction whose tier holds no chunk of vLLM's tier is refused
    (:func:`~marconi.integrations.vllm.replay.tiers.check_tier_size`; a size was refused with the
    options). The pool is checked against vLLM's least pool for the longest request
    (:mod:`~marconi.integrations.vllm.replay.pool_floor`): a ``--blocks`` under it is refused; a
    ``--capacity`` under it the worker raises to it, so its note is returned. So is a note when no
    input is longer than vLLM's block for the model (vLLM caches whole blocks: no hit is possible),
    and one for requests a server of the model's config would refuse (longer than its positions, or
    with token ids outside its vocabulary) or serve otherwise (without output: with one token).
    A ``--gpu-memory``, and a model directory (whose block only vLLM knows), pass unchecked.

    Raises:
        ConfigError: naming ``--cpu-tier``, or ``--blocks`` under the least pool (with the least and
            ``--max-input-len``).
    """
    from marconi.integrations.vllm.replay.tiers import check_tier_size

    if config.cpu_tier is not None and parse_capacity(config.cpu_tier).fraction is not None:
        check_tier_size(config.cpu_tier, config.model, working_set)
    max_model_len = replay_max_model_len(requests)
    if config.num_blocks is not None:
        check_pool_blocks(config.num_blocks, minimum_pool(config.model, max_model_len), shorter="--max-input-len")
    notes = []
    block = VLLM_BLOCK_SIZES.get(config.model)
    longest = max((len(r.input_tokens) for r in requests), default=0)
    if block is not None and longest <= block:
        notes.append(f"no input of the {len(requests):,} replayed is longer than vLLM's block for {config.model} "
                     f"({block:,} tokens; the longest has {longest:,}): vLLM caches whole blocks, so no request "
                     "can hit; replay longer requests (--trace, --max-input-len, --num-requests)")
    if config.capacity is not None:
        note = capacity_floor_note(config.capacity, parse_capacity(config.capacity).resolve(working_set or 0),
                                   config.model, max_model_len)
        notes += [note] if note is not None else []
    return notes + _model_limit_notes(config.model, requests)


def _model_limit_notes(model: str, requests: Sequence[Any]) -> list[str]:
    """Notes for requests a server of ``model``'s config would refuse and the replay serves: longer
    than its ``max_position_embeddings`` (the replay runs vLLM with ``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1``,
    since hits and memory do not depend on positions), or with token ids outside its ``vocab_size``;
    and for requests without output tokens, which vLLM serves with one."""
    hf = json.loads((model_dir(model) / "config.json").read_text())
    notes = []
    positions = hf.get("max_position_embeddings")
    if isinstance(positions, int) and positions > 0:
        longer = sum(len(r.input_tokens) + max(1, len(r.output_tokens)) > positions for r in requests)
        if longer:
            notes.append(f"{longer:,} of the {len(requests):,} requests replayed are longer than {model}'s "
                         f"{positions:,} positions (max_position_embeddings, prompt and output): the replay serves "
                         "them as vLLM does with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, and a server without it refuses "
                         f"them (--max-input-len {positions:,} and shorter outputs leave them out)")
    silent = sum(len(r.output_tokens) == 0 for r in requests)
    if silent:
        notes.append(f"{silent:,} of the {len(requests):,} requests replayed have no output tokens: vLLM generates "
                     "at least one (max_tokens >= 1), so each is replayed with one, counted in the throughput")
    vocab = hf.get("vocab_size")
    if isinstance(vocab, int) and vocab > 0 and requests:
        top = max(int(max(r.input_tokens.max(initial=0), r.output_tokens.max(initial=0))) for r in requests)
        if top >= vocab:
            notes.append(f"token ids up to {top:,} are outside {model}'s vocabulary of {vocab:,} (vocab_size): a "
                         "server refuses such prompts; the replay's hits do not read the ids")
    return notes


def _check_gpu_memory(config: ReplayConfig) -> None:
    """``--gpu-memory`` is a size that holds the weights and the activation reserve, checked on the host
    before any worker starts (:func:`~marconi.integrations.vllm.replay.gpu_memory.available_kv_bytes`,
    the worker's own arithmetic) for a bundled model, whose parameter count is known here; for
    another the worker counts them, and :func:`marconi.integrations.vllm.commands.setting_error`
    names the flag when it refuses."""
    assert config.gpu_memory is not None
    memory = parse_gpu_memory(config.gpu_memory)
    num_params = BUNDLED_NUM_PARAMS.get(config.model)
    if num_params is not None:
        available_kv_bytes(memory, num_params, config.weight_bytes or 2, tensor_parallel=config.tensor_parallel)


def _check_tier(config: ReplayConfig) -> None:
    """The tier options agree: a size with policies, known names, a positive link. A size holds one
    chunk of vLLM's tier for the model (:func:`~marconi.integrations.vllm.replay.tiers.check_tier_size`):
    a size here, when the options are checked; a fraction of the working set once the trace is read,
    still before vLLM is probed (:func:`run_replay`, :func:`~marconi.integrations.vllm.replay.sweep.run_sweep`)."""
    from marconi.integrations.vllm.replay.tiers import check_tier_arm, check_tier_size, tier_capacity

    if config.cpu_tier is None:
        if config.tier_policies or config.host_bandwidth is not None:
            raise ConfigError("--tier-policies and --host-bandwidth need a CPU tier: give --cpu-tier (256GB or 0.5x)")
        return
    try:
        tier_capacity(config.cpu_tier)
    except ConfigError as exc:
        raise ConfigError(f"--cpu-tier: {exc}") from None
    check_tier_size(config.cpu_tier, config.model)
    if not config.tier_policies:
        raise ConfigError("--cpu-tier needs --tier-policies (e.g. lru,arc,marconi)")
    for name in config.tier_policies:
        check_tier_arm(name)
    if config.host_bandwidth is not None and not config.host_bandwidth > 0:
        raise ConfigError(f"--host-bandwidth must be > 0 bytes/s, got {config.host_bandwidth}")


def policy_env(label: str, alpha: float | str, budget: int | None = None) -> dict[str, str]:
    """The plugin's environment for one arm; ``budget``: with sparse-dp retention (then ``lru`` is
    the plugin observing vLLM's eviction, the placement its only change)."""
    policy, a = policy_arm(label, alpha)
    if policy == "lru" and budget is None:  # stock vLLM: the plugin does nothing (no forward pass: no CPU fix either)
        return {"MARCONI_VLLM_POLICY": "", "MARCONI_VLLM_MAMBA2_CPU_FIX": "off", "MARCONI_VLLM_RETENTION": "",
                "MARCONI_VLLM_RETENTION_BUDGET": ""}
    sparse = {} if budget is None else {"retention": SPARSE_DP, "retention_budget": budget}
    env = (PluginConfig(policy="lru", **sparse) if policy == "lru" else
           PluginConfig(policy="marconi", alpha=a, **sparse)).to_env()   # type: ignore[arg-type]
    env["MARCONI_VLLM_MAMBA2_CPU_FIX"] = "off"
    env.setdefault("MARCONI_VLLM_RETENTION", "")
    env.setdefault("MARCONI_VLLM_RETENTION_BUDGET", "")
    return env


def _pool_args(config: ReplayConfig, working_set: int | None) -> tuple[list[str], dict[str, Any]]:
    if config.num_blocks is not None:
        return ["--blocks", str(config.num_blocks)], {"pool": f"{config.num_blocks} blocks"}
    if config.gpu_memory is not None:
        args = ["--gpu-memory-bytes", str(parse_gpu_memory(config.gpu_memory))]
        if config.weight_bytes is not None:
            args += ["--weight-bytes", str(config.weight_bytes)]
        return args, {"gpu_memory": config.gpu_memory, "weight_bytes": config.weight_bytes}
    assert config.capacity is not None
    cap = parse_capacity(config.capacity)
    ws = working_set if cap.fraction is not None else None
    kv = cap.resolve(ws or 0)
    return ["--kv-bytes", str(kv)], {"capacity": config.capacity, "capacity_bytes": kv, "working_set_bytes": ws}


def _run_worker(config: ReplayConfig, mdir: Path, requests_path: Path, out_path: Path, label: str,
                pool_args: list[str], on_progress: Callable[[int, int], None],
                tier_args: Sequence[str] = ()) -> dict[str, Any]:
    limit = config.load_args()
    cmd = [config.vllm_python, "-m", "marconi.integrations.vllm.replay.worker", str(requests_path), str(out_path),
           "--model", str(mdir), *pool_args, "--gpu", config.gpu,
           "--tensor-parallel", str(config.tensor_parallel), *limit, "--progress",
           "--max-model-len", str(replay_max_model_len(_REQUESTS[requests_path])),
           "--max-num-batched-tokens", str(config.max_num_batched_tokens),
           "--max-num-seqs", str(config.max_num_seqs), "--seed", str(config.seed),
           "--retention-interval", str(config.retention_interval).lower(), *tier_args]
    env = {**os.environ, **policy_env(label, config.alpha, config.sparse_budget), "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "OMP_NUM_THREADS": "1",
           # no forward pass, so no position runs past the model's table: a trace longer than
           # max_position_embeddings (Nemotron-H-8B-Base-8K) is a scheduling question only
           "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
           # the worker's own temp files (gloo's file store, torch's caches) go with the work folder
           "TMPDIR": str(out_path.parent.resolve())}
    log_path = out_path.with_suffix(".log")
    # The worker dies with this process: on SIGTERM, Ctrl-C or an error here it is stopped, and a
    # kill -9 of this process kills it too (issue 31, bug 11; marconi.pool.child_process).
    with log_path.open("w") as log, child_process(cmd, env=env, stdout=subprocess.PIPE, stderr=log, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("progress "):
                done, total = map(int, line.split()[1:3])
                on_progress(done, total)
        rc = proc.wait()
    if rc != 0 or not out_path.is_file():     # exit 0 without a result is a failure too (issue 31, bug 10)
        tail = log_path.read_text(errors="replace")[-3000:]
        what = f"exit {rc}" if rc != 0 else "exit 0 without writing its result"
        raise RuntimeError(f"replay worker for {label!r} failed ({what}); log {log_path} (kept only with --work-dir "
                           f"or {KEEP_SCRATCH_ENV}=1):\n{tail}")
    return json.loads(out_path.read_text())


_REQUESTS: dict[Path, Sequence[Any]] = {}


def emulation_engine(spec: ModelSpec, result: dict[str, Any], label: str, config: ReplayConfig) -> Any:
    """A ``vllm-align`` engine on the pool vLLM built for the run (``result``, the worker's answer:
    its ``kv_cache`` block count, block size and groups in vLLM's order) under ``label``'s GPU
    policy: the replay's emulation runs on it."""
    from marconi.integrations.vllm.emulate.engine import VllmAlignEngine
    from marconi.integrations.vllm.layout import layout_for_spec

    kv = result["kv_cache"]
    # vLLM's own Mamba spec says whether the backend exports prefill checkpoints (MambaMixer2 does).
    checkpoint = next((g["fields"].get("prefill_checkpoint_alignment") for g in kv["groups"]
                       if g["spec"] == "MambaSpec" and g["fields"].get("num_prefill_checkpoint_blocks")), None)
    layout = layout_for_spec(spec, num_blocks=kv["num_blocks"], block_size=kv["block_size"],
                             max_num_batched_tokens=config.max_num_batched_tokens,
                             prefill_checkpoint_alignment=checkpoint, retention_interval=config.retention_interval)
    # The groups in vLLM's own order: the order its pool frees blocks in and its tier lists keys
    # in (Falcon-H1's attention layers register first, so its attention group is group 0 there).
    kinds = tuple(MAMBA if g["spec"] == "MambaSpec" else ATTENTION for g in kv["groups"])
    if kinds != layout.group_kinds and sorted(kinds) == sorted(layout.group_kinds):
        layout = replace(layout, group_kinds=kinds)
    eviction, alpha = policy_arm(label, config.alpha)
    return VllmAlignEngine(layout, spec, eviction=eviction, alpha=DEFAULT_ALPHA if alpha is None else alpha,
                           retention_budget=config.sparse_budget)


def _serve(engine: Any, requests: Sequence[Any], config: ReplayConfig,
           step_s: Callable[[list[tuple[int, int]]], float]) -> Any:
    """The emulation's loop under the run's load: the worker's own admitter (``replay.worker``: the
    same sessions, concurrency or arrival times, and seed) on the virtual clock ``step_s`` (the
    worker's step-time model). A closed-loop admitter never waits on the clock, so a closed loop
    serves as ``emulate_closed_loop`` does (``tests/test_vllm_tier_emulation.py``)."""
    from marconi.integrations.vllm.arrivals import make_admitter
    from marconi.integrations.vllm.emulate.scheduler import emulate_admitted

    admitter = make_admitter([r.session_id for r in requests], config.arrivals, concurrency=config.concurrency,
                             rate=config.rate, ts=[float(r.ts) for r in requests],
                             time_scale=config.time_scale or 1.0, seed=config.seed)
    return emulate_admitted(engine, requests, admitter, step_s, max_num_seqs=config.max_num_seqs)


def _step_time(spec: ModelSpec, result: dict[str, Any], config: ReplayConfig) -> Any:
    """The worker's step-time model (``replay.steptime``) for the run's model, GPU and weights."""
    from marconi.integrations.vllm.replay.steptime import StepTimeModel

    return StepTimeModel.named(spec, config.gpu, int(result["num_params"]) * (config.weight_bytes or 2),
                               num_gpus=config.tensor_parallel)


def _emulated_hit_rate(spec: ModelSpec, requests: Sequence[Any], result: dict[str, Any], label: str,
                       config: ReplayConfig) -> tuple[float, float]:
    """The emulation's token hit rate, and its Mamba states cached per request (per Mamba group):
    vLLM's scheduler loop under the run's load (the closed loop, or the worker's open-loop arrivals
    on the same virtual clock)."""
    engine = emulation_engine(spec, result, label, config)
    rate = _serve(engine, requests, config, _step_time(spec, result, config).step_s).token_hit_rate
    states = engine.pool.stats.blocks_cached.get(MAMBA, 0) / max(1, len(engine.mamba_ids)) / max(1, len(requests))
    return rate, states


def _emulated_tier(spec: ModelSpec, requests: Sequence[Any], result: dict[str, Any], label: str,
                   config: ReplayConfig, tier_policy: str, host_bandwidth: float) -> dict[str, Any]:
    """The emulation with vLLM's CPU tier (:class:`~marconi.integrations.vllm.emulate.tier.EmulatedTier`)
    on the run's pool, tier size (chunks, as vLLM sized it) and load (the closed loop, or the
    worker's open-loop arrivals on the same virtual clock): its token, GPU and tier hit rates,
    per-request hit tokens by tier, and the tier's counters."""
    from marconi.integrations.vllm.emulate.tier import EmulatedTier
    from marconi.integrations.vllm.tier_settings import DEFAULT_RULE, ENV_RULE, switches_from_env

    engine = emulation_engine(spec, result, label, config)
    # the replay's clock: its step-time model and host link, so loads span the steps they span there
    timing = _step_time(spec, result, config)
    # the rule vLLM's tier policy runs: MARCONI_TIER_RULE reaches it through the replay's environment
    # (and MARCONI_TIER_COLD_INSERT and MARCONI_TIER_SECOND_CHANCE, read as the policy reads them)
    rule = os.environ.get(ENV_RULE) or DEFAULT_RULE
    switches = switches_from_env()
    tier = EmulatedTier(engine.layout, int(result["tier"]["tier_num_chunks"]), tier_policy, spec, rule=rule,
                        **switches,
                        host_gbps=host_bandwidth / 1e9, step_time=timing.step_s,
                        host_bandwidth=host_bandwidth * config.tensor_parallel)
    engine.attach_tier(tier)
    loop = _serve(engine, requests, config, timing.step_s)
    return {"token_hit_rate": loop.token_hit_rate, "gpu_hit_rate": loop.gpu_hit_rate,
            "tier_hit_rate": loop.tier_hit_rate, **tier.counters(), "num_preemptions": sum(loop.num_preemptions),
            "num_steps": loop.num_steps,
            "per_request": {"gpu_hit_tokens": [r.hit_len for r in loop.records],
                            "tier_hit_tokens": list(loop.tier_hits or ())}}


def _record(config: ReplayConfig, label: str, trace_info: dict[str, Any], pool_info: dict[str, Any],
            requests: Sequence[Any], res: dict[str, Any], sim: tuple[float, float] | None) -> dict[str, Any]:
    policy, alpha = policy_arm(label, config.alpha)
    ttft = [f - a for f, a in zip(res["first_token_s"], res["arrival_s"])]
    tpot = [(fin - first) / (len(r.output_tokens) - 1) if len(r.output_tokens) > 1 else None
            for r, fin, first in zip(requests, res["finish_s"], res["first_token_s"])]
    out_tokens = sum(max(1, len(r.output_tokens)) for r in requests)
    kv = res["kv_cache"]
    return {
        "engine": "vllm-replay", "vllm_version": res["vllm_version"], "model": config.model, "gpu": config.gpu,
        "tensor_parallel": config.tensor_parallel,
        "num_blocks": kv["num_blocks"], "block_size": kv["block_size"], "pool_bytes": kv["pool_bytes"],
        "kv_cache_groups": [g["spec"] for g in kv["groups"]], **pool_info,
        "concurrency": config.concurrency, "rate": config.rate, "arrivals": config.arrivals,
        "time_scale": config.time_scale, "policy": policy, "arm": label, "alpha": alpha,
        **trace_info, "num_requests": len(requests), "prompt_tokens": int(sum(r.input_len for r in requests)),
        "token_hit_rate": res["prefix_cache_hits"] / res["prefix_cache_queries"] if res["prefix_cache_queries"] else 0.0,
        "request_hit_rate": sum(res["num_cached_tokens"]) / max(1, sum(r.input_len for r in requests)),
        "sim_token_hit_rate": None if sim is None else sim[0], "sim_states_per_request": None if sim is None else sim[1],
        "sim_models_concurrency": True,
        "ttft_p50_s": percentile(ttft, 50), "ttft_p95_s": percentile(ttft, 95), "ttft_p99_s": percentile(ttft, 99),
        "tpot_mean_s": mean_or_none(tpot), "throughput_tok_s": out_tokens / res["virtual_s"] if res["virtual_s"] else None,
        "num_preemptions": int(sum(res["num_preemptions"])), "sched_s_per_step": res["sched_s_per_step"],
        "num_steps": res["num_steps"], "virtual_s": res["virtual_s"], "scheduler": res["scheduler"],
        "plugin_evictions": res["plugin_evictions"],
        "retention": config.retention, "retention_interval": config.retention_interval,
        "retention_budget": config.sparse_budget, "plugin_retention": res.get("plugin_retention"),
        # Mamba states cached per request (state hashes the plugin saw inserted, per Mamba group:
        # a shared state once, a re-cached one again); None for stock vLLM (no plugin loaded)
        "states_per_request": _states_per_request(res, len(requests)),
        "kv_bytes": res["kv_bytes"], "kv_floor_applied": res["kv_floor_applied"], "num_params": res["num_params"], "wall_s": res["wall_s"],
        "per_request": {"ttft_s": ttft, "num_cached_tokens": res["num_cached_tokens"]},
    }


def _states_per_request(res: dict[str, Any], num_requests: int) -> float | None:
    cached = res.get("plugin_cached")
    groups = sum(g["spec"] == "MambaSpec" for g in res["kv_cache"]["groups"])
    if cached is None or not groups or not num_requests:
        return None
    return cached.get("mamba", 0) / groups / num_requests


def run_replay(config: ReplayConfig, *, work_dir: str | Path | None = None, emulate: bool = True,
               progress: Callable[[str], None] | None = None, show_bars: bool = True,
               selection_notice: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """One record per policy (see the module docstring). ``progress``: told each policy's start, and
    (a ``NOTE:`` line) of a ``--capacity`` the worker will raise to vLLM's least pool;
    ``show_bars``: a per-policy progress bar on stderr, drawn on a terminal only (off in sweeps, which
    show one per point);
    ``selection_notice``: told of requests the input cap left out and of a stand-in for absent data
    (:func:`select_replay_requests`; None: a ``NOTE:`` line on stderr; a sweep tells them once).

    The trace is read first and the working set a fraction (``--capacity 0.05x``, ``--cpu-tier
    0.5x``) is of is measured, so a ``--cpu-tier`` fraction under one chunk of vLLM's tier is
    refused before anything else (ConfigError naming ``--cpu-tier``), and so is a ``--blocks``
    under vLLM's least pool for the longest request (:func:`check_pool`, ConfigError naming
    ``--blocks``); then ``config.vllm_python`` is probed (ConfigError naming ``--vllm-python``).
    ``work_dir`` (requests, worker logs, results) is kept; without one a temporary folder is used
    and removed when the run ends, however it ends, unless ``MARCONI_KEEP_SCRATCH=1``.
    """
    sel = select_replay_requests(config, notice=selection_notice)
    working_set = replay_working_set(config, sel.requests) if needs_working_set(config) else None
    for note in check_pool(config, sel.requests, working_set):
        if progress is not None:
            progress(f"NOTE: {note}")
    probe_python(config.vllm_python, "vllm", option="--vllm-python", make_target="make vllm-env")
    with scratch_dir("marconi-replay-", work_dir) as work:
        try:
            return _replay_in(config, work, sel, working_set, emulate=emulate, progress=progress, show_bars=show_bars)
        finally:
            _REQUESTS.pop(work / "requests.json", None)


def select_replay_requests(config: ReplayConfig, *, notice: Callable[[str], None] | None = None) -> common.Selection:
    """The requests ``config`` replays: the first ``num_requests`` of its trace under ``max_input_len``,
    outputs cut to ``max_output_len`` (:func:`marconi.integrations.common.bench.select_requests`, which
    tells ``notice`` of requests the cap left out; None: a ``NOTE:`` line on stderr)."""
    return common.select_requests(config.trace, max_input_len=config.max_input_len, num_requests=config.num_requests,
                                  max_output_len=config.max_output_len, notice=notice)


def replay_working_set(config: ReplayConfig, requests: Sequence[Any] | None = None) -> int:
    """The working set (bytes) that ``config``'s fractions (``--capacity 0.05x``, ``--cpu-tier 0.5x``)
    are of: :func:`marconi.sim.working_set_bytes` of its requests (``requests``, else
    :func:`select_replay_requests`) on its model."""
    from marconi.sim import working_set_bytes

    if requests is None:
        requests = select_replay_requests(config).requests
    spec = ModelSpec.from_hf_config(model_dir(config.model) / "config.json", name=config.model)
    return int(working_set_bytes(requests, spec))


def needs_working_set(config: ReplayConfig) -> bool:
    """Whether ``--capacity`` or ``--cpu-tier`` is a fraction of the working set."""
    return any(text is not None and parse_capacity(text).fraction is not None
               for text in (config.capacity, config.cpu_tier))


def _replay_in(config: ReplayConfig, work: Path, sel: common.Selection, working_set: int | None, *, emulate: bool,
               progress: Callable[[str], None] | None, show_bars: bool) -> list[dict[str, Any]]:
    """:func:`run_replay`'s records, its files in the working folder ``work``: the requests of ``sel``,
    fractions of ``working_set`` (None: no option is a fraction)."""
    from tqdm import tqdm

    mdir = model_dir(config.model)
    spec = ModelSpec.from_hf_config(mdir / "config.json", name=config.model)
    requests = sel.requests
    req_path = work / "requests.json"
    req_path.write_text(json.dumps({"requests": [{"session": r.session_id, "prompt": r.input_tokens.tolist(),
                                                   "output": r.output_tokens.tolist(), "ts": float(r.ts)}
                                                  for r in requests]}))
    _REQUESTS[req_path] = requests
    pool_args, pool_info = _pool_args(config, working_set)
    tier_info = _tier_info(config, working_set)
    records = []
    for label in config.policies:
        for tier_policy in config.tier_arms:
            name = label if tier_policy is None else f"{label}+{tier_policy}"
            if progress is not None:
                progress(f"[{name}] vLLM replay of {len(requests)} requests on {config.model}")
            with tqdm(total=len(requests), desc=name, unit="req", leave=False,
                      disable=(not show_bars) or None) as bar:      # None: drawn on a terminal only
                def tick(done: int, total: int) -> None:
                    bar.update(done - bar.n)
                res = _run_worker(config, mdir, req_path, work / f"out-{common.file_label(name)}.json", label,
                                  pool_args, tick, _tier_args(config, tier_policy, tier_info))
            if tier_policy is None:
                sim = _emulated_hit_rate(spec, requests, res, label, config) if emulate else None
                records.append(_record(config, label, sel.trace_info, pool_info, requests, res, sim))
            else:
                sim = None
                if emulate and tier_policy == NO_TIER:        # no tier: the single-pool emulation
                    rate = _emulated_hit_rate(spec, requests, res, label, config)[0]
                    sim = {"token_hit_rate": rate, "gpu_hit_rate": rate, "tier_hit_rate": 0.0}
                elif emulate and res.get("tier"):
                    # the same pool and the tier as vLLM sized it, under the same load and clock
                    sim = _emulated_tier(spec, requests, res, label, config, tier_policy,
                                         float(tier_info["host_bandwidth_bytes_s"]))
                records.append(_tier_record(_record(config, label, sel.trace_info, pool_info, requests, res, None),
                                            tier_policy, tier_info, res, sim))
    return records


def _tier_info(config: ReplayConfig, working_set: int | None) -> dict[str, Any]:
    """The tier as asked and resolved: ``cpu_tier`` (the option), ``cpu_tier_bytes`` (a fraction of
    ``working_set``), the link."""
    from marconi.integrations.vllm.replay.tiers import DEFAULT_HOST_BANDWIDTH

    if config.cpu_tier is None:
        return {}
    return {"cpu_tier": config.cpu_tier, "cpu_tier_bytes": parse_capacity(config.cpu_tier).resolve(working_set or 0),
            "host_bandwidth_bytes_s": config.host_bandwidth or DEFAULT_HOST_BANDWIDTH}


def _tier_args(config: ReplayConfig, tier_policy: str | None, tier_info: dict[str, Any]) -> list[str]:
    """The worker's tier options (none for a GPU-only arm)."""
    if tier_policy is None or tier_policy == NO_TIER:
        return []
    return ["--cpu-tier-bytes", str(tier_info["cpu_tier_bytes"]), "--tier-policy", tier_policy,
            "--host-bandwidth", str(tier_info["host_bandwidth_bytes_s"])]


def _tier_record(rec: dict[str, Any], tier_policy: str, tier_info: dict[str, Any], res: dict[str, Any],
                 sim: dict[str, Any] | None) -> dict[str, Any]:
    """A GPU-policy record extended by the tier's fields (docs/vllm-tiers.md). Both hit counters are
    vLLM's, first admissions only, so ``gpu_hit_tokens + tier_hit_tokens + recomputed_tokens =
    prompt_tokens``."""
    tier = res.get("tier") or {}
    gpu_hits = int(res["prefix_cache_hits"])
    tier_hits = int(tier.get("connector_hits", 0))
    queries = int(res["prefix_cache_queries"])
    evictions = tier.get("tier_evictions") or {"kv": 0, "state": 0}
    out = {**rec, "arm": f"{rec['arm']}+{tier_policy}", "tier_policy": tier_policy,
           "cpu_tier": tier_info["cpu_tier"], "cpu_tier_bytes": tier_info["cpu_tier_bytes"] if tier else 0,
           "host_bandwidth_bytes_s": tier_info["host_bandwidth_bytes_s"],
           "token_hit_rate": (gpu_hits + tier_hits) / queries if queries else 0.0,
           "gpu_hit_tokens": gpu_hits, "tier_hit_tokens": tier_hits,
           "recomputed_tokens": queries - gpu_hits - tier_hits,
           "gpu_hit_rate": gpu_hits / queries if queries else 0.0,
           "tier_hit_rate": tier_hits / queries if queries else 0.0,
           "bytes_loaded": int(tier.get("bytes_loaded", 0)), "bytes_stored": int(tier.get("bytes_stored", 0)),
           "num_loads": int(tier.get("num_loads", 0)), "num_stores": int(tier.get("num_stores", 0)),
           "tier_evictions_kv": int(evictions["kv"]), "tier_evictions_state": int(evictions["state"]),
           "tier_num_chunks": tier.get("tier_num_chunks", 0),
           "load_wait_mean_s": tier.get("load_wait_mean_s"), "load_wait_max_s": tier.get("load_wait_max_s"),
           "sim_token_hit_rate": None if sim is None else sim["token_hit_rate"],
           "sim_gpu_hit_rate": None if sim is None else sim["gpu_hit_rate"],
           "sim_tier_hit_rate": None if sim is None else sim["tier_hit_rate"]}
    out["per_request"] = {**rec["per_request"], "gpu_hit_tokens": res["num_local_cached_tokens"],
                          "tier_hit_tokens": res["num_external_cached_tokens"]}
    if sim is not None and "per_request" in sim:      # the emulation's split, per request and in total
        out["per_request"]["sim_gpu_hit_tokens"] = sim["per_request"]["gpu_hit_tokens"]
        out["per_request"]["sim_tier_hit_tokens"] = sim["per_request"]["tier_hit_tokens"]
        per = out["per_request"]
        # requests whose GPU/tier split the emulation did not reproduce (0: exact, request for request)
        out["sim_requests_differing"] = sum(
            (g, t) != (sg, st) for g, t, sg, st in zip(per["gpu_hit_tokens"], per["tier_hit_tokens"],
                                                       per["sim_gpu_hit_tokens"], per["sim_tier_hit_tokens"]))
        out["sim_tier"] = {k: sim[k] for k in ("bytes_loaded", "bytes_stored", "num_loads", "num_stores",
                                                "tier_evictions_kv", "tier_evictions_state", "tier_num_chunks")}
    return out


def load_label(rec: dict[str, Any]) -> str:
    """A record's load, short: ``C=8``, ``2.0/s`` (Poisson), ``trace×0.5`` (trace timestamps times 0.5).
    Records from before ``arrivals`` existed are closed-loop or Poisson by which field is set."""
    arrivals = rec.get("arrivals") or ("closed-loop" if rec.get("concurrency") is not None else "poisson")
    if arrivals == "closed-loop":
        return f"C={rec['concurrency']}"
    if arrivals == "poisson":
        return f"{rec['rate']}/s"
    return f"trace×{rec.get('time_scale', 1.0):g}"


def replay_table(records: Sequence[dict[str, Any]]) -> str:
    from marconi.report import fmt_pct, fmt_seconds, format_table

    rows = []
    for rec in records:
        row = dict(rec)
        row["_ms"] = f"{1e6 * rec['sched_s_per_step']:.0f} µs"
        row["_tput"] = f"{rec['throughput_tok_s']:.0f}" if rec["throughput_tok_s"] else "-"
        row["_load"] = load_label(rec)
        row["_pool"] = _pool_label(rec).split("\n")[0]
        budget = rec.get("retention_budget")
        row["_ret"] = f"sparse-dp({budget})" if budget is not None else str(rec.get("retention_interval", 0)).lower()
        states = rec.get("sim_states_per_request")
        row["_states"] = f"{states:.2f}" if states is not None else "-"
        rows.append(row)
    return format_table(rows, [
        ("policy", "arm", None), ("load", "_load", None), ("pool", "_pool", None), ("blocks", "num_blocks", None),
        ("block", "block_size", None), ("retention", "_ret", None), ("states/req", "_states", None),
        ("vLLM token hit", "token_hit_rate", fmt_pct),
        ("emulated", "sim_token_hit_rate", fmt_pct), ("TTFT P50", "ttft_p50_s", fmt_seconds),
        ("TTFT P95", "ttft_p95_s", fmt_seconds), ("TTFT P99", "ttft_p99_s", fmt_seconds),
        ("TPOT mean", "tpot_mean_s", fmt_seconds), ("tok/s", "_tput", None),
        ("preempt", "num_preemptions", None), ("schedule()/step", "_ms", None)])


def plot_ttft_cdf(records: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """One CDF of per-request virtual TTFT per policy (PNG, written atomically)."""
    from marconi.report import plot_ttft_cdf as plot

    first = records[0]
    return plot(records, path, clock=f"virtual clock, {first['gpu']}",
                title=f"vLLM replay: {first['model']}, {first['num_blocks']} blocks, {load_label(first)}")


def _pool_label(rec: dict[str, Any]) -> str:
    """A record's pool as asked (``0.05x``, ``80GB`` GPU, ``N blocks``), then the blocks it gave."""
    if rec.get("capacity"):
        asked = str(rec["capacity"])
    elif rec.get("gpu_memory"):
        tp = rec.get("tensor_parallel") or 1
        asked = f"{rec['gpu_memory']} GPU" + (f" x{tp}" if tp > 1 else "")
    else:
        asked = str(rec.get("pool") or f"{rec['num_blocks']} blocks")
    return f"{asked}\n{rec['num_blocks']} blocks"


def plot_sweep(records: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """A sweep at a glance (PNG, written atomically): vLLM's token hit rate and TTFT P95 against
    the pool size, one panel per load, one line per policy."""
    from marconi.report import pyplot, save_figure

    loads = list(dict.fromkeys(load_label(r) for r in records))
    pools = list(dict.fromkeys(_pool_label(r) for r in records))
    arms = list(dict.fromkeys(r["arm"] for r in records))
    fig, axes = pyplot().subplots(2, len(loads), figsize=(3.6 * len(loads) + 1, 6), squeeze=False, sharex=True)
    for col, load in enumerate(loads):
        for arm in arms:
            by_pool = {_pool_label(r): r for r in records if r["arm"] == arm and load_label(r) == load}
            xs = [i for i, p in enumerate(pools) if p in by_pool]
            axes[0][col].plot(xs, [100 * by_pool[pools[i]]["token_hit_rate"] for i in xs], marker="o", label=arm)
            axes[1][col].plot(xs, [1000 * by_pool[pools[i]]["ttft_p95_s"] for i in xs], marker="o", label=arm)
        axes[0][col].set_title(load)
        axes[1][col].set_xticks(range(len(pools)), pools, fontsize=7)
        for ax in (axes[0][col], axes[1][col]):
            ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("vLLM token hit rate (%)")
    axes[1][0].set_ylabel(f"TTFT P95 (ms, virtual, {records[0]['gpu']})")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(f"vLLM replay sweep: {records[0]['model']} on {records[0]['trace']}")
    fig.tight_layout()
    return save_figure(fig, path, dpi=120)


def is_tier_record(rec: dict[str, Any]) -> bool:
    """A record of a two-tier replay (it carries ``tier_policy``)."""
    return rec.get("tier_policy") is not None


def tier_table(records: Sequence[dict[str, Any]]) -> str:
    """The two-tier records side by side: where hits came from, what crossed the host link, latency."""
    from marconi.report import fmt_pct, fmt_seconds, format_table
    from marconi.units import format_bytes

    rows = []
    for rec in records:
        row = dict(rec)
        row["_load"] = load_label(rec)
        row["_pool"] = _pool_label(rec).split("\n")[0] + f" ({rec['num_blocks']} blk)"
        row["_tier"] = (f"{rec['cpu_tier']} = {format_bytes(rec['cpu_tier_bytes'])}" if rec["cpu_tier_bytes"]
                        else "-")
        row["_moved"] = f"{format_bytes(rec['bytes_loaded'])} / {format_bytes(rec['bytes_stored'])}"
        row["_evicted"] = f"{rec['tier_evictions_kv']} / {rec['tier_evictions_state']}"
        row["_tput"] = f"{rec['throughput_tok_s']:.0f}" if rec["throughput_tok_s"] else "-"
        if rec.get("sim_requests_differing") is not None:
            row["_differ"] = f"{rec['sim_requests_differing']}/{rec['num_requests']}"
        rows.append(row)
    return format_table(rows, [
        ("GPU policy", "arm", lambda a: str(a).split("+")[0]), ("tier policy", "tier_policy", None),
        ("load", "_load", None), ("GPU pool", "_pool", None), ("CPU tier", "_tier", None),
        ("token hit", "token_hit_rate", fmt_pct), ("GPU hit", "gpu_hit_rate", fmt_pct),
        ("tier hit", "tier_hit_rate", fmt_pct), ("emulated", "sim_token_hit_rate", fmt_pct),
        ("requests differing", "_differ", None), ("loaded / stored", "_moved", None), ("tier evicted KV / state", "_evicted", None),
        ("TTFT P50", "ttft_p50_s", fmt_seconds), ("TTFT P95", "ttft_p95_s", fmt_seconds),
        ("TTFT P99", "ttft_p99_s", fmt_seconds), ("tok/s", "_tput", None)])


def plot_tiers(records: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Two-tier records at a glance (PNG, written atomically): per point (pool × load), one bar
    per policy pair, split into GPU-pool hits and CPU-tier hits, and below it the TTFT P95."""
    from marconi.report import pyplot, save_figure

    points = list(dict.fromkeys((_pool_label(r).split("\n")[0], r.get("cpu_tier"), load_label(r)) for r in records))
    fig, axes = pyplot().subplots(2, len(points), figsize=(max(5.0, 4.2 * len(points)), 6.5), squeeze=False)
    for col, point in enumerate(points):
        recs = [r for r in records if (_pool_label(r).split("\n")[0], r.get("cpu_tier"), load_label(r)) == point]
        xs = np.arange(len(recs))
        gpu = [100 * r["gpu_hit_rate"] for r in recs]
        tier = [100 * r["tier_hit_rate"] for r in recs]
        top, bottom = axes[0][col], axes[1][col]
        top.bar(xs, gpu, color="#4c72b0", label="GPU pool")
        top.bar(xs, tier, bottom=gpu, color="#dd8452", label="CPU tier")
        for x, r in zip(xs, recs):
            if r.get("sim_token_hit_rate") is not None:
                top.plot([x - 0.4, x + 0.4], [100 * r["sim_token_hit_rate"]] * 2, color="k", lw=1)
        bottom.bar(xs, [1000 * r["ttft_p95_s"] for r in recs], color="#55a868")
        for ax in (top, bottom):
            ax.set_xticks(xs, [r["arm"].replace("+", "\n+") for r in recs], fontsize=7)
            ax.grid(alpha=0.3, axis="y")
        top.set_title(f"GPU {point[0]}, CPU {point[1]}, {point[2]}", fontsize=9)
    axes[0][0].set_ylabel("token hit rate (%)")
    axes[1][0].set_ylabel(f"TTFT P95 (ms, virtual, {records[0]['gpu']})")
    emulated = any(r.get("sim_token_hit_rate") is not None for r in records)
    axes[0][0].legend(fontsize=7, title="hits from" + (" (line: emulated)" if emulated else ""), title_fontsize=7)
    fig.suptitle(f"vLLM replay in two tiers: {records[0]['model']} on {str(records[0]['trace']).split(':')[0]}", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path, dpi=120)
