"""``marconi vllm frontier``: Mamba states kept per request against prefill recomputed, through vLLM.

Every point is one ``marconi vllm replay`` run (vLLM's own scheduler, KV cache manager and block
pool, the plugin loaded as vLLM loads it, a stub model runner, no weights) on one workload, one
pool and one *arm*:

* ``dp-M`` — the plugin's DP placement (``--retention sparse-dp --retention-budget M``, vLLM's
  eviction kept: ``lru``), for each budget ``M``;
* ``interval-T`` — stock vLLM with ``prefix_cache_retention_interval=T``. vLLM refuses an interval
  that is not a multiple of the block, so each asked interval is rounded **up** to a block multiple
  and the duplicates merged (Nemotron-H-8B's block is 1152 tokens: 512 and 1024 both become 1152,
  2048 becomes 2304); a record keeps the intervals it stands for (``intervals_asked``);
* ``marconi`` — Marconi's admission alone, which in vLLM means: the plugin's ``marconi`` policy
  (FLOP-aware eviction, α = 0.5) with vLLM's retention 0 and no state placed by the plugin. vLLM's
  own writes under retention 0 are Marconi's admission rule on vLLM's grid: the prompt's replay
  boundary (the last-token state a next turn resumes from) and the shared-prefix junction vLLM
  detects (the branch point). In a pool that never evicts it is the ``interval-0`` point.

Per point (a record, :func:`frontier_record`): vLLM's token hit rate (its prefix-cache counters),
recomputed prefill tokens (the prompt tokens vLLM did not take from the cache, request by request,
``num_cached_tokens``) and their share of the prompt tokens, and Mamba states cached per request
(per Mamba group; a state shared by many requests once, one evicted and cached again again): as
the plugin counted them inside vLLM where it is loaded (``dp-M``, ``marconi``), else as the
replay's emulation counts them (stock vLLM has no such counter; ``states_source`` says which; the
emulation's count is kept on every record, ``sim_states_per_request``).

The frontier (:func:`pareto`) is, per workload and pool, the points no other point beats on both
axes (no more states per request and no more recomputed tokens, one of them strictly fewer). The
report (:func:`report_markdown`), the plot (:func:`plot_frontier`) and ``--from-records`` read the
records alone.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from marconi.core.registry import ConfigError

__all__ = ["Arm", "FrontierConfig", "plan_arms", "run_frontier", "frontier_record", "pareto",
           "verdict_lines", "floor_notes", "report_markdown", "plot_frontier", "write_outputs", "RECORD_FIELDS",
           "DEFAULT_WORKLOADS", "DEFAULT_BUDGETS", "DEFAULT_INTERVALS"]

DEFAULT_WORKLOADS = ("quality", "shared-prompts-synthetic", "swe-sample", "doc-qa-synthetic")
DEFAULT_BUDGETS = (0, 1, 2, 4)
DEFAULT_INTERVALS = (0, 512, 1024, 2048)

#: What every frontier record has (what the plot, the report and ``--from-records`` read).
RECORD_FIELDS = ("kind", "workload", "pool_label", "arm", "family", "budget", "retention_interval",
                 "intervals_asked", "states_per_request", "states_source", "token_hit_rate",
                 "recomputed_prefill_tokens", "recomputed_fraction", "prompt_tokens", "num_requests", "block_size")

KIND = "vllm-retention-frontier"
FAMILIES = ("dp", "interval", "marconi")


@dataclass(frozen=True, slots=True)
class Arm:
    """One way of keeping states: ``label`` names it in records and plots; ``policy`` is the
    replay's (``lru``: vLLM's eviction, ``marconi``: the plugin's); ``retention`` the replay's
    ``--retention`` (``sparse-dp`` with ``budget``, or vLLM's interval in tokens)."""

    label: str
    family: str
    policy: str
    retention: str
    budget: int | None = None
    intervals_asked: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ConfigError(f"arm {self.label!r}: family must be one of {FAMILIES}, got {self.family!r}")


def plan_arms(block_size: int, budgets: Sequence[int], intervals: Sequence[int],
              families: Sequence[str] = FAMILIES) -> list[Arm]:
    """The DP arms (one per budget, in order given), the interval arms (each asked interval rounded
    up to a multiple of ``block_size``, duplicates merged, ascending) and Marconi's admission alone,
    of the ``families`` asked.

    Raises:
        ConfigError: a negative budget or interval, a budget given twice, an unknown family, or no arm.
    """
    unknown = set(families) - set(FAMILIES)
    if unknown:
        raise ConfigError(f"--arms: {sorted(unknown)} are not among {', '.join(FAMILIES)}")
    if block_size <= 0:
        raise ConfigError(f"the block size must be > 0, got {block_size}")
    if any(m < 0 for m in budgets) or any(t < 0 for t in intervals):
        raise ConfigError("budgets and intervals must be >= 0")
    if len(set(budgets)) != len(budgets):
        raise ConfigError(f"--budgets: a budget given twice ({', '.join(map(str, budgets))})")
    arms = [Arm(f"dp-{m}", "dp", "lru", "sparse-dp", budget=m) for m in budgets if "dp" in families]
    rounded: dict[int, list[int]] = {}
    for asked in intervals:
        rounded.setdefault(math.ceil(asked / block_size) * block_size, []).append(asked)
    arms += [Arm(f"interval-{t}", "interval", "lru", str(t), intervals_asked=tuple(rounded[t]))
             for t in sorted(rounded) if "interval" in families]
    arms += [Arm("marconi", "marconi", "marconi", "0")] if "marconi" in families else []
    if not arms:
        raise ConfigError("no arm to run: give budgets (dp), intervals (interval) or the marconi arm")
    return arms


def _needs_block(arm: Arm) -> bool:
    """Whether the arm's interval was rounded to the block (interval 0 and the other families were not)."""
    return arm.family == "interval" and arm.retention != "0"


@dataclass(frozen=True, slots=True)
class FrontierConfig:
    """One frontier run (echoed in every record). ``pools``: each ``{"gpu_memory": "80GB"}`` or
    ``{"capacity": "0.3x"}``, as the replay takes them; ``limit``: the first requests of each trace."""

    vllm_python: str
    workloads: tuple[str, ...] = DEFAULT_WORKLOADS
    model: str = "nemotron-h-8b"
    budgets: tuple[int, ...] = DEFAULT_BUDGETS
    intervals: tuple[int, ...] = DEFAULT_INTERVALS
    pools: tuple[Mapping[str, str], ...] = ({"gpu_memory": "80GB"},)
    concurrency: int = 8
    limit: int | None = 256
    max_input_len: int = 16384
    max_num_batched_tokens: int = 8192
    gpu: str = "h100"
    families: tuple[str, ...] = FAMILIES

    def __post_init__(self) -> None:
        if not self.workloads:
            raise ConfigError("give at least one workload")
        if not self.pools or any(len(p) != 1 or set(p) - {"gpu_memory", "capacity"} for p in self.pools):
            raise ConfigError("each pool is one of gpu_memory or capacity")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"--limit must be >= 1, got {self.limit}")
        from marconi.integrations.vllm.replay.run import DEFAULT_MAX_NUM_SEQS, check_step_budget

        check_step_budget(self.max_num_batched_tokens, DEFAULT_MAX_NUM_SEQS, seqs_flag=False)   # no --max-num-seqs here
        plan_arms(1, self.budgets, self.intervals, self.families)      # the arms' own checks, before anything runs

    def replay_configs(self, workload: str, pool: Mapping[str, str], arms: Sequence[Arm]) -> list[Any]:
        """One :class:`~marconi.integrations.vllm.replay.run.ReplayConfig` per arm (validated)."""
        from marconi.integrations.vllm.replay.run import ReplayConfig

        base = ReplayConfig(vllm_python=self.vllm_python, model=self.model, trace=workload, policies=("lru",),
                            gpu=self.gpu, concurrency=self.concurrency, max_input_len=self.max_input_len,
                            num_requests=self.limit, max_num_batched_tokens=self.max_num_batched_tokens, **pool)
        return [dataclasses.replace(base, policies=(arm.policy,), retention=arm.retention,
                                    retention_budget=arm.budget) for arm in arms]


def pool_label(pool: Mapping[str, str]) -> str:
    """``80GB GPU`` or ``0.3x`` (a capacity)."""
    return f"{pool['gpu_memory']} GPU" if "gpu_memory" in pool else str(pool["capacity"])


def frontier_record(replay: Mapping[str, Any], arm: Arm, workload: str, pool: Mapping[str, str]) -> dict[str, Any]:
    """A replay record (its per-request lists dropped) with the frontier's fields (module docstring)."""
    rec = {k: v for k, v in replay.items() if k != "per_request"}
    cached = sum(replay["per_request"]["num_cached_tokens"])
    vllm_states = replay.get("states_per_request")
    states, source = (vllm_states, "vllm-plugin") if vllm_states is not None else \
        (replay.get("sim_states_per_request"), "emulation")
    return {"kind": KIND, "workload": workload, "pool_label": pool_label(pool), **rec,
            "arm": arm.label, "family": arm.family, "budget": arm.budget, "intervals_asked": list(arm.intervals_asked),
            "vllm_states_per_request": vllm_states, "states_per_request": states, "states_source": source,
            "recomputed_prefill_tokens": int(replay["prompt_tokens"]) - int(cached),
            "recomputed_fraction": 1 - cached / replay["prompt_tokens"] if replay["prompt_tokens"] else 0.0}


def _run_arm(shared: Mapping[str, Any], item: tuple[Any, str, Arm, str, dict[str, str], dict[str, Any]]) -> dict[str, Any]:
    """One point (module level: it may run in a forked worker); ``echo``: configuration the
    replay's record lacks."""
    from marconi.integrations.vllm.replay.run import run_replay

    config, work_dir, arm, workload, pool, echo = item
    (replay,) = run_replay(config, work_dir=work_dir, show_bars=False)
    return {**frontier_record(replay, arm, workload, pool), **echo}


def run_frontier(config: FrontierConfig, *, work_dir: str | Path | None = None, workers: int = 1,
                 on_point: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Every point's record, workload-major, then pool, then arm (:func:`plan_arms`' order).

    vLLM derives the block size (the hybrid page rule, kernel alignment), so the arms that do not
    depend on it run first and their block size rounds the intervals; with none of them, one
    request is replayed to learn it.

    ``work_dir`` (every replay's requests, logs and results) is kept; without one a temporary
    folder is used and removed when the run ends, however it ends (issue 31, bug 12: it held
    every selected trace as JSON), unless ``MARCONI_KEEP_SCRATCH=1`` (:func:`marconi.pool.scratch_dir`).

    Raises:
        ConfigError: an invalid point, or ``vllm_python`` not a vLLM environment, before any runs.
    """
    from marconi.integrations.common.probe import probe_python
    from marconi.pool import scratch_dir
    from marconi.sim.backends import make_backend

    probe_python(config.vllm_python, "vllm", option="--vllm-python", make_target="make vllm-env")
    with scratch_dir("marconi-frontier-", work_dir) as work:
        runner = make_backend("local", workers=workers)
        try:
            first = [a for a in plan_arms(1, config.budgets, config.intervals, config.families) if not _needs_block(a)]
            done = _run_arms(runner, config, first, work, on_point) if first else []
            block = done[0]["block_size"] if done else _probe_block_size(config, work / "probe")
            arms = plan_arms(block, config.budgets, config.intervals, config.families)
            done += _run_arms(runner, config, [a for a in arms if _needs_block(a)], work, on_point)
        finally:
            runner.close()
    order = {(w, pool_label(p), a.label): i for i, (w, p, a) in
             enumerate((w, p, a) for w in config.workloads for p in config.pools for a in arms)}
    return sorted(done, key=lambda r: order[(r["workload"], r["pool_label"], r["arm"])])


def _run_arms(runner: Any, config: FrontierConfig, arms: Sequence[Arm], work: Path,
              on_point: Callable[[dict[str, Any]], None] | None) -> list[dict[str, Any]]:
    echo = {"max_num_batched_tokens": config.max_num_batched_tokens, "limit": config.limit}
    points = [(workload, dict(pool), arm, rc) for workload in config.workloads for pool in config.pools
              for arm, rc in zip(arms, config.replay_configs(workload, pool, arms))]
    # each point its own work folder: the names alone collide (traces x/one.jsonl and x_one.jsonl, pools
    # "80GB" and "80 GB"), and two replays sharing one overwrote each other's requests (wrong numbers)
    items = [(rc, str(work / f"{i:04d}-{workload.replace('/', '_')}-{pool_label(pool).replace(' ', '')}-{arm.label}"),
              arm, workload, pool, echo) for i, (workload, pool, arm, rc) in enumerate(points)]
    return runner.map(_run_arm, items, shared={}, on_result=on_point)


def _probe_block_size(config: FrontierConfig, work: Path) -> int:
    """vLLM's block size for the model: one request of the first workload through the replay."""
    from marconi.integrations.vllm.replay.run import run_replay

    (rc,) = config.replay_configs(config.workloads[0], config.pools[0], [Arm("probe", "interval", "lru", "0")])
    (rec,) = run_replay(dataclasses.replace(rc, num_requests=1), work_dir=work, emulate=False, show_bars=False)
    return int(rec["block_size"])


# ====================================================================================== analysis
def _groups(records: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    return list(dict.fromkeys((r["workload"], r["pool_label"]) for r in records))


def _of(records: Sequence[Mapping[str, Any]], workload: str, pool: str) -> list[Mapping[str, Any]]:
    return [r for r in records if r["workload"] == workload and r["pool_label"] == pool]


def _beats(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """``a`` dominates ``b``: no more states, no more recompute, one of them strictly less."""
    sa, sb, ra, rb = a["states_per_request"], b["states_per_request"], a["recomputed_fraction"], b["recomputed_fraction"]
    return sa <= sb and ra <= rb and (sa < sb or ra < rb)


def pareto(points: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The points no other beats (:func:`_beats`), by states per request; equal points all stay."""
    return sorted((p for p in points if not any(_beats(q, p) for q in points)),
                  key=lambda p: (p["states_per_request"], p["recomputed_fraction"]))


def _pt(r: Mapping[str, Any]) -> str:
    return f"{r['arm']} ({r['states_per_request']:.3f} states/req, {100 * r['token_hit_rate']:.2f}% hit)"


def verdict_lines(points: Sequence[Mapping[str, Any]]) -> list[str]:
    """Plain statements for one workload and pool: against each interval point and Marconi, is
    some DP point on or beyond it (recomputes no more with no more states per request)?"""
    dp = [p for p in points if p["family"] == "dp"]
    if not dp:
        return ["no DP point was run"]
    out = []
    for other in (p for p in points if p["family"] != "dp"):
        sparser = [d for d in dp if d["states_per_request"] <= other["states_per_request"]]
        match = [d for d in sparser if d["recomputed_fraction"] <= other["recomputed_fraction"]]
        if match:
            best = min(match, key=lambda d: (d["recomputed_fraction"], d["states_per_request"]))
            word = "beyond" if _beats(best, other) else "on"
            out.append(f"{other['arm']}: DP {word} it — {_pt(best)} vs {_pt(other)}.")
            continue
        denser = [d for d in dp if d["recomputed_fraction"] <= other["recomputed_fraction"]]
        best_sparse = min(sparser, key=lambda d: d["recomputed_fraction"]) if sparser else None
        parts = [f"{other['arm']}: no DP point matches it at no more states — {_pt(other)}"]
        parts.append(f"best DP at no more states {_pt(best_sparse)}" if best_sparse else "no DP point is as sparse")
        if denser:
            parts.append(f"DP recomputes as little only with more states: "
                         f"{_pt(min(denser, key=lambda d: d['states_per_request']))}")
        else:
            parts.append("no DP budget run reaches its hit rate")
        out.append("; ".join(parts) + ".")
    return out


def _fmt_intervals(r: Mapping[str, Any]) -> str:
    asked = r.get("intervals_asked") or []
    return ", ".join(map(str, asked)) if asked else ""


def floor_note(pool: str, points: Sequence[Mapping[str, Any]]) -> str:
    """What a group replayed where the pool asked was below vLLM's least pool (the replay raises it,
    records ``kv_floor_applied``): said in the report and by the command, not only in the records."""
    p = next(p for p in points if p.get("kv_floor_applied"))
    return (f"NOTE: {pool} is below vLLM's least pool for this trace's longest request: its points replay "
            f"{p['num_blocks']:,} blocks ({p.get('pool_bytes', 0) / 1e9:.3g} GB; records: kv_floor_applied)")


def floor_notes(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """``workload: NOTE ...`` for each group (workload, pool) whose pool was raised to vLLM's least
    (:func:`floor_note`): what the command says on stderr, beside the report's own line."""
    groups = [(workload, pool, _of(records, workload, pool)) for workload, pool in _groups(records)]
    return [f"{workload}: {floor_note(pool, pts)}" for workload, pool, pts in groups
            if any(p.get("kv_floor_applied") for p in pts)]


def report_markdown(records: Sequence[Mapping[str, Any]], notes: Sequence[str] = ()) -> str:
    """``report.md``: what was run, the definitions, one table and the verdicts per workload and pool."""
    from marconi.report import md_table

    first = records[0]
    block = first["block_size"]
    rounding = sorted({(tuple(r["intervals_asked"]), r["retention_interval"]) for r in records if r["family"] == "interval"},
                      key=lambda x: x[1])
    lines = ["# Mamba states per request vs recomputed prefill, through vLLM's replay", ""]
    if first.get("command"):
        lines += ["```bash", first["command"], "```", ""]
        if first.get("command_wall_s") is not None:
            lines += [f"Wall time of the run: {first['command_wall_s']:.0f} s.", ""]
    lines += [
        f"vLLM {first['vllm_version']}'s scheduler, KV cache manager and block pool (`marconi vllm replay`, stub "
        f"model runner, no weights); model `{first['model']}` (block {block} tokens), {first['concurrency']} requests "
        f"in flight, chunk {first['max_num_batched_tokens']} tokens, the first {first['limit']} "
        "requests of each trace at most (inputs capped at "
        f"{first['trace_params'].get('max_input_len')} tokens).", "",
        "- `dp-M`: the plugin's DP placement (`--retention sparse-dp --retention-budget M`, vLLM's eviction).",
        "- `interval-T`: stock vLLM, `prefix_cache_retention_interval=T`. vLLM takes only multiples of the block, so "
        "each asked interval was rounded up to one and duplicates merged: "
        + "; ".join(f"{', '.join(map(str, asked))} → {t}" for asked, t in rounding) + ".",
        "- `marconi`: Marconi's admission alone — the plugin's `marconi` policy (FLOP-aware eviction, α = 0.5) with "
        "vLLM's retention 0 and nothing placed by the plugin. vLLM's own writes under retention 0 are Marconi's "
        "admission on vLLM's grid: the prompt's replay boundary (the last-token state a next turn resumes from) and "
        "the shared-prefix junction (the branch point). Where the pool never evicts it equals `interval-0`.",
        "- states/req: Mamba states cached per request (per Mamba group; a shared state once, a re-cached one again), "
        "counted by the plugin inside vLLM for `dp-M` and `marconi`, by the replay's emulation for stock vLLM "
        "(which has no such counter).",
        "- recomputed: prompt tokens vLLM did not take from its cache (Σ per-request `num_cached_tokens`), as a share "
        "of prompt tokens; hit: vLLM's prefix-cache token hit rate (the two add to 100% without preemptions).",
        "- frontier: points no other point beats on both axes (no more states and no more recompute, one strictly "
        "less). A DP point is *on* a rival when it has no more states and recomputes no more; *beyond* it when also "
        "strictly better on one.", ""]
    agree = [abs(r["vllm_states_per_request"] - r["sim_states_per_request"]) for r in records
             if r.get("vllm_states_per_request") is not None and r.get("sim_states_per_request") is not None]
    if agree:
        lines += [f"Where both count, the plugin's and the emulation's states/req differ by at most {max(agree):.4f}.", ""]
    sims = [abs(r["sim_token_hit_rate"] - r["token_hit_rate"]) for r in records if r.get("sim_token_hit_rate") is not None]
    if sims:
        lines += [f"The emulation's token hit rate equals vLLM's on {sum(d < 5e-5 for d in sims)} of {len(sims)} "
                  f"points (at most {100 * max(sims):.2f} pp apart).", ""]
    lines += [f"- {n}" for n in notes] + ([""] if notes else [])
    for workload, pool in _groups(records):
        pts = _of(records, workload, pool)
        front = {id(p) for p in pareto(pts)}
        lines += [f"## {workload}, {pool} ({pts[0]['num_blocks']:,} blocks; {pts[0]['num_requests']} requests, "
                  f"{pts[0]['prompt_tokens']:,} prompt tokens)", ""]
        if any(p.get("kv_floor_applied") for p in pts):
            lines += [floor_note(pool, pts), ""]
        lines.append(md_table(
            ["arm", "asked", "states/req", "source", "token hit", "recomputed", "recomputed tokens", "preempt", "frontier"],
            [[p["arm"], _fmt_intervals(p), f"{p['states_per_request']:.3f}", p["states_source"],
              f"{100 * p['token_hit_rate']:.2f}%", f"{100 * p['recomputed_fraction']:.2f}%",
              f"{p['recomputed_prefill_tokens']:,}", p.get("num_preemptions", 0), "yes" if id(p) in front else ""]
             for p in pts]))
        lines += [""] + [f"- {line}" for line in verdict_lines(pts)] + [""]
    return "\n".join(lines)


# ====================================================================================== outputs
_STYLE = {"dp": ("o-", "C0", "DP placement (M)"), "interval": ("s-", "C1", "vLLM interval (tokens)"),
          "marconi": ("X", "C3", "Marconi admission alone")}


def plot_frontier(records: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """One panel per workload and pool: recomputed prefill (% of prompt tokens; hit rate on the
    right axis) against Mamba states per request, each family a series, the frontier dashed."""
    from marconi.report import pyplot, save_figure

    groups = _groups(records)
    cols = min(2, len(groups))
    rows = -(-len(groups) // cols)
    fig, axes = pyplot().subplots(rows, cols, figsize=(5.6 * cols, 4.0 * rows), squeeze=False)
    for ax, (workload, pool) in zip([a for row in axes for a in row], groups):
        pts = _of(records, workload, pool)
        front = pareto(pts)
        ax.step([p["states_per_request"] for p in front], [100 * p["recomputed_fraction"] for p in front],
                where="post", color="0.6", linestyle="--", linewidth=1, label="frontier", zorder=1)
        for family, (fmt, color, name) in _STYLE.items():
            fam = sorted((p for p in pts if p["family"] == family), key=lambda p: p["states_per_request"])
            if not fam:
                continue
            xs, ys = [p["states_per_request"] for p in fam], [100 * p["recomputed_fraction"] for p in fam]
            ax.plot(xs, ys, fmt, color=color, label=name, markersize=7 if family != "marconi" else 9, zorder=2)
            for p, x, y in zip(fam, xs, ys):
                tag = p["budget"] if family == "dp" else p["retention_interval"] if family == "interval" else None
                if tag is not None:
                    ax.annotate(str(tag), (x, y), textcoords="offset points", xytext=(4, 4 if family == "dp" else -10),
                                fontsize=7, color=color)
        ax.set_title(f"{workload} ({pool}, {pts[0]['num_requests']} req)", fontsize=10)
        ax.set_xlabel("Mamba states cached per request")
        ax.set_ylabel("recomputed prefill (% of prompt tokens)")
        ax.secondary_yaxis("right", functions=(lambda y: 100 - y, lambda h: 100 - h)).set_ylabel("token hit rate (%)")
        ax.grid(alpha=0.3)
    for ax in [a for row in axes for a in row][len(groups):]:
        ax.set_visible(False)
    axes[0][0].legend(fontsize=7, loc="best")
    first = records[0]
    fig.suptitle(f"Through vLLM {first['vllm_version']}'s scheduler: {first['model']} (block {first['block_size']}), "
                 f"C={first['concurrency']}", fontsize=11)
    fig.tight_layout()
    return save_figure(fig, path, dpi=120)


def write_outputs(records: Sequence[Mapping[str, Any]], out_dir: str | Path, notes: Sequence[str] = (), *,
                  write_jsonl: bool = True) -> list[Path]:
    """``records.jsonl`` (unless ``write_jsonl`` is false), ``frontier.png`` and ``report.md`` under
    ``out_dir``, each written atomically, from the records alone."""
    from marconi.io import write_text
    from marconi.sim.sweep import write_records

    out = Path(out_dir)
    paths = [write_records(records, out / "records.jsonl")] if write_jsonl else []
    paths.append(plot_frontier(records, out / "frontier.png"))
    paths.append(write_text(out / "report.md", report_markdown(records, notes)))
    return paths
