"""``marconi vllm diagnose``: where did my prefix-cache hits go, and what would each lever give?

A hash-id trace (a ``MARCONI_VLLM_RECORD`` recording, a Mooncake file, any trace) is served again
through the ``vllm-align`` emulation on a virtual clock, or with ``--vllm-python`` through vLLM's own
scheduler. The report: fidelity against the recorded ``num_cached_tokens``, each lost token's cause
(:func:`attribute`, :data:`CAUSES`), two ceilings and one run per lever (docs/diagnose.md).
"""

from __future__ import annotations

import argparse
import json
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from marconi.core.model import ModelSpec
from marconi.core.registry import ConfigError
from marconi.integrations.common.bench import percentile
from marconi.integrations.common.probe import python_command
from marconi.integrations.vllm.emulate.engine import VllmAlignEngine
from marconi.integrations.vllm.emulate.scheduler import VllmAlignScheduler
from marconi.integrations.vllm.layout import VllmLayout, cdiv, layout_for_spec, prefix_hashes
from marconi.integrations.vllm.policy import DEFAULT_ALPHA, MAMBA
from marconi.integrations.vllm.replay.gpu_memory import available_kv_bytes, estimated_num_params, parse_gpu_memory
from marconi.integrations.vllm.replay.steptime import StepTimeModel
from marconi.integrations.vllm.replay.configs import VLLM_BLOCK_SIZES
from marconi.units import parse_capacity

__all__ = ["CAUSES", "CAUSE_TEXT", "DEFAULT_MODEL", "DiagnoseConfig", "EmulatedRun", "attribute", "run_emulated",
           "diagnose", "model_for_trace", "summary_table", "lever_table", "next_steps", "write_report",
           "EMULATED_VLLM", "CAUSE_ADVICE", "replay_block_warning"]

CAUSES = ("never_shared", "kv_evicted", "no_state_at_usable_depth", "state_evicted_kv_stayed", "in_flight",
          "preempted", "below_one_block")
CAUSE_TEXT = {
    "never_shared": "never shared (no earlier request had this prefix)",
    "kv_evicted": "shared, but its KV was evicted",
    "no_state_at_usable_depth": "KV resident, but no state at a usable depth (junction/alignment)",
    "state_evicted_kv_stayed": "state evicted while its KV stayed",
    "in_flight": "still being computed by another request",
    "preempted": "computed by a request since preempted (freed, then evicted)",
    "below_one_block": "below one block (tail no boundary covers)",
}
EMULATED_VLLM = "0.32"           # the series vllm-align mirrors
DEFAULT_MODEL = "nemotron-h-8b"  # --model when neither given nor named by a recording's sidecar


def attribute(prompt_len: int, hit: int, kv_hit: int, unit: int, seen_depth: int, computed_depth: int,
              state_depth: int, preempted_depth: int) -> dict[str, int]:
    """One request's lost tokens by cause, at its first admission; the values sum to
    ``prompt_len - hit`` exactly. Depths are token counts: ``kv_hit`` (``K``: attention matched),
    ``seen_depth`` (``S``: longest prefix any earlier sequence contains), ``computed_depth`` (``C``:
    longest prefix some request had computed), ``state_depth`` (``E``: deepest depth ``<= K`` with a
    state cached at some time before the request's lookup, 0 if none), ``preempted_depth`` (``D``: longest prefix of a request waiting
    after a preemption). With ``T = max(hit, ⌊(P-1)/unit⌋·unit)`` and every bound clamped into
    ``[hit, T]`` in that order: ``below_one_block`` ``[T, P)``, ``never_shared`` ``[S, T)``,
    ``in_flight`` ``[C, S)``, ``kv_evicted`` ``[D, C)``, ``preempted`` ``[K, D)``,
    ``no_state_at_usable_depth`` ``[E, K)``, ``state_evicted_kv_stayed`` ``[hit, E)``."""
    P, h = int(prompt_len), int(hit)
    if not 0 <= h <= P:
        raise ValueError(f"hit {h} outside [0, {P}]")
    top = max(h, (P - 1) // unit * unit)

    def clamp(x: int, lo: int, hi: int) -> int:
        return min(max(int(x), lo), hi)

    S = clamp(seen_depth, h, top)
    K = clamp(kv_hit, h, S)
    E = clamp(state_depth, h, K)
    C = clamp(computed_depth, K, S)
    D = clamp(preempted_depth, K, C)
    return {"never_shared": top - S, "kv_evicted": C - D, "no_state_at_usable_depth": K - E,
            "state_evicted_kv_stayed": E - h, "in_flight": S - C, "preempted": D - K, "below_one_block": P - top}


def _depth(chain: Sequence[bytes], members: Any, unit: int) -> int:
    d = 0
    while d < len(chain) and chain[d] in members:
        d += 1
    return d * unit


def _lcp(a: Sequence[bytes], b: Sequence[bytes]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class EmulatedRun:
    """One run of the emulation over a trace: per request (trace order) its hit, attention-only
    hit, preemptions, TTFT (virtual seconds) and, when attributed, its lost tokens by cause."""

    name: str
    hit: np.ndarray
    kv_hit: np.ndarray
    prompt: np.ndarray
    preemptions: np.ndarray
    ttft_s: np.ndarray
    causes: np.ndarray | None = None        # [n, len(CAUSES)]
    num_blocks: int = 0
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def token_hit_rate(self) -> float:
        total = int(self.prompt.sum())
        return float(self.hit.sum()) / total if total else 0.0

    def lost_by_cause(self) -> dict[str, int]:
        assert self.causes is not None
        return {c: int(v) for c, v in zip(CAUSES, self.causes.sum(axis=0))}


def run_emulated(requests: Sequence[Any], spec: ModelSpec, layout: VllmLayout, timing: StepTimeModel, *,
                 name: str = "stock", eviction: str = "lru", alpha: float | str = DEFAULT_ALPHA,
                 retention_budget: int | None = None, max_num_seqs: int = 256, concurrency: int | None = None,
                 attribute_causes: bool = False, progress: Callable[[int], None] | None = None) -> EmulatedRun:
    """Serve ``requests`` through :class:`VllmAlignScheduler` on a virtual clock (arrivals at each
    request's ``ts``, or a closed loop of ``concurrency``); see the module docstring.

    A request's TTFT (virtual seconds) runs from when it reached the server to the end of the step
    that samples its first token: its ``ts`` (relative to the first request's) in the open loop, and
    in the closed loop the step boundary at which a free slot let it in, as ``marconi vllm replay``
    measures it (its worker's ``arrival_s``). Submission waits for the next step boundary; TTFT counts
    that wait."""
    engine = VllmAlignEngine(layout, spec, eviction=eviction, alpha=alpha, retention_budget=retention_budget)
    sched = VllmAlignScheduler(engine, max_num_seqs=max_num_seqs)
    n = len(requests)
    unit = layout.hash_block_size
    t0 = requests[0].ts if n else 0.0
    arrival = [float(r.ts - t0) for r in requests]
    submitted = list(arrival)       # when each request reached the server (closed loop: when a slot freed)
    hit = np.zeros(n, np.int64)
    kv_hit = np.zeros(n, np.int64)
    prompt = np.array([len(r.input_tokens) for r in requests], np.int64)
    ttft = np.full(n, np.nan)
    causes = np.zeros((n, len(CAUSES)), np.int64) if attribute_causes else None
    chains: list[list[bytes]] = []
    seen: set[bytes] = set()
    computed: set[bytes] = set()
    state_ever: dict[bytes, int] = {}     # a state's prefix -> the step that first cached it
    step_no = [0]
    ptr = [0] * n
    if attribute_causes:
        for r in requests:
            out = np.asarray(r.output_tokens, np.int32)
            seq = np.concatenate((np.asarray(r.input_tokens, np.int32), out if out.size else np.zeros(1, np.int32)))
            chains.append(prefix_hashes(seq, unit))
        original = engine.pool.insert_block_hash
        mamba_groups = {g for g, k in enumerate(layout.group_kinds) if k == MAMBA}

        def insert_block_hash(block: Any, prefix: bytes, group_id: int, depth: int, parent: Any) -> None:
            original(block, prefix, group_id, depth, parent)
            if group_id in mamba_groups:
                state_ever.setdefault(prefix, step_no[0])

        engine.pool.insert_block_hash = insert_block_hash  # type: ignore[method-assign]
    index_of: dict[int, int] = {}
    marked = [False] * n
    seen_upto = 0
    clock = 0.0
    next_i = done = 0
    in_flight = 0
    while done < n:
        step_no[0] += 1
        if concurrency is not None:
            while next_i < n and in_flight < concurrency:
                submitted[next_i] = clock
                index_of[sched.add(requests[next_i].input_tokens, np.asarray(requests[next_i].output_tokens, np.int32)).index] = next_i
                next_i += 1
                in_flight += 1
        else:
            while next_i < n and arrival[next_i] <= clock + 1e-12:
                index_of[sched.add(requests[next_i].input_tokens, np.asarray(requests[next_i].output_tokens, np.int32)).index] = next_i
                next_i += 1
                in_flight += 1
        if not sched.has_requests:
            clock = arrival[next_i]
            continue
        before = {id(r): r.state.num_computed_tokens for r in sched.running}
        pre_waiting = [r for r in sched.waiting if r.num_preemptions > 0]
        finished = sched.step()
        touched = list(sched.running) + finished
        spans = []
        for r in touched:
            start = before.get(id(r))
            if start is None:
                start = r.record.hit_len if r.record is not None else 0
            end = r.state.num_computed_tokens
            if end > start:
                spans.append((start, end))
        clock += timing.step_s(spans)
        for r in touched:
            i = index_of[r.index]
            if r.record is not None and not marked[i]:
                marked[i] = True
                hit[i], kv_hit[i] = r.record.hit_len, r.record.kv_hit_len
                if causes is not None:
                    while seen_upto < i:
                        seen.update(chains[seen_upto])
                        seen_upto += 1
                    chain = chains[i]
                    k_blocks = int(r.record.kv_hit_len) // unit
                    e = 0
                    for d in range(min(k_blocks, len(chain)), 0, -1):   # cached before this step's lookups
                        if state_ever.get(chain[d - 1], step_no[0]) < step_no[0]:
                            e = d * unit
                            break
                    pre = max((_lcp(chain, chains[index_of[w.index]]) for w in pre_waiting
                               if index_of[w.index] != i), default=0) * unit
                    row = attribute(int(prompt[i]), int(hit[i]), int(kv_hit[i]), unit, _depth(chain, seen, unit),
                                    _depth(chain, computed, unit), e, pre)
                    causes[i] = [row[c] for c in CAUSES]
            if np.isnan(ttft[i]) and r.num_output_tokens >= 1:
                ttft[i] = clock - submitted[i]
        if causes is not None:
            for r in touched:
                i = index_of[r.index]
                full = min(r.state.num_computed_tokens // unit, len(chains[i]))
                if full > ptr[i]:
                    computed.update(chains[i][ptr[i]:full])
                    ptr[i] = full
        done += len(finished)
        in_flight -= len(finished)
        if progress is not None and finished:
            progress(len(finished))
    preempt = np.zeros(n, np.int64)
    return EmulatedRun(name, hit, kv_hit, prompt, preempt, ttft, causes, layout.num_blocks,
                       {"num_steps": sched.num_steps, "num_preemptions": sched.num_preemptions, "virtual_s": clock})


# ============================================================================================ config
@dataclass(frozen=True)
class DiagnoseConfig:
    """One diagnosis. One of ``gpu_memory`` / ``num_blocks`` (neither: a recording's own pool)."""

    trace: str
    model: str = DEFAULT_MODEL
    gpu_memory: str | None = None
    num_blocks: int | None = None
    tensor_parallel: int = 1
    gpu: str = "h100"
    weight_bytes: int = 2
    concurrency: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    num_requests: int | None = None
    vllm_python: str | None = None
    capacity_points: tuple[float, ...] = (0.25, 0.5, 2.0, 4.0)
    cpu_tiers: tuple[str, ...] = ("0.5x",)      # with vllm_python: CPU tier sizes, each with tier policies lru, marconi
    levers: tuple[str, ...] = ("marconi", "sparse-dp", "retention-interval", "max-num-seqs", "gpu-memory-2x")

    def __post_init__(self) -> None:
        """The options that need no trace, checked before anything loads or runs, by the replay's own
        checks: the model, ``--tensor-parallel`` (it divides every head count), ``--gpu-memory`` (a size
        that holds the weights) and each ``--cpu-tiers`` size, which must hold one chunk of vLLM's
        tier for the model (a fraction of the working set: :func:`diagnose`, once the trace is read).
        ConfigError naming the flag."""
        from marconi.integrations.vllm.replay.configs import model_dir
        from marconi.integrations.vllm.replay.run import check_tensor_parallel

        mdir = model_dir(self.model)
        check_tensor_parallel(mdir, self.tensor_parallel)
        if self.gpu_memory is not None:
            config_json = json.loads((mdir / "config.json").read_text())
            available_kv_bytes(parse_gpu_memory(self.gpu_memory), estimated_num_params(self.model, config_json),
                               self.weight_bytes, tensor_parallel=self.tensor_parallel, weight_flag=None)
        self.check_cpu_tiers()       # each size read as the replay reads it, and held to one chunk

    def check_cpu_tiers(self, working_set: int | None = None) -> None:
        """Each ``--cpu-tiers`` size holds one chunk of vLLM's tier for the model, by the replay's own
        check (:func:`~marconi.integrations.vllm.replay.tiers.check_tier_size`): the sizes, and with
        ``working_set`` (the replay's, :func:`~marconi.integrations.vllm.replay.run.replay_working_set`)
        the fractions. ConfigError naming ``--cpu-tiers``."""
        from marconi.integrations.vllm.replay.tiers import check_tier_size

        for size in self.cpu_tiers:
            check_tier_size(size, self.model, working_set, flag=_CPU_TIERS,
                            no_tier=f"leave it out of {_CPU_TIERS} ('' for none)")


_CPU_TIERS = "--cpu-tiers"      # how the tier sizes' refusals name the option


def _layout(cfg: DiagnoseConfig, spec: ModelSpec, config_json: dict[str, Any], *, gpu_memory_scale: float = 1.0,
            recorded: dict[str, Any] | None = None, **options: Any) -> VllmLayout:
    from marconi.integrations.vllm.layout import prefill_checkpoint_alignment_for

    settings = (recorded or {}).get("settings") or {}
    if recorded and settings.get("block_size"):      # the live server's own block and checkpoint mode
        block_size = int(settings["block_size"])
        options.setdefault("prefill_checkpoint_alignment", 1 if settings.get("mamba_prefill_checkpoint_blocks") else None)
    else:                                            # a GPU deployment of the model, as vLLM 0.32 builds it
        block_size = VLLM_BLOCK_SIZES.get(cfg.model)  # the replay's (every bundled model); a directory: derived
        options.setdefault("prefill_checkpoint_alignment", prefill_checkpoint_alignment_for(spec))
    if cfg.num_blocks is not None:
        return layout_for_spec(spec, num_blocks=int(cfg.num_blocks * gpu_memory_scale), block_size=block_size, **options)
    if cfg.gpu_memory is not None:
        kv = available_kv_bytes(int(parse_gpu_memory(cfg.gpu_memory) * gpu_memory_scale),
                                estimated_num_params(cfg.model, config_json), cfg.weight_bytes,
                                tensor_parallel=cfg.tensor_parallel, weight_flag=None)
        block_bytes = layout_for_spec(spec, num_blocks=2, block_size=block_size).block_bytes
        # vLLM's num_gpu_blocks, the replay's pool: the budget over the block's bytes, null block
        # included (layout_for_spec's capacity_bytes would add one more for it)
        if kv // block_bytes < 2:
            raise ConfigError(f"--gpu-memory {cfg.gpu_memory}: leaves {kv:,} bytes for the KV cache, under two "
                              f"{block_bytes:,}-byte blocks of {cfg.model}: give a larger --gpu-memory")
        return layout_for_spec(spec, num_blocks=kv // block_bytes, block_size=block_size, **options)
    if settings.get("num_blocks"):
        return layout_for_spec(spec, num_blocks=int(settings["num_blocks"] * gpu_memory_scale), block_size=block_size,
                               **options)
    if recorded is not None:
        from marconi.workloads.recording import sidecar_of

        raise ConfigError(f"{sidecar_of(cfg.trace)}: field 'settings.num_blocks': missing (or null), so the recording "
                          "names no pool: give --gpu-memory or --blocks")
    raise ConfigError("give --gpu-memory or --blocks: only a recording names its own pool (its sidecar's "
                      "settings.num_blocks), and this trace is not one")


#: Bytes the emulation holds per block of its pool whatever the traffic (a block object, its
#: free-list entry, its row in the victim index and the compiled core's arrays): measured at about
#: 285-300 B for nemotron-h-8b's seven groups at 4*10**5 and 10**6 blocks, rounded up.
EMULATED_BYTES_PER_BLOCK = 320


def machine_memory() -> int | None:
    """The bytes this process may hold: the machine's physical memory (``os.sysconf``), or the
    address-space limit (``ulimit -v``) where that is lower; None where neither is known."""
    import os
    import resource

    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        total = None
    try:
        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    except (ValueError, OSError):
        soft = resource.RLIM_INFINITY
    if soft != resource.RLIM_INFINITY and soft > 0:
        total = soft if total is None or total <= 0 else min(total, soft)
    return total if total is not None and total > 0 else None


def _check_pool_memory(cfg: DiagnoseConfig, layout: VllmLayout, largest: int) -> None:
    """Refuse, before any run, a pool whose largest run (``largest`` blocks: the pool, its largest
    capacity point or the gpu-memory-2x lever; not the infinite pool, which the trace's own size
    bounds) would need more memory than :func:`machine_memory` at :data:`EMULATED_BYTES_PER_BLOCK`
    per block: ConfigError naming the flag (or the recording's field) that set the pool, instead of
    a MemoryError or the kernel's OOM killer."""
    from marconi.units import format_bytes

    have = machine_memory()
    need = largest * EMULATED_BYTES_PER_BLOCK
    if have is None or need <= have:
        return
    if cfg.num_blocks is not None:
        source, fix = f"--blocks {cfg.num_blocks}", "a smaller --blocks"
    elif cfg.gpu_memory is not None:
        source, fix = f"--gpu-memory {cfg.gpu_memory}", "a smaller --gpu-memory (or --blocks)"
    else:
        from marconi.workloads.recording import sidecar_of

        source = f"the recording's pool ({sidecar_of(cfg.trace)}: field 'settings.num_blocks')"
        fix = "--blocks or --gpu-memory for a smaller pool"
    raise ConfigError(f"{source}: a pool of {layout.num_blocks:,} blocks, whose largest run here holds "
                      f"{largest:,} blocks, needs about {format_bytes(need)} to emulate "
                      f"({EMULATED_BYTES_PER_BLOCK} B a block), more than this machine's {format_bytes(have)}: "
                      f"give {fix}")


def _check_serving_options(cfg: DiagnoseConfig, requests: Sequence[Any], layout: VllmLayout, max_num_seqs: int,
                           settings: dict[str, Any]) -> None:
    """What vLLM would refuse to start with, refused before any run by the replay's own checks: a
    step's token budget (``layout``'s) under ``max_num_seqs``
    (:func:`~marconi.integrations.vllm.replay.run.check_step_budget`; diagnose has no
    ``--max-num-batched-tokens``, so it names ``--max-num-seqs``) and a ``--blocks`` under vLLM's
    least pool for the longest of ``requests`` on ``layout``
    (:func:`~marconi.integrations.vllm.replay.pool_floor.check_pool_blocks`). ConfigError."""
    from marconi.integrations.vllm.replay.pool_floor import (check_pool_blocks, layout_minimum_pool,
                                                             replay_max_model_len)
    from marconi.integrations.vllm.replay.run import check_step_budget

    source = ("as configured" if cfg.max_num_batched_tokens else
              "the recording's" if settings.get("max_num_batched_tokens") else "the default")
    check_step_budget(layout.max_num_batched_tokens, max_num_seqs, budget_source=source)
    if cfg.num_blocks is not None:
        check_pool_blocks(cfg.num_blocks, layout_minimum_pool(layout, replay_max_model_len(requests)))


def _fidelity(recorded: Sequence[int], ran: np.ndarray, prompt: np.ndarray,
              where: Sequence[str] | None = None) -> dict[str, Any]:
    """How many requests the run reproduces; the first that differ with the recording's file:line
    (``where``, in the requests' order) where known."""
    rec = np.asarray(recorded, np.int64)
    agree = rec == ran
    return {"requests": int(len(rec)), "agree": int(agree.sum()), "agree_share": float(agree.mean()) if len(rec) else 1.0,
            "recorded_hit_rate": float(rec.sum() / prompt.sum()) if prompt.sum() else 0.0,
            "replayed_hit_rate": float(ran.sum() / prompt.sum()) if prompt.sum() else 0.0,
            "abs_token_gap": int(np.abs(rec - ran).sum()),
            "first_disagreements": [{"request": int(i), "recorded": int(rec[i]), "replayed": int(ran[i]),
                                     **({"where": where[i]} if where is not None and i < len(where) else {})}
                                    for i in np.flatnonzero(~agree)[:10]]}


def _config_warnings(recorded: dict[str, Any], layout: VllmLayout, max_num_seqs: int, where: str,
                     vllm_version: str) -> list[str]:
    out = []
    version = str(recorded.get("vllm_version", ""))
    if version and ".".join(version.split("+")[0].split(".")[:2]) != ".".join(vllm_version.split(".")[:2]):
        out.append(f"{where}: field 'vllm_version': recorded on vLLM {version}, replayed as vLLM {vllm_version}: "
                   "hits may differ where the versions' schedulers do")
    settings = recorded.get("settings") or {}
    if "block_size" in recorded and int(recorded["block_size"]) != layout.hash_block_size:
        out.append(f"{where}: field 'block_size': the recording hashes {recorded['block_size']}-token blocks, this "
                   f"model's vLLM pool matches {layout.hash_block_size}-token units: hits are only as exact as the "
                   "coarser of the two")
    for key, ours in (("num_blocks", layout.num_blocks), ("max_num_batched_tokens", layout.max_num_batched_tokens)):
        if key in settings and settings[key] is not None and int(settings[key]) != int(ours):
            out.append(f"{where}: field 'settings.{key}': recorded {settings[key]}, replayed {ours}")
    if recorded.get("max_num_seqs") is not None and int(recorded["max_num_seqs"]) != max_num_seqs:
        out.append(f"{where}: field 'max_num_seqs': recorded {recorded['max_num_seqs']}, replayed {max_num_seqs}")
    ri = settings.get("retention_interval", 0)
    if ri != layout.retention_interval:
        out.append(f"{where}: field 'settings.retention_interval': recorded {ri}, replayed {layout.retention_interval}")
    return out


def _recorded_model(trace: str) -> str | None:
    """The ``model`` field of ``trace``'s recording sidecar (vLLM's ``model_config.model``: a hub id
    or the path the server loaded), or None: not a recording, no such field, or a sidecar that does not
    read (the recording's reader names what is wrong with it)."""
    from marconi.core.jsonfile import JsonError, read_json
    from marconi.workloads.recording import META_SUFFIX, is_recording

    if not is_recording(trace):
        return None
    try:
        model = read_json(trace + META_SUFFIX).get("model")
    except (JsonError, OSError):
        return None
    return model if isinstance(model, str) and model.strip() else None


def _as_model_arg(named: str) -> str | None:
    """``named`` (a sidecar's ``model``) as ``--model`` takes it, where that is unambiguous: a bundled
    config's name, or an absolute directory that holds a ``config.json`` here. None otherwise: a hub
    id (``nvidia/Nemotron-H-8B-Base-8K``) names no config here, and a relative path was relative to
    where the server ran."""
    from marconi.integrations.vllm.replay.configs import CONFIGS_DIR

    if "/" not in named and (CONFIGS_DIR / named / "config.json").is_file():
        return named
    path = Path(named)
    return named if path.is_absolute() and (path / "config.json").is_file() else None


def model_for_trace(trace: str, model: str | None) -> tuple[str, str | None]:
    """The model to diagnose ``trace`` on, and a note saying why (None: nothing to say). ``model``
    (``--model``) if given; else the model a recording's sidecar names, where it resolves to one
    unambiguously (a bundled config's name or an absolute directory with a ``config.json``); else
    :data:`DEFAULT_MODEL`, with a note naming the sidecar's model and ``--model`` if it names one.
    Reads only the sidecar; raises nothing."""
    if model is not None:
        return model, None
    named = _recorded_model(trace)
    if named is None:
        return DEFAULT_MODEL, None
    resolved = _as_model_arg(named)
    if resolved is not None:
        return resolved, (f"--model not given: diagnosing on {resolved}, the model the recording's sidecar names "
                          "(field 'model'); give --model to diagnose on another")
    return DEFAULT_MODEL, (f"--model not given: the recording's sidecar names model {named!r}, which is neither a "
                           f"bundled config nor a directory here; diagnosing on {DEFAULT_MODEL}: if the recording "
                           "is of another model, give --model with its config (a bundled name or a directory "
                           "holding its config.json)")


def replay_block_warning(replay_block: int, block_size: int, model: str, recorded: dict[str, Any] | None) -> str:
    """The warning when ``--vllm-python``'s replay ran at vLLM's own ``replay_block``-token block for
    ``model`` and the diagnosis at ``block_size`` (``recorded``: the recording's sidecar, if any). Its
    advice: where the recording names another model, diagnose with that ``--model``; where it names
    this one, its server set the block size itself, which the replay does not take, and no option
    here makes the two pools alike."""
    from marconi.integrations.vllm.replay.configs import model_dir

    w = (f"vllm-replay ran at vLLM's own {replay_block}-token block for {model}, the diagnosis at {block_size} "
         f"tokens" + (" (the recording's)" if recorded is not None else "")
         + ": the replay's figures are of another pool")
    if recorded is None:
        return w
    named = recorded.get("model")
    resolved = _as_model_arg(named) if isinstance(named, str) and named.strip() else None
    same = ("its server set another block size, which the replay does not take: compare the replay's arms with "
            "each other, not with the diagnosis")
    if resolved is not None and model_dir(resolved).resolve() == model_dir(model).resolve():
        return f"{w}; the recording is of this model, so {same}"
    if resolved is None and isinstance(named, str) and named.strip():      # a hub id: which config, unknown here
        return (f"{w}; if {model} is the recorded {named}, {same}; if not, diagnose with the recorded model's "
                "config as --model")
    return w + "; diagnose with the recording's own --model for a like-for-like replay"


def _model_warnings(recorded: dict[str, Any], layout: VllmLayout, spec: ModelSpec, model: str,
                    where: str) -> list[str]:
    """What says the recording's server was not the one diagnosed: another model (its sidecar's
    ``model``, its KV cache groups, a block too small for this model's Mamba state), another Mamba
    cache mode, or a policy other than stock vLLM's. One warning per field, naming it and the fix."""
    from collections import Counter

    from marconi.integrations.vllm.replay.configs import model_dir

    out = []
    settings = recorded.get("settings") or {}
    named = recorded.get("model") if isinstance(recorded.get("model"), str) else None
    resolved = _as_model_arg(named) if named else None
    fix = (f"give --model {resolved}" if resolved else "give --model with the recorded model's config (a bundled "
           "name or a directory holding its config.json)")
    other = f"the recording is of another model ({named or 'its sidecar names none'}); {fix}"
    if resolved is not None and model_dir(resolved).resolve() != model_dir(model).resolve():
        out.append(f"{where}: field 'model': recorded on {named}, diagnosed on {model}: {fix}")
    kinds = settings.get("group_kinds")
    if isinstance(kinds, list) and Counter(map(str, kinds)) != Counter(layout.group_kinds):
        out.append(f"{where}: field 'settings.group_kinds': the recording's server had KV cache groups "
                   f"{','.join(map(str, kinds))}, model {model} has {','.join(layout.group_kinds)}: {other}")
    least = layout_for_spec(spec, num_blocks=2).block_size
    if isinstance(settings.get("block_size"), int) and settings["block_size"] < least:
        out.append(f"{where}: field 'settings.block_size': the recording's server had {settings['block_size']}-token "
                   f"blocks, but a block of model {model} holds its Mamba state only from {least} tokens: {other}")
    mode = settings.get("mamba_cache_mode")
    if mode is not None and mode != "align":
        out.append(f"{where}: field 'settings.mamba_cache_mode': recorded {mode!r}, but the vllm-align emulation "
                   "runs vLLM's 'align' mode (prefix caching's for hybrids): hits may differ")
    policy = recorded.get("policy")
    if policy is not None and policy != "lru":
        out.append(f"{where}: field 'policy': recorded under MARCONI_VLLM_POLICY={policy} (the plugin's eviction), "
                   "but the fidelity run is stock vLLM's (lru): the recorded hits are not stock's, so they need not "
                   f"agree; the '{policy}' lever runs that policy")
    if settings.get("marconi_retention"):
        out.append(f"{where}: field 'settings.marconi_retention': recorded with the plugin's state retention "
                   f"({settings['marconi_retention']}), but the fidelity run keeps vLLM's own: the recorded hits "
                   "need not agree")
    return out


def diagnose(cfg: DiagnoseConfig, *, trace: Any = None, notice: Callable[[str], None] | None = None,
             show_bars: bool = True) -> dict[str, Any]:
    """Run the diagnosis; returns ``{"summary": record, "levers": [records], "capacity": [records],
    "per_request": {...}, "warnings": [...]}`` (see the module docstring for the fields)."""
    from tqdm import tqdm

    from marconi.integrations.vllm.replay.configs import model_dir
    from marconi.workloads import load_trace

    say = notice or (lambda line: None)
    skipped: list[str] = []          # what did not run (a lever, a capacity point), in the report too

    def skip(what: str, why: str) -> None:
        """A step that did not run: shown, and listed in the report's "Not run"."""
        skipped.append(f"{what}: skipped ({why})")
        say(skipped[-1])

    if trace is None:
        trace = load_trace(cfg.trace, cfg.num_requests, notice=lambda line: say(f"NOTE: {line}"))
    requests = list(trace)
    if not requests:
        raise ConfigError(f"trace {cfg.trace!r}: no request")
    mdir = model_dir(cfg.model)
    config_json = json.loads((mdir / "config.json").read_text())
    spec = ModelSpec.from_hf_config(mdir / "config.json", name=cfg.model)
    recorded = (trace.meta or {}).get("recording") if hasattr(trace, "meta") else None
    recorded_hits = ((trace.meta or {}).get("recorded") or {}).get("num_cached_tokens")
    warnings = list((trace.meta or {}).get("warnings", [])) if hasattr(trace, "meta") else []
    settings = (recorded or {}).get("settings") or {}
    max_num_seqs = cfg.max_num_seqs or int((recorded or {}).get("max_num_seqs") or 256)
    mnbt = cfg.max_num_batched_tokens or int(settings.get("max_num_batched_tokens") or 8192)
    interval = settings.get("retention_interval", 0) if recorded else 0
    options = dict(max_num_batched_tokens=mnbt, retention_interval=interval,
                   long_prefill_token_threshold=int(settings.get("long_prefill_token_threshold") or 0))
    layout = _layout(cfg, spec, config_json, recorded=recorded, **options)
    _check_serving_options(cfg, requests, layout, max_num_seqs, settings)
    largest = max([layout.num_blocks] + [max(2 + len(layout.group_kinds), int(layout.num_blocks * scale))
                                         for scale in cfg.capacity_points])
    if "gpu-memory-2x" in cfg.levers:
        try:
            largest = max(largest, _layout(cfg, spec, config_json, gpu_memory_scale=2.0, recorded=recorded,
                                           **options).num_blocks)
        except ConfigError:     # the lever's own run says why, in "Not run"
            pass
    _check_pool_memory(cfg, layout, largest)
    if recorded is not None and recorded_hits is not None:
        where = f"{cfg.trace}.meta.json"
        warnings += _model_warnings(recorded, layout, spec, cfg.model, where)
        warnings += _config_warnings(recorded, layout, max_num_seqs, where, EMULATED_VLLM)
        bs = int(recorded.get("block_size", layout.hash_block_size))
        if layout.hash_block_size % bs:
            raise ConfigError(f"{where}: field 'block_size': the recording's {bs}-token blocks do not divide model "
                              f"{cfg.model}'s {layout.hash_block_size}-token match unit: its hash ids cannot say "
                              "which of this model's blocks are shared; record with this model's configuration")
    meta = trace.meta or {}
    params = (meta.get("params") or {}) if meta.get("recipe") == "mooncake-blocks" else {}   # Mooncake, Bailian
    if params.get("block_size") and layout.hash_block_size % int(params["block_size"]):
        name = meta.get("layout", "Mooncake")
        warnings.append(f"{cfg.trace}: field 'block_size': {name}'s {params['block_size']}-token hash blocks do not "
                        f"divide {cfg.model}'s {layout.hash_block_size}-token vLLM block: a block that spans a "
                        f"differing {name} block counts as different, so hits are a lower bound")
    if cfg.vllm_python is not None and any(parse_capacity(size).fraction is not None for size in cfg.cpu_tiers):
        # a --cpu-tiers fraction is of the replay's working set: refused under one chunk before any run
        from marconi.integrations.vllm.replay.run import replay_working_set

        cfg.check_cpu_tiers(replay_working_set(_replay_config(cfg, layout, max_num_seqs)))
    for w in warnings:
        say(f"warning: {w}")
    timing = StepTimeModel.named(spec, cfg.gpu, estimated_num_params(cfg.model, config_json) * cfg.weight_bytes,
                                 num_gpus=cfg.tensor_parallel)
    n = len(requests)

    def run(name: str, lay: VllmLayout, **kw: Any) -> EmulatedRun:
        # None: the bar is drawn on a terminal only, not into a log file
        with tqdm(total=n, desc=name, unit="req", leave=False, disable=(not show_bars) or None) as bar:
            return run_emulated(requests, spec, lay, timing, name=name, concurrency=cfg.concurrency,
                                max_num_seqs=kw.pop("max_num_seqs", max_num_seqs), progress=bar.update, **kw)

    say(f"diagnose: {n} requests on {cfg.model}, {layout.num_blocks} blocks of {layout.block_size} tokens "
        f"(match unit {layout.hash_block_size}), vllm-align emulation")
    try:
        stock = run("stock", layout, attribute_causes=True)
    except ConfigError as exc:      # the emulator's advice in this command's flags, and where the request is
        raise ConfigError(_in_diagnose_terms(str(exc), trace)) from None
    by_cause = stock.lost_by_cause()
    lost = int((stock.prompt - stock.hit).sum())
    assert sum(by_cause.values()) == lost, (by_cause, lost)
    seq_blocks = sum(cdiv(len(r.input_tokens) + max(1, len(r.output_tokens)), layout.block_size) for r in requests)
    inf_layout = replace(layout, num_blocks=seq_blocks * len(layout.group_kinds) + 2)
    infinite = run("infinite", inf_layout)
    oracle_rate, oracle_admission = _oracle_rate(trace, spec, layout, skip)
    fidelity = None
    stock_engine = "vllm-align"
    replay_records: list[dict[str, Any]] = []
    replay_block = None
    if cfg.vllm_python is not None:
        replay_records = _replay(cfg, layout, max_num_seqs, n, say, skip)
        stock_engine = "vllm-align; vllm-replay beside it"
        replay_block = replay_records[0].get("block_size") if replay_records else None
        if replay_block is not None and int(replay_block) != layout.block_size:
            w = replay_block_warning(int(replay_block), layout.block_size, cfg.model, recorded)
            warnings.append(w)
            say(f"warning: {w}")
    if recorded_hits is not None:
        lines_of = ((trace.meta or {}).get("recorded") or {}).get("where")
        fidelity = _fidelity(recorded_hits, stock.hit, stock.prompt, lines_of)
        fidelity["engine"] = "vllm-align"
        if replay_records:
            ran = np.asarray(replay_records[0]["per_request"]["num_cached_tokens"], np.int64)
            fidelity["vllm_replay"] = _fidelity(recorded_hits, ran, stock.prompt, lines_of)
    levers = [_lever_record("stock", stock, layout, "vllm-align", baseline=stock)]
    for lever in cfg.levers:
        try:
            lrun, lay = _run_lever(lever, run, layout, cfg, spec, config_json, recorded, options, max_num_seqs)
        except ConfigError as exc:
            skip(f"lever {lever}", _in_diagnose_terms(str(exc), trace))
            continue
        levers.append(_lever_record(lever, lrun, lay, "vllm-align", baseline=stock))
    for rec in replay_records:
        tier = f" cpu-tier {rec['cpu_tier']}" if rec.get("tier_policy") else ""
        levers.append({"record": "lever", "lever": f"replay:{rec['arm']}{tier}", "engine": "vllm-replay",
                       "token_hit_rate": rec["token_hit_rate"], "ttft_p50_s": rec["ttft_p50_s"],
                       "ttft_p95_s": rec["ttft_p95_s"], "num_blocks": rec["num_blocks"]})
    capacity = [{"record": "capacity", "num_blocks": layout.num_blocks, "scale": 1.0, "token_hit_rate": stock.token_hit_rate}]
    for scale in cfg.capacity_points:
        blocks = max(2 + len(layout.group_kinds), int(layout.num_blocks * scale))
        try:
            crun = run(f"capacity x{scale:g}", replace(layout, num_blocks=blocks))
        except ConfigError as exc:
            skip(f"capacity x{scale:g}", _in_diagnose_terms(str(exc), trace))
            continue
        capacity.append({"record": "capacity", "num_blocks": blocks, "scale": scale, "token_hit_rate": crun.token_hit_rate})
    capacity.sort(key=lambda r: r["num_blocks"])
    summary = {"record": "summary", "trace": cfg.trace, "model": cfg.model, "gpu": cfg.gpu, "gpu_memory": cfg.gpu_memory,
               "tensor_parallel": cfg.tensor_parallel, "engine": stock_engine, "num_requests": n,
               "num_blocks": layout.num_blocks, "block_size": layout.block_size, "match_unit": layout.hash_block_size,
               "prompt_tokens": int(stock.prompt.sum()), "hit_tokens": int(stock.hit.sum()),
               "token_hit_rate": stock.token_hit_rate,     # the engine the lost tokens and causes are of
               "replay_token_hit_rate": replay_records[0]["token_hit_rate"] if replay_records else None,
               "replay_block_size": replay_block,
               "infinite_token_hit_rate": infinite.token_hit_rate, "oracle_token_hit_rate": oracle_rate,
               "oracle_admission": oracle_admission,
               "lost_tokens": lost, "lost_tokens_by_cause": by_cause, "fidelity": fidelity,
               "recorded_token_hit_rate": (fidelity or {}).get("recorded_hit_rate"),
               "ttft_p50_s": percentile(list(stock.ttft_s), 50), "ttft_p95_s": percentile(list(stock.ttft_s), 95),
               "max_num_seqs": max_num_seqs, "concurrency": cfg.concurrency, "warnings": warnings,
               "pool_source": (f"--blocks {cfg.num_blocks}" if cfg.num_blocks is not None else
                               f"--gpu-memory {cfg.gpu_memory}" if cfg.gpu_memory is not None else
                               "GPU memory as recorded: the recording's settings.num_blocks"),
               "max_num_seqs_source": ("--max-num-seqs" if cfg.max_num_seqs else "as recorded"
                                       if (recorded or {}).get("max_num_seqs") else "the default"),
               "num_requests_limit": cfg.num_requests, "num_requests_read": meta.get("num_requests_read"),
               "skipped": skipped}
    per_request = {"prompt_len": stock.prompt.tolist(), "num_cached_tokens": stock.hit.tolist(),
                   "kv_hit": stock.kv_hit.tolist(), "causes": {c: stock.causes[:, k].tolist() for k, c in enumerate(CAUSES)},
                   "recorded_num_cached_tokens": list(recorded_hits) if recorded_hits is not None else None}
    return {"summary": summary, "levers": levers, "capacity": capacity, "per_request": per_request, "warnings": warnings}


def _in_diagnose_terms(text: str, trace: Any) -> str:
    """An emulator refusal as this command says it: ``raise the capacity`` as its flags, and
    ``request #i`` with the file and line a recording read it from."""
    text = text.replace("raise the capacity", "raise --gpu-memory (or --blocks), or leave the request out "
                        "(--num-requests)")
    found = re.search(r"request #(\d+)", text)
    where = (((getattr(trace, "meta", None) or {}).get("recorded") or {}).get("where") or [])
    if found and int(found.group(1)) < len(where):
        text += f" (request #{found.group(1)} is {where[int(found.group(1))]})"
    return text


def _oracle_rate(trace: Any, spec: ModelSpec, layout: VllmLayout,
                 skip: Callable[[str, str], None]) -> tuple[float | None, str | None]:
    """The simulator's future-aware oracle at the pool's KV bytes, under Marconi's admission and under
    a state at every block boundary (vLLM's grid): the better of the two, and which it was."""
    from marconi.sim import simulate_system

    best: tuple[float | None, str | None] = (None, None)
    requests = list(trace)
    for admission in ("marconi", f"every-block(block={layout.block_size})"):
        try:
            res = simulate_system(requests, f"oracle:admission={admission}", spec,
                                  (layout.num_blocks - 1) * layout.block_bytes, latency=None)
        except Exception as exc:        # a reference figure: its failure must not hide the diagnosis
            skip(f"oracle ({admission})", f"{type(exc).__name__}: {exc}")
            continue
        total = int(res.input_len.sum())
        rate = float(res.reused_len.sum()) / total if total else 0.0
        if best[0] is None or rate > best[0]:
            best = (rate, admission)
    return best


def _run_lever(lever: str, run: Callable[..., EmulatedRun], layout: VllmLayout, cfg: DiagnoseConfig, spec: ModelSpec,
               config_json: dict[str, Any], recorded: Any, options: dict[str, Any],
               max_num_seqs: int) -> tuple[EmulatedRun, VllmLayout]:
    if lever == "marconi":
        return run(lever, layout, eviction="marconi"), layout
    if lever == "sparse-dp":
        lay = replace(layout, retention_interval=0)
        return run(lever, lay, retention_budget=2), lay
    if lever == "retention-interval":
        lay = replace(layout, retention_interval=4 * layout.block_size)
        return run(lever, lay), lay
    if lever == "max-num-seqs":
        return run(lever, layout, max_num_seqs=max(1, max_num_seqs // 2)), layout
    if lever == "gpu-memory-2x":
        lay = _layout(cfg, spec, config_json, gpu_memory_scale=2.0, recorded=recorded, **options)
        return run(lever, lay), lay
    raise ConfigError(f"unknown lever {lever!r}")


def _lever_record(name: str, r: EmulatedRun, layout: VllmLayout, engine: str, *, baseline: EmulatedRun) -> dict[str, Any]:
    return {"record": "lever", "lever": name, "engine": engine, "token_hit_rate": r.token_hit_rate,
            "delta_token_hit_rate": r.token_hit_rate - baseline.token_hit_rate,
            "ttft_p50_s": percentile(list(r.ttft_s), 50), "ttft_p95_s": percentile(list(r.ttft_s), 95),
            "num_blocks": layout.num_blocks, "retention_interval": layout.retention_interval,
            "num_preemptions": r.info.get("num_preemptions")}


def _replay_config(cfg: DiagnoseConfig, layout: VllmLayout, max_num_seqs: int) -> Any:
    """The ``vllm replay`` configuration of the stock and Marconi arms (:func:`_replay`)."""
    from marconi.integrations.vllm.replay.run import ReplayConfig

    assert cfg.vllm_python is not None
    load = {"concurrency": cfg.concurrency} if cfg.concurrency is not None else {"time_scale": 1.0}
    return ReplayConfig(vllm_python=cfg.vllm_python, model=cfg.model, trace=cfg.trace, policies=("lru", "marconi"),
                        num_blocks=layout.num_blocks, tensor_parallel=cfg.tensor_parallel, gpu=cfg.gpu,
                        max_input_len=10**9, num_requests=cfg.num_requests, max_num_seqs=max_num_seqs,
                        max_num_batched_tokens=layout.max_num_batched_tokens,
                        retention=str(layout.retention_interval).lower(), **load)


def _replay(cfg: DiagnoseConfig, layout: VllmLayout, max_num_seqs: int, n: int,
            say: Callable[[str], None], skip: Callable[[str, str], None]) -> list[dict[str, Any]]:
    from marconi.integrations.vllm.replay.run import run_replay

    rc = _replay_config(cfg, layout, max_num_seqs)
    records = run_replay(rc, emulate=False, progress=say)
    for size in cfg.cpu_tiers:       # the CPU tier (vLLM's OffloadingConnector), each tier policy one replay
        try:
            records += run_replay(replace(rc, policies=("lru",), cpu_tier=size, tier_policies=("lru", "marconi")),
                                  emulate=False, progress=say)
        except (ConfigError, RuntimeError) as exc:
            skip(f"lever cpu-tier {size}", str(exc).splitlines()[0])
    return records


# ============================================================================================ output
def _fmt(x: Any, pct: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{100 * x:.1f}%" if pct else (f"{x:.3f}" if isinstance(x, float) else str(x))


def summary_table(result: dict[str, Any]) -> str:
    s = result["summary"]
    lines = [f"token hit rate {_fmt(s['token_hit_rate'], True)} (vllm-align); infinite "
             f"{_fmt(s['infinite_token_hit_rate'], True)}; oracle {_fmt(s['oracle_token_hit_rate'], True)}"]
    if s.get("replay_token_hit_rate") is not None:
        lines.append(f"through vLLM's own scheduler: {_fmt(s['replay_token_hit_rate'], True)} (vllm-replay, "
                     f"{s.get('replay_block_size') or '?'}-token blocks)")
    f = s.get("fidelity")
    if f:
        lines.append(f"fidelity: {f['agree']}/{f['requests']} requests reproduce the recorded num_cached_tokens "
                     f"(recorded {_fmt(f['recorded_hit_rate'], True)}, replayed {_fmt(f['replayed_hit_rate'], True)}; "
                     f"{f.get('engine', 'vllm-align')})")
        if f.get("vllm_replay"):
            v = f["vllm_replay"]
            lines.append(f"fidelity: {v['agree']}/{v['requests']} through vLLM's own scheduler (vllm-replay; replayed "
                         f"{_fmt(v['replayed_hit_rate'], True)})")
    lines.append(f"lost prompt tokens: {s['lost_tokens']:,} of {s['prompt_tokens']:,}")
    for c in CAUSES:
        v = s["lost_tokens_by_cause"][c]
        lines.append(f"  {c:<26} {v:>12,}  {100 * v / max(1, s['lost_tokens']):5.1f}%")
    return "\n".join(lines)


#: What to look at next when a cause holds the most lost tokens.
CAUSE_ADVICE = {
    "never_shared": "no cache can recover tokens no earlier request had: the traffic itself shares little at "
                    "this block (stable prefixes first in the prompt share more)",
    "kv_evicted": "capacity: more GPU memory (the gpu-memory-2x lever), or a CPU tier (--vllm-python with "
                  "--cpu-tiers)",
    "no_state_at_usable_depth": "states missing where a hit could resume: the sparse-dp and retention-interval "
                                "levers place more of them",
    "state_evicted_kv_stayed": "states evicted while their KVs stayed: the marconi lever ranks them with their KVs",
    "in_flight": "requests asked for a prefix another was still computing: nothing a cache policy changes",
    "preempted": "preemptions freed computed blocks: the max-num-seqs lever, or more memory",
    "below_one_block": "prompt tails under one block never cache: inherent to the block size",
}


def next_steps(result: dict[str, Any]) -> list[str]:
    """A few sentences from the figures: where the headroom is (ceilings), the cause that loses most
    and what addresses it, and the lever that gained most (or that none did).

    The headroom is to the infinite pool: stock vLLM's ceiling at any pool size, with stock's state
    placement and scheduling, so the most an eviction policy could reach. A lever that changes those
    (retention-interval, sparse-dp, max-num-seqs) can pass it; where one did, the headroom is to that
    lever's rate, and the line says it passes the infinite pool."""
    s = result["summary"]
    rate, inf, oracle = s["token_hit_rate"], s["infinite_token_hit_rate"], s["oracle_token_hit_rate"]
    levers = [(r["token_hit_rate"], r["lever"]) for r in result["levers"]
              if r["engine"] == "vllm-align" and r["lever"] != "stock" and r.get("token_hit_rate") is not None]
    above = max(levers, default=None)
    if above is not None and above[0] > inf:
        ceiling = above[0]
        head = (f"Headroom: {100 * (ceiling - rate):.1f} pp to the {above[1]} lever's {100 * ceiling:.1f}%, above "
                f"the infinite pool's {100 * inf:.1f}% (stock's ceiling at any pool size, with stock's state "
                f"placement and scheduling: no eviction policy passes it, but {above[1]} changes them)")
    else:
        ceiling = inf
        head = f"Headroom: {100 * (inf - rate):.1f} pp to the infinite pool's {100 * inf:.1f}%"
    if oracle is None:
        out = [head + "."]
    elif oracle > ceiling and ceiling > inf:
        out = [head + f"; the oracle at this pool ({100 * oracle:.1f}%) is above it, counting hits vLLM's block "
                      "grid cannot serve (whole prompts, tails under one block)."]
    elif oracle > ceiling:  # the simulator's accounting: whole prompts and tails under a block count as hits
        out = [head + f", the most a better policy could reach here: the oracle at this pool ({100 * oracle:.1f}%) "
                      "is above it, counting hits vLLM's block grid cannot serve (whole prompts, tails under one "
                      "block)."]
    else:
        out = [head + f", {100 * (oracle - rate):.1f} pp to the oracle at this pool ({100 * oracle:.1f}%): what a "
                      "better policy alone could reach."]
    lost = s["lost_tokens_by_cause"]
    if s["lost_tokens"]:
        top = max(CAUSES, key=lambda c: lost[c])
        out.append(f"Most lost tokens: {top} ({100 * lost[top] / s['lost_tokens']:.0f}%): {CAUSE_ADVICE[top]}.")
    gains = [(r.get("delta_token_hit_rate") or 0.0, r["lever"]) for r in result["levers"]
             if r["engine"] == "vllm-align" and r["lever"] != "stock"]
    best = max(gains, default=None)
    if best is not None and best[0] > 0.005:
        out.append(f"The lever that gains most: {best[1]} (+{100 * best[0]:.1f} pp).")
    elif gains:
        out.append("No lever gains 0.5 pp here.")
    return out


def lever_table(result: dict[str, Any]) -> str:
    rows = [("lever", "engine", "hit rate", "Δ pp", "TTFT p50 s", "TTFT p95 s", "blocks")]
    for r in result["levers"]:
        delta = r.get("delta_token_hit_rate")
        rows.append((r["lever"], r["engine"], _fmt(r["token_hit_rate"], True), "-" if delta is None else f"{100 * delta:+.1f}",
                     _fmt(r["ttft_p50_s"]), _fmt(r["ttft_p95_s"]), str(r.get("num_blocks", "-"))))
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows)


def _plot_waterfall(summary: dict[str, Any], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["prompt tokens", "hits"] + list(CAUSES)
    values = [summary["prompt_tokens"], -summary["hit_tokens"]] + [-summary["lost_tokens_by_cause"][c] for c in CAUSES]
    fig, ax = plt.subplots(figsize=(9, 4))
    level = 0
    for k, (lab, v) in enumerate(zip(labels, values)):
        bottom = level if v >= 0 else level + v
        ax.bar(k, abs(v), bottom=bottom, color="tab:blue" if k == 0 else "tab:green" if k == 1 else "tab:red")
        level += v
    ax.set_xticks(range(len(labels)), labels, rotation=35, ha="right")
    ax.set_ylabel("tokens")
    ax.set_title("Where the prompt tokens went (stock vLLM)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_capacity(result: dict[str, Any], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result["summary"]
    pts = result["capacity"]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([p["num_blocks"] for p in pts], [100 * p["token_hit_rate"] for p in pts], "o-", label="stock vLLM")
    ax.axhline(100 * s["infinite_token_hit_rate"], ls="--", color="gray", label="infinite capacity")
    if s["oracle_token_hit_rate"] is not None:
        ax.axhline(100 * s["oracle_token_hit_rate"], ls=":", color="black", label="oracle (this pool)")
    ax.axvline(s["num_blocks"], color="tab:red", lw=0.8, label="your pool")
    ax.set_xscale("log")
    ax.set_xlabel("pool blocks")
    ax.set_ylabel("token hit rate (%)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


#: Who writes the report folder, and its files. A folder of these alone, without a manifest, was
#: written by this command before :data:`marconi.io.FOLDER_MANIFEST` existed only where its
#: ``records.jsonl`` is this command's (:data:`REPORT_RECORDS`: its first record is the summary).
WRITER = "marconi vllm diagnose"
REPORT_FILES = ("records.jsonl", "per_request.json", "report.md", "waterfall.png", "capacity.png")
REPORT_RECORDS = ("records.jsonl", "record", "summary")


def _report_header(s: dict[str, Any]) -> str:
    """report.md's first line: the requests (with ``--num-requests``, how many of how many), the pool
    and where it came from, how arrivals were replayed, ``max_num_seqs``, that TTFTs are modelled
    (which GPU's step-time model) and the engine."""
    n, limit, read = s["num_requests"], s.get("num_requests_limit"), s.get("num_requests_read")
    requests = f"{n} requests"
    if limit is not None and read and n < read:
        requests += f" (--num-requests {limit}: the first {n} to arrive of the {read} recorded)"
    elif limit is not None and not read and n >= limit:     # a trace whose size was not read whole
        requests += f" (--num-requests {limit}: the first {n} to arrive)"
    pool = s.get("pool_source") or (f"--gpu-memory {s['gpu_memory']}" if s.get("gpu_memory") else "pool as given")
    c = s.get("concurrency")
    arrivals = (f"a closed loop of {c} requests in flight (--concurrency {c})" if c is not None else
                "at their recorded arrival times (open loop)")
    seqs = ""
    if s.get("max_num_seqs") is not None:
        seqs = f"; max_num_seqs {s['max_num_seqs']}"
        if s.get("max_num_seqs_source"):
            seqs += f" ({s['max_num_seqs_source']})"
    return (f"{requests}; pool {s['num_blocks']} blocks of {s['block_size']} tokens ({pool}, TP "
            f"{s['tensor_parallel']}); arrivals {arrivals}{seqs}" +
            f"; TTFTs modelled on a virtual clock ({s.get('gpu') or 'h100'} step-time model), not measured; "
            f"engine {s['engine']}.")


def write_report(result: dict[str, Any], out: str | Path) -> list[Path]:
    """``out/`` gets ``records.jsonl`` (summary, levers, capacity points), ``per_request.json``,
    ``report.md`` (its header: the requests kept, the pool's source, how arrivals were replayed,
    ``max_num_seqs``, the step-time model of its TTFTs), ``waterfall.png`` and ``capacity.png``; the
    folder is swapped in whole. ConfigError, nothing written, where ``out`` holds files this command
    did not write, or is not an earlier report of it (:func:`marconi.io.check_replaceable` with
    :data:`REPORT_FILES` and :data:`REPORT_RECORDS`)."""
    from marconi.io import atomic_directory

    with atomic_directory(out, writer=WRITER, known=REPORT_FILES, records=REPORT_RECORDS) as stage:
        records = [result["summary"], *result["levers"], *result["capacity"]]
        (stage / "records.jsonl").write_text("".join(json.dumps(r, default=str) + "\n" for r in records))
        (stage / "per_request.json").write_text(json.dumps(result["per_request"]))
        _plot_waterfall(result["summary"], stage / "waterfall.png")
        _plot_capacity(result, stage / "capacity.png")
        s = result["summary"]
        md = [f"# Prefix-cache diagnosis: {s['trace']} on {s['model']}", "", _report_header(s), "",
              "```", summary_table(result), "```", "", "## Lost tokens by cause", "",
              "| cause | tokens | share |", "|---|---:|---:|"]
        for c in CAUSES:
            v = s["lost_tokens_by_cause"][c]
            md.append(f"| {CAUSE_TEXT[c]} | {v:,} | {100 * v / max(1, s['lost_tokens']):.1f}% |")
        md += [f"| **total lost** | **{s['lost_tokens']:,}** | 100% |", "", "![waterfall](waterfall.png)", "",
               "## Levers", "", "```", lever_table(result), "```", "", "## Hit rate against capacity", "",
               "![capacity](capacity.png)", ""]
        md += ["## What to do next", ""] + [f"- {line}" for line in next_steps(result)] + [""]
        f = s.get("fidelity") or {}
        for label, fid in (("the emulation", f), ("vLLM's own scheduler", f.get("vllm_replay") or {})):
            if fid.get("first_disagreements"):
                md += [f"## Requests {label} does not reproduce ({fid['requests'] - fid['agree']} of "
                       f"{fid['requests']}; the first {len(fid['first_disagreements'])})", "",
                       "| request | where | recorded cached tokens | replayed |", "|---:|---|---:|---:|"]
                md += [f"| {d['request']} | {d.get('where', '-')} | {d['recorded']:,} | {d['replayed']:,} |"
                       for d in fid["first_disagreements"]] + [""]
        if s.get("skipped"):
            md += ["## Not run", ""] + [f"- {line}" for line in s["skipped"]] + [""]
        if s["warnings"]:
            md += ["## Warnings", ""] + [f"- {w}" for w in s["warnings"]] + [""]
        (stage / "report.md").write_text("\n".join(md))
    out = Path(out)
    return [out / name for name in ("report.md", "records.jsonl", "waterfall.png", "capacity.png")]


# ============================================================================================ command
def register_command(sub: Any) -> None:
    """``marconi vllm diagnose`` (added to the ``vllm`` group by :mod:`.commands`)."""
    from marconi.core.registry import Domain
    from marconi.options import COUNT, Number, add_output

    p = sub.add_parser("diagnose", help="where a recording's (or hash-id trace's) prefix-cache hits went, by cause, "
                                        "and what each lever (Marconi, retention, max_num_seqs, memory) gives")
    p.add_argument("--trace", required=True, help="a MARCONI_VLLM_RECORD recording, a Mooncake file, or any trace")
    p.add_argument("--model", default=None,
                   help=f"a bundled config or a directory with a config.json; default: the model a recording's "
                        f"sidecar names, if it is one of those, else {DEFAULT_MODEL}")
    pool = p.add_mutually_exclusive_group()
    pool.add_argument("--gpu-memory", default=None, help="the GPU's memory (80GB); default: a recording's own pool")
    pool.add_argument("--blocks", type=Number(Domain(2, 10**9, integer=True)), default=None,
                      help="the block pool (num_gpu_blocks) instead of --gpu-memory")
    p.add_argument("--tensor-parallel", type=Number(Domain(1, 1024, integer=True)), default=1,
                   help="GPUs per replica: the pool is each GPU's --gpu-memory over its share of the heads "
                        "(it must divide every head count)")
    p.add_argument("--gpu", default="h100", help="step-time model's GPU: h100, h200 or a100")
    p.add_argument("--concurrency", type=Number(Domain(1, 65536, integer=True)), default=None,
                   help="a closed loop of C requests instead of the recorded arrival times")
    p.add_argument("--max-num-seqs", type=Number(Domain(1, 65536, integer=True)), default=None,
                   help="default: the recording's, else 256")
    p.add_argument("--num-requests", type=Number(COUNT), default=None, help="only the first N requests")
    p.add_argument("--vllm-python", default=None, type=python_command,
                   help="run the stock and Marconi arms through vLLM's scheduler (marconi vllm replay) as well")
    p.add_argument("--cpu-tiers", default="0.5x", type=_cpu_tier_sizes, action=_GivenCpuTiers,
                   help="with --vllm-python: CPU tier sizes (comma list: 0.5x of the working set, 256GB), each "
                        "replayed with tier policies lru and marconi; '' for none")
    add_output(p, "--out", kind="dir", required=True,
               help="report folder: new, empty, or an earlier report of this command (replaced as a whole)")
    p.set_defaults(func=_cmd_diagnose)


class _GivenCpuTiers(argparse.Action):
    """Stores ``--cpu-tiers`` and remembers it was given (``cpu_tiers_given``): without
    ``--vllm-python`` its lever cannot run, and the command says so rather than drop it."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        namespace.cpu_tiers_given = True


def _cpu_tier_sizes(text: str) -> tuple[str, ...]:
    """argparse ``type=`` of ``--cpu-tiers``: each size as ``vllm replay --cpu-tier`` reads it
    (:class:`marconi.options.CapacityList`, no zero), refused at parse time; ``''``: no tier."""
    from marconi.options import CapacityList

    if not str(text).strip():
        return ()
    CapacityList(allow_zero=False)(text)
    return tuple(s.strip() for s in str(text).split(","))


def _cmd_diagnose(args: Any) -> int:
    import sys

    from marconi.io import check_replaceable
    from marconi.workloads.recording import RecordingError

    replaced = check_replaceable(args.out, WRITER, known=REPORT_FILES,   # before the run, not after it
                                 records=REPORT_RECORDS)
    model, note = model_for_trace(args.trace, args.model)
    if note:
        print(f"note: {note}", file=sys.stderr)
    if replaced:
        print(f"note: {replaced}", file=sys.stderr)
    cfg = DiagnoseConfig(trace=args.trace, model=model, gpu_memory=args.gpu_memory, num_blocks=args.blocks,
                         tensor_parallel=args.tensor_parallel, gpu=args.gpu, concurrency=args.concurrency,
                         max_num_seqs=args.max_num_seqs, num_requests=args.num_requests, vllm_python=args.vllm_python,
                         cpu_tiers=args.cpu_tiers)
    if getattr(args, "cpu_tiers_given", False) and args.cpu_tiers and args.vllm_python is None:
        print(f"note: {_CPU_TIERS} {','.join(args.cpu_tiers)}: not run: the CPU tier is replayed only through "
              "vLLM's OffloadingConnector (give --vllm-python); the emulation has no tier", file=sys.stderr)
    try:
        result = diagnose(cfg, notice=lambda line: print(line, file=sys.stderr))
    except RecordingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    paths = write_report(result, args.out)
    print(summary_table(result))
    print()
    print(lever_table(result))
    print()
    print("\n".join(next_steps(result)))
    print(f"\nreport: {paths[0]}", file=sys.stderr)
    return 0
